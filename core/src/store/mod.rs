//! Where a server keeps its parameters.
//!
//! Storage is not protocol: the trait is small, so that another layout can serve behind the same
//! server code. Its batch methods have per-row defaults, so another layout needs only `get`,
//! `row_mut` and iteration; [`OrderedStore`] overrides them to work on runs of consecutive rows,
//! which is what makes a dense push one pass over memory, and [`HashedStore`] to find each of a
//! sparse batch's scattered keys in one lookup (ARCHITECTURE.md §3). A job picks one of the two
//! ([`StoreLayout`]); [`Store`] is whichever it picked.

use core::fmt::Debug;
use core::hash::Hasher;
use core::ops::ControlFlow;

use crate::key::{Key, KeyRange};
use crate::value::Value;

mod hashed;
mod layout;
mod ordered;
mod shared;

pub use hashed::HashedStore;
pub use layout::{Store, StoreLayout};
pub use ordered::OrderedStore;
pub use shared::SharedRows;

/// What [`ParamStore::for_each_row_in`] calls for each row: its key, values and updater state.
pub type RowVisitor<'a, V> = dyn FnMut(Key, &[V], &[V]) + 'a;

/// What [`ParamStore::for_each_run_with_state_in`] calls for each run of rows: their keys,
/// values and updater state, in key order.
pub type StateRunVisitor<'a, V> = dyn FnMut(&[Key], &[V], &[V]) + 'a;

/// What [`ParamStore::update_rows`] calls for each run of rows stored one after another: their
/// values, their updater state, and the pushed values for them, all in key order.
pub type RowsUpdate<'a, V> = dyn FnMut(&mut [V], &mut [V], &[V]) + 'a;

