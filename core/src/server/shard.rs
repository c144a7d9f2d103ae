//! A shard: one key range a server holds, as primary or replica, with everything that moves
//! with the range (ARCHITECTURE.md §8).

use core::hash::{Hash, Hasher};
use std::collections::BTreeMap;

use crate::dedupe::DedupeWindow;
use crate::ids::{Iteration, NodeId};
use crate::key::{Key, KeyRange};
use crate::kv::KvPairs;
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{
    AppliedSpan, BufferedPush, DedupeRecord, Replicate, ShardCopy, ShardUpdate, SmallVec, Transfer,
    smallvec,
};

/// The steps a shard ships at once: usually the one just taken, kept in place, so that a push
/// allocates nothing per shard it touches (ARCHITECTURE.md §8).
pub(crate) type Steps<V> = SmallVec<[Replicate<V>; 1]>;

/// Updates a primary keeps per shard for replicas that are behind; beyond this, a replica
/// catches up with a whole copy.
const MAX_LOG: usize = 256;

/// How far a replica has come in a shard's update order, as its primary knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ReplicaState {
    /// Holds no copy the primary may extend: it needs the whole shard.
    NeedsCopy,
    /// Was sent the whole shard as of this update, not yet acknowledged.
    Copying(u64),
    /// Has applied every update up to this one.
    Acked(u64),
}

impl ReplicaState {
    /// The first update the primary must keep for this replica.
    fn keeps_from(self) -> Option<u64> {
        match self {
            ReplicaState::NeedsCopy => None,
            ReplicaState::Copying(s) | ReplicaState::Acked(s) => Some(s + 1),
        }
    }
}

/// What this server is to a shard.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ShardRole<V: Value> {
    /// It takes pushes, orders them, and streams the order to the replicas.
    Primary {
        /// Updates some replica may still need, oldest first.
        log: Vec<Replicate<V>>,
        /// Every replica of the range and how far it has come.
        replicas: BTreeMap<NodeId, ReplicaState>,
        /// Buffered pushes applied here but not shipped yet: they arrived while the replicas
        /// were still acknowledging earlier steps, and go out together, one sum per
        /// iteration, once they have ([`Shard::ship`]).
        queued: Vec<Replicate<V>>,
    },
    /// It follows `primary`'s update order. `synced` is false from the moment the primary
    /// changed until the new primary's copy arrived: the old copy is kept (it holds every
    /// acknowledged push, so it may yet be promoted) but is not extended.
    Replica { primary: NodeId, synced: bool },
}

/// One key range's parameters, buffered deltas, de-duplication state and update order.
#[derive(Clone, Debug)]
pub(crate) struct Shard<V: Value, S> {
    pub(crate) range: KeyRange,
    pub(crate) store: S,
    /// Sequential mode: deltas per unfinished iteration, in the order they were taken in.
    pub(crate) pending: BTreeMap<Iteration, Vec<KvPairs<V>>>,
    /// Sequential mode: every iteration below this is applied.
    pub(crate) applied_below: Iteration,
    pub(crate) dedupe: BTreeMap<NodeId, DedupeWindow>,
    /// The last update applied.
    pub(crate) seq: u64,
    pub(crate) role: ShardRole<V>,
}

impl<V: Value, S: ParamStore<V>> Shard<V, S> {
    pub(crate) fn new(range: KeyRange, store: S, role: ShardRole<V>) -> Self {
        Shard {
            range,
            store,
            pending: BTreeMap::new(),
            applied_below: 0,
            dedupe: BTreeMap::new(),
            seq: 0,
            role,
        }
    }

    pub(crate) fn is_primary(&self) -> bool {
        matches!(self.role, ShardRole::Primary { .. })
    }

