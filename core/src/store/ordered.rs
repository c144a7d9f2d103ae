//! [`OrderedStore`]: rows in sorted leaves of a few thousand keys each.
//!
//! A push merges its keys into a leaf once and hands runs of consecutive rows to
//! `UpdateRule::apply_all` as slices, so a dense push is one pass over memory; a range pull copies
//! leaf slices. Equality and hashing look at rows, not at how they are cut into leaves, because
//! that is what the model checker compares: two servers that hold the same rows are in the same
//! state however their leaves were split.

use core::hash::{Hash, Hasher};
use core::ops::ControlFlow;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::{ParamStore, RowVisitor, RowsUpdate, RunVisitor, SharedRows, StateRunVisitor};
use crate::key::{Key, KeyRange};
use crate::value::Value;

/// Where the keys of one batch sit in their leaf.
type Positions = smallvec::SmallVec<[usize; 32]>;

/// Rows a leaf is cut into once it holds more than twice as many.
pub(super) const LEAF_ROWS: usize = 1 << 13;

/// Leaves by their first key.
pub(super) type Leaves<V> = BTreeMap<Key, Arc<Leaf<V>>>;

/// The first key of the leaf of `leaves` that `key` belongs in: the last leaf starting at or
/// below it, or the first leaf for a key below every leaf.
pub(super) fn leaf_for<V>(leaves: &Leaves<V>, key: Key) -> Option<Key> {
    leaves
        .range(..=key)
        .next_back()
        .or_else(|| leaves.iter().next())
        .map(|(&start, _)| start)
}

/// Keys in order with their values and updater state laid out in the same order.
#[derive(Clone, Debug)]
pub(super) struct Leaf<V> {
    pub(super) keys: Vec<Key>,
    pub(super) values: Vec<V>,
    pub(super) aux: Vec<V>,
}

/// Where `key` is in `keys`, searching forward from `from`: galloping, so that a sorted batch
/// costs a step per key when its keys sit next to each other and a logarithm when they do not.
fn seek(keys: &[Key], from: usize, key: Key) -> Result<usize, usize> {
    let mut lo = from;
    let mut step = 1;
    let mut hi = from;
    while hi < keys.len() && keys[hi] < key {
        lo = hi + 1;
        hi = hi.saturating_add(step);
        step *= 2;
    }
    // keys[hi] >= key (or hi is past the end): the key is in keys[lo..=hi] if anywhere.
    let hi = hi.saturating_add(1).min(keys.len());
    keys[lo..hi]
        .binary_search(&key)
        .map(|i| lo + i)
        .map_err(|i| lo + i)
}

