//! `pserver sim`: many seeded runs of the deterministic simulator, and the tau sweep.

mod seeds;
mod slots;
mod sweep;

use pserver_core::Consistency;

use pserver_core::filter::{Filters, KeyCaching, Kkt, Threshold};

use pserver_core::pace::{Balance, Detection, StragglerPolicy, TauRange};

use pserver_core::slots::PushSlots;

// The simulator is named in this one place; the submodules go through this module too.
use pserver_models::sim as simulator;
use simulator::{
    Faults, KeyLayout, MS, PaceReport, ServerFaults, SimConfig, SimFailure, SimReport, SimUpdater,
};

pub(crate) use seeds::run_seeds;
pub(crate) use sweep::tau_sweep;

use super::CliError;
use super::parse::{
    at_least_one, factor, key_caching, kkt, probability, push_slots, tau_range, threshold,
};

/// Run whole clusters in the deterministic simulator, with faults, checking the protocol's
/// invariants after every step.
///
/// Each seed runs a coordinator, servers and workers (each worker: pull, compute, push,
/// advance, for every iteration) on virtual time. A failing seed is printed with the
/// command that replays it; the last line is always
/// `sim seeds=N failed=F steps=X redirects=R secs=Y`, and the exit status is 1 if any seed
/// failed.
/// With --tau-sweep, prints instead how long the workload takes, and how much workers
/// idle, for tau in 0, 1, 2, 4, 8 and infinity, for tau moving between 1 and 8 as stragglers
/// come and go (adaptive:1-8), for tau 1 with stragglers skipped ahead (skip-ahead:1), and
/// the same with four shares per worker moved from slow workers to fast ones
/// (skip-ahead+shares:1). With --slots-sweep, prints instead the servers' peak receive queue
/// and the finish time of four workers pushing together, with and without round-robin push
/// slots.
#[derive(clap::Args, Debug)]
pub(crate) struct SimArgs {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// First seed; seeds run from here upwards.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Servers in the simulated cluster.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    servers: u32,
    /// Workers in the simulated cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Size of the key space.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    keys: u64,
    /// Iterations each worker runs.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    iterations: u32,
    /// Consistency model: sequential, bounded:TAU or eventual.
    #[arg(long, default_value = "sequential")]
    consistency: Consistency,
    /// Probability that a message is lost.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    drop: f64,
    /// Probability that a message is delivered twice.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    dup: f64,
    /// Deliver messages out of order (otherwise FIFO per pair of nodes, like TCP).
    #[arg(long)]
    reorder: bool,
    /// Each iteration one worker, chosen at random, computes this many times slower.
    #[arg(long, default_value_t = 1.0, value_parser = factor)]
    straggler: f64,
    /// The first worker always computes this many times slower (a slow machine). Unlike
    /// transient stragglers, no staleness bound can hide it: everybody waits for it in the end.
    #[arg(long, default_value_t = 1.0, value_parser = factor)]
    slow_worker: f64,
    /// The first worker computes this many times slower from the middle of each run on (a
    /// machine that slows down mid-job).
    #[arg(long, default_value_t = 1.0, value_parser = factor)]
    slows_down: f64,
    /// Detect stragglers: the coordinator flags a worker more than this many iterations
    /// behind the median of the others (default 1 with --skip-ahead or --adaptive-tau).
    #[arg(long, value_parser = clap::value_parser!(u32))]
    detect_lag: Option<u32>,
    /// Under bounded delay, let the coordinator move a straggler to the others' iteration
    /// instead of holding everybody at the bound.
    #[arg(long)]
    skip_ahead: bool,
    /// Under bounded delay, move tau within MIN:MAX: up while stragglers are found, down once
    /// they clear.
    #[arg(long, value_parser = tau_range)]
    adaptive_tau: Option<TauRange>,
    /// Cut the work into this many shares per worker, and let the coordinator move shares
    /// from slow workers to fast ones by the speed they report (at least 1 each, at most
    /// twice this many).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    shares: Option<u16>,
    /// Cut each iteration's compute into this many parts, each pushed when done, so that a
    /// skip loses only the part not yet pushed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    parts: u32,
    /// Cut nodes off the network for a while, then heal.
    #[arg(long)]
    partition: bool,
    /// Crash one worker mid-run.
    #[arg(long)]
    crash: bool,
    /// Replicas of every key range besides its primary (on the next distinct servers of the
    /// ring); must be smaller than --servers. With replicas, --partition also cuts a server off
    /// from the other servers or makes one flap (by the seed).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..64))]
    replicas: u32,
    /// Servers that crash during each run, at most --replicas: one at a time, each once the
    /// cluster recovered from the one before (its replicas refilled). The seed picks whether a
    /// crashed server stays down or restarts, and a later crash may hit a server a range copy
    /// is on its way to.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..64))]
    crash_servers: u32,
    /// Servers that join each run while it goes on: they copy the ranges the ring will give
    /// them while the old holders serve, then the ring switches.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..64))]
    join_servers: u32,
    /// Servers that leave each run while it goes on: their ranges are copied to the servers
    /// taking them over first.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..64))]
    leave_servers: u32,
    /// Restart the crashed servers that restart within the heartbeat timeout, before the
    /// coordinator declares them dead: the new process registers under a new incarnation, is
    /// taken off the ring and joins again.
    #[arg(long)]
    quick_restart: bool,
    /// Membership under stress: the joins, leaves and first crash come close together so that
    /// they overlap, membership messages are delayed and reordered, and a crashed server's
    /// messages still on the network arrive late, after its restart.
    #[arg(long)]
    membership_stress: bool,
    /// Skip encoding and decoding every message (faster, checks less).
    #[arg(long)]
    no_wire: bool,
    /// Virtual milliseconds after which an unfinished run counts as failed (completion).
    #[arg(long, default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(1..))]
    time_limit_ms: u64,
    /// Threads to run seeds on (default: one per core).
    #[arg(long, value_parser = at_least_one)]
    threads: Option<usize>,
    /// Print finish time and idle fraction for tau in 0, 1, 2, 4, 8, inf, adaptive tau and
    /// skip-ahead instead.
    #[arg(long)]
    tau_sweep: bool,
    /// The servers' update rule: sum, sgd, adagrad or ftrl (default: picked by each seed).
    /// Every run checks the servers' values against a one-node oracle.
    #[arg(long)]
    updater: Option<SimUpdater>,
    /// Start every run with the ring already changed: one server's ranges moved away, workers
    /// partly on the old ring, so that they are redirected (default: one run in four).
    #[arg(long, conflicts_with = "no_ring_change")]
    ring_change: bool,
    /// Never start a run with the ring changed.
    #[arg(long)]
    no_ring_change: bool,
    /// Run a deliberately broken protocol, e.g. no-dedupe or wrong-sign (needs a build with
    /// --features mutations).
    #[arg(long)]
    mutation: Option<String>,
    /// Round-robin push slots: push slices of at least MIN_BYTES bytes wait for one of
    /// AT_ONCE slots per server, which the workers take in turn (MIN_BYTES:AT_ONCE).
    #[arg(long, value_parser = push_slots)]
    push_slots: Option<PushSlots>,
    /// Workers run their pushes through the significantly-modified filter at THETA (pushed
    /// values are integers 1 to 100): a key's change goes once it adds up to more. Each
    /// worker flushes with its last iteration, and every run checks that what its requests
    /// carried sums to what it pushed.
    #[arg(long, value_name = "THETA", value_parser = threshold)]
    sigmod: Option<Threshold>,
    /// Key caching: workers name the key lists they sent a server before by digest, servers
    /// keep LISTS lists per worker (256 if none is given) and ask for one they do not hold,
    /// and answer pulls without keys. The oracle sees each named push as the keys it names.
    #[arg(long, value_name = "LISTS", num_args = 0..=1, default_missing_value = "256", value_parser = key_caching)]
    key_cache: Option<KeyCaching>,
    /// With --key-cache: pack the values sent without keys in the smallest exact form (zero
    /// rows left out, or LZ4), where it saves bytes.
    #[arg(long, requires = "key_cache")]
    compress: bool,
    /// Workers run their pushes through the KKT filter: a push of the keys of a pull holds
    /// back the change to each key the pull answered zero for while the change adds up to at
    /// most BOUND, for at most EVERY pushes. Every run checks that what the requests carried
    /// sums to what was pushed.
    #[arg(long, value_name = "BOUND:EVERY", value_parser = kkt)]
    kkt: Option<Kkt>,
    /// Servers work through the bytes that reach them at this many bytes per virtual
    /// millisecond, and the summary prints their peak receive queue (default: every message
    /// is handled as it arrives).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    receive_rate: Option<u64>,
    /// Where the keys sit: even, edges or boundaries (default: picked by each seed).
    #[arg(long)]
    key_layout: Option<KeyLayout>,
    /// Virtual milliseconds of compute per iteration on a worker that is not straggling.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    compute_ms: u64,
    /// One-way network latency in virtual microseconds.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    latency_us: u64,
    /// Print the servers' peak receive queue and the finish time of four workers pushing
    /// together, with and without push slots (those of --push-slots, default 8192:1), as
    /// `name value unit` lines, instead.
    #[arg(long, conflicts_with = "tau_sweep")]
    slots_sweep: bool,
}

