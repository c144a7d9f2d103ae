//! Sparse vectors: strictly increasing keys with `width` values per key.

use core::fmt;
use core::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

use thiserror::Error;

use crate::key::{Key, KeyRange, MAX_KEY};
use crate::value::Value;

mod values;

pub(crate) use values::ValueStorage;

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

/// The first of `keys` when they are consecutive: strictly increasing keys spanning exactly
/// their count are. `None` for gaps, or no key.
fn run_start(keys: &[Key]) -> Option<Key> {
    let (&first, &last) = (keys.first()?, keys.last()?);
    (last - first == keys.len() as Key - 1).then_some(first)
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

/// Where the keys of a [`KvPairs`] live.
#[derive(Clone)]
enum KeyStorage {
    /// Consecutive keys: the key at position `i` is `first + i`. A dense push holds no key
    /// list at all; `list` builds one the first time a caller asks for the keys as a slice,
    /// and clones and slices share it.
    Run {
        first: Key,
        list: Arc<OnceLock<Vec<Key>>>,
    },
    /// Any strictly increasing keys: the key at position `i` is `keys[from + i]`. `from` is 0
    /// but for the steps of a replication batch, whose keys share one list ([`crate::arena`]).
    List { keys: Arc<Vec<Key>>, from: usize },
}

/// A sparse vector: strictly increasing keys, each with `width` values (`width > 1` stores
/// embedding rows), as the paper's key-range push and pull move them.
///
/// Invariants, checked by [`KvPairs::new`] and by the decoder: keys are strictly increasing,
/// every key is at most [`MAX_KEY`], `width >= 1`, and there are exactly `keys x width` values.
///
/// The storage is shared: [`Clone`] and [`KvPairs::slice`] are O(1) (plus a binary search) and
/// never copy keys or values. Values decoded from a frame are read where they arrived, in the
/// frame's bytes, whenever the machine and the bytes' alignment allow. Consecutive keys (a
/// dense range, see [`KvPairs::from_range`]) are held as their first key alone, so a dense
/// vector costs its values and nothing more; [`KvPairs::key_range`] tells such a vector apart
/// in O(1). Equality and hashing compare values by their bits.
///
/// ```
/// use pserver_core::{KeyRange, KvPairs};
/// let kv = KvPairs::new(vec![1, 5, 9], vec![0.1f32, 0.5, 0.9], 1)?;
/// let mid = kv.slice(KeyRange::new(2, 10)?);
/// assert_eq!(mid.keys(), &[5, 9]);
/// assert_eq!(mid.get(9), Some(&[0.9f32][..]));
///
/// let dense = KvPairs::from_range(KeyRange::new(100, 103)?, vec![1.0f32, 2.0, 3.0], 1)?;
/// assert_eq!(dense.key_range(), KeyRange::new(100, 103).ok());
/// assert_eq!(dense.get(101), Some(&[2.0f32][..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct KvPairs<V> {
    keys: KeyStorage,
    values: ValueStorage<V>,
    width: usize,
    /// Window of pair indices `[lo, hi)` into the shared storage.
    lo: usize,
    hi: usize,
}

impl<V: Value> KvPairs<V> {
    /// Builds a sparse vector, validating every invariant of the type. Keys that turn out to
    /// be consecutive are kept as a range, as [`KvPairs::from_range`] would.
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

