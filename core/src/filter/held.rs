//! The changes a filter holds back on the worker, per key (ARCHITECTURE.md §10): the table
//! the significantly-modified and the KKT filters share.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::hash::{KeyHasher, mix64};
use crate::key::Key;
use crate::value::Value;

/// Bits of [`HeldRows`]'s `maybe_held`: 2 MiB, so that a few million held keys leave most
/// bits clear.
const MAYBE_BITS: u64 = 1 << 24;

/// Per key, a change not sent yet: rows of `width` values, summed as they come.
///
/// Hashed rather than ordered: every row of every push looks its key up, in a table that can
/// hold most of a model's rare features; in an ordered map, with a vector per row, that
/// lookup took 45% of a run. A row's first value and the push that began holding it lie in
/// the table itself and the rest in an arena of slots, so that a linear model's row costs
/// one lookup and no other memory. Equal and hashed by what is held, key by key, and the
/// values' bits (floats are not `Eq`); not by slots or the table's order.
#[derive(Clone, Debug)]
pub(crate) struct HeldRows<V: Value> {
    width: usize,
    held: HashMap<Key, Held<V>, BuildHasherDefault<KeyHasher>>,
    /// Per slot, a held row's values after its first (`width - 1` of them).
    rest: Vec<V>,
    /// Slots of `rest` free for reuse.
    free: Vec<u32>,
    /// A bit per hash of a key held since the table was last drained, set before the key is
    /// held: a key whose bit is clear is not held, and its row skips the table. It says
    /// nothing the table does not, so equality and hashing leave it out.
    maybe_held: Vec<u64>,
}

/// A key's change not sent yet.
#[derive(Clone, Copy, Debug)]
struct Held<V> {
    /// When it began to be held, as the filter counts time.
    since: u64,
    /// Its first value.
    first: V,
    /// Where `rest` keeps the others.
    slot: u32,
}

/// What a key holds once a row was added to it.
pub(crate) struct Sum<'a, V> {
    /// When it began to be held.
    pub(crate) since: u64,
    first: V,
    rest: &'a [V],
}

impl<V: Value> Sum<'_, V> {
    /// The summed row, value by value.
    pub(crate) fn values(&self) -> impl Iterator<Item = V> + '_ {
        std::iter::once(self.first).chain(self.rest.iter().copied())
    }
}

impl<V: Value> HeldRows<V> {
    /// An empty table of rows of `width` values.
    pub(crate) fn new(width: usize) -> Self {
        HeldRows {
            width,
            held: HashMap::default(),
            rest: Vec::new(),
            free: Vec::new(),
            maybe_held: Vec::new(),
        }
    }

    /// Keys held.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The range of `rest` that `slot` holds.
    fn rest_of(&self, slot: u32) -> std::ops::Range<usize> {
        let stride = self.width - 1;
        slot as usize * stride..(slot as usize + 1) * stride
    }

    /// The change `held` holds, value by value.
    fn row<'a>(&'a self, held: &'a Held<V>) -> impl Iterator<Item = V> + 'a {
        std::iter::once(held.first).chain(self.rest[self.rest_of(held.slot)].iter().copied())
    }

    /// The word and bit of `maybe_held` for `key`.
    fn maybe_bit(key: Key) -> (usize, u64) {
        let h = mix64(key) & (MAYBE_BITS - 1);
        ((h / 64) as usize, 1 << (h % 64))
    }

    /// Adds `row` to what `key` holds, and gives the sum; `None`, adding nothing, if `key`
    /// holds nothing.
    pub(crate) fn add(&mut self, key: Key, row: &[V]) -> Option<Sum<'_, V>> {
        let (word, bit) = Self::maybe_bit(key);
        if self.maybe_held.get(word).is_none_or(|w| w & bit == 0) {
            return None;
        }
        let held = self.held.get_mut(&key)?;
        held.first = held.first.add(row[0]);
        let stride = self.width - 1;
        let at = held.slot as usize * stride;
        let rest = &mut self.rest[at..at + stride];
        for (s, &v) in rest.iter_mut().zip(&row[1..]) {
            *s = s.add(v);
        }
        Some(Sum {
            since: held.since,
            first: held.first,
            rest,
        })
    }

    /// Holds `row` for `key`, which holds nothing, from `since` on.
    pub(crate) fn hold(&mut self, key: Key, row: &[V], since: u64) {
        if self.maybe_held.is_empty() {
            self.maybe_held = vec![0; (MAYBE_BITS / 64) as usize];
        }
        let (word, bit) = Self::maybe_bit(key);
        self.maybe_held[word] |= bit;
        let slot = if self.width == 1 {
            0
        } else if let Some(slot) = self.free.pop() {
            let range = self.rest_of(slot);
            self.rest[range].copy_from_slice(&row[1..]);
            slot
        } else {
            self.rest.extend_from_slice(&row[1..]);
            // Slots number the rows a worker holds at once: far fewer than 2^32.
            u32::try_from(self.rest.len() / (self.width - 1) - 1).unwrap_or(u32::MAX)
        };
        self.held.insert(
            key,
            Held {
                since,
                first: row[0],
                slot,
            },
        );
    }

    /// Stops holding `key`, appending what it held to `values`; false if it held nothing.
    pub(crate) fn release(&mut self, key: Key, values: &mut Vec<V>) -> bool {
        let Some(held) = self.held.remove(&key) else {
            return false;
        };
        values.push(held.first);
        values.extend_from_slice(&self.rest[self.rest_of(held.slot)]);
        if self.width > 1 {
            self.free.push(held.slot);
        }
        true
    }

    /// Everything held, in key order, as keys and their rows' values; the table is empty
    /// after.
    pub(crate) fn drain(&mut self) -> (Vec<Key>, Vec<V>) {
        let mut held: Vec<(Key, Held<V>)> = self.held.drain().collect();
        held.sort_unstable_by_key(|&(key, _)| key);
        let mut keys = Vec::with_capacity(held.len());
        let mut values = Vec::with_capacity(held.len() * self.width);
        for (key, row) in &held {
            keys.push(*key);
            values.extend(self.row(row));
        }
        self.rest.clear();
        self.free.clear();
        self.maybe_held.clear();
        (keys, values)
    }
}

