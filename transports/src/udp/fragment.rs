//! Splitting frames into datagrams and putting them back together.
//!
//! The datagram layout is described in the [module documentation](super). Everything here is
//! synchronous and clock-free: the caller passes the time in, so the reassembler can be driven
//! by a fuzzer or a test as well as by the socket loop.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use pserver_core::NodeId;
use thiserror::Error;

/// The first bytes of every datagram: "pserver UDP transport, fragment revision 1".
pub const MAGIC: [u8; 4] = *b"PSU1";
/// Size of the fragment header: magic, sender, frame id, index, count, frame length, CRC-32.
pub const HEADER_LEN: usize = 4 + 4 + 8 + 2 + 2 + 4 + 4;
/// The most fragments one frame may have (the index is 16 bits).
pub const MAX_FRAGMENTS: usize = u16::MAX as usize;

/// The header every datagram starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentHeader {
    /// The node that sent the frame.
    pub from: NodeId,
    /// The sender's number for the frame, unique among its recent frames.
    pub frame: u64,
    /// This fragment's place in the frame, from 0.
    pub index: u16,
    /// How many fragments the frame has.
    pub count: u16,
    /// The whole frame's length in bytes.
    pub frame_len: u32,
    /// CRC-32 of the whole frame, checked once it is reassembled.
    pub crc: u32,
}

impl FragmentHeader {
    /// Appends the header's wire form to `out`.
    pub fn write(&self, out: &mut BytesMut) {
        out.put_slice(&MAGIC);
        out.put_u32_le(self.from.0);
        out.put_u64_le(self.frame);
        out.put_u16_le(self.index);
        out.put_u16_le(self.count);
        out.put_u32_le(self.frame_len);
        out.put_u32_le(self.crc);
    }

    /// Reads a header from the start of `datagram`.
    pub fn read(datagram: &[u8]) -> Result<Self, FragmentError> {
        let Some(h) = datagram.get(..HEADER_LEN) else {
            return Err(FragmentError::Short {
                len: datagram.len(),
            });
        };
        if h[..4] != MAGIC {
            return Err(FragmentError::BadMagic);
        }
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let mut frame = [0u8; 8];
        frame.copy_from_slice(&h[8..16]);
        Ok(FragmentHeader {
            from: NodeId(u32_at(4)),
            frame: u64::from_le_bytes(frame),
            index: u16_at(16),
            count: u16_at(18),
            frame_len: u32_at(20),
            crc: u32_at(24),
        })
    }

    /// The payload bytes this fragment must carry: every fragment but the last carries
    /// `ceil(frame_len / count)` bytes, the last the rest. `None` when the header cannot
    /// describe a frame (no fragments, an index past the count, more fragments than bytes).
    pub fn payload_range(&self) -> Option<(usize, usize)> {
        let count = usize::from(self.count);
        let index = usize::from(self.index);
        let total = self.frame_len as usize;
        if count == 0 || index >= count {
            return None;
        }
        let chunk = total.div_ceil(count);
        // Every fragment carries at least one byte, except the single fragment of an empty
        // frame: a count that leaves a fragment empty is a lie.
        if total == 0 {
            return (count == 1).then_some((0, 0));
        }
        if (count - 1) * chunk >= total {
            return None;
        }
        let start = index * chunk;
        Some((start, (start + chunk).min(total)))
    }
}

/// Why a datagram was not taken.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum FragmentError {
    /// Shorter than a fragment header.
    #[error("datagram of {len} bytes is shorter than the {HEADER_LEN}-byte fragment header")]
    Short {
        /// Its length.
        len: usize,
    },
    /// Not a pserver fragment.
    #[error("datagram does not start with the pserver UDP magic")]
    BadMagic,
    /// The header describes no frame, or the payload is not the length the header implies
    /// (a truncated datagram, a count that does not fit the length).
    #[error("fragment header and payload do not agree (truncated datagram or false counts)")]
    Malformed,
    /// The frame is longer than the reassembler takes.
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The length the header claims.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The fragment claims another frame length, count or checksum than the frame's earlier
    /// fragments.
    #[error("fragment disagrees with the earlier fragments of its frame")]
    Inconsistent,
    /// The whole frame was put together but its checksum does not match.
    #[error("reassembled frame fails its CRC-32 check")]
    Corrupt,
}

