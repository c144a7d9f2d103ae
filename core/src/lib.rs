//! # pserver-core
//!
//! The sans-IO protocol core of pserver, a parameter server after Li et al., "Scaling
//! Distributed Machine Learning with the Parameter Server" (OSDI 2014): sparse key-range push
//! and pull, consistency models, exactly-once delivery, replication, failure detection and
//! elastic membership.
//!
//! Nothing in this crate opens a socket, reads a clock, spawns a thread or draws from a global
//! random source: bytes and time go in, bytes, deadlines and events come out. The same code
//! runs in the model checker, the deterministic simulator, the async runtime of
//! `pserver-runtime` and your own network stack, and every run replays from its inputs.
//!
//! ## A cluster
//!
//! A job has one [`Coordinator`](node::Coordinator) (membership, the ring of key ranges, the epoch), servers
//! ([`Server`](node::Server): they hold the parameters, sharded by key range and replicated) and workers
//! ([`Worker`](node::Worker): the application's side, which pushes updates and pulls parameters). A
//! [`JobSpec`] describes the whole job once (its nodes, ring, consistency model, timing,
//! message limits and the servers' update rule), refuses a job that cannot work with a
//! [`JobError`], and builds each node inside the [`Driver`] that runs it:
//!
//! ```
//! use pserver_core::{Consistency, Driver, JobSpec};
//! let mut job = JobSpec::new(2, 3); // nodes n0 (coordinator), n1-n2 (servers), n3-n5
//! job.consistency = Consistency::BoundedDelay(1);
//! job.ring.replicas = 1;
//! let nodes: Vec<Driver<f32>> = job
//!     .node_ids()
//!     .into_iter()
//!     .map(|id| job.driver(id, 0))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(nodes.len(), 6);
//! # Ok::<(), pserver_core::JobError>(())
//! ```
//!
//! Each node can also be built by hand from its own configuration
//! ([`CoordinatorConfig`](node::CoordinatorConfig), [`ServerConfig`](node::ServerConfig), [`WorkerConfig`](node::WorkerConfig)), which is what `JobSpec` does.
//!
//! ## The driving loop
//!
//! A driver is fed and drained; it never blocks and never reads a clock. [`Time`] is
//! nanoseconds from an origin of your choosing, and must not go backwards.
//!
//! 1. Once: [`Driver::start`] (the node registers with the coordinator).
//! 2. When a frame arrives from peer `from`: [`Driver::handle_frame`] (from a buffer you
//!    reuse) or [`Driver::handle_frame_bytes`] (from a buffer of its own, not copied).
//! 3. When the deadline has passed: [`Driver::handle_timeout`].
//! 4. After each of those, and after each call of the application: poll
//!    [`Driver::poll_output`] until it says [`Output::Wait`]. Send each
//!    [`Output::Transmit`] to its addressee, hand each [`Output::Event`] to the application,
//!    and come back at the deadline `Wait` gives, or when a frame arrives.
//! 5. When the transport could not send a frame (it knows, as a datagram socket often does):
//!    [`Driver::send_failed`], and the worker resends there less often.
//!
//! A worker's application borrows the worker's calls from its driver ([`Driver::worker`]:
//! [`WorkerCalls::push`](driver::WorkerCalls::push), [`WorkerCalls::pull`](driver::WorkerCalls::pull), [`WorkerCalls::advance`](driver::WorkerCalls::advance)) once the worker
//! said [`Event::Ready`], and learns of their completion through [`Event::Worker`] events:
//! [`WorkerEvent::PushDone`](events::WorkerEvent::PushDone) (the push counts for its iteration),
//! [`WorkerEvent::PushDurable`](events::WorkerEvent::PushDurable) (every replica holds it), [`WorkerEvent::PullDone`](events::WorkerEvent::PullDone) (the
//! values), [`WorkerEvent::Advanced`](events::WorkerEvent::Advanced) (the next iteration began, as soon as the consistency
//! model allows). A server's calls (reading values, checkpoints) are borrowed the same way
//! ([`Driver::server`]), and a server's driver has no push to call. Input a node will not use
//! is never dropped silently: it is reported as [`Event::Refused`] and counted in
//! [`Driver::refusals`]; nor is output that does not fit the codec's frames
//! ([`Event::Unencodable`]). Give the driver a codec whose frame limit your transport carries
//! ([`Driver::with_codec`], or [`JobSpec::max_frame`], which [`JobSpec::validate`] checks
//! against [`JobSpec::smallest_frame`]): the driver fits workers' slices, servers' answers,
//! copies and replication batches to it.
//!
//! Failures reach every node: [`Event::NodeDead`] once a configuration drops a node that did
//! not leave, [`Event::RangeLost`] for each range every holder of failed, and, where the job
//! sets [`Timing::stall_limit`], a worker's [`Event::Worker`] `Stalled` naming what its
//! oldest request waits for.
//!
//! Here is the whole loop for a coordinator, one server and one worker, with a "network" that
//! delivers every frame a millisecond after it is sent:
//!
//! ```
//! use std::collections::VecDeque;
//! use pserver_core::{Driver, Event, JobSpec, KeyList, KeySelection, KvPairs, Output, Time};
//! use pserver_core::events::WorkerEvent::{Advanced, PullDone, PushDone};
//!
//! let job = JobSpec::new(1, 1); // n0 coordinator, n1 server, n2 worker
//! let mut nodes: Vec<Driver<f64>> = job
//!     .node_ids()
//!     .into_iter()
//!     .map(|id| job.driver(id, 0))
//!     .collect::<Result<_, _>>()?;
//! const MS: Time = 1_000_000;
//! let mut now: Time = 0;
//! for node in &mut nodes {
//!     node.start(now);
//! }
//! // Frames on the wire: (arrival, from, to, bytes).
//! let mut wire = VecDeque::new();
//! let (mut push, mut pull, mut pulled) = (None, None, None);
//! let mut deadlines = vec![None; nodes.len()];
//! while pulled.is_none() && now < 10_000 * MS {
//!     // Out: frames to the wire, events to the application, until each node says to wait.
//!     for (i, node) in nodes.iter_mut().enumerate() {
//!         deadlines[i] = loop {
//!             match node.poll_output() {
//!                 Output::Transmit(t) => wire.push_back((now + MS, node.id(), t.to, t.frame)),
//!                 // Registered and configured: push 1.5 to key 7.
//!                 Output::Event(Event::Ready { .. }) if i == 2 => {
//!                     let kvs = KvPairs::new(vec![7], vec![1.5], 1)?;
//!                     push = Some(node.worker()?.push(now, kvs)?);
//!                 }
//!                 Output::Event(Event::Worker(PushDone(id))) if Some(id) == push => {
//!                     node.worker()?.advance(now)?;
//!                 }
//!                 // In the next iteration: read key 7 back.
//!                 Output::Event(Event::Worker(Advanced(_))) => {
//!                     let keys = KeySelection::Keys(KeyList::new(vec![7])?);
//!                     pull = Some(node.worker()?.pull(now, keys)?);
//!                 }
//!                 Output::Event(Event::Worker(PullDone(id, kvs))) if Some(id) == pull => {
//!                     pulled = Some(kvs);
//!                 }
//!                 Output::Event(_) => {}
//!                 Output::Wait { until } => break until,
//!             }
//!         };
//!     }
//!     // In: the next thing to happen, a frame arriving or a timer firing.
//!     let timer = deadlines.iter().flatten().min().copied();
//!     let frame = wire.front().map(|f| f.0);
//!     if frame.is_some_and(|at| timer.is_none_or(|t| at <= t)) {
//!         let (at, from, to, bytes) = wire.pop_front().ok_or("no frame")?;
//!         now = now.max(at);
//!         nodes[to.0 as usize].handle_frame_bytes(now, from, &bytes);
//!     } else if let Some(t) = timer {
//!         now = now.max(t);
//!         for node in &mut nodes {
//!             node.handle_timeout(now);
//!         }
//!     } else {
//!         break;
//!     }
//! }
//! let pulled = pulled.ok_or("the pull never completed")?;
//! assert_eq!((pulled.keys(), pulled.values()), (&[7][..], &[1.5][..]));
//! assert_eq!(nodes.iter().map(|n| n.refusals().total()).sum::<u64>(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `core/examples/threads.rs` runs the same loop with a thread per node, and the
//! `pserver-runtime` crate runs it in an async runtime over TCP, UDP or in-memory channels.
//!
//! ## What else is here
//!
//! - The front door (this page): the job description, the driver and its events, keys and
//!   values ([`Key`], [`KeyRange`], [`KvPairs`], [`KeySelection`]),
//!   the job's settings ([`Consistency`], [`Timing`], [`Updater`], the [`UpdateRule`] trait
//!   for rules of your own) and the errors. Policies a job may add have modules of their own:
//! - [`filter`]: what workers leave out of or compress in their pushes and pulls
//!   ([`Filters`](filter::Filters): significantly-modified, key caching, KKT);
//! - [`pace`]: stragglers and the pace of a job
//!   ([`StragglerPolicy`](pace::StragglerPolicy): detection, skip-ahead, adaptive tau,
//!   shares moved by speed);
//! - [`slots`]: round-robin push slots ([`PushSlots`](slots::PushSlots)).
//!
//! And below the front door:
//! - [`ring`]: consistent hashing of key ranges onto servers, with replicas.
//! - [`store`]: the [`ParamStore`](store::ParamStore) trait servers keep their rows in, and
//!   the default layout.
//! - [`wire`]: the [`Codec`](wire::Codec) and the messages inside a frame, for transports
//!   and for tools that look at traffic.
//! - [`node`]: the state machines and their own surface below the driver (`on_message`,
//!   `on_timer`, [`Effects`](node::Effects)), which the model checker drives; build a node
//!   here by hand for a store or an update rule of your own.
//! - `testing` (feature `testing`) and `mutation` (feature `mutations`): what only the
//!   checkers in `pserver-models` and the fuzz targets use. Never needed to embed the core.
//!
//! ARCHITECTURE.md in the repository describes the protocol and its invariants.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[macro_use]
mod macros;

