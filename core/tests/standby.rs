//! Standby coordinators and terms (ARCHITECTURE.md §11), on whole clusters of drivers exchanging
//! frames on a queue with virtual time: a standby takes over from a crashed coordinator, one
//! cut off from the active coordinator but not from the members cannot, a silent standby is
//! dropped, a coordinator taken over from is refused and becomes the standby, and one cut off
//! from the members declares none dead for the silence that was its own; a configuration of an
//! older term is refused by servers, workers and coordinators alike.

use pserver_core::events::{CoordinatorEvent, WorkerEvent};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use pserver_core::node::*;
use pserver_core::ring::RingConfig;
use pserver_core::wire::ClusterConfig;
use pserver_core::*;

const ACTIVE: NodeId = NodeId(0);
const STANDBY: NodeId = NodeId(9);
const SERVERS: [NodeId; 2] = [NodeId(1), NodeId(2)];
const WORKERS: [NodeId; 2] = [NodeId(3), NodeId(4)];
const SECOND: Time = 1_000_000_000;

struct Cluster {
    now: Time,
    nodes: BTreeMap<NodeId, Driver<i64>>,
    down: BTreeSet<NodeId>,
    cut: BTreeSet<(NodeId, NodeId)>,
    queue: VecDeque<(NodeId, NodeId, Bytes)>,
    events: BTreeMap<NodeId, Vec<Event<i64>>>,
}

/// Coordinator `id` of the job, with `peer` as the other coordinator.
fn coordinator(id: NodeId, peer: NodeId) -> CoordinatorConfig {
    let mut cfg = CoordinatorConfig::new(id, SERVERS.len(), WORKERS.len());
    cfg.ring = RingConfig {
        vnodes: 4,
        replicas: 1,
        seed: 3,
        ..RingConfig::default()
    };
    cfg.consistency = Consistency::Eventual;
    cfg.peers = Standbys::new(&[peer]).unwrap();
    cfg
}

impl Cluster {
    /// Two coordinators (the first active), two servers with one replica, two workers; every
    /// node registers, and the job starts once all have.
    fn new() -> Self {
        let standbys = Standbys::new(&[STANDBY]).unwrap();
        let mut nodes = BTreeMap::new();
        let active = Coordinator::new(coordinator(ACTIVE, STANDBY)).unwrap();
        nodes.insert(ACTIVE, Driver::new(active));
        let standby = Coordinator::standby(coordinator(STANDBY, ACTIVE)).unwrap();
        nodes.insert(STANDBY, Driver::new(standby));
        for s in SERVERS {
            let mut cfg = ServerConfig::new(s, ACTIVE);
            cfg.standbys = standbys;
            nodes.insert(s, Driver::new(Server::new(cfg, Updater::Sum)));
        }
        for w in WORKERS {
            let mut cfg = WorkerConfig::new(w, ACTIVE);
            cfg.standbys = standbys;
            nodes.insert(w, Driver::new(Worker::new(cfg)));
        }
        for d in nodes.values_mut() {
            d.start(0);
        }
        let mut c = Cluster {
            now: 0,
            nodes,
            down: BTreeSet::new(),
            cut: BTreeSet::new(),
            queue: VecDeque::new(),
            events: BTreeMap::new(),
        };
        c.collect();
        c
    }

    fn driver(&mut self, id: NodeId) -> &mut Driver<i64> {
        self.nodes.get_mut(&id).unwrap()
    }

    fn coordinator(&self, id: NodeId) -> &Coordinator {
        self.nodes[&id].node().as_coordinator().unwrap()
    }

    fn members() -> impl Iterator<Item = NodeId> {
        SERVERS.into_iter().chain(WORKERS)
    }

    /// The configuration `node` holds.
    fn held(&self, node: NodeId) -> Option<&ClusterConfig> {
        self.nodes[&node].node().config()
    }

    fn collect(&mut self) {
        for (&id, d) in &mut self.nodes {
            let up = !self.down.contains(&id);
            while let Some(t) = d.poll_transmit() {
                if up && !self.cut.contains(&(id, t.to)) {
                    self.queue.push_back((id, t.to, t.frame));
                }
            }
            let events = self.events.entry(id).or_default();
            events.extend(std::iter::from_fn(|| d.poll_event()));
        }
    }

