//! The worker: slices the application's pushes and pulls by the ring, retransmits until every
//! slice is answered, reports its progress, and enters new iterations only as far ahead as the
//! consistency model allows.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::cluster::Cluster;
use crate::consistency::Consistency;
use crate::effects::{Effects, Event, Refusal, TimerId};
use crate::ids::{Epoch, Iteration, NodeId, Role, Time};
use crate::kv::KvPairs;
use crate::selection::KeySelection;
use crate::sizes;
use crate::slicing::{Part, answers, assemble, merge_parts, primary_of_all, split_by_primary};
use crate::timing::Timing;
use crate::value::Value;
use crate::wire::{
    ClusterConfig, Envelope, Message, Pull, PullReply, Push, RequestId, SliceId, SliceRef,
};

/// Default for [`WorkerConfig::max_slice_bytes`]: 4 MiB, well below the default frame limit.
pub const DEFAULT_MAX_SLICE_BYTES: usize = 4 << 20;

/// What a worker is told at start. Build it with [`WorkerConfig::new`] and change the fields
/// that differ from the defaults.
///
/// ```
/// use pserver_core::{NodeId, WorkerConfig};
/// let mut cfg = WorkerConfig::new(NodeId(3), NodeId(0));
/// cfg.width = 8;
/// assert!(cfg.max_slice_bytes < pserver_core::DEFAULT_MAX_FRAME);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// This worker.
    pub id: NodeId,
    /// The coordinator to register with.
    pub coordinator: NodeId,
    /// Values per key (default 1).
    pub width: usize,
    /// Timeouts and intervals.
    pub timing: Timing,
    /// Largest slice, in bytes of keys and values, that the worker puts in one message. Requests
    /// are split by owner and then by size, so that every slice (and every pull answer to a
    /// slice of keys) fits a frame; keep it below the codec's frame limit.
    pub max_slice_bytes: usize,
    /// Push slices, and separately pull slices, that the worker has on the network at once;
    /// further slices wait for earlier ones to be answered. Pushes never wait behind pulls (a
    /// pull may be held by the consistency model, a push never is).
    pub max_slices_in_flight: usize,
    /// Bytes of push slices, and separately of pull slices (keys and values, as
    /// [`WorkerConfig::max_slice_bytes`] counts them), that the worker has on the network at
    /// once; a slice beyond it waits, but one slice of each always goes, and pushes never wait
    /// behind pulls. A transport that loses what overflows a receive buffer (UDP) needs it
    /// below that buffer. Default: unbounded.
    pub max_bytes_in_flight: u64,
    /// Seed of the retransmission jitter.
    pub seed: u64,
}

impl WorkerConfig {
    /// A worker of width 1 with default timing, slice size and window.
    pub fn new(id: NodeId, coordinator: NodeId) -> Self {
        WorkerConfig {
            id,
            coordinator,
            width: 1,
            timing: Timing::default(),
            max_slice_bytes: DEFAULT_MAX_SLICE_BYTES,
            max_slices_in_flight: 64,
            max_bytes_in_flight: u64::MAX,
            seed: 0,
        }
    }

    /// The bytes a slice moves: its rows for a push or a pull of keys, at most a message's rows
    /// for a pull of ranges (whose answer size only the server knows).
    fn slice_bytes<V: Value>(&self, part: &Part<V>) -> u64 {
        let row = sizes::row_bytes::<V>(self.width) as u64;
        let rows = match part {
            Part::Push(kvs) => kvs.len() as u64,
            Part::Pull(KeySelection::Keys(list)) => list.keys().len() as u64,
            Part::Pull(KeySelection::Ranges(list)) => list
                .ranges()
                .iter()
                .map(|r| r.len())
                .fold(0u64, u64::saturating_add)
                .min(self.keys_per_slice::<V>() as u64),
        };
        rows.saturating_mul(row)
    }

    /// Keys per slice: as many rows as fit `max_slice_bytes`, at least one.
    fn keys_per_slice<V: Value>(&self) -> usize {
        sizes::rows_within::<V>(self.max_slice_bytes, self.width)
    }

    /// The largest message this worker's slices (and the answers to them) need: what the frame
    /// limit must allow.
    pub fn frame_needed<V: Value>(&self) -> usize {
        sizes::message_bytes::<V>(self.keys_per_slice::<V>(), self.width)
    }
}

