//! The driver: frames, timers and refusals, and requests cut to fit the wire.

use pserver_core::driver::Transmit;
use pserver_core::events::{Refusal, WorkerEvent};
use pserver_core::node::DEFAULT_MAX_SLICE_BYTES;
use pserver_core::node::*;
use pserver_core::ring::*;
use pserver_core::wire::*;
use pserver_core::wire::{ClusterConfig, Codec};
use pserver_core::*;

const COORD: NodeId = NodeId(0);
const S1: NodeId = NodeId(1);
const W1: NodeId = NodeId(2);
const W2: NodeId = NodeId(3);

fn config(workers: &[NodeId], consistency: Consistency) -> ClusterConfig {
    ClusterConfig {
        epoch: 1,
        coordinator: COORD,
        standbys: Vec::new(),
        term: 0,
        servers: vec![S1],
        workers: workers.to_vec(),
        ring: RingConfig {
            vnodes: 8,
            replicas: 0,
            seed: 0,
            ..RingConfig::default()
        },
        consistency,
        joining: Vec::new(),
        leaving: Vec::new(),
        shares: workers.to_vec(),
        left: vec![],
        lost: vec![],
        incarnations: Vec::new(),
        pace: Default::default(),
        checkpoints: Default::default(),
    }
}

fn server(cfg: &ClusterConfig, codec: Codec) -> Driver<i64> {
    let mut d = Driver::with_codec(
        Server::new(ServerConfig::new(S1, COORD), Updater::Sum),
        codec,
    );
    d.start_configured(0, cfg.clone());
    d
}

fn worker(
    id: NodeId,
    cfg: &ClusterConfig,
    codec: Codec,
    slice: usize,
    window: usize,
) -> Driver<i64> {
    let mut wc = WorkerConfig::new(id, COORD);
    wc.max_slice_bytes = slice;
    wc.max_slices_in_flight = window;
    let mut d = Driver::with_codec(Worker::new(wc), codec);
    d.start_configured(0, cfg.clone());
    d
}

fn drain_events(d: &mut Driver<i64>) -> Vec<Event<i64>> {
    std::iter::from_fn(|| d.poll_event()).collect()
}

#[test]
fn a_push_far_larger_than_a_frame_is_cut_into_slices_that_fit_and_applied_once() {
    let codec = Codec::new(8 << 10);
    let cfg = config(&[W1], Consistency::Eventual);
    let mut s = server(&cfg, codec);
    let mut w = worker(W1, &cfg, codec, 4 << 10, 4);
    let keys: Vec<Key> = (0..20_000).map(|k| k * 3).collect();
    let values: Vec<i64> = (0..20_000).map(|k| k % 7 + 1).collect();
    let kvs = KvPairs::new(keys.clone(), values.clone(), 1).unwrap();
    let id = w.worker().unwrap().push(0, kvs).unwrap();
    let mut done = 0;
    let mut frames = 0;
    for _ in 0..10_000 {
        let in_flight = w.node().as_worker().unwrap().slices_in_flight();
        assert!(in_flight <= 4, "{in_flight} slices on the network");
        let mut moved = false;
        while let Some(t) = w.poll_transmit() {
            assert!(t.frame.len() <= 8 << 10);
            s.handle_frame(0, W1, &t.frame);
            frames += 1;
            moved = true;
        }
        while let Some(t) = s.poll_transmit() {
            w.handle_frame(0, S1, &t.frame);
            moved = true;
        }
        done += drain_events(&mut w)
            .iter()
            .filter(|e| **e == Event::Worker(WorkerEvent::PushDone(id)))
            .count();
        if !moved {
            break;
        }
    }
    assert_eq!(done, 1);
    assert!(frames > 20, "only {frames} frames for a 300 KB push");
    assert_eq!(w.refusals().unencodable, 0);
    let server = s.node().as_server().unwrap();
    for (k, v) in keys.iter().zip(&values) {
        assert_eq!(server.received_total(*k), vec![*v], "key {k}");
    }
}

