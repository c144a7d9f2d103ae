//! Matrix factorization by SGD on (user, item, rating) triples, the standard biased model:
//! each user and item is a key of width `rank + 1` on the servers, its factors and then its
//! bias, which the servers update by plain SGD; workers pull the rows their minibatch touches,
//! compute the gradient of the squared error (with L2 on factors and biases) and push it.
//!
//! A rating is predicted as the training ratings' mean, plus the user's and the item's biases,
//! plus the dot product of their factors, so the factors learn what sets a rating apart from
//! the mean and from how its user rates and its item is rated: ratings of 1 to 5 are far from
//! the zero that small factors predict, and a lenient user or a popular item is a bias, not a
//! factor.
//!
//! Factors start at a small seeded random point that every node derives from the key
//! (`initial`), added to what the servers hold, which start at zero: no node has to write the
//! initial model before training begins.

use crate::apps::mf_file::MfModelFile;
use crate::data::ratings::{Ids, Rating, read, split};
use crate::seeded::{mix, unit};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use pserver_core::store::StoreLayout;
use pserver_core::{Consistency, JobSpec, Key, KeyList, KeySelection, KvPairs, Updater};
use pserver_runtime::{ClusterSpec, LocalCluster, RuntimeError, WorkerHandle};
use pserver_transport::mem::MemNetwork;

/// The key of user number `user`: users and items take turns, so that the keys of a problem
/// are the dense range `[0, 2 * max(users, items))`, which the ring spreads over every server.
pub(crate) fn user_key(user: u32) -> Key {
    2 * Key::from(user)
}

/// The key of item number `item`.
pub(crate) fn item_key(item: u32) -> Key {
    2 * Key::from(item) + 1
}

/// How to train.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct MfConfig {
    /// Servers.
    pub servers: usize,
    /// Workers.
    pub workers: usize,
    /// The consistency model.
    pub consistency: Consistency,
    /// Factors per user and per item: the rank of the model.
    pub rank: usize,
    /// Passes over the training ratings.
    pub epochs: u32,
    /// Ratings per minibatch on each worker.
    pub batch: usize,
    /// SGD learning rate.
    pub lr: f64,
    /// L2 regularization of the factors, per rating.
    pub l2: f64,
    /// Seed of the initial factors and of the order in which workers visit their ratings.
    pub seed: u64,
    /// Stop after this many epochs in a row without a lower validation RMSE.
    pub early_stop: Option<u32>,
    /// End with the epoch of the lowest validation RMSE (where there are validation
    /// ratings), not the last.
    pub keep_best: bool,
}

impl Default for MfConfig {
    fn default() -> Self {
        MfConfig {
            servers: 2,
            workers: 2,
            consistency: Consistency::BoundedDelay(2),
            rank: 4,
            epochs: 8,
            batch: 200,
            lr: 0.05,
            l2: 0.01,
            seed: 0,
            early_stop: None,
            keep_best: true,
        }
    }
}

/// Training and test ratings, users and items numbered as [`crate::data::ratings::Ids`]
/// numbers them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct MfData {
    /// What the workers train on.
    pub train: Vec<Rating>,
    /// What the model is measured on after every epoch.
    pub test: Vec<Rating>,
    /// Ratings held out of `train` that choose the epoch kept and when to stop early, so
    /// that the test ratings choose neither (none by default).
    pub validation: Vec<Rating>,
    /// The ids the ratings files gave the users and items, by number (none for a generated
    /// problem, whose numbers are its ids).
    pub ids: Ids,
    /// The mean predictions are made around, where it is not the training ratings' own: a
    /// saved model's, for a run that starts from it, whose biases were learnt around it.
    pub center: Option<f64>,
}

impl MfData {
    /// The mean of the training ratings (0 without any), or [`MfData::center`]: what the
    /// model predicts before it learns anything.
    pub(crate) fn mean(&self) -> f64 {
        if let Some(center) = self.center {
            return center;
        }
        let sum: f64 = self.train.iter().map(|r| f64::from(r.value)).sum();
        sum / self.train.len().max(1) as f64
    }

    /// The test RMSE of predicting the training mean for every rating: what training must
    /// beat.
    pub(crate) fn baseline_rmse(&self) -> f64 {
        let mean = self.mean();
        rms(
            self.test.iter().map(|r| f64::from(r.value) - mean),
            self.test.len(),
        )
    }

    /// Distinct users in the training and test ratings.
    pub(crate) fn users(&self) -> usize {
        distinct(self.all().map(|r| r.user))
    }

