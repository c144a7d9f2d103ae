//! Round-robin push slots, driven by hand (ARCHITECTURE.md §9): a worker asks before it sends
//! a large push slice and sends it once granted; a server grants a few slots at a time, to
//! the workers in turn, and takes a slot back when its slice arrives or its lease runs out.

use crate::common;
use pserver_core::events::{Refusal, WorkerEvent};

use common::config;
use pserver_core::node::*;
use pserver_core::pace::Coverage;
use pserver_core::slots::PushSlots;
use pserver_core::wire::ClusterConfig;
use pserver_core::wire::*;
use pserver_core::*;

const S1: NodeId = NodeId(1);
const W: [NodeId; 3] = [NodeId(2), NodeId(3), NodeId(4)];

/// A slice of ten keys needs a slot (18 bytes a row of one `i64`), one of two does not.
const SLOTS: PushSlots = PushSlots {
    min_bytes: 100,
    at_once: 1,
};

fn rows(first: Key, n: u64) -> KvPairs<i64> {
    let keys: Vec<Key> = (first..first + n).collect();
    KvPairs::new(keys, vec![1; n as usize], 1).unwrap()
}

fn sref(request: RequestId, slice: SliceId) -> SliceRef {
    SliceRef { request, slice }
}

/// One server and the three workers `W`, sequential, epoch 1.
fn cluster() -> ClusterConfig {
    config(1, &[1], &W, Consistency::Sequential)
}

fn job(slots: Option<PushSlots>) -> JobSpec {
    let mut job = JobSpec::new(1, 3);
    job.ring = common::ring();
    job.push_slots = slots;
    job
}

fn worker(slots: Option<PushSlots>) -> Worker<i64> {
    let mut w = Worker::new(job(slots).worker_config(W[0]));
    w.start_configured(0, cluster(), &mut Effects::new());
    w
}

fn server(slots: Option<PushSlots>) -> Server<i64> {
    let mut s = Server::new(job(slots).server_config(S1), Updater::Sum);
    s.start_configured(0, cluster(), &mut Effects::new());
    s
}

/// What `out` sends, in order: "ask", "grant" or "push", with the addressee and the slice.
fn said(out: &Effects<i64>) -> Vec<(&'static str, NodeId, SliceRef)> {
    out.sends
        .iter()
        .filter_map(|e| match &e.body {
            Message::SlotAsk { slice, .. } => Some(("ask", e.to, *slice)),
            Message::SlotGrant(slice) => Some(("grant", e.to, *slice)),
            Message::Push(p) => Some(("push", e.to, p.slice)),
            _ => None,
        })
        .collect()
}

fn ask(s: &mut Server<i64>, now: Time, from: NodeId, slice: SliceRef) -> Effects<i64> {
    let mut out = Effects::new();
    let body = Message::SlotAsk { slice, bytes: 180 };
    s.on_message(now, Envelope::new(from, S1, 1, body), &mut out);
    out
}

fn push(s: &mut Server<i64>, now: Time, from: NodeId, slice: SliceRef) -> Effects<i64> {
    let mut out = Effects::new();
    let body = Message::Push(Push {
        slice,
        iteration: 0,
        covers: Coverage::WHOLE,
        settled_below: 1,
        kvs: rows(u64::from(from.0) * 100, 10),
    });
    s.on_message(now, Envelope::new(from, S1, 1, body), &mut out);
    out
}

fn grants(out: &Effects<i64>) -> Vec<(NodeId, SliceRef)> {
    said(out)
        .into_iter()
        .filter(|(what, ..)| *what == "grant")
        .map(|(_, to, slice)| (to, slice))
        .collect()
}

#[test]
fn a_large_push_waits_for_its_grant_and_a_small_one_goes_at_once() {
    let mut w = worker(Some(SLOTS));
    let mut out = Effects::new();
    let large = w.push(10, rows(0, 10), &mut out).unwrap();
    let small = w.push(10, rows(50, 2), &mut out).unwrap();
    assert_eq!(
        said(&out),
        [("ask", S1, sref(large, 0)), ("push", S1, sref(small, 0))]
    );
    // Unanswered, the ask is sent again on the retransmission timer, never the slice.
    let due = out
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
        .unwrap();
    let mut again = Effects::new();
    w.on_timer(due, TimerId::Retransmit, &mut again);
    assert!(said(&again).contains(&("ask", S1, sref(large, 0))));
    assert!(!said(&again).contains(&("push", S1, sref(large, 0))));
    // An acknowledgement for the slice it never sent is no answer.
    let mut acked = Effects::new();
    let ack = Envelope::new(S1, W[0], 1, Message::PushAck(sref(large, 0)));
    w.on_message(due, ack, &mut acked);
    assert!(matches!(
        acked.events[..],
        [Event::Refused {
            reason: Refusal::BadAnswer,
            ..
        }]
    ));
    // The grant lets the slice go, once: a second grant is harmless.
    for sent in [1, 0] {
        let mut granted = Effects::new();
        let grant = Envelope::new(S1, W[0], 1, Message::SlotGrant(sref(large, 0)));
        w.on_message(due + 1, grant, &mut granted);
        assert_eq!(said(&granted).len(), sent, "{:?}", granted.sends);
        assert!(granted.events.is_empty());
    }
    // Once sent, the slice is acknowledged like any other.
    let mut done = Effects::new();
    let ack = Envelope::new(S1, W[0], 1, Message::PushAck(sref(large, 0)));
    w.on_message(due + 2, ack, &mut done);
    assert!(
        done.events
            .contains(&Event::Worker(WorkerEvent::PushDone(large)))
    );
}