fn bits<V: Value>(row: impl Iterator<Item = V>) -> impl Iterator<Item = u64> {
    row.map(|v| v.to_bits())
}

impl<V: Value> PartialEq for HeldRows<V> {
    fn eq(&self, other: &Self) -> bool {
        self.width == other.width
            && self.held.len() == other.held.len()
            && self.held.iter().all(|(key, mine)| {
                other.held.get(key).is_some_and(|theirs| {
                    mine.since == theirs.since && bits(self.row(mine)).eq(bits(other.row(theirs)))
                })
            })
    }
}

impl<V: Value> Eq for HeldRows<V> {}

impl<V: Value> Hash for HeldRows<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.width.hash(state);
        // Summed, so that the table's order does not count.
        let held = self.held.iter().fold(0u64, |acc, (&key, held)| {
            let row = bits(self.row(held)).fold(mix64(key ^ held.since), |h, b| mix64(h ^ b));
            acc.wrapping_add(row)
        });
        (self.held.len(), held).hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_of(rows: &HeldRows<f64>) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        rows.hash(&mut h);
        h.finish()
    }

    #[test]
    fn rows_add_up_where_they_are_held_and_go_whole() {
        let mut rows = HeldRows::<f64>::new(2);
        assert!(rows.add(7, &[1.0, 2.0]).is_none());
        rows.hold(7, &[1.0, 2.0], 3);
        rows.hold(9, &[5.0, 6.0], 4);
        let sum = rows.add(7, &[0.5, -1.0]).expect("held");
        assert_eq!(
            (sum.since, sum.values().collect::<Vec<_>>()),
            (3, vec![1.5, 1.0])
        );
        let mut values = Vec::new();
        assert!(rows.release(7, &mut values));
        assert!(!rows.release(7, &mut values));
        assert_eq!(values, [1.5, 1.0]);
        // The freed slot serves the next key held, and nothing of the row before stays.
        rows.hold(2, &[8.0, 9.0], 5);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows.drain(), (vec![2, 9], vec![8.0, 9.0, 5.0, 6.0]));
        assert!(rows.is_empty());
        assert!(rows.add(9, &[1.0, 1.0]).is_none());
    }

    #[test]
    fn tables_holding_the_same_rows_are_equal_whatever_their_slots_and_order() {
        let mut a = HeldRows::<f64>::new(2);
        let mut b = HeldRows::<f64>::new(2);
        a.hold(1, &[1.0, 1.0], 0);
        a.hold(2, &[2.0, 2.0], 0);
        let mut out = Vec::new();
        a.release(1, &mut out);
        a.hold(3, &[3.0, 3.0], 0);
        b.hold(2, &[2.0, 2.0], 0);
        b.hold(3, &[3.0, 3.0], 0);
        assert_ne!(a.held[&2].slot, b.held[&2].slot, "held in different slots");
        assert_eq!(a, b);
        assert_eq!(hash_of(&a), hash_of(&b));
        // Another value, or another start, is another table.
        let mut c = b.clone();
        c.add(3, &[0.0, 1.0]);
        assert_ne!(a, c);
        let mut d = HeldRows::<f64>::new(2);
        d.hold(3, &[3.0, 3.0], 1);
        d.hold(2, &[2.0, 2.0], 0);
        assert_ne!(a, d);
        assert_ne!(hash_of(&a), hash_of(&d));
    }

    #[test]
    fn the_arena_stays_as_large_as_the_most_rows_held_at_once() {
        // A worker holds and releases rare features for the whole of a run: what a released
        // row took serves the next, for rows of any width.
        for width in [1, 2, 3] {
            let mut rows = HeldRows::<f64>::new(width);
            let row = vec![1.0; width];
            let mut out = Vec::new();
            for key in 0..1000 {
                rows.hold(key, &row, key);
                rows.hold(key + 5000, &row, key);
                assert!(rows.release(key, &mut out));
                assert!(rows.release(key + 5000, &mut out));
            }
            assert_eq!(rows.rest.len(), 2 * (width - 1), "width {width}");
            assert!(
                rows.free.len() <= 2,
                "width {width}: {} free",
                rows.free.len()
            );
            assert_eq!(out.len(), 2000 * width);
        }
    }
}
