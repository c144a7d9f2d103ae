//! # pserver
//!
//! A parameter server after Li et al., "Scaling Distributed Machine Learning with the Parameter
//! Server" (OSDI 2014). This crate is the command-line tool and a thin facade over the parts:
//!
//! - [`core`]: the sans-IO protocol core (types, codec, clocks, ring, node state machines);
//! - [`transport`]: the `Transport` trait and its adapters;
//! - [`models`]: stateright models of the protocol.

pub use pserver_core as core;
pub use pserver_models as models;
pub use pserver_transport as transport;

pub mod apps;
pub mod commands;
pub mod data;
mod seeded;
