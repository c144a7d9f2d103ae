//! The TCP transport: one authenticated connection per pair of nodes, carrying length-prefixed
//! frames both ways.
//!
//! # What the secret protects
//!
//! Every node of a cluster holds the same secret. The handshake proves to each end that the
//! other holds it too, and which node it is, so a frame that
//! [`recv`](crate::Transport::recv) returns with node id `n` came over a connection that `n`
//! authenticated when it was opened.
//!
//! That is authentication of peers, **not** confidentiality: traffic is not encrypted, and
//! frames after the handshake carry no MAC, so anyone on the path can read them, and an
//! attacker able to rewrite TCP streams can tamper with an established connection. Run the
//! cluster on a network you trust for that (or under a tunnel that encrypts), and keep the
//! secret out of logs: [`Secret`]'s `Debug` never shows it.
//!
//! # Handshake
//!
//! The dialer speaks first; the acceptor answers only a dialer it has checked, and proves
//! itself only to a dialer that has proven itself. Integers are little-endian.
//!
//! ```text
//! hello  = magic "PSRVTCP1" (8 bytes) | protocol version (u16) | node id (u32)
//!          | nonce (32 bytes, fresh from the OS) | cluster id length (u16, <= 256) | cluster id
//! proof  = HMAC-SHA256(secret, "pserver-tcp-proof-v1" | side ("D" or "A") | version (u16)
//!          | cluster id length (u64) | cluster id | dialer id (u32) | acceptor id (u32)
//!          | dialer nonce | acceptor nonce)                             (32 bytes)
//!
//! dialer  -> acceptor : hello
//! acceptor            : checks magic, version, cluster id, that the id is a peer and not its own
//! acceptor -> dialer  : hello
//! dialer              : same checks, and that the acceptor is the node it meant to dial
//! dialer  -> acceptor : proof (side "D")
//! acceptor            : verifies in constant time, else "authentication failed: wrong secret"
//! acceptor -> dialer  : proof (side "A")
//! dialer              : verifies
//! ```
//!
//! The hello's fixed part is read first and the cluster id's length checked before anything is
//! allocated for it. Both nonces are fresh, so a recorded proof is worthless on another
//! connection; the side in the transcript keeps a proof from being reflected to its sender.
//! The whole handshake must finish within [`TcpConfig::handshake_timeout`]. A refused
//! handshake is logged with `tracing::warn!` (reason and remote address), counted in
//! [`TcpStats::handshakes_refused`], and the connection closed: nothing it sent reaches `recv`.
//!
//! # Framing
//!
//! After the handshake each direction is a sequence of frames: a u32 length, then that many
//! bytes. The length is checked against [`TcpConfig::max_frame`] before anything is allocated;
//! a larger one, a stream that ends mid-frame, or a frame that takes longer than
//! [`TcpConfig::frame_timeout`] from its first byte closes the connection (logged, counted in
//! [`TcpStats::bad_framing_closes`]). A zero-length frame is a keepalive and never delivered.
//! Each frame is read into a buffer of its own, so that the values trailer of a core frame sits
//! at an aligned address and the decoder reads the values where they arrived (ARCHITECTURE.md
//! §5). The writer drains every frame queued for a peer into one vectored write: small parts are
//! gathered with the length prefixes, large parts (a push's values, lent by the runtime) are
//! written from where they are. Every socket has `TCP_NODELAY` set, so that a small frame (an
//! acknowledgement, a heartbeat) does not wait for the peer to acknowledge the one before.
//!
//! # Connections
//!
//! A node dials a peer when it first has a frame for it, and redials (waiting
//! [`TcpConfig::reconnect_min`], doubling up to [`TcpConfig::reconnect_max`]) when the
//! connection drops and frames wait. If both nodes dial at once, both keep the connection
//! dialed by the lower node id; the other one stops carrying new frames, delivers what was
//! already sent on it, and closes. A node that dials again replaces its own earlier connection.
//! When a peer dials although this node holds a connection dialed by the lower id, this node
//! also sends a keepalive on the connection it holds: if the peer had restarted, that write
//! fails, and the peer's next dial gets through. Frames wait in a per-peer queue of
//! [`TcpConfig::send_queue`] frames; beyond that `send` drops them (counted in
//! [`TcpStats::frames_dropped`]), and the core's retransmission recovers.

