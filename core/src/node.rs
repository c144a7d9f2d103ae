//! The node-level surface: the state machines and their own inputs and outputs, below the
//! [`Driver`](crate::Driver) (ARCHITECTURE.md §1).
//!
//! [`JobSpec`](crate::JobSpec) builds every node of a job with its settings; build one here
//! by hand for what a job description does not say: a server over a store of your own
//! ([`Server::with_store`]) or with an [`UpdateRule`](crate::UpdateRule) of your own.
//!
//! Every node kind takes `on_message(now, envelope, &mut effects)` and `on_timer(now, timer,
//! &mut effects)` and records what it wants done (sends, timer commands, events) in
//! [`Effects`]. A driver carries those effects out; the model checker drives the node structs
//! directly instead, so that it sees every timer command and may fire timers in any order.
//! An embedder that only runs jobs does not need this module.

pub use crate::clock::RangeClock;
pub use crate::coordinator::{Coordinator, CoordinatorConfig, CoordinatorError};
pub use crate::driver::Node;
pub use crate::effects::{Effects, TimerCmd, TimerId};
pub use crate::events::NoGrant;
pub use crate::events::Wait;
pub use crate::ids::{EPOCHS_PER_TERM, NodeLayout, Standbys, TooManyStandbys, first_epoch_of_term};
pub use crate::server::{CheckpointError, RangeRead, Server, ServerConfig, StartFromError};
pub use crate::status::Phase;
pub use crate::worker::{DEFAULT_MAX_SLICE_BYTES, Worker, WorkerConfig};
