//! The UDP transport's framing: frames cut into datagrams below the path MTU and put back together
//! at the receiver (ARCHITECTURE.md §6).
//!
//! A node has one socket. Every datagram carries one fragment of a frame: a 28-byte header, then at
//! most [`UdpConfig::max_payload`] bytes of payload ([`DEFAULT_MAX_PAYLOAD`], 1,400).
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `PSU1` |
//! | 4 | sender node id (u32, little-endian, as are all fields) |
//! | 8 | frame id, the sender's counter |
//! | 2 | fragment index |
//! | 2 | fragment count |
//! | 4 | frame length |
//! | 4 | CRC-32 of the whole frame |
//!
//! Every fragment but the last carries `ceil(length / count)` bytes, the last the rest, so a
//! truncated datagram or a header lying about the count is refused on arrival. A lost fragment
//! leaves its frame incomplete until the reassembly timeout drops it; the core retransmits what it
//! is still owed.
//!
//! With a secret configured every datagram ends with a 16-byte MAC (HMAC-SHA256 over header and
//! payload, truncated), checked before the fragment reaches the reassembler; datagrams from
//! addresses outside the peer table, or naming another node than the one at their address, are
//! dropped before that.
//!
//! # Reassembly
//!
//! The receive task hands what passed those checks to a [`fragment::Reassembler`], which reads no
//! clock ([`fragment`] says why). It holds incomplete frames within a bound in bytes and one in
//! frames, dropping the oldest first to make room, and for at most a timeout
//! ([`fragment::ReassemblyLimits`]), and yields a frame only once its CRC-32 matches. A frame of
//! several fragments is put together in a buffer of its own, so that the values trailer of a core
//! frame is aligned (ARCHITECTURE.md §5); a frame of one fragment is handed on as the datagram's
//! payload, without a copy. For tests, a seeded injector drops outgoing datagrams ([`UdpConfig`]).
//!
//! # What UDP asks of the workers
//!
//! A lost datagram costs its whole frame, and datagrams that overflow the socket's receive buffer
//! are lost. So UDP asks ([`Transport::flow_limits`](crate::Transport::flow_limits)) for slices of
//! at most [`SLICE_DATAGRAMS`] (64) datagrams, and for at most its receive buffer over
//! [`WINDOW_SHARE`] (a half) in flight per worker and kind (push or pull); the runtime applies the
//! tighter of these and the job's own settings.

pub mod fragment;
#[cfg(not(loom))]
mod transport;

#[cfg(not(loom))]
pub use transport::{
    DEFAULT_MAX_PAYLOAD, MAC_LEN, RESOLVE_EVERY, SLICE_DATAGRAMS, UdpConfig, UdpStats,
    UdpTransport, WINDOW_SHARE,
};
