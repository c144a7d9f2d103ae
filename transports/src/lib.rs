//! # pserver-transport
//!
//! How frames move between pserver nodes. The protocol core never touches the network: its
//! `Driver` hands out encoded frames addressed to a [`NodeId`] and takes in frames from one. A
//! [`Transport`] carries them:
//!
//! - [`mem`]: tokio channels inside one process, with seeded faults;
//! - [`tcp`]: authenticated TCP connections between processes;
//! - [`udp`]: datagrams below the MTU, reassembled, optionally authenticated.
//!
//! The event loop that drives nodes over a transport, and the handles an application pushes and
//! pulls through, are the `pserver-runtime` crate's. ARCHITECTURE.md §6 describes how they fit
//! together.

mod address;
pub mod mem;
#[cfg(not(loom))]
pub mod refusal_log;
pub mod sync;
pub mod tcp;
pub mod udp;

#[cfg(all(test, not(loom)))]
mod test_logs;

pub use address::{Address, AddressError};
pub use bytes::{self, Bytes};
/// The protocol core whose types this crate's API takes and gives.
pub use pserver_core;

use async_trait::async_trait;
use pserver_core::NodeId;
use pserver_core::wire::FrameParts;
use thiserror::Error;

/// Why a transport could not send or receive.
#[derive(Debug, Error)]
pub enum TransportError {
    /// The destination is not a node this transport knows how to reach.
    #[error("no route to node {0}: it is not in this transport's peer table")]
    UnknownPeer(NodeId),
    /// The frame is larger than the transport (or its peer) accepts.
    #[error("frame of {len} bytes exceeds the transport limit of {limit} bytes")]
    FrameTooLarge {
        /// Frame size.
        len: usize,
        /// The transport's limit.
        limit: usize,
    },
    /// The transport has been shut down; no more frames will arrive.
    #[error("transport closed")]
    Closed,
    /// An operating-system I/O error, with what was being done when it happened.
    #[error("{context}: {source}")]
    Io {
        /// What the transport was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// How fast a worker may put requests on a transport ([`Transport::flow_limits`]). The runtime
/// takes, for each, the smaller of this and the job's own setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowLimits {
    /// The largest slice the transport carries well, in bytes as
    /// `WorkerConfig::max_slice_bytes` counts them; `None`: no limit of its own.
    pub max_slice_bytes: Option<usize>,
    /// Bytes of push slices, and separately of pull slices, on the network at once
    /// (`WorkerConfig::max_bytes_in_flight`); `None`: no limit of its own.
    pub max_bytes_in_flight: Option<u64>,
}

/// Moves whole frames between nodes. Delivery may lose, duplicate or reorder frames (the core's
/// retransmission and de-duplication make the protocol exactly-once over any of them), but a
/// frame that arrives arrives whole and unaltered.
///
/// Implementations are shared between the tasks of a node, hence `&self` and `Send + Sync`.
///
/// Two rules keep a node's event loop live whatever the network does:
///
/// - `send` never waits for the peer. When the way to a peer is congested or down, the
///   transport queues the frame within a bound and beyond it drops the frame; the core's
///   retransmission recovers what matters. A node that blocked on a slow peer could deadlock
///   with that peer blocking on it.
/// - `recv` is cancel-safe: the runtime selects on it beside timers and application commands,
///   and a `recv` future dropped before it completed must not lose a frame.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Sends `frame` to `to`. Returning `Ok` means the frame was handed to the network, not that
    /// it arrived.
    async fn send(&self, to: NodeId, frame: Bytes) -> Result<(), TransportError>;

    /// Sends the frame that is the concatenation of `frame`'s parts, as
    /// [`Transport::send`] does. The runtime sends every frame this way, its values lent
    /// rather than copied into one buffer ([`pserver_core::wire::Codec::encode_parts`]). The default
    /// joins the parts (one copy) and calls `send`; a transport that writes vectored sends them
    /// as they are.
    async fn send_parts(&self, to: NodeId, frame: FrameParts) -> Result<(), TransportError> {
        self.send(to, frame.into_bytes()).await
    }

    /// Waits for the next frame from any peer. The `NodeId` is the peer the transport received
    /// the frame from (authenticated, for transports that authenticate), which the runtime
    /// compares with the sender the frame claims.
    async fn recv(&self) -> Result<(NodeId, Bytes), TransportError>;

    /// What this transport asks of the workers that use it: a transport that loses a whole
    /// frame for one lost packet wants small slices, and one whose receiver drops what
    /// overflows its buffer wants fewer bytes on the network. Default: no limits.
    fn flow_limits(&self) -> FlowLimits {
        FlowLimits::default()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A loopback transport: every frame sent comes back from `recv`.
    struct Loopback {
        queue: Mutex<Vec<(NodeId, Bytes)>>,
    }

    #[async_trait]
    impl Transport for Loopback {
        async fn send(&self, to: NodeId, frame: Bytes) -> Result<(), TransportError> {
            self.queue
                .lock()
                .map_err(|_| TransportError::Closed)?
                .push((to, frame));
            Ok(())
        }
        async fn recv(&self) -> Result<(NodeId, Bytes), TransportError> {
            let mut q = self.queue.lock().map_err(|_| TransportError::Closed)?;
            if q.is_empty() {
                return Err(TransportError::Closed);
            }
            Ok(q.remove(0))
        }
    }

    #[tokio::test]
    async fn the_trait_is_object_safe_and_moves_frames_unaltered() {
        let t: Box<dyn Transport> = Box::new(Loopback {
            queue: Mutex::new(Vec::new()),
        });
        t.send(NodeId(2), Bytes::from_static(b"frame"))
            .await
            .unwrap();
        let (peer, frame) = t.recv().await.unwrap();
        assert_eq!((peer, &frame[..]), (NodeId(2), &b"frame"[..]));
        assert!(matches!(t.recv().await, Err(TransportError::Closed)));
    }

    #[test]
    fn errors_read_well_on_a_terminal() {
        let e = TransportError::FrameTooLarge { len: 10, limit: 4 };
        assert_eq!(
            e.to_string(),
            "frame of 10 bytes exceeds the transport limit of 4 bytes"
        );
        assert!(
            TransportError::UnknownPeer(NodeId(3))
                .to_string()
                .contains("n3")
        );
    }
}
