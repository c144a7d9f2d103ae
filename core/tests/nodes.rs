//! The node state machines driven by hand, message by message (ARCHITECTURE.md §2-4).

use crate::common;
use pserver_core::events::{Refusal, WorkerEvent};

use common::{COORD, config, deliver_config, ring};
use pserver_core::node::CoordinatorError;
use pserver_core::node::*;
use pserver_core::ring::*;
use pserver_core::wire::ClusterConfig;
use pserver_core::wire::*;
use pserver_core::*;

const W1: NodeId = NodeId(10);
const W2: NodeId = NodeId(11);

fn worker(id: NodeId, config: &ClusterConfig) -> Worker<i64> {
    let mut w = Worker::new(WorkerConfig::new(id, COORD));
    let mut out = Effects::new();
    w.start(0, &mut out);
    w.on_message(0, deliver_config(id, config), &mut out);
    w
}

fn server<U: UpdateRule<i64>>(id: u32, config: &ClusterConfig, updater: U) -> Server<i64, U> {
    let mut s = Server::new(ServerConfig::new(NodeId(id), COORD), updater);
    s.start_configured(0, config.clone(), &mut Effects::new());
    s
}

/// Keys spread over the whole key space, so that they land on every server.
fn spread(n: u64) -> Vec<Key> {
    (0..n).map(|i| i * (u64::MAX / n)).collect()
}

fn sends_of(out: &mut Effects<i64>) -> Vec<Envelope<i64>> {
    out.sends.drain(..).collect()
}

#[test]
fn a_push_is_sliced_by_primary_and_completes_when_every_slice_is_acked() {
    let cfg = config(1, &[1, 2, 3], &[W1], Consistency::Eventual);
    let ring = Ring::new(cfg.servers.clone(), cfg.ring).unwrap();
    let mut w = worker(W1, &cfg);
    let mut out = Effects::new();
    let keys = spread(40);
    let kvs = KvPairs::new(keys.clone(), vec![1i64; 40], 1).unwrap();
    let id = w.push(1, kvs, &mut out).unwrap();
    let sends = sends_of(&mut out);
    assert_eq!(sends.len(), 3, "one slice per primary");
    let mut seen = Vec::new();
    for env in &sends {
        let Message::Push(p) = &env.body else {
            panic!("expected a push, got {env:?}")
        };
        assert!(p.kvs.keys().iter().all(|&k| ring.primary(k) == env.to));
        seen.extend_from_slice(p.kvs.keys());
    }
    seen.sort_unstable();
    assert_eq!(seen, keys);
    for (i, env) in sends.iter().enumerate() {
        let Message::Push(p) = &env.body else {
            unreachable!()
        };
        let ack = Envelope::new(env.to, W1, 1, Message::PushAck(p.slice));
        w.on_message(2, ack.clone(), &mut out);
        let done = out
            .events
            .contains(&Event::Worker(WorkerEvent::PushDone(id)));
        assert_eq!(done, i == 2, "done only after the last ack");
        // A duplicated ack changes nothing.
        out.events.clear();
        w.on_message(2, ack, &mut out);
        assert!(
            !out.events
                .contains(&Event::Worker(WorkerEvent::PushDone(id)))
        );
    }
}

#[test]
fn pull_answers_are_assembled_in_key_order() {
    let cfg = config(1, &[1, 2], &[W1], Consistency::Eventual);
    let mut servers = [server(1, &cfg, Updater::Sum), server(2, &cfg, Updater::Sum)];
    let mut w = worker(W1, &cfg);
    let mut out = Effects::new();
    let keys = spread(20);
    let values: Vec<i64> = (0..20).collect();
    w.push(
        1,
        KvPairs::new(keys.clone(), values.clone(), 1).unwrap(),
        &mut out,
    )
    .unwrap();
    let list = KeyList::new(keys.clone()).unwrap();
    let pull = w.pull(1, KeySelection::Keys(list), &mut out).unwrap();
    // Deliver everything between worker and servers until quiet.
    let mut pending = sends_of(&mut out);
    while let Some(env) = pending.pop() {
        let mut o = Effects::new();
        if env.to == W1 {
            w.on_message(3, env, &mut o);
        } else {
            servers[(env.to.0 - 1) as usize].on_message(3, env, &mut o);
        }
        pending.extend(o.sends);
        out.events.extend(o.events);
    }
    let reply = out
        .events
        .iter()
        .find_map(|e| match e {
            Event::Worker(WorkerEvent::PullDone(id, kvs)) if *id == pull => Some(kvs.clone()),
            _ => None,
        })
        .expect("the pull completes");
    assert_eq!(reply.keys(), &keys[..]);
    // The pull may be served before or after the push reached each server (eventual), but never
    // anything else than 0 or the pushed value.
    for ((_, v), want) in reply.iter().zip(&values) {
        assert!(v[0] == 0 || v[0] == *want);
    }
}

/// Room for three rows of one `i64` each (a key may take 10 bytes) plus the slice overhead.
const THREE_ROWS: usize = 128 + 3 * (10 + 8);

