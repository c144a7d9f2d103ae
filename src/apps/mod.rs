//! The applications: models trained on the parameter server.

pub mod lr;
pub mod plot;
pub mod sketch;
