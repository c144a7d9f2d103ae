//! The worker state machine driven by hand, message by message: registration and timers, how
//! requests are cut and windowed, retransmission and progress deadlines, which answers it takes
//! or refuses, and what it reports about itself.

use crate::common;
use pserver_core::events::{Refusal, WorkerEvent};

use common::COORD;
use pserver_core::node::DEFAULT_MAX_SLICE_BYTES;
use pserver_core::node::*;
use pserver_core::ring::*;
use pserver_core::wire::ClusterConfig;
use pserver_core::wire::*;
use pserver_core::*;

const S1: NodeId = NodeId(1);
const S2: NodeId = NodeId(2);
const W1: NodeId = NodeId(10);

const MS: Time = 1_000_000;
/// A time well past zero, so that a deadline computed backwards or multiplied shows.
const T: Time = 1_000 * MS;

/// A configuration whose one worker is `W1`.
fn config(epoch: Epoch, servers: &[u32], c: Consistency) -> ClusterConfig {
    common::config(epoch, servers, &[W1], c)
}

/// `config` as the coordinator sends it to `W1`.
fn deliver_config(config: &ClusterConfig) -> Envelope<i64> {
    common::deliver_config(W1, config)
}

fn worker_with(wc: WorkerConfig, c: &ClusterConfig) -> Worker<i64> {
    let mut w = Worker::new(wc);
    w.start_configured(0, c.clone(), &mut Effects::new());
    w
}

fn worker(c: &ClusterConfig) -> Worker<i64> {
    worker_with(WorkerConfig::new(W1, COORD), c)
}

fn one(key: Key) -> KvPairs<i64> {
    KvPairs::new(vec![key], vec![1], 1).unwrap()
}

fn keys(ks: &[Key]) -> KeySelection {
    KeySelection::Keys(KeyList::new(ks.to_vec()).unwrap())
}

fn ranges(rs: &[(Key, Key)]) -> KeySelection {
    let rs = rs
        .iter()
        .map(|&(a, b)| KeyRange::new(a, b).unwrap())
        .collect();
    KeySelection::Ranges(RangeList::new(rs).unwrap())
}

/// The pushes among `out`'s sends: (to, slice, settled_below, keys).
fn pushes(out: &Effects<i64>) -> Vec<(NodeId, SliceRef, RequestId, Vec<Key>)> {
    out.sends
        .iter()
        .filter_map(|e| match &e.body {
            Message::Push(p) => Some((e.to, p.slice, p.settled_below, p.kvs.keys().to_vec())),
            _ => None,
        })
        .collect()
}

fn pulls(out: &Effects<i64>) -> Vec<(NodeId, Pull)> {
    out.sends
        .iter()
        .filter_map(|e| match &e.body {
            Message::Pull(p) => Some((e.to, p.clone())),
            _ => None,
        })
        .collect()
}

fn progress_sends(out: &Effects<i64>) -> Vec<(NodeId, Iteration)> {
    out.sends
        .iter()
        .filter_map(|e| match e.body {
            Message::Progress { finished_below, .. } => Some((e.to, finished_below)),
            _ => None,
        })
        .collect()
}

/// The deadline of the last retransmission timer set in `out`.
fn retransmit_at(out: &Effects<i64>) -> Option<Time> {
    out.timers.iter().rev().find_map(|t| match t {
        TimerCmd::Set {
            timer: TimerId::Retransmit,
            at,
        } => Some(*at),
        _ => None,
    })
}

/// `at` lies within `rto` after `from`, stretched by at most a quarter.
fn within(at: Option<Time>, from: Time, rto: Time) -> bool {
    at.is_some_and(|at| (from + rto..=from + rto + rto / 4).contains(&at))
}

/// Slice `slice` of request `request`.
fn sref(request: RequestId, slice: SliceId) -> SliceRef {
    SliceRef { request, slice }
}

fn ack(from: NodeId, slice: SliceRef) -> Envelope<i64> {
    Envelope::new(from, W1, 1, Message::PushAck(slice))
}

fn reply(from: NodeId, slice: SliceRef, kvs: KvPairs<i64>, resume: Option<Key>) -> Envelope<i64> {
    Envelope::new(
        from,
        W1,
        1,
        Message::PullReply(PullReply {
            slice,
            complete_below: 0,
            kvs,
            resume,
        }),
    )
}

fn refused(from: NodeId, reason: Refusal) -> Event<i64> {
    Event::Refused { from, reason }
}

/// Some key whose primary is `server` under `c`.
fn key_of(c: &ClusterConfig, server: NodeId) -> Key {
    let ring = Ring::new(c.servers.clone(), c.ring).unwrap();
    (0..64u64)
        .map(|i| i * (u64::MAX / 64))
        .find(|&k| ring.primary(k) == server)
        .expect("the server owns some key")
}

