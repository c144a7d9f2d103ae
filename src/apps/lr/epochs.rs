//! Epoch accounting for a single-process run: what the workers tell the trainer
//! ([`WorkerMessage`]), summed per epoch until every worker's part and the measured model are
//! in, then one [`EpochReport`] per epoch in order, the model kept by [`Keep`], and the
//! finished run ([`Trained`]).

use std::collections::BTreeMap;
use std::time::Instant;

use pserver_core::KvPairs;
use pserver_core::filter::FilterSaving;
use pserver_runtime::RuntimeError;

use super::batch::ShareStep;
use super::config::{Keep, LrConfig, config_error};
use super::pace::PaceCounts;

/// What one epoch reached.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct EpochReport {
    /// Epochs done, from 1.
    pub epoch: u32,
    /// Mean log loss of the training minibatches during the epoch, before each update.
    pub train_logloss: f64,
    /// Mean log loss on the test set at the end of the epoch.
    pub test_logloss: f64,
    /// Mean log loss on the validation rows at the end of the epoch, if the run holds some
    /// out ([`LrConfig::validation`]): what chooses the epoch kept.
    pub validation_logloss: Option<f64>,
    /// Area under the ROC curve on the test set, exact.
    pub test_auc: f64,
    /// Non-zero weights in the model.
    pub nnz: usize,
    /// Rows trained on in the epoch, over every worker.
    pub rows: usize,
    /// Rows of the training data no worker trained in the epoch: steps a straggler was told
    /// to skip ([`pserver_core::pace::StragglerPolicy::skip_ahead`]), and rows of a share that
    /// changed hands mid-epoch from a worker behind to one ahead.
    pub skipped_rows: usize,
    /// Of the rows skipped, those the workers dropped when told to skip ahead; the others
    /// are rows of a share that changed hands mid-epoch (its worker died, or a move by speed
    /// reached one of the two workers only after the epoch it was for).
    pub skipped_ahead_rows: usize,
    /// Rows two workers trained in the epoch: of a share that changed hands mid-epoch from
    /// a worker ahead to one behind.
    pub repeated_rows: usize,
    /// Minibatches whose weights were pulled while the one before was computed, over every
    /// worker ([`LrConfig::pipelined`]).
    pub pulled_ahead: usize,
    /// Seconds the slowest worker's steps took, the measurement of the model left out: what
    /// the training itself cost.
    pub train_secs: f64,
    /// Seconds the epoch took, from the end of the one before.
    pub epoch_secs: f64,
    /// Seconds since training began.
    pub secs: f64,
    /// Bytes every node has sent since training began.
    pub bytes_sent: u64,
}

impl EpochReport {
    /// Rows trained per second of the epoch.
    pub(crate) fn rows_per_sec(&self) -> f64 {
        self.rows as f64 / self.epoch_secs.max(1e-9)
    }
}

