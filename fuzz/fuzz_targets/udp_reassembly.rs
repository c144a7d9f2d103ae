//! Arbitrary datagram sequences into the UDP reassembler: fragments of real frames delivered
//! duplicated, reordered, truncated, with headers rewritten to lie about their frame, id,
//! place or count, and raw garbage datagrams, with time moving on. The reassembler must never
//! panic, never hold more than its bound, and yield only frames that were sent whole.
//!
//! Run it with `cargo +nightly fuzz run udp_reassembly` (docs/verification.md, "Fuzzing").

#![no_main]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pserver_core::NodeId;
use pserver_transport::Bytes;
use pserver_transport::udp::fragment::{
    FragmentHeader, HEADER_LEN, Reassembler, ReassemblyLimits, fragment,
};

/// Real frames come from nodes 0..4; garbage from 200 and up, so that a forged datagram,
/// which may well be a valid frame of its own, never lands in a real frame's reassembly.
const FORGED_FROM: u32 = 200;

#[derive(Arbitrary, Debug)]
struct Input {
    max_payload: u8,
    frames: Vec<(u8, u8, Vec<u8>)>,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Deliver(u16),
    Truncate(u16, u16),
    SetFrame(u16, u8),
    SetIndex(u16, u16),
    SetCount(u16, u16),
    SetLength(u16, u32),
    SetFrom(u16, u8),
    Advance(u16),
    Forged(u8, Vec<u8>),
}

fuzz_target!(|input: Input| {
    let limits = ReassemblyLimits {
        max_frame: 4096,
        max_held: 2048,
        max_partial: 8,
        timeout: Duration::from_millis(50),
    };
    let mut r = Reassembler::new(limits);
    let mut now = Instant::now();
    let max_payload = usize::from(input.max_payload % 64) + 1;
    let mut sent = BTreeSet::new();
    let mut datagrams: Vec<Vec<u8>> = Vec::new();
    for (i, (from, repeat, data)) in input.frames.iter().take(16).enumerate() {
        let from = NodeId(u32::from(from % 4));
        // Repeating the data gives frames longer than the input.
        let frame: Vec<u8> = data
            .iter()
            .copied()
            .cycle()
            .take(data.len() * usize::from(repeat % 8 + 1))
            .collect();
        let Ok(ds) = fragment(from, i as u64 % 4, &frame, max_payload) else {
            continue;
        };
        sent.insert(frame);
        datagrams.extend(ds.iter().map(|d| d.to_vec()));
    }
    let pick = |i: u16, n: usize| usize::from(i) % n.max(1);
    for op in input.ops {
        let n = datagrams.len();
        let yielded = match op {
            Op::Deliver(i) if n > 0 => r.accept(now, Bytes::from(datagrams[pick(i, n)].clone())),
            Op::Truncate(i, cut) if n > 0 => {
                let d = &mut datagrams[pick(i, n)];
                d.truncate(d.len().saturating_sub(usize::from(cut % 64)));
                continue;
            }
            Op::SetFrame(i, v) if n > 0 => {
                rewrite(&mut datagrams[pick(i, n)], |h| h.frame = u64::from(v % 4))
            }
            Op::SetIndex(i, v) if n > 0 => rewrite(&mut datagrams[pick(i, n)], |h| h.index = v),
            Op::SetCount(i, v) if n > 0 => rewrite(&mut datagrams[pick(i, n)], |h| h.count = v),
            Op::SetLength(i, v) if n > 0 => {
                rewrite(&mut datagrams[pick(i, n)], |h| h.frame_len = v)
            }
            Op::SetFrom(i, v) if n > 0 => rewrite(&mut datagrams[pick(i, n)], |h| {
                h.from = NodeId(u32::from(v % 4))
            }),
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(ms % 128));
                r.expire(now);
                continue;
            }
            Op::Forged(from, mut bytes) => {
                if bytes.len() >= HEADER_LEN {
                    let id = FORGED_FROM + u32::from(from % 4);
                    bytes[4..8].copy_from_slice(&id.to_le_bytes());
                }
                r.accept(now, Bytes::from(bytes))
            }
            _ => continue,
        };
        assert!(r.held_bytes() <= limits.max_held, "{} held", r.held_bytes());
        assert!(r.partial_frames() <= limits.max_partial);
        if let Ok(Some((from, frame))) = yielded {
            assert!(frame.len() <= limits.max_frame);
            if from.0 < FORGED_FROM {
                // Which node a frame is from is the transport's to check (against the source
                // address); a rewritten header may move a frame to another sender here.
                assert!(
                    sent.contains(frame.as_ref()),
                    "yielded a frame nobody sent: {from} {frame:?}"
                );
            }
        }
    }
});

/// Rewrites a datagram's header (no-op for one too short to have one).
fn rewrite(
    d: &mut Vec<u8>,
    change: impl FnOnce(&mut FragmentHeader),
) -> Result<Option<(NodeId, Bytes)>, pserver_transport::udp::fragment::FragmentError> {
    if let Ok(mut h) = FragmentHeader::read(d) {
        change(&mut h);
        let mut out = pserver_transport::bytes::BytesMut::new();
        h.write(&mut out);
        d[..HEADER_LEN].copy_from_slice(&out);
    }
    Ok(None)
}
