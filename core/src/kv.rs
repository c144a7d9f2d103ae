//! Sparse vectors: strictly increasing keys with `width` values per key.

use core::fmt;
use core::hash::{Hash, Hasher};
use std::sync::Arc;

use thiserror::Error;

use crate::key::{Key, KeyRange, MAX_KEY};
use crate::value::Value;

/// Why a set of key-value pairs was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KvError {
    /// Every key needs at least one value.
    #[error("width must be at least 1 value per key")]
    ZeroWidth,
    /// The values do not fill exactly `width` slots per key.
    #[error(
        "{values} values do not fit {keys} keys of width {width}: expected keys x width values"
    )]
    LengthMismatch {
        /// Number of keys given.
        keys: usize,
        /// Number of values given.
        values: usize,
        /// Values per key.
        width: usize,
    },
    /// Keys must be strictly increasing (sorted, no duplicates).
    #[error(
        "keys must be strictly increasing, but key {key} at position {index} follows {previous}"
    )]
    NotIncreasing {
        /// Position of the offending key.
        index: usize,
        /// The key before it.
        previous: Key,
        /// The offending key.
        key: Key,
    },
    /// `u64::MAX` is reserved as the end of the key space.
    #[error("key {0} is reserved (the largest usable key is u64::MAX - 1)")]
    ReservedKey(Key),
}

/// Checks that `keys` are strictly increasing and below the reserved key.
pub(crate) fn check_keys(keys: &[Key]) -> Result<(), KvError> {
    for (index, pair) in keys.windows(2).enumerate() {
        if pair[1] <= pair[0] {
            return Err(KvError::NotIncreasing {
                index: index + 1,
                previous: pair[0],
                key: pair[1],
            });
        }
    }
    match keys.last() {
        Some(&last) if last > MAX_KEY => Err(KvError::ReservedKey(last)),
        _ => Ok(()),
    }
}

/// A sparse vector: strictly increasing keys, each with `width` values (`width > 1` stores
/// embedding rows), as the paper's key-range push and pull move them.
///
/// Invariants, checked by [`KvPairs::new`] and by the decoder: keys are strictly increasing,
/// every key is at most [`MAX_KEY`], `width >= 1`, and there are exactly `keys x width` values.
///
/// The storage is shared: [`Clone`] and [`KvPairs::slice`] are O(1) (plus a binary search) and
/// never copy keys or values. Equality and hashing compare values by their bits.
///
/// ```
/// use pserver_core::{KeyRange, KvPairs};
/// let kv = KvPairs::new(vec![1, 5, 9], vec![0.1f32, 0.5, 0.9], 1)?;
/// let mid = kv.slice(KeyRange::new(2, 10)?);
/// assert_eq!(mid.keys(), &[5, 9]);
/// assert_eq!(mid.get(9), Some(&[0.9f32][..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct KvPairs<V> {
    keys: Arc<Vec<Key>>,
    values: Arc<Vec<V>>,
    width: usize,
    /// Window of pair indices `[lo, hi)` into the shared storage.
    lo: usize,
    hi: usize,
}

impl<V: Value> KvPairs<V> {
    /// Builds a sparse vector, validating every invariant of the type.
    pub fn new(keys: Vec<Key>, values: Vec<V>, width: usize) -> Result<Self, KvError> {
        if width == 0 {
            return Err(KvError::ZeroWidth);
        }
        if keys.len().checked_mul(width) != Some(values.len()) {
            return Err(KvError::LengthMismatch {
                keys: keys.len(),
                values: values.len(),
                width,
            });
        }
        check_keys(&keys)?;
        Ok(Self::from_validated(keys, values, width))
    }

    /// Wraps storage whose invariants the caller has already checked.
    pub(crate) fn from_validated(keys: Vec<Key>, values: Vec<V>, width: usize) -> Self {
        let hi = keys.len();
        KvPairs {
            keys: Arc::new(keys),
            values: Arc::new(values),
            width,
            lo: 0,
            hi,
        }
    }

    /// An empty vector of the given width (at least 1).
    pub fn empty(width: usize) -> Result<Self, KvError> {
        Self::new(Vec::new(), Vec::new(), width)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.hi - self.lo
    }

    /// True when there is no key.
    pub fn is_empty(&self) -> bool {
        self.lo == self.hi
    }

    /// Values per key.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The keys, strictly increasing.
    pub fn keys(&self) -> &[Key] {
        &self.keys[self.lo..self.hi]
    }

    /// All values, `width` per key, in key order.
    pub fn values(&self) -> &[V] {
        &self.values[self.lo * self.width..self.hi * self.width]
    }

    /// The values of `key`, if present.
    pub fn get(&self, key: Key) -> Option<&[V]> {
        let i = self.keys().binary_search(&key).ok()?;
        let start = (self.lo + i) * self.width;
        Some(&self.values[start..start + self.width])
    }