#[test]
fn a_pull_of_many_keys_is_cut_into_slices_of_at_most_max_keys() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s = server(1, &cfg, Updater::Sum);
    let mut wc = WorkerConfig::new(W1, COORD);
    wc.max_slice_bytes = THREE_ROWS;
    let mut w = Worker::new(wc);
    let mut out = Effects::new();
    w.start(0, &mut out);
    w.on_message(0, deliver_config(W1, &cfg), &mut out);
    out.sends.clear();
    let keys: Vec<Key> = (0..10).map(|k| k * 7).collect();
    let list = KeyList::new(keys.clone()).unwrap();
    let pull = w.pull(1, KeySelection::Keys(list), &mut out).unwrap();
    let sends = sends_of(&mut out);
    let sizes: Vec<usize> = sends
        .iter()
        .map(|env| match &env.body {
            Message::Pull(p) => match &p.keys {
                KeySelection::Keys(l) => l.keys().len(),
                other => panic!("expected keys, got {other:?}"),
            },
            other => panic!("expected a pull, got {other:?}"),
        })
        .collect();
    assert_eq!(sizes, [3, 3, 3, 1], "slices of at most three keys");
    for env in sends {
        s.on_message(2, env, &mut out);
    }
    for env in sends_of(&mut out) {
        w.on_message(3, env, &mut out);
    }
    let reply = out
        .events
        .iter()
        .find_map(|e| match e {
            Event::Worker(WorkerEvent::PullDone(id, kvs)) if *id == pull => Some(kvs.clone()),
            _ => None,
        })
        .expect("the pull completes");
    assert_eq!(reply.keys(), &keys[..]);
}

#[test]
fn adjacent_ranges_of_a_pull_go_to_their_owner_as_one_range() {
    // One server owns the whole ring: ranges that touch are joined.
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg);
    let mut out = Effects::new();
    let range = KeyRange::new(0, u64::MAX).unwrap();
    let list = RangeList::new(vec![
        KeyRange::new(0, 1 << 40).unwrap(),
        KeyRange::new(1 << 40, u64::MAX).unwrap(),
    ])
    .unwrap();
    w.pull(1, KeySelection::Ranges(list), &mut out).unwrap();
    let sends = sends_of(&mut out);
    assert_eq!(sends.len(), 1);
    let Message::Pull(p) = &sends[0].body else {
        panic!("expected a pull, got {:?}", sends[0])
    };
    let KeySelection::Ranges(sent) = &p.keys else {
        panic!("expected ranges, got {:?}", p.keys)
    };
    assert_eq!(sent.ranges(), &[range]);
}

#[test]
fn a_pull_answer_with_other_keys_than_asked_for_is_not_taken() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg);
    let mut out = Effects::new();
    let list = KeyList::new(vec![5, 9]).unwrap();
    let pull = w.pull(1, KeySelection::Keys(list), &mut out).unwrap();
    let sends = sends_of(&mut out);
    let Message::Pull(p) = &sends[0].body else {
        panic!("expected a pull, got {:?}", sends[0])
    };
    let reply = |keys: Vec<Key>| {
        let n = keys.len();
        let body = Message::PullReply(PullReply {
            slice: p.slice,
            complete_below: 0,
            kvs: KvPairs::new(keys, vec![1i64; n], 1).unwrap(),
            resume: None,
        });
        Envelope::new(NodeId(1), W1, 1, body)
    };
    let done = |out: &Effects<i64>| {
        out.events
            .iter()
            .any(|e| matches!(e, Event::Worker(WorkerEvent::PullDone(id, _)) if *id == pull))
    };
    // The right width but a key missing, then a key too many: neither answers the slice.
    w.on_message(2, reply(vec![5]), &mut out);
    w.on_message(2, reply(vec![5, 7, 9]), &mut out);
    assert!(!done(&out), "a wrong answer completed the pull");
    w.on_message(2, reply(vec![5, 9]), &mut out);
    assert!(done(&out));
}

#[test]
fn a_duplicate_push_is_acknowledged_again_and_never_applied_again() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s = server(1, &cfg, Updater::Sum);
    let kvs = KvPairs::new(vec![5], vec![7i64], 1).unwrap();
    let slice = SliceRef {
        request: 1,
        slice: 0,
    };
    let push = Envelope::new(
        W1,
        NodeId(1),
        1,
        Message::Push(Push {
            slice,
            iteration: 0,
            covers: pserver_core::pace::Coverage::WHOLE,
            settled_below: 1,
            kvs,
        }),
    );
    let mut out = Effects::new();
    for _ in 0..3 {
        s.on_message(1, push.clone(), &mut out);
    }
    let acks = out
        .sends
        .iter()
        .filter(|e| e.body == Message::PushAck(slice))
        .count();
    assert_eq!(acks, 3, "every copy is acknowledged");
    assert_eq!(s.value(5), Some(&[7i64][..]), "applied once");
}

#[test]
fn dedupe_state_stays_bounded_by_the_requests_in_flight() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s = server(1, &cfg, Updater::Sum);
    let mut out = Effects::new();
    for request in 1..5_000u64 {
        let push = Push {
            slice: SliceRef { request, slice: 0 },
            iteration: 0,
            covers: pserver_core::pace::Coverage::WHOLE,
            settled_below: request.saturating_sub(4),
            kvs: KvPairs::new(vec![1], vec![1i64], 1).unwrap(),
        };
        s.on_message(
            1,
            Envelope::new(W1, NodeId(1), 1, Message::Push(push)),
            &mut out,
        );
        out.clear();
        assert!(s.dedupe_entries() <= 5);
    }
    assert_eq!(s.value(1), Some(&[4_999i64][..]));
}

