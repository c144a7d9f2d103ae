//! # pserver-models
//!
//! Stateright models of the pserver protocol, built from the core's own state machines: a model
//! only enumerates the inputs a real deployment could give the core and checks the core's
//! invariants on what comes out. No protocol logic lives here.
//!
//! For now the crate holds [`ClockModel`], a model of the range vector clock, which the
//! protocol's consistency checks stand on.

mod clock_model;

pub use clock_model::{ClockAction, ClockModel, ClockState};
