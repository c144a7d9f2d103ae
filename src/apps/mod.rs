//! The applications: models trained on the parameter server.

pub mod lr;
pub mod mf;
pub mod plot;
pub mod sketch;
