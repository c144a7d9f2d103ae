//! The subcommands of `pserver`, one module each, named after the command: each owns its
//! arguments (a clap `Args` struct) and its `run`. The values options take are defined once in
//! [`values`], and the flags several commands share once in `groups`.

pub(crate) mod bench;
pub(crate) mod check;
pub(crate) mod cluster;
pub(crate) mod cluster_file;
pub(crate) mod error;
pub(crate) mod r#gen;
mod groups;
pub(crate) mod launch;
pub(crate) mod local;
pub(crate) mod manual;
pub(crate) mod metrics;
pub(crate) mod node;
pub(crate) mod predict;
pub(crate) mod ring;
pub(crate) mod script;
pub(crate) mod signals;
pub(crate) mod sim;
pub(crate) mod status;
pub(crate) mod train;
pub(crate) mod values;

pub(crate) use error::{CliError, exit};

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