#[test]
fn a_worker_registers_and_beats_refuses_requests_until_configured_and_reports_its_state() {
    let timing = Timing::default();
    let mut w: Worker<i64> = Worker::new(WorkerConfig::new(W1, COORD));
    assert_eq!((w.id(), w.epoch(), w.consistency()), (W1, 0, None));
    assert!(w.is_idle() && !w.is_fenced());
    let mut out = Effects::new();
    w.start(T, &mut out);
    let register = Envelope::new(
        W1,
        COORD,
        0,
        Message::Register {
            role: Role::Worker,
            incarnation: 0,
            keys_below: None,
            checkpoints: Vec::new(),
        },
    );
    assert_eq!(out.sends, vec![register.clone()]);
    assert_eq!(
        out.timers,
        vec![
            TimerCmd::Set {
                timer: TimerId::Register,
                at: T + timing.register_retry
            },
            TimerCmd::Set {
                timer: TimerId::Heartbeat,
                at: T + timing.heartbeat_interval
            },
        ]
    );
    out.clear();
    w.on_timer(2 * T, TimerId::Register, &mut out);
    assert_eq!(out.sends, vec![register]);
    assert_eq!(
        out.timers,
        vec![TimerCmd::Set {
            timer: TimerId::Register,
            at: 2 * T + timing.register_retry
        }]
    );
    out.clear();
    w.on_timer(3 * T, TimerId::Heartbeat, &mut out);
    assert_eq!(
        out.sends,
        vec![Envelope::new(
            W1,
            COORD,
            0,
            Message::Heartbeat {
                sent_at: 3 * T,
                at: None,
                term: 0,
            }
        )]
    );
    assert_eq!(
        out.timers,
        vec![TimerCmd::Set {
            timer: TimerId::Heartbeat,
            at: 3 * T + timing.heartbeat_interval
        }]
    );
    out.clear();
    // Requests before any configuration are refused: the worker is not ready.
    assert_eq!(w.push(3 * T, one(5), &mut out), Err(WorkerError::NotReady));
    assert_eq!(w.advance(3 * T, &mut out), Err(WorkerError::NotReady));
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(w.open_requests(), 0);
    assert!(!w.is_ready());
    let cfg = config(1, &[1], Consistency::BoundedDelay(1));
    w.on_message(4 * T, deliver_config(&cfg), &mut out);
    assert_eq!(
        (w.epoch(), w.consistency()),
        (1, Some(Consistency::BoundedDelay(1)))
    );
    assert_eq!(out.events, vec![Event::Ready { epoch: 1 }]);
    assert!(w.is_ready());
    assert!(out.timers.contains(&TimerCmd::Cancel(TimerId::Register)));
    out.clear();
    let id = w.push(4 * T, one(5), &mut out).unwrap();
    assert!(!w.is_idle());
    assert_eq!(out.sends.len(), 1);
    assert_eq!((out.sends[0].to, out.sends[0].epoch), (S1, 1));
    let slice = sref(id, 0);
    assert_eq!(pushes(&out), vec![(S1, slice, id, vec![5])]);
    out.clear();
    // Configured: a stale registration timer does nothing.
    w.on_timer(5 * T, TimerId::Register, &mut out);
    assert!(out.is_empty(), "{out:?}");
    w.on_message(5 * T, ack(S1, slice), &mut out);
    assert_eq!(
        out.events,
        vec![
            Event::Worker(WorkerEvent::PushDone(id)),
            Event::Worker(WorkerEvent::PushDurable(id))
        ]
    );
    assert!(w.is_idle());
}

#[test]
fn a_worker_started_configured_is_ready_at_once_and_beats() {
    let cfg = config(2, &[1], Consistency::Eventual);
    let mut w: Worker<i64> = Worker::new(WorkerConfig::new(W1, COORD));
    let mut out = Effects::new();
    w.start_configured(T, cfg, &mut out);
    assert!(out.sends.is_empty(), "no registration: {:?}", out.sends);
    assert_eq!(out.events, vec![Event::Ready { epoch: 2 }]);
    assert_eq!(
        out.timers.last(),
        Some(&TimerCmd::Set {
            timer: TimerId::Heartbeat,
            at: T + Timing::default().heartbeat_interval
        })
    );
}

#[test]
fn slices_hold_as_many_rows_as_the_configured_size_allows() {
    let cfg = config(1, &[1], Consistency::Eventual);
    // Rows of width 1 of i64 take at most 10 + 8 bytes, and 128 bytes are kept for the rest of
    // the message: room for three rows and a bit.
    let mut wc = WorkerConfig::new(W1, COORD);
    wc.max_slice_bytes = 128 + 3 * 18 + 5;
    assert_eq!(wc.frame_needed::<i64>(), 128 + 3 * 18);
    let mut w = worker_with(wc, &cfg);
    let mut out = Effects::new();
    let ks: Vec<Key> = (0..10).map(|k| 3 * k).collect();
    w.push(
        T,
        KvPairs::new(ks.clone(), vec![1; 10], 1).unwrap(),
        &mut out,
    )
    .unwrap();
    let sizes: Vec<usize> = pushes(&out).iter().map(|p| p.3.len()).collect();
    assert_eq!(sizes, vec![3, 3, 3, 1]);
    // Wider rows: two values of 8 bytes, 26 bytes a row.
    wc.width = 2;
    wc.max_slice_bytes = 128 + 2 * 26;
    assert_eq!(wc.frame_needed::<i64>(), 128 + 2 * 26);
    // By default a slice holds far more than a thousand keys.
    let mut w = worker(&cfg);
    out.clear();
    w.push(
        T,
        KvPairs::new((0..1_000).collect(), vec![1; 1_000], 1).unwrap(),
        &mut out,
    )
    .unwrap();
    assert_eq!(pushes(&out).len(), 1);
    let wc = WorkerConfig::new(W1, COORD);
    let rows = (DEFAULT_MAX_SLICE_BYTES - 128) / 18;
    assert_eq!(wc.frame_needed::<i64>(), rows * 18 + 128);
}

