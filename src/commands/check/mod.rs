//! `pserver check`: the model checker over the protocol's stateright models.

mod checker;
mod configs;

use std::time::Duration;

use pserver_core::Consistency;
use pserver_core::filter::KeyCaching;
use pserver_core::pace::TauRange;
use pserver_models::cluster::{NetworkKind, Strategy};

use super::CliError;
use super::sim::Protocol;
use super::values::{at_least_one, key_caching, tau_range};

pub(crate) use checker::{check_clock, check_cluster, check_standby, explore};

/// Model-check the protocol: explore every state of a small cluster and check its
/// properties.
///
/// The cluster model runs the core's own coordinator, servers and workers under stateright,
/// each worker pushing, advancing and pulling for every iteration. Prints one line per
/// property (`property NAME: holds | violated | found | not found`), the steps of any
/// counterexample, and last `check states=N unique=N depth=N secs=S`. Exits 1 if an
/// `always` property is violated. Keep models tiny: every actor and iteration multiplies
/// the states.
#[derive(clap::Args, Debug)]
pub(crate) struct CheckArgs {
    /// The model: cluster (the whole protocol), replication (key ranges copied between
    /// servers, in three configurations checked one after the other: a primary and a replica
    /// per range on 3 servers, one of which may crash; the same on 2 servers, which leaves one;
    /// and 1 server holding every range while a second joins at any point and takes a range
    /// over), standby (coordinator succession: an active coordinator, its standby and two
    /// workers on a lossy network, the active one crashing if --crashes is not 0, property
    /// `single-coordinator`) or clock (the range vector clock).
    /// The shape options change the replication model's shape too; giving --servers,
    /// --crashes, --joins or --replicas checks the one configuration they describe.
    // The help above explains every model; clap's list of them would only repeat it.
    #[arg(value_enum, default_value = "cluster", hide_possible_values = true)]
    model: ModelName,
    /// Explore breadth first (the default; shortest counterexamples, most memory).
    #[arg(long, group = "strategy")]
    bfs: bool,
    /// Explore depth first (less memory).
    #[arg(long, group = "strategy")]
    dfs: bool,
    /// Random walks from this seed instead of exhaustive search (see --timeout-secs).
    #[arg(long, value_name = "SEED", group = "strategy")]
    simulation: Option<u64>,
    /// How long --simulation walks.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_secs: u64,
    /// Servers [default: 2]. Giving any of the shape options (servers, workers, keys,
    /// iterations, crashes, joins, network, consistency, registration, ring change, backoff,
    /// skip-ahead, adaptive tau) checks that one shape, once per consistency model, instead of
    /// the default suite.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    servers: Option<u32>,
    /// Workers [default: 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    workers: Option<u32>,
    /// Keys each worker pushes and pulls (for the clock model: keys modelled one by one)
    /// [default: 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=8))]
    keys: Option<u64>,
    /// Iterations per worker [default: 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=4))]
    iterations: Option<u32>,
    /// Actors that may crash (adds heartbeats and failure detection) [default: 0].
    #[arg(long)]
    crashes: Option<usize>,
    /// Servers that join while the job runs (replication model only): each registers at a
    /// point the checker chooses, copies the ranges the next ring gives it and takes them
    /// over [default: 0].
    #[arg(long)]
    joins: Option<usize>,
    /// Replicas per key range (replication model only) [default: 1].
    #[arg(long)]
    replicas: Option<u32>,
    /// Network: ordered (per-pair FIFO, reliable, like TCP) or lossy (unordered, duplicating,
    /// lossy, like UDP) [default: lossy].
    #[arg(long)]
    network: Option<NetworkKind>,
    /// Consistency models to check, comma-separated [default: sequential,bounded:1].
    #[arg(long, value_delimiter = ',')]
    consistency: Vec<Consistency>,
    /// Model the registration phase instead of starting with epoch 1 in force.
    #[arg(long)]
    registration: bool,
    /// Start with the ring already changed on the coordinator and servers while the workers
    /// still hold the old one, so that requests are redirected and re-sliced.
    #[arg(long)]
    ring_change: bool,
    /// Model doubling retransmission timeouts (lossy network; each worker retransmits at most
    /// twice).
    #[arg(long)]
    backoff: bool,
    /// Straggler skip-ahead (bounded delay): once, at a point the checker chooses, the
    /// coordinator finds a worker lagging and tells it to skip to the others' iteration.
    /// Without other shape options: 1 server, 2 iterations, bounded:0, ordered network.
    #[arg(long)]
    skip_ahead: bool,
    /// Adaptive tau (bounded delay) within MIN:MAX: once, at a point the checker chooses, the
    /// coordinator's check finds a worker lagging and raises the bound, or finds none and
    /// lowers it. Without other shape options: 1 server, 1 iteration, bounded:1, ordered
    /// network; --adaptive-tau 0:2 is the range the default suite checks.
    #[arg(long, value_name = "MIN:MAX", value_parser = tau_range)]
    adaptive_tau: Option<TauRange>,
    /// Key caching, each side keeping LISTS lists per peer (2 if none is given, the model's
    /// own): the worker names a key list it sent the server before by its digest, the server
    /// asks for a list it does not hold and answers pulls without keys; each iteration's push
    /// leaves out one key, so that the lists differ. Without other shape options: 1 server, 1
    /// worker, 2 keys, 2 iterations, sequential, lossy network (about 240,000 states).
    /// `--mutation stale-key-cache` names lists by a stale entry.
    #[arg(long, value_name = "LISTS", num_args = 0..=1, default_missing_value = "2", value_parser = key_caching)]
    key_cache: Option<KeyCaching>,
    /// Check a deliberately broken protocol, e.g. no-dedupe or no-gating (needs a
    /// build with --features mutations).
    #[arg(long)]
    mutation: Option<String>,
    /// Serve stateright's Explorer for the chosen model (the first consistency model given)
    /// at this address instead.
    #[arg(long, value_name = "ADDR")]
    explore: Option<String>,
    /// Stop after about this many states: a bounded check, for models too large to exhaust
    /// (crashes, more iterations).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    max_states: Option<usize>,
    /// Checker threads (default: one per core).
    #[arg(long, value_parser = at_least_one)]
    threads: Option<usize>,
    /// Timer firings the standby model explores, over all nodes: each more multiplies the
    /// states by about three (6: about a million, a minute) [default: 6].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=12))]
    fires: Option<u32>,
}

