//! How to train: the application's configuration ([`LrConfig`]), the servers' update rule and
//! its rates, and the constants a run starts from. Everything else in the application reads
//! these, so they sit at the bottom of its modules; the slowness a benchmark injects is not
//! here but in [`super::slowdown`].

use pserver_core::store::StoreLayout;
use pserver_core::{Consistency, JobSpec, Key, KeyRange, MAX_KEY, Updater};
use pserver_runtime::RuntimeError;

/// How to train.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LrConfig {
    /// The job: its servers and workers (each worker gets an equal share of the training
    /// rows), consistency model, and the servers' update rule.
    pub job: JobSpec,
    /// Passes over the data.
    pub epochs: u32,
    /// Rows per minibatch on each worker.
    pub batch: usize,
    /// How the nodes talk: in memory, or over TCP on loopback.
    pub transport: Wire,
    /// Whether the model has an intercept.
    pub bias: bool,
    /// Whether each epoch visits a share's rows in a seeded random order (or in file order).
    pub shuffle: bool,
    /// Seed of the visiting order.
    pub seed: u64,
    /// Which epoch's model a run ends with.
    pub keep: Keep,
    /// Stop after this many epochs in a row without a better log loss (on the validation
    /// rows, or else the test rows).
    pub early_stop: Option<u32>,
    /// The fraction of the training rows held out (drawn from `seed`) to choose the epoch
    /// kept and when to stop early, so that neither looks at the test rows. Default: none,
    /// every row trained and the test rows deciding.
    pub validation: Option<f64>,
    /// Whether a worker pulls its next minibatch's weights while it computes on this one,
    /// where the consistency model allows it ([`LrConfig::pipelined`]).
    pub pipeline: bool,
    /// The weights the job starts from, a saved model's (`--init`): each server starts its
    /// keys there. Default: none, every weight starting at zero.
    pub initial: Option<std::sync::Arc<pserver_core::KvPairs<f64>>>,
    /// Where the servers write a whole-job checkpoint after every epoch (server `N` in
    /// `server-N` below it; ARCHITECTURE.md §11). Default: none.
    pub checkpoints: Option<std::path::PathBuf>,
    /// Go on from the newest checkpoint in `checkpoints` every server holds whole.
    pub resume: bool,
}

/// Which epoch's model a training run ends with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Keep {
    /// The epoch with the lowest loss on the rows held out for validation (without any, on
    /// the test rows).
    #[default]
    Best,
    /// The last epoch.
    Last,
}

/// FTRL's default learning-rate scale. Pushes are per-row gradients summed over a minibatch
/// (`Batch::gradient`), so FTRL steps as a per-example adaptive learner does: with
/// [`DEFAULT_L1`] and [`DEFAULT_L2`], one epoch reaches the test AUC of one pass of Vowpal
/// Wabbit's default rule on the shipped data and on generated click data (`pserver bench
/// train`; `docs/training.md`). 0.1 is close to VW's rate 0.5 over the square root of a row's
/// 30 features, its normalization.
pub(crate) const DEFAULT_ALPHA: f64 = 0.1;
/// FTRL's default L1 regularization: a weight stays zero while the sum of its per-row
/// gradients stays within it.
pub(crate) const DEFAULT_L1: f64 = 1.0;
/// FTRL's default L2 regularization, against the sum of per-row gradients.
pub(crate) const DEFAULT_L2: f64 = 1.0;

/// The servers' update rule of a logistic-regression job. The command line and the cluster
/// file name it as an `UpdateRule` (`commands::values`), which refuses the rules that do not
/// learn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Rule {
    /// FTRL-Proximal: takes alpha, l1 and l2.
    #[default]
    Ftrl,
    /// AdaGrad: takes lr.
    Adagrad,
    /// Plain SGD: takes lr.
    Sgd,
}

/// The rates a user gave, each `None` when not given.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Rates {
    /// Learning rate of adagrad and sgd.
    pub lr: Option<f64>,
    /// FTRL's learning-rate scale.
    pub alpha: Option<f64>,
    /// FTRL's L1.
    pub l1: Option<f64>,
    /// FTRL's L2.
    pub l2: Option<f64>,
}

