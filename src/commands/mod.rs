//! The subcommands of `pserver`, as library functions so that they can be tested directly.

pub mod check;
pub mod ring;
pub mod sim;