    /// The rows of `kvs` inside this shard that `worker`'s `request` has not applied yet.
    pub(crate) fn fresh_rows(
        &self,
        worker: NodeId,
        request: u64,
        kvs: &KvPairs<V>,
        dedupe: bool,
    ) -> KvPairs<V> {
        let rows = kvs.slice(self.range);
        let (Some(window), Some(span), true) = (self.dedupe.get(&worker), rows.span(), dedupe)
        else {
            return rows;
        };
        if window.untouched(request) {
            return rows;
        }
        let fresh = window.fresh_ranges(request, span);
        match fresh.as_slice() {
            [only] if *only == span => rows,
            _ => KvPairs::concat(fresh.iter().map(|&r| rows.slice(r)).collect(), rows.width()),
        }
    }

    /// Carries out one step of the update order (the primary's own, or one it replicated).
    pub(crate) fn apply_update<U: UpdateRule<V>>(
        &mut self,
        entry: &Replicate<V>,
        rule: Rule<'_, U>,
    ) {
        match &entry.update {
            ShardUpdate::Apply(kvs) => apply_rows(&mut self.store, rule, kvs),
            ShardUpdate::Buffer { iteration, kvs } => {
                self.pending
                    .entry(*iteration)
                    .or_default()
                    .push(kvs.slice(self.range));
            }
            ShardUpdate::ApplyBelow(below) => {
                // Iteration by iteration, in order, but only over those buffered: the step may
                // come from another server, and a huge `below` must not cost a loop per number.
                let finished: Vec<Iteration> =
                    self.pending.range(..*below).map(|(&i, _)| i).collect();
                for iteration in finished {
                    if let Some(batch) = self.pending.remove(&iteration) {
                        let width = batch.first().map_or(1, KvPairs::width);
                        let summed = sum_by_key(&batch, width);
                        apply_rows(&mut self.store, rule, &summed);
                    }
                }
                self.applied_below = self.applied_below.max(*below);
            }
        }
        for record in &entry.dedupe {
            self.dedupe.entry(record.worker).or_default().merge(record);
        }
        self.seq = entry.seq;
    }

    /// Cuts this shard at `at` (inside its range) and returns the upper part: both keep the
    /// update order, the role and the de-duplication state, each with its own rows.
    pub(crate) fn split_off(&mut self, at: Key) -> Self {
        let (low, high) = self.range.split_at(at);
        let mut pending_high = BTreeMap::new();
        for (&it, batch) in &mut self.pending {
            pending_high.insert(it, batch.iter().map(|kvs| kvs.slice(high)).collect());
            for kvs in batch.iter_mut() {
                *kvs = kvs.slice(low);
            }
        }
        let role_high = match &mut self.role {
            ShardRole::Primary {
                log,
                replicas,
                queued,
            } => {
                let high_log = log.iter().map(|e| restrict(e, high)).collect();
                for e in log.iter_mut() {
                    *e = restrict(e, low);
                }
                let high_queued = queued.iter().map(|e| restrict(e, high)).collect();
                for e in queued.iter_mut() {
                    *e = restrict(e, low);
                }
                ShardRole::Primary {
                    log: high_log,
                    replicas: replicas.clone(),
                    queued: high_queued,
                }
            }
            replica => replica.clone(),
        };
        self.range = low;
        Shard {
            range: high,
            store: self.store.split_off(at),
            pending: pending_high,
            applied_below: self.applied_below,
            dedupe: self.dedupe.clone(),
            seq: self.seq,
            role: role_high,
        }
    }

    /// The whole shard as of its last update, for a new holder.
    pub(crate) fn copy(&self, width: usize, aux_width: usize) -> Transfer<V> {
        self.checkpoint_copy(width, aux_width).into_transfer()
    }

    /// The whole shard as of its last update, its rows shared with the store: for a
    /// checkpoint, and, made a [`Transfer`], for a new holder.
    pub(crate) fn checkpoint_copy(&self, width: usize, aux_width: usize) -> ShardCopy<V> {
        let pending = self
            .pending
            .iter()
            .flat_map(|(&iteration, batch)| {
                batch.iter().map(move |kvs| BufferedPush {
                    iteration,
                    kvs: kvs.clone(),
                })
            })
            .collect();
        ShardCopy {
            range: self.range,
            seq: self.seq,
            rows: self.store.shared_rows_in(self.range, width, aux_width),
            pending,
            applied_below: self.applied_below,
            dedupe: self.dedupe.iter().map(|(&w, d)| d.to_record(w)).collect(),
            clocks: Vec::new(),
        }
    }