    /// Distinct items in the training and test ratings.
    pub(crate) fn items(&self) -> usize {
        distinct(self.all().map(|r| r.item))
    }

    /// Test ratings whose user or item has no training rating: the model predicts them from
    /// factors that kept their seeded starting point.
    pub(crate) fn unseen(&self) -> usize {
        let seen = |numbers: &mut dyn Iterator<Item = u32>| {
            let mut seen = Vec::new();
            for n in numbers {
                let n = n as usize;
                if seen.len() <= n {
                    seen.resize(n + 1, false);
                }
                seen[n] = true;
            }
            seen
        };
        let users = seen(&mut self.train.iter().map(|r| r.user));
        let items = seen(&mut self.train.iter().map(|r| r.item));
        let known = |seen: &[bool], n: u32| seen.get(n as usize).copied().unwrap_or(false);
        self.test
            .iter()
            .filter(|r| !known(&users, r.user) || !known(&items, r.item))
            .count()
    }

    fn all(&self) -> impl Iterator<Item = &Rating> {
        self.train.iter().chain(&self.test).chain(&self.validation)
    }

    /// Moves a seeded `fraction` of the training ratings to [`MfData::validation`]; an error
    /// when that leaves none to train on or none held out.
    pub(crate) fn hold_out_validation(&mut self, fraction: f64, seed: u64) -> Result<(), String> {
        // Another stream of the seed than the test split's, which drew from the same file.
        let (train, held) = crate::data::ratings::split(&self.train, fraction, seed ^ 0x7a11_da7e);
        if train.is_empty() || held.is_empty() {
            return Err(format!(
                "holding out --validation-fraction {fraction} of the {} training ratings leaves none to {}: give more ratings or another fraction",
                self.train.len(),
                if train.is_empty() {
                    "train on"
                } else {
                    "validate on"
                }
            ));
        }
        self.train = train;
        self.validation = held;
        Ok(())
    }
}

fn distinct(numbers: impl Iterator<Item = u32>) -> usize {
    let mut numbers: Vec<u32> = numbers.collect();
    numbers.sort_unstable();
    numbers.dedup();
    numbers.len()
}

/// A generated problem: a low-rank matrix plus Gaussian noise, sampled uniformly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Generated {
    /// Users.
    pub users: u32,
    /// Items.
    pub items: u32,
    /// Rank of the true matrix.
    pub rank: usize,
    /// Training ratings; a tenth as many more are drawn for testing.
    pub ratings: usize,
    /// Standard deviation of the noise added to every rating: the best test RMSE possible.
    pub noise: f64,
    /// Standard deviation of the users' and the items' true biases (0: none).
    pub biases: f64,
    /// Seed of the true factors, the sample and the noise.
    pub seed: u64,
}

impl Default for Generated {
    fn default() -> Self {
        Generated {
            users: 300,
            items: 300,
            rank: 4,
            ratings: 40_000,
            noise: 0.5,
            biases: 0.0,
            seed: 0,
        }
    }
}

impl Generated {
    /// `n` ratings from the true low-rank matrix plus noise; another `stream` draws other
    /// ratings of the same matrix.
    pub(crate) fn generate(&self, n: usize, stream: u64) -> Vec<Rating> {
        (0..n as u64)
            .map(|t| {
                let r = mix(self.seed ^ stream.wrapping_mul(0x51ed) ^ t);
                let user = (r % u64::from(self.users.max(1))) as u32;
                let item = ((r >> 32) % u64::from(self.items.max(1))) as u32;
                let signal: f64 = (0..self.rank)
                    .map(|j| self.truth(user_key(user), j) * self.truth(item_key(item), j))
                    .sum();
                let bias = self.bias(user_key(user)) + self.bias(item_key(item));
                let value = signal + bias + self.noise * normal(self.seed ^ 0x3333, stream, t);
                Rating {
                    user,
                    item,
                    value: value as f32,
                }
            })
            .collect()
    }

    /// The training ratings and a tenth as many test ratings, drawn apart.
    pub(crate) fn data(&self) -> MfData {
        MfData {
            train: self.generate(self.ratings, 1),
            test: self.generate(self.ratings / 10, 2),
            validation: Vec::new(),
            ids: Ids::new(),
            center: None,
        }
    }

    /// The true bias of `key`.
    pub(crate) fn bias(&self, key: Key) -> f64 {
        self.biases * normal(self.seed ^ 0x4444, key, 0)
    }

    /// The true factor `j` of `key`, scaled so that a rating's signal has variance about 1.
    fn truth(&self, key: Key, j: usize) -> f64 {
        normal(self.seed ^ 0x2222, key, j as u64) / (self.rank as f64).sqrt().sqrt()
    }
}

