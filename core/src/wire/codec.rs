//! Framing of [`Envelope`]s: postcard, a frame-size limit, and typed decode errors.
//!
//! ```text
//! version (varint u16) | value type (u8) | from | to | epoch | trailer length (u32 LE)
//!     | body | padding | trailer
//! ```
//!
//! The header and body are postcard, in the wire forms of `crate::forms`: keys as delta varints
//! (the pairs of a dense push or pull, whose keys are consecutive, carry their first key alone, and
//! decode into a [`KvPairs`] that holds no key list), sequences that never pre-allocate on a length
//! read from the wire. The trailer holds the values of every key-value pair set in the body, raw
//! little-endian, in the order the pairs appear, and starts at an offset that is a multiple of
//! [`TRAILER_ALIGN`] (8), after the fewest zero bytes of padding that take it there (none when the
//! trailer is empty). A decoder refuses any other padding, so every frame has one encoding. The
//! version comes first so that a peer of another version is refused with a clear error before
//! anything else is read.
//!
//! A frame is checked against the codec's limit ([`DEFAULT_MAX_FRAME`], 64 MiB, by default) before
//! anything is decoded, and every length in it against the bytes present before anything is
//! allocated. A frame that cannot be decoded is a typed [`DecodeError`], never a panic.
//!
//! # Why the values travel apart
//!
//! The trailer is there for the copy from socket to store. A frame that a transport received into a
//! buffer of its own (TCP reads each frame into one, UDP reassembles each frame of several
//! datagrams into one, the in-memory transport hands over the sender's buffer) sits at an aligned
//! address, so the values in its trailer are aligned too, and [`Codec::decode_bytes`] (which
//! [`Driver::handle_frame_bytes`](crate::Driver::handle_frame_bytes) uses) gives the decoded pairs a view of
//! the frame's bytes instead of a copy (`crate::kv::values`). A push's values then go from the
//! transport's buffer straight into the store. Inline values, as postcard lays out a byte string,
//! would sit after varints of any length and at any alignment. How the serde form of `KvPairs`
//! finds the trailer is `crate::trailer`'s.

use bytes::Bytes;
use thiserror::Error;

use crate::ids::{Epoch, NodeId};
use crate::kv::KvPairs;
use crate::trailer::{self, TRAILER_ALIGN};
use crate::value::Value;
use crate::wire::{Envelope, Message, PROTOCOL_VERSION};

/// The trailer length field's size.
const TRAILER_LEN: usize = 4;

/// Default limit on a frame's size: 64 MiB.
pub const DEFAULT_MAX_FRAME: usize = 64 << 20;

/// Why a frame could not be decoded. Decoding never panics, whatever the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Error)]
pub enum DecodeError {
    /// The frame is larger than this codec accepts.
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// Frame size.
        len: usize,
        /// Configured limit.
        limit: usize,
    },
    /// The peer speaks another protocol version.
    #[error(
        "unsupported protocol version {got}: this build speaks version {supported}; upgrade the older side"
    )]
    UnsupportedVersion {
        /// Version in the frame.
        got: u16,
        /// Version this build speaks.
        supported: u16,
    },
    /// The frame carries values of another scalar type than this node uses.
    #[error(
        "frame carries {got} values but this node uses {expected}: every node of a job must use the same value type"
    )]
    ValueType {
        /// This node's value type.
        expected: &'static str,
        /// The frame's value type name (or `unknown`).
        got: &'static str,
    },
    /// The frame ended in the middle of a field.
    #[error("frame truncated: it ended in the middle of a field")]
    Truncated,
    /// Bytes were left over after a complete envelope.
    #[error("{0} unexpected bytes after the end of the message")]
    TrailingBytes(usize),
    /// The message kind tag is not one this version knows.
    #[error("unknown message kind {0}: the peer may run a newer build")]
    UnknownKind(u32),
    /// A field failed validation: keys not strictly increasing or reserved, a key count beyond
    /// the bytes present, value bytes not matching keys x width, a zero width, a bad key range,
    /// a malformed varint, or the like.
    #[error("malformed message: a field failed validation (keys, lengths, ranges or varints)")]
    Malformed,
}

/// Why an envelope could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Error)]
pub enum EncodeError {
    /// The encoded frame would exceed the limit; split the request into smaller ones.
    #[error(
        "encoded frame of {len} bytes exceeds the limit of {limit} bytes; send fewer keys per message"
    )]
    FrameTooLarge {
        /// Encoded size.
        len: usize,
        /// Configured limit.
        limit: usize,
    },
    /// Serialization failed (cannot happen for well-formed messages).
    #[error("serialization failed: {0}")]
    Serialize(String),
}