    /// A dense vector: every key of `range` in order, `width` values each. No key list is
    /// built.
    ///
    /// ```
    /// use pserver_core::{KeyRange, KvPairs};
    /// let kv = KvPairs::from_range(KeyRange::new(10, 12)?, vec![1i64, 2, 3, 4], 2)?;
    /// assert_eq!(kv.keys(), &[10, 11]);
    /// assert_eq!(kv.get(11), Some(&[3i64, 4][..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_range(range: KeyRange, values: Vec<V>, width: usize) -> Result<Self, KvError> {
        if width == 0 {
            return Err(KvError::ZeroWidth);
        }
        let count = usize::try_from(range.len()).ok();
        if count.and_then(|n| n.checked_mul(width)) != Some(values.len()) {
            return Err(KvError::LengthMismatch {
                keys: count.unwrap_or(usize::MAX),
                values: values.len(),
                width,
            });
        }
        // A range ends at most at u64::MAX, so its last key is at most MAX_KEY.
        Ok(Self::from_run(range.start(), values, width))
    }

    /// A vector over the keys of `list`, whose order the type proves already: the keys are
    /// neither checked again nor copied, only counted against the values. So a worker that
    /// pulled a batch's keys pushes its gradient for them without another pass over the keys.
    ///
    /// ```
    /// use pserver_core::{KeyList, KvPairs};
    /// let keys = KeyList::new(vec![2, 7, 9])?;
    /// let grad = KvPairs::with_keys(&keys, vec![0.5f32, -1.0, 2.0], 1)?;
    /// assert_eq!(grad.get(7), Some(&[-1.0f32][..]));
    /// assert!(KvPairs::with_keys(&keys, vec![0.5f32], 1).is_err());
    /// # Ok::<(), pserver_core::KvError>(())
    /// ```
    pub fn with_keys(list: &crate::KeyList, values: Vec<V>, width: usize) -> Result<Self, KvError> {
        if width == 0 {
            return Err(KvError::ZeroWidth);
        }
        let keys = list.shared();
        if keys.len().checked_mul(width) != Some(values.len()) {
            return Err(KvError::LengthMismatch {
                keys: keys.len(),
                values: values.len(),
                width,
            });
        }
        let hi = keys.len();
        Ok(KvPairs {
            keys: KeyStorage::List {
                keys: Arc::clone(keys),
                from: 0,
            },
            values: ValueStorage::owned(values),
            width,
            lo: 0,
            hi,
        })
    }

    /// `values` under the keys of `self`, `width` per key: the key storage is shared, not
    /// copied. The caller has checked that `width` divides the values into one row per key.
    pub(crate) fn beside(&self, values: Vec<V>, width: usize) -> Self {
        if self.lo != 0 {
            // A window into shared storage: the new values start at the window's first pair.
            return KvPairs::from_validated(self.keys().to_vec(), values, width);
        }
        KvPairs {
            keys: self.keys.clone(),
            values: ValueStorage::owned(values),
            width,
            lo: self.lo,
            hi: self.hi,
        }
    }

    /// Wraps storage whose invariants the caller has already checked.
    pub(crate) fn from_validated(keys: Vec<Key>, values: Vec<V>, width: usize) -> Self {
        Self::from_stored(keys, ValueStorage::owned(values), width)
    }

    /// As [`KvPairs::from_validated`], over values stored already.
    pub(crate) fn from_stored(keys: Vec<Key>, values: ValueStorage<V>, width: usize) -> Self {
        match run_start(&keys) {
            Some(first) => Self::run_of(first, values, width),
            None => {
                let hi = keys.len();
                KvPairs {
                    keys: KeyStorage::List {
                        keys: Arc::new(keys),
                        from: 0,
                    },
                    values,
                    width,
                    lo: 0,
                    hi,
                }
            }
        }
    }

    /// The keys `first, first + 1, ...`, one per `width` values; the caller has checked that
    /// the last of them is at most [`MAX_KEY`] and that `width` divides the values.
    pub(crate) fn from_run(first: Key, values: Vec<V>, width: usize) -> Self {
        Self::run_of(first, ValueStorage::owned(values), width)
    }

    /// As [`KvPairs::from_run`], over values stored already.
    pub(crate) fn run_of(first: Key, values: ValueStorage<V>, width: usize) -> Self {
        let hi = values.as_slice().len() / width;
        KvPairs {
            keys: KeyStorage::Run {
                first,
                list: Arc::new(OnceLock::new()),
            },
            values,
            width,
            lo: 0,
            hi,
        }
    }

    /// The same values over the keys `0..len`: what [`crate::wire::RowValues`] sends when
    /// the receiver knows the keys. Shares the value storage.
    pub(crate) fn without_keys(&self) -> Self {
        KvPairs {
            keys: KeyStorage::Run {
                first: 0,
                list: Arc::new(OnceLock::new()),
            },
            values: self.values.clone(),
            width: self.width,
            lo: self.lo,
            hi: self.hi,
        }
        .rebased()
    }

    /// The same values under `keys` (strictly increasing, as a key list the receiver was sent
    /// is), if there are as many keys as rows. Shares the value storage.
    pub(crate) fn rekeyed(&self, keys: &Arc<Vec<Key>>) -> Option<Self> {
        if keys.len() != self.len() {
            return None;
        }
        let rebased = self.clone().rebased();
        Some(match run_start(keys) {
            Some(first) => Self::run_of(first, rebased.values, self.width),
            None => KvPairs {
                keys: KeyStorage::List {
                    keys: Arc::clone(keys),
                    from: 0,
                },
                ..rebased
            },
        })
    }

    /// Pairs decoded into a batch's key arena: `count` keys from position `from` of the list
    /// `stand_in` holds the place of until [`KvPairs::rebase_keys`] ([`crate::arena`]).
    pub(crate) fn in_arena(
        stand_in: Arc<Vec<Key>>,
        from: usize,
        values: ValueStorage<V>,
        width: usize,
    ) -> Self {
        let hi = values.as_slice().len() / width;
        KvPairs {
            keys: KeyStorage::List {
                keys: stand_in,
                from,
            },
            values,
            width,
            lo: 0,
            hi,
        }
    }

    /// Points pairs decoded into an arena (holding `stand_in`) at the arena's `keys`; any
    /// others are left alone.
    pub(crate) fn rebase_keys(&mut self, stand_in: &Arc<Vec<Key>>, keys: &Arc<Vec<Key>>) {
        if let KeyStorage::List { keys: held, .. } = &mut self.keys
            && Arc::ptr_eq(held, stand_in)
        {
            *held = Arc::clone(keys);
        }
    }

    /// This vector with its window at the start of its value storage: a copy of the values
    /// when the window does not start there.
    fn rebased(self) -> Self {
        if self.lo == 0 && self.hi * self.width == self.values.as_slice().len() {
            return self;
        }
        let values = ValueStorage::Owned(Arc::new(self.values().to_vec()));
        let hi = self.hi - self.lo;
        KvPairs {
            values,
            lo: 0,
            hi,
            ..self
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
    ///
    /// A dense vector holds no key list: the first call builds one for the whole shared
    /// storage. Code on a hot path asks [`KvPairs::key_range`] first.
    pub fn keys(&self) -> &[Key] {
        if self.is_empty() {
            return &[];
        }
        match &self.keys {
            KeyStorage::List { keys, from } => &keys[from + self.lo..from + self.hi],
            KeyStorage::Run { first, list } => {
                let total = self.values.as_slice().len() / self.width;
                let all = list.get_or_init(|| (*first..*first + total as Key).collect());
                &all[self.lo..self.hi]
            }
        }
    }

    /// The key at position `i` (`i < len`).
    pub(crate) fn key_at(&self, i: usize) -> Key {
        match &self.keys {
            KeyStorage::List { keys, from } => keys[from + self.lo + i],
            KeyStorage::Run { first, .. } => first + (self.lo + i) as Key,
        }
    }

    /// The keys as one range, when they are consecutive (and there is at least one); `None`
    /// for a vector with gaps between its keys, or an empty one. O(1).
    pub fn key_range(&self) -> Option<KeyRange> {
        let span = self.span()?;
        (span.len() == self.len() as u64).then_some(span)
    }

    /// Position of the first key at or above `key`.
    fn position_of(&self, key: Key) -> usize {
        match &self.keys {
            KeyStorage::List { keys, from } => {
                keys[from + self.lo..from + self.hi].partition_point(|&k| k < key)
            }
            KeyStorage::Run { first, .. } => {
                let at = first + self.lo as Key;
                usize::try_from(key.saturating_sub(at)).map_or(self.len(), |d| d.min(self.len()))
            }
        }
    }

    /// All values, `width` per key, in key order.
    pub fn values(&self) -> &[V] {
        &self.values.as_slice()[self.lo * self.width..self.hi * self.width]
    }

    /// The values as little-endian bytes, `width x len` values of `V::SIZE` bytes: on a
    /// little-endian machine a view of the storage, without a copy.
    pub(crate) fn le_values(&self) -> bytes::Bytes {
        self.values
            .le_bytes(self.lo * self.width..self.hi * self.width)
    }

    /// The values of `key`, if present.
    pub fn get(&self, key: Key) -> Option<&[V]> {
        let i = self.position_of(key);
        if i == self.len() || self.key_at(i) != key {
            return None;
        }
        let start = (self.lo + i) * self.width;
        Some(&self.values.as_slice()[start..start + self.width])
    }

    /// Iterates over `(key, values)` in key order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Key, &[V])> + '_ {
        (0..self.len())
            .map(|i| self.key_at(i))
            .zip(self.values().chunks_exact(self.width))
    }

    /// The smallest range covering every key, or `None` when empty.
    pub fn span(&self) -> Option<KeyRange> {
        if self.is_empty() {
            return None;
        }
        let (first, last) = (self.key_at(0), self.key_at(self.len() - 1));
        // last <= MAX_KEY, so last + 1 cannot overflow and the range is valid.
        KeyRange::new(first, last + 1).ok()
    }

    /// Rows `from..to` (positions, not keys), without copying.
    pub(crate) fn rows(&self, from: usize, to: usize) -> KvPairs<V> {
        let to = to.min(self.len());
        let from = from.min(to);
        KvPairs {
            keys: self.keys.clone(),
            values: self.values.clone(),
            width: self.width,
            lo: self.lo + from,
            hi: self.lo + to,
        }
    }

    /// The pairs of `pieces`, one after another: the caller gives them in increasing, disjoint
    /// key order. Pieces that are adjacent windows of one storage (the slices of one vector
    /// that all go to the same server, say) are joined without a copy.
    pub(crate) fn concat(mut pieces: Vec<KvPairs<V>>, width: usize) -> KvPairs<V> {
        pieces.retain(|p| !p.is_empty());
        let adjacent = pieces
            .windows(2)
            .all(|pair| pair[0].values.same(&pair[1].values) && pair[0].hi == pair[1].lo);
        if adjacent {
            if let (Some(first), Some(last)) = (pieces.first(), pieces.last()) {
                return KvPairs {
                    hi: last.hi,
                    ..first.clone()
                };
            }
        }
        let n: usize = pieces.iter().map(KvPairs::len).sum();
        let mut values = Vec::with_capacity(n * width);
        for p in &pieces {
            values.extend_from_slice(p.values());
        }
        let span = pieces
            .first()
            .and_then(KvPairs::span)
            .zip(pieces.last().and_then(KvPairs::span));
        match span {
            // Disjoint increasing pieces spanning exactly their count leave no gap.
            Some((a, b)) if b.end() - a.start() == n as Key => {
                KvPairs::from_run(a.start(), values, width)
            }
            _ => {
                let mut keys = Vec::with_capacity(n);
                for p in &pieces {
                    keys.extend_from_slice(p.keys());
                }
                KvPairs::from_validated(keys, values, width)
            }
        }
    }

    /// The pairs whose keys lie in `range`, sharing this vector's storage (no copy).
    pub fn slice(&self, range: KeyRange) -> KvPairs<V> {
        let from = self.position_of(range.start());
        let to = self.position_of(range.end());
        self.rows(from, to.max(from))
    }
}