/// One epoch's result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct MfReport {
    /// Epochs done, from 1.
    pub epoch: u32,
    /// Root mean squared error on the training ratings, after the epoch.
    pub train_rmse: f64,
    /// Root mean squared error on the test ratings.
    pub test_rmse: f64,
    /// Test RMSE of predicting the training mean: [`MfData::baseline_rmse`].
    pub baseline_rmse: f64,
    /// With validation ratings: their RMSE.
    pub validation_rmse: Option<f64>,
    /// Seconds since training began.
    pub secs: f64,
    /// Training ratings per second in this epoch's training, without measuring the model.
    pub rows_per_sec: f64,
}

/// A standard normal draw from two hashed words (Box-Muller).
fn normal(seed: u64, a: u64, b: u64) -> f64 {
    let u1 = unit(mix(seed ^ mix(a) ^ b.rotate_left(17)));
    let u2 = unit(mix(seed ^ mix(b) ^ a.rotate_left(29)));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Values per key: the factors, then the bias.
fn width(rank: usize) -> usize {
    rank + 1
}

/// The seeded starting point of value `j` of `key`: small random factors, a bias of 0.
fn initial(cfg: &MfConfig, key: Key, j: usize) -> f64 {
    if j == cfg.rank {
        return 0.0;
    }
    0.1 * normal(cfg.seed ^ 0x1111, key, j as u64)
}

/// The rows of `keys` (sorted): what the servers hold, `pulled`, plus the starting point,
/// `rank` factors and a bias per key.
fn model(cfg: &MfConfig, keys: &[Key], pulled: &[f32]) -> Vec<f64> {
    let w = width(cfg.rank);
    let mut out = Vec::with_capacity(pulled.len());
    for (k, &key) in keys.iter().enumerate() {
        let row = &pulled[k * w..(k + 1) * w];
        out.extend(
            row.iter()
                .enumerate()
                .map(|(j, &v)| f64::from(v) + initial(cfg, key, j)),
        );
    }
    out
}

/// Where the row of `key` starts in a model of `keys` (sorted, holding `key`).
fn offset(keys: &[Key], key: Key, rank: usize) -> usize {
    keys.binary_search(&key).unwrap_or(0) * width(rank)
}

/// The prediction error on `r` of the model `factors` of `keys`, with the offsets of its
/// user's and its item's rows (each `rank` factors, then the bias).
fn error(keys: &[Key], factors: &[f64], rank: usize, mean: f64, r: &Rating) -> (f64, usize, usize) {
    let a = offset(keys, user_key(r.user), rank);
    let b = offset(keys, item_key(r.item), rank);
    let dot: f64 = factors[a..a + rank]
        .iter()
        .zip(&factors[b..b + rank])
        .map(|(p, q)| p * q)
        .sum();
    let biases = factors[a + rank] + factors[b + rank];
    (mean + biases + dot - f64::from(r.value), a, b)
}

fn rms(errors: impl Iterator<Item = f64>, n: usize) -> f64 {
    (errors.map(|e| e * e).sum::<f64>() / n.max(1) as f64).sqrt()
}

fn sorted_keys<'a>(ratings: impl Iterator<Item = &'a Rating>) -> Vec<Key> {
    let mut keys: Vec<Key> = ratings
        .flat_map(|r| [user_key(r.user), item_key(r.item)])
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The order in which a worker visits the `n` ratings of its share in `epoch`: a seeded
/// permutation, so that files sorted by user or by time do not feed one user's ratings in a
/// row.
fn visit_order(seed: u64, worker: usize, epoch: u32, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    crate::seeded::shuffle(
        &mut order,
        mix(seed ^ mix(worker as u64) ^ mix(u64::from(epoch) << 32)),
    );
    order
}

/// Pushes a worker keeps unawaited before it waits for the oldest: enough that it never waits
/// for one under bounded delay, while the last ones are awaited before the model is measured.
const PUSHES_IN_FLIGHT: usize = 8;

fn config(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(e.to_string())
}

/// The ratings of `data`, and the test ratings of `test` or else `fraction` of `data` held
/// out by `seed`; users and items numbered alike in both. Errors are one line naming the
/// file, or `fraction_name` when the split leaves nothing to train or test on.
pub(crate) fn load(
    data: &std::path::Path,
    test: Option<&std::path::Path>,
    fraction: f64,
    seed: u64,
    fraction_name: &str,
) -> Result<MfData, String> {
    let mut ids = Ids::new();
    let ratings = read(data, &mut ids).map_err(|e| e.to_string())?;
    let (train, test) = match test {
        Some(test) => (ratings, read(test, &mut ids).map_err(|e| e.to_string())?),
        None => {
            let (train, test) = split(&ratings, fraction, seed);
            let left_without = if train.is_empty() {
                Some("train")
            } else if test.is_empty() {
                Some("test")
            } else {
                None
            };
            if let Some(what) = left_without {
                return Err(format!(
                    "{}: holding out {fraction_name} {fraction} of its {} ratings leaves none to {what} on: give more ratings, another fraction or test ratings",
                    data.display(),
                    ratings.len()
                ));
            }
            (train, test)
        }
    };
    Ok(MfData {
        train,
        test,
        validation: Vec::new(),
        ids,
        center: None,
    })
}

/// The job every node of a factorization runs: rows of `rank` factors and a bias, scattered
/// over the key space (a batch's users and items are), plain SGD on the servers.
pub(crate) fn job_of(cfg: &MfConfig, job: &mut JobSpec) {
    job.consistency = cfg.consistency;
    job.width = width(cfg.rank);
    job.store = StoreLayout::Hashed;
    job.updater = Updater::Sgd { lr: cfg.lr };
}

/// Every key of `data` lies below this: the ring is spread over `0..keys_below(data)`.
pub(crate) fn keys_below(data: &MfData) -> Key {
    let top = data.all().map(|r| r.user.max(r.item)).max().unwrap_or(0);
    item_key(top) + 1
}

/// How one epoch of training is cut: every worker's share of the training ratings, and the
/// steps each takes per share.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shares {
    /// Ratings per share (the last may hold fewer).
    pub per: usize,
    /// Steps per share and epoch: `ceil(per / batch)`.
    pub steps: usize,
}

