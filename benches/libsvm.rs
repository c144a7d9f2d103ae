//! LIBSVM parsing throughput, printed as `name value unit` lines.
//!
//! Run with `cargo bench --bench libsvm`. The input is generated in memory (click-like rows:
//! a 0/1 label, about 40 features with indices below 2^20, binary and real values), so the
//! figure is the parser's, not the disk's.

use std::hint::black_box;
use std::time::Instant;

// The reader is a module of the `pserver` binary, not of a library: the benchmark compiles the
// file itself. Only the parser is measured, so the rest of the module goes unused here.
#[allow(dead_code, unreachable_pub)]
#[path = "../src/data/libsvm.rs"]
mod libsvm;
// What the reader draws its seeded hold-out from.
#[allow(dead_code, unreachable_pub)]
#[path = "../src/seeded.rs"]
mod seeded;

use libsvm::{IndexBase, parse};

/// About `bytes` of LIBSVM text from a fixed seed.
fn generate(bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes + 1024);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    while out.len() < bytes {
        out.extend_from_slice(if next() % 4 == 0 { b"+1" } else { b"-1" });
        let mut index = 0u64;
        for f in 0..40 {
            index += 1 + next() % 26_000;
            if f % 3 == 0 {
                let v = (next() % 10_000) as f32 / 1000.0;
                out.extend_from_slice(format!(" {index}:{v}").as_bytes());
            } else {
                out.extend_from_slice(format!(" {index}:1").as_bytes());
            }
        }
        out.push(b'\n');
    }
    out
}

fn main() {
    let text = generate(128 << 20);
    let mut best = f64::INFINITY;
    let mut rows = 0;
    for _ in 0..5 {
        let start = Instant::now();
        let examples = parse("bench.svm", black_box(&text), IndexBase::One).expect("valid input");
        best = best.min(start.elapsed().as_secs_f64());
        rows = examples.len();
    }
    let mb = text.len() as f64 / 1e6;
    println!("libsvm.parse {:.0} MB/s", mb / best);
    println!("libsvm.rows {:.2} Mrows/s", rows as f64 / best / 1e6);
    println!("libsvm.input {mb:.0} MB");
}
