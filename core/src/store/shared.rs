//! [`SharedRows`]: a store's rows taken without copying them, so that a checkpoint costs the
//! disk's time and not a copy of the model first (ARCHITECTURE.md §11).

use core::hash::{Hash, Hasher};
use std::sync::Arc;

use super::StateRunVisitor;
use super::ordered::{Leaf, Leaves, leaf_for};
use crate::key::{Key, KeyRange};
use crate::value::Value;

/// The rows of a key range in key order, each with its update-rule state, as a store hands
/// them to a checkpoint ([`super::ParamStore::shared_rows_in`]).
///
/// An [`super::OrderedStore`] shares its map of leaves by reference count: taking a model's
/// rows costs one count whatever its size, and nothing of it is read until the rows are (by
/// the checkpoint's writer, on another thread). The store copies the map, and each leaf it
/// writes to, only if it writes while the rows are still held (a server takes them when every
/// worker waits at the cut, and nothing is written before the checkpoint is recorded, so in
/// practice never). Other layouts copy their rows into one run.
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
    parts: Vec<Part<V>>,
}

/// A leaf and the rows of it held.
type LeafRun<'a, V> = (&'a Arc<Leaf<V>>, usize, usize);

/// Rows held, in key order.
#[derive(Clone, Debug)]
enum Part<V> {
    /// Rows `from..to` of a leaf.
    Run {
        leaf: Arc<Leaf<V>>,
        from: usize,
        to: usize,
    },
    /// The rows in `range` of a map of leaves, found when read.
    Leaves {
        map: Arc<Leaves<V>>,
        range: KeyRange,
    },
}

