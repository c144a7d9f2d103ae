//! The significantly-modified filter (ARCHITECTURE.md §10): a key's change goes once it adds up to
//! more than a threshold.
//!
//! A change counts by its absolute value, and NaN counts as more than any threshold: a filter must
//! not hide it. The filter delays changes and drops none: summed, what the servers receive is what
//! the application pushed once the worker flushed (`core/tests/filters.rs`). A held change is
//! staleness the consistency model does not see, which is the trade the paper makes too. Held
//! changes live in the table the KKT filter uses (`HeldRows`, `super::held`).

use crate::filter::held::HeldRows;
use crate::filter::{Filter, FilterSaving};
use crate::kv::KvPairs;
use crate::value::Value;

/// How large a key's accumulated change must be to be sent: more than this in absolute value,
/// in any of its values. Finite and not negative; 0 sends every non-zero change.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold(f64);

impl Threshold {
    /// `theta`, if it is finite and not negative.
    pub fn new(theta: f64) -> Option<Self> {
        (theta.is_finite() && theta >= 0.0).then_some(Threshold(theta))
    }

    /// The threshold's value.
    pub fn get(self) -> f64 {
        self.0
    }
}

// Never NaN (see `new`), so equality is an equivalence.
impl Eq for Threshold {}

impl std::hash::Hash for Threshold {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// Sends a key's change only once it adds up to more than the [`Threshold`]; below that it
/// accumulates on the worker, and goes with a later push of the key or at
/// [`Filter::flush`]. What is sent, summed, is what was pushed, summed, once the worker
/// flushes: the filter delays changes, it drops none. (Li et al., OSDI 2014, §4.2: most
/// changes to most keys are small.)
#[derive(Clone, Debug)]
pub struct SignificantlyModified<V: Value> {
    threshold: Threshold,
    width: usize,
    /// Per key, the change not sent yet: a hash table, as the KKT filter's, since every row
    /// of every push looks its key up (in an ordered map, with a vector per row, the filter
    /// trained at a fifth of unfiltered training's rows/s on 4 million features).
    held: HeldRows<V>,
    saving: FilterSaving,
}

// By hand: a derive would ask `V: Eq + Hash`, which floats are not; the table compares
// values by their bits.
impl<V: Value> PartialEq for SignificantlyModified<V> {
    fn eq(&self, other: &Self) -> bool {
        self.threshold == other.threshold
            && self.width == other.width
            && self.held == other.held
            && self.saving == other.saving
    }
}

impl<V: Value> Eq for SignificantlyModified<V> {}

impl<V: Value> std::hash::Hash for SignificantlyModified<V> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.threshold.hash(state);
        self.width.hash(state);
        self.held.hash(state);
        self.saving.hash(state);
    }
}

impl<V: Value> SignificantlyModified<V> {
    /// The filter at `threshold`, on pushes of `width` values per key.
    pub fn new(threshold: Threshold, width: usize) -> Self {
        SignificantlyModified {
            threshold,
            width,
            held: HeldRows::new(width),
            saving: FilterSaving::default(),
        }
    }

    /// Bytes of a row on the wire, as [`FilterSaving::bytes_saved`] counts them.
    fn row_bytes(&self) -> usize {
        8 + self.width * V::SIZE
    }
}

/// Whether a change is large enough to send at `threshold`. NaN is: a filter must not hide
/// it.
fn significant<V: Value>(threshold: Threshold, mut row: impl Iterator<Item = V>) -> bool {
    let t = threshold.get();
    row.any(|v| {
        let x = v.to_f64().abs();
        x.is_nan() || x > t
    })
}