    fn run_until(&mut self, limit: Time, mut done: impl FnMut(&Cluster) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if let Some((from, to, frame)) = self.queue.pop_front() {
                if !self.down.contains(&to) {
                    let now = self.now;
                    if let Some(d) = self.nodes.get_mut(&to) {
                        d.handle_frame(now, from, &frame);
                    }
                }
            } else {
                let next = self
                    .nodes
                    .iter()
                    .filter(|(id, _)| !self.down.contains(id))
                    .filter_map(|(&id, d)| Some((d.poll_timeout()?, id)))
                    .min();
                match next {
                    Some((at, id)) if at <= end => {
                        self.now = self.now.max(at);
                        let now = self.now;
                        self.driver(id).handle_timeout(now);
                    }
                    _ => return false,
                }
            }
            self.collect();
        }
    }

    fn run_for(&mut self, time: Time) {
        self.run_until(time, |_| false);
    }

    /// Every member holds a configuration `check` accepts.
    fn all_hold(&self, check: impl Fn(&ClusterConfig) -> bool) -> bool {
        Cluster::members().all(|m| self.held(m).is_some_and(&check))
    }

    fn cut_both_ways(&mut self, a: NodeId, b: NodeId) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
    }

    fn crash(&mut self, node: NodeId) {
        self.down.insert(node);
        self.queue
            .retain(|&(from, to, _)| from != node && to != node);
    }

    fn said(&self, node: NodeId, what: impl Fn(&Event<i64>) -> bool) -> bool {
        self.events.get(&node).is_some_and(|e| e.iter().any(what))
    }

    /// Starts the job and waits until the standby is listed in the configuration members hold.
    fn running_with_standby() -> Cluster {
        let mut c = Cluster::new();
        let listed = c.run_until(20 * SECOND, |c| {
            c.all_hold(|config| config.standbys == [STANDBY])
        });
        assert!(listed, "the standby is taken and every member hears of it");
        c
    }

    /// Pushes `value` to `keys` from the first worker and waits for its acknowledgement.
    fn push(&mut self, keys: &[Key], value: i64) {
        let kvs = KvPairs::new(keys.to_vec(), vec![value; keys.len()], 1).unwrap();
        let now = self.now;
        let id = self
            .driver(WORKERS[0])
            .worker()
            .unwrap()
            .push(now, kvs)
            .unwrap();
        self.collect();
        let worker = WORKERS[0];
        let done = self.run_until(30 * SECOND, |c| {
            c.said(
                worker,
                |e| matches!(e, Event::Worker(WorkerEvent::PushDurable(r)) if *r == id),
            )
        });
        assert!(done, "push {id} completes");
    }

    /// Pulls `keys` from the second worker.
    fn pull(&mut self, keys: &[Key]) -> Vec<i64> {
        let now = self.now;
        let worker = WORKERS[1];
        let list = KeyList::new(keys.to_vec()).unwrap();
        let id = self
            .driver(worker)
            .worker()
            .unwrap()
            .pull(now, KeySelection::Keys(list))
            .unwrap();
        self.collect();
        let mut got = None;
        let done = self.run_until(30 * SECOND, |c| {
            got = c.events.get(&worker).and_then(|events| {
                events.iter().find_map(|e| match e {
                    Event::Worker(WorkerEvent::PullDone(r, kvs)) if *r == id => {
                        Some(kvs.values().to_vec())
                    }
                    _ => None,
                })
            });
            got.is_some()
        });
        assert!(done, "pull {id} completes");
        got.unwrap_or_default()
    }
}

fn keys() -> Vec<Key> {
    (0..64).map(|i| i * (u64::MAX / 64)).collect()
}

#[test]
fn a_standby_takes_over_from_a_crashed_coordinator_and_handles_a_server_crash_after() {
    let mut c = Cluster::running_with_standby();
    c.push(&keys(), 5);
    c.crash(ACTIVE);
    let crashed_at = c.now;
    let took_over = c.run_until(30 * SECOND, |c| {
        c.all_hold(|config| config.coordinator == STANDBY && config.term == 1)
    });
    assert!(took_over, "every member follows the standby under term 1");
    let first = first_epoch_of_term(1);
    assert!(c.said(STANDBY, |e| matches!(
        e,
        Event::Coordinator(CoordinatorEvent::TookOver { from: ACTIVE, term: 1, epoch }) if *epoch == first
    )));
    let timeout = Timing::default().heartbeat_timeout;
    assert!(
        c.now - crashed_at <= 2 * timeout,
        "took over {} ms after the crash, more than twice the heartbeat timeout",
        (c.now - crashed_at) / 1_000_000
    );
    assert!(c.coordinator(STANDBY).is_active());
    assert!(c.all_hold(|config| !config.standbys.contains(&ACTIVE)));

    // Failure handling goes on under the new coordinator: a server crash moves its ranges to
    // the replica, which holds every acknowledged push.
    c.crash(SERVERS[0]);
    let removed = c.run_until(30 * SECOND, |c| {
        [SERVERS[1], WORKERS[0], WORKERS[1]].into_iter().all(|m| {
            c.held(m)
                .is_some_and(|config| config.servers == [SERVERS[1]])
        })
    });
    assert!(removed, "the crashed server is taken off the ring");
    assert!(c.said(STANDBY, |e| *e == Event::NodeDead(SERVERS[0])));
    assert_eq!(c.pull(&keys()), vec![5; keys().len()]);
    c.push(&keys(), 2);
    assert_eq!(c.pull(&keys()), vec![7; keys().len()]);
}

