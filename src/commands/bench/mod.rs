//! `pserver bench push | train | stragglers | filters | checkpoint`: push and pull over each
//! transport next to raw TCP, training next to a plain loop and Vowpal Wabbit, straggler
//! handling, filters, and checkpoints next to `cp`, each with its baseline measured in the same
//! run, so that every figure reads as a ratio.
//!
//! Every measure is one `name value unit` line; [`Measure::line`] gives it.

mod checkpoint;
mod child;
mod filters;
mod loopback;
mod options;
mod raw_tcp;
mod reached;
mod requests;
mod stragglers;
mod train;
mod usage;
mod vw;

use pserver_core::Consistency;
use pserver_runtime::{ClusterSpec, RuntimeError};

use super::CliError;
use clap::ValueEnum;
use loopback::start;
use options::{dense_sizes, spelled, wants};
use raw_tcp::raw_tcp;
use requests::{SPARSE_SPACE, dense, round_trips, sparse, sparse_keys};
use std::collections::BTreeMap;

use pserver_core::ring::Ring;
use pserver_core::{Key, NodeId};

pub(crate) use options::{BenchOptions, DenseSize, Kind, Topology, Transport};

/// Measure pserver next to baselines run in the same process, each figure read as a ratio.
///
/// Four measures: push and pull over each transport against raw TCP (`push`), training
/// against a plain loop and Vowpal Wabbit (`train`), straggler handling (`stragglers`) and
/// filters (`filters`). Build with --release.
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// What to measure.
    #[command(subcommand)]
    mode: BenchMode,
}

/// What `pserver bench` measures.
#[derive(clap::Subcommand, Debug)]
enum BenchMode {
    /// Push and pull throughput and latency over each transport, next to raw TCP.
    ///
    /// Over mem, tcp and udp, with one server and one worker, then two of each, on loopback; a
    /// raw TCP stream and ping-pong are the baselines, measured in the same run.
    ///
    /// Dense requests carry contiguous keys; sparse ones 1M keys drawn from 2^24 (64K with
    /// --quick); each runs on a cluster whose ring is told the key space of its keys, and with
    /// two servers `...share.nN` says what fraction of the keys each server is the primary of;
    /// `udp_lossy` drops 0.1% of the datagrams. Every dense measure checks that the servers
    /// end with exactly the pushes sent, and fails otherwise. Prints one `name value unit` line
    /// per measure (GB/s of values, million keys per second, microseconds); --table adds each
    /// figure's ratio to the raw TCP baseline.
    Push(PushArgs),
    /// Training throughput and test AUC next to a plain loop and Vowpal Wabbit.
    ///
    /// Logistic regression on a generated click-shaped problem (500,000 rows of 4M features,
    /// 3 epochs; 20,000 rows with --quick) and then on a text-shaped one (`train.text.*`:
    /// 20,000 rows of 90 valued words of 100,000, 5 epochs; 5,000 rows with --quick), by a
    /// floor (the same update rule over a flat array in one thread), by Vowpal Wabbit (one
    /// pass, when the vw command or the vowpalwabbit Python module is installed) and by
    /// pserver train with 1 server and 1 worker over mem, 2 and 2 over mem, and 1 and 1 over
    /// tcp: rows/s overall and per epoch (parsing apart), CPU-seconds per million rows, peak
    /// RSS, test AUC after each epoch, the epoch and the seconds at which it first reached
    /// VW's AUC, and each figure's ratio to the floor and to VW. Then `pserver train` as a
    /// process of its own for one epoch, 1 + 1 and 2 + 2, measured from outside as VW is:
    /// rows/s and CPU per row with parsing and startup, and their ratios to VW's.
    Train(TrainBenchArgs),
    /// Straggler handling: time and test AUC with slow and transient stragglers.
    ///
    /// On the shipped UCI Adult data: with worker 0 always 4x slower,
    /// sequential consistency against bounded delay 1 with skip-ahead and 8 shares per worker
    /// sized by speed (time and test AUC); with transient stragglers, fixed tau 0, 1, 2, 4, 8
    /// against adaptive tau 1-8 (FTRL alpha 0.01, 20 epochs; when each median learning curve
    /// first reaches the lowest test log loss a fixed tau's reaches). Each configuration runs
    /// 11 times (a few minutes). Runs from the repository's root.
    Stragglers(QuickArgs),
    /// What the filters save, and what they cost, next to unfiltered training.
    ///
    /// Unfiltered training against key caching, key caching with value compression, and both
    /// with the significantly-modified filter at 1, on the shipped UCI Adult data (2
    /// servers, 4 workers, 10 epochs, over mem) and on a generated problem (that of `bench
    /// train`, --train-rows rows, 2 million by default; 2 servers, 4 workers, 3 epochs, over
    /// mem and tcp): the bytes every node sent in the last epoch, test AUC, rows/s and CPU
    /// seconds per million rows, each with its ratio to unfiltered training, medians of
    /// --rounds runs. Runs from the repository's root.
    Filters(FiltersBenchArgs),
    /// What a whole-job checkpoint costs, next to `cp` and to training without checkpoints.
    ///
    /// One server holding a model of --mb MiB (FTRL weights and their state; 1 GiB by default)
    /// writes a checkpoint: the time from the workers' advance into the cut until it is
    /// recorded (taken from the store, encoded, written, flushed, renamed), and how long the
    /// workers were held for it, next to `cp` of the same file and `cp` with a flush of the
    /// copy, on the same disk (--dir), and the job started again from it until the model is
    /// served again. Then training on `bench train`'s generated problem with a checkpoint after
    /// every epoch (the default of `pserver train --checkpoint-dir`) next to training without,
    /// in --rounds pairs of runs whose order alternates: the slowdown is the median of the
    /// pairs' ratios.
    Checkpoint(CheckpointBenchArgs),
}

