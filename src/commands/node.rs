//! `pserver coordinator | server | worker`: one node of a cluster described by a cluster file,
//! one per process.

use std::path::PathBuf;
use std::time::Duration;

use pserver_core::{NodeId, Role};
use pserver_runtime::RuntimeError;

use super::CliError;
use super::cluster::{self, NodeOutcome, RunError};
use super::cluster_file::ClusterFile;
use super::signals::Stop;

/// The arguments of `pserver coordinator`, `pserver server` and `pserver worker`.
#[derive(clap::Args, Debug)]
pub(crate) struct NodeArgs {
    /// The cluster file: every node's address, the consistency model, the ring and the job
    /// (TOML). The secret comes from its secret_file or the PSERVER_SECRET environment
    /// variable, never from the command line.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// This node's id in the cluster file.
    #[arg(long)]
    id: u32,
    /// Servers and workers: give up (exit status 2) if the job has not started after this many
    /// seconds (the coordinator is unreachable, a node is missing, or the secret differs).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    join_timeout_secs: u64,
    /// Servers: on exit, write one `key_index total` line per key held to this file.
    #[arg(long, value_name = "FILE")]
    dump: Option<PathBuf>,
    /// Serve `/healthz` and Prometheus-format `/metrics` (frames, bytes, pushes, pulls,
    /// iterations, open requests and resends, held pulls, refusals by reason, nodes declared
    /// dead, lost ranges, the transport's counters) over HTTP at this address, e.g.
    /// 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

/// Runs node `--id` of the cluster file, which must be a `role`, and prints its last line.
pub(crate) fn run(args: NodeArgs, role: Role) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.config).map_err(CliError::input)?;
    let id = NodeId(args.id);
    let named = file.role(id).map_err(CliError::input)?;
    if named != role {
        return Err(CliError::Input(format!(
            "{}: node {} is a {named}, not a {role}: run `pserver {named} --id {}`",
            args.config.display(),
            args.id,
            args.id
        )));
    }
    if let Some(path) = &args.dump {
        // Found out now, not after the whole job has run.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))?;
    }
    let options = cluster::NodeOptions {
        join_timeout: Duration::from_secs(args.join_timeout_secs),
        metrics: args.metrics,
    };
    let outcome = super::runtime()?
        .block_on(cluster::run_node(&file, id, &options))
        .map_err(|e| match e {
            RunError::Runtime(RuntimeError::Fenced) => CliError::Fenced(format!(
                "{role} {id} was removed from the cluster (fenced): the coordinator went on \
                 without it, as it does with a node silent past its timeout; restart it to rejoin"
            )),
            e @ (RunError::Lost(_) | RunError::Runtime(RuntimeError::Stalled { .. })) => {
                CliError::failed(e)
            }
            RunError::Stopped(Stop::Interrupt) => CliError::Interrupted,
            RunError::Stopped(Stop::Terminate) => CliError::Terminated,
            e => CliError::input(e),
        })?;
    match outcome {
        NodeOutcome::Coordinator => {}
        NodeOutcome::Server { totals, refused } => {
            let total: i64 = totals.iter().sum();
            let held = totals.iter().filter(|t| **t != 0).count();
            println!("server {id} keys={held} total={total} refused={refused}");
            if let Some(path) = &args.dump {
                cluster::dump_totals(path, &totals).map_err(|e| {
                    CliError::Input(format!("{}: cannot write: {e}", path.display()))
                })?;
            }
        }
        NodeOutcome::LrServer {
            rows,
            nonzero,
            refused,
        } => println!("server {id} rows={rows} nonzero={nonzero} refused={refused}"),
        NodeOutcome::Trained { epochs } => println!("worker {id} trained epochs={epochs}"),
        NodeOutcome::Worker(s) => println!(
            "worker {id} iterations={} pushes={} pushed_sum={}",
            s.iterations, s.pushes, s.pushed_sum
        ),
    }
    Ok(())
}
