//! Minibatches: the order a share's rows are visited in each epoch, a minibatch made ready
//! before its weights are pulled ([`Batch`]: its rows, the keys they touch, and the gradient
//! at the pulled weights), and the record of one share's minibatch a worker trained
//! ([`ShareStep`]), from which a run tells the rows no worker trained and those two did.

use pserver_core::{Key, KeyList};
use pserver_runtime::RuntimeError;

use super::config::{BIAS_KEY, LrConfig, config_error};
use super::metrics::{logloss, sigmoid};
use crate::data::libsvm::Examples;

/// One minibatch, made ready before its weights are pulled: its rows, the distinct keys it
/// touches (sorted, the intercept's last), and where each feature of each row, in row order,
/// sits among those keys. One sort finds both, so computing on the pulled weights needs no
/// search.
#[derive(Debug)]
pub(crate) struct Batch {
    /// Its rows of the examples, in the order they are trained.
    pub rows: Vec<usize>,
    /// The distinct keys its rows touch, sorted, the intercept's last.
    pub keys: KeyList,
    /// For each feature of each row, in row order: its key's place in `keys`.
    pub positions: Vec<u32>,
}

impl Batch {
    /// Prepares `rows` of `data`; `scratch` is reused from batch to batch.
    pub(crate) fn new(
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
            keys: KeyList::new(keys).map_err(config_error)?,
            positions,
        })
    }

    /// The gradient of the summed log loss of the batch's rows at `weights` (aligned with its
    /// keys, the intercept's last when `bias`), and that summed log loss before the update.
    ///
    /// A sum, not a mean: a feature seen in one row of the batch is pushed that row's gradient
    /// whatever the batch size, so the servers' per-coordinate adaptive rule steps for it as it
    /// would after that row alone (ARCHITECTURE.md §2; `docs/training.md`). Divided by the
    /// batch size, a rare feature's step shrank with the batch while FTRL's `beta` and
    /// regularizers stayed the same size, and one epoch learnt far less than one pass of a
    /// per-example learner.
    pub(crate) fn gradient(&self, data: &Examples, weights: &[f32], bias: bool) -> (Vec<f32>, f64) {
        let mut grad = vec![0f32; weights.len()];
        let mut loss = 0.0;
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
            let g = (p - f64::from(y)) as f32;
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

/// The order in which the rows `rows` of window `window` of a share are visited in `epoch`:
/// shuffled by a seed drawn from the job's seed, the share, the epoch and the window, or as
/// given. Rows held in memory are one window, 0, of the whole share; a streamed share is
/// shuffled within each window, as Vowpal Wabbit shuffles within its buffer.
pub(crate) fn visiting_order(
    cfg: &LrConfig,
    share: usize,
    epoch: u32,
    window: usize,
    rows: Vec<usize>,
) -> Vec<usize> {
    let mut order = rows;
    if cfg.shuffle {
        let seed = crate::seeded::mix(cfg.seed ^ crate::seeded::mix(share as u64))
            ^ u64::from(epoch).rotate_left(32)
            ^ if window == 0 {
                0
            } else {
                crate::seeded::mix(window as u64 ^ 0x3d1f)
            };
        crate::seeded::shuffle(&mut order, seed);
    }
    order
}

/// One share's minibatch a worker trained: of which share, at which step of the epoch, how
/// many rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShareStep {
    /// The share ([`WorkerHandle::shares`](pserver_runtime::WorkerHandle::shares)).
    pub share: usize,
    /// The step of the epoch: the share's rows from `step * batch` in the epoch's order.
    pub step: usize,
    /// Rows in it.
    pub rows: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::libsvm::IndexBase;

    fn examples(text: &[u8]) -> Examples {
        crate::data::libsvm::parse("t", text, IndexBase::Zero).unwrap()
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
    fn the_gradient_is_the_sum_over_the_batch_with_the_intercept_in_the_last_slot() {
        let data = examples(b"1 0:1 1:2\n0 1:1\n");
        let weights = [0.5f32, -0.25, 0.1];
        let (grad, loss) = batch(&data, &[0, 1], true).gradient(&data, &weights, true);
        // Row 0: z = 0.1 + 0.5 - 0.5 = 0.1, label 1; row 1: z = 0.1 - 0.25 = -0.15, label 0.
        let (p0, p1) = (sigmoid(0.1), sigmoid(-0.15));
        let (g0, g1) = (p0 - 1.0, p1);
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
    fn each_epoch_and_each_share_visit_their_rows_in_their_own_order() {
        let cfg = LrConfig::default();
        let order = |share, epoch| visiting_order(&cfg, share, epoch, 0, (0..50).collect());
        let mut sorted = order(0, 1);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(order(0, 1), order(0, 2));
        assert_ne!(order(0, 1), order(1, 1));
        assert_eq!(order(3, 4), order(3, 4));
        assert_ne!(
            visiting_order(&cfg, 0, 1, 1, (0..50).collect()),
            order(0, 1),
            "each window of a streamed share in its own order"
        );
        let in_file = LrConfig {
            shuffle: false,
            ..LrConfig::default()
        };
        assert_eq!(
            visiting_order(&in_file, 2, 5, 3, (10..20).collect()),
            (10..20).collect::<Vec<_>>()
        );
    }
}
