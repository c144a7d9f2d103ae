//! Where the values of a [`KvPairs`](super::KvPairs) live: a vector of their own, or the bytes
//! of the frame they arrived in, read in place (ARCHITECTURE.md §5).

use core::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use crate::value::Value;

/// The values of a [`KvPairs`](super::KvPairs), shared by its clones and slices.
#[derive(Clone)]
pub(crate) enum ValueStorage<V> {
    /// Values made (or copied) by this process.
    Owned(Arc<Vec<V>>),
    /// Little-endian values in the bytes of a received frame, read where they arrived. Only
    /// [`ValueStorage::from_le_bytes`] makes one, on a little-endian machine, from bytes aligned
    /// for `V` and a whole number of values long; a `Bytes` never moves its bytes.
    Frame(Bytes),
}

impl<V: Value> ValueStorage<V> {
    /// Values of this process's own.
    pub(crate) fn owned(values: Vec<V>) -> Self {
        ValueStorage::Owned(Arc::new(values))
    }

    /// The values in `bytes`, `V::SIZE` little-endian bytes each: read in place when the
    /// machine is little-endian and the bytes are aligned for `V`, copied otherwise. `None`
    /// when `bytes` is not a whole number of values.
    pub(crate) fn from_le_bytes(bytes: Bytes) -> Option<Self> {
        if bytes.len() % V::SIZE != 0 {
            return None;
        }
        let in_place = cfg!(target_endian = "little")
            && !bytes.is_empty()
            && bytemuck::try_cast_slice::<u8, V>(&bytes).is_ok();
        if in_place {
            return Some(ValueStorage::Frame(bytes));
        }
        Some(ValueStorage::owned(
            bytes.chunks_exact(V::SIZE).map(V::from_le_slice).collect(),
        ))
    }

    /// Every value held.
    pub(crate) fn as_slice(&self) -> &[V] {
        match self {
            ValueStorage::Owned(values) => values,
            // Aligned, whole and little-endian: checked when it was made.
            ValueStorage::Frame(bytes) => bytemuck::cast_slice(bytes),
        }
    }

    /// True when both are the same storage (not merely equal values).
    pub(crate) fn same(&self, other: &Self) -> bool {
        match (self, other) {
            (ValueStorage::Owned(a), ValueStorage::Owned(b)) => Arc::ptr_eq(a, b),
            (ValueStorage::Frame(a), ValueStorage::Frame(b)) => {
                a.as_ptr() == b.as_ptr() && a.len() == b.len()
            }
            _ => false,
        }
    }

    /// Values `range` as little-endian bytes: on a little-endian machine a view of this
    /// storage, without a copy.
    pub(crate) fn le_bytes(&self, range: Range<usize>) -> Bytes {
        if cfg!(target_endian = "big") {
            let mut raw = Vec::with_capacity(range.len() * V::SIZE);
            for &v in &self.as_slice()[range] {
                v.extend_le(&mut raw);
            }
            return Bytes::from(raw);
        }
        match self {
            ValueStorage::Frame(bytes) => bytes.slice(range.start * V::SIZE..range.end * V::SIZE),
            ValueStorage::Owned(values) => Bytes::from_owner(ValueBytes {
                values: Arc::clone(values),
                range,
            }),
        }
    }
}

/// A window of an owned value vector, seen as its bytes.
struct ValueBytes<V> {
    values: Arc<Vec<V>>,
    range: Range<usize>,
}

impl<V: Value> AsRef<[u8]> for ValueBytes<V> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.values[self.range.clone()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_frame_bytes_are_read_in_place_and_others_copied() {
        let values = [1.5f32, -2.0, 3.25];
        let owned = Bytes::from(bytemuck::cast_slice::<f32, u8>(&values).to_vec());
        // A Vec<u8> from the allocator is at least 8-aligned on every platform we build for.
        let aligned = ValueStorage::<f32>::from_le_bytes(owned.clone()).unwrap();
        assert!(matches!(aligned, ValueStorage::Frame(_)));
        assert_eq!(aligned.as_slice(), &values);
        assert_eq!(aligned.as_slice().as_ptr().cast::<u8>(), owned.as_ptr());

        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&owned);
        let odd = Bytes::from(shifted).slice(1..);
        let copied = ValueStorage::<f32>::from_le_bytes(odd).unwrap();
        assert!(matches!(copied, ValueStorage::Owned(_)));
        assert_eq!(copied.as_slice(), &values);

        assert!(ValueStorage::<f32>::from_le_bytes(owned.slice(..5)).is_none());
    }

    #[test]
    fn frame_storages_are_the_same_only_over_the_same_bytes() {
        let bytes = Bytes::from(vec![0u8; 64]);
        let frame = |range: core::ops::Range<usize>| {
            let storage = ValueStorage::<f32>::from_le_bytes(bytes.slice(range)).unwrap();
            assert!(matches!(storage, ValueStorage::Frame(_)));
            storage
        };
        let whole = frame(0..64);
        assert!(whole.same(&whole.clone()));
        assert!(whole.same(&frame(0..64)), "the same bytes, taken again");
        assert!(
            !whole.same(&frame(0..32)),
            "a shorter view from the same start"
        );
        assert!(
            !frame(0..32).same(&frame(32..64)),
            "as long, from elsewhere"
        );
        assert!(!whole.same(&ValueStorage::owned(vec![0.0; 16])));
    }

    #[test]
    fn owned_values_are_lent_as_bytes_without_a_copy() {
        let storage = ValueStorage::owned(vec![7i64, 8, 9]);
        let bytes = storage.le_bytes(1..3);
        assert_eq!(&bytes[..], bytemuck::cast_slice::<i64, u8>(&[8, 9]));
        assert_eq!(
            bytes.as_ptr(),
            storage.as_slice()[1..].as_ptr().cast::<u8>()
        );
        let back = ValueStorage::<i64>::from_le_bytes(bytes).unwrap();
        assert_eq!(back.as_slice(), &[8, 9]);
        assert!(storage.same(&storage.clone()));
        assert!(!storage.same(&ValueStorage::owned(vec![7, 8, 9])));
    }
}