impl<V: Value> Leaf<V> {
    pub(super) fn empty() -> Self {
        Leaf {
            keys: Vec::new(),
            values: Vec::new(),
            aux: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Fills `at` with the position of every key of `batch` (strictly increasing) in this
    /// leaf; false, with `at` cut short, as soon as one is missing.
    fn positions(&self, batch: &[Key], at: &mut Positions) -> bool {
        at.clear();
        let mut from = 0;
        for &key in batch {
            let found = if self.keys.get(from) == Some(&key) {
                Ok(from)
            } else {
                seek(&self.keys, from, key)
            };
            match found {
                Ok(i) => {
                    at.push(i);
                    from = i + 1;
                }
                Err(_) => return false,
            }
        }
        true
    }

    /// Adds the keys of `batch` (strictly increasing) not yet here, as zero rows, in one merge;
    /// returns how many it added.
    ///
    /// The merge runs in place, from the back: the arrays grow by the rows added (amortized,
    /// without a new allocation per batch) and each old row moves at most once, and only
    /// those after the first key added. Rebuilding the leaf into new arrays instead took a
    /// third of a sparse training run's first epoch (copies and fresh pages for every push
    /// that brought one new key to a leaf of thousands).
    fn insert_missing(&mut self, batch: &[Key], width: usize, aux_width: usize) -> usize {
        let row_aux = width * aux_width;
        let missing: Vec<Key> = batch
            .iter()
            .copied()
            .filter(|k| self.keys.binary_search(k).is_err())
            .collect();
        if missing.is_empty() {
            return 0;
        }
        let old = self.keys.len();
        let total = old + missing.len();
        self.keys.resize(total, 0);
        self.values.resize(total * width, V::default());
        self.aux.resize(total * row_aux, V::default());
        // Old rows still to place are [0, i); the rows from `w` on are final.
        let (mut i, mut w) = (old, total);
        for &key in missing.iter().rev() {
            let from = self.keys[..i].partition_point(|&k| k < key);
            let n = i - from;
            self.keys.copy_within(from..i, w - n);
            self.values
                .copy_within(from * width..i * width, (w - n) * width);
            self.aux
                .copy_within(from * row_aux..i * row_aux, (w - n) * row_aux);
            w -= n + 1;
            i = from;
            self.keys[w] = key;
            self.values[w * width..(w + 1) * width].fill(V::default());
            self.aux[w * row_aux..(w + 1) * row_aux].fill(V::default());
        }
        missing.len()
    }

    /// Calls `f` on the rows at positions `at` (increasing), with `deltas` `width` values a
    /// row in the same order, a run of consecutive rows at a time.
    fn update_at(
        &mut self,
        at: &[usize],
        deltas: &[V],
        width: usize,
        aux_width: usize,
        f: &mut RowsUpdate<'_, V>,
    ) {
        let row_aux = width * aux_width;
        let mut run_from = 0;
        for t in 1..=at.len() {
            if t < at.len() && at[t] == at[t - 1] + 1 {
                continue;
            }
            let (first, n) = (at[run_from], t - run_from);
            f(
                &mut self.values[first * width..(first + n) * width],
                &mut self.aux[first * row_aux..(first + n) * row_aux],
                &deltas[run_from * width..t * width],
            );
            run_from = t;
        }
    }

    /// Cuts off the rows from position `i` on.
    fn split_off(&mut self, i: usize, width: usize, aux_width: usize) -> Self {
        Leaf {
            keys: self.keys.split_off(i),
            values: self.values.split_off(i * width),
            aux: self.aux.split_off(i * width * aux_width),
        }
    }

    fn row(&self, i: usize, width: usize) -> &[V] {
        &self.values[i * width..(i + 1) * width]
    }

    fn aux_row(&self, i: usize, row_aux: usize) -> &[V] {
        &self.aux[i * row_aux..(i + 1) * row_aux]
    }
}

/// Rows kept in key order in leaves of a few thousand keys, each leaf three flat arrays (keys,
/// values, updater state), found through an ordered map of the leaves.
///
/// A push of keys stored one after another is applied as one slice per leaf; a batch of keys
/// all present costs a step per key, not a tree lookup; a leaf grows by one merge per batch,
/// not by one insertion per key. Iteration is in key order. Equality and hashing compare rows
/// by bits and ignore how they are cut into leaves.
///
/// ```
/// use pserver_core::KeyRange;
/// use pserver_core::store::{OrderedStore, ParamStore};
/// let mut store = OrderedStore::<f32>::new(1, 0);
/// store.update_rows(&[3, 4, 5], &[1.0, 2.0, 3.0], &mut |rows, _, deltas| {
///     for (w, d) in rows.iter_mut().zip(deltas) {
///         *w += d;
///     }
/// });
/// assert_eq!(store.get(4), Some(&[2.0f32][..]));
/// assert_eq!(store.len(), 3);
/// ```
#[derive(Clone, Debug)]
pub struct OrderedStore<V> {
    width: usize,
    aux_width: usize,
    /// Non-empty leaves by their first key; their keys do not overlap. The map and each
    /// leaf are shared with the checkpoints that took them ([`ParamStore::shared_rows_in`])
    /// and copied on the next write while one still holds them: the map once, each leaf
    /// written to.
    leaves: Arc<Leaves<V>>,
    len: usize,
}

impl<V: Value> OrderedStore<V> {
    /// An empty store of rows `width` wide with `aux_width` updater values per value.
    pub fn new(width: usize, aux_width: usize) -> Self {
        OrderedStore {
            width,
            aux_width,
            leaves: Arc::new(BTreeMap::new()),
            len: 0,
        }
    }

    /// The first key of the leaf `key` belongs in: the last leaf starting at or below it, or
    /// the first leaf for a key below every leaf.
    fn leaf_for(&self, key: Key) -> Option<Key> {
        leaf_for(&self.leaves, key)
    }

    /// Every row in key order, with its updater state.
    fn rows(&self) -> impl Iterator<Item = (Key, &[V], &[V])> + '_ {
        let (width, row_aux) = (self.width, self.width * self.aux_width);
        self.leaves.values().flat_map(move |leaf| {
            leaf.keys
                .iter()
                .enumerate()
                .map(move |(i, &k)| (k, leaf.row(i, width), leaf.aux_row(i, row_aux)))
        })
    }

    /// Puts `leaf` back under its first key, cut into leaves of [`LEAF_ROWS`] if it grew past
    /// twice that.
    fn put_leaf(&mut self, mut leaf: Leaf<V>) {
        while leaf.len() > 2 * LEAF_ROWS {
            let tail = leaf.split_off(leaf.len() - LEAF_ROWS, self.width, self.aux_width);
            self.leaves_mut().insert(tail.keys[0], Arc::new(tail));
        }
        if let Some(&first) = leaf.keys.first() {
            self.leaves_mut().insert(first, Arc::new(leaf));
        }
    }

    /// Leaves overlapping `range`, in key order.
    fn leaves_in(&self, range: KeyRange) -> impl Iterator<Item = &Leaf<V>> + '_ {
        let from = self.leaf_for(range.start()).unwrap_or(range.start());
        self.leaves
            .range(from..range.end().max(from))
            .map(|(_, leaf)| &**leaf)
    }