impl<V: Value> Filter<V> for SignificantlyModified<V> {
    fn name(&self) -> &'static str {
        "sigmod"
    }

    fn push(&mut self, kvs: KvPairs<V>) -> KvPairs<V> {
        let mut keys = Vec::with_capacity(kvs.len());
        let mut values = Vec::with_capacity(kvs.len() * self.width);
        let threshold = self.threshold;
        for (key, row) in kvs.iter() {
            match self.held.add(key, row) {
                Some(sum) => {
                    if significant(threshold, sum.values()) {
                        keys.push(key);
                        self.held.release(key, &mut values);
                    }
                }
                // A key held nothing: its row is the sum, sent as it is or kept.
                None if significant(threshold, row.iter().copied()) => {
                    keys.push(key);
                    values.extend_from_slice(row);
                }
                None => self.held.hold(key, row, 0),
            }
        }
        let row_bytes = self.row_bytes();
        self.saving.count(kvs.len(), keys.len(), row_bytes);
        // The keys come from `kvs` in its order, a subset of a valid key list.
        KvPairs::from_validated(keys, values, self.width)
    }

    fn flush(&mut self) -> Option<KvPairs<V>> {
        if self.held.is_empty() {
            return None;
        }
        let (keys, values) = self.held.drain();
        let row_bytes = self.row_bytes();
        self.saving.count(0, keys.len(), row_bytes);
        // Sorted keys of a map, each once.
        Some(KvPairs::from_validated(keys, values, self.width))
    }

    fn holds(&self) -> usize {
        self.held.len()
    }

    fn saving(&self) -> FilterSaving {
        self.saving
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    fn kvs(keys: &[Key], values: &[f64]) -> KvPairs<f64> {
        KvPairs::new(keys.to_vec(), values.to_vec(), 1).unwrap()
    }

    fn rows(kvs: &KvPairs<f64>) -> Vec<(Key, f64)> {
        kvs.iter().map(|(k, v)| (k, v[0])).collect()
    }

    #[test]
    fn small_changes_wait_until_they_add_up_and_large_ones_go_at_once() {
        let mut f = SignificantlyModified::new(Threshold::new(1.0).unwrap(), 1);
        let sent = f.push(kvs(&[1, 2, 3], &[0.5, 2.0, -0.4]));
        assert_eq!(rows(&sent), [(2, 2.0)]);
        assert_eq!(f.holds(), 2);
        // Key 1 adds up to 1.1, past the threshold; key 3 to -0.8, not yet.
        let sent = f.push(kvs(&[1, 3], &[0.6, -0.4]));
        assert_eq!(rows(&sent), [(1, 1.1)]);
        assert_eq!(rows(&f.flush().unwrap()), [(3, -0.8)]);
        assert!(f.flush().is_none());
        let saving = f.saving();
        assert_eq!((saving.rows_in, saving.rows_out), (5, 3));
        assert_eq!(saving.bytes_saved, 2 * 16);
    }

    #[test]
    fn a_threshold_is_finite_and_not_negative_and_nan_is_never_held() {
        assert!(Threshold::new(-0.1).is_none());
        assert!(Threshold::new(f64::NAN).is_none());
        assert!(Threshold::new(f64::INFINITY).is_none());
        let mut f = SignificantlyModified::new(Threshold::new(0.0).unwrap(), 2);
        let sent = f.push(KvPairs::new(vec![4, 5], vec![0.0, 0.0, f64::NAN, 0.0], 2).unwrap());
        assert_eq!(sent.keys(), [5]);
        assert_eq!(f.holds(), 1);
    }

    /// Filters holding the same changes at the same threshold are one state; another threshold
    /// or another held change is another state, and hashes apart.
    #[test]
    fn filters_holding_the_same_changes_are_equal_and_any_difference_tells_them_apart() {
        use std::hash::{Hash, Hasher};
        let hash = |f: &SignificantlyModified<f64>| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            f.hash(&mut h);
            h.finish()
        };
        let theta = |t: f64| Threshold::new(t).unwrap();
        let mut x = SignificantlyModified::new(theta(1.0), 1);
        let mut y = SignificantlyModified::new(theta(1.0), 1);
        assert!(x.push(kvs(&[1, 2], &[0.5, 0.25])).is_empty());
        assert!(y.push(kvs(&[2], &[0.25])).is_empty());
        assert!(y.push(kvs(&[1], &[0.5])).is_empty());
        assert_eq!(x, y);
        assert_eq!(hash(&x), hash(&y));
        // Another threshold, holding the same.
        let mut z = SignificantlyModified::new(theta(2.0), 1);
        assert!(z.push(kvs(&[1, 2], &[0.5, 0.25])).is_empty());
        assert_eq!(z.saving(), x.saving());
        assert_ne!(x, z);
        assert_ne!(hash(&x), hash(&z));
        // Another width, holding nothing.
        assert_ne!(
            SignificantlyModified::<f64>::new(theta(1.0), 1),
            SignificantlyModified::<f64>::new(theta(1.0), 2)
        );
        // Another held change, the same saving.
        let mut w = x.clone();
        w.held.add(2, &[0.125]);
        assert_ne!(x, w);
        assert_ne!(hash(&x), hash(&w));
    }
}