/// Runs `pserver sim`: the seeds, or with `--tau-sweep` the sweep. A failed seed or a broken
/// invariant in the sweep is a [`CliError::Found`], once reported.
pub(crate) fn run(args: SimArgs) -> Result<(), CliError> {
    let protocol = Protocol::from_mutation(args.mutation.as_deref()).map_err(CliError::Input)?;
    let base = config(&args);
    base.validate().map_err(CliError::input)?;
    if args.tau_sweep {
        return sweep(&args, &base, protocol);
    }
    if args.slots_sweep {
        return slots::print(&args, protocol);
    }
    let threads = super::threads_or_cores(args.threads);
    eprintln!(
        "seeds {}..{} ({} threads)",
        args.first_seed,
        args.first_seed.saturating_add(args.seeds),
        threads
    );
    let batch = run_seeds(&base, protocol, args.first_seed, args.seeds, threads, true);
    if base.crash_servers > 0 || base.ring.replicas > 0 || base.join_servers > 0 {
        println!("{}", batch.server_fault_summary());
        println!("{}", batch.recovery_summary());
        println!("{}", batch.replication_summary());
    }
    if base.stragglers.detect.is_some() {
        println!("{}", batch.pace_summary());
    }
    if base.receive_rate.is_some() || base.push_slots.is_some() {
        println!("{}", batch.slots_summary());
    }
    if base.filters != Filters::none() {
        println!("{}", batch.filters_summary());
    }
    println!("{}", batch.summary());
    if batch.failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::Found)
    }
}

