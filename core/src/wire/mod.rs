//! The messages nodes exchange and the envelope that carries them (ARCHITECTURE.md §2, §5).
//!
//! An embedder moves frames, not messages: [`crate::Driver`] encodes and decodes them with
//! [`crate::wire::Codec`]. These types are for what looks inside a frame: the model checker, which
//! drives the node structs with envelopes, tests, fuzzing, and tools that inspect traffic.
//!
//! ```
//! use pserver_core::ring::{Ring, RingConfig};
//! use pserver_core::wire::{Envelope, Message, Push, SliceRef};
//! use pserver_core::{KvPairs, NodeId};
//! use pserver_core::wire::Codec;
//! let ring = Ring::new((0..3).map(NodeId), RingConfig::default())?;
//! let kvs = KvPairs::new(vec![10, 20], vec![0.5f32, -1.0], 1)?;
//! let slice = SliceRef { request: 1, slice: 0 };
//! let push = Message::Push(Push { slice, iteration: 0, covers: pserver_core::pace::Coverage::WHOLE, settled_below: 0, kvs });
//! let env = Envelope::new(NodeId(7), ring.primary(10), 1, push);
//! let frame = Codec::default().encode(&env)?;
//! assert_eq!(Codec::default().decode::<f32>(&frame)?, env);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod codec;
mod exponents;
mod first_use;
mod message;
mod palette;
mod rows;

pub use codec::{Codec, DEFAULT_MAX_FRAME, DecodeError, EncodeError, FrameParts};
pub use message::{
    AppliedSpan, BufferedPush, ClockRecord, DedupeRecord, Envelope, Message, PROTOCOL_VERSION,
    Pull, PullCached, PullReply, PullRows, PullValues, Push, PushCached, Replicate, ShardAck,
    ShardCopy, ShardUpdate, SliceId, SliceRef, StandbyState, Transfer,
};
pub use message::{Checkpoints, ClusterConfig, RequestId};
pub use rows::RowValues;
/// The in-place vector of [`DedupeRecord::applied`] and [`Replicate::dedupe`].
pub use smallvec::{SmallVec, smallvec};

pub use crate::trailer::TRAILER_ALIGN;