#[test]
fn a_slice_reaching_a_non_owner_is_redirected_and_resent_under_the_new_ring() {
    let old = config(1, &[1, 2], &[W1], Consistency::Eventual);
    let new = config(2, &[1, 2, 3], &[W1], Consistency::Eventual);
    let new_ring = Ring::new(new.servers.clone(), new.ring).unwrap();
    let mut w = worker(W1, &old);
    let mut servers = [
        server(1, &new, Updater::Sum),
        server(2, &new, Updater::Sum),
        server(3, &new, Updater::Sum),
    ];
    let mut out = Effects::new();
    let keys = spread(30);
    let id = w
        .push(1, KvPairs::new(keys, vec![1i64; 30], 1).unwrap(), &mut out)
        .unwrap();
    let mut redirected = false;
    let mut pending = sends_of(&mut out);
    while let Some(env) = pending.pop() {
        let mut o = Effects::new();
        match env.to {
            COORD => {
                assert_eq!(env.body, Message::ConfigRequest);
                w.on_message(2, deliver_config(W1, &new), &mut o);
            }
            W1 => {
                redirected |= matches!(env.body, Message::Redirect { epoch: 2, .. });
                w.on_message(2, env, &mut o);
            }
            to => {
                if let Message::Push(p) = &env.body {
                    if env.epoch == 2 {
                        assert!(p.kvs.keys().iter().all(|&k| new_ring.primary(k) == to));
                    }
                }
                servers[(to.0 - 1) as usize].on_message(2, env, &mut o);
            }
        }
        pending.extend(o.sends);
        out.events.extend(o.events);
    }
    assert!(
        redirected,
        "some slice reached a server that no longer owns it"
    );
    assert!(
        out.events
            .contains(&Event::Worker(WorkerEvent::PushDone(id)))
    );
    for s in &servers {
        // Each key is held once, by its new primary.
        for &k in &spread(30) {
            let held = s.value(k).is_some();
            assert_eq!(held, new_ring.primary(k) == s.id(), "key {k} at {}", s.id());
        }
    }
}

fn push_env(from: NodeId, request: u64, iteration: Iteration, key: Key, v: i64) -> Envelope<i64> {
    Envelope::new(
        from,
        NodeId(1),
        1,
        Message::Push(Push {
            slice: SliceRef { request, slice: 0 },
            iteration,
            covers: pserver_core::pace::Coverage::WHOLE,
            settled_below: 0,
            kvs: KvPairs::new(vec![key], vec![v], 1).unwrap(),
        }),
    )
}

fn progress(from: NodeId, finished_below: Iteration) -> Envelope<i64> {
    Envelope::new(
        from,
        NodeId(1),
        1,
        Message::Progress {
            finished_below,
            taken_below: finished_below,
        },
    )
}

#[test]
fn sequential_mode_applies_one_aggregated_update_per_iteration() {
    let cfg = config(1, &[1], &[W1, W2], Consistency::Sequential);
    let rule = Updater::AdaGrad { lr: 1.0, eps: 0.0 };
    let mut s: Server<f64> = Server::new(ServerConfig::new(NodeId(1), COORD), rule);
    let mut out = Effects::new();
    s.on_message(0, deliver_config(NodeId(1), &cfg), &mut out);
    let push = |from, g: f64| {
        Envelope::new(
            from,
            NodeId(1),
            1,
            Message::Push(Push {
                slice: SliceRef {
                    request: 1,
                    slice: 0,
                },
                iteration: 0,
                covers: pserver_core::pace::Coverage::WHOLE,
                settled_below: 0,
                kvs: KvPairs::new(vec![9], vec![g], 1).unwrap(),
            }),
        )
    };
    let progress = |from, finished_below| {
        Envelope::new(
            from,
            NodeId(1),
            1,
            Message::Progress {
                finished_below,
                taken_below: finished_below,
            },
        )
    };
    // Gradients 3 and 6 for key 9 in iteration 0. AdaGrad sees their sum once: n = 81,
    // w = -9 / 9 = -1. Applied one by one it would give -1 - 6 / sqrt(45).
    s.on_message(1, push(W1, 3.0), &mut out);
    s.on_message(1, push(W2, 6.0), &mut out);
    assert_eq!(
        s.value(9),
        None,
        "buffered until both workers finish iteration 0"
    );
    s.on_message(1, progress(W1, 1), &mut out);
    assert_eq!(s.value(9), None);
    s.on_message(1, progress(W2, 1), &mut out);
    assert_eq!(s.value(9), Some(&[-1.0][..]));
    assert_eq!(s.applied_below(), 1);
}

#[test]
fn a_pull_waits_until_every_live_worker_finished_the_required_iterations() {
    let cfg = config(1, &[1], &[W1, W2], Consistency::BoundedDelay(1));
    let mut s = server(1, &cfg, Updater::Sum);
    let mut out = Effects::new();
    let pull = |iteration| {
        Envelope::new(
            W1,
            NodeId(1),
            1,
            Message::Pull(Pull {
                slice: SliceRef {
                    request: 9,
                    slice: 0,
                },
                iteration,
                keys: KeySelection::Keys(KeyList::new(vec![4]).unwrap()),
            }),
        )
    };
    let replies = |out: &Effects<i64>| {
        out.sends
            .iter()
            .filter(|e| matches!(e.body, Message::PullReply(_)))
            .count()
    };
    // Iteration 1 with tau 1 needs nothing: answered at once.
    s.on_message(1, pull(1), &mut out);
    assert_eq!(replies(&out), 1);
    out.clear();
    // Iteration 3 needs both workers to have finished iterations 0 and 1.
    s.on_message(1, pull(3), &mut out);
    s.on_message(1, pull(3), &mut out);
    assert_eq!(
        (replies(&out), s.held_pulls()),
        (0, 1),
        "held once, however often sent"
    );
    s.on_message(1, progress(W1, 2), &mut out);
    assert_eq!(replies(&out), 0, "W2 has not finished iteration 1");
    s.on_message(1, progress(W2, 1), &mut out);
    assert_eq!(replies(&out), 0);
    s.on_message(1, progress(W2, 2), &mut out);
    assert_eq!(replies(&out), 1);
    assert_eq!(s.held_pulls(), 0);
}