/// Which model to check.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ModelName {
    /// The whole protocol: coordinator, servers, workers.
    Cluster,
    /// The whole protocol with key ranges copied between servers: fail-over after a server
    /// crash, and a server joining.
    Replication,
    /// Coordinator succession: standby coordinators and terms.
    Standby,
    /// The range vector clock against a per-key clock.
    Clock,
}

/// Runs `pserver check` and prints its verdicts; a violated `always` property is a
/// [`CliError::Found`].
pub(crate) fn run(args: CheckArgs) -> Result<(), CliError> {
    let threads = super::threads_or_cores(args.threads);
    let (configs, base) = configs::from_args(&args)?;
    let protocol = Protocol::from_mutation(args.mutation.as_deref()).map_err(CliError::Input)?;
    #[cfg(feature = "mutations")]
    if protocol.mutation == Some(pserver_models::sim::SimMutation::WrongSign) {
        return Err(CliError::Input(
            "--mutation wrong-sign breaks only what the simulator's oracle judges, which the \
             model checker does not: run it with pserver sim"
                .into(),
        ));
    }
    let clock_max_time = u8::try_from(base.iterations.max(1)).unwrap_or(u8::MAX);
    if let Some(address) = &args.explore {
        let first = configs.first().cloned().unwrap_or(base);
        return explore(args.model, first, protocol, clock_max_time, address)
            .map_err(CliError::Input);
    }
    let strategy = strategy(&args);
    let outcome = match args.model {
        ModelName::Cluster | ModelName::Replication => {
            check_cluster(&configs, protocol, strategy, threads, args.max_states)
                .map_err(CliError::Input)?
        }
        ModelName::Clock => check_clock(base.keys, clock_max_time, strategy, threads),
        ModelName::Standby => {
            let crash = args.crashes.is_none_or(|c| c > 0);
            check_standby(crash, args.fires, protocol, strategy, threads)
        }
    };
    print!("{}", outcome.text);
    if outcome.violated {
        Err(CliError::Found)
    } else {
        Ok(())
    }
}

/// How the arguments ask to explore the states.
fn strategy(args: &CheckArgs) -> Strategy {
    match (args.dfs, args.simulation) {
        (true, _) => Strategy::Dfs,
        (_, Some(seed)) => Strategy::Simulation {
            seed,
            timeout: Duration::from_secs(args.timeout_secs),
        },
        _ => Strategy::Bfs,
    }
}
