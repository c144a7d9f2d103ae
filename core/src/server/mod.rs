//! The server: holds shards of the parameters, applies pushes through its update rule,
//! replicates them, and answers pulls once the job's consistency model allows.

mod replication;
mod shard;

use core::hash::{Hash, Hasher};
use std::collections::{BTreeMap, BTreeSet};

use crate::clock::RangeClock;
use crate::cluster::Cluster;
use crate::consistency::Consistency;
use crate::effects::{Effects, Event, Refusal, TimerId};
use crate::ids::{Epoch, Iteration, NodeId, Role, Time};
use crate::key::{Key, KeyRange};
use crate::kv::{KvPairs, PairsBuilder};
use crate::selection::KeySelection;
use crate::store::{OrderedStore, ParamStore};
use crate::timing::Timing;
use crate::updater::{UpdateRule, Updater};
use crate::value::Value;
use crate::wire::{
    ClusterConfig, Envelope, Message, Pull, PullReply, Push, Replicate, ShardUpdate, SliceRef,
};

use replication::Resend;
use shard::Shard;

/// Messages kept while a server waits for a configuration; beyond this, retransmission recovers.
const MAX_EARLY: usize = 64;

/// What a server is told at start. Build it with [`ServerConfig::new`] and change the fields
/// that differ from the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ServerConfig {
    /// This server.
    pub id: NodeId,
    /// The coordinator to register with.
    pub coordinator: NodeId,
    /// Values per key.
    pub width: usize,
    /// Timeouts and intervals.
    pub timing: Timing,
    /// Which start of this server process this is. Give every start a larger value than the
    /// last (the start time will do): the coordinator takes a registration with a new
    /// incarnation for a restart that lost the server's state, one with the same incarnation
    /// for a resend, and refuses one with a smaller incarnation (a late resend of a process
    /// that is gone).
    pub incarnation: u64,
    /// Largest answer, in bytes of keys and values, to a pull of key ranges; a larger answer is
    /// sent in parts (see [`PullReply::resume`]). Copies of shards for new replicas are cut to
    /// the same size. Keep it below the codec's frame limit.
    pub max_reply_bytes: usize,
}

impl ServerConfig {
    /// A server of width 1 with default timing and reply size.
    pub fn new(id: NodeId, coordinator: NodeId) -> Self {
        ServerConfig {
            id,
            coordinator,
            width: 1,
            timing: Timing::default(),
            incarnation: 0,
            max_reply_bytes: crate::worker::DEFAULT_MAX_SLICE_BYTES,
        }
    }

    /// Rows per answer to a range pull (and per copy of a shard): as many as fit
    /// `max_reply_bytes`, at least one.
    fn rows_per_reply<V: Value>(&self) -> usize {
        crate::sizes::rows_within::<V>(self.max_reply_bytes, self.width)
    }
}

/// A pull waiting until the consistency model lets it be answered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct HeldPull {
    iteration: Iteration,
    keys: KeySelection,
}