/// Gathers rows in increasing key order into a [`KvPairs`], listing the keys only once a gap
/// appears between them: the answer to a dense pull stays a range.
pub(crate) struct PairsBuilder<V> {
    width: usize,
    /// The first key, while the keys so far are consecutive.
    first: Option<Key>,
    /// The keys, once they are not.
    list: Option<Vec<Key>>,
    values: Vec<V>,
    len: usize,
}

impl<V: Value> PairsBuilder<V> {
    /// An empty builder of rows `width` (at least 1) values wide.
    pub(crate) fn new(width: usize) -> Self {
        PairsBuilder {
            width: width.max(1),
            first: None,
            list: None,
            values: Vec::new(),
            len: 0,
        }
    }

    /// An empty builder with room for `rows` rows.
    pub(crate) fn with_capacity(width: usize, rows: usize) -> Self {
        let mut builder = Self::new(width);
        builder.values.reserve(rows.saturating_mul(builder.width));
        builder
    }

    /// Rows gathered so far.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends rows: `keys` strictly increasing and above every key before, `width` values
    /// each.
    pub(crate) fn extend(&mut self, keys: &[Key], values: &[V]) {
        let (Some(&lo), Some(&hi)) = (keys.first(), keys.last()) else {
            return;
        };
        self.values.extend_from_slice(values);
        let consecutive = hi - lo == keys.len() as Key - 1;
        match (&mut self.list, self.first) {
            (Some(list), _) => list.extend_from_slice(keys),
            (None, None) if consecutive => self.first = Some(lo),
            (None, Some(first)) if consecutive && lo == first + self.len as Key => {}
            (None, first) => {
                let mut list: Vec<Key> =
                    first.map_or(Vec::new(), |f| (f..f + self.len as Key).collect());
                list.extend_from_slice(keys);
                self.list = Some(list);
            }
        }
        self.len += keys.len();
    }

