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
    build(tokio::runtime::Builder::new_multi_thread())
}

fn build(mut builder: tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, CliError> {
    builder
        .enable_all()
        .build()
        .map_err(|e| CliError::input(format!("cannot start the async runtime: {e}")))
}

/// The async runtime a cluster node of `role` runs on (ARCHITECTURE.md §6). A coordinator or
/// a server does all its work in its one node loop, so it runs on the thread that started it:
/// a frame read from a connection then reaches the loop without waking a second thread, which
/// cost a replicated job's servers an eighth of their CPU (docs/performance.md). A worker
/// keeps a thread per core, for its application computes beside its node loop.
fn node_runtime(role: pserver_core::Role) -> Result<tokio::runtime::Runtime, CliError> {
    match role {
        pserver_core::Role::Worker => runtime(),
        _ => build(tokio::runtime::Builder::new_current_thread()),
    }
}

/// `threads`, or one per core when not given.
fn threads_or_cores(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    })
}
