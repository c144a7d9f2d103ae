//! The worker loop ([`run_shares`]): one worker's steps over every share of the data it holds,
//! each minibatch's weights pulled (a step ahead where the consistency model allows it), its
//! gradient computed and pushed, and the model measured after every epoch by whichever worker
//! leads. A single-process run and a cluster's worker process both train through it; what it
//! reports of each epoch is a [`WorkerEpoch`].

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pserver_core::pace::Coverage;
use pserver_core::{Key, KeyRange, KeySelection, KvPairs, RangeList};
use pserver_runtime::{RuntimeError, WorkerHandle};
use tracing::{info, warn};

use super::batch::{Batch, ShareStep, visiting_order};
use super::config::{LrConfig, config_error};
use super::slowdown::{SleepDebt, Transient};
use super::test_rows::TestRows;
use crate::data::libsvm::Examples;

/// What a worker measured in one epoch.
#[derive(Clone, Debug)]
pub(crate) struct WorkerEpoch {
    /// Epochs done, from 1.
    pub epoch: u32,
    /// Summed log loss of its minibatches, before each update.
    pub loss: f64,
    /// Rows it trained on.
    pub rows: usize,
    /// Rows of its shares it did not train because the coordinator told it to skip ahead
    /// ([`pserver_core::pace::StragglerPolicy::skip_ahead`]).
    pub skipped_rows: usize,
    /// Minibatches whose weights it pulled while computing the one before.
    pub pulled_ahead: usize,
    /// Seconds its steps took, the measurement of the model after them left out.
    pub train_secs: f64,
    /// Every minibatch it trained, so that a trainer can tell rows no worker trained (a
    /// skip, a share moved from a worker behind to one ahead) and rows two workers did.
    pub batches: Vec<ShareStep>,
    /// The model after the epoch, if this worker measured it ([`MeasureSpec`]).
    pub model: Option<MeasuredModel>,
}

/// The model as a worker pulled it after an epoch.
#[derive(Clone, Debug)]
pub(crate) struct MeasuredModel {
    /// With a test set: its log loss and AUC.
    pub test: Option<(f64, f64)>,
    /// With validation rows: their log loss.
    pub validation: Option<f64>,
    /// Non-zero weights.
    pub nnz: usize,
    /// The model itself: every weight that is not zero.
    pub weights: KvPairs<f32>,
}

/// What the worker holding the first share does after every epoch. The first share, not the
/// first worker: when a worker dies, whoever takes over its shares measures in its place.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MeasureSpec<'a> {
    /// Measure the model on this test set.
    pub test: Option<&'a TestRows>,
    /// And on these validation rows, which choose the epoch kept.
    pub validation: Option<&'a TestRows>,
    /// Pull the model even without a test set (to save it).
    pub model: bool,
    /// Where the job's features end, if known: the model is pulled a part of the keys below
    /// at a time ([`MODEL_PIECE`]), then the keys above, so that measuring costs the memory
    /// of the model's nonzero weights and one part, not of every row the servers store.
    pub keys_below: Option<Key>,
}

/// Keys pulled at a time when measuring a model whose features end where the job knows.
pub(crate) const MODEL_PIECE: Key = 1 << 20;

/// How one worker runs, besides what it trains on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkerRun<'a> {
    /// What it does after every epoch if it leads.
    pub measure: MeasureSpec<'a>,
    /// Counts the rows it trains as it goes.
    pub counter: Option<&'a RowsTrained>,
    /// How many times slower than it can the worker computes (1: as fast as it can): a
    /// slow machine, to measure what straggler handling does. It waits `slowdown - 1` times
    /// each minibatch's compute after it.
    pub slowdown: f64,
    /// Transient stragglers: at each step one worker, drawn from a seed, computes slower.
    pub transient: Option<Transient>,
}

impl Default for WorkerRun<'_> {
    fn default() -> Self {
        WorkerRun {
            measure: MeasureSpec::default(),
            counter: None,
            slowdown: 1.0,
            transient: None,
        }
    }
}

/// Rows trained so far, over every worker and epoch, for progress lines in the middle of an
/// epoch.
#[derive(Clone, Debug, Default)]
pub(crate) struct RowsTrained(Arc<std::sync::atomic::AtomicU64>);

