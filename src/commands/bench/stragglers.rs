//! `pserver bench --stragglers`: what straggler handling buys on the shipped UCI Adult data,
//! against plain runs in the same invocation (ARCHITECTURE.md §9).
//!
//! Two measures. With worker 0 always four times slower, plain sequential consistency is the
//! baseline, and bounded delay 1 with skip-ahead and eight shares per worker sized by speed is
//! measured against it: time to the end of training, and the test AUC reached; each figure is
//! the median of the repetitions.
//!
//! With transient stragglers (at each step one worker drawn at random computes four times
//! slower), each fixed tau of 0, 1, 2, 4 and 8 runs, and adaptive tau between 1 and 8, each
//! as often as the others, in turn, a different seed each time. What is compared is each
//! configuration's median learning curve (at each epoch, the median test log loss and the
//! median time over its runs). The target is the lowest loss any fixed tau's curve reaches,
//! plus 0.001, and each curve's figure is when it first reaches it, between two epochs by
//! linear interpolation.
//!
//! These runs take FTRL's alpha at 0.01 for 20 epochs rather than the default 0.1. At 0.1
//! Adult's test log loss levels off within three epochs (0.15 s) and then wanders by about
//! 0.005 from one epoch to the next, so the epoch a run first dips to a loss near the lowest
//! is luck: on the same code, one run of this benchmark measured adaptive tau at 0.71 times
//! the best fixed tau's time, another at 1.29 (measured at the rule's earlier default, which
//! levelled off as fast). At 0.01 the curves fall through the whole run and every
//! tau's curve falls alike epoch by epoch; what differs is the time an epoch takes.

use std::path::Path;
use std::sync::Arc;

use pserver_core::Consistency;

use pserver_core::pace::{Balance, StragglerPolicy, TauRange};

use super::{BenchError, Measure, runtime_err};
use crate::apps::lr::{
    DEFAULT_L1, DEFAULT_L2, EpochReport, LrConfig, SlowWorker, Slowdowns, ftrl, train_local,
};
use crate::data::libsvm::{Examples, IndexBase, read};

/// How close to the lowest fixed-tau log loss counts as reaching it.
const REACHED: f64 = 0.001;

/// The fixed bounds adaptive tau is measured against (0: sequential).
const FIXED_TAUS: [u32; 5] = [0, 1, 2, 4, 8];

/// How often each configuration runs.
const REPS: u32 = 11;

/// Where adaptive tau moves, in the transient measure.
const ADAPTIVE: TauRange = TauRange { min: 1, max: 8 };

/// The shipped training and test sets.
type Data = (Arc<Examples>, Arc<Examples>);

/// Runs both measures, each configuration `REPS` times, and prints the medians (timings on a
/// shared machine vary by tens of percent from run to run); `quick`: once, with few epochs (a
/// smoke test of the benchmark itself).
pub(super) async fn run_stragglers_bench(
    quick: bool,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let reps: u32 = if quick { 1 } else { REPS };
    let adult = |name: &str| -> Result<Arc<Examples>, BenchError> {
        let path = Path::new("data/adult").join(name);
        Ok(Arc::new(read(&path, IndexBase::Auto).map_err(runtime_err)?))
    };
    let data = (adult("adult.train.svm.gz")?, adult("adult.test.svm.gz")?);
    emit(Measure {
        name: "stragglers.repetitions".into(),
        value: f64::from(reps),
        unit: "runs",
    });
    let mut all: Vec<Vec<Measure>> = Vec::new();
    for _ in 0..reps {
        let mut once = Vec::new();
        slow_worker_once(quick, &data, &mut |m| once.push(m)).await?;
        all.push(once);
    }
    if let Some(first) = all.first() {
        for (i, m) in first.iter().enumerate() {
            let values: Vec<f64> = all
                .iter()
                .filter_map(|r| r.get(i))
                .map(|m| m.value)
                .collect();
            emit(Measure {
                name: m.name.clone(),
                value: median(values),
                unit: m.unit,
            });
        }
    }
    transient(quick, reps, &data, 0.01, 20, emit).await
}