/// A finished training run.
#[derive(Clone, Debug)]
pub(crate) struct Trained {
    /// One report per epoch.
    pub reports: Vec<EpochReport>,
    /// The model kept ([`LrConfig::keep`]): every weight that is not zero.
    pub model: KvPairs<f32>,
    /// The epoch the model is from (0 if none finished).
    pub kept_epoch: u32,
    /// Training stopped early ([`LrConfig::early_stop`]) after this epoch.
    pub stopped_early: Option<u32>,
    /// What was found and done about stragglers.
    pub pace: PaceCounts,
    /// What each of the job's filters saved, by name, summed over the workers
    /// ([`pserver_core::JobSpec::filters`]).
    pub filters: Vec<(&'static str, FilterSaving)>,
}

/// What the workers tell the trainer.
pub(crate) enum WorkerMessage {
    /// A worker's summed training loss and row count for one epoch.
    Loss {
        /// The epoch, from 1.
        epoch: u32,
        /// Summed log loss of its minibatches, before each update.
        loss: f64,
        /// Rows it trained.
        rows: usize,
        /// Minibatches whose weights it pulled while computing the one before.
        pulled_ahead: usize,
        /// Seconds its steps took.
        train_secs: f64,
        /// Rows it dropped when told to skip ahead.
        skipped_rows: usize,
        /// Every share's minibatch it trained.
        batches: Vec<ShareStep>,
    },
    /// The measurement of the model after an epoch, by the worker holding the first share.
    Model {
        /// The epoch, from 1.
        epoch: u32,
        /// Log loss on the test set.
        test_logloss: f64,
        /// Log loss on the validation rows, if the run holds some out.
        validation_logloss: Option<f64>,
        /// AUC on the test set.
        test_auc: f64,
        /// Non-zero weights.
        nnz: usize,
        /// The model: every weight that is not zero.
        weights: KvPairs<f32>,
    },
}

/// An epoch's measurement: test log loss, validation log loss, test AUC, non-zero weights,
/// and the model.
type EpochModel = (f64, Option<f64>, f64, usize, KvPairs<f32>);

/// What the workers said of one epoch, summed over them.
#[derive(Clone, Debug, Default)]
struct EpochTally {
    loss: f64,
    rows: usize,
    workers: usize,
    pulled_ahead: usize,
    /// The slowest worker's.
    train_secs: f64,
    /// Per share and step: its rows, and how many workers trained them.
    batches: BTreeMap<(usize, usize), (usize, usize)>,
    /// Rows workers dropped when told to skip ahead.
    skipped_ahead: usize,
}

/// What the workers have said about each epoch. An epoch's report is made once every worker's
/// loss and the measurement of the model are in, in epoch order.
pub(crate) struct Epochs {
    workers: usize,
    /// Rows of the training data: what every epoch trains once.
    train_rows: usize,
    keep: Keep,
    /// Per epoch (from 1): what the workers said of it.
    tallies: Vec<EpochTally>,
    /// Per epoch (from 1) not reported yet: test log loss, test AUC, non-zero weights and
    /// the model measured after it.
    models: Vec<Option<EpochModel>>,
    /// The model kept so far, and its epoch.
    kept: Option<(u32, KvPairs<f32>)>,
    /// The reported epoch with the lowest test log loss.
    best: Option<(u32, f64)>,
    /// Epochs trained by an earlier run this one resumed from: the first report is of the
    /// one after.
    done: u32,
    /// The epochs reported so far, in order.
    pub reports: Vec<EpochReport>,
    /// Training stopped early after this epoch ([`Trained::stopped_early`]).
    pub stopped_early: Option<u32>,
    /// What was found and done about stragglers ([`Trained::pace`]).
    pub pace: PaceCounts,
    /// What the filters saved ([`Trained::filters`]).
    pub filters: Vec<(&'static str, FilterSaving)>,
}

impl Epochs {
    /// Nothing said yet of any of `cfg`'s epochs, each of which trains `train_rows` rows.
    pub(crate) fn new(cfg: &LrConfig, train_rows: usize) -> Self {
        Epochs {
            workers: cfg.job.workers,
            train_rows,
            keep: cfg.keep,
            tallies: vec![EpochTally::default(); cfg.epochs as usize + 1],
            models: vec![None; cfg.epochs as usize + 1],
            kept: None,
            best: None,
            done: 0,
            reports: Vec::new(),
            stopped_early: None,
            pace: PaceCounts::default(),
            filters: Vec::new(),
        }
    }

    /// The epochs before `done` were trained by the run a resumed job goes on from: the
    /// first report is of epoch `done + 1`.
    pub(crate) fn after(mut self, done: u32) -> Self {
        self.done = done;
        self
    }

    /// Epochs reported since the best one.
    pub(crate) fn since_best(&self) -> u32 {
        let best = self.best.map_or(self.done, |(e, _)| e);
        self.done + self.reports.len() as u32 - best
    }

    /// Takes in what a worker said; call [`Epochs::next_report`] after it.
    pub(crate) fn note(&mut self, message: WorkerMessage) {
        match message {
            WorkerMessage::Loss {
                epoch,
                loss,
                rows,
                pulled_ahead,
                train_secs,
                skipped_rows,
                batches,
            } => {
                let slot = &mut self.tallies[epoch as usize];
                slot.skipped_ahead += skipped_rows;
                slot.loss += loss;
                slot.rows += rows;
                slot.workers += 1;
                slot.pulled_ahead += pulled_ahead;
                slot.train_secs = slot.train_secs.max(train_secs);
                for b in batches {
                    let seen = slot.batches.entry((b.share, b.step)).or_default();
                    *seen = (b.rows, seen.1 + 1);
                }
            }
            WorkerMessage::Model {
                epoch,
                test_logloss,
                validation_logloss,
                test_auc,
                nnz,
                weights,
            } => {
                self.models[epoch as usize] =
                    Some((test_logloss, validation_logloss, test_auc, nnz, weights));
            }
        }
    }