/// The simulation the arguments describe, before the seed.
fn config(args: &SimArgs) -> SimConfig {
    let mut filters = args
        .sigmod
        .map_or_else(Filters::none, Filters::significantly_modified);
    filters.key_caching = args.key_cache;
    filters.compression = args.compress;
    filters.kkt = args.kkt;
    let mut cfg = SimConfig {
        servers: args.servers as usize,
        workers: args.workers as usize,
        keys: args.keys,
        iterations: args.iterations,
        consistency: args.consistency,
        faults: Faults {
            drop: args.drop,
            dup: args.dup,
            reorder: args.reorder,
            partition: args.partition,
            crash: args.crash,
        },
        straggler: args.straggler,
        slow_worker: args.slow_worker,
        slows_down: args.slows_down,
        stragglers: policy(args),
        parts: args.parts,
        wire: !args.no_wire,
        time_limit: args.time_limit_ms * MS,
        updater: args.updater,
        ring_change: match (args.ring_change, args.no_ring_change) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        crash_servers: args.crash_servers as usize,
        join_servers: args.join_servers as usize,
        leave_servers: args.leave_servers as usize,
        quick_restart: args.quick_restart,
        membership_stress: args.membership_stress,
        push_slots: args.push_slots,
        filters,
        receive_rate: args.receive_rate,
        key_layout: args.key_layout,
        compute: args.compute_ms * MS,
        latency: args.latency_us * (MS / 1000),
        ..SimConfig::default()
    };
    cfg.ring.replicas = args.replicas;
    cfg
}

/// The straggler policy the arguments ask for: detection whenever anything acts on it.
fn policy(args: &SimArgs) -> StragglerPolicy {
    let mut policy = StragglerPolicy::default();
    if args.detect_lag.is_some()
        || args.skip_ahead
        || args.adaptive_tau.is_some()
        || args.shares.is_some()
    {
        policy.detect = Some(Detection::lagging(args.detect_lag.unwrap_or(1)));
    }
    policy.skip_ahead = args.skip_ahead;
    policy.adaptive_tau = args.adaptive_tau;
    policy.balance = args.shares.map(Balance::shares);
    policy
}

/// Runs the tau sweep on `base` and prints a row per tau.
fn sweep(args: &SimArgs, base: &SimConfig, protocol: Protocol) -> Result<(), CliError> {
    let seeds = args.seeds.min(20);
    println!(
        "# tau sweep: {} workers, {} iterations, straggler {}x, slow worker {}x, slows down {}x, seeds {}..{}",
        args.workers,
        args.iterations,
        args.straggler,
        args.slow_worker,
        args.slows_down,
        args.first_seed,
        args.first_seed + seeds
    );
    let rows = match tau_sweep(base, protocol, args.first_seed, seeds) {
        Ok(rows) => rows,
        Err(failure) => {
            eprintln!("{failure}");
            return Err(CliError::Found);
        }
    };
    for row in rows {
        println!(
            "tau={} finish_ms={:.1} idle_fraction={:.3} skipped_iterations={} max_tau={}",
            row.pacing.label,
            row.finish_ms,
            row.idle_fraction,
            row.pace.skipped_iterations,
            row.pace.max_tau
        );
    }
    Ok(())
}

/// Which protocol the simulated nodes run: the real one, or (in a build with the `mutations`
/// feature) a deliberately broken one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Protocol {
    /// The mechanism switched off, if any.
    #[cfg(feature = "mutations")]
    pub mutation: Option<simulator::SimMutation>,
}

impl Protocol {
    /// The protocol `--mutation NAME` asks for: the real one without a name; the named
    /// mutation with one, or in a build without the `mutations` feature an error that says how
    /// to make one.
    pub(crate) fn from_mutation(name: Option<&str>) -> Result<Self, String> {
        let Some(name) = name else {
            return Ok(Protocol::default());
        };
        #[cfg(feature = "mutations")]
        {
            name.parse().map(|m| Protocol { mutation: Some(m) })
        }
        #[cfg(not(feature = "mutations"))]
        {
            Err(format!(
                "--mutation {name} needs a build with the mutations feature: cargo run --release --features mutations -- ... --mutation {name}"
            ))
        }
    }

    /// Runs one simulation of `cfg` under this protocol.
    pub(crate) fn run(&self, cfg: &SimConfig) -> Result<SimReport, SimFailure> {
        #[cfg(feature = "mutations")]
        if let Some(m) = self.mutation {
            return simulator::run_mutated(cfg, m);
        }
        simulator::run(cfg)
    }
}
