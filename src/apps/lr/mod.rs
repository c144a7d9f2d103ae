//! Sparse logistic regression, the paper's headline application: each worker computes the
//! gradient of the log loss on minibatches of its own shard, for the keys those examples
//! touch, and pushes it; servers apply it through their update rule (FTRL-Proximal by
//! default, whose L1 term keeps the model sparse).
//!
//! One iteration is one minibatch on every worker; an epoch is one pass over each shard, in an
//! order drawn afresh every epoch from a seed. After every epoch the worker holding the first
//! share pulls the whole model (a range pull, answered in parts) and measures it on the test
//! set.
//!
//! The model has an intercept (unless [`LrConfig::bias`] is off): the weight of a constant
//! feature of value 1 that every row holds, kept at key [`BIAS_KEY`], past every key a data
//! file can name, and exempt from regularization ([`JobSpec::unregularized`]).
//!
//! **Regularization.** FTRL-Proximal minimizes the sum of the losses it is pushed plus one
//! `l1 |w| + l2 w^2 / 2` for the whole run: the regularizer is charged once, not once per
//! push. Each push is the gradient of the *mean* log loss of a minibatch, so every row counts
//! `1 / batch` in the data term: against a per-row formulation with the same `l1` (VW's, whose
//! updates are one row each), the regularizer is `batch` times stronger. And the data term
//! grows with every epoch while the regularizer does not, so the regularization weakens as
//! training goes on. The test `l1_is_charged_once_against_minibatch_means` pins this down.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pserver_core::filter::FilterSaving;
use pserver_core::pace::Coverage;
use pserver_core::store::StoreLayout;
use pserver_core::{
    Consistency, JobSpec, Key, KeyList, KeyRange, KeySelection, KvPairs, MAX_KEY, RangeList,
    Updater,
};
use pserver_runtime::{ClusterSpec, LocalCluster, NodeMetrics, RuntimeError, WorkerHandle};
use pserver_transport::mem::MemNetwork;
use pserver_transport::tcp::{Secret, TcpConfig, TcpTransport};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::data::libsvm::{Examples, IndexBase};

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
    /// Stop after this many epochs in a row without a better test log loss.
    pub early_stop: Option<u32>,
    /// Whether a worker pulls its next minibatch's weights while it computes on this one,
    /// where the consistency model allows it ([`LrConfig::pipelined`]).
    pub pipeline: bool,
    /// One worker computing slower than it can, to measure straggler handling.
    pub slow_worker: Option<SlowWorker>,
    /// At each step one worker, drawn at random, computes this many times slower: transient
    /// stragglers ([`Transient`]).
    pub straggler: Option<f64>,
}

/// A worker made to compute slower than it can ([`WorkerRun::slowdown`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SlowWorker {
    /// Which worker, from 0 in node order.
    pub worker: usize,
    /// How many times slower (at least 1).
    pub factor: f64,
}

/// Which epoch's model a training run ends with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Keep {
    /// The epoch with the lowest test log loss.
    #[default]
    Best,
    /// The last epoch.
    Last,
}

/// FTRL's default learning-rate scale. With [`DEFAULT_L1`] and [`DEFAULT_L2`], on the shipped
/// data and on a generated set of a million features, the test AUC of liblinear -s 0 -B 1 and
/// of Vowpal Wabbit or better in 10 epochs (`scripts/compare-baselines`).
pub(crate) const DEFAULT_ALPHA: f64 = 1.0;
/// FTRL's default L1 regularization, per push.
pub(crate) const DEFAULT_L1: f64 = 0.1;
/// FTRL's default L2 regularization, per push.
pub(crate) const DEFAULT_L2: f64 = 1.0;

/// The servers' update rule of a logistic-regression job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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
            pipeline: true,
            slow_worker: None,
            straggler: None,
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
    /// a worker's step trains `batch` rows until shares move.
    pub(crate) fn share_batch(&self) -> usize {
        self.batch
            .max(1)
            .div_ceil(self.job.stragglers.shares_per_worker())
    }

    /// What a share's minibatch of `rows` rows is pushed weighted by: 1, or with several
    /// shares per worker its rows over `batch`, so that a row weighs the same whoever trains
    /// it and however many shares that worker holds.
    fn push_weight(&self, rows: usize) -> f32 {
        if self.job.stragglers.shares_per_worker() > 1 {
            rows as f32 / self.batch.max(1) as f32
        } else {
            1.0
        }
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

/// Binds a TCP transport for every node of `spec` on 127.0.0.1, each knowing all the others,
/// with a secret made for this run.
async fn loopback(
    spec: &ClusterSpec,
) -> Result<
    std::collections::BTreeMap<pserver_core::NodeId, std::sync::Arc<TcpTransport>>,
    RuntimeError,
> {
    use std::hash::{BuildHasher, Hasher};
    let mut peers = std::collections::BTreeMap::new();
    let mut listeners = Vec::new();
    for id in spec.job.node_ids() {
        // Each listener is kept and handed to its transport, so no other socket can take the
        // port in between.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(config)?;
        peers.insert(id, listener.local_addr().map_err(config)?);
        listeners.push((id, listener));
    }
    let state = std::collections::hash_map::RandomState::new();
    let secret: Vec<u8> = (0..4u64)
        .flat_map(|i| {
            let mut h = state.build_hasher();
            h.write_u64(i);
            h.finish().to_le_bytes()
        })
        .collect();
    let mut transports = std::collections::BTreeMap::new();
    for (id, listener) in listeners {
        let mut cfg = TcpConfig::new(
            id,
            peers[&id],
            peers.clone(),
            "train",
            Secret::new(secret.clone()),
        );
        cfg.max_frame = spec.job.max_frame + 64;
        let t = TcpTransport::with_listener(cfg, listener)
            .await
            .map_err(config)?;
        transports.insert(id, std::sync::Arc::new(t));
    }
    Ok(transports)
}

/// What one epoch reached.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct EpochReport {
    /// Epochs done, from 1.
    pub epoch: u32,
    /// Mean log loss of the training minibatches during the epoch, before each update.
    pub train_logloss: f64,
    /// Mean log loss on the test set at the end of the epoch.
    pub test_logloss: f64,
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

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z.clamp(-35.0, 35.0)).exp())
}

