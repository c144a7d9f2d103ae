//! Stragglers, driven by hand (ARCHITECTURE.md §9): the coordinator tells them from the
//! positions workers report, and what it decides (skip-ahead, adaptive tau) is what servers
//! and workers hold to.

use crate::common;
use pserver_core::events::{CoordinatorEvent, Refusal, WorkerEvent};

use common::{COORD, config, deliver_config, ring};
use pserver_core::node::*;
use pserver_core::pace::{
    Balance, Coverage, Detection, Position, ShareMove, StragglerPolicy, TauRange,
};
use pserver_core::wire::ClusterConfig;
use pserver_core::wire::*;
use pserver_core::*;

const S1: NodeId = NodeId(1);
const W: [NodeId; 3] = [NodeId(2), NodeId(3), NodeId(4)];

/// A coordinator of one server and three workers with `policy`, epoch 1 in force.
fn coordinator(consistency: Consistency, policy: StragglerPolicy) -> Coordinator {
    let mut cfg = CoordinatorConfig::new(COORD, 1, 3);
    cfg.ring = ring();
    cfg.consistency = consistency;
    cfg.stragglers = policy;
    Coordinator::bootstrapped(cfg, &[S1], &W).unwrap()
}

/// Every worker reports its position of `ats`, the server beats, and a failure check runs.
fn check_at(c: &mut Coordinator, ats: [Position; 3], out: &mut Effects<i64>) {
    let epoch = c.epoch();
    for (w, at) in W.iter().zip(ats) {
        let beat = Message::Heartbeat {
            sent_at: 0,
            at: Some(at),
            term: 0,
        };
        c.on_message(0, Envelope::new(*w, COORD, epoch, beat), out);
    }
    let beat = Message::Heartbeat {
        sent_at: 0,
        at: None,
        term: 0,
    };
    c.on_message(0, Envelope::new(S1, COORD, epoch, beat), out);
    c.on_timer(0, TimerId::FailureCheck, out);
}

/// Every worker reports `positions`, the server beats, and a failure check runs.
fn check(c: &mut Coordinator, positions: [Iteration; 3], out: &mut Effects<i64>) {
    let ats = positions.map(|iteration| Position {
        iteration,
        ..Position::default()
    });
    check_at(c, ats, out);
}

fn detection(lag: Iteration) -> StragglerPolicy {
    let mut policy = StragglerPolicy::default();
    policy.detect = Some(Detection::lagging(lag));
    policy
}

#[test]
fn the_coordinator_flags_a_worker_lagging_the_median_once_and_says_when_it_keeps_up() {
    let mut c = coordinator(Consistency::BoundedDelay(2), detection(1));
    let mut out = Effects::new();
    check(&mut c, [5, 5, 3], &mut out);
    assert_eq!(
        out.events,
        [Event::Coordinator(CoordinatorEvent::Straggler {
            worker: W[2],
            behind: 2
        })]
    );
    out.clear();
    check(&mut c, [6, 6, 4], &mut out);
    assert!(out.events.is_empty(), "said once: {:?}", out.events);
    check(&mut c, [6, 6, 5], &mut out);
    assert_eq!(
        out.events,
        [Event::Coordinator(CoordinatorEvent::StragglerCleared(W[2]))]
    );
    // Detection alone decides nothing: no new configuration.
    assert_eq!(c.epoch(), 1);
}

#[test]
fn workers_report_their_position_only_where_the_job_detects_stragglers() {
    for (policy, reported) in [(StragglerPolicy::default(), false), (detection(1), true)] {
        let mut job = JobSpec::new(1, 1);
        job.consistency = Consistency::BoundedDelay(1);
        job.stragglers = policy;
        let mut w: Worker<i64> = Worker::new(job.worker_config(NodeId(2)));
        let mut out = Effects::new();
        w.start(0, &mut out);
        out.clear();
        w.on_timer(1, TimerId::Heartbeat, &mut out);
        let beat = out
            .sends
            .iter()
            .find_map(|e| match e.body {
                Message::Heartbeat { at, .. } => Some(at),
                _ => None,
            })
            .unwrap();
        assert_eq!(beat.is_some(), reported);
    }
}

