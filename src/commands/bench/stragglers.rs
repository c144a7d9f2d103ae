//! `pserver bench --stragglers`: what straggler handling buys on the shipped UCI Adult data,
//! against plain runs in the same invocation (ARCHITECTURE.md §9).
//!
//! Two measures. With worker 0 always four times slower, plain sequential consistency is the
//! baseline, and bounded delay 1 with skip-ahead and eight shares per worker sized by speed is
//! measured against it: time to the end of training, and the test AUC reached. With transient
//! stragglers (at each step one worker drawn at random computes four times slower), each fixed
//! tau of 0, 1, 2, 4 and 8 runs, and adaptive tau between 1 and 8: the target is the lowest
//! test log loss any fixed tau reaches, plus 0.001 (figures differ from run to run in the
//! fourth decimal), and each run's figure is the time it first reaches it. Every figure is
//! the median of five repetitions.

use std::path::Path;
use std::sync::Arc;

use pserver_core::{Balance, Consistency, StragglerPolicy, TauRange};

use super::{BenchError, Measure, runtime_err};
use crate::apps::lr::{EpochReport, LrConfig, SlowWorker, train_local};
use crate::data::libsvm::{Examples, IndexBase, read};

/// How close to the lowest fixed-tau log loss counts as reaching it.
const REACHED: f64 = 0.001;

/// Runs both measures five times and prints the median of each figure (timings on a shared
/// machine vary by tens of percent from run to run); `quick`: once, with few epochs (a smoke
/// test of the benchmark itself).
pub(super) async fn run_stragglers_bench(
    quick: bool,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let reps = if quick { 1 } else { 5 };
    let mut all: Vec<Vec<Measure>> = Vec::new();
    for _ in 0..reps {
        let mut once = Vec::new();
        measure_once(quick, &mut |m| once.push(m)).await?;
        all.push(once);
    }
    emit(Measure {
        name: "stragglers.repetitions".into(),
        value: f64::from(reps),
        unit: "runs",
    });
    let Some(first) = all.first() else {
        return Ok(());
    };
    for (i, m) in first.iter().enumerate() {
        let mut values: Vec<f64> = all
            .iter()
            .filter_map(|r| r.get(i))
            .map(|m| m.value)
            .collect();
        values.sort_by(f64::total_cmp);
        emit(Measure {
            name: m.name.clone(),
            value: values[values.len() / 2],
            unit: m.unit,
        });
    }
    Ok(())
}

/// Both measures once.
async fn measure_once(quick: bool, emit: &mut impl FnMut(Measure)) -> Result<(), BenchError> {
    let adult = |name: &str| -> Result<Arc<Examples>, BenchError> {
        let path = Path::new("data/adult").join(name);
        Ok(Arc::new(read(&path, IndexBase::Auto).map_err(runtime_err)?))
    };
    let (train, test) = (adult("adult.train.svm.gz")?, adult("adult.test.svm.gz")?);
    let run = |cfg: LrConfig| {
        let (train, test) = (train.clone(), test.clone());
        async move { train_local(&cfg, train, test, |_| {}).await }
    };
    let mut figure = |name: &str, value: f64, unit: &'static str| {
        emit(Measure {
            name: format!("stragglers.{name}"),
            value,
            unit,
        })
    };

    // A worker always four times slower.
    let epochs = if quick { 3 } else { 30 };
    let slow = Some(SlowWorker {
        worker: 0,
        factor: 4.0,
    });
    let plain = |consistency| {
        let mut cfg = LrConfig {
            epochs,
            ..LrConfig::default()
        };
        cfg.job.consistency = consistency;
        cfg
    };
    let fast = run(plain(Consistency::Sequential)).await?;
    let baseline = run(LrConfig {
        slow_worker: slow,
        ..plain(Consistency::Sequential)
    })
    .await?;
    let mut handled = LrConfig {
        slow_worker: slow,
        ..plain(Consistency::BoundedDelay(1))
    };
    handled.job.stragglers = StragglerPolicy::skip_ahead();
    handled.job.stragglers.balance = Some(Balance::shares(8));
    let handled = run(handled).await?;
    let (fast_secs, _) = secs_auc(&fast.reports);
    let (base_secs, base_auc) = secs_auc(&baseline.reports);
    let (handled_secs, handled_auc) = secs_auc(&handled.reports);
    figure("no_slow_worker.sequential.secs", fast_secs, "s");
    figure("slow_worker.sequential.secs", base_secs, "s");
    figure("slow_worker.sequential.test_auc", base_auc, "auc");
    figure("slow_worker.skip_ahead_shares8.secs", handled_secs, "s");
    figure(
        "slow_worker.skip_ahead_shares8.test_auc",
        handled_auc,
        "auc",
    );
    figure(
        "slow_worker.skip_ahead_shares8.vs_sequential",
        handled_secs / base_secs,
        "x",
    );
    figure(
        "slow_worker.skip_ahead_shares8.auc_minus_sequential",
        handled_auc - base_auc,
        "auc",
    );
    figure(
        "slow_worker.skip_ahead_shares8.shares_moved",
        handled.pace.shares_moved as f64,
        "moves",
    );
    let skipped: usize = handled.reports.iter().map(|r| r.skipped_rows).sum();
    figure(
        "slow_worker.skip_ahead_shares8.skipped_rows",
        skipped as f64,
        "rows",
    );

    // Transient stragglers.
    let epochs = if quick { 3 } else { 15 };
    let transient = |consistency, adaptive: Option<TauRange>| {
        let mut cfg = LrConfig {
            epochs,
            straggler: Some(4.0),
            ..LrConfig::default()
        };
        cfg.job.consistency = consistency;
        if let Some(range) = adaptive {
            cfg.job.stragglers = StragglerPolicy::adaptive(range);
        }
        cfg
    };
    let mut fixed = Vec::new();
    for tau in [0, 1, 2, 4, 8] {
        let consistency = match tau {
            0 => Consistency::Sequential,
            t => Consistency::BoundedDelay(t),
        };
        fixed.push((tau, run(transient(consistency, None)).await?.reports));
    }
    let range = TauRange { min: 1, max: 8 };
    let adaptive = run(transient(Consistency::BoundedDelay(range.min), Some(range)))
        .await?
        .reports;
    let lowest = fixed
        .iter()
        .flat_map(|(_, r)| r.iter().map(|e| e.test_logloss))
        .fold(f64::INFINITY, f64::min);
    let target = lowest + REACHED;
    figure("transient.target_test_logloss", target, "logloss");
    let mut best = f64::INFINITY;
    for (tau, reports) in &fixed {
        let t = time_to(reports, target);
        best = best.min(t);
        figure(&format!("transient.tau{tau}.secs_to_target"), t, "s");
    }
    let t = time_to(&adaptive, target);
    figure("transient.adaptive1-8.secs_to_target", t, "s");
    figure("transient.adaptive1-8.vs_best_fixed", t / best, "x");
    Ok(())
}

/// The last epoch's end and test AUC.
fn secs_auc(reports: &[EpochReport]) -> (f64, f64) {
    reports
        .last()
        .map_or((f64::NAN, f64::NAN), |e| (e.secs, e.test_auc))
}

/// When a run first reached `target` test log loss (infinity if never).
fn time_to(reports: &[EpochReport], target: f64) -> f64 {
    reports
        .iter()
        .find(|e| e.test_logloss <= target)
        .map_or(f64::INFINITY, |e| e.secs)
}