fn logloss(p: f64, y: f32) -> f64 {
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    if y > 0.5 { -p.ln() } else { -(1.0 - p).ln() }
}

/// Exact area under the ROC curve: the probability that a random positive scores above a
/// random negative (ties count half), by sorting.
pub(crate) fn auc(scores: &[f64], labels: &[f32]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut positives) = (0.0, 0.0);
    let mut i = 0;
    while i < order.len() {
        // Tied scores share the mean of their ranks.
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            if labels[k] > 0.5 {
                rank_sum += mean_rank;
                positives += 1.0;
            }
        }
        i = j + 1;
    }
    let negatives = scores.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return 0.5;
    }
    (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)
}

/// Test log loss and AUC of the model `weights` (sorted keys with their weights).
pub(crate) fn evaluate(weights: &KvPairs<f32>, test: &Examples) -> (f64, f64) {
    let scores = scores(weights, test);
    let loss: f64 = scores
        .iter()
        .zip(test.labels())
        .map(|(&z, &y)| logloss(sigmoid(z), y))
        .sum();
    (loss / test.len().max(1) as f64, auc(&scores, test.labels()))
}

/// One minibatch, made ready before its weights are pulled: its rows, the distinct keys it
/// touches (sorted, the intercept's last), and where each feature of each row, in row order,
/// sits among those keys. One sort finds both, so computing on the pulled weights needs no
/// search.
#[derive(Debug)]
struct Batch {
    rows: Vec<usize>,
    keys: KeyList,
    positions: Vec<u32>,
}

impl Batch {
    /// Prepares `rows` of `data`; `scratch` is reused from batch to batch.
    fn new(
        data: &Examples,
        rows: &[usize],
        bias: bool,
        scratch: &mut Vec<u64>,
    ) -> Result<Self, RuntimeError> {
        // Each feature as one word, its id above its place in the batch, so that sorting
        // words sorts by id: half the memory of (id, place) pairs, and the sort's fastest
        // case. Ids past 32 bits take the pairs instead.
        scratch.clear();
        let mut wide = false;
        for &r in rows {
            for id in data.row(r).ids() {
                wide |= id > u64::from(u32::MAX);
                scratch.push((id << 32) | scratch.len() as u64);
            }
        }
        let features = scratch.len();
        let mut keys: Vec<Key> = Vec::with_capacity(features + 1);
        let mut positions = vec![0u32; features];
        let mut place = |k: Key, at: usize| {
            if keys.last() != Some(&k) {
                keys.push(k);
            }
            positions[at] = (keys.len() - 1) as u32;
        };
        if wide {
            let mut pairs: Vec<(Key, u32)> = Vec::with_capacity(features);
            for &r in rows {
                let at = pairs.len();
                pairs.extend(
                    data.row(r)
                        .ids()
                        .enumerate()
                        .map(|(i, k)| (k, (at + i) as u32)),
                );
            }
            pairs.sort_unstable_by_key(|&(k, _)| k);
            for (k, at) in pairs {
                place(k, at as usize);
            }
        } else {
            // A radix sort on the ids alone: two or three passes over a batch's few thousand
            // words, where a comparison sort spent as long as the gradient itself. Being
            // stable, it keeps each id's places in order.
            radsort::sort_by_key(scratch.as_mut_slice(), |&word| (word >> 32) as u32);
            for &word in scratch.iter() {
                place(word >> 32, (word & u64::from(u32::MAX)) as usize);
            }
        }
        if bias {
            keys.push(BIAS_KEY);
        }
        Ok(Batch {
            rows: rows.to_vec(),
            keys: KeyList::new(keys).map_err(config)?,
            positions,
        })
    }

    /// The gradient of the mean log loss of the batch's rows at `weights` (aligned with its
    /// keys, the intercept's last when `bias`), and the summed log loss before the update.
    fn gradient(&self, data: &Examples, weights: &[f32], bias: bool) -> (Vec<f32>, f64) {
        let mut grad = vec![0f32; weights.len()];
        let mut loss = 0.0;
        let n = self.rows.len().max(1) as f32;
        let intercept = if bias {
            weights.last().map_or(0.0, |&w| f64::from(w))
        } else {
            0.0
        };
        let mut intercept_grad = 0f32;
        let mut from = 0;
        for &r in &self.rows {
            let row = data.row(r);
            let pos = &self.positions[from..from + row.len()];
            from += row.len();
            let dot: f64 = match row.values() {
                Some(val) => pos
                    .iter()
                    .zip(val)
                    .map(|(&p, &v)| f64::from(weights[p as usize]) * f64::from(v))
                    .sum(),
                // Binary rows: every value is 1.
                None => pos.iter().map(|&p| f64::from(weights[p as usize])).sum(),
            };
            let p = sigmoid(intercept + dot);
            let y = data.labels()[r];
            loss += logloss(p, y);
            let g = (p - f64::from(y)) as f32 / n;
            match row.values() {
                Some(val) => {
                    for (&p, &v) in pos.iter().zip(val) {
                        grad[p as usize] += g * v;
                    }
                }
                None => {
                    for &p in pos {
                        grad[p as usize] += g;
                    }
                }
            }
            intercept_grad += g;
        }
        if bias && let Some(last) = grad.last_mut() {
            *last += intercept_grad;
        }
        (grad, loss)
    }
}

/// The order in which a share's rows `rows` are visited in `epoch`: shuffled by a seed drawn
/// from the job's seed, the share and the epoch, or as given.
fn visiting_order(cfg: &LrConfig, share: usize, epoch: u32, rows: Vec<usize>) -> Vec<usize> {
    let mut order = rows;
    if cfg.shuffle {
        let seed = crate::seeded::mix(cfg.seed ^ crate::seeded::mix(share as u64))
            ^ u64::from(epoch).rotate_left(32);
        crate::seeded::shuffle(&mut order, seed);
    }
    order
}