/// A parameter server node (sans-IO).
///
/// Call [`Server::start`] once, then [`Server::on_message`] for every frame addressed to it and
/// [`Server::on_timer`] whenever a timer it set fires; after each call, carry out the
/// [`Effects`].
///
/// A server holds *shards*: one per key range it is the primary or a replica of, each with its
/// rows, its buffered deltas, its de-duplication state and its update order
/// (ARCHITECTURE.md §8). The primary of a range applies pushes and streams each step to the
/// range's replicas, and acknowledges a push only once every replica has it.
///
/// Invariants: the rows of a worker's push request are applied at most once per key (a resend
/// is acknowledged again, never applied again, whichever server holds the range by then); an
/// acknowledged push is held by the range's primary and every replica; a pull from iteration
/// `c` is answered only when every live worker has finished every iteration below `c - tau`
/// (and, in sequential mode, the server has applied them).
#[derive(Clone, Debug)]
pub struct Server<V: Value, U: UpdateRule<V> = Updater, S: ParamStore<V> = OrderedStore<V>> {
    cfg: ServerConfig,
    updater: U,
    cluster: Option<Cluster>,
    /// Rows to start from, moved into the shards of the first configuration; afterwards an
    /// empty store that new shards are cut from.
    template: S,
    /// By range start; the ranges are disjoint.
    shards: BTreeMap<Key, Shard<V, S>>,
    /// Per worker, by key range: every iteration below the clock's reading is finished. A
    /// worker's progress report raises the whole key space; a copy of a shard brings the
    /// clocks of its range (ARCHITECTURE.md §8).
    progress: BTreeMap<NodeId, RangeClock>,
    held: BTreeMap<(NodeId, SliceRef), HeldPull>,
    /// Push slices taken in but not acknowledged yet: each waits until every replica of the
    /// named shards has applied the named update.
    unreplicated: BTreeMap<(NodeId, SliceRef), Vec<(KeyRange, u64)>>,
    /// Whether the replication timer is set.
    replication_timer: bool,
    /// Replication timer firings in a row that found a replica behind.
    replication_attempts: u8,
    /// Started with a configuration in force: the job is starting, every shard is empty.
    started_configured: bool,
    /// [`Server::leave`] was called.
    leave_requested: bool,
    /// Per worker, the epoch it last reported taken progress at and that progress
    /// ([`Message::Progress`]); counted only while that epoch is in force.
    taken: BTreeMap<NodeId, (Epoch, Iteration)>,
    /// Per primary shard with buffered pushes queued, its last step at the last heartbeat: a
    /// queue that has not grown for a whole heartbeat is shipped then.
    queue_seen: BTreeMap<Key, u64>,
    /// A configuration this process adopted listed it as a member (on the ring or joining):
    /// until then it keeps registering, whatever configurations it hears of that do not list
    /// it (one broadcast before its registration reached the coordinator, say).
    listed: bool,
    /// Messages from senders with a newer configuration than ours, replayed once we have it.
    early: Vec<Envelope<V>>,
    /// Workers this process, which joined a running job, has not heard its progress from: an
    /// earlier process with this id may have acknowledged it, so they would not resend it by
    /// themselves. Asked with `ProgressRequest` on every heartbeat until they answer.
    progress_unheard: BTreeSet<NodeId>,
    #[cfg(feature = "mutations")]
    mutation: Option<crate::mutation::Mutation>,
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> PartialEq for Server<V, U, S> {
    fn eq(&self, other: &Self) -> bool {
        #[cfg(feature = "mutations")]
        let same_mutation = self.mutation == other.mutation;
        #[cfg(not(feature = "mutations"))]
        let same_mutation = true;
        same_mutation
            && self.cfg == other.cfg
            && self.updater == other.updater
            && self.cluster == other.cluster
            && self.template.same_rows(&other.template)
            && self.shards == other.shards
            && self.progress == other.progress
            && self.held == other.held
            && self.unreplicated == other.unreplicated
            && self.replication_timer == other.replication_timer
            && self.replication_attempts == other.replication_attempts
            && self.started_configured == other.started_configured
            && self.leave_requested == other.leave_requested
            && self.taken == other.taken
            && self.queue_seen == other.queue_seen
            && self.listed == other.listed
            && self.early == other.early
            && self.progress_unheard == other.progress_unheard
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Eq for Server<V, U, S> {}

impl<V: Value + Hash, U: UpdateRule<V>, S: ParamStore<V>> Hash for Server<V, U, S> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.cfg.hash(state);
        self.updater.fingerprint(state);
        self.cluster.hash(state);
        self.template.fingerprint(state);
        self.shards.hash(state);
        self.progress.hash(state);
        self.held.hash(state);
        self.unreplicated.hash(state);
        self.replication_timer.hash(state);
        self.replication_attempts.hash(state);
        self.started_configured.hash(state);
        self.leave_requested.hash(state);
        self.taken.hash(state);
        self.queue_seen.hash(state);
        self.listed.hash(state);
        self.early.hash(state);
        self.progress_unheard.hash(state);
        #[cfg(feature = "mutations")]
        self.mutation.hash(state);
    }
}

impl<V: Value, U: UpdateRule<V>> Server<V, U, OrderedStore<V>> {
    /// A server with an ordered-map store.
    pub fn new(cfg: ServerConfig, updater: U) -> Self {
        let store = OrderedStore::new(cfg.width, updater.aux_width());
        Self::with_store(cfg, updater, store)
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// A server keeping its parameters in stores shaped like `store`; rows already in `store`
    /// are the starting values of the keys this server holds in the job's first configuration.
    pub fn with_store(cfg: ServerConfig, updater: U, store: S) -> Self {
        Server {
            cfg,
            updater,
            cluster: None,
            template: store,
            shards: BTreeMap::new(),
            progress: BTreeMap::new(),
            held: BTreeMap::new(),
            unreplicated: BTreeMap::new(),
            replication_timer: false,
            replication_attempts: 0,
            started_configured: false,
            leave_requested: false,
            taken: BTreeMap::new(),
            queue_seen: BTreeMap::new(),
            listed: false,
            early: Vec::new(),
            progress_unheard: BTreeSet::new(),
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }

    /// Runs a deliberately broken protocol (see [`crate::mutation::Mutation`]).
    #[cfg(feature = "mutations")]
    pub fn set_mutation(&mut self, mutation: Option<crate::mutation::Mutation>) {
        self.mutation = mutation;
    }

    /// This server's id.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// The epoch of the configuration in force, 0 before the first.
    pub fn epoch(&self) -> Epoch {
        self.cluster.as_ref().map_or(0, Cluster::epoch)
    }

    fn shard_of(&self, key: Key) -> Option<&Shard<V, S>> {
        self.shards
            .range(..=key)
            .next_back()
            .map(|(_, s)| s)
            .filter(|s| s.range.contains(key))
    }

    /// The stored values of `key`, if it was ever written to a shard this server holds.
    pub fn value(&self, key: Key) -> Option<&[V]> {
        self.shard_of(key)?.store.get(key)
    }

    /// Every value received for `key`: stored plus buffered for a later iteration. Pushes are
    /// counted here exactly once, which is what exactly-once checks compare (with [`Updater::Sum`]).
    pub fn received_total(&self, key: Key) -> Vec<V> {
        let shard = self.shard_of(key);
        let mut total: Vec<V> = shard
            .and_then(|s| s.store.get(key))
            .map_or_else(|| vec![V::default(); self.cfg.width], <[V]>::to_vec);
        for kvs in shard.iter().flat_map(|s| s.pending.values().flatten()) {
            if let Some(row) = kvs.get(key) {
                for (t, &d) in total.iter_mut().zip(row) {
                    *t = t.add(d);
                }
            }
        }
        total
    }

    /// Sequential mode: every iteration below this one has been applied on every shard this
    /// server is the primary of (0 when it is the primary of none). An inspector for checkers
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn applied_below(&self) -> Iteration {
        self.shards
            .values()
            .filter(|s| s.is_primary())
            .map(|s| s.applied_below)
            .min()
            .unwrap_or(0)
    }

    /// Pulls held back by the consistency model (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn held_pulls(&self) -> usize {
        self.held.len()
    }

    /// Key spans remembered for de-duplication, over all shards and workers (feature
    /// `testing`).
    #[cfg(feature = "testing")]
    pub fn dedupe_entries(&self) -> usize {
        self.shards
            .values()
            .flat_map(|s| s.dedupe.values())
            .map(crate::dedupe::DedupeWindow::len)
            .sum()
    }

    /// The key ranges of the shards this server holds, each with whether it is their primary.
    pub fn shards(&self) -> impl Iterator<Item = (KeyRange, bool)> + '_ {
        self.shards.values().map(|s| (s.range, s.is_primary()))
    }