/// A rate given to a rule that does not use it: the rate's name, the rule's, and the names of
/// the rates the rule takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnusedRate {
    /// The rate given (`lr`, `alpha`, `l1`, `l2`).
    pub rate: &'static str,
    /// The rule chosen.
    pub rule: &'static str,
    /// The rates it takes.
    pub takes: &'static [&'static str],
}

impl Rule {
    /// The update rule with `rates` (defaults for those not given), or the first rate given
    /// that the rule does not use: a rate is never silently ignored.
    pub(crate) fn updater(self, rates: Rates) -> Result<Updater, UnusedRate> {
        let (name, takes): (&'static str, &'static [&'static str]) = match self {
            Rule::Ftrl => ("ftrl", &["alpha", "l1", "l2"]),
            Rule::Adagrad => ("adagrad", &["lr"]),
            Rule::Sgd => ("sgd", &["lr"]),
        };
        let given = [
            ("lr", rates.lr),
            ("alpha", rates.alpha),
            ("l1", rates.l1),
            ("l2", rates.l2),
        ];
        if let Some((rate, _)) = given
            .iter()
            .find(|(rate, value)| value.is_some() && !takes.contains(rate))
        {
            return Err(UnusedRate {
                rate,
                rule: name,
                takes,
            });
        }
        let lr = rates.lr.unwrap_or(0.1);
        Ok(match self {
            Rule::Ftrl => ftrl(
                rates.alpha.unwrap_or(DEFAULT_ALPHA),
                rates.l1.unwrap_or(DEFAULT_L1),
                rates.l2.unwrap_or(DEFAULT_L2),
            ),
            Rule::Adagrad => Updater::AdaGrad { lr, eps: 1e-6 },
            Rule::Sgd => Updater::Sgd { lr },
        })
    }
}

/// FTRL-Proximal with these rates (and `beta` 1).
pub(crate) fn ftrl(alpha: f64, l1: f64, l2: f64) -> Updater {
    Updater::FtrlProximal {
        alpha,
        beta: 1.0,
        l1,
        l2,
    }
}

/// The key of the intercept: past every feature index a data file can hold.
pub(crate) const BIAS_KEY: Key = MAX_KEY;

/// The transport a single-process training run uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Wire {
    /// Channels inside the process.
    #[default]
    Mem,
    /// Authenticated TCP connections on 127.0.0.1, one listening port per node.
    Tcp,
    /// UDP datagrams on 127.0.0.1, one port per node.
    Udp,
}

impl Default for LrConfig {
    fn default() -> Self {
        let mut job = JobSpec::new(2, 4);
        job.consistency = Consistency::BoundedDelay(4);
        job.updater = ftrl(DEFAULT_ALPHA, DEFAULT_L1, DEFAULT_L2);
        // Each batch touches a few thousand scattered features of millions.
        job.store = StoreLayout::Hashed;
        LrConfig {
            job,
            epochs: 10,
            batch: 100,
            transport: Wire::Mem,
            bias: true,
            shuffle: true,
            seed: 0,
            keep: Keep::Best,
            early_stop: None,
            validation: None,
            pipeline: true,
            initial: None,
            checkpoints: None,
            resume: false,
        }
        .with_bias(true)
    }
}

impl LrConfig {
    /// Whether workers pull a minibatch ahead: when asked to and the job's bound lets a
    /// batch's weights miss at least one iteration of pushes. Under sequential consistency
    /// each batch needs the push of the one before, so nothing is pulled ahead.
    pub(crate) fn pipelined(&self) -> bool {
        self.pipeline && self.job.consistency.tau() != Some(0)
    }

    /// The job the nodes run. A pulled-ahead batch's pull is sent one iteration early, so
    /// under bounded delay `tau` the servers hold it to `tau - 1`: every batch's weights then
    /// miss at most the pushes the job's `tau` allows, as without pipelining.
    pub(crate) fn protocol_job(&self) -> JobSpec {
        let mut job = self.job.clone();
        if self.pipelined()
            && let Consistency::BoundedDelay(tau) = job.consistency
        {
            job.consistency = Consistency::BoundedDelay(tau.saturating_sub(1));
            // The same for the bounds adaptive tau moves between.
            if let Some(range) = &mut job.stragglers.adaptive_tau {
                range.min = range.min.saturating_sub(1);
                range.max = range.max.saturating_sub(1);
            }
        }
        job
    }