/// The arguments of `pserver bench checkpoint`.
#[derive(clap::Args, Debug)]
struct CheckpointBenchArgs {
    #[command(flatten)]
    run: QuickArgs,
    /// The model's size in MiB (16 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536))]
    mb: Option<u64>,
    /// Where the checkpoints and the copies are written: the disk measured. Default: the
    /// temporary directory.
    #[arg(long, value_name = "DIR")]
    dir: Option<std::path::PathBuf>,
    /// Pairs of training runs, one with checkpoints and one without (default 9; 1 with
    /// --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=99))]
    rounds: Option<u32>,
}

/// How long a benchmark runs.
#[derive(clap::Args, Debug)]
struct QuickArgs {
    /// Seconds instead of minutes: small problems, few repetitions (a smoke test of the
    /// benchmark itself).
    #[arg(long)]
    quick: bool,
}

/// What `pserver bench push` measures.
#[derive(clap::Args, Debug)]
struct PushArgs {
    #[command(flatten)]
    run: QuickArgs,
    /// Also print a table with each figure's ratio to the raw TCP baselines.
    #[arg(long)]
    table: bool,
    /// The transports to measure, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "mem,tcp,udp")]
    transports: Vec<Transport>,
    /// Only these dense request sizes, comma-separated (values per request); by default all
    /// of them (1K and 64K with --quick).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<DenseSize>,
    /// Only these kinds of measure, comma-separated: dense push/pull, sparse push/pull, small
    /// round trips; by default all of them. The raw TCP baselines always run.
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<Kind>,
    /// Only these cluster shapes, comma-separated (servers `s`, workers `w`); by default both.
    #[arg(long, value_delimiter = ',')]
    topologies: Vec<Topology>,
}

/// The size of a generated training problem.
#[derive(clap::Args, Debug)]
struct RowsArgs {
    /// Training rows of the generated problem (and a tenth as many test rows).
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..))]
    train_rows: Option<u64>,
}

/// What `pserver bench train` measures.
#[derive(clap::Args, Debug)]
struct TrainBenchArgs {
    #[command(flatten)]
    run: QuickArgs,
    /// Also print a table with each figure's ratio to the floor and to VW.
    #[arg(long)]
    table: bool,
    #[command(flatten)]
    rows: RowsArgs,
}

