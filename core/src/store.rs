//! Where a server keeps its parameters.
//!
//! Storage is not protocol: the trait is small so that a plain ordered map serves the models and
//! a cache-friendlier layout can serve the runtime, behind the same server code.

use core::fmt::Debug;
use core::hash::{Hash, Hasher};
use std::collections::BTreeMap;

use crate::key::{Key, KeyRange};
use crate::value::Value;

/// What [`ParamStore::for_each_row_in`] calls for each row: its key, values and updater state.
pub type RowVisitor<'a, V> = dyn FnMut(Key, &[V], &[V]) + 'a;

/// A server's parameter rows: `width` values and `aux_width x width` updater state per key.
///
/// A server keeps one store per shard (ARCHITECTURE.md §8): a store is split when the ring cuts
/// a shard in two, copied row by row when a shard moves to another server, and created empty for
/// a shard that arrives. Nothing else is asked of it: equality and hashing, which the model
/// checker needs, come from [`ParamStore::fingerprint`] and [`ParamStore::same_rows`], whose
/// defaults read the rows through [`ParamStore::for_each_row_in`].
pub trait ParamStore<V: Value>: Clone + Debug {
    /// Values of `key`, if it was ever written.
    fn get(&self, key: Key) -> Option<&[V]>;

    /// Values and updater state of `key`, created as zeros if absent.
    fn row_mut(&mut self, key: Key) -> (&mut [V], &mut [V]);

    /// Calls `f` on every stored row in `range`, in key order.
    fn for_each_in(&self, range: KeyRange, f: &mut dyn FnMut(Key, &[V]));

    /// Calls `f` on every stored row in `range` with its updater state, in key order.
    fn for_each_row_in(&self, range: KeyRange, f: &mut RowVisitor<'_, V>);

    /// An empty store of the same shape.
    fn empty(&self) -> Self;

    /// Moves every row at or above `at` into a new store of the same shape.
    fn split_off(&mut self, at: Key) -> Self;

    /// Number of stored keys.
    fn len(&self) -> usize;

    /// True when nothing is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Feeds every row (key, then the bits of its values and updater state) into `state`, so
    /// that two stores holding the same rows hash alike however they lay them out.
    fn fingerprint(&self, state: &mut dyn Hasher) {
        self.for_each_row_in(KeyRange::FULL, &mut |key, row, aux| {
            state.write_u64(key);
            for v in row.iter().chain(aux) {
                state.write_u64(v.to_bits());
            }
        });
    }

    /// True when both stores hold the same keys with the same bits.
    fn same_rows(&self, other: &Self) -> bool {
        let rows = |s: &Self| {
            let mut all = Vec::new();
            s.for_each_row_in(KeyRange::FULL, &mut |key, row, aux| {
                all.push(key);
                all.extend(row.iter().chain(aux).map(|v| v.to_bits()));
            });
            all
        };
        self.len() == other.len() && rows(self) == rows(other)
    }
}

/// Rows in two flat arenas indexed by an ordered map: no allocation per key, and iteration in key
/// order. Equality and hashing compare values by bits and ignore arena order.
#[derive(Clone, Debug)]
pub struct OrderedStore<V> {
    width: usize,
    aux_width: usize,
    index: BTreeMap<Key, usize>,
    values: Vec<V>,
    aux: Vec<V>,
}

impl<V: Value> OrderedStore<V> {
    /// An empty store of rows `width` wide with `aux_width` updater values per value.
    pub fn new(width: usize, aux_width: usize) -> Self {
        OrderedStore {
            width,
            aux_width,
            index: BTreeMap::new(),
            values: Vec::new(),
            aux: Vec::new(),
        }
    }

    fn row(&self, row: usize) -> &[V] {
        &self.values[row * self.width..(row + 1) * self.width]
    }

    fn aux_row(&self, row: usize) -> &[V] {
        let n = self.width * self.aux_width;
        &self.aux[row * n..(row + 1) * n]
    }
}

impl<V: Value> ParamStore<V> for OrderedStore<V> {
    fn get(&self, key: Key) -> Option<&[V]> {
        self.index.get(&key).map(|&row| self.row(row))
    }

