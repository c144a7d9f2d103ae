//! The applications: models trained on the parameter server.

pub(crate) mod loopback;
pub(crate) mod lr;
pub(crate) mod mf;
pub(crate) mod mf_file;
pub(crate) mod plot;
pub(crate) mod sketch;
