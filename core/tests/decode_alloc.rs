//! Decoding never allocates more than the frame's length warrants: a short frame that claims a
//! huge count is refused before anything is reserved for that count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pserver_core::wire::*;
use pserver_core::wire::{Codec, DecodeError};
use pserver_core::*;

/// Counts the bytes this thread allocates, so parallel tests do not disturb the count.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocated_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

fn varint(mut x: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
    out
}

/// Protocol version, value type f32, from 1, to 2, epoch 0, no trailer.
const HEADER: [u8; 9] = [PROTOCOL_VERSION as u8, 1, 1, 2, 0, 0, 0, 0, 0];

#[test]
fn a_short_frame_claiming_2_pow_40_keys_is_refused_before_allocating() {
    // Push { slice: (0, 0), iteration: 0, covers: 0, settled_below: 0, kvs: width 1,
    // count 2^40, ... }.
    let mut frame = HEADER.to_vec();
    frame.extend_from_slice(&[4, 0, 0, 0, 0, 0, 1]);
    frame.extend(varint(1 << 40));
    let codec = Codec::default();
    let (result, bytes) = allocated_during(|| codec.decode::<f32>(&frame));
    assert!(result.is_err());
    assert!(
        bytes < 64,
        "decoding {} bytes allocated {bytes} bytes",
        frame.len()
    );

    // The same claim with a key blob of 10 bytes present.
    frame.push(10);
    frame.extend_from_slice(&[1; 10]);
    let (result, bytes) = allocated_during(|| codec.decode::<f32>(&frame));
    assert_eq!(result, Err(DecodeError::Malformed));
    assert!(
        bytes < 64,
        "decoding {} bytes allocated {bytes} bytes",
        frame.len()
    );
}

#[test]
fn a_short_frame_claiming_2_pow_40_servers_is_refused_before_allocating() {
    // Config { epoch 0, coordinator 0, servers: 2^40 of them } and nothing more.
    let mut frame = HEADER.to_vec();
    frame.extend_from_slice(&[1, 0, 0]);
    frame.extend(varint(1 << 40));
    frame.extend_from_slice(&[1, 2, 3]);
    let (result, bytes) = allocated_during(|| Codec::default().decode::<f32>(&frame));
    assert_eq!(result, Err(DecodeError::Truncated));
    assert!(
        bytes <= 16 * 4,
        "decoding {} bytes allocated {bytes} bytes",
        frame.len()
    );
}

#[test]
fn a_short_pull_claiming_2_pow_40_keys_is_refused_before_allocating() {
    // Pull { slice: (0, 0), iteration: 0, keys: Keys(count 2^40, blob of 3 bytes) }.
    let mut frame = HEADER.to_vec();
    frame.extend_from_slice(&[6, 0, 0, 0, 1]);
    frame.extend(varint(1 << 40));
    frame.extend_from_slice(&[3, 1, 1, 1]);
    let (result, bytes) = allocated_during(|| Codec::default().decode::<f32>(&frame));
    assert_eq!(result, Err(DecodeError::Malformed));
    assert!(
        bytes < 64,
        "decoding {} bytes allocated {bytes} bytes",
        frame.len()
    );
}

/// A push of 1000 pairs with keys `0, step, 2 * step, ...`.
fn push_of_1000(step: u64) -> Envelope<f32> {
    let kvs = KvPairs::new((0..1000).map(|i| i * step).collect(), vec![1.0f32; 1000], 1).unwrap();
    let slice = SliceRef {
        request: 0,
        slice: 0,
    };
    Envelope::new(
        NodeId(1),
        NodeId(2),
        0,
        Message::Push(Push {
            slice,
            iteration: 0,
            covers: pserver_core::pace::Coverage::WHOLE,
            settled_below: 0,
            kvs,
        }),
    )
}

#[test]
fn the_counter_sees_what_decoding_allocates() {
    // Guards the guard: a real push of 1000 sparse pairs does allocate its keys and values,
    // and the counter shows it.
    let env = push_of_1000(2);
    let frame = Codec::default().encode(&env).unwrap();
    let (result, bytes) = allocated_during(|| Codec::default().decode::<f32>(&frame));
    assert_eq!(result.unwrap(), env);
    assert!(bytes >= 1000 * 12, "allocated only {bytes} bytes");
}

#[test]
fn a_dense_push_decodes_without_a_key_list() {
    let env = push_of_1000(1);
    let frame = Codec::default().encode(&env).unwrap();
    let (result, bytes) = allocated_during(|| Codec::default().decode::<f32>(&frame));
    assert_eq!(result.unwrap(), env);
    assert!(
        (1000 * 4..1000 * 4 + 256).contains(&bytes),
        "allocated {bytes} bytes for 4000 bytes of values"
    );
}

#[test]
fn a_push_decoded_from_shared_bytes_reads_its_values_in_the_frame() {
    for step in [1, 2] {
        let env = push_of_1000(step);
        let frame = Codec::default().encode(&env).unwrap();
        let (result, bytes) = allocated_during(|| Codec::default().decode_bytes::<f32>(&frame));
        let decoded = result.unwrap();
        assert_eq!(decoded, env);
        let Message::Push(push) = &decoded.body else {
            panic!("a push decodes as a push");
        };
        let values = push.kvs.values().as_ptr_range();
        let frame_range = frame.as_ptr_range();
        assert!(
            frame_range.start <= values.start.cast() && values.end.cast() <= frame_range.end,
            "the values are read where they are in the frame"
        );
        // Only the sparse push's key list is allocated, none of the 4,000 bytes of values.
        let keys = if step == 1 { 0 } else { 1000 * 8 };
        assert!(
            bytes < keys + 256,
            "allocated {bytes} bytes decoding a push of 1000 pairs"
        );
    }
}
