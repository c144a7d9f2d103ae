//! [`HashedStore`]: rows found through a hash table, kept in the order they arrived.

use core::hash::{BuildHasherDefault, Hash, Hasher};
use std::collections::HashMap;
use std::sync::OnceLock;

use super::{ParamStore, RowVisitor, RowsUpdate, RunVisitor};
use crate::hash::mix64;
use crate::key::{Key, KeyRange};
use crate::value::Value;

/// Hashes a key with SplitMix64's mixer: keys are integers already, often consecutive or
/// strided, and need only spreading, not a keyed hash. Deterministic, so that a store behaves
/// the same in every run (ARCHITECTURE.md §2).
#[derive(Clone, Copy, Debug, Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix64(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = mix64(self.0 ^ key);
    }
}

type Slots = HashMap<Key, usize, BuildHasherDefault<KeyHasher>>;

/// Rows in the order they were first written, indexed by a hash table from key to row: a key
/// costs one lookup however many rows the store holds and however scattered the keys are,
/// which is what a sparse model's pushes and pulls need (ARCHITECTURE.md §3). A row's values
/// and its updater state lie next to each other, so that updating a scattered key touches one
/// cache line, not one in each of two arrays.
///
/// Reading in key order (a range pull, a shard copy) sorts the rows once and keeps that order
/// until a row is added, so that the parts of a long range pull do not each sort again. A dense
/// range costs a lookup per key here; [`super::OrderedStore`] serves those as slices.
///
/// ```
/// use pserver_core::KeyRange;
/// use pserver_core::store::{HashedStore, ParamStore};
/// let mut store = HashedStore::<f32>::new(1, 0);
/// store.update_rows(&[3, 400_000_000, 5_000_000_000], &[1.0, 2.0, 3.0], &mut |rows, _, deltas| {
///     for (w, d) in rows.iter_mut().zip(deltas) {
///         *w += d;
///     }
/// });
/// assert_eq!(store.get(400_000_000), Some(&[2.0f32][..]));
/// let mut keys = Vec::new();
/// store.for_each_in(KeyRange::FULL, &mut |k, _| keys.push(k));
/// assert_eq!(keys, [3, 400_000_000, 5_000_000_000]);
/// ```
#[derive(Clone, Debug)]
pub struct HashedStore<V> {
    width: usize,
    aux_width: usize,
    slots: Slots,
    keys: Vec<Key>,
    /// Per row, `width` values then `width * aux_width` updater values.
    rows: Vec<V>,
    /// Rows by increasing key, computed when first asked for after a row was added.
    sorted: OnceLock<Vec<usize>>,
}

impl<V: Value> HashedStore<V> {
    /// An empty store of rows `width` wide with `aux_width` updater values per value.
    pub fn new(width: usize, aux_width: usize) -> Self {
        HashedStore {
            width,
            aux_width,
            slots: Slots::default(),
            keys: Vec::new(),
            rows: Vec::new(),
            sorted: OnceLock::new(),
        }
    }

    /// The row of `key`, added as zeros if absent.
    fn slot_or_insert(&mut self, key: Key) -> usize {
        let next = self.keys.len();
        let slot = *self.slots.entry(key).or_insert(next);
        if slot == next {
            self.keys.push(key);
            self.rows
                .resize(self.rows.len() + self.stride(), V::default());
            self.sorted = OnceLock::new();
        }
        slot
    }

    /// Values per row, updater state included.
    fn stride(&self) -> usize {
        self.width * (1 + self.aux_width)
    }

    fn rows_mut(&mut self, slot: usize) -> (&mut [V], &mut [V]) {
        let stride = self.stride();
        self.rows[slot * stride..(slot + 1) * stride].split_at_mut(self.width)
    }

    /// Rows whose keys lie in `range`, by increasing key.
    fn sorted_in(&self, range: KeyRange) -> &[usize] {
        let sorted = self.sorted.get_or_init(|| {
            let mut order: Vec<usize> = (0..self.keys.len()).collect();
            order.sort_unstable_by_key(|&slot| self.keys[slot]);
            order
        });
        let from = sorted.partition_point(|&s| self.keys[s] < range.start());
        let to = sorted.partition_point(|&s| self.keys[s] < range.end());
        &sorted[from..to.max(from)]
    }

