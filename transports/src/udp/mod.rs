//! The UDP transport's framing: frames cut into datagrams below the path MTU and put back
//! together at the receiver (ARCHITECTURE.md §6).
//!
//! Every datagram carries one fragment: a 28-byte header, then payload.
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
//! leaves its frame incomplete until the reassembly timeout drops it; the core retransmits
//! what it is still owed.
//!
//! With a secret configured every datagram ends with a 16-byte MAC (HMAC-SHA256 over header
//! and payload, truncated), checked before the fragment reaches the reassembler; datagrams
//! from addresses outside the peer table, or naming another node than the one at their
//! address, are dropped before that.

pub mod fragment;
#[cfg(not(loom))]
mod transport;

#[cfg(not(loom))]
pub use transport::{
    DEFAULT_MAX_PAYLOAD, MAC_LEN, SLICE_DATAGRAMS, UdpConfig, UdpStats, UdpTransport, WINDOW_SHARE,
};