#[test]
fn a_standby_that_lost_contact_with_the_active_one_but_not_with_the_nodes_cannot_publish() {
    let mut c = Cluster::running_with_standby();
    c.cut_both_ways(ACTIVE, STANDBY);
    c.run_for(20 * SECOND);
    assert!(
        !c.said(STANDBY, |e| matches!(
            e,
            Event::Coordinator(CoordinatorEvent::TookOver { .. })
        )),
        "no takeover while the members hear the active coordinator"
    );
    assert!(c.all_hold(|config| config.coordinator == ACTIVE && config.term == 0));
    let refused: u64 = Cluster::members()
        .map(|m| c.nodes[&m].refusals().term_not_granted)
        .sum();
    assert!(refused > 0, "the standby asked the members, who refused");
    assert!(c.said(ACTIVE, |e| *e
        == Event::Coordinator(CoordinatorEvent::StandbyDropped(STANDBY))));
    assert!(
        c.all_hold(|config| config.standbys.is_empty()),
        "the active coordinator publishes without the standby"
    );

    // And goes on publishing: a server crash is handled.
    c.crash(SERVERS[1]);
    let removed = c.run_until(30 * SECOND, |c| {
        [SERVERS[0], WORKERS[0], WORKERS[1]].into_iter().all(|m| {
            c.held(m)
                .is_some_and(|config| config.servers == [SERVERS[0]])
        })
    });
    assert!(
        removed,
        "the active coordinator handles a crash after dropping the standby"
    );
    assert!(!c.coordinator(STANDBY).is_active());
}

#[test]
fn a_coordinator_taken_over_from_is_refused_by_every_member_and_becomes_the_standby() {
    let mut c = Cluster::running_with_standby();
    // The active coordinator is cut off from everybody, the standby takes over.
    let cut_at = c.held(WORKERS[0]).unwrap().epoch;
    for node in [STANDBY, SERVERS[0], SERVERS[1], WORKERS[0], WORKERS[1]] {
        c.cut_both_ways(ACTIVE, node);
    }
    let took_over = c.run_until(30 * SECOND, |c| {
        c.all_hold(|config| config.coordinator == STANDBY)
    });
    assert!(took_over);
    // Meanwhile the old one, hearing no member, declared none dead (it is the one cut off),
    // but dropped its silent standby: a configuration of term 0 that every member must
    // refuse once the links are back.
    c.run_for(10 * SECOND);
    assert!(!c.said(ACTIVE, |e| matches!(e, Event::NodeDead(_))));
    assert!(c.said(ACTIVE, |e| *e
        == Event::Coordinator(CoordinatorEvent::StandbyDropped(STANDBY))));
    let old = c.coordinator(ACTIVE).config().unwrap().clone();
    assert_eq!((old.term, old.coordinator), (0, ACTIVE));
    assert!(old.epoch > cut_at && old.standbys.is_empty());
    for m in Cluster::members() {
        let env = wire::Envelope::new(ACTIVE, m, old.epoch, wire::Message::Config(old.clone()));
        let now = c.now;
        c.driver(m).handle_message(now, env);
    }
    c.cut.clear();
    let back = c.run_until(30 * SECOND, |c| {
        c.all_hold(|config| config.standbys == [ACTIVE] && config.coordinator == STANDBY)
    });
    assert!(
        back,
        "the old coordinator steps down and is taken as the standby"
    );
    assert!(c.said(ACTIVE, |e| *e
        == Event::Coordinator(CoordinatorEvent::SteppedDown { term: 1 })));
    assert!(!c.coordinator(ACTIVE).is_active());
    for m in Cluster::members() {
        assert!(
            c.nodes[&m].refusals().stale_term > 0,
            "{m} refused the old coordinator's configurations"
        );
        assert!(c.held(m).is_some_and(|config| config.term == 1), "{m}");
    }
    // The job lost nobody to the old coordinator's view.
    let config = c.held(WORKERS[0]).unwrap().clone();
    assert_eq!(config.servers, SERVERS);
    assert_eq!(config.workers, WORKERS);
}

