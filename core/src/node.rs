//! The node-level surface: the state machines' own inputs and outputs, below the
//! [`Driver`](crate::Driver) (ARCHITECTURE.md §1).
//!
//! Every node kind takes `on_message(now, envelope, &mut effects)` and `on_timer(now, timer,
//! &mut effects)` and records what it wants done (sends, timer commands, events) in
//! [`Effects`]. A driver carries those effects out; the model checker drives the node structs
//! directly instead, so that it sees every timer command and may fire timers in any order.
//! An embedder does not need this module.

pub use crate::clock::RangeClock;
pub use crate::coordinator::Phase;
pub use crate::driver::Node;
pub use crate::effects::{Effects, TimerCmd, TimerId};
pub use crate::ids::NodeLayout;