    /// A shard holding `copy`, with an empty `store` to fill. `None` when the copy does not fit
    /// this server's row shape.
    pub(crate) fn from_copy(
        copy: Transfer<V>,
        mut store: S,
        width: usize,
        aux_width: usize,
        role: ShardRole<V>,
    ) -> Option<Self> {
        if !fits(&copy, width, aux_width) {
            return None;
        }
        fill(&mut store, &copy);
        let mut pending: BTreeMap<Iteration, Vec<KvPairs<V>>> = BTreeMap::new();
        for b in copy.pending {
            if b.kvs.width() != width {
                return None;
            }
            pending.entry(b.iteration).or_default().push(b.kvs);
        }
        let mut dedupe: BTreeMap<NodeId, DedupeWindow> = BTreeMap::new();
        for record in &copy.dedupe {
            dedupe.entry(record.worker).or_default().merge(record);
        }
        Some(Shard {
            range: copy.range,
            store,
            pending,
            applied_below: copy.applied_below,
            dedupe,
            seq: copy.seq,
            role,
        })
    }

    /// The first update the primary must still keep for some replica.
    pub(crate) fn log_needed_from(&self) -> Option<u64> {
        match &self.role {
            ShardRole::Primary { replicas, .. } => {
                replicas.values().filter_map(|r| r.keeps_from()).min()
            }
            ShardRole::Replica { .. } => None,
        }
    }

    /// True when some replica can only catch up with a whole copy: it holds none, or the log
    /// no longer reaches back to what it has.
    pub(crate) fn needs_copy(&self) -> bool {
        match &self.role {
            ShardRole::Primary { log, replicas, .. } => replicas.values().any(|r| match *r {
                ReplicaState::Acked(a) => {
                    a < self.shipped_seq() && log.first().is_none_or(|e| first_step(e) > a + 1)
                }
                ReplicaState::NeedsCopy | ReplicaState::Copying(_) => true,
            }),
            ShardRole::Replica { .. } => false,
        }
    }

    /// The last step shipped to the replicas: steps after it are queued.
    pub(crate) fn shipped_seq(&self) -> u64 {
        match &self.role {
            ShardRole::Primary { queued, .. } => {
                queued.first().map_or(self.seq, |e| first_step(e) - 1)
            }
            ShardRole::Replica { .. } => self.seq,
        }
    }

    /// True when buffered pushes wait to be shipped.
    pub(crate) fn has_queued(&self) -> bool {
        matches!(&self.role, ShardRole::Primary { queued, .. } if !queued.is_empty())
    }

    /// Takes `entry`, a step of this primary shard's update order, and returns the steps to
    /// ship to the replicas now. A buffered push (sequential mode) is applied here and
    /// queued: the pushes of an iteration go out as their sum ([`Shard::ship_queued`]) when
    /// the iteration is applied, so that replication carries one update per iteration where
    /// the workers pushed many. Any other step ships the queue first, then itself: an
    /// iteration is applied (`ApplyBelow`) only after its buffered pushes were shipped, in
    /// the form both sides sum. A queue ships early rather than sum past `room` bytes of a
    /// frame.
    pub(crate) fn take_step<U: UpdateRule<V>>(
        &mut self,
        entry: Replicate<V>,
        rule: Rule<'_, U>,
        width: usize,
        room: usize,
    ) -> Steps<V> {
        let buffered = matches!(entry.update, ShardUpdate::Buffer { .. });
        // A queue ships before its sum would outgrow a frame, and before this push is
        // buffered behind it (its sum takes the place of the parts it sums): the rest of the
        // iteration follows as another part of its sum, as pushes arriving after a ship do.
        let fits = |queued: &[Replicate<V>]| {
            let bytes: usize = queued.iter().map(crate::sizes::step_bytes).sum();
            bytes.saturating_add(crate::sizes::step_bytes(&entry)) <= room
        };
        let queue_fits = match &self.role {
            ShardRole::Primary { queued, .. } => buffered && fits(queued),
            ShardRole::Replica { .. } => buffered,
        };
        let mut ship = if queue_fits {
            Steps::new()
        } else {
            self.ship_queued(width)
        };
        self.apply_update(&entry, rule);
        let ShardRole::Primary {
            replicas, queued, ..
        } = &mut self.role
        else {
            return Steps::new();
        };
        if replicas.is_empty() {
            return Steps::new();
        }
        if buffered {
            queued.push(entry);
        } else {
            ship.push(entry);
        }
        ship
    }

