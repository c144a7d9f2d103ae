//! Codec throughput: encode and decode of push frames, printed as `name value unit` lines.
//!
//! Run with `cargo bench --bench codec`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use pserver_core::wire::Codec;
use pserver_core::wire::{Envelope, Message, Push, SliceRef};
use pserver_core::{KvPairs, NodeId};

/// Runs `f` repeatedly for about `budget`, returning the mean seconds per call.
fn time_per_call(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < budget {
        f();
        calls += 1;
    }
    start.elapsed().as_secs_f64() / calls as f64
}

fn push_frame(keys: u64, stride: u64) -> Envelope<f32> {
    let kvs = KvPairs::new(
        (0..keys).map(|k| k * stride).collect(),
        (0..keys).map(|k| k as f32 * 0.5).collect(),
        1,
    )
    .expect("keys are increasing");
    let slice = SliceRef {
        request: 1,
        slice: 0,
    };
    Envelope::new(
        NodeId(1),
        NodeId(2),
        1,
        Message::Push(Push {
            slice,
            iteration: 0,
            covers: pserver_core::pace::Coverage::WHOLE,
            settled_below: 0,
            kvs,
        }),
    )
}

fn main() {
    let codec = Codec::default();
    let budget = Duration::from_secs(1);
    for (name, stride) in [("dense", 1u64), ("sparse", 1_000)] {
        let keys = 100_000u64;
        let env = push_frame(keys, stride);
        let mut buf = Vec::new();
        let enc = time_per_call(budget, || {
            buf.clear();
            codec.encode_into(black_box(&env), &mut buf).expect("fits");
        });
        let frame = codec.encode(&env).expect("fits");
        let dec = time_per_call(budget, || {
            black_box(codec.decode::<f32>(black_box(&frame)).expect("valid"));
        });
        // As a transport's frames are decoded: the values read in place.
        let in_place = time_per_call(budget, || {
            black_box(codec.decode_bytes::<f32>(black_box(&frame)).expect("valid"));
        });
        let bytes = frame.len() as f64;
        println!(
            "codec.{name}.frame_bytes_per_key {:.2} bytes",
            bytes / keys as f64
        );
        println!("codec.{name}.encode {:.1} Mkeys/s", keys as f64 / enc / 1e6);
        println!("codec.{name}.encode {:.0} MB/s", bytes / enc / 1e6);
        println!("codec.{name}.decode {:.1} Mkeys/s", keys as f64 / dec / 1e6);
        println!("codec.{name}.decode {:.0} MB/s", bytes / dec / 1e6);
        println!(
            "codec.{name}.decode_in_place {:.1} Mkeys/s",
            keys as f64 / in_place / 1e6
        );
        println!(
            "codec.{name}.decode_in_place {:.0} MB/s",
            bytes / in_place / 1e6
        );
    }
}
