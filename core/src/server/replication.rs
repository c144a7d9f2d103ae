//! Shards on the move: how a primary streams its update order to the replicas, how a replica
//! follows it, and how a server re-cuts its shards when the ring changes (ARCHITECTURE.md §8).
//!
//! # The update order
//!
//! Every change to a shard is one `Replicate { range, seq, span, update, dedupe }` step
//! (`ShardUpdate::Apply`, `Buffer` or `ApplyBelow`), carried out by the primary through the same
//! function (`Shard::apply_update`) that its replicas use. A replica applies a step ending at `seq`
//! only right after `seq - span`, through the same update rule, so it reproduces the primary's
//! values and updater state bit for bit. A gap is repaired from the primary's log, or with a whole
//! copy (`Transfer`) once the log no longer reaches back, never skipped. Steps travel to each
//! replica server in batches, one per call and replica server, whatever shards they belong to
//! (`super::batches`).
//!
//! Copies are cut into parts and sent again, so they can arrive out of order: a replica installs a
//! copy only around the parts it already holds a newer copy of, from the same primary, and
//! acknowledges it only then (`on_transfer`).
//!
//! # One sum per iteration in sequential mode
//!
//! A primary with replicas in sequential mode answers pushes before its replicas hold them
//! (`super::push`). It queues the buffered steps (`Shard::take_step`) and ships each iteration's
//! queue as one step holding the key-wise sum of its pushes, spanning their steps (`ship_queued`),
//! when the iteration is applied; it replaces those pushes in its own buffer by the same sum, so
//! both sides aggregate the same parts. Any other step, a copy (`Transfer`) or a new configuration
//! ships the queue first, and a queue that did not grow for a whole heartbeat goes out then (the
//! last iteration, which no worker advances past, is never applied). Replication then carries about
//! one sum per key and iteration: `pserver sim` prints it against that floor (docs/performance.md,
//! "Replication traffic").
//!
//! # A new primary
//!
//! When a range's primary is declared dead, its first replica becomes primary of its shard. Every
//! replica whose primary changed keeps its copy but stops extending it until the new primary's copy
//! arrives, and new replicas get a whole copy (`resend_replication`, on `TimerId::Replicate` until
//! acknowledged), the shard first cut into shards whose copies fit a frame
//! (`ServerConfig::max_reply_bytes`).
//!
//! # A new holder: copy, follow, catch up, switch
//!
//! While the coordinator lists a membership change, every server the next ring gives a range it
//! does not hold yet becomes a follower of that range's primary: it gets a whole copy, then every
//! update, and counts for acknowledgements like a replica. Pushes go on during the copy: the delta
//! written meanwhile reaches the new holder through the update stream. Every server of the next
//! ring reports `CaughtUp` once it holds each range that ring gives it, as primary or with a copy
//! in step with the primary, and the coordinator then switches to the next ring.
//!
//! A server already on the ring may not hold its ranges yet either: a replica chosen when another
//! server died during the change waits for its copy like a newcomer. While a change waits, each
//! server tells every primary on each heartbeat which ranges it should follow but holds no copy in
//! step of (`ask_for_copies`), since a primary that missed an epoch may count it in step. A server
//! whose first configuration was not the job's first does so always: it created no replica shards
//! while its primaries count it in step, and without writes to a range they would never learn
//! otherwise.
//!
//! A new shard of a job that declared its key space is laid out over its range up front
//! (`ParamStore::empty_for`) when the space's rows, laid out flat, take at most 1 GiB.

use std::collections::BTreeMap;

use crate::clock::RangeClock;
use crate::effects::{Effects, Refusal, TimerId};
use crate::ids::{NodeId, Time};
use crate::key::{Key, KeyRange};
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{ClockRecord, Envelope, Message, Replicate, ShardAck, ShardUpdate, Transfer};

use super::Server;
use super::batches::Batches;
use super::shard::{ReplicaState, Rule, Shard, ShardRole, first_step, restrict};

/// Which replicas [`Server::resend_replication`] serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Resend {
    /// The replication timer fired: whatever was sent may be lost, copies included.
    Lost,
    /// The configuration changed: replicas that need a copy get one; copies on their way are
    /// left alone.
    Changed,
    /// A replica installed a copy of this range: it gets the updates that came after.
    Range(KeyRange),
}

