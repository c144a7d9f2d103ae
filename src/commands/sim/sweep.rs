//! The tau sweep: how long a workload takes, and how much workers idle, as the staleness bound
//! grows.

use super::{Consistency, MS, Protocol, SimConfig, SimFailure};

/// One row of the tau sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRow {
    /// The consistency model (tau = 0 is sequential, inf is eventual).
    pub consistency: Consistency,
    /// Mean virtual time to finish the workload, in milliseconds.
    pub finish_ms: f64,
    /// Mean fraction of worker time spent waiting.
    pub idle_fraction: f64,
}

/// The staleness bounds the sweep tries: 0 (sequential), 1, 2, 4, 8 and infinity (eventual).
pub fn sweep_models() -> Vec<Consistency> {
    let mut models = vec![Consistency::Sequential];
    models.extend([1, 2, 4, 8].map(Consistency::BoundedDelay));
    models.push(Consistency::Eventual);
    models
}

/// Runs `base` under every model of [`sweep_models`] for seeds `first..first + seeds` and
/// averages finish time and idle fraction. Fails on the first broken invariant.
pub fn tau_sweep(
    base: &SimConfig,
    protocol: Protocol,
    first: u64,
    seeds: u64,
) -> Result<Vec<SweepRow>, SimFailure> {
    let mut rows = Vec::new();
    for consistency in sweep_models() {
        let (mut finish, mut idle) = (0.0, 0.0);
        for seed in first..first + seeds.max(1) {
            let report = protocol.run(&SimConfig {
                seed,
                consistency,
                ..base.clone()
            })?;
            finish += report.finish as f64 / MS as f64;
            idle += report.idle_fraction;
        }
        let n = seeds.max(1) as f64;
        rows.push(SweepRow {
            consistency,
            finish_ms: finish / n,
            idle_fraction: idle / n,
        });
    }
    Ok(rows)
}

/// How a sweep row names its tau.
pub fn tau_label(c: Consistency) -> String {
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
        let labels: Vec<String> = rows.iter().map(|r| tau_label(r.consistency)).collect();
        assert_eq!(labels, ["0", "1", "2", "4", "8", "inf"]);
        let sequential = &rows[0];
        for bounded in &rows[1..5] {
            assert!(bounded.finish_ms < sequential.finish_ms, "{rows:?}");
            assert!(bounded.idle_fraction < sequential.idle_fraction, "{rows:?}");
        }
    }
}
