//! `pserver local`: a whole cluster in this process, over the in-memory transport, checked
//! exactly.

use std::time::Duration;

use pserver_core::Consistency;

use pserver_core::node::DEFAULT_MAX_SLICE_BYTES;

use pserver_core::wire::DEFAULT_MAX_FRAME;

use super::CliError;
use super::cluster::{LocalOptions, run_local};
use super::script::Script;
use super::values::{Probability, at_least_one};

/// Run a whole cluster in this process over the in-memory transport, run the script on
/// every worker, and check that the servers end with exactly what the workers pushed.
///
/// Prints `worker nN iterations=I pushes=P pushed_sum=S` for each worker, and last
/// `local servers=S workers=W keys=K iterations=N totals=exact|WRONG
/// refused=R secs=T`; the exit status is 1 if the totals are wrong.
#[derive(clap::Args, Debug)]
pub(crate) struct LocalArgs {
    /// Servers.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    servers: u32,
    /// Workers.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Keys each worker pushes and pulls every iteration.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    keys: u64,
    /// Iterations per worker.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    iterations: u32,
    /// Consistency model: sequential, bounded:TAU or eventual.
    #[arg(long, default_value = "bounded:2")]
    consistency: Consistency,
    /// Probability that the in-memory network loses a frame.
    #[arg(long, default_value_t = Probability::ZERO)]
    drop: Probability,
    /// Probability that it delivers a frame twice.
    #[arg(long, default_value_t = Probability::ZERO)]
    dup: Probability,
    /// Seed of the network's faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest frame in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME, value_parser = at_least_one)]
    max_frame: usize,
    /// Largest slice a worker puts in one message, in bytes (must fit a frame).
    #[arg(long, default_value_t = DEFAULT_MAX_SLICE_BYTES, value_parser = at_least_one)]
    max_slice_bytes: usize,
}

/// Runs `pserver local` and prints its summary line; totals other than exactly what the
/// workers pushed are a [`CliError::Found`].
pub(crate) fn run(args: LocalArgs) -> Result<(), CliError> {
    let opts = LocalOptions {
        servers: args.servers as usize,
        workers: args.workers as usize,
        consistency: args.consistency,
        script: Script {
            keys: args.keys,
            iterations: args.iterations,
            compute: Duration::ZERO,
        },
        drop: args.drop.get(),
        dup: args.dup.get(),
        seed: args.seed,
        max_frame: args.max_frame,
        max_slice_bytes: args.max_slice_bytes,
    };
    let outcome = super::runtime()?
        .block_on(run_local(&opts))
        .map_err(CliError::input)?;
    for (id, s) in &outcome.workers {
        println!(
            "worker {id} iterations={} pushes={} pushed_sum={}",
            s.iterations, s.pushes, s.pushed_sum
        );
    }
    println!(
        "local servers={} workers={} keys={} iterations={} totals={} refused={} secs={:.2}",
        opts.servers,
        opts.workers,
        opts.script.keys,
        opts.script.iterations,
        if outcome.exact() { "exact" } else { "WRONG" },
        outcome.refused,
        outcome.secs
    );
    if outcome.exact() {
        Ok(())
    } else {
        Err(CliError::Found)
    }
}
