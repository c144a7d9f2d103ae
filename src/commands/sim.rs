//! `pserver sim`: many seeded runs of the deterministic simulator, and the tau sweep.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
// The simulator is named in this one place; the rest of the module goes through this name.
use pserver_core::sim as simulator;
use pserver_core::{Consistency, RingConfig};
use pserver_transport::sync::{AtomicU64, Mutex, Ordering, Tickets};
use simulator::{Faults, MS, ServerFaults, SimConfig, SimFailure, SimReport, SimUpdater};

use super::CliError;
use super::parse::{factor, probability};

/// Run whole clusters in the deterministic simulator, with faults, checking the protocol's
/// invariants after every step.
///
/// Each seed runs a coordinator, servers and workers (each worker: pull, compute, push,
/// advance, for every iteration) on virtual time. A failing seed is printed with the
/// command that replays it; the last line is always
/// `sim seeds=N failed=F steps=X redirects=R secs=Y`, and the exit status is 1 if any seed
/// failed.
/// With --tau-sweep, prints instead how long the workload takes, and how much workers
/// idle, for tau in 0, 1, 2, 4, 8 and infinity.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100)]
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
    /// Skip encoding and decoding every message (faster, checks less).
    #[arg(long)]
    no_wire: bool,
    /// Virtual milliseconds after which an unfinished run counts as failed (completion).
    #[arg(long, default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(1..))]
    time_limit_ms: u64,
    /// Threads to run seeds on (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Print finish time and idle fraction for tau in 0, 1, 2, 4, 8, inf instead.
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
}

/// Runs `pserver sim`: the seeds, or with `--tau-sweep` the sweep. A failed seed or a broken
/// invariant in the sweep is a [`CliError::Found`], once reported.
pub fn run(args: SimArgs) -> Result<(), CliError> {
    let protocol = Protocol::from_mutation(args.mutation.as_deref()).map_err(CliError::Input)?;
    let base = SimConfig {
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
        ..SimConfig::default()
    };
    let base = SimConfig {
        ring: RingConfig {
            replicas: args.replicas,
            ..base.ring
        },
        ..base
    };
    base.validate().map_err(CliError::input)?;
    if args.tau_sweep {
        let seeds = args.seeds.min(20);
        println!(
            "# tau sweep: {} workers, {} iterations, straggler {}x, slow worker {}x, seeds {}..{}",
            args.workers,
            args.iterations,
            args.straggler,
            args.slow_worker,
            args.first_seed,
            args.first_seed + seeds
        );
        let rows = match tau_sweep(&base, protocol, args.first_seed, seeds) {
            Ok(rows) => rows,
            Err(failure) => {
                eprintln!("{failure}");
                return Err(CliError::Found);
            }
        };
        for row in rows {
            println!(
                "tau={} finish_ms={:.1} idle_fraction={:.3}",
                tau_label(row.consistency),
                row.finish_ms,
                row.idle_fraction
            );
        }
        return Ok(());
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
    println!("{}", batch.summary());
    if batch.failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::Found)
    }
}

/// The outcome of running a range of seeds.
#[derive(Debug, Default)]
pub struct Batch {
    /// Seeds run.
    pub seeds: u64,
    /// Failed runs, by seed.
    pub failures: Vec<SimFailure>,
    /// Events processed over all runs.
    pub steps: u64,
    /// Redirects workers followed over all successful runs.
    pub redirects: u64,
    /// Wall-clock seconds.
    pub secs: f64,
    /// Server faults over all successful runs, by kind.
    pub server_faults: ServerFaults,
    /// Recovery time of every server crash recovered from, over all successful runs.
    pub recoveries: Vec<pserver_core::Time>,
    /// Values workers sent in pushes, over all successful runs.
    pub pushed_values: u64,
    /// Values primaries sent their replicas in updates, over all successful runs.
    pub replicated_values: u64,
    /// Values one replicated sum per key and iteration would carry, over all successful runs.
    pub aggregate_values: u64,
}

impl Batch {
    /// The summary line: `sim seeds=N failed=F steps=X redirects=R secs=Y`.
    pub fn summary(&self) -> String {
        format!(
            "sim seeds={} failed={} steps={} redirects={} secs={:.2}",
            self.seeds,
            self.failures.len(),
            self.steps,
            self.redirects,
            self.secs
        )
    }

    /// How long the cluster took to serve every range again after a server crash, in virtual
    /// milliseconds: `recovery_ms mean=M max=X crashes=N` (N the crashes recovered from).
    pub fn recovery_summary(&self) -> String {
        let n = self.recoveries.len();
        let ms = |t: pserver_core::Time| t as f64 / MS as f64;
        let mean = if n == 0 {
            0.0
        } else {
            self.recoveries.iter().map(|&t| ms(t)).sum::<f64>() / n as f64
        };
        let max = self.recoveries.iter().copied().max().map_or(0.0, ms);
        format!("recovery_ms mean={mean:.1} max={max:.1} crashes={n}")
    }

