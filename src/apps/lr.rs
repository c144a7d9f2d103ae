//! Sparse logistic regression, the paper's headline application: each worker computes the
//! gradient of the log loss on minibatches of its own shard, for the keys those examples
//! touch, and pushes it; servers apply it through their update rule (FTRL-Proximal by
//! default, whose L1 term keeps the model sparse).
//!
//! One iteration is one minibatch on every worker; an epoch is one pass over each shard. After
//! every epoch the first worker pulls the whole model (a range pull, answered in parts) and
//! measures it on the test set.

use std::time::{Duration, Instant};

use pserver_core::{
    Consistency, Key, KeyList, KeyRange, KeySelection, KvPairs, MAX_KEY, RangeList, Updater,
};
use pserver_transport::mem::MemNetwork;
use pserver_transport::runtime::{ClusterSpec, LocalCluster, RuntimeError, WorkerHandle};
use tokio::sync::mpsc;

use crate::data::libsvm::Examples;

/// How to train.
#[derive(Clone, Debug, PartialEq)]
pub struct LrConfig {
    /// Servers.
    pub servers: usize,
    /// Workers; each gets an equal share of the training rows.
    pub workers: usize,
    /// The consistency model.
    pub consistency: Consistency,
    /// Passes over the data.
    pub epochs: u32,
    /// Rows per minibatch on each worker.
    pub batch: usize,
    /// The servers' update rule.
    pub updater: Updater,
}

impl Default for LrConfig {
    fn default() -> Self {
        LrConfig {
            servers: 2,
            workers: 4,
            consistency: Consistency::BoundedDelay(4),
            epochs: 10,
            batch: 100,
            updater: Updater::FtrlProximal {
                alpha: 0.3,
                beta: 1.0,
                l1: 1.0,
                l2: 1.0,
            },
        }
    }
}