    /// Empties the queue into the steps to ship: per iteration (in order) one buffered step
    /// holding the key-wise sum of its queued pushes, spanning their steps, with every queued
    /// push's de-duplication record, in arrival order, on the last. This shard's own buffer
    /// keeps the same sum in place of the pushes it sums, so that primary and replicas sum an
    /// iteration from the same parts and hold the same bits.
    pub(crate) fn ship_queued(&mut self, width: usize) -> Steps<V> {
        let ShardRole::Primary { queued, .. } = &mut self.role else {
            return Steps::new();
        };
        let queue = core::mem::take(queued);
        let (Some(first), Some(last)) = (queue.first(), queue.last()) else {
            return Steps::new();
        };
        let (first, last) = (first_step(first), last.seq);
        let mut groups: BTreeMap<Iteration, Vec<KvPairs<V>>> = BTreeMap::new();
        let mut dedupe = SmallVec::new();
        for entry in queue {
            if let ShardUpdate::Buffer { iteration, kvs } = entry.update {
                groups.entry(iteration).or_default().push(kvs);
            }
            dedupe.extend(entry.dedupe);
        }
        let steps = last - first + 1;
        let k = groups.len() as u64;
        let mut ship = Steps::with_capacity(groups.len());
        for (j, (iteration, batch)) in groups.into_iter().enumerate() {
            let j = j as u64;
            let sum = sum_by_key(&batch, width);
            if let Some(parts) = self.pending.get_mut(&iteration) {
                parts.truncate(parts.len().saturating_sub(batch.len()));
                parts.push(sum.slice(self.range));
            }
            ship.push(Replicate {
                range: self.range,
                seq: last - (k - 1 - j),
                span: if j == 0 { steps - k + 1 } else { 1 },
                update: ShardUpdate::Buffer {
                    iteration,
                    kvs: sum,
                },
                dedupe: SmallVec::new(),
            });
        }
        if let Some(entry) = ship.last_mut() {
            entry.dedupe = dedupe;
        }
        ship
    }

    /// Logs `entries` for replicas that fall behind; false when there is nothing to send
    /// (no entries, or no replicas).
    pub(crate) fn log_steps(&mut self, entries: &[Replicate<V>]) -> bool {
        let ShardRole::Primary { log, replicas, .. } = &mut self.role else {
            return false;
        };
        if entries.is_empty() || replicas.is_empty() {
            return false;
        }
        log.extend_from_slice(entries);
        true
    }

