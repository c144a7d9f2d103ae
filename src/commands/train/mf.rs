//! `pserver train mf`: matrix factorization of a ratings file, or of generated ratings.

use std::path::PathBuf;

use pserver_core::Consistency;

use super::NodesArgs;
use std::sync::Arc;

use crate::apps::lr::Keep;
use crate::apps::mf::{
    Generated, MfConfig, MfData, Start, checkpoint_rows, initial_rows, train_model,
};
use crate::apps::mf_file::{load_mf, save_mf};
use crate::commands::CliError;
use crate::commands::values::{Fraction, Rate, Strength, at_least_one, output_file};
use pserver_runtime::checkpoint::CheckpointDir;

/// Factorize a matrix of ratings into user and item factors.
///
/// With --data, trains on a ratings file: MovieLens u.data (user item rating timestamp,
/// tab-separated), ratings.dat (user::item::rating::timestamp), or CSV with a header naming
/// the user, item and rating columns (MovieLens userId,movieId,rating,timestamp), optionally
/// .gz. Without it, on a generated rank-4 problem whose noise floor is printed. A rating is
/// predicted as the training mean plus its user's and item's biases plus the dot product of
/// their factors. The factors and biases live on the servers; workers push the gradient of
/// the squared error of their minibatches, each user's and item's averaged over its ratings
/// in the minibatch. A tenth of the training ratings is held out to choose the epoch kept and
/// when to stop early. Prints `iter=E train_rmse=... test_rmse=... baseline_rmse=...
/// valid_rmse=... secs=... rows_per_sec=...` after every epoch, where baseline_rmse is the
/// test RMSE of predicting the training mean. A bad line is one error naming file:line and
/// the field, exit status 2.
#[derive(clap::Args, Debug)]
pub(crate) struct MfArgs {
    /// Ratings to train on; without it, a generated problem.
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// Test ratings, whose user and item ids are those of --data [default: hold out
    /// --test-fraction of --data].
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
    /// Seed of the test split, the initial factors, the order of each epoch and the
    /// generated problem.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    nodes: NodesArgs,
    /// Consistency model: sequential, bounded:TAU or eventual.
    #[arg(long, default_value = "bounded:2")]
    consistency: Consistency,
    /// Factors per user and per item [default: 10 with --data; 4, the true rank, on the
    /// generated problem].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000), allow_negative_numbers = true)]
    rank: Option<u32>,
    /// The servers' SGD learning rate.
    #[arg(long, default_value = "0.05", allow_negative_numbers = true)]
    lr: Rate,
    /// L2 regularization of the factors, per rating [default: 0.05 with --data, 0.01 on the
    /// generated problem].
    #[arg(long, allow_negative_numbers = true)]
    l2: Option<Strength>,
    /// Passes over the training ratings [default: 20 with --data, or until --early-stop ends
    /// the run; 8 on the generated problem].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    epochs: Option<u32>,
    /// Stop after N epochs in a row without a lower validation RMSE [default: 3 with --data and
    /// --keep best, where ratings are held out for validation; none with --keep last or on the
    /// generated problem].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    early_stop: Option<u32>,
    /// Fraction of the training ratings held out, drawn from --seed, to choose the epoch kept
    /// (--keep best) and when --early-stop ends the run, so that the test ratings choose
    /// neither [default: 0.1 with --data, or with --early-stop].
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    validation_fraction: Option<Fraction>,
    /// Which epoch's model the run ends with, and --save writes: best (the lowest validation
    /// RMSE) or last.
    #[arg(long, value_enum, default_value = "best")]
    keep: Keep,
    /// Ratings per minibatch on each worker.
    #[arg(long, default_value_t = 200, value_parser = at_least_one, allow_negative_numbers = true)]
    batch: usize,
    /// Save the model --keep chooses to this file (every user's and item's factors and bias
    /// under the ids of the ratings file), for `pserver predict` and --init.
    #[arg(long, value_name = "FILE", value_parser = output_file)]
    save: Option<PathBuf>,
    /// Start from this saved model instead of small random factors: the users and items it
    /// holds start where it left them, matched by their ids; its rank must be the run's.
    #[arg(long, value_name = "MODEL")]
    init: Option<PathBuf>,
    /// Write a checkpoint of the servers' rows after every epoch to this directory (written
    /// whole or not at all, checksummed), for --resume.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Go on from the newest good checkpoint in --checkpoint-dir: train the epochs after it,
    /// each as it would have been trained without the interruption. A torn or corrupt
    /// checkpoint is said and passed over for the one before it.
    #[arg(long, requires = "checkpoint_dir", conflicts_with = "init")]
    resume: bool,
}

