//! `pserver coordinator | server | worker`: one node of a cluster described by a cluster file,
//! one per process.

use std::path::PathBuf;
use std::time::Duration;

use pserver_core::{NodeId, Role};
use pserver_runtime::RuntimeError;

use super::CliError;
use super::cluster::{self, Ended, NodeOutcome, RunError};
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
    #[arg(
        long,
        required_unless_present = "id_from_env",
        conflicts_with = "id_from_env"
    )]
    id: Option<u32>,
    /// Take this node's place among the nodes of its role from environment variable VAR: a
    /// number, or a name ending in `-N` (a StatefulSet pod's host name), counted from 0 in the
    /// order of that role's ids in the cluster file. For instance JOB_COMPLETION_INDEX (a
    /// Kubernetes Indexed Job), HOSTNAME (a StatefulSet pod), SLURM_PROCID (one Slurm job step
    /// per role).
    #[arg(long, value_name = "VAR")]
    id_from_env: Option<String>,
    /// Servers and workers: give up (exit status 2) if the job has not started after this many
    /// seconds (the coordinator is unreachable, a node is missing, or the secret differs).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    join_timeout_secs: u64,
    /// Servers: on exit, write one `key_index total` line per key held to this file.
    #[arg(long, value_name = "FILE")]
    dump: Option<PathBuf>,
    /// The coordinator and servers: keep serving after every worker has left the job, instead
    /// of ending (exit status 0) once the job is finished. For servers that outlive a job,
    /// and under supervisors that restart a process that exits (a Kubernetes Deployment or
    /// StatefulSet).
    #[arg(long)]
    serve_forever: bool,
    /// Servers: on SIGTERM, leave the job (the other servers take over its ranges first, so
    /// that nothing acknowledged is lost) and stop, waiting at most this many seconds.
    #[arg(long, default_value_t = 25, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    leave_timeout_secs: u64,
    /// Serve `/healthz` and Prometheus-format `/metrics` (frames, bytes, pushes, pulls,
    /// iterations, open requests and resends, held pulls, refusals by reason, nodes declared
    /// dead, lost ranges, the transport's counters) over HTTP at this address, e.g.
    /// 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Servers: write this server's whole-job checkpoints to this directory (a local disk or
    /// a mounted volume, one per server), at every cut the cluster file's job.checkpoint_every
    /// sets: written whole or not at all, checksummed, the newest three kept.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Servers: offer the checkpoints in --checkpoint-dir that read back whole; the job
    /// resumes from the newest every server holds (start every server with it), and the
    /// workers from its iteration. A torn or corrupt file is said and passed over.
    #[arg(long, requires = "checkpoint_dir")]
    resume: bool,
}

/// The place among the nodes of its role that `value` (of environment variable `var`) gives:
/// a number, or the number after the last `-` of a name.
fn place_in(var: &str, value: &str) -> Result<usize, String> {
    let digits = value.rsplit('-').next().unwrap_or(value).trim();
    digits.parse().map_err(|_| {
        format!("--id-from-env {var}: `{value}` is neither a number nor a name ending in -N")
    })
}

/// The id of the node at `place` among the `role` nodes of `file`, in the file's order.
fn id_at(file: &ClusterFile, role: Role, place: usize, var: &str) -> Result<NodeId, String> {
    let of_role: Vec<NodeId> = file
        .roles
        .iter()
        .filter(|&(_, &r)| r == role)
        .map(|(&id, _)| id)
        .collect();
    of_role.get(place).copied().ok_or_else(|| {
        format!(
            "--id-from-env {var}: {role} {place} asked, but the cluster file has {} {role}s (counted from 0)",
            of_role.len()
        )
    })
}

