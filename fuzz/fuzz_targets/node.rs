//! Arbitrary message sequences into a Server and a Worker, each behind the core's `Driver`
//! (frames to the server go through the decoder), plus the worker's application calls and the
//! passing of time. Nothing may panic, and the protocol's invariants must hold throughout:
//! exactly-once (the server's totals equal the sum of the push slices it acknowledged for the
//! first time) and the worker's in-flight bound. Server-to-server traffic (replication, copies,
//! acknowledgements, catching up, leaving) and configurations with replicas and joining servers
//! are thrown in too; once any of it reached the server, its totals also hold what other
//! servers sent, so only the absence of panics and the in-flight bound are checked. The first
//! input decides whether both nodes run with round-robin push slots, the second whether (and
//! at which threshold) the worker runs the significantly-modified filter, the third whether
//! both run key caching (and with how many lists, and with value compression): slices that
//! name key lists, requests for lists, and answers without keys mix in; the fourth whether
//! the worker runs the KKT filter (at which bound, and how often its full check comes), which
//! judges a push of the keys of the last pull by that pull's answer.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pserver_core::filter::{Filters, KeyCaching, KeysDigest, Kkt, Threshold};
use pserver_core::pace::{Pace, ShareMove};
use pserver_core::slots::PushSlots;
use pserver_core::node::*;
use pserver_core::ring::*;
use pserver_core::wire::*;
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
    (0..3)
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| NodeId(first + i))
        .collect()
}

#[derive(Arbitrary, Debug)]
enum Body {
    Register {
        incarnation: u8,
        keys_below: Option<u64>,
    },
    Config {
        epoch: u8,
        servers: u8,
        workers: u8,
        consistency: u8,
        replicas: bool,
        joining: u8,
        /// Adaptive tau's bound, and the share moved from the worker (see `pace`).
        pace: (Option<u8>, u8),
    },
    ConfigRequest,
    Heartbeat,
    Push {
        request: u8,
        slice: u8,
        iteration: u8,
    },
    PushAck {
        request: u8,
        slice: u8,
    },
    Pull {
        request: u8,
        slice: u8,
        iteration: u8,
        keys: Vec<u16>,
        dense: bool,
    },
    PullReply {
        request: u8,
        slice: u8,
        keys: Vec<u16>,
        vals: Vec<i16>,
        resume: Option<u16>,
    },
    Redirect {
        request: u8,
        slice: u8,
        epoch: u8,
    },
    Progress(u8, u8),
    ProgressAck(u8, u8),
    PushTaken {
        request: u8,
        slice: u8,
    },
    Replicate {
        from_key: u16,
        to_key: u16,
        seq: u8,
        kind: u8,
        keys: Vec<u16>,
        vals: Vec<i16>,
    },
    ReplicateAck {
        from_key: u16,
        to_key: u16,
        seq: Option<u8>,
    },
    Transfer {
        from_key: u16,
        to_key: u16,
        seq: u8,
        keys: Vec<u16>,
        vals: Vec<i16>,
        worker: u8,
    },
    TransferAck {
        from_key: u16,
        to_key: u16,
        seq: u8,
    },
    CaughtUp(u8),
    Leave,
    ProgressRequest,
    Lost {
        from_key: u16,
        to_key: u16,
    },
    HeartbeatAck {
        degraded: bool,
    },
    SlotAsk {
        request: u8,
        slice: u8,
        bytes: u16,
    },
    SlotGrant {
        request: u8,
        slice: u8,
    },
    PushCached {
        request: u8,
        slice: u8,
        iteration: u8,
        /// Name a list nobody sent instead of the slice's own.
        unknown: bool,
        packed: bool,
    },
    PullCached {
        request: u8,
        slice: u8,
        iteration: u8,
        keys: Vec<u16>,
    },
    KeysUnknown {
        request: u8,
        slice: u8,
    },
    PullValues {
        request: u8,
        slice: u8,
        vals: Vec<i16>,
        packed: bool,
    },
    PullRows {
        request: u8,
        slice: u8,
        keys: Vec<u16>,
        vals: Vec<i16>,
        resume: Option<u16>,
    },
}

