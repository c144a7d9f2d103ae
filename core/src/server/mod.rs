//! The server: holds shards of the parameters, applies pushes through its update rule,
//! replicates them, and answers pulls once the job's consistency model allows.

mod batches;
mod cached;
mod checkpoint;
mod membership;
mod progress;
mod pull;
mod push;
mod read;
mod replication;
mod shard;
mod slots;

use core::hash::{Hash, Hasher};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::clock::RangeClock;
use crate::cluster::Cluster;
use crate::consistency::Consistency;
use crate::effects::{Effects, Refusal, TimerId};
use crate::filter::KeyCaching;
use crate::filter::keycache::HeldLists;
use crate::ids::{Epoch, NodeId, Role, Standbys, Time};
use crate::key::{Key, KeyRange};
use crate::selection::KeySelection;
use crate::slots::{PushSlots, SlotQueue};
use crate::store::{ParamStore, Store, StoreLayout};
use crate::timing::Timing;
use crate::updater::{UpdateRule, Updater};
use crate::value::Value;
use crate::watch::CoordinatorWatch;
use crate::wire::{ClusterConfig, Envelope, Message, SliceRef};

use batches::Batches;
pub use checkpoint::CheckpointError;
use checkpoint::Checkpointing;
use progress::Taken;
use pull::HeldPull;
pub use read::RangeRead;
use replication::Resend;
use shard::Shard;

/// What a server is told at start. Build it with [`ServerConfig::new`] and change the fields
/// that differ from the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ServerConfig {
    /// This server.
    pub id: NodeId,
    /// The coordinator to register with.
    pub coordinator: NodeId,
    /// Standby coordinators, registered with too until a configuration names the active one
    /// (ARCHITECTURE.md §11). Default: none.
    pub standbys: Standbys,
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
    /// sent in parts (see [`PullReply::resume`](crate::wire::PullReply::resume)). Copies of
    /// shards for new replicas are cut to the same size. A [`Driver`](crate::Driver) lowers it
    /// to its codec's frame limit.
    pub max_reply_bytes: usize,
    /// The largest frame this server's messages may take: its replication batches are cut to
    /// fit it. A [`Driver`](crate::Driver) lowers it to its codec's limit. Default:
    /// [`DEFAULT_MAX_FRAME`](crate::wire::DEFAULT_MAX_FRAME).
    pub max_frame: usize,
    /// Replication batches a primary keeps unacknowledged per replica server; the steps made
    /// meanwhile wait, and go out together at the next acknowledgement. Default 8.
    pub replication_in_flight: u32,
    /// Keys the update rule applies without its regularizer ([`UpdateRule::unregularized`]).
    pub unregularized: Option<KeyRange>,
    /// How the rows are laid out ([`StoreLayout`]). Default: in key order.
    pub store: StoreLayout,
    /// Let large push slices in a few at a time, the workers taking turns
    /// ([`crate::slots::PushSlots`]). Default: none, every slice is let in as it comes.
    pub push_slots: Option<PushSlots>,
    /// Keep the key lists workers send, so that they may name them the next time, and answer
    /// key-list pulls without the keys ([`crate::filter::Filters::key_caching`]). Default: none.
    pub key_caching: Option<KeyCaching>,
    /// Pack the values of answers sent without keys ([`crate::filter::Filters::compression`]).
    pub compression: bool,
}

impl ServerConfig {
    /// A server of width 1 with default timing and reply size.
    pub fn new(id: NodeId, coordinator: NodeId) -> Self {
        ServerConfig {
            id,
            coordinator,
            standbys: Standbys::default(),
            width: 1,
            timing: Timing::default(),
            incarnation: 0,
            max_reply_bytes: crate::worker::DEFAULT_MAX_SLICE_BYTES,
            max_frame: crate::wire::DEFAULT_MAX_FRAME,
            replication_in_flight: 8,
            unregularized: None,
            store: StoreLayout::Ordered,
            push_slots: None,
            key_caching: None,
            compression: false,
        }
    }

    /// Rows per answer to a range pull (and per copy of a shard): as many as fit
    /// `max_reply_bytes`, at least one.
    fn rows_per_reply<V: Value>(&self) -> usize {
        crate::sizes::rows_within::<V>(self.max_reply_bytes, self.width)
    }
}