/// Splits `frame` into datagrams of at most `max_payload` payload bytes each (plus the
/// header), all sharing `frame_id`. Fails if that takes more than [`MAX_FRAGMENTS`].
///
/// ```
/// use pserver_transport::udp::fragment::{Reassembler, ReassemblyLimits, fragment};
/// use pserver_transport::pserver_core::NodeId;
/// use std::time::Instant;
///
/// let frame = vec![7u8; 3000];
/// let datagrams = fragment(NodeId(1), 9, &frame, 1400).unwrap();
/// assert_eq!(datagrams.len(), 3);
/// let mut r = Reassembler::new(ReassemblyLimits::default());
/// let now = Instant::now();
/// let mut whole = None;
/// for d in datagrams.into_iter().rev() {
///     whole = r.accept(now, d).unwrap();
/// }
/// assert_eq!(whole.unwrap().1.as_ref(), &frame[..]);
/// ```
pub fn fragment(
    from: NodeId,
    frame_id: u64,
    frame: &[u8],
    max_payload: usize,
) -> Result<Vec<Bytes>, FragmentError> {
    let max_payload = max_payload.max(1);
    let count = frame.len().div_ceil(max_payload).max(1);
    let limit = MAX_FRAGMENTS * max_payload;
    if count > MAX_FRAGMENTS || u32::try_from(frame.len()).is_err() {
        return Err(FragmentError::TooLarge {
            len: frame.len(),
            limit: limit.min(u32::MAX as usize),
        });
    }
    let chunk = frame.len().div_ceil(count).max(1);
    let mut header = FragmentHeader {
        from,
        frame: frame_id,
        index: 0,
        count: count as u16,
        frame_len: frame.len() as u32,
        crc: crc32fast::hash(frame),
    };
    let mut out = Vec::with_capacity(count);
    let mut buf = BytesMut::with_capacity(frame.len() + count * HEADER_LEN);
    for (index, piece) in frame
        .chunks(chunk)
        .chain(frame.is_empty().then_some(&[][..]))
        .enumerate()
    {
        header.index = index as u16;
        header.write(&mut buf);
        buf.put_slice(piece);
        out.push(buf.split().freeze());
    }
    Ok(out)
}

/// Bounds on what a [`Reassembler`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReassemblyLimits {
    /// The longest frame taken.
    pub max_frame: usize,
    /// The most bytes held by incomplete frames together; the oldest are dropped to make room.
    pub max_held: usize,
    /// The most incomplete frames held at once.
    pub max_partial: usize,
    /// An incomplete frame older than this is dropped: a fragment was lost, and the core's
    /// retransmission sends the frame again under a new id.
    pub timeout: Duration,
}

impl Default for ReassemblyLimits {
    /// 64 MiB frames, 256 MiB held, 4,096 incomplete frames, 2 s.
    fn default() -> Self {
        ReassemblyLimits {
            max_frame: 64 << 20,
            max_held: 256 << 20,
            max_partial: 4096,
            timeout: Duration::from_secs(2),
        }
    }
}

/// Counts of what a [`Reassembler`] dropped, by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    /// Frames completed.
    pub frames: u64,
    /// Datagrams refused ([`FragmentError`]).
    pub refused: u64,
    /// Fragments of a frame already held (duplicates).
    pub duplicates: u64,
    /// Incomplete frames dropped because they timed out.
    pub expired: u64,
    /// Incomplete frames dropped to stay within [`ReassemblyLimits::max_held`] or
    /// [`ReassemblyLimits::max_partial`].
    pub evicted: u64,
}

#[derive(Debug)]
struct Partial {
    header: FragmentHeader,
    buf: Vec<u8>,
    have: Vec<bool>,
    missing: usize,
    started: Instant,
    order: u64,
}

/// Puts frames back together from their datagrams, per sender and frame id, within
/// [`ReassemblyLimits`]. A frame it yields is exactly a frame some sender passed to
/// [`fragment`]: every fragment's length is checked against its header, every fragment of a
/// frame must agree on the frame's length, count and checksum, and the whole frame's CRC-32
/// is checked before it is handed out.
#[derive(Debug)]
pub struct Reassembler {
    limits: ReassemblyLimits,
    partial: BTreeMap<(NodeId, u64), Partial>,
    /// Incomplete frames oldest first: arrival number to key.
    order: BTreeMap<u64, (NodeId, u64)>,
    next_order: u64,
    held: usize,
    stats: ReassemblyStats,
}

