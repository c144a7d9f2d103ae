//! # pserver-models
//!
//! Stateright models of the pserver protocol, built from the core's own state machines: a model
//! only enumerates the inputs a real deployment could give the core and checks the core's
//! invariants on what comes out. No protocol logic lives here.
//!
//! - [`cluster`]: the whole protocol — coordinator, servers, workers — on ordered or lossy
//!   networks, with crashes.
//! - [`ClockModel`]: the range vector clock against a per-key clock.

mod clock_model;
pub mod cluster;

pub use clock_model::{ClockAction, ClockModel, ClockState};