/// The most a declared key space's rows may take, laid out flat, for new shards to be laid
/// out up front.
const PRESIZE_BYTES: u128 = 1 << 30;

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// Applies `entry` to the primary shard it names and streams it to the replicas that are
    /// in step (or queues it, [`Shard::take_step`]); the others catch up from the log or a
    /// copy.
    pub(super) fn commit(&mut self, entry: Replicate<V>) {
        let Some(shard) = self.shards.get_mut(&entry.range.start()) else {
            return;
        };
        commit_step(shard, &mut self.batches, &self.updater, &self.cfg, entry);
    }

    /// Ships the queued buffered pushes of every primary shard: before a copy is cut or the
    /// ring changes.
    pub(super) fn ship_queued(&mut self) {
        self.ship_queues_where(|_, _| true);
    }

    /// Heartbeat: ships the queues that did not grow since the last heartbeat. Pushes of an
    /// iteration that never finishes (the last, which no worker advances past) reach the
    /// replicas that way and are acknowledged after all, while an iteration still under way
    /// keeps gathering its pushes into one sum.
    pub(super) fn ship_idle_queues(&mut self) {
        let seen = core::mem::take(&mut self.queue_seen);
        let mut grew = BTreeMap::new();
        self.ship_queues_where(|start, seq| {
            let idle = seen.get(&start) == Some(&seq);
            if !idle {
                grew.insert(start, seq);
            }
            idle
        });
        self.queue_seen = grew;
    }

    /// Ships the queue of every primary shard with one that `pick` (given the shard's start
    /// and last step) chooses.
    fn ship_queues_where(&mut self, mut pick: impl FnMut(Key, u64) -> bool) {
        let width = self.cfg.width;
        for (&start, shard) in &mut self.shards {
            if shard.has_queued() && pick(start, shard.seq) {
                let steps = shard.ship_queued(width);
                self.batches.ship(shard, steps);
            }
        }
    }

    /// True when primary shards of this server cover all of `range` and their replicas all
    /// applied update `seq`.
    pub(super) fn replicated(&self, range: KeyRange, seq: u64) -> bool {
        // One walk for both tests: a primary asks this of every step of every waiting push
        // after each acknowledgement.
        let mut led = 0;
        for (_, shard) in self.shards_in(range) {
            if !shard.replicated(seq) {
                return false;
            }
            led += shard.range.intersect(range).map_or(0, KeyRange::len);
        }
        led == range.len()
    }

    /// True when primary shards of this server cover every key of `range`. A server that gave
    /// up part of a range (it left the ring, or the range failed over) must not count the part
    /// it no longer holds as replicated: that part's new primary may lack the update.
    fn leads_all_of(&self, range: KeyRange) -> bool {
        let led: u64 = self
            .shards_in(range)
            .map(|(_, s)| s)
            .filter(|s| s.is_primary())
            .filter_map(|s| s.range.intersect(range))
            .map(KeyRange::len)
            .sum();
        led == range.len()
    }

    /// Acknowledges the pushes whose updates every replica now has.
    pub(super) fn ack_replicated(&mut self, out: &mut Effects<V>) {
        let done: Vec<(NodeId, crate::wire::SliceRef)> = self
            .unreplicated
            .iter()
            .filter(|(_, waits)| waits.iter().all(|&(r, seq)| self.replicated(r, seq)))
            .map(|(&k, _)| k)
            .collect();
        for (worker, slice) in done {
            self.unreplicated.remove(&(worker, slice));
            self.send(worker, Message::PushAck(slice), out);
        }
    }

    /// Sets the replication timer while some replica is behind, its timeout doubling (up to
    /// the cap) for as long as some replica stays behind.
    pub(super) fn arm_replication(&mut self, now: Time, out: &mut Effects<V>) {
        let behind = self.shards.values().any(|s| match &s.role {
            ShardRole::Primary { replicas, .. } => replicas
                .values()
                .any(|r| !matches!(r, ReplicaState::Acked(a) if *a >= s.shipped_seq())),
            ShardRole::Replica { .. } => false,
        });
        if !behind {
            self.replication_attempts = 0;
        } else if !self.replication_timer {
            self.replication_timer = true;
            let timing = self.cfg.timing;
            out.set_timer(
                TimerId::Replicate,
                now + timing.rto(self.replication_attempts),
            );
            self.replication_attempts = timing.next_attempt(self.replication_attempts);
        }
    }

    /// Sends replicas that are behind what they miss: the logged updates they lack, or the
    /// whole shard when the log no longer reaches back far enough or they hold no copy.
    /// `scope` says which shards and which copies: a copy already on its way is sent again
    /// only when the timer says it was lost.
    pub(super) fn resend_replication(&mut self, scope: Resend, out: &mut Effects<V>) {
        // Copies are cut from the shards as they stand: nothing may stay queued behind them.
        self.ship_queued();
        self.cut_for_copies();
        let width = self.cfg.width;
        let aux_width = self.updater.aux_width();
        let drop_dedupe = mutated!(self, DropDedupOnTransfer);
        let mut sends: Vec<(NodeId, Message<V>)> = Vec::new();
        for shard in self.shards.values_mut() {
            let seq = shard.seq;
            if let Resend::Range(r) = scope {
                if !r.covers(shard.range) {
                    continue;
                }
            }
            let copy_needed: Vec<NodeId> = match &shard.role {
                ShardRole::Primary { log, replicas, .. } => replicas
                    .iter()
                    .filter_map(|(&n, r)| match *r {
                        ReplicaState::Acked(a) if a >= seq => None,
                        ReplicaState::Acked(a)
                            if log.first().is_some_and(|e| first_step(e) <= a + 1) =>
                        {
                            let updates = log.iter().filter(|e| e.seq > a).cloned();
                            self.batches.gather(n, updates);
                            None
                        }
                        ReplicaState::Copying(_) if scope != Resend::Lost => None,
                        _ if matches!(scope, Resend::Range(_)) => None,
                        _ => Some(n),
                    })
                    .collect(),
                ShardRole::Replica { .. } => continue,
            };
            if copy_needed.is_empty() {
                continue;
            }
            let mut copy = shard.copy(width, aux_width);
            if drop_dedupe {
                copy.dedupe.clear();
            }
            copy.clocks = clock_records(&self.progress, shard.range);
            if let ShardRole::Primary { replicas, .. } = &mut shard.role {
                for n in copy_needed {
                    replicas.insert(n, ReplicaState::Copying(seq));
                    sends.push((n, Message::Transfer(copy.clone())));
                }
            }
            shard.trim_log();
        }
        for (to, body) in sends {
            self.send(to, body, out);
        }
    }

    /// Cuts every shard that some replica needs a whole copy of into shards whose copies fit
    /// a frame (`ServerConfig::max_reply_bytes`): copies then travel, and are acknowledged,
    /// shard by shard. Shards only ever split, so the replica's cuts follow. A copy carries
    /// each stored row with its update-rule state and, in sequential mode, each row of the
    /// pushes buffered for unfinished iterations, whose keys need not be stored yet: the cuts
    /// fall by what a copy carries of each key, not by the stored rows alone.
    fn cut_for_copies(&mut self) {
        let rows = self.cfg.rows_per_reply::<V>();
        let aux_width = self.updater.aux_width();
        let mut cuts = Vec::new();
        for shard in self.shards.values() {
            if !shard.needs_copy() {
                continue;
            }
            let mut carried: BTreeMap<Key, usize> = BTreeMap::new();
            shard.store.for_each_in(shard.range, &mut |k, _| {
                *carried.entry(k).or_default() += 1 + aux_width;
            });
            for kvs in shard.pending.values().flatten() {
                for &k in kvs.keys() {
                    *carried.entry(k).or_default() += 1;
                }
            }
            if carried.values().sum::<usize>() <= rows {
                continue;
            }
            let mut held = 0;
            for (k, n) in carried {
                if held > 0 && held + n > rows {
                    cuts.push(k);
                    held = 0;
                }
                held += n;
            }
        }
        for k in cuts {
            self.split_shards_at(k);
        }
    }

    /// A message between servers about the ranges they hold together: updates and copies,
    /// and their acknowledgements.
    pub(super) fn on_replication(&mut self, now: Time, env: Envelope<V>, out: &mut Effects<V>) {
        let from = env.from;
        let Some(cluster) = &self.cluster else {
            return;
        };
        if !cluster.is_server(from) {
            return out.refuse(from, Refusal::UnknownSender);
        }
        if env.epoch < cluster.members_since {
            // Sent under a configuration that no longer holds (the sender may have lost the
            // range since): it learns the new one from the coordinator and sends again. One
            // that differs from the one in force only in its pace still holds: a straggler
            // policy publishing epochs must not starve copies of the epoch they need.
            let current = cluster.epoch();
            return out.refuse(
                from,
                Refusal::StaleEpoch {
                    epoch: env.epoch,
                    current,
                },
            );
        }
        match env.body {
            Message::Replicate { updates } => self.on_replicate(from, updates, out),
            Message::ReplicateAck { acks } => self.on_replicate_ack(now, from, &acks, out),
            Message::Transfer(copy) => self.on_transfer(from, copy, out),
            Message::TransferAck { range, seq } => {
                self.on_transfer_ack(now, from, range, seq, out);
            }
            _ => out.refuse(from, Refusal::Unexpected),
        }
    }

    /// A replica takes in its primary's updates, in order, and says how far it has come.
    fn on_replicate(&mut self, from: NodeId, updates: Vec<Replicate<V>>, out: &mut Effects<V>) {
        let mut acks = Vec::with_capacity(updates.len());
        let first_range = updates.first().map(|e| e.range);
        for entry in &updates {
            if mutated!(self, PartialBatch) && Some(entry.range) != first_range {
                acks.push(ShardAck {
                    range: entry.range,
                    seq: Some(entry.seq),
                });
                continue;
            }
            if entry.span == 0 || entry.span > entry.seq || !self.is_replica_of(from, entry.range) {
                out.refuse(from, Refusal::Unexpected);
                continue;
            }
            let width = match &entry.update {
                ShardUpdate::Apply(kvs) | ShardUpdate::Buffer { kvs, .. } => Some(kvs.width()),
                ShardUpdate::ApplyBelow(_) => None,
            };
            if width.is_some_and(|w| w != self.cfg.width) {
                // Rows of another shape would not fit the store: refused, visibly, rather than
                // skipped where they are applied.
                out.refuse(from, Refusal::ForeignJob);
                continue;
            }
            // Most steps are for exactly one shard held in step with `from`: found in one
            // look, where cutting and walking the map costs five per step.
            if let Some(shard) = self.shards.get_mut(&entry.range.start()).filter(|s| {
                s.range == entry.range
                    && matches!(s.role, ShardRole::Replica { primary, synced: true } if primary == from)
            }) {
                if entry.seq - entry.span == shard.seq {
                    shard.apply_update(entry, Rule::of(&self.updater, &self.cfg));
                }
                acks.push(ShardAck {
                    range: entry.range,
                    seq: Some(shard.seq),
                });
                continue;
            }
            self.split_shards_at(entry.range.start());
            self.split_shards_at(entry.range.end());
            // Cut at both ends, the shards of the range are those that start in it.
            let within = entry.range.start()..entry.range.end();
            let covered: u64 = self
                .shards
                .range(within.clone())
                .map(|(_, s)| s)
                .filter(|s| matches!(s.role, ShardRole::Replica { primary, synced: true } if primary == from))
                .map(|s| s.range.len())
                .sum();
            if covered < entry.range.len() {
                acks.push(ShardAck {
                    range: entry.range,
                    seq: None,
                });
                continue;
            }
            let mut seq = u64::MAX;
            let rule = Rule::of(&self.updater, &self.cfg);
            for (_, shard) in self.shards.range_mut(within) {
                if entry.seq - entry.span == shard.seq {
                    if shard.range == entry.range {
                        shard.apply_update(entry, rule);
                    } else {
                        shard.apply_update(&restrict(entry, shard.range), rule);
                    }
                }
                seq = seq.min(shard.seq);
            }
            acks.push(ShardAck {
                range: entry.range,
                seq: Some(seq),
            });
        }
        if !acks.is_empty() {
            self.send(from, Message::ReplicateAck { acks }, out);
        }
    }

    /// True when, under this server's configuration, `primary` is the primary of every key of
    /// `range` and this server one of its replicas, or a server the next ring gives the range.
    fn is_replica_of(&self, primary: NodeId, range: KeyRange) -> bool {
        let me = self.cfg.id;
        me != primary
            && self.cluster.as_ref().is_some_and(|c| {
                c.every_piece_in(range, |now, next| {
                    now.first() == Some(&primary)
                        && (now.contains(&me) || next.is_some_and(|n| n.contains(&me)))
                })
            })
    }

    /// A primary learns how far a replica has come.
    fn on_replicate_ack(
        &mut self,
        now: Time,
        from: NodeId,
        acks: &[ShardAck],
        out: &mut Effects<V>,
    ) {
        for ack in acks {
            self.set_replica_state(from, ack.range, |state| match (state, ack.seq) {
                (ReplicaState::Acked(a), Some(s)) => ReplicaState::Acked(a.max(s)),
                (_, Some(s)) => ReplicaState::Acked(s),
                (ReplicaState::Acked(_), None) => ReplicaState::NeedsCopy,
                (copying, None) => copying,
            });
        }
        self.ack_replicated(out);
        self.arm_replication(now, out);
    }

    fn set_replica_state(
        &mut self,
        replica: NodeId,
        range: KeyRange,
        next: impl Fn(ReplicaState) -> ReplicaState,
    ) {
        // A shard the range covers starts in it.
        for (_, shard) in self.shards.range_mut(range.start()..range.end()) {
            if !range.covers(shard.range) {
                continue;
            }
            if let ShardRole::Primary { replicas, .. } = &mut shard.role {
                if let Some(state) = replicas.get_mut(&replica) {
                    *state = next(*state);
                }
            }
            shard.trim_log();
        }
    }

    /// A new holder installs a whole shard from the range's primary.
    fn on_transfer(&mut self, from: NodeId, copy: Transfer<V>, out: &mut Effects<V>) {
        let range = copy.range;
        let seq = copy.seq;
        if !self.is_replica_of(from, range) {
            return out.refuse(from, Refusal::Unexpected);
        }
        self.split_shards_at(range.start());
        self.split_shards_at(range.end());
        let starts = self.shard_starts_in(range);
        // The parts of the range this server already holds a newer copy of, from the same
        // primary. Copies are cut into parts and sent again, so an older one can arrive after
        // a newer one of a part of its range: it must replace neither that part nor, because
        // of it, the rest (ARCHITECTURE.md §8).
        let newer: Vec<KeyRange> = starts
            .iter()
            .filter_map(|s| self.shards.get(s))
            .filter(|s| {
                matches!(s.role, ShardRole::Replica { primary, synced: true } if primary == from)
                    && s.seq > seq
            })
            .map(|s| s.range)
            .collect();
        if newer.iter().map(|r| r.len()).sum::<u64>() < range.len() {
            for record in &copy.clocks {
                let clock = self.progress.entry(record.worker).or_default();
                for &(segment, finished) in &record.segments {
                    if let Some(inside) = segment.intersect(range) {
                        clock.advance(inside, finished);
                    }
                }
            }
            let role = ShardRole::Replica {
                primary: from,
                synced: true,
            };
            let store = self.template.empty();
            let (width, aux_width) = (self.cfg.width, self.updater.aux_width());
            let Some(shard) = Shard::from_copy(copy, store, width, aux_width, role) else {
                return out.refuse(from, Refusal::BadAnswer);
            };
            for start in starts {
                if !newer.iter().any(|r| r.start() == start) {
                    self.shards.remove(&start);
                }
            }
            for piece in cut_around(shard, &newer) {
                self.shards.insert(piece.range.start(), piece);
            }
        }
        self.send(from, Message::TransferAck { range, seq }, out);
        self.report_caught_up(out);
    }

    /// A primary learns that a replica installed its copy, and sends what came after it.
    fn on_transfer_ack(
        &mut self,
        now: Time,
        from: NodeId,
        range: KeyRange,
        seq: u64,
        out: &mut Effects<V>,
    ) {
        self.set_replica_state(from, range, |state| match state {
            ReplicaState::Acked(a) => ReplicaState::Acked(a.max(seq)),
            _ => ReplicaState::Acked(seq),
        });
        self.resend_replication(Resend::Range(range), out);
        self.ack_replicated(out);
        self.arm_replication(now, out);
    }

    /// Cuts the shard holding `at` in two there, if `at` falls inside it.
    pub(super) fn split_shards_at(&mut self, at: Key) {
        let Some((&start, shard)) = self.shards.range_mut(..at).next_back() else {
            return;
        };
        if shard.range.end() > at && start < at {
            let high = shard.split_off(at);
            self.shards.insert(at, high);
        }
    }

    /// Re-cuts the shards along the ring in force (and the next ring, while servers join or
    /// leave) and sets each one's role: a replica whose primary left becomes primary, a new
    /// replica or a server the next ring gives the range waits for a copy, shards of ranges
    /// this server no longer holds are dropped. At a job's start every shard is created empty,
    /// with every replica in step.
    pub(super) fn reshard(&mut self, fresh_start: bool, rejoined: &[NodeId], out: &mut Effects<V>) {
        let Some(cluster) = self.cluster.as_ref() else {
            return;
        };
        let pieces: Vec<(KeyRange, Vec<NodeId>)> = cluster.pieces_in(KeyRange::FULL);
        for (piece, _) in &pieces {
            self.split_shards_at(piece.start());
        }
        self.assign_roles(&pieces, rejoined);
        self.create_shards(pieces, fresh_start, out);
        // Rows to start from count only at a job's start; a server that joins a running job
        // copies its ranges instead, and must not keep them.
        self.template = self.template.empty();
        // A push waiting on a range this server no longer leads all of is resent by its worker
        // to the new primary; waiting on would never end.
        let waiting = core::mem::take(&mut self.unreplicated);
        self.unreplicated = waiting
            .into_iter()
            .filter(|(_, waits)| waits.iter().all(|&(range, _)| self.leads_all_of(range)))
            .collect();
    }

    /// Gives every shard its role among the holders of its piece of the ring (`pieces`, cut
    /// so that no shard straddles two), and drops the shards of pieces this server does not
    /// hold.
    fn assign_roles(&mut self, pieces: &[(KeyRange, Vec<NodeId>)], rejoined: &[NodeId]) {
        let me = self.cfg.id;
        let promote_stale = mutated!(self, PromoteStaleReplica);
        let mut gone = Vec::new();
        for (&start, shard) in &mut self.shards {
            let i = pieces.partition_point(|(p, _)| p.end() <= start);
            let Some((_, holders)) = pieces.get(i) else {
                continue;
            };
            match holders.iter().position(|&n| n == me) {
                None => gone.push(start),
                Some(0) => {
                    let new_replica = if promote_stale {
                        ReplicaState::Acked(shard.seq)
                    } else {
                        ReplicaState::NeedsCopy
                    };
                    shard.lead(&holders[1..], rejoined, new_replica);
                }
                Some(_) => shard.follow(holders[0]),
            }
        }
        for start in gone {
            self.shards.remove(&start);
        }
    }

    /// The part of `range` inside the job's declared key space, when the job declared one
    /// whose rows, laid out flat, fit [`PRESIZE_BYTES`]: what a new shard's store may lay out
    /// up front ([`ParamStore::empty_for`]).
    fn declared_part(&self, range: KeyRange) -> Option<KeyRange> {
        let space = self.cluster.as_ref()?.config.ring.key_space;
        let row_bytes = self.cfg.width * (1 + self.updater.aux_width()) * core::mem::size_of::<V>();
        let bytes = u128::from(space) * row_bytes as u128;
        if space == u64::MAX || bytes > PRESIZE_BYTES {
            return None;
        }
        range.intersect(KeyRange::new(0, space).ok()?)
    }

    /// Creates a shard for every part of a piece this server holds that no shard covers: as
    /// its primary, a range lost with its holders (or, at a job's start, a new one); as a
    /// replica, only at a job's start, when every shard is empty and so in step.
    fn create_shards(
        &mut self,
        pieces: Vec<(KeyRange, Vec<NodeId>)>,
        fresh_start: bool,
        out: &mut Effects<V>,
    ) {
        let me = self.cfg.id;
        let promote_stale = mutated!(self, PromoteStaleReplica);
        for (range, holders) in pieces {
            let Some(at) = holders.iter().position(|&n| n == me) else {
                continue;
            };
            for gap in self.gaps_in(range) {
                if at == 0 && !fresh_start {
                    out.emit(crate::effects::Event::RangeLost(gap));
                    // Listed already (lost before, in the same bounds): the coordinator
                    // would publish nothing new, and the report would never be answered.
                    let listed = self
                        .cluster
                        .as_ref()
                        .is_some_and(|c| c.config.lost.binary_search(&gap).is_ok());
                    if !listed {
                        self.lost_unlisted.push(gap);
                    }
                }
                let role = if at == 0 {
                    let start_as = if fresh_start || promote_stale {
                        ReplicaState::Acked(0)
                    } else {
                        ReplicaState::NeedsCopy
                    };
                    ShardRole::Primary {
                        log: Vec::new(),
                        replicas: holders[1..].iter().map(|&n| (n, start_as)).collect(),
                        queued: Vec::new(),
                    }
                } else if fresh_start || promote_stale {
                    ShardRole::Replica {
                        primary: holders[0],
                        synced: true,
                    }
                } else {
                    continue;
                };
                let mut store = match self.declared_part(gap) {
                    Some(part) => self.template.empty_for(part),
                    None => self.template.empty(),
                };
                if fresh_start {
                    self.template.for_each_row_in(gap, &mut |k, row, aux| {
                        let (values, state) = store.row_mut(k);
                        values.copy_from_slice(row);
                        state.copy_from_slice(aux);
                    });
                }
                self.shards
                    .insert(gap.start(), Shard::new(gap, store, role));
            }
        }
    }

    /// True while servers join or leave, the next ring gives this server ranges, and it holds
    /// each of them: as their primary, or with a copy in step with their primary.
    pub(super) fn caught_up(&self) -> bool {
        let me = self.cfg.id;
        let Some(cluster) = self.cluster.as_ref().filter(|c| c.next.is_some()) else {
            return false;
        };
        let pieces = cluster.pieces_in(KeyRange::FULL);
        let mut learning = pieces
            .iter()
            .filter(|(piece, _)| cluster.will_hold(me, piece.start()))
            .peekable();
        learning.peek().is_some()
            && learning.all(|(piece, holders)| {
                let covered: u64 = self
                    .shard_starts_in(*piece)
                    .iter()
                    .filter_map(|s| self.shards.get(s))
                    .filter(|s| match s.role {
                        ShardRole::Primary { .. } => holders[0] == me,
                        ShardRole::Replica { primary, synced } => synced && primary == holders[0],
                    })
                    .filter_map(|s| s.range.intersect(*piece))
                    .map(KeyRange::len)
                    .sum();
                covered == piece.len()
            })
    }

    /// Tells each primary which of its ranges this server should follow but holds no copy in
    /// step of. A primary may count this server in step: it missed the epoch in which this
    /// server dropped the range, or this server's primary changed. It would otherwise only
    /// find out with its next update, and a range nobody writes to any more would never be
    /// copied. Asked while a change is under way, and always by a server whose first
    /// configuration was not the job's first (it missed epoch 1, which a straggler policy's
    /// early change of pace makes likely): it created no replica shards, and its primaries
    /// count it in step from the start. Otherwise the next update sets the primary right, and
    /// asking on every heartbeat would only repeat what a primary that chose a new replica
    /// knows already.
    pub(super) fn ask_for_copies(&self, out: &mut Effects<V>) {
        let me = self.cfg.id;
        let Some(cluster) = self
            .cluster
            .as_ref()
            .filter(|c| c.next.is_some() || self.late_start)
        else {
            return;
        };
        let mut wanted: BTreeMap<NodeId, Vec<ShardAck>> = BTreeMap::new();
        for (piece, holders) in cluster.pieces_in(KeyRange::FULL) {
            if holders[1..].contains(&me) {
                for gap in self.gaps_in(piece) {
                    wanted.entry(holders[0]).or_default().push(ShardAck {
                        range: gap,
                        seq: None,
                    });
                }
            }
        }
        for shard in self.shards.values() {
            if let ShardRole::Replica {
                primary,
                synced: false,
            } = shard.role
            {
                wanted.entry(primary).or_default().push(ShardAck {
                    range: shard.range,
                    seq: None,
                });
            }
        }
        for (primary, acks) in wanted {
            self.send(primary, Message::ReplicateAck { acks }, out);
        }
    }

    /// Tells the coordinator, when it is so, that this server caught up with the change under
    /// way.
    pub(super) fn report_caught_up(&self, out: &mut Effects<V>) {
        if self.caught_up() {
            let epoch = self.epoch();
            self.send(self.coordinator_id(), Message::CaughtUp { epoch }, out);
        }
    }

    /// The parts of `range` no shard covers, in key order.
    fn gaps_in(&self, range: KeyRange) -> Vec<KeyRange> {
        let mut gaps = Vec::new();
        let mut at = range.start();
        for start in self.shard_starts_in(range) {
            let Some(shard) = self.shards.get(&start) else {
                continue;
            };
            if shard.range.start() > at {
                gaps.extend(KeyRange::new(at, shard.range.start()).ok());
            }
            at = at.max(shard.range.end());
        }
        if at < range.end() {
            gaps.extend(KeyRange::new(at, range.end()).ok());
        }
        gaps
    }
}