    /// Replication traffic against push traffic, in values sent (resends included), and the
    /// floor one replicated sum per key and iteration would reach: `replication
    /// pushed_values=P replicated_values=R ratio=R/P aggregate_ratio=A/P`.
    pub fn replication_summary(&self) -> String {
        let of_pushed = |v: u64| {
            if self.pushed_values == 0 {
                0.0
            } else {
                v as f64 / self.pushed_values as f64
            }
        };
        format!(
            "replication pushed_values={} replicated_values={} ratio={:.3} aggregate_ratio={:.3}",
            self.pushed_values,
            self.replicated_values,
            of_pushed(self.replicated_values),
            of_pushed(self.aggregate_values)
        )
    }

    /// The server faults injected, by kind: `server_faults crashes=C restarts=R
    /// crashes_during_copy=D crashes_after_copy=A cut_offs=X flaps=F joins=J leaves=L`.
    pub fn server_fault_summary(&self) -> String {
        let f = &self.server_faults;
        format!(
            "server_faults crashes={} restarts={} crashes_during_copy={} crashes_after_copy={} cut_offs={} flaps={} joins={} leaves={}",
            f.crashes,
            f.restarts,
            f.crashes_during_copy,
            f.crashes_after_copy,
            f.cut_offs,
            f.flaps,
            f.joins,
            f.leaves
        )
    }
}

/// Which protocol the simulated nodes run: the real one, or (in a build with the `mutations`
/// feature) a deliberately broken one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Protocol {
    /// The mechanism switched off, if any.
    #[cfg(feature = "mutations")]
    pub mutation: Option<pserver_core::Mutation>,
}

impl Protocol {
    /// The protocol `--mutation NAME` asks for: the real one without a name; the named
    /// mutation with one, or in a build without the `mutations` feature an error that says how
    /// to make one.
    pub fn from_mutation(name: Option<&str>) -> Result<Self, String> {
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
    pub fn run(&self, cfg: &SimConfig) -> Result<SimReport, SimFailure> {
        #[cfg(feature = "mutations")]
        if let Some(m) = self.mutation {
            return simulator::run_mutated(cfg, m);
        }
        simulator::run(cfg)
    }
}

/// Runs seeds `first..first + seeds` of `base` on `threads` threads, showing progress on stderr
/// when `progress` is set. Failures come back sorted by seed.
pub fn run_seeds(
    base: &SimConfig,
    protocol: Protocol,
    first: u64,
    seeds: u64,
    threads: usize,
    progress: bool,
) -> Batch {
    let start = Instant::now();
    let tickets = Tickets::new(first, first.saturating_add(seeds));
    let steps = AtomicU64::new(0);
    let redirects = AtomicU64::new(0);
    let pushed = AtomicU64::new(0);
    let replicated = AtomicU64::new(0);
    let aggregate = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    let faults = Mutex::new((ServerFaults::default(), Vec::new()));
    let bar = if progress {
        let bar = ProgressBar::new(seeds);
        let style =
            ProgressStyle::with_template("{bar:40} {pos}/{len} seeds {elapsed} ({eta} left) {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar
    } else {
        ProgressBar::hidden()
    };
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                while let Some(seed) = tickets.claim() {
                    match protocol.run(&SimConfig {
                        seed,
                        ..base.clone()
                    }) {
                        Ok(report) => {
                            steps.fetch_add(report.steps, Ordering::Relaxed);
                            redirects.fetch_add(report.redirects, Ordering::Relaxed);
                            pushed.fetch_add(report.pushed_values, Ordering::Relaxed);
                            replicated.fetch_add(report.replicated_values, Ordering::Relaxed);
                            aggregate.fetch_add(report.aggregate_values, Ordering::Relaxed);
                            if let Ok(mut f) = faults.lock() {
                                f.0.add(&report.server_faults);
                                f.1.extend_from_slice(&report.recoveries);
                            }
                        }
                        Err(failure) => {
                            bar.suspend(|| eprintln!("{failure}"));
                            steps.fetch_add(failure.step, Ordering::Relaxed);
                            if let Ok(mut f) = failures.lock() {
                                f.push(failure);
                                bar.set_message(format!("{} failed", f.len()));
                            }
                        }
                    }
                    bar.inc(1);
                }
            });
        }
    });
    bar.finish_and_clear();
    let mut failures = failures.into_inner().unwrap_or_default();
    failures.sort_by_key(|f| f.seed);
    let (server_faults, recoveries) = faults.into_inner().unwrap_or_default();
    Batch {
        server_faults,
        recoveries,
        seeds,
        failures,
        steps: steps.into_inner(),
        redirects: redirects.into_inner(),
        pushed_values: pushed.into_inner(),
        replicated_values: replicated.into_inner(),
        aggregate_values: aggregate.into_inner(),
        secs: start.elapsed().as_secs_f64(),
    }
}