    /// The rows gathered.
    pub(crate) fn finish(self) -> KvPairs<V> {
        match (self.list, self.first) {
            (Some(list), _) => KvPairs::from_validated(list, self.values, self.width),
            (None, Some(first)) => KvPairs::from_run(first, self.values, self.width),
            (None, None) => KvPairs::from_validated(Vec::new(), Vec::new(), self.width),
        }
    }
}

impl<V: Value> PartialEq for KvPairs<V> {
    fn eq(&self, other: &Self) -> bool {
        // Equal key sets are either the same range or, both with gaps, the same list.
        let same_keys = match (self.key_range(), other.key_range()) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.keys() == other.keys(),
            _ => false,
        };
        self.width == other.width
            && same_keys
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
        // Consistent with `eq`: the range stands for the keys exactly when they have no gap.
        match self.key_range() {
            Some(range) => range.hash(state),
            None => self.keys().hash(state),
        }
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

    /// The same pairs with their keys as a list, whatever they are.
    fn listed<V: Value>(kv: &KvPairs<V>) -> KvPairs<V> {
        KvPairs {
            keys: KeyStorage::List {
                keys: Arc::new(kv.keys().to_vec()),
                from: 0,
            },
            values: ValueStorage::owned(kv.values().to_vec()),
            width: kv.width(),
            lo: 0,
            hi: kv.len(),
        }
    }

