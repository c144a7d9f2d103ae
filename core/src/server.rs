//! The server: holds a share of the parameters, applies pushes through its update rule, and
//! answers pulls once the job's consistency model allows.

use std::collections::BTreeMap;

use crate::cluster::Cluster;
use crate::consistency::Consistency;
use crate::dedupe::DedupeWindow;
use crate::effects::{Effects, Event, Refusal, TimerId};
use crate::key::{Key, KeyRange};
use crate::kv::KvPairs;
use crate::message::{
    ClusterConfig, Envelope, KeySelection, Message, Pull, PullReply, Push, SliceRef,
};
use crate::node::{Epoch, Iteration, NodeId, Role, Time};
use crate::store::{OrderedStore, ParamStore};
use crate::timing::Timing;
use crate::updater::{UpdateRule, Updater};
use crate::value::Value;

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
    /// Largest answer, in bytes of keys and values, to a pull of key ranges; a larger answer is
    /// sent in parts (see [`PullReply::resume`]). Keep it below the codec's frame limit.
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
            max_reply_bytes: crate::worker::DEFAULT_MAX_SLICE_BYTES,
        }
    }

    /// Rows per answer to a range pull: as many as fit `max_reply_bytes`, at least one.
    fn rows_per_reply<V: Value>(&self) -> usize {
        let row = 10 + self.width.saturating_mul(V::SIZE);
        (self.max_reply_bytes.saturating_sub(128) / row.max(1)).max(1)
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
/// Invariants: a push slice `(worker, request, slice)` is applied at most once (a duplicate is
/// acknowledged again, never applied again); a pull from iteration `c` is answered only when
/// every live worker has finished every iteration below `c - tau` (and, in sequential mode, the
/// server has applied them).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Server<V: Value, U: UpdateRule<V> = Updater, S: ParamStore<V> = OrderedStore<V>> {
    cfg: ServerConfig,
    updater: U,
    cluster: Option<Cluster>,
    store: S,
    /// Sequential mode: pushes buffered per iteration until every live worker finished it.
    pending: BTreeMap<Iteration, Vec<KvPairs<V>>>,
    /// Sequential mode: every iteration below this is applied.
    applied_below: Iteration,
    /// Per worker: every iteration below this is finished.
    progress: BTreeMap<NodeId, Iteration>,
    dedupe: BTreeMap<NodeId, DedupeWindow>,
    held: BTreeMap<(NodeId, SliceRef), HeldPull>,
    /// Messages from senders with a newer configuration than ours, replayed once we have it.
    early: Vec<Envelope<V>>,
    #[cfg(feature = "mutations")]
    mutation: Option<crate::mutation::Mutation>,
}

