//! [`StoreLayout`] and [`Store`]: the layout a job chooses for its servers' rows.

use core::hash::{Hash, Hasher};

use super::{
    HashedStore, OrderedStore, ParamStore, RowVisitor, RowsUpdate, RunVisitor, SharedRows,
    StateRunVisitor,
};
use crate::key::{Key, KeyRange};
use crate::value::Value;

/// How a job's servers lay out their rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StoreLayout {
    /// In key order ([`OrderedStore`]): dense pushes and pulls of consecutive keys are slices.
    #[default]
    Ordered,
    /// Behind a hash table ([`HashedStore`]): one lookup per key however scattered the keys,
    /// for sparse models whose batches touch a few keys of millions.
    Hashed,
}

/// The store of the layout a job chose: what [`crate::node::Server`] keeps unless an embedder
/// names its own [`ParamStore`].
#[derive(Clone, Debug)]
pub enum Store<V> {
    /// Rows in key order.
    Ordered(OrderedStore<V>),
    /// Rows behind a hash table.
    Hashed(HashedStore<V>),
}

impl<V: Value> Store<V> {
    /// An empty store of `layout` with rows `width` wide and `aux_width` updater values per
    /// value.
    pub fn new(layout: StoreLayout, width: usize, aux_width: usize) -> Self {
        match layout {
            StoreLayout::Ordered => Store::Ordered(OrderedStore::new(width, aux_width)),
            StoreLayout::Hashed => Store::Hashed(HashedStore::new(width, aux_width)),
        }
    }
}

/// Calls the same method on whichever store `self` is.
macro_rules! either {
    ($self:expr, $s:ident => $call:expr) => {
        match $self {
            Store::Ordered($s) => $call,
            Store::Hashed($s) => $call,
        }
    };
}

impl<V: Value> ParamStore<V> for Store<V> {
    fn get(&self, key: Key) -> Option<&[V]> {
        either!(self, s => s.get(key))
    }

    fn row_mut(&mut self, key: Key) -> (&mut [V], &mut [V]) {
        either!(self, s => s.row_mut(key))
    }

    fn update_rows(&mut self, keys: &[Key], deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        either!(self, s => s.update_rows(keys, deltas, f))
    }

    fn update_range(&mut self, range: KeyRange, deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        either!(self, s => s.update_range(range, deltas, f))
    }

    fn values_of(&self, keys: &[Key], width: usize, out: &mut Vec<V>) {
        either!(self, s => s.values_of(keys, width, out))
    }

    fn for_each_run_in(&self, range: KeyRange, f: &mut RunVisitor<'_, V>) {
        either!(self, s => s.for_each_run_in(range, f))
    }

    fn for_each_in(&self, range: KeyRange, f: &mut dyn FnMut(Key, &[V])) {
        either!(self, s => s.for_each_in(range, f))
    }

    fn for_each_row_in(&self, range: KeyRange, f: &mut RowVisitor<'_, V>) {
        either!(self, s => s.for_each_row_in(range, f))
    }

    fn for_each_run_with_state_in(&self, range: KeyRange, f: &mut StateRunVisitor<'_, V>) {
        either!(self, s => s.for_each_run_with_state_in(range, f))
    }

    fn shared_rows_in(&self, range: KeyRange, width: usize, aux_width: usize) -> SharedRows<V> {
        either!(self, s => s.shared_rows_in(range, width, aux_width))
    }

    fn load_rows(&mut self, rows: &SharedRows<V>) {
        either!(self, s => s.load_rows(rows))
    }

    fn empty(&self) -> Self {
        match self {
            Store::Ordered(s) => Store::Ordered(s.empty()),
            Store::Hashed(s) => Store::Hashed(s.empty()),
        }
    }

    fn empty_for(&self, range: KeyRange) -> Self {
        match self {
            Store::Ordered(s) => Store::Ordered(s.empty_for(range)),
            Store::Hashed(s) => Store::Hashed(s.empty_for(range)),
        }
    }

    fn split_off(&mut self, at: Key) -> Self {
        match self {
            Store::Ordered(s) => Store::Ordered(s.split_off(at)),
            Store::Hashed(s) => Store::Hashed(s.split_off(at)),
        }
    }

    fn len(&self) -> usize {
        either!(self, s => s.len())
    }
}

impl<V: Value> PartialEq for Store<V> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Store::Ordered(a), Store::Ordered(b)) => a == b,
            (Store::Hashed(a), Store::Hashed(b)) => a == b,
            _ => false,
        }
    }
}

impl<V: Value> Eq for Store<V> {}

impl<V: Value> Hash for Store<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        core::mem::discriminant(self).hash(state);
        either!(self, s => s.hash(state));
    }
}