/// A byte window holds slices back until earlier ones are answered: one slice always goes,
/// and pushes and pulls each have their own.
#[test]
fn a_byte_window_holds_slices_back_until_earlier_ones_are_answered() {
    let cfg = config(1, &[1], Consistency::Eventual);
    // Three rows of 18 bytes a slice, and room for two such slices on the network.
    let mut wc = WorkerConfig::new(W1, COORD);
    wc.max_slice_bytes = 128 + 3 * 18;
    wc.max_bytes_in_flight = 2 * 3 * 18;
    let mut w = worker_with(wc, &cfg);
    let mut out = Effects::new();
    let ks: Vec<Key> = (0..10).map(|k| 3 * k).collect();
    w.push(T, KvPairs::new(ks, vec![1; 10], 1).unwrap(), &mut out)
        .unwrap();
    let sent = pushes(&out);
    assert_eq!(sent.len(), 2, "two of the four slices fit the window");
    out.clear();
    w.pull(T, keys(&[1, 2, 4, 5, 7, 8, 10]), &mut out).unwrap();
    assert_eq!(pulls(&out).len(), 2, "pulls have a window of their own");
    assert_eq!(pushes(&out).len(), 0);
    out.clear();
    w.on_message(T, ack(S1, sent[0].1), &mut out);
    assert_eq!(pushes(&out).len(), 1, "an answer makes room for one more");
    // A window smaller than any slice still lets one go at a time.
    wc.max_bytes_in_flight = 1;
    let mut w = worker_with(wc, &cfg);
    out.clear();
    let ks: Vec<Key> = (0..10).map(|k| 3 * k).collect();
    w.push(T, KvPairs::new(ks, vec![1; 10], 1).unwrap(), &mut out)
        .unwrap();
    let sent = pushes(&out);
    assert_eq!(sent.len(), 1);
    out.clear();
    w.on_message(T, ack(S1, sent[0].1), &mut out);
    assert_eq!(pushes(&out).len(), 1);
}

/// A large message's deadline allows for moving the bytes on the network: a MiB of requests in
/// flight adds `rto_per_mib`, and resends allow for everything still on the network.
#[test]
fn retransmission_deadlines_allow_for_the_bytes_on_the_network() {
    let cfg = config(1, &[1], Consistency::Eventual);
    let timing = Timing::default();
    let (rto, per_mib) = (timing.rto_initial, timing.rto_per_mib);
    assert!(per_mib > 0);
    // 100,000 rows of i64 count 18 bytes each: 1.7 MiB, one whole MiB.
    let big = |from: Key| KvPairs::new((from..from + 100_000).collect(), vec![1; 100_000], 1);
    let mut w = worker(&cfg);
    let mut out = Effects::new();
    w.push(T, one(7), &mut out).unwrap();
    assert!(
        within(retransmit_at(&out), T, rto),
        "a small push adds nothing"
    );
    let mut w = worker(&cfg);
    out.clear();
    w.push(T, big(0).unwrap(), &mut out).unwrap();
    assert_eq!(pushes(&out).len(), 1);
    assert!(within(retransmit_at(&out), T + per_mib, rto));
    // A second one leaves with 3.4 MiB on the network: three whole MiB.
    out.clear();
    w.push(T, big(200_000).unwrap(), &mut out).unwrap();
    let at = T + 2 * rto;
    out.clear();
    w.on_timer(at, TimerId::Retransmit, &mut out);
    assert_eq!(pushes(&out).len(), 1, "only the first is due");
    assert!(
        within(retransmit_at(&out), T + 3 * per_mib, rto),
        "the second is due next, after its allowance"
    );
    // Both resent with both on the network: the first is due next again.
    let at2 = T + 3 * rto;
    out.clear();
    w.on_timer(at2, TimerId::Retransmit, &mut out);
    assert_eq!(pushes(&out).len(), 1, "now the second is due");
    assert!(within(retransmit_at(&out), at + 3 * per_mib, timing.rto(1)));
}