/// What the workers tell the trainer.
enum Note {
    /// A worker's summed training loss and row count for one epoch.
    Loss {
        epoch: u32,
        loss: f64,
        rows: usize,
        pulled_ahead: usize,
        train_secs: f64,
        skipped_rows: usize,
        batches: Vec<Trained1>,
    },
    /// The measurement of the model after an epoch, by the worker holding the first share.
    Model {
        epoch: u32,
        test_logloss: f64,
        test_auc: f64,
        nnz: usize,
        weights: KvPairs<f32>,
    },
}

/// One minibatch a worker trained: of which share, at which step of the epoch, how many rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Trained1 {
    /// The share ([`WorkerHandle::shares`]).
    pub share: usize,
    /// The step of the epoch: the share's rows from `step * batch` in the epoch's order.
    pub step: usize,
    /// Rows in it.
    pub rows: usize,
}

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
    pub batches: Vec<Trained1>,
    /// The model after the epoch, if this worker measured it ([`Measure`]).
    pub model: Option<Measured>,
}

/// The model as a worker pulled it after an epoch.
#[derive(Clone, Debug)]
pub(crate) struct Measured {
    /// With a test set: its log loss and AUC.
    pub test: Option<(f64, f64)>,
    /// Non-zero weights.
    pub nnz: usize,
    /// The model itself: every weight that is not zero.
    pub weights: KvPairs<f32>,
}

/// What the worker holding the first share does after every epoch. The first share, not the
/// first worker: when a worker dies, whoever takes over its shares measures in its place.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Measure<'a> {
    /// Measure the model on this test set.
    pub test: Option<&'a Examples>,
    /// Pull the model even without a test set (to save it).
    pub model: bool,
}

/// How one worker runs, besides what it trains on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkerRun<'a> {
    /// What it does after every epoch if it leads.
    pub measure: Measure<'a>,
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
            measure: Measure::default(),
            counter: None,
            slowdown: 1.0,
            transient: None,
        }
    }
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
    fn factor_at(&self, step: usize) -> f64 {
        let drawn = crate::seeded::mix(self.seed ^ crate::seeded::mix(step as u64));
        if drawn % self.workers.max(1) as u64 == self.worker as u64 {
            self.factor
        } else {
            1.0
        }
    }
}

