//! `pserver train lr`: sparse logistic regression on LIBSVM data, once per consistency model.

use std::cell::Cell;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use pserver_core::filter::Threshold;
use pserver_core::{Consistency, JobSpec, Updater};
use tokio::runtime::Runtime;

use super::NodesArgs;
use crate::apps::lr::{
    Keep, LrConfig, Rates, RowsTrained, SavedModel, SlowWorker, Slowdowns, StreamedFile,
    StreamedTest, TestRows, TrainRows, Trained, Wire, base_for_init, load_model, save_model,
    train_local_until,
};
use crate::apps::plot::{Curve, write_svg};
use crate::commands::groups::{FilterArgs, StragglerArgs};
use crate::commands::signals::{self, Stop};
use crate::commands::values::{
    Factor, Fraction, Rate, Seconds, Strength, Transport, UpdateRule, at_least_one, output_file,
};
use crate::commands::{CliError, runtime};
use crate::data::libsvm::{IndexBase, Labels, read_streaming};
use pserver_runtime::checkpoint::CheckpointDir;

/// Train sparse logistic regression on LIBSVM data (the default application).
///
/// With no arguments, trains on the shipped UCI Adult data (data/adult). Workers compute
/// gradients on minibatches of their own share of the rows and push them; servers apply the
/// update rule (FTRL-Proximal by default). After every epoch prints `iter=E train_logloss=...
/// test_logloss=... test_auc=... nnz=... rows_per_sec=... secs=... bytes=... epoch_bytes=...`
/// (bytes sent by every node so far, and in the epoch); a bad data file is one line naming
/// file:line:column, exit status 2, and so is an empty one, or an option with a value it
/// cannot mean (a NaN or negative rate, zero epochs, a rate the chosen update rule does not
/// use). Ctrl-C or SIGTERM stops it, keeping the epochs finished so far (their plot and
/// model), with exit status 130 or 143.
#[derive(clap::Args, Debug)]
pub(crate) struct LrArgs {
    /// Training data (LIBSVM, optionally .gz; labels 0/1 or -1/+1, or see --positive) [default: the shipped
    /// Adult data, data/adult/adult.train.svm.gz, with its test file].
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// Test data, measured after every epoch [default: hold out --test-fraction of --data].
    #[arg(long, value_name = "FILE", requires = "data")]
    test: Option<PathBuf>,
    /// Fraction of --data held out for testing, chosen by --seed, when no --test is given
    /// [default: 0.1].
    #[arg(
        long,
        value_name = "F",
        requires = "data",
        conflicts_with = "test",
        allow_negative_numbers = true
    )]
    test_fraction: Option<Fraction>,
    /// Read the training file a window of rows at a time, each window shuffled within itself,
    /// instead of whole: memory holds the model and a window per share, not the file. The test
    /// file, or without one the rows --test-fraction holds out of it, is read a part at a time
    /// too.
    #[arg(long)]
    stream: bool,
    /// Rows in each window of a share with --stream (rounded up to whole minibatches).
    #[arg(
        long,
        value_name = "ROWS",
        default_value_t = 20_000,
        requires = "stream",
        value_parser = at_least_one,
        allow_negative_numbers = true
    )]
    window: usize,
    #[command(flatten)]
    nodes: NodesArgs,
    /// Consistency models, comma-separated (sequential, bounded:TAU, eventual): one training
    /// run each, one curve each in the plot.
    #[arg(long, value_delimiter = ',', default_value = "bounded:4")]
    consistency: Vec<Consistency>,
    /// Draw test log loss and AUC against time into this SVG file.
    #[arg(long, value_name = "FILE", value_parser = output_file)]
    plot: Option<PathBuf>,
    /// Save the trained model (of the last consistency model given) to this file, for
    /// `pserver predict`.
    #[arg(long, value_name = "FILE", value_parser = output_file)]
    save: Option<PathBuf>,
    /// Start from this saved model (`--save`'s file) instead of zero weights: a warm start.
    /// The data is read with the index base the model was trained with, unless --index-base
    /// says otherwise, which must then agree.
    #[arg(long, value_name = "MODEL")]
    init: Option<PathBuf>,
    /// Have every server write a checkpoint of its shards (weights and the update rule's
    /// state) after every epoch, each in its own directory below this one (written whole or
    /// not at all, checksummed; the newest three kept), for --resume.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Go on from the newest epoch every server's checkpoint in --checkpoint-dir holds whole:
    /// train the epochs after it, each as it would have been trained without the
    /// interruption. A torn or corrupt file is said and passed over for the one before it.
    /// The data, --workers, --servers and --batch must be those of the run that wrote it.
    #[arg(long, requires = "checkpoint_dir", conflicts_with = "init")]
    resume: bool,
    /// Passes over the training data.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    epochs: u32,
    /// Rows per minibatch on each worker.
    #[arg(long, default_value_t = 100, value_parser = at_least_one, allow_negative_numbers = true)]
    batch: usize,
    /// How the nodes of this process talk: mem (channels), tcp (authenticated connections on
    /// 127.0.0.1) or udp (datagrams on 127.0.0.1). For separate processes, see `pserver
    /// coordinator | server | worker`.
    #[arg(long, value_enum, default_value = "mem")]
    transport: Transport,
    #[command(flatten)]
    rule: RuleArgs,
    /// Train without an intercept. By default the model has one: the weight of a constant
    /// feature every row holds, exempt from regularization (as liblinear's -B 1).
    #[arg(long)]
    no_bias: bool,
    /// How the data files count their feature indices: 0, 1, or auto (zero-based if any index
    /// of the training or test file is 0, one-based otherwise). Decided once for both files
    /// and saved with the model; an index 0 in a file read as one-based is an error.
    #[arg(long, value_enum, default_value = "auto")]
    index_base: IndexBase,
    /// Train one label against the rest: rows of --data and --test labelled LABEL are
    /// positive, every other row negative, whatever its label (several classes, or
    /// real-valued targets). Without it, labels must be 0/1 or -1/+1, and any other is
    /// refused naming its line.
    #[arg(long, value_name = "LABEL", value_parser = crate::commands::values::label, allow_negative_numbers = true)]
    positive: Option<f32>,
    /// Visit each worker's rows in file order, instead of an order drawn afresh every epoch
    /// from --seed.
    #[arg(long)]
    no_shuffle: bool,
    /// Pull each minibatch's weights only once the one before is pushed, instead of while it
    /// is computed. Pipelining never applies under sequential consistency, and under bounded
    /// delay keeps the bound: a batch's weights miss no more pushes than tau allows.
    #[arg(long)]
    no_pipeline: bool,
    /// Seed of the order rows are visited in.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Which epoch's model --save writes: best (lowest validation log loss) or last.
    #[arg(long, value_enum, default_value = "best")]
    keep: Keep,
    /// Stop after N epochs in a row without a lower validation log loss.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    early_stop: Option<u32>,
    /// Fraction of the training rows held out, drawn from --seed, to choose the epoch --save
    /// keeps (--keep best) and when --early-stop ends the run, so that the test rows choose
    /// neither; the rows held out are not trained on [default: 0.1 with --save and --keep
    /// best, or --early-stop, over more than one epoch; otherwise none].
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    validation_fraction: Option<Fraction>,
    /// Without a terminal, print a progress line (rows trained, rows/s) this often.
    #[arg(
        long,
        value_name = "SECS",
        default_value = "5",
        allow_negative_numbers = true
    )]
    progress_every: Seconds,
    #[command(flatten)]
    stragglers: StragglerArgs,
    #[command(flatten)]
    filters: FilterArgs,
}

