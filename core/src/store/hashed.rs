//! [`HashedStore`]: rows found in one step, at their offset in a filled span or through a hash
//! table.
//!
//! It is the layout for sparse batches: their scattered keys cost one lookup each here, where
//! [`OrderedStore`](super::OrderedStore) pays a search in a leaf of thousands and a merge that
//! shifts the leaf. A span of keys filled at least a quarter (a shard of feature ids) is held as a
//! one-thread trainer's weight array holds it.

use core::hash::{BuildHasherDefault, Hash, Hasher};
use std::collections::HashMap;
use std::sync::OnceLock;

use super::{ParamStore, RowVisitor, RowsUpdate, RunVisitor, SharedRows};
use crate::hash::KeyHasher;
use crate::key::{Key, KeyRange};
use crate::value::Value;

type Slots = HashMap<Key, usize, BuildHasherDefault<KeyHasher>>;

/// The most keys the direct part spans.
const DIRECT_KEYS: Key = 1 << 26;

/// The direct part grows only while it would stay at least a quarter full: memory for it is
/// at most four times what the rows themselves need.
const DIRECT_FILL: usize = 4;

/// Where a row is.
#[derive(Clone, Copy, Debug)]
enum At {
    /// In the direct part, at the key's offset from its base.
    Direct(usize),
    /// In the hashed part, at this slot.
    Hashed(usize),
}

/// Rows found in one step: keys that fill a contiguous span well enough (feature ids, user or
/// item numbers, a shard of them) are kept at their offset in that span, as a flat weight
/// array keeps them; any other key through a hash table from key to row, in the order rows
/// arrived. Either way a key costs one lookup
/// however many rows the store holds and however scattered the keys are, which is what a
/// sparse model's pushes and pulls need (ARCHITECTURE.md §3). A row's values and its updater
/// state lie next to each other, so that updating a scattered key touches one cache line, not
/// one in each of two arrays.
///
/// The direct part covers keys `base..base + n`, `n` a power of two, grown (up or down) only
/// while at least a quarter of it would be filled, so it never costs more than four times the
/// rows it holds; or, for a shard of a key space the job declared
/// ([`ParamStore::empty_for`]), laid out over the shard's range up front, so that the first
/// epoch does not grow into it. Other keys are hashed, and move to the direct part when it
/// grows over them.
///
/// Reading in key order (a range pull, a shard copy) walks the direct part in order, then
/// sorts the hashed rows once and keeps that order until a hashed row is added, so that the
/// parts of a long range pull do not each sort again. A dense range costs a lookup per key
/// here; [`super::OrderedStore`] serves those as slices.
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
    /// Rows of keys `base..base + direct_keys`, each at `(key - base) * stride`; zeros where
    /// none was written.
    direct: Vec<V>,
    base: Key,
    /// Which keys of the direct part were written, a bit each.
    present: Vec<u64>,
    direct_keys: usize,
    direct_len: usize,
    slots: Slots,
    /// The lowest hashed key, where a first direct part would start.
    lowest: Option<Key>,
    keys: Vec<Key>,
    /// Per hashed row, `width` values then `width * aux_width` updater values.
    rows: Vec<V>,
    /// Hashed rows by increasing key, computed when first asked for after one was added.
    sorted: OnceLock<Vec<usize>>,
}

