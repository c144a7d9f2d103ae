//! The `pserver` command-line tool.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pserver::commands::cluster::{self, LocalOptions, NodeOutcome};
use pserver::commands::cluster_file::ClusterFile;
use pserver::commands::ring::{self, Change};
use pserver::commands::script::Script;
use pserver::commands::{check, sim};
use pserver::core::{Consistency, NodeId, RingConfig, Role};
use pserver::models::cluster::{ClusterModelConfig, Strategy};
use pserver::models::sim::{Faults, MS, SimConfig, SimUpdater};

/// Frames of megabytes are allocated and freed many times a second. The system allocator hands
/// such blocks back to the kernel and faults them in again, zeroed, a few percent of a dense
/// push's time in a profile of `pserver bench`; mimalloc keeps them for reuse.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tracing_subscriber::EnvFilter;

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

#[derive(Subcommand, Debug)]
enum Command {
    /// Show how a ring spreads the key space over servers, and what joining or leaving moves.
    ///
    /// Prints one `name value unit` line per measure: each server's primary share of the key
    /// space, the number of segments, the imbalance (largest share over the mean), and with
    /// --add or --remove the share of keys that would change primary.
    Ring(RingArgs),
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
    Sim(SimArgs),
    /// Model-check the protocol: explore every state of a small cluster and check its
    /// properties.
    ///
    /// The cluster model runs the core's own coordinator, servers and workers under stateright,
    /// each worker pushing, advancing and pulling for every iteration. Prints one line per
    /// property (`property NAME: holds | violated | found | not found`), the steps of any
    /// counterexample, and last `check states=N unique=N depth=N secs=S`. Exits 1 if an
    /// `always` property is violated. Keep models tiny: every actor and iteration multiplies
    /// the states.
    Check(CheckArgs),
    /// Run the coordinator of a cluster described by a cluster file, until SIGINT or SIGTERM.
    ///
    /// The coordinator owns membership, the ring and the epoch: it waits until every server and
    /// worker of the file has registered, then starts the job.
    Coordinator(NodeArgs),
    /// Run one server of a cluster described by a cluster file, until SIGINT or SIGTERM.
    ///
    /// On exit it prints `server nN keys=K total=T refused=R`, and with --dump writes one
    /// `key_index total` line per key it holds.
    Server(NodeArgs),
    /// Run one worker of a cluster described by a cluster file: the job's script (pull every
    /// key, compute, push, advance, for each iteration), then exit.
    ///
    /// Prints `worker nN iterations=I pushes=P pushed_sum=S` when done.
    Worker(NodeArgs),
    /// Run a whole cluster in this process over the in-memory transport, run the script on
    /// every worker, and check that the servers end with exactly what the workers pushed.
    ///
    /// The last line is `local servers=S workers=W keys=K iterations=N totals=exact|WRONG
    /// refused=R secs=T`; the exit status is 1 if the totals are wrong.
    Local(LocalArgs),
    /// Measure push and pull throughput and small-request latency over each transport (mem,
    /// tcp, udp; one server and one worker, then two of each, on loopback), with a raw TCP
    /// stream and ping-pong as baselines measured in the same run. Build with --release.
    ///
    /// Dense requests carry contiguous keys; sparse ones 1M keys drawn from 2^40 (64K with
    /// --quick); `udp_lossy` drops 0.1% of the datagrams. Every dense measure checks that the
    /// servers end with exactly the pushes sent, and fails otherwise. Prints one `name value
    /// unit` line per measure (GB/s of values, million keys per second, microseconds); --table
    /// adds each figure's ratio to the raw TCP baseline.
    Bench(BenchArgs),
    /// Train a model in one process: sparse logistic regression (lr), matrix factorization
    /// (mf) or a count-min sketch (sketch).
    ///
    /// With no arguments, trains logistic regression on the shipped UCI Adult data
    /// (data/adult); `pserver train sketch` counts a generated stream and checks every
    /// estimate against its exact count (`sketch ... over_bound=O max_overcount=M`). Workers compute
    /// gradients on minibatches of their own share of the rows and push them; servers apply
    /// FTRL-Proximal. After every epoch prints `iter=E train_logloss=... test_logloss=...
    /// test_auc=... nnz=... secs=...`; a bad data file is one line naming file:line:column,
    /// exit status 2.
    Train(TrainArgs),
    /// Score a LIBSVM data set with a model saved by `pserver train --save`.
    ///
    /// Prints `predict rows=N logloss=L auc=A`, or with --scores one probability per row.
    Predict(PredictArgs),
    /// Generate synthetic click-like data in LIBSVM form (zero-based indices): binary features
    /// with power-law frequencies, labels drawn from a known true logistic model.
    ///
    /// The same arguments always give the same file; a name ending in .gz is compressed.
    Gen(GenArgs),
}

