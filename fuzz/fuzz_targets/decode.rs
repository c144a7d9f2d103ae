//! Both directions of the codec, for every value type:
//!
//! - arbitrary bytes into the envelope decoder: both ways of decoding (values copied, values
//!   read in place) must agree, whatever decodes must re-encode, and the re-encoding must
//!   decode to the same envelope;
//! - an arbitrary valid envelope (built from the same bytes, with keys at the edges of the key
//!   space) into the encoder: the frame must decode back to it, so a decoder that refuses a
//!   legal frame is caught.
#![no_main]

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use pserver_core::filter::KeysDigest;
use pserver_core::wire::*;
use pserver_core::*;

fn check<V: Value>(codec: &Codec, data: &[u8]) {
    let decoded = codec.decode::<V>(data);
    assert_eq!(
        codec.decode_bytes::<V>(&Bytes::copy_from_slice(data)),
        decoded,
        "reading values in place decodes what copying them does"
    );
    if let Ok(env) = decoded {
        let frame = codec
            .encode(&env)
            .expect("a decoded envelope re-encodes within the same limit");
        let again = codec
            .decode::<V>(&frame)
            .expect("a re-encoded envelope decodes");
        assert_eq!(again, env, "decode(encode(decode(x))) == decode(x)");
    }
}

/// A key, often at an edge: 0, the largest legal key, or next to a varint boundary.
fn key(u: &mut Unstructured) -> Result<Key> {
    Ok(match u.int_in_range(0..=5)? {
        0 => 0,
        1 => MAX_KEY - u.int_in_range(0..=3)?,
        2 => [127, 128, 16_383, 16_384, 1 << 21][u.choose_index(5)?],
        3 => u.int_in_range(0..=1000)?,
        _ => u.arbitrary::<u64>()? % u64::MAX,
    })
}

fn keys(u: &mut Unstructured) -> Result<Vec<Key>> {
    let mut ks: Vec<Key> = (0..u.int_in_range(0..=24)?)
        .map(|_| key(u))
        .collect::<Result<_>>()?;
    ks.sort_unstable();
    ks.dedup();
    Ok(ks)
}

fn kvs<V: Value>(u: &mut Unstructured) -> Result<KvPairs<V>> {
    let ks = keys(u)?;
    let width = u.int_in_range(1..=3)?;
    let values = (0..ks.len() * width)
        .map(|_| Ok(V::from_f64(f64::from(u.arbitrary::<i16>()?))))
        .collect::<Result<Vec<V>>>()?;
    Ok(KvPairs::new(ks, values, width).expect("sorted distinct keys"))
}

fn ranges(u: &mut Unstructured) -> Result<RangeList> {
    let bounds = keys(u)?;
    let mut rs: Vec<KeyRange> = bounds
        .chunks_exact(2)
        .map(|p| KeyRange::new(p[0], p[1]).expect("ordered"))
        .filter(|r| !r.is_empty())
        .collect();
    if u.arbitrary::<bool>()? {
        // A last range that ends at the end of the key space.
        let start = rs.last().map_or(0, |r| r.end());
        if let Ok(r) = KeyRange::new(start, u64::MAX) {
            rs.push(r);
        }
    }
    Ok(RangeList::new(rs).expect("sorted, disjoint, non-empty"))
}

fn slice(u: &mut Unstructured) -> Result<SliceRef> {
    Ok(SliceRef {
        request: u.arbitrary()?,
        slice: u.arbitrary()?,
    })
}

fn message<V: Value>(u: &mut Unstructured) -> Result<Message<V>> {
    Ok(match u.int_in_range(0..=12)? {
        0 => Message::Push(Push {
            slice: slice(u)?,
            iteration: u.arbitrary()?,
            covers: pserver_core::pace::Coverage(u.arbitrary()?),
            settled_below: u.arbitrary()?,
            kvs: kvs(u)?,
        }),
        1 => Message::Pull(Pull {
            slice: slice(u)?,
            iteration: u.arbitrary()?,
            keys: KeySelection::Keys(KeyList::new(keys(u)?).expect("sorted")),
        }),
        2 => Message::Pull(Pull {
            slice: slice(u)?,
            iteration: u.arbitrary()?,
            keys: KeySelection::Ranges(ranges(u)?),
        }),
        3 => Message::PullReply(PullReply {
            slice: slice(u)?,
            complete_below: u.arbitrary()?,
            kvs: kvs(u)?,
            resume: if u.arbitrary()? { Some(key(u)?) } else { None },
        }),
        4 => Message::Redirect {
            slice: slice(u)?,
            epoch: u.arbitrary()?,
        },
        5 => Message::Progress {
            finished_below: u.arbitrary()?,
            taken_below: u.arbitrary()?,
        },
        6 => Message::SlotAsk {
            slice: slice(u)?,
            bytes: u.arbitrary()?,
        },
        7 => Message::SlotGrant(slice(u)?),
        // Key caching's: values without keys, plain or packed, and names of lists.
        8 => {
            let rows = kvs(u)?;
            Message::PushCached(PushCached {
                slice: slice(u)?,
                iteration: u.arbitrary()?,
                covers: pserver_core::pace::Coverage(u.arbitrary()?),
                settled_below: u.arbitrary()?,
                keys: KeysDigest::of(rows.keys()),
                values: if u.arbitrary()? {
                    RowValues::packed(&rows)
                } else {
                    RowValues::of(&rows)
                },
            })
        }
        9 => {
            let rows = kvs(u)?;
            Message::PullValues(PullValues {
                slice: slice(u)?,
                complete_below: u.arbitrary()?,
                values: RowValues::packed(&rows),
            })
        }
        11 => {
            let rows = kvs(u)?;
            Message::PullRows(PullRows {
                slice: slice(u)?,
                complete_below: u.arbitrary()?,
                keys: KeyList::new(rows.keys().to_vec())
                    .map_err(|_| arbitrary::Error::IncorrectFormat)?,
                values: RowValues::packed(&rows),
                resume: if u.arbitrary()? { Some(key(u)?) } else { None },
            })
        }
        10 => Message::PullCached(PullCached {
            slice: slice(u)?,
            iteration: u.arbitrary()?,
            keys: KeysDigest::of(&keys(u)?),
        }),
        _ => Message::Heartbeat {
            sent_at: u.arbitrary()?,
            term: u.arbitrary()?,
            at: if u.arbitrary()? {
                Some(pserver_core::pace::Position {
                    iteration: u.arbitrary()?,
                    covered: pserver_core::pace::Coverage(u.arbitrary()?),
                    speed: u.arbitrary()?,
                })
            } else {
                None
            },
        },
    })
}

fn round_trip<V: Value>(codec: &Codec, data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(body) = message::<V>(&mut u) else {
        return;
    };
    let (Ok(from), Ok(to), Ok(epoch)) = (u.arbitrary(), u.arbitrary(), u.arbitrary()) else {
        return;
    };
    let env = Envelope::new(NodeId(from), NodeId(to), epoch, body);
    let frame = codec.encode(&env).expect("small envelopes encode");
    assert_eq!(
        codec.decode::<V>(&frame).as_ref(),
        Ok(&env),
        "decode(encode(e)) == e"
    );
}

fuzz_target!(|data: &[u8]| {
    let codec = Codec::new(1 << 20);
    check::<f32>(&codec, data);
    check::<f64>(&codec, data);
    check::<i64>(&codec, data);
    round_trip::<f32>(&codec, data);
    round_trip::<i64>(&codec, data);
});
