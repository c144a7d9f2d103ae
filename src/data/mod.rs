//! Reading training data.

pub(crate) mod libsvm;
pub(crate) mod ratings;
pub(crate) mod synthetic;