    /// Iterates over `(key, values)` in key order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Key, &[V])> + '_ {
        self.keys()
            .iter()
            .copied()
            .zip(self.values().chunks_exact(self.width))
    }

    /// The smallest range covering every key, or `None` when empty.
    pub fn span(&self) -> Option<KeyRange> {
        let keys = self.keys();
        let (first, last) = (*keys.first()?, *keys.last()?);
        // last <= MAX_KEY, so last + 1 cannot overflow and the range is valid.
        KeyRange::new(first, last + 1).ok()
    }

    /// Rows `from..to` (positions, not keys), without copying.
    pub(crate) fn rows(&self, from: usize, to: usize) -> KvPairs<V> {
        let to = to.min(self.len());
        let from = from.min(to);
        KvPairs {
            keys: Arc::clone(&self.keys),
            values: Arc::clone(&self.values),
            width: self.width,
            lo: self.lo + from,
            hi: self.lo + to,
        }
    }

    /// The pairs of `pieces`, one after another: the caller gives them in increasing, disjoint
    /// key order. A single piece is returned as it is, without a copy.
    pub(crate) fn concat(mut pieces: Vec<KvPairs<V>>, width: usize) -> KvPairs<V> {
        pieces.retain(|p| !p.is_empty());
        if pieces.len() == 1 {
            if let Some(only) = pieces.pop() {
                return only;
            }
        }
        let n: usize = pieces.iter().map(KvPairs::len).sum();
        let mut keys = Vec::with_capacity(n);
        let mut values = Vec::with_capacity(n * width);
        for p in &pieces {
            keys.extend_from_slice(p.keys());
            values.extend_from_slice(p.values());
        }
        KvPairs::from_validated(keys, values, width)
    }

    /// The pairs whose keys lie in `range`, sharing this vector's storage (no copy).
    pub fn slice(&self, range: KeyRange) -> KvPairs<V> {
        let keys = self.keys();
        let from = keys.partition_point(|&k| k < range.start());
        let to = keys.partition_point(|&k| k < range.end());
        KvPairs {
            keys: Arc::clone(&self.keys),
            values: Arc::clone(&self.values),
            width: self.width,
            lo: self.lo + from,
            hi: self.lo + to.max(from),
        }
    }
}

impl<V: Value> PartialEq for KvPairs<V> {
    fn eq(&self, other: &Self) -> bool {
        self.width == other.width
            && self.keys() == other.keys()
            && self.values().len() == other.values().len()
            && self
                .values()
                .iter()
                .zip(other.values())
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl<V: Value> Eq for KvPairs<V> {}

impl<V: Value> Hash for KvPairs<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.width.hash(state);
        self.keys().hash(state);
        for v in self.values() {
            v.to_bits().hash(state);
        }
    }
}

impl<V: Value> fmt::Debug for KvPairs<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in self.iter() {
            if self.width == 1 {
                m.entry(&k, &v[0]);
            } else {
                m.entry(&k, &v);
            }
        }
        m.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn new_validates_every_invariant() {
        assert_eq!(
            KvPairs::<f32>::new(vec![], vec![], 0),
            Err(KvError::ZeroWidth)
        );
        assert!(matches!(
            KvPairs::new(vec![1, 2], vec![1.0f32; 3], 1),
            Err(KvError::LengthMismatch { .. })
        ));
        assert_eq!(
            KvPairs::new(vec![1, 3, 3], vec![0i64; 3], 1),
            Err(KvError::NotIncreasing {
                index: 2,
                previous: 3,
                key: 3
            })
        );
        assert!(matches!(
            KvPairs::new(vec![4, 2], vec![0i64; 2], 1),
            Err(KvError::NotIncreasing { index: 1, .. })
        ));
        assert_eq!(
            KvPairs::new(vec![u64::MAX], vec![0i64], 1),
            Err(KvError::ReservedKey(u64::MAX))
        );
        assert!(KvPairs::new(vec![0, MAX_KEY], vec![0i64; 4], 2).is_ok());
    }

    #[test]
    fn rows_of_width_two_stay_together() {
        let kv = KvPairs::new(vec![3, 7], vec![1i64, 2, 3, 4], 2).unwrap();
        assert_eq!(kv.get(7), Some(&[3i64, 4][..]));
        let hi = kv.slice(KeyRange::new(4, 100).unwrap());
        assert_eq!(hi.values(), &[3, 4]);
        assert_eq!(hi.span(), KeyRange::new(7, 8).ok());
    }

    #[test]
    fn slicing_shares_storage_instead_of_copying() {
        let kv = KvPairs::new((0..1000).collect(), vec![1.0f64; 1000], 1).unwrap();
        let part = kv.slice(KeyRange::new(100, 200).unwrap());
        assert_eq!(part.len(), 100);
        assert!(core::ptr::eq(part.values().as_ptr(), &kv.values()[100]));
        assert!(core::ptr::eq(part.keys().as_ptr(), &kv.keys()[100]));
    }

    #[test]
    fn floats_compare_by_bits() {
        let a = KvPairs::new(vec![1], vec![f32::NAN], 1).unwrap();
        assert_eq!(a, a.clone());
        let z = KvPairs::new(vec![1], vec![0.0f32], 1).unwrap();
        let nz = KvPairs::new(vec![1], vec![-0.0f32], 1).unwrap();
        assert_ne!(z, nz);
    }

    proptest! {
        #[test]
        fn slice_keeps_exactly_the_keys_in_range(
            keys in proptest::collection::btree_set(0u64..500, 0..60),
            a in 0u64..520, b in 0u64..520,
            c in 0u64..520, d in 0u64..520,
        ) {
            let keys: Vec<Key> = keys.into_iter().collect();
            let values: Vec<i64> = keys.iter().map(|&k| k as i64 * 10).collect();
            let kv = KvPairs::new(keys.clone(), values, 1).unwrap();
            let outer = KeyRange::new(a.min(b), a.max(b)).unwrap();
            let inner = KeyRange::new(c.min(d), c.max(d)).unwrap();
            let s = kv.slice(outer).slice(inner);
            let expect: Vec<Key> =
                keys.into_iter().filter(|&k| outer.contains(k) && inner.contains(k)).collect();
            prop_assert_eq!(s.keys(), &expect[..]);
            for (k, v) in s.iter() {
                prop_assert_eq!(v, &[k as i64 * 10][..]);
            }
        }
    }
}