#[test]
fn iterations_and_slices_in_flight_are_counted() {
    let cfg = config(1, &[1], Consistency::BoundedDelay(2));
    let mut w = worker(&cfg);
    let mut out = Effects::new();
    assert_eq!(
        (w.iteration(), w.finished_below(), w.in_flight()),
        (0, 0, 1)
    );
    let p1 = w.push(T, one(1), &mut out).unwrap();
    w.advance(T, &mut out).unwrap();
    let p2 = w.push(T, one(2), &mut out).unwrap();
    w.advance(T, &mut out).unwrap();
    let q = w.pull(T, keys(&[1]), &mut out).unwrap();
    assert_eq!(
        (w.iteration(), w.finished_below(), w.in_flight()),
        (2, 0, 3)
    );
    assert_eq!((w.open_requests(), w.slices_in_flight()), (3, 3));
    w.on_message(T, ack(S1, sref(p1, 0)), &mut out);
    assert_eq!(
        (w.iteration(), w.finished_below(), w.in_flight()),
        (2, 1, 2)
    );
    assert_eq!((w.open_requests(), w.slices_in_flight()), (2, 2));
    w.on_message(T, reply(S1, sref(q, 0), one(1), None), &mut out);
    w.on_message(T, ack(S1, sref(p2, 0)), &mut out);
    assert_eq!(
        (w.iteration(), w.finished_below(), w.in_flight()),
        (2, 2, 1)
    );
    assert_eq!((w.open_requests(), w.slices_in_flight()), (0, 0));
}

#[test]
fn progress_goes_once_to_every_server_and_is_retransmitted_until_each_acknowledges() {
    let cfg = config(1, &[1, 2], Consistency::Eventual);
    let mut w = worker(&cfg);
    let mut out = Effects::new();
    let id = w.push(T, one(key_of(&cfg, S2)), &mut out).unwrap();
    w.advance(T, &mut out).unwrap();
    assert!(
        progress_sends(&out).is_empty(),
        "iteration 0 is not finished yet"
    );
    out.clear();
    w.on_message(T, ack(S2, sref(id, 0)), &mut out);
    assert_eq!(progress_sends(&out), vec![(S1, 1), (S2, 1)]);
    assert_eq!(out.sends.len(), 2, "{:?}", out.sends);
    assert!(!w.is_idle());
    let due = retransmit_at(&out);
    assert!(within(due, T, 20 * MS), "{due:?}");
    let due = due.unwrap();
    out.clear();
    // Not yet due: nothing.
    w.on_timer(due - 1, TimerId::Retransmit, &mut out);
    assert!(out.sends.is_empty(), "{:?}", out.sends);
    out.clear();
    w.on_timer(due, TimerId::Retransmit, &mut out);
    assert_eq!(progress_sends(&out), vec![(S1, 1), (S2, 1)]);
    let next = retransmit_at(&out);
    assert!(within(next, due, 40 * MS), "{next:?}");
    let due = next.unwrap();
    out.clear();
    // One server acknowledges: the other is still asked, with the backoff going on.
    w.on_message(
        due - 1,
        Envelope::new(
            S1,
            W1,
            1,
            Message::ProgressAck {
                finished_below: 1,
                taken_below: 1,
            },
        ),
        &mut out,
    );
    assert!(!w.is_idle());
    out.clear();
    w.on_timer(due, TimerId::Retransmit, &mut out);
    assert_eq!(progress_sends(&out), vec![(S2, 1)]);
    let next = retransmit_at(&out);
    assert!(within(next, due, 80 * MS), "{next:?}");
    out.clear();
    w.on_message(
        due,
        Envelope::new(
            S2,
            W1,
            1,
            Message::ProgressAck {
                finished_below: 1,
                taken_below: 1,
            },
        ),
        &mut out,
    );
    assert!(w.is_idle());
    assert_eq!(out.timers, vec![TimerCmd::Cancel(TimerId::Retransmit)]);
}

#[test]
fn a_server_asking_for_progress_gets_it_even_if_its_id_acknowledged_it_before() {
    let cfg = config(1, &[1, 2], Consistency::Eventual);
    let mut w = worker(&cfg);
    let mut out = Effects::new();
    let id = w.push(T, one(key_of(&cfg, S2)), &mut out).unwrap();
    w.advance(T, &mut out).unwrap();
    w.on_message(T, ack(S2, sref(id, 0)), &mut out);
    for s in [S1, S2] {
        let acked = Message::ProgressAck {
            finished_below: 1,
            taken_below: 1,
        };
        w.on_message(T, Envelope::new(s, W1, 1, acked), &mut out);
    }
    assert!(w.is_idle());
    out.clear();
    // S1 restarted: the new process never heard the progress its id acknowledged.
    w.on_message(
        T,
        Envelope::new(S1, W1, 2, Message::ProgressRequest),
        &mut out,
    );
    assert_eq!(progress_sends(&out), vec![(S1, 1)]);
    assert!(!w.is_idle(), "resent until the new process acknowledges");
    out.clear();
    let stranger = NodeId(99);
    w.on_message(
        T,
        Envelope::new(stranger, W1, 1, Message::ProgressRequest),
        &mut out,
    );
    assert!(progress_sends(&out).is_empty());
    assert_eq!(out.events, vec![refused(stranger, Refusal::UnknownSender)]);
}