/// Encodes and decodes envelopes under a frame-size limit.
///
/// ```
/// use pserver_core::NodeId;
/// use pserver_core::wire::Codec;
/// use pserver_core::wire::{Envelope, Message};
/// let codec = Codec::default();
/// let env = Envelope::<f32>::new(NodeId(1), NodeId(0), 3, Message::Heartbeat { sent_at: 9, at: None, term: 0 });
/// let frame = codec.encode(&env)?;
/// assert_eq!(codec.decode::<f32>(&frame)?, env);
/// assert!(codec.decode::<f32>(&frame[..frame.len() - 1]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Codec {
    max_frame: usize,
}

impl Default for Codec {
    fn default() -> Self {
        Codec {
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

/// One byte naming the value type, so that nodes of mismatched jobs fail loudly.
fn value_tag<V: Value>() -> u8 {
    match V::NAME {
        "f32" => 1,
        "f64" => 2,
        "i64" => 3,
        _ => 0,
    }
}

fn value_name(tag: u8) -> &'static str {
    match tag {
        1 => "f32",
        2 => "f64",
        3 => "i64",
        _ => "unknown",
    }
}

fn decode_error(e: postcard::Error) -> DecodeError {
    match e {
        postcard::Error::DeserializeUnexpectedEnd => DecodeError::Truncated,
        _ => DecodeError::Malformed,
    }
}

/// Appends to a vector, a byte string with one copy: postcard's own `ExtendFlavor` goes through
/// `Extend`, a loop per byte, which showed as a tenth of a dense push's time in a profile of
/// `pserver bench`.
struct AppendFlavor(Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendFlavor {
    type Output = Vec<u8>;

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// About how many bytes the keys and the values of the key-value pairs of `body` take on the
/// wire, so that a frame is allocated once instead of doubling its way there.
fn bulk_bytes<V: Value>(body: &Message<V>) -> (usize, usize) {
    let pairs = |kvs: &KvPairs<V>| {
        // A run's keys take one varint; sparse keys a few bytes each.
        let keys = if kvs.key_range().is_some() {
            10
        } else {
            4 * kvs.len()
        };
        (keys, kvs.values().len() * V::SIZE)
    };
    match body {
        Message::Push(push) => pairs(&push.kvs),
        Message::PullReply(reply) => pairs(&reply.kvs),
        Message::PushCached(push) => (0, push.values.wire_bytes()),
        Message::PullValues(reply) => (0, reply.values.wire_bytes()),
        Message::PullRows(reply) => (4 * reply.keys.keys().len(), reply.values.wire_bytes()),
        _ => (0, 0),
    }
}

/// A frame in parts, whose concatenation is the frame: the header and message first, then
/// the values of the message's key-value pairs, each lent from where it is kept (the
/// application's vector, a reply's rows) rather than copied into one buffer. A transport that
/// writes vectored sends the parts as they are; [`Codec::encode_parts`] makes them.
#[derive(Clone, Default)]
pub struct FrameParts {
    parts: Vec<Bytes>,
    len: usize,
}

impl FrameParts {
    /// The frame made of `parts`, in order.
    pub fn new(parts: Vec<Bytes>) -> Self {
        let len = parts.iter().map(Bytes::len).sum();
        FrameParts { parts, len }
    }

    /// The frame's length: the parts' lengths summed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the frame has no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The frame in one piece: the part itself when there is one, else a copy of them all.
    pub fn into_bytes(mut self) -> Bytes {
        if self.parts.len() == 1 {
            return self.parts.pop().unwrap_or_default();
        }
        let mut whole = Vec::with_capacity(self.len);
        for part in &self.parts {
            whole.extend_from_slice(part);
        }
        Bytes::from(whole)
    }
}

impl From<Bytes> for FrameParts {
    fn from(frame: Bytes) -> Self {
        FrameParts::new(vec![frame])
    }
}

impl core::fmt::Debug for FrameParts {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let lens: Vec<usize> = self.parts.iter().map(Bytes::len).collect();
        f.debug_struct("FrameParts")
            .field("len", &self.len)
            .field("parts", &lens)
            .finish()
    }
}

/// `len` rounded up to a multiple of [`TRAILER_ALIGN`].
fn padded(len: usize) -> usize {
    len.div_ceil(TRAILER_ALIGN) * TRAILER_ALIGN
}

impl Codec {
    /// A codec refusing frames above `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        Codec { max_frame }
    }

    /// The frame-size limit in bytes.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Appends the head of `env`'s frame to `buf` (header, trailer length, message and
    /// padding, with `extra` more bytes reserved) and returns its trailer: the values of its
    /// key-value pairs, in order, lent rather than copied. On error `buf` is left as it was.
    fn encode_head<V: Value>(
        &self,
        env: &Envelope<V>,
        buf: &mut Vec<u8>,
        extra: usize,
    ) -> Result<Vec<Bytes>, EncodeError> {
        let start = buf.len();
        buf.reserve(extra + 64 + TRAILER_ALIGN);
        let header = (env.version, value_tag::<V>(), env.from, env.to, env.epoch);
        let mut slot = 0;
        let (written, values) = trailer::encoding(|| {
            postcard::serialize_with_flavor(&header, AppendFlavor(core::mem::take(buf))).and_then(
                |mut b| {
                    slot = b.len();
                    b.extend_from_slice(&[0; TRAILER_LEN]);
                    postcard::serialize_with_flavor(&env.body, AppendFlavor(b))
                },
            )
        });
        match written {
            Ok(b) => *buf = b,
            Err(e) => return Err(EncodeError::Serialize(e.to_string())),
        }
        let trailer_len: usize = values.iter().map(Bytes::len).sum();
        if trailer_len > 0 {
            buf.resize(start + padded(buf.len() - start), 0);
        }
        let len = buf.len() - start + trailer_len;
        let field = u32::try_from(trailer_len)
            .ok()
            .filter(|_| len <= self.max_frame);
        let Some(field) = field else {
            buf.truncate(start);
            return Err(EncodeError::FrameTooLarge {
                len,
                limit: self.max_frame,
            });
        };
        buf[slot..slot + TRAILER_LEN].copy_from_slice(&field.to_le_bytes());
        Ok(values)
    }

    /// Appends the frame of `env` to `buf`. On error `buf` is left as it was. The frame's
    /// offsets (its trailer's alignment) count from where it starts in `buf`.
    pub fn encode_into<V: Value>(
        &self,
        env: &Envelope<V>,
        buf: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        let (keys, values) = bulk_bytes(&env.body);
        for v in self.encode_head(env, buf, keys + values)? {
            buf.extend_from_slice(&v);
        }
        Ok(())
    }

    /// The frame of `env` in parts, without copying its values: the head, then the values of
    /// each key-value pair set, lent from where the envelope keeps them. Their concatenation
    /// is what [`Codec::encode`] gives.
    ///
    /// ```
    /// use pserver_core::{KeyRange, KvPairs, NodeId};
    /// use pserver_core::wire::Codec;
    /// use pserver_core::wire::{Envelope, Message, Push, SliceRef};
    /// let kvs = KvPairs::from_range(KeyRange::new(0, 1000)?, vec![0.5f32; 1000], 1)?;
    /// let values = kvs.values().as_ptr();
    /// let slice = SliceRef { request: 1, slice: 0 };
    /// let push = Push { slice, iteration: 0, covers: pserver_core::pace::Coverage::WHOLE, settled_below: 0, kvs };
    /// let env = Envelope::new(NodeId(1), NodeId(0), 1, Message::Push(push));
    /// let codec = Codec::default();
    /// let parts = codec.encode_parts(&env)?;
    /// assert_eq!(parts.parts()[1].as_ptr(), values.cast::<u8>(), "the values are lent");
    /// assert_eq!(parts.into_bytes(), codec.encode(&env)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn encode_parts<V: Value>(&self, env: &Envelope<V>) -> Result<FrameParts, EncodeError> {
        let mut head = Vec::new();
        let (keys, _) = bulk_bytes(&env.body);
        let values = self.encode_head(env, &mut head, keys)?;
        let mut parts = Vec::with_capacity(1 + values.len());
        parts.push(Bytes::from(head));
        parts.extend(values.into_iter().filter(|v| !v.is_empty()));
        Ok(FrameParts::new(parts))
    }

    /// The frame of `env`.
    pub fn encode<V: Value>(&self, env: &Envelope<V>) -> Result<Bytes, EncodeError> {
        let mut buf = Vec::new();
        self.encode_into(env, &mut buf)?;
        Ok(Bytes::from(buf))
    }

    /// Decodes one whole frame. Checks the size limit, the version and the value type first,
    /// and every length inside before allocating for it. The values are copied out of
    /// `frame`; [`Codec::decode_bytes`] reads them in place.
    pub fn decode<V: Value>(&self, frame: &[u8]) -> Result<Envelope<V>, DecodeError> {
        self.decode_with(frame, |trailer| Bytes::copy_from_slice(&frame[trailer..]))
    }

    /// Decodes one whole frame as [`Codec::decode`] does, but the decoded key-value pairs
    /// read their values where they are in `frame`, without a copy, whenever the frame sits at
    /// an address aligned to [`TRAILER_ALIGN`] (as a frame received into a buffer of its own
    /// does) and the machine is little-endian. The pairs then keep `frame`'s bytes alive.
    ///
    /// ```
    /// use pserver_core::{KeyRange, KvPairs, NodeId};
    /// use pserver_core::wire::Codec;
    /// use pserver_core::wire::{Envelope, Message, Push, SliceRef};
    /// let kvs = KvPairs::from_range(KeyRange::new(0, 1000)?, vec![0.5f32; 1000], 1)?;
    /// let slice = SliceRef { request: 1, slice: 0 };
    /// let push = Push { slice, iteration: 0, covers: pserver_core::pace::Coverage::WHOLE, settled_below: 0, kvs };
    /// let codec = Codec::default();
    /// let frame = codec.encode(&Envelope::new(NodeId(1), NodeId(0), 1, Message::Push(push)))?;
    /// let Message::Push(got) = codec.decode_bytes::<f32>(&frame)?.body else { panic!() };
    /// let at = (got.kvs.values().as_ptr() as usize).wrapping_sub(frame.as_ptr() as usize);
    /// assert!(at < frame.len(), "the values are read in the frame itself");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decode_bytes<V: Value>(&self, frame: &Bytes) -> Result<Envelope<V>, DecodeError> {
        self.decode_with(frame, |trailer| frame.slice(trailer..))
    }

