//! `pserver sim seeds | tau-sweep | slots-sweep`: many seeded runs of the deterministic
//! simulator, and the sweeps.

mod seeds;
mod slots;
mod sweep;

use pserver_core::Consistency;
use pserver_core::filter::{Filters, Threshold};
use pserver_core::slots::PushSlots;

// The simulator is named in this one place; the submodules go through this module too.
use pserver_models::sim as simulator;
use simulator::{
    CoordinatorFaults, Faults, KeyLayout, MS, PaceReport, ServerFaults, SimConfig, SimFailure,
    SimReport, SimUpdater,
};

pub(crate) use seeds::run_seeds;
pub(crate) use sweep::tau_sweep;

use super::CliError;
use super::groups::{FilterArgs, StragglerArgs};
use super::values::{Factor, Probability, UpdateRule, at_least_one, push_slots, threshold};

/// Run whole clusters in the deterministic simulator, checking the invariants at every step.
///
/// With faults, on virtual time: many seeds (`seeds`), or how a workload's finish time moves
/// with the staleness bound (`tau-sweep`) or with push slots (`slots-sweep`).
#[derive(clap::Args, Debug)]
pub(crate) struct SimArgs {
    /// What to run.
    #[command(subcommand)]
    mode: SimMode,
}

/// What `pserver sim` runs; each takes the same description of a cluster and its faults.
#[derive(clap::Subcommand, Debug)]
enum SimMode {
    /// Run many seeds of one cluster, checking the invariants after every step.
    ///
    /// Each seed runs a coordinator, servers and workers (each worker: pull, compute, push,
    /// advance, for every iteration) on virtual time. A failing seed is printed with the
    /// command that replays it; the last line is always
    /// `sim seeds=N failed=F steps=X redirects=R secs=Y`, and the exit status is 1 if any seed
    /// failed.
    Seeds(SimOptions),
    /// How long the workload takes, and how much workers idle, as the staleness bound varies.
    ///
    /// Prints a row for tau in 0, 1, 2, 4, 8 and infinity, for tau moving between 1 and 8 as stragglers come and go
    /// (adaptive:1-8), for tau 1 with stragglers skipped ahead (skip-ahead:1), and the same
    /// with four shares per worker moved from slow workers to fast ones (skip-ahead+shares:1).
    TauSweep(SimOptions),
    /// The servers' peak receive queue with and without round-robin push slots.
    ///
    /// Prints the peak receive queue and the finish time of four workers pushing together, with
    /// and without push slots (those of --push-slots, default 8192:1), as `name value unit`
    /// lines.
    SlotsSweep(SimOptions),
}

/// A simulated cluster, its workload and its faults.
#[derive(clap::Args, Debug)]
pub(crate) struct SimOptions {
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
    #[arg(long, default_value_t = Probability::ZERO)]
    drop: Probability,
    /// Probability that a message is delivered twice.
    #[arg(long, default_value_t = Probability::ZERO)]
    dup: Probability,
    /// Deliver messages out of order (otherwise FIFO per pair of nodes, like TCP).
    #[arg(long)]
    reorder: bool,
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
    /// Give the job a standby coordinator and kill the active coordinator's process at a
    /// seeded time (once the standby holds its state); it starts again 3 s later as a fresh
    /// standby. Prints how long each takeover took (`takeover_ms`).
    #[arg(long)]
    crash_coordinator: bool,
    /// Give the job a standby coordinator and cut the active coordinator off from every node
    /// for 0.5 to 5 s: the standby takes over in some runs and not in others.
    #[arg(long)]
    partition_coordinator: bool,
    /// Skip encoding and decoding every message (faster, checks less).
    #[arg(long)]
    no_wire: bool,
    /// Virtual milliseconds after which an unfinished run counts as failed (completion).
    #[arg(long, default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(1..))]
    time_limit_ms: u64,
    /// Threads to run seeds on (default: one per core).
    #[arg(long, value_parser = at_least_one)]
    threads: Option<usize>,
    /// The servers' update rule: ftrl, adagrad, sgd or sum (default: picked by each seed).
    /// Every run checks the servers' values against a one-node oracle.
    #[arg(long, value_enum)]
    updater: Option<UpdateRule>,
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
    #[command(flatten)]
    stragglers: StragglerArgs,
    /// The slow worker (that of --slow-worker, else the first) computes F times slower from
    /// the middle of each run on (a machine that slows down mid-job).
    #[arg(long, value_name = "F", default_value_t = Factor::ONE)]
    slows_down: Factor,
    /// Cut each iteration's compute into this many parts, each pushed when done, so that a
    /// skip loses only the part not yet pushed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    parts: u32,
    #[command(flatten)]
    filters: FilterArgs,
    /// With --kkt: the bound within which a key's held change stays on the worker (pushed
    /// values are integers 1 to 100). Every run checks that what the requests carried sums to
    /// what was pushed.
    #[arg(long, value_name = "BOUND", default_value = "50", value_parser = threshold, requires = "kkt")]
    kkt_bound: Threshold,
}