impl Shares {
    /// `workers` shares of `data`'s training ratings, in minibatches of `cfg.batch`.
    pub(crate) fn of(data: &MfData, workers: usize, cfg: &MfConfig) -> Shares {
        let per = data.train.len().div_ceil(workers.max(1));
        Shares {
            per,
            steps: per.div_ceil(cfg.batch.max(1)),
        }
    }

    /// The training ratings of share `share`.
    pub(crate) fn ratings<'a>(&self, data: &'a MfData, share: usize) -> &'a [Rating] {
        let n = data.train.len();
        &data.train[(share * self.per).min(n)..((share + 1) * self.per).min(n)]
    }
}

/// Trains on every rating of share `share` once, in an order drawn from the seed, the share
/// and the epoch, in `shares.steps` steps (advancing without a batch once the share runs
/// out, so that every share takes as many steps); returns once every push is acknowledged.
pub(crate) async fn train_share(
    handle: &WorkerHandle<f32>,
    cfg: &MfConfig,
    data: &MfData,
    shares: Shares,
    share: usize,
    epoch: u32,
) -> Result<(), RuntimeError> {
    let mean = data.mean();
    let ratings = shares.ratings(data, share);
    let order = visit_order(cfg.seed, share, epoch, ratings.len());
    let mut pushes = VecDeque::new();
    for step in 0..shares.steps {
        let from = (step * cfg.batch).min(order.len());
        let batch = &order[from..(from + cfg.batch).min(order.len())];
        if batch.is_empty() {
            handle.advance().await?;
            continue;
        }
        let keys = sorted_keys(batch.iter().map(|&i| &ratings[i]));
        let list = KeyList::new(keys.clone()).map_err(config)?;
        let pulled = handle.pull(KeySelection::Keys(list)).await?;
        let factors = model(cfg, &keys, pulled.values());
        let w = width(cfg.rank);
        let mut grad = vec![0f32; keys.len() * w];
        let mut counts = vec![0u32; keys.len()];
        for &i in batch {
            let (e, a, b) = error(&keys, &factors, cfg.rank, mean, &ratings[i]);
            counts[a / w] += 1;
            counts[b / w] += 1;
            for j in 0..cfg.rank {
                let (p, q) = (factors[a + j], factors[b + j]);
                grad[a + j] += (e * q + cfg.l2 * p) as f32;
                grad[b + j] += (e * p + cfg.l2 * q) as f32;
            }
            let (bu, bi) = (factors[a + cfg.rank], factors[b + cfg.rank]);
            grad[a + cfg.rank] += (e + cfg.l2 * bu) as f32;
            grad[b + cfg.rank] += (e + cfg.l2 * bi) as f32;
        }
        // Each row's step is the mean over the batch's ratings of its user or item: a user
        // rated once steps as for that rating alone, however large the batch, and a popular
        // item's many ratings are one step, not one each on the same stale factors (which
        // diverged with four workers at the default rate).
        for (row, &n) in grad.chunks_exact_mut(w).zip(&counts) {
            if n > 1 {
                row.iter_mut().for_each(|g| *g /= n as f32);
            }
        }
        let kvs = KvPairs::new(keys, grad, w).map_err(config)?;
        pushes.push_back(handle.start_push(kvs).await?);
        if pushes.len() > PUSHES_IN_FLIGHT
            && let Some(oldest) = pushes.pop_front()
        {
            oldest.await?;
        }
        handle.advance().await?;
    }
    // The model may be measured next: it should hold every push of the epoch.
    for push in pushes {
        push.await?;
    }
    Ok(())
}