/// Why [`Server::start_from`] refused its rows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartFromError {
    /// The node is not a server ([`crate::driver::ServerCalls::start_from`]).
    #[error("only a server starts from rows")]
    NotAServer,
    /// The server holds a configuration already: its shards are made.
    #[error("the server is configured already: rows to start from are taken only before")]
    Configured,
    /// A row of another width than the job's.
    #[error("key {key} has {got} values, but the job's rows have {width}")]
    Width {
        /// The row's key.
        key: Key,
        /// Its values.
        got: usize,
        /// The job's width.
        width: usize,
    },
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
pub struct Server<V: Value, U: UpdateRule<V> = Updater, S: ParamStore<V> = Store<V>> {
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
    /// Replication steps on their way to each replica server (`batches`).
    batches: Batches<V>,
    /// Whether the replication timer is set.
    replication_timer: bool,
    /// Replication timer firings in a row that found a replica behind.
    replication_attempts: u8,
    /// Started with a configuration in force: the job is starting, every shard is empty.
    started_configured: bool,
    /// [`Server::leave`] was called.
    leave_requested: bool,
    /// How long the coordinator has left heartbeats unanswered.
    coordinator: CoordinatorWatch,
    /// Ranges this server lost with their holders ([`crate::Event::RangeLost`]) that no adopted
    /// configuration lists yet: reported to the coordinator with every heartbeat until one
    /// does ([`ClusterConfig::lost`]).
    lost_unlisted: Vec<KeyRange>,
    /// Per worker, the epoch it last reported taken progress at and that progress
    /// ([`Message::Progress`]); counted only while that epoch is in force.
    taken: BTreeMap<NodeId, Taken>,
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
    /// Its first configuration was not the job's first: it created no replica shards while
    /// its primaries may count it in step, so it asks them for what it lacks on every
    /// heartbeat, not only while the ring changes.
    late_start: bool,
    /// Push slots granted and asked for ([`ServerConfig::push_slots`]); empty without.
    slots: SlotQueue,
    /// Key caching: the lists each worker sent whole ([`ServerConfig::key_caching`]).
    held_lists: Option<HeldLists>,
    /// Whole-job checkpoints: offered, restoring, written (ARCHITECTURE.md §11).
    checkpointing: Checkpointing,
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
            && self.batches == other.batches
            && self.replication_timer == other.replication_timer
            && self.replication_attempts == other.replication_attempts
            && self.started_configured == other.started_configured
            && self.leave_requested == other.leave_requested
            && self.taken == other.taken
            && self.queue_seen == other.queue_seen
            && self.listed == other.listed
            && self.early == other.early
            && self.progress_unheard == other.progress_unheard
            && self.lost_unlisted == other.lost_unlisted
            && self.coordinator == other.coordinator
            && self.late_start == other.late_start
            && self.slots == other.slots
            && self.held_lists == other.held_lists
            && self.checkpointing == other.checkpointing
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
        self.batches.hash(state);
        self.replication_timer.hash(state);
        self.replication_attempts.hash(state);
        self.started_configured.hash(state);
        self.leave_requested.hash(state);
        self.taken.hash(state);
        self.queue_seen.hash(state);
        self.listed.hash(state);
        self.early.hash(state);
        self.progress_unheard.hash(state);
        self.lost_unlisted.hash(state);
        self.coordinator.hash(state);
        self.late_start.hash(state);
        self.slots.hash(state);
        self.held_lists.hash(state);
        self.checkpointing.hash(state);
        #[cfg(feature = "mutations")]
        self.mutation.hash(state);
    }
}

