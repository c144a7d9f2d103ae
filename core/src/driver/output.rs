//! What a driver hands its embedder: one stream of frames to send and events to see, ended by
//! the time to come back (ARCHITECTURE.md §1).

use bytes::Bytes;

use crate::effects::Event;
use crate::ids::{NodeId, Time};
use crate::value::Value;

/// A frame to send, to `to`: the encoded envelope ([`Bytes`]), its parts
/// ([`crate::wire::FrameParts`]), or its length in the caller's buffer, by how it was polled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit<F = Bytes> {
    /// The addressee.
    pub to: NodeId,
    /// The frame.
    pub frame: F,
}

/// The next thing a driver has for its embedder ([`crate::Driver::poll_output`]). Poll until
/// [`Output::Wait`]: the frames and events before it are all there is, and nothing new comes
/// until a frame arrives, the embedder calls the node, or `until` passes.
#[derive(Clone, Debug, PartialEq)]
#[must_use = "a frame not sent never reaches its peer, and an event not seen is lost"]
pub enum Output<V: Value, F = Bytes> {
    /// Send this frame.
    Transmit(Transmit<F>),
    /// The application should know this.
    Event(Event<V>),
    /// Nothing more for now: call [`crate::Driver::handle_timeout`] at `until` (no timer is
    /// set if `None`), or sooner when a frame arrives.
    Wait {
        /// The earliest timer deadline.
        until: Option<Time>,
    },
}

impl<V: Value, F> Output<V, F> {
    /// The same output, its frame made another thing by `f`.
    pub fn map_frame<G>(self, f: impl FnOnce(F) -> G) -> Output<V, G> {
        match self {
            Output::Transmit(Transmit { to, frame }) => Output::Transmit(Transmit {
                to,
                frame: f(frame),
            }),
            Output::Event(event) => Output::Event(event),
            Output::Wait { until } => Output::Wait { until },
        }
    }
}