/// The servers' update rule and its rates; each rate belongs to some rules only, and giving
/// it to another is an error rather than a silent no-op.
#[derive(clap::Args, Debug, Clone)]
struct RuleArgs {
    /// The servers' update rule: ftrl (FTRL-Proximal, sparse; takes --alpha --l1 --l2),
    /// adagrad or sgd (take --lr).
    #[arg(long, value_enum, default_value = "ftrl")]
    updater: UpdateRule,
    /// Learning rate of adagrad and sgd [default: 0.1].
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<Rate>,
    /// FTRL learning-rate scale [default: 0.1].
    #[arg(long, allow_negative_numbers = true)]
    alpha: Option<Rate>,
    /// FTRL L1 regularization, charged once against the sum of the per-row gradients
    /// pushed, as a per-row learner charges it: a weight stays zero until its rows' gradients
    /// add up past it (larger: sparser model) [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    l1: Option<Strength>,
    /// FTRL L2 regularization, charged as L1 is [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    l2: Option<Strength>,
}

impl RuleArgs {
    /// The update rule asked for, or an error naming a rate given to a rule that does not
    /// use it.
    fn updater(&self) -> Result<Updater, CliError> {
        let rates = Rates {
            lr: self.lr.map(Rate::get),
            alpha: self.alpha.map(Rate::get),
            l1: self.l1.map(Strength::get),
            l2: self.l2.map(Strength::get),
        };
        let rule = self
            .updater
            .lr_rule()
            .map_err(|e| CliError::input(format!("--updater {}: {e}", self.updater)))?;
        rule.updater(rates).map_err(|u| {
            let takes: Vec<String> = u.takes.iter().map(|t| format!("--{t}")).collect();
            CliError::input(format!(
                "--{} is not used by --updater {}, which takes {}",
                u.rate,
                u.rule,
                takes.join(", ")
            ))
        })
    }
}

