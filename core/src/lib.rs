//! # pserver-core
//!
//! The sans-IO protocol core of pserver, a parameter server after Li et al., "Scaling Distributed
//! Machine Learning with the Parameter Server" (OSDI 2014).
//!
//! Nothing in this crate opens a socket, reads a clock, spawns a thread or draws from a global
//! random source: time and bytes come in, bytes and timers go out. That makes the same code
//! usable inside the model checker, the deterministic simulator, the async runtime and a user's
//! own network stack, and makes every run replayable from its inputs.
//!
//! The vocabulary:
//!
//! - [`NodeId`], [`Role`]: who is talking.
//! - [`Key`], [`KeyRange`]: the key space `[0, u64::MAX)` and half-open ranges of it.
//! - [`Value`]: the parameter scalars `f32`, `f64`, `i64`.
//! - [`KvPairs`]: sparse vectors, the unit of push and pull.
//! - [`RangeClock`]: the paper's range vector clock.
//! - [`Ring`]: consistent hashing of key ranges onto servers, with replicas.
//! - [`Envelope`], [`Message`], [`Codec`]: the wire protocol.
//! - [`Coordinator`], [`Server`], [`Worker`]: the node state machines; they write what they want
//!   done into [`Effects`].
//! - [`sim`]: the deterministic simulator that runs whole clusters under faults.
//!
//! ## Driving nodes
//!
//! Every node has the same shape: `on_message(now, envelope, &mut effects)` and
//! `on_timer(now, timer, &mut effects)` in, and after each call the driver sends
//! `effects.sends`, applies `effects.timers` and hands `effects.events` to the application. Here
//! the "network" is a queue and time stands still:
//!
//! ```
//! use std::collections::VecDeque;
//! use pserver_core::*;
//!
//! let timing = Timing::default();
//! let (c, s, w) = (NodeId(0), NodeId(1), NodeId(2));
//! let mut coordinator = Coordinator::new(CoordinatorConfig {
//!     id: c, servers: 1, workers: 1, consistency: Consistency::Sequential, timing,
//!     ring: RingConfig { vnodes: 8, replicas: 0, seed: 0 },
//! })?;
//! let mut server: Server<f32> =
//!     Server::new(ServerConfig { id: s, coordinator: c, width: 1, timing }, Updater::Sum);
//! let mut worker: Worker<f32> =
//!     Worker::new(WorkerConfig { id: w, coordinator: c, width: 1, timing });
//!
//! let mut out = Effects::new();
//! server.start(0, &mut out);
//! worker.start(0, &mut out);
//! let mut net: VecDeque<Envelope<f32>> = out.sends.drain(..).collect();
//! let mut events = Vec::new();
//! while let Some(env) = net.pop_front() {
//!     let mut out = Effects::new();
//!     let to = env.to;
//!     match to {
//!         _ if to == c => coordinator.on_message(0, env, &mut out),
//!         _ if to == s => server.on_message(0, env, &mut out),
//!         _ => worker.on_message(0, env, &mut out),
//!     }
//!     let ready = out.events.iter().any(|e| matches!(e, Event::Ready { .. }));
//!     if to == w && ready {
//!         // The worker has its configuration: the application may start.
//!         let kvs = KvPairs::new(vec![3, 9], vec![0.5, 2.0], 1)?;
//!         worker.push(0, kvs, &mut out)?;
//!         worker.pull(0, KeySelection::Keys(KeyList::new(vec![9])?), &mut out)?;
//!     }
//!     net.extend(out.sends.drain(..));
//!     events.extend(out.events.drain(..));
//! }
//! assert!(events.contains(&Event::PushDone(1)));
//! let pulled = events.iter().find_map(|e| match e {
//!     Event::PullDone(2, kvs) => Some(kvs.clone()),
//!     _ => None,
//! });
//! // Sequential: a pull in iteration 0 needs nothing earlier, so it may or may not see the push.
//! assert!(pulled.is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## The wire
//!
//! ```
//! use pserver_core::*;
//! let ring = Ring::new((0..3).map(NodeId), RingConfig::default())?;
//! let kvs = KvPairs::new(vec![10, 20], vec![0.5f32, -1.0], 1)?;
//! let slice = SliceRef { request: 1, slice: 0 };
//! let push = Message::Push(Push { slice, iteration: 0, settled_below: 0, kvs });
//! let env = Envelope::new(NodeId(7), ring.primary(10), 1, push);
//! let frame = Codec::default().encode(&env)?;
//! assert_eq!(Codec::default().decode::<f32>(&frame)?, env);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[macro_use]
mod macros;

mod clock;
mod cluster;
mod codec;
mod consistency;
mod coordinator;
mod dedupe;
mod effects;
mod hash;
mod key;
mod kv;
mod message;
#[cfg(feature = "mutations")]
mod mutation;
mod node;
mod ring;
mod server;
pub mod sim;
mod slicing;
mod store;
mod timing;
mod updater;
mod value;
mod wire;
mod worker;

pub use clock::RangeClock;
pub use codec::{Codec, DEFAULT_MAX_FRAME, DecodeError, EncodeError};
pub use consistency::{Consistency, ParseConsistencyError};
pub use coordinator::{Coordinator, CoordinatorConfig, CoordinatorError};
pub use dedupe::DedupeWindow;
pub use effects::{Effects, Event, TimerCmd, TimerId};
pub use key::{InvalidRange, Key, KeyRange, MAX_KEY};
pub use kv::{KvError, KvPairs};
pub use message::{
    BadRangeList, ClockRecord, ClusterConfig, DedupeRecord, Envelope, KeyList, KeySelection,
    Message, PROTOCOL_VERSION, Pull, PullReply, Push, RangeList, Replicate, RequestId, SliceId,
    SliceRef, Transfer,
};
#[cfg(feature = "mutations")]
pub use mutation::Mutation;
pub use node::{Epoch, Iteration, NodeId, NodeLayout, Role, Time};
pub use ring::{MAX_SERVERS, MAX_VNODES, Ring, RingConfig, RingError};
pub use server::{Server, ServerConfig};
pub use store::{OrderedStore, ParamStore};
pub use timing::Timing;
pub use updater::{UpdateRule, Updater};
pub use value::Value;
pub use worker::{Worker, WorkerConfig, WorkerError};