#[test]
fn a_dead_worker_no_longer_holds_pulls_back() {
    let cfg = config(1, &[1], &[W1, W2], Consistency::Sequential);
    let mut s = server(1, &cfg, Updater::Sum);
    let mut out = Effects::new();
    s.on_message(1, push_env(W2, 1, 0, 4, 5), &mut out);
    s.on_message(1, progress(W1, 1), &mut out);
    let pull = Envelope::new(
        W1,
        NodeId(1),
        1,
        Message::Pull(Pull {
            slice: SliceRef {
                request: 2,
                slice: 0,
            },
            iteration: 1,
            keys: KeySelection::Keys(KeyList::new(vec![4]).unwrap()),
        }),
    );
    s.on_message(1, pull, &mut out);
    assert_eq!(s.held_pulls(), 1);
    out.clear();
    let without_w2 = config(2, &[1], &[W1], Consistency::Sequential);
    s.on_message(2, deliver_config(NodeId(1), &without_w2), &mut out);
    assert_eq!(s.held_pulls(), 0);
    let reply = out
        .sends
        .iter()
        .find_map(|e| match &e.body {
            Message::PullReply(r) => Some(r.kvs.clone()),
            _ => None,
        })
        .unwrap();
    // W2's acknowledged push of iteration 0 was applied with the iteration.
    assert_eq!(reply.get(4), Some(&[5i64][..]));
}

#[test]
fn a_worker_never_has_more_than_tau_plus_one_iterations_in_flight() {
    let cfg = config(1, &[1], &[W1], Consistency::BoundedDelay(1));
    let mut w = worker(W1, &cfg);
    let mut out = Effects::new();
    let kv = || KvPairs::new(vec![1], vec![1i64], 1).unwrap();
    w.push(1, kv(), &mut out).unwrap();
    w.advance(1, &mut out).unwrap();
    assert!(
        out.events
            .contains(&Event::Worker(WorkerEvent::Advanced(1))),
        "two in flight is allowed"
    );
    w.push(1, kv(), &mut out).unwrap();
    out.clear();
    w.advance(1, &mut out).unwrap();
    assert!(
        !out.events
            .contains(&Event::Worker(WorkerEvent::Advanced(2))),
        "a third would exceed tau + 1"
    );
    assert_eq!(w.in_flight(), 2);
    // Acknowledging iteration 0's push lets the worker enter iteration 2.
    w.on_message(
        2,
        Envelope::new(
            NodeId(1),
            W1,
            1,
            Message::PushAck(SliceRef {
                request: 1,
                slice: 0,
            }),
        ),
        &mut out,
    );
    assert!(
        out.events
            .contains(&Event::Worker(WorkerEvent::Advanced(2)))
    );
    assert_eq!(w.iteration(), 2);
}

#[test]
fn retransmission_backs_off_exponentially_up_to_the_cap() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg);
    let mut out = Effects::new();
    w.push(0, KvPairs::new(vec![1], vec![1i64], 1).unwrap(), &mut out)
        .unwrap();
    let mut fire_times = Vec::new();
    for _ in 0..10 {
        let at = out
            .timers
            .iter()
            .rev()
            .find_map(|t| match t {
                TimerCmd::Set {
                    timer: TimerId::Retransmit,
                    at,
                } => Some(*at),
                _ => None,
            })
            .expect("a retransmission is scheduled");
        fire_times.push(at);
        out.clear();
        w.on_timer(at, TimerId::Retransmit, &mut out);
        assert!(out.sends.iter().any(|e| matches!(e.body, Message::Push(_))));
        // Counted for operators: the push's one slice, sent again.
        assert_eq!(out.retransmitted, 1);
    }
    let gaps: Vec<u64> = fire_times
        .windows(2)
        .map(|p| (p[1] - p[0]) / 1_000_000)
        .collect();
    // Each timeout is the capped exponential one, stretched by at most a quarter of jitter.
    let base = [40, 80, 160, 320, 640, 1000, 1000, 1000, 1000];
    for (gap, base) in gaps.iter().zip(base) {
        assert!((base..=base + base / 4).contains(gap), "{gaps:?}");
    }
    assert!(
        gaps.iter().zip(base).any(|(g, b)| *g != b),
        "no jitter: {gaps:?}"
    );
}

/// The first retransmission time of one push, per worker id.
fn first_retransmission(id: NodeId) -> Time {
    let cfg = config(1, &[1], &[id], Consistency::Eventual);
    let mut w = worker(id, &cfg);
    let mut out = Effects::new();
    w.push(0, KvPairs::new(vec![1], vec![1i64], 1).unwrap(), &mut out)
        .unwrap();
    out.timers
        .iter()
        .find_map(|t| match t {
            TimerCmd::Set {
                timer: TimerId::Retransmit,
                at,
            } => Some(*at),
            _ => None,
        })
        .expect("a retransmission is scheduled")
}

