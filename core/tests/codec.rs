//! The wire codec (ARCHITECTURE.md §5): every message kind round-trips, and bad frames are refused
//! with a typed error.

use proptest::prelude::*;
use pserver_core::ring::*;
use pserver_core::wire::*;
use pserver_core::wire::{ClusterConfig, Codec, DecodeError, EncodeError};
use pserver_core::*;

fn node() -> impl Strategy<Value = NodeId> {
    any::<u32>().prop_map(NodeId)
}

/// Keys from everywhere, weighted towards the edges: 0, the largest legal key, and both sides
/// of the varint length boundaries that delta encoding crosses.
fn key() -> impl Strategy<Value = Key> {
    let boundary = prop_oneof![
        Just(127u64),
        Just(128),
        Just(16_383),
        Just(16_384),
        Just(1 << 21),
        Just((1 << 21) - 1)
    ];
    prop_oneof![
        0u64..1000,
        any::<u64>().prop_map(|k| k % u64::MAX),
        (MAX_KEY - 1000)..=MAX_KEY,
        Just(0),
        Just(MAX_KEY),
        boundary,
    ]
}

/// Ranges, some of which end at the end of the key space.
fn range() -> impl Strategy<Value = KeyRange> {
    prop_oneof![
        (key(), key()).prop_map(|(a, b)| KeyRange::new(a.min(b), a.max(b)).unwrap()),
        key().prop_map(|a| KeyRange::new(a, u64::MAX).unwrap()),
    ]
}

/// Keys with gaps, or consecutive keys (which travel as their first key alone).
fn keys() -> impl Strategy<Value = Vec<Key>> {
    prop_oneof![
        proptest::collection::btree_set(key(), 0..40).prop_map(|s| s.into_iter().collect()),
        (key(), 0usize..40).prop_map(|(first, n)| (first..=MAX_KEY).take(n).collect()),
    ]
}

fn kvs<V: Value + Arbitrary>() -> impl Strategy<Value = KvPairs<V>> {
    (keys(), 1usize..4).prop_flat_map(|(keys, width)| {
        proptest::collection::vec(any::<V>(), keys.len() * width)
            .prop_map(move |values| KvPairs::new(keys.clone(), values, width).unwrap())
    })
}

fn slice() -> impl Strategy<Value = SliceRef> {
    (any::<u64>(), any::<u32>()).prop_map(|(request, slice)| SliceRef { request, slice })
}

fn dedupe() -> impl Strategy<Value = Vec<DedupeRecord>> {
    let span = (any::<u64>(), key(), key()).prop_map(|(request, first, last)| AppliedSpan {
        request,
        first,
        last,
    });
    proptest::collection::vec(
        (node(), any::<u64>(), proptest::collection::vec(span, 0..4)).prop_map(
            |(worker, settled_below, applied)| DedupeRecord {
                worker,
                settled_below,
                applied: applied.into(),
            },
        ),
        0..4,
    )
}

fn shard_update<V: Value + Arbitrary>() -> impl Strategy<Value = ShardUpdate<V>> {
    prop_oneof![
        kvs::<V>().prop_map(ShardUpdate::Apply),
        (any::<u32>(), kvs::<V>())
            .prop_map(|(iteration, kvs)| ShardUpdate::Buffer { iteration, kvs }),
        any::<u32>().prop_map(ShardUpdate::ApplyBelow),
    ]
}