#[derive(Args, Debug)]
struct GenArgs {
    /// Rows to write.
    #[arg(long, default_value_t = 100_000)]
    rows: u64,
    /// Features (the dimension of the problem).
    #[arg(long, default_value_t = 1 << 22, value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    features: u64,
    /// Distinct features per row.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    per_row: u32,
    /// Seed of the true model and of the rows.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of the first row: a test set is the same seed with rows after the training set's.
    #[arg(long, default_value_t = 0)]
    first_row: u64,
    /// Output file (.gz to compress).
    #[arg(long, value_name = "FILE")]
    out: std::path::PathBuf,
}

fn gen_command(args: GenArgs) -> ExitCode {
    use pserver::data::synthetic::{GenConfig, write};
    let cfg = GenConfig {
        rows: args.rows,
        features: args.features,
        per_row: args.per_row as usize,
        seed: args.seed,
        first_row: args.first_row,
    };
    let file = match std::fs::File::create(&args.out) {
        Ok(f) => std::io::BufWriter::new(f),
        Err(e) => {
            eprintln!("error: {}: cannot create: {e}", args.out.display());
            return ExitCode::from(2);
        }
    };
    let written = if args.out.extension().is_some_and(|e| e == "gz") {
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        write(&cfg, &mut gz).and_then(|()| gz.finish().map(drop))
    } else {
        let mut file = file;
        write(&cfg, &mut file)
    };
    match written {
        Ok(()) => {
            eprintln!("gen: {} rows to {}", cfg.rows, args.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: cannot write: {e}", args.out.display());
            ExitCode::from(2)
        }
    }
}

#[derive(Args, Debug)]
struct PredictArgs {
    /// The model file.
    #[arg(long, value_name = "FILE")]
    model: std::path::PathBuf,
    /// The data to score (LIBSVM, optionally .gz).
    #[arg(long, value_name = "FILE")]
    data: std::path::PathBuf,
    /// Print one probability per row instead of the summary.
    #[arg(long)]
    scores: bool,
}

/// What `pserver train` trains.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum App {
    /// Sparse logistic regression on LIBSVM data.
    Lr,
    /// Matrix factorization of generated low-rank ratings with noise of known variance.
    Mf,
    /// A count-min sketch of a generated stream, checked against exact counts.
    Sketch,
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// What to train.
    #[arg(value_enum, default_value = "lr")]
    app: App,
    /// Sketch: items in the stream.
    #[arg(long, default_value_t = 200_000)]
    items: u64,
    /// Sketch: additive error bound, as a fraction of the stream's length.
    #[arg(long, default_value_t = 0.001)]
    eps: f64,
    /// Sketch: probability that an estimate breaks the bound.
    #[arg(long, default_value_t = 0.01)]
    delta: f64,
    /// Training data (LIBSVM, optionally .gz).
    #[arg(long, default_value = "data/adult/adult.train.svm.gz")]
    data: std::path::PathBuf,
    /// Test data (LIBSVM, optionally .gz).
    #[arg(long, default_value = "data/adult/adult.test.svm.gz")]
    test: std::path::PathBuf,
    /// Servers.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    servers: u32,
    /// Workers.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Consistency models, comma-separated (sequential, bounded:TAU, eventual): one training
    /// run each, one curve each in the plot.
    #[arg(long, value_delimiter = ',', default_value = "bounded:4")]
    consistency: Vec<Consistency>,
    /// Draw test log loss and AUC against time into this SVG file.
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
    /// Save the trained model (of the last consistency model given) to this file, for
    /// `pserver predict`.
    #[arg(long, value_name = "FILE")]
    save: Option<std::path::PathBuf>,
    /// Passes over the training data.
    #[arg(long, default_value_t = 10)]
    epochs: u32,
    /// Rows per minibatch on each worker.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// How the nodes of this process talk: mem (channels) or tcp (authenticated connections
    /// on 127.0.0.1). For separate processes, see `pserver coordinator | server | worker`.
    #[arg(long, default_value = "mem", value_parser = ["mem", "tcp"])]
    transport: String,
    /// The servers' update rule: ftrl (FTRL-Proximal, sparse), adagrad or sgd.
    #[arg(long, default_value = "ftrl", value_parser = ["ftrl", "adagrad", "sgd"])]
    updater: String,
    /// Learning rate of adagrad and sgd.
    #[arg(long, default_value_t = 0.1)]
    lr: f64,
    /// FTRL learning-rate scale.
    #[arg(long, default_value_t = 0.3)]
    alpha: f64,
    /// FTRL L1 regularization (larger: sparser model).
    #[arg(long, default_value_t = 1.0)]
    l1: f64,
    /// FTRL L2 regularization.
    #[arg(long, default_value_t = 1.0)]
    l2: f64,
}