/// Runs `pserver sim`: the seeds or a sweep. A failed seed or a broken invariant in a sweep is
/// a [`CliError::Found`], once reported.
pub(crate) fn run(args: SimArgs) -> Result<(), CliError> {
    let (SimMode::Seeds(opts) | SimMode::TauSweep(opts) | SimMode::SlotsSweep(opts)) = &args.mode;
    let protocol = Protocol::from_mutation(opts.mutation.as_deref()).map_err(CliError::Input)?;
    let base = config(opts);
    base.validate().map_err(CliError::input)?;
    match args.mode {
        SimMode::Seeds(opts) => seeds(&opts, &base, protocol),
        SimMode::TauSweep(opts) => sweep(&opts, &base, protocol),
        SimMode::SlotsSweep(opts) => slots::print(&opts, protocol),
    }
}

/// Runs the seeds on `base` and prints their summaries.
fn seeds(args: &SimOptions, base: &SimConfig, protocol: Protocol) -> Result<(), CliError> {
    let threads = super::threads_or_cores(args.threads);
    eprintln!(
        "seeds {}..{} ({} threads)",
        args.first_seed,
        args.first_seed.saturating_add(args.seeds),
        threads
    );
    let batch = run_seeds(base, protocol, args.first_seed, args.seeds, threads, true);
    if base.crash_servers > 0 || base.ring.replicas > 0 || base.join_servers > 0 {
        println!("{}", batch.server_fault_summary());
        println!("{}", batch.recovery_summary());
        println!("{}", batch.replication_summary());
    }
    if base.coordinator_faults.any() {
        println!("{}", batch.takeover_summary());
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
fn config(args: &SimOptions) -> SimConfig {
    let slow = args.stragglers.slow_worker;
    let mut cfg = SimConfig {
        servers: args.servers as usize,
        workers: args.workers as usize,
        keys: args.keys,
        iterations: args.iterations,
        consistency: args.consistency,
        faults: Faults {
            drop: args.drop.get(),
            dup: args.dup.get(),
            reorder: args.reorder,
            partition: args.partition,
            crash: args.crash,
        },
        straggler: args.stragglers.straggler.map_or(1.0, Factor::get),
        slow_worker: slow.map_or(1.0, |s| s.factor.get()),
        slow_index: slow.map_or(0, |s| s.worker),
        slows_down: args.slows_down.get(),
        stragglers: args.stragglers.policy(),
        parts: args.parts,
        wire: !args.no_wire,
        time_limit: args.time_limit_ms * MS,
        updater: args.updater.map(|u| match u {
            UpdateRule::Sum => SimUpdater::Sum,
            UpdateRule::Sgd => SimUpdater::Sgd,
            UpdateRule::Adagrad => SimUpdater::AdaGrad,
            UpdateRule::Ftrl => SimUpdater::Ftrl,
        }),
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
        coordinator_faults: CoordinatorFaults {
            crash: args.crash_coordinator,
            partition: args.partition_coordinator,
        },
        push_slots: args.push_slots,
        filters: args.filters.filters(Some(args.kkt_bound)),
        receive_rate: args.receive_rate,
        key_layout: args.key_layout,
        compute: args.compute_ms * MS,
        latency: args.latency_us * (MS / 1000),
        ..SimConfig::default()
    };
    cfg.ring.replicas = args.replicas;
    cfg
}

/// Runs the tau sweep on `base` and prints a row per tau.
fn sweep(args: &SimOptions, base: &SimConfig, protocol: Protocol) -> Result<(), CliError> {
    let seeds = args.seeds.min(20);
    println!(
        "# tau sweep: {} workers, {} iterations, straggler {}x, slow worker {}x, slows down {}x, seeds {}..{}",
        args.workers,
        args.iterations,
        base.straggler,
        base.slow_worker,
        base.slows_down,
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