impl<V: Value, U: UpdateRule<V>> Server<V, U, Store<V>> {
    /// A server keeping its rows in the layout `cfg.store` names.
    pub fn new(cfg: ServerConfig, updater: U) -> Self {
        let store = Store::new(cfg.store, cfg.width, updater.aux_width());
        Self::with_store(cfg, updater, store)
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// A server keeping its parameters in stores shaped like `store`; rows already in `store`
    /// are the starting values of the keys this server holds in the job's first configuration.
    pub fn with_store(cfg: ServerConfig, updater: U, store: S) -> Self {
        Server {
            updater,
            cluster: None,
            template: store,
            shards: BTreeMap::new(),
            progress: BTreeMap::new(),
            held: BTreeMap::new(),
            unreplicated: BTreeMap::new(),
            batches: Batches::default(),
            replication_timer: false,
            replication_attempts: 0,
            started_configured: false,
            leave_requested: false,
            coordinator: CoordinatorWatch::default(),
            lost_unlisted: Vec::new(),
            taken: BTreeMap::new(),
            queue_seen: BTreeMap::new(),
            listed: false,
            early: Vec::new(),
            progress_unheard: BTreeSet::new(),
            late_start: false,
            slots: SlotQueue::default(),
            held_lists: cfg.key_caching.map(HeldLists::new),
            checkpointing: Checkpointing::default(),
            cfg,
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }

    /// Starts the job from `rows` (a saved model: a warm start): each becomes the value of its
    /// key in the shard of the first configuration that holds it, with the update rule's state
    /// set to go on from there ([`UpdateRule::warm`]). Rows of the keys this server will not
    /// hold are dropped then. Call before the first configuration; a server that restarts
    /// while a job runs takes its rows from their replicas instead.
    pub fn start_from<'a>(
        &mut self,
        rows: impl IntoIterator<Item = (Key, &'a [V])>,
    ) -> Result<(), StartFromError> {
        if self.cluster.is_some() {
            return Err(StartFromError::Configured);
        }
        let free = self.updater.unregularized();
        for (key, values) in rows {
            if values.len() != self.cfg.width {
                return Err(StartFromError::Width {
                    key,
                    got: values.len(),
                    width: self.cfg.width,
                });
            }
            let in_free = self.cfg.unregularized.is_some_and(|r| r.contains(key));
            let rule = if in_free { &free } else { &self.updater };
            let (row, aux) = self.template.row_mut(key);
            row.copy_from_slice(values);
            aux.fill(V::default());
            let per = aux.len() / values.len().max(1);
            for (j, &v) in values.iter().enumerate() {
                rule.warm(v, &mut aux[j * per..(j + 1) * per]);
            }
        }
        Ok(())
    }

    /// Runs a deliberately broken protocol (see [`crate::mutation::Mutation`]).
    #[cfg(feature = "mutations")]
    pub fn set_mutation(&mut self, mutation: Option<crate::mutation::Mutation>) {
        self.mutation = mutation;
    }

    /// The empty store new shards are made from: its layout is every shard's.
    #[cfg(test)]
    pub(crate) fn template(&self) -> &S {
        &self.template
    }

    /// Every shard's store.
    #[cfg(test)]
    pub(crate) fn shard_stores(&self) -> impl Iterator<Item = &S> + '_ {
        self.shards.values().map(|s| &s.store)
    }

    /// This server's id.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// Pulls held until the consistency model lets them be answered: how far the workers
    /// are waiting on each other here.
    pub fn held_pulls(&self) -> usize {
        self.held.len()
    }

    /// The configuration in force, once the first arrived.
    pub fn config(&self) -> Option<&ClusterConfig> {
        self.cluster.as_ref().map(|c| &c.config)
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
    pub fn applied_below(&self) -> crate::ids::Iteration {
        self.shards
            .values()
            .filter(|s| s.is_primary())
            .map(|s| s.applied_below)
            .min()
            .unwrap_or(0)
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

    /// Calls `f` on every row of the ranges this server is the primary of, in key order: what
    /// it holds for the job, without the copies it keeps as a replica.
    pub fn for_each_primary_row(&self, f: &mut dyn FnMut(Key, &[V])) {
        for shard in self.shards.values().filter(|s| s.is_primary()) {
            shard.store.for_each_in(shard.range, f);
        }
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

    /// Push slots granted whose slice has not arrived, and asks waiting for one
    /// ([`ServerConfig::push_slots`]; feature `testing`).
    #[cfg(feature = "testing")]
    pub fn push_slots(&self) -> (usize, usize) {
        (self.slots.granted(), self.slots.waiting())
    }

    /// Cuts this server's messages to frames of at most `max_frame` bytes, where its
    /// configuration allowed larger ones: replication batches, answers to range pulls and
    /// copies of shards.
    pub(crate) fn fit_frames(&mut self, max_frame: usize) {
        self.cfg.max_frame = self.cfg.max_frame.min(max_frame);
        self.cfg.max_reply_bytes = self.cfg.max_reply_bytes.min(max_frame);
    }

    /// Registers with the coordinator and starts heartbeats. Call once, first.
    pub fn start(&mut self, now: Time, out: &mut Effects<V>) {
        self.register(now, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    /// Starts with `config` already in force (static membership, e.g. from
    /// [`crate::node::Coordinator::bootstrapped`]) instead of registering. Call once, first,
    /// instead of `start`.
    ///
    /// Only for a job that is starting: the server takes every shard of `config` to be empty
    /// and its replicas in step. A server restarted while a job runs must register instead
    /// (it then joins as a new member).
    pub fn start_configured(&mut self, now: Time, config: ClusterConfig, out: &mut Effects<V>) {
        self.started_configured = true;
        self.adopt(now, config.coordinator, config, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
        self.send_batches(false, out);
    }

    /// Asks the coordinator to take this server out of the job. Its ranges are copied to the
    /// servers that take them over while it keeps serving; once they caught up, a configuration
    /// without it arrives, it drops its shards and emits
    /// [`Event::Fenced`](crate::Event::Fenced): it may stop. The request is repeated with every
    /// heartbeat until then.
    pub fn leave(&mut self, out: &mut Effects<V>) {
        self.leave_requested = true;
        if self.is_member() {
            self.send(self.coordinator_id(), Message::Leave, out);
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
            keys_below: None,
            checkpoints: self.checkpointing.offered.clone(),
        };
        for to in crate::watch::register_with(
            self.cluster.as_ref(),
            self.cfg.coordinator,
            self.cfg.standbys,
        ) {
            out.send(Envelope::new(self.cfg.id, to, self.epoch(), body.clone()));
        }
        out.set_timer(TimerId::Register, now + self.cfg.timing.register_retry);
    }

    /// The highest coordinator term this server holds or granted.
    fn term_held(&self) -> u64 {
        let held = self.cluster.as_ref().map_or(0, |c| c.config.term);
        held.max(self.coordinator.granted())
    }

    /// The coordinator this server follows: the active one of the configuration in force, or
    /// the one it was told to register with.
    fn coordinator_id(&self) -> NodeId {
        self.cluster
            .as_ref()
            .map_or(self.cfg.coordinator, |c| c.config.coordinator)
    }

    fn send(&self, to: NodeId, body: Message<V>, out: &mut Effects<V>) {
        out.send(Envelope::new(self.cfg.id, to, self.epoch(), body));
    }

    /// Call when a timer this server set fires.
    pub fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Effects<V>) {
        self.timer_fired(now, timer, out);
        self.send_batches(false, out);
    }

    fn timer_fired(&mut self, now: Time, timer: TimerId, out: &mut Effects<V>) {
        match timer {
            TimerId::Register if !self.listed => self.register(now, out),
            TimerId::Replicate => {
                self.replication_timer = false;
                // Batches or their acknowledgements went missing: what each replica lacks
                // goes again from the log.
                self.batches.forget();
                self.resend_replication(Resend::Lost, out);
                self.arm_replication(now, out);
            }
            TimerId::SlotLease => self.expire_slots(now, out),
            TimerId::Heartbeat => {
                let body = Message::Heartbeat {
                    sent_at: now,
                    at: None,
                    term: self.term_held(),
                };
                self.send(self.coordinator_id(), body, out);
                let standbys = self
                    .cluster
                    .as_ref()
                    .is_some_and(|c| !c.config.standbys.is_empty());
                self.coordinator
                    .heartbeat_sent(&self.cfg.timing, standbys, out);
                self.ship_idle_queues();
                self.arm_replication(now, out);
                // Either may have been lost; the coordinator waits for both.
                self.report_caught_up(out);
                self.ask_for_progress(out);
                self.ask_for_copies(out);
                if self.leave_requested && self.is_member() {
                    self.send(self.coordinator_id(), Message::Leave, out);
                }
                self.report_lost(out);
                self.report_checkpoint(out);
                out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
            }
            _ => {}
        }
    }

    /// Call for every message addressed to this server.
    pub fn on_message(&mut self, now: Time, env: Envelope<V>, out: &mut Effects<V>) {
        self.take_message(now, env, out);
        self.send_batches(false, out);
    }

    fn take_message(&mut self, now: Time, env: Envelope<V>, out: &mut Effects<V>) {
        let from = env.from;
        if env.to != self.cfg.id {
            return out.refuse(from, Refusal::Misaddressed { to: env.to });
        }
        if from == self.coordinator_id() {
            self.coordinator.heard(&self.cfg.timing, out);
            // An answer to a heartbeat says only that the coordinator is alive; at a newer
            // epoch than ours it is not kept for later like other early messages.
            if let Message::HeartbeatAck { sent_at, degraded } = &env.body {
                return self.coordinator.heard_degraded(*sent_at, degraded, out);
            }
        }
        match env.body {
            // A ring change while the shards are read would cut or ship shards still empty:
            // adopted once they are loaded (ARCHITECTURE.md §11).
            Message::Config(_) if self.checkpointing.restoring.is_some() => {
                return self.hold_while_restoring(env, out);
            }
            Message::Config(config) => return self.adopt(now, from, config, out),
            Message::TermAsk { term } => {
                let config = self.cluster.as_ref().map(|c| &c.config);
                let answer = self.coordinator.on_term_ask(
                    &self.cfg.timing,
                    config,
                    from,
                    crate::watch::Ask {
                        term,
                        epoch: env.epoch,
                    },
                );
                return crate::watch::answer_term_ask(
                    self.cfg.id,
                    self.epoch(),
                    from,
                    term,
                    answer,
                    out,
                );
            }
            _ => {}
        }
        if self.checkpointing.restoring.is_some() {
            return self.hold_while_restoring(env, out);
        }
        let Some(cluster) = self.cluster.as_ref().filter(|c| env.epoch <= c.epoch()) else {
            return self.keep_early(env, out);
        };
        match env.body {
            Message::Push(_)
            | Message::Pull(_)
            | Message::PushCached(_)
            | Message::PullCached(_)
            | Message::Progress { .. }
            | Message::SlotAsk { .. }
                if !cluster.is_worker(from) =>
            {
                out.refuse(from, Refusal::UnknownSender);
            }
            Message::Push(push) => {
                // Any push of the slice frees its slot, even one this server redirects: its
                // bytes are in.
                self.slot_arrived(now, from, push.slice, push.settled_below, out);
                self.keep_list(from, || push.kvs.keys().to_vec().into());
                self.on_push(now, from, push, out)
            }
            Message::PushCached(push) => {
                self.slot_arrived(now, from, push.slice, push.settled_below, out);
                self.on_push_cached(now, from, push, out)
            }
            Message::PullCached(pull) => self.on_pull_cached(from, pull, out),
            Message::SlotAsk { slice, bytes } => self.on_slot_ask(now, from, slice, bytes, out),
            Message::Pull(pull) => {
                if let KeySelection::Keys(list) = &pull.keys {
                    self.keep_list(from, || Arc::clone(list.shared()));
                }
                self.on_pull(from, pull, out)
            }
            Message::Progress {
                finished_below,
                taken_below,
            } => {
                self.on_progress(now, from, env.epoch, finished_below, taken_below, out);
                self.checkpoint_when_due(now, out);
            }
            Message::Replicate { .. }
            | Message::ReplicateAck { .. }
            | Message::Transfer(_)
            | Message::TransferAck { .. } => {
                self.on_replication(now, env, out);
                // A replica that applied the iterations below a cut may complete it.
                self.checkpoint_when_due(now, out);
            }
            _ => out.refuse(from, Refusal::Unexpected),
        }
    }
    fn consistency(&self) -> Consistency {
        self.cluster
            .as_ref()
            .map_or_else(Consistency::default, |c| c.config.consistency)
    }

    fn redirect(&self, to: NodeId, slice: SliceRef, out: &mut Effects<V>) {
        let body = Message::Redirect {
            slice,
            epoch: self.epoch(),
        };
        self.send(to, body, out);
    }

    /// Starts of the shards overlapping `range`, in key order: for callers that change the
    /// shards as they go.
    fn shard_starts_in(&self, range: KeyRange) -> Vec<Key> {
        self.shards_in(range).map(|(k, _)| k).collect()
    }

    /// The shards overlapping `range`, with their starts, in key order. Looked up per step
    /// and per acknowledgement, so it walks the map rather than collecting.
    fn shards_in(&self, range: KeyRange) -> impl Iterator<Item = (Key, &Shard<V, S>)> {
        reaching_into(&self.shards, range)
            .into_iter()
            .chain(self.shards.range(range.start()..range.end()))
            .map(|(&k, s)| (k, s))
    }
}

/// The shard that starts before `range` and holds its first key, if one does. The shards
/// overlapping `range` are it and those starting inside `range`: two walks of the map, which
/// a primary makes for every step a replica acknowledges.
fn reaching_into<V: Value, S>(
    shards: &BTreeMap<Key, Shard<V, S>>,
    range: KeyRange,
) -> Option<(&Key, &Shard<V, S>)> {
    shards
        .range(..range.start())
        .next_back()
        .filter(|(_, s)| s.range.end() > range.start())
}
