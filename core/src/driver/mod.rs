//! The one way to drive a node: a sans-IO driver in the manner of quinn-proto.
//!
//! A [`Driver`] owns a [`Node`], its timer table, the codec and the queues between the node and
//! the world. Whoever embeds the core (the simulator, the async runtime, an application's own
//! event loop) only moves bytes and time:
//!
//! - a frame arrived: [`Driver::handle_frame`] (or [`Driver::handle_frame_bytes`]);
//! - the deadline passed: [`Driver::handle_timeout`];
//! - then poll [`Driver::poll_output`] until [`Output::Wait`]: frames to send, events the
//!   application should know, and the deadline to come back at.
//!
//! A role's own calls are borrowed from the driver: [`Driver::worker`] (push, pull,
//! advance), [`Driver::server`] (read, checkpoints). Input the driver or the node refuses is
//! never dropped silently: it is counted in [`Driver::refusals`] and reported as
//! [`Event::Refused`]. See ARCHITECTURE.md §1.
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
//! let push = nodes[2].worker()?.push(0, kvs)?;
//! // The "network": move every frame to its addressee until nobody has anything to say.
//! let mut events = Vec::new();
//! loop {
//!     let mut moved = false;
//!     for i in 0..nodes.len() {
//!         let from = nodes[i].id();
//!         loop {
//!             match nodes[i].poll_output() {
//!                 Output::Transmit(t) => {
//!                     nodes[t.to.0 as usize].handle_frame_bytes(0, from, &t.frame);
//!                     moved = true;
//!                 }
//!                 Output::Event(e) => events.push(e),
//!                 Output::Wait { .. } => break,
//!             }
//!         }
//!     }
//!     if !moved {
//!         break;
//!     }
//! }
//! assert!(events.contains(&Event::Worker(events::WorkerEvent::PushDone(push))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod node;
mod output;
mod roles;

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use thiserror::Error;

use crate::effects::{Effects, Event, Refusal, TimerCmd, TimerId};
use crate::ids::{NodeId, Role, Time};
use crate::store::{ParamStore, Store};
use crate::updater::{UpdateRule, Updater};
use crate::value::Value;
use crate::wire::{ClusterConfig, Envelope};
use crate::wire::{Codec, EncodeError, FrameParts};
use crate::worker::WorkerError;

pub use node::Node;
pub use output::{Output, Transmit};
pub use roles::{ServerCalls, WorkerCalls};

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
/// must not go backwards. The driver never reads a clock and never blocks.
#[derive(Clone, Debug)]
pub struct Driver<V: Value, U: UpdateRule<V> = Updater, S: ParamStore<V> = Store<V>> {
    node: Node<V, U, S>,
    io: Io<V>,
}

/// Everything of a driver but its node: what a call into the node leaves behind.
#[derive(Clone, Debug)]
struct Io<V: Value> {
    codec: Codec,
    timers: BTreeMap<TimerId, Time>,
    scratch: Effects<V>,
    outbox: VecDeque<Envelope<V>>,
    events: VecDeque<Event<V>>,
    refusals: Refusals,
    retransmissions: u64,
    send_failures: u64,
    /// The node's mutation, in force on this thread while the node is driven.
    #[cfg(feature = "mutations")]
    mutation: Option<crate::mutation::Mutation>,
}

impl<V: Value> Io<V> {
    /// The next envelope that `encode` accepts, as [`Output::Transmit`]; the ones refused on
    /// the way are counted and said as events.
    fn poll_frame<F>(
        &mut self,
        mut encode: impl FnMut(&Codec, &Envelope<V>) -> Result<F, EncodeError>,
    ) -> Option<Output<V, F>> {
        while let Some(env) = self.outbox.pop_front() {
            match encode(&self.codec, &env) {
                Ok(frame) => return Some(Output::Transmit(Transmit { to: env.to, frame })),
                Err(error) => {
                    self.refusals.unencodable += 1;
                    self.events
                        .push_back(Event::Unencodable { to: env.to, error });
                }
            }
        }
        None
    }