    /// The map of leaves, to change: copied first if a checkpoint holds it.
    fn leaves_mut(&mut self) -> &mut Leaves<V> {
        Arc::make_mut(&mut self.leaves)
    }

    /// Takes the leaf starting at `start` out of the map, for a write that reshapes it.
    fn take_leaf(&mut self, start: Option<Key>) -> Leaf<V> {
        start
            .and_then(|s| self.leaves_mut().remove(&s))
            .map_or_else(Leaf::empty, Arc::unwrap_or_clone)
    }
}

impl<V: Value> ParamStore<V> for OrderedStore<V> {
    fn get(&self, key: Key) -> Option<&[V]> {
        let (_, leaf) = self.leaves.range(..=key).next_back()?;
        let i = leaf.keys.binary_search(&key).ok()?;
        Some(leaf.row(i, self.width))
    }

    fn row_mut(&mut self, key: Key) -> (&mut [V], &mut [V]) {
        let held = self
            .leaves
            .range(..=key)
            .next_back()
            .is_some_and(|(_, leaf)| leaf.keys.binary_search(&key).is_ok());
        if !held {
            let mut leaf = self.take_leaf(self.leaf_for(key));
            self.len += leaf.insert_missing(&[key], self.width, self.aux_width);
            self.put_leaf(leaf);
        }
        let (width, row_aux) = (self.width, self.width * self.aux_width);
        // The key is now held by the last leaf starting at or below it.
        if let Some((_, leaf)) = self.leaves_mut().range_mut(..=key).next_back() {
            if let Ok(i) = leaf.keys.binary_search(&key) {
                let leaf = Arc::make_mut(leaf);
                return (
                    &mut leaf.values[i * width..(i + 1) * width],
                    &mut leaf.aux[i * row_aux..(i + 1) * row_aux],
                );
            }
        }
        (&mut [], &mut [])
    }