impl Body {
    /// True for what only another server sends a server.
    fn is_between_servers(&self) -> bool {
        matches!(
            self,
            Body::Replicate { .. }
                | Body::ReplicateAck { .. }
                | Body::Transfer { .. }
                | Body::TransferAck { .. }
        ) || matches!(self, Body::Config { replicas: true, .. })
            || matches!(self, Body::Config { joining, .. } if joining & 7 != 0)
    }
}

fn range(a: u16, b: u16) -> KeyRange {
    let (a, b) = (key(a.min(b)), key(a.max(b)));
    KeyRange::new(a, b.max(a + 1)).expect("a < b")
}

#[derive(Arbitrary, Debug)]
enum Op {
    ToServer {
        from: u8,
        epoch: u8,
        body: Body,
    },
    ToWorker {
        from: u8,
        epoch: u8,
        body: Body,
    },
    ServerTimeout,
    WorkerTimeout,
    Push {
        keys: Vec<u16>,
        vals: Vec<i16>,
    },
    /// A push of the keys of the application's last pull, as a trainer pushes its gradient:
    /// the KKT filter judges such a push by that pull's answer.
    PushPulled {
        vals: Vec<i16>,
    },
    Pull {
        keys: Vec<u16>,
        dense: bool,
    },
    Advance,
    Flush,
    Leave,
    Tick(u16),
}