/// What [`ParamStore::for_each_run_in`] calls for each run of stored rows (consecutive in the
/// store, or gathered by it): their keys and their values, in key order; it breaks to stop
/// the walk (a reply that is full).
pub type RunVisitor<'a, V> = dyn FnMut(&[Key], &[V]) -> ControlFlow<()> + 'a;

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

    /// Calls `f` on the rows of `keys` (strictly increasing), creating absent ones as zeros,
    /// with `deltas` cut to match: `deltas.len() / keys.len()` values per key. A store may
    /// hand several consecutive rows to one call.
    fn update_rows(&mut self, keys: &[Key], deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        let width = deltas.len() / keys.len().max(1);
        if width == 0 {
            return;
        }
        for (&key, delta) in keys.iter().zip(deltas.chunks_exact(width)) {
            let (row, aux) = self.row_mut(key);
            f(row, aux, delta);
        }
    }

    /// Calls `f` on the rows of every key of `range`, as [`ParamStore::update_rows`] does for
    /// a list: a dense push arrives as a range and need not be listed key by key.
    fn update_range(&mut self, range: KeyRange, deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        let keys: Vec<Key> = range.keys().collect();
        self.update_rows(&keys, deltas, f);
    }

    /// Appends the values of `keys` (strictly increasing) to `out`, `width` zeros for a key
    /// never written.
    fn values_of(&self, keys: &[Key], width: usize, out: &mut Vec<V>) {
        out.reserve(keys.len() * width);
        for &key in keys {
            match self.get(key) {
                Some(row) => out.extend_from_slice(row),
                None => out.resize(out.len() + width, V::default()),
            }
        }
    }

    /// Calls `f` on the stored rows in `range`, in key order, several at a time where the
    /// layout allows, until it breaks.
    fn for_each_run_in(&self, range: KeyRange, f: &mut RunVisitor<'_, V>) {
        let mut stopped = false;
        self.for_each_in(range, &mut |key, row| {
            if !stopped {
                stopped = f(&[key], row).is_break();
            }
        });
    }

    /// Calls `f` on every stored row in `range`, in key order.
    fn for_each_in(&self, range: KeyRange, f: &mut dyn FnMut(Key, &[V]));

    /// Calls `f` on every stored row in `range` with its updater state, in key order.
    fn for_each_row_in(&self, range: KeyRange, f: &mut RowVisitor<'_, V>);

    /// Calls `f` on the stored rows in `range` with their updater state, in key order,
    /// several at a time where the layout allows: a whole shard is copied this way (a
    /// replica's copy, a checkpoint).
    fn for_each_run_with_state_in(&self, range: KeyRange, f: &mut StateRunVisitor<'_, V>) {
        self.for_each_row_in(range, &mut |key, row, aux| f(&[key], row, aux));
    }

    /// The stored rows in `range` with their updater state, `width` values and
    /// `aux_width x width` of state a row, for a checkpoint to write while the store goes on.
    /// The default copies them; [`OrderedStore`] shares its leaves and copies one only if it
    /// is written to while they are held.
    fn shared_rows_in(&self, range: KeyRange, width: usize, aux_width: usize) -> SharedRows<V> {
        let mut keys = Vec::with_capacity(self.len());
        let mut values = Vec::with_capacity(self.len() * width);
        let mut aux = Vec::with_capacity(self.len() * width * aux_width);
        self.for_each_run_with_state_in(range, &mut |run, rows, state| {
            keys.extend_from_slice(run);
            values.extend_from_slice(rows);
            aux.extend_from_slice(state);
        });
        let mut shared = SharedRows::new(width, aux_width);
        shared.push_owned(keys, values, aux);
        shared
    }

    /// Writes `rows` (of this store's row shape) over the store's, row by row by default;
    /// [`OrderedStore`], when empty, takes their leaves as they are.
    fn load_rows(&mut self, rows: &SharedRows<V>) {
        load_row_by_row(self, rows);
    }

    /// An empty store of the same shape.
    fn empty(&self) -> Self;

    /// An empty store of the same shape for the rows of `range`, which the job says its keys
    /// fill (it declared its key space, and a flat array of it fits the server's budget): a
    /// layout may lay them out up front instead of growing into them. The default is
    /// [`ParamStore::empty`].
    fn empty_for(&self, range: KeyRange) -> Self {
        let _ = range;
        self.empty()
    }

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

/// A row as the ordered layouts walk theirs: its key, values and update-rule state.
type Row<'a, V> = (Key, &'a [V], &'a [V]);

/// Whether two walks of rows in key order hold the same keys with the same bits (the callers
/// checked that both hold as many).
fn same_rows_by_bits<'a, 'b, V: Value>(
    a: impl Iterator<Item = Row<'a, V>>,
    b: impl Iterator<Item = Row<'b, V>>,
) -> bool {
    let same = |x: &[V], y: &[V]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
    a.zip(b)
        .all(|((k, r, s), (ok, or, os))| k == ok && same(r, or) && same(s, os))
}

/// Feeds every row of a walk in key order, key and bits, into `state`.
fn hash_rows<'a, V: Value, H: Hasher>(rows: impl Iterator<Item = Row<'a, V>>, state: &mut H) {
    use core::hash::Hash;
    for (k, row, aux) in rows {
        k.hash(state);
        for v in row.iter().chain(aux) {
            v.to_bits().hash(state);
        }
    }
}

/// Whether rows of the shape `asked` for, `(width, aux_width)`, are the store's `own`: a
/// caller asks for nothing else, and a store hands out no rows of another shape.
fn same_shape(asked: (usize, usize), own: (usize, usize)) -> bool {
    debug_assert_eq!(asked, own, "another shape");
    asked == own
}

/// Writes `rows` over `store`'s one row at a time.
fn load_row_by_row<V: Value, S: ParamStore<V>>(store: &mut S, rows: &SharedRows<V>) {
    let (width, row_aux) = (rows.width(), rows.width() * rows.aux_width());
    rows.for_each_run(&mut |keys, values, aux| {
        for (i, &key) in keys.iter().enumerate() {
            let (row, state) = store.row_mut(key);
            row.copy_from_slice(&values[i * width..(i + 1) * width]);
            state.copy_from_slice(&aux[i * row_aux..(i + 1) * row_aux]);
        }
    });
}

#[cfg(test)]
mod tests;
