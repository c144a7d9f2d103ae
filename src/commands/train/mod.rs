//! `pserver train`: trains a model in one process. Each application is its own subcommand
//! with its own options; `pserver train` alone (or with logistic-regression options) is
//! `pserver train lr`.

mod lr;
mod mf;
mod sketch;

use super::CliError;

pub(crate) use lr::LrArgs;
pub(crate) use mf::MfArgs;
pub(crate) use sketch::SketchArgs;

/// Train a model in one process: sparse logistic regression (lr, the default), matrix
/// factorization (mf) or a count-min sketch (sketch).
///
/// With no arguments, trains logistic regression on the shipped UCI Adult data (data/adult).
/// `pserver train lr --help`, `pserver train mf --help` and `pserver train sketch --help`
/// show each application's options.
#[derive(clap::Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_precedence_over_arg = true
)]
pub(crate) struct TrainArgs {
    /// What to train.
    #[command(subcommand)]
    app: Option<App>,
    /// Logistic regression's options, for `pserver train` without a subcommand.
    #[command(flatten)]
    lr: LrArgs,
}

/// What `pserver train` trains. The variants have no doc comment: each command's help is its
/// arguments' own.
#[derive(clap::Subcommand, Debug)]
enum App {
    Lr(Box<LrArgs>),
    Mf(Box<MfArgs>),
    Sketch(SketchArgs),
}

/// The nodes every application runs on, in this process.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct NodesArgs {
    /// Servers.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub servers: u32,
    /// Workers.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
}

/// Runs `pserver train`: trains the chosen application and prints how it went.
pub(crate) fn run(args: TrainArgs) -> Result<(), CliError> {
    match args.app {
        None => lr::run(&args.lr),
        Some(App::Lr(lr)) => lr::run(&lr),
        Some(App::Mf(mf)) => mf::run(&mf),
        Some(App::Sketch(sketch)) => sketch::run(&sketch),
    }
}
