//! `pserver train`: trains a model in one process.

mod lr;
mod mf;
mod sketch;

use std::path::PathBuf;

use pserver_core::Consistency;

use super::CliError;
use super::parse::{at_least_one, non_negative_finite, open_unit, positive_finite};

/// Train a model in one process: sparse logistic regression (lr), matrix factorization
/// (mf) or a count-min sketch (sketch).
///
/// With no arguments, trains logistic regression on the shipped UCI Adult data
/// (data/adult); `pserver train sketch` counts a generated stream and checks every
/// estimate against its exact count (`sketch ... over_bound=O max_overcount=M`). Workers compute
/// gradients on minibatches of their own share of the rows and push them; servers apply
/// FTRL-Proximal. After every epoch prints `iter=E train_logloss=... test_logloss=...
/// test_auc=... nnz=... secs=...`; a bad data file is one line naming file:line:column,
/// exit status 2, and so is an empty one, or an option with a value it cannot mean (a NaN or
/// negative rate, zero epochs). Ctrl-C or SIGTERM stops it, keeping the epochs finished so
/// far (their plot and model), with exit status 130 or 143.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// What to train.
    #[arg(value_enum, default_value = "lr")]
    app: App,
    /// Sketch: items in the stream.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    items: u64,
    /// Sketch: additive error bound, as a fraction of the stream's length.
    #[arg(long, default_value_t = 0.001, value_parser = open_unit, allow_negative_numbers = true)]
    eps: f64,
    /// Sketch: probability that an estimate breaks the bound.
    #[arg(long, default_value_t = 0.01, value_parser = open_unit, allow_negative_numbers = true)]
    delta: f64,
    /// Training data (LIBSVM, optionally .gz).
    #[arg(long, default_value = "data/adult/adult.train.svm.gz")]
    data: PathBuf,
    /// Test data (LIBSVM, optionally .gz).
    #[arg(long, default_value = "data/adult/adult.test.svm.gz")]
    test: PathBuf,
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
    plot: Option<PathBuf>,
    /// Save the trained model (of the last consistency model given) to this file, for
    /// `pserver predict`.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    /// Passes over the training data.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    epochs: u32,
    /// Rows per minibatch on each worker.
    #[arg(long, default_value_t = 100, value_parser = at_least_one, allow_negative_numbers = true)]
    batch: usize,
    /// How the nodes of this process talk: mem (channels) or tcp (authenticated connections
    /// on 127.0.0.1). For separate processes, see `pserver coordinator | server | worker`.
    #[arg(long, value_enum, default_value = "mem")]
    transport: Transport,
    /// The servers' update rule: ftrl (FTRL-Proximal, sparse), adagrad or sgd.
    #[arg(long, value_enum, default_value = "ftrl")]
    updater: UpdateRule,
    /// Learning rate of adagrad and sgd.
    #[arg(long, default_value_t = 0.1, value_parser = positive_finite, allow_negative_numbers = true)]
    lr: f64,
    /// FTRL learning-rate scale.
    #[arg(long, default_value_t = 0.3, value_parser = positive_finite, allow_negative_numbers = true)]
    alpha: f64,
    /// FTRL L1 regularization (larger: sparser model).
    #[arg(long, default_value_t = 1.0, value_parser = non_negative_finite, allow_negative_numbers = true)]
    l1: f64,
    /// FTRL L2 regularization.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative_finite, allow_negative_numbers = true)]
    l2: f64,
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

// The variants below have no doc comment: clap would print it under the option, whose own
// help already explains each choice.

/// How the nodes of a training run talk.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Mem,
    Tcp,
}

/// The servers' update rule.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum UpdateRule {
    Ftrl,
    Adagrad,
    Sgd,
}

/// Runs `pserver train`: trains the chosen application and prints how it went.
pub fn run(args: TrainArgs) -> Result<(), CliError> {
    match args.app {
        App::Lr => lr::run(&args),
        App::Mf => mf::run(&args),
        App::Sketch => sketch::run(&args),
    }
}
