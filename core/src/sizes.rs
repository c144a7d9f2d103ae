//! What rows cost on the wire: the one reckoning by which a worker sizes its slices and a
//! server its answers to range pulls and its copies of shards, so that each fits a frame.

use crate::value::Value;
use crate::wire::{Replicate, ShardUpdate};

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

/// The most bytes a replication step takes on the wire, besides its rows: its range, its
/// place in the update order and its update's kind and iteration.
const STEP_OVERHEAD: usize = 64;

/// The most bytes one de-duplication record takes, besides its spans, and one span.
const RECORD_BYTES: usize = 24;
const SPAN_BYTES: usize = 32;

/// The most bytes `step` takes in a `Replicate` message: what a primary sums to cut its
/// batches for a replica to fit a frame (`crate::server`'s batches).
pub(crate) fn step_bytes<V: Value>(step: &Replicate<V>) -> usize {
    let rows = match &step.update {
        ShardUpdate::Apply(kvs) | ShardUpdate::Buffer { kvs, .. } => {
            kvs.len().saturating_mul(row_bytes::<V>(kvs.width()))
        }
        ShardUpdate::ApplyBelow(_) => 0,
    };
    let dedupe: usize = step
        .dedupe
        .iter()
        .map(|r| RECORD_BYTES + r.applied.len().saturating_mul(SPAN_BYTES))
        .sum();
    STEP_OVERHEAD.saturating_add(rows).saturating_add(dedupe)
}

/// Room for the steps of one `Replicate` message in a frame of `max_frame` bytes.
pub(crate) fn steps_within(max_frame: usize) -> usize {
    max_frame.saturating_sub(MESSAGE_OVERHEAD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;
    use crate::key::KeyRange;
    use crate::kv::KvPairs;
    use crate::wire::{AppliedSpan, Codec, DedupeRecord, Envelope, Message};
    use proptest::prelude::*;

    fn step(
        keys: Vec<u64>,
        values: Vec<f64>,
        kind: u8,
        records: usize,
        spans: usize,
    ) -> Replicate<f64> {
        let kvs = KvPairs::new(keys, values, 1).unwrap();
        let update = match kind {
            0 => ShardUpdate::Apply(kvs),
            1 => ShardUpdate::Buffer {
                iteration: u32::MAX,
                kvs,
            },
            _ => ShardUpdate::ApplyBelow(u32::MAX),
        };
        let record = |w: u32| DedupeRecord {
            worker: NodeId(u32::MAX - w),
            settled_below: u64::MAX,
            applied: (0..spans as u64)
                .map(|r| AppliedSpan {
                    request: u64::MAX - r,
                    first: u64::MAX - 1,
                    last: u64::MAX,
                })
                .collect(),
        };
        Replicate {
            range: KeyRange::new(u64::MAX - 2, u64::MAX).unwrap(),
            seq: u64::MAX,
            span: u64::MAX,
            update,
            dedupe: (0..records as u32).map(record).collect(),
        }
    }

    /// Encodes `steps` (keys, kind, records, spans) as one `Replicate` message and gives its
    /// frame's length and what the steps are reckoned at.
    fn encoded_and_reckoned(
        steps: Vec<(std::collections::BTreeSet<u64>, u8, usize, usize)>,
    ) -> (usize, usize) {
        let updates: Vec<Replicate<f64>> = steps
            .into_iter()
            .map(|(keys, kind, records, spans)| {
                let keys: Vec<u64> = keys.into_iter().collect();
                let values = keys.iter().map(|&k| f64::from_bits(k)).collect();
                step(keys, values, kind, records, spans)
            })
            .collect();
        let reckoned: usize = updates.iter().map(step_bytes).sum();
        let env = Envelope::new(
            NodeId(u32::MAX),
            NodeId(u32::MAX - 1),
            u64::MAX,
            Message::Replicate { updates },
        );
        let frame = Codec::new(usize::MAX).encode(&env).unwrap();
        (frame.len(), MESSAGE_OVERHEAD + reckoned)
    }

    /// Steps whose every field takes its longest encoding and that carry nothing else: the
    /// reckoning of their overhead alone must hold, however many a batch holds.
    #[test]
    fn bare_steps_never_take_more_than_reckoned() {
        for n in [1, 2, 10, 100] {
            for kind in 0..3 {
                let steps = vec![(std::collections::BTreeSet::new(), kind, 0, 0); n];
                let (frame, reckoned) = encoded_and_reckoned(steps);
                assert!(
                    frame <= reckoned,
                    "{n} steps of kind {kind}: {frame} > {reckoned}"
                );
            }
        }
    }

    proptest! {
        /// What a primary reckons its batches take is never less than their frame, so that a
        /// batch cut to the frame limit by this reckoning is never refused by the codec: steps
        /// of few rows, where the overheads dominate.
        #[test]
        fn a_batch_of_small_steps_never_takes_more_than_reckoned(
            steps in prop::collection::vec(
                (prop::collection::btree_set(any::<u64>(), 0..3), 0u8..3, 0usize..4, 0usize..4),
                1..40,
            ),
        ) {
            let (frame, reckoned) = encoded_and_reckoned(steps);
            prop_assert!(frame <= reckoned, "{frame} > {reckoned}");
        }

        /// The same for steps of many rows, where the rows dominate.
        #[test]
        fn a_batch_of_large_steps_never_takes_more_than_reckoned(
            steps in prop::collection::vec(
                (prop::collection::btree_set(any::<u64>(), 100..400), 0u8..2, 0usize..2, 0usize..2),
                1..4,
            ),
        ) {
            let (frame, reckoned) = encoded_and_reckoned(steps);
            prop_assert!(frame <= reckoned, "{frame} > {reckoned}");
        }
    }
}