fn message(body: Body) -> Message<i64> {
    let sref = |request: u8, slice: u8| SliceRef {
        request: u64::from(request),
        slice: u32::from(slice % 4),
    };
    match body {
        Body::Register {
            incarnation,
            keys_below,
        } => Message::Register {
            role: Role::Worker,
            incarnation: u64::from(incarnation),
            keys_below,
            checkpoints: Vec::new(),
        },
        Body::Config {
            epoch,
            servers,
            workers,
            consistency,
            replicas,
            joining,
            pace,
        } => {
            let servers = members(servers | 1, 1);
            let joining: Vec<NodeId> = members(joining, 1)
                .into_iter()
                .filter(|s| !servers.contains(s))
                .collect();
            // Some configurations name the server under test with another incarnation than
            // its own (0): they speak of an earlier process, which it must refuse.
            let mut incarnations: Vec<(NodeId, u64)> = servers
                .iter()
                .chain(&joining)
                .map(|&s| (s, u64::from(epoch % 2)))
                .collect();
            incarnations.sort_unstable();
            Message::Config(ClusterConfig {
                epoch: u64::from(epoch),
                coordinator: COORD,
                standbys: Vec::new(),
                term: 0,
                servers,
                workers: members(workers, 8),
                ring: RingConfig {
                    vnodes: 4,
                    replicas: u32::from(replicas),
                    seed: 0,
                    ..RingConfig::default()
                },
                joining,
                leaving: Vec::new(),
                shares: members(workers, 8),
                left: Vec::new(),
                lost: vec![],
                incarnations,
                // Checkpoints every few iterations, some recorded: the worker under test may
                // wait at a cut, and a first configuration may resume from one.
                checkpoints: Checkpoints {
                    every: u32::from(pace.1 % 4),
                    taken: u32::from(epoch / 4) * 2,
                    complete: u32::from(epoch / 8) * 2,
                },
                // The worker under test may be told to skip ahead, the bound may move, and a
                // share may have moved from it for its speed. A coordinator only ever moves a
                // skip forward, so a later configuration's is never lower.
                pace: Pace {
                    tau: pace.0.map(|t| u32::from(t % 8)),
                    skipped_below: vec![(WORKER, u32::from(epoch / 16))],
                    moves: vec![ShareMove {
                        share: u32::from(pace.1 % 8),
                        from: WORKER,
                        at: u32::from(pace.1 % 16),
                    }],
                },
                consistency: match consistency % 3 {
                    0 => Consistency::Sequential,
                    1 => Consistency::BoundedDelay(u32::from(consistency % 4)),
                    _ => Consistency::Eventual,
                },
            })
        }
        Body::ConfigRequest => Message::ConfigRequest,
        Body::Heartbeat => Message::Heartbeat {
            sent_at: 1,
            at: None,
            term: 0,
        },
        Body::Push {
            request,
            slice,
            iteration,
        } => {
            // Push slices are 0 and 1, pull slices 2 and 3, so answers tell them apart.
            let slice = sref(request, slice % 2);
            Message::Push(Push {
                slice,
                iteration: u32::from(iteration % 8),
                covers: pserver_core::pace::Coverage::WHOLE,
                settled_below: settled_of(slice),
                kvs: content_of(slice),
            })
        }
        Body::PushAck { request, slice } => Message::PushAck(sref(request, slice)),
        Body::Pull {
            request,
            slice,
            iteration,
            keys: ks,
            dense,
        } => Message::Pull(Pull {
            slice: sref(request, 2 + slice % 2),
            iteration: u32::from(iteration % 8),
            keys: selection(&ks, dense),
        }),
        Body::PullReply {
            request,
            slice,
            keys: ks,
            vals,
            resume,
        } => Message::PullReply(PullReply {
            slice: sref(request, slice),
            complete_below: 0,
            kvs: kvs(&ks, &vals),
            resume: resume.map(key),
        }),
        Body::Redirect {
            request,
            slice,
            epoch,
        } => Message::Redirect {
            slice: sref(request, slice),
            epoch: u64::from(epoch),
        },
        Body::Progress(i, t) => Message::Progress {
            finished_below: u32::from(i % 8),
            taken_below: u32::from(t % 8),
        },
        Body::ProgressAck(i, t) => Message::ProgressAck {
            finished_below: u32::from(i % 8),
            taken_below: u32::from(t % 8),
        },
        Body::PushTaken { request, slice } => Message::PushTaken(sref(request, slice)),
        Body::Replicate {
            from_key,
            to_key,
            seq,
            kind,
            keys: ks,
            vals,
        } => {
            let rows = kvs(&ks, &vals);
            let update = match kind % 3 {
                0 => ShardUpdate::Apply(rows),
                1 => ShardUpdate::Buffer {
                    iteration: u32::from(kind % 4),
                    kvs: rows,
                },
                _ => ShardUpdate::ApplyBelow(if kind > 250 {
                    u32::MAX
                } else {
                    u32::from(kind % 5)
                }),
            };
            let dedupe = smallvec![DedupeRecord {
                worker: WORKER,
                settled_below: u64::from(seq / 2),
                applied: smallvec![AppliedSpan {
                    request: u64::from(seq),
                    first: key(from_key),
                    last: key(to_key),
                }],
            }];
            Message::Replicate {
                updates: vec![Replicate {
                    range: range(from_key, to_key),
                    seq: u64::from(seq % 8),
                    // Spans of 0 and spans reaching below step 1 must be refused.
                    span: u64::from(seq / 8 % 4),
                    update,
                    dedupe,
                }],
            }
        }
        Body::ReplicateAck {
            from_key,
            to_key,
            seq,
        } => Message::ReplicateAck {
            acks: vec![ShardAck {
                range: range(from_key, to_key),
                seq: seq.map(|s| u64::from(s % 8)),
            }],
        },
        Body::Transfer {
            from_key,
            to_key,
            seq,
            keys: ks,
            vals,
            worker,
        } => {
            let r = range(from_key, to_key);
            let rows = kvs(&ks, &vals);
            Message::Transfer(Transfer {
                range: r,
                seq: u64::from(seq % 8),
                values: rows.slice(r),
                state: None,
                pending: vec![BufferedPush {
                    iteration: 1,
                    kvs: rows,
                }],
                applied_below: 0,
                dedupe: vec![DedupeRecord {
                    worker: node(worker),
                    settled_below: 1,
                    applied: SmallVec::new(),
                }],
                clocks: vec![ClockRecord {
                    worker: node(worker),
                    segments: vec![(r, u32::from(seq % 4))],
                }],
            })
        }
        Body::TransferAck {
            from_key,
            to_key,
            seq,
        } => Message::TransferAck {
            range: range(from_key, to_key),
            seq: u64::from(seq % 8),
        },
        Body::CaughtUp(epoch) => Message::CaughtUp {
            epoch: u64::from(epoch % 4),
        },
        Body::Leave => Message::Leave,
        Body::ProgressRequest => Message::ProgressRequest,
        Body::Lost { from_key, to_key } => Message::Lost(vec![range(from_key, to_key)]),
        Body::HeartbeatAck { degraded } => Message::HeartbeatAck {
            sent_at: 0,
            degraded: if degraded { vec![SERVER] } else { Vec::new() },
        },
        Body::SlotAsk {
            request,
            slice,
            bytes,
        } => Message::SlotAsk {
            slice: sref(request, slice % 2),
            bytes: u32::from(bytes),
        },
        Body::SlotGrant { request, slice } => Message::SlotGrant(sref(request, slice % 2)),
        Body::PushCached {
            request,
            slice,
            iteration,
            unknown,
            packed,
        } => {
            let slice = sref(request, slice % 2);
            let content = content_of(slice);
            // A list no worker sends: its keys are not in the fuzzed key space.
            let keys = if unknown {
                KeysDigest::of(&[1, 2, 3])
            } else {
                KeysDigest::of(content.keys())
            };
            Message::PushCached(PushCached {
                slice,
                iteration: u32::from(iteration % 8),
                covers: pserver_core::pace::Coverage::WHOLE,
                settled_below: settled_of(slice),
                keys,
                values: if packed {
                    RowValues::packed(&content)
                } else {
                    RowValues::of(&content)
                },
            })
        }
        Body::PullCached {
            request,
            slice,
            iteration,
            keys: ks,
        } => Message::PullCached(PullCached {
            slice: sref(request, 2 + slice % 2),
            iteration: u32::from(iteration % 8),
            keys: KeysDigest::of(&keys(&ks)),
        }),
        Body::KeysUnknown { request, slice } => Message::KeysUnknown(sref(request, slice)),
        Body::PullRows {
            request,
            slice,
            keys: ks,
            vals,
            resume,
        } => {
            let rows = kvs(&ks, &vals);
            Message::PullRows(PullRows {
                slice: sref(request, slice),
                complete_below: 0,
                keys: KeyList::new(rows.keys().to_vec()).unwrap_or_default(),
                values: RowValues::packed(&rows),
                resume: resume.map(key),
            })
        }
        Body::PullValues {
            request,
            slice,
            vals,
            packed,
        } => {
            let ks: Vec<u16> = (0..vals.len() as u16).collect();
            let rows = kvs(&ks, &vals);
            Message::PullValues(PullValues {
                slice: sref(request, slice),
                complete_below: 0,
                values: if packed {
                    RowValues::packed(&rows)
                } else {
                    RowValues::of(&rows)
                },
            })
        }
    }
}

