//! The values trailer of a frame: where the values of a frame's key-value pairs travel, and why, is
//! in the codec's docs (`crate::wire::codec`, ARCHITECTURE.md §5).
//!
//! While [`Codec`](crate::wire::Codec) encodes or decodes a frame, the values of every
//! [`KvPairs`](crate::KvPairs) in it travel after the message, in the order the pairs appear,
//! starting at an offset of the frame that is a multiple of 8. A decoder handed the frame as
//! `Bytes` then lets the pairs read their values where they arrived, without a copy.
//!
//! The codec opens the trailer for the duration of one encode or decode on the current thread;
//! `KvPairs`' serde form outside the codec (any other format) keeps its values inline.

use core::cell::RefCell;

use bytes::Bytes;

/// The trailer's offset in a frame is a multiple of this, so that the values of a frame held
/// at an address aligned as well can be read in place.
pub const TRAILER_ALIGN: usize = 8;

thread_local! {
    /// The values gathered by the frame being encoded on this thread, if one is.
    static ENCODING: RefCell<Option<Vec<Bytes>>> = const { RefCell::new(None) };
    /// The trailer of the frame being decoded on this thread, and how much of it is taken.
    static DECODING: RefCell<Option<(Bytes, usize)>> = const { RefCell::new(None) };
}

/// Restores the previous state of a trailer slot when an encode or decode ends, however it
/// ends.
struct Restore<T: 'static> {
    slot: &'static std::thread::LocalKey<RefCell<Option<T>>>,
    previous: Option<T>,
}

impl<T: 'static> Drop for Restore<T> {
    fn drop(&mut self) {
        let previous = self.previous.take();
        self.slot.with_borrow_mut(|s| *s = previous);
    }
}

/// Runs `encode` with a trailer open: the values of every `KvPairs` it serializes are
/// gathered, in order, instead of written inline. Returns what `encode` returned and the
/// gathered values.
pub(crate) fn encoding<R>(encode: impl FnOnce() -> R) -> (R, Vec<Bytes>) {
    let _restore = Restore {
        slot: &ENCODING,
        previous: ENCODING.with_borrow_mut(|s| s.replace(Vec::new())),
    };
    let out = encode();
    let gathered = ENCODING.with_borrow_mut(|s| s.take()).unwrap_or_default();
    (out, gathered)
}

/// True while a frame is being encoded on this thread.
pub(crate) fn is_encoding() -> bool {
    ENCODING.with_borrow(Option::is_some)
}

/// Hands `values` to the frame being encoded; false (and nothing kept) when none is.
pub(crate) fn put(values: impl FnOnce() -> Bytes) -> bool {
    ENCODING.with_borrow_mut(|s| match s {
        Some(gathered) => {
            gathered.push(values());
            true
        }
        None => false,
    })
}

/// Runs `decode` with `trailer` open. Returns what `decode` returned and how many bytes of the
/// trailer were left untaken.
pub(crate) fn decoding<R>(trailer: Bytes, decode: impl FnOnce() -> R) -> (R, usize) {
    let _restore = Restore {
        slot: &DECODING,
        previous: DECODING.with_borrow_mut(|s| s.replace((trailer, 0))),
    };
    let out = decode();
    let left = DECODING
        .with_borrow_mut(|s| s.take())
        .map_or(0, |(t, taken)| t.len() - taken);
    (out, left)
}

/// True while a frame is being decoded on this thread.
pub(crate) fn is_decoding() -> bool {
    DECODING.with_borrow(Option::is_some)
}

/// The next `len` bytes of the trailer of the frame being decoded: `None` when fewer are
/// left. Checked before anything is allocated for them.
pub(crate) fn take(len: usize) -> Option<Bytes> {
    DECODING.with_borrow_mut(|s| {
        let (trailer, taken) = s.as_mut()?;
        let end = taken.checked_add(len).filter(|&end| end <= trailer.len())?;
        let bytes = trailer.slice(*taken..end);
        *taken = end;
        Some(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailer_is_open_only_inside_its_encode_or_decode() {
        assert!(!is_encoding() && !put(|| Bytes::from_static(b"x")));
        let ((), gathered) = encoding(|| {
            assert!(is_encoding());
            assert!(put(|| Bytes::from_static(b"ab")));
            assert!(put(|| Bytes::from_static(b"c")));
        });
        assert_eq!(
            gathered,
            [Bytes::from_static(b"ab"), Bytes::from_static(b"c")]
        );
        assert!(!is_encoding());

        assert!(take(0).is_none());
        let (taken, left) = decoding(Bytes::from_static(b"abcdef"), || {
            (take(2), take(5), take(3), is_decoding())
        });
        assert_eq!(
            taken,
            (
                Some(Bytes::from_static(b"ab")),
                None,
                Some(Bytes::from_static(b"cde")),
                true
            )
        );
        assert_eq!(left, 1);
        assert!(!is_decoding());
    }

    #[test]
    fn a_panic_inside_an_encode_closes_its_trailer() {
        let caught = std::panic::catch_unwind(|| encoding(|| panic!("bad serializer")));
        assert!(caught.is_err());
        assert!(!is_encoding());
    }
}