/// What `pserver bench filters` measures.
#[derive(clap::Args, Debug)]
struct FiltersBenchArgs {
    #[command(flatten)]
    run: QuickArgs,
    #[command(flatten)]
    rows: RowsArgs,
    /// Measure only over TCP: the generated problem's TCP runs, for a link shaped outside the
    /// process (`scripts/filters-1gbit` runs them over a 1 Gbit/s link).
    #[arg(long)]
    tcp_only: bool,
    /// Run every configuration this many times, in rounds of one run each, and report the
    /// median of each figure: rows/s on a shared machine moves by tens of percent from run to
    /// run [default: 3, 1 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=99))]
    rounds: Option<u32>,
}

/// Runs `pserver bench`: prints every measure as it is known, then with `--table` the table of
/// ratios to the baselines.
pub(crate) fn run(args: BenchArgs) -> Result<(), CliError> {
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: a debug build; benchmark figures come from `cargo run --release -- bench`"
        );
    }
    let rt = super::runtime()?;
    match args.mode {
        BenchMode::Stragglers(QuickArgs { quick }) => {
            rt.block_on(stragglers::run_stragglers_bench(
                quick,
                &mut |m: Measure| println!("{}", m.line()),
            ))
            .map_err(CliError::failed)?;
        }
        BenchMode::Filters(args) => {
            let quick = args.run.quick;
            let rows = args.rows.train_rows.or((!quick).then_some(2_000_000));
            let size = train::TrainSize::new(quick, rows);
            rt.block_on(filters::run_filters_bench(
                quick,
                args.tcp_only,
                size,
                args.rounds
                    .map_or(if quick { 1 } else { 3 }, |r| r as usize),
                &mut |m: Measure| println!("{}", m.line()),
            ))
            .map_err(CliError::failed)?;
        }
        BenchMode::Checkpoint(args) => {
            let quick = args.run.quick;
            let mb = args.mb.unwrap_or(if quick { 16 } else { 1024 });
            let dir = args.dir.unwrap_or_else(std::env::temp_dir);
            let rounds = args
                .rounds
                .map_or(if quick { 1 } else { 9 }, |r| r as usize);
            let size = train::TrainSize::new(quick, None);
            rt.block_on(checkpoint::run_checkpoint_bench(
                mb,
                &dir,
                (size, rounds),
                &mut |m: Measure| println!("{}", m.line()),
            ))
            .map_err(CliError::failed)?;
        }
        BenchMode::Train(args) => {
            let size = train::TrainSize::new(args.run.quick, args.rows.train_rows);
            let mut measures = Vec::new();
            rt.block_on(train::run_train_bench(size, &mut |m: Measure| {
                println!("{}", m.line());
                measures.push(m);
            }))
            .map_err(CliError::failed)?;
            if args.table {
                train::print_table(&measures);
            }
        }
        BenchMode::Push(args) => {
            let opts = BenchOptions {
                quick: args.run.quick,
                transports: args.transports,
                sizes: args.sizes,
                kinds: args.kinds,
                topologies: args.topologies,
            };
            let measures = rt
                .block_on(run_bench(&opts, |m| println!("{}", m.line())))
                .map_err(CliError::failed)?;
            if args.table {
                print_table(&measures);
            }
        }
    }
    Ok(())
}

/// Every measure with its ratio to the raw TCP baseline of its unit.
fn print_table(measures: &[Measure]) {
    let base = |name: &str| {
        measures
            .iter()
            .find(|m| m.name == name)
            .map_or(f64::NAN, |m| m.value)
    };
    let (stream, ping) = (base("raw_tcp.stream"), base("raw_tcp.ping_pong.p50"));
    println!();
    println!(
        "{:<36} {:>12} {:<7} {:>10}",
        "measure", "value", "unit", "vs raw TCP"
    );
    for m in measures {
        // Key rates have no byte baseline to compare with.
        let ratio = match m.unit {
            "GB/s" => format!("{:.2}x", m.value / stream),
            "us" => format!("{:.2}x", m.value / ping),
            _ => "-".to_owned(),
        };
        println!(
            "{:<36} {:>12.4} {:<7} {:>10}",
            m.name, m.value, m.unit, ratio
        );
    }
}