impl<V: Value, U: UpdateRule<V>> Server<V, U, OrderedStore<V>> {
    /// A server with an ordered-map store.
    pub fn new(cfg: ServerConfig, updater: U) -> Self {
        let store = OrderedStore::new(cfg.width, updater.aux_width());
        Self::with_store(cfg, updater, store)
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// A server keeping its parameters in `store`.
    pub fn with_store(cfg: ServerConfig, updater: U, store: S) -> Self {
        Server {
            cfg,
            updater,
            cluster: None,
            store,
            pending: BTreeMap::new(),
            applied_below: 0,
            progress: BTreeMap::new(),
            dedupe: BTreeMap::new(),
            held: BTreeMap::new(),
            early: Vec::new(),
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }

    /// Runs a deliberately broken protocol (see [`crate::Mutation`]).
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

    /// The stored values of `key`, if it was ever written.
    pub fn value(&self, key: Key) -> Option<&[V]> {
        self.store.get(key)
    }

    /// Every value received for `key`: stored plus buffered for a later iteration. Pushes are
    /// counted here exactly once, which is what exactly-once checks compare (with [`Updater::Sum`]).
    pub fn received_total(&self, key: Key) -> Vec<V> {
        let mut total: Vec<V> = self
            .store
            .get(key)
            .map_or_else(|| vec![V::default(); self.cfg.width], <[V]>::to_vec);
        for kvs in self.pending.values().flatten() {
            if let Some(row) = kvs.get(key) {
                for (t, &d) in total.iter_mut().zip(row) {
                    *t = t.add(d);
                }
            }
        }
        total
    }

    /// Sequential mode: every iteration below this one has been applied.
    pub fn applied_below(&self) -> Iteration {
        self.applied_below
    }

    /// Pulls held back by the consistency model.
    pub fn held_pulls(&self) -> usize {
        self.held.len()
    }

    /// Push slices remembered for de-duplication, over all workers.
    pub fn dedupe_entries(&self) -> usize {
        self.dedupe.values().map(DedupeWindow::len).sum()
    }

    /// Registers with the coordinator and starts heartbeats. Call once, first.
    pub fn start(&mut self, now: Time, out: &mut Effects<V>) {
        self.register(now, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    /// Starts with `config` already in force (static membership, e.g. from
    /// [`crate::Coordinator::bootstrapped`]) instead of registering. Call once, first, instead
    /// of `start`.
    pub fn start_configured(&mut self, now: Time, config: ClusterConfig, out: &mut Effects<V>) {
        self.adopt(now, config.coordinator, config, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    fn register(&mut self, now: Time, out: &mut Effects<V>) {
        let body = Message::Register { role: Role::Server };
        out.send(Envelope::new(
            self.cfg.id,
            self.cfg.coordinator,
            self.epoch(),
            body,
        ));
        out.set_timer(TimerId::Register, now + self.cfg.timing.register_retry);
    }

    fn send(&self, to: NodeId, body: Message<V>, out: &mut Effects<V>) {
        out.send(Envelope::new(self.cfg.id, to, self.epoch(), body));
    }

    /// Call when a timer this server set fires.
    pub fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Effects<V>) {
        match timer {
            TimerId::Register if self.cluster.is_none() => self.register(now, out),
            TimerId::Heartbeat => {
                let body = Message::Heartbeat { sent_at: now };
                self.send(self.cfg.coordinator, body, out);
                out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
            }
            _ => {}
        }
    }

    /// Call for every message addressed to this server.
    pub fn on_message(&mut self, now: Time, env: Envelope<V>, out: &mut Effects<V>) {
        let from = env.from;
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
        if !cluster.is_worker(from) {
            out.refuse(from, Refusal::UnknownSender);
            return;
        }
        match env.body {
            Message::Push(push) => self.on_push(from, push, out),
            Message::Pull(pull) => self.on_pull(from, pull, out),
            Message::Progress { finished_below } => {
                let p = self.progress.entry(from).or_default();
                *p = (*p).max(finished_below);
                let body = Message::ProgressAck { finished_below: *p };
                self.send(from, body, out);
                self.apply_finished_iterations();
                self.answer_held(out);
            }
            _ => out.refuse(from, Refusal::Unexpected),
        }
    }

    fn adopt(&mut self, now: Time, from: NodeId, config: ClusterConfig, out: &mut Effects<V>) {
        let cluster = match Cluster::successor(self.cluster.as_ref(), config) {
            Ok(Some(cluster)) => cluster,
            Ok(None) => return,
            Err(reason) => return out.refuse(from, reason),
        };
        let first = self.cluster.is_none();
        // De-duplication windows are kept even for removed workers: forgetting one would let a
        // late duplicate be applied again if the worker ever came back.
        self.held.retain(|(w, _), _| cluster.is_worker(*w));
        self.cluster = Some(cluster);
        if first {
            out.cancel_timer(TimerId::Register);
            out.emit(Event::Ready {
                epoch: self.epoch(),
            });
        }
        self.apply_finished_iterations();
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

    fn consistency(&self) -> Consistency {
        self.cluster
            .as_ref()
            .map_or_else(Consistency::default, |c| c.config.consistency)
    }

    fn owns(&self, key: Key) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.primary(key) == self.cfg.id)
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

    fn on_push(&mut self, from: NodeId, push: Push<V>, out: &mut Effects<V>) {
        let window = self.dedupe.entry(from).or_default();
        window.settle(push.settled_below);
        if window.is_duplicate(push.slice) && !mutated!(self, NoDedupe) {
            self.send(from, Message::PushAck(push.slice), out);
            return;
        }
        if !push.kvs.keys().iter().all(|&k| self.owns(k)) {
            self.redirect(from, push.slice, out);
            return;
        }
        if push.kvs.width() != self.cfg.width {
            // A worker of another job; it will not be acknowledged.
            out.refuse(from, Refusal::ForeignJob);
            return;
        }
        if self.consistency() == Consistency::Sequential && push.iteration >= self.applied_below {
            self.pending
                .entry(push.iteration)
                .or_default()
                .push(push.kvs);
        } else {
            self.apply(&push.kvs);
        }
        if let Some(window) = self.dedupe.get_mut(&from) {
            window.record(push.slice);
        }
        self.send(from, Message::PushAck(push.slice), out);
    }

    fn apply(&mut self, kvs: &KvPairs<V>) {
        let aux_width = self.updater.aux_width();
        for (key, deltas) in kvs.iter() {
            let (row, aux) = self.store.row_mut(key);
            for (j, (w, &d)) in row.iter_mut().zip(deltas).enumerate() {
                let d = if mutated!(self, WrongSign) {
                    V::default().sub(d)
                } else {
                    d
                };
                self.updater
                    .apply(w, &mut aux[j * aux_width..(j + 1) * aux_width], d);
            }
        }
    }

    /// Sequential mode: applies, in order, each buffered iteration that every live worker has
    /// finished, aggregated over workers so that the update rule sees one sum per key.
    fn apply_finished_iterations(&mut self) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        if cluster.config.consistency != Consistency::Sequential {
            return;
        }
        let Some(done_below) = cluster
            .workers()
            .iter()
            .map(|w| self.progress.get(w).copied().unwrap_or(0))
            .min()
        else {
            return;
        };
        while self.applied_below < done_below {
            if let Some(batch) = self.pending.remove(&self.applied_below) {
                let summed = sum_by_key(&batch, self.cfg.width);
                self.apply(&summed);
            }
            self.applied_below += 1;
        }
    }

    fn may_answer(&self, asking: NodeId, iteration: Iteration) -> bool {
        let Some(cluster) = &self.cluster else {
            return false;
        };
        if mutated!(self, NoGating) {
            return true;
        }
        let consistency = cluster.config.consistency;
        let required = consistency.required_below(iteration);
        let workers_done = cluster
            .workers()
            .iter()
            .filter(|&&w| w == asking || !mutated!(self, OwnProgressOnly))
            .all(|w| self.progress.get(w).copied().unwrap_or(0) >= required);
        workers_done && (consistency != Consistency::Sequential || self.applied_below >= required)
    }

    fn on_pull(&mut self, from: NodeId, pull: Pull, out: &mut Effects<V>) {
        let owned = match &pull.keys {
            KeySelection::Keys(keys) => keys.keys().iter().all(|&k| self.owns(k)),
            KeySelection::Ranges(ranges) => ranges.ranges().iter().all(|&r| self.owns_range(r)),
        };
        if !owned {
            self.redirect(from, pull.slice, out);
            return;
        }
        let held = HeldPull {
            iteration: pull.iteration,
            keys: pull.keys,
        };
        if self.may_answer(from, held.iteration) {
            self.answer(from, pull.slice, &held, out);
        } else {
            self.held.insert((from, pull.slice), held);
        }
    }

    fn answer_held(&mut self, out: &mut Effects<V>) {
        let ready: Vec<(NodeId, SliceRef)> = self
            .held
            .iter()
            .filter(|((asking, _), h)| self.may_answer(*asking, h.iteration))
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
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut resume = None;
        match &pull.keys {
            KeySelection::Keys(list) => {
                keys.extend_from_slice(list.keys());
                values.reserve(keys.len() * width);
                for &k in list.keys() {
                    match self.store.get(k) {
                        Some(row) => values.extend_from_slice(row),
                        None => values.resize(values.len() + width, V::default()),
                    }
                }
            }
            KeySelection::Ranges(ranges) => {
                // Beyond the rows one message may carry, remember only where to resume.
                let most = self.cfg.rows_per_reply::<V>();
                for &r in ranges.ranges() {
                    self.store.for_each_in(r, &mut |k, row| {
                        if keys.len() < most {
                            keys.push(k);
                            values.extend_from_slice(row);
                        } else if resume.is_none() {
                            resume = Some(k);
                        }
                    });
                    if resume.is_some() {
                        break;
                    }
                }
            }
        }
        let kvs = KvPairs::from_validated(keys, values, width);
        let body = Message::PullReply(PullReply {
            slice,
            complete_below: self.consistency().required_below(pull.iteration),
            kvs,
            resume,
        });
        self.send(to, body, out);
    }
}

/// Sums several sparse vectors key-wise into one, in key order.
fn sum_by_key<V: Value>(batch: &[KvPairs<V>], width: usize) -> KvPairs<V> {
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
