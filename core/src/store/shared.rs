//! [`SharedRows`]: a store's rows taken without copying them, so that a checkpoint costs the
//! disk's time and not a copy of the model first (ARCHITECTURE.md §11).

use core::hash::{Hash, Hasher};
use std::sync::Arc;

use super::StateRunVisitor;
use super::ordered::Leaf;
use crate::key::{Key, KeyRange};
use crate::value::Value;

/// The rows of a key range in key order, each with its update-rule state, as a store hands
/// them to a checkpoint ([`super::ParamStore::shared_rows_in`]).
///
/// An [`super::OrderedStore`] shares its leaves of a few thousand rows by reference count:
/// taking a model's rows costs a count per leaf, and a leaf is copied only if the store
/// writes to it while the rows are still held (a server takes them when every worker waits
/// at the cut, and nothing is written before the checkpoint is recorded, so in practice
/// never). Other layouts copy their rows into one run.
///
/// Equality and hashing compare rows by bits, not how they are cut into runs.
///
/// ```
/// use pserver_core::KeyRange;
/// use pserver_core::store::{OrderedStore, ParamStore};
/// let mut store = OrderedStore::<f32>::new(1, 0);
/// *store.row_mut(7).0.first_mut().unwrap() = 1.5;
/// let taken = store.shared_rows_in(KeyRange::FULL, 1, 0);
/// store.row_mut(7).0[0] = 2.5;
/// let mut rows = Vec::new();
/// taken.for_each_run(&mut |keys, values, _| rows.push((keys.to_vec(), values.to_vec())));
/// assert_eq!(rows, vec![(vec![7], vec![1.5])]);
/// ```
#[derive(Clone, Debug)]
pub struct SharedRows<V> {
    width: usize,
    aux_width: usize,
    runs: Vec<Run<V>>,
    len: usize,
}

/// Rows `from..to` of a leaf.
#[derive(Clone, Debug)]
struct Run<V> {
    leaf: Arc<Leaf<V>>,
    from: usize,
    to: usize,
}