/// The middle value (the upper of the two middle ones of an even count; NaN if none).
pub(super) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Trains `cfg` on the shipped data, its workers slowed as `slowdowns` says.
async fn run(
    cfg: LrConfig,
    slowdowns: Slowdowns,
    data: &Data,
) -> Result<crate::apps::lr::Trained, BenchError> {
    let (train, test) = (data.0.clone(), data.1.clone());
    Ok(train_local(&cfg, slowdowns, train, test, |_| {}).await?)
}

/// The transient-straggler measure: every configuration `reps` times, in turn, then the
/// median curves and the time each reaches the target.
async fn transient(
    quick: bool,
    reps: u32,
    data: &Data,
    alpha: f64,
    epochs: u32,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let epochs = if quick { 3 } else { epochs };
    let config = |consistency, adaptive: Option<TauRange>| {
        let mut cfg = LrConfig {
            epochs,
            ..LrConfig::default()
        };
        cfg.job.updater = ftrl(alpha, DEFAULT_L1, DEFAULT_L2);
        cfg.job.consistency = consistency;
        if let Some(range) = adaptive {
            cfg.job.stragglers = StragglerPolicy::adaptive(range);
        }
        cfg
    };
    let mut configs: Vec<(String, LrConfig)> = FIXED_TAUS
        .iter()
        .map(|&tau| {
            let consistency = match tau {
                0 => Consistency::Sequential,
                t => Consistency::BoundedDelay(t),
            };
            (format!("tau{tau}"), config(consistency, None))
        })
        .collect();
    let adaptive = format!("adaptive{}-{}", ADAPTIVE.min, ADAPTIVE.max);
    configs.push((
        adaptive.clone(),
        config(Consistency::BoundedDelay(ADAPTIVE.min), Some(ADAPTIVE)),
    ));
    let stragglers = Slowdowns {
        transient: Some(4.0),
        ..Slowdowns::default()
    };
    let mut runs: Vec<Vec<Vec<EpochReport>>> = vec![Vec::new(); configs.len()];
    for rep in 0..reps {
        for ((_, cfg), runs) in configs.iter().zip(&mut runs) {
            let cfg = LrConfig {
                seed: u64::from(rep),
                ..cfg.clone()
            };
            runs.push(run(cfg, stragglers, data).await?.reports);
        }
    }
    let curves: Vec<Vec<(f64, f64)>> = runs.iter().map(|r| median_curve(r)).collect();
    let fixed = &curves[..FIXED_TAUS.len()];
    let lowest = fixed
        .iter()
        .flatten()
        .map(|&(_, loss)| loss)
        .fold(f64::INFINITY, f64::min);
    let target = lowest + REACHED;
    let mut figure = |name: &str, value: f64, unit: &'static str| {
        emit(Measure {
            name: format!("stragglers.transient.alpha{alpha}.{name}"),
            value,
            unit,
        })
    };
    figure("target_test_logloss", target, "logloss");
    let times: Vec<f64> = curves.iter().map(|c| time_to(c, target)).collect();
    for (((name, _), t), curve) in configs.iter().zip(&times).zip(&curves) {
        figure(&format!("{name}.secs_to_target"), *t, "s");
        let last = curve.last().map_or(f64::NAN, |&(_, loss)| loss);
        figure(&format!("{name}.last_test_logloss"), last, "logloss");
    }
    let (best, tau) = FIXED_TAUS
        .iter()
        .zip(&times)
        .map(|(tau, t)| (*t, *tau))
        .fold((f64::INFINITY, 0), |a, b| if b.0 < a.0 { b } else { a });
    figure("best_fixed_tau", f64::from(tau), "tau");
    let adaptive_time = times.last().copied().unwrap_or(f64::INFINITY);
    figure(
        &format!("{adaptive}.vs_best_fixed"),
        adaptive_time / best,
        "x",
    );
    Ok(())
}