    /// The replicas in step, which get each step as it is taken.
    pub(crate) fn in_step(&self) -> impl Iterator<Item = NodeId> + '_ {
        let replicas = match &self.role {
            ShardRole::Primary { replicas, .. } => Some(replicas),
            ShardRole::Replica { .. } => None,
        };
        replicas
            .into_iter()
            .flatten()
            .filter(|(_, r)| matches!(r, ReplicaState::Acked(_)))
            .map(|(&n, _)| n)
    }

    /// Keeps the log within [`MAX_LOG`] steps: a replica that would need more catches up
    /// with a whole copy instead.
    pub(crate) fn bound_log(&mut self) {
        let ShardRole::Primary { log, replicas, .. } = &mut self.role else {
            return;
        };
        if log.len() > MAX_LOG {
            // A replica this far behind (cut off, or about to be declared dead) catches up
            // with a whole copy instead of holding the log, and so memory, without bound.
            let oldest = log.len() - MAX_LOG;
            let dropped_below = first_step(&log[oldest]);
            log.drain(..oldest);
            for state in replicas.values_mut() {
                if matches!(*state, ReplicaState::Acked(a) if a + 1 < dropped_below) {
                    *state = ReplicaState::NeedsCopy;
                }
            }
        }
    }

    /// True when every replica has applied update `seq`.
    pub(crate) fn replicated(&self, seq: u64) -> bool {
        match &self.role {
            ShardRole::Primary { replicas, .. } => replicas
                .values()
                .all(|r| matches!(r, ReplicaState::Acked(a) if *a >= seq)),
            ShardRole::Replica { .. } => false,
        }
    }

    /// Drops logged updates every replica has.
    pub(crate) fn trim_log(&mut self) {
        let keep_from = self.log_needed_from();
        if let ShardRole::Primary { log, .. } = &mut self.role {
            match keep_from {
                Some(from) => log.retain(|e| e.seq >= from),
                None => log.clear(),
            }
        }
    }

    /// Makes this server the shard's primary, with `replicas`. A replica this server already
    /// led the shard for keeps its place unless it `rejoined` (it holds nothing now); any
    /// other starts as `new_replica`.
    pub(crate) fn lead(
        &mut self,
        replicas: &[NodeId],
        rejoined: &[NodeId],
        new_replica: ReplicaState,
    ) {
        let states = replicas
            .iter()
            .map(|&n| {
                let kept = match &self.role {
                    ShardRole::Primary { replicas, .. } if !rejoined.contains(&n) => {
                        replicas.get(&n).copied()
                    }
                    _ => None,
                };
                (n, kept.unwrap_or(new_replica))
            })
            .collect();
        let log = match &mut self.role {
            ShardRole::Primary { log, .. } => core::mem::take(log),
            ShardRole::Replica { .. } => Vec::new(),
        };
        self.role = ShardRole::Primary {
            log,
            replicas: states,
            queued: Vec::new(),
        };
        self.trim_log();
    }

    /// Makes this server a replica of the shard under `primary`. A copy kept under another
    /// primary is not in step with this one's, and is not extended until its copy arrives.
    pub(crate) fn follow(&mut self, primary: NodeId) {
        let kept = matches!(self.role, ShardRole::Replica { primary: p, .. } if p == primary);
        if !kept {
            self.role = ShardRole::Replica {
                primary,
                synced: false,
            };
        }
    }
}

impl<V: Value, S: ParamStore<V>> PartialEq for Shard<V, S> {
    fn eq(&self, other: &Self) -> bool {
        self.range == other.range
            && self.pending == other.pending
            && self.applied_below == other.applied_below
            && self.dedupe == other.dedupe
            && self.seq == other.seq
            && self.role == other.role
            && self.store.same_rows(&other.store)
    }
}

impl<V: Value, S: ParamStore<V>> Eq for Shard<V, S> {}

impl<V: Value + Hash, S: ParamStore<V>> Hash for Shard<V, S> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.range.hash(state);
        self.pending.hash(state);
        self.applied_below.hash(state);
        self.dedupe.hash(state);
        self.seq.hash(state);
        self.role.hash(state);
        self.store.fingerprint(state);
    }
}

/// Whether `copy` fits a server whose rows are `width` values with `aux_width` values of
/// update-rule state each: its keys in its range, its state beside every row.
pub(crate) fn fits<V: Value>(copy: &Transfer<V>, width: usize, aux_width: usize) -> bool {
    if copy.values.width() != width || copy.values.keys().iter().any(|&k| !copy.range.contains(k)) {
        return false;
    }
    match &copy.state {
        Some(state) => state.keys() == copy.values.keys() && state.width() == width * aux_width,
        None => aux_width == 0,
    }
}

