//! Reading training data.

pub mod libsvm;
pub mod ratings;
pub mod synthetic;