mod arena;
mod clock;
mod cluster;
mod consistency;
mod coordinator;
mod dedupe;
pub mod driver;
mod effects;
pub mod events;
pub mod filter;
mod forms;
mod hash;
mod ids;
mod job;
mod key;
mod kv;
#[cfg(feature = "mutations")]
pub mod mutation;
pub mod node;
pub mod pace;
pub mod ring;
mod selection;
mod server;
mod sizes;
mod slicing;
pub mod slots;
pub mod status;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod timing;
mod trailer;
mod updater;
mod value;
mod watch;
pub mod wire;
mod worker;

pub use consistency::{Consistency, ParseConsistencyError};
pub use driver::{Driver, DriverError, Output};
pub use events::Event;
pub use ids::{Epoch, Iteration, NodeId, Role, Time};
pub use job::{JobError, JobSpec};
pub use key::{InvalidRange, Key, KeyRange, MAX_KEY};
pub use kv::{KvError, KvPairs};
pub use selection::{BadRangeList, KeyList, KeySelection, RangeList};
pub use timing::Timing;
pub use updater::{UpdateRule, Updater};
pub use value::Value;
pub use wire::RequestId;
pub use worker::WorkerError;

/// The byte buffer frames travel in, re-exported so that embedders use the same version.
pub use bytes::Bytes;