    /// The report of the next epoch, if everything about it is in; `began` and `bytes_sent`
    /// are when training began and what the nodes have sent so far.
    pub(crate) fn next_report(&mut self, began: Instant, bytes_sent: u64) -> Option<&EpochReport> {
        let next = self.done as usize + self.reports.len() + 1;
        let tally = self.tallies.get(next)?;
        if tally.workers < self.workers {
            return None;
        }
        let EpochTally {
            loss,
            rows,
            pulled_ahead,
            train_secs,
            skipped_ahead,
            ..
        } = *tally;
        // Rows of a skipped step no worker trained, and rows of a share that moved from a
        // worker ahead to one behind that both did.
        let distinct: usize = tally.batches.values().map(|&(rows, _)| rows).sum();
        let skipped_rows = self.train_rows.saturating_sub(distinct);
        let repeated_rows = rows.saturating_sub(distinct);
        let (test_logloss, validation_logloss, test_auc, nnz, model) =
            self.models.get_mut(next)?.take()?;
        // The validation rows decide where the run holds some out: the test rows then
        // measure the model chosen, they do not choose it.
        let deciding = validation_logloss.unwrap_or(test_logloss);
        let epoch = next as u32;
        let secs = began.elapsed().as_secs_f64();
        let before = self.reports.last().map_or(0.0, |r| r.secs);
        // A NaN loss is never better, not even than nothing.
        let better = !deciding.is_nan() && self.best.is_none_or(|(_, b)| deciding < b);
        if better {
            self.best = Some((epoch, deciding));
        }
        if better || self.keep == Keep::Last || self.kept.is_none() {
            self.kept = Some((epoch, model));
        }
        self.reports.push(EpochReport {
            epoch,
            train_logloss: loss / rows.max(1) as f64,
            test_logloss,
            validation_logloss,
            test_auc,
            nnz,
            rows,
            skipped_rows,
            skipped_ahead_rows: skipped_ahead,
            repeated_rows,
            pulled_ahead,
            train_secs,
            epoch_secs: secs - before,
            secs,
            bytes_sent,
        });
        self.reports.last()
    }