#[test]
fn only_sent_slices_that_are_due_are_retransmitted() {
    let cfg = config(1, &[1], Consistency::Eventual);
    let mut wc = WorkerConfig::new(W1, COORD);
    wc.max_slices_in_flight = 2;
    let mut w = worker_with(wc, &cfg);
    let mut out = Effects::new();
    let a = w.push(T, one(1), &mut out).unwrap();
    let first = retransmit_at(&out);
    assert!(within(first, T, 20 * MS), "{first:?}");
    let first = first.unwrap();
    let b = w.push(T + 10 * MS, one(2), &mut out).unwrap();
    // A third waits for room in the window.
    let c = w.push(T + 10 * MS, one(3), &mut out).unwrap();
    assert_eq!(w.slices_in_flight(), 2);
    out.clear();
    w.on_timer(first, TimerId::Retransmit, &mut out);
    let sent: Vec<RequestId> = pushes(&out).iter().map(|p| p.1.request).collect();
    assert_eq!(sent, vec![a], "only the first is due");
    assert_eq!(w.slices_in_flight(), 2);
    // The next deadline is b's first one, before a's second.
    let next = retransmit_at(&out);
    assert!(within(next, T + 10 * MS, 20 * MS), "{next:?}");
    out.clear();
    w.on_message(first, ack(S1, sref(a, 0)), &mut out);
    let sent: Vec<RequestId> = pushes(&out).iter().map(|p| p.1.request).collect();
    assert_eq!(sent, vec![c], "room for the one waiting");
    let _ = b;
}

#[test]
fn pushes_say_which_requests_are_settled_and_pulls_do_not_count() {
    let cfg = config(1, &[1], Consistency::Eventual);
    let mut w = worker(&cfg);
    let mut out = Effects::new();
    let q = w.pull(T, keys(&[1]), &mut out).unwrap();
    let a = w.push(T, one(1), &mut out).unwrap();
    assert_eq!((q, a), (1, 2));
    assert_eq!(
        pushes(&out)[0].2,
        2,
        "the open pull does not hold the mark back"
    );
    w.on_message(T, ack(S1, sref(a, 0)), &mut out);
    out.clear();
    w.push(T, one(1), &mut out).unwrap();
    assert_eq!(pushes(&out)[0].2, 3);
    out.clear();
    w.on_message(T, reply(S1, sref(q, 0), one(1), None), &mut out);
    // No push open: everything below the next request id is settled.
    let b = w.push(T, one(1), &mut out).unwrap();
    assert_eq!(b, 4);
    assert_eq!(pushes(&out)[0].2, 3, "request 3 is still open");
}

#[test]
fn answers_from_another_server_of_the_wrong_shape_or_to_unsent_slices_are_refused() {
    let cfg = config(1, &[1, 2], Consistency::Eventual);
    let mut wc = WorkerConfig::new(W1, COORD);
    wc.max_slices_in_flight = 1;
    let mut w = worker_with(wc, &cfg);
    let k = key_of(&cfg, S1);
    let mut out = Effects::new();
    let a = w.push(T, one(k), &mut out).unwrap();
    let b = w.push(T, one(k), &mut out).unwrap();
    let sa = sref(a, 0);
    let sb = sref(b, 0);
    out.clear();
    w.on_message(T, ack(S2, sa), &mut out);
    w.on_message(T, ack(S1, sb), &mut out);
    w.on_message(T, reply(S1, sa, one(k), None), &mut out);
    assert_eq!(
        out.events,
        vec![
            refused(S2, Refusal::BadAnswer),
            refused(S1, Refusal::BadAnswer),
            refused(S1, Refusal::BadAnswer)
        ]
    );
    assert_eq!((w.open_requests(), w.slices_in_flight()), (2, 1));
    out.clear();
    w.on_message(T, ack(S1, sa), &mut out);
    w.on_message(T, ack(S1, sb), &mut out);
    assert_eq!(
        out.events,
        vec![
            Event::Worker(WorkerEvent::PushDone(a)),
            Event::Worker(WorkerEvent::PushDurable(a)),
            Event::Worker(WorkerEvent::PushDone(b)),
            Event::Worker(WorkerEvent::PushDurable(b))
        ]
    );
    assert_eq!(w.slices_in_flight(), 0);
    out.clear();
    // A pull answer must hold exactly the keys asked for, and only a pull takes one.
    let q = w.pull(T, keys(&[k]), &mut out).unwrap();
    let sq = sref(q, 0);
    w.on_message(T, reply(S1, sq, one(k + 1), None), &mut out);
    w.on_message(T, ack(S1, sq), &mut out);
    assert_eq!(
        out.events,
        vec![
            refused(S1, Refusal::BadAnswer),
            refused(S1, Refusal::BadAnswer)
        ]
    );
    assert_eq!(w.slices_in_flight(), 1);
    out.clear();
    w.on_message(T, reply(S1, sq, one(k), None), &mut out);
    assert_eq!(
        out.events,
        vec![Event::Worker(WorkerEvent::PullDone(q, one(k)))]
    );
    assert_eq!(w.slices_in_flight(), 0);
}