#[test]
fn a_grant_from_another_server_than_the_slice_s_is_refused() {
    let mut w = worker(Some(SLOTS));
    let mut out = Effects::new();
    let large = w.push(10, rows(0, 10), &mut out).unwrap();
    out.clear();
    let grant = Envelope::new(NodeId(7), W[0], 1, Message::SlotGrant(sref(large, 0)));
    w.on_message(11, grant, &mut out);
    assert!(out.sends.is_empty());
    assert!(matches!(
        out.events[..],
        [Event::Refused {
            reason: Refusal::BadAnswer,
            ..
        }]
    ));
}

#[test]
fn without_push_slots_nothing_asks_and_every_slice_goes_at_once() {
    let mut w = worker(None);
    let mut out = Effects::new();
    let large = w.push(10, rows(0, 10), &mut out).unwrap();
    assert_eq!(said(&out), [("push", S1, sref(large, 0))]);
    // A server of a job without slots lets an ask in at once, holding nothing.
    let mut s = server(None);
    assert_eq!(
        grants(&ask(&mut s, 1, W[0], sref(1, 0))),
        [(W[0], sref(1, 0))]
    );
    assert_eq!(
        grants(&ask(&mut s, 1, W[1], sref(1, 0))),
        [(W[1], sref(1, 0))]
    );
    assert_eq!(s.push_slots(), (0, 0));
}

#[test]
fn a_server_grants_at_most_at_once_slots_and_the_workers_take_turns() {
    let mut s = server(Some(SLOTS));
    // W0 asks for two slices before the others ask for one each.
    assert_eq!(
        grants(&ask(&mut s, 1, W[0], sref(1, 0))),
        [(W[0], sref(1, 0))]
    );
    assert!(grants(&ask(&mut s, 2, W[0], sref(1, 1))).is_empty());
    assert!(grants(&ask(&mut s, 3, W[1], sref(1, 0))).is_empty());
    assert!(grants(&ask(&mut s, 4, W[2], sref(1, 0))).is_empty());
    assert_eq!(s.push_slots(), (1, 3));
    // A resent ask keeps its place and takes no second one.
    assert!(grants(&ask(&mut s, 5, W[1], sref(1, 0))).is_empty());
    assert_eq!(s.push_slots(), (1, 3));
    // Each arrival frees the slot for the next worker in turn: W0's second slice waits for
    // the others' first.
    let mut order = Vec::new();
    let mut next = (W[0], sref(1, 0));
    for now in 10..14 {
        let out = push(&mut s, now, next.0, next.1);
        assert!(
            out.sends
                .iter()
                .any(|e| matches!(e.body, Message::PushAck(_) | Message::PushTaken(_))),
            "the push itself is taken in as usual"
        );
        let granted = grants(&out);
        assert!(granted.len() <= 1);
        let Some(&g) = granted.first() else {
            break;
        };
        order.push(g);
        next = g;
        assert_eq!(s.push_slots().0, 1);
    }
    assert_eq!(
        order,
        [(W[1], sref(1, 0)), (W[2], sref(1, 0)), (W[0], sref(1, 1))]
    );
    assert_eq!(s.push_slots(), (0, 0));
}

#[test]
fn two_slots_at_once_let_two_slices_in_together() {
    let two = PushSlots {
        at_once: 2,
        ..SLOTS
    };
    let mut s = server(Some(two));
    let mut granted = Vec::new();
    for (i, w) in W.iter().enumerate() {
        granted.extend(grants(&ask(&mut s, i as Time, *w, sref(1, 0))));
    }
    assert_eq!(granted, [(W[0], sref(1, 0)), (W[1], sref(1, 0))]);
    assert_eq!(
        grants(&push(&mut s, 5, W[1], sref(1, 0))),
        [(W[2], sref(1, 0))]
    );
    assert_eq!(s.push_slots(), (2, 0));
}