    fn row(&self, slot: usize) -> &[V] {
        let at = slot * self.stride();
        &self.rows[at..at + self.width]
    }

    fn aux_row(&self, slot: usize) -> &[V] {
        let stride = self.stride();
        &self.rows[slot * stride + self.width..(slot + 1) * stride]
    }
}

impl<V: Value> ParamStore<V> for HashedStore<V> {
    fn get(&self, key: Key) -> Option<&[V]> {
        self.slots.get(&key).map(|&slot| self.row(slot))
    }

    fn row_mut(&mut self, key: Key) -> (&mut [V], &mut [V]) {
        let slot = self.slot_or_insert(key);
        self.rows_mut(slot)
    }

    fn update_rows(&mut self, keys: &[Key], deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        let width = self.width;
        if keys.is_empty() || deltas.len() != keys.len() * width {
            return;
        }
        self.slots.reserve(keys.len());
        for (&key, delta) in keys.iter().zip(deltas.chunks_exact(width)) {
            let slot = self.slot_or_insert(key);
            let (row, aux) = self.rows_mut(slot);
            f(row, aux, delta);
        }
    }

    fn update_range(&mut self, range: KeyRange, deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        let width = self.width;
        let total = usize::try_from(range.len()).ok();
        if range.is_empty() || total.and_then(|n| n.checked_mul(width)) != Some(deltas.len()) {
            return;
        }
        for (key, delta) in range.keys().zip(deltas.chunks_exact(width)) {
            let slot = self.slot_or_insert(key);
            let (row, aux) = self.rows_mut(slot);
            f(row, aux, delta);
        }
    }

    fn values_of(&self, keys: &[Key], width: usize, out: &mut Vec<V>) {
        out.reserve(keys.len() * width);
        if width != self.width {
            out.resize(out.len() + keys.len() * width, V::default());
            return;
        }
        let stride = self.stride();
        if width == 1 {
            // One value a row, the common sparse case: no slice copy per key.
            out.extend(keys.iter().map(|key| {
                self.slots
                    .get(key)
                    .map_or(V::default(), |&slot| self.rows[slot * stride])
            }));
            return;
        }
        for key in keys {
            match self.slots.get(key) {
                Some(&slot) => out.extend_from_slice(self.row(slot)),
                None => out.resize(out.len() + width, V::default()),
            }
        }
    }

    fn for_each_run_in(&self, range: KeyRange, f: &mut RunVisitor<'_, V>) {
        // Rows are not stored in key order: gather them into runs of a bounded size.
        const RUN: usize = 1024;
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for chunk in self.sorted_in(range).chunks(RUN) {
            keys.clear();
            values.clear();
            for &slot in chunk {
                keys.push(self.keys[slot]);
                values.extend_from_slice(self.row(slot));
            }
            f(&keys, &values);
        }
    }

    fn for_each_in(&self, range: KeyRange, f: &mut dyn FnMut(Key, &[V])) {
        for &slot in self.sorted_in(range) {
            f(self.keys[slot], self.row(slot));
        }
    }

    fn for_each_row_in(&self, range: KeyRange, f: &mut RowVisitor<'_, V>) {
        for &slot in self.sorted_in(range) {
            f(self.keys[slot], self.row(slot), self.aux_row(slot));
        }
    }

    fn empty(&self) -> Self {
        HashedStore::new(self.width, self.aux_width)
    }

    fn split_off(&mut self, at: Key) -> Self {
        let mut low = self.empty();
        let mut high = self.empty();
        for slot in 0..self.keys.len() {
            let key = self.keys[slot];
            let half = if key < at { &mut low } else { &mut high };
            let (row, aux) = (self.row(slot), self.aux_row(slot));
            let (to_row, to_aux) = half.row_mut(key);
            to_row.copy_from_slice(row);
            to_aux.copy_from_slice(aux);
        }
        *self = low;
        high
    }

    fn len(&self) -> usize {
        self.keys.len()
    }
}

impl<V: Value> PartialEq for HashedStore<V> {
    fn eq(&self, other: &Self) -> bool {
        self.width == other.width && self.aux_width == other.aux_width && self.same_rows(other)
    }
}

impl<V: Value> Eq for HashedStore<V> {}

impl<V: Value> Hash for HashedStore<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.width.hash(state);
        self.fingerprint(state);
    }
}