#[test]
fn only_a_redirect_to_a_newer_epoch_fetches_the_configuration() {
    let cfg = config(2, &[1], Consistency::Eventual);
    let mut w = worker(&cfg);
    let mut out = Effects::new();
    let redirect = |epoch| {
        Envelope::new(
            S1,
            W1,
            epoch,
            Message::Redirect {
                slice: sref(1, 0),
                epoch,
            },
        )
    };
    for epoch in [1, 2] {
        w.on_message(T, redirect(epoch), &mut out);
        assert!(out.sends.is_empty(), "{:?}", out.sends);
        assert_eq!(
            out.events,
            vec![refused(S1, Refusal::StaleEpoch { epoch, current: 2 })]
        );
        out.clear();
    }
    w.on_message(T, redirect(3), &mut out);
    assert_eq!(
        out.sends,
        vec![Envelope::new(W1, COORD, 2, Message::ConfigRequest)]
    );
    assert!(out.events.is_empty());
}

#[test]
fn a_range_pull_answered_in_parts_takes_only_parts_that_move_forward() {
    let cfg = config(1, &[1], Consistency::Eventual);
    let mut wc = WorkerConfig::new(W1, COORD);
    wc.max_slices_in_flight = 1;
    let mut w = worker_with(wc, &cfg);
    let mut out = Effects::new();
    let q = w.pull(T, ranges(&[(100, 1_000)]), &mut out).unwrap();
    let waiting = w.pull(T, ranges(&[(100, 1_000)]), &mut out).unwrap();
    let s = sref(q, 0);
    let kv = |ks: &[Key]| KvPairs::new(ks.to_vec(), vec![7; ks.len()], 1).unwrap();
    out.clear();
    let bad = [
        // From another server.
        reply(S2, s, kv(&[100]), Some(200)),
        // Not past the start of the slice: it would ask for the same again.
        reply(S1, s, kv(&[]), Some(100)),
        // A key outside the ranges asked for.
        reply(S1, s, kv(&[50]), Some(200)),
        // Keys at or beyond where the next part is to begin.
        reply(S1, s, kv(&[100, 200]), Some(200)),
        // To a slice not sent yet.
        reply(S1, sref(waiting, 0), kv(&[100]), Some(200)),
    ];
    let n = bad.len();
    for env in bad {
        w.on_message(T, env, &mut out);
    }
    assert!(out.sends.is_empty(), "{:?}", out.sends);
    assert_eq!(out.events.len(), n);
    assert!(
        out.events.iter().all(|e| matches!(
            e,
            Event::Refused {
                reason: Refusal::BadAnswer,
                ..
            }
        )),
        "{:?}",
        out.events
    );
    out.clear();
    // A part that moves forward: kept, and the rest asked for under the same slice.
    let later = T + 7 * MS;
    w.on_message(later, reply(S1, s, kv(&[100, 150]), Some(200)), &mut out);
    let asked = pulls(&out);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].0, S1);
    assert_eq!(
        (asked[0].1.slice, &asked[0].1.keys),
        (s, &ranges(&[(200, 1_000)]))
    );
    let due = retransmit_at(&out);
    assert!(within(due, later, 20 * MS), "{due:?}");
    assert_eq!(w.slices_in_flight(), 1);
    out.clear();
    w.on_message(later, reply(S1, s, kv(&[300]), None), &mut out);
    assert_eq!(
        out.events,
        vec![Event::Worker(WorkerEvent::PullDone(
            q,
            kv(&[100, 150, 300])
        ))]
    );
    // The waiting pull goes out now; a part that ends at the end of its ranges completes it.
    let sw = sref(waiting, 0);
    assert_eq!(
        pulls(&out).iter().map(|p| p.1.slice).collect::<Vec<_>>(),
        vec![sw]
    );
    out.clear();
    w.on_message(later, reply(S1, sw, kv(&[999]), Some(1_000)), &mut out);
    assert_eq!(
        out.events,
        vec![Event::Worker(WorkerEvent::PullDone(waiting, kv(&[999])))]
    );
    assert!(out.sends.is_empty(), "{:?}", out.sends);
    assert_eq!(w.slices_in_flight(), 0);
}