/// What one epoch reached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochReport {
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
    /// Seconds since training began.
    pub secs: f64,
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
pub fn auc(scores: &[f64], labels: &[f32]) -> f64 {
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
pub fn evaluate(weights: &KvPairs<f32>, test: &Examples) -> (f64, f64) {
    let mut scores = Vec::with_capacity(test.len());
    let mut loss = 0.0;
    for i in 0..test.len() {
        let (idx, val) = test.row(i);
        let z: f64 = idx
            .iter()
            .zip(val)
            .map(|(&k, &v)| {
                weights
                    .get(k)
                    .map_or(0.0, |w| f64::from(w[0]) * f64::from(v))
            })
            .sum();
        loss += logloss(sigmoid(z), test.labels()[i]);
        scores.push(z);
    }
    (loss / test.len().max(1) as f64, auc(&scores, test.labels()))
}

/// One minibatch: the distinct keys it touches, sorted.
fn batch_keys(data: &Examples, rows: std::ops::Range<usize>) -> Vec<Key> {
    let mut keys: Vec<Key> = rows.flat_map(|r| data.row(r).0.iter().copied()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The gradient of the mean log loss of `rows` at `weights` (aligned with `keys`), and the
/// summed log loss before the update.
fn gradient(
    data: &Examples,
    rows: std::ops::Range<usize>,
    keys: &[Key],
    weights: &[f32],
) -> (Vec<f32>, f64) {
    let mut grad = vec![0f32; keys.len()];
    let mut loss = 0.0;
    let n = rows.len().max(1) as f32;
    for r in rows {
        let (idx, val) = data.row(r);
        let pos: Vec<usize> = idx
            .iter()
            .map(|k| keys.binary_search(k).unwrap_or(0))
            .collect();
        let z: f64 = pos
            .iter()
            .zip(val)
            .map(|(&p, &v)| f64::from(weights[p]) * f64::from(v))
            .sum();
        let p = sigmoid(z);
        let y = data.labels()[r];
        loss += logloss(p, y);
        let g = (p - f64::from(y)) as f32 / n;
        for (&p, &v) in pos.iter().zip(val) {
            grad[p] += g * v;
        }
    }
    (grad, loss)
}

/// What the workers tell the trainer.
enum Note {
    /// A worker's summed training loss and row count for one epoch.
    Loss { epoch: u32, loss: f64, rows: usize },
    /// The first worker's measurement of the model after an epoch.
    Model {
        epoch: u32,
        test_logloss: f64,
        test_auc: f64,
        nnz: usize,
    },
}

async fn run_worker(
    index: usize,
    cfg: LrConfig,
    handle: WorkerHandle<f32>,
    train: std::sync::Arc<Examples>,
    test: std::sync::Arc<Examples>,
    notes: mpsc::UnboundedSender<Note>,
) -> Result<(), RuntimeError> {
    handle.ready().await?;
    let per = train.len().div_ceil(cfg.workers);
    let mine = (index * per).min(train.len())..((index + 1) * per).min(train.len());
    let batch = cfg.batch.max(1);
    let everything =
        RangeList::new(vec![KeyRange::new(0, MAX_KEY).map_err(config)?]).map_err(config)?;
    // Every worker takes the same number of steps per epoch, even with a shorter shard, so
    // that nobody waits at a consistency bound for a worker that has stopped advancing.
    let steps = per.div_ceil(batch);
    for epoch in 1..=cfg.epochs {
        let mut loss = 0.0;
        for step in 0..steps {
            let from = (mine.start + step * batch).min(mine.end);
            let rows = from..(from + batch).min(mine.end);
            if rows.is_empty() {
                handle.advance().await?;
                continue;
            }
            let keys = batch_keys(&train, rows.clone());
            let list = KeyList::new(keys.clone()).map_err(config)?;
            let pulled = handle.pull(KeySelection::Keys(list)).await?;
            let (grad, l) = gradient(&train, rows, &keys, pulled.values());
            loss += l;
            let kvs = KvPairs::new(keys, grad, 1).map_err(config)?;
            // Not waiting for the acknowledgement: the consistency model bounds how far ahead
            // of its acknowledged pushes the worker may run.
            drop(handle.start_push(kvs).await?);
            handle.advance().await?;
        }
        let _ = notes.send(Note::Loss {
            epoch,
            loss,
            rows: mine.len(),
        });
        if index == 0 {
            let model = handle
                .pull(KeySelection::Ranges(everything.clone()))
                .await?;
            let (test_logloss, test_auc) = evaluate(&model, &test);
            let nnz = model.values().iter().filter(|w| **w != 0.0).count();
            let _ = notes.send(Note::Model {
                epoch,
                test_logloss,
                test_auc,
                nnz,
            });
        }
    }
    Ok(())
}

fn config(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(e.to_string())
}

/// Trains on `train` in one process over the in-memory transport, measuring on `test` after
/// every epoch; `on_epoch` sees each report as it is made.
pub async fn train_local(
    cfg: &LrConfig,
    train: Examples,
    test: Examples,
    mut on_epoch: impl FnMut(&EpochReport),
) -> Result<Vec<EpochReport>, RuntimeError> {
    let began = Instant::now();
    let mut spec = ClusterSpec::new(cfg.servers, cfg.workers);
    spec.consistency = cfg.consistency;
    spec.updater = cfg.updater;
    // Held pulls wait for the slowest worker; never declare a busy worker dead for that.
    spec.timing.heartbeat_timeout = Duration::from_secs(60).as_nanos() as u64;
    let cluster: LocalCluster<f32> = LocalCluster::start(&spec, &MemNetwork::reliable())?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (train, test) = (std::sync::Arc::new(train), std::sync::Arc::new(test));
    let tasks: Vec<_> = cluster
        .workers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            tokio::spawn(run_worker(
                i,
                cfg.clone(),
                h.clone(),
                train.clone(),
                test.clone(),
                tx.clone(),
            ))
        })
        .collect();
    drop(tx);
    let mut losses: Vec<(f64, usize, usize)> = vec![(0.0, 0, 0); cfg.epochs as usize + 1];
    let mut models = vec![None; cfg.epochs as usize + 1];
    let mut reports = Vec::new();
    let mut next = 1;
    while let Some(note) = rx.recv().await {
        match note {
            Note::Loss { epoch, loss, rows } => {
                let slot = &mut losses[epoch as usize];
                slot.0 += loss;
                slot.1 += rows;
                slot.2 += 1;
            }
            Note::Model {
                epoch,
                test_logloss,
                test_auc,
                nnz,
            } => models[epoch as usize] = Some((test_logloss, test_auc, nnz)),
        }
        while next <= cfg.epochs {
            let (loss, rows, workers) = losses[next as usize];
            let Some((test_logloss, test_auc, nnz)) = models[next as usize] else {
                break;
            };
            if workers < cfg.workers {
                break;
            }
            let report = EpochReport {
                epoch: next,
                train_logloss: loss / rows.max(1) as f64,
                test_logloss,
                test_auc,
                nnz,
                secs: began.elapsed().as_secs_f64(),
            };
            on_epoch(&report);
            reports.push(report);
            next += 1;
        }
    }
    for t in tasks {
        t.await.map_err(|_| RuntimeError::ShutDown)??;
    }
    cluster.shutdown().await?;
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_is_exact_and_handles_ties() {
        assert_eq!(auc(&[0.1, 0.9], &[0.0, 1.0]), 1.0);
        assert_eq!(auc(&[0.9, 0.1], &[0.0, 1.0]), 0.0);
        assert_eq!(auc(&[0.5, 0.5], &[0.0, 1.0]), 0.5);
        // 2 positives, 2 negatives: pairs (p, n) ordered right in 3 of 4.
        assert_eq!(auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]), 0.75);
    }
}