fn sketch_command(args: &TrainArgs) -> ExitCode {
    use pserver::apps::sketch::{SketchConfig, run};
    if !(args.eps > 0.0 && args.eps < 1.0 && args.delta > 0.0 && args.delta < 1.0) {
        eprintln!("error: --eps and --delta must lie strictly between 0 and 1");
        return ExitCode::from(2);
    }
    let cfg = SketchConfig {
        servers: args.servers as usize,
        workers: args.workers as usize,
        items: args.items,
        eps: args.eps,
        delta: args.delta,
        ..SketchConfig::default()
    };
    let rt = match tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(&cfg)) {
        Ok(r) => {
            println!(
                "sketch items={} width={} depth={} queried={} over_bound={} max_overcount={} bound={:.1} under_counted={}",
                cfg.items,
                r.width,
                r.depth,
                r.queried,
                r.over_bound,
                r.max_overcount,
                r.bound,
                r.under_counted
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn mf_command(args: &TrainArgs) -> ExitCode {
    use pserver::apps::mf::{MfConfig, train};
    let cfg = MfConfig {
        servers: args.servers as usize,
        workers: args.workers as usize,
        consistency: args
            .consistency
            .first()
            .copied()
            .unwrap_or(Consistency::Sequential),
        epochs: args.epochs,
        ..MfConfig::default()
    };
    let rt = match tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "mf: {} users x {} items, rank {}, {} ratings, noise {}",
        cfg.users, cfg.items, cfg.rank, cfg.ratings, cfg.noise
    );
    match rt.block_on(train(&cfg)) {
        Ok(reports) => {
            for r in reports {
                println!(
                    "iter={} test_rmse={:.4} noise_floor={} secs={:.2}",
                    r.epoch, r.test_rmse, cfg.noise, r.secs
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn train_command(args: TrainArgs) -> ExitCode {
    match args.app {
        App::Sketch => return sketch_command(&args),
        App::Mf => return mf_command(&args),
        App::Lr => {}
    }
    use pserver::apps::lr::{LrConfig, train_local_until};
    use pserver::apps::plot::{Curve, write_svg};
    use pserver::data::libsvm::{IndexBase, read};
    let load = |p: &std::path::Path| read(p, IndexBase::Auto);
    let (train, test) = match (load(&args.data), load(&args.test)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let several = args.consistency.len() > 1;
    let mut runs = Vec::new();
    for &consistency in &args.consistency {
        let cfg = LrConfig {
            servers: args.servers as usize,
            workers: args.workers as usize,
            consistency,
            epochs: args.epochs,
            batch: args.batch,
            updater: match args.updater.as_str() {
                "adagrad" => pserver::core::Updater::AdaGrad {
                    lr: args.lr,
                    eps: 1e-6,
                },
                "sgd" => pserver::core::Updater::Sgd { lr: args.lr },
                _ => pserver::core::Updater::FtrlProximal {
                    alpha: args.alpha,
                    beta: 1.0,
                    l1: args.l1,
                    l2: args.l2,
                },
            },
            transport: if args.transport == "tcp" {
                pserver::apps::lr::Wire::Tcp
            } else {
                pserver::apps::lr::Wire::Mem
            },
        };
        eprintln!(
            "train: {} rows, test: {} rows, {} servers, {} workers, {}",
            train.len(),
            test.len(),
            cfg.servers,
            cfg.workers,
            cfg.consistency
        );
        let bar = indicatif::ProgressBar::new(u64::from(cfg.epochs));
        let prefix = if several {
            format!("consistency={consistency} ")
        } else {
            String::new()
        };
        // The training future runs on this thread (block_on), so a Cell is enough.
        let interrupted = std::cell::Cell::new(false);
        let ctrl_c = async {
            if tokio::signal::ctrl_c().await.is_ok() {
                interrupted.set(true);
            } else {
                std::future::pending::<()>().await;
            }
        };
        let result = rt.block_on(train_local_until(&cfg, train.clone(), test.clone(), |r| {
            bar.suspend(|| {
                println!(
                    "{prefix}iter={} train_logloss={:.4} test_logloss={:.4} test_auc={:.4} nnz={} secs={:.2} bytes={}",
                    r.epoch, r.train_logloss, r.test_logloss, r.test_auc, r.nnz, r.secs, r.bytes_sent
                )
            });
            bar.inc(1);
        }, ctrl_c));
        bar.finish_and_clear();
        match result {
            Ok(reports) => runs.push((consistency, reports)),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        if interrupted.get() {
            eprintln!("interrupted: keeping the epochs finished so far");
            break;
        }
    }
    let interrupted = runs.len() < args.consistency.len()
        || runs
            .last()
            .is_some_and(|(_, t)| t.reports.len() < args.epochs as usize);
    if let Some(path) = &args.plot {
        let curves: Vec<Curve<'_>> = runs
            .iter()
            .map(|(c, trained)| Curve {
                name: c.to_string(),
                reports: &trained.reports,
            })
            .collect();
        if let Err(e) = write_svg(path, &curves) {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        eprintln!("plot: {}", path.display());
    }
    if let (Some(path), Some((_, trained))) = (&args.save, runs.last()) {
        if let Err(e) = pserver::apps::lr::save_model(path, &trained.model) {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        let nonzero = trained.model.values().iter().filter(|w| **w != 0.0).count();
        eprintln!("model: {} ({nonzero} non-zero weights)", path.display());
    }
    if interrupted {
        // The shell's convention for a run ended by SIGINT.
        return ExitCode::from(130);
    }
    ExitCode::SUCCESS
}

fn predict_command(args: PredictArgs) -> ExitCode {
    use pserver::apps::lr::{auc, load_model, scores};
    use pserver::data::libsvm::{IndexBase, read};
    let model = match load_model(&args.model) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let data = match read(&args.data, IndexBase::Auto) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let s = scores(&model, &data);
    if args.scores {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for z in &s {
            // A closed pipe (`| head`) ends the output quietly.
            if writeln!(out, "{:.6}", 1.0 / (1.0 + (-z).exp())).is_err() {
                return ExitCode::SUCCESS;
            }
        }
        let _ = out.flush();
        return ExitCode::SUCCESS;
    }
    let logloss: f64 = s
        .iter()
        .zip(data.labels())
        .map(|(&z, &y)| {
            let p = (1.0 / (1.0 + (-z).exp())).clamp(1e-12, 1.0 - 1e-12);
            if y > 0.5 { -p.ln() } else { -(1.0 - p).ln() }
        })
        .sum::<f64>()
        / data.len() as f64;
    println!(
        "predict rows={} logloss={logloss:.4} auc={:.4}",
        data.len(),
        auc(&s, data.labels())
    );
    ExitCode::SUCCESS
}

#[derive(Args, Debug)]
struct NodeArgs {
    /// The cluster file: every node's address, the consistency model, the ring and the job
    /// (TOML). The secret comes from its secret_file or the PSERVER_SECRET environment
    /// variable, never from the command line.
    #[arg(long, value_name = "FILE")]
    config: std::path::PathBuf,
    /// This node's id in the cluster file.
    #[arg(long)]
    id: u32,
    /// Servers and workers: give up (exit status 2) if the job has not started after this many
    /// seconds (the coordinator is unreachable, a node is missing, or the secret differs).
    #[arg(long, default_value_t = 60)]
    join_timeout_secs: u64,
    /// Servers: on exit, write one `key_index total` line per key held to this file.
    #[arg(long, value_name = "FILE")]
    dump: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Seconds instead of minutes: requests of 1K and 64K values, few repetitions (a smoke
    /// test of the benchmark itself).
    #[arg(long)]
    quick: bool,
    /// Also print a table with each figure's ratio to the raw TCP baselines.
    #[arg(long)]
    table: bool,
    /// The transports to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "mem,tcp,udp", value_parser = ["mem", "tcp", "udp"])]
    transports: Vec<String>,
    /// Only these dense request sizes, comma-separated (values per request); by default all
    /// of them (1K and 64K with --quick).
    #[arg(long, value_delimiter = ',', value_parser = ["1K", "64K", "1M", "16M"])]
    sizes: Vec<String>,
    /// Only these kinds of measure, comma-separated: dense push/pull, sparse push/pull, small
    /// round trips; by default all of them. The raw TCP baselines always run.
    #[arg(long, value_delimiter = ',', value_parser = ["dense", "sparse", "rtt"])]
    kinds: Vec<String>,
    /// Only these cluster shapes, comma-separated (servers `s`, workers `w`); by default both.
    #[arg(long, value_delimiter = ',', value_parser = ["1s1w", "2s2w"])]
    topologies: Vec<String>,
}

#[derive(Args, Debug)]
struct LocalArgs {
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
    #[arg(long, default_value_t = 20)]
    iterations: u32,
    /// Consistency model: sequential, bounded:TAU or eventual.
    #[arg(long, default_value = "bounded:2")]
    consistency: Consistency,
    /// Probability that the in-memory network loses a frame.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    drop: f64,
    /// Probability that it delivers a frame twice.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    dup: f64,
    /// Seed of the network's faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest frame in bytes.
    #[arg(long, default_value_t = pserver::core::DEFAULT_MAX_FRAME)]
    max_frame: usize,
    /// Largest slice a worker puts in one message, in bytes (must fit a frame).
    #[arg(long, default_value_t = pserver::core::DEFAULT_MAX_SLICE_BYTES)]
    max_slice_bytes: usize,
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

fn node_command(args: NodeArgs, role: Role) -> ExitCode {
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    };
    let file = match ClusterFile::load(&args.config) {
        Ok(f) => f,
        Err(e) => return fail(&e),
    };
    let id = NodeId(args.id);
    match file.role(id) {
        Ok(r) if r == role => {}
        Ok(r) => {
            let msg = format!(
                "{}: node {} is a {r}, not a {role}: run `pserver {r} --id {}`",
                args.config.display(),
                args.id,
                args.id
            );
            return fail(&msg);
        }
        Err(e) => return fail(&e),
    }
    let rt = match tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    let join = std::time::Duration::from_secs(args.join_timeout_secs);
    match rt.block_on(cluster::run_node(&file, id, join)) {
        Ok(NodeOutcome::Coordinator) => ExitCode::SUCCESS,
        Ok(NodeOutcome::Server { totals, refused }) => {
            let total: i64 = totals.iter().sum();
            let held = totals.iter().filter(|t| **t != 0).count();
            println!("server {id} keys={held} total={total} refused={refused}");
            if let Some(path) = &args.dump {
                if let Err(e) = cluster::dump_totals(path, &totals) {
                    return fail(&format!("{}: cannot write: {e}", path.display()));
                }
            }
            ExitCode::SUCCESS
        }
        Ok(NodeOutcome::Trained { epochs }) => {
            println!("worker {id} trained epochs={epochs}");
            ExitCode::SUCCESS
        }
        Ok(NodeOutcome::Worker(s)) => {
            println!(
                "worker {id} iterations={} pushes={} pushed_sum={}",
                s.iterations, s.pushes, s.pushed_sum
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn bench_command(args: BenchArgs) -> ExitCode {
    use pserver::commands::bench::{BenchOptions, run_bench};
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: a debug build; benchmark figures come from `cargo run --release -- bench`"
        );
    }
    let rt = match tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = BenchOptions {
        quick: args.quick,
        transports: args.transports,
        sizes: args.sizes,
        kinds: args.kinds,
        topologies: args.topologies,
    };
    let measures = match rt.block_on(run_bench(&opts, |m| println!("{}", m.line()))) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    if args.table {
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
        for m in &measures {
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
    ExitCode::SUCCESS
}

fn local_command(args: LocalArgs) -> ExitCode {
    let opts = LocalOptions {
        servers: args.servers as usize,
        workers: args.workers as usize,
        consistency: args.consistency,
        script: Script {
            keys: args.keys,
            iterations: args.iterations,
            compute: std::time::Duration::ZERO,
        },
        drop: args.drop,
        dup: args.dup,
        seed: args.seed,
        max_frame: args.max_frame,
        max_slice_bytes: args.max_slice_bytes,
    };
    let rt = match tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(cluster::run_local(&opts)) {
        Ok(outcome) => {
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
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// Model: cluster (the whole protocol), replication (key ranges copied between servers,
    /// in two configurations checked one after the other: a primary and a replica per range on
    /// 3 servers, one of which may crash; and 1 server holding every range while a second
    /// joins at any point and takes a range over) or clock (the range vector clock). The shape
    /// options change the replication model's shape too; giving --servers, --crashes, --joins
    /// or --replicas checks the one configuration they describe.
    #[arg(long, default_value = "cluster")]
    model: check::ModelName,
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
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Servers [default: 2]. Giving any of the shape options (servers, workers, keys,
    /// iterations, crashes, joins, network, consistency, registration, ring change, backoff)
    /// checks that one shape, once per consistency model, instead of the default suite.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    servers: Option<u32>,
    /// Workers [default: 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    workers: Option<u32>,
    /// Keys each worker pushes and pulls (for --model clock: keys modelled one by one)
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
    #[arg(long, value_parser = check::network)]
    network: Option<pserver::models::cluster::NetworkKind>,
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
    #[arg(long, value_name = "N")]
    max_states: Option<usize>,
    /// Checker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

fn check_command(args: CheckArgs) -> ExitCode {
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let strategy = match (args.dfs, args.simulation) {
        (true, _) => Strategy::Dfs,
        (_, Some(seed)) => Strategy::Simulation {
            seed,
            timeout: std::time::Duration::from_secs(args.timeout_secs),
        },
        _ => Strategy::Bfs,
    };
    let models = if args.consistency.is_empty() {
        check::default_models()
    } else {
        args.consistency.clone()
    };
    let shape_given = args.servers.is_some()
        || args.workers.is_some()
        || args.keys.is_some()
        || args.iterations.is_some()
        || args.crashes.is_some()
        || args.joins.is_some()
        || args.network.is_some()
        || !args.consistency.is_empty()
        || args.registration
        || args.ring_change
        || args.backoff;
    let replication = args.model == check::ModelName::Replication;
    if !replication && (args.joins.is_some() || args.replicas.is_some()) {
        eprintln!(
            "error: --joins and --replicas shape the replication model: add --model replication"
        );
        return ExitCode::from(2);
    }
    // The replication model checks fail-over and a join, each exhaustively, unless its servers
    // are shaped on the command line: then the one configuration asked for.
    let servers_given = args.servers.is_some()
        || args.crashes.is_some()
        || args.joins.is_some()
        || args.replicas.is_some();
    let bases = match (replication, servers_given) {
        (true, false) => ClusterModelConfig::replication_suite(),
        (true, true) => vec![ClusterModelConfig::replication()],
        (false, _) => vec![ClusterModelConfig::default()],
    };
    let shaped = |defaults: ClusterModelConfig| {
        let (keys, iterations, crashes) = if replication {
            (defaults.keys, defaults.iterations, defaults.crashes)
        } else {
            (1, 1, 0)
        };
        ClusterModelConfig {
            servers: args.servers.map_or(defaults.servers, |n| n as usize),
            workers: args.workers.map_or(defaults.workers, |n| n as usize),
            keys: args.keys.unwrap_or(keys),
            iterations: args.iterations.unwrap_or(iterations),
            consistency: args
                .consistency
                .first()
                .copied()
                .unwrap_or(defaults.consistency),
            network: args.network.unwrap_or(defaults.network),
            crashes: args.crashes.unwrap_or(crashes),
            registration: args.registration,
            ring_change: args.ring_change,
            replicas: args.replicas.unwrap_or(defaults.replicas),
            backoff: args.backoff,
            joins: args.joins.unwrap_or(defaults.joins),
        }
    };
    let bases: Vec<ClusterModelConfig> = bases.into_iter().map(shaped).collect();
    if bases
        .iter()
        .any(|b| b.joins > 0 && (b.registration || b.ring_change))
    {
        eprintln!(
            "error: a server join does not combine with --registration or --ring-change (give --joins 0 to check fail-over alone)"
        );
        return ExitCode::from(2);
    }
    let base = bases[0].clone();
    let configs: Vec<ClusterModelConfig> = if replication && args.consistency.is_empty() {
        bases
    } else if shape_given || replication {
        bases
            .iter()
            .flat_map(|b| {
                models.iter().map(|&consistency| ClusterModelConfig {
                    consistency,
                    ..b.clone()
                })
            })
            .collect()
    } else {
        check::default_suite()
    };
    // Without the mutations feature `broken` can only be None and is not read.
    #[allow(unused_variables)]
    let broken = match args.mutation.as_deref().map(mutation).transpose() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    #[allow(clippy::needless_update)]
    let protocol = check::Protocol {
        #[cfg(feature = "mutations")]
        mutation: broken,
        ..check::Protocol::default()
    };
    let clock_max_time = u8::try_from(base.iterations.max(1)).unwrap_or(u8::MAX);
    if let Some(address) = &args.explore {
        let first = configs.first().cloned().unwrap_or(base);
        return match check::explore(args.model, first, protocol, clock_max_time, address) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    let outcome = match args.model {
        check::ModelName::Cluster | check::ModelName::Replication => {
            match check::check_cluster(&configs, protocol, strategy, threads, args.max_states) {
                Ok(outcome) => outcome,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        check::ModelName::Clock => check::check_clock(base.keys, clock_max_time, strategy, threads),
    };
    print!("{}", outcome.text);
    if outcome.violated {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[derive(Args, Debug)]
struct SimArgs {
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

/// Parses a mutation name, or explains that the build lacks the feature.
#[cfg(feature = "mutations")]
fn mutation<M: std::str::FromStr<Err = String>>(name: &str) -> Result<M, String> {
    name.parse()
}

#[cfg(not(feature = "mutations"))]
fn mutation(name: &str) -> Result<std::convert::Infallible, String> {
    Err(format!(
        "--mutation {name} needs a build with the mutations feature: cargo run --release --features mutations -- ... --mutation {name}"
    ))
}

fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..1.0).contains(&p) => Ok(p),
        _ => Err(format!("`{s}` is not a probability in [0, 1)")),
    }
}

fn factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (1.0..=1000.0).contains(&f) => Ok(f),
        _ => Err(format!("`{s}` is not a slowdown factor between 1 and 1000")),
    }
}

fn sim_command(args: SimArgs) -> ExitCode {
    // Without the mutations feature `broken` can only be None and is not read.
    #[allow(unused_variables)]
    let broken = match args.mutation.as_deref().map(mutation).transpose() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    #[allow(clippy::needless_update)]
    let protocol = sim::Protocol {
        #[cfg(feature = "mutations")]
        mutation: broken,
        ..sim::Protocol::default()
    };
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
    if let Err(e) = base.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
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
        return match sim::tau_sweep(&base, protocol, args.first_seed, seeds) {
            Ok(rows) => {
                for row in rows {
                    println!(
                        "tau={} finish_ms={:.1} idle_fraction={:.3}",
                        sim::tau_label(row.consistency),
                        row.finish_ms,
                        row.idle_fraction
                    );
                }
                ExitCode::SUCCESS
            }
            Err(failure) => {
                eprintln!("{failure}");
                ExitCode::FAILURE
            }
        };
    }
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    eprintln!(
        "seeds {}..{} ({} threads)",
        args.first_seed,
        args.first_seed.saturating_add(args.seeds),
        threads
    );
    let batch = sim::run_seeds(&base, protocol, args.first_seed, args.seeds, threads, true);
    if base.crash_servers > 0 || base.ring.replicas > 0 || base.join_servers > 0 {
        println!("{}", batch.server_fault_summary());
        println!("{}", batch.recovery_summary());
        println!("{}", batch.replication_summary());
    }
    println!("{}", batch.summary());
    if batch.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[derive(Args, Debug)]
struct RingArgs {
    /// Number of servers (ids 0..N).
    #[arg(long, default_value_t = 8)]
    servers: u32,
    /// Virtual nodes per server: more even out the shares, at the cost of more segments.
    #[arg(long, default_value_t = 64)]
    vnodes: u32,
    /// Replicas per key range besides the primary; must be smaller than --servers.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// Seed of the point placement (every node of a cluster uses the same one).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Preview adding a server with this id.
    #[arg(long, value_name = "ID", conflicts_with = "remove")]
    add: Option<u32>,
    /// Preview removing the server with this id.
    #[arg(long, value_name = "ID")]
    remove: Option<u32>,
}

fn main() -> ExitCode {
    // Warnings (a refused peer, a node declared dead) show without RUST_LOG.
    let filter = EnvFilter::builder()
        .with_default_directive(tracing::level_filters::LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Sim(args) => sim_command(args),
        Command::Check(args) => check_command(args),
        Command::Coordinator(args) => node_command(args, Role::Coordinator),
        Command::Server(args) => node_command(args, Role::Server),
        Command::Worker(args) => node_command(args, Role::Worker),
        Command::Local(args) => local_command(args),
        Command::Bench(args) => bench_command(args),
        Command::Train(args) => train_command(args),
        Command::Predict(args) => predict_command(args),
        Command::Gen(args) => gen_command(args),
        Command::Ring(args) => {
            let config = RingConfig {
                vnodes: args.vnodes,
                replicas: args.replicas,
                seed: args.seed,
            };
            let change = match (args.add, args.remove) {
                (Some(id), _) => Some(Change::Add(NodeId(id))),
                (_, Some(id)) => Some(Change::Remove(NodeId(id))),
                _ => None,
            };
            match ring::report(args.servers, config, change) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