#[test]
fn retransmission_is_stretched_by_at_most_a_quarter_and_sometimes_by_all_of_it() {
    let cfg = config(1, &[1], Consistency::Eventual);
    let mut gaps = Vec::new();
    for seed in 0..32 {
        let mut wc = WorkerConfig::new(W1, COORD);
        wc.seed = seed;
        // A 4 ns timeout: stretched by 0 or 1 ns.
        wc.timing.rto_initial = 4;
        wc.timing.rto_max = 4;
        let mut w = worker_with(wc, &cfg);
        let mut out = Effects::new();
        w.push(T, one(1), &mut out).unwrap();
        gaps.push(retransmit_at(&out).unwrap() - T);
    }
    assert!(gaps.iter().all(|g| (4..=5).contains(g)), "{gaps:?}");
    assert!(gaps.contains(&4) && gaps.contains(&5), "{gaps:?}");
}

#[test]
fn slices_taken_back_after_a_ring_change_leave_the_window() {
    let old = config(1, &[1, 2], Consistency::Eventual);
    let new = config(2, &[1, 2, 3], Consistency::Eventual);
    let mut w = worker(&old);
    let mut out = Effects::new();
    let ks: Vec<Key> = (0..30u64).map(|i| i * (u64::MAX / 30)).collect();
    let id = w
        .push(T, KvPairs::new(ks, vec![1; 30], 1).unwrap(), &mut out)
        .unwrap();
    let mut sent = pushes(&out);
    assert_eq!(w.slices_in_flight(), 2);
    out.clear();
    w.on_message(T, deliver_config(&new), &mut out);
    sent.extend(pushes(&out));
    let open_after: usize = pushes(&out).len();
    assert!(open_after > 0, "some keys moved to server 3");
    out.clear();
    // Acknowledge every slice ever sent: those taken back are ignored, the rest complete it.
    for (to, slice, _, _) in sent {
        w.on_message(T, ack(to, slice), &mut out);
    }
    assert_eq!(
        out.events,
        vec![
            Event::Worker(WorkerEvent::PushDone(id)),
            Event::Worker(WorkerEvent::PushDurable(id))
        ]
    );
    assert_eq!(w.slices_in_flight(), 0);
}

#[test]
fn progress_to_a_server_that_joins_starts_from_the_first_timeout() {
    let old = config(1, &[1], Consistency::Eventual);
    let new = config(2, &[1, 2], Consistency::Eventual);
    // A key that stays with server 1, so that the ring change moves no slice.
    let k = key_of(&new, S1);
    let mut w = worker(&old);
    let mut out = Effects::new();
    let a = w.push(T, one(k), &mut out).unwrap();
    w.advance(T, &mut out).unwrap();
    w.on_message(T, ack(S1, sref(a, 0)), &mut out);
    w.on_message(
        T,
        Envelope::new(
            S1,
            W1,
            1,
            Message::ProgressAck {
                finished_below: 1,
                taken_below: 1,
            },
        ),
        &mut out,
    );
    assert!(w.is_idle());
    let b = w.push(T, one(k), &mut out).unwrap();
    out.clear();
    // Well after every deadline so far: only the push is resent; progress is all acknowledged.
    let late = T + 30 * MS;
    w.on_timer(late, TimerId::Retransmit, &mut out);
    let sent: Vec<RequestId> = pushes(&out).iter().map(|p| p.1.request).collect();
    assert_eq!(sent, vec![b]);
    assert!(progress_sends(&out).is_empty());
    out.clear();
    // Server 2 joins: it is told the progress, with the first timeout, not a backed-off one.
    w.on_message(late, deliver_config(&new), &mut out);
    assert_eq!(progress_sends(&out), vec![(S2, 1)]);
    assert!(pushes(&out).is_empty(), "no slice moved");
    let due = retransmit_at(&out);
    assert!(within(due, late, 20 * MS), "{due:?}");
}

/// Sequential mode with replicas: a push its server took in (`PushTaken`) counts for its
/// iteration at once (the application hears `PushDone` and may advance), leaves the window,
/// and is kept, resent only at the longest timeout, until `PushAck` says the replicas hold it
/// (`PushDurable`, with no second `PushDone`).
#[test]
fn in_flight_bound_a_taken_push_finishes_its_iteration_and_is_kept_until_durable() {
    let timing = Timing::default();
    let c = config(1, &[1], Consistency::Sequential);
    let mut wc = WorkerConfig::new(W1, COORD);
    wc.max_slices_in_flight = 1;
    let mut w = worker_with(wc, &c);
    let mut out = Effects::new();
    let id = w.push(T, one(key_of(&c, S1)), &mut out).unwrap();
    let (_, slice, _, _) = pushes(&out)[0].clone();
    // A second push waits for room in the window of one.
    w.push(T, one(key_of(&c, S1)), &mut out).unwrap();
    assert_eq!(pushes(&out).len(), 1);
    out.clear();
    let taken = Envelope::new(S1, W1, 1, Message::PushTaken(slice));
    w.on_message(T, taken.clone(), &mut out);
    assert_eq!(out.events, vec![Event::Worker(WorkerEvent::PushDone(id))]);
    // The taken slice left the window: the second push goes out.
    assert_eq!(pushes(&out).len(), 1);
    assert_eq!(w.open_requests(), 2);
    assert!(!w.is_idle());
    // A duplicate changes nothing.
    out.clear();
    w.on_message(T, taken, &mut out);
    assert!(out.events.is_empty() && out.sends.is_empty(), "{out:?}");
    // Resent at the longest timeout, not before.
    out.clear();
    w.on_timer(T + timing.rto_initial * 2, TimerId::Retransmit, &mut out);
    assert!(pushes(&out).iter().all(|p| p.1 != slice), "{out:?}");
    out.clear();
    let late = T + timing.rto_max * 2;
    w.on_timer(late, TimerId::Retransmit, &mut out);
    assert!(pushes(&out).iter().any(|p| p.1 == slice), "{out:?}");
    out.clear();
    w.on_message(late, ack(S1, slice), &mut out);
    assert_eq!(
        out.events,
        vec![Event::Worker(WorkerEvent::PushDurable(id))]
    );
    assert_eq!(w.open_requests(), 1);
}