#[test]
fn a_job_that_reports_progress_has_its_workers_say_where_they_are_and_the_coordinator_tell_it() {
    let mut job = JobSpec::new(1, 1);
    job.report_progress = true;
    let mut w: Worker<i64> = Worker::new(job.worker_config(NodeId(2)));
    let mut out = Effects::new();
    w.start(0, &mut out);
    out.clear();
    w.on_timer(1, TimerId::Heartbeat, &mut out);
    assert!(
        out.sends
            .iter()
            .any(|e| matches!(e.body, Message::Heartbeat { at: Some(_), .. }))
    );
    // Without a straggler policy, the coordinator only tells where the workers are.
    let mut c = coordinator(Consistency::BoundedDelay(1), StragglerPolicy::default());
    let mut out = Effects::new();
    assert!(c.progress().is_empty());
    check(&mut c, [6, 5, 2], &mut out);
    let told: Vec<(NodeId, Iteration)> = c.progress().into_iter().collect();
    assert_eq!(told, [(W[0], 6), (W[1], 5), (W[2], 2)]);
    assert_eq!(c.config().unwrap().epoch, 1, "nothing decided");
}

#[test]
fn skip_ahead_is_published_in_the_configuration_and_servers_wait_no_more_for_what_was_skipped() {
    let job = Consistency::BoundedDelay(1);
    let mut c = coordinator(job, StragglerPolicy::skip_ahead());
    let mut out = Effects::new();
    check(&mut c, [6, 6, 2], &mut out);
    let published = c.config().unwrap().clone();
    assert_eq!(published.epoch, 2);
    assert_eq!(published.pace.skipped_below(W[2]), 6);
    assert_eq!(published.pace.skipped_below(W[0]), 0);
    assert!(
        out.sends
            .iter()
            .any(|e| e.to == S1 && e.body == Message::Config(published.clone())),
        "every member is told"
    );
    // A server holding W0's pull of iteration 6 for W2's iterations 2 to 4 answers it once
    // the configuration says they were skipped.
    let mut s: Server<i64> = Server::new(ServerConfig::new(S1, COORD), Updater::Sum);
    let mut sout = Effects::new();
    let first = config(1, &[1], &W, job);
    s.start_configured(0, first, &mut sout);
    for w in &W[..2] {
        let progress = Message::Progress {
            finished_below: 6,
            taken_below: 6,
        };
        s.on_message(1, Envelope::new(*w, S1, 1, progress), &mut sout);
    }
    let progress = Message::Progress {
        finished_below: 2,
        taken_below: 2,
    };
    s.on_message(1, Envelope::new(W[2], S1, 1, progress), &mut sout);
    let pull = Message::Pull(Pull {
        slice: SliceRef {
            request: 1,
            slice: 0,
        },
        iteration: 6,
        keys: KeySelection::Keys(KeyList::new(vec![7]).unwrap()),
    });
    s.on_message(1, Envelope::new(W[0], S1, 1, pull), &mut sout);
    assert_eq!(
        s.held_pulls(),
        1,
        "iteration 6 under tau 1 needs W2 below 5"
    );
    sout.clear();
    s.on_message(2, deliver_config(S1, &published), &mut sout);
    assert_eq!(s.held_pulls(), 0);
    assert!(
        sout.sends
            .iter()
            .any(|e| e.to == W[0] && matches!(e.body, Message::PullReply(_)))
    );
}