    /// Decodes `frame`, whose trailer (from the offset given) `trailer_of` hands over as
    /// `Bytes`.
    fn decode_with<V: Value>(
        &self,
        frame: &[u8],
        trailer_of: impl FnOnce(usize) -> Bytes,
    ) -> Result<Envelope<V>, DecodeError> {
        if frame.len() > self.max_frame {
            return Err(DecodeError::FrameTooLarge {
                len: frame.len(),
                limit: self.max_frame,
            });
        }
        let (version, rest) = postcard::take_from_bytes::<u16>(frame).map_err(decode_error)?;
        if version != PROTOCOL_VERSION {
            return Err(DecodeError::UnsupportedVersion {
                got: version,
                supported: PROTOCOL_VERSION,
            });
        }
        let (tag, rest) = postcard::take_from_bytes::<u8>(rest).map_err(decode_error)?;
        if tag != value_tag::<V>() {
            return Err(DecodeError::ValueType {
                expected: V::NAME,
                got: value_name(tag),
            });
        }
        let ((from, to, epoch), rest) =
            postcard::take_from_bytes::<(NodeId, NodeId, Epoch)>(rest).map_err(decode_error)?;
        let (field, body_and_trailer) = rest
            .split_first_chunk::<TRAILER_LEN>()
            .ok_or(DecodeError::Truncated)?;
        let trailer_len = usize::try_from(u32::from_le_bytes(*field))
            .ok()
            .filter(|&n| n <= body_and_trailer.len())
            .ok_or(DecodeError::Malformed)?;
        let body_bytes = &body_and_trailer[..body_and_trailer.len() - trailer_len];
        let trailer_at = frame.len() - trailer_len;
        if trailer_len > 0 && trailer_at % TRAILER_ALIGN != 0 {
            return Err(DecodeError::Malformed);
        }
        let (kind, _) = postcard::take_from_bytes::<u32>(body_bytes).map_err(decode_error)?;
        if kind >= Message::<V>::KINDS {
            return Err(DecodeError::UnknownKind(kind));
        }
        let trailer = if trailer_len > 0 {
            trailer_of(trailer_at)
        } else {
            Bytes::new()
        };
        let (parsed, untaken) = trailer::decoding(trailer, || {
            postcard::take_from_bytes::<Message<V>>(body_bytes).map_err(decode_error)
        });
        let (body, rest) = parsed?;
        // Only the padding a canonical encoder writes may sit between the body and the trailer.
        let padding = if trailer_len > 0 {
            padded(trailer_at - rest.len()) - (trailer_at - rest.len())
        } else {
            0
        };
        let bad_padding = rest.len() != padding || rest.iter().any(|&b| b != 0);
        let unexpected = if bad_padding { rest.len() } else { 0 } + untaken;
        if unexpected > 0 {
            return Err(DecodeError::TrailingBytes(unexpected));
        }
        Ok(Envelope {
            version,
            from,
            to,
            epoch,
            body,
        })
    }
}