/// Whether the checkpoint's `copy` fits a server whose rows are `width` values with
/// `aux_width` values of update-rule state each: its row shape, its keys in its range.
pub(crate) fn fits_checkpoint<V: Value>(
    copy: &ShardCopy<V>,
    width: usize,
    aux_width: usize,
) -> bool {
    (copy.rows.width(), copy.rows.aux_width()) == (width, aux_width)
        && copy.rows.span().is_none_or(|span| {
            copy.range.contains(span.start()) && copy.range.contains(span.end() - 1)
        })
}

/// Writes the rows and update-rule state of `copy` (checked with [`fits`]) into `store`.
pub(crate) fn fill<V: Value, S: ParamStore<V>>(store: &mut S, copy: &Transfer<V>) {
    for (i, (k, row)) in copy.values.iter().enumerate() {
        let (values, aux) = store.row_mut(k);
        values.copy_from_slice(row);
        if let Some(state) = &copy.state {
            aux.copy_from_slice(&state.values()[i * aux.len()..(i + 1) * aux.len()]);
        }
    }
}

/// The first step of the update order `entry` stands for.
pub(crate) fn first_step<V: Value>(entry: &Replicate<V>) -> u64 {
    (entry.seq + 1).saturating_sub(entry.span)
}

/// The record of a push's fresh rows for the de-duplication state.
pub(crate) fn record_of<V: Value>(
    worker: NodeId,
    settled_below: u64,
    request: u64,
    fresh: &KvPairs<V>,
) -> DedupeRecord {
    let applied = match fresh.span() {
        Some(span) => smallvec![AppliedSpan {
            request,
            first: span.start(),
            last: span.end() - 1,
        }],
        None => SmallVec::new(),
    };
    DedupeRecord {
        worker,
        settled_below,
        applied,
    }
}

/// `entry` cut down to the rows inside `range`.
pub(crate) fn restrict<V: Value>(entry: &Replicate<V>, range: KeyRange) -> Replicate<V> {
    let update = match &entry.update {
        ShardUpdate::Apply(kvs) => ShardUpdate::Apply(kvs.slice(range)),
        ShardUpdate::Buffer { iteration, kvs } => ShardUpdate::Buffer {
            iteration: *iteration,
            kvs: kvs.slice(range),
        },
        ShardUpdate::ApplyBelow(i) => ShardUpdate::ApplyBelow(*i),
    };
    Replicate {
        range: entry.range.intersect(range).unwrap_or(range),
        seq: entry.seq,
        span: entry.span,
        update,
        dedupe: entry.dedupe.clone(),
    }
}

/// A server's update rule, and the keys it applies without regularization.
#[derive(Debug)]
pub(crate) struct Rule<'a, U> {
    pub(crate) updater: &'a U,
    pub(crate) unregularized: Option<KeyRange>,
}

impl<'a, U> Rule<'a, U> {
    /// The rule of a server configured by `cfg`.
    pub(crate) fn of(updater: &'a U, cfg: &super::ServerConfig) -> Self {
        Rule {
            updater,
            unregularized: cfg.unregularized,
        }
    }
}

impl<U> Clone for Rule<'_, U> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<U> Copy for Rule<'_, U> {}

fn apply_rows<V: Value, U: UpdateRule<V>, S: ParamStore<V>>(
    store: &mut S,
    rule: Rule<'_, U>,
    kvs: &KvPairs<V>,
) {
    // A slice is a view found by binary search: no key list is built for a dense push.
    let free = rule.unregularized.filter(|&r| !kvs.slice(r).is_empty());
    let Some(free) = free else {
        return apply_with(store, rule.updater, kvs);
    };
    // Rare (a push touching the intercept): the rows before, inside and after the exempt range.
    let (before, rest) = KeyRange::FULL.split_at(free.start());
    let (_, after) = rest.split_at(free.end());
    apply_with(store, rule.updater, &kvs.slice(before));
    apply_with(store, &rule.updater.unregularized(), &kvs.slice(free));
    apply_with(store, rule.updater, &kvs.slice(after));
}