#[test]
fn workers_that_lost_messages_together_do_not_retransmit_in_lock_step() {
    let times: Vec<Time> = (10..20).map(|i| first_retransmission(NodeId(i))).collect();
    let mut distinct = times.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() >= 8, "{times:?}");
    // Deterministic: the same worker always picks the same timeout.
    assert_eq!(first_retransmission(NodeId(10)), times[0]);
}

#[test]
fn a_worker_removed_from_the_cluster_is_fenced() {
    let cfg = config(1, &[1], &[W1, W2], Consistency::Eventual);
    let mut w = worker(W2, &cfg);
    let mut out = Effects::new();
    let without = config(2, &[1], &[W1], Consistency::Eventual);
    w.on_message(5, deliver_config(W2, &without), &mut out);
    assert!(out.events.contains(&Event::Fenced));
    assert!(w.is_fenced());
    let kvs = KvPairs::new(vec![1], vec![1i64], 1).unwrap();
    assert_eq!(w.push(6, kvs, &mut out), Err(WorkerError::Fenced));
}

#[test]
fn pushes_of_the_wrong_width_are_refused() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg);
    let kvs = KvPairs::new(vec![1], vec![1i64, 2], 2).unwrap();
    assert_eq!(
        w.push(0, kvs, &mut Effects::new()),
        Err(WorkerError::WidthMismatch {
            expected: 1,
            got: 2
        })
    );
}

fn coordinator() -> Coordinator {
    let mut job = CoordinatorConfig::new(COORD, 1, 2);
    job.ring = ring();
    Coordinator::new(job).unwrap()
}

/// The coordinator once the server and both workers registered: epoch 1 is published.
fn started_coordinator() -> (Coordinator, Effects<i64>) {
    let mut c = coordinator();
    let mut out = Effects::new();
    register(&mut c, 0, NodeId(1), Role::Server, &mut out);
    register(&mut c, 0, W1, Role::Worker, &mut out);
    register(&mut c, 0, W2, Role::Worker, &mut out);
    (c, out)
}

fn register(c: &mut Coordinator, now: Time, from: NodeId, role: Role, out: &mut Effects<i64>) {
    c.on_message(
        now,
        Envelope::new(
            from,
            COORD,
            0,
            Message::Register {
                role,
                incarnation: 0,
                keys_below: None,
                checkpoints: Vec::new(),
            },
        ),
        out,
    );
}

#[test]
fn the_coordinator_publishes_once_every_expected_node_registered() {
    let mut c = coordinator();
    let mut out = Effects::new();
    register(&mut c, 0, NodeId(1), Role::Server, &mut out);
    register(&mut c, 0, W1, Role::Worker, &mut out);
    assert!(c.config().is_none());
    assert!(out.sends.is_empty());
    register(&mut c, 0, W2, Role::Worker, &mut out);
    let config = c.config().unwrap().clone();
    assert_eq!(config.epoch, 1);
    assert_eq!(config.workers, vec![W1, W2]);
    let configs = out
        .sends
        .iter()
        .filter(|e| e.body == Message::Config(config.clone()))
        .count();
    assert_eq!(configs, 3);
}

#[test]
fn the_coordinator_removes_a_silent_worker_and_bumps_the_epoch() {
    let (mut c, mut out) = started_coordinator();
    let timing = Timing::default();
    let checks = timing.heartbeat_timeout / timing.heartbeat_interval;
    let beat = |from| {
        Envelope::new(
            from,
            COORD,
            1,
            Message::Heartbeat {
                sent_at: 1,
                at: None,
                term: 0,
            },
        )
    };
    for i in 1..=checks + 1 {
        assert_eq!(
            c.epoch(),
            1,
            "W2 is still a member after {} silent checks",
            i - 1
        );
        out.clear();
        c.on_message(0, beat(W1), &mut out);
        c.on_message(0, beat(NodeId(1)), &mut out);
        c.on_timer(0, TimerId::FailureCheck, &mut out);
    }
    assert_eq!(c.epoch(), 2);
    assert_eq!(c.config().unwrap().workers, vec![W1]);
    assert!(out.events.contains(&Event::NodeDead(W2)));
    assert_eq!(c.dead().iter().collect::<Vec<_>>(), [&W2]);
    assert_eq!(
        c.config().unwrap().servers,
        vec![NodeId(1)],
        "servers are kept"
    );
}

#[test]
fn a_job_the_ring_cannot_hold_is_refused_at_setup() {
    let mut job = CoordinatorConfig::new(COORD, 1, 1);
    job.ring = RingConfig {
        vnodes: 8,
        replicas: 1,
        seed: 0,
        ..RingConfig::default()
    };
    let err = Coordinator::new(job).unwrap_err();
    assert!(
        err.to_string()
            .contains("1 replicas need at least 2 servers"),
        "{err}"
    );
}

/// A user-defined rule: keep the largest value ever pushed, and count the pushes in `aux`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct KeepMax;

impl UpdateRule<i64> for KeepMax {
    fn aux_width(&self) -> usize {
        1
    }
    fn apply(&self, weight: &mut i64, aux: &mut [i64], delta: i64) {
        *weight = (*weight).max(delta);
        aux[0] += 1;
    }
}

#[test]
fn servers_run_user_defined_update_rules() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s = server(1, &cfg, KeepMax);
    let mut out = Effects::new();
    for (request, v) in [(1, 4), (2, 9), (3, 2)] {
        s.on_message(1, push_env(W1, request, 0, 6, v), &mut out);
    }
    assert_eq!(s.value(6), Some(&[9i64][..]));
}

