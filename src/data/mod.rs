//! Reading training data.

pub mod libsvm;
pub mod synthetic;
