//! Matrix factorization by SGD on (user, item, rating) triples: user and item factors are
//! keys of width `rank` on the servers, which apply plain SGD; workers pull the factors their
//! minibatch touches, compute the gradient of the squared error and push it.
//!
//! Factors start at a small seeded random point that every node derives from the key
//! (`initial`), added to what the servers hold, which start at zero: no node has to write the
//! initial model before training begins.

use crate::seeded::{mix, unit};
use std::time::Instant;

use pserver_core::{Consistency, Key, KeyList, KeySelection, KvPairs, Updater};
use pserver_transport::mem::MemNetwork;
use pserver_transport::runtime::{ClusterSpec, LocalCluster, RuntimeError};

/// The first item key: users are keys `0..users`, items `ITEM_BASE + i`.
const ITEM_BASE: Key = 1 << 40;

/// A generated problem and how to train on it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MfConfig {
    /// Servers.
    pub servers: usize,
    /// Workers.
    pub workers: usize,
    /// The consistency model.
    pub consistency: Consistency,
    /// Users.
    pub users: u64,
    /// Items.
    pub items: u64,
    /// Rank of the true matrix and of the model.
    pub rank: usize,
    /// Training ratings.
    pub ratings: usize,
    /// Standard deviation of the noise added to every rating: the best test RMSE possible.
    pub noise: f64,
    /// Passes over the training ratings.
    pub epochs: u32,
    /// Ratings per minibatch on each worker.
    pub batch: usize,
    /// SGD learning rate.
    pub lr: f64,
    /// L2 regularization of the factors.
    pub l2: f64,
    /// Seed of the problem and of the initial factors.
    pub seed: u64,
}

impl Default for MfConfig {
    fn default() -> Self {
        MfConfig {
            servers: 2,
            workers: 2,
            consistency: Consistency::BoundedDelay(2),
            users: 300,
            items: 300,
            rank: 4,
            ratings: 40_000,
            noise: 0.5,
            epochs: 8,
            batch: 200,
            lr: 0.05,
            l2: 0.01,
            seed: 0,
        }
    }
}

/// One epoch's result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MfReport {
    /// Epochs done, from 1.
    pub epoch: u32,
    /// Root mean squared error on held-out ratings.
    pub test_rmse: f64,
    /// Seconds since training began.
    pub secs: f64,
}