    fn update_rows(&mut self, keys: &[Key], deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        let (width, aux_width) = (self.width, self.aux_width);
        if keys.is_empty() || deltas.len() != keys.len() * width {
            return;
        }
        // Positions of a batch in its leaf, found once and reused from leaf to leaf; on the
        // stack for the few keys a push brings each shard, so that a push allocates nothing
        // per shard it touches.
        let mut at = Positions::new();
        let mut i = 0;
        while i < keys.len() {
            let start = self.leaf_for(keys[i]);
            let bound = start.and_then(|s| {
                self.leaves
                    .range(s.saturating_add(1)..)
                    .next()
                    .map(|(&b, _)| b)
            });
            let j = i + keys[i..].partition_point(|&k| bound.is_none_or(|b| k < b));
            let batch = &keys[i..j];
            let batch_deltas = &deltas[i * width..j * width];
            let whole_run = |leaf: &Leaf<V>| {
                // Strictly increasing keys spanning exactly their count are consecutive.
                let n = batch.len();
                let at = leaf.keys.binary_search(&batch[0]).ok()?;
                (batch[n - 1] - batch[0] == n as Key - 1
                    && leaf.keys.get(at + n - 1) == Some(&batch[n - 1]))
                .then_some(at)
            };
            let done = match start.and_then(|s| self.leaves_mut().get_mut(&s)) {
                Some(leaf) => match whole_run(leaf) {
                    Some(at) => {
                        let leaf = Arc::make_mut(leaf);
                        let (n, row_aux) = (batch.len(), width * aux_width);
                        f(
                            &mut leaf.values[at * width..(at + n) * width],
                            &mut leaf.aux[at * row_aux..(at + n) * row_aux],
                            batch_deltas,
                        );
                        true
                    }
                    None if leaf.positions(batch, &mut at) => {
                        Arc::make_mut(leaf).update_at(&at, batch_deltas, width, aux_width, f);
                        true
                    }
                    None => false,
                },
                None => false,
            };
            if !done {
                let mut leaf = self.take_leaf(start);
                self.len += leaf.insert_missing(batch, width, aux_width);
                if leaf.positions(batch, &mut at) {
                    leaf.update_at(&at, batch_deltas, width, aux_width, f);
                }
                self.put_leaf(leaf);
            }
            i = j;
        }
    }

    fn update_range(&mut self, range: KeyRange, deltas: &[V], f: &mut RowsUpdate<'_, V>) {
        let (width, aux_width) = (self.width, self.aux_width);
        let total = usize::try_from(range.len()).ok();
        if range.is_empty() || total.and_then(|n| n.checked_mul(width)) != Some(deltas.len()) {
            return;
        }
        let mut done = 0;
        let mut key = range.start();
        while key < range.end() {
            let start = self.leaf_for(key);
            let bound = start
                .and_then(|s| self.leaves.range(s.saturating_add(1)..).next())
                .map_or(range.end(), |(&b, _)| b.clamp(key + 1, range.end()));
            // `bound - key` is at most the range's length, which fits in usize.
            let n = (bound - key) as usize;
            let chunk = &deltas[done * width..(done + n) * width];
            let held = start
                .and_then(|s| self.leaves_mut().get_mut(&s))
                .and_then(|leaf| {
                    let at = leaf.keys.binary_search(&key).ok()?;
                    (leaf.keys.get(at + n - 1) == Some(&(bound - 1))).then_some((leaf, at))
                });
            match held {
                // The leaf holds the whole chunk as consecutive rows: one call, no key list.
                Some((leaf, at)) => {
                    let leaf = Arc::make_mut(leaf);
                    let row_aux = width * aux_width;
                    f(
                        &mut leaf.values[at * width..(at + n) * width],
                        &mut leaf.aux[at * row_aux..(at + n) * row_aux],
                        chunk,
                    );
                }
                None => {
                    let keys: Vec<Key> = (key..bound).collect();
                    self.update_rows(&keys, chunk, f);
                }
            }
            done += n;
            key = bound;
        }
    }

    fn values_of(&self, keys: &[Key], width: usize, out: &mut Vec<V>) {
        out.reserve(keys.len() * width);
        let mut i = 0;
        while i < keys.len() {
            let Some((&start, leaf)) = self.leaves.range(..=keys[i]).next_back() else {
                // Below every leaf: never written.
                let j = i + keys[i..]
                    .partition_point(|&k| self.leaves.keys().next().is_none_or(|&first| k < first));
                out.resize(out.len() + (j - i) * width, V::default());
                i = j;
                continue;
            };
            let bound = self
                .leaves
                .range(start.saturating_add(1)..)
                .next()
                .map(|(&b, _)| b);
            let j = i + keys[i..].partition_point(|&k| bound.is_none_or(|b| k < b));
            let mut at = 0;
            for &key in &keys[i..j] {
                match seek(&leaf.keys, at, key) {
                    Ok(p) if width == self.width => {
                        out.extend_from_slice(leaf.row(p, width));
                        at = p + 1;
                    }
                    Ok(p) | Err(p) => {
                        out.resize(out.len() + width, V::default());
                        at = p;
                    }
                }
            }
            i = j;
        }
    }