fn apply_with<V: Value, U: UpdateRule<V>, S: ParamStore<V>>(
    store: &mut S,
    updater: &U,
    kvs: &KvPairs<V>,
) {
    if kvs.is_empty() {
        return;
    }
    let f = &mut |rows: &mut [V], aux: &mut [V], deltas: &[V]| {
        updater.apply_all(rows, aux, deltas);
    };
    match kvs.key_range() {
        Some(range) => store.update_range(range, kvs.values(), f),
        None => store.update_rows(kvs.keys(), kvs.values(), f),
    }
}

/// Sums several sparse vectors key-wise into one, in key order.
pub(crate) fn sum_by_key<V: Value>(batch: &[KvPairs<V>], width: usize) -> KvPairs<V> {
    let mut rows: Vec<(Key, &[V])> = batch
        .iter()
        .filter(|kvs| kvs.width() == width)
        .flat_map(|kvs| kvs.iter())
        .collect();
    rows.sort_by_key(|&(k, _)| k);
    let mut keys: Vec<Key> = Vec::with_capacity(rows.len());
    let mut values: Vec<V> = Vec::with_capacity(rows.len() * width);
    for (k, row) in rows {
        if keys.last() == Some(&k) {
            let start = values.len() - width;
            for (acc, &v) in values[start..].iter_mut().zip(row) {
                *acc = acc.add(v);
            }
        } else {
            keys.push(k);
            values.extend_from_slice(row);
        }
    }
    KvPairs::from_validated(keys, values, width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OrderedStore;
    use crate::updater::Updater;

    const SUM: Rule<'static, Updater> = Rule {
        updater: &Updater::Sum,
        unregularized: None,
    };

    fn kvs(keys: &[u64], v: i64) -> KvPairs<i64> {
        KvPairs::new(keys.to_vec(), vec![v; keys.len()], 1).unwrap()
    }

    #[test]
    fn applying_every_iteration_below_a_huge_bound_costs_only_the_buffered_ones() {
        let range = KeyRange::new(0, 100).unwrap();
        let role = ShardRole::Replica {
            primary: NodeId(1),
            synced: true,
        };
        let mut shard = Shard::new(range, OrderedStore::<i64>::new(1, 0), role);
        shard.pending.insert(0, vec![kvs(&[1, 2], 3), kvs(&[2], 4)]);
        shard.pending.insert(7, vec![kvs(&[1], 5)]);
        let step = |seq, update| Replicate {
            range,
            seq,
            span: 1,
            update,
            dedupe: Default::default(),
        };
        shard.apply_update(&step(1, ShardUpdate::ApplyBelow(5)), SUM);
        assert_eq!(
            (shard.store.get(1), shard.store.get(2)),
            (Some(&[3][..]), Some(&[7][..]))
        );
        assert_eq!(shard.applied_below, 5);
        assert!(shard.pending.contains_key(&7));
        shard.apply_update(&step(2, ShardUpdate::ApplyBelow(u32::MAX)), SUM);
        assert_eq!(shard.store.get(1), Some(&[8][..]));
        assert_eq!(shard.applied_below, u32::MAX);
        assert!(shard.pending.is_empty());
    }

    #[test]
    fn keys_exempt_from_regularization_escape_the_l1_threshold_and_no_others_do() {
        let strong_l1 = Updater::FtrlProximal {
            alpha: 1.0,
            beta: 1.0,
            l1: 100.0,
            l2: 0.0,
        };
        let free = KeyRange::new(20, 30).unwrap();
        let mut store = OrderedStore::<f64>::new(1, 2);
        let pushed = KvPairs::new(vec![5, 20, 29, 30], vec![1.0; 4], 1).unwrap();
        let rule = Rule {
            updater: &strong_l1,
            unregularized: Some(free),
        };
        apply_rows(&mut store, rule, &pushed);
        let weight = |k| store.get(k).map_or(0.0, |w| w[0]);
        // |z| = 1 is below l1 = 100: regularized keys stay at exactly zero.
        assert_eq!((weight(5), weight(30)), (0.0, 0.0));
        // Without l1, one step of FTRL moves against the gradient.
        assert!(weight(20) < 0.0 && weight(29) < 0.0, "{store:?}");
        assert_eq!(weight(20), weight(29));
    }
}
