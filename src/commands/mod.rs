//! The subcommands of `pserver`, as library functions so that they can be tested directly.

pub mod bench;
pub mod check;
pub mod cluster;
pub mod cluster_file;
pub mod ring;
pub mod script;
pub mod sim;