    fn hash_of<V: Value>(kv: &KvPairs<V>) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        kv.hash(&mut h);
        h.finish()
    }

    #[test]
    fn consecutive_keys_are_held_as_a_range_without_a_list() {
        let kv = KvPairs::new((10..20).collect(), vec![0i64; 10], 1).unwrap();
        assert!(matches!(kv.keys, KeyStorage::Run { first: 10, .. }));
        let gappy = KvPairs::new(vec![10, 12], vec![0i64; 2], 1).unwrap();
        assert!(matches!(gappy.keys, KeyStorage::List { .. }));
        assert_eq!(gappy.key_range(), None);
        let dense = KvPairs::from_range(KeyRange::new(5, 8).unwrap(), vec![1i64; 3], 1).unwrap();
        let KeyStorage::Run { list, .. } = &dense.keys else {
            panic!("a range is held as a run");
        };
        assert!(list.get().is_none(), "no key list until one is asked for");
        assert_eq!(
            dense.slice(KeyRange::new(6, 100).unwrap()).key_range(),
            KeyRange::new(6, 8).ok()
        );
        assert!(list.get().is_none(), "slicing a run lists no keys");
        assert_eq!(dense.keys(), &[5, 6, 7]);
        assert_eq!(
            KvPairs::from_range(KeyRange::new(5, 8).unwrap(), vec![1i64; 4], 1),
            Err(KvError::LengthMismatch {
                keys: 3,
                values: 4,
                width: 1
            })
        );
        assert_eq!(
            KvPairs::<i64>::from_range(KeyRange::new(5, 8).unwrap(), vec![], 0),
            Err(KvError::ZeroWidth)
        );
    }

    #[test]
    fn adjacent_slices_join_without_a_copy() {
        let kv = KvPairs::new(vec![1, 3, 5, 7, 9], vec![1i64, 3, 5, 7, 9], 1).unwrap();
        let cut = |a, b| kv.slice(KeyRange::new(a, b).unwrap());
        let joined = KvPairs::concat(vec![cut(0, 4), cut(4, 6), cut(6, 8)], 1);
        assert_eq!(joined.keys(), &[1, 3, 5, 7]);
        assert!(core::ptr::eq(
            joined.values().as_ptr(),
            kv.values().as_ptr()
        ));
        let gapped = KvPairs::concat(vec![cut(0, 4), cut(6, 10)], 1);
        assert_eq!(gapped.keys(), &[1, 3, 7, 9]);
        assert_eq!(gapped.values(), &[1, 3, 7, 9]);
        let dense = KvPairs::new((0..10).collect(), (0..10).collect::<Vec<i64>>(), 1).unwrap();
        let part = |a, b| dense.slice(KeyRange::new(a, b).unwrap());
        let rejoined = KvPairs::concat(vec![part(0, 3), part(5, 7)], 1);
        assert_eq!(rejoined.keys(), &[0, 1, 2, 5, 6]);
        let copied = KvPairs::concat(vec![part(2, 4), listed(&part(4, 6))], 1);
        assert_eq!(
            copied.key_range(),
            KeyRange::new(2, 6).ok(),
            "copied runs stay a range"
        );
        assert_eq!(copied.values(), &[2, 3, 4, 5]);
    }

    #[test]
    fn a_builder_lists_keys_only_after_a_gap() {
        let mut b = PairsBuilder::<i64>::new(1);
        b.extend(&[3, 4], &[1, 2]);
        b.extend(&[5], &[3]);
        let run = b.finish();
        assert_eq!(run.key_range(), KeyRange::new(3, 6).ok());
        assert_eq!(run.values(), &[1, 2, 3]);
        let mut b = PairsBuilder::<i64>::new(1);
        b.extend(&[3, 4], &[1, 2]);
        b.extend(&[6, 7], &[3, 4]);
        b.extend(&[8], &[5]);
        assert_eq!(b.len(), 5);
        let gappy = b.finish();
        assert_eq!(gappy.keys(), &[3, 4, 6, 7, 8]);
        assert_eq!(gappy.get(7), Some(&[4i64][..]));
        assert!(PairsBuilder::<i64>::new(2).finish().is_empty());
    }

    proptest! {
        /// A vector holding its keys as a run and one holding them as a list answer every
        /// question alike, and are equal with equal hashes.
        #[test]
        fn runs_and_lists_agree(
            start in prop_oneof![0u64..100, (MAX_KEY - 60)..MAX_KEY],
            n in 0usize..50,
            width in 1usize..3,
            cut in (0u64..120, 0u64..120),
            probe in 0u64..120,
        ) {
            let n = n.min((MAX_KEY - start + 1) as usize);
            let keys: Vec<Key> = (start..start + n as Key).collect();
            let values: Vec<i64> = (0..(n * width) as i64).collect();
            let run = KvPairs::new(keys.clone(), values, width).unwrap();
            let list = listed(&run);
            let listed = matches!(list.keys, KeyStorage::List { .. });
            prop_assert!(listed);
            let (a, b) = (start.saturating_add(cut.0.min(cut.1)), start.saturating_add(cut.0.max(cut.1)));
            let range = KeyRange::new(a, b).unwrap();
            for (r, l) in [(run.clone(), list.clone()), (run.slice(range), list.slice(range))] {
                prop_assert_eq!(r.len(), l.len());
                prop_assert_eq!(r.span(), l.span());
                prop_assert_eq!(r.key_range(), l.key_range());
                prop_assert_eq!(r.key_range().is_some(), !r.is_empty());
                let key = start.saturating_add(probe);
                prop_assert_eq!(r.get(key), l.get(key));
                prop_assert_eq!(r.iter().collect::<Vec<_>>(), l.iter().collect::<Vec<_>>());
                prop_assert_eq!(r.keys(), l.keys());
                prop_assert_eq!(&r, &l);
                prop_assert_eq!(hash_of(&r), hash_of(&l));
            }
        }

        /// Built from rows in any grouping, a builder gives the vector of all of them.
        #[test]
        fn a_builder_gives_the_pairs_it_was_given(
            keys in proptest::collection::btree_set(0u64..80, 0..40),
            cuts in proptest::collection::vec(0usize..40, 0..6),
        ) {
            let keys: Vec<Key> = keys.into_iter().collect();
            let values: Vec<i64> = keys.iter().map(|&k| k as i64 * 3).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(keys.len())).collect();
            cuts.push(0);
            cuts.push(keys.len());
            cuts.sort_unstable();
            let mut b = PairsBuilder::new(1);
            for pair in cuts.windows(2) {
                b.extend(&keys[pair[0]..pair[1]], &values[pair[0]..pair[1]]);
            }
            let built = b.finish();
            let want = KvPairs::new(keys, values, 1).unwrap();
            prop_assert_eq!(built.key_range(), want.key_range());
            prop_assert_eq!(built, want);
        }

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