    /// Rows of one share's minibatch: `batch` over the shares each worker starts with, so that
    /// a worker's step trains `batch` rows until shares move. A row weighs the same whoever
    /// trains it and however many shares that worker holds, since pushes are sums of per-row
    /// gradients.
    pub(crate) fn share_batch(&self) -> usize {
        self.batch
            .max(1)
            .div_ceil(self.job.stragglers.shares_per_worker())
    }

    /// Rows in each share of `rows` training rows: the job's work is cut into
    /// [`JobSpec::share_count`] shares, the last one shorter.
    pub(crate) fn share_rows(&self, rows: usize) -> usize {
        rows.div_ceil(self.job.share_count().max(1))
    }

    /// This configuration with or without an intercept (exempt from regularization).
    pub(crate) fn with_bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self.job.unregularized = bias.then(|| KeyRange::single(BIAS_KEY).ok()).flatten();
        self
    }
}

/// A value the run made for itself and the core refused (a key list, a set of pairs, a
/// socket), as the runtime's configuration error.
pub(crate) fn config_error(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weight FTRL gives a feature whose every row has gradient 0.5 and appears in
    /// `every`-th row, after one epoch of 1,000 rows pushed in minibatches of `batch` rows, as
    /// `Batch::gradient` sums them.
    fn ftrl_weight(batch: usize, every: usize, l1: f64) -> f64 {
        use pserver_core::UpdateRule;
        let rule = ftrl(DEFAULT_ALPHA, l1, DEFAULT_L2);
        let (mut w, mut aux) = (0.0f64, [0.0f64; 2]);
        for from in (0..1000).step_by(batch) {
            let seen = (from..from + batch).filter(|r| r % every == 0).count();
            if seen > 0 {
                rule.apply(&mut w, &mut aux, 0.5 * seen as f64);
            }
        }
        w
    }

    #[test]
    fn a_rare_features_step_does_not_shrink_with_the_batch_size() {
        // Seen in one row of 1,000, a feature's weight moves as far in minibatches of 1,000
        // rows as row by row: the push is that row's gradient, not a thousandth of it.
        let alone = ftrl_weight(1, 1000, 0.0);
        assert!(alone < 0.0);
        for batch in [10, 100, 1000] {
            assert_eq!(ftrl_weight(batch, 1000, 0.0), alone, "batch {batch}");
        }
        // Pushed as a minibatch mean, as before, the same row moved it a hundredth as far.
        let rule = ftrl(DEFAULT_ALPHA, 0.0, DEFAULT_L2);
        let (mut diluted, mut aux) = (0.0f64, [0.0f64; 2]);
        pserver_core::UpdateRule::apply(&rule, &mut diluted, &mut aux, 0.5 / 100.0);
        assert!(diluted.abs() < alone.abs() / 50.0, "{diluted} vs {alone}");
    }

    #[test]
    fn l1_holds_a_weight_at_zero_until_its_summed_gradients_pass_it_whatever_the_batch() {
        // One row's gradient 0.5 against an l1 of 1: held at zero in any batch.
        for batch in [1, 100] {
            assert_eq!(ftrl_weight(batch, 1000, DEFAULT_L1), 0.0);
        }
        // Ten rows' 5.0 pass it, row by row or in minibatches.
        for batch in [1, 10, 100, 1000] {
            assert!(ftrl_weight(batch, 100, DEFAULT_L1) < 0.0, "batch {batch}");
        }
        // An l1 above an epoch's sum holds it at zero.
        assert_eq!(ftrl_weight(10, 100, 5.5), 0.0);
    }

    #[test]
    fn pulling_ahead_lowers_the_servers_bound_by_one_and_only_when_it_happens() {
        let with = |consistency, pipeline| {
            let mut cfg = LrConfig {
                pipeline,
                ..LrConfig::default()
            };
            cfg.job.consistency = consistency;
            (cfg.pipelined(), cfg.protocol_job().consistency)
        };
        use Consistency::{BoundedDelay, Eventual, Sequential};
        assert_eq!(with(BoundedDelay(4), true), (true, BoundedDelay(3)));
        assert_eq!(with(BoundedDelay(1), true), (true, BoundedDelay(0)));
        assert_eq!(with(BoundedDelay(4), false), (false, BoundedDelay(4)));
        assert_eq!(with(Sequential, true), (false, Sequential));
        assert_eq!(with(Eventual, true), (true, Eventual));
    }
}