fn message<V: Value + Arbitrary>() -> impl Strategy<Value = Message<V>> {
    let role = prop_oneof![
        Just(Role::Coordinator),
        Just(Role::Server),
        Just(Role::Worker)
    ];
    let config = (
        (any::<u64>(), node()),
        proptest::collection::vec(node(), 0..8),
        proptest::collection::vec(node(), 0..8),
        (any::<u32>(), any::<u32>(), any::<u64>()),
        prop_oneof![
            Just(Consistency::Sequential),
            any::<u32>().prop_map(Consistency::BoundedDelay),
            Just(Consistency::Eventual)
        ],
        (
            proptest::collection::vec(node(), 0..3),
            proptest::collection::vec(node(), 0..3),
        ),
    )
        .prop_map(
            |(
                (epoch, coordinator),
                servers,
                workers,
                (vnodes, replicas, seed),
                consistency,
                (joining, leaving),
            )| {
                // The field must round-trip: any members, drawn from the others.
                let left = workers.iter().chain(&joining).copied().step_by(2).collect();
                Message::Config(ClusterConfig {
                    epoch,
                    coordinator,
                    standbys: left_standbys(coordinator),
                    term: epoch.wrapping_mul(3),
                    servers,
                    workers,
                    ring: RingConfig {
                        vnodes,
                        replicas,
                        seed,
                        // Any key space, drawn from the seed: the field must round-trip.
                        key_space: seed.rotate_left(17) | 1,
                    },
                    consistency,
                    left,
                    lost: (0..epoch % 3)
                        .map(|i| KeyRange::new(i * 10, i * 10 + 5).unwrap())
                        .collect(),
                    incarnations: joining.iter().map(|&n| (n, epoch ^ 7)).collect(),
                    pace: pserver_core::pace::Pace {
                        tau: (epoch % 2 == 0).then_some((epoch % 9) as u32),
                        skipped_below: leaving.iter().map(|&n| (n, epoch as u32)).collect(),
                        moves: leaving
                            .iter()
                            .enumerate()
                            .map(|(i, &from)| pserver_core::pace::ShareMove {
                                share: i as u32,
                                from,
                                at: (epoch as u32).wrapping_mul(3),
                            })
                            .collect(),
                    },
                    joining,
                    shares: leaving.iter().rev().copied().collect(),
                    leaving,
                    checkpoints: pserver_core::wire::Checkpoints {
                        every: (epoch % 5) as u32,
                        taken: (epoch as u32).wrapping_mul(11),
                        complete: (epoch as u32).wrapping_mul(7),
                    },
                })
            },
        );
    let selection = prop_oneof![
        proptest::collection::btree_set(key(), 0..8).prop_map(|bounds| {
            let b: Vec<Key> = bounds.into_iter().collect();
            let ranges = b
                .chunks_exact(2)
                .map(|p| KeyRange::new(p[0], p[1]).unwrap())
                .collect();
            KeySelection::Ranges(RangeList::new(ranges).unwrap())
        }),
        keys().prop_map(|k| KeySelection::Keys(KeyList::new(k).unwrap())),
    ];
    let pending = proptest::collection::vec(
        (any::<u32>(), kvs::<V>()).prop_map(|(iteration, kvs)| BufferedPush { iteration, kvs }),
        0..3,
    );
    let clocks = proptest::collection::vec(
        (
            node(),
            proptest::collection::vec((range(), any::<u32>()), 0..4),
        )
            .prop_map(|(worker, segments)| ClockRecord { worker, segments }),
        0..3,
    );
    let replicate = (
        range(),
        (any::<u64>(), any::<u64>()),
        shard_update::<V>(),
        dedupe(),
    )
        .prop_map(|(range, (seq, span), update, dedupe)| Replicate {
            range,
            seq,
            span,
            update,
            dedupe: dedupe.into(),
        });
    prop_oneof![
        (role, any::<u64>()).prop_map(|(role, incarnation)| Message::Register {
            role,
            incarnation,
            keys_below: None,
            checkpoints: (0..incarnation % 4)
                .map(|i| (incarnation as u32) >> i)
                .collect(),
        }),
        any::<u32>().prop_map(|cut| Message::Checkpointed { cut }),
        any::<u32>().prop_map(|cut| Message::CheckpointTaken { cut }),
        config,
        Just(Message::ConfigRequest),
        (
            any::<u64>(),
            proptest::option::of((any::<u32>(), any::<u16>(), any::<u32>())),
            any::<u64>(),
        )
            .prop_map(|(sent_at, at, term)| Message::Heartbeat {
                sent_at,
                term,
                at: at.map(|(iteration, covered, speed)| pserver_core::pace::Position {
                    iteration,
                    covered: pserver_core::pace::Coverage(covered),
                    speed,
                }),
            }),
        (
            slice(),
            any::<u32>(),
            any::<u16>(),
            any::<u64>(),
            kvs::<V>()
        )
            .prop_map(|(slice, iteration, covers, settled_below, kvs)| {
                Message::Push(Push {
                    slice,
                    iteration,
                    covers: pserver_core::pace::Coverage(covers),
                    settled_below,
                    kvs,
                })
            }),
        slice().prop_map(Message::PushAck),
        (slice(), any::<u32>(), selection).prop_map(|(slice, iteration, keys)| {
            Message::Pull(Pull {
                slice,
                iteration,
                keys,
            })
        }),
        (slice(), any::<u32>(), kvs::<V>(), any::<Option<u64>>()).prop_map(
            |(slice, complete_below, kvs, resume)| {
                Message::PullReply(PullReply {
                    slice,
                    complete_below,
                    kvs,
                    resume: resume.map(|k| k % MAX_KEY),
                })
            }
        ),
        (slice(), any::<u64>()).prop_map(|(slice, epoch)| Message::Redirect { slice, epoch }),
        (any::<u32>(), any::<u32>()).prop_map(|(finished_below, taken_below)| {
            Message::Progress {
                finished_below,
                taken_below,
            }
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(finished_below, taken_below)| {
            Message::ProgressAck {
                finished_below,
                taken_below,
            }
        }),
        proptest::collection::vec(replicate, 0..3)
            .prop_map(|updates| Message::Replicate { updates }),
        proptest::collection::vec(
            (range(), any::<Option<u64>>()).prop_map(|(range, seq)| ShardAck { range, seq }),
            0..3
        )
        .prop_map(|acks| Message::ReplicateAck { acks }),
        (
            (range(), any::<u64>(), kvs::<V>(), any::<bool>()),
            pending,
            any::<u32>(),
            dedupe(),
            clocks,
        )
            .prop_map(
                |((range, seq, values, with_state), pending, applied_below, dedupe, clocks)| {
                    Message::Transfer(Transfer {
                        range,
                        seq,
                        state: with_state.then(|| values.clone()),
                        values,
                        pending,
                        applied_below,
                        dedupe,
                        clocks,
                    })
                }
            ),
        (range(), any::<u64>()).prop_map(|(range, seq)| Message::TransferAck { range, seq }),
        any::<u64>().prop_map(|epoch| Message::CaughtUp { epoch }),
        Just(Message::Leave),
        Just(Message::ProgressRequest),
        proptest::collection::vec(range(), 0..4).prop_map(Message::Lost),
        (
            any::<u64>(),
            proptest::collection::vec(any::<u32>().prop_map(NodeId), 0..3)
        )
            .prop_map(|(sent_at, degraded)| Message::HeartbeatAck { sent_at, degraded }),
        (slice(), any::<u32>()).prop_map(|(slice, bytes)| Message::SlotAsk { slice, bytes }),
        slice().prop_map(Message::SlotGrant),
    ]
}

fn envelope<V: Value + Arbitrary>() -> impl Strategy<Value = Envelope<V>> {
    (node(), node(), any::<u64>(), message::<V>())
        .prop_map(|(from, to, epoch, body)| Envelope::new(from, to, epoch, body))
}

fn round_trips<V: Value>(env: &Envelope<V>) -> Result<(), TestCaseError> {
    let codec = Codec::default();
    let frame = codec.encode(env).unwrap();
    prop_assert_eq!(&codec.decode::<V>(&frame).unwrap(), env);
    // Every strict prefix is refused, never misread and never a panic.
    for cut in 0..frame.len() {
        prop_assert!(
            codec.decode::<V>(&frame[..cut]).is_err(),
            "prefix {} decoded",
            cut
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn every_message_kind_round_trips_with_f32_values(env in envelope::<f32>()) {
        round_trips(&env)?;
    }

    #[test]
    fn every_message_kind_round_trips_with_f64_values(env in envelope::<f64>()) {
        round_trips(&env)?;
    }

    #[test]
    fn every_message_kind_round_trips_with_i64_values(env in envelope::<i64>()) {
        round_trips(&env)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let codec = Codec::default();
        if let Ok(env) = codec.decode::<i64>(&bytes) {
            let again = codec.encode(&env).unwrap();
            prop_assert_eq!(codec.decode::<i64>(&again).unwrap(), env);
        }
    }
}

fn push(keys: Vec<Key>, values: Vec<f32>) -> Envelope<f32> {
    let kvs = KvPairs::new(keys, values, 1).unwrap();
    let slice = SliceRef {
        request: 1,
        slice: 0,
    };
    Envelope::new(
        NodeId(1),
        NodeId(2),
        7,
        Message::Push(Push {
            slice,
            iteration: 3,
            covers: pserver_core::pace::Coverage::WHOLE,
            settled_below: 1,
            kvs,
        }),
    )
}

#[test]
fn keys_travel_as_delta_varints_and_values_as_raw_little_endian() {
    let keys: Vec<Key> = (1 << 40..(1 << 40) + 1000).collect();
    let values: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let frame = Codec::default()
        .encode(&push(keys, values.clone()))
        .unwrap();
    // 1000 dense keys cost ~1 byte each, 1000 f32 values exactly 4 bytes each.
    assert!(
        frame.len() < 1000 + 4000 + 40,
        "frame is {} bytes",
        frame.len()
    );
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert!(frame.windows(raw.len()).any(|w| w == raw.as_slice()));
}

#[test]
fn a_frame_over_the_limit_is_refused_both_ways() {
    let env = push((0..100).collect(), vec![1.0; 100]);
    let big = Codec::default().encode(&env).unwrap();
    let small = Codec::new(100);
    assert!(matches!(
        small.encode(&env),
        Err(EncodeError::FrameTooLarge { limit: 100, .. })
    ));
    assert_eq!(
        small.decode::<f32>(&big),
        Err(DecodeError::FrameTooLarge {
            len: big.len(),
            limit: 100
        })
    );
    let mut buf = vec![9u8];
    assert!(small.encode_into(&env, &mut buf).is_err());
    assert_eq!(
        buf,
        vec![9u8],
        "a refused encode leaves the buffer as it was"
    );
}

#[test]
fn an_unknown_version_is_refused_with_a_clear_error() {
    let mut env = push(vec![1], vec![1.0]);
    env.version = PROTOCOL_VERSION + 1;
    let frame = Codec::default().encode(&env).unwrap();
    let err = Codec::default().decode::<f32>(&frame).unwrap_err();
    assert_eq!(
        err,
        DecodeError::UnsupportedVersion {
            got: PROTOCOL_VERSION + 1,
            supported: PROTOCOL_VERSION
        }
    );
    assert!(err.to_string().contains(&format!(
        "unsupported protocol version {}",
        PROTOCOL_VERSION + 1
    )));
}

#[test]
fn a_frame_of_another_value_type_is_refused() {
    let frame = Codec::default().encode(&push(vec![1], vec![1.0])).unwrap();
    assert_eq!(
        Codec::default().decode::<i64>(&frame),
        Err(DecodeError::ValueType {
            expected: "i64",
            got: "f32"
        })
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let codec = Codec::default();
    let mut frame = codec.encode(&push(vec![], vec![])).unwrap().to_vec();
    frame.push(0);
    assert_eq!(
        codec.decode::<f32>(&frame),
        Err(DecodeError::TrailingBytes(1))
    );
    // After a trailer, an extra byte moves the trailer off its alignment.
    let mut frame = codec.encode(&push(vec![1], vec![1.0])).unwrap().to_vec();
    frame.push(0);
    assert!(codec.decode::<f32>(&frame).is_err());
}

/// Where the trailer length sits in the frames of [`push`]: after the one-byte version, value
/// type, sender, addressee and epoch.
const TRAILER_FIELD: core::ops::Range<usize> = 5..9;

/// A frame of [`push`] whose key-value pairs are `pairs` (width, count and keys, as the wire
/// has them) and whose trailer is `values`, laid out as an encoder would.
fn push_frame_with(pairs: &[u8], values: &[u8]) -> Vec<u8> {
    let frame = Codec::default().encode(&push(vec![], vec![])).unwrap();
    assert_eq!(frame[0], PROTOCOL_VERSION as u8);
    assert_eq!(&frame[TRAILER_FIELD], &[0; 4], "no trailer");
    // An empty KvPairs encodes as width=1, count=0, no key bytes: 3 bytes at the end.
    assert_eq!(&frame[frame.len() - 3..], &[1, 0, 0]);
    let mut out = frame[..frame.len() - 3].to_vec();
    out.extend_from_slice(pairs);
    if !values.is_empty() {
        out.resize(out.len().div_ceil(TRAILER_ALIGN) * TRAILER_ALIGN, 0);
        out.extend_from_slice(values);
    }
    out[TRAILER_FIELD].copy_from_slice(&(values.len() as u32).to_le_bytes());
    out
}

#[test]
fn decoding_refuses_pairs_that_break_their_invariants() {
    let codec = Codec::default();
    let refused =
        |pairs: &[u8], values: &[u8]| codec.decode::<f32>(&push_frame_with(pairs, values));
    // Sanity: a well-formed single pair decodes.
    let ok = push_frame_with(&[1, 1, 1, 5], &[0, 0, 128, 63]);
    assert_eq!(codec.decode::<f32>(&ok).unwrap(), push(vec![5], vec![1.0]));
    assert_eq!(ok, codec.encode(&push(vec![5], vec![1.0])).unwrap());
    assert_eq!(
        refused(&[0, 0, 0], &[]),
        Err(DecodeError::Malformed),
        "zero width"
    );
    // Two keys and one key varint: the run 5, 6.
    let run = push_frame_with(&[1, 2, 1, 5], &[0; 8]);
    assert_eq!(
        codec.decode::<f32>(&run).unwrap(),
        push(vec![5, 6], vec![0.0, 0.0])
    );
    assert_eq!(
        refused(&[1, 3, 1, 5], &[0; 8]),
        Err(DecodeError::Malformed),
        "a run of 3 keys with the values of 2"
    );
    // A run of 2^40 keys with 8 value bytes: refused before anything is allocated.
    assert_eq!(
        refused(&[1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 1, 5], &[0; 8]),
        Err(DecodeError::Malformed),
        "a run claiming 2^40 keys"
    );
    // A run of two from u64::MAX - 1 would reach the reserved key.
    let mut past = vec![1, 2, 10];
    past.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert_eq!(
        refused(&past, &[0; 8]),
        Err(DecodeError::Malformed),
        "a run past the reserved key"
    );
    assert_eq!(
        refused(&[1, 1, 1, 5], &[0, 0, 0]),
        Err(DecodeError::Malformed),
        "3 value bytes for one f32"
    );
    assert_eq!(
        refused(&[1, 1, 2, 5, 0], &[0; 4]),
        Err(DecodeError::Malformed),
        "trailing key byte"
    );
    // Keys 5 and then 5 + u64::MAX: overflow.
    let mut overflow = vec![1, 2, 11, 5];
    overflow.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert_eq!(
        refused(&overflow, &[0; 8]),
        Err(DecodeError::Malformed),
        "key overflow"
    );
    // The reserved key u64::MAX.
    let mut reserved = vec![1, 1, 10];
    reserved.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert_eq!(
        refused(&reserved, &[0; 4]),
        Err(DecodeError::Malformed),
        "reserved key"
    );
}

#[test]
fn a_trailer_must_be_aligned_padded_with_zeros_and_taken_whole() {
    let codec = Codec::default();
    let ok = push_frame_with(&[1, 1, 1, 5], &[0, 0, 128, 63]);
    let pad = ok.len() - 4 - push_frame_with(&[1, 1, 1, 5], &[]).len();
    assert!(
        pad > 0,
        "the frames of `push` need padding before their trailer"
    );
    assert!(codec.decode::<f32>(&ok).is_ok());

    let mut nonzero = ok.clone();
    nonzero[ok.len() - 5] = 1;
    assert_eq!(
        codec.decode::<f32>(&nonzero),
        Err(DecodeError::TrailingBytes(pad))
    );
    // Eight more bytes of padding keep the trailer aligned, but are not the fewest.
    let mut wide = ok[..ok.len() - 4].to_vec();
    wide.extend_from_slice(&[0; 8]);
    wide.extend_from_slice(&ok[ok.len() - 4..]);
    assert_eq!(
        codec.decode::<f32>(&wide),
        Err(DecodeError::TrailingBytes(pad + 8))
    );
    // Values left over in the trailer.
    assert_eq!(
        codec.decode::<f32>(&push_frame_with(&[1, 1, 1, 5], &[0; 8])),
        Err(DecodeError::TrailingBytes(4))
    );
    // A trailer longer than the frame.
    let mut long = ok.clone();
    long[TRAILER_FIELD].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(codec.decode::<f32>(&long), Err(DecodeError::Malformed));
    // A trailer that does not start at an aligned offset.
    let mut shifted = ok.clone();
    shifted[TRAILER_FIELD].copy_from_slice(&5u32.to_le_bytes());
    assert_eq!(codec.decode::<f32>(&shifted), Err(DecodeError::Malformed));
}

#[test]
fn a_reversed_key_range_is_refused() {
    let env = Envelope::<f32>::new(
        NodeId(1),
        NodeId(2),
        0,
        Message::TransferAck {
            range: KeyRange::new(3, 9).unwrap(),
            seq: 0,
        },
    );
    let mut frame = Codec::default().encode(&env).unwrap().to_vec();
    // The range is (3, 9) followed by seq 0: swap the bounds.
    let n = frame.len();
    assert_eq!(&frame[n - 3..], &[3, 9, 0]);
    frame[n - 3] = 9;
    frame[n - 2] = 3;
    assert_eq!(
        Codec::default().decode::<f32>(&frame),
        Err(DecodeError::Malformed)
    );
}

#[test]
fn unknown_message_kinds_are_refused() {
    let env = Envelope::<f32>::new(NodeId(1), NodeId(2), 0, Message::ConfigRequest);
    let mut frame = Codec::default().encode(&env).unwrap().to_vec();
    *frame.last_mut().unwrap() = 100;
    assert_eq!(
        Codec::default().decode::<f32>(&frame),
        Err(DecodeError::UnknownKind(100))
    );
    // The last kind is KINDS - 1: KINDS stays in step with the enum. A bodiless kind's tag is
    // the frame's last byte; every tag up to KINDS - 1 is known, KINDS is not.
    let kinds = Message::<f32>::KINDS;
    *frame.last_mut().unwrap() = u8::try_from(kinds).unwrap();
    assert_eq!(
        Codec::default().decode::<f32>(&frame),
        Err(DecodeError::UnknownKind(kinds))
    );
    *frame.last_mut().unwrap() = u8::try_from(kinds - 1).unwrap();
    assert_ne!(
        Codec::default().decode::<f32>(&frame),
        Err(DecodeError::UnknownKind(kinds - 1))
    );
}

/// Standbys for a configuration of `coordinator`: some other node, so that the field is
/// exercised.
fn left_standbys(coordinator: NodeId) -> Vec<NodeId> {
    vec![NodeId(coordinator.0.wrapping_add(1))]
}