impl<V: Value> SharedRows<V> {
    /// No rows, `width` values and `aux_width x width` values of update-rule state a row.
    pub fn new(width: usize, aux_width: usize) -> Self {
        SharedRows {
            width,
            aux_width,
            runs: Vec::new(),
            len: 0,
        }
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Values of update-rule state per value of a row.
    pub fn aux_width(&self) -> usize {
        self.aux_width
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no rows are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The smallest range covering every key, or `None` when empty.
    pub fn span(&self) -> Option<KeyRange> {
        let first = self.runs.first()?.keys().first()?;
        let last = self.runs.last()?.keys().last()?;
        KeyRange::new(*first, last + 1).ok()
    }

    /// Calls `f` on each run of rows in key order: their keys, values and update-rule state.
    pub fn for_each_run(&self, f: &mut StateRunVisitor<'_, V>) {
        for (keys, values, aux) in self.runs() {
            f(keys, values, aux);
        }
    }

    /// Appends rows `from..to` of `leaf`, whose keys are above every key held.
    pub(super) fn push_shared(&mut self, leaf: &Arc<Leaf<V>>, from: usize, to: usize) {
        if from < to {
            self.len += to - from;
            self.runs.push(Run {
                leaf: Arc::clone(leaf),
                from,
                to,
            });
        }
    }

    /// Appends a run of rows: `keys` strictly increasing and above every key held, `values`
    /// `width` a key and `aux` `aux_width x width` a key (the caller checked).
    pub(crate) fn push_owned(&mut self, keys: Vec<Key>, values: Vec<V>, aux: Vec<V>) {
        let to = keys.len();
        self.push_shared(&Arc::new(Leaf { keys, values, aux }), 0, to);
    }

    /// The runs in key order: keys, values and update-rule state.
    pub(crate) fn runs(&self) -> impl ExactSizeIterator<Item = (&[Key], &[V], &[V])> + '_ {
        let (width, row_aux) = (self.width, self.width * self.aux_width);
        self.runs.iter().map(move |run| {
            let (from, to) = (run.from, run.to);
            (
                &run.leaf.keys[from..to],
                &run.leaf.values[from * width..to * width],
                &run.leaf.aux[from * row_aux..to * row_aux],
            )
        })
    }

    /// Keys, values and update-rule state in flat vectors: taken over when one whole leaf
    /// held nowhere else is all there is, copied otherwise.
    pub(crate) fn into_parts(mut self) -> (Vec<Key>, Vec<V>, Vec<V>) {
        if self.runs.len() == 1
            && self.runs[0].from == 0
            && self.runs[0].to == self.runs[0].leaf.len()
        {
            if let Some(run) = self.runs.pop() {
                match Arc::try_unwrap(run.leaf) {
                    Ok(leaf) => return (leaf.keys, leaf.values, leaf.aux),
                    Err(leaf) => self.runs.push(Run { leaf, ..run }),
                }
            }
        }
        let mut keys = Vec::with_capacity(self.len);
        let mut values = Vec::with_capacity(self.len * self.width);
        let mut aux = Vec::with_capacity(self.len * self.width * self.aux_width);
        for (k, v, a) in self.runs() {
            keys.extend_from_slice(k);
            values.extend_from_slice(v);
            aux.extend_from_slice(a);
        }
        (keys, values, aux)
    }

    /// Whether `key` is above every key held, so that a run starting there may follow.
    pub(crate) fn follows(&self, key: Key) -> bool {
        self.runs
            .last()
            .and_then(|r| r.keys().last())
            .is_none_or(|&last| key > last)
    }

    /// The runs as leaves a store can take whole: a run that is a whole leaf is shared, a
    /// part of one copied.
    pub(super) fn leaves(&self) -> impl Iterator<Item = Arc<Leaf<V>>> + '_ {
        let (width, row_aux) = (self.width, self.width * self.aux_width);
        self.runs.iter().map(move |run| {
            if run.from == 0 && run.to == run.leaf.len() {
                Arc::clone(&run.leaf)
            } else {
                let (from, to) = (run.from, run.to);
                Arc::new(Leaf {
                    keys: run.leaf.keys[from..to].to_vec(),
                    values: run.leaf.values[from * width..to * width].to_vec(),
                    aux: run.leaf.aux[from * row_aux..to * row_aux].to_vec(),
                })
            }
        })
    }

    /// Every row in key order, with its update-rule state.
    fn rows(&self) -> impl Iterator<Item = (Key, &[V], &[V])> + '_ {
        let (width, row_aux) = (self.width, self.width * self.aux_width);
        self.runs.iter().flat_map(move |run| {
            (run.from..run.to).map(move |i| {
                (
                    run.leaf.keys[i],
                    &run.leaf.values[i * width..(i + 1) * width],
                    &run.leaf.aux[i * row_aux..(i + 1) * row_aux],
                )
            })
        })
    }
}

impl<V> Run<V> {
    fn keys(&self) -> &[Key] {
        &self.leaf.keys[self.from..self.to]
    }
}

impl<V: Value> PartialEq for SharedRows<V> {
    fn eq(&self, other: &Self) -> bool {
        let same_bits = |a: &[V], b: &[V]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        self.width == other.width
            && self.aux_width == other.aux_width
            && self.len == other.len
            && self
                .rows()
                .zip(other.rows())
                .all(|((k, r, a), (ok, or, oa))| k == ok && same_bits(r, or) && same_bits(a, oa))
    }
}

impl<V: Value> Eq for SharedRows<V> {}

impl<V: Value> Hash for SharedRows<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.width.hash(state);
        self.aux_width.hash(state);
        for (k, row, aux) in self.rows() {
            k.hash(state);
            for v in row.iter().chain(aux) {
                v.to_bits().hash(state);
            }
        }
    }
}