/// Test fraction when neither --test nor --test-fraction is given.
const TEST_FRACTION: f64 = 0.1;

/// Validation fraction where ratings are held out and no fraction is given.
const VALIDATION_FRACTION: f64 = 0.1;

/// Epochs in a row without a lower validation RMSE after which a run on a ratings file stops
/// when not told otherwise: on MovieLens-100k-shaped ratings the validation RMSE levels off
/// within 10-15 epochs of the default rate and then creeps up as the model overfits.
const EARLY_STOP: u32 = 3;

/// The training configuration the arguments give.
fn config(args: &MfArgs) -> MfConfig {
    let real = args.data.is_some();
    MfConfig {
        servers: args.nodes.servers as usize,
        workers: args.nodes.workers as usize,
        consistency: args.consistency,
        rank: args.rank.map_or(if real { 10 } else { 4 }, |r| r as usize),
        epochs: args.epochs.unwrap_or(if real { 20 } else { 8 }),
        batch: args.batch,
        lr: args.lr.get(),
        l2: args
            .l2
            .map_or(if real { 0.05 } else { 0.01 }, Strength::get),
        seed: args.seed,
        // By default only where the best epoch is kept: with --keep last the run trains every
        // epoch asked for.
        early_stop: args.early_stop.or((real
            && args.keep == Keep::Best
            && validation_of(args).is_some())
        .then_some(EARLY_STOP)),
        keep_best: args.keep == Keep::Best,
    }
}

/// The fraction of the training ratings held out for validation: the one given, else the
/// default on a ratings file or with --early-stop; none on the generated problem otherwise.
fn validation_of(args: &MfArgs) -> Option<f64> {
    match args.validation_fraction {
        Some(f) => Some(f.get()),
        None => (args.data.is_some() || args.early_stop.is_some()).then_some(VALIDATION_FRACTION),
    }
}

/// The ratings the arguments name, split into training and test ratings.
fn load(args: &MfArgs, data: &std::path::Path) -> Result<MfData, CliError> {
    let fraction = args.test_fraction.map_or(TEST_FRACTION, Fraction::get);
    crate::apps::mf::load(
        data,
        args.test.as_deref(),
        fraction,
        args.seed,
        "--test-fraction",
    )
    .map_err(CliError::Input)
}

/// Trains and prints the errors after every epoch.
pub(super) fn run(args: &MfArgs) -> Result<(), CliError> {
    let cfg = config(args);
    let (mut data, noise) = match &args.data {
        Some(path) => (load(args, path)?, None),
        None => {
            let problem = Generated {
                seed: args.seed,
                ..Generated::default()
            };
            (problem.data(), Some(problem.noise))
        }
    };
    if let Some(fraction) = validation_of(args) {
        data.hold_out_validation(fraction, args.seed)
            .map_err(CliError::Input)?;
    }
    let initial = match &args.init {
        Some(path) => {
            let model = load_mf(path).map_err(CliError::Input)?;
            let rows = initial_rows(&cfg, &model, &data.ids)
                .map_err(|e| CliError::Input(format!("{}: {e}", path.display())))?;
            eprintln!(
                "init: {} of the {} users and items of {} are in the data",
                rows.len(),
                model.users.len() + model.items.len(),
                path.display()
            );
            // The biases were learnt around the saved mean: predictions stay around it.
            data.center = Some(model.mean);
            Some(Arc::new(rows))
        }
        None => None,
    };
    let mut start = Start {
        initial,
        ..Start::default()
    };
    if let Some(path) = &args.checkpoint_dir {
        resume_from(path, args.resume, &cfg, &mut start)?;
    }
    if start.done >= cfg.epochs {
        eprintln!(
            "resume: every one of the {} epochs is trained already",
            cfg.epochs
        );
    }
    let per = data.train.len().div_ceil(cfg.workers);
    eprintln!(
        "mf: {} users, {} items, {} train ratings, {} validation ratings, {} test ratings ({} with a user or item unseen in training), rank {}, {} workers x {} steps of {} ratings per epoch{}",
        data.users(),
        data.items(),
        data.train.len(),
        data.validation.len(),
        data.test.len(),
        data.unseen(),
        cfg.rank,
        cfg.workers,
        per.div_ceil(cfg.batch),
        cfg.batch,
        noise.map_or(String::new(), |n| format!(", noise floor {n}")),
    );
    let rt = crate::commands::runtime()?;
    let (ids, mean) = (data.ids.clone(), data.mean());
    let (_, model) = rt
        .block_on(train_model(&cfg, data, start, |r| {
            let valid = r
                .validation_rmse
                .map_or(String::new(), |v| format!(" valid_rmse={v:.4}"));
            println!(
                "iter={} train_rmse={:.4} test_rmse={:.4} baseline_rmse={:.4}{valid} secs={:.2} rows_per_sec={:.0}",
                r.epoch, r.train_rmse, r.test_rmse, r.baseline_rmse, r.secs, r.rows_per_sec
            );
        }))
        .map_err(CliError::failed)?;
    if let Some(path) = &args.save {
        save_mf(path, &model.file(&ids, mean)).map_err(CliError::Input)?;
    }
    Ok(())
}

