//! The tau sweep: how long a workload takes, and how much workers idle, as the staleness bound
//! grows, and with the coordinator dealing with stragglers (ARCHITECTURE.md §9).

use pserver_core::pace::{Balance, StragglerPolicy, TauRange};

use super::{Consistency, MS, PaceReport, Protocol, SimConfig, SimFailure};

/// One way of running the workload: a consistency model, and what the coordinator does about
/// stragglers.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pacing {
    /// How the row is named: the tau (0 is sequential, inf is eventual), or what deals with
    /// stragglers.
    pub label: String,
    /// The consistency model.
    pub consistency: Consistency,
    /// What the coordinator does about stragglers.
    pub stragglers: StragglerPolicy,
    /// Parts each iteration's compute is pushed in.
    pub parts: u32,
}

/// One row of the tau sweep.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SweepRow {
    /// How the workload ran.
    pub pacing: Pacing,
    /// Mean virtual time to finish the workload, in milliseconds.
    pub finish_ms: f64,
    /// Mean fraction of worker time spent waiting.
    pub idle_fraction: f64,
    /// What the coordinators found and decided, over every seed.
    pub pace: PaceReport,
}

/// The staleness bounds the sweep tries: 0 (sequential), 1, 2, 4, 8 and infinity (eventual).
pub(crate) fn sweep_models() -> Vec<Consistency> {
    let mut models = vec![Consistency::Sequential];
    models.extend([1, 2, 4, 8].map(Consistency::BoundedDelay));
    models.push(Consistency::Eventual);
    models
}

/// What the sweep runs: every model of [`sweep_models`] as it is; tau moving between 1 and 8
/// (`adaptive:1-8`); bounded delay 1 with stragglers skipped ahead, each iteration pushed in
/// four parts (`skip-ahead:1`); and the same with four shares per worker moved by speed
/// (`skip-ahead+shares:1`).
pub(crate) fn sweep_pacings() -> Vec<Pacing> {
    let mut rows: Vec<Pacing> = sweep_models()
        .into_iter()
        .map(|consistency| Pacing {
            label: tau_label(consistency),
            consistency,
            stragglers: StragglerPolicy::default(),
            parts: 1,
        })
        .collect();
    let range = TauRange { min: 1, max: 8 };
    rows.push(Pacing {
        label: format!("adaptive:{}-{}", range.min, range.max),
        consistency: Consistency::BoundedDelay(range.min),
        stragglers: StragglerPolicy::adaptive(range),
        parts: 1,
    });
    rows.push(Pacing {
        label: "skip-ahead:1".into(),
        consistency: Consistency::BoundedDelay(1),
        stragglers: StragglerPolicy::skip_ahead(),
        parts: 4,
    });
    let mut shared = StragglerPolicy::skip_ahead();
    shared.balance = Some(Balance::shares(4));
    rows.push(Pacing {
        label: "skip-ahead+shares:1".into(),
        consistency: Consistency::BoundedDelay(1),
        stragglers: shared,
        parts: 4,
    });
    rows
}

/// Runs `base` in every way of [`sweep_pacings`] for seeds `first..first + seeds` and averages
/// finish time and idle fraction. Fails on the first broken invariant.
pub(crate) fn tau_sweep(
    base: &SimConfig,
    protocol: Protocol,
    first: u64,
    seeds: u64,
) -> Result<Vec<SweepRow>, SimFailure> {
    let mut rows = Vec::new();
    for pacing in sweep_pacings() {
        let (mut finish, mut idle, mut pace) = (0.0, 0.0, PaceReport::default());
        for seed in first..first + seeds.max(1) {
            let report = protocol.run(&SimConfig {
                seed,
                consistency: pacing.consistency,
                stragglers: pacing.stragglers,
                parts: pacing.parts,
                ..base.clone()
            })?;
            finish += report.finish as f64 / MS as f64;
            idle += report.idle_fraction;
            pace.add(&report.pace);
        }
        let n = seeds.max(1) as f64;
        rows.push(SweepRow {
            pacing,
            finish_ms: finish / n,
            idle_fraction: idle / n,
            pace,
        });
    }
    Ok(rows)
}

/// How a sweep row names its tau.
pub(crate) fn tau_label(c: Consistency) -> String {
    match c.tau() {
        Some(t) => t.to_string(),
        None => "inf".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_has_the_papers_shape_bounded_delay_beats_sequential() {
        let base = SimConfig {
            straggler: 4.0,
            workers: 4,
            iterations: 20,
            ..SimConfig::default()
        };
        let rows = tau_sweep(&base, Protocol::default(), 0, 3).unwrap();
        let labels: Vec<&str> = rows.iter().map(|r| r.pacing.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "0",
                "1",
                "2",
                "4",
                "8",
                "inf",
                "adaptive:1-8",
                "skip-ahead:1",
                "skip-ahead+shares:1"
            ]
        );
        let sequential = &rows[0];
        for bounded in &rows[1..5] {
            assert!(bounded.finish_ms < sequential.finish_ms, "{rows:?}");
            assert!(bounded.idle_fraction < sequential.idle_fraction, "{rows:?}");
        }
    }

    #[test]
    fn with_a_permanently_slow_worker_skip_ahead_finishes_well_before_any_fixed_tau() {
        let base = SimConfig {
            slow_worker: 4.0,
            workers: 4,
            iterations: 20,
            ..SimConfig::default()
        };
        let rows = tau_sweep(&base, Protocol::default(), 0, 3).unwrap();
        let finish = |label: &str| {
            rows.iter()
                .find(|r| r.pacing.label == label)
                .map(|r| r.finish_ms)
                .unwrap()
        };
        let skip = rows
            .iter()
            .find(|r| r.pacing.label == "skip-ahead:1")
            .unwrap();
        assert!(
            skip.pace.skips > 0 && skip.pace.skipped_iterations > 0,
            "{rows:?}"
        );
        for fixed in ["0", "1", "2", "4", "8"] {
            assert!(finish("skip-ahead:1") < 0.6 * finish(fixed), "{rows:?}");
        }
        let adaptive = rows
            .iter()
            .find(|r| r.pacing.label == "adaptive:1-8")
            .unwrap();
        assert!(adaptive.pace.max_tau > 1, "{rows:?}");
    }

    #[test]
    fn with_shares_sized_by_speed_the_slow_worker_skips_little_and_all_finish_early() {
        let base = SimConfig {
            slow_worker: 4.0,
            workers: 4,
            iterations: 20,
            ..SimConfig::default()
        };
        let rows = tau_sweep(&base, Protocol::default(), 0, 3).unwrap();
        let row = |label: &str| rows.iter().find(|r| r.pacing.label == label).unwrap();
        let (alone, shared) = (row("skip-ahead:1"), row("skip-ahead+shares:1"));
        assert!(shared.pace.shares_moved > 0, "{rows:?}");
        // The slow worker's work moves to the others instead of being dropped.
        assert!(
            2 * shared.pace.skipped_iterations < alone.pace.skipped_iterations,
            "{rows:?}"
        );
        assert!(shared.finish_ms < 0.6 * row("0").finish_ms, "{rows:?}");
    }
}