    /// The epochs reported so far and the model kept of them.
    pub(crate) fn trained(self) -> Result<Trained, RuntimeError> {
        let (kept_epoch, model) = match self.kept {
            Some(kept) => kept,
            None => (0, KvPairs::empty(1).map_err(config_error)?),
        };
        Ok(Trained {
            reports: self.reports,
            model,
            kept_epoch,
            stopped_early: self.stopped_early,
            pace: self.pace,
            filters: self.filters.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reports of epochs whose test log losses are `losses`, with `keep`, each epoch's
    /// model holding its number as its one weight.
    fn reported(losses: &[f64], keep: Keep) -> Epochs {
        reported_with(losses, None, keep)
    }

    /// [`reported`], the validation rows' log losses `validation` where given.
    fn reported_with(losses: &[f64], validation: Option<&[f64]>, keep: Keep) -> Epochs {
        let cfg = LrConfig {
            epochs: losses.len() as u32,
            keep,
            ..LrConfig::default()
        };
        let mut epochs = Epochs::new(&cfg, 4 * cfg.job.workers);
        let began = Instant::now();
        for (i, &loss) in losses.iter().enumerate() {
            let epoch = i as u32 + 1;
            for share in 0..cfg.job.workers {
                assert!(epochs.next_report(began, 0).is_none());
                epochs.note(WorkerMessage::Loss {
                    epoch,
                    loss: 2.0,
                    rows: 4,
                    pulled_ahead: 0,
                    train_secs: 0.0,
                    skipped_rows: 0,
                    batches: vec![ShareStep {
                        share,
                        step: 0,
                        rows: 4,
                    }],
                });
            }
            assert!(epochs.next_report(began, 0).is_none(), "no model yet");
            let weights = KvPairs::new(vec![1], vec![epoch as f32], 1).unwrap();
            epochs.note(WorkerMessage::Model {
                epoch,
                test_logloss: loss,
                validation_logloss: validation.map(|v| v[i]),
                test_auc: 0.5,
                nnz: 1,
                weights,
            });
            let report = *epochs.next_report(began, 0).unwrap();
            assert_eq!(report.epoch, epoch);
            assert_eq!(report.rows, 4 * cfg.job.workers);
            assert_eq!(report.train_logloss, 0.5);
        }
        let total: f64 = epochs.reports.iter().map(|r| r.epoch_secs).sum();
        let last = epochs.reports.last().map_or(0.0, |r| r.secs);
        assert!((total - last).abs() < 1e-9);
        epochs
    }

    #[test]
    fn an_epoch_reports_the_rows_no_worker_trained_and_the_rows_two_did() {
        let cfg = LrConfig {
            epochs: 1,
            ..LrConfig::default()
        };
        let mut epochs = Epochs::new(&cfg, 40);
        let batch = |share, step, rows| ShareStep { share, step, rows };
        // Shares 0 and 1 of 10 rows each, four workers: share 1's step 1 is trained twice
        // (a move to a worker behind), share 2's steps 0 and 1 never (a skip).
        let said = [
            vec![batch(0, 0, 5), batch(0, 1, 5)],
            vec![batch(1, 0, 5), batch(1, 1, 5)],
            vec![batch(1, 1, 5)],
            vec![batch(3, 0, 5), batch(3, 1, 5)],
        ];
        for batches in said {
            let rows = batches.iter().map(|b| b.rows).sum();
            epochs.note(WorkerMessage::Loss {
                epoch: 1,
                loss: 1.0,
                rows,
                pulled_ahead: 0,
                train_secs: 0.0,
                skipped_rows: 0,
                batches,
            });
        }
        epochs.note(WorkerMessage::Model {
            epoch: 1,
            test_logloss: 0.5,
            validation_logloss: None,
            test_auc: 0.5,
            nnz: 0,
            weights: KvPairs::empty(1).unwrap(),
        });
        let report = epochs.next_report(Instant::now(), 0).unwrap();
        assert_eq!(report.rows, 35);
        assert_eq!(report.skipped_rows, 10);
        assert_eq!(report.repeated_rows, 5);
    }

    /// Where the run holds validation rows out, they choose the epoch kept and count the
    /// epochs since the best, whatever the test rows say.
    #[test]
    fn the_validation_rows_choose_the_epoch_where_the_run_holds_some_out() {
        let test = [0.5, 0.3, 0.2, 0.1];
        let validation = [0.4, 0.35, 0.45, 0.5];
        let epochs = reported_with(&test, Some(&validation), Keep::Best);
        assert_eq!(epochs.since_best(), 2);
        assert_eq!(
            epochs
                .reports
                .iter()
                .map(|r| r.validation_logloss)
                .collect::<Vec<_>>(),
            validation.map(Some)
        );
        let trained = epochs.trained().unwrap();
        assert_eq!(
            (trained.kept_epoch, trained.model.values()),
            (2, &[2.0f32][..])
        );
        let trained = reported(&test, Keep::Best).trained().unwrap();
        assert_eq!(trained.kept_epoch, 4, "without, the test rows choose");
    }

    #[test]
    fn the_best_epoch_is_the_first_with_the_lowest_test_loss_and_never_a_nan() {
        let epochs = reported(&[0.5, 0.3, 0.3, 0.4, f64::NAN], Keep::Best);
        assert_eq!(epochs.since_best(), 3);
        let trained = epochs.trained().unwrap();
        assert_eq!(
            (trained.kept_epoch, trained.model.values()),
            (2, &[2.0f32][..])
        );
        let trained = reported(&[0.5, 0.3, 0.4], Keep::Last).trained().unwrap();
        assert_eq!(
            (trained.kept_epoch, trained.model.values()),
            (3, &[3.0f32][..])
        );
        let trained = reported(&[f64::NAN, 0.7], Keep::Best).trained().unwrap();
        assert_eq!(trained.kept_epoch, 2);
        assert_eq!(reported(&[0.5, 0.6], Keep::Best).since_best(), 1);
    }
}
