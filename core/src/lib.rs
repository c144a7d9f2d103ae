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
//! - [`Node`], [`Driver`]: any node, and the sans-IO driver that carries out its effects.
//!
//! ## Driving nodes
//!
//! Every node has the same shape: `on_message(now, envelope, &mut effects)` and
//! `on_timer(now, timer, &mut effects)` in, sends, timer commands and events out through
//! [`Effects`]. Nobody needs to carry out effects by hand: a [`Driver`] wraps any [`Node`] with
//! its timer table and the codec, and is the one way every stack drives nodes (the simulator,
//! the async runtime of `pserver-transport`, and your own loop). Bytes and time in
//! ([`Driver::handle_frame`], [`Driver::handle_timeout`]), bytes, deadlines and events out
//! ([`Driver::poll_transmit`], [`Driver::poll_timeout`], [`Driver::poll_event`]); the
//! [`Driver`] docs show a whole cluster on a queue. The model checker alone drives the node
//! structs directly, so that it can fire timers in any order it likes.
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
mod driver;
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
mod slicing;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod timing;
mod updater;
mod value;
mod wire;
mod worker;

pub use clock::RangeClock;
pub use codec::{Codec, DEFAULT_MAX_FRAME, DecodeError, EncodeError, FrameParts, TRAILER_ALIGN};
pub use consistency::{Consistency, ParseConsistencyError};
pub use coordinator::{Coordinator, CoordinatorConfig, CoordinatorError, Phase};
pub use dedupe::DedupeWindow;
pub use driver::{Driver, DriverError, Node, Refusals, Transmit};
pub use effects::{Effects, Event, Refusal, TimerCmd, TimerId};
pub use key::{InvalidRange, Key, KeyRange, MAX_KEY};
pub use kv::{KvError, KvPairs};
pub use message::{
    AppliedSpan, BadRangeList, BufferedPush, ClockRecord, ClusterConfig, DedupeRecord, Envelope,
    KeyList, KeySelection, Message, PROTOCOL_VERSION, Pull, PullReply, Push, RangeList, Replicate,
    RequestId, ShardAck, ShardUpdate, SliceId, SliceRef, Transfer,
};
#[cfg(feature = "mutations")]
pub use mutation::Mutation;
pub use node::{Epoch, Iteration, NodeId, NodeLayout, Role, Time};
pub use ring::{MAX_SERVERS, MAX_VNODES, Ring, RingConfig, RingError};
pub use server::{Server, ServerConfig};
pub use store::{OrderedStore, ParamStore, RowVisitor, RowsUpdate, RunVisitor};
pub use timing::Timing;
pub use updater::{UpdateRule, Updater};
pub use value::Value;
pub use worker::{DEFAULT_MAX_SLICE_BYTES, Worker, WorkerConfig, WorkerError};

/// The byte buffer frames travel in, re-exported so that embedders use the same version.
pub use bytes::{self, Bytes};