#[test]
fn a_push_that_beats_the_configuration_is_applied_once_it_arrives() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s: Server<i64> = Server::new(ServerConfig::new(NodeId(1), COORD), Updater::Sum);
    let mut out = Effects::new();
    s.start(0, &mut out);
    out.clear();
    // Two copies arrive before the server has any configuration: kept once, not answered yet.
    s.on_message(1, push_env(W1, 1, 0, 8, 5), &mut out);
    s.on_message(1, push_env(W1, 1, 0, 8, 5), &mut out);
    assert!(out.sends.is_empty());
    assert_eq!(s.value(8), None);
    s.on_message(2, deliver_config(NodeId(1), &cfg), &mut out);
    assert_eq!(s.value(8), Some(&[5i64][..]));
    let acks = out
        .sends
        .iter()
        .filter(|e| matches!(e.body, Message::PushAck(_)))
        .count();
    assert_eq!(acks, 1);
}

#[test]
fn a_server_taken_off_the_ring_hands_its_keys_to_the_others() {
    let old = config(1, &[1, 2, 3], &[W1], Consistency::Eventual);
    let new = old.without_server(NodeId(2)).unwrap();
    assert_eq!(new.epoch, 2);
    assert_eq!(new.servers, vec![NodeId(1), NodeId(3)]);
    let ring = Ring::new(new.servers.clone(), new.ring).unwrap();
    assert!(spread(64).iter().all(|&k| ring.primary(k) != NodeId(2)));
    assert_eq!(
        new.without_server(NodeId(2)),
        Err(RingError::UnknownServer(NodeId(2)))
    );
    let last = config(1, &[1], &[W1], Consistency::Eventual);
    assert_eq!(last.without_server(NodeId(1)), Err(RingError::NoServers));
}

#[test]
fn a_resumed_coordinator_hands_out_the_configuration_in_force() {
    let config = config(1, &[1, 2], &[W1], Consistency::Sequential)
        .without_server(NodeId(1))
        .unwrap();
    let mut c = Coordinator::resume(CoordinatorConfig::new(COORD, 9, 9), config.clone()).unwrap();
    assert_eq!(c.config(), Some(&config));
    let mut out = Effects::<i64>::new();
    c.on_message(
        0,
        Envelope::new(W1, COORD, 1, Message::ConfigRequest),
        &mut out,
    );
    assert_eq!(sends_of(&mut out), vec![deliver_config::<i64>(W1, &config)]);
    let empty = ClusterConfig {
        workers: vec![],
        ..config.clone()
    };
    assert_eq!(
        Coordinator::resume(CoordinatorConfig::new(COORD, 1, 1), empty),
        Err(CoordinatorError::NoWorkers)
    );
}

#[test]
fn a_bootstrapped_coordinator_counts_the_members_it_is_given() {
    // The job's shape says 9 servers and 9 workers; the members given up front are what counts.
    let mut job = CoordinatorConfig::new(COORD, 9, 9);
    job.ring = ring();
    let c = Coordinator::bootstrapped(job, &[NodeId(1), NodeId(2)], &[W1]).unwrap();
    let config = c.config().expect("epoch 1 is in force from the start");
    assert_eq!(config.epoch, 1);
    assert_eq!(config.servers, vec![NodeId(1), NodeId(2)]);
    assert_eq!(config.workers, vec![W1]);
}

#[test]
fn a_resumed_coordinator_takes_its_id_and_shape_from_the_configuration() {
    let config = config(3, &[1, 2], &[W1, W2], Consistency::Sequential);
    // The job's shape is left at a placeholder: an id of its own, no servers, no workers.
    let c = Coordinator::resume(CoordinatorConfig::new(NodeId(99), 0, 0), config.clone()).unwrap();
    assert_eq!(c.id(), COORD);
    assert_eq!(c.epoch(), 3);
    assert_eq!(c.config(), Some(&config));
}

#[test]
fn the_coordinator_checks_for_silent_workers_every_heartbeat_interval() {
    let mut c = coordinator();
    let mut out = Effects::<i64>::new();
    let every = Timing::default().heartbeat_interval;
    let check_at = |at| TimerCmd::Set {
        timer: TimerId::FailureCheck,
        at,
    };
    c.start(1_000, &mut out);
    assert_eq!(out.timers, [check_at(1_000 + every)]);
    out.clear();
    c.on_timer(7_000, TimerId::FailureCheck, &mut out);
    assert_eq!(out.timers, [check_at(7_000 + every)]);
}

#[test]
fn the_coordinator_answers_heartbeats_and_admits_latecomers_in_a_new_epoch() {
    let (mut c, mut out) = started_coordinator();
    let config = c.config().unwrap().clone();
    out.clear();
    let beat = |epoch| {
        Envelope::new(
            W1,
            COORD,
            epoch,
            Message::Heartbeat {
                sent_at: 1,
                at: None,
                term: 0,
            },
        )
    };
    // A heartbeat at the current epoch is answered with its time, and is no refusal.
    c.on_message(0, beat(1), &mut out);
    let ack = Envelope::new(
        COORD,
        W1,
        1,
        Message::HeartbeatAck {
            sent_at: 1,
            degraded: Vec::new(),
        },
    );
    assert_eq!(sends_of(&mut out), vec![ack]);
    assert!(out.events.is_empty(), "{out:?}");
    // A node behind the current epoch is sent the configuration.
    c.on_message(0, beat(0), &mut out);
    assert_eq!(sends_of(&mut out), vec![deliver_config::<i64>(W1, &config)]);
    // A member registering again (its configuration was lost) is told it again.
    register(&mut c, 0, W2, Role::Worker, &mut out);
    assert_eq!(c.config(), Some(&config));
    assert_eq!(sends_of(&mut out), vec![deliver_config::<i64>(W2, &config)]);
    // A worker registering after the configuration was published joins in a new epoch, which
    // every member hears.
    let late = NodeId(12);
    register(&mut c, 0, late, Role::Worker, &mut out);
    let next = c.config().unwrap().clone();
    assert_eq!(next.epoch, 2);
    assert_eq!(next.workers, vec![W1, W2, late]);
    let told: Vec<NodeId> = sends_of(&mut out).iter().map(|e| e.to).collect();
    assert_eq!(told, vec![NodeId(1), W1, W2, late]);
    assert!(out.events.is_empty(), "{out:?}");
}

