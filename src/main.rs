//! The `pserver` command-line tool: parses the command line and hands each subcommand to its
//! module under `commands`, whose name is the subcommand's.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
mod apps;
mod commands;
mod data;
mod seeded;

use commands::{bench, check, r#gen, local, node, predict, ring, sim, train};
use pserver_core::Role;
use tracing_subscriber::EnvFilter;

/// Frames of megabytes are allocated and freed many times a second. The system allocator hands
/// such blocks back to the kernel and faults them in again, zeroed, a few percent of a dense
/// push's time in a profile of `pserver bench`; mimalloc keeps them for reuse.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// pserver: a parameter server for sparse machine learning, after Li et al. (OSDI 2014).
///
/// Servers hold the parameters of a model sharded by key range on a consistent-hashing ring;
/// workers push updates and pull parameters under a chosen consistency model. Set RUST_LOG
/// (e.g. RUST_LOG=debug) for logs.
#[derive(Parser, Debug)]
#[command(name = "pserver", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands, in the order `--help` lists them. Each one's help is the doc comment of
/// its arguments, except for the three node roles, which share theirs.
#[derive(Subcommand, Debug)]
enum Command {
    Ring(ring::RingArgs),
    Sim(sim::SimArgs),
    Check(check::CheckArgs),
    /// Run the coordinator of a cluster described by a cluster file, until SIGINT or SIGTERM.
    ///
    /// The coordinator owns membership, the ring and the epoch: it waits until every server and
    /// worker of the file has registered, then starts the job.
    Coordinator(node::NodeArgs),
    /// Run one server of a cluster described by a cluster file, until SIGINT or SIGTERM.
    ///
    /// On exit it prints `server nN keys=K total=T refused=R`, and with --dump writes one
    /// `key_index total` line per key it holds. A server the coordinator removed from the
    /// cluster (fenced, after a silence past the heartbeat timeout) exits at once with status
    /// 3 and says so, freeing its port: restart it with the same id to rejoin.
    Server(node::NodeArgs),
    /// Run one worker of a cluster described by a cluster file: the job's script (pull every
    /// key, compute, push, advance, for each iteration), then exit.
    ///
    /// Prints `worker nN iterations=I pushes=P pushed_sum=S` when done. A worker the
    /// coordinator removed from the cluster (fenced) exits with status 3 and says so.
    Worker(node::NodeArgs),
    Local(local::LocalArgs),
    Bench(bench::BenchArgs),
    Train(Box<train::TrainArgs>),
    Predict(predict::PredictArgs),
    Gen(r#gen::GenArgs),
}

fn main() -> ExitCode {
    // Warnings (a refused peer, a node declared dead) show without RUST_LOG.
    let filter = EnvFilter::builder()
        .with_default_directive(tracing::level_filters::LevelFilter::WARN.into())
        .from_env_lossy();
    // Colours only for a person at a terminal: a log piped to a file or a collector reads
    // `node=n2`, not escape codes around it.
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colours)
        .init();
    let result = match Cli::parse().command {
        Command::Ring(args) => ring::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Check(args) => check::run(args),
        Command::Coordinator(args) => node::run(args, Role::Coordinator),
        Command::Server(args) => node::run(args, Role::Server),
        Command::Worker(args) => node::run(args, Role::Worker),
        Command::Local(args) => local::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Train(args) => train::run(*args),
        Command::Predict(args) => predict::run(args),
        Command::Gen(args) => r#gen::run(args),
    };
    commands::exit(result)
}