/// Whether bit `i` of `bits` is set.
fn bit(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

fn set_bit(bits: &mut [u64], i: usize) {
    bits[i / 64] |= 1 << (i % 64);
}

impl<V: Value> HashedStore<V> {
    /// An empty store of rows `width` wide with `aux_width` updater values per value.
    pub fn new(width: usize, aux_width: usize) -> Self {
        HashedStore {
            width,
            aux_width,
            direct: Vec::new(),
            base: 0,
            present: Vec::new(),
            direct_keys: 0,
            direct_len: 0,
            slots: Slots::default(),
            lowest: None,
            keys: Vec::new(),
            rows: Vec::new(),
            sorted: OnceLock::new(),
        }
    }

    /// Keys the direct part covers.
    #[cfg(test)]
    pub(crate) fn direct_keys(&self) -> usize {
        self.direct_keys
    }

    /// Values per row, updater state included.
    fn stride(&self) -> usize {
        self.width * (1 + self.aux_width)
    }

    fn is_present(&self, key: usize) -> bool {
        bit(&self.present, key)
    }

    /// The offset of `key` in the direct part, if it lies there.
    fn offset(&self, key: Key) -> Option<usize> {
        key.checked_sub(self.base)
            .and_then(|k| usize::try_from(k).ok())
            .filter(|&k| k < self.direct_keys)
    }

    fn find(&self, key: Key) -> Option<At> {
        match self.offset(key) {
            Some(k) => self.is_present(k).then_some(At::Direct(k)),
            None => self.slots.get(&key).map(|&slot| At::Hashed(slot)),
        }
    }

    /// The row of `key`, added as zeros if absent.
    fn find_or_insert(&mut self, key: Key) -> At {
        if self.offset(key).is_none() {
            // The keys the direct part would have to span to take this one too.
            let (low, high) = if self.direct_keys == 0 {
                (self.lowest.map_or(key, |l| l.min(key)), key)
            } else {
                let last = self.base.saturating_add(self.direct_keys as Key - 1);
                (self.base.min(key), last.max(key))
            };
            let span = (high - low).checked_add(1).filter(|&n| n <= DIRECT_KEYS);
            if let Some(span) = span {
                let wanted = (span as usize).next_power_of_two();
                if (self.len() + 1) * DIRECT_FILL >= wanted {
                    // Reaching down as far as the power of two allows, so that keys arriving
                    // in decreasing order rebuild the part only when it doubles.
                    let base = if key < self.base || self.direct_keys == 0 {
                        high.saturating_add(1)
                            .saturating_sub(wanted as Key)
                            .min(low)
                    } else {
                        self.base
                    };
                    self.rebuild_direct(base, wanted);
                }
            }
        }
        if let Some(k) = self.offset(key) {
            if !self.is_present(k) {
                set_bit(&mut self.present, k);
                self.direct_len += 1;
            }
            return At::Direct(k);
        }
        let next = self.keys.len();
        let slot = *self.slots.entry(key).or_insert(next);
        if slot == next {
            self.lowest = Some(self.lowest.map_or(key, |low| low.min(key)));
            self.keys.push(key);
            self.rows
                .resize(self.rows.len() + self.stride(), V::default());
            self.sorted = OnceLock::new();
        }
        At::Hashed(slot)
    }

    /// Makes the direct part cover keys `base..base + keys`, a span holding the one it had,
    /// and moves the hashed rows there into it.
    fn rebuild_direct(&mut self, base: Key, keys: usize) {
        let stride = self.stride();
        if self.direct_keys == 0 {
            // Zeroed memory from the allocator: pages of a span laid out up front cost
            // nothing until a row of theirs is written.
            self.direct = vec![V::default(); keys * stride];
            self.present = vec![0; keys.div_ceil(64)];
            self.base = base;
        } else if base == self.base {
            self.direct.resize(keys * stride, V::default());
            self.present.resize(keys.div_ceil(64), 0);
        } else {
            let old = std::mem::replace(&mut self.direct, vec![V::default(); keys * stride]);
            let old_present = std::mem::replace(&mut self.present, vec![0; keys.div_ceil(64)]);
            let shift = (self.base - base) as usize;
            for k in (0..self.direct_keys).filter(|&k| bit(&old_present, k)) {
                let to = k + shift;
                self.direct[to * stride..(to + 1) * stride]
                    .copy_from_slice(&old[k * stride..(k + 1) * stride]);
                set_bit(&mut self.present, to);
            }
            self.base = base;
        }
        self.direct_keys = keys;
        if self.keys.iter().all(|&k| self.offset(k).is_none()) {
            return;
        }
        let (old_keys, old_rows) = (
            std::mem::take(&mut self.keys),
            std::mem::take(&mut self.rows),
        );
        self.slots.clear();
        self.lowest = None;
        self.sorted = OnceLock::new();
        for (slot, key) in old_keys.into_iter().enumerate() {
            let row = &old_rows[slot * stride..(slot + 1) * stride];
            let at = self.find_or_insert(key);
            self.full_row_mut(at).copy_from_slice(row);
        }
    }

    fn full_row(&self, at: At) -> &[V] {
        let stride = self.stride();
        match at {
            At::Direct(k) => &self.direct[k * stride..(k + 1) * stride],
            At::Hashed(slot) => &self.rows[slot * stride..(slot + 1) * stride],
        }
    }

    fn full_row_mut(&mut self, at: At) -> &mut [V] {
        let stride = self.stride();
        match at {
            At::Direct(k) => &mut self.direct[k * stride..(k + 1) * stride],
            At::Hashed(slot) => &mut self.rows[slot * stride..(slot + 1) * stride],
        }
    }

    fn rows_mut(&mut self, at: At) -> (&mut [V], &mut [V]) {
        let width = self.width;
        self.full_row_mut(at).split_at_mut(width)
    }

    fn row(&self, at: At) -> &[V] {
        &self.full_row(at)[..self.width]
    }

    fn aux_row(&self, at: At) -> &[V] {
        &self.full_row(at)[self.width..]
    }

    /// Every row in `range`, by increasing key: the hashed part's below the direct part,
    /// the direct part's, and the hashed part's above it.
    fn in_order(&self, range: KeyRange) -> impl Iterator<Item = (Key, At)> + '_ {
        let (start, end) = self.direct_span(range);
        let direct = (start..end)
            .filter(|&k| self.is_present(k))
            .map(|k| (self.base + k as Key, At::Direct(k)));
        let (below, above) = self.hashed_in(range);
        let at = |&slot: &usize| (self.keys[slot], At::Hashed(slot));
        below
            .iter()
            .map(at)
            .chain(direct)
            .chain(above.iter().map(at))
    }

    /// The offsets in the direct part of the keys of `range`, `start..end`, empty when none
    /// lies there.
    fn direct_span(&self, range: KeyRange) -> (usize, usize) {
        let within = |key: Key| key.saturating_sub(self.base).min(self.direct_keys as Key) as usize;
        let start = within(range.start());
        (start, within(range.end()).max(start))
    }

    /// The slots of the hashed rows in `range` by increasing key: those below the direct
    /// part, and those above it.
    fn hashed_in(&self, range: KeyRange) -> (&[usize], &[usize]) {
        let sorted = self.sorted.get_or_init(|| {
            let mut order: Vec<usize> = (0..self.keys.len()).collect();
            order.sort_unstable_by_key(|&slot| self.keys[slot]);
            order
        });
        let from = sorted.partition_point(|&s| self.keys[s] < range.start());
        let to = sorted.partition_point(|&s| self.keys[s] < range.end());
        let hashed = &sorted[from..to.max(from)];
        hashed.split_at(hashed.partition_point(|&s| self.keys[s] < self.base))
    }

    /// The hashed rows of `slots` as one run, values and state apart.
    fn copy_hashed(&self, slots: &[usize]) -> (Vec<Key>, Vec<V>, Vec<V>) {
        let (width, stride) = (self.width, self.stride());
        let mut keys = Vec::with_capacity(slots.len());
        let mut values = Vec::with_capacity(slots.len() * width);
        let mut aux = Vec::with_capacity(slots.len() * (stride - width));
        for &slot in slots {
            keys.push(self.keys[slot]);
            let row = &self.rows[slot * stride..(slot + 1) * stride];
            values.extend_from_slice(&row[..width]);
            aux.extend_from_slice(&row[width..]);
        }
        (keys, values, aux)
    }

    /// The direct part's rows of keys `base + start..base + end` as one run, values and state
    /// apart: the bits of present keys read a word at a time, and nothing allocated beyond
    /// what the rows take.
    fn copy_direct(&self, start: usize, end: usize) -> (Vec<Key>, Vec<V>, Vec<V>) {
        let (width, stride) = (self.width, self.stride());
        let words = start / 64..end.div_ceil(64);
        // The bits of word `w` that lie in `start..end`.
        let masked = |w: usize| {
            let mut bits = self.present[w];
            if w == start / 64 {
                bits &= u64::MAX << (start % 64);
            }
            if w == (end - 1) / 64 && end % 64 != 0 {
                bits &= u64::MAX >> (64 - end % 64);
            }
            bits
        };
        let rows: usize = words.clone().map(|w| masked(w).count_ones() as usize).sum();
        let mut keys = Vec::with_capacity(rows);
        let mut values = Vec::with_capacity(rows * width);
        let mut aux = Vec::with_capacity(rows * (stride - width));
        for w in words {
            let mut bits = masked(w);
            while bits != 0 {
                let k = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                keys.push(self.base + k as Key);
                let row = &self.direct[k * stride..(k + 1) * stride];
                values.extend_from_slice(&row[..width]);
                aux.extend_from_slice(&row[width..]);
            }
        }
        (keys, values, aux)
    }
}

