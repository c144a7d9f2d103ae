//! Arbitrary message sequences into a Server and a Worker, each behind the core's `Driver`
//! (frames to the server go through the decoder), plus the worker's application calls and the
//! passing of time. Nothing may panic, and the protocol's invariants must hold throughout:
//! exactly-once (the server's totals equal the sum of the push slices it acknowledged for the
//! first time) and the worker's in-flight bound.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pserver_core::*;

const COORD: NodeId = NodeId(0);
const SERVER: NodeId = NodeId(1);
const WORKER: NodeId = NodeId(8);

/// Small ids, so that senders are often members: 0 coordinator, 1..=3 servers, 8..=10 workers.
fn node(n: u8) -> NodeId {
    match n % 7 {
        0 => COORD,
        i @ 1..=3 => NodeId(u32::from(i)),
        i => NodeId(u32::from(i) + 4),
    }
}

fn key(k: u16) -> Key {
    // Spread over the key space so that keys land on every server's ranges.
    u64::from(k % 64) * (u64::MAX / 64)
}

fn keys(ks: &[u16]) -> Vec<Key> {
    let mut v: Vec<Key> = ks.iter().map(|&k| key(k)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn kvs(ks: &[u16], vals: &[i16]) -> KvPairs<i64> {
    let ks = keys(ks);
    let vs = ks
        .iter()
        .enumerate()
        .map(|(i, _)| i64::from(*vals.get(i).unwrap_or(&1)))
        .collect();
    KvPairs::new(ks, vs, 1).expect("sorted, deduplicated keys")
}

fn members(mask: u8, first: u32) -> Vec<NodeId> {
    (0..3).filter(|i| mask & (1 << i) != 0).map(|i| NodeId(first + i)).collect()
}

#[derive(Arbitrary, Debug)]
enum Body {
    Register,
    Config { epoch: u8, servers: u8, workers: u8, consistency: u8 },
    ConfigRequest,
    Heartbeat,
    Push { request: u8, slice: u8, iteration: u8 },
    PushAck { request: u8, slice: u8 },
    Pull { request: u8, slice: u8, iteration: u8, keys: Vec<u16>, dense: bool },
    PullReply { request: u8, slice: u8, keys: Vec<u16>, vals: Vec<i16>, resume: Option<u16> },
    Redirect { request: u8, slice: u8, epoch: u8 },
    Progress(u8),
    ProgressAck(u8),
}

#[derive(Arbitrary, Debug)]
enum Op {
    ToServer { from: u8, epoch: u8, body: Body },
    ToWorker { from: u8, epoch: u8, body: Body },
    ServerTimeout,
    WorkerTimeout,
    Push { keys: Vec<u16>, vals: Vec<i16> },
    Pull { keys: Vec<u16>, dense: bool },
    Advance,
    Tick(u16),
}

fn message(body: Body) -> Message<i64> {
    let sref = |request: u8, slice: u8| SliceRef {
        request: u64::from(request),
        slice: u32::from(slice % 4),
    };
    match body {
        Body::Register => Message::Register { role: Role::Worker },
        Body::Config { epoch, servers, workers, consistency } => {
            let servers = members(servers | 1, 1);
            Message::Config(ClusterConfig {
                epoch: u64::from(epoch),
                coordinator: COORD,
                servers,
                workers: members(workers, 8),
                ring: RingConfig { vnodes: 4, replicas: 0, seed: 0 },
                consistency: match consistency % 3 {
                    0 => Consistency::Sequential,
                    1 => Consistency::BoundedDelay(u32::from(consistency % 4)),
                    _ => Consistency::Eventual,
                },
            })
        }
        Body::ConfigRequest => Message::ConfigRequest,
        Body::Heartbeat => Message::Heartbeat { sent_at: 1 },
        Body::Push { request, slice, iteration } => {
            // Push slices are 0 and 1, pull slices 2 and 3, so answers tell them apart.
            let slice = sref(request, slice % 2);
            Message::Push(Push {
                slice,
                iteration: u32::from(iteration % 8),
                settled_below: settled_of(slice),
                kvs: content_of(slice),
            })
        }
        Body::PushAck { request, slice } => Message::PushAck(sref(request, slice)),
        Body::Pull { request, slice, iteration, keys: ks, dense } => Message::Pull(Pull {
            slice: sref(request, 2 + slice % 2),
            iteration: u32::from(iteration % 8),
            keys: selection(&ks, dense),
        }),
        Body::PullReply { request, slice, keys: ks, vals, resume } => {
            Message::PullReply(PullReply {
                slice: sref(request, slice),
                complete_below: 0,
                kvs: kvs(&ks, &vals),
                resume: resume.map(key),
            })
        }
        Body::Redirect { request, slice, epoch } => Message::Redirect {
            slice: sref(request, slice),
            epoch: u64::from(epoch),
        },
        Body::Progress(i) => Message::Progress { finished_below: u32::from(i % 8) },
        Body::ProgressAck(i) => Message::ProgressAck { finished_below: u32::from(i % 8) },
    }
}

/// A push's content is a function of its slice, so that the mirror knows what an acknowledged
/// slice carried even when the server acknowledges it later (after buffering it).
fn content_of(slice: SliceRef) -> KvPairs<i64> {
    let r = slice.request as u16;
    kvs(&[r, r + 7], &[i16::from(r as u8) + 1, slice.slice as i16 + 1])
}

/// Pushes settle the requests a few below their own.
fn settled_of(slice: SliceRef) -> u64 {
    slice.request.saturating_sub(u64::from(slice.slice) * 3)
}

fn selection(ks: &[u16], dense: bool) -> KeySelection {
    let ks = keys(ks);
    match (dense, ks.first(), ks.last()) {
        (true, Some(&a), Some(&b)) => {
            let r = KeyRange::new(a, b + 1).expect("a <= b");
            KeySelection::Ranges(RangeList::new(vec![r]).expect("one non-empty range"))
        }
        _ => KeySelection::Keys(KeyList::new(ks).expect("sorted keys")),
    }
}

/// What the server must hold: the first acknowledged copy of every push slice, per worker.
#[derive(Default)]
struct Mirror {
    applied: BTreeMap<(NodeId, SliceRef), KvPairs<i64>>,
    settled: BTreeMap<NodeId, u64>,
}

fuzz_target!(|ops: Vec<Op>| {
    let codec = Codec::default();
    let mut server: Driver<i64> =
        Driver::new(Server::new(ServerConfig::new(SERVER, COORD), Updater::Sum));
    // Small slices and a small window, so that splitting and waiting for room are exercised.
    let mut wc = WorkerConfig::new(WORKER, COORD);
    wc.max_slice_bytes = 128 + 3 * 18;
    wc.max_slices_in_flight = 2;
    let mut worker: Driver<i64> = Driver::new(Worker::new(wc));
    let mut now: Time = 0;
    let mut mirror = Mirror::default();
    server.start(now);
    worker.start(now);
    for op in ops.into_iter().take(256) {
        match op {
            Op::ToServer { from, epoch, body } => {
                let env = Envelope::new(node(from), SERVER, u64::from(epoch % 4), message(body));
                let frame = codec.encode(&env).expect("small messages encode");
                assert_eq!(codec.decode::<i64>(&frame).as_ref(), Ok(&env));
                server.handle_frame(now, env.from, &frame);
            }
            Op::ToWorker { from, epoch, body } => {
                let env = Envelope::new(node(from), WORKER, u64::from(epoch % 4), message(body));
                worker.handle_message(now, env);
            }
            Op::ServerTimeout => server.handle_timeout(now),
            Op::WorkerTimeout => worker.handle_timeout(now),
            Op::Push { keys: ks, vals } => {
                let _ = worker.push(now, kvs(&ks, &vals));
            }
            Op::Pull { keys: ks, dense } => {
                let _ = worker.pull(now, selection(&ks, dense));
            }
            Op::Advance => {
                let _ = worker.advance(now);
            }
            Op::Tick(ms) => now += u64::from(ms) * 1_000_000,
        }
        // Whatever the worker says or reports is not checked here, only that it copes.
        while worker.poll_transmit().is_some() {}
        while worker.poll_event().is_some() {}
        while server.poll_event().is_some() {}
        // What the server answered, in the order it processed pushes (it may process buffered
        // ones long after they arrived): each answer settles, each first acknowledgement of an
        // unsettled slice is an application.
        while let Some(e) = server.poll_message() {
            let (slice, acked) = match &e.body {
                Message::PushAck(s) => (*s, true),
                Message::Redirect { slice, .. } if slice.slice < 2 => (*slice, false),
                _ => continue,
            };
            let settled = mirror.settled.entry(e.to).or_default();
            *settled = (*settled).max(settled_of(slice));
            if acked && slice.request >= *settled {
                mirror.applied.entry((e.to, slice)).or_insert_with(|| content_of(slice));
            }
        }
        let s = server.node().as_server().expect("a server");
        let w = worker.node().as_worker().expect("a worker");
        // Exactly-once: totals are the sum of the first acknowledged copy of each slice.
        for k in 0..64u16 {
            let key = key(k);
            let want = mirror
                .applied
                .values()
                .filter_map(|kv| kv.get(key).map(|v| v[0]))
                .fold(0i64, i64::wrapping_add);
            assert_eq!(s.received_total(key)[0], want, "key {key}");
        }
        // In-flight bound, and the window on slices.
        if let Some(tau) = w.consistency().and_then(Consistency::tau) {
            assert!(w.in_flight() <= tau + 1, "{} in flight, tau {tau}", w.in_flight());
        }
        assert!(w.slices_in_flight() <= 2 * 2);
        assert_eq!(server.node().clone(), *server.node());
        assert_eq!(worker.node().clone(), *worker.node());
    }
});