#[cfg(not(loom))]
mod conn;
#[cfg(not(loom))]
mod handshake;
#[cfg(not(loom))]
mod peer;
#[cfg(not(loom))]
mod shared;
mod stats;
#[cfg(all(test, not(loom)))]
mod tests;
#[cfg(not(loom))]
mod transport;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use pserver_core::NodeId;

use pserver_core::wire::DEFAULT_MAX_FRAME;

use crate::Address;

pub use stats::TcpStats;
// tokio has no networking under loom: only the configuration and the counters (whose loom
// tests run there) are built then.
#[cfg(not(loom))]
pub use transport::{SHUTDOWN_FLUSH, TcpTransport};

/// The secret shared by every node of a cluster, from which each connection's proofs are made.
///
/// Its `Debug` output is `Secret(..)`: the bytes never reach a log.
///
/// ```
/// use pserver_transport::tcp::Secret;
/// let s = Secret::new(b"correct horse battery staple".to_vec());
/// assert_eq!(format!("{s:?}"), "Secret(..)");
/// ```
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps the secret's bytes (read from a file by the caller, typically).
    pub fn new(bytes: Vec<u8>) -> Self {
        Secret(bytes)
    }

    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// How a [`TcpTransport`] binds, authenticates and paces its connections.
///
/// [`TcpConfig::new`] takes what has no sensible default; the other fields start at the values
/// their docs give and may be changed before [`TcpTransport::bind`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TcpConfig {
    /// This node.
    pub id: NodeId,
    /// The address to listen on; port 0 picks a free port (see [`TcpTransport::local_addr`]).
    pub listen: SocketAddr,
    /// Every node this one may talk to, with the address to dial it at: an IP address, or a
    /// host name resolved again on every dial. Connections from nodes not listed are refused.
    /// An entry for `id` itself is ignored.
    pub peers: BTreeMap<NodeId, Address>,
    /// The cluster's name, at most 256 bytes; nodes of another cluster are refused.
    pub cluster_id: String,
    /// The shared secret.
    pub secret: Secret,
    /// The largest frame sent or accepted, in bytes. Default: [`DEFAULT_MAX_FRAME`] + 64.
    pub max_frame: usize,
    /// The wait before the first redial of a peer. Default: 50 ms.
    pub reconnect_min: Duration,
    /// The longest wait between redials; the wait doubles from `reconnect_min` up to this.
    /// Default: 2 s.
    pub reconnect_max: Duration,
    /// How long a connection may take to connect and complete the handshake. Default: 2 s.
    pub handshake_timeout: Duration,
    /// How long a frame may take from its first byte to its last, and a batch of frames to be
    /// written; a slower connection is closed. Default: 10 s.
    pub frame_timeout: Duration,
    /// Frames queued per peer (while connecting, or while the connection is busy) before
    /// `send` drops them. Default: 1024.
    pub send_queue: usize,
}

impl TcpConfig {
    /// A configuration with the default limits and timeouts.
    pub fn new<A: Into<Address>>(
        id: NodeId,
        listen: SocketAddr,
        peers: impl IntoIterator<Item = (NodeId, A)>,
        cluster_id: impl Into<String>,
        secret: Secret,
    ) -> Self {
        TcpConfig {
            id,
            listen,
            peers: peers.into_iter().map(|(n, a)| (n, a.into())).collect(),
            cluster_id: cluster_id.into(),
            secret,
            max_frame: DEFAULT_MAX_FRAME + 64,
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(2),
            frame_timeout: Duration::from_secs(10),
            send_queue: 1024,
        }
    }
}