#[test]
fn a_repeated_ask_is_granted_again_and_one_for_a_slice_that_arrived_takes_no_slot() {
    let mut s = server(Some(SLOTS));
    assert_eq!(grants(&ask(&mut s, 1, W[0], sref(1, 0))).len(), 1);
    // The grant was lost: asked again, it is granted again, and the slot is still one.
    assert_eq!(
        grants(&ask(&mut s, 2, W[0], sref(1, 0))),
        [(W[0], sref(1, 0))]
    );
    assert_eq!(s.push_slots(), (1, 0));
    push(&mut s, 3, W[0], sref(1, 0));
    // A late copy of the ask: granted at once (a resend is acknowledged as a duplicate),
    // holding nothing, so that the next worker is not kept waiting for a lease.
    assert_eq!(
        grants(&ask(&mut s, 4, W[0], sref(1, 0))),
        [(W[0], sref(1, 0))]
    );
    assert_eq!(s.push_slots(), (0, 0));
    assert_eq!(
        grants(&ask(&mut s, 5, W[1], sref(1, 0))),
        [(W[1], sref(1, 0))]
    );
}

#[test]
fn a_slot_whose_slice_never_comes_is_freed_when_its_lease_runs_out() {
    let mut s = server(Some(SLOTS));
    let first = ask(&mut s, 1, W[0], sref(1, 0));
    let lease = first
        .timers
        .iter()
        .find_map(|t| match t {
            TimerCmd::Set {
                timer: TimerId::SlotLease,
                at,
            } => Some(*at),
            _ => None,
        })
        .expect("a granted slot sets the lease timer");
    assert!(lease > 1);
    // W0 died with its slot; W1 waits behind it.
    assert!(grants(&ask(&mut s, 2, W[1], sref(1, 0))).is_empty());
    // A timer that fires early (any driver may) takes nothing back.
    let mut early = Effects::new();
    s.on_timer(lease - 1, TimerId::SlotLease, &mut early);
    assert!(grants(&early).is_empty());
    assert!(early.timers.contains(&TimerCmd::Set {
        timer: TimerId::SlotLease,
        at: lease
    }));
    let mut out = Effects::new();
    s.on_timer(lease, TimerId::SlotLease, &mut out);
    assert_eq!(grants(&out), [(W[1], sref(1, 0))]);
    assert_eq!(s.push_slots(), (1, 0));
}

#[test]
fn a_configuration_without_a_worker_frees_its_slot() {
    let mut s = server(Some(SLOTS));
    ask(&mut s, 1, W[0], sref(1, 0));
    assert!(grants(&ask(&mut s, 2, W[1], sref(1, 0))).is_empty());
    let mut next = config(2, &[1], &W[1..], Consistency::Sequential);
    next.shares = W.to_vec();
    let mut out = Effects::new();
    s.on_message(3, common::deliver_config(S1, &next), &mut out);
    assert_eq!(grants(&out), [(W[1], sref(1, 0))]);
}

#[test]
fn an_ask_from_a_worker_not_in_the_configuration_is_refused() {
    let mut s = server(Some(SLOTS));
    let stranger = NodeId(9);
    let out = ask(&mut s, 1, stranger, sref(1, 0));
    assert!(out.sends.is_empty());
    assert_eq!(
        out.events,
        [Event::Refused {
            from: stranger,
            reason: Refusal::UnknownSender
        }]
    );
    assert_eq!(s.push_slots(), (0, 0));
}

/// Three workers push large pushes together through drivers on a lossless network: the
/// asks queue up, the server never grants more than one slot, and every push completes.
#[test]
fn workers_pushing_together_all_complete_one_slot_at_a_time() {
    let job = job(Some(SLOTS));
    let coordinator = Coordinator::bootstrapped(job.coordinator_config(), &[S1], &W).unwrap();
    let config = coordinator.config().cloned().unwrap();
    let mut nodes: Vec<Driver<i64>> = job
        .node_ids()
        .into_iter()
        .map(|id| job.driver(id, 0).unwrap())
        .collect();
    for d in &mut nodes {
        d.start_configured(0, config.clone());
    }
    let ids: Vec<RequestId> = W
        .iter()
        .map(|w| {
            nodes[w.0 as usize]
                .worker()
                .unwrap()
                .push(0, rows(0, 10))
                .unwrap()
        })
        .collect();
    let mut done = Vec::new();
    let mut most_waiting = 0;
    loop {
        let mut moved = false;
        for i in 0..nodes.len() {
            while let Some(t) = nodes[i].poll_transmit() {
                let from = nodes[i].id();
                nodes[t.to.0 as usize].handle_frame(0, from, &t.frame);
                moved = true;
                let (granted, waiting) = nodes[S1.0 as usize]
                    .node()
                    .as_server()
                    .unwrap()
                    .push_slots();
                assert!(granted <= 1);
                most_waiting = most_waiting.max(waiting);
            }
        }
        for w in W {
            done.extend(
                std::iter::from_fn(|| nodes[w.0 as usize].poll_event())
                    .filter(|e| matches!(e, Event::Worker(WorkerEvent::PushDone(_)))),
            );
        }
        if !moved {
            break;
        }
    }
    assert_eq!(most_waiting, 2, "the later workers waited their turn");
    let mut expected: Vec<Event<i64>> = ids
        .iter()
        .map(|&id| Event::Worker(WorkerEvent::PushDone(id)))
        .collect();
    expected.dedup();
    assert_eq!(done.len(), 3);
    assert!(expected.iter().all(|e| done.contains(e)));
}