/// One measured figure.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Measure {
    /// Dotted name, e.g. `tcp.1s1w.dense_push.1M`.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Its unit: `GB/s`, `us`, `Mkeys/s`.
    pub unit: &'static str,
}

impl Measure {
    /// The machine-readable line: `name value unit`.
    pub(crate) fn line(&self) -> String {
        format!("{} {:.4} {}", self.name, self.value, self.unit)
    }
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    /// The cluster or a request failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A socket of the raw baselines failed.
    #[error("raw TCP baseline: {0}")]
    Io(#[from] std::io::Error),
    /// The servers did not end with exactly what was pushed.
    #[error("{0}")]
    Inexact(String),
    /// A measure did not finish in time.
    #[error("{0} did not finish within {1} s")]
    Timeout(String, u64),
}

fn runtime_err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(e.to_string())
}

/// Runs every measure, calling `report` with each as soon as it is known.
pub(crate) async fn run_bench(
    opts: &BenchOptions,
    mut report: impl FnMut(&Measure),
) -> Result<Vec<Measure>, BenchError> {
    let mut all = Vec::new();
    let mut emit = |m: Measure| {
        report(&m);
        all.push(m);
    };
    for m in raw_tcp(opts.quick).await? {
        emit(m);
    }
    for &wire in &opts.transports {
        for &topology in Topology::value_variants() {
            if wants(&opts.topologies, topology) {
                measure_cluster(opts, wire, topology, &mut emit).await?;
            }
        }
        let lossy_wanted =
            wants(&opts.kinds, Kind::Dense) && wants(&opts.topologies, Topology::OneEach);
        if wire == Transport::Udp && lossy_wanted {
            emit_lossy(opts, &mut emit).await?;
        }
    }
    Ok(all)
}

/// The job of a bench cluster of the `topology` whose keys are `[0, key_space)`.
fn bench_spec(topology: Topology, key_space: Key) -> ClusterSpec {
    let (servers, workers) = topology.shape();
    let mut spec = ClusterSpec::new(servers, workers);
    spec.job.consistency = Consistency::Eventual;
    spec.job.ring.key_space = key_space;
    spec
}

/// With more than one server, the fraction of `keys` each is the primary of: what part of
/// every push it receives.
fn server_shares(
    spec: &ClusterSpec,
    prefix: &str,
    keys: impl Iterator<Item = Key>,
) -> Result<Vec<Measure>, BenchError> {
    if spec.job.servers < 2 {
        return Ok(Vec::new());
    }
    let ring = Ring::new(spec.job.layout().servers(), spec.job.ring).map_err(runtime_err)?;
    let mut held: BTreeMap<NodeId, u64> = ring.servers().iter().map(|&s| (s, 0)).collect();
    let mut total = 0u64;
    for key in keys {
        *held.entry(ring.primary(key)).or_default() += 1;
        total += 1;
    }
    Ok(held
        .into_iter()
        .map(|(server, n)| Measure {
            name: format!("{prefix}.share.{server}"),
            value: n as f64 / total.max(1) as f64,
            unit: "fraction",
        })
        .collect())
}

/// Starts a cluster for `spec` over `wire` and waits until its workers are ready.
async fn started(
    spec: &ClusterSpec,
    wire: Transport,
) -> Result<pserver_runtime::LocalCluster<f32>, BenchError> {
    let cluster = start(spec, wire, 0.0).await?;
    for w in &cluster.workers {
        w.ready().await?;
    }
    Ok(cluster)
}