impl<V: Value> ParamStore<V> for HashedStore<V> {
    fn get(&self, key: Key) -> Option<&[V]> {
        self.find(key).map(|at| self.row(at))
    }

    fn row_mut(&mut self, key: Key) -> (&mut [V], &mut [V]) {
        let at = self.find_or_insert(key);
        self.rows_mut(at)
    }

    fn update_rows(&mut self, keys: &[Key], deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        let width = self.width;
        if keys.is_empty() || deltas.len() != keys.len() * width {
            return;
        }
        for (&key, delta) in keys.iter().zip(deltas.chunks_exact(width)) {
            let at = self.find_or_insert(key);
            let (row, aux) = self.rows_mut(at);
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
            let at = self.find_or_insert(key);
            let (row, aux) = self.rows_mut(at);
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
            // One value a row, the common sparse case: no slice copy per key, and a direct
            // row never written reads as the zero it holds.
            out.extend(keys.iter().map(|&key| {
                match self.offset(key) {
                    Some(k) => self.direct[k * stride],
                    None => self
                        .slots
                        .get(&key)
                        .map_or(V::default(), |&slot| self.rows[slot * stride]),
                }
            }));
            return;
        }
        for &key in keys {
            match self.find(key) {
                Some(at) => out.extend_from_slice(self.row(at)),
                None => out.resize(out.len() + width, V::default()),
            }
        }
    }