/// The rows of one share of the training data: the examples that hold them, and which.
pub(crate) type ShareRows = (Arc<Examples>, Vec<usize>);

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
    rows_of: impl FnMut(usize) -> Result<ShareRows, RuntimeError>,
    steps: usize,
    run: WorkerRun<'_>,
    mut on_epoch: impl FnMut(WorkerEpoch),
) -> Result<(), RuntimeError> {
    handle.ready().await?;
    let steps = steps.max(1);
    let first = handle.iteration().await?;
    let mut shares = Shares {
        cfg,
        handle,
        first,
        steps: steps as pserver_core::Iteration,
        rows_of,
        held: Vec::new(),
        orders: BTreeMap::new(),
        sizes: BTreeMap::new(),
        scratch: Vec::new(),
        prepared: Duration::ZERO,
    };
    let ahead = cfg.pipelined();
    let total = cfg.epochs as usize * steps;
    let mut slowdown = Slowdown::default();
    let mut speed = Speed::default();
    let says_speed = cfg.job.stragglers.balance.is_some();
    let mut epoch = Epoch1::new(1);
    // Rows skipped in epochs not reached yet, by epoch.
    let mut skipped_later: BTreeMap<u32, usize> = BTreeMap::new();
    let mut next: Option<(usize, Vec<InFlight>)> = None;
    let mut at = 0;
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
            if iteration_of(handle.skipped_to(), first) > at {
                // Moved on mid-step: the rest of the step's work is dropped.
                epoch.skipped_rows += flight.batch.rows.len();
                continue;
            }
            let pulled = flight.weights.await?;
            let began = Instant::now();
            let (mut grad, l) = flight
                .batch
                .gradient(&flight.data, pulled.values(), cfg.bias);
            let rows = flight.batch.rows.len();
            let weight = cfg.push_weight(rows);
            if weight != 1.0 {
                grad.iter_mut().for_each(|g| *g *= weight);
            }
            // The worker's compute: the gradient, and preparing the minibatches since.
            let computed = began.elapsed() + std::mem::take(&mut shares.prepared);
            let factor = run.slowdown * run.transient.map_or(1.0, |t| t.factor_at(at));
            let slept = slowdown.after(computed, factor).await;
            speed.add(rows, computed + slept);
            epoch.loss += l;
            epoch.rows += rows;
            epoch.batches.extend(flight.parts);
            if let Some(counter) = run.counter {
                counter.add(rows);
            }
            let kvs = KvPairs::with_keys(&flight.batch.keys, grad, 1).map_err(config)?;
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
        let moved = iteration_of(handle.skipped_to(), first);
        if moved.max(at + 1) >= total {
            // The last step: what the job's filters held back goes with it, so that the
            // model holds every change the worker computed.
            handle.flush().await?;
        }
        let to = if moved > at {
            moved
        } else {
            iteration_of(handle.advance().await?, first)
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
            let model = measure(handle, run.measure).await?;
            while epoch.number <= ended {
                let next_epoch = epoch.number + 1;
                let mut done = std::mem::replace(&mut epoch, Epoch1::new(next_epoch));
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
fn iteration_of(iteration: pserver_core::Iteration, first: pserver_core::Iteration) -> usize {
    iteration.saturating_sub(first) as usize
}

/// The leading worker measures: the holder of the first share while it lives, then whoever
/// holds the lowest share among the living, so that metrics go on whoever dies or leaves.
async fn measure(
    handle: &WorkerHandle<f32>,
    measure: Measure<'_>,
) -> Result<Option<Measured>, RuntimeError> {
    let wanted = measure.test.is_some() || measure.model;
    if !wanted || !handle.leads().await? {
        return Ok(None);
    }
    let everything = RangeList::new(vec![KeyRange::FULL]).map_err(config)?;
    let pulled = handle.pull(KeySelection::Ranges(everything)).await?;
    // Only the weights that are not zero: a weight absent reads as zero, and an L1-regularized
    // model keeps a few of the millions of rows the servers store.
    let (keys, values): (Vec<Key>, Vec<f32>) = pulled
        .iter()
        .filter_map(|(k, w)| w.first().filter(|&&w| w != 0.0).map(|&w| (k, w)))
        .unzip();
    let weights = KvPairs::new(keys, values, 1).map_err(config)?;
    Ok(Some(Measured {
        test: measure.test.map(|test| evaluate(&weights, test)),
        nnz: weights.len(),
        weights,
    }))
}

/// What a worker has done so far in one epoch.
struct Epoch1 {
    number: u32,
    began: Instant,
    loss: f64,
    rows: usize,
    skipped_rows: usize,
    pulled_ahead: usize,
    batches: Vec<Trained1>,
}

impl Epoch1 {
    fn new(number: u32) -> Self {
        Epoch1 {
            number,
            began: Instant::now(),
            loss: 0.0,
            rows: 0,
            skipped_rows: 0,
            pulled_ahead: 0,
            batches: Vec::new(),
        }
    }

    fn finish(self, model: Option<Measured>) -> WorkerEpoch {
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

/// Makes a worker compute slower than it does: after each minibatch computed `factor` times
/// slower it waits `factor - 1` times the minibatch's compute. Waits shorter than a
/// millisecond are saved up, since a timer cannot wait that little, so the slowdown holds on
/// average.
#[derive(Default)]
struct Slowdown {
    owed: Duration,
}

impl Slowdown {
    /// Waits what `computed` owes at `factor`; returns how long it waited.
    async fn after(&mut self, computed: Duration, factor: f64) -> Duration {
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
type Answer = std::pin::Pin<Box<dyn Future<Output = Result<KvPairs<f32>, RuntimeError>> + Send>>;

/// A minibatch whose weights were asked for.
struct InFlight {
    /// The shares' steps it holds.
    parts: Vec<Trained1>,
    data: Arc<Examples>,
    batch: Batch,
    weights: Answer,
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
    /// The shares of the last step.
    held: Vec<usize>,
    /// Per share: its rows, in this epoch's order.
    orders: BTreeMap<usize, (Arc<Examples>, Vec<usize>)>,
    /// Per share seen: its rows.
    sizes: BTreeMap<usize, usize>,
    scratch: Vec<u64>,
    /// Time spent preparing minibatches not yet counted as compute.
    prepared: Duration,
}

impl<F: FnMut(usize) -> Result<ShareRows, RuntimeError>> Shares<'_, F> {
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
        let mut groups: Vec<(Arc<Examples>, Vec<usize>, Vec<Trained1>)> = Vec::new();
        for r in shares {
            let share = r.share;
            let (first_seen, (data, order)) = match self.orders.entry(share) {
                Entry::Occupied(e) => (false, e.into_mut()),
                Entry::Vacant(e) => {
                    let (data, mine) = (self.rows_of)(share)?;
                    self.sizes.insert(share, mine.len());
                    (
                        true,
                        e.insert((data, visiting_order(self.cfg, share, epoch, mine))),
                    )
                }
            };
            // A share moved here for this epoch, learned of mid-epoch: its steps before this
            // one are done now, since the worker it came from stopped where the epoch began.
            let from_step = if first_seen && r.from_start { 0 } else { step };
            for at in from_step..=step {
                let from = (at * batch).min(order.len());
                let rows = &order[from..(from + batch).min(order.len())];
                if rows.is_empty() {
                    continue;
                }
                let part = Trained1 {
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

impl EpochReport {
    /// Rows trained per second of the epoch.
    pub(crate) fn rows_per_sec(&self) -> f64 {
        self.rows as f64 / self.epoch_secs.max(1e-9)
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

/// A run's rows, shared by its workers: training rows, the permutation of them dealt into
/// shares, and test rows.
#[derive(Clone)]
struct RunData {
    train: Arc<Examples>,
    dealt: Arc<Vec<usize>>,
    test: Arc<Examples>,
}

async fn run_worker(
    cfg: LrConfig,
    handle: WorkerHandle<f32>,
    RunData { train, dealt, test }: RunData,
    notes: mpsc::UnboundedSender<Note>,
    counter: RowsTrained,
    (slowdown, transient): (f64, Option<Transient>),
) -> Result<(), RuntimeError> {
    let per = cfg.share_rows(train.len());
    let rows_of = |share: usize| {
        let share = (share * per).min(train.len())..((share + 1) * per).min(train.len());
        Ok((train.clone(), dealt[share].to_vec()))
    };
    let steps = per.div_ceil(cfg.share_batch());
    let run = WorkerRun {
        measure: Measure {
            test: Some(&*test),
            model: true,
        },
        counter: Some(&counter),
        slowdown,
        transient,
    };
    run_shares(&cfg, &handle, rows_of, steps, run, |e| {
        let _ = notes.send(Note::Loss {
            epoch: e.epoch,
            loss: e.loss,
            rows: e.rows,
            pulled_ahead: e.pulled_ahead,
            train_secs: e.train_secs,
            skipped_rows: e.skipped_rows,
            batches: e.batches,
        });
        if let Some(Measured {
            test: Some((test_logloss, test_auc)),
            nnz,
            weights,
        }) = e.model
        {
            let _ = notes.send(Note::Model {
                epoch: e.epoch,
                test_logloss,
                test_auc,
                nnz,
                weights,
            });
        }
    })
    .await
}

fn config(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(e.to_string())
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

/// Trains on `train` in one process over the in-memory transport, measuring on `test` after
/// every epoch; `on_epoch` sees each report as it is made.
pub(crate) async fn train_local(
    cfg: &LrConfig,
    train: impl Into<Arc<Examples>>,
    test: impl Into<Arc<Examples>>,
    on_epoch: impl FnMut(&EpochReport),
) -> Result<Trained, RuntimeError> {
    let counter = RowsTrained::default();
    train_local_until(cfg, train, test, &counter, on_epoch, std::future::pending()).await
}

/// [`train_local`], ending early when `stop` completes (Ctrl-C, say): the result then holds the
/// epochs finished so far, and the model of the last of them.
/// `counter` counts the rows trained as training goes.
pub(crate) async fn train_local_until(
    cfg: &LrConfig,
    train: impl Into<Arc<Examples>>,
    test: impl Into<Arc<Examples>>,
    counter: &RowsTrained,
    mut on_epoch: impl FnMut(&EpochReport),
    stop: impl Future<Output = ()>,
) -> Result<Trained, RuntimeError> {
    let began = Instant::now();
    // Shared, never copied: a run holds one copy of the rows, however many runs share it.
    let (train, test): (Arc<Examples>, Arc<Examples>) = (train.into(), test.into());
    let mut spec = ClusterSpec::of(cfg.protocol_job());
    // The job's keys are the data's features: the ring spreads them over every server, where
    // over the whole 64-bit key space they would all fall to one.
    if spec.job.ring.key_space == u64::MAX {
        spec.job.ring.key_space = train.dimensions().max(test.dimensions()).max(1);
    }
    // Held pulls wait for the slowest worker; never declare a busy worker dead for that, nor
    // take a coordinator whose loop is as busy for a silent one.
    spec.job.timing.heartbeat_timeout = Duration::from_secs(60).as_nanos() as u64;
    spec.job.timing.coordinator_timeout = spec.job.timing.heartbeat_timeout;
    // Stragglers are told and dealt with at failure checks: a run of seconds needs them a few
    // times a second, not every tenth of one.
    if spec.job.stragglers.detect.is_some() {
        let often = Duration::from_millis(10).as_nanos() as u64;
        spec.job.timing.heartbeat_interval = spec.job.timing.heartbeat_interval.min(often);
    }
    let network = MemNetwork::reliable();
    let tcp = match cfg.transport {
        Wire::Mem => None,
        Wire::Tcp => Some(loopback(&spec).await?),
    };
    let cluster: LocalCluster<f32> = match &tcp {
        None => LocalCluster::start(&spec, &network)?,
        Some(transports) => LocalCluster::start_over(&spec, |id| {
            let t = transports
                .get(&id)
                .ok_or_else(|| config(format!("no transport for {id}")))?;
            Ok(t.clone() as std::sync::Arc<dyn pserver_transport::Transport>)
        })?,
    };
    let bytes_sent = || match &tcp {
        None => network.stats().bytes_sent,
        Some(transports) => transports.values().map(|t| t.stats().bytes_sent).sum(),
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Shares are contiguous runs of a seeded permutation of the rows: each holds a fair
    // sample of a file sorted by label (or by anything else), not one end of it. The
    // permutation is what is dealt; the rows themselves are not copied.
    let mut dealt: Vec<usize> = (0..train.len()).collect();
    if cfg.shuffle {
        crate::seeded::shuffle(&mut dealt, crate::seeded::mix(cfg.seed ^ 0x5a17));
    }
    let data = RunData {
        train: train.clone(),
        dealt: Arc::new(dealt),
        test: test.clone(),
    };
    let tasks: Vec<_> = cluster
        .workers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let slowdown = cfg
                .slow_worker
                .filter(|s| s.worker == i)
                .map_or(1.0, |s| s.factor);
            let transient = cfg.straggler.map(|factor| Transient {
                factor,
                worker: i,
                workers: cfg.job.workers,
                seed: cfg.seed,
            });
            tokio::spawn(run_worker(
                cfg.clone(),
                h.clone(),
                data.clone(),
                tx.clone(),
                counter.clone(),
                (slowdown, transient),
            ))
        })
        .collect();
    drop(tx);
    let mut epochs = Epochs::new(cfg, train.len());
    let pace = PaceWatch::new(&cluster, &spec.job);
    let mut stop = std::pin::pin!(stop);
    loop {
        let note = tokio::select! {
            note = rx.recv() => note,
            () = &mut stop => {
                // Workers may be waiting on each other at a consistency bound: end them all at
                // once rather than one by one.
                for t in &tasks {
                    t.abort();
                }
                drop(cluster);
                epochs.pace = pace.read();
                return epochs.trained();
            }
        };
        let Some(note) = note else {
            break;
        };
        epochs.note(note);
        while let Some(report) = epochs.next_report(began, bytes_sent()) {
            on_epoch(report);
        }
        if let Some(patience) = cfg.early_stop
            && epochs.since_best() >= patience
        {
            for t in &tasks {
                t.abort();
            }
            drop(cluster);
            epochs.pace = pace.read();
            epochs.filters = pace.filter_savings();
            epochs.stopped_early = Some(epochs.reports.len() as u32);
            return epochs.trained();
        }
    }
    for t in tasks {
        t.await.map_err(|_| RuntimeError::ShutDown)??;
    }
    cluster.shutdown().await?;
    epochs.pace = pace.read();
    epochs.filters = pace.filter_savings();
    epochs.trained()
}

/// What was found and done about stragglers in a run ([`pserver_core::pace::StragglerPolicy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PaceCounts {
    /// Times the coordinator found a worker lagging.
    pub stragglers: u64,
    /// Shares it moved from slower workers to faster ones.
    pub shares_moved: u64,
    /// Iterations workers were told to skip, over every worker.
    pub skipped_iterations: u64,
}

/// Where a run's [`PaceCounts`] are read from: the coordinator's and the workers' counts,
/// which hold their last values once the nodes have stopped.
struct PaceWatch {
    coordinator: Option<watch::Receiver<NodeMetrics>>,
    workers: Vec<watch::Receiver<NodeMetrics>>,
}

impl PaceWatch {
    fn new(cluster: &LocalCluster<f32>, job: &JobSpec) -> Self {
        let layout = job.layout();
        PaceWatch {
            coordinator: cluster.metrics_receiver(layout.coordinator()),
            workers: layout
                .workers()
                .filter_map(|w| cluster.metrics_receiver(w))
                .collect(),
        }
    }

    fn read(&self) -> PaceCounts {
        let coordinator = self
            .coordinator
            .as_ref()
            .map(|c| c.borrow().clone())
            .unwrap_or_default();
        PaceCounts {
            stragglers: coordinator.stragglers,
            shares_moved: coordinator.shares_moved,
            skipped_iterations: self
                .workers
                .iter()
                .map(|w| w.borrow().skipped_iterations)
                .sum(),
        }
    }

    /// Each filter's saving, summed over the workers, in the order the workers name them.
    fn filter_savings(&self) -> Vec<(&'static str, FilterSaving)> {
        let mut sums: Vec<(&'static str, FilterSaving)> = Vec::new();
        for w in &self.workers {
            for &(name, saving) in &w.borrow().filter_savings {
                match sums.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, sum)) => sum.add(saving),
                    None => sums.push((name, saving)),
                }
            }
        }
        sums
    }
}

/// An epoch's measurement: test log loss, test AUC, non-zero weights, and the model.
type EpochModel = (f64, f64, usize, KvPairs<f32>);

/// What the workers said of one epoch, summed over them.
#[derive(Clone, Debug, Default)]
struct Said {
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
struct Epochs {
    workers: usize,
    /// Rows of the training data: what every epoch trains once.
    train_rows: usize,
    keep: Keep,
    /// Per epoch (from 1): what the workers said of it.
    losses: Vec<Said>,
    /// Per epoch (from 1) not reported yet: test log loss, test AUC, non-zero weights and
    /// the model measured after it.
    models: Vec<Option<EpochModel>>,
    /// The model kept so far, and its epoch.
    kept: Option<(u32, KvPairs<f32>)>,
    /// The reported epoch with the lowest test log loss.
    best: Option<(u32, f64)>,
    reports: Vec<EpochReport>,
    stopped_early: Option<u32>,
    pace: PaceCounts,
    filters: Vec<(&'static str, FilterSaving)>,
}

impl Epochs {
    fn new(cfg: &LrConfig, train_rows: usize) -> Self {
        Epochs {
            workers: cfg.job.workers,
            train_rows,
            keep: cfg.keep,
            losses: vec![Said::default(); cfg.epochs as usize + 1],
            models: vec![None; cfg.epochs as usize + 1],
            kept: None,
            best: None,
            reports: Vec::new(),
            stopped_early: None,
            pace: PaceCounts::default(),
            filters: Vec::new(),
        }
    }

    /// Epochs reported since the best one.
    fn since_best(&self) -> u32 {
        let best = self.best.map_or(0, |(e, _)| e);
        self.reports.len() as u32 - best
    }

    fn note(&mut self, note: Note) {
        match note {
            Note::Loss {
                epoch,
                loss,
                rows,
                pulled_ahead,
                train_secs,
                skipped_rows,
                batches,
            } => {
                let slot = &mut self.losses[epoch as usize];
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
            Note::Model {
                epoch,
                test_logloss,
                test_auc,
                nnz,
                weights,
            } => {
                self.models[epoch as usize] = Some((test_logloss, test_auc, nnz, weights));
            }
        }
    }

    /// The report of the next epoch, if everything about it is in; `began` and `bytes_sent`
    /// are when training began and what the nodes have sent so far.
    fn next_report(&mut self, began: Instant, bytes_sent: u64) -> Option<&EpochReport> {
        let next = self.reports.len() + 1;
        let said = self.losses.get(next)?;
        if said.workers < self.workers {
            return None;
        }
        let Said {
            loss,
            rows,
            pulled_ahead,
            train_secs,
            skipped_ahead,
            ..
        } = *said;
        // Rows of a skipped step no worker trained, and rows of a share that moved from a
        // worker ahead to one behind that both did.
        let distinct: usize = said.batches.values().map(|&(rows, _)| rows).sum();
        let skipped_rows = self.train_rows.saturating_sub(distinct);
        let repeated_rows = rows.saturating_sub(distinct);
        let (test_logloss, test_auc, nnz, model) = self.models.get_mut(next)?.take()?;
        let epoch = next as u32;
        let secs = began.elapsed().as_secs_f64();
        let before = self.reports.last().map_or(0.0, |r| r.secs);
        // A NaN loss is never better, not even than nothing.
        let better = !test_logloss.is_nan() && self.best.is_none_or(|(_, b)| test_logloss < b);
        if better {
            self.best = Some((epoch, test_logloss));
        }
        if better || self.keep == Keep::Last || self.kept.is_none() {
            self.kept = Some((epoch, model));
        }
        self.reports.push(EpochReport {
            epoch,
            train_logloss: loss / rows.max(1) as f64,
            test_logloss,
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
    fn trained(self) -> Result<Trained, RuntimeError> {
        let (kept_epoch, model) = match self.kept {
            Some(kept) => kept,
            None => (0, KvPairs::empty(1).map_err(config)?),
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

/// The first bytes of a saved model file: version 2 records the index base.
const MODEL_MAGIC: &[u8; 8] = b"PSLRv2\0\0";
/// Version 1: no index base.
const MODEL_MAGIC_V1: &[u8; 8] = b"PSLRv1\0\0";

/// A model as saved: the weights (the intercept at [`BIAS_KEY`]) and how the data it was
/// trained on counted its feature indices, so that data scored with it is read the same way.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SavedModel {
    /// Every non-zero weight by key.
    pub weights: KvPairs<f32>,
    /// `Zero` or `One`; `Auto` for a model saved before the base was recorded.
    pub base: IndexBase,
}

/// Writes `weights` and the index base `base` (`Zero` or `One`) to `path`: magic, base (one
/// byte and seven of padding), count, then each key and weight in little-endian. Zero
/// weights are left out.
pub(crate) fn save_model(
    path: &std::path::Path,
    weights: &KvPairs<f32>,
    base: IndexBase,
) -> Result<(), String> {
    let rows: Vec<(Key, f32)> = weights
        .iter()
        .filter(|(_, w)| w[0] != 0.0)
        .map(|(k, w)| (k, w[0]))
        .collect();
    let mut bytes = Vec::with_capacity(24 + rows.len() * 12);
    bytes.extend_from_slice(MODEL_MAGIC);
    bytes.extend_from_slice(&[base.first().unwrap_or(u8::MAX), 0, 0, 0, 0, 0, 0, 0]);
    bytes.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    for (k, w) in rows {
        bytes.extend_from_slice(&k.to_le_bytes());
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    std::fs::write(path, bytes).map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

/// Reads a model written by [`save_model`] (or by a version that did not record the index
/// base), checking its header and length before allocating.
pub(crate) fn load_model(path: &std::path::Path) -> Result<SavedModel, String> {
    let name = path.display();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    let bad = |why: &str| format!("{name}: not a pserver model: {why}");
    let (magic, rest) = bytes.split_at_checked(8).ok_or_else(|| bad("too short"))?;
    let (base, rest) = if magic == MODEL_MAGIC {
        let (header, rest) = rest.split_at_checked(8).ok_or_else(|| bad("too short"))?;
        let base = match header[0] {
            0 => IndexBase::Zero,
            1 => IndexBase::One,
            other => return Err(bad(&format!("index base {other}"))),
        };
        (base, rest)
    } else if magic == MODEL_MAGIC_V1 {
        (IndexBase::Auto, rest)
    } else {
        return Err(bad("wrong magic bytes"));
    };
    let (count, rows) = rest.split_at_checked(8).ok_or_else(|| bad("too short"))?;
    let count = u64::from_le_bytes(count.try_into().map_err(|_| bad("too short"))?);
    if Some(rows.len() as u64) != count.checked_mul(12) {
        return Err(bad("its length does not match its row count"));
    }
    let mut keys = Vec::with_capacity(rows.len() / 12);
    let mut weights = Vec::with_capacity(rows.len() / 12);
    for row in rows.chunks_exact(12) {
        let (k, w) = row.split_at(8);
        keys.push(u64::from_le_bytes(
            k.try_into().map_err(|_| bad("a short row"))?,
        ));
        weights.push(f32::from_le_bytes(
            w.try_into().map_err(|_| bad("a short row"))?,
        ));
    }
    let weights = KvPairs::new(keys, weights, 1).map_err(|e| bad(&e.to_string()))?;
    Ok(SavedModel { weights, base })
}

/// The raw score (log-odds) of every example of `data` under `model`, its intercept (the
/// weight at [`BIAS_KEY`], if any) included.
pub(crate) fn scores(model: &KvPairs<f32>, data: &Examples) -> Vec<f64> {
    let intercept = model.get(BIAS_KEY).map_or(0.0, |w| f64::from(w[0]));
    (0..data.len())
        .map(|i| {
            intercept
                + data
                    .row(i)
                    .iter()
                    .map(|(k, v)| model.get(k).map_or(0.0, |w| f64::from(w[0]) * f64::from(v)))
                    .sum::<f64>()
        })
        .collect()
}

#[cfg(test)]
mod end_to_end;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_model_loads_back_and_a_corrupt_one_is_refused() {
        let model = KvPairs::new(vec![3, 9, 12], vec![0.5f32, 0.0, -1.25], 1).unwrap();
        let dir = std::env::temp_dir().join(format!("pserver-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.bin");
        save_model(&path, &model, IndexBase::One).unwrap();
        let back = load_model(&path).unwrap();
        assert_eq!(back.weights.keys(), &[3, 12]);
        assert_eq!(back.weights.values(), &[0.5, -1.25]);
        assert_eq!(back.base, IndexBase::One);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(load_model(&path).unwrap_err().contains("does not match"));
        std::fs::write(&path, b"garbage!").unwrap();
        assert!(
            load_model(&path)
                .unwrap_err()
                .contains("not a pserver model")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The weight FTRL gives a feature whose every row has gradient 0.5, over `epochs` passes
    /// of 100 rows pushed as minibatch means of `batch` rows.
    fn ftrl_weight(batch: usize, epochs: usize, l1: f64) -> f64 {
        use pserver_core::UpdateRule;
        let rule = ftrl(1.0, l1, 0.0);
        let (mut w, mut aux) = (0.0f64, [0.0f64; 2]);
        for _ in 0..epochs * 100 / batch {
            rule.apply(&mut w, &mut aux, 0.5);
        }
        w
    }

    #[test]
    fn l1_is_charged_once_against_minibatch_means() {
        // Per row, one epoch sums to 50 against an l1 of 10: the weight moves.
        assert!(ftrl_weight(1, 1, 10.0) < 0.0);
        // As means of 20 rows, one epoch sums to 2.5: the same l1 holds the weight at zero,
        // as an l1 20 times larger would per row.
        assert_eq!(ftrl_weight(20, 1, 10.0), 0.0);
        assert_eq!(ftrl_weight(1, 1, 200.0), 0.0);
        // More epochs add to the data term, not to the regularizer: by the fifth epoch (12.5)
        // the weight moves.
        assert_eq!(ftrl_weight(20, 4, 10.0), 0.0);
        assert!(ftrl_weight(20, 5, 10.0) < 0.0);
    }

    fn examples(text: &[u8]) -> Examples {
        crate::data::libsvm::parse("t", text, IndexBase::Zero).unwrap()
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

    fn batch(data: &Examples, rows: &[usize], bias: bool) -> Batch {
        Batch::new(data, rows, bias, &mut Vec::new()).unwrap()
    }

    #[test]
    fn a_batch_pulls_its_distinct_keys_sorted_and_the_intercept_last() {
        let data = examples(b"1 3:1 7:1\n0 1:1 3:2\n");
        assert_eq!(batch(&data, &[0, 1], true).keys.keys(), [1, 3, 7, BIAS_KEY]);
        assert_eq!(batch(&data, &[1], false).keys.keys(), [1, 3]);
    }

    #[test]
    fn features_past_32_bits_point_at_their_own_keys_too() {
        let data = examples(b"1 2:1 5000000000:1\n0 5:1 4294967296:1\n");
        let b = batch(&data, &[0, 1], false);
        assert_eq!(b.keys.keys(), [2, 5, 4_294_967_296, 5_000_000_000]);
        let pointed: Vec<Key> = b
            .positions
            .iter()
            .map(|&p| b.keys.keys()[p as usize])
            .collect();
        assert_eq!(pointed, [2, 5_000_000_000, 5, 4_294_967_296]);
    }

    #[test]
    fn each_feature_of_a_batch_points_at_its_own_key() {
        let data = examples(b"1 2:1 5:1 9:1\n0 5:1 9:2\n1 2:1\n");
        let rows = [2, 0, 1];
        let b = batch(&data, &rows, true);
        let features: Vec<Key> = rows.iter().flat_map(|&r| data.row(r).ids()).collect();
        let pointed: Vec<Key> = b
            .positions
            .iter()
            .map(|&p| b.keys.keys()[p as usize])
            .collect();
        assert_eq!(pointed, features);
        assert_eq!(b.rows, rows);
    }

    #[test]
    fn the_gradient_is_the_mean_over_the_batch_with_the_intercept_in_the_last_slot() {
        let data = examples(b"1 0:1 1:2\n0 1:1\n");
        let weights = [0.5f32, -0.25, 0.1];
        let (grad, loss) = batch(&data, &[0, 1], true).gradient(&data, &weights, true);
        // Row 0: z = 0.1 + 0.5 - 0.5 = 0.1, label 1; row 1: z = 0.1 - 0.25 = -0.15, label 0.
        let (p0, p1) = (sigmoid(0.1), sigmoid(-0.15));
        let (g0, g1) = ((p0 - 1.0) / 2.0, p1 / 2.0);
        let want = [g0, 2.0 * g0 + g1, g0 + g1];
        for (got, want) in grad.iter().zip(want) {
            assert!((f64::from(*got) - want).abs() < 1e-6, "{grad:?} {want}");
        }
        assert!((loss - (-p0.ln() - (1.0 - p1).ln())).abs() < 1e-9);
        // Without an intercept its weight is not read, and no slot is added.
        let (grad, _) = batch(&data, &[1], false).gradient(&data, &[-0.25], false);
        assert_eq!(grad.len(), 1);
        assert!(
            (f64::from(grad[0]) - sigmoid(-0.25)).abs() < 1e-6,
            "{grad:?}"
        );
    }

    #[test]
    fn scores_are_the_log_odds_with_the_intercept() {
        let data = examples(b"1 0:1 2:3\n0\n");
        let model = KvPairs::new(vec![0, 2, BIAS_KEY], vec![0.5f32, 0.25, -1.0], 1).unwrap();
        assert_eq!(scores(&model, &data), vec![-1.0 + 0.5 + 0.75, -1.0]);
    }

    #[test]
    fn each_epoch_and_each_share_visit_their_rows_in_their_own_order() {
        let cfg = LrConfig::default();
        let order = |share, epoch| visiting_order(&cfg, share, epoch, (0..50).collect());
        let mut sorted = order(0, 1);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(order(0, 1), order(0, 2));
        assert_ne!(order(0, 1), order(1, 1));
        assert_eq!(order(3, 4), order(3, 4));
        let in_file = LrConfig {
            shuffle: false,
            ..LrConfig::default()
        };
        assert_eq!(
            visiting_order(&in_file, 2, 5, (10..20).collect()),
            (10..20).collect::<Vec<_>>()
        );
    }

    /// The reports of epochs whose test log losses are `losses`, with `keep`, each epoch's
    /// model holding its number as its one weight.
    fn reported(losses: &[f64], keep: Keep) -> Epochs {
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
                epochs.note(Note::Loss {
                    epoch,
                    loss: 2.0,
                    rows: 4,
                    pulled_ahead: 0,
                    train_secs: 0.0,
                    skipped_rows: 0,
                    batches: vec![Trained1 {
                        share,
                        step: 0,
                        rows: 4,
                    }],
                });
            }
            assert!(epochs.next_report(began, 0).is_none(), "no model yet");
            let weights = KvPairs::new(vec![1], vec![epoch as f32], 1).unwrap();
            epochs.note(Note::Model {
                epoch,
                test_logloss: loss,
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

    #[test]
    fn an_epoch_reports_the_rows_no_worker_trained_and_the_rows_two_did() {
        let cfg = LrConfig {
            epochs: 1,
            ..LrConfig::default()
        };
        let mut epochs = Epochs::new(&cfg, 40);
        let batch = |share, step, rows| Trained1 { share, step, rows };
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
            epochs.note(Note::Loss {
                epoch: 1,
                loss: 1.0,
                rows,
                pulled_ahead: 0,
                train_secs: 0.0,
                skipped_rows: 0,
                batches,
            });
        }
        epochs.note(Note::Model {
            epoch: 1,
            test_logloss: 0.5,
            test_auc: 0.5,
            nnz: 0,
            weights: KvPairs::empty(1).unwrap(),
        });
        let report = epochs.next_report(Instant::now(), 0).unwrap();
        assert_eq!(report.rows, 35);
        assert_eq!(report.skipped_rows, 10);
        assert_eq!(report.repeated_rows, 5);
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

    #[test]
    fn a_model_saved_before_the_index_base_was_recorded_still_loads() {
        let dir = std::env::temp_dir().join(format!("pserver-model-v1-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v1.bin");
        let mut bytes = b"PSLRv1\0\0".to_vec();
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&5u64.to_le_bytes());
        bytes.extend_from_slice(&0.5f32.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let model = load_model(&path).unwrap();
        assert_eq!(model.base, IndexBase::Auto);
        assert_eq!(
            (model.weights.keys(), model.weights.values()),
            (&[5][..], &[0.5][..])
        );
        std::fs::write(&path, b"PSLRv9\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
        assert!(load_model(&path).unwrap_err().contains("wrong magic bytes"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn auc_is_exact_and_handles_ties() {
        assert_eq!(auc(&[0.1, 0.9], &[0.0, 1.0]), 1.0);
        assert_eq!(auc(&[0.9, 0.1], &[0.0, 1.0]), 0.0);
        assert_eq!(auc(&[0.5, 0.5], &[0.0, 1.0]), 0.5);
        // 2 positives, 2 negatives: pairs (p, n) ordered right in 3 of 4.
        assert_eq!(auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]), 0.75);
    }
}