/// Trains once per consistency model given, printing a line per epoch, then draws the plot
/// and saves the model asked for. Ctrl-C or SIGTERM keeps the epochs finished so far (exit
/// status 130 or 143).
pub(super) fn run(args: &LrArgs) -> Result<(), CliError> {
    if args.stream
        && args.epochs > 1
        && ((args.save.is_some() && args.keep == Keep::Best) || args.early_stop.is_some())
    {
        eprintln!(
            "warning: --stream holds no validation rows out of the file yet: the test rows choose the epoch --save keeps and when --early-stop ends the run (--keep last keeps the last)"
        );
    }
    if args.stream && args.validation_fraction.is_some() {
        return Err(CliError::input(
            "--validation-fraction: a streamed file holds no validation rows out yet: leave it out with --stream (the test rows then choose the epoch kept)",
        ));
    }
    // Options first: a mistake in them is reported before a large file is read.
    let mut configs = args
        .consistency
        .iter()
        .map(|&c| Ok((c, config(args, c)?)))
        .collect::<Result<Vec<_>, CliError>>()?;
    if let Some(dir) = &args.checkpoint_dir {
        if configs.len() > 1 {
            return Err(CliError::input(
                "--checkpoint-dir: one --consistency model at a time: each run would write over the other's checkpoints",
            ));
        }
        say_checkpoints(dir, args.resume)?;
        for (_, cfg) in &mut configs {
            cfg.checkpoints = Some(dir.clone());
            cfg.resume = args.resume;
        }
    }
    let init = args.init.as_deref().map(load_init).transpose()?;
    let index_base = match &init {
        Some((path, model)) => base_for_init(path, model.base, args.index_base, "--index-base")
            .map_err(CliError::Input)?,
        None => args.index_base,
    };
    let (train, test, base) = load(args, index_base)?;
    if let Some((path, model)) = init {
        eprintln!(
            "init: {} weights from {}",
            model.weights.len(),
            path.display()
        );
        let rows = Arc::new(model.rows(!args.no_bias));
        if rows.len() < model.weights.len() {
            eprintln!("init: the model's intercept is left out (--no-bias)");
        }
        for (_, cfg) in &mut configs {
            cfg.initial = Some(Arc::clone(&rows));
        }
    }
    let slowdowns = Slowdowns {
        slow_worker: args.stragglers.slow_worker.map(|s| SlowWorker {
            worker: s.worker,
            factor: s.factor.get(),
        }),
        transient: args.stragglers.straggler.map(Factor::get),
    };
    let rt = runtime()?;
    let mut runs = Vec::new();
    let mut stopped = None;
    for (consistency, cfg) in configs {
        eprintln!(
            "train: {} rows{}, test: {} rows, {} servers, {} workers, {}, {}",
            train.len(),
            match &train {
                TrainRows::Stream(file) =>
                    format!(" streamed in windows of {} per share", file.window_rows()),
                TrainRows::Memory(_) => String::new(),
            },
            test.len(),
            cfg.job.servers,
            cfg.job.workers,
            cfg.job.consistency,
            if cfg.bias {
                "intercept"
            } else {
                "no intercept"
            }
        );
        // With several runs, each line says which one it belongs to.
        let prefix = if args.consistency.len() > 1 {
            format!("consistency={consistency} ")
        } else {
            String::new()
        };
        let every = args.progress_every.duration();
        let (trained, stop) =
            train_until_stopped(&rt, &cfg, slowdowns, (&train, &test), &prefix, every)?;
        if let Some(after) = trained.stopped_early {
            let best = trained
                .reports
                .iter()
                .filter(|r| !r.test_logloss.is_nan())
                .min_by(|a, b| a.test_logloss.total_cmp(&b.test_logloss))
                .map_or(0, |r| r.epoch);
            eprintln!(
                "{prefix}early stop after epoch {after}: no lower test log loss since epoch {best}"
            );
        }
        if cfg.job.stragglers.detect.is_some() {
            let p = trained.pace;
            let skipped: usize = trained.reports.iter().map(|r| r.skipped_rows).sum();
            let repeated: usize = trained.reports.iter().map(|r| r.repeated_rows).sum();
            println!(
                "{prefix}pace stragglers={} shares_moved={} skipped_iterations={} skipped_rows={skipped} repeated_rows={repeated}",
                p.stragglers, p.shares_moved, p.skipped_iterations
            );
        }
        for (name, f) in &trained.filters {
            println!(
                "{prefix}filter {name} rows_in={} rows_out={} bytes_saved={}",
                f.rows_in, f.rows_out, f.bytes_saved
            );
        }
        runs.push((consistency, trained));
        if let Some(stop) = stop {
            eprintln!("{}: keeping the epochs finished so far", stop.word());
            stopped = Some(stop);
            break;
        }
    }
    if let Some(path) = &args.plot {
        plot(path, &runs)?;
    }
    if let (Some(path), Some((_, trained))) = (&args.save, runs.last()) {
        save(path, trained, base)?;
    }
    match stopped {
        None => Ok(()),
        Some(Stop::Interrupt) => Err(CliError::Interrupted),
        Some(Stop::Terminate) => Err(CliError::Terminated),
    }
}