    fn row_mut(&mut self, key: Key) -> (&mut [V], &mut [V]) {
        let next = self.index.len();
        let row = *self.index.entry(key).or_insert(next);
        if row == next {
            self.values.resize((next + 1) * self.width, V::default());
            self.aux
                .resize((next + 1) * self.width * self.aux_width, V::default());
        }
        let n = self.width * self.aux_width;
        (
            &mut self.values[row * self.width..(row + 1) * self.width],
            &mut self.aux[row * n..(row + 1) * n],
        )
    }

    fn for_each_in(&self, range: KeyRange, f: &mut dyn FnMut(Key, &[V])) {
        for (&key, &row) in self.index.range(range.start()..range.end()) {
            f(key, self.row(row));
        }
    }

    fn for_each_row_in(&self, range: KeyRange, f: &mut RowVisitor<'_, V>) {
        for (&key, &row) in self.index.range(range.start()..range.end()) {
            f(key, self.row(row), self.aux_row(row));
        }
    }

    fn empty(&self) -> Self {
        OrderedStore::new(self.width, self.aux_width)
    }

    fn split_off(&mut self, at: Key) -> Self {
        let mut high = self.empty();
        let mut low = self.empty();
        for (&key, &row) in &self.index {
            let into = if key >= at { &mut high } else { &mut low };
            let (values, aux) = into.row_mut(key);
            values.copy_from_slice(self.row(row));
            aux.copy_from_slice(self.aux_row(row));
        }
        *self = low;
        high
    }

