//! Reading training data.

pub mod libsvm;