    /// Calls into the node with the effects to fill, and carries out what it asked for; with
    /// the `mutations` feature, with the node's mutation in force for the code it calls that
    /// holds no node (the coordinator's pace decisions).
    fn call<T>(&mut self, f: impl FnOnce(&mut Effects<V>) -> T) -> T {
        let mut out = core::mem::take(&mut self.scratch);
        #[cfg(feature = "mutations")]
        let result = crate::mutation::driving(self.mutation, || f(&mut out));
        #[cfg(not(feature = "mutations"))]
        let result = f(&mut out);
        self.absorb(out);
        result
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

    /// The next envelope that `encode` accepts, encoded, and its addressee, else the next
    /// event, else the time to come back.
    fn poll<F>(
        &mut self,
        encode: impl FnMut(&Codec, &Envelope<V>) -> Result<F, EncodeError>,
    ) -> Output<V, F> {
        if let Some(transmit) = self.poll_frame(encode) {
            return transmit;
        }
        match self.events.pop_front() {
            Some(event) => Output::Event(event),
            None => Output::Wait {
                until: self.timers.values().min().copied(),
            },
        }
    }
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
            io: Io {
                codec,
                timers: BTreeMap::new(),
                scratch: Effects::new(),
                outbox: VecDeque::new(),
                events: VecDeque::new(),
                refusals: Refusals::default(),
                retransmissions: 0,
                send_failures: 0,
                #[cfg(feature = "mutations")]
                mutation: None,
            },
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

    /// The worker's calls: push, pull, advance. Refused for a node that is not a worker.
    pub fn worker(&mut self) -> Result<WorkerCalls<'_, V>, DriverError> {
        let id = self.id();
        match &mut self.node {
            Node::Worker(worker) => Ok(WorkerCalls {
                worker,
                io: &mut self.io,
            }),
            _ => Err(DriverError::NotAWorker(id)),
        }
    }