/// The model the servers hold now, for every user and item of `data`.
pub(crate) struct Model {
    keys: Vec<Key>,
    rows: Vec<f64>,
    rank: usize,
}

impl Model {
    /// Pulls the rows of every user and item of `data`.
    pub(crate) async fn pull(
        handle: &WorkerHandle<f32>,
        cfg: &MfConfig,
        data: &MfData,
    ) -> Result<Model, RuntimeError> {
        let (keys, pulled) = pull_rows(handle, data).await?;
        let rows = model(cfg, &keys, pulled.values());
        Ok(Model {
            keys,
            rows,
            rank: cfg.rank,
        })
    }

    /// The root mean squared error of the model on `ratings`, around `mean`.
    fn rmse(&self, ratings: &[Rating], mean: f64) -> f64 {
        rms(
            ratings
                .iter()
                .map(|r| error(&self.keys, &self.rows, self.rank, mean, r).0),
            ratings.len(),
        )
    }

    /// The model as saved: every user's and item's row under the id `ids` gave it (its
    /// number, for a generated problem), around the training mean `mean`.
    pub(crate) fn file(&self, ids: &Ids, mean: f64) -> MfModelFile {
        let (user_names, item_names) = (ids.user_names(), ids.item_names());
        let name = |names: &[Box<str>], n: u64| -> Box<str> {
            usize::try_from(n)
                .ok()
                .and_then(|n| names.get(n).cloned())
                .unwrap_or_else(|| n.to_string().into())
        };
        let w = width(self.rank);
        let mut file = MfModelFile {
            rank: self.rank,
            mean,
            ..MfModelFile::default()
        };
        for (at, &key) in self.keys.iter().enumerate() {
            let row: Vec<f32> = self.rows[at * w..(at + 1) * w]
                .iter()
                .map(|&v| v as f32)
                .collect();
            if key % 2 == 0 {
                file.users.push((name(&user_names, key / 2), row));
            } else {
                file.items.push((name(&item_names, key / 2), row));
            }
        }
        file
    }

    /// The bias learnt for `key`, if the model holds it.
    #[cfg(test)]
    pub(crate) fn bias(&self, key: Key) -> Option<f64> {
        let at = self.keys.binary_search(&key).ok()?;
        Some(self.rows[at * width(self.rank) + self.rank])
    }
}

/// The rows the servers start from to go on from `model` (a warm start), for the users and
/// items of `ids` it holds: the model's values less the seeded starting point the workers add
/// ([`Model::pull`]), so that the model the workers see is the saved one. Users and items the
/// model does not hold start from zero, as in a run without it.
pub(crate) fn initial_rows(
    cfg: &MfConfig,
    model: &MfModelFile,
    ids: &Ids,
) -> Result<KvPairs<f64>, String> {
    if model.rank != cfg.rank {
        return Err(format!(
            "the model has rank {}, but the run's is {}: give --rank {}",
            model.rank, cfg.rank, model.rank
        ));
    }
    let w = width(cfg.rank);
    let mut rows: Vec<(Key, &[f32])> = Vec::new();
    for (id, row) in &model.users {
        if let Some(n) = ids.user(id) {
            rows.push((user_key(n), row));
        }
    }
    for (id, row) in &model.items {
        if let Some(n) = ids.item(id) {
            rows.push((item_key(n), row));
        }
    }
    if rows.is_empty() {
        return Err(
            "none of its users and items is in the ratings: there is nothing to start from".into(),
        );
    }
    rows.sort_unstable_by_key(|&(key, _)| key);
    let keys: Vec<Key> = rows.iter().map(|&(key, _)| key).collect();
    let values: Vec<f64> = rows
        .iter()
        .flat_map(|&(key, row)| {
            row.iter()
                .enumerate()
                .map(move |(j, &v)| f64::from(v) - initial(cfg, key, j))
        })
        .collect();
    KvPairs::new(keys, values, w).map_err(|e| e.to_string())
}