    /// Push slices taken in and waiting for their replicas before they are acknowledged
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn unreplicated_pushes(&self) -> usize {
        self.unreplicated.len()
    }

    /// Registers with the coordinator and starts heartbeats. Call once, first.
    pub fn start(&mut self, now: Time, out: &mut Effects<V>) {
        self.register(now, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    /// Starts with `config` already in force (static membership, e.g. from
    /// [`crate::Coordinator::bootstrapped`]) instead of registering. Call once, first, instead
    /// of `start`.
    ///
    /// Only for a job that is starting: the server takes every shard of `config` to be empty
    /// and its replicas in step. A server restarted while a job runs must register instead
    /// (it then joins as a new member).
    pub fn start_configured(&mut self, now: Time, config: ClusterConfig, out: &mut Effects<V>) {
        self.started_configured = true;
        self.adopt(now, config.coordinator, config, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    /// Asks the coordinator to take this server out of the job. Its ranges are copied to the
    /// servers that take them over while it keeps serving; once they caught up, a configuration
    /// without it arrives, it drops its shards and emits [`Event::Fenced`]: it may stop. The request is repeated with every heartbeat
    /// until then.
    pub fn leave(&mut self, out: &mut Effects<V>) {
        self.leave_requested = true;
        if self.is_member() {
            self.send(self.cfg.coordinator, Message::Leave, out);
        }
    }

    /// True while the configuration in force has this server on the ring or joining it.
    pub fn is_member(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.is_server(self.cfg.id))
    }

    fn register(&mut self, now: Time, out: &mut Effects<V>) {
        let body = Message::Register {
            role: Role::Server,
            incarnation: self.cfg.incarnation,
        };
        out.send(Envelope::new(
            self.cfg.id,
            self.cfg.coordinator,
            self.epoch(),
            body,
        ));
        out.set_timer(TimerId::Register, now + self.cfg.timing.register_retry);
    }

    /// Asks every worker this process has not heard its progress from for it.
    fn ask_for_progress(&self, out: &mut Effects<V>) {
        for &w in &self.progress_unheard {
            self.send(w, Message::ProgressRequest, out);
        }
    }

    fn send(&self, to: NodeId, body: Message<V>, out: &mut Effects<V>) {
        out.send(Envelope::new(self.cfg.id, to, self.epoch(), body));
    }

    /// Call when a timer this server set fires.
    pub fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Effects<V>) {
        match timer {
            TimerId::Register if !self.listed => self.register(now, out),
            TimerId::Replicate => {
                self.replication_timer = false;
                self.resend_replication(Resend::Lost, out);
                self.arm_replication(now, out);
            }
            TimerId::Heartbeat => {
                let body = Message::Heartbeat { sent_at: now };
                self.send(self.cfg.coordinator, body, out);
                self.ship_idle_queues(out);
                self.arm_replication(now, out);
                // Either may have been lost; the coordinator waits for both.
                self.report_caught_up(out);
                self.ask_for_progress(out);
                self.ask_for_copies(out);
                if self.leave_requested && self.is_member() {
                    self.send(self.cfg.coordinator, Message::Leave, out);
                }
                out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
            }
            _ => {}
        }
    }

    /// Call for every message addressed to this server.
    pub fn on_message(&mut self, now: Time, env: Envelope<V>, out: &mut Effects<V>) {
        let from = env.from;
        let env_epoch = env.epoch;
        if env.to != self.cfg.id {
            out.refuse(from, Refusal::Misaddressed { to: env.to });
            return;
        }
        if let Message::Config(config) = env.body {
            self.adopt(now, from, config, out);
            return;
        }
        let behind = self.cluster.as_ref().is_none_or(|c| env.epoch > c.epoch());
        if behind {
            // A sender already knows a configuration we lack (it raced ahead of the broadcast):
            // keep its message for when the configuration arrives rather than waste a
            // retransmission timeout, and ask for the configuration if we had one.
            if self.cluster.is_some() {
                self.send(self.cfg.coordinator, Message::ConfigRequest, out);
            }
            if self.early.contains(&env) {
                return;
            }
            if self.early.len() < MAX_EARLY {
                self.early.push(env);
            } else {
                out.refuse(from, Refusal::Overflow);
            }
            return;
        }
        let Some(cluster) = &self.cluster else {
            return;
        };
        let from_server = cluster.is_server(from);
        match env.body {
            Message::Push(_) | Message::Pull(_) | Message::Progress { .. }
                if !cluster.is_worker(from) =>
            {
                out.refuse(from, Refusal::UnknownSender);
            }
            Message::Replicate { .. }
            | Message::ReplicateAck { .. }
            | Message::Transfer(_)
            | Message::TransferAck { .. }
                if !from_server =>
            {
                out.refuse(from, Refusal::UnknownSender);
            }
            Message::Replicate { .. }
            | Message::ReplicateAck { .. }
            | Message::Transfer(_)
            | Message::TransferAck { .. }
                if env.epoch < cluster.epoch() =>
            {
                // Sent under a configuration that no longer holds (the sender may have lost the
                // range since): it learns the new one from the coordinator and sends again.
                out.refuse(
                    from,
                    Refusal::StaleEpoch {
                        epoch: env.epoch,
                        current: cluster.epoch(),
                    },
                );
            }
            Message::Push(push) => self.on_push(now, from, push, out),
            Message::Pull(pull) => self.on_pull(from, pull, out),
            Message::Progress {
                finished_below,
                taken_below,
            } => {
                self.progress_unheard.remove(&from);
                let clock = self.progress.entry(from).or_default();
                clock.advance(KeyRange::FULL, finished_below);
                let recorded = clock.min_in(KeyRange::FULL).unwrap_or(finished_below);
                let epoch = self.epoch();
                // Taken progress is kept only where it runs ahead of finished progress (in
                // sequential mode with replicas), and only at the epoch it was reported in.
                let taken = if env_epoch != epoch {
                    0
                } else if taken_below > recorded {
                    let entry = self.taken.entry(from).or_insert((epoch, 0));
                    if entry.0 != epoch {
                        *entry = (epoch, 0);
                    }
                    entry.1 = entry.1.max(taken_below);
                    entry.1
                } else {
                    self.taken
                        .get(&from)
                        .filter(|&&(at, _)| at == epoch)
                        .map_or(recorded, |&(_, below)| below.max(recorded))
                };
                let body = Message::ProgressAck {
                    finished_below: recorded,
                    taken_below: taken,
                };
                self.send(from, body, out);
                self.apply_finished_iterations(now, out);
                self.answer_held(out);
            }
            Message::Replicate { updates } => self.on_replicate(from, updates, out),
            Message::ReplicateAck { acks } => self.on_replicate_ack(now, from, &acks, out),
            Message::Transfer(copy) => self.on_transfer(from, copy, out),
            Message::TransferAck { range, seq } => {
                self.on_transfer_ack(now, from, range, seq, out);
            }
            _ => out.refuse(from, Refusal::Unexpected),
        }
    }

    fn adopt(&mut self, now: Time, from: NodeId, config: ClusterConfig, out: &mut Effects<V>) {
        let mine = self.cfg.incarnation;
        if let Some(listed) = config.incarnation_of(self.cfg.id).filter(|&i| i != mine) {
            // The configuration gives ranges to an earlier start of this node, which held
            // them; this process holds none of it, and serving them would answer pulls and
            // de-duplicate pushes from empty shards. It waits for a configuration that lists
            // it under its own incarnation.
            return out.refuse(
                from,
                Refusal::OtherIncarnation {
                    known: mine,
                    claimed: listed,
                },
            );
        }
        let cluster = match Cluster::successor(self.cluster.as_ref(), config) {
            Ok(Some(cluster)) => cluster,
            Ok(None) => return,
            Err(reason) => return out.refuse(from, reason),
        };
        let first = self.cluster.is_none();
        // De-duplication windows are kept even for removed workers: forgetting one would let a
        // late duplicate be applied again if the worker ever came back.
        self.held.retain(|(w, _), _| cluster.is_worker(*w));
        let fresh_start = first && (self.started_configured || cluster.epoch() == 1);
        // A server listed as joining anew holds nothing, whatever it held before (it may have
        // restarted): what this server knew of its copies is void.
        let rejoined: Vec<NodeId> = cluster
            .config
            .joining
            .iter()
            .copied()
            .filter(|n| {
                self.cluster
                    .as_ref()
                    .is_none_or(|old| !old.config.joining.contains(n))
            })
            .collect();
        self.count_joiners_as_caught_up(&cluster);
        if first && !fresh_start {
            self.progress_unheard = cluster.workers().iter().copied().collect();
        }
        self.progress_unheard.retain(|w| cluster.is_worker(*w));
        let was_member = self.is_member();
        // What is queued goes to the replicas of the ring it was taken in under.
        self.ship_queued(out);
        self.cluster = Some(cluster);
        if was_member && !self.is_member() {
            // It left, or the coordinator declared it dead: its ranges are served elsewhere
            // now, and the process must stop (it may start again, as a new member).
            out.emit(Event::Fenced);
        }
        self.reshard(fresh_start, &rejoined, out);
        // A pull held for a range this server no longer serves is sent again by its worker,
        // re-sliced under the new ring.
        let held = core::mem::take(&mut self.held);
        self.held = held
            .into_iter()
            .filter(|(_, h)| self.serves(&h.keys))
            .collect();
        self.resend_replication(Resend::Changed, out);
        // A replica that was behind may have left the range's holders: what every holder
        // left has is acknowledged now.
        self.ack_replicated(out);
        self.report_caught_up(out);
        if !self.listed && self.is_member() {
            self.listed = true;
            out.cancel_timer(TimerId::Register);
            out.emit(Event::Ready {
                epoch: self.epoch(),
            });
            self.ask_for_progress(out);
        }
        self.apply_finished_iterations(now, out);
        self.arm_replication(now, out);
        self.answer_held(out);
        let now_current: Vec<Envelope<V>> = {
            let epoch = self.epoch();
            let (ready, later) = core::mem::take(&mut self.early)
                .into_iter()
                .partition(|e| e.epoch <= epoch);
            self.early = later;
            ready
        };
        for env in now_current {
            self.on_message(now, env, out);
        }
    }

    /// A worker that joined a running job has nothing to push for the iterations the others
    /// finished: count it as having finished them too, so that nobody waits for it, and tell
    /// it where to start when it asks.
    fn count_joiners_as_caught_up(&mut self, next: &Cluster) {
        let Some(old) = &self.cluster else {
            return;
        };
        let staying = old.workers().iter().filter(|w| next.is_worker(**w));
        let floor = match staying.map(|&w| self.finished_in(w, KeyRange::FULL)).min() {
            Some(min) => min,
            None => self
                .progress
                .values()
                .filter_map(|c| c.min_in(KeyRange::FULL))
                .max()
                .unwrap_or(0),
        };
        for &w in next.workers() {
            if !old.is_worker(w) {
                let clock = self.progress.entry(w).or_default();
                clock.advance(KeyRange::FULL, floor);
            }
        }
    }

    fn consistency(&self) -> Consistency {
        self.cluster
            .as_ref()
            .map_or_else(Consistency::default, |c| c.config.consistency)
    }

    /// Whether a push or pull may be served, or must be redirected.
    fn owns_all(&self, keys: &[Key]) -> bool {
        keys.is_empty()
            || self
                .cluster
                .as_ref()
                .is_some_and(|c| crate::slicing::primary_of_keys(c, self.cfg.id, keys))
    }

    fn owns_range(&self, range: KeyRange) -> bool {
        self.cluster.as_ref().is_some_and(|c| {
            c.ring
                .segments_in(range)
                .all(|(_, owners)| owners[0] == self.cfg.id)
        })
    }

    fn redirect(&self, to: NodeId, slice: SliceRef, out: &mut Effects<V>) {
        let body = Message::Redirect {
            slice,
            epoch: self.epoch(),
        };
        self.send(to, body, out);
    }

    fn on_push(&mut self, now: Time, from: NodeId, push: Push<V>, out: &mut Effects<V>) {
        let owned = push.kvs.is_empty()
            || self
                .cluster
                .as_ref()
                .is_some_and(|c| crate::slicing::primary_of_pairs(c, self.cfg.id, &push.kvs));
        if !owned {
            self.redirect(from, push.slice, out);
            return;
        }
        if push.kvs.width() != self.cfg.width {
            // A worker of another job; it will not be acknowledged.
            out.refuse(from, Refusal::ForeignJob);
            return;
        }
        let Some(span) = push.kvs.span() else {
            self.send(from, Message::PushAck(push.slice), out);
            return;
        };
        let sequential = self.consistency() == Consistency::Sequential;
        let starts: Vec<Key> = self.shard_starts_in(span);
        let mut waits = Vec::new();
        let mut updates = Vec::new();
        for start in starts {
            let Some(shard) = self.shards.get_mut(&start) else {
                continue;
            };
            // The span of the push may reach over ranges this server only replicates; the
            // ownership check above leaves no rows there.
            if !shard.is_primary() || push.kvs.slice(shard.range).is_empty() {
                continue;
            }
            if let Some(window) = shard.dedupe.get_mut(&from) {
                window.settle(push.settled_below);
            }
            let dedupe = !mutated!(self, NoDedupe);
            let fresh = shard.fresh_rows(from, push.slice.request, &push.kvs, dedupe);
            if !fresh.is_empty() {
                let update = if sequential && push.iteration >= shard.applied_below {
                    ShardUpdate::Buffer {
                        iteration: push.iteration,
                        kvs: fresh.clone(),
                    }
                } else {
                    ShardUpdate::Apply(fresh.clone())
                };
                let record = shard::record_of(from, push.settled_below, push.slice.request, &fresh);
                let entry = Replicate {
                    range: shard.range,
                    seq: shard.seq + 1,
                    span: 1,
                    update,
                    dedupe: vec![record],
                };
                updates.push(entry);
            }
            // A resend waits for the replicas too: they may not have its rows yet.
            waits.push((shard.range, shard.seq + u64::from(!fresh.is_empty())));
        }
        for entry in updates {
            self.commit(entry, out);
        }
        waits.retain(|&(range, seq)| !self.replicated(range, seq));
        if waits.is_empty() || mutated!(self, AckBeforeReplicate) {
            self.send(from, Message::PushAck(push.slice), out);
        } else {
            if sequential {
                // Its replicas get it with the iteration's sum, once every worker finished
                // the iteration, which this push may be what it waits for.
                self.send(from, Message::PushTaken(push.slice), out);
            }
            self.unreplicated.insert((from, push.slice), waits);
            self.arm_replication(now, out);
        }
    }

    /// Starts of the shards overlapping `range`, in key order.
    fn shard_starts_in(&self, range: KeyRange) -> Vec<Key> {
        let first = self
            .shards
            .range(..=range.start())
            .next_back()
            .filter(|(_, s)| s.range.end() > range.start())
            .map(|(&k, _)| k);
        first
            .into_iter()
            .chain(
                self.shards
                    .range(range.start()..range.end())
                    .map(|(&k, _)| k)
                    .filter(|&k| Some(k) != first),
            )
            .collect()
    }

    /// Sequential mode: applies, in order, each buffered iteration that every live worker has
    /// finished, aggregated over workers so that the update rule sees one sum per key.
    fn apply_finished_iterations(&mut self, now: Time, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        if cluster.config.consistency != Consistency::Sequential {
            return;
        }
        let workers = cluster.workers();
        let behind: Vec<Replicate<V>> = self
            .shards
            .values()
            .filter(|s| s.is_primary())
            .filter_map(|s| {
                let done_below = workers
                    .iter()
                    .map(|&w| self.finished_in(w, s.range))
                    .min()?;
                (s.applied_below < done_below).then(|| Replicate {
                    range: s.range,
                    seq: s.seq + 1,
                    span: 1,
                    update: ShardUpdate::ApplyBelow(done_below),
                    dedupe: Vec::new(),
                })
            })
            .collect();
        let any = !behind.is_empty();
        for entry in behind {
            self.commit(entry, out);
        }
        if any {
            self.arm_replication(now, out);
        }
    }

    /// The iterations `worker` finished on every key of `range`: acknowledged, or taken in
    /// at this epoch by the primaries of their keys (which this server is, where it asks).
    fn finished_in(&self, worker: NodeId, range: KeyRange) -> Iteration {
        let finished = self
            .progress
            .get(&worker)
            .and_then(|c| c.min_in(range))
            .unwrap_or(0);
        let taken = self
            .taken
            .get(&worker)
            .filter(|&&(epoch, _)| epoch == self.epoch())
            .map_or(0, |&(_, below)| below);
        finished.max(taken)
    }

    fn may_answer(&self, asking: NodeId, pull: &HeldPull) -> bool {
        let Some(cluster) = &self.cluster else {
            return false;
        };
        if mutated!(self, NoGating) {
            return true;
        }
        let Some(span) = pull.keys.span() else {
            return true;
        };
        let consistency = cluster.config.consistency;
        let required = consistency.required_below(pull.iteration);
        let workers_done = cluster
            .workers()
            .iter()
            .filter(|&&w| w == asking || !mutated!(self, OwnProgressOnly))
            .all(|&w| self.finished_in(w, span) >= required);
        let applied = || {
            self.shard_starts_in(span)
                .iter()
                .filter_map(|s| self.shards.get(s))
                .filter(|s| s.is_primary())
                .all(|s| s.applied_below >= required)
        };
        workers_done && (consistency != Consistency::Sequential || applied())
    }

    /// True when this server is the primary of every key of `keys`.
    fn serves(&self, keys: &KeySelection) -> bool {
        match keys {
            KeySelection::Keys(keys) => self.owns_all(keys.keys()),
            KeySelection::Ranges(ranges) => ranges.ranges().iter().all(|&r| self.owns_range(r)),
        }
    }

    fn on_pull(&mut self, from: NodeId, pull: Pull, out: &mut Effects<V>) {
        if !self.serves(&pull.keys) {
            self.redirect(from, pull.slice, out);
            return;
        }
        let held = HeldPull {
            iteration: pull.iteration,
            keys: pull.keys,
        };
        if self.may_answer(from, &held) {
            self.answer(from, pull.slice, &held, out);
        } else {
            self.held.insert((from, pull.slice), held);
        }
    }

    fn answer_held(&mut self, out: &mut Effects<V>) {
        let ready: Vec<(NodeId, SliceRef)> = self
            .held
            .iter()
            .filter(|((asking, _), h)| self.may_answer(*asking, h))
            .map(|(&k, _)| k)
            .collect();
        for key in ready {
            if let Some(h) = self.held.remove(&key) {
                self.answer(key.0, key.1, &h, out);
            }
        }
    }

    fn answer(&self, to: NodeId, slice: SliceRef, pull: &HeldPull, out: &mut Effects<V>) {
        let width = self.cfg.width;
        let mut resume = None;
        let kvs = match &pull.keys {
            KeySelection::Keys(list) => {
                let keys = list.keys().to_vec();
                let mut values = Vec::with_capacity(keys.len() * width);
                // Shard by shard, so that each store reads its keys in one ordered pass.
                let mut rest = list.keys();
                while let Some(&first) = rest.first() {
                    let shard = self.shard_of(first);
                    let n = shard.map_or(1, |s| rest.partition_point(|&k| s.range.contains(k)));
                    let n = n.max(1);
                    match shard {
                        Some(shard) => shard.store.values_of(&rest[..n], width, &mut values),
                        None => values.resize(values.len() + n * width, V::default()),
                    }
                    rest = &rest[n..];
                }
                KvPairs::from_validated(keys, values, width)
            }
            KeySelection::Ranges(ranges) => {
                // Beyond the rows one message may carry, remember only where to resume.
                let most = self.cfg.rows_per_reply::<V>();
                // Room for every row the reply can hold, reserved once: the rows asked for, at
                // most what one reply carries and what the shards hold.
                let asked = ranges
                    .ranges()
                    .iter()
                    .map(|r| r.len())
                    .fold(0, u64::saturating_add);
                let held: usize = self.shards.values().map(|s| s.store.len()).sum();
                let room = usize::try_from(asked).map_or(most, |n| n.min(most).min(held));
                let mut rows = PairsBuilder::with_capacity(width, room);
                'ranges: for &r in ranges.ranges() {
                    for start in self.shard_starts_in(r) {
                        let Some(shard) = self.shards.get(&start) else {
                            continue;
                        };
                        let Some(part) = shard.range.intersect(r) else {
                            continue;
                        };
                        shard
                            .store
                            .for_each_run_in(part, &mut |run_keys, run_values| {
                                if resume.is_some() {
                                    return;
                                }
                                let room = most - rows.len();
                                let take = run_keys.len().min(room);
                                rows.extend(&run_keys[..take], &run_values[..take * width]);
                                resume = run_keys.get(take).copied();
                            });
                        if resume.is_some() {
                            break 'ranges;
                        }
                    }
                }
                rows.finish()
            }
        };
        let body = Message::PullReply(PullReply {
            slice,
            complete_below: self.consistency().required_below(pull.iteration),
            kvs,
            resume,
        });
        self.send(to, body, out);
    }
}