impl<V: Value> SharedRows<V> {
    /// No rows, `width` values and `aux_width x width` values of update-rule state a row.
    pub fn new(width: usize, aux_width: usize) -> Self {
        SharedRows {
            width,
            aux_width,
            parts: Vec::new(),
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

    /// Rows held (counted: a pass over the runs).
    pub fn len(&self) -> usize {
        self.leaf_runs().map(|(_, from, to)| to - from).sum()
    }

    /// Whether no rows are held.
    pub fn is_empty(&self) -> bool {
        self.leaf_runs().next().is_none()
    }

    /// The smallest range covering every key, or `None` when empty.
    pub fn span(&self) -> Option<KeyRange> {
        let first = self.leaf_runs().next().map(|(l, from, _)| l.keys[from])?;
        let last = self.leaf_runs().last().map(|(l, _, to)| l.keys[to - 1])?;
        KeyRange::new(first, last + 1).ok()
    }

    /// Calls `f` on each run of rows in key order: their keys, values and update-rule state.
    pub fn for_each_run(&self, f: &mut StateRunVisitor<'_, V>) {
        for (keys, values, aux) in self.runs() {
            f(keys, values, aux);
        }
    }

    /// The runs in key order: keys, values and update-rule state.
    pub(crate) fn runs(&self) -> impl Iterator<Item = (&[Key], &[V], &[V])> + '_ {
        let (width, row_aux) = (self.width, self.width * self.aux_width);
        self.leaf_runs().map(move |(leaf, from, to)| {
            (
                &leaf.keys[from..to],
                &leaf.values[from * width..to * width],
                &leaf.aux[from * row_aux..to * row_aux],
            )
        })
    }

    /// Every run as a leaf and the rows of it held, none empty, in key order.
    fn leaf_runs(&self) -> impl Iterator<Item = LeafRun<'_, V>> + '_ {
        self.parts
            .iter()
            .flat_map(|part| -> Box<dyn Iterator<Item = LeafRun<'_, V>> + '_> {
                match part {
                    Part::Run { leaf, from, to } => Box::new(core::iter::once((leaf, *from, *to))),
                    Part::Leaves { map, range } => {
                        let range = *range;
                        let start = leaf_for(map, range.start()).unwrap_or(range.start());
                        let mut leaves = map.range(start..range.end().max(start)).peekable();
                        Box::new(core::iter::from_fn(move || {
                            let (&first, leaf) = leaves.next()?;
                            // A leaf's keys run from its first key to below the next leaf's:
                            // only a leaf at an end of the range is searched.
                            let below_next = leaves.peek().map(|(next, _)| **next);
                            let inside = first >= range.start()
                                && below_next.is_some_and(|next| next <= range.end());
                            Some(if inside {
                                (leaf, 0, leaf.len())
                            } else {
                                let keys = &leaf.keys;
                                (
                                    leaf,
                                    keys.partition_point(|&k| k < range.start()),
                                    keys.partition_point(|&k| k < range.end()),
                                )
                            })
                        }))
                    }
                }
            })
            .filter(|(_, from, to)| from < to)
    }

    /// Appends the rows in `range` of the map `leaves`, whose keys are above every key held:
    /// a count on the map, nothing read.
    pub(super) fn push_leaves(&mut self, leaves: &Arc<Leaves<V>>, range: KeyRange) {
        self.parts.push(Part::Leaves {
            map: Arc::clone(leaves),
            range,
        });
    }

    /// Appends a run of rows: `keys` strictly increasing and above every key held, `values`
    /// `width` a key and `aux` `aux_width x width` a key (the caller checked).
    pub(crate) fn push_owned(&mut self, keys: Vec<Key>, values: Vec<V>, aux: Vec<V>) {
        let to = keys.len();
        if to > 0 {
            self.parts.push(Part::Run {
                leaf: Arc::new(Leaf { keys, values, aux }),
                from: 0,
                to,
            });
        }
    }

    /// Keys, values and update-rule state in flat vectors: taken over when one whole leaf
    /// held nowhere else is all there is, copied otherwise.
    pub(crate) fn into_parts(mut self) -> (Vec<Key>, Vec<V>, Vec<V>) {
        if let [Part::Run { leaf, from: 0, to }] = &self.parts[..] {
            if *to == leaf.len() {
                if let Some(Part::Run { leaf, from, to }) = self.parts.pop() {
                    match Arc::try_unwrap(leaf) {
                        Ok(leaf) => return (leaf.keys, leaf.values, leaf.aux),
                        Err(leaf) => self.parts.push(Part::Run { leaf, from, to }),
                    }
                }
            }
        }
        let rows = self.len();
        let mut keys = Vec::with_capacity(rows);
        let mut values = Vec::with_capacity(rows * self.width);
        let mut aux = Vec::with_capacity(rows * self.width * self.aux_width);
        for (k, v, a) in self.runs() {
            keys.extend_from_slice(k);
            values.extend_from_slice(v);
            aux.extend_from_slice(a);
        }
        (keys, values, aux)
    }

    /// Whether `key` is above every key held, so that a run starting there may follow.
    pub(crate) fn follows(&self, key: Key) -> bool {
        // The last part alone: a decoder asks once per run it appends.
        let last = match self.parts.last() {
            None => return true,
            Some(Part::Run { leaf, to, .. }) => leaf.keys.get(to.wrapping_sub(1)).copied(),
            Some(Part::Leaves { .. }) => self.leaf_runs().last().map(|(l, _, to)| l.keys[to - 1]),
        };
        last.is_none_or(|last| key > last)
    }

    /// The runs as leaves a store can take whole: a run that is a whole leaf is shared, a
    /// part of one copied.
    pub(super) fn leaves(&self) -> impl Iterator<Item = Arc<Leaf<V>>> + '_ {
        let (width, row_aux) = (self.width, self.width * self.aux_width);
        self.leaf_runs().map(move |(leaf, from, to)| {
            if from == 0 && to == leaf.len() {
                Arc::clone(leaf)
            } else {
                Arc::new(Leaf {
                    keys: leaf.keys[from..to].to_vec(),
                    values: leaf.values[from * width..to * width].to_vec(),
                    aux: leaf.aux[from * row_aux..to * row_aux].to_vec(),
                })
            }
        })
    }

    /// Every row in key order, with its update-rule state.
    fn rows(&self) -> impl Iterator<Item = (Key, &[V], &[V])> + '_ {
        let (width, row_aux) = (self.width, self.width * self.aux_width);
        self.runs().flat_map(move |(keys, values, aux)| {
            keys.iter().enumerate().map(move |(i, &k)| {
                (
                    k,
                    &values[i * width..(i + 1) * width],
                    &aux[i * row_aux..(i + 1) * row_aux],
                )
            })
        })
    }
}

impl<V: Value> PartialEq for SharedRows<V> {
    fn eq(&self, other: &Self) -> bool {
        self.width == other.width
            && self.aux_width == other.aux_width
            && self.len() == other.len()
            && super::same_rows_by_bits(self.rows(), other.rows())
    }
}

impl<V: Value> Eq for SharedRows<V> {}

impl<V: Value> Hash for SharedRows<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.width.hash(state);
        self.aux_width.hash(state);
        super::hash_rows(self.rows(), state);
    }
}
