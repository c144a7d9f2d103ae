//! What rows cost on the wire: the one reckoning by which a worker sizes its slices and a
//! server its answers to range pulls and its copies of shards, so that each fits a frame.

use crate::value::Value;

/// Room left in a message for everything but its keys and values.
const MESSAGE_OVERHEAD: usize = 128;

/// Bytes a key may take on the wire (a 64-bit varint).
const MAX_KEY_BYTES: usize = 10;

/// The most bytes one row of `width` values takes on the wire: its key and its values.
pub(crate) fn row_bytes<V: Value>(width: usize) -> usize {
    MAX_KEY_BYTES + width.saturating_mul(V::SIZE)
}

/// Rows of `width` values that a message of at most `bytes` carries, at least one.
pub(crate) fn rows_within<V: Value>(bytes: usize, width: usize) -> usize {
    (bytes.saturating_sub(MESSAGE_OVERHEAD) / row_bytes::<V>(width).max(1)).max(1)
}

/// The bytes a message of `rows` rows of `width` values needs at most.
pub(crate) fn message_bytes<V: Value>(rows: usize, width: usize) -> usize {
    (rows * row_bytes::<V>(width)).saturating_add(MESSAGE_OVERHEAD)
}