/// Runs node `--id` of the cluster file (or the one `--id-from-env` names), which must be a
/// `role`, and prints its last line.
pub(crate) fn run(args: NodeArgs, role: Role) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.config).map_err(CliError::input)?;
    let id = match (&args.id_from_env, args.id) {
        (Some(var), _) => {
            let value = std::env::var(var)
                .map_err(|_| CliError::Input(format!("--id-from-env {var}: {var} is not set")))?;
            let place = place_in(var, &value).map_err(CliError::Input)?;
            id_at(&file, role, place, var).map_err(CliError::Input)?
        }
        (None, Some(id)) => NodeId(id),
        (None, None) => return Err(CliError::input("give --id or --id-from-env")),
    };
    let named = file.role(id).map_err(CliError::input)?;
    if named != role {
        return Err(CliError::Input(format!(
            "{}: node {} is a {named}, not a {role}: run `pserver {named} --id {}`",
            args.config.display(),
            id.0,
            id.0
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
    if args.checkpoint_dir.is_some() && role != Role::Server {
        return Err(CliError::input(format!(
            "--checkpoint-dir: only servers write checkpoints, and node {} is a {role}",
            id.0
        )));
    }
    let options = cluster::NodeOptions {
        join_timeout: Duration::from_secs(args.join_timeout_secs),
        metrics: args.metrics,
        serve_forever: args.serve_forever,
        leave_timeout: Duration::from_secs(args.leave_timeout_secs),
        checkpoints: args.checkpoint_dir.clone(),
        resume: args.resume,
    };
    let outcome = super::node_runtime(role)?
        .block_on(cluster::run_node(&file, id, &options))
        .map_err(|e| match e {
            RunError::Runtime(RuntimeError::Fenced) => CliError::Fenced(format!(
                "{role} {id} was removed from the cluster (fenced): the coordinator went on \
                 without it, as it does with a node silent past its timeout; restart it to rejoin"
            )),
            e @ (RunError::Lost(_)
            | RunError::Runtime(
                RuntimeError::Stalled { .. } | RuntimeError::CoordinatorSilent { .. },
            )) => CliError::failed(e),
            RunError::Stopped(Stop::Interrupt) => CliError::Interrupted,
            RunError::Stopped(Stop::Terminate) => CliError::Terminated,
            e => CliError::input(e),
        })?;
    // Why a server stopped; the other roles' ending says nothing of their status.
    let server_ended = match outcome {
        NodeOutcome::Coordinator(ended) => {
            if ended == Ended::JobFinished {
                println!("coordinator {id} job finished: every worker left, every server stopped");
            }
            None
        }
        NodeOutcome::Server {
            totals,
            refused,
            ended,
        } => {
            let total: i64 = totals.iter().sum();
            let held = totals.iter().filter(|t| **t != 0).count();
            println!(
                "server {id} keys={held} total={total} refused={refused} ended={}",
                ended_word(ended)
            );
            if let Some(path) = &args.dump {
                cluster::dump_totals(path, &totals).map_err(|e| {
                    CliError::Input(format!("{}: cannot write: {e}", path.display()))
                })?;
            }
            Some(ended)
        }
        NodeOutcome::ModelServer {
            rows,
            nonzero,
            refused,
            ended,
        } => {
            println!(
                "server {id} rows={rows} nonzero={nonzero} refused={refused} ended={}",
                ended_word(ended)
            );
            Some(ended)
        }
        NodeOutcome::Trained { epochs } => {
            println!("worker {id} trained epochs={epochs}");
            None
        }
        NodeOutcome::Worker(s) => {
            println!(
                "worker {id} iterations={} pushes={} pushed_sum={}",
                s.iterations, s.pushes, s.pushed_sum
            );
            None
        }
    };
    match server_ended {
        // A server that SIGTERM could not take out of the job in time stopped with its
        // ranges: the ring's replicas hold them, or the job loses them.
        Some(Ended::Stopped(Stop::Terminate)) => Err(CliError::Terminated),
        _ => Ok(()),
    }
}

/// How a server's last line says why it stopped.
fn ended_word(ended: Ended) -> &'static str {
    match ended {
        Ended::JobFinished => "job-finished",
        Ended::Left => "left",
        Ended::Stopped(stop) => stop.word(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_a_number_or_the_ordinal_at_the_end_of_a_host_name() {
        assert_eq!(place_in("JOB_COMPLETION_INDEX", "3"), Ok(3));
        assert_eq!(place_in("HOSTNAME", "pserver-server-12"), Ok(12));
        assert!(place_in("HOSTNAME", "pserver-server").is_err());
        assert!(place_in("SLURM_PROCID", "").is_err());
    }
}