fn register_as(c: &mut Coordinator, from: NodeId, incarnation: u64, out: &mut Effects<i64>) {
    let body = Message::Register {
        role: Role::Server,
        incarnation,
        keys_below: None,
        checkpoints: Vec::new(),
    };
    c.on_message(0, Envelope::new(from, COORD, 0, body), out);
}

/// Every configuration names the incarnation each server registered with, so that a restarted
/// process can tell a configuration about its earlier start from one about itself; and a late
/// registration of an earlier start does not take the node off the ring again.
#[test]
fn the_coordinator_lists_registered_incarnations_and_refuses_earlier_ones() {
    let mut job = CoordinatorConfig::new(COORD, 2, 1);
    job.ring = ring();
    let mut c = Coordinator::new(job).unwrap();
    let mut out = Effects::new();
    register_as(&mut c, NodeId(1), 5, &mut out);
    register_as(&mut c, NodeId(2), 6, &mut out);
    register(&mut c, 0, W1, Role::Worker, &mut out);
    let first = c.config().unwrap().clone();
    assert_eq!(first.incarnations, vec![(NodeId(1), 5), (NodeId(2), 6)]);
    assert_eq!(first.incarnation_of(NodeId(2)), Some(6));
    assert_eq!(first.incarnation_of(W1), None);
    // The node restarts: the new process is taken off the ring and joins under its own
    // incarnation.
    register_as(&mut c, NodeId(1), 9, &mut out);
    let next = c.config().unwrap().clone();
    assert_eq!((next.epoch, &next.joining[..]), (2, &[NodeId(1)][..]));
    assert_eq!(next.incarnations, vec![(NodeId(1), 9), (NodeId(2), 6)]);
    // A resend from the process that is gone changes nothing, and is reported.
    out.clear();
    register_as(&mut c, NodeId(1), 5, &mut out);
    assert_eq!(c.config(), Some(&next));
    assert!(out.sends.is_empty());
    assert_eq!(
        out.events,
        vec![Event::Refused {
            from: NodeId(1),
            reason: Refusal::OtherIncarnation {
                known: 9,
                claimed: 5
            }
        }]
    );
}

#[test]
fn servers_and_workers_say_once_that_the_coordinator_is_silent_and_once_that_it_is_back() {
    let (mut c, mut out) = started_coordinator();
    let config = c.config().unwrap().clone();
    let epoch = config.epoch;
    let timing = Timing::default();
    let allowed = timing.coordinator_timeout / timing.heartbeat_interval;
    let mut w = worker(W1, &config);
    let mut s = server(1, &config, Updater::Sum);
    let said = |out: &mut Effects<i64>| {
        let said: Vec<_> = out
            .events
            .drain(..)
            .filter(|e| matches!(e, Event::CoordinatorSilent { .. } | Event::CoordinatorBack))
            .collect();
        out.sends.clear();
        said
    };
    let (mut w_out, mut s_out) = (Effects::new(), Effects::new());
    // The coordinator answers: nobody says anything, however long it goes on.
    for now in 1..=3 * allowed {
        w.on_timer(now, TimerId::Heartbeat, &mut w_out);
        s.on_timer(now, TimerId::Heartbeat, &mut s_out);
        let beats: Vec<_> = w_out.sends.drain(..).chain(s_out.sends.drain(..)).collect();
        for beat in beats {
            out.clear();
            c.on_message(now, beat, &mut out);
            for answer in out.sends.drain(..) {
                assert_eq!(answer.epoch, epoch);
                if answer.to == W1 {
                    w.on_message(now, answer, &mut w_out);
                } else {
                    s.on_message(now, answer, &mut s_out);
                }
            }
        }
        assert_eq!(said(&mut w_out), [], "at heartbeat {now}");
        assert_eq!(said(&mut s_out), [], "at heartbeat {now}");
    }
    // Silent: said once, after the timeout's worth of heartbeats.
    let mut heard_at = None;
    for i in 1..=3 * allowed {
        w.on_timer(i, TimerId::Heartbeat, &mut w_out);
        s.on_timer(i, TimerId::Heartbeat, &mut s_out);
        let (ws, ss) = (said(&mut w_out), said(&mut s_out));
        assert_eq!(ws, ss);
        if !ws.is_empty() {
            assert!(heard_at.is_none(), "said twice");
            heard_at = Some(i);
            let silent = Event::CoordinatorSilent {
                for_at_least: timing.coordinator_timeout,
            };
            assert_eq!(ws, [silent]);
        }
    }
    assert_eq!(heard_at, Some(allowed + 1));
    // Back: any message of the coordinator's says so, once.
    let ack = |to| {
        Envelope::new(
            COORD,
            to,
            epoch,
            Message::HeartbeatAck {
                sent_at: 0,
                degraded: Vec::new(),
            },
        )
    };
    for _ in 0..2 {
        w.on_message(0, ack(W1), &mut w_out);
        s.on_message(0, ack(NodeId(1)), &mut s_out);
    }
    assert_eq!(said(&mut w_out), [Event::CoordinatorBack]);
    assert_eq!(said(&mut s_out), [Event::CoordinatorBack]);
    assert!(
        w_out.events.is_empty() && s_out.events.is_empty(),
        "an answer is taken without a refusal: {:?} {:?}",
        w_out.events,
        s_out.events
    );
}

