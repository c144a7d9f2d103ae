//! The one way to drive a node: a sans-IO driver in the manner of quinn-proto.
//!
//! A [`Driver`] owns a [`Node`], its timer table, the codec and the queues between the node and
//! the world. Whoever embeds the core (the simulator, the async runtime, an application's own
//! event loop) only moves bytes and time:
//!
//! - a frame arrived: [`Driver::handle_frame`];
//! - the deadline of [`Driver::poll_timeout`] passed: [`Driver::handle_timeout`];
//! - then drain [`Driver::poll_transmit`] (frames to send) and [`Driver::poll_event`] (what the
//!   application should know), and ask [`Driver::poll_timeout`] again.
//!
//! Input the driver or the node refuses is never dropped silently: it is counted in
//! [`Driver::refusals`] and reported as [`Event::Refused`]. See ARCHITECTURE.md §1.
//!
//! ```
//! use pserver_core::node::*;
//! use pserver_core::*;
//! let (c, s, w) = (NodeId(0), NodeId(1), NodeId(2));
//! let mut job = CoordinatorConfig::new(c, 1, 1);
//! job.ring.replicas = 0; // one server: nobody to replicate to
//! let coordinator = Coordinator::bootstrapped(job, &[s], &[w])?;
//! let config = coordinator.config().cloned().ok_or("no configuration")?;
//! let mut nodes: Vec<Driver<f32>> = vec![
//!     Driver::new(coordinator),
//!     Driver::new(Server::new(ServerConfig::new(s, c), Updater::Sum)),
//!     Driver::new(Worker::new(WorkerConfig::new(w, c))),
//! ];
//! for d in &mut nodes {
//!     d.start_configured(0, config.clone());
//! }
//! let kvs = KvPairs::new(vec![3, 9], vec![0.5, 2.0], 1)?;
//! let push = nodes[2].push(0, kvs)?;
//! // The "network": move every frame to its addressee until nobody has anything to say.
//! let mut events = Vec::new();
//! loop {
//!     let mut moved = false;
//!     for i in 0..nodes.len() {
//!         while let Some(t) = nodes[i].poll_transmit() {
//!             let from = nodes[i].id();
//!             nodes[t.to.0 as usize].handle_frame(0, from, &t.frame);
//!             moved = true;
//!         }
//!     }
//!     events.extend(std::iter::from_fn(|| nodes[2].poll_event()));
//!     if !moved {
//!         break;
//!     }
//! }
//! assert!(events.contains(&Event::PushDone(push)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod node;

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use thiserror::Error;

use crate::effects::{Effects, Event, Refusal, TimerCmd, TimerId};
use crate::ids::{Iteration, NodeId, Time};
use crate::key::{Key, KeyRange};
use crate::kv::KvPairs;
use crate::pace::Coverage;
use crate::selection::KeySelection;
use crate::server::{CheckpointError, RangeRead, Server};
use crate::store::{ParamStore, Store};
use crate::updater::{UpdateRule, Updater};
use crate::value::Value;
use crate::wire::{ClusterConfig, Envelope, RequestId, ShardCopy};
use crate::wire::{Codec, EncodeError, FrameParts};
use crate::worker::WorkerError;

pub use node::Node;

/// A frame to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The addressee.
    pub to: NodeId,
    /// The encoded envelope.
    pub frame: Bytes,
}

/// Why an application call on a driver failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The node is not a worker: only workers push, pull and advance.
    #[error("node {0} is not a worker: only workers push, pull and advance")]
    NotAWorker(NodeId),
    /// The coordinator cannot leave its own job.
    #[error("node {0} is the coordinator: only servers and workers leave a job")]
    CannotLeave(NodeId),
    /// The node holds no values: only servers are read.
    #[error("node {0} is not a server: only servers hold values to read")]
    NotAServer(NodeId),
    /// The worker refused the call.
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// How many messages were refused, by kind of reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Refusals {
    /// Frames that did not decode.
    pub undecodable: u64,
    /// Frames claiming another sender than the peer they came from.
    pub spoofed: u64,
    /// Messages addressed to another node.
    pub misaddressed: u64,
    /// Messages from nodes that are not members.
    pub unknown_sender: u64,
    /// Messages of an epoch the node has moved past.
    pub stale_epoch: u64,
    /// Configurations of a coordinator term older than the one the node follows.
    pub stale_term: u64,
    /// Terms asked for by standby coordinators and not granted.
    pub term_not_granted: u64,
    /// Messages of another job.
    pub foreign_job: u64,
    /// Every other refusal (unexpected kinds, bad answers, overflow, after fencing).
    pub other: u64,
    /// Envelopes the node produced that the codec could not encode (too large for a frame).
    pub unencodable: u64,
}