    fn for_each_run_in(&self, range: KeyRange, f: &mut RunVisitor<'_, V>) {
        // Rows do not lie in key order with only their values: gather runs of a bounded size.
        const RUN: usize = 1024;
        let (mut keys, mut values) = (Vec::with_capacity(RUN), Vec::new());
        for (key, at) in self.in_order(range) {
            keys.push(key);
            values.extend_from_slice(self.row(at));
            if keys.len() == RUN {
                if f(&keys, &values).is_break() {
                    return;
                }
                keys.clear();
                values.clear();
            }
        }
        if !keys.is_empty() {
            let _ = f(&keys, &values);
        }
    }

    fn for_each_in(&self, range: KeyRange, f: &mut dyn FnMut(Key, &[V])) {
        for (key, at) in self.in_order(range) {
            f(key, self.row(at));
        }
    }

    fn for_each_row_in(&self, range: KeyRange, f: &mut RowVisitor<'_, V>) {
        for (key, at) in self.in_order(range) {
            f(key, self.row(at), self.aux_row(at));
        }
    }

    /// A copy (a checkpoint's writer reads it on another thread while the store goes on),
    /// taken a word of presence bits at a time: the server takes it while every worker waits
    /// at the cut.
    fn shared_rows_in(&self, range: KeyRange, width: usize, aux_width: usize) -> SharedRows<V> {
        let mut shared = SharedRows::new(width, aux_width);
        if !super::same_shape((width, aux_width), (self.width, self.aux_width)) {
            return shared;
        }
        let (start, end) = self.direct_span(range);
        let (below, above) = self.hashed_in(range);
        let (keys, values, aux) = self.copy_hashed(below);
        shared.push_owned(keys, values, aux);
        if start < end {
            let (keys, values, aux) = self.copy_direct(start, end);
            shared.push_owned(keys, values, aux);
        }
        let (keys, values, aux) = self.copy_hashed(above);
        shared.push_owned(keys, values, aux);
        shared
    }

    fn empty(&self) -> Self {
        HashedStore::new(self.width, self.aux_width)
    }

    fn empty_for(&self, range: KeyRange) -> Self {
        let mut store = self.empty();
        if let Some(keys) = usize::try_from(range.len())
            .ok()
            .filter(|&n| n > 0 && n as Key <= DIRECT_KEYS)
        {
            store.rebuild_direct(range.start(), keys);
        }
        store
    }

    fn split_off(&mut self, at: Key) -> Self {
        let mut low = self.empty();
        let mut high = self.empty();
        for (key, row) in self.in_order(KeyRange::FULL) {
            let half = if key < at { &mut low } else { &mut high };
            let to = half.find_or_insert(key);
            half.full_row_mut(to).copy_from_slice(self.full_row(row));
        }
        *self = low;
        high
    }

    fn len(&self) -> usize {
        self.direct_len + self.keys.len()
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