/// One row of the tau sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRow {
    /// The consistency model (tau = 0 is sequential, inf is eventual).
    pub consistency: Consistency,
    /// Mean virtual time to finish the workload, in milliseconds.
    pub finish_ms: f64,
    /// Mean fraction of worker time spent waiting.
    pub idle_fraction: f64,
}

/// The staleness bounds the sweep tries: 0 (sequential), 1, 2, 4, 8 and infinity (eventual).
pub fn sweep_models() -> Vec<Consistency> {
    let mut models = vec![Consistency::Sequential];
    models.extend([1, 2, 4, 8].map(Consistency::BoundedDelay));
    models.push(Consistency::Eventual);
    models
}

/// Runs `base` under every model of [`sweep_models`] for seeds `first..first + seeds` and
/// averages finish time and idle fraction. Fails on the first broken invariant.
pub fn tau_sweep(
    base: &SimConfig,
    protocol: Protocol,
    first: u64,
    seeds: u64,
) -> Result<Vec<SweepRow>, SimFailure> {
    let mut rows = Vec::new();
    for consistency in sweep_models() {
        let (mut finish, mut idle) = (0.0, 0.0);
        for seed in first..first + seeds.max(1) {
            let report = protocol.run(&SimConfig {
                seed,
                consistency,
                ..base.clone()
            })?;
            finish += report.finish as f64 / MS as f64;
            idle += report.idle_fraction;
        }
        let n = seeds.max(1) as f64;
        rows.push(SweepRow {
            consistency,
            finish_ms: finish / n,
            idle_fraction: idle / n,
        });
    }
    Ok(rows)
}

/// How a sweep row names its tau.
pub fn tau_label(c: Consistency) -> String {
    match c.tau() {
        Some(t) => t.to_string(),
        None => "inf".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_every_seed_and_failure() {
        let base = SimConfig {
            faults: Faults {
                drop: 0.1,
                ..Faults::default()
            },
            ..SimConfig::default()
        };
        let batch = run_seeds(&base, Protocol::default(), 5, 8, 2, false);
        assert_eq!(batch.seeds, 8);
        assert!(batch.failures.is_empty());
        assert!(batch.steps > 0);
        assert!(batch.summary().starts_with("sim seeds=8 failed=0 steps="));
        assert!(batch.summary().contains(" redirects="));

        let changed = SimConfig {
            ring_change: Some(true),
            servers: 3,
            ..base.clone()
        };
        let batch = run_seeds(&changed, Protocol::default(), 0, 8, 2, false);
        assert!(batch.failures.is_empty());
        assert!(batch.redirects > 0, "{}", batch.summary());

        let hopeless = SimConfig {
            time_limit: MS,
            ..base
        };
        let batch = run_seeds(&hopeless, Protocol::default(), 0, 3, 2, false);
        let seeds: Vec<u64> = batch.failures.iter().map(|f| f.seed).collect();
        assert_eq!(seeds, vec![0, 1, 2]);
    }

    #[test]
    fn the_batch_sums_server_faults_and_recovery_times() {
        let mut base = SimConfig {
            servers: 3,
            crash_servers: 1,
            ..SimConfig::default()
        };
        base.ring.replicas = 1;
        let batch = run_seeds(&base, Protocol::default(), 0, 6, 2, false);
        assert!(batch.failures.is_empty(), "{:?}", batch.failures);
        assert_eq!(batch.recoveries.len(), batch.server_faults.crashed());
        assert!(!batch.recoveries.is_empty());
        let line = batch.recovery_summary();
        assert!(line.starts_with("recovery_ms mean="), "{line}");
        assert!(
            line.ends_with(&format!(" crashes={}", batch.recoveries.len())),
            "{line}"
        );
        assert!(
            batch
                .server_fault_summary()
                .starts_with("server_faults crashes=")
        );
    }

    #[test]
    fn the_sweep_has_the_papers_shape_bounded_delay_beats_sequential() {
        let base = SimConfig {
            straggler: 4.0,
            workers: 4,
            iterations: 20,
            ..SimConfig::default()
        };
        let rows = tau_sweep(&base, Protocol::default(), 0, 3).unwrap();
        let labels: Vec<String> = rows.iter().map(|r| tau_label(r.consistency)).collect();
        assert_eq!(labels, ["0", "1", "2", "4", "8", "inf"]);
        let sequential = &rows[0];
        for bounded in &rows[1..5] {
            assert!(bounded.finish_ms < sequential.finish_ms, "{rows:?}");
            assert!(bounded.idle_fraction < sequential.idle_fraction, "{rows:?}");
        }
    }
}
