//! The worker: slices the application's pushes and pulls by the ring, retransmits until every
//! slice is answered, reports its progress, and enters new iterations only as far ahead as the
//! consistency model allows.

mod answer;
mod config;
mod progress;
mod request;
mod stall;
mod window;

use std::collections::BTreeMap;

use crate::cluster::Cluster;
use crate::consistency::Consistency;
use crate::effects::{Effects, Event, Refusal, TimerId, WorkerEvent};
use crate::events::Wait;
use crate::filter::keycache::SentLists;
use crate::filter::{FilterChain, FilterSaving, Tally};
use crate::ids::{Epoch, Iteration, NodeId, Role, Time};
use crate::key::KeyRange;
use crate::kv::KvPairs;
use crate::pace::{Coverage, Position};
use crate::selection::KeySelection;
use crate::slicing::Part;
use crate::value::Value;
use crate::watch::CoordinatorWatch;
use crate::wire::{
    ClusterConfig, Envelope, Message, PullReply, PullRows, PullValues, RequestId, RowValues,
};

pub use config::{DEFAULT_MAX_SLICE_BYTES, WorkerConfig, WorkerError};
use progress::Reached;
use request::Request;
use stall::{StallWatch, Waiting};
use window::{PerKind, Window};

/// A worker node (sans-IO).
///
/// Call [`Worker::start`] once; then [`Worker::on_message`] for every frame addressed to it,
/// [`Worker::on_timer`] when a timer it set fires, and the application calls [`Worker::push`],
/// [`Worker::pull`] and [`Worker::advance`]. Completions come back as [`Event`]s.
///
/// Invariant: at most `tau + 1` iterations are in flight — the worker enters iteration `c` only
/// once every iteration below `c - tau` is finished (its pushes acknowledged).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Worker<V: Value> {
    cfg: WorkerConfig,
    cluster: Option<Cluster>,
    fenced: bool,
    next_request: RequestId,
    iteration: Iteration,
    advances_waiting: u32,
    requests: BTreeMap<RequestId, Request<V>>,
    /// Unfinished push requests per iteration.
    unfinished: BTreeMap<Iteration, u32>,
    /// Per server: the progress it acknowledged, finished and taken (the latter at the
    /// current epoch only).
    progress_acked: BTreeMap<NodeId, Reached>,
    progress_due: Time,
    progress_attempts: u8,
    retransmit_at: Option<Time>,
    /// Slices on the network, and their bytes, per kind.
    windows: PerKind<Window>,
    /// Started with a configuration in force.
    started_configured: bool,
    /// Joined a running job and is asking the servers which iteration to start in; the
    /// application hears [`Event::Ready`] once they all answered.
    learning_start: bool,
    /// [`Worker::leave`] was called.
    leave_requested: bool,
    /// How long the coordinator has left heartbeats unanswered.
    coordinator: CoordinatorWatch,
    /// How long nothing it was asked for has completed.
    stall: StallWatch,
    /// How much of the current iteration its pushes covered so far.
    covered: Coverage,
    /// The speed the application last said it works at ([`Worker::report_speed`]).
    speed: u32,
    /// The checkpoint the job resumed from, when its first configuration said so.
    resumed_from: Option<Iteration>,
    /// The job's filters, which every push goes through ([`WorkerConfig::filters`]).
    filters: FilterChain<V>,
    /// Key caching: the lists each server was sent ([`crate::filter::Filters::key_caching`]).
    sent_lists: Option<SentLists>,
    /// Value compression: what it saved, on the values this worker sent and was answered
    /// ([`crate::filter::Filters::compression`]).
    compressed: Option<Tally>,
    #[cfg(feature = "mutations")]
    mutation: Option<crate::mutation::Mutation>,
}