impl Refusals {
    fn count(&mut self, reason: &Refusal) {
        let slot = match reason {
            Refusal::Undecodable(_) => &mut self.undecodable,
            Refusal::SpoofedSender { .. } => &mut self.spoofed,
            Refusal::Misaddressed { .. } => &mut self.misaddressed,
            Refusal::UnknownSender => &mut self.unknown_sender,
            Refusal::StaleEpoch { .. } => &mut self.stale_epoch,
            Refusal::StaleTerm { .. } => &mut self.stale_term,
            Refusal::TermNotGranted { .. } => &mut self.term_not_granted,
            Refusal::ForeignJob => &mut self.foreign_job,
            _ => &mut self.other,
        };
        *slot += 1;
    }

    /// All refused input together (not counting `unencodable`, which is output).
    pub fn total(&self) -> u64 {
        self.undecodable
            + self.spoofed
            + self.misaddressed
            + self.unknown_sender
            + self.stale_epoch
            + self.stale_term
            + self.term_not_granted
            + self.foreign_job
            + self.other
    }
}

/// A node with its timer table, codec and queues: the sans-IO driver every stack uses.
///
/// Time is whatever the caller says it is (nanoseconds from an origin of its choosing), and
/// must not go backwards. The driver never reads a clock, never blocks and never allocates more
/// than what it queues.
#[derive(Clone, Debug)]
pub struct Driver<V: Value, U: UpdateRule<V> = Updater, S: ParamStore<V> = Store<V>> {
    node: Node<V, U, S>,
    codec: Codec,
    timers: BTreeMap<TimerId, Time>,
    scratch: Effects<V>,
    outbox: VecDeque<Envelope<V>>,
    events: VecDeque<Event<V>>,
    refusals: Refusals,
    retransmissions: u64,
    /// The node's mutation, in force on this thread while the node is driven.
    #[cfg(feature = "mutations")]
    mutation: Option<crate::mutation::Mutation>,
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Driver<V, U, S> {
    /// Drives `node` with the default codec.
    pub fn new(node: impl Into<Node<V, U, S>>) -> Self {
        Self::with_codec(node, Codec::default())
    }

    /// Drives `node`, encoding and decoding frames with `codec` (its frame limit).
    pub fn with_codec(node: impl Into<Node<V, U, S>>, codec: Codec) -> Self {
        let mut node = node.into();
        // A message the codec would refuse is a message its peer never gets.
        match &mut node {
            Node::Server(server) => server.fit_frames(codec.max_frame()),
            Node::Worker(worker) => worker.fit_frames(codec.max_frame()),
            Node::Coordinator(_) => {}
        }
        Driver {
            node,
            codec,
            timers: BTreeMap::new(),
            scratch: Effects::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            refusals: Refusals::default(),
            retransmissions: 0,
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }

    /// The driven node's id.
    pub fn id(&self) -> NodeId {
        self.node.id()
    }

    /// The driven node, to inspect.
    pub fn node(&self) -> &Node<V, U, S> {
        &self.node
    }

    /// Starts a server's job from `rows`, a saved model ([`crate::server::Server::start_from`]); before the
    /// driver is started. Refused for a node that is not a server.
    pub fn start_from<'a>(
        &mut self,
        rows: impl IntoIterator<Item = (Key, &'a [V])>,
    ) -> Result<(), crate::server::StartFromError> {
        match &mut self.node {
            Node::Server(server) => server.start_from(rows),
            _ => Err(crate::server::StartFromError::NotAServer),
        }
    }

    /// Offers the checkpoints the driven server holds whole, by cut, before it starts: a job
    /// whose servers all hold one resumes from the newest they share (see
    /// [`crate::node::Server::offer_checkpoints`], ARCHITECTURE.md §11).
    pub fn offer_checkpoints(&mut self, cuts: Vec<Iteration>) -> Result<(), CheckpointError> {
        match &mut self.node {
            Node::Server(server) => server.offer_checkpoints(cuts),
            _ => Err(CheckpointError::NotAServer),
        }
    }

    /// Says that the shards of `cut` the driven server handed out
    /// ([`Event::CheckpointDue`]) are written where they survive the process.
    pub fn checkpoint_written(&mut self, now: Time, cut: Iteration) -> Result<(), CheckpointError> {
        self.on_server(|s, out| s.checkpoint_written(now, cut, out))
    }

    /// Hands the driven server the shards it wrote at `cut`, which the job resumes from
    /// ([`Event::Restore`]); call before the next frame or timeout.
    pub fn restore(
        &mut self,
        now: Time,
        cut: Iteration,
        shards: Vec<ShardCopy<V>>,
    ) -> Result<(), CheckpointError> {
        self.on_server(|s, out| s.restore(now, cut, shards, out))
    }

    fn on_server<T>(
        &mut self,
        call: impl FnOnce(&mut Server<V, U, S>, &mut Effects<V>) -> Result<T, CheckpointError>,
    ) -> Result<T, CheckpointError> {
        let mut out = self.take_scratch();
        let result = match &mut self.node {
            Node::Server(server) => call(server, &mut out),
            _ => Err(CheckpointError::NotAServer),
        };
        self.absorb(out);
        result
    }

    /// The codec in use.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Runs a deliberately broken protocol (see [`crate::mutation::Mutation`]), the node's own
    /// decisions and the coordinator's pace decisions alike.
    #[cfg(feature = "mutations")]
    pub fn set_mutation(&mut self, mutation: Option<crate::mutation::Mutation>) {
        self.mutation = mutation;
        match &mut self.node {
            Node::Server(s) => s.set_mutation(mutation),
            Node::Worker(w) => w.set_mutation(mutation),
            Node::Coordinator(c) => c.set_mutation(mutation),
        }
    }

    /// True when the node has nothing left to finish and nothing queued to send: a worker with
    /// no open request whose progress every server acknowledged; a server with no copy of its
    /// shards still to be written ([`Event::CheckpointDue`]); a coordinator always.
    pub fn is_idle(&self) -> bool {
        self.outbox.is_empty()
            && match &self.node {
                Node::Worker(w) => w.is_idle(),
                Node::Server(s) => !s.writing_checkpoint(),
                Node::Coordinator(_) => true,
            }
    }

    /// A server's rows of `range`, where it leads them ([`Server::read`]): what an embedder
    /// reads to inspect or save values without reaching into the node.
    pub fn read(&self, range: KeyRange) -> Result<RangeRead<V>, DriverError> {
        match &self.node {
            Node::Server(server) => Ok(server.read(range)),
            _ => Err(DriverError::NotAServer(self.id())),
        }
    }

    /// Refused input so far.
    pub fn refusals(&self) -> Refusals {
        self.refusals
    }

    /// Messages the node sent again so far because they went unanswered (a worker's request
    /// slices and progress reports).
    pub fn retransmissions(&self) -> u64 {
        self.retransmissions
    }

    /// Starts the node: registration (or failure detection, for the coordinator). Call once,
    /// first, or [`Driver::start_configured`] instead.
    pub fn start(&mut self, now: Time) {
        let mut out = self.take_scratch();
        self.on_node(|node| node.start(now, &mut out));
        self.absorb(out);
    }

    /// Starts the node with `config` in force (static membership).
    pub fn start_configured(&mut self, now: Time, config: ClusterConfig) {
        let mut out = self.take_scratch();
        self.on_node(|node| node.start_configured(now, config, &mut out));
        self.absorb(out);
    }

    /// A frame arrived from the transport's peer `from`. Undecodable frames, frames claiming
    /// another sender and frames for another node are refused (counted, and reported as
    /// [`Event::Refused`]).
    ///
    /// The values of the frame's key-value pairs are read where they are in `frame`, not
    /// copied ([`Codec::decode_bytes`]): a transport that receives each frame into a buffer of
    /// its own gets them from its socket buffer to the store with no copy in between. Bytes
    /// held in a buffer of the embedder's go in with [`Bytes::copy_from_slice`].
    pub fn handle_frame(&mut self, now: Time, from: NodeId, frame: &Bytes) {
        match self.codec.decode_bytes::<V>(frame) {
            Ok(env) if env.from != from => {
                self.refuse(from, Refusal::SpoofedSender { claimed: env.from })
            }
            Ok(env) => self.dispatch(now, env),
            Err(e) => self.refuse(from, Refusal::Undecodable(e)),
        }
    }

    /// An envelope arrived, already decoded: for checkers that skip the wire (feature
    /// `testing`).
    #[cfg(feature = "testing")]
    pub fn handle_message(&mut self, now: Time, env: Envelope<V>) {
        self.dispatch(now, env);
    }

    fn dispatch(&mut self, now: Time, env: Envelope<V>) {
        let mut out = self.take_scratch();
        self.on_node(|node| node.on_message(now, env, &mut out));
        self.absorb(out);
    }

    /// Fires every timer whose deadline is at or before `now`, earliest first. A timer the node
    /// sets again for a deadline at or before `now` fires on the next call, not in this one.
    pub fn handle_timeout(&mut self, now: Time) {
        let mut due: Vec<(Time, TimerId)> = self
            .timers
            .iter()
            .filter(|&(_, &at)| at <= now)
            .map(|(&t, &at)| (at, t))
            .collect();
        due.sort_unstable();
        for (at, timer) in due {
            // An earlier timer's handler may have moved or cancelled this one.
            if self.timers.get(&timer) != Some(&at) {
                continue;
            }
            self.timers.remove(&timer);
            let mut out = self.take_scratch();
            self.on_node(|node| node.on_timer(now, timer, &mut out));
            self.absorb(out);
        }
    }

    /// The earliest timer deadline, if any timer is set: call [`Driver::handle_timeout`] then.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.values().min().copied()
    }

    /// The next frame to send. An envelope the codec cannot encode (larger than the frame
    /// limit) is skipped, counted in [`Refusals::unencodable`] and said with
    /// [`Event::Unencodable`].
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.poll_encoded(Codec::encode)
            .map(|(to, frame)| Transmit { to, frame })
    }