/// Why the worker refused an application call.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WorkerError {
    /// The coordinator no longer counts this worker as a member.
    #[error("this worker was removed from the cluster (declared dead); restart it to rejoin")]
    Fenced,
    /// The pushed values have another width than the job's.
    #[error("pushed rows have {got} values per key, but this job uses {expected}")]
    WidthMismatch {
        /// The job's width.
        expected: usize,
        /// The pushed width.
        got: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Slice<V: Value> {
    server: NodeId,
    part: Part<V>,
    /// On the network (otherwise waiting for room in the window).
    sent: bool,
    /// Next retransmission, once sent.
    due: Time,
    attempts: u8,
    /// A push slice the server took in ([`Message::PushTaken`]), and the server's epoch then:
    /// it has left the window and is kept (now and then resent) until acknowledged, and it
    /// counts for its iteration while the worker is at that epoch.
    taken: Option<Epoch>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Request<V: Value> {
    iteration: Iteration,
    /// Pushes count towards their iteration's completion; pulls do not.
    is_push: bool,
    /// What the application asked for, kept until the first configuration slices it.
    whole: Option<Part<V>>,
    /// Unanswered slices.
    open: BTreeMap<SliceId, Slice<V>>,
    /// Pull answers received so far.
    replies: Vec<KvPairs<V>>,
    next_slice: SliceId,
    /// A push counted as finished for its iteration (every slice taken in or acknowledged),
    /// with [`Event::PushDone`] emitted.
    counted: bool,
}

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
    /// Per server: the progress it acknowledged.
    /// Per server: the progress it acknowledged, finished and taken (the latter at the
    /// current epoch only).
    progress_acked: BTreeMap<NodeId, (Iteration, Iteration)>,
    progress_due: Time,
    progress_attempts: u8,
    retransmit_at: Option<Time>,
    /// Slices on the network: push slices, pull slices.
    in_flight: [usize; 2],
    /// Started with a configuration in force.
    started_configured: bool,
    /// Joined a running job and is asking the servers which iteration to start in; the
    /// application hears [`Event::Ready`] once they all answered.
    learning_start: bool,
    /// [`Worker::leave`] was called.
    leave_requested: bool,
    #[cfg(feature = "mutations")]
    mutation: Option<crate::mutation::Mutation>,
}

impl<V: Value> Worker<V> {
    /// A worker that has not yet registered.
    pub fn new(cfg: WorkerConfig) -> Self {
        Worker {
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
            in_flight: [0, 0],
            started_configured: false,
            learning_start: false,
            leave_requested: false,
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

    /// The epoch of the configuration in force, 0 before the first.
    pub fn epoch(&self) -> Epoch {
        self.cluster.as_ref().map_or(0, Cluster::epoch)
    }

    /// The job's consistency model, once the first configuration has arrived.
    pub fn consistency(&self) -> Option<Consistency> {
        self.cluster.as_ref().map(|c| c.config.consistency)
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

    /// The iteration the worker is in.
    pub fn iteration(&self) -> Iteration {
        self.iteration
    }

    /// Every iteration below this one is finished: advanced past, all its pushes acknowledged
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn finished_below(&self) -> Iteration {
        self.finished_below_at(self.iteration)
    }

    fn finished_below_at(&self, iteration: Iteration) -> Iteration {
        self.unfinished
            .keys()
            .next()
            .map_or(iteration, |&i| i.min(iteration))
    }

    /// Iterations started and not yet finished (the current one included).
    pub fn in_flight(&self) -> Iteration {
        self.iteration - self.finished_below_at(self.iteration) + 1
    }

    /// Requests not yet completed.
    pub fn open_requests(&self) -> usize {
        self.requests.len()
    }

    /// Slices on the network, push and pull together (at most twice
    /// [`WorkerConfig::max_slices_in_flight`]; feature `testing`).
    #[cfg(feature = "testing")]
    pub fn slices_in_flight(&self) -> usize {
        self.in_flight[0] + self.in_flight[1]
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

    /// Registers with the coordinator and starts heartbeats. Call once, first.
    pub fn start(&mut self, now: Time, out: &mut Effects<V>) {
        self.register(now, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    /// Starts with `config` already in force (static membership, e.g. from
    /// [`crate::Coordinator::bootstrapped`]) instead of registering. Call once, first, instead
    /// of `start`.
    pub fn start_configured(&mut self, now: Time, config: ClusterConfig, out: &mut Effects<V>) {
        self.started_configured = true;
        self.adopt(now, config.coordinator, config, out);
        out.set_timer(TimerId::Heartbeat, now + self.cfg.timing.heartbeat_interval);
    }

    /// Asks the coordinator to take this worker out of the job; nobody waits on its progress
    /// afterwards. Call it once the worker's requests have completed: when the configuration
    /// without it arrives the worker is fenced ([`Event::Fenced`]) and drops what is open. The
    /// request is repeated with every heartbeat until then.
    pub fn leave(&mut self, out: &mut Effects<V>) {
        self.leave_requested = true;
        if !self.fenced {
            self.send(self.cfg.coordinator, Message::Leave, out);
        }
    }

    fn register(&mut self, now: Time, out: &mut Effects<V>) {
        let body = Message::Register {
            role: Role::Worker,
            incarnation: 0,
        };
        self.send(self.cfg.coordinator, body, out);
        out.set_timer(TimerId::Register, now + self.cfg.timing.register_retry);
    }

    fn send(&self, to: NodeId, body: Message<V>, out: &mut Effects<V>) {
        out.send(Envelope::new(self.cfg.id, to, self.epoch(), body));
    }

    /// Pushes `kvs` as part of the current iteration. Completes with [`Event::PushDone`] once
    /// it counts for the iteration, and with [`Event::PushDurable`] (in the same step, or
    /// later in sequential mode with replicas) once every replica holds it.
    pub fn push(
        &mut self,
        now: Time,
        kvs: KvPairs<V>,
        out: &mut Effects<V>,
    ) -> Result<RequestId, WorkerError> {
        if self.fenced {
            return Err(WorkerError::Fenced);
        }
        if kvs.width() != self.cfg.width {
            return Err(WorkerError::WidthMismatch {
                expected: self.cfg.width,
                got: kvs.width(),
            });
        }
        *self.unfinished.entry(self.iteration).or_default() += 1;
        Ok(self.submit(now, Part::Push(kvs), out))
    }

    /// Pulls `keys` for the current iteration. Completes with [`Event::PullDone`] once the
    /// servers can meet the consistency model.
    pub fn pull(
        &mut self,
        now: Time,
        keys: KeySelection,
        out: &mut Effects<V>,
    ) -> Result<RequestId, WorkerError> {
        if self.fenced {
            return Err(WorkerError::Fenced);
        }
        Ok(self.submit(now, Part::Pull(keys), out))
    }

    /// Ends the current iteration. The worker enters the next one ([`Event::Advanced`]) as soon
    /// as the consistency model allows: at once, or when enough earlier pushes are acknowledged.
    pub fn advance(&mut self, now: Time, out: &mut Effects<V>) -> Result<(), WorkerError> {
        if self.fenced {
            return Err(WorkerError::Fenced);
        }
        self.advances_waiting += 1;
        self.try_advance(now, out);
        Ok(())
    }

    fn submit(&mut self, now: Time, part: Part<V>, out: &mut Effects<V>) -> RequestId {
        let id = self.next_request;
        self.next_request += 1;
        let request = Request {
            iteration: self.iteration,
            is_push: matches!(part, Part::Push(_)),
            whole: Some(part),
            open: BTreeMap::new(),
            replies: Vec::new(),
            next_slice: 0,
            counted: false,
        };
        self.requests.insert(id, request);
        if self.cluster.is_some() {
            self.slice_request(now, id, out);
        }
        id
    }

    /// Splits a request's unsliced part over the primaries of the current ring and sends the
    /// slices.
    fn slice_request(&mut self, now: Time, id: RequestId, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Some(request) = self.requests.get_mut(&id) else {
            return;
        };
        let Some(whole) = request.whole.take() else {
            return;
        };
        let parts = split_by_primary(cluster, whole, self.cfg.keys_per_slice::<V>());
        for (server, part) in parts {
            let sid = request.next_slice;
            request.next_slice += 1;
            request.open.insert(
                sid,
                Slice {
                    server,
                    part,
                    sent: false,
                    due: 0,
                    attempts: 0,
                    taken: None,
                },
            );
        }
        self.fill_window(now, out);
        self.complete_if_done(now, id, out);
        self.arm_retransmit(out);
    }

    /// Sends waiting slices, oldest request first, while the window of their kind has room.
    fn fill_window(&mut self, now: Time, out: &mut Effects<V>) {
        let max = self.cfg.max_slices_in_flight.max(1);
        if self.in_flight.iter().all(|&n| n >= max) {
            return;
        }
        let mut to_send = Vec::new();
        let budget = self.cfg.max_bytes_in_flight;
        let mut bytes = self.bytes_on_network();
        // A kind whose next slice did not fit sends no later one either, so that a large
        // slice is not overtaken for ever by small ones.
        let mut full = [false; 2];
        for (&id, request) in &mut self.requests {
            let kind = usize::from(!request.is_push);
            if self.in_flight[kind] >= max || full[kind] {
                continue;
            }
            for (&sid, slice) in &mut request.open {
                if self.in_flight[kind] >= max {
                    break;
                }
                if !slice.sent {
                    let size = self.cfg.slice_bytes(&slice.part);
                    if bytes[kind] > 0 && bytes[kind].saturating_add(size) > budget {
                        full[kind] = true;
                        break;
                    }
                    bytes[kind] = bytes[kind].saturating_add(size);
                    slice.sent = true;
                    slice.due = now + jittered_rto(&self.cfg, id, sid, 0);
                    self.in_flight[kind] += 1;
                    to_send.push((id, sid));
                }
            }
        }
        let allowance = self.transfer_allowance();
        for (id, sid) in to_send {
            self.delay_due(id, sid, allowance);
            self.send_slice(id, sid, out);
        }
    }

    /// Bytes of the push slices, and of the pull slices, sent and neither answered nor taken
    /// in.
    fn bytes_on_network(&self) -> [u64; 2] {
        let mut bytes = [0u64; 2];
        for request in self.requests.values() {
            let kind = usize::from(!request.is_push);
            for slice in request.open.values() {
                if slice.sent && slice.taken.is_none() {
                    let size = self.cfg.slice_bytes(&slice.part);
                    bytes[kind] = bytes[kind].saturating_add(size);
                }
            }
        }
        bytes
    }

    /// What [`Timing::rto_per_mib`] adds to a deadline for what is on the network now.
    fn transfer_allowance(&self) -> Time {
        let [push, pull] = self.bytes_on_network();
        (push.saturating_add(pull) >> 20).saturating_mul(self.cfg.timing.rto_per_mib)
    }

    fn delay_due(&mut self, id: RequestId, sid: SliceId, by: Time) {
        if by == 0 {
            return;
        }
        if let Some(slice) = self
            .requests
            .get_mut(&id)
            .and_then(|r| r.open.get_mut(&sid))
        {
            slice.due = slice.due.saturating_add(by);
        }
    }

    fn send_slice(&self, id: RequestId, sid: SliceId, out: &mut Effects<V>) {
        let Some(request) = self.requests.get(&id) else {
            return;
        };
        let Some(slice) = request.open.get(&sid) else {
            return;
        };
        let sref = SliceRef {
            request: id,
            slice: sid,
        };
        let body = match &slice.part {
            Part::Push(kvs) => Message::Push(Push {
                slice: sref,
                iteration: request.iteration,
                settled_below: self.settled_below(),
                kvs: kvs.clone(),
            }),
            Part::Pull(keys) => Message::Pull(Pull {
                slice: sref,
                iteration: request.iteration,
                keys: keys.clone(),
            }),
        };
        self.send(slice.server, body, out);
    }

    /// Every push request below this id is complete.
    fn settled_below(&self) -> RequestId {
        self.requests
            .iter()
            .find(|(_, r)| r.is_push)
            .map_or(self.next_request, |(&id, _)| id)
    }

    /// Call when a timer this worker set fires.
    pub fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Effects<V>) {
        if self.fenced {
            return;
        }
        match timer {
            TimerId::Register if self.cluster.is_none() => self.register(now, out),
            TimerId::Heartbeat => {
                let body = Message::Heartbeat { sent_at: now };
                self.send(self.cfg.coordinator, body, out);
                if self.leave_requested {
                    self.send(self.cfg.coordinator, Message::Leave, out);
                }
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

    fn retransmit_due(&mut self, now: Time, out: &mut Effects<V>) {
        let timing = self.cfg.timing;
        let mut due = Vec::new();
        for (&id, request) in &mut self.requests {
            for (&sid, slice) in &mut request.open {
                if slice.sent && slice.due <= now {
                    slice.attempts = timing.next_attempt(slice.attempts);
                    slice.due = now + jittered_rto(&self.cfg, id, sid, slice.attempts);
                    due.push((id, sid));
                }
            }
        }
        let allowance = self.transfer_allowance();
        for (id, sid) in due {
            self.delay_due(id, sid, allowance);
            self.send_slice(id, sid, out);
        }
        if self.progress_pending() && self.progress_due <= now {
            self.progress_attempts = timing.next_attempt(self.progress_attempts);
            self.send_progress(now, out);
        }
    }

    /// Sets the retransmission timer to the earliest deadline, or cancels it.
    fn arm_retransmit(&mut self, out: &mut Effects<V>) {
        let slices = self
            .requests
            .values()
            .flat_map(|r| r.open.values().filter(|s| s.sent).map(|s| s.due));
        let progress = self.progress_pending().then_some(self.progress_due);
        let next = slices
            .chain(progress)
            .min()
            .filter(|_| !mutated!(self, NoRetransmit));
        if next != self.retransmit_at {
            match next {
                Some(at) => out.set_timer(TimerId::Retransmit, at),
                None => out.cancel_timer(TimerId::Retransmit),
            }
            self.retransmit_at = next;
        }
    }

    fn progress_pending(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.servers().iter().any(|&s| self.progress_owed(s)))
    }

    /// Every push of every iteration below this one is acknowledged (and it was left).
    fn durable_below(&self) -> Iteration {
        self.requests
            .values()
            .filter(|r| r.is_push)
            .map(|r| r.iteration)
            .min()
            .map_or(self.iteration, |i| i.min(self.iteration))
    }

    /// Every push of every iteration below this one is acknowledged or taken in, at this
    /// epoch, by the server its slices are addressed to, the primary of their keys (and it
    /// was left).
    fn taken_below(&self) -> Iteration {
        let epoch = self.epoch();
        self.requests
            .values()
            .filter(|r| r.is_push && (r.whole.is_some() || !all_taken_at(r, epoch)))
            .map(|r| r.iteration)
            .min()
            .map_or(self.iteration, |i| i.min(self.iteration))
    }

    fn progress_message(&self) -> Message<V> {
        Message::Progress {
            finished_below: self.durable_below(),
            taken_below: self.taken_below(),
        }
    }

    /// Whether `server` has not acknowledged this worker's progress yet: it is ahead of what
    /// the server acknowledged, or, while learning where to start, anything at all.
    fn progress_owed(&self, server: NodeId) -> bool {
        match self.progress_acked.get(&server) {
            None if self.learning_start => true,
            acked => {
                // Finished progress the server holds covers taken progress as far as it goes.
                let (finished, taken) = acked.copied().unwrap_or((0, 0));
                finished < self.durable_below() || finished.max(taken) < self.taken_below()
            }
        }
    }

    /// When progress sent now is next retransmitted.
    fn progress_deadline(&self, now: Time) -> Time {
        let attempts = self.progress_attempts;
        now + jittered_rto(
            &self.cfg,
            RequestId::MAX,
            self.finished_below_at(self.iteration),
            attempts,
        )
    }

    fn send_progress(&mut self, now: Time, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        for &server in cluster.servers() {
            if self.progress_owed(server) {
                let body = self.progress_message();
                out.send(Envelope::new(self.cfg.id, server, cluster.epoch(), body));
            }
        }
        self.progress_due = self.progress_deadline(now);
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
        match env.body {
            Message::Config(config) => self.adopt(now, from, config, out),
            Message::PushAck(sref) => self.on_answer(now, from, sref, None, out),
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
            Message::ProgressRequest
                if self.cluster.as_ref().is_some_and(|c| c.is_server(from)) =>
            {
                // A new process that never heard our progress, whatever its id acknowledged
                // before: tell it, and count nothing as acknowledged until it answers.
                let was_pending = self.progress_pending();
                self.progress_acked.remove(&from);
                let body = self.progress_message();
                self.send(from, body, out);
                if !was_pending {
                    // The deadline of progress acknowledged long ago is in the past.
                    self.progress_attempts = 0;
                    self.progress_due = self.progress_deadline(now);
                }
                self.arm_retransmit(out);
            }
            Message::ProgressRequest => out.refuse(from, Refusal::UnknownSender),
            Message::ProgressAck {
                finished_below,
                taken_below,
            } => {
                let current = env.epoch == self.epoch();
                let acked = self.progress_acked.entry(env.from).or_default();
                acked.0 = acked.0.max(finished_below);
                // Taken progress counts at one epoch: an acknowledgement from an earlier one
                // says nothing of what the server holds now.
                // Kept only where it runs ahead of finished progress.
                if current && taken_below > acked.0 {
                    acked.1 = acked.1.max(taken_below);
                }
                if self.learning_start {
                    self.start_when_learned(now, out);
                }
                if !self.progress_pending() {
                    self.progress_attempts = 0;
                }
                self.arm_retransmit(out);
            }
            // The server knows a newer configuration: fetch it; adopting it re-slices what
            // moved. A server behind us catches up by itself, and retransmission retries.
            Message::Redirect { epoch, .. }
                if epoch > self.epoch() && !mutated!(self, IgnoreRedirect) =>
            {
                self.send(self.cfg.coordinator, Message::ConfigRequest, out);
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

    fn on_answer(
        &mut self,
        now: Time,
        from: NodeId,
        sref: SliceRef,
        reply: Option<KvPairs<V>>,
        out: &mut Effects<V>,
    ) {
        let width = self.cfg.width;
        let Some(request) = self.requests.get_mut(&sref.request) else {
            return;
        };
        let Some(slice) = request.open.get(&sref.slice) else {
            return;
        };
        if !slice.sent || from != slice.server {
            // Not sent, or not to this server: an answer to something else, or a forgery.
            return out.refuse(from, Refusal::BadAnswer);
        }
        match (&slice.part, reply) {
            (Part::Push(_), None) => {}
            (part @ Part::Pull(_), Some(kvs)) if answers(part, &kvs, width) => {
                request.replies.push(kvs);
            }
            // An answer of the wrong kind or shape: leave the slice open.
            _ => return out.refuse(from, Refusal::BadAnswer),
        }
        let taken = slice.taken.is_some();
        request.open.remove(&sref.slice);
        if !taken {
            self.in_flight[usize::from(!request.is_push)] -= 1;
        }
        self.fill_window(now, out);
        if self.count_if_taken(sref.request, out) {
            self.on_progress(now, out);
        }
        self.complete_if_done(now, sref.request, out);
        self.arm_retransmit(out);
    }

    /// A server took a push slice in without its replicas holding it yet: the slice leaves
    /// the window and counts for its iteration, and is resent only at the longest
    /// retransmission timeout (a lost acknowledgement, or a server that died with it) until
    /// it is acknowledged.
    fn on_taken(
        &mut self,
        now: Time,
        from: NodeId,
        epoch: Epoch,
        sref: SliceRef,
        out: &mut Effects<V>,
    ) {
        let timing = self.cfg.timing;
        let Some(request) = self.requests.get_mut(&sref.request) else {
            return;
        };
        let Some(slice) = request.open.get_mut(&sref.slice) else {
            return;
        };
        if !slice.sent || from != slice.server || !matches!(slice.part, Part::Push(_)) {
            return out.refuse(from, Refusal::BadAnswer);
        }
        let was_taken = slice.taken.is_some();
        if slice.taken >= Some(epoch) {
            return;
        }
        slice.taken = Some(epoch);
        slice.attempts = timing.max_doublings;
        slice.due = now + jittered_rto(&self.cfg, sref.request, sref.slice, slice.attempts);
        if !was_taken {
            self.in_flight[0] -= 1;
        }
        self.fill_window(now, out);
        if self.count_if_taken(sref.request, out) {
            self.on_progress(now, out);
        }
        self.arm_retransmit(out);
    }

    /// Counts a push for its iteration once every slice of it was taken in or acknowledged.
    /// Returns whether the worker's taken progress may have moved (the caller tells the
    /// servers).
    fn count_if_taken(&mut self, id: RequestId, out: &mut Effects<V>) -> bool {
        let epoch = self.epoch();
        let Some(request) = self.requests.get_mut(&id) else {
            return false;
        };
        // With no slice open the push is acknowledged: `complete_if_done` counts it.
        let taken = request.is_push
            && request.whole.is_none()
            && !request.open.is_empty()
            && all_taken_at(request, epoch);
        if !taken {
            return false;
        }
        // Already counted: taken in again at a new epoch.
        if !request.counted {
            request.counted = true;
            let iteration = request.iteration;
            self.count_push(id, iteration, out);
        }
        true
    }

    /// A push is done for its iteration: the iteration may finish (the caller tells the
    /// servers), and the application hears [`Event::PushDone`].
    fn count_push(&mut self, id: RequestId, iteration: Iteration, out: &mut Effects<V>) {
        if let Some(n) = self.unfinished.get_mut(&iteration) {
            *n -= 1;
            if *n == 0 {
                self.unfinished.remove(&iteration);
            }
        }
        out.emit(Event::PushDone(id));
    }

    /// The first part of an answer to a range pull too large for one message: keep it, and ask
    /// for the rest (the keys from `next` on) under the same slice.
    fn on_partial_answer(
        &mut self,
        now: Time,
        from: NodeId,
        sref: SliceRef,
        kvs: KvPairs<V>,
        next: crate::key::Key,
        out: &mut Effects<V>,
    ) {
        let width = self.cfg.width;
        let Some(request) = self.requests.get_mut(&sref.request) else {
            return;
        };
        let Some(slice) = request.open.get_mut(&sref.slice) else {
            return;
        };
        let Part::Pull(KeySelection::Ranges(ranges)) = &slice.part else {
            return out.refuse(from, Refusal::BadAnswer);
        };
        let start = ranges.ranges().first().map_or(0, |r| r.start());
        // The part must answer the slice as it stands, stop short of `next`, and move forward:
        // anything else (a stale copy of an earlier part, say) could repeat keys or loop.
        let fits = slice.sent
            && from == slice.server
            && next > start
            && answers(&slice.part, &kvs, width)
            && kvs.span().is_none_or(|s| s.end() <= next);
        if !fits {
            return out.refuse(from, Refusal::BadAnswer);
        }
        request.replies.push(kvs);
        let rest = ranges.from_key(next);
        if rest.ranges().is_empty() {
            request.open.remove(&sref.slice);
            self.in_flight[1] -= 1;
            self.fill_window(now, out);
            self.complete_if_done(now, sref.request, out);
        } else {
            slice.part = Part::Pull(KeySelection::Ranges(rest));
            slice.attempts = 0;
            slice.due = now + jittered_rto(&self.cfg, sref.request, sref.slice, 0);
            let allowance = self.transfer_allowance();
            self.delay_due(sref.request, sref.slice, allowance);
            self.send_slice(sref.request, sref.slice, out);
        }
        self.arm_retransmit(out);
    }

    fn complete_if_done(&mut self, now: Time, id: RequestId, out: &mut Effects<V>) {
        let done = self
            .requests
            .get(&id)
            .is_some_and(|r| r.open.is_empty() && r.whole.is_none());
        if !done {
            return;
        }
        let Some(request) = self.requests.remove(&id) else {
            return;
        };
        if request.is_push {
            if !request.counted {
                self.count_push(id, request.iteration, out);
            }
            // Durable progress moved, and maybe finished progress: servers hear it.
            self.on_progress(now, out);
            out.emit(Event::PushDurable(id));
        } else {
            #[allow(unused_mut)]
            let mut kvs = assemble(request.replies, self.cfg.width);
            if mutated!(self, ShortPull) && !kvs.is_empty() {
                kvs = kvs.rows(0, kvs.len() - 1);
            }
            out.emit(Event::PullDone(id, kvs));
        }
    }

    fn on_progress(&mut self, now: Time, out: &mut Effects<V>) {
        if self.progress_pending() {
            self.progress_attempts = 0;
            self.send_progress(now, out);
        }
        self.try_advance(now, out);
    }

    fn try_advance(&mut self, now: Time, out: &mut Effects<V>) {
        let Some(consistency) = self.cluster.as_ref().map(|c| c.config.consistency) else {
            return;
        };
        let mut moved = false;
        while self.advances_waiting > 0 {
            let next = self.iteration + 1;
            if !consistency.may_enter(next, self.finished_below_at(next))
                && !mutated!(self, EagerAdvance)
            {
                break;
            }
            self.iteration = next;
            self.advances_waiting -= 1;
            out.emit(Event::Advanced(next));
            moved = true;
        }
        if moved && self.progress_pending() {
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
        // A server joining, or back on the ring, may be a new process that never heard this
        // worker's progress, whatever an earlier process of the same id acknowledged.
        let old_servers: Vec<NodeId> = self
            .cluster
            .as_ref()
            .map(|c| c.servers().to_vec())
            .unwrap_or_default();
        for s in cluster.config.servers.iter().chain(&cluster.config.joining) {
            if cluster.config.joining.contains(s) || !old_servers.contains(s) {
                self.progress_acked.remove(s);
            }
        }
        if self
            .cluster
            .as_ref()
            .is_some_and(|c| c.epoch() < cluster.epoch())
        {
            // Servers count taken progress at one epoch only: tell them again at this one.
            for acked in self.progress_acked.values_mut() {
                acked.1 = 0;
            }
            self.untake_before(cluster.epoch());
        }
        if !cluster.is_worker(self.cfg.id) {
            self.fenced = true;
            self.requests.clear();
            self.in_flight = [0, 0];
            for timer in [TimerId::Retransmit, TimerId::Heartbeat, TimerId::Register] {
                out.cancel_timer(timer);
            }
            out.emit(Event::Fenced);
            return;
        }
        self.cluster = Some(cluster);
        if first {
            out.cancel_timer(TimerId::Register);
            if joins_late {
                self.learning_start = true;
            } else {
                out.emit(Event::Ready {
                    epoch: self.epoch(),
                });
            }
        } else if self.learning_start {
            // A server that had not answered may have left the configuration.
            self.start_when_learned(now, out);
        }
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

    /// Once every server answered a late joiner's progress, enters the furthest iteration they
    /// named (each server counts the joiner as having finished what every other worker had)
    /// and tells the application it is ready.
    fn start_when_learned(&mut self, now: Time, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let answers: Option<Vec<Iteration>> = cluster
            .servers()
            .iter()
            .map(|s| self.progress_acked.get(s).map(|a| a.0))
            .collect();
        let Some(start) = answers.and_then(|a| a.into_iter().max()) else {
            return;
        };
        self.learning_start = false;
        if self.requests.is_empty() && self.unfinished.is_empty() {
            self.iteration = self.iteration.max(start);
        }
        out.emit(Event::Ready {
            epoch: self.epoch(),
        });
        if self.progress_pending() {
            self.progress_attempts = 0;
            self.send_progress(now, out);
            self.arm_retransmit(out);
        }
    }

    /// A new epoch: what servers took in under earlier ones counts no more (a server may have
    /// crashed with it, and a process restarted under the same id, and at the same place on
    /// the ring, does not hold it). Every such slice goes back to the window and is sent
    /// again; a server that still holds it says so at once.
    fn untake_before(&mut self, epoch: Epoch) {
        for request in self.requests.values_mut() {
            for slice in request.open.values_mut() {
                if slice.taken.is_some_and(|e| e < epoch) {
                    slice.taken = None;
                    slice.sent = false;
                    slice.attempts = 0;
                }
            }
        }
    }

    /// Takes back the open slices whose server is no longer the primary of all their keys, so
    /// that they are sliced again under the new ring.
    fn reslice_moved(&mut self, id: RequestId) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Some(request) = self.requests.get_mut(&id) else {
            return;
        };
        let moved: Vec<SliceId> = request
            .open
            .iter()
            .filter(|(_, s)| !primary_of_all(cluster, s.server, &s.part))
            .map(|(&sid, _)| sid)
            .collect();
        if moved.is_empty() {
            return;
        }
        let parts: Vec<Part<V>> = moved
            .iter()
            .filter_map(|sid| request.open.remove(sid))
            .map(|s| {
                if s.sent && s.taken.is_none() {
                    self.in_flight[usize::from(!request.is_push)] -= 1;
                }
                s.part
            })
            .collect();
        request.whole = merge_parts(parts, self.cfg.width);
    }
}

/// Every open slice of `request` was taken in by its server at `epoch`.
fn all_taken_at<V: Value>(request: &Request<V>, epoch: Epoch) -> bool {
    request.open.values().all(|s| s.taken == Some(epoch))
}

/// The retransmission timeout of a slice after `attempts` sends, stretched by up to a quarter
/// by a hash of the slice, so that workers that lost messages together do not retransmit in
/// lock-step. Deterministic: the same slice and attempt always get the same timeout.
fn jittered_rto(cfg: &WorkerConfig, request: RequestId, slice: SliceId, attempts: u8) -> Time {
    let rto = cfg.timing.rto(attempts);
    let words = [
        u64::from(cfg.id.0),
        request,
        u64::from(slice),
        u64::from(attempts),
    ];
    rto + crate::hash::hash_words(cfg.seed, &words) % (rto / 4 + 1)
}