/// The training and test RMSE of the model the servers hold now.
pub(crate) async fn measure(
    handle: &WorkerHandle<f32>,
    cfg: &MfConfig,
    data: &MfData,
) -> Result<(f64, f64), RuntimeError> {
    let mean = data.mean();
    let model = Model::pull(handle, cfg, data).await?;
    Ok((model.rmse(&data.train, mean), model.rmse(&data.test, mean)))
}

/// [`train_model`] from zero, for the tests: every epoch's result.
#[cfg(test)]
pub(crate) async fn train(
    cfg: &MfConfig,
    data: MfData,
    on_epoch: impl FnMut(&MfReport),
) -> Result<Vec<MfReport>, RuntimeError> {
    Ok(train_model(cfg, data, Start::default(), on_epoch).await?.0)
}

/// Where a run starts: from zero at epoch 1 by default.
#[derive(Clone, Debug, Default)]
pub(crate) struct Start {
    /// Rows the servers start from ([`initial_rows`], or a checkpoint's).
    pub initial: Option<Arc<KvPairs<f64>>>,
    /// Epochs already trained (a checkpoint's): the run trains the epochs after them.
    pub done: u32,
    /// Where to write a checkpoint after every epoch.
    pub checkpoints: Option<pserver_runtime::checkpoint::CheckpointDir>,
}

/// Magic bytes of a factorization checkpoint's payload.
const ROWS_MAGIC: &[u8; 8] = b"PSMFrows";