/// A push's content is a function of its slice, so that the mirror knows what an acknowledged
/// slice carried even when the server acknowledges it later (after buffering it). The two
/// push slices of a request hold disjoint keys, as a worker cuts them: the server remembers
/// which keys of a request it applied, so a key in two slices of one request is a resend.
fn content_of(slice: SliceRef) -> KvPairs<i64> {
    let r = slice.request as u16;
    let base = r % 24 + 32 * slice.slice as u16;
    kvs(
        &[base, base + 7],
        &[i16::from(r as u8) + 1, slice.slice as i16 + 1],
    )
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

fuzz_target!(|input: (
    bool,
    Option<u8>,
    Option<(u8, bool)>,
    Option<(u8, u8)>,
    Vec<Op>
)| {
    let (slots, sigmod, caching, kkt, ops) = input;
    // Few lists, so that both sides evict often.
    let key_caching = caching.and_then(|(lists, _)| KeyCaching::new(u32::from(lists % 4) + 1));
    let compression = caching.is_some_and(|(_, on)| on);
    let codec = Codec::default();
    // With push slots, a slice of more than a few keys waits for its grant, so that asks,
    // grants, leases and slices sent on a grant mix with everything else.
    let slots = slots.then_some(PushSlots {
        min_bytes: 150,
        at_once: 1,
    });
    let mut sc = ServerConfig::new(SERVER, COORD);
    sc.push_slots = slots;
    sc.key_caching = key_caching;
    sc.compression = compression;
    let mut server: Driver<i64> = Driver::new(Server::new(sc, Updater::Sum));
    // Small slices and a small window, so that splitting and waiting for room are exercised.
    let mut wc = WorkerConfig::new(WORKER, COORD);
    wc.max_slice_bytes = 128 + 3 * 18;
    wc.max_slices_in_flight = 2;
    wc.push_slots = slots;
    // With a filter, the worker holds small changes back; flushing and leaving mix in.
    wc.filters = sigmod
        .and_then(|t| Threshold::new(f64::from(t)))
        .map_or_else(Filters::none, Filters::significantly_modified);
    wc.filters.key_caching = key_caching;
    wc.filters.compression = compression;
    // The KKT filter holds pushes of keys its pulls answered zero for; a short full-check
    // period sends them with a later push of the key.
    wc.filters.kkt = kkt.and_then(|(bound, every)| {
        Kkt::new(Threshold::new(f64::from(bound))?, u32::from(every % 8) + 1)
    });
    let mut worker: Driver<i64> = Driver::new(Worker::new(wc));
    let mut now: Time = 0;
    let mut mirror = Mirror::default();
    let mut last_pulled: Vec<u16> = Vec::new();
    // Set once the server took in traffic only other servers send: its totals then hold more
    // than the worker's pushes.
    let mut between_servers = false;
    // The servers every configuration so far named (as `Body::Config`'s bits).
    let mut ring_servers = u8::MAX;
    // The highest staleness bound the worker has been under.
    let mut widest: Option<Iteration> = None;
    server.start(now);
    worker.start(now);
    for op in ops.into_iter().take(256) {
        match op {
            Op::ToServer { from, epoch, mut body } => {
                if let Body::Config { servers, .. } = &mut body {
                    // A coordinator gives a server's ranges to another only through joining
                    // and leaving, with a copy first: a ring that gained servers otherwise
                    // would drop what this server holds with no copy made. Servers only leave
                    // the ring here (declared dead, their ranges pass to this one).
                    ring_servers &= *servers;
                    *servers = ring_servers;
                }
                between_servers |= body.is_between_servers();
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
                let _ = worker.worker().and_then(|mut w| w.push(now, kvs(&ks, &vals)));
            }
            Op::PushPulled { vals } => {
                let _ = worker.worker().and_then(|mut w| w.push(now, kvs(&last_pulled, &vals)));
            }
            Op::Pull { keys: ks, dense } => {
                let _ = worker.worker().and_then(|mut w| w.pull(now, selection(&ks, dense)));
                last_pulled = ks;
            }
            Op::Advance => {
                let _ = worker.worker().and_then(|mut w| w.advance(now));
            }
            Op::Flush => {
                let _ = worker.worker().and_then(|mut w| w.flush(now));
            }
            Op::Leave => {
                let _ = worker.leave();
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
        loop {
            let e = match server.poll_output_message() {
                Output::Transmit(t) => t.frame,
                Output::Event(_) => continue,
                Output::Wait { .. } => break,
            };
            let (slice, acked) = match &e.body {
                Message::PushAck(s) => (*s, true),
                Message::Redirect { slice, .. } if slice.slice < 2 => (*slice, false),
                _ => continue,
            };
            let settled = mirror.settled.entry(e.to).or_default();
            *settled = (*settled).max(settled_of(slice));
            if acked && slice.request >= *settled {
                mirror
                    .applied
                    .entry((e.to, slice))
                    .or_insert_with(|| content_of(slice));
            }
        }
        let s = server.node().as_server().expect("a server");
        let w = worker.node().as_worker().expect("a worker");
        // Exactly-once: totals are the sum of the first acknowledged copy of each slice.
        for k in (0..64u16).filter(|_| !between_servers) {
            let key = key(k);
            let want = mirror
                .applied
                .values()
                .filter_map(|kv| kv.get(key).map(|v| v[0]))
                .fold(0i64, i64::wrapping_add);
            assert_eq!(s.received_total(key)[0], want, "key {key}");
        }
        // In-flight bound, and the window on slices. The bound is the one in force (adaptive
        // tau's where a configuration set one); once it fell, what went out under a higher
        // one stays out, so the highest it has been holds.
        if let Some(tau) = w.consistency_in_force().and_then(Consistency::tau) {
            let tau = *widest.insert(widest.map_or(tau, |t: Iteration| t.max(tau)));
            assert!(
                w.in_flight() <= tau + 1,
                "{} in flight, tau {tau}",
                w.in_flight()
            );
        }
        assert!(w.slices_in_flight() <= 2 * 2);
        assert_eq!(server.node().clone(), *server.node());
        assert_eq!(worker.node().clone(), *worker.node());
    }
});