/// Every measure `opts` asks for over `wire` with the `topology`, each on a cluster whose key
/// space is that of its keys.
async fn measure_cluster(
    opts: &BenchOptions,
    wire: Transport,
    topology: Topology,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let prefix = format!("{}.{}", spelled(wire), spelled(topology));
    let sizes = if wants(&opts.kinds, Kind::Dense) {
        dense_sizes(opts.quick, &opts.sizes)
    } else {
        Vec::new()
    };
    for size in sizes {
        let spec = bench_spec(topology, size.values() as Key);
        let cluster = started(&spec, wire).await?;
        let named = format!("{prefix}.dense.{}", spelled(size));
        for m in server_shares(&spec, &named, 0..size.values() as Key)? {
            emit(m);
        }
        let figures = dense(&cluster.workers, size.values(), opts.quick, &prefix).await;
        cluster.shutdown().await?;
        let (push, pull) = match figures {
            Ok(figures) => figures,
            // Reported, and the transport's larger requests are skipped: they would not
            // finish either.
            Err(e @ BenchError::Timeout(..)) => {
                eprintln!("{e}: skipped, with the larger requests");
                break;
            }
            Err(e) => return Err(e),
        };
        let size = spelled(size);
        for m in push_and_pull_measures(&prefix, "dense", &size, (push, pull), "GB/s") {
            emit(m);
        }
    }
    let spec = bench_spec(topology, SPARSE_SPACE);
    let cluster = started(&spec, wire).await?;
    if wants(&opts.kinds, Kind::Sparse) {
        let (keys, name) = if opts.quick {
            (64 << 10, "64K")
        } else {
            (1 << 20, "1M")
        };
        for m in server_shares(
            &spec,
            &format!("{prefix}.sparse.{name}"),
            sparse_keys(keys).into_iter(),
        )? {
            emit(m);
        }
        match sparse(&cluster.workers, keys, opts.quick, &prefix).await {
            Ok(figures) => {
                for m in push_and_pull_measures(&prefix, "sparse", name, figures, "Mkeys/s") {
                    emit(m);
                }
            }
            Err(e @ BenchError::Timeout(..)) => eprintln!("{e}: skipped"),
            Err(e) => return Err(e),
        }
    }
    if wants(&opts.kinds, Kind::Rtt) {
        let requests = if opts.quick { 200 } else { 10_000 };
        let (p50, p99) = round_trips(&cluster.workers[0], requests).await?;
        emit(Measure {
            name: format!("{prefix}.small_push_rtt.p50"),
            value: p50,
            unit: "us",
        });
        emit(Measure {
            name: format!("{prefix}.small_push_rtt.p99"),
            value: p99,
            unit: "us",
        });
    }
    cluster.shutdown().await?;
    Ok(())
}

/// The push and the pull figure of one measure, named `{prefix}.{kind}_push.{size}` and
/// `{prefix}.{kind}_pull.{size}`.
fn push_and_pull_measures(
    prefix: &str,
    kind: &str,
    size: &str,
    (push, pull): (f64, f64),
    unit: &'static str,
) -> [Measure; 2] {
    [("push", push), ("pull", pull)].map(|(way, value)| Measure {
        name: format!("{prefix}.{kind}_{way}.{size}"),
        value,
        unit,
    })
}

/// Fraction of datagrams the lossy UDP measure drops.
const LOSSY_DROP: f64 = 0.001;

/// Dense push and pull over UDP with [`LOSSY_DROP`] of the datagrams lost: 1M values per
/// request (64K with `--quick`), every push still applied exactly once.
async fn emit_lossy(opts: &BenchOptions, emit: &mut impl FnMut(Measure)) -> Result<(), BenchError> {
    let (size, name) = if opts.quick {
        (64 << 10, "64K")
    } else {
        (1 << 20, "1M")
    };
    let mut spec = ClusterSpec::new(1, 1);
    spec.job.consistency = Consistency::Eventual;
    let cluster = start(&spec, Transport::Udp, LOSSY_DROP).await?;
    cluster.workers[0].ready().await?;
    let prefix = "udp_lossy.1s1w";
    match dense(&cluster.workers, size, opts.quick, prefix).await {
        Ok((push, pull)) => {
            for m in push_and_pull_measures(prefix, "dense", name, (push, pull), "GB/s") {
                emit(m);
            }
        }
        Err(e @ BenchError::Timeout(..)) => eprintln!("{e}: skipped"),
        Err(e) => return Err(e),
    }
    cluster.shutdown().await?;
    Ok(())
}