/// The parts of `copy` outside `keep` (ranges inside the copy's, in key order, apart).
fn cut_around<V: Value, S: ParamStore<V>>(
    copy: Shard<V, S>,
    keep: &[KeyRange],
) -> Vec<Shard<V, S>> {
    let mut parts = Vec::new();
    let mut rest = Some(copy);
    for kept in keep {
        let Some(mut part) = rest.take() else {
            break;
        };
        if kept.start() > part.range.start() {
            let tail = part.split_off(kept.start());
            parts.push(part);
            part = tail;
        }
        if kept.end() < part.range.end() {
            rest = Some(part.split_off(kept.end()));
        }
    }
    parts.extend(rest);
    parts
}

/// The workers' clocks on `range`, as a copy of a shard carries them.
pub(super) fn clock_records(
    progress: &BTreeMap<NodeId, RangeClock>,
    range: KeyRange,
) -> Vec<ClockRecord> {
    progress
        .iter()
        .map(|(&worker, clock)| ClockRecord {
            worker,
            segments: clock.segments_in(range).collect(),
        })
        .collect()
}

/// [`Server::commit`] on a shard already in hand: for a caller walking the shards in place.
pub(super) fn commit_step<V: Value, U: UpdateRule<V>, S: ParamStore<V>>(
    shard: &mut Shard<V, S>,
    batches: &mut Batches<V>,
    updater: &U,
    cfg: &super::ServerConfig,
    entry: Replicate<V>,
) {
    let room = crate::sizes::steps_within(cfg.max_frame);
    let steps = shard.take_step(entry, Rule::of(updater, cfg), cfg.width, room);
    batches.ship(shard, steps);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OrderedStore;

    fn range(a: u64, b: u64) -> KeyRange {
        KeyRange::new(a, b).unwrap()
    }

    fn copy_of(r: KeyRange) -> Shard<i64, OrderedStore<i64>> {
        let role = ShardRole::Replica {
            primary: NodeId(1),
            synced: true,
        };
        Shard::new(r, OrderedStore::new(1, 0), role)
    }

    fn ranges(parts: &[Shard<i64, OrderedStore<i64>>]) -> Vec<KeyRange> {
        parts.iter().map(|p| p.range).collect()
    }

    #[test]
    fn an_older_copy_is_cut_around_the_parts_held_newer_and_nothing_else() {
        let whole = range(0, 100);
        // Nothing held newer: the copy whole.
        assert_eq!(ranges(&cut_around(copy_of(whole), &[])), [whole]);
        // Newer parts inside, at either end, and side by side.
        let kept = [range(10, 20), range(20, 30), range(50, 60)];
        assert_eq!(
            ranges(&cut_around(copy_of(whole), &kept)),
            [range(0, 10), range(30, 50), range(60, 100)]
        );
        let ends = [range(0, 10), range(90, 100)];
        assert_eq!(ranges(&cut_around(copy_of(whole), &ends)), [range(10, 90)]);
        assert_eq!(ranges(&cut_around(copy_of(whole), &[whole])), []);
    }
}
