//! The subcommands of `pserver`, one module each, named after the command: each owns its
//! arguments (a clap `Args` struct) and its `run`. The modules also hold the commands' logic as
//! library functions, so that it can be tested directly.

pub mod bench;
pub mod check;
pub mod cluster;
pub mod cluster_file;
pub mod error;
pub mod r#gen;
pub mod local;
pub mod metrics;
pub mod node;
mod parse;
pub mod predict;
pub mod ring;
pub mod script;
pub mod signals;
pub mod sim;
pub mod train;

pub use error::{CliError, exit};

/// The async runtime the commands that run nodes drive them on.
fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::input(format!("cannot start the async runtime: {e}")))
}

/// `threads`, or one per core when not given.
fn threads_or_cores(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    })
}
