//! What one way of training reached, as the training benchmark compares them: pserver's
//! runs, the floor, and Vowpal Wabbit.

/// What one way of training reached.
pub(super) struct Reached {
    /// Over every epoch.
    pub(super) rows_per_sec: f64,
    /// Per epoch.
    pub(super) epochs: Vec<f64>,
    pub(super) cpu_secs_per_mrow: Option<f64>,
    pub(super) peak_rss_mb: Option<f64>,
    pub(super) auc: f64,
    /// Seconds an epoch's measurement of the model took, besides its steps.
    pub(super) measure_secs: Option<f64>,
    /// After each epoch: the seconds of training so far and the test AUC then.
    pub(super) curve: Vec<(f64, f64)>,
}

impl Reached {
    /// One pass of `rows` rows by a program measured from outside: `secs` of wall clock, its
    /// CPU seconds and peak RSS where known, and the test AUC it reached.
    pub(super) fn one_pass(
        rows: usize,
        secs: f64,
        cpu: Option<f64>,
        peak_rss_mb: Option<f64>,
        auc: f64,
    ) -> Self {
        let rows = rows as f64;
        Reached {
            rows_per_sec: rows / secs.max(1e-9),
            epochs: vec![rows / secs.max(1e-9)],
            cpu_secs_per_mrow: cpu.map(|c| c / rows * 1e6),
            peak_rss_mb,
            auc,
            measure_secs: None,
            curve: vec![(secs, auc)],
        }
    }

    /// The first epoch (from 1) whose test AUC is at least `target`, and the seconds of
    /// training until its end; `None` if no epoch reached it.
    pub(super) fn first_reaching(&self, target: f64) -> Option<(usize, f64)> {
        self.curve
            .iter()
            .position(|&(_, auc)| auc >= target)
            .map(|at| (at + 1, self.curve[at].0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_epoch_at_or_above_the_target_is_the_one_reached() {
        let reached = Reached {
            rows_per_sec: 1.0,
            epochs: vec![1.0; 3],
            cpu_secs_per_mrow: None,
            peak_rss_mb: None,
            auc: 0.8,
            measure_secs: None,
            curve: vec![(1.0, 0.70), (2.5, 0.75), (3.0, 0.74)],
        };
        assert_eq!(reached.first_reaching(0.75), Some((2, 2.5)));
        assert_eq!(reached.first_reaching(0.70), Some((1, 1.0)));
        assert_eq!(reached.first_reaching(0.76), None);
    }
}
