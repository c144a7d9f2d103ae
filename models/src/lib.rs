//! # pserver-models
//!
//! The checkers of the pserver protocol, built from the core's own state machines: they only
//! enumerate or draw the inputs a real deployment could give the core and check the core's
//! invariants on what comes out. No protocol logic lives here.
//!
//! - [`cluster`]: stateright models of the whole protocol (coordinator, servers, workers) on
//!   ordered or lossy networks, with crashes.
//! - [`ClockModel`]: the range vector clock against a per-key clock.
//! - [`StandbyModel`]: coordinator succession: an active coordinator, its standby and the
//!   members that grant terms, on a lossy network, the active one crashing.
//! - [`sim`]: the deterministic simulator: whole clusters on virtual time under faults, driven
//!   through the core's `Driver`, with every invariant checked after every step.

mod clock_model;
pub mod cluster;
pub mod sim;
mod standby_model;

pub use clock_model::{ClockAction, ClockModel, ClockState};
pub use standby_model::{StandbyAction, StandbyModel, StandbyState};