/// A worker configured for slices larger than its codec's frames has them cut to fit by its
/// driver: nothing is refused on the way out.
#[test]
fn a_slice_size_larger_than_the_frame_is_cut_to_fit_it() {
    let codec = Codec::new(1 << 10);
    let cfg = config(&[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg, codec, 64 << 10, 4);
    let keys: Vec<Key> = (0..5_000).collect();
    w.worker()
        .unwrap()
        .push(0, KvPairs::new(keys, vec![1; 5_000], 1).unwrap())
        .unwrap();
    let mut frames = 0;
    while let Some(t) = w.poll_transmit() {
        assert!(
            t.frame.len() <= 1 << 10,
            "a frame of {} bytes",
            t.frame.len()
        );
        frames += 1;
    }
    assert!(frames >= 4, "{frames} frames");
    assert_eq!(w.refusals().unencodable, 0);
}

/// A frame limit no message fits: what the codec refuses is counted and kept, not dropped
/// silently.
#[test]
fn a_frame_the_codec_refuses_is_visible_not_silent() {
    let codec = Codec::new(16);
    let cfg = config(&[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg, codec, 64 << 10, 4);
    let keys: Vec<Key> = (0..50).collect();
    w.worker()
        .unwrap()
        .push(0, KvPairs::new(keys, vec![1; 50], 1).unwrap())
        .unwrap();
    while w.poll_transmit().is_some() {}
    assert!(w.refusals().unencodable > 0);
    let said: Vec<(NodeId, EncodeError)> = std::iter::from_fn(|| w.poll_event())
        .filter_map(|e| match e {
            Event::Unencodable { to, error } => Some((to, error)),
            _ => None,
        })
        .collect();
    assert_eq!(said.len() as u64, w.refusals().unencodable);
    assert!(said.iter().all(|(to, _)| *to == S1), "{said:?}");
    assert!(said[0].1.to_string().contains("exceeds the limit"));
}

#[test]
fn pushes_never_wait_behind_pulls_that_the_consistency_model_holds() {
    let codec = Codec::default();
    let cfg = config(&[W1, W2], Consistency::Sequential);
    let mut s = server(&cfg, codec);
    let mut w = worker(W1, &cfg, codec, DEFAULT_MAX_SLICE_BYTES, 2);
    let exchange = |w: &mut Driver<i64>, s: &mut Driver<i64>| {
        for _ in 0..100 {
            let mut moved = false;
            while let Some(t) = w.poll_transmit() {
                s.handle_frame(0, W1, &t.frame);
                moved = true;
            }
            while let Some(t) = s.poll_transmit() {
                // The other worker's traffic is not part of this exchange.
                if t.to == W1 {
                    w.handle_frame(0, S1, &t.frame);
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    };
    // Iteration 0: push and advance; W1 may enter iteration 1 once its push is acknowledged.
    w.worker()
        .unwrap()
        .push(0, KvPairs::new(vec![5], vec![1], 1).unwrap())
        .unwrap();
    w.worker().unwrap().advance(0).unwrap();
    exchange(&mut w, &mut s);
    assert!(drain_events(&mut w).contains(&Event::Worker(WorkerEvent::Advanced(1))));
    // Pulls in iteration 1 wait for W2, which never finishes iteration 0: the window fills.
    let keys = || KeySelection::Keys(KeyList::new(vec![5]).unwrap());
    for _ in 0..3 {
        w.worker().unwrap().pull(0, keys()).unwrap();
    }
    exchange(&mut w, &mut s);
    assert_eq!(w.node().as_worker().unwrap().slices_in_flight(), 2);
    assert_eq!(s.node().as_server().unwrap().held_pulls(), 2);
    let push = w
        .worker()
        .unwrap()
        .push(0, KvPairs::new(vec![5], vec![1], 1).unwrap())
        .unwrap();
    exchange(&mut w, &mut s);
    assert!(drain_events(&mut w).contains(&Event::Worker(WorkerEvent::PushDone(push))));
}

#[test]
fn refused_input_is_counted_and_reported() {
    let codec = Codec::default();
    let cfg = config(&[W1], Consistency::Eventual);
    let mut s = server(&cfg, codec);
    drain_events(&mut s);

    s.handle_frame(0, W1, &Bytes::from_static(b"\x01\x03garbage"));
    let push = |from: NodeId| {
        let body = Message::Push(Push {
            slice: SliceRef {
                request: 1,
                slice: 0,
            },
            iteration: 0,
            covers: pserver_core::pace::Coverage::WHOLE,
            settled_below: 0,
            kvs: KvPairs::new(vec![1], vec![1i64], 1).unwrap(),
        });
        codec.encode(&Envelope::new(from, S1, 1, body)).unwrap()
    };
    // A frame that claims to come from W1 but arrived from another peer.
    s.handle_frame(0, NodeId(9), &push(W1));
    // A frame from a node that is not a member.
    s.handle_frame(0, NodeId(9), &push(NodeId(9)));
    // A configuration older than the one in force.
    let old = ClusterConfig {
        epoch: 0,
        ..cfg.clone()
    };
    s.handle_message(0, Envelope::new(COORD, S1, 0, Message::Config(old)));

    let r = s.refusals();
    assert_eq!(
        (r.undecodable, r.spoofed, r.unknown_sender, r.stale_epoch),
        (1, 1, 1, 1)
    );
    assert_eq!(r.total(), 4);
    let reasons: Vec<Refusal> = drain_events(&mut s)
        .into_iter()
        .filter_map(|e| match e {
            Event::Refused { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.len(), 4);
    assert!(matches!(reasons[0], Refusal::Undecodable(_)));
    assert_eq!(reasons[1], Refusal::SpoofedSender { claimed: W1 });
    // Nothing refused was applied.
    assert_eq!(s.node().as_server().unwrap().received_total(1), vec![0]);
}

#[test]
fn timers_fire_only_when_due_and_each_once_per_call() {
    let cfg = config(&[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg, Codec::default(), DEFAULT_MAX_SLICE_BYTES, 4);
    while w.poll_transmit().is_some() {}
    w.worker()
        .unwrap()
        .push(0, KvPairs::new(vec![1], vec![1], 1).unwrap())
        .unwrap();
    assert_eq!(w.poll_transmit().map(|t| t.to), Some(S1));
    let first = w
        .poll_timeout()
        .expect("retransmission and heartbeat are set");
    w.handle_timeout(first - 1);
    assert!(w.poll_transmit().is_none(), "nothing is due yet");
    w.handle_timeout(first);
    assert!(w.poll_transmit().is_some(), "the earliest timer fired");
    assert!(w.poll_timeout().is_some_and(|t| t > first));
}

#[test]
fn a_range_pull_whose_answer_exceeds_a_frame_is_answered_in_parts() {
    let codec = Codec::new(4 << 10);
    let cfg = config(&[W1], Consistency::Eventual);
    let mut sc = ServerConfig::new(S1, COORD);
    sc.max_reply_bytes = 2 << 10;
    let mut s: Driver<i64> = Driver::with_codec(Server::new(sc, Updater::Sum), codec);
    s.start_configured(0, cfg.clone());
    let mut w = worker(W1, &cfg, codec, 2 << 10, 4);
    let keys: Vec<Key> = (0..5_000).map(|k| k * 7).collect();
    let values: Vec<i64> = (0..5_000).map(|k| k % 5 + 1).collect();
    w.worker()
        .unwrap()
        .push(0, KvPairs::new(keys.clone(), values.clone(), 1).unwrap())
        .unwrap();
    let all = KeyRange::new(0, 7 * 5_000).unwrap();
    let pull = w
        .worker()
        .unwrap()
        .pull(0, KeySelection::Ranges(RangeList::new(vec![all]).unwrap()))
        .unwrap();
    let mut pulled = None;
    let mut replies = 0;
    for _ in 0..10_000 {
        let mut moved = false;
        while let Some(t) = w.poll_transmit() {
            s.handle_frame(0, W1, &t.frame);
            moved = true;
        }
        while let Some(t) = s.poll_transmit() {
            assert!(t.frame.len() <= 4 << 10);
            replies += 1;
            w.handle_frame(0, S1, &t.frame);
            moved = true;
        }
        for e in drain_events(&mut w) {
            if let Event::Worker(WorkerEvent::PullDone(id, kvs)) = e {
                assert_eq!(id, pull);
                assert!(pulled.replace(kvs).is_none(), "answered twice");
            }
        }
        if !moved {
            break;
        }
    }
    let pulled = pulled.expect("the range pull completed");
    assert_eq!(pulled.keys(), keys.as_slice());
    assert_eq!(pulled.values(), values.as_slice());
    assert!(replies > 20, "{replies} messages for a 60 KB answer");
    assert_eq!(s.refusals().unencodable, 0);
}

#[test]
fn a_stale_part_of_a_range_answer_is_refused_not_counted_twice() {
    let codec = Codec::default();
    let cfg = config(&[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg, codec, DEFAULT_MAX_SLICE_BYTES, 4);
    while w.poll_transmit().is_some() {}
    let all = KeyRange::new(0, 100).unwrap();
    let pull = w
        .worker()
        .unwrap()
        .pull(0, KeySelection::Ranges(RangeList::new(vec![all]).unwrap()))
        .unwrap();
    let slice = SliceRef {
        request: pull,
        slice: 0,
    };
    let part = |keys: Vec<Key>, resume: Option<Key>| {
        let n = keys.len();
        let body = Message::PullReply(PullReply {
            slice,
            complete_below: 0,
            kvs: KvPairs::new(keys, vec![1i64; n], 1).unwrap(),
            resume,
        });
        Envelope::new(S1, W1, 1, body)
    };
    w.handle_message(0, part(vec![1, 2], Some(50)));
    // The same part again (a duplicate on the network): its keys lie below the resume point.
    w.handle_message(0, part(vec![1, 2], Some(50)));
    // A part that does not move forward would loop.
    w.handle_message(0, part(vec![], Some(50)));
    w.handle_message(0, part(vec![60], None));
    let events = drain_events(&mut w);
    let done: Vec<&KvPairs<i64>> = events
        .iter()
        .filter_map(|e| match e {
            Event::Worker(WorkerEvent::PullDone(_, kvs)) => Some(kvs),
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].keys(), &[1, 2, 60]);
    assert_eq!(w.refusals().other, 2);
}

#[test]
fn the_driver_counts_what_a_worker_sends_again_and_nothing_else() {
    let cfg = config(&[W1], Consistency::Eventual);
    let mut w = worker(W1, &cfg, Codec::default(), DEFAULT_MAX_SLICE_BYTES, 4);
    while w.poll_transmit().is_some() {}
    w.worker()
        .unwrap()
        .push(0, KvPairs::new(vec![1], vec![1], 1).unwrap())
        .unwrap();
    let (mut pushes, mut heartbeats) = (0, 0);
    // Nobody answers: the push goes out again and again, between heartbeats.
    for round in 0..=20 {
        while let Some(t) = w.poll_transmit() {
            match Codec::default().decode::<i64>(&t.frame).unwrap().body {
                Message::Push(_) => pushes += 1,
                Message::Heartbeat { .. } => heartbeats += 1,
                _ => {}
            }
        }
        if round < 20 {
            let at = w.poll_timeout().expect("a timer is set");
            w.handle_timeout(at);
        }
    }
    assert!(pushes > 2 && heartbeats > 0, "{pushes} {heartbeats}");
    assert_eq!(w.retransmissions(), pushes - 1);
}

/// Everything a driver has, through the one stream: frames first, then events, ended by the
/// deadline to come back at.
fn output(d: &mut Driver<i64>) -> (Vec<Transmit>, Vec<Event<i64>>, Option<Time>) {
    let (mut frames, mut events) = (Vec::new(), Vec::new());
    loop {
        match d.poll_output() {
            Output::Transmit(t) => frames.push(t),
            Output::Event(e) => events.push(e),
            Output::Wait { until } => return (frames, events, until),
        }
    }
}

#[test]
fn one_output_stream_gives_every_frame_and_event_then_the_deadline() {
    let codec = Codec::default();
    let cfg = config(&[W1], Consistency::Eventual);
    let mut s = server(&cfg, codec);
    let mut w = worker(W1, &cfg, codec, DEFAULT_MAX_SLICE_BYTES, 4);
    let (_, events, until) = output(&mut w);
    assert_eq!(events, vec![Event::Ready { epoch: 1 }]);
    assert_eq!(until, w.poll_timeout());
    assert!(until.is_some(), "a configured worker beats");
    output(&mut s);
    let push = w
        .worker()
        .unwrap()
        .push(0, KvPairs::new(vec![5, 9], vec![2, 3], 1).unwrap())
        .unwrap();
    let (frames, events, _) = output(&mut w);
    assert_eq!(frames.len(), 1);
    assert!(events.is_empty(), "{events:?}");
    // The stream ends with Wait, and stays ended until something new happens.
    assert!(matches!(w.poll_output(), Output::Wait { .. }));
    for t in &frames {
        assert_eq!(t.to, S1);
        s.handle_frame(0, W1, &t.frame);
    }
    let (answers, _, _) = output(&mut s);
    for t in &answers {
        w.handle_frame_bytes(0, S1, &t.frame);
    }
    let (_, events, _) = output(&mut w);
    assert_eq!(
        events,
        vec![
            Event::Worker(WorkerEvent::PushDone(push)),
            Event::Worker(WorkerEvent::PushDurable(push))
        ]
    );
    let server = s.server().unwrap();
    let read = server.read(KeyRange::FULL);
    assert_eq!(read.rows.keys(), &[5, 9]);
    assert_eq!(read.rows.values(), &[2, 3]);
}

#[test]
fn a_frame_written_into_the_callers_buffer_is_the_frame_polled_as_bytes() {
    let codec = Codec::default();
    let cfg = config(&[W1], Consistency::Eventual);
    let kvs = || KvPairs::new((0..300).collect(), vec![7; 300], 1).unwrap();
    let (mut a, mut b) = (
        worker(W1, &cfg, codec, DEFAULT_MAX_SLICE_BYTES, 4),
        worker(W1, &cfg, codec, DEFAULT_MAX_SLICE_BYTES, 4),
    );
    for d in [&mut a, &mut b] {
        output(d);
        d.worker().unwrap().push(0, kvs()).unwrap();
    }
    let (frames, _, _) = output(&mut a);
    let mut buf = Vec::with_capacity(1);
    let mut written = Vec::new();
    loop {
        match b.poll_output_into(&mut buf) {
            Output::Transmit(t) => {
                assert_eq!(t.frame, buf.len());
                written.push((t.to, buf.clone()));
            }
            Output::Event(_) => {}
            Output::Wait { .. } => break,
        }
    }
    let polled: Vec<(NodeId, Vec<u8>)> = frames
        .into_iter()
        .map(|t| (t.to, t.frame.to_vec()))
        .collect();
    assert_eq!(written, polled);
    assert!(!written.is_empty());
}

#[test]
fn a_role_lends_only_its_own_calls_and_a_worker_takes_none_before_it_is_ready() {
    let codec = Codec::default();
    let cfg = config(&[W1], Consistency::Eventual);
    let mut s = server(&cfg, codec);
    assert_eq!(s.worker().unwrap_err(), DriverError::NotAWorker(S1));
    let mut w = Driver::<i64>::with_codec(Worker::new(WorkerConfig::new(W1, COORD)), codec);
    assert_eq!(w.server().unwrap_err(), DriverError::NotAServer(W1));
    // Started but not configured: registering, not ready.
    w.start(0);
    let kvs = KvPairs::new(vec![1], vec![1], 1).unwrap();
    let mut calls = w.worker().unwrap();
    assert!(!calls.is_ready());
    assert_eq!(
        calls.push(0, kvs),
        Err(DriverError::Worker(WorkerError::NotReady))
    );
    assert_eq!(
        calls.advance(0),
        Err(DriverError::Worker(WorkerError::NotReady))
    );
    let (frames, events, _) = output(&mut w);
    assert!(
        frames.iter().all(|t| t.to == COORD),
        "only registration goes out"
    );
    assert!(events.is_empty(), "{events:?}");
}

/// A frame read from a buffer the embedder reuses decodes as the same frame read in place.
#[test]
fn a_frame_from_a_reused_buffer_is_taken_as_from_its_own() {
    let codec = Codec::default();
    let cfg = config(&[W1], Consistency::Eventual);
    let (mut a, mut b) = (server(&cfg, codec), server(&cfg, codec));
    let mut w = worker(W1, &cfg, codec, DEFAULT_MAX_SLICE_BYTES, 4);
    output(&mut w);
    w.worker()
        .unwrap()
        .push(0, KvPairs::new(vec![3, 4], vec![5, 6], 1).unwrap())
        .unwrap();
    let (frames, _, _) = output(&mut w);
    let mut reused = vec![0u8; 1 << 16];
    for t in &frames {
        a.handle_frame_bytes(0, W1, &t.frame);
        reused[..t.frame.len()].copy_from_slice(&t.frame);
        b.handle_frame(0, W1, &reused[..t.frame.len()]);
        reused.fill(0xff);
    }
    let read = |d: &mut Driver<i64>| d.server().unwrap().read(KeyRange::FULL).rows;
    assert_eq!(read(&mut a), read(&mut b));
    assert_eq!(read(&mut b).values(), &[5, 6]);
    assert_eq!(output(&mut a).0, output(&mut b).0);
}

/// A send the transport says failed counts as an attempt: the slice is resent later than on
/// the timeout of a send that left, and only to the peer that failed.
#[test]
fn a_failed_send_backs_off_what_is_resent_to_that_peer() {
    let codec = Codec::default();
    let cfg = config(&[W1], Consistency::Eventual);
    let (mut a, mut b) = (
        worker(W1, &cfg, codec, DEFAULT_MAX_SLICE_BYTES, 4),
        worker(W1, &cfg, codec, DEFAULT_MAX_SLICE_BYTES, 4),
    );
    for d in [&mut a, &mut b] {
        output(d);
        d.worker()
            .unwrap()
            .push(0, KvPairs::new(vec![1, 2], vec![1, 1], 1).unwrap())
            .unwrap();
        assert!(output(d).0.iter().any(|t| t.to == S1));
    }
    a.send_failed(0, S1);
    assert_eq!((a.send_failures(), b.send_failures()), (1, 0));
    let (due_a, due_b) = (a.poll_timeout().unwrap(), b.poll_timeout().unwrap());
    assert!(due_a > due_b, "{due_a} <= {due_b}");
    // A burst of failures for the one send backs off once, not once per failure.
    a.send_failed(0, S1);
    a.send_failed(0, S1);
    assert_eq!(a.poll_timeout(), Some(due_a));
    assert_eq!(a.send_failures(), 3);
    for d in [&mut a, &mut b] {
        d.handle_timeout(due_b);
    }
    assert!(output(&mut b).0.iter().any(|t| t.to == S1));
    assert!(!output(&mut a).0.iter().any(|t| t.to == S1));
    a.handle_timeout(due_a);
    assert!(
        output(&mut a).0.iter().any(|t| t.to == S1),
        "backed off, not given up"
    );
}