/// At each epoch every run reached, the median time and the median test log loss.
fn median_curve(runs: &[Vec<EpochReport>]) -> Vec<(f64, f64)> {
    let epochs = runs.iter().map(Vec::len).min().unwrap_or(0);
    (0..epochs)
        .map(|e| {
            let at = |f: fn(&EpochReport) -> f64| median(runs.iter().map(|r| f(&r[e])).collect());
            (at(|r| r.secs), at(|r| r.test_logloss))
        })
        .collect()
}

/// When `curve` first reaches `target` loss, between the epoch before and the epoch it does
/// by linear interpolation (infinity if never).
fn time_to(curve: &[(f64, f64)], target: f64) -> f64 {
    let Some(i) = curve.iter().position(|&(_, loss)| loss <= target) else {
        return f64::INFINITY;
    };
    let (t1, l1) = curve[i];
    match i.checked_sub(1).map(|j| curve[j]) {
        Some((t0, l0)) if l0 > l1 => t0 + (t1 - t0) * (l0 - target) / (l0 - l1),
        _ => t1,
    }
}

/// The slow-worker measure once.
async fn slow_worker_once(
    quick: bool,
    data: &Data,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let run = |cfg: LrConfig, slowdowns: Slowdowns| run(cfg, slowdowns, data);
    let mut figure = |name: &str, value: f64, unit: &'static str| {
        emit(Measure {
            name: format!("stragglers.{name}"),
            value,
            unit,
        })
    };

    // A worker always four times slower.
    let epochs = if quick { 3 } else { 30 };
    let slow = Slowdowns {
        slow_worker: Some(SlowWorker {
            worker: 0,
            factor: 4.0,
        }),
        ..Slowdowns::default()
    };
    let plain = |consistency| {
        let mut cfg = LrConfig {
            epochs,
            ..LrConfig::default()
        };
        cfg.job.consistency = consistency;
        cfg
    };
    let fast = run(plain(Consistency::Sequential), Slowdowns::default()).await?;
    let baseline = run(plain(Consistency::Sequential), slow).await?;
    let mut handled = plain(Consistency::BoundedDelay(1));
    handled.job.stragglers = StragglerPolicy::skip_ahead();
    handled.job.stragglers.balance = Some(Balance::shares(8));
    let handled = run(handled, slow).await?;
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

    Ok(())
}

/// The last epoch's end and test AUC.
fn secs_auc(reports: &[EpochReport]) -> (f64, f64) {
    reports
        .last()
        .map_or((f64::NAN, f64::NAN), |e| (e.secs, e.test_auc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(secs: f64, test_logloss: f64) -> EpochReport {
        EpochReport {
            secs,
            test_logloss,
            ..EpochReport::default()
        }
    }

    #[test]
    fn a_curve_reaches_its_target_between_epochs_by_interpolation() {
        let curve = [(1.0, 0.50), (2.0, 0.30), (3.0, 0.35), (4.0, 0.20)];
        assert!((time_to(&curve, 0.40) - 1.5).abs() < 1e-12);
        assert_eq!(time_to(&curve, 0.30), 2.0);
        // A first epoch already below the target, and a target never reached.
        assert_eq!(time_to(&curve, 0.60), 1.0);
        assert_eq!(time_to(&curve, 0.10), f64::INFINITY);
    }

    #[test]
    fn the_median_curve_takes_each_epochs_median_over_the_epochs_every_run_reached() {
        let runs = vec![
            vec![epoch(1.0, 0.9), epoch(2.0, 0.5), epoch(3.0, 0.1)],
            vec![epoch(3.0, 0.7), epoch(4.0, 0.6)],
            vec![epoch(2.0, 0.8), epoch(9.0, 0.4)],
        ];
        assert_eq!(median_curve(&runs), [(2.0, 0.8), (4.0, 0.5)]);
        assert!(median_curve(&[]).is_empty());
    }
}