#[test]
fn a_leave_from_before_the_epoch_in_force_is_refused_so_a_late_one_takes_no_new_process_out() {
    let (mut c, mut out) = started_coordinator();
    // Another worker joins: epoch 2.
    register(&mut c, 0, NodeId(12), Role::Worker, &mut out);
    assert_eq!(c.epoch(), 2);
    out.clear();
    let leave = |epoch| Envelope::new(W1, COORD, epoch, Message::Leave);
    // Sent at epoch 1, perhaps by an earlier process of W1: refused, and W1 told the epoch.
    c.on_message(0, leave(1), &mut out);
    assert_eq!(c.epoch(), 2);
    assert!(c.config().unwrap().workers.contains(&W1));
    assert_eq!(
        out.events,
        [Event::Refused {
            from: W1,
            reason: Refusal::StaleEpoch {
                epoch: 1,
                current: 2
            }
        }]
    );
    let config = c.config().unwrap().clone();
    assert_eq!(sends_of(&mut out), [deliver_config(W1, &config)]);
    // Said again at the epoch in force, it is taken.
    out.clear();
    c.on_message(0, leave(2), &mut out);
    let config = c.config().unwrap();
    assert_eq!(config.epoch, 3);
    assert!(!config.workers.contains(&W1));
    assert_eq!(config.left, [W1]);
}

/// The first configuration's ring: spread over the keys the workers said they use when the
/// job gave it no key space, so that keys of a small dimension reach every server; the job's
/// own key space when it gave one.
#[test]
fn a_ring_without_a_key_space_is_spread_over_the_keys_the_workers_use() {
    let first_ring = |declared: Option<u64>, bounds: [Option<u64>; 2]| {
        let mut job = CoordinatorConfig::new(COORD, 2, 2);
        if let Some(space) = declared {
            job.ring.key_space = space;
        }
        let mut c = Coordinator::new(job).unwrap();
        let mut out: Effects<i64> = Effects::default();
        for server in [NodeId(1), NodeId(2)] {
            register_as(&mut c, server, 0, &mut out);
        }
        for (worker, keys_below) in [NodeId(3), NodeId(4)].into_iter().zip(bounds) {
            let body = Message::Register {
                role: Role::Worker,
                incarnation: 0,
                keys_below,
                checkpoints: Vec::new(),
            };
            c.on_message(0, Envelope::new(worker, COORD, 0, body), &mut out);
        }
        c.config().unwrap().ring
    };
    assert_eq!(first_ring(None, [Some(123), Some(4_000)]).key_space, 4_000);
    assert_eq!(first_ring(None, [None, Some(77)]).key_space, 77);
    // Keys hashed over the whole range: nothing said, nothing changed.
    assert_eq!(first_ring(None, [None, None]).key_space, u64::MAX);
    // A key space the job gave is kept.
    assert_eq!(
        first_ring(Some(1 << 20), [Some(123), None]).key_space,
        1 << 20
    );
    // Spread over 4,000 keys, both servers are the primary of some of them.
    let ring = Ring::new(
        [NodeId(1), NodeId(2)],
        first_ring(None, [Some(4_000), None]),
    )
    .unwrap();
    let primaries: std::collections::BTreeSet<NodeId> =
        (0..4_000).map(|k| ring.primary(k)).collect();
    assert_eq!(primaries.len(), 2);
}

/// A configuration of an older coordinator term than the one a node holds comes from a
/// coordinator another took over from: every node kind refuses it visibly, whatever its
/// epoch, and stays on the configuration it holds.
#[test]
fn a_configuration_from_an_older_term_is_refused_by_every_node_kind() {
    let mut newer = config(3, &[1, 2], &[W1], Consistency::Eventual);
    newer.term = 2;
    let older = ClusterConfig {
        epoch: 4,
        term: 1,
        servers: vec![NodeId(1)],
        ..newer.clone()
    };
    let refused = |out: &Effects<i64>| {
        out.events.iter().any(|e| {
            *e == Event::Refused {
                from: COORD,
                reason: Refusal::StaleTerm {
                    term: 1,
                    current: 2,
                },
            }
        })
    };
    let mut s = server(1, &newer, Updater::Sum);
    let mut out = Effects::new();
    s.on_message(0, deliver_config(NodeId(1), &older), &mut out);
    assert!(refused(&out), "{:?}", out.events);
    assert_eq!(s.config(), Some(&newer));
    let mut w = worker(W1, &newer);
    let mut out = Effects::new();
    w.on_message(0, deliver_config(W1, &older), &mut out);
    assert!(refused(&out), "{:?}", out.events);
    assert_eq!(w.config(), Some(&newer));
    // A later term is followed, as a later epoch is.
    let later = ClusterConfig {
        epoch: 4,
        term: 3,
        ..newer.clone()
    };
    let mut out = Effects::new();
    w.on_message(0, deliver_config(W1, &later), &mut out);
    assert_eq!(w.config(), Some(&later));
}
