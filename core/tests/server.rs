//! The server state machine driven by hand, message by message: registration and timers,
//! which messages it takes, keeps or refuses, and the exact shape of what it answers.

use crate::common;
use pserver_core::events::Refusal;

use common::{COORD, config, deliver_config};
use pserver_core::node::*;
use pserver_core::ring::*;
use pserver_core::wire::ClusterConfig;
use pserver_core::wire::*;
use pserver_core::*;

const S1: NodeId = NodeId(1);
const W1: NodeId = NodeId(10);
const W2: NodeId = NodeId(11);

fn configured<V: Value, U: UpdateRule<V>>(
    cfg: ServerConfig,
    c: &ClusterConfig,
    rule: U,
) -> Server<V, U> {
    let mut s = Server::new(cfg, rule);
    let mut out = Effects::new();
    s.start(0, &mut out);
    s.on_message(0, deliver_config(cfg.id, c), &mut out);
    s
}

fn server(c: &ClusterConfig) -> Server<i64> {
    configured(ServerConfig::new(S1, COORD), c, Updater::Sum)
}

fn push(
    from: NodeId,
    epoch: Epoch,
    request: u64,
    settled_below: u64,
    kvs: KvPairs<i64>,
) -> Envelope<i64> {
    Envelope::new(
        from,
        S1,
        epoch,
        Message::Push(Push {
            slice: SliceRef { request, slice: 0 },
            iteration: 0,
            covers: pserver_core::pace::Coverage::WHOLE,
            settled_below,
            kvs,
        }),
    )
}

fn one(key: Key, v: i64) -> KvPairs<i64> {
    KvPairs::new(vec![key], vec![v], 1).unwrap()
}

fn pull(from: NodeId, request: u64, keys: KeySelection) -> Envelope<i64> {
    Envelope::new(
        from,
        S1,
        1,
        Message::Pull(Pull {
            slice: SliceRef { request, slice: 0 },
            iteration: 0,
            keys,
        }),
    )
}

