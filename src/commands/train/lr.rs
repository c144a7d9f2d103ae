//! `pserver train lr`: sparse logistic regression on LIBSVM data, once per consistency model.

use std::cell::Cell;
use std::path::Path;

use indicatif::ProgressBar;
use pserver_core::{Consistency, JobSpec, Updater};
use tokio::runtime::Runtime;

use super::{TrainArgs, Transport, UpdateRule};
use crate::apps::lr::{LrConfig, Trained, Wire, save_model, train_local_until};
use crate::apps::plot::{Curve, write_svg};
use crate::commands::signals::{self, Stop};
use crate::commands::{CliError, runtime};
use crate::data::libsvm::{Examples, IndexBase, read};

/// Trains once per consistency model given, printing a line per epoch, then draws the plot
/// and saves the model asked for. Ctrl-C or SIGTERM keeps the epochs finished so far (exit
/// status 130 or 143).
pub(super) fn run(args: &TrainArgs) -> Result<(), CliError> {
    let load = |p: &Path| read(p, IndexBase::Auto);
    let (train, test) = match (load(&args.data), load(&args.test)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return Err(CliError::input(e)),
    };
    let rt = runtime()?;
    let mut runs = Vec::new();
    let mut stopped = None;
    for &consistency in &args.consistency {
        let cfg = config(args, consistency);
        eprintln!(
            "train: {} rows, test: {} rows, {} servers, {} workers, {}",
            train.len(),
            test.len(),
            cfg.job.servers,
            cfg.job.workers,
            cfg.job.consistency
        );
        // With several runs, each line says which one it belongs to.
        let prefix = if args.consistency.len() > 1 {
            format!("consistency={consistency} ")
        } else {
            String::new()
        };
        let (trained, stop) = train_until_stopped(&rt, &cfg, &train, &test, &prefix)?;
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
        save(path, trained)?;
    }
    match stopped {
        None => Ok(()),
        Some(Stop::Interrupt) => Err(CliError::Interrupted),
        Some(Stop::Terminate) => Err(CliError::Terminated),
    }
}

/// The training configuration the arguments give for one consistency model.
fn config(args: &TrainArgs, consistency: Consistency) -> LrConfig {
    let mut job = JobSpec::new(args.servers as usize, args.workers as usize);
    job.consistency = consistency;
    job.updater = match args.updater {
        UpdateRule::Adagrad => Updater::AdaGrad {
            lr: args.lr,
            eps: 1e-6,
        },
        UpdateRule::Sgd => Updater::Sgd { lr: args.lr },
        UpdateRule::Ftrl => Updater::FtrlProximal {
            alpha: args.alpha,
            beta: 1.0,
            l1: args.l1,
            l2: args.l2,
        },
    };
    LrConfig {
        job,
        epochs: args.epochs,
        batch: args.batch,
        transport: match args.transport {
            Transport::Mem => Wire::Mem,
            Transport::Tcp => Wire::Tcp,
        },
    }
}

/// One training run, a line per epoch (each starting with `prefix`) and a progress bar;
/// Ctrl-C or SIGTERM ends it early. Returns what was trained and the signal that ended it, if
/// one did.
fn train_until_stopped(
    rt: &Runtime,
    cfg: &LrConfig,
    train: &Examples,
    test: &Examples,
    prefix: &str,
) -> Result<(Trained, Option<Stop>), CliError> {
    let bar = ProgressBar::new(u64::from(cfg.epochs));
    // The training future runs on this thread (block_on), so a Cell is enough.
    let stopped = Cell::new(None);
    let stop = async { stopped.set(Some(signals::stop_requested().await)) };
    let result = rt.block_on(train_local_until(cfg, train.clone(), test.clone(), |r| {
        bar.suspend(|| {
            println!(
                "{prefix}iter={} train_logloss={:.4} test_logloss={:.4} test_auc={:.4} nnz={} secs={:.2} bytes={}",
                r.epoch, r.train_logloss, r.test_logloss, r.test_auc, r.nnz, r.secs, r.bytes_sent
            )
        });
        bar.inc(1);
    }, stop));
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

/// Saves the trained model for `pserver predict`.
fn save(path: &Path, trained: &Trained) -> Result<(), CliError> {
    save_model(path, &trained.model).map_err(CliError::Input)?;
    let nonzero = trained.model.values().iter().filter(|w| **w != 0.0).count();
    eprintln!("model: {} ({nonzero} non-zero weights)", path.display());
    Ok(())
}