/// The servers' rows of every user and item of `data` as they hold them now, as a
/// checkpoint's payload: the magic, the rank, the count, then each key and its values. With
/// plain SGD on the servers the rows are all their state, so a run started from them goes on
/// exactly where this one is.
async fn checkpoint_payload(
    handle: &WorkerHandle<f32>,
    cfg: &MfConfig,
    data: &MfData,
) -> Result<Vec<u8>, RuntimeError> {
    let (keys, pulled) = pull_rows(handle, data).await?;
    let w = width(cfg.rank);
    let mut bytes = Vec::with_capacity(20 + keys.len() * (8 + 4 * w));
    bytes.extend_from_slice(ROWS_MAGIC);
    bytes.extend_from_slice(&(cfg.rank as u32).to_le_bytes());
    bytes.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for (k, &key) in keys.iter().enumerate() {
        bytes.extend_from_slice(&key.to_le_bytes());
        for v in &pulled.values()[k * w..(k + 1) * w] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok(bytes)
}

/// The keys of every user and item of `data`, sorted, and the rows the servers hold for them.
async fn pull_rows(
    handle: &WorkerHandle<f32>,
    data: &MfData,
) -> Result<(Vec<Key>, KvPairs<f32>), RuntimeError> {
    let keys = sorted_keys(data.all());
    let list = KeyList::new(keys.clone()).map_err(config)?;
    let pulled = handle.pull(KeySelection::Keys(list)).await?;
    Ok((keys, pulled))
}

/// The rows a checkpoint's payload holds, for a run of `cfg`'s rank.
pub(crate) fn checkpoint_rows(cfg: &MfConfig, payload: &[u8]) -> Result<KvPairs<f64>, String> {
    let rest = payload
        .strip_prefix(ROWS_MAGIC.as_slice())
        .ok_or("not a factorization checkpoint")?;
    let (rank, rest) = rest.split_at_checked(4).ok_or("too short")?;
    let rank = u32::from_le_bytes([rank[0], rank[1], rank[2], rank[3]]) as usize;
    if rank != cfg.rank {
        return Err(format!(
            "its rows have rank {rank}, but the run's is {}: give --rank {rank}",
            cfg.rank
        ));
    }
    let (count, rows) = rest.split_at_checked(8).ok_or("too short")?;
    let mut n = [0u8; 8];
    n.copy_from_slice(count);
    let w = width(rank);
    let row = 8 + 4 * w;
    if Some(rows.len() as u64) != u64::from_le_bytes(n).checked_mul(row as u64) {
        return Err("its length does not match its row count".into());
    }
    let mut keys = Vec::with_capacity(rows.len() / row);
    let mut values = Vec::with_capacity(rows.len() / row * w);
    for chunk in rows.chunks_exact(row) {
        let (key, vals) = chunk.split_at(8);
        let mut k = [0u8; 8];
        k.copy_from_slice(key);
        keys.push(u64::from_le_bytes(k));
        values.extend(
            vals.chunks_exact(4)
                .map(|v| f64::from(f32::from_le_bytes([v[0], v[1], v[2], v[3]]))),
        );
    }
    KvPairs::new(keys, values, w).map_err(|e| e.to_string())
}

/// Trains on `data` in one process, calling `on_epoch` with each epoch's result as it ends;
/// returns every epoch's result and the model trained.
///
/// Every epoch, each worker trains on every rating of its share of the training ratings (a
/// contiguous `1/workers` of them) in a seeded order, in `ceil(share / batch)` steps; all
/// workers take as many steps, the ones with a smaller share advancing without a batch. With
/// `start`, the servers start from its rows instead of zero, the run trains the epochs after
/// those it says are done, and writes a checkpoint after each.
pub(crate) async fn train_model(
    cfg: &MfConfig,
    data: MfData,
    start: Start,
    mut on_epoch: impl FnMut(&MfReport),
) -> Result<(Vec<MfReport>, Model), RuntimeError> {
    let began = Instant::now();
    let baseline_rmse = data.baseline_rmse();
    let data = Arc::new(data);
    let mut spec = ClusterSpec::new(cfg.servers, cfg.workers);
    job_of(cfg, &mut spec.job);
    spec.job.ring.key_space = keys_below(&data);
    spec.initial = start.initial;
    let cluster: LocalCluster<f32> = LocalCluster::start(&spec, &MemNetwork::reliable())?;
    let shares = Shares::of(&data, cfg.workers, cfg);
    let mut reports = Vec::new();
    let mut best: Option<(f64, u32, Model)> = None;
    for epoch in start.done + 1..=cfg.epochs {
        let epoch_began = Instant::now();
        let mut tasks = Vec::new();
        for (w, handle) in cluster.workers.iter().enumerate() {
            let (handle, data, cfg) = (handle.clone(), data.clone(), *cfg);
            tasks.push(tokio::spawn(async move {
                handle.ready().await?;
                train_share(&handle, &cfg, &data, shares, w, epoch).await
            }));
        }
        for t in tasks {
            t.await.map_err(|_| RuntimeError::ShutDown)??;
        }
        let trained_secs = epoch_began.elapsed().as_secs_f64();
        let model = Model::pull(&cluster.workers[0], cfg, &data).await?;
        let mean = data.mean();
        let validation_rmse =
            (!data.validation.is_empty()).then(|| model.rmse(&data.validation, mean));
        let report = MfReport {
            epoch,
            train_rmse: model.rmse(&data.train, mean),
            test_rmse: model.rmse(&data.test, mean),
            baseline_rmse,
            validation_rmse,
            secs: began.elapsed().as_secs_f64(),
            rows_per_sec: data.train.len() as f64 / trained_secs.max(1e-9),
        };
        on_epoch(&report);
        reports.push(report);
        // The first epoch with the lowest validation RMSE is kept; a NaN is never better.
        if let Some(rmse) = validation_rmse
            && !rmse.is_nan()
            && best.as_ref().is_none_or(|(lowest, _, _)| rmse < *lowest)
        {
            best = Some((rmse, epoch, model));
        }
        if let Some(dir) = &start.checkpoints {
            let payload = checkpoint_payload(&cluster.workers[0], cfg, &data).await?;
            dir.write(u64::from(epoch), &payload).map_err(|e| {
                RuntimeError::Config(format!(
                    "{}: cannot write the checkpoint of epoch {epoch}: {e}",
                    dir.path().display()
                ))
            })?;
        }
        if let (Some(patience), Some((_, at, _))) = (cfg.early_stop, &best)
            && epoch - at >= patience
        {
            eprintln!(
                "early stop: no lower validation RMSE in the {patience} epochs after epoch {at}"
            );
            break;
        }
    }
    let trained = match best {
        Some((_, at, model)) if cfg.keep_best => {
            if reports.last().is_some_and(|r| r.epoch != at) {
                eprintln!("kept: epoch {at}, of the lowest validation RMSE");
            }
            model
        }
        _ => Model::pull(&cluster.workers[0], cfg, &data).await?,
    };
    cluster.shutdown().await?;
    Ok((reports, trained))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rating(user: u32, item: u32, value: f32) -> Rating {
        Rating { user, item, value }
    }

    #[test]
    fn validation_ratings_are_a_seeded_part_of_the_training_ratings_moved_out_of_them() {
        let train: Vec<Rating> = (0..1000).map(|n| rating(n % 37, n % 53, 3.0)).collect();
        let held = |seed| {
            let mut data = MfData {
                train: train.clone(),
                ..MfData::default()
            };
            data.hold_out_validation(0.1, seed).unwrap();
            data
        };
        let data = held(4);
        assert_eq!(data.train.len() + data.validation.len(), train.len());
        assert!(
            (50..150).contains(&data.validation.len()),
            "{}",
            data.validation.len()
        );
        let mut both: Vec<Rating> = data.train.iter().chain(&data.validation).copied().collect();
        let mut all = train.clone();
        let key = |r: &Rating| (r.user, r.item);
        both.sort_by_key(key);
        all.sort_by_key(key);
        assert_eq!(both, all);
        assert_eq!(held(4), data);
        assert_ne!(held(5).validation, data.validation);
        // Nothing left on either side is refused, naming the option.
        let mut tiny = MfData {
            train: vec![rating(0, 0, 1.0)],
            ..MfData::default()
        };
        let e = tiny.hold_out_validation(0.5, 0).unwrap_err();
        assert!(e.contains("--validation-fraction 0.5"), "{e}");
    }

    #[test]
    fn the_baseline_predicts_the_training_mean() {
        let data = MfData {
            train: vec![rating(0, 0, 1.0), rating(1, 0, 3.0)],
            test: vec![rating(0, 1, 4.0), rating(2, 0, 2.0)],
            ..MfData::default()
        };
        assert_eq!(data.mean(), 2.0);
        // Errors 2 and 0.
        assert!((data.baseline_rmse() - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!((data.users(), data.items()), (3, 2));
        // Item 1 and user 2 have no training rating.
        assert_eq!(data.unseen(), 2);
    }

    #[test]
    fn each_epoch_visits_every_rating_of_a_share_once_in_a_seeded_order() {
        let order = visit_order(3, 1, 1, 500);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..500).collect::<Vec<_>>());
        assert_ne!(order, sorted);
        assert_eq!(order, visit_order(3, 1, 1, 500));
        assert_ne!(order, visit_order(3, 1, 2, 500));
    }

    // Users and items with true biases: the model learns each as its bias, and comes near the
    // noise floor.
    #[test]
    fn biases_are_learnt_as_the_data_was_generated_with_them() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let problem = Generated {
            biases: 0.7,
            noise: 0.3,
            ..Generated::default()
        };
        let cfg = MfConfig {
            epochs: 10,
            ..MfConfig::default()
        };
        let (reports, model) = rt
            .block_on(train_model(&cfg, problem.data(), Start::default(), |_| {}))
            .expect("training runs");
        let keys = (0..problem.users)
            .map(user_key)
            .chain((0..problem.items).map(item_key));
        let pairs: Vec<(f64, f64)> = keys
            .filter_map(|key| Some((model.bias(key)?, problem.bias(key))))
            .collect();
        let n = pairs.len() as f64;
        let (ml, mt) = (
            pairs.iter().map(|p| p.0).sum::<f64>() / n,
            pairs.iter().map(|p| p.1).sum::<f64>() / n,
        );
        let cov: f64 = pairs.iter().map(|(l, t)| (l - ml) * (t - mt)).sum();
        let (vl, vt): (f64, f64) = (
            pairs.iter().map(|(l, _)| (l - ml).powi(2)).sum(),
            pairs.iter().map(|(_, t)| (t - mt).powi(2)).sum(),
        );
        let correlation = cov / (vl * vt).sqrt();
        let last = reports.last().unwrap().test_rmse;
        eprintln!(
            "bias correlation {correlation:.3}, test rmse {last:.3}, noise {}",
            problem.noise
        );
        assert!(correlation > 0.9, "{correlation}");
        assert!(last < 1.3 * problem.noise, "{reports:?}");
    }

    // Matrix factorization on generated low-rank ratings reaches the noise floor.
    #[test]
    fn test_rmse_comes_within_ten_percent_of_the_noise_floor() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (cfg, problem) = (MfConfig::default(), Generated::default());
        let reports = rt
            .block_on(train(&cfg, problem.data(), |_| {}))
            .expect("training runs");
        let rmse: Vec<f64> = reports.iter().map(|r| r.test_rmse).collect();
        eprintln!("noise {} test rmse by epoch {rmse:?}", problem.noise);
        let last = *rmse.last().unwrap();
        assert!(last <= 1.1 * problem.noise, "{rmse:?}");
        // It learned: far below the error of predicting the mean.
        assert!(rmse[0] > 1.2 * last, "{rmse:?}");
        assert!(last < 0.5 * reports[0].baseline_rmse, "{reports:?}");
    }
}
