//! Allocations per frame on the hot path, counted by a counting allocator: a worker's pushes,
//! a primary taking them in and replicating them, a replica taking the batches in, and the
//! acknowledgements back, with 8 and with 64 ring points per server (ARCHITECTURE.md §1).
//!
//! What is held to a handful, independent of the ring's segments: pushes taken in by a
//! primary (once 235 a frame at 64 points: a record, a step and copies of both per shard),
//! replication batches taken in by a replica (once 185: besides the same, a key list and its
//! handle per step decoded, now one list for the batch), acknowledgements of both (once 91)
//! and heartbeats, and frames polled out (once a key buffer per pair encoded).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};

use pserver_core::node::Coordinator;
use pserver_core::*;

/// Counts the allocations this thread makes, so parallel tests do not disturb the count.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (out, ALLOCATIONS.with(Cell::get) - before)
}

const MS: Time = 1_000_000;

/// A job of a coordinator, two servers with a replica each and one worker, each driver
/// reading frames from a buffer the test reuses, as a datagram stack does.
struct Job {
    nodes: BTreeMap<NodeId, Driver<f32>>,
    wire: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    buf: Vec<u8>,
    now: Time,
    /// Allocations and frames, by role of the node that handled them.
    handled: BTreeMap<String, (u64, u64)>,
    /// Allocations and frames polled out.
    polled: (u64, u64),
}

impl Job {
    fn new(vnodes: u32) -> Self {
        let mut job = JobSpec::new(2, 1);
        job.ring.vnodes = vnodes;
        job.ring.replicas = 1;
        job.consistency = Consistency::Eventual;
        let mut nodes = BTreeMap::new();
        for id in job.node_ids() {
            nodes.insert(id, job.driver::<f32>(id, 0).unwrap());
        }
        let c = job.coordinator_config();
        let config = Coordinator::bootstrapped(c, &[NodeId(1), NodeId(2)], &[NodeId(3)])
            .unwrap()
            .config()
            .cloned()
            .unwrap();
        for d in nodes.values_mut() {
            d.start_configured(0, config.clone());
        }
        let mut job = Job {
            nodes,
            wire: VecDeque::new(),
            buf: Vec::with_capacity(1 << 16),
            now: 0,
            handled: BTreeMap::new(),
            polled: (0, 0),
        };
        job.settle();
        job
    }

    /// Polls every node's output onto the wire, counting what polling allocates.
    fn poll(&mut self) {
        for (&id, d) in &mut self.nodes {
            loop {
                let (output, n) = count(|| d.poll_output_into(&mut self.buf));
                match output {
                    Output::Transmit(t) => {
                        self.polled.0 += n;
                        self.polled.1 += 1;
                        self.wire
                            .push_back((id, t.to, self.buf[..t.frame].to_vec()));
                    }
                    Output::Event(_) => {}
                    Output::Wait { .. } => break,
                }
            }
        }
    }

    /// Moves frames and fires timers until nothing is left to move.
    fn settle(&mut self) {
        for _ in 0..100_000 {
            self.poll();
            let Some((from, to, frame)) = self.wire.pop_front() else {
                return;
            };
            let now = self.now;
            let d = self.nodes.get_mut(&to).unwrap();
            let role = d.node().role();
            let kind = pserver_core::wire::Codec::new(usize::MAX)
                .decode::<f32>(&frame)
                .map(|e| {
                    format!("{:?}", e.body)
                        .split(['(', ' ', '{'])
                        .next()
                        .unwrap_or("")
                        .to_owned()
                })
                .unwrap_or_default();
            let ((), n) = count(|| d.handle_frame(now, from, &frame));
            let entry = self.handled.entry(format!("{role} {kind}")).or_default();
            entry.0 += n;
            entry.1 += 1;
        }
        panic!("the job never settled");
    }

    fn push(&mut self, keys: &[Key]) {
        let kvs = KvPairs::new(keys.to_vec(), vec![1.0; keys.len()], 1).unwrap();
        let now = self.now;
        let worker = self.nodes.get_mut(&NodeId(3)).unwrap();
        worker.worker().unwrap().push(now, kvs).unwrap();
        self.settle();
    }

    fn tick(&mut self, by: Time) -> u64 {
        self.now += by;
        let now = self.now;
        let mut n = 0;
        for d in self.nodes.values_mut() {
            n += count(|| d.handle_timeout(now)).1;
        }
        self.settle();
        n
    }
}

/// Allocations per frame handled, by kind of node and message, over 20 pushes of 200 keys
/// spread over the key space, after 5 to warm up.
fn per_frame(vnodes: u32) -> BTreeMap<String, f64> {
    let mut job = Job::new(vnodes);
    let keys: Vec<Key> = (0..200).map(|i| i * (u64::MAX / 201)).collect();
    for _ in 0..5 {
        job.push(&keys);
    }
    job.handled.clear();
    job.polled = (0, 0);
    for _ in 0..20 {
        job.push(&keys);
    }
    for _ in 0..10 {
        job.tick(100 * MS);
    }
    let mut per = BTreeMap::new();
    for (kind, (n, frames)) in &job.handled {
        let each = *n as f64 / *frames as f64;
        eprintln!(
            "{vnodes} points: {kind}: {n} allocations for {frames} frames, {each:.1} a frame"
        );
        per.insert(kind.clone(), each);
    }
    let (n, frames) = job.polled;
    eprintln!("{vnodes} points: polled out: {n} allocations for {frames} frames");
    per.insert("polled out".into(), n as f64 / frames as f64);
    per
}

#[test]
fn every_frame_allocates_a_handful_however_many_segments_the_ring_has() {
    let few = per_frame(8);
    let many = per_frame(64);
    for (kind, most) in [
        ("server Push", 12.0),
        ("server Replicate", 10.0),
        ("server ReplicateAck", 4.0),
        ("worker PushAck", 4.0),
        ("coordinator Heartbeat", 4.0),
        // Written into the caller's buffer, the keys of each pair of a frame encoded in one
        // kept by the thread (once a buffer per pair: 7.7 a frame at 64 points).
        ("polled out", 4.0),
    ] {
        let (a, b) = (few[kind], many[kind]);
        assert!(b <= most, "{kind}: {b:.1} allocations a frame at 64 points");
        // A push reaches 8 times as many shards at 64 points: what grows with them is a
        // vector or two doubling, not a cost per shard.
        assert!(
            b <= a + 2.0,
            "{kind}: {a:.1} a frame at 8 points, {b:.1} at 64"
        );
    }
    // The counter counts: a push taken in does allocate.
    assert!(many["server Push"] >= 1.0);
}