fn replies(out: &Effects<i64>) -> Vec<PullReply<i64>> {
    out.sends
        .iter()
        .filter_map(|e| match &e.body {
            Message::PullReply(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn acks(out: &Effects<i64>) -> usize {
    out.sends
        .iter()
        .filter(|e| matches!(e.body, Message::PushAck(_)))
        .count()
}

#[test]
fn a_server_registers_and_beats_until_configured_then_only_beats() {
    let timing = Timing::default();
    let mut s: Server<i64> = Server::new(ServerConfig::new(S1, COORD), Updater::Sum);
    let mut out = Effects::new();
    s.start(1_000, &mut out);
    assert_eq!(
        out.sends,
        vec![Envelope::new(
            S1,
            COORD,
            0,
            Message::Register {
                role: Role::Server,
                incarnation: 0,
                keys_below: None,
                checkpoints: Vec::new(),
            }
        )]
    );
    assert_eq!(
        out.timers,
        vec![
            TimerCmd::Set {
                timer: TimerId::Register,
                at: 1_000 + timing.register_retry
            },
            TimerCmd::Set {
                timer: TimerId::Heartbeat,
                at: 1_000 + timing.heartbeat_interval
            },
        ]
    );
    out.clear();
    // No configuration yet: registration is retried.
    s.on_timer(5_000, TimerId::Register, &mut out);
    assert_eq!(
        out.sends,
        vec![Envelope::new(
            S1,
            COORD,
            0,
            Message::Register {
                role: Role::Server,
                incarnation: 0,
                keys_below: None,
                checkpoints: Vec::new(),
            }
        )]
    );
    assert_eq!(
        out.timers,
        vec![TimerCmd::Set {
            timer: TimerId::Register,
            at: 5_000 + timing.register_retry
        }]
    );
    out.clear();
    s.on_timer(7_000, TimerId::Heartbeat, &mut out);
    assert_eq!(
        out.sends,
        vec![Envelope::new(
            S1,
            COORD,
            0,
            Message::Heartbeat {
                sent_at: 7_000,
                at: None,
                term: 0,
            }
        )]
    );
    assert_eq!(
        out.timers,
        vec![TimerCmd::Set {
            timer: TimerId::Heartbeat,
            at: 7_000 + timing.heartbeat_interval
        }]
    );
    out.clear();
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    s.on_message(8_000, deliver_config(S1, &cfg), &mut out);
    assert_eq!(s.epoch(), 1);
    assert_eq!(out.events, vec![Event::Ready { epoch: 1 }]);
    assert_eq!(out.timers, vec![TimerCmd::Cancel(TimerId::Register)]);
    out.clear();
    // Configured: a stale registration timer does nothing, heartbeats carry the epoch.
    s.on_timer(9_000, TimerId::Register, &mut out);
    assert!(out.is_empty(), "{out:?}");
    s.on_timer(9_000, TimerId::Heartbeat, &mut out);
    assert_eq!(
        out.sends,
        vec![Envelope::new(
            S1,
            COORD,
            1,
            Message::Heartbeat {
                sent_at: 9_000,
                at: None,
                term: 0,
            }
        )]
    );
    out.clear();
    // Timers a server never sets are ignored.
    s.on_timer(9_000, TimerId::Retransmit, &mut out);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_server_started_configured_is_ready_at_once_and_beats() {
    let timing = Timing::default();
    let cfg = config(3, &[1], &[W1], Consistency::Eventual);
    let mut s: Server<i64> = Server::new(ServerConfig::new(S1, COORD), Updater::Sum);
    let mut out = Effects::new();
    s.start_configured(2_000, cfg, &mut out);
    assert_eq!(s.id(), S1);
    assert_eq!(s.epoch(), 3);
    assert!(out.sends.is_empty(), "no registration: {:?}", out.sends);
    assert_eq!(out.events, vec![Event::Ready { epoch: 3 }]);
    assert_eq!(
        out.timers.last(),
        Some(&TimerCmd::Set {
            timer: TimerId::Heartbeat,
            at: 2_000 + timing.heartbeat_interval
        })
    );
}

#[test]
fn messages_for_another_node_or_from_a_non_member_are_refused_and_change_nothing() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s = server(&cfg);
    let mut out = Effects::new();
    let mut elsewhere = push(W1, 1, 1, 0, one(5, 1));
    elsewhere.to = NodeId(2);
    s.on_message(1, elsewhere, &mut out);
    assert_eq!(
        out.events,
        vec![Event::Refused {
            from: W1,
            reason: Refusal::Misaddressed { to: NodeId(2) }
        }]
    );
    assert!(out.sends.is_empty());
    out.clear();
    s.on_message(1, push(W2, 1, 1, 0, one(5, 1)), &mut out);
    assert_eq!(
        out.events,
        vec![Event::Refused {
            from: W2,
            reason: Refusal::UnknownSender
        }]
    );
    assert!(out.sends.is_empty());
    out.clear();
    s.on_message(
        1,
        Envelope::new(
            W1,
            S1,
            1,
            Message::PushAck(SliceRef {
                request: 1,
                slice: 0,
            }),
        ),
        &mut out,
    );
    assert_eq!(
        out.events,
        vec![Event::Refused {
            from: W1,
            reason: Refusal::Unexpected
        }]
    );
    assert_eq!(s.value(5), None);
    assert_eq!(s.dedupe_entries(), 0);
}

#[test]
fn progress_is_acknowledged_with_the_highest_iteration_reported() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s = server(&cfg);
    let mut out = Effects::new();
    let progress = |finished_below| {
        Envelope::new(
            W1,
            S1,
            1,
            Message::Progress {
                finished_below,
                taken_below: finished_below,
            },
        )
    };
    s.on_message(1, progress(3), &mut out);
    s.on_message(1, progress(2), &mut out);
    let acked: Vec<Message<i64>> = out.sends.iter().map(|e| e.body.clone()).collect();
    assert_eq!(
        acked,
        vec![
            Message::ProgressAck {
                finished_below: 3,
                taken_below: 3,
            },
            Message::ProgressAck {
                finished_below: 3,
                taken_below: 3,
            }
        ]
    );
    assert!(
        out.sends
            .iter()
            .all(|e| e.to == W1 && e.epoch == 1 && e.from == S1)
    );
}

#[test]
fn a_server_that_joins_a_running_job_asks_every_worker_for_its_progress_until_it_hears_it() {
    let mut cfg = config(3, &[2], &[W1, W2], Consistency::Sequential);
    cfg.joining = vec![S1];
    let mut s = Server::<i64>::new(ServerConfig::new(S1, COORD), Updater::Sum);
    let mut out = Effects::new();
    s.start(0, &mut out);
    out.clear();
    s.on_message(0, deliver_config(S1, &cfg), &mut out);
    let asked = |out: &Effects<i64>| -> Vec<NodeId> {
        out.sends
            .iter()
            .filter(|e| e.body == Message::ProgressRequest)
            .map(|e| e.to)
            .collect()
    };
    assert_eq!(asked(&out), [W1, W2]);
    let progress = Envelope::new(
        W1,
        S1,
        3,
        Message::Progress {
            finished_below: 2,
            taken_below: 2,
        },
    );
    s.on_message(1, progress, &mut out);
    out.clear();
    s.on_timer(2, TimerId::Heartbeat, &mut out);
    assert_eq!(asked(&out), [W2], "asked again on every heartbeat");
    let progress = Envelope::new(
        W2,
        S1,
        3,
        Message::Progress {
            finished_below: 2,
            taken_below: 2,
        },
    );
    s.on_message(3, progress, &mut out);
    out.clear();
    s.on_timer(4, TimerId::Heartbeat, &mut out);
    assert!(asked(&out).is_empty());
    // A server that started with the job asks nobody.
    let mut fresh = server(&config(1, &[1], &[W1, W2], Consistency::Sequential));
    let mut out = Effects::new();
    fresh.on_timer(1, TimerId::Heartbeat, &mut out);
    assert!(asked(&out).is_empty());
}

#[test]
fn a_message_from_a_newer_epoch_waits_for_its_configuration_and_an_older_one_is_served() {
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s = server(&cfg);
    let mut out = Effects::new();
    // From a worker that already has epoch 2: ask for the configuration, keep the push.
    s.on_message(1, push(W1, 2, 1, 0, one(5, 4)), &mut out);
    assert_eq!(
        out.sends,
        vec![Envelope::new(S1, COORD, 1, Message::ConfigRequest)]
    );
    assert_eq!(s.value(5), None);
    out.clear();
    // From a worker still on epoch 0 (it never saw a configuration): served at once.
    s.on_message(1, push(W1, 0, 2, 0, one(6, 3)), &mut out);
    assert_eq!(acks(&out), 1);
    assert_eq!(s.value(6), Some(&[3i64][..]));
    out.clear();
    let next = config(2, &[1], &[W1], Consistency::Eventual);
    s.on_message(2, deliver_config(S1, &next), &mut out);
    assert_eq!(acks(&out), 1, "{:?}", out.sends);
    assert_eq!(s.value(5), Some(&[4i64][..]));
    assert!(
        out.events.is_empty(),
        "not the first configuration: {:?}",
        out.events
    );
}

#[test]
fn at_most_sixty_four_messages_wait_for_a_configuration() {
    let mut s: Server<i64> = Server::new(ServerConfig::new(S1, COORD), Updater::Sum);
    let mut out = Effects::new();
    s.start(0, &mut out);
    out.clear();
    for request in 1..=65 {
        s.on_message(1, push(W1, 1, request, 0, one(7, 1)), &mut out);
    }
    assert_eq!(
        out.events,
        vec![Event::Refused {
            from: W1,
            reason: Refusal::Overflow
        }]
    );
    assert!(out.sends.is_empty(), "no configuration to ask for yet");
    out.clear();
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    s.on_message(2, deliver_config(S1, &cfg), &mut out);
    assert_eq!(acks(&out), 64);
    assert_eq!(s.value(7), Some(&[64i64][..]));
}

#[test]
fn dedupe_entries_count_the_unsettled_slices_of_every_worker() {
    let cfg = config(1, &[1], &[W1, W2], Consistency::Eventual);
    let mut s = server(&cfg);
    let mut out = Effects::new();
    assert_eq!(s.dedupe_entries(), 0);
    for request in 1..=3 {
        s.on_message(1, push(W1, 1, request, 0, one(1, 1)), &mut out);
    }
    s.on_message(1, push(W2, 1, 1, 0, one(1, 1)), &mut out);
    assert_eq!(s.dedupe_entries(), 4);
    // W1 says everything below request 3 is settled.
    s.on_message(1, push(W1, 1, 4, 3, one(1, 1)), &mut out);
    assert_eq!(s.dedupe_entries(), 3);
    assert_eq!(s.value(1), Some(&[5i64][..]));
}

#[test]
fn a_range_pull_is_answered_in_parts_of_the_configured_size() {
    // Rows of width 1 of i64 count 10 + 8 bytes; 128 bytes are kept for the rest of a frame.
    // Room for three rows and a bit.
    let mut scfg = ServerConfig::new(S1, COORD);
    scfg.max_reply_bytes = 128 + 3 * 18 + 5;
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s: Server<i64> = configured(scfg, &cfg, Updater::Sum);
    let mut out = Effects::new();
    let keys: Vec<Key> = (0..10).map(|k| 100 + 10 * k).collect();
    let values: Vec<i64> = (1..=10).collect();
    s.on_message(
        1,
        push(W1, 1, 1, 0, KvPairs::new(keys.clone(), values, 1).unwrap()),
        &mut out,
    );
    out.clear();
    let all = RangeList::new(vec![KeyRange::new(0, 1_000).unwrap()]).unwrap();
    s.on_message(1, pull(W1, 2, KeySelection::Ranges(all)), &mut out);
    let r = replies(&out);
    assert_eq!(r.len(), 1);
    assert_eq!(
        r[0].kvs,
        KvPairs::new(keys[..3].to_vec(), vec![1, 2, 3], 1).unwrap()
    );
    assert_eq!(r[0].resume, Some(keys[3]));
    out.clear();
    // The rest, asked again from there, over two ranges: the part stops inside the second.
    let rest = RangeList::new(vec![
        KeyRange::new(keys[3], 145).unwrap(),
        KeyRange::new(150, 1_000).unwrap(),
    ])
    .unwrap();
    s.on_message(1, pull(W1, 2, KeySelection::Ranges(rest)), &mut out);
    let r = replies(&out);
    assert_eq!(r[0].kvs.keys(), &keys[3..6]);
    assert_eq!(r[0].resume, Some(keys[6]));
    out.clear();
    // Exactly three rows left: one complete part, no resume.
    let tail = RangeList::new(vec![KeyRange::new(keys[7], 1_000).unwrap()]).unwrap();
    s.on_message(1, pull(W1, 3, KeySelection::Ranges(tail)), &mut out);
    let r = replies(&out);
    assert_eq!(r[0].kvs.keys(), &keys[7..]);
    assert_eq!(r[0].resume, None);
}

#[test]
fn a_range_pull_is_redirected_unless_the_server_owns_all_of_it() {
    let cfg = config(1, &[1, 2], &[W1], Consistency::Eventual);
    let ring = Ring::new(cfg.servers.clone(), cfg.ring).unwrap();
    let mut s = server(&cfg);
    let mut out = Effects::new();
    let (mine, _) = ring
        .segments()
        .find(|(_, owners)| owners[0] == S1)
        .expect("server 1 owns a segment");
    let (theirs, _) = ring
        .segments()
        .find(|(_, owners)| owners[0] != S1)
        .expect("server 2 owns a segment");
    let ranges = |rs: Vec<KeyRange>| KeySelection::Ranges(RangeList::new(rs).unwrap());
    s.on_message(1, pull(W1, 1, ranges(vec![mine])), &mut out);
    assert_eq!(replies(&out).len(), 1, "{:?}", out.sends);
    out.clear();
    let mut both = vec![mine, theirs];
    both.sort();
    s.on_message(1, pull(W1, 2, ranges(both)), &mut out);
    assert_eq!(
        out.sends,
        vec![Envelope::new(
            S1,
            W1,
            1,
            Message::Redirect {
                slice: SliceRef {
                    request: 2,
                    slice: 0
                },
                epoch: 1
            }
        )]
    );
}

#[test]
fn a_pull_of_keys_never_written_reads_zero_rows() {
    let mut scfg = ServerConfig::new(S1, COORD);
    scfg.width = 2;
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s: Server<i64> = configured(scfg, &cfg, Updater::Sum);
    let mut out = Effects::new();
    s.on_message(
        1,
        push(W1, 1, 1, 0, KvPairs::new(vec![5], vec![7, 8], 2).unwrap()),
        &mut out,
    );
    let keys = KeyList::new(vec![1, 2, 5, 9]).unwrap();
    s.on_message(1, pull(W1, 2, KeySelection::Keys(keys)), &mut out);
    let r = replies(&out);
    assert_eq!(
        r[0].kvs,
        KvPairs::new(vec![1, 2, 5, 9], vec![0, 0, 0, 0, 7, 8, 0, 0], 2).unwrap()
    );
    assert_eq!(r[0].resume, None);
}

/// Counts in `aux` the sum and the number of the deltas each coordinate received, and stores
/// both in the weight: a coordinate that saw another's state shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SumAndCount;

impl UpdateRule<i64> for SumAndCount {
    fn aux_width(&self) -> usize {
        2
    }
    fn apply(&self, weight: &mut i64, aux: &mut [i64], delta: i64) {
        assert_eq!(aux.len(), 2);
        aux[0] += delta;
        aux[1] += 1;
        *weight = aux[0] * 100 + aux[1];
    }
}

#[test]
fn each_value_of_a_row_keeps_its_own_update_state() {
    let mut scfg = ServerConfig::new(S1, COORD);
    scfg.width = 3;
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let mut s: Server<i64, SumAndCount> = configured(scfg, &cfg, SumAndCount);
    let mut out = Effects::new();
    let row = |a, b, c| KvPairs::new(vec![4], vec![a, b, c], 3).unwrap();
    s.on_message(1, push(W1, 1, 1, 0, row(1, 2, 3)), &mut out);
    s.on_message(1, push(W1, 1, 2, 0, row(10, 20, 30)), &mut out);
    assert_eq!(s.value(4), Some(&[1_102, 2_202, 3_302][..]));
}

#[test]
fn adagrad_keeps_one_accumulator_per_value_of_a_row() {
    let mut scfg = ServerConfig::new(S1, COORD);
    scfg.width = 2;
    let cfg = config(1, &[1], &[W1], Consistency::Eventual);
    let rule = Updater::AdaGrad { lr: 1.0, eps: 0.0 };
    let mut s: Server<f64> = configured(scfg, &cfg, rule);
    let mut out = Effects::new();
    let row = |a: f64, b: f64| {
        Envelope::new(
            W1,
            S1,
            1,
            Message::Push(Push {
                slice: SliceRef {
                    request: a as u64,
                    slice: 0,
                },
                iteration: 0,
                covers: pserver_core::pace::Coverage::WHOLE,
                settled_below: 0,
                kvs: KvPairs::new(vec![4], vec![a, b], 2).unwrap(),
            }),
        )
    };
    // Column 0: g = 3 then 4: n = 9, w = -1; n = 25, w = -1 - 4/5. Column 1: g = 4 then 3.
    s.on_message(1, row(3.0, 4.0), &mut out);
    s.on_message(1, row(4.0, 3.0), &mut out);
    let v = s.value(4).unwrap();
    assert_eq!(v, &[-1.0 - 0.8, -1.0 - 0.6][..]);
}

/// A restarted server process that hears of a configuration before its own registration
/// reached the coordinator must not take the ranges that configuration gives its node: they
/// were held by the earlier process, and serving them from empty shards would lose what was
/// acknowledged there. It refuses the configuration, visibly, and keeps registering until it
/// is listed under its own incarnation.
#[test]
fn exactly_once_a_restarted_server_refuses_a_configuration_of_its_earlier_process() {
    let mut sc = ServerConfig::new(S1, COORD);
    sc.incarnation = 7;
    let mut s: Server<i64> = Server::new(sc, Updater::Sum);
    let mut out = Effects::new();
    s.start(0, &mut out);
    let mut earlier = config(2, &[1, 2], &[W1], Consistency::Eventual);
    earlier.incarnations = vec![(S1, 3), (NodeId(2), 1)];
    out.clear();
    s.on_message(0, deliver_config(S1, &earlier), &mut out);
    assert_eq!(
        out.events,
        vec![Event::Refused {
            from: COORD,
            reason: Refusal::OtherIncarnation {
                known: 7,
                claimed: 3
            }
        }]
    );
    assert!(!s.is_member());
    assert_eq!(s.epoch(), 0);
    // Still registering: the retry timer was not cancelled and fires a new registration.
    out.clear();
    s.on_timer(5_000, TimerId::Register, &mut out);
    assert!(out.sends.iter().any(|e| e.body
        == Message::Register {
            role: Role::Server,
            incarnation: 7,
            keys_below: None,
            checkpoints: Vec::new(),
        }));
    // The coordinator took the registration: it lists the node as joining, under incarnation 7.
    let mut own = config(3, &[2], &[W1], Consistency::Eventual);
    own.joining = vec![S1];
    own.incarnations = vec![(S1, 7), (NodeId(2), 1)];
    out.clear();
    s.on_message(5_000, deliver_config(S1, &own), &mut out);
    assert!(out.events.contains(&Event::Ready { epoch: 3 }));
    assert!(s.is_member());
}

/// A configuration that does not record incarnations (made by hand, or by a coordinator that
/// was handed its members) is taken as it stands.
#[test]
fn a_configuration_without_incarnations_is_adopted_by_any_process() {
    let mut sc = ServerConfig::new(S1, COORD);
    sc.incarnation = 7;
    let s = configured::<i64, _>(
        sc,
        &config(1, &[1], &[W1], Consistency::Eventual),
        Updater::Sum,
    );
    assert_eq!(s.epoch(), 1);
    assert!(s.is_member());
}

/// A warm start: every server is given the whole saved model, and each keeps the rows of the
/// keys the first configuration gives it, as their values; the others are dropped.
#[test]
fn a_server_started_from_rows_holds_those_of_its_keys_and_no_others() {
    let c = config(1, &[1, 2], &[W1], Consistency::Eventual);
    let ring = Ring::new(c.servers.clone(), c.ring).unwrap();
    let keys: Vec<Key> = (0..64).map(|i| i * (MAX_KEY / 64)).collect();
    let rows: Vec<(Key, [f64; 1])> = keys.iter().map(|&k| (k, [k as f64 / 1e18 + 1.0])).collect();
    let rule = Updater::FtrlProximal {
        alpha: 0.1,
        beta: 1.0,
        l1: 0.01,
        l2: 0.1,
    };
    for id in [NodeId(1), NodeId(2)] {
        let mut s: Server<f64> = Server::new(ServerConfig::new(id, COORD), rule);
        s.start_from(rows.iter().map(|(k, v)| (*k, &v[..])))
            .unwrap();
        let mut out = Effects::new();
        s.start(0, &mut out);
        s.on_message(0, deliver_config(id, &c), &mut out);
        for (k, v) in &rows {
            let held = (ring.primary(*k) == id).then_some(&v[..]);
            assert_eq!(s.value(*k), held, "key {k} on {id}");
        }
        assert_eq!(
            s.start_from([(0, &[1.0][..])]),
            Err(StartFromError::Configured),
            "too late once configured"
        );
    }
    let mut s: Server<f64> = Server::new(ServerConfig::new(S1, COORD), rule);
    assert_eq!(
        s.start_from([(5, &[1.0, 2.0][..])]),
        Err(StartFromError::Width {
            key: 5,
            got: 2,
            width: 1
        })
    );
}