/// The taken progress in every `Progress` of `out`: (server, epoch, taken_below).
fn taken_sends(out: &Effects<i64>) -> Vec<(NodeId, Epoch, Iteration)> {
    out.sends
        .iter()
        .filter_map(|e| match e.body {
            Message::Progress { taken_below, .. } => Some((e.to, e.epoch, taken_below)),
            _ => None,
        })
        .collect()
}

/// Taken in counts only at the epoch it happened in: at a new epoch the worker sends the taken
/// push again and reports no taken progress for it until the server takes it in anew (a
/// server restarted under the same id, at the same place on the ring, does not hold it). A
/// `PushTaken` from an earlier epoch is refused; one from a later epoch counts once the worker
/// is there too.
#[test]
fn staleness_a_push_taken_in_at_an_earlier_epoch_counts_only_when_taken_in_again() {
    let c1 = config(1, &[1], Consistency::Sequential);
    let c2 = config(2, &[1], Consistency::Sequential);
    let c3 = config(3, &[1], Consistency::Sequential);
    let mut w = worker(&c1);
    let mut out = Effects::new();
    w.push(T, one(key_of(&c1, S1)), &mut out).unwrap();
    let (_, slice, _, _) = pushes(&out)[0].clone();
    w.advance(T, &mut out).unwrap();
    w.on_message(
        T,
        Envelope::new(S1, W1, 1, Message::PushTaken(slice)),
        &mut out,
    );
    assert_eq!(taken_sends(&out), vec![(S1, 1, 1)]);
    out.clear();
    w.on_message(T, deliver_config(&c2), &mut out);
    assert!(
        pushes(&out).iter().any(|p| p.1 == slice),
        "sent again: {out:?}"
    );
    assert!(
        taken_sends(&out).iter().all(|&(_, _, taken)| taken == 0),
        "{out:?}"
    );
    out.clear();
    w.on_message(
        T,
        Envelope::new(S1, W1, 1, Message::PushTaken(slice)),
        &mut out,
    );
    assert_eq!(
        out.events,
        vec![Event::Refused {
            from: S1,
            reason: Refusal::StaleEpoch {
                epoch: 1,
                current: 2
            }
        }]
    );
    assert!(taken_sends(&out).is_empty());
    out.clear();
    // Taken in at epoch 3 before the worker heard of it: it counts on adopting epoch 3.
    w.on_message(
        T,
        Envelope::new(S1, W1, 3, Message::PushTaken(slice)),
        &mut out,
    );
    assert!(taken_sends(&out).is_empty(), "{out:?}");
    out.clear();
    w.on_message(T, deliver_config(&c3), &mut out);
    assert!(pushes(&out).iter().all(|p| p.1 != slice), "{out:?}");
    assert_eq!(taken_sends(&out), vec![(S1, 3, 1)]);
}

#[test]
fn a_worker_says_which_server_and_keys_each_open_slice_waits_for() {
    let cfg = config(1, &[1, 2], Consistency::Eventual);
    let mut w = worker(&cfg);
    let mut out = Effects::new();
    let (k1, k2) = (key_of(&cfg, S1), key_of(&cfg, S2));
    let push = w.push(T, one(k1), &mut out).unwrap();
    let pull = w.pull(T, keys(&[k2]), &mut out).unwrap();
    let waits = w.waits();
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert_eq!(
        (waits[0].request, waits[0].push, waits[0].server),
        (push, true, S1)
    );
    assert_eq!(waits[0].keys, Some(KeyRange::new(k1, k1 + 1).unwrap()));
    assert_eq!(
        (waits[1].request, waits[1].push, waits[1].server),
        (pull, false, S2)
    );
    assert_eq!(waits[1].keys, Some(KeyRange::new(k2, k2 + 1).unwrap()));
    assert!(
        waits.iter().all(|x| x.attempts == 0 && x.iteration == 0),
        "{waits:?}"
    );
    // Answered, the push waits no more.
    let sent = pushes(&out);
    out.clear();
    w.on_message(T, ack(S1, sent[0].1), &mut out);
    assert_eq!(w.waits().len(), 1);
    assert_eq!(w.waits()[0].request, pull);
}