    fn len(&self) -> usize {
        self.index.len()
    }
}

impl<V: Value> PartialEq for OrderedStore<V> {
    fn eq(&self, other: &Self) -> bool {
        let same_bits = |a: &[V], b: &[V]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        self.width == other.width
            && self.aux_width == other.aux_width
            && self.index.len() == other.index.len()
            && self
                .index
                .iter()
                .zip(&other.index)
                .all(|((k, &r), (ok, &or))| {
                    k == ok
                        && same_bits(self.row(r), other.row(or))
                        && same_bits(self.aux_row(r), other.aux_row(or))
                })
    }
}

impl<V: Value> Eq for OrderedStore<V> {}

impl<V: Value> Hash for OrderedStore<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.width.hash(state);
        for (k, &r) in &self.index {
            k.hash(state);
            for v in self.row(r).iter().chain(self.aux_row(r)) {
                v.to_bits().hash(state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_start_at_zero_and_iterate_in_key_order() {
        let mut s = OrderedStore::<i64>::new(2, 1);
        s.row_mut(9).0[1] = 4;
        s.row_mut(3).0[0] = 1;
        assert_eq!(s.get(9), Some(&[0, 4][..]));
        assert_eq!(s.row_mut(3).1, &[0, 0]);
        let mut seen = Vec::new();
        s.for_each_in(KeyRange::new(0, 10).unwrap(), &mut |k, v| {
            seen.push((k, v.to_vec()))
        });
        assert_eq!(seen, vec![(3, vec![1, 0]), (9, vec![0, 4])]);
    }

    fn edge_key() -> impl proptest::strategy::Strategy<Value = Key> {
        use proptest::prelude::*;
        prop_oneof![
            0u64..64,
            (crate::MAX_KEY - 64)..=crate::MAX_KEY,
            any::<u64>().prop_map(|k| k % u64::MAX),
        ]
    }

    proptest::proptest! {
        /// Rows at the edges of the key space, up to the largest legal key, are kept and found
        /// by ranges, including ranges that end at the end of the key space.
        #[test]
        fn ranges_find_exactly_the_rows_they_hold_up_to_the_end_of_the_key_space(
            keys in proptest::collection::btree_set(edge_key(), 0..32),
            start in edge_key(),
            to_end in proptest::bool::ANY,
            end in edge_key(),
        ) {
            let mut s = OrderedStore::<i64>::new(1, 0);
            for &k in &keys {
                s.row_mut(k).0[0] = (k % 1000) as i64 + 1;
            }
            let end = if to_end { u64::MAX } else { end.max(start) };
            let range = KeyRange::new(start.min(end), end).unwrap();
            let mut seen = Vec::new();
            s.for_each_in(range, &mut |k, v| seen.push((k, v[0])));
            let want: Vec<(Key, i64)> = keys
                .iter()
                .filter(|&&k| range.contains(k))
                .map(|&k| (k, (k % 1000) as i64 + 1))
                .collect();
            proptest::prop_assert_eq!(seen, want);
            proptest::prop_assert_eq!(s.len(), keys.len());
            for &k in &keys {
                proptest::prop_assert_eq!(s.get(k), Some(&[(k % 1000) as i64 + 1][..]));
            }
        }
    }

    #[test]
    fn equality_ignores_the_order_rows_were_created_in() {
        let mut a = OrderedStore::<f32>::new(1, 0);
        let mut b = OrderedStore::<f32>::new(1, 0);
        a.row_mut(1).0[0] = 1.0;
        a.row_mut(2).0[0] = 2.0;
        b.row_mut(2).0[0] = 2.0;
        b.row_mut(1).0[0] = 1.0;
        assert_eq!(a, b);
        b.row_mut(1).0[0] = -1.0;
        assert_ne!(a, b);
    }

    /// Rows wider than one value, with updater state, each keep their own values.
    #[test]
    fn wide_rows_with_updater_state_do_not_overlap() {
        let mut s = OrderedStore::<i64>::new(3, 2);
        for k in 0..6i64 {
            let (values, aux) = s.row_mut(k as Key * 10);
            assert_eq!((values.len(), aux.len()), (3, 6));
            values.copy_from_slice(&[k, k + 1, k + 2]);
            aux.copy_from_slice(&[-k; 6]);
        }
        assert_eq!(s.len(), 6);
        for k in 0..6i64 {
            assert_eq!(s.get(k as Key * 10), Some(&[k, k + 1, k + 2][..]));
            assert_eq!(s.row_mut(k as Key * 10).1, &[-k; 6]);
        }
    }

    fn hash_of(s: &OrderedStore<f32>) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    }

    /// Every difference counts: shape, keys, values and updater state; equal stores hash alike
    /// and (with this hasher) different ones do not.
    #[test]
    fn equality_and_hashing_see_every_difference() {
        let store = |width: usize, aux_width: usize, rows: &[(Key, f32, f32)]| {
            let mut s = OrderedStore::<f32>::new(width, aux_width);
            for &(k, v, a) in rows {
                let (values, aux) = s.row_mut(k);
                values[0] = v;
                if let Some(x) = aux.first_mut() {
                    *x = a;
                }
            }
            s
        };
        let base = store(1, 1, &[(1, 1.0, 5.0), (2, 2.0, 6.0)]);
        assert_eq!(base, store(1, 1, &[(2, 2.0, 6.0), (1, 1.0, 5.0)]));
        assert_eq!(
            hash_of(&base),
            hash_of(&store(1, 1, &[(2, 2.0, 6.0), (1, 1.0, 5.0)]))
        );
        let others = [
            store(2, 1, &[(1, 1.0, 5.0), (2, 2.0, 6.0)]),
            store(1, 2, &[(1, 1.0, 5.0), (2, 2.0, 6.0)]),
            store(1, 1, &[(1, 1.0, 5.0)]),
            store(1, 1, &[(1, 1.0, 5.0), (2, 2.0, 6.0), (3, 0.0, 0.0)]),
            store(1, 1, &[(1, 1.0, 5.0), (3, 2.0, 6.0)]),
            store(1, 1, &[(1, 1.0, 5.0), (2, 2.5, 6.0)]),
            store(1, 1, &[(1, 1.0, 5.0), (2, 2.0, 6.5)]),
        ];
        for other in &others {
            assert_ne!(&base, other);
            assert_ne!(hash_of(&base), hash_of(other), "{other:?}");
        }
        // Bits, not numeric equality: 0.0 and -0.0 differ, a NaN equals itself.
        assert_ne!(
            store(1, 0, &[(1, 0.0, 0.0)]),
            store(1, 0, &[(1, -0.0, 0.0)])
        );
        let nan = store(1, 0, &[(1, f32::NAN, 0.0)]);
        assert_eq!(nan, nan.clone());
        assert!(!nan.is_empty() && OrderedStore::<f32>::new(1, 0).is_empty());
    }
}