impl RowsTrained {
    /// Rows trained so far.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add(&self, rows: usize) {
        self.0
            .fetch_add(rows as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The rows of one share of the training data: the examples that hold them, and which.
pub(crate) type ShareRows = (Arc<Examples>, Vec<usize>);

/// Where a worker finds its rows: window `w` of share `s` is the share's rows of steps
/// `w * window_steps..(w + 1) * window_steps` of an epoch, which `of(s, w)` gives with the rows
/// the whole share trains an epoch. Rows held in memory are one window of the whole share
/// ([`whole_shares`]); a streamed file is read a window at a time, so that a worker holds no
/// more of it than that (`crate::apps::lr::stream`).
pub(crate) struct Rows<F> {
    /// Window `w` of share `s`, and the share's rows in an epoch.
    pub of: F,
    /// Steps of an epoch in each window.
    pub window_steps: usize,
}

/// Every row of a share in one window, as `rows_of(share)` gives them: rows held in memory.
pub(crate) fn whole_shares<F>(
    mut rows_of: F,
) -> Rows<impl FnMut(usize, usize) -> Result<(ShareRows, usize), RuntimeError>>
where
    F: FnMut(usize) -> Result<ShareRows, RuntimeError>,
{
    Rows {
        of: move |share, _| {
            let rows = rows_of(share)?;
            let len = rows.1.len();
            Ok((rows, len))
        },
        window_steps: usize::MAX,
    }
}

/// Trains on one worker for `cfg.epochs` epochs of `steps` minibatches each; after every
/// epoch, the worker holding the first share pulls the whole model and measures it as
/// `run.measure` says. Each step takes the next minibatch of every share of the data the
/// worker has ([`WorkerHandle::shares`]): its own, those of workers that died or left, and
/// those the coordinator moved to it for its speed; `rows_of` finds them. Every worker of a
/// job must take the same number of steps, even with fewer rows, so that nobody waits at a
/// consistency bound for a worker that has stopped advancing.
///
/// Step `s` of the run is the worker's iteration `s` past the one it started in. Told to skip
/// ahead mid-step, the worker drops the step's minibatches it has not computed (those it
/// pushed still count: each is pushed as a part of the step); the steps it skipped are rows
/// it does not train, counted in [`WorkerEpoch::skipped_rows`].
pub(crate) async fn run_shares(
    cfg: &LrConfig,
    handle: &WorkerHandle<f32>,
    rows: Rows<impl FnMut(usize, usize) -> Result<(ShareRows, usize), RuntimeError>>,
    steps: usize,
    run: WorkerRun<'_>,
    mut on_epoch: impl FnMut(WorkerEpoch),
) -> Result<(), RuntimeError> {
    handle.ready().await?;
    let steps = steps.max(1);
    let now = handle.iteration().await?;
    // A job resumed from a checkpoint counts its iterations from the start of the run that
    // wrote it: it goes on in the epoch and step it left off at (ARCHITECTURE.md §11).
    let first = match handle.resumed_from().await? {
        Some(_) => 0,
        None => now,
    };
    let mut shares = Shares {
        cfg,
        handle,
        first,
        steps: steps as pserver_core::Iteration,
        rows_of: rows.of,
        window_steps: rows.window_steps.max(1),
        held: Vec::new(),
        orders: BTreeMap::new(),
        sizes: BTreeMap::new(),
        scratch: Vec::new(),
        prepared: Duration::ZERO,
    };
    let ahead = cfg.pipelined();
    let total = cfg.epochs as usize * steps;
    let mut sleep_debt = SleepDebt::default();
    let mut speed = Speed::default();
    let says_speed = cfg.job.stragglers.balance.is_some();
    let mut at = step_of(now, first);
    let mut epoch = EpochProgress::new((at / steps) as u32 + 1);
    // Rows skipped in epochs not reached yet, by epoch.
    let mut skipped_later: BTreeMap<u32, usize> = BTreeMap::new();
    let mut next: Option<(usize, Vec<InFlight>)> = None;
    while at < total {
        let step = at % steps;
        let current = match next.take() {
            Some((of, sent)) if of == at => sent,
            _ => shares.send(epoch.number, step).await?,
        };
        // The next step's pulls go out now, in this iteration, and are answered while
        // this step computes: `LrConfig::protocol_job` runs the servers' bound one lower,
        // so that they still see every push the job's bound promises.
        if ahead && step + 1 < steps {
            let sent = shares.send(epoch.number, step + 1).await?;
            epoch.pulled_ahead += sent.len();
            next = Some((at + 1, sent));
        }
        let parts = current.len() as u32;
        for (done, flight) in (1..).zip(current) {
            if step_of(handle.skipped_to(), first) > at {
                // Moved on mid-step: the rest of the step's work is dropped.
                epoch.skipped_rows += flight.batch.rows.len();
                continue;
            }
            let pulled = flight.weights.await?;
            let began = Instant::now();
            let (grad, l) = flight
                .batch
                .gradient(&flight.data, pulled.values(), cfg.bias);
            let rows = flight.batch.rows.len();
            // The worker's compute: the gradient, and preparing the minibatches since.
            let computed = began.elapsed() + std::mem::take(&mut shares.prepared);
            let factor = run.slowdown * run.transient.map_or(1.0, |t| t.factor_at(at));
            let slept = sleep_debt.after(computed, factor).await;
            speed.add(rows, computed + slept);
            epoch.loss += l;
            epoch.rows += rows;
            epoch.batches.extend(flight.parts);
            if let Some(counter) = run.counter {
                counter.add(rows);
            }
            let kvs = KvPairs::with_keys(&flight.batch.keys, grad, 1).map_err(config_error)?;
            // Not waiting for the acknowledgement: the consistency model bounds how far
            // ahead of its acknowledged pushes the worker may run. Each minibatch is a part
            // of the step, so that a skip loses only what was not pushed.
            drop(
                handle
                    .start_push_part(kvs, Coverage::parts(done, parts))
                    .await?,
            );
        }
        if says_speed && let Some(per_sec) = speed.per_sec() {
            handle.report_speed(per_sec).await?;
        }
        // The next iteration, or the one the coordinator moved the worker to: then the worker
        // is in it already, and advancing would skip it too.
        let moved = step_of(handle.skipped_to(), first);
        if moved.max(at + 1) >= total {
            // The last step: what the job's filters held back goes with it, so that the
            // model holds every change the worker computed.
            handle.flush().await?;
        }
        let to = if moved > at {
            moved
        } else {
            step_of(handle.advance().await?, first)
        };
        for s in at + 1..to.min(total) {
            let e = (s / steps) as u32 + 1;
            let rows = shares.rows_at(s % steps);
            if e == epoch.number {
                epoch.skipped_rows += rows;
            } else {
                *skipped_later.entry(e).or_default() += rows;
            }
        }
        // Every epoch ended by this step, measured once: a skip may cross several.
        let ended = (to / steps).min(cfg.epochs as usize) as u32;
        if ended >= epoch.number {
            let model = measure_model(handle, run.measure).await?;
            while epoch.number <= ended {
                let next_epoch = epoch.number + 1;
                let mut done = std::mem::replace(&mut epoch, EpochProgress::new(next_epoch));
                done.skipped_rows += skipped_later.remove(&done.number).unwrap_or(0);
                on_epoch(done.finish(model.clone()));
            }
            shares.orders.clear();
        }
        at = to;
    }
    Ok(())
}

/// Step `iteration - first` of a run that started in iteration `first`.
fn step_of(iteration: pserver_core::Iteration, first: pserver_core::Iteration) -> usize {
    iteration.saturating_sub(first) as usize
}

/// The leading worker measures: the holder of the first share while it lives, then whoever
/// holds the lowest share among the living, so that metrics go on whoever dies or leaves.
async fn measure_model(
    handle: &WorkerHandle<f32>,
    measure: MeasureSpec<'_>,
) -> Result<Option<MeasuredModel>, RuntimeError> {
    let wanted = measure.test.is_some() || measure.validation.is_some() || measure.model;
    if !wanted || !handle.leads().await? {
        return Ok(None);
    }
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for piece in model_pieces(measure.keys_below) {
        let piece = RangeList::new(vec![piece]).map_err(config_error)?;
        let pulled = handle.pull(KeySelection::Ranges(piece)).await?;
        // Only the weights that are not zero: a weight absent reads as zero, and an
        // L1-regularized model keeps a few of the millions of rows the servers store.
        for (k, w) in pulled.iter() {
            if let Some(&w) = w.first().filter(|&&w| w != 0.0) {
                keys.push(k);
                values.push(w);
            }
        }
    }
    let weights = KvPairs::new(keys, values, 1).map_err(config_error)?;
    Ok(Some(MeasuredModel {
        test: match measure.test {
            Some(test) => Some(test.evaluate(&weights).map_err(config_error)?),
            None => None,
        },
        validation: match measure.validation {
            Some(rows) => Some(rows.evaluate(&weights).map_err(config_error)?.0),
            None => None,
        },
        nnz: weights.len(),
        weights,
    }))
}

/// The ranges, in key order, that a model whose features lie below `keys_below` (if known) is
/// pulled in: together the whole key space, each once. At most [`MOST_PIECES`] below
/// `keys_below`, each wider than [`MODEL_PIECE`] if it must be: a sparse job's hashed indices
/// may reach far past the rows it holds.
fn model_pieces(keys_below: Option<Key>) -> Vec<KeyRange> {
    let end = KeyRange::FULL.end();
    let below = keys_below.unwrap_or(0).min(end);
    let width = MODEL_PIECE.max(below.div_ceil(MOST_PIECES));
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < below {
        let stop = start.saturating_add(width).min(below);
        pieces.extend(KeyRange::new(start, stop).ok());
        start = stop;
    }
    pieces.extend(
        KeyRange::new(below, end)
            .ok()
            .filter(|r| r.start() < r.end()),
    );
    pieces
}

/// Most pulls a model is measured in below the job's features.
const MOST_PIECES: Key = 64;

/// What a worker has done so far in one epoch.
struct EpochProgress {
    number: u32,
    began: Instant,
    loss: f64,
    rows: usize,
    skipped_rows: usize,
    pulled_ahead: usize,
    batches: Vec<ShareStep>,
}

impl EpochProgress {
    fn new(number: u32) -> Self {
        EpochProgress {
            number,
            began: Instant::now(),
            loss: 0.0,
            rows: 0,
            skipped_rows: 0,
            pulled_ahead: 0,
            batches: Vec::new(),
        }
    }

    fn finish(self, model: Option<MeasuredModel>) -> WorkerEpoch {
        WorkerEpoch {
            epoch: self.number,
            loss: self.loss,
            rows: self.rows,
            skipped_rows: self.skipped_rows,
            pulled_ahead: self.pulled_ahead,
            train_secs: self.began.elapsed().as_secs_f64(),
            batches: self.batches,
            model,
        }
    }
}

/// Rows per second of a worker's own compute, waiting for pulls left out, over roughly its
/// last fifty minibatches: what the coordinator sizes its shares by.
#[derive(Default)]
struct Speed {
    rows: f64,
    secs: f64,
}

impl Speed {
    const KEEP: f64 = 0.98;

    fn add(&mut self, rows: usize, took: Duration) {
        self.rows = self.rows * Self::KEEP + rows as f64;
        self.secs = self.secs * Self::KEEP + took.as_secs_f64();
    }

    fn per_sec(&self) -> Option<u32> {
        (self.secs > 0.0).then(|| (self.rows / self.secs).clamp(1.0, f64::from(u32::MAX)) as u32)
    }
}

/// A pulled answer not yet awaited.
type PendingPull =
    std::pin::Pin<Box<dyn Future<Output = Result<KvPairs<f32>, RuntimeError>> + Send>>;

/// A minibatch whose weights were asked for.
struct InFlight {
    /// The shares' steps it holds.
    parts: Vec<ShareStep>,
    data: Arc<Examples>,
    batch: Batch,
    weights: PendingPull,
}

/// The shares a worker trains and their rows in this epoch's order.
struct Shares<'a, F> {
    cfg: &'a LrConfig,
    handle: &'a WorkerHandle<f32>,
    /// The worker's iteration when the run started, and the steps of an epoch: a share
    /// moved by speed changes hands where epochs meet.
    first: pserver_core::Iteration,
    steps: pserver_core::Iteration,
    rows_of: F,
    /// Steps of an epoch in each window of a share's rows.
    window_steps: usize,
    /// The shares of the last step.
    held: Vec<usize>,
    /// Per share: the window it holds, and that window's rows in this epoch's order.
    orders: BTreeMap<usize, (usize, Arc<Examples>, Vec<usize>)>,
    /// Per share seen: its rows.
    sizes: BTreeMap<usize, usize>,
    scratch: Vec<u64>,
    /// Time spent preparing minibatches not yet counted as compute.
    prepared: Duration,
}

impl<F: FnMut(usize, usize) -> Result<(ShareRows, usize), RuntimeError>> Shares<'_, F> {
    /// Prepares the minibatch of `step` of every share the worker holds now, and sends their
    /// pulls.
    async fn send(&mut self, epoch: u32, step: usize) -> Result<Vec<InFlight>, RuntimeError> {
        let shares = self
            .handle
            .shares_in_round(self.first, self.steps, u64::from(epoch))
            .await?;
        for r in shares.iter().filter(|r| !self.held.contains(&r.share)) {
            if self.held.is_empty() {
                continue;
            }
            if r.moved {
                info!(
                    share = r.share,
                    epoch, step, "took share {} for its speed", r.share
                );
            } else {
                warn!(
                    share = r.share,
                    epoch, step, "took over the share of a worker that is gone"
                );
            }
        }
        self.held = shares.iter().map(|r| r.share).collect();
        let batch = self.cfg.share_batch();
        // One minibatch of every share's step, pulled and pushed as one where the shares'
        // rows are in the same examples: a worker holding several shares sends no more
        // requests than one holding a single share.
        let mut groups: Vec<(Arc<Examples>, Vec<usize>, Vec<ShareStep>)> = Vec::new();
        for r in shares {
            let share = r.share;
            let first_seen = !self.orders.contains_key(&share);
            // A share moved here for this epoch, learned of mid-epoch: its steps before this
            // one are done now, since the worker it came from stopped where the epoch began.
            let from_step = if first_seen && r.from_start { 0 } else { step };
            for at in from_step..=step {
                let window = at / self.window_steps;
                let (data, order) = match self.orders.entry(share) {
                    Entry::Occupied(e) if e.get().0 == window => {
                        let (_, data, order) = e.into_mut();
                        (&*data, &*order)
                    }
                    entry => {
                        // The window before is dropped first: a streamed share holds one.
                        if let Entry::Occupied(e) = entry {
                            e.remove();
                        }
                        let ((data, mine), len) = (self.rows_of)(share, window)?;
                        self.sizes.insert(share, len);
                        let order = visiting_order(self.cfg, share, epoch, window, mine);
                        let (_, data, order) =
                            self.orders.entry(share).or_insert((window, data, order));
                        (&*data, &*order)
                    }
                };
                let at_in_window = at - window * self.window_steps;
                let from = (at_in_window * batch).min(order.len());
                let rows = &order[from..(from + batch).min(order.len())];
                if rows.is_empty() {
                    continue;
                }
                let part = ShareStep {
                    share,
                    step: at,
                    rows: rows.len(),
                };
                match groups.iter_mut().find(|(d, ..)| Arc::ptr_eq(d, data)) {
                    Some((_, all, parts)) => {
                        all.extend_from_slice(rows);
                        parts.push(part);
                    }
                    None => groups.push((data.clone(), rows.to_vec(), vec![part])),
                }
            }
        }
        let mut sent = Vec::with_capacity(groups.len());
        for (data, rows, parts) in groups {
            let began = Instant::now();
            let prepared = Batch::new(&data, &rows, self.cfg.bias, &mut self.scratch)?;
            self.prepared += began.elapsed();
            let weights = self
                .handle
                .start_pull(KeySelection::Keys(prepared.keys.clone()))
                .await?;
            sent.push(InFlight {
                parts,
                data,
                batch: prepared,
                weights: Box::pin(weights),
            });
        }
        Ok(sent)
    }