/// A standard normal draw from two hashed words (Box-Muller).
fn normal(seed: u64, a: u64, b: u64) -> f64 {
    let u1 = unit(mix(seed ^ mix(a) ^ b.rotate_left(17)));
    let u2 = unit(mix(seed ^ mix(b) ^ a.rotate_left(29)));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The seeded starting point of factor `j` of `key`.
fn initial(cfg: &MfConfig, key: Key, j: usize) -> f64 {
    0.1 * normal(cfg.seed ^ 0x1111, key, j as u64)
}

/// The true factor `j` of `key`, scaled so that a rating's signal has variance about 1.
fn truth(cfg: &MfConfig, key: Key, j: usize) -> f64 {
    normal(cfg.seed ^ 0x2222, key, j as u64) / (cfg.rank as f64).sqrt().sqrt()
}

/// `n` ratings from the true low-rank matrix plus noise: (user key, item key, rating).
pub fn generate(cfg: &MfConfig, n: usize, stream: u64) -> Vec<(Key, Key, f32)> {
    (0..n as u64)
        .map(|t| {
            let r = mix(cfg.seed ^ stream.wrapping_mul(0x51ed) ^ t);
            let user = r % cfg.users;
            let item = ITEM_BASE + (r >> 32) % cfg.items;
            let signal: f64 = (0..cfg.rank)
                .map(|j| truth(cfg, user, j) * truth(cfg, item, j))
                .sum();
            let rating = signal + cfg.noise * normal(cfg.seed ^ 0x3333, stream, t);
            (user, item, rating as f32)
        })
        .collect()
}

/// Factors of `key` in `pulled` (aligned with `keys`) plus their starting point.
/// Writes into `out` (reused between calls, so the hot loop does not allocate).
fn factors(cfg: &MfConfig, keys: &[Key], pulled: &[f32], key: Key, out: &mut Vec<f64>) {
    let pos = keys.binary_search(&key).unwrap_or(0);
    out.clear();
    out.extend((0..cfg.rank).map(|j| f64::from(pulled[pos * cfg.rank + j]) + initial(cfg, key, j)));
}

fn rmse(cfg: &MfConfig, keys: &[Key], pulled: &[f32], ratings: &[(Key, Key, f32)]) -> f64 {
    let (mut pu, mut qi) = (Vec::new(), Vec::new());
    let sum: f64 = ratings
        .iter()
        .map(|&(u, i, r)| {
            factors(cfg, keys, pulled, u, &mut pu);
            factors(cfg, keys, pulled, i, &mut qi);
            let e = pu.iter().zip(&qi).map(|(a, b)| a * b).sum::<f64>() - f64::from(r);
            e * e
        })
        .sum();
    (sum / ratings.len().max(1) as f64).sqrt()
}

fn sorted_keys(ratings: &[(Key, Key, f32)]) -> Vec<Key> {
    let mut keys: Vec<Key> = ratings.iter().flat_map(|&(u, i, _)| [u, i]).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

fn config(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(e.to_string())
}

/// Trains on generated ratings in one process and reports the test RMSE after every epoch.
pub async fn train(cfg: &MfConfig) -> Result<Vec<MfReport>, RuntimeError> {
    let began = Instant::now();
    let train_set = std::sync::Arc::new(generate(cfg, cfg.ratings, 1));
    let test_set = generate(cfg, cfg.ratings / 10, 2);
    let mut spec = ClusterSpec::new(cfg.servers, cfg.workers);
    spec.job.consistency = cfg.consistency;
    spec.job.width = cfg.rank;
    spec.job.updater = Updater::Sgd { lr: cfg.lr };
    let cluster: LocalCluster<f32> = LocalCluster::start(&spec, &MemNetwork::reliable())?;
    let per = train_set.len().div_ceil(cfg.workers);
    let steps = per.div_ceil(cfg.batch.max(1));
    let test_keys = sorted_keys(&test_set);
    let mut reports = Vec::new();
    for epoch in 1..=cfg.epochs {
        let mut tasks = Vec::new();
        for (w, handle) in cluster.workers.iter().enumerate() {
            let (handle, data, cfg) = (handle.clone(), train_set.clone(), *cfg);
            tasks.push(tokio::spawn(async move {
                handle.ready().await?;
                let mine = &data[(w * per).min(data.len())..((w + 1) * per).min(data.len())];
                for step in 0..steps {
                    let from = (step * cfg.batch).min(mine.len());
                    let batch = &mine[from..(from + cfg.batch).min(mine.len())];
                    if batch.is_empty() {
                        handle.advance().await?;
                        continue;
                    }
                    let keys = sorted_keys(batch);
                    let list = KeyList::new(keys.clone()).map_err(config)?;
                    let pulled = handle.pull(KeySelection::Keys(list)).await?;
                    let mut grad = vec![0f32; keys.len() * cfg.rank];
                    let (mut pu, mut qi) = (Vec::new(), Vec::new());
                    for &(u, i, r) in batch {
                        factors(&cfg, &keys, pulled.values(), u, &mut pu);
                        factors(&cfg, &keys, pulled.values(), i, &mut qi);
                        let e = pu.iter().zip(&qi).map(|(a, b)| a * b).sum::<f64>() - f64::from(r);
                        let (a, b) = (
                            keys.binary_search(&u).unwrap_or(0) * cfg.rank,
                            keys.binary_search(&i).unwrap_or(0) * cfg.rank,
                        );
                        for j in 0..cfg.rank {
                            grad[a + j] += (e * qi[j] + cfg.l2 * pu[j]) as f32;
                            grad[b + j] += (e * pu[j] + cfg.l2 * qi[j]) as f32;
                        }
                    }
                    let kvs = KvPairs::new(keys, grad, cfg.rank).map_err(config)?;
                    drop(handle.start_push(kvs).await?);
                    handle.advance().await?;
                }
                Ok::<(), RuntimeError>(())
            }));
        }
        for t in tasks {
            t.await.map_err(|_| RuntimeError::ShutDown)??;
        }
        let list = KeyList::new(test_keys.clone()).map_err(config)?;
        let pulled = cluster.workers[0].pull(KeySelection::Keys(list)).await?;
        reports.push(MfReport {
            epoch,
            test_rmse: rmse(cfg, &test_keys, pulled.values(), &test_set),
            secs: began.elapsed().as_secs_f64(),
        });
    }
    cluster.shutdown().await?;
    Ok(reports)
}