    /// The server's calls: read, checkpoints, leave. Refused for a node that is not a server.
    pub fn server(&mut self) -> Result<ServerCalls<'_, V, U, S>, DriverError> {
        let id = self.id();
        match &mut self.node {
            Node::Server(server) => Ok(ServerCalls {
                server,
                io: &mut self.io,
            }),
            _ => Err(DriverError::NotAServer(id)),
        }
    }

    /// The codec in use.
    pub fn codec(&self) -> Codec {
        self.io.codec
    }

    /// Runs a deliberately broken protocol (see [`crate::mutation::Mutation`]), the node's own
    /// decisions and the coordinator's pace decisions alike.
    #[cfg(feature = "mutations")]
    pub fn set_mutation(&mut self, mutation: Option<crate::mutation::Mutation>) {
        self.io.mutation = mutation;
        match &mut self.node {
            Node::Server(s) => s.set_mutation(mutation),
            Node::Worker(w) => w.set_mutation(mutation),
            Node::Coordinator(c) => c.set_mutation(mutation),
        }
    }

    /// True when the node has nothing left to finish and nothing queued to send: a worker with
    /// no open request whose progress every server acknowledged; a server with no copy of its
    /// shards still to be written ([`crate::events::ServerEvent::CheckpointDue`]); a coordinator
    /// always.
    pub fn is_idle(&self) -> bool {
        self.io.outbox.is_empty()
            && match &self.node {
                Node::Worker(w) => w.is_idle(),
                Node::Server(s) => !s.writing_checkpoint(),
                Node::Coordinator(_) => true,
            }
    }

    /// Refused input so far.
    pub fn refusals(&self) -> Refusals {
        self.io.refusals
    }

    /// Messages the node sent again so far because they went unanswered (a worker's request
    /// slices and progress reports).
    pub fn retransmissions(&self) -> u64 {
        self.io.retransmissions
    }

    /// Sends the transport said failed so far ([`Driver::send_failed`]).
    pub fn send_failures(&self) -> u64 {
        self.io.send_failures
    }

    /// The transport could not send a frame to `to` (no route, the peer's port closed, a
    /// full buffer): a worker backs off what it resends there instead of resending it on the
    /// timeout of a send that never left ([`crate::node::Worker::send_failed`]); other nodes
    /// count it. Nothing is given up: the peer may be back, or the coordinator may move its
    /// ranges.
    pub fn send_failed(&mut self, now: Time, to: NodeId) {
        self.io.send_failures += 1;
        if let Node::Worker(worker) = &mut self.node {
            self.io.call(|out| worker.send_failed(now, to, out));
        }
    }

    /// Starts the node: registration (or failure detection, for the coordinator). Call once,
    /// first, or [`Driver::start_configured`] instead.
    pub fn start(&mut self, now: Time) {
        let node = &mut self.node;
        self.io.call(|out| node.start(now, out));
    }

    /// Starts the node with `config` in force (static membership).
    pub fn start_configured(&mut self, now: Time, config: ClusterConfig) {
        let node = &mut self.node;
        self.io.call(|out| node.start_configured(now, config, out));
    }

    /// A frame arrived from the transport's peer `from`, in a buffer the caller keeps (a
    /// socket's receive buffer, reused). Undecodable frames, frames claiming another sender
    /// and frames for another node are refused (counted, and reported as [`Event::Refused`]).
    ///
    /// The values of the frame's key-value pairs are copied out of `frame`, once; the rest is
    /// decoded in place. A transport that receives each frame into a buffer of its own hands
    /// it to [`Driver::handle_frame_bytes`] instead, which copies nothing.
    pub fn handle_frame(&mut self, now: Time, from: NodeId, frame: &[u8]) {
        let decoded = self.io.codec.decode::<V>(frame);
        self.handle_decoded(now, from, decoded);
    }

    /// A frame arrived from the transport's peer `from`, in a buffer of its own: as
    /// [`Driver::handle_frame`], but the values of the frame's key-value pairs are read where
    /// they are in `frame`, not copied ([`Codec::decode_bytes`]), so they go from the socket
    /// buffer to the store with no copy in between.
    pub fn handle_frame_bytes(&mut self, now: Time, from: NodeId, frame: &Bytes) {
        let decoded = self.io.codec.decode_bytes::<V>(frame);
        self.handle_decoded(now, from, decoded);
    }

    fn handle_decoded(
        &mut self,
        now: Time,
        from: NodeId,
        decoded: Result<Envelope<V>, crate::wire::DecodeError>,
    ) {
        match decoded {
            Ok(env) if env.from != from => self
                .io
                .refuse(from, Refusal::SpoofedSender { claimed: env.from }),
            Ok(env) => self.dispatch(now, env),
            Err(e) => self.io.refuse(from, Refusal::Undecodable(e)),
        }
    }

    /// An envelope arrived, already decoded: for checkers that skip the wire (feature
    /// `testing`).
    #[cfg(feature = "testing")]
    pub fn handle_message(&mut self, now: Time, env: Envelope<V>) {
        self.dispatch(now, env);
    }

    fn dispatch(&mut self, now: Time, env: Envelope<V>) {
        let node = &mut self.node;
        self.io.call(|out| node.on_message(now, env, out));
    }

    /// Fires every timer whose deadline is at or before `now`, earliest first. A timer the node
    /// sets again for a deadline at or before `now` fires on the next call, not in this one.
    pub fn handle_timeout(&mut self, now: Time) {
        let mut due: Vec<(Time, TimerId)> = self
            .io
            .timers
            .iter()
            .filter(|&(_, &at)| at <= now)
            .map(|(&t, &at)| (at, t))
            .collect();
        due.sort_unstable();
        for (at, timer) in due {
            // An earlier timer's handler may have moved or cancelled this one.
            if self.io.timers.get(&timer) != Some(&at) {
                continue;
            }
            self.io.timers.remove(&timer);
            let node = &mut self.node;
            self.io.call(|out| node.on_timer(now, timer, out));
        }
    }

    /// The earliest timer deadline, if any timer is set: call [`Driver::handle_timeout`] then.
    /// [`Output::Wait`] says it too, once everything else is out.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.io.timers.values().min().copied()
    }

    /// The next frame to send, else the next event for the application, else
    /// [`Output::Wait`]: poll after every call into the driver until it says to wait. An
    /// envelope the codec cannot encode (larger than the frame limit) is not sent; it is
    /// counted in [`Refusals::unencodable`] and said with [`Event::Unencodable`].
    pub fn poll_output(&mut self) -> Output<V> {
        self.io.poll(Codec::encode)
    }

    /// As [`Driver::poll_output`], but a frame is written into `buf` (emptied first, its
    /// allocation kept) and [`Transmit::frame`] is its length: a transport that sends from a
    /// buffer of its own allocates nothing per frame for it.
    pub fn poll_output_into(&mut self, buf: &mut Vec<u8>) -> Output<V, usize> {
        self.io.poll(|codec, env| {
            buf.clear();
            codec.encode_into(env, buf).map(|()| buf.len())
        })
    }

    /// As [`Driver::poll_output`], but a frame comes in parts ([`Codec::encode_parts`]): the
    /// values of its key-value pairs are lent from where the node keeps them instead of
    /// copied into the frame, for a transport that writes vectored.
    pub fn poll_output_parts(&mut self) -> Output<V, FrameParts> {
        self.io.poll(Codec::encode_parts)
    }

    /// As [`Driver::poll_output`], but an envelope is handed over as it is, not encoded: for
    /// checkers that skip the wire (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn poll_output_message(&mut self) -> Output<V, Envelope<V>> {
        self.io.poll(|_, env| Ok(env.clone()))
    }

    /// The next frame to send, leaving events where they are: for checkers that look at one
    /// queue at a time (feature `testing`). An embedder polls [`Driver::poll_output`], which
    /// cannot be drained in part.
    #[cfg(feature = "testing")]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        match self.io.poll_frame(Codec::encode) {
            Some(Output::Transmit(t)) => Some(t),
            _ => None,
        }
    }

    /// The next event, leaving frames where they are: for checkers (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn poll_event(&mut self) -> Option<Event<V>> {
        self.io.events.pop_front()
    }

    /// Takes the driven server or worker out of the job (see [`ServerCalls::leave`] and
    /// [`WorkerCalls::leave`]).
    pub fn leave(&mut self) -> Result<(), DriverError> {
        match self.node.role() {
            Role::Server => {
                self.server()?.leave();
                Ok(())
            }
            Role::Worker => self.worker()?.leave(),
            Role::Coordinator => Err(DriverError::CannotLeave(self.id())),
        }
    }
}