    /// The next envelope that `encode` accepts, encoded, and its addressee; the ones refused
    /// on the way are counted and said as events.
    fn poll_encoded<F>(
        &mut self,
        encode: impl Fn(&Codec, &Envelope<V>) -> Result<F, EncodeError>,
    ) -> Option<(NodeId, F)> {
        while let Some(env) = self.outbox.pop_front() {
            match encode(&self.codec, &env) {
                Ok(frame) => return Some((env.to, frame)),
                Err(error) => {
                    self.refusals.unencodable += 1;
                    self.events
                        .push_back(Event::Unencodable { to: env.to, error });
                }
            }
        }
        None
    }

    /// The next frame to send and its addressee, as [`Driver::poll_transmit`] gives it, but
    /// in parts ([`Codec::encode_parts`]): the values of its key-value pairs are lent from
    /// where the node keeps them instead of copied into the frame, for a transport that writes
    /// vectored.
    pub fn poll_transmit_parts(&mut self) -> Option<(NodeId, FrameParts)> {
        self.poll_encoded(Codec::encode_parts)
    }

    /// The next envelope to send, not encoded: for checkers that skip the wire (feature
    /// `testing`).
    #[cfg(feature = "testing")]
    pub fn poll_message(&mut self) -> Option<Envelope<V>> {
        self.outbox.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event<V>> {
        self.events.pop_front()
    }

    /// Pushes `kvs` from the driven worker (see [`crate::node::Worker::push`]).
    pub fn push(&mut self, now: Time, kvs: KvPairs<V>) -> Result<RequestId, DriverError> {
        self.on_worker(|w, out| w.push(now, kvs, out))
    }

    /// Pushes `kvs` as a part of the driven worker's iteration, covering `covers` of it with
    /// the parts before (see [`crate::node::Worker::push_part`]).
    pub fn push_part(
        &mut self,
        now: Time,
        kvs: KvPairs<V>,
        covers: Coverage,
    ) -> Result<RequestId, DriverError> {
        self.on_worker(|w, out| w.push_part(now, kvs, covers, out))
    }

    /// Says how fast the driven worker's application works (see
    /// [`crate::node::Worker::report_speed`]).
    pub fn report_speed(&mut self, per_sec: u32) -> Result<(), DriverError> {
        self.on_worker(|w, _| {
            w.report_speed(per_sec);
            Ok(())
        })
    }

    /// Pulls `keys` to the driven worker (see [`crate::node::Worker::pull`]).
    pub fn pull(&mut self, now: Time, keys: KeySelection) -> Result<RequestId, DriverError> {
        self.on_worker(|w, out| w.pull(now, keys, out))
    }

    /// Ends the driven worker's iteration (see [`crate::node::Worker::advance`]).
    pub fn advance(&mut self, now: Time) -> Result<(), DriverError> {
        self.on_worker(|w, out| w.advance(now, out))
    }

    /// Pushes what the driven worker's filters hold back (see
    /// [`crate::node::Worker::flush`]); `None` when they hold nothing.
    pub fn flush(&mut self, now: Time) -> Result<Option<RequestId>, DriverError> {
        self.on_worker(|w, out| w.flush(now, out))
    }

    /// What each of the driven worker's filters saved so far, by name (none for other
    /// nodes; see [`crate::node::Worker::filter_savings`]).
    pub fn filter_savings(&self) -> Vec<(&'static str, crate::filter::FilterSaving)> {
        self.node
            .as_worker()
            .map_or_else(Vec::new, |w| w.filter_savings())
    }

    /// Takes the driven server (once its ranges are held elsewhere, see
    /// [`crate::node::Server::leave`]) or worker ([`crate::node::Worker::leave`]) out of the job.
    pub fn leave(&mut self) -> Result<(), DriverError> {
        let id = self.id();
        let mut out = self.take_scratch();
        let result = match &mut self.node {
            Node::Server(s) => {
                s.leave(&mut out);
                Ok(())
            }
            Node::Worker(w) => w.leave(&mut out).map_err(DriverError::from),
            Node::Coordinator(_) => Err(DriverError::CannotLeave(id)),
        };
        self.absorb(out);
        result
    }

    fn on_worker<T>(
        &mut self,
        call: impl FnOnce(&mut crate::worker::Worker<V>, &mut Effects<V>) -> Result<T, WorkerError>,
    ) -> Result<T, DriverError> {
        let id = self.id();
        let mut out = self.take_scratch();
        let result = match self.node.as_worker_mut() {
            Some(w) => call(w, &mut out).map_err(DriverError::from),
            None => Err(DriverError::NotAWorker(id)),
        };
        self.absorb(out);
        result
    }

    /// Calls `f` on the node; with the `mutations` feature, with the node's mutation in force
    /// for the code it calls that holds no node (the coordinator's pace decisions).
    fn on_node<T>(&mut self, f: impl FnOnce(&mut Node<V, U, S>) -> T) -> T {
        #[cfg(feature = "mutations")]
        return crate::mutation::driving(self.mutation, || f(&mut self.node));
        #[cfg(not(feature = "mutations"))]
        f(&mut self.node)
    }

    fn take_scratch(&mut self) -> Effects<V> {
        core::mem::take(&mut self.scratch)
    }

    fn refuse(&mut self, from: NodeId, reason: Refusal) {
        self.refusals.count(&reason);
        self.events.push_back(Event::Refused { from, reason });
    }

    /// Carries out what the node asked for, keeping the effects' allocations for next time.
    fn absorb(&mut self, mut out: Effects<V>) {
        for cmd in out.timers.drain(..) {
            match cmd {
                TimerCmd::Set { timer, at } => {
                    self.timers.insert(timer, at);
                }
                TimerCmd::Cancel(timer) => {
                    self.timers.remove(&timer);
                }
            }
        }
        self.outbox.extend(out.sends.drain(..));
        self.retransmissions += core::mem::take(&mut out.retransmitted);
        for event in out.events.drain(..) {
            if let Event::Refused { reason, .. } = &event {
                self.refusals.count(reason);
            }
            self.events.push_back(event);
        }
        self.scratch = out;
    }
}