    /// Rows the minibatches of `step` hold over the shares the worker holds.
    fn rows_at(&self, step: usize) -> usize {
        let batch = self.cfg.share_batch();
        self.held
            .iter()
            .filter_map(|s| self.sizes.get(s))
            .map(|&len| len.saturating_sub(step * batch).min(batch))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model is pulled a bounded part at a time where the job knows its features, and the
    /// parts cover every key once, those past the features (the intercept's) included.
    #[test]
    fn a_model_is_pulled_in_parts_that_cover_every_key_once() {
        for below in [
            None,
            Some(0),
            Some(1),
            Some(1 << 40),
            Some(u64::MAX - 1),
            Some(u64::MAX),
            Some(MODEL_PIECE),
            Some(5 * MODEL_PIECE / 2),
        ] {
            let pieces = model_pieces(below);
            let mut next = 0;
            for piece in &pieces {
                assert_eq!(piece.start(), next, "{below:?}: {pieces:?}");
                assert!(piece.start() < piece.end(), "{below:?}: {pieces:?}");
                next = piece.end();
            }
            assert_eq!(next, KeyRange::FULL.end(), "{below:?}: {pieces:?}");
            // A bounded number of pulls, however far the features reach.
            assert!(
                pieces.len() <= MOST_PIECES as usize + 1,
                "{below:?}: {pieces:?}"
            );
            let bias = super::super::BIAS_KEY;
            assert!(
                pieces.iter().any(|p| p.start() <= bias && bias < p.end()),
                "{below:?}: {pieces:?}"
            );
            // Features that fit the pieces' number are pulled a piece of 2^20 keys at a time.
            let below = below.unwrap_or(0);
            if below <= MOST_PIECES * MODEL_PIECE {
                let parts = &pieces[..pieces.len() - 1];
                assert!(parts.iter().all(|p| p.end() - p.start() <= MODEL_PIECE));
                assert_eq!(
                    parts.len() as u64,
                    below.div_ceil(MODEL_PIECE),
                    "{pieces:?}"
                );
            }
        }
    }
}