#[test]
fn a_coordinator_cut_off_from_the_members_gives_each_a_whole_timeout_once_it_hears_them_again() {
    let mut c = Cluster::running_with_standby();
    // Cut off from every member, but not from its standby, which therefore does not take over:
    // the silence the active coordinator counts is its own.
    for m in Cluster::members() {
        c.cut_both_ways(ACTIVE, m);
    }
    c.run_for(5 * SECOND);
    // Back in touch with all but one worker, whose link stays down for less than a timeout.
    let late = WORKERS[1];
    for m in Cluster::members().filter(|&m| m != late) {
        c.cut.remove(&(ACTIVE, m));
        c.cut.remove(&(m, ACTIVE));
    }
    c.run_for(Timing::default().heartbeat_timeout / 2);
    c.cut.clear();
    c.run_for(10 * SECOND);
    assert!(
        !c.said(ACTIVE, |e| matches!(e, Event::NodeDead(_))),
        "a member silent only while the coordinator was cut off is declared dead"
    );
    assert!(!c.said(STANDBY, |e| matches!(
        e,
        Event::Coordinator(CoordinatorEvent::TookOver { .. })
    )));
    assert!(c.all_hold(|config| config.workers == WORKERS && config.servers == SERVERS));
}

#[test]
fn a_configuration_from_an_older_term_is_refused_by_every_node_kind() {
    let mut c = Cluster::running_with_standby();
    let old = c.held(WORKERS[0]).unwrap().clone();
    assert_eq!(old.term, 0);
    c.crash(ACTIVE);
    let took_over = c.run_until(30 * SECOND, |c| {
        c.all_hold(|config| config.coordinator == STANDBY && config.term == 1)
    });
    assert!(took_over);
    let now = c.now;
    // Servers and workers: the old coordinator's configuration, resent late.
    for m in Cluster::members() {
        let before = c.held(m).unwrap().clone();
        let env = wire::Envelope::new(ACTIVE, m, old.epoch, wire::Message::Config(old.clone()));
        c.driver(m).handle_message(now, env);
        assert_eq!(c.nodes[&m].refusals().stale_term, 1, "{m}");
        assert_eq!(c.held(m), Some(&before), "{m} kept the newer term's");
    }
    // The coordinator that took over: the old one's state, as a standby would be sent it.
    let state = wire::StandbyState {
        config: old.clone(),
        published: old.epoch,
        members: Vec::new(),
        incarnations: Vec::new(),
        dead: Vec::new(),
    };
    let env = wire::Envelope::new(
        ACTIVE,
        STANDBY,
        old.epoch,
        wire::Message::Standby(Box::new(state)),
    );
    c.driver(STANDBY).handle_message(now, env);
    assert_eq!(c.nodes[&STANDBY].refusals().stale_term, 1);
    assert!(c.coordinator(STANDBY).is_active(), "it did not step down");
    assert_eq!(c.coordinator(STANDBY).term(), 1);
}

#[test]
fn a_coordinator_restarted_at_once_does_not_hold_up_the_takeover_and_becomes_the_standby() {
    let mut c = Cluster::running_with_standby();
    // Its process restarts before anybody noticed: a fresh coordinator, as `pserver
    // coordinator --id 0` starts, that knows nothing of the job.
    c.crash(ACTIVE);
    c.down.remove(&ACTIVE);
    let mut fresh = Driver::new(Coordinator::new(coordinator(ACTIVE, STANDBY)).unwrap());
    fresh.start(c.now);
    c.nodes.insert(ACTIVE, fresh);
    let took_over = c.run_until(30 * SECOND, |c| {
        c.all_hold(|config| config.coordinator == STANDBY && config.term == 1)
    });
    assert!(
        took_over,
        "the members, unanswered by a coordinator that does not know their job, grant the standby a term"
    );
    let back = c.run_until(30 * SECOND, |c| {
        c.all_hold(|config| config.standbys == [ACTIVE])
    });
    assert!(back, "the restarted coordinator is taken as the standby");
    assert!(!c.coordinator(ACTIVE).is_active());
    assert!(c.all_hold(|config| config.workers == WORKERS && config.servers == SERVERS));
}

#[test]
fn a_coordinator_with_a_standby_ends_the_job_when_a_server_stops_before_its_last_word_arrives() {
    let mut c = Cluster::running_with_standby();
    let (s1, s2) = (SERVERS[0], SERVERS[1]);
    // The second server hears that the job finished and stops, but what it said last never
    // reaches the active coordinator.
    c.cut.insert((s2, ACTIVE));
    for w in WORKERS {
        c.driver(w).leave().unwrap();
    }
    c.collect();
    let heard = c.run_until(10 * SECOND, |c| {
        SERVERS
            .iter()
            .all(|&s| c.said(s, |e| matches!(e, Event::JobFinished { .. })))
    });
    assert!(heard, "every server hears that the job finished");
    // Every other node ends with the job: nobody is left for the active coordinator to hear,
    // which is no sign of its being cut off.
    for node in [s1, s2, STANDBY].into_iter().chain(WORKERS) {
        c.crash(node);
    }
    let ended = c.run_until(60 * SECOND, |c| {
        c.said(ACTIVE, |e| matches!(e, Event::JobFinished { .. }))
    });
    assert!(ended, "the coordinator waits for a server that stopped");
    assert!(!c.said(ACTIVE, |e| matches!(e, Event::NodeDead(_))));
}