    fn for_each_run_in(&self, range: KeyRange, f: &mut RunVisitor<'_, V>) {
        for leaf in self.leaves_in(range) {
            let from = leaf.keys.partition_point(|&k| k < range.start());
            let to = leaf.keys.partition_point(|&k| k < range.end());
            if from < to
                && f(
                    &leaf.keys[from..to],
                    &leaf.values[from * self.width..to * self.width],
                )
                .is_break()
            {
                return;
            }
        }
    }

    fn for_each_in(&self, range: KeyRange, f: &mut dyn FnMut(Key, &[V])) {
        self.for_each_run_in(range, &mut |keys, values| {
            for (&k, row) in keys.iter().zip(values.chunks_exact(self.width)) {
                f(k, row);
            }
            ControlFlow::Continue(())
        });
    }

    fn for_each_run_with_state_in(&self, range: KeyRange, f: &mut StateRunVisitor<'_, V>) {
        let row_aux = self.width * self.aux_width;
        for leaf in self.leaves_in(range) {
            let from = leaf.keys.partition_point(|&k| k < range.start());
            let to = leaf.keys.partition_point(|&k| k < range.end());
            if from < to {
                f(
                    &leaf.keys[from..to],
                    &leaf.values[from * self.width..to * self.width],
                    &leaf.aux[from * row_aux..to * row_aux],
                );
            }
        }
    }

    fn for_each_row_in(&self, range: KeyRange, f: &mut RowVisitor<'_, V>) {
        let row_aux = self.width * self.aux_width;
        for leaf in self.leaves_in(range) {
            let from = leaf.keys.partition_point(|&k| k < range.start());
            let to = leaf.keys.partition_point(|&k| k < range.end());
            for i in from..to {
                f(
                    leaf.keys[i],
                    leaf.row(i, self.width),
                    leaf.aux_row(i, row_aux),
                );
            }
        }
    }

    fn shared_rows_in(&self, range: KeyRange, width: usize, aux_width: usize) -> SharedRows<V> {
        let mut shared = SharedRows::new(width, aux_width);
        if super::same_shape((width, aux_width), (self.width, self.aux_width)) {
            // The map alone, whatever the model's size: nothing of it is read until the rows
            // are, by whoever writes them, on another thread.
            shared.push_leaves(&self.leaves, range);
        }
        shared
    }

    fn load_rows(&mut self, rows: &SharedRows<V>) {
        if !self.is_empty() || (rows.width(), rows.aux_width()) != (self.width, self.aux_width) {
            return super::load_row_by_row(self, rows);
        }
        for leaf in rows.leaves() {
            self.len += leaf.len();
            if leaf.len() > 2 * LEAF_ROWS {
                // Cut as a store cuts its own (runs of another layout's checkpoint are one).
                self.put_leaf(Arc::unwrap_or_clone(leaf));
            } else if let Some(&first) = leaf.keys.first() {
                self.leaves_mut().insert(first, leaf);
            }
        }
    }

    fn empty(&self) -> Self {
        OrderedStore::new(self.width, self.aux_width)
    }

    fn split_off(&mut self, at: Key) -> Self {
        let mut high = self.empty();
        let (width, aux_width) = (self.width, self.aux_width);
        high.leaves = Arc::new(self.leaves_mut().split_off(&at));
        if let Some(leaf) = self.leaves_mut().values_mut().next_back() {
            let i = leaf.keys.partition_point(|&k| k < at);
            if i < leaf.len() {
                let tail = Arc::make_mut(leaf).split_off(i, width, aux_width);
                high.leaves_mut().insert(tail.keys[0], Arc::new(tail));
            }
        }
        high.len = high.leaves.values().map(|leaf| leaf.len()).sum();
        self.len -= high.len;
        high
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl<V: Value> PartialEq for OrderedStore<V> {
    fn eq(&self, other: &Self) -> bool {
        self.width == other.width
            && self.aux_width == other.aux_width
            && self.len == other.len
            && super::same_rows_by_bits(self.rows(), other.rows())
    }
}

impl<V: Value> Eq for OrderedStore<V> {}

impl<V: Value> Hash for OrderedStore<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.width.hash(state);
        super::hash_rows(self.rows(), state);
    }
}