impl Reassembler {
    /// An empty reassembler.
    pub fn new(limits: ReassemblyLimits) -> Self {
        Reassembler {
            limits,
            partial: BTreeMap::new(),
            order: BTreeMap::new(),
            next_order: 0,
            held: 0,
            stats: ReassemblyStats::default(),
        }
    }

    /// Bytes held by incomplete frames (never more than [`ReassemblyLimits::max_held`]).
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Incomplete frames held.
    pub fn partial_frames(&self) -> usize {
        self.partial.len()
    }

    /// What was completed and dropped so far.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Takes one datagram. Returns the sender and the frame once its last missing fragment
    /// arrived, `None` while fragments are missing (or for a duplicate), and an error for a
    /// datagram that was refused (counted in [`ReassemblyStats::refused`]).
    pub fn accept(
        &mut self,
        now: Instant,
        datagram: Bytes,
    ) -> Result<Option<(NodeId, Bytes)>, FragmentError> {
        let result = self.take(now, datagram);
        if result.is_err() {
            self.stats.refused += 1;
        }
        result
    }

    fn take(
        &mut self,
        now: Instant,
        datagram: Bytes,
    ) -> Result<Option<(NodeId, Bytes)>, FragmentError> {
        let header = FragmentHeader::read(&datagram)?;
        let (start, end) = header.payload_range().ok_or(FragmentError::Malformed)?;
        let payload = datagram.slice(HEADER_LEN..);
        if payload.len() != end - start {
            return Err(FragmentError::Malformed);
        }
        let len = header.frame_len as usize;
        if len > self.limits.max_frame || (len > self.limits.max_held && header.count > 1) {
            return Err(FragmentError::TooLarge {
                len,
                limit: self.limits.max_frame.min(self.limits.max_held),
            });
        }
        if header.count == 1 {
            // The common small frame: no copy, nothing held.
            if crc32fast::hash(&payload) != header.crc {
                return Err(FragmentError::Corrupt);
            }
            self.stats.frames += 1;
            return Ok(Some((header.from, payload)));
        }
        let key = (header.from, header.frame);
        if let Some(p) = self.partial.get(&key) {
            let h = p.header;
            if (h.count, h.frame_len, h.crc) != (header.count, header.frame_len, header.crc) {
                return Err(FragmentError::Inconsistent);
            }
        } else {
            self.expire(now);
            self.make_room(len);
            let order = self.next_order;
            self.next_order += 1;
            self.order.insert(order, key);
            self.held += len;
            let count = usize::from(header.count);
            self.partial.insert(
                key,
                Partial {
                    header,
                    buf: vec![0; len],
                    have: vec![false; count],
                    missing: count,
                    started: now,
                    order,
                },
            );
        }
        let Some(p) = self.partial.get_mut(&key) else {
            return Ok(None);
        };
        let index = usize::from(header.index);
        if p.have[index] {
            self.stats.duplicates += 1;
            return Ok(None);
        }
        p.have[index] = true;
        p.missing -= 1;
        p.buf[start..end].copy_from_slice(&payload);
        if p.missing > 0 {
            return Ok(None);
        }
        let Some(done) = self.remove(key) else {
            return Ok(None);
        };
        if crc32fast::hash(&done.buf) != done.header.crc {
            return Err(FragmentError::Corrupt);
        }
        self.stats.frames += 1;
        Ok(Some((done.header.from, Bytes::from(done.buf))))
    }

    /// Drops the incomplete frames older than the timeout.
    pub fn expire(&mut self, now: Instant) {
        while let Some((_, &key)) = self.order.first_key_value() {
            let old = self
                .partial
                .get(&key)
                .is_some_and(|p| now.saturating_duration_since(p.started) >= self.limits.timeout);
            if !old {
                break;
            }
            self.remove(key);
            self.stats.expired += 1;
        }
    }

    /// Drops the oldest incomplete frames until one of `len` bytes fits.
    fn make_room(&mut self, len: usize) {
        while self.held + len > self.limits.max_held
            || self.partial.len() >= self.limits.max_partial.max(1)
        {
            let Some((_, &key)) = self.order.first_key_value() else {
                break;
            };
            self.remove(key);
            self.stats.evicted += 1;
        }
    }

    fn remove(&mut self, key: (NodeId, u64)) -> Option<Partial> {
        let p = self.partial.remove(&key)?;
        self.order.remove(&p.order);
        self.held -= p.buf.len();
        Some(p)
    }
}

#[cfg(test)]
mod tests;