#[test]
fn a_worker_told_to_skip_enters_the_others_iteration_and_what_it_pushed_still_goes() {
    let job = Consistency::BoundedDelay(1);
    let first = config(1, &[1], &W, job);
    let mut w: Worker<i64> = Worker::new(WorkerConfig::new(W[2], COORD));
    let mut out = Effects::new();
    w.start_configured(0, first.clone(), &mut out);
    // Half of iteration 0 is pushed; the other half is still being computed.
    let kvs = KvPairs::new(vec![7], vec![3], 1).unwrap();
    let part = w
        .push_part(1, kvs, Coverage::parts(1, 2), &mut out)
        .unwrap();
    let push = out
        .sends
        .iter()
        .find_map(|e| match &e.body {
            Message::Push(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(push.covers, Coverage::parts(1, 2));
    out.clear();
    let mut skipped = first.clone();
    skipped.epoch = 2;
    skipped.pace.skipped_below = vec![(W[2], 4)];
    w.on_message(2, deliver_config(W[2], &skipped), &mut out);
    assert_eq!(
        out.events,
        [Event::Worker(WorkerEvent::SkippedAhead {
            from: 0,
            to: 4,
            covered: Coverage::parts(1, 2)
        })]
    );
    assert_eq!(w.iteration(), 4);
    // The part pushed is still open, and is not what holds the worker back: it enters
    // iterations 5 and 6 (tau 1 allows two in flight past what was skipped)...
    assert_eq!(w.open_requests(), 1);
    out.clear();
    w.advance(3, &mut out).unwrap();
    assert_eq!(out.events, [Event::Worker(WorkerEvent::Advanced(5))]);
    // ...and the part is acknowledged as any push, once.
    let ack = Message::PushAck(SliceRef {
        request: part,
        slice: 0,
    });
    out.clear();
    w.on_message(4, Envelope::new(S1, W[2], 2, ack), &mut out);
    assert!(
        out.events
            .contains(&Event::Worker(WorkerEvent::PushDone(part)))
    );
    // A configuration that says nothing new moves nobody back.
    let mut again = skipped.clone();
    again.epoch = 3;
    out.clear();
    w.on_message(5, deliver_config(W[2], &again), &mut out);
    assert_eq!(w.iteration(), 5);
    assert!(
        !out.events
            .iter()
            .any(|e| matches!(e, Event::Worker(WorkerEvent::SkippedAhead { .. })))
    );
}

#[test]
fn an_advance_waiting_when_the_skip_arrives_is_answered_with_the_iteration_entered() {
    let job = Consistency::BoundedDelay(0);
    let first = config(1, &[1], &W, job);
    let mut w: Worker<i64> = Worker::new(WorkerConfig::new(W[2], COORD));
    let mut out = Effects::new();
    w.start_configured(0, first.clone(), &mut out);
    w.push(1, KvPairs::new(vec![7], vec![3], 1).unwrap(), &mut out)
        .unwrap();
    out.clear();
    // Tau 0: iteration 1 waits for iteration 0's push.
    w.advance(1, &mut out).unwrap();
    assert!(out.events.is_empty());
    let mut skipped = first;
    skipped.epoch = 2;
    skipped.pace.skipped_below = vec![(W[2], 3)];
    w.on_message(2, deliver_config(W[2], &skipped), &mut out);
    assert_eq!(
        out.events,
        [
            Event::Worker(WorkerEvent::SkippedAhead {
                from: 0,
                to: 3,
                covered: Coverage::WHOLE
            }),
            Event::Worker(WorkerEvent::Advanced(3))
        ]
    );
}

#[test]
fn adaptive_tau_rises_with_stragglers_and_is_the_bound_servers_and_workers_hold_to() {
    let job = Consistency::BoundedDelay(1);
    let mut c = coordinator(job, StragglerPolicy::adaptive(TauRange { min: 1, max: 2 }));
    let mut out = Effects::new();
    check(&mut c, [6, 6, 4], &mut out);
    assert!(
        out.events
            .contains(&Event::Coordinator(CoordinatorEvent::TauChanged {
                from: 1,
                to: 2
            }))
    );
    let published = c.config().unwrap().clone();
    assert_eq!(published.pace.tau, Some(2));
    // A server on that configuration answers at once a pull of iteration 6 that tau 1 holds
    // (W2 finished only iteration 3 and below).
    let pull = |request| {
        Message::Pull(Pull {
            slice: SliceRef { request, slice: 0 },
            iteration: 6,
            keys: KeySelection::Keys(KeyList::new(vec![7]).unwrap()),
        })
    };
    for (cfg, held) in [(config(1, &[1], &W, job), 1), (published.clone(), 0)] {
        let mut s: Server<i64> = Server::new(ServerConfig::new(S1, COORD), Updater::Sum);
        let mut sout = Effects::new();
        let epoch = cfg.epoch;
        s.start_configured(0, cfg, &mut sout);
        for (w, below) in W.iter().zip([6, 6, 4]) {
            let progress = Message::Progress {
                finished_below: below,
                taken_below: below,
            };
            s.on_message(1, Envelope::new(*w, S1, epoch, progress), &mut sout);
        }
        s.on_message(1, Envelope::new(W[0], S1, epoch, pull(1)), &mut sout);
        assert_eq!(s.held_pulls(), held);
    }
    // A worker on it runs three iterations ahead of what it finished, not two.
    let mut w: Worker<i64> = Worker::new(WorkerConfig::new(W[0], COORD));
    w.start_configured(0, published, &mut out);
    for _ in 0..3 {
        w.push(1, KvPairs::new(vec![7], vec![1], 1).unwrap(), &mut out)
            .unwrap();
        w.advance(1, &mut out).unwrap();
    }
    assert_eq!((w.iteration(), w.in_flight()), (2, 3));
    w.push(1, KvPairs::new(vec![7], vec![1], 1).unwrap(), &mut out)
        .unwrap();
    w.advance(1, &mut out).unwrap();
    assert_eq!(w.iteration(), 2, "a fourth would exceed tau + 1");
    // Once nobody lags, the bound falls back, one check at a time.
    out.clear();
    check(&mut c, [7, 7, 7], &mut out);
    assert!(
        out.events
            .contains(&Event::Coordinator(CoordinatorEvent::TauChanged {
                from: 2,
                to: 1
            }))
    );
    check(&mut c, [8, 8, 8], &mut out);
    assert_eq!(c.config().unwrap().pace.tau, Some(1));
}

#[test]
fn a_job_refuses_a_straggler_policy_it_cannot_follow() {
    let mut job = JobSpec::new(1, 2);
    job.stragglers = StragglerPolicy::skip_ahead();
    let err = job.validate::<f32>().unwrap_err().to_string();
    assert!(err.contains("bounded delay"), "{err}");
    job.consistency = Consistency::BoundedDelay(2);
    assert!(job.validate::<f32>().is_ok());
    job.stragglers.detect = None;
    assert!(job.validate::<f32>().is_err(), "nothing to act on");
    job.stragglers = StragglerPolicy::adaptive(TauRange { min: 4, max: 2 });
    assert!(job.validate::<f32>().is_err(), "an empty range");
}

/// Two servers, each range with a primary and one replica, and the three workers.
fn replicated(epoch: Epoch, tau: Option<Iteration>) -> ClusterConfig {
    let mut c = config(epoch, &[1, 2], &W, Consistency::BoundedDelay(1));
    c.ring.replicas = 1;
    c.pace.tau = tau;
    c
}

fn sends(out: &mut Effects<i64>) -> Vec<Envelope<i64>> {
    out.sends.drain(..).collect()
}

#[test]
fn a_replica_that_missed_the_first_configuration_asks_for_its_copies_and_gets_them() {
    let (s1, s2) = (NodeId(1), NodeId(2));
    let first = replicated(1, None);
    // The straggler policy's first check moved tau: epoch 2 differs only in its pace.
    let second = replicated(2, Some(2));
    let mut primary: Server<i64> = Server::new(ServerConfig::new(s1, COORD), Updater::Sum);
    let mut replica: Server<i64> = Server::new(ServerConfig::new(s2, COORD), Updater::Sum);
    let (mut po, mut ro) = (Effects::new(), Effects::new());
    primary.start(0, &mut po);
    replica.start(0, &mut ro);
    primary.on_message(1, deliver_config(s1, &first), &mut po);
    // The replica never sees epoch 1: it creates no replica shards, while its primary counts
    // it in step.
    replica.on_message(1, deliver_config(s2, &second), &mut ro);
    sends(&mut po);
    sends(&mut ro);
    replica.on_timer(2, TimerId::Heartbeat, &mut ro);
    let asks: Vec<Envelope<i64>> = sends(&mut ro)
        .into_iter()
        .filter(|e| e.to == s1 && matches!(e.body, Message::ReplicateAck { .. }))
        .collect();
    assert_eq!(
        asks.len(),
        1,
        "one ask to the primary, with every range missing"
    );
    // The primary copies each range the ask names.
    primary.on_message(3, deliver_config(s1, &second), &mut po);
    for ask in asks {
        primary.on_message(3, ask, &mut po);
    }
    primary.on_timer(4, TimerId::Replicate, &mut po);
    let copies: Vec<Envelope<i64>> = sends(&mut po)
        .into_iter()
        .filter(|e| matches!(e.body, Message::Transfer(_)))
        .collect();
    assert!(!copies.is_empty());
    for copy in copies {
        replica.on_message(5, copy, &mut ro);
    }
    let acks = sends(&mut ro)
        .iter()
        .filter(|e| matches!(e.body, Message::TransferAck { .. }))
        .count();
    assert!(acks > 0);
    assert!(
        !ro.events.iter().any(|e| matches!(e, Event::Refused { .. })),
        "{:?}",
        ro.events
    );
    // Holding every copy, it asks no more.
    replica.on_timer(6, TimerId::Heartbeat, &mut ro);
    assert!(
        !sends(&mut ro)
            .iter()
            .any(|e| matches!(e.body, Message::ReplicateAck { .. }))
    );
}

#[test]
fn replication_sent_before_a_change_of_pace_is_taken_but_not_from_before_a_change_of_members() {
    let (s1, s2) = (NodeId(1), NodeId(2));
    let ring = pserver_core::ring::Ring::new([s1, s2], replicated(1, None).ring).unwrap();
    let key = (0..u64::MAX)
        .step_by(1 << 40)
        .find(|&k| ring.primary(k) == s1)
        .unwrap();
    let mut primary: Server<i64> = Server::new(ServerConfig::new(s1, COORD), Updater::Sum);
    let mut po = Effects::new();
    primary.start_configured(0, replicated(1, None), &mut po);
    let push = Message::Push(Push {
        slice: SliceRef {
            request: 1,
            slice: 0,
        },
        iteration: 0,
        covers: Coverage::WHOLE,
        settled_below: 0,
        kvs: KvPairs::new(vec![key], vec![5], 1).unwrap(),
    });
    primary.on_message(1, Envelope::new(W[0], s1, 1, push), &mut po);
    let update = sends(&mut po)
        .into_iter()
        .find(|e| matches!(e.body, Message::Replicate { .. }))
        .unwrap();
    for (next, taken) in [
        (replicated(2, Some(3)), true),
        // A worker's death changes the members: what was sent before no longer holds.
        (
            {
                let mut c = replicated(2, None);
                c.workers.retain(|&w| w != W[2]);
                c
            },
            false,
        ),
    ] {
        let mut replica: Server<i64> = Server::new(ServerConfig::new(s2, COORD), Updater::Sum);
        let mut ro = Effects::new();
        replica.start_configured(0, replicated(1, None), &mut ro);
        replica.on_message(1, deliver_config(s2, &next), &mut ro);
        ro.clear();
        replica.on_message(2, update.clone(), &mut ro);
        let refused = ro.events.iter().any(|e| {
            matches!(
                e,
                Event::Refused {
                    reason: Refusal::StaleEpoch { .. },
                    ..
                }
            )
        });
        assert_eq!(refused, !taken, "{:?}", ro.events);
        assert_eq!(replica.value(key).is_some(), taken);
    }
}

/// Every worker reports iteration `iteration` and its speed from `speeds`, the server beats,
/// and a failure check runs.
fn check_speeds(
    c: &mut Coordinator,
    iteration: Iteration,
    speeds: [u32; 3],
    out: &mut Effects<i64>,
) {
    let ats = speeds.map(|speed| Position {
        iteration,
        covered: Coverage(0),
        speed,
    });
    check_at(c, ats, out);
}

fn held(c: &Coordinator) -> Vec<usize> {
    let config = c.config().unwrap();
    W.iter().map(|&w| config.shares_of(w).len()).collect()
}

#[test]
fn shares_move_from_a_slow_worker_to_fast_ones_one_a_check_until_each_holds_its_part() {
    let policy = StragglerPolicy::balanced(Balance::shares(4));
    let mut c = coordinator(Consistency::Sequential, policy);
    assert_eq!(held(&c), [4, 4, 4], "dealt in turn");
    assert_eq!(c.config().unwrap().shares_of(W[0]), [0, 3, 6, 9]);
    let mut out = Effects::new();
    let mut moves = Vec::new();
    for i in 0..20 {
        out.clear();
        let epoch = c.epoch();
        check_speeds(&mut c, i, [400, 400, 100], &mut out);
        let moved: Vec<_> = out
            .events
            .iter()
            .filter(|e| matches!(e, Event::Coordinator(CoordinatorEvent::ShareMoved { .. })))
            .cloned()
            .collect();
        assert!(moved.len() <= 1, "one share a check: {moved:?}");
        if let Some(m) = moved.first() {
            assert_eq!(c.epoch(), epoch + 1, "published");
            moves.push(m.clone());
        } else {
            assert_eq!(c.epoch(), epoch, "nothing to publish");
        }
    }
    // Of 12 shares, 400 / 900 is 5.3 each for the fast and 1.3 for the slow: a step of the
    // slowest takes 6 / 400 where it took 4 / 100.
    assert_eq!(held(&c), [6, 5, 1]);
    assert_eq!(moves.len(), 3);
    assert!(
        moves
            .iter()
            .all(|m| matches!(m, Event::Coordinator(CoordinatorEvent::ShareMoved { from, .. }) if *from == W[2]))
    );
    // The highest share goes first, so that the worker leading the job stays.
    assert_eq!(
        moves[0],
        Event::Coordinator(CoordinatorEvent::ShareMoved {
            share: 11,
            from: W[2],
            to: W[0]
        })
    );
    // Every share is held by exactly one live worker, and each move says where the worker it
    // came from was, so that it finishes the round it was in.
    let config = c.config().unwrap();
    assert_eq!(
        config.pace.moved(11),
        Some(&ShareMove {
            share: 11,
            from: W[2],
            at: 0
        })
    );
    assert_eq!(config.pace.moves.len(), 3);
    assert_eq!(config.shares_in_round(W[2], 0, 1, 1), [2, 5, 8, 11]);
    assert_eq!(config.shares_in_round(W[2], 0, 1, 4), [2]);
    assert_eq!(config.shares.len(), 12);
    assert!(config.shares.iter().all(|s| W.contains(s)));
}

#[test]
fn shares_stay_within_the_bounds_and_do_not_follow_speeds_that_wobble() {
    let mut balance = Balance::shares(4);
    balance.fewest = 3;
    balance.most = 5;
    let mut c = coordinator(Consistency::Sequential, StragglerPolicy::balanced(balance));
    let mut out = Effects::new();
    for i in 0..20 {
        check_speeds(&mut c, i, [400, 400, 100], &mut out);
    }
    assert_eq!(held(&c), [5, 4, 3], "no fewer than 3, no more than 5");
    // Speeds within a share's worth of each other move nothing, back or forth.
    let mut c = coordinator(
        Consistency::Sequential,
        StragglerPolicy::balanced(Balance::shares(4)),
    );
    out.clear();
    for i in 0..20 {
        let wobble = if i % 2 == 0 {
            [420, 380, 400]
        } else {
            [380, 420, 400]
        };
        check_speeds(&mut c, i, wobble, &mut out);
    }
    assert!(
        !out.events
            .iter()
            .any(|e| matches!(e, Event::Coordinator(CoordinatorEvent::ShareMoved { .. }))),
        "{:?}",
        out.events
    );
    assert_eq!(c.epoch(), 1);
}

#[test]
fn no_share_moves_until_every_worker_said_its_speed() {
    let mut c = coordinator(
        Consistency::BoundedDelay(2),
        StragglerPolicy::balanced(Balance::shares(2)),
    );
    let mut out = Effects::new();
    check_speeds(&mut c, 3, [400, 400, 0], &mut out);
    assert_eq!(c.epoch(), 1);
    check_speeds(&mut c, 4, [400, 400, 50], &mut out);
    assert_eq!(c.epoch(), 2);
    assert_eq!(held(&c), [3, 2, 1]);
}

#[test]
fn a_worker_says_its_speed_with_its_heartbeat_and_learns_the_shares_moved_to_it() {
    let mut job = JobSpec::new(1, 2);
    job.stragglers = StragglerPolicy::balanced(Balance::shares(3));
    assert_eq!(job.share_count(), 6);
    let mut w: Worker<i64> = Worker::new(job.worker_config(NodeId(2)));
    let mut out = Effects::new();
    w.report_speed(1234);
    w.start(0, &mut out);
    out.clear();
    w.on_timer(1, TimerId::Heartbeat, &mut out);
    let at = out
        .sends
        .iter()
        .find_map(|e| match e.body {
            Message::Heartbeat { at, .. } => at,
            _ => None,
        })
        .unwrap();
    assert_eq!(at.speed, 1234);
    // A configuration that moved a share is no change of members for anybody.
    let mut first = config(1, &[1], &[NodeId(2), NodeId(3)], Consistency::Sequential);
    first.shares = ClusterConfig::deal(&first.workers, 3);
    let mut moved = first.clone();
    moved.epoch = 2;
    moved.shares[5] = NodeId(2);
    assert!(first.differs_only_in_pace(&moved));
    assert_eq!(moved.shares_of(NodeId(2)), [0, 2, 4, 5]);
    let mut gone = moved.clone();
    gone.workers.retain(|&n| n != NodeId(3));
    assert!(!moved.differs_only_in_pace(&gone));
}

#[test]
fn a_job_refuses_shares_sized_by_speed_it_cannot_size() {
    let mut job = JobSpec::new(1, 2);
    let mut policy = StragglerPolicy::default();
    policy.balance = Some(Balance::shares(2));
    job.stragglers = policy;
    assert!(matches!(
        job.validate::<f32>(),
        Err(JobError::Stragglers(_))
    ));
    for (per_worker, fewest, most) in [(2, 0, 4), (2, 3, 4), (4, 1, 3)] {
        job.stragglers = StragglerPolicy::balanced(Balance {
            per_worker,
            fewest,
            most,
        });
        assert!(
            matches!(job.validate::<f32>(), Err(JobError::Stragglers(_))),
            "{per_worker} {fewest} {most}"
        );
    }
    job.stragglers = StragglerPolicy::balanced(Balance::shares(2));
    assert!(job.validate::<f32>().is_ok());
}