/// Says what a run resuming from `dir` will find there, refusing to write over checkpoints a
/// run without --resume would leave unused.
fn say_checkpoints(dir: &Path, resume: bool) -> Result<(), CliError> {
    let servers = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("server-"))
            .map(|e| e.path())
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(CliError::input(format!(
                "{}: cannot read the checkpoint directory: {e}",
                dir.display()
            )));
        }
    };
    let mut held = Vec::new();
    for server in &servers {
        let checkpoints = CheckpointDir::new(server)
            .map_err(|e| CliError::input(format!("{}: {e}", server.display())))?;
        let (good, refused) = checkpoints
            .good()
            .map_err(|e| CliError::input(format!("{}: {e}", server.display())))?;
        if resume {
            for (file, why) in refused {
                eprintln!("checkpoint {}: refused, {why}", file.display());
            }
        }
        held.extend(good.first().copied());
    }
    match (held.iter().max(), resume) {
        (Some(newest), false) => Err(CliError::input(format!(
            "{}: holds checkpoints up to iteration {newest}: give --resume to go on from them, or another directory",
            dir.display()
        ))),
        (None, true) => {
            eprintln!(
                "resume: no good checkpoint in {}: training from the start",
                dir.display()
            );
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The saved model `--init` names.
fn load_init(path: &Path) -> Result<(PathBuf, SavedModel), CliError> {
    let model = load_model(path).map_err(CliError::Input)?;
    Ok((path.to_path_buf(), model))
}

/// The shipped data `pserver train` trains on when given no --data.
const SHIPPED: (&str, &str) = (
    "data/adult/adult.train.svm.gz",
    "data/adult/adult.test.svm.gz",
);

/// Test rows held out of --data when neither --test nor --test-fraction is given.
const TEST_FRACTION: f64 = 0.1;

/// Reads the training and test rows, with one index base decided over every file read: the
/// shipped data without --data; --data and --test; or --data with a seeded part held out.
fn load(
    args: &LrArgs,
    index_base: IndexBase,
) -> Result<(TrainRows, TestRows, IndexBase), CliError> {
    let (data, test) = match (&args.data, &args.test) {
        (Some(data), test) => (data.clone(), test.clone()),
        (None, _) => (PathBuf::from(SHIPPED.0), Some(PathBuf::from(SHIPPED.1))),
    };
    let files: Vec<&std::path::Path> = std::iter::once(data.as_path())
        .chain(test.as_deref())
        .collect();
    // Read a few megabytes at a time, twice where the base is to be found: the text of a
    // large file is never held whole beside its parsed rows.
    let (base, zero) = index_base
        .resolve_files(files.iter().copied())
        .map_err(CliError::input)?;
    let labels = args.positive.map_or(Labels::Binary, Labels::Positive);
    if args.stream {
        // The test file too is read a part at a time, each time the model is measured; without
        // one, the rows the seed names are held out of the streamed file and read from it.
        let one_based = base == IndexBase::One;
        let fraction = args.test_fraction.map_or(TEST_FRACTION, Fraction::get);
        let held = test.is_none().then_some((fraction, args.seed));
        let cfg = config(args, Consistency::Eventual)?;
        let file = StreamedFile::open(&data, one_based, labels, &cfg, args.window, held)
            .map_err(CliError::input)?;
        let test = match &test {
            Some(test) => StreamedTest::open(test, one_based, labels).map_err(CliError::input)?,
            None => {
                let held = StreamedTest::held(&data, one_based, labels, (fraction, args.seed))
                    .map_err(CliError::input)?;
                eprintln!(
                    "test: {} rows held out of {} (--test-fraction {fraction}, --seed {})",
                    held.rows(),
                    data.display(),
                    args.seed
                );
                held
            }
        };
        let test = TestRows::Streamed(test);
        say_base(index_base, zero, &files);
        say_if_one_class(&test);
        return Ok((file.into(), test, base));
    }
    let whole = read_streaming(&data, base, labels).map_err(CliError::input)?;
    if let Some(label) = args.positive
        && !whole.labels().contains(&1.0)
    {
        // One class is nothing to learn: most likely a label mistyped.
        return Err(CliError::Input(format!(
            "{}: no row is labelled {label}, the label --positive names",
            data.display()
        )));
    }
    let (train, test) = match &test {
        Some(test) => (
            whole,
            read_streaming(test, base, labels).map_err(CliError::input)?,
        ),
        None => {
            let fraction = args.test_fraction.map_or(TEST_FRACTION, Fraction::get);
            let (train, held) = whole.hold_out(fraction, args.seed);
            if train.is_empty() || held.is_empty() {
                return Err(CliError::Input(format!(
                    "{}: holding out --test-fraction {fraction} of its {} rows leaves none to {}: give more rows, another fraction or --test",
                    data.display(),
                    whole.len(),
                    if train.is_empty() {
                        "train on"
                    } else {
                        "test on"
                    }
                )));
            }
            eprintln!(
                "test: {} rows held out of {} (--test-fraction {fraction}, --seed {})",
                held.len(),
                data.display(),
                args.seed
            );
            (train, held)
        }
    };
    let test = TestRows::from(test);
    say_base(index_base, zero, &files);
    say_if_one_class(&test);
    Ok((train.into(), test, base))
}

/// Says how the index base was decided, where it was left to the files.
fn say_base(
    index_base: IndexBase,
    zero: Option<crate::data::libsvm::ZeroAt>,
    files: &[&std::path::Path],
) {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    match (index_base, zero) {
        (IndexBase::Auto, Some((file, line, column))) => {
            eprintln!("index base 0: index 0 at {file}:{line}:{column}")
        }
        (IndexBase::Auto, None) => eprintln!(
            "index base 1: no index 0 in {} (give --index-base 0 if they count from 0)",
            names.join(" or ")
        ),
        _ => {}
    }
}

/// Says when the test rows hold one class only: their AUC means nothing then (it reads 0.5),
/// and their log loss says little.
fn say_if_one_class(test: &TestRows) {
    let class = match test.positives() {
        0 => "negative",
        p if p == test.len() => "positive",
        _ => return,
    };
    eprintln!(
        "warning: every one of the {} test rows is {class}: test_auc means nothing for one class (it reads 0.5)",
        test.len()
    );
}

/// The KKT filter's bound in a job updated by `updater`: the L1 bound under which FTRL keeps a
/// weight at zero.
fn kkt_bound(updater: Updater) -> Result<Threshold, CliError> {
    let Updater::FtrlProximal { l1, .. } = updater else {
        return Err(CliError::input(
            "--kkt: the KKT filter needs an L1-regularised model: --updater ftrl",
        ));
    };
    Threshold::new(l1)
        .filter(|b| b.get() > 0.0)
        .ok_or_else(|| CliError::input(format!("--kkt: needs --l1 above 0, not {l1}")))
}

/// The training configuration the arguments give for one consistency model.
fn config(args: &LrArgs, consistency: Consistency) -> Result<LrConfig, CliError> {
    let mut job = JobSpec::new(args.nodes.servers as usize, args.nodes.workers as usize);
    job.consistency = consistency;
    job.updater = args.rule.updater()?;
    job.store = LrConfig::default().job.store;
    job.stragglers = args.stragglers.policy();
    let kkt_bound = match args.filters.kkt {
        Some(_) => Some(kkt_bound(job.updater)?),
        None => None,
    };
    job.filters = args.filters.filters(kkt_bound);
    // Refused here, naming the model, rather than once the nodes are started.
    job.validate::<f32>()
        .map_err(|e| CliError::input(format!("--consistency {consistency}: {e}")))?;
    if let Some(slow) = args.stragglers.slow_worker
        && slow.worker >= job.workers
    {
        return Err(CliError::input(format!(
            "--slow-worker {}:{}: there are workers 0 to {} only",
            slow.worker,
            slow.factor,
            job.workers - 1
        )));
    }
    let cfg = LrConfig {
        job,
        epochs: args.epochs,
        batch: args.batch,
        transport: match args.transport {
            Transport::Mem => Wire::Mem,
            Transport::Tcp => Wire::Tcp,
            Transport::Udp => Wire::Udp,
        },
        bias: !args.no_bias,
        shuffle: !args.no_shuffle,
        seed: args.seed,
        keep: args.keep,
        early_stop: args.early_stop,
        validation: validation_of(args),
        pipeline: !args.no_pipeline,
        initial: None,
        checkpoints: None,
        resume: false,
    };
    Ok(cfg.with_bias(!args.no_bias))
}

/// Training rows held out to choose the epoch when none is given but one is chosen.
const VALIDATION_FRACTION: f64 = 0.1;

/// The fraction of the training rows held out to choose the epoch: the one given, or the
/// default where an epoch is chosen among several (the model --save keeps the best, or
/// --early-stop).
fn validation_of(args: &LrArgs) -> Option<f64> {
    // A streamed file holds nothing out yet: the test rows choose, as without a fraction.
    let chooses = args.epochs > 1
        && !args.stream
        && ((args.save.is_some() && args.keep == Keep::Best) || args.early_stop.is_some());
    match args.validation_fraction {
        Some(f) => Some(f.get()),
        None => chooses.then_some(VALIDATION_FRACTION),
    }
}

/// One training run, a line per epoch (each starting with `prefix`) and a progress bar on a
/// terminal, or a progress line every few seconds without one; Ctrl-C or SIGTERM ends it
/// early. Returns what was trained and the signal that ended it, if one did.
fn train_until_stopped(
    rt: &Runtime,
    cfg: &LrConfig,
    slowdowns: Slowdowns,
    (train, test): (&TrainRows, &TestRows),
    prefix: &str,
    every: Duration,
) -> Result<(Trained, Option<Stop>), CliError> {
    let total = train.len() as u64 * u64::from(cfg.epochs);
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40} epoch {msg} {human_pos}/{human_len} rows {per_sec} {elapsed}",
    ) {
        bar.set_style(style);
    }
    bar.set_message("1");
    let terminal = std::io::stderr().is_terminal();
    let counter = RowsTrained::default();
    // The training future runs on this thread (block_on), so a Cell is enough.
    let stopped = Cell::new(None);
    let stop = async { stopped.set(Some(signals::stop_requested().await)) };
    let began = Instant::now();
    let sent_before = Cell::new(0u64);
    let first_report = Cell::new(true);
    let training = train_local_until(
        cfg,
        slowdowns,
        train.clone(),
        test.clone(),
        &counter,
        |r| {
            bar.suspend(|| {
                if first_report.replace(false) && r.epoch > 1 {
                    eprintln!(
                        "{prefix}resume: epochs 1 to {} from the servers' checkpoints",
                        r.epoch - 1
                    );
                }
                let epoch_bytes = r.bytes_sent.saturating_sub(sent_before.replace(r.bytes_sent));
                let mut line = format!(
                    "{prefix}iter={} train_logloss={:.4} test_logloss={:.4} test_auc={:.4} nnz={} rows_per_sec={:.0} secs={:.2} bytes={} epoch_bytes={epoch_bytes}",
                    r.epoch, r.train_logloss, r.test_logloss, r.test_auc, r.nnz, r.rows_per_sec(), r.secs, r.bytes_sent
                );
                if let Some(loss) = r.validation_logloss {
                    line += &format!(" valid_logloss={loss:.4}");
                }
                // Never silent: rows no worker or two workers trained.
                if r.skipped_rows > 0 || r.repeated_rows > 0 {
                    line += &format!(
                        " skipped_rows={} repeated_rows={}",
                        r.skipped_rows, r.repeated_rows
                    );
                }
                println!("{line}");
            });
            bar.set_message((r.epoch + 1).min(cfg.epochs).to_string());
        },
        stop,
    );
    let progress = async {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            ticks.tick().await;
            let rows = counter.get();
            bar.set_position(rows);
            if !terminal {
                let secs = began.elapsed().as_secs_f64();
                eprintln!(
                    "{prefix}progress rows={rows}/{total} rows_per_sec={:.0} secs={secs:.0}",
                    rows as f64 / secs.max(1e-9)
                );
            }
        }
    };
    let result = rt.block_on(async {
        tokio::select! {
            result = training => result,
            never = progress => never,
        }
    });
    bar.finish_and_clear();
    let trained = result.map_err(CliError::failed)?;
    Ok((trained, stopped.get()))
}

/// Draws each run's test log loss and AUC against time.
fn plot(path: &Path, runs: &[(Consistency, Trained)]) -> Result<(), CliError> {
    let curves: Vec<Curve<'_>> = runs
        .iter()
        .map(|(c, trained)| Curve {
            name: c.to_string(),
            reports: &trained.reports,
        })
        .collect();
    write_svg(path, &curves).map_err(CliError::Input)?;
    eprintln!("plot: {}", path.display());
    Ok(())
}

/// Saves the trained model, with the index base its data was read with, for `pserver
/// predict`.
fn save(path: &Path, trained: &Trained, base: IndexBase) -> Result<(), CliError> {
    save_model(path, &trained.model, base).map_err(CliError::Input)?;
    let nonzero = trained.model.values().iter().filter(|w| **w != 0.0).count();
    eprintln!(
        "model: {} (epoch {} of {}, {nonzero} non-zero weights, index base {base})",
        path.display(),
        trained.kept_epoch,
        trained.reports.len()
    );
    Ok(())
}