impl<V: Value> Worker<V> {
    /// The worker, running its pushes through `filter` too, after the job's filters
    /// ([`crate::filter::Filter`]): an embedder's own filter. Its saving is reported under its
    /// name with the others ([`Worker::filter_savings`]), and what it holds goes at
    /// [`Worker::flush`] and keeps the worker from leaving until then, as the built-in
    /// filters' does.
    #[must_use]
    pub fn with_filter<F: crate::filter::Filter<V> + Send + Sync + 'static>(
        mut self,
        filter: F,
    ) -> Self {
        self.filters.add(filter);
        self
    }

    /// Cuts this worker's slices to frames of at most `max_frame` bytes, where its
    /// configuration allowed larger ones.
    pub(crate) fn fit_frames(&mut self, max_frame: usize) {
        self.cfg.max_slice_bytes = self.cfg.max_slice_bytes.min(max_frame);
    }

    /// A worker that has not yet registered.
    pub fn new(cfg: WorkerConfig) -> Self {
        Worker {
            filters: FilterChain::new(&cfg.filters, cfg.width),
            sent_lists: cfg.filters.key_caching.map(SentLists::new),
            compressed: cfg.filters.compression.then(Tally::default),
            cfg,
            cluster: None,
            fenced: false,
            next_request: 1,
            iteration: 0,
            advances_waiting: 0,
            requests: BTreeMap::new(),
            unfinished: BTreeMap::new(),
            progress_acked: BTreeMap::new(),
            progress_due: 0,
            progress_attempts: 0,
            retransmit_at: None,
            windows: PerKind::default(),
            started_configured: false,
            learning_start: false,
            leave_requested: false,
            coordinator: CoordinatorWatch::default(),
            stall: StallWatch::default(),
            covered: Coverage(0),
            speed: 0,
            resumed_from: None,
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }

    /// Runs a deliberately broken protocol (see [`crate::mutation::Mutation`]).
    #[cfg(feature = "mutations")]
    pub fn set_mutation(&mut self, mutation: Option<crate::mutation::Mutation>) {
        self.mutation = mutation;
    }

    /// This worker's id.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// The configuration in force, once the first arrived.
    pub fn config(&self) -> Option<&ClusterConfig> {
        self.cluster.as_ref().map(|c| &c.config)
    }

    /// The epoch of the configuration in force, 0 before the first.
    pub fn epoch(&self) -> Epoch {
        self.cluster.as_ref().map_or(0, Cluster::epoch)
    }

    /// The job's consistency model, once the first configuration has arrived.
    pub fn consistency(&self) -> Option<Consistency> {
        self.cluster.as_ref().map(|c| c.config.consistency)
    }

    /// The consistency model in force: the job's, with the staleness bound adaptive tau set
    /// ([`crate::pace::Pace::tau`]).
    pub fn consistency_in_force(&self) -> Option<Consistency> {
        self.cluster.as_ref().map(Cluster::consistency)
    }

    /// Every iteration of this worker below this one counts as finished whatever it pushed:
    /// the coordinator told it to skip them ([`crate::pace::Pace::skipped_below`]).
    pub fn skipped_below(&self) -> Iteration {
        self.cluster
            .as_ref()
            .map_or(0, |c| c.config.pace.skipped_below(self.cfg.id))
    }

    /// The shares of the job's work this worker does under the configuration in force
    /// ([`ClusterConfig::shares`]): its own, and those of workers that died or left and were
    /// handed to it. Empty before the first configuration, and for a worker that joined a
    /// running job while every share had a live worker.
    pub fn shares(&self) -> Vec<usize> {
        self.cluster
            .as_ref()
            .map_or_else(Vec::new, |c| c.config.shares_of(self.cfg.id))
    }

    /// The shares the worker works on in round `round` of an application that works in rounds
    /// of `length` iterations from iteration `first`
    /// ([`ClusterConfig::shares_in_round`]): a share moved to or from it by speed changes
    /// hands where rounds meet.
    pub fn shares_in_round(
        &self,
        first: Iteration,
        length: Iteration,
        round: u64,
    ) -> Vec<crate::pace::RoundShare> {
        let Some(c) = &self.cluster else {
            return Vec::new();
        };
        c.config
            .shares_in_round(self.cfg.id, first, length, round)
            .into_iter()
            .map(|share| crate::pace::RoundShare {
                share,
                from_start: c.config.handed_over_in(share, first, length) == Some(round),
                moved: c.config.pace.moved(share).is_some(),
            })
            .collect()
    }

    /// What the worker waits for: every unanswered slice of its open requests, in request
    /// order (the oldest first), with the server it is addressed to and the keys it covers.
    /// A driver that sees requests stay open logs these, so that a stall says where it is.
    pub fn waits(&self) -> Vec<Wait> {
        self.requests
            .iter()
            .flat_map(|(&request, r)| {
                r.open.values().map(move |slice| Wait {
                    request,
                    push: r.is_push(),
                    iteration: r.iteration,
                    server: slice.server,
                    keys: match &slice.part {
                        Part::Push(kvs) => kvs.span(),
                        Part::Pull(keys) => keys.span(),
                    },
                    attempts: slice.attempts,
                })
            })
            .collect()
    }

    /// Whether this worker leads: it holds the lowest-numbered share a live worker holds
    /// ([`ClusterConfig::lead_worker`]).
    pub fn leads(&self) -> bool {
        self.cluster.as_ref().and_then(|c| c.config.lead_worker()) == Some(self.cfg.id)
    }

    /// The iteration the worker is in.
    pub fn iteration(&self) -> Iteration {
        self.iteration
    }

    /// The checkpoint the job resumed from ([`crate::wire::Checkpoints`]): the worker started
    /// in its iteration, every one before it trained by the run that wrote it. `None` for a
    /// job that started from the beginning, or a worker that joined a running one.
    pub fn resumed_from(&self) -> Option<Iteration> {
        self.resumed_from
    }

    /// The cut the worker waits before: the application asked to advance into an iteration
    /// whose checkpoint is not complete yet ([`crate::wire::Checkpoints`]).
    pub fn waits_at_checkpoint(&self) -> Option<Iteration> {
        let next = self.iteration + 1;
        let plan = self.cluster.as_ref()?.config.checkpoints;
        (self.advances_waiting > 0 && plan.waits_before(next)).then_some(next)
    }

    /// The iteration the worker has left everything below: the one it is in, or the cut it
    /// waits before, the iteration it asked to leave being over.
    fn left_below(&self) -> Iteration {
        self.waits_at_checkpoint().unwrap_or(self.iteration)
    }

    /// Every iteration below this one is finished: advanced past, all its pushes acknowledged
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn finished_below(&self) -> Iteration {
        self.finished_below_at(self.iteration)
    }

    /// Every iteration below the result is finished: pushed and acknowledged, or skipped.
    fn finished_below_at(&self, iteration: Iteration) -> Iteration {
        let pushed = self
            .unfinished
            .keys()
            .next()
            .map_or(iteration, |&i| i.min(iteration));
        pushed.max(self.skipped_below().min(iteration))
    }

    /// Iterations started and not yet finished (the current one included).
    pub fn in_flight(&self) -> Iteration {
        self.iteration - self.finished_below_at(self.iteration) + 1
    }

    /// Requests not yet completed.
    pub fn open_requests(&self) -> usize {
        self.requests.len()
    }

    /// The rows an open push request carries, as its slices hold them: what the job's filters
    /// passed of what the application pushed (feature `testing`; `None` once the request
    /// completed, or for a pull).
    #[cfg(feature = "testing")]
    pub fn push_rows(&self, id: RequestId) -> Option<KvPairs<V>> {
        let request = self.requests.get(&id)?;
        let mut rows: BTreeMap<crate::key::Key, Vec<V>> = BTreeMap::new();
        let parts = request
            .whole
            .iter()
            .chain(request.open.values().map(|s| &s.part));
        for part in parts {
            let Part::Push(kvs) = part else {
                return None;
            };
            for (key, row) in kvs.iter() {
                rows.insert(key, row.to_vec());
            }
        }
        let keys: Vec<_> = rows.keys().copied().collect();
        let values = rows.into_values().flatten().collect();
        KvPairs::new(keys, values, self.cfg.width).ok()
    }

    /// Slices on the network, push and pull together (at most twice
    /// [`WorkerConfig::max_slices_in_flight`]; feature `testing`).
    #[cfg(feature = "testing")]
    pub fn slices_in_flight(&self) -> usize {
        self.windows.push.slices() + self.windows.pull.slices()
    }

    /// True when nothing is left to finish: no open request, and every server has acknowledged
    /// the worker's progress. A worker stopped before it is idle may leave servers waiting for
    /// its last iteration.
    pub fn is_idle(&self) -> bool {
        self.requests.is_empty() && !self.progress_pending()
    }

    /// True once the coordinator has removed this worker (feature `testing`; a driver reports
    /// [`crate::Event::Fenced`]).
    #[cfg(feature = "testing")]
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// True once the worker holds a configuration and knows the iteration it starts in: it
    /// has said [`Event::Ready`]. Until then it refuses requests ([`WorkerError::NotReady`]).
    pub fn is_ready(&self) -> bool {
        self.cluster.is_some() && !self.learning_start
    }

    /// Whether the application may push, pull or advance now.
    fn takes_requests(&self) -> Result<(), WorkerError> {
        if self.fenced {
            Err(WorkerError::Fenced)
        } else if !self.is_ready() {
            Err(WorkerError::NotReady)
        } else {
            Ok(())
        }
    }

    /// Registers with the coordinator and starts heartbeats. Call once, first.
    pub fn start(&mut self, now: Time, out: &mut Effects<V>) {
        self.register(now, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    /// Starts with `config` already in force (static membership, e.g. from
    /// [`crate::node::Coordinator::bootstrapped`]) instead of registering. Call once, first,
    /// instead of `start`.
    pub fn start_configured(&mut self, now: Time, config: ClusterConfig, out: &mut Effects<V>) {
        self.started_configured = true;
        self.adopt(now, config.coordinator, config, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    /// Asks the coordinator to take this worker out of the job; nobody waits on its progress
    /// afterwards. Call it once the worker's requests have completed: when the configuration
    /// without it arrives the worker is fenced ([`Event::Fenced`]) and drops what is open. The
    /// request is repeated with every heartbeat until then. Refused while the job's filters
    /// hold changes not pushed yet ([`WorkerError::Unflushed`]): [`Worker::flush`] them, and
    /// leave once that push completed.
    pub fn leave(&mut self, out: &mut Effects<V>) -> Result<(), WorkerError> {
        let rows = self.filters.holds();
        if rows > 0 && !self.fenced {
            return Err(WorkerError::Unflushed { rows });
        }
        self.leave_requested = true;
        if !self.fenced {
            self.send(self.coordinator_id(), Message::Leave, out);
        }
        Ok(())
    }

    fn register(&mut self, now: Time, out: &mut Effects<V>) {
        let body = Message::Register {
            role: Role::Worker,
            incarnation: 0,
            keys_below: self.cfg.keys_below,
            checkpoints: Vec::new(),
        };
        for to in crate::watch::register_with(
            self.cluster.as_ref(),
            self.cfg.coordinator,
            self.cfg.standbys,
        ) {
            self.send(to, body.clone(), out);
        }
        out.set_timer(TimerId::Register, now + self.cfg.timing.register_retry);
    }

    /// The highest coordinator term this worker holds or granted.
    fn term_held(&self) -> u64 {
        let held = self.cluster.as_ref().map_or(0, |c| c.config.term);
        held.max(self.coordinator.granted())
    }

    /// The coordinator this worker follows: the active one of the configuration in force, or
    /// the one it was told to register with.
    fn coordinator_id(&self) -> NodeId {
        self.cluster
            .as_ref()
            .map_or(self.cfg.coordinator, |c| c.config.coordinator)
    }

    fn send(&self, to: NodeId, body: Message<V>, out: &mut Effects<V>) {
        out.send(Envelope::new(self.cfg.id, to, self.epoch(), body));
    }

    /// Pushes `kvs` as part of the current iteration. Completes with [`crate::events::WorkerEvent::PushDone`] once
    /// it counts for the iteration, and with [`crate::events::WorkerEvent::PushDurable`] (in the same step, or
    /// later in sequential mode with replicas) once every replica holds it.
    pub fn push(
        &mut self,
        now: Time,
        kvs: KvPairs<V>,
        out: &mut Effects<V>,
    ) -> Result<RequestId, WorkerError> {
        self.push_part(now, kvs, Coverage::WHOLE, out)
    }

    /// Pushes `kvs` as a part of the current iteration's work: with the parts pushed before,
    /// `covers` of it. A worker that cuts its iteration into parts this way loses only the
    /// part it had not pushed when the coordinator tells it to skip ahead
    /// ([`crate::events::WorkerEvent::SkippedAhead`]), and the coordinator sees how far into the iteration it is.
    /// Completes as [`Worker::push`] does.
    pub fn push_part(
        &mut self,
        now: Time,
        kvs: KvPairs<V>,
        covers: Coverage,
        out: &mut Effects<V>,
    ) -> Result<RequestId, WorkerError> {
        self.takes_requests()?;
        if kvs.width() != self.cfg.width {
            return Err(WorkerError::WidthMismatch {
                expected: self.cfg.width,
                got: kvs.width(),
            });
        }
        if let Some(cut) = self.waits_at_checkpoint() {
            return Err(WorkerError::AtCheckpoint { cut });
        }
        let kvs = self.filters.push(kvs);
        Ok(self.send_push(now, kvs, covers, out))
    }

    /// Sends a push the filters passed.
    fn send_push(
        &mut self,
        now: Time,
        kvs: KvPairs<V>,
        covers: Coverage,
        out: &mut Effects<V>,
    ) -> RequestId {
        self.covered = self.covered.max(covers);
        *self.unfinished.entry(self.iteration).or_default() += 1;
        self.submit(now, Part::Push(kvs), covers, out)
    }

    /// Pushes, in the current iteration, everything the job's filters held back
    /// ([`crate::filter`]): before the worker leaves, and whenever the application wants the
    /// servers to hold every change it pushed. Completes as [`Worker::push`] does; `None` when
    /// the filters held nothing.
    pub fn flush(
        &mut self,
        now: Time,
        out: &mut Effects<V>,
    ) -> Result<Option<RequestId>, WorkerError> {
        self.takes_requests()?;
        if let Some(cut) = self.waits_at_checkpoint() {
            return Err(WorkerError::AtCheckpoint { cut });
        }
        let Some(kvs) = self.filters.flush() else {
            return Ok(None);
        };
        if mutated!(self, FilterForgets) {
            return Ok(None);
        }
        Ok(Some(self.send_push(now, kvs, self.covered, out)))
    }

    /// What each of the job's filters saved so far, by name.
    pub fn filter_savings(&self) -> Vec<(&'static str, FilterSaving)> {
        let mut savings = self.filters.savings();
        savings.extend(self.sent_lists.as_ref().map(|s| ("keycache", s.saving())));
        savings.extend(self.compressed.map(|s| ("compress", s.0)));
        savings
    }

    /// Counts what compression saved on `values`, sent or received.
    fn count_compressed(&mut self, values: &RowValues<V>) {
        if let Some(Tally(saving)) = self.compressed.as_mut() {
            let rows = values.rows() as u64;
            let plain = values.rows() * self.cfg.width * V::SIZE;
            saving.rows_in += rows;
            saving.rows_out += rows;
            saving.bytes_saved += plain.saturating_sub(values.wire_bytes()) as u64;
        }
    }

    /// Sets how long the worker may go with nothing completed before it says it stalled
    /// ([`crate::Timing::stall_limit`]; 0: never).
    pub fn set_stall_limit(&mut self, limit: Time) {
        self.cfg.timing.stall_limit = limit;
    }

    /// Says how fast the application works: the work it does per second of its own compute,
    /// waiting left out (rows per second, say; any unit the same for every worker of the
    /// job). Where the job sizes shares by speed ([`crate::pace::StragglerPolicy::balance`]) it
    /// goes to the coordinator with the next heartbeat, which moves shares from slow workers
    /// to fast ones by it; otherwise it is kept and unused.
    pub fn report_speed(&mut self, per_sec: u32) {
        self.speed = per_sec;
    }

    /// Pulls `keys` for the current iteration. Completes with [`crate::events::WorkerEvent::PullDone`] once the
    /// servers can meet the consistency model.
    pub fn pull(
        &mut self,
        now: Time,
        keys: KeySelection,
        out: &mut Effects<V>,
    ) -> Result<RequestId, WorkerError> {
        self.takes_requests()?;
        Ok(self.submit(now, Part::Pull(keys), Coverage(0), out))
    }

    /// Ends the current iteration. The worker enters the next one ([`crate::events::WorkerEvent::Advanced`]) as soon
    /// as the consistency model allows: at once, or when enough earlier pushes are acknowledged.
    pub fn advance(&mut self, now: Time, out: &mut Effects<V>) -> Result<(), WorkerError> {
        self.takes_requests()?;
        self.advances_waiting += 1;
        self.try_advance(now, out);
        Ok(())
    }

    /// Says once, when the oldest thing the worker waits on has waited the job's stall
    /// limit, what it waits for ([`WorkerEvent::Stalled`]).
    fn watch_stall(&mut self, now: Time, out: &mut Effects<V>) {
        // A push done for its iteration but not yet durable waits on the others' iteration
        // (sequential mode with replicas), not on a server: not a stall of its own.
        let oldest = self
            .requests
            .iter()
            .find(|(_, r)| !r.is_push() || !r.counted)
            .map(|(&id, _)| id);
        let waiting = match oldest {
            Some(id) => Some(Waiting::Request(id)),
            None => (self.advances_waiting > 0).then_some(Waiting::Advance(self.iteration)),
        };
        let limit = self.cfg.timing.stall_limit;
        if let Some(for_at_least) = self.stall.look(now, waiting, limit) {
            let waits = self
                .waits()
                .into_iter()
                .filter(|w| oldest.is_none_or(|id| w.request == id))
                .collect();
            out.emit(Event::Worker(WorkerEvent::Stalled {
                request: oldest,
                for_at_least,
                waits,
            }));
        }
    }

    /// Call when a timer this worker set fires.
    pub fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Effects<V>) {
        if self.fenced {
            return;
        }
        match timer {
            TimerId::Register if self.cluster.is_none() => self.register(now, out),
            TimerId::Heartbeat => {
                let at = self.cfg.report_position.then_some(Position {
                    iteration: self.iteration,
                    covered: self.covered,
                    speed: self.speed,
                });
                let body = Message::Heartbeat {
                    sent_at: now,
                    at,
                    term: self.term_held(),
                };
                self.send(self.coordinator_id(), body, out);
                let standbys = self
                    .cluster
                    .as_ref()
                    .is_some_and(|c| !c.config.standbys.is_empty());
                self.coordinator
                    .heartbeat_sent(&self.cfg.timing, standbys, out);
                if self.leave_requested {
                    self.send(self.coordinator_id(), Message::Leave, out);
                }
                self.watch_stall(now, out);
                out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
            }
            TimerId::Retransmit => {
                self.retransmit_at = None;
                self.retransmit_due(now, out);
                self.arm_retransmit(out);
            }
            _ => {}
        }
    }

    /// Call for every message addressed to this worker.
    pub fn on_message(&mut self, now: Time, env: Envelope<V>, out: &mut Effects<V>) {
        let from = env.from;
        if env.to != self.cfg.id {
            return out.refuse(from, Refusal::Misaddressed { to: env.to });
        }
        if self.fenced {
            return out.refuse(from, Refusal::Fenced);
        }
        if from == self.coordinator_id() {
            self.coordinator.heard(&self.cfg.timing, out);
        }
        match env.body {
            Message::Config(config) => self.adopt(now, from, config, out),
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
                crate::watch::answer_term_ask(self.cfg.id, self.epoch(), from, term, answer, out);
            }
            Message::HeartbeatAck { sent_at, degraded } if from == self.coordinator_id() => {
                self.coordinator.heard_degraded(sent_at, &degraded, out);
            }
            Message::PushAck(sref) => self.on_answer(now, from, sref, None, out),
            Message::SlotGrant(sref) => self.on_grant(now, from, sref, out),
            // Taken in counts only at the epoch it happened in: a server that took a push in
            // under an earlier configuration may have lost it since (ARCHITECTURE.md §8). A
            // later one counts once this worker is there too.
            Message::PushTaken(sref) if env.epoch >= self.epoch() => {
                self.on_taken(now, from, env.epoch, sref, out)
            }
            Message::PushTaken(_) => out.refuse(
                from,
                Refusal::StaleEpoch {
                    epoch: env.epoch,
                    current: self.epoch(),
                },
            ),
            Message::PullReply(PullReply {
                slice, kvs, resume, ..
            }) => match resume {
                None => self.on_answer(now, from, slice, Some(kvs), out),
                Some(next) => self.on_partial_answer(now, from, slice, kvs, next, out),
            },
            Message::PullValues(PullValues { slice, values, .. }) => {
                match self
                    .asked_keys(slice)
                    .and_then(|keys| values.with_keys(&keys, self.cfg.width))
                {
                    Some(kvs) => {
                        if let Some(sent) = self.sent_lists.as_mut() {
                            sent.answered_without(from, kvs.keys());
                        }
                        self.count_compressed(&values);
                        self.on_answer(now, from, slice, Some(kvs), out)
                    }
                    None => out.refuse(from, Refusal::BadAnswer),
                }
            }
            Message::PullRows(PullRows {
                slice,
                keys,
                values,
                resume,
                ..
            }) => match values.with_keys(keys.shared(), self.cfg.width) {
                Some(kvs) => {
                    self.count_compressed(&values);
                    match resume {
                        None => self.on_answer(now, from, slice, Some(kvs), out),
                        Some(next) => self.on_partial_answer(now, from, slice, kvs, next, out),
                    }
                }
                None => out.refuse(from, Refusal::BadAnswer),
            },
            Message::KeysUnknown(slice) => self.on_keys_unknown(now, from, slice, out),
            Message::ProgressRequest => self.on_progress_request(now, from, out),
            Message::ProgressAck {
                finished_below,
                taken_below,
            } => {
                let acked = Reached {
                    finished_below,
                    taken_below,
                };
                self.on_progress_ack(now, from, env.epoch, acked, out);
            }
            // The server knows a newer configuration: fetch it; adopting it re-slices what
            // moved. A server behind us catches up by itself, and retransmission retries.
            Message::Redirect { epoch, .. }
                if epoch > self.epoch() && !mutated!(self, IgnoreRedirect) =>
            {
                self.send(self.coordinator_id(), Message::ConfigRequest, out);
            }
            Message::Redirect { epoch, .. } => out.refuse(
                from,
                Refusal::StaleEpoch {
                    epoch,
                    current: self.epoch(),
                },
            ),
            _ => out.refuse(from, Refusal::Unexpected),
        }
    }

    fn try_advance(&mut self, now: Time, out: &mut Effects<V>) {
        let Some(consistency) = self.consistency_in_force() else {
            return;
        };
        let mut moved = false;
        let checkpoints = self
            .cluster
            .as_ref()
            .map(|c| c.config.checkpoints)
            .unwrap_or_default();
        while self.advances_waiting > 0 {
            let next = self.iteration + 1;
            if !consistency.may_enter(next, self.finished_below_at(next))
                && !mutated!(self, EagerAdvance)
            {
                break;
            }
            // The servers write the iterations below a cut before anyone enters it
            // (ARCHITECTURE.md §11).
            if checkpoints.waits_before(next) {
                break;
            }
            self.iteration = next;
            self.covered = Coverage(0);
            self.advances_waiting -= 1;
            out.emit(Event::Worker(WorkerEvent::Advanced(next)));
            moved = true;
        }
        // A worker waiting at a cut has left the iteration before it: the servers hear so.
        let waits = self.waits_at_checkpoint().is_some();
        if (moved || waits) && self.progress_pending() {
            self.progress_attempts = 0;
            self.send_progress(now, out);
            self.arm_retransmit(out);
        }
    }

    fn adopt(&mut self, now: Time, from: NodeId, config: ClusterConfig, out: &mut Effects<V>) {
        let cluster = match Cluster::successor(self.cluster.as_ref(), config) {
            Ok(Some(cluster)) => cluster,
            Ok(None) => return,
            Err(reason) => return out.refuse(from, reason),
        };
        let first = self.cluster.is_none();
        // A worker that joins a running job asks where the others are before it starts, so
        // that nobody waits for it to go through iterations the job has finished.
        let joins_late = first && !self.started_configured && cluster.epoch() > 1;
        self.forget_progress_of_new_servers(&cluster);
        if self
            .cluster
            .as_ref()
            .is_some_and(|c| c.epoch() < cluster.epoch())
        {
            self.forget_taken_progress();
            self.untake_before(cluster.epoch());
        }
        // A range lost since the configuration before: the job may have to fail for it, even
        // if this configuration also removes the worker.
        let known: &[KeyRange] = self.cluster.as_ref().map_or(&[], |c| &c.config.lost);
        for &range in &cluster.config.lost {
            if known.binary_search(&range).is_err() {
                out.emit(Event::RangeLost(range));
            }
        }
        if let Some(held) = &self.cluster {
            for dead in cluster.config.dead_since(&held.config) {
                if dead != self.cfg.id {
                    out.emit(Event::NodeDead(dead));
                }
            }
        }
        if !cluster.is_worker(self.cfg.id) {
            return self.fence(out);
        }
        self.cluster = Some(cluster);
        if first {
            out.cancel_timer(TimerId::Register);
            if joins_late {
                self.learning_start = true;
            } else {
                let resumes = cluster_resumes(self.cluster.as_ref());
                if let Some(cut) = resumes.filter(|_| self.requests.is_empty()) {
                    self.iteration = self.iteration.max(cut);
                    self.resumed_from = Some(cut);
                }
                out.emit(Event::Ready {
                    epoch: self.epoch(),
                });
            }
        } else if self.learning_start {
            // A server that had not answered may have left the configuration.
            self.start_when_learned(now, out);
        }
        self.skip_ahead(out);
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for id in ids {
            self.reslice_moved(id);
            self.slice_request(now, id, out);
        }
        // Slices taken back from servers that kept their ranges go out again too; slices
        // taken at this epoch before the worker heard of it count now.
        self.fill_window(now, out);
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for id in ids {
            self.count_if_taken(id, out);
        }
        self.try_advance(now, out);
        if self.progress_pending() {
            self.send_progress(now, out);
        }
        self.arm_retransmit(out);
    }

    /// The coordinator told this worker to skip the iterations below
    /// [`Worker::skipped_below`]: it enters that iteration at once. What it pushed of the ones
    /// it skips still goes to the servers; what it had not pushed is dropped. An `advance` the
    /// application is waiting on is answered with the iteration entered.
    fn skip_ahead(&mut self, out: &mut Effects<V>) {
        let to = self.skipped_below();
        if to <= self.iteration || self.learning_start {
            return;
        }
        let from = self.iteration;
        out.emit(Event::Worker(WorkerEvent::SkippedAhead {
            from,
            to,
            covered: self.covered,
        }));
        self.iteration = to;
        self.covered = Coverage(0);
        if self.advances_waiting > 0 {
            self.advances_waiting -= 1;
            out.emit(Event::Worker(WorkerEvent::Advanced(to)));
        }
    }

    /// The coordinator removed this worker: it drops what is open and stops.
    fn fence(&mut self, out: &mut Effects<V>) {
        self.fenced = true;
        self.requests.clear();
        self.windows = PerKind::default();
        for timer in [TimerId::Retransmit, TimerId::Heartbeat, TimerId::Register] {
            out.cancel_timer(timer);
        }
        out.emit(Event::Fenced);
    }
}

/// The cut a job resumes from, when `cluster` is its first configuration and says so.
fn cluster_resumes(cluster: Option<&Cluster>) -> Option<Iteration> {
    let config = &cluster?.config;
    (config.epoch == 1 && config.checkpoints.complete > 0).then_some(config.checkpoints.complete)
}
