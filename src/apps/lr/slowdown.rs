//! Slowness injected into workers, to measure what straggler handling does: one worker always
//! slower ([`SlowWorker`]), or one worker a step, drawn at random ([`Transient`]). A benchmark
//! or `pserver train --slow-worker` asks for it with [`Slowdowns`], passed beside the
//! application's configuration rather than inside it: it is a fault a measurement injects, not
//! a way to train. [`SleepDebt`] is how a slowed worker waits.

use std::time::{Duration, Instant};

/// The slowness injected into a training run's workers; the default injects none.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Slowdowns {
    /// One worker computing slower than it can, to measure straggler handling.
    pub slow_worker: Option<SlowWorker>,
    /// At each step one worker, drawn at random, computes this many times slower: transient
    /// stragglers ([`Transient`]).
    pub transient: Option<f64>,
}

impl Slowdowns {
    /// How many times slower than it can worker `worker` (from 0 in node order) computes at
    /// every step: 1 unless it is the slow worker.
    pub(crate) fn factor_of(&self, worker: usize) -> f64 {
        self.slow_worker
            .filter(|s| s.worker == worker)
            .map_or(1.0, |s| s.factor)
    }

    /// The transient stragglers as worker `worker` of `workers` sees them, drawn from `seed`
    /// (the run's, the same on every worker).
    pub(crate) fn transient_of(
        &self,
        worker: usize,
        workers: usize,
        seed: u64,
    ) -> Option<Transient> {
        self.transient.map(|factor| Transient {
            factor,
            worker,
            workers,
            seed,
        })
    }
}

/// A worker made to compute slower than it can
/// ([`WorkerRun::slowdown`](super::worker::WorkerRun::slowdown)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SlowWorker {
    /// Which worker, from 0 in node order.
    pub worker: usize,
    /// How many times slower (at least 1).
    pub factor: f64,
}

/// At each step one worker of the job, drawn from `seed` and the step, computes `factor`
/// times slower: stragglers that come and go, to measure what adaptive tau does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Transient {
    /// How many times slower the step's straggler computes.
    pub factor: f64,
    /// This worker, from 0 in node order.
    pub worker: usize,
    /// Workers in the job.
    pub workers: usize,
    /// Seed of the draw, the same on every worker.
    pub seed: u64,
}

impl Transient {
    /// The slowdown of this worker at step `step`.
    pub(crate) fn factor_at(&self, step: usize) -> f64 {
        let drawn = crate::seeded::mix(self.seed ^ crate::seeded::mix(step as u64));
        if drawn % self.workers.max(1) as u64 == self.worker as u64 {
            self.factor
        } else {
            1.0
        }
    }
}

/// Makes a worker compute slower than it does: after each minibatch computed `factor` times
/// slower it waits `factor - 1` times the minibatch's compute. Waits shorter than a
/// millisecond are saved up, since a timer cannot wait that little, so the slowdown holds on
/// average.
#[derive(Default)]
pub(crate) struct SleepDebt {
    owed: Duration,
}

impl SleepDebt {
    /// Waits what `computed` owes at `factor`; returns how long it waited.
    pub(crate) async fn after(&mut self, computed: Duration, factor: f64) -> Duration {
        if factor > 1.0 {
            self.owed += computed.mul_f64(factor - 1.0);
        }
        if self.owed < Duration::from_millis(1) {
            return Duration::ZERO;
        }
        let began = Instant::now();
        tokio::time::sleep(self.owed).await;
        let slept = began.elapsed();
        self.owed = self.owed.saturating_sub(slept);
        slept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_default_no_worker_is_slowed_and_else_only_the_one_asked_for() {
        let none = Slowdowns::default();
        assert_eq!((none.factor_of(0), none.transient_of(0, 4, 7)), (1.0, None));
        let slowdowns = Slowdowns {
            slow_worker: Some(SlowWorker {
                worker: 2,
                factor: 3.0,
            }),
            transient: Some(4.0),
        };
        let factors: Vec<f64> = (0..4).map(|w| slowdowns.factor_of(w)).collect();
        assert_eq!(factors, [1.0, 1.0, 3.0, 1.0]);
        assert_eq!(
            slowdowns.transient_of(1, 4, 7),
            Some(Transient {
                factor: 4.0,
                worker: 1,
                workers: 4,
                seed: 7,
            })
        );
    }

    #[test]
    fn transient_stragglers_slow_exactly_one_worker_a_step_and_each_in_turn() {
        let workers = 4;
        let of = |worker| Transient {
            factor: 4.0,
            worker,
            workers,
            seed: 7,
        };
        let mut slowed = [0; 4];
        for step in 0..1000 {
            let slow: Vec<usize> = (0..workers)
                .filter(|&w| of(w).factor_at(step) > 1.0)
                .collect();
            assert_eq!(slow.len(), 1, "step {step}: {slow:?}");
            slowed[slow[0]] += 1;
        }
        assert!(
            slowed.iter().all(|&n| (200..300).contains(&n)),
            "{slowed:?}"
        );
    }
}