/// Reads the checkpoints in `path` into `start`: with `resume`, the newest good one's rows and
/// epoch; without, none may be there. Every newer file refused is said; the run writes its own
/// checkpoints there.
fn resume_from(
    path: &std::path::Path,
    resume: bool,
    cfg: &MfConfig,
    start: &mut Start,
) -> Result<(), CliError> {
    let dir = CheckpointDir::new(path).map_err(|e| {
        CliError::Input(format!(
            "{}: cannot make the checkpoint directory: {e}",
            path.display()
        ))
    })?;
    let latest = dir.latest().map_err(|e| {
        CliError::Input(format!(
            "{}: cannot read the checkpoints: {e}",
            path.display()
        ))
    })?;
    for (file, why) in &latest.refused {
        eprintln!("checkpoint {}: refused, {why}", file.display());
    }
    match (&latest.found, resume) {
        (Some(found), true) => {
            let rows = checkpoint_rows(cfg, &found.payload)
                .map_err(|e| CliError::Input(format!("{}: {e}", found.path.display())))?;
            start.done = u32::try_from(found.iteration).unwrap_or(u32::MAX);
            start.initial = Some(Arc::new(rows));
            eprintln!(
                "resume: epochs 1 to {} from {}",
                start.done,
                found.path.display()
            );
        }
        (None, true) => eprintln!(
            "resume: no good checkpoint in {}: training from the start",
            path.display()
        ),
        (Some(found), false) => {
            return Err(CliError::Input(format!(
                "{}: holds checkpoints up to epoch {}: give --resume to go on from them, or another directory",
                path.display(),
                found.iteration
            )));
        }
        (None, false) => {}
    }
    start.checkpoints = Some(dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mf: MfArgs,
    }

    fn config_of(args: &[&str]) -> MfConfig {
        let cli = Cli::try_parse_from(std::iter::once("mf").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        config(&cli.mf)
    }

    #[test]
    fn every_training_option_reaches_the_configuration() {
        let cfg = config_of(&[
            "--data",
            "u.data",
            "--rank",
            "3",
            "--lr",
            "0.2",
            "--l2",
            "0.5",
            "--batch",
            "7",
            "--epochs",
            "9",
            "--seed",
            "11",
            "--workers",
            "3",
            "--servers",
            "5",
        ]);
        let want = MfConfig {
            servers: 5,
            workers: 3,
            consistency: Consistency::BoundedDelay(2),
            rank: 3,
            epochs: 9,
            batch: 7,
            lr: 0.2,
            l2: 0.5,
            seed: 11,
            early_stop: Some(3),
            keep_best: true,
        };
        assert_eq!(cfg, want);
    }

    #[test]
    fn a_run_keeping_its_last_epoch_trains_every_epoch_asked_for() {
        assert_eq!(config_of(&["--data", "u.data"]).early_stop, Some(3));
        let last = config_of(&["--data", "u.data", "--keep", "last"]);
        assert_eq!((last.early_stop, last.keep_best), (None, false));
        let told = config_of(&["--data", "u.data", "--keep", "last", "--early-stop", "2"]);
        assert_eq!(told.early_stop, Some(2));
    }

    #[test]
    fn rank_and_l2_default_by_whether_the_data_is_real() {
        let generated = config_of(&[]);
        assert_eq!((generated.rank, generated.l2), (4, 0.01));
        let real = config_of(&["--data", "u.data"]);
        assert_eq!((real.rank, real.l2), (10, 0.05));
    }

    #[test]
    fn test_options_need_data_and_exclude_each_other() {
        let refused = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("mf").chain(args.iter().copied())).is_err()
        };
        assert!(refused(&["--test", "t"]));
        assert!(refused(&["--test-fraction", "0.2"]));
        assert!(refused(&[
            "--data",
            "d",
            "--test",
            "t",
            "--test-fraction",
            "0.2"
        ]));
        for bad in ["0", "1", "NaN", "-0.1"] {
            assert!(refused(&["--data", "d", "--test-fraction", bad]), "{bad}");
        }
        assert!(!refused(&["--data", "d", "--test-fraction", "0.2"]));
    }
}
