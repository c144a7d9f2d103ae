//! Replication, failure detection and fail-over, on whole clusters of drivers exchanging frames
//! on a queue with virtual time: durability, exactly-once across fail-over, replica
//! convergence and single ownership.

use pserver_core::events::{CoordinatorEvent, Refusal, WorkerEvent};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use pserver_core::node::*;
use pserver_core::ring::*;
use pserver_core::wire::*;
use pserver_core::wire::{ClusterConfig, Codec, DEFAULT_MAX_FRAME};
use pserver_core::*;

const COORD: NodeId = NodeId(0);
const MS: Time = 1_000_000;

/// A deliberately broken protocol to run, where the build has them.
#[cfg(feature = "mutations")]
use pserver_core::mutation::Mutation;

#[cfg(feature = "mutations")]
type Broken = Option<Mutation>;
#[cfg(not(feature = "mutations"))]
type Broken = Option<core::convert::Infallible>;

fn break_node(d: &mut Driver<i64>, mutation: Broken) {
    #[cfg(feature = "mutations")]
    d.set_mutation(mutation);
    #[cfg(not(feature = "mutations"))]
    let _ = (d, mutation);
}

/// A cluster on one FIFO queue. Crashed nodes receive nothing, send nothing and fire no timers.
/// Every `drop_every`-th frame is lost, every `dup_every`-th delivered twice.
struct Cluster {
    now: Time,
    nodes: BTreeMap<NodeId, Driver<i64>>,
    down: BTreeSet<NodeId>,
    /// Links that lose everything sent on them: (from, to).
    cut: BTreeSet<(NodeId, NodeId)>,
    queue: VecDeque<(NodeId, NodeId, Bytes)>,
    sent: u64,
    /// Whole copies of shards sent.
    transfers: u64,
    /// Values sent in pushes, and in replication steps.
    pushed_values: usize,
    replicated_values: usize,
    /// Frames sent of pushes, of replication batches and of their acknowledgements.
    push_frames: u64,
    replicate_frames: u64,
    replicate_ack_frames: u64,
    /// The largest frame any node sent.
    largest_frame: usize,
    drop_every: u64,
    dup_every: u64,
    /// Copies of the range holding this key sent to this server are lost.
    lost_copies: Option<(NodeId, Key)>,
    events: BTreeMap<NodeId, Vec<Event<i64>>>,
}

impl Cluster {
    /// `servers` servers (ids 1..), `workers` workers after them, `replicas` per range,
    /// everybody starting with epoch 1 in force.
    fn new(servers: u32, workers: u32, replicas: u32, consistency: Consistency) -> Self {
        Cluster::with_frames(servers, workers, replicas, consistency, DEFAULT_MAX_FRAME)
    }

    /// As `new`, with frames of at most `frame` bytes, and slices and range answers cut to
    /// fit them.
    fn with_frames(
        servers: u32,
        workers: u32,
        replicas: u32,
        consistency: Consistency,
        frame: usize,
    ) -> Self {
        Cluster::build(servers, workers, replicas, consistency, frame, 0, 4)
    }

    /// As `new`, with `vnodes` points on the ring per server.
    fn with_vnodes(
        servers: u32,
        workers: u32,
        replicas: u32,
        consistency: Consistency,
        vnodes: u32,
    ) -> Self {
        let frame = DEFAULT_MAX_FRAME;
        Cluster::build(servers, workers, replicas, consistency, frame, 0, vnodes)
    }

    /// As `new`, with a coordinator that keeps at least `min_replicas` replicas.
    fn keeping(servers: u32, workers: u32, replicas: u32, min_replicas: u32) -> Self {
        let frame = DEFAULT_MAX_FRAME;
        let eventual = Consistency::Eventual;
        Cluster::build(servers, workers, replicas, eventual, frame, min_replicas, 4)
    }

    fn build(
        servers: u32,
        workers: u32,
        replicas: u32,
        consistency: Consistency,
        frame: usize,
        min_replicas: u32,
        vnodes: u32,
    ) -> Self {
        let codec = Codec::new(frame);
        let server_ids: Vec<NodeId> = (1..=servers).map(NodeId).collect();
        let worker_ids: Vec<NodeId> = (servers + 1..=servers + workers).map(NodeId).collect();
        let mut job = CoordinatorConfig::new(COORD, 0, 0);
        job.ring = RingConfig {
            vnodes,
            replicas,
            seed: 3,
            ..RingConfig::default()
        };
        job.consistency = consistency;
        job.min_replicas = min_replicas;
        let coordinator = Coordinator::bootstrapped(job, &server_ids, &worker_ids).unwrap();
        let config = coordinator.config().unwrap().clone();
        let mut nodes = BTreeMap::new();
        let mut c = Driver::with_codec(coordinator, codec);
        c.start(0);
        nodes.insert(COORD, c);
        for &s in &server_ids {
            // The driver fits replies, copies, batches and slices to the codec's frames.
            let sc = ServerConfig::new(s, COORD);
            let mut d = Driver::with_codec(Server::new(sc, Updater::Sum), codec);
            d.start_configured(0, config.clone());
            nodes.insert(s, d);
        }
        for &w in &worker_ids {
            let wc = WorkerConfig::new(w, COORD);
            let mut d = Driver::with_codec(Worker::new(wc), codec);
            d.start_configured(0, config.clone());
            nodes.insert(w, d);
        }
        let mut cluster = Cluster {
            now: 0,
            nodes,
            down: BTreeSet::new(),
            cut: BTreeSet::new(),
            queue: VecDeque::new(),
            sent: 0,
            transfers: 0,
            pushed_values: 0,
            replicated_values: 0,
            push_frames: 0,
            replicate_frames: 0,
            replicate_ack_frames: 0,
            largest_frame: 0,
            drop_every: 0,
            dup_every: 0,
            lost_copies: None,
            events: BTreeMap::new(),
        };
        cluster.collect();
        cluster
    }

    fn driver(&mut self, id: NodeId) -> &mut Driver<i64> {
        self.nodes.get_mut(&id).unwrap()
    }

    fn server(&self, id: NodeId) -> &Server<i64> {
        self.nodes[&id].node().as_server().unwrap()
    }

    fn coordinator(&self) -> &Coordinator {
        self.nodes[&COORD].node().as_coordinator().unwrap()
    }

    /// Moves what every live node queued onto the network, and its events into `events`.
    fn collect(&mut self) {
        for (&id, d) in &mut self.nodes {
            let up = !self.down.contains(&id);
            while let Some(t) = d.poll_transmit() {
                if !up || self.cut.contains(&(id, t.to)) {
                    continue;
                }
                self.sent += 1;
                self.largest_frame = self.largest_frame.max(t.frame.len());
                let body = Codec::new(usize::MAX)
                    .decode::<i64>(&t.frame)
                    .map(|e| e.body);
                match &body {
                    Ok(Message::Push(push)) => {
                        self.push_frames += 1;
                        self.pushed_values += push.kvs.values().len();
                    }
                    Ok(Message::ReplicateAck { .. }) => self.replicate_ack_frames += 1,
                    Ok(Message::Replicate { updates }) => {
                        self.replicate_frames += 1;
                        for u in updates {
                            if let ShardUpdate::Apply(kvs) | ShardUpdate::Buffer { kvs, .. } =
                                &u.update
                            {
                                self.replicated_values += kvs.values().len();
                            }
                        }
                    }
                    _ => {}
                }
                if let Ok(Message::Transfer(copy)) = body {
                    self.transfers += 1;
                    if self
                        .lost_copies
                        .is_some_and(|(to, k)| to == t.to && copy.range.contains(k))
                    {
                        continue;
                    }
                }
                if self.drop_every > 0 && self.sent % self.drop_every == 0 {
                    continue;
                }
                if self.dup_every > 0 && self.sent % self.dup_every == 0 {
                    self.queue.push_back((id, t.to, t.frame.clone()));
                }
                self.queue.push_back((id, t.to, t.frame));
            }
            let events = self.events.entry(id).or_default();
            events.extend(std::iter::from_fn(|| d.poll_event()));
        }
    }

    /// Delivers frames and fires timers until `done` holds (true) or `limit` of virtual time
    /// has passed (false).
    fn run_until(&mut self, limit: Time, mut done: impl FnMut(&Cluster) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if let Some((from, to, frame)) = self.queue.pop_front() {
                if std::env::var("TRACE").is_ok() {
                    let env = Codec::default().decode::<i64>(&frame).unwrap();
                    if !matches!(env.body, Message::Heartbeat { .. }) {
                        eprintln!("{from}->{to} e{} {:?}", env.epoch, env.body);
                    }
                }
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

    fn push(&mut self, worker: NodeId, keys: &[Key], value: i64) -> RequestId {
        let kvs = KvPairs::new(keys.to_vec(), vec![value; keys.len()], 1).unwrap();
        let now = self.now;
        let id = self
            .driver(worker)
            .worker()
            .unwrap()
            .push(now, kvs)
            .unwrap();
        self.collect();
        id
    }

    /// Pushes of `worker` acknowledged by their servers and every replica.
    fn pushes_done(&self, worker: NodeId) -> usize {
        self.events.get(&worker).map_or(0, |e| {
            e.iter()
                .filter(|e| matches!(e, Event::Worker(WorkerEvent::PushDurable(_))))
                .count()
        })
    }

    fn config(&self) -> ClusterConfig {
        self.coordinator().config().unwrap().clone()
    }

    fn ring(&self) -> Ring {
        self.config().ring_in_force().unwrap()
    }

    /// The value of `key` on the node the coordinator's ring names primary.
    fn primary_value(&self, key: Key) -> i64 {
        let primary = self.ring().primary(key);
        self.server(primary).received_total(key)[0]
    }

    /// True when every key's primary holds `value` for it.
    fn all_hold(&self, keys: &[Key], value: i64) -> bool {
        keys.iter().all(|&k| self.primary_value(k) == value)
    }

    /// True when every server on the ring has every push it took in replicated.
    fn all_replicated(&self) -> bool {
        self.ring()
            .servers()
            .iter()
            .all(|&s| self.server(s).unreplicated_pushes() == 0)
    }

    /// True when every live server has adopted `epoch`.
    fn servers_at_epoch(&self, epoch: Epoch) -> bool {
        self.config()
            .servers
            .iter()
            .all(|&s| self.server(s).epoch() == epoch)
    }

    /// Keys spread over the whole key space.
    fn keys(n: u64) -> Vec<Key> {
        (0..n).map(|i| i * (MAX_KEY / n)).collect()
    }

    /// Starts a server with no state that registers with the coordinator: a new machine, or
    /// `id` restarted after losing everything.
    fn start_server(&mut self, id: NodeId) {
        self.down.remove(&id);
        let mut sc = ServerConfig::new(id, COORD);
        sc.incarnation = self.now;
        let mut d = Driver::new(Server::new(sc, Updater::Sum));
        d.start(self.now);
        self.nodes.insert(id, d);
        self.collect();
    }

    /// True when the coordinator runs its configuration (no change under way) with exactly
    /// `servers` on the ring, and every one of them adopted it.
    fn settled_on(&self, servers: &[u32]) -> bool {
        let c = self.config();
        self.coordinator().phase() == Phase::Running
            && c.servers == servers.iter().map(|&s| NodeId(s)).collect::<Vec<_>>()
            && self.servers_at_epoch(c.epoch)
    }

    fn crash(&mut self, node: NodeId) {
        self.down.insert(node);
        self.queue
            .retain(|(from, to, _)| *from != node && *to != node);
    }

    /// Every live server's shards: at most one primary per key, and the primary is the one
    /// the coordinator's ring names.
    fn assert_single_owner(&self, keys: &[Key]) {
        let ring = self.ring();
        for &k in keys {
            let primaries: Vec<NodeId> = ring
                .servers()
                .iter()
                .filter(|s| !self.down.contains(s))
                .filter(|&&s| {
                    self.server(s)
                        .shards()
                        .any(|(r, primary)| primary && r.contains(k))
                })
                .copied()
                .collect();
            assert_eq!(primaries, vec![ring.primary(k)], "primaries of key {k}");
        }
    }

    /// Every replica of `key` holds exactly what its primary holds.
    fn assert_converged(&self, keys: &[Key]) {
        let ring = self.ring();
        for &k in keys {
            let owners = ring.owners(k);
            let want = self.server(owners[0]).received_total(k);
            for &r in &owners[1..] {
                assert_eq!(
                    self.server(r).received_total(k),
                    want,
                    "replica {r} of key {k}"
                );
            }
        }
    }
}

#[test]
fn replica_convergence_every_replica_holds_what_its_primary_holds() {
    let mut c = Cluster::new(3, 2, 1, Consistency::Eventual);
    let keys = Cluster::keys(24);
    let (w1, w2) = (NodeId(4), NodeId(5));
    for i in 0..3 {
        c.push(w1, &keys, 1 + i);
        c.push(w2, &keys[5..], 10);
    }
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w1) == 3
        && c.pushes_done(w2) == 3));
    for &k in &keys {
        let extra = if k >= keys[5] { 30 } else { 0 };
        assert_eq!(c.primary_value(k), 6 + extra, "key {k}");
    }
    c.assert_converged(&keys);
    c.assert_single_owner(&keys);
    for s in 1..=3 {
        assert_eq!(c.server(NodeId(s)).unreplicated_pushes(), 0);
    }
}

#[test]
fn durability_an_acknowledged_push_survives_the_crash_of_its_primary() {
    for consistency in [Consistency::Eventual, Consistency::Sequential] {
        let mut c = Cluster::new(3, 1, 1, consistency);
        let keys = Cluster::keys(24);
        let w = NodeId(4);
        c.push(w, &keys, 5);
        assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
        let victim = c.ring().primary(keys[0]);
        c.crash(victim);
        assert!(
            c.run_until(60_000 * MS, |c| !c.config().servers.contains(&victim)),
            "the coordinator declares the silent server dead"
        );
        assert_eq!(c.config().epoch, 2);
        assert!(c.coordinator().dead().contains(&victim));
        // Every value is served again, and only by the new owners.
        assert!(c.run_until(10_000 * MS, |c| {
            c.servers_at_epoch(2) && c.all_hold(&keys, 5)
        }));
        c.assert_single_owner(&keys);
        // The refilled replicas get whole copies and converge, each copy sent about once.
        assert!(c.run_until(10_000 * MS, |c| {
            (1..=3)
                .map(NodeId)
                .filter(|s| *s != victim)
                .all(|s| c.server(s).unreplicated_pushes() == 0)
        }));
        let shards: usize = c
            .ring()
            .servers()
            .iter()
            .map(|&s| c.server(s).shards().count())
            .sum();
        assert!(
            c.transfers as usize <= shards,
            "{} copies for {shards} shards",
            c.transfers
        );
        c.push(w, &keys, 1);
        assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 2));
        if consistency == Consistency::Sequential {
            let now = c.now;
            c.driver(w).worker().unwrap().advance(now).unwrap();
            c.collect();
            assert!(c.run_until(10_000 * MS, |c| {
                keys.iter()
                    .all(|&k| c.server(c.ring().primary(k)).applied_below() >= 1)
            }));
        }
        for &k in &keys {
            assert_eq!(c.primary_value(k), 6, "key {k} under {consistency:?}");
        }
        c.assert_converged(&keys);
    }
}

#[test]
fn exactly_once_across_fail_over_on_a_lossy_duplicating_network() {
    for (drop_every, dup_every) in [(7, 5), (3, 4)] {
        let mut c = Cluster::new(4, 2, 1, Consistency::Eventual);
        c.drop_every = drop_every;
        c.dup_every = dup_every;
        let keys = Cluster::keys(40);
        let (w1, w2) = (NodeId(5), NodeId(6));
        for i in 0..4 {
            c.push(w1, &keys, 1);
            c.push(w2, &keys[i * 5..], 2);
        }
        // The crash comes while pushes are still on the network.
        c.run_until(3 * MS, |_| false);
        let victim = c.ring().primary(keys[7]);
        c.crash(victim);
        for _ in 0..4 {
            c.push(w1, &keys, 1);
        }
        assert!(
            c.run_until(120_000 * MS, |c| c.pushes_done(w1) == 8
                && c.pushes_done(w2) == 4),
            "every push completes across the fail-over"
        );
        assert!(!c.config().servers.contains(&victim));
        assert!(c.run_until(10_000 * MS, |c| c.servers_at_epoch(2)));
        for (j, &k) in keys.iter().enumerate() {
            let from_w2: i64 = (0..4).filter(|&i| j >= i * 5).map(|_| 2).sum();
            assert_eq!(
                c.primary_value(k),
                8 + from_w2,
                "key {k} (drop 1/{drop_every})"
            );
        }
        c.assert_single_owner(&keys);
        assert!(c.run_until(30_000 * MS, |c| { c.all_replicated() }));
        c.assert_converged(&keys);
    }
}

/// The smallest replicated cluster: two servers, one replica. Either may crash and restart,
/// in turn, without an acknowledged push lost: the one left holds every range alone, and the
/// one back copies them all before the ring holds a replica again.
#[test]
fn two_servers_with_one_replica_survive_each_crashing_and_restarting_in_turn() {
    for consistency in [Consistency::Eventual, Consistency::Sequential] {
        let mut c = Cluster::new(2, 1, 1, consistency);
        let keys = Cluster::keys(24);
        let w = NodeId(3);
        c.push(w, &keys, 5);
        assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
        for (round, victim) in [NodeId(2), NodeId(1), NodeId(2)].into_iter().enumerate() {
            // Five at first, then one more each round.
            let before = 5 + round as i64;
            let other = if victim == NodeId(1) { 2 } else { 1 };
            let changes_before = replicas_changes(&c);
            c.crash(victim);
            assert!(
                c.run_until(60_000 * MS, |c| c.settled_on(&[other])),
                "round {round}: the job goes on with server {other} alone ({consistency:?})"
            );
            assert_eq!(c.config().replicas_held(), 0);
            assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, before)));
            c.push(w, &keys, 1);
            let pushed = before + 1;
            assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == round + 2));
            assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, pushed)));
            c.start_server(victim);
            assert!(
                c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2])),
                "round {round}: the restarted server rejoins"
            );
            assert_eq!(c.config().replicas_held(), 1);
            assert_eq!(
                replicas_changes(&c)[changes_before.len()..],
                [(0, 1), (1, 1)],
                "said at each change, down and back"
            );
            assert!(c.run_until(10_000 * MS, |c| {
                c.all_hold(&keys, pushed)
                    && [1, 2]
                        .map(NodeId)
                        .iter()
                        .all(|&s| c.server(s).unreplicated_pushes() == 0)
            }));
            c.assert_single_owner(&keys);
            c.assert_converged(&keys);
        }
    }
}

/// One of two servers restarts before the coordinator missed it (a `kill -9` and a restart
/// within the heartbeat timeout): it is taken off the ring, the other serves alone while the
/// new process copies every range, and the ring holds a replica again.
#[test]
fn one_of_two_servers_restarted_before_it_is_missed_rejoins_with_every_range() {
    let mut c = Cluster::new(2, 1, 1, Consistency::Eventual);
    let keys = Cluster::keys(24);
    let w = NodeId(3);
    c.push(w, &keys, 3);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    c.crash(NodeId(1));
    c.start_server(NodeId(1));
    assert!(c.run_until(1_000 * MS, |c| c.config().joining == vec![NodeId(1)]));
    assert_eq!(c.config().servers, vec![NodeId(2)]);
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2])));
    assert_eq!(replicas_changes(&c), [(0, 1), (1, 1)]);
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 3)));
    // The server that restarted holds every range too: the one that stayed may go.
    c.crash(NodeId(2));
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1])));
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 3)));
    c.assert_single_owner(&keys);
}

/// Every `(held, asked)` the coordinator said with `CoordinatorEvent::ReplicasChanged`, in order.
fn replicas_changes(c: &Cluster) -> Vec<(u32, u32)> {
    c.events[&COORD]
        .iter()
        .filter_map(|e| match e {
            Event::Coordinator(CoordinatorEvent::ReplicasChanged { held, asked }) => {
                Some((*held, *asked))
            }
            _ => None,
        })
        .collect()
}

/// Three servers, two replicas: every server holds every range, so two may die and the last
/// serves the job alone, with all it was acknowledged.
#[test]
fn three_servers_with_two_replicas_lose_two_and_go_on_with_everything() {
    let mut c = Cluster::new(3, 1, 2, Consistency::Eventual);
    let keys = Cluster::keys(24);
    let w = NodeId(4);
    c.push(w, &keys, 7);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    c.crash(NodeId(1));
    c.crash(NodeId(3));
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[2])));
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 7)));
    assert_eq!(replicas_changes(&c).last(), Some(&(0, 2)));
    c.push(w, &keys, 1);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 2));
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 8)));
    assert!(
        c.events[&COORD]
            .iter()
            .all(|e| !matches!(e, Event::RangeLost(_)))
    );
}

/// The coordinator keeps a silent server whose loss would leave too few replicas, and says
/// so; every other member hears it from the coordinator's answers to its heartbeats. Each
/// says it once for the whole silence, not on every failure check or heartbeat.
#[test]
fn a_server_whose_loss_would_leave_fewer_than_min_replicas_is_kept_and_reported() {
    let mut c = Cluster::keeping(2, 1, 1, 1);
    c.crash(NodeId(2));
    c.run_until(10_000 * MS, |_| false);
    assert_eq!(c.config().servers, vec![NodeId(1), NodeId(2)]);
    assert!(replicas_changes(&c).is_empty());
    for node in [COORD, NodeId(1), NodeId(3)] {
        let said = c.events[&node]
            .iter()
            .filter(|e| **e == Event::RingDegraded(NodeId(2)))
            .count();
        assert_eq!(said, 1, "{node}: {:?}", c.events[&node]);
    }
}

/// A primary cut off from its replica holds a push without acknowledging it; once the primary
/// dies, the worker's resend reaches the promoted replica and is applied there exactly once.
/// With `ack-before-replicate` the push is acknowledged at once and dies with the primary.
fn cut_off_primary_then_crash(mutation: Broken) -> (usize, i64) {
    let mut c = Cluster::new(3, 1, 1, Consistency::Eventual);
    for d in c.nodes.values_mut() {
        break_node(d, mutation);
    }
    let key = Cluster::keys(8)[3];
    let ring = c.ring();
    let (primary, replica) = (ring.owners(key)[0], ring.owners(key)[1]);
    c.cut.insert((primary, replica));
    let w = NodeId(4);
    c.push(w, &[key], 7);
    c.run_until(500 * MS, |_| false);
    let done_before_crash = c.pushes_done(w);
    c.crash(primary);
    c.cut.clear();
    assert!(c.run_until(60_000 * MS, |c| c.pushes_done(w) == 1
        && c.servers_at_epoch(2)));
    assert_eq!(
        c.ring().primary(key),
        replica,
        "the range passes to its first replica"
    );
    (done_before_crash, c.primary_value(key))
}

#[test]
fn durability_a_push_is_acknowledged_only_once_the_replica_has_it() {
    assert_eq!(cut_off_primary_then_crash(None), (0, 7));
}

#[cfg(feature = "mutations")]
#[test]
fn ack_before_replicate_loses_an_acknowledged_push_with_its_primary() {
    let (done_before_crash, value) = cut_off_primary_then_crash(Some(Mutation::AckBeforeReplicate));
    assert_eq!(done_before_crash, 1, "acknowledged without the replica");
    assert_eq!(value, 0, "and lost with the primary");
}

#[test]
fn a_joining_server_takes_its_ranges_with_their_data_and_exactly_once_holds() {
    let runs = [Consistency::Eventual, Consistency::Sequential]
        .into_iter()
        .flat_map(|c| [(c, 0, 0), (c, 9, 0), (c, 5, 7), (c, 11, 3)]);
    for (consistency, drop_every, dup_every) in runs {
        let mut c = Cluster::new(3, 1, 1, consistency);
        c.drop_every = drop_every;
        c.dup_every = dup_every;
        let keys = Cluster::keys(32);
        let w = NodeId(4);
        c.push(w, &keys, 3);
        assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
        c.start_server(NodeId(9));
        assert!(c.run_until(1_000 * MS, |c| c.coordinator().phase()
            == Phase::Reconfiguring));
        assert_eq!(c.config().joining, vec![NodeId(9)]);
        // Pushes go on while the new server copies its ranges.
        c.push(w, &keys, 1);
        assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2, 3, 9])
            && c.pushes_done(w) == 2));
        let ring = c.ring();
        assert!(
            keys.iter().any(|&k| ring.primary(k) == NodeId(9)),
            "the new server is the primary of some keys"
        );
        c.push(w, &keys, 1);
        assert!(c.run_until(60_000 * MS, |c| c.pushes_done(w) == 3));
        if consistency == Consistency::Sequential {
            let now = c.now;
            c.driver(w).worker().unwrap().advance(now).unwrap();
            c.collect();
        }
        assert!(
            c.run_until(60_000 * MS, |c| {
                c.all_replicated() && c.all_hold(&keys, 5)
            }),
            "every key holds each push once under {consistency:?}, drop 1/{drop_every}"
        );
        c.assert_single_owner(&keys);
        c.assert_converged(&keys);
    }
}

#[test]
fn a_leaving_server_hands_its_ranges_over_before_it_goes() {
    let mut c = Cluster::new(4, 1, 1, Consistency::Eventual);
    let keys = Cluster::keys(32);
    let w = NodeId(5);
    c.push(w, &keys, 2);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    c.driver(NodeId(2)).leave().unwrap();
    c.collect();
    c.push(w, &keys, 1);
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 3, 4])
        && c.pushes_done(w) == 2));
    assert!(c.run_until(10_000 * MS, |c| c.server(NodeId(2)).shards().count() == 0));
    assert!(!c.server(NodeId(2)).is_member());
    assert!(
        c.events[&NodeId(2)].contains(&Event::Fenced),
        "told to stop"
    );
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 3)));
    c.assert_single_owner(&keys);
    c.assert_converged(&keys);
    // Gone on its own, it is listed as left: no node takes it for dead, and a configuration
    // that skipped the change would say the same.
    assert!(c.config().left.contains(&NodeId(2)));
    for n in [COORD, NodeId(1), NodeId(3), NodeId(4), w] {
        assert_eq!(heard_dead(&c, n, NodeId(2)), 0, "{n}");
    }
}

#[test]
fn durability_a_leaving_primary_does_not_acknowledge_what_its_successor_lacks() {
    let mut c = Cluster::new(4, 1, 1, Consistency::Eventual);
    let (leaver, w) = (NodeId(2), NodeId(5));
    let ring = c.ring();
    let keys: Vec<Key> = Cluster::keys(64)
        .into_iter()
        .filter(|&k| ring.primary(k) == leaver)
        .collect();
    assert!(!keys.is_empty());
    c.push(w, &keys, 2);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    c.driver(leaver).leave().unwrap();
    c.collect();
    assert!(c.run_until(60_000 * MS, |c| !c.config().servers.contains(&leaver)));
    // The ring without the leaver is published. Neither the leaver nor the worker hears of it
    // yet, and nothing the leaver replicates arrives: it takes a push in on the old ring that
    // the range's new primary never gets.
    c.queue
        .retain(|&(from, to, _)| !(from == COORD && (to == leaver || to == w)));
    c.cut.extend([(COORD, leaver), (COORD, w)]);
    c.cut.extend((1..=4).map(|s| (leaver, NodeId(s))));
    c.push(w, &keys, 1);
    c.run_until(500 * MS, |_| false);
    assert_eq!(c.pushes_done(w), 1);
    c.cut.remove(&(COORD, leaver));
    assert!(c.run_until(10_000 * MS, |c| !c.server(leaver).is_member()));
    c.run_until(500 * MS, |_| false);
    assert_eq!(
        c.pushes_done(w),
        1,
        "a server that gave up a range acknowledged a push only it had"
    );
    assert!(c.events[&leaver].contains(&Event::Fenced));
    c.cut.clear();
    assert!(c.run_until(60_000 * MS, |c| c.pushes_done(w) == 2));
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 3)));
}

#[test]
fn durability_a_server_dying_during_a_change_holds_the_switch_until_its_range_is_refilled() {
    let mut c = Cluster::new(4, 1, 1, Consistency::Eventual);
    let w = NodeId(5);
    let ring = c.config().ring;
    let ring_of = |servers: &[NodeId]| Ring::new(servers.iter().copied(), ring).unwrap();
    let all: Vec<NodeId> = (1..=4).map(NodeId).collect();
    let without = |servers: &[NodeId], gone: NodeId| -> Vec<NodeId> {
        servers.iter().copied().filter(|&s| s != gone).collect()
    };
    // A key whose primary `b` dies while its replica `a` leaves, so that the replica chosen in
    // `b`'s place, `r`, is to be the key's primary once `a` is gone.
    let (key, a, b, r) = Cluster::keys(512)
        .into_iter()
        .find_map(|k| {
            let (b, a) = (ring_of(&all).owners(k)[0], ring_of(&all).owners(k)[1]);
            let after_b = ring_of(&without(&all, b)).owners(k).to_vec();
            let r = after_b[1];
            let last = ring_of(&without(&without(&all, b), a)).primary(k);
            (after_b[0] == a && last == r).then_some((k, a, b, r))
        })
        .expect("some key moves that way");
    c.push(w, &[key], 5);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    // `r` gets no copy of the key's range until the copies go through again.
    c.lost_copies = Some((r, key));
    c.driver(a).leave().unwrap();
    c.collect();
    assert!(c.run_until(10_000 * MS, |c| c.config().leaving == [a]));
    c.crash(b);
    assert!(c.run_until(60_000 * MS, |c| !c.config().servers.contains(&b)));
    c.run_until(3_000 * MS, |_| false);
    assert!(
        c.config().servers.contains(&a),
        "the ring switched while {r} lacked the range it was to lead"
    );
    c.lost_copies = None;
    let rest = without(&without(&all, b), a);
    let rest: Vec<u32> = rest.iter().map(|n| n.0).collect();
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&rest)));
    assert_eq!(c.primary_value(key), 5);
}

#[test]
fn a_restarted_server_rejoins_as_a_new_member() {
    let mut c = Cluster::new(3, 1, 1, Consistency::Eventual);
    let keys = Cluster::keys(32);
    let w = NodeId(4);
    c.push(w, &keys, 4);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    // The process restarts before anyone noticed it was gone: its state is lost, so it must
    // not be taken back as the holder of its ranges.
    c.crash(NodeId(1));
    c.start_server(NodeId(1));
    assert!(c.run_until(1_000 * MS, |c| c.config().joining == vec![NodeId(1)]));
    assert!(!c.config().servers.contains(&NodeId(1)));
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2, 3])));
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 4)));
    c.assert_single_owner(&keys);
    c.assert_converged(&keys);
}

/// A process that restarts quickly may hear of a configuration before its own registration
/// reaches the coordinator: here its registrations are lost, and a worker joining makes the
/// coordinator broadcast a configuration that still gives the node the ranges its earlier
/// process held. The new process holds none of them; it must not serve them, but wait until
/// it is listed under its own incarnation, while its ranges fail over to their replicas.
#[test]
fn exactly_once_a_quickly_restarted_server_waits_to_be_listed_under_its_own_incarnation() {
    let mut c = Cluster::new(3, 1, 1, Consistency::Eventual);
    let keys = Cluster::keys(32);
    let (w, s1) = (NodeId(4), NodeId(1));
    c.push(w, &keys, 4);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    // A first restart, so that the configuration records the node's incarnation.
    c.crash(s1);
    c.start_server(s1);
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2, 3])));
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 4)));
    let earlier = c.config().incarnation_of(s1);
    assert!(earlier.is_some());
    // The second restart cannot reach the coordinator.
    c.now += MS;
    c.crash(s1);
    c.cut.insert((s1, COORD));
    c.start_server(s1);
    c.events.remove(&s1);
    let mut d = Driver::new(Worker::new(WorkerConfig::new(NodeId(9), COORD)));
    d.start(c.now);
    c.nodes.insert(NodeId(9), d);
    c.collect();
    assert!(c.run_until(10_000 * MS, |c| c.config().workers.len() == 2));
    assert!(c.config().servers.contains(&s1));
    assert_eq!(c.config().incarnation_of(s1), earlier);
    // The worker pushes meanwhile: the node's ranges fail over to their replicas, whose copies
    // hold the earlier pushes.
    c.push(w, &keys, 1);
    assert!(c.run_until(60_000 * MS, |c| c.pushes_done(w) == 2));
    let events = &c.events[&s1];
    assert!(
        !events.iter().any(|e| matches!(e, Event::Ready { .. })),
        "the new process served before it was listed: {events:?}"
    );
    assert!(events.iter().any(|e| matches!(
        e,
        Event::Refused {
            reason: Refusal::OtherIncarnation { .. },
            ..
        }
    )));
    c.cut.clear();
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2, 3])));
    assert_ne!(c.config().incarnation_of(s1), earlier);
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 5)));
    c.assert_single_owner(&keys);
    c.assert_converged(&keys);
}

#[test]
fn a_server_declared_dead_that_comes_back_joins_again() {
    let mut c = Cluster::new(3, 1, 1, Consistency::Eventual);
    let keys = Cluster::keys(16);
    let w = NodeId(4);
    c.push(w, &keys, 1);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    c.crash(NodeId(3));
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2])));
    c.start_server(NodeId(3));
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2, 3])));
    assert!(!c.coordinator().dead().contains(&NodeId(3)));
    c.push(w, &keys, 1);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 2));
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 2)));
    c.assert_converged(&keys);
}

#[test]
fn a_shard_larger_than_a_frame_is_copied_in_parts_that_fit() {
    let mut c = Cluster::with_frames(3, 1, 1, Consistency::Eventual, 16 << 10);
    let keys: Vec<Key> = (0..20_000u64).map(|i| i * (MAX_KEY / 20_000)).collect();
    let w = NodeId(4);
    c.push(w, &keys, 1);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    let victim = c.ring().primary(keys[0]);
    c.crash(victim);
    assert!(c.run_until(60_000 * MS, |c| {
        !c.config().servers.contains(&victim) && c.servers_at_epoch(2) && c.all_replicated()
    }));
    c.push(w, &keys, 1);
    assert!(c.run_until(60_000 * MS, |c| c.pushes_done(w) == 2));
    for d in c.nodes.values() {
        assert_eq!(
            d.refusals().unencodable,
            0,
            "{} sent a frame too large",
            d.id()
        );
    }
    for &k in keys.iter().step_by(97) {
        assert_eq!(c.primary_value(k), 2, "key {k}");
    }
    c.assert_converged(&keys);
    let shards: usize = c
        .ring()
        .servers()
        .iter()
        .map(|&s| c.server(s).shards().count())
        .sum();
    assert!(shards > 24, "copies were cut into {shards} shards");
}

/// With 64 points per server on the ring, a push crosses dozens of ring segments; the
/// primary replicates it with one batch per replica server, not one message per segment, and
/// each batch is acknowledged once.
#[test]
fn a_push_across_many_ring_segments_is_replicated_with_a_batch_per_replica_server() {
    for (servers, consistency) in [
        (2, Consistency::Eventual),
        (3, Consistency::Eventual),
        (3, Consistency::BoundedDelay(1)),
    ] {
        let mut c = Cluster::with_vnodes(servers, 2, 1, consistency, 64);
        let keys = Cluster::keys(4_000);
        let (w1, w2) = (NodeId(servers + 1), NodeId(servers + 2));
        for _ in 0..5 {
            c.push(w1, &keys, 1);
            c.push(w2, &keys, 2);
        }
        assert!(c.run_until(60_000 * MS, |c| c.pushes_done(w1) == 5
            && c.pushes_done(w2) == 5));
        assert!(c.all_hold(&keys, 15));
        c.assert_converged(&keys);
        // With one replica per range, a primary's ranges are replicated on any of the other
        // servers.
        let replica_servers = u64::from(servers - 1);
        let segments: usize = (1..=servers)
            .map(|s| c.server(NodeId(s)).shards().filter(|&(_, p)| p).count())
            .sum();
        assert!(segments > 64, "{segments} primary shards");
        assert!(c.push_frames > 0);
        assert!(
            c.replicate_frames <= c.push_frames * replica_servers,
            "{servers} servers, {consistency:?}: {} batches for {} push frames",
            c.replicate_frames,
            c.push_frames
        );
        // Nothing is lost: each batch is acknowledged once.
        assert!(
            c.replicate_ack_frames == c.replicate_frames,
            "{} acknowledgements of {} batches",
            c.replicate_ack_frames,
            c.replicate_frames
        );
    }
}

/// An embedder's transport carries datagrams of at most 1,472 bytes and loses one frame in
/// ten: every message a node builds fits, replication batches included, and every push is
/// applied exactly once.
#[test]
fn frames_of_a_datagram_on_a_lossy_network_carry_every_push_exactly_once() {
    const DATAGRAM: usize = 1_472;
    for consistency in [
        Consistency::Eventual,
        Consistency::BoundedDelay(1),
        Consistency::Sequential,
    ] {
        let mut c = Cluster::with_frames(3, 2, 1, consistency, DATAGRAM);
        c.drop_every = 10;
        let keys = Cluster::keys(600);
        let (w1, w2) = (NodeId(4), NodeId(5));
        for _ in 0..4 {
            c.push(w1, &keys, 1);
            c.push(w2, &keys[100..], 2);
        }
        assert!(
            c.run_until(120_000 * MS, |c| c.pushes_done(w1) == 4
                && c.pushes_done(w2) == 4),
            "{consistency:?}: every push completes"
        );
        for (j, &k) in keys.iter().enumerate() {
            let want = 4 + if j >= 100 { 8 } else { 0 };
            assert_eq!(c.primary_value(k), want, "key {k}, {consistency:?}");
        }
        assert!(c.replicate_frames > 0);
        assert!(
            c.largest_frame <= DATAGRAM,
            "{consistency:?}: a frame of {} bytes",
            c.largest_frame
        );
        for d in c.nodes.values() {
            assert_eq!(
                d.refusals().unencodable,
                0,
                "{} built a frame too large",
                d.id()
            );
        }
        assert!(c.run_until(30_000 * MS, |c| { c.all_replicated() }));
        c.assert_converged(&keys);
    }
}

/// An embedder reads each server's values through its driver: the servers' led parts tile the
/// key space, each key's value is read from the one server that leads it, and replicas are
/// left out. A worker holds nothing to read.
#[test]
fn reading_every_server_gives_each_key_once_from_its_primary() {
    let mut c = Cluster::new(3, 2, 1, Consistency::Eventual);
    let keys = Cluster::keys(60);
    let (w1, w2) = (NodeId(4), NodeId(5));
    c.push(w1, &keys, 2);
    c.push(w2, &keys[10..], 5);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w1) == 1
        && c.pushes_done(w2) == 1));
    let reads: Vec<(NodeId, RangeRead<i64>)> = (1..=3)
        .map(|s| {
            let server = c.nodes.get_mut(&NodeId(s)).unwrap().server().unwrap();
            (NodeId(s), server.read(KeyRange::FULL))
        })
        .collect();
    let mut led: Vec<KeyRange> = reads.iter().flat_map(|(_, r)| r.led.clone()).collect();
    led.sort_by_key(|r| r.start());
    assert_eq!(led.first().map(|r| r.start()), Some(KeyRange::FULL.start()));
    assert_eq!(led.last().map(|r| r.end()), Some(KeyRange::FULL.end()));
    for pair in led.windows(2) {
        assert_eq!(pair[0].end(), pair[1].start(), "{led:?}");
    }
    let ring = c.ring();
    for (j, &k) in keys.iter().enumerate() {
        let want = 2 + if j >= 10 { 5 } else { 0 };
        for (s, read) in &reads {
            let leads = read.led.iter().any(|r| r.contains(k));
            assert_eq!(leads, ring.primary(k) == *s, "key {k} on {s}");
            let got = read.rows.get(k).map(|v| v[0]);
            assert_eq!(got, leads.then_some(want), "key {k} on {s}");
        }
    }
    assert_eq!(
        c.nodes.get_mut(&w1).unwrap().server().unwrap_err(),
        DriverError::NotAServer(w1)
    );
}

/// A server joins a job whose data was written before: after the switch, the key's primary
/// holds the value. With `promote-stale-replica` the new server takes itself to be in step
/// without copying anything and is made primary of ranges it holds nothing of.
fn join_after_writes(mutation: Broken) -> Vec<i64> {
    let mut c = Cluster::new(3, 1, 1, Consistency::Eventual);
    for d in c.nodes.values_mut() {
        break_node(d, mutation);
    }
    let keys = Cluster::keys(32);
    let w = NodeId(4);
    c.push(w, &keys, 6);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    c.start_server(NodeId(9));
    break_node(c.driver(NodeId(9)), mutation);
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2, 3, 9])));
    let ring = c.ring();
    keys.iter()
        .filter(|&&k| ring.primary(k) == NodeId(9))
        .map(|&k| c.primary_value(k))
        .collect()
}

#[test]
fn durability_a_joining_server_is_made_primary_only_with_the_data() {
    let values = join_after_writes(None);
    assert!(!values.is_empty());
    assert!(values.iter().all(|&v| v == 6), "{values:?}");
}

#[cfg(feature = "mutations")]
#[test]
fn promote_stale_replica_makes_an_empty_server_primary() {
    let values = join_after_writes(Some(Mutation::PromoteStaleReplica));
    assert!(!values.is_empty());
    assert!(values.iter().all(|&v| v == 0), "{values:?}");
}

#[cfg(feature = "mutations")]
#[test]
fn drop_dedup_on_transfer_applies_a_resend_again_after_fail_over() {
    // The push reaches the primary and its replica, but no acknowledgement reaches the worker.
    // The primary dies; the replica, now primary, copies the range to a new replica; then it
    // dies too, and the worker's resend reaches the holder of the copy, which recognises it,
    // unless the copy left the de-duplication state behind.
    let run = |mutation: Option<Mutation>| -> i64 {
        let mut c = Cluster::new(4, 1, 1, Consistency::Eventual);
        for d in c.nodes.values_mut() {
            d.set_mutation(mutation);
        }
        let key = Cluster::keys(8)[3];
        let ring = c.ring();
        let (primary, replica) = (ring.owners(key)[0], ring.owners(key)[1]);
        let w = NodeId(5);
        c.cut.insert((primary, w));
        c.cut.insert((replica, w));
        c.push(w, &[key], 7);
        assert!(
            c.run_until(10_000 * MS, |c| c.server(primary).unreplicated_pushes()
                == 1
                && c.server(replica).received_total(key) == vec![7])
        );
        c.crash(primary);
        assert!(c.run_until(60_000 * MS, |c| {
            c.servers_at_epoch(2)
                && c.ring()
                    .owners(key)
                    .iter()
                    .all(|&s| c.server(s).received_total(key) == vec![7])
        }));
        let follower = c.ring().owners(key)[1];
        assert_eq!(c.pushes_done(w), 0);
        c.crash(replica);
        // Epoch 3 takes the replica off the ring; ranges the two crashed servers alone held
        // are listed as lost in a later one.
        assert!(c.run_until(60_000 * MS, |c| c.pushes_done(w) == 1
            && c.config().epoch >= 3
            && c.servers_at_epoch(c.config().epoch)));
        assert_eq!(c.ring().primary(key), follower);
        c.primary_value(key)
    };
    assert_eq!(run(None), 7, "the resend is recognised");
    assert_eq!(
        run(Some(Mutation::DropDedupOnTransfer)),
        14,
        "applied twice"
    );
}

impl Cluster {
    /// Runs one iteration on `worker`: push 1 to every key, then advance.
    fn iterate(&mut self, worker: NodeId, keys: &[Key]) {
        self.push(worker, keys, 1);
        let now = self.now;
        self.driver(worker).worker().unwrap().advance(now).unwrap();
        self.collect();
    }

    /// Makes `worker` leave the job and runs until the fence that confirms it arrives.
    fn leave(&mut self, worker: NodeId) {
        self.driver(worker).leave().unwrap();
        self.collect();
        assert!(self.run_until(10_000 * MS, |c| c.events[&worker].contains(&Event::Fenced)));
    }

    fn iteration(&self, worker: NodeId) -> Iteration {
        self.nodes[&worker].node().as_worker().unwrap().iteration()
    }
}

/// Sequential mode: a primary takes the pushes of an iteration in (`PushTaken`), and ships
/// them to its replica as one sum once every worker finished the iteration, so replication
/// carries a quarter of the values the four workers pushed; every push is acknowledged once
/// the replica holds the sum, and the replica holds exactly what its primary holds, bit for
/// bit.
#[test]
fn replica_convergence_an_iterations_pushes_are_replicated_as_their_sum() {
    let mut c = Cluster::new(3, 4, 1, Consistency::Sequential);
    let keys = Cluster::keys(12);
    let workers = [4, 5, 6, 7].map(NodeId);
    for round in 1..=3 {
        for &w in &workers {
            c.iterate(w, &keys);
        }
        assert!(c.run_until(10_000 * MS, |c| {
            workers.iter().all(|&w| c.iteration(w) == round)
        }));
    }
    assert!(c.run_until(10_000 * MS, |c| {
        keys.iter()
            .all(|&k| c.server(c.ring().primary(k)).applied_below() >= 3)
    }));
    for &k in &keys {
        assert_eq!(c.primary_value(k), 12, "key {k}");
        // Read from outside, the primary's rows are the job's values below iteration 3.
        let primary = c.ring().primary(k);
        let read = c
            .nodes
            .get_mut(&primary)
            .unwrap()
            .server()
            .unwrap()
            .read(KeyRange::FULL);
        assert!(read.applied_below >= 3, "{}", read.applied_below);
        assert_eq!(read.rows.get(k), Some(&[12][..]), "key {k}");
    }
    assert!(c.run_until(10_000 * MS, |c| {
        workers.iter().all(|&w| c.pushes_done(w) == 3)
    }));
    c.assert_converged(&keys);
    assert!(
        c.replicated_values * 4 <= c.pushed_values,
        "replicated {} values for {} pushed",
        c.replicated_values,
        c.pushed_values
    );
}

#[test]
fn a_worker_joining_a_running_job_starts_where_the_others_are() {
    let mut c = Cluster::new(3, 2, 1, Consistency::Sequential);
    let keys = Cluster::keys(12);
    let (w1, w2, w3) = (NodeId(4), NodeId(5), NodeId(9));
    for _ in 0..3 {
        c.iterate(w1, &keys);
        c.iterate(w2, &keys);
    }
    assert!(c.run_until(10_000 * MS, |c| c.iteration(w1) == 3
        && c.iteration(w2) == 3));
    let mut d = Driver::new(Worker::new(WorkerConfig::new(w3, COORD)));
    d.start(c.now);
    c.nodes.insert(w3, d);
    c.collect();
    assert!(c.run_until(10_000 * MS, |c| {
        c.events
            .get(&w3)
            .is_some_and(|e| e.iter().any(|e| matches!(e, Event::Ready { .. })))
    }));
    assert_eq!(c.config().workers, vec![w1, w2, w3]);
    assert_eq!(
        c.iteration(w3),
        3,
        "the newcomer starts where the others are"
    );
    // Iteration 3 is aggregated once all three finished it; nobody waited for the newcomer to
    // go through iterations 0 to 2.
    for w in [w1, w2, w3] {
        c.iterate(w, &keys);
    }
    assert!(c.run_until(10_000 * MS, |c| {
        [w1, w2, w3].iter().all(|&w| c.iteration(w) == 4)
    }));
    assert!(c.run_until(10_000 * MS, |c| {
        keys.iter()
            .all(|&k| c.server(c.ring().primary(k)).applied_below() >= 4)
    }));
    for &k in &keys {
        assert_eq!(c.primary_value(k), 9, "key {k}");
    }
}

#[test]
fn a_worker_that_leaves_is_waited_for_no_more() {
    let mut c = Cluster::new(3, 2, 1, Consistency::Sequential);
    let keys = Cluster::keys(12);
    let (w1, w2) = (NodeId(4), NodeId(5));
    c.iterate(w1, &keys);
    c.iterate(w2, &keys);
    assert!(c.run_until(10_000 * MS, |c| c.iteration(w1) == 1
        && c.iteration(w2) == 1));
    c.leave(w2);
    assert_eq!(c.config().workers, vec![w1]);
    assert!(
        !c.coordinator().dead().contains(&w2),
        "it left; it did not die"
    );
    for _ in 0..2 {
        c.iterate(w1, &keys);
    }
    assert!(c.run_until(10_000 * MS, |c| c.iteration(w1) == 3));
    assert!(c.run_until(10_000 * MS, |c| {
        keys.iter()
            .all(|&k| c.server(c.ring().primary(k)).applied_below() >= 3)
    }));
    for &k in &keys {
        assert_eq!(c.primary_value(k), 4, "key {k}");
    }
    assert!(
        c.driver(COORD).leave().is_err(),
        "the coordinator cannot leave"
    );
}

#[test]
fn a_dead_workers_share_of_the_work_passes_to_a_live_worker() {
    let mut c = Cluster::new(2, 3, 1, Consistency::Sequential);
    let keys = Cluster::keys(8);
    let (w1, w2, w3) = (NodeId(3), NodeId(4), NodeId(5));
    let shares = |c: &Cluster, w: NodeId| c.nodes[&w].node().as_worker().unwrap().shares();
    assert_eq!(
        [shares(&c, w1), shares(&c, w2), shares(&c, w3)],
        [vec![0], vec![1], vec![2]]
    );
    c.crash(w2);
    c.iterate(w1, &keys);
    c.iterate(w3, &keys);
    assert!(c.run_until(60_000 * MS, |c| c.config().workers == [w1, w3]
        && c.iteration(w1) == 1
        && c.iteration(w3) == 1));
    assert!(c.coordinator().dead().contains(&w2));
    // Every share has exactly one live worker, and the workers left know it.
    assert_eq!(c.config().shares, [w1, w1, w3]);
    assert!(c.run_until(10_000 * MS, |c| shares(c, w1) == [0, 1]));
    assert_eq!(shares(&c, w3), [2]);
    // One that leaves on its own keeps its share: done with it, it passes it to nobody.
    c.leave(w3);
    assert_eq!(c.config().workers, [w1]);
    assert_eq!(c.config().left, [w3]);
    assert_eq!(c.config().shares, [w1, w1, w3]);
    assert_eq!(shares(&c, w1), [0, 1]);
}

#[test]
fn a_worker_that_finishes_is_never_declared_dead() {
    let mut c = Cluster::new(2, 2, 1, Consistency::Eventual);
    let keys = Cluster::keys(8);
    let (w1, w2) = (NodeId(3), NodeId(4));
    c.iterate(w1, &keys);
    c.iterate(w2, &keys);
    assert!(c.run_until(10_000 * MS, |c| c.iteration(w1) == 1
        && c.iteration(w2) == 1));
    // The second worker is done: it leaves, and is silent from then on.
    c.leave(w2);
    c.crash(w2);
    // Far past the heartbeat timeout, while the other worker goes on.
    for _ in 0..20 {
        c.iterate(w1, &keys);
        c.run_until(1_000 * MS, |_| false);
    }
    assert!(c.iteration(w1) >= 21, "the other worker went on");
    let said = &c.events[&COORD];
    assert!(
        said.contains(&Event::Coordinator(CoordinatorEvent::WorkerLeft(w2))),
        "{said:?}"
    );
    assert!(!said.contains(&Event::NodeDead(w2)), "{said:?}");
    assert!(!c.coordinator().dead().contains(&w2));
    // Its share stays done: the worker still training is not given it.
    assert_eq!(c.config().shares, [w1, w2]);
    assert_eq!(c.nodes[&w1].node().as_worker().unwrap().shares(), [0]);
}

#[test]
fn a_primary_cut_off_from_its_replica_holds_a_bounded_log_and_catches_it_up_with_a_copy() {
    // Six workers with 64 slices each on the network: more updates than the log keeps.
    let mut c = Cluster::new(3, 6, 1, Consistency::Eventual);
    let key = Cluster::keys(8)[3];
    let ring = c.ring();
    let (primary, replica) = (ring.owners(key)[0], ring.owners(key)[1]);
    c.cut.insert((primary, replica));
    let workers: Vec<NodeId> = (4..10).map(NodeId).collect();
    for &w in &workers {
        for _ in 0..60 {
            c.push(w, &[key], 1);
        }
    }
    c.run_until(300 * MS, |_| false);
    assert!(
        workers.iter().all(|&w| c.pushes_done(w) == 0),
        "nothing is acknowledged"
    );
    let logged = format!("{:?}", c.server(primary))
        .matches("Replicate {")
        .count();
    assert!(logged <= 256, "{logged} updates logged");
    c.cut.clear();
    assert!(c.run_until(60_000 * MS, |c| {
        workers.iter().all(|&w| c.pushes_done(w) == 60)
    }));
    assert_eq!(c.primary_value(key), 360);
    c.assert_converged(&[key]);
}

#[test]
fn losing_every_holder_of_a_range_at_once_is_reported_not_silent() {
    let mut c = Cluster::new(4, 1, 1, Consistency::Eventual);
    let key = Cluster::keys(8)[3];
    let w = NodeId(5);
    c.push(w, &[key], 3);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    let owners = c.ring().owners(key).to_vec();
    for &s in &owners {
        c.crash(s);
    }
    assert!(c.run_until(60_000 * MS, |c| {
        owners.iter().all(|s| !c.config().servers.contains(s))
            && c.servers_at_epoch(c.config().epoch)
    }));
    let primary = c.ring().primary(key);
    let lost: Vec<KeyRange> = c.events[&primary]
        .iter()
        .filter_map(|e| match e {
            Event::RangeLost(r) => Some(*r),
            _ => None,
        })
        .collect();
    assert!(lost.iter().any(|r| r.contains(key)), "{lost:?}");
    // The coordinator lists the loss, and every worker hears of it.
    assert!(c.run_until(10_000 * MS, |c| c.config().lost == lost));
    for range in &lost {
        assert!(c.events[&COORD].contains(&Event::RangeLost(*range)));
    }
    assert!(c.run_until(10_000 * MS, |c| {
        lost.iter()
            .all(|r| c.events[&w].contains(&Event::RangeLost(*r)))
    }));
    assert_eq!(
        c.primary_value(key),
        0,
        "more failures than replicas lose the range"
    );
    c.push(w, &[key], 1);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 2));
    assert_eq!(c.primary_value(key), 1, "and it serves again from zero");
}

/// A server taking a range over learns from the copy how far each worker has come there, so
/// it can answer a pull at once instead of waiting for the workers to report to it.
#[test]
fn a_copy_brings_the_workers_range_clocks_with_it() {
    let (s1, s2, w) = (NodeId(1), NodeId(2), NodeId(10));
    let ring = RingConfig {
        vnodes: 4,
        replicas: 0,
        seed: 3,
        ..RingConfig::default()
    };
    let config = |epoch: Epoch, servers: Vec<NodeId>, joining: Vec<NodeId>| ClusterConfig {
        epoch,
        coordinator: COORD,
        standbys: Vec::new(),
        term: 0,
        servers,
        workers: vec![w],
        ring,
        consistency: Consistency::Sequential,
        joining,
        leaving: Vec::new(),
        shares: vec![w],
        left: vec![],
        lost: vec![],
        incarnations: Vec::new(),
        pace: Default::default(),
        checkpoints: Default::default(),
    };
    let next = Ring::new([s1, s2], ring).unwrap();
    let (range, _) = next
        .segments()
        .find(|(_, owners)| owners[0] == s2)
        .expect("the joiner takes some range");
    let answered = |clocks: Vec<ClockRecord>| -> bool {
        let mut s: Server<i64> = Server::new(ServerConfig::new(s2, COORD), Updater::Sum);
        let mut out = Effects::new();
        s.start(0, &mut out);
        let deliver = |s: &mut Server<i64>, from: NodeId, epoch: Epoch, body, out: &mut _| {
            s.on_message(0, Envelope::new(from, s2, epoch, body), out);
        };
        deliver(
            &mut s,
            COORD,
            2,
            Message::Config(config(2, vec![s1], vec![s2])),
            &mut out,
        );
        let copy = Transfer {
            range,
            seq: 0,
            values: KvPairs::empty(1).unwrap(),
            state: None,
            pending: Vec::new(),
            applied_below: 3,
            dedupe: Vec::new(),
            clocks,
        };
        deliver(&mut s, s1, 2, Message::Transfer(copy), &mut out);
        assert!(
            out.sends
                .iter()
                .any(|e| matches!(e.body, Message::TransferAck { .. })),
            "the copy is installed"
        );
        deliver(
            &mut s,
            COORD,
            3,
            Message::Config(config(3, vec![s1, s2], vec![])),
            &mut out,
        );
        out.clear();
        let pull = Pull {
            slice: SliceRef {
                request: 1,
                slice: 0,
            },
            iteration: 3,
            keys: KeySelection::Keys(KeyList::new(vec![range.start()]).unwrap()),
        };
        deliver(&mut s, w, 3, Message::Pull(pull), &mut out);
        out.sends
            .iter()
            .any(|e| matches!(e.body, Message::PullReply(_)))
    };
    let clock = ClockRecord {
        worker: w,
        segments: vec![(range, 3)],
    };
    assert!(
        answered(vec![clock]),
        "the copy's clock says the worker finished 0..3"
    );
    assert!(
        !answered(Vec::new()),
        "without it the pull waits for the worker's report"
    );
}

/// Delivers a replication step of key `k` (sequence 1) from `primary` to `replica`.
fn deliver_step(
    c: &mut Cluster,
    (primary, replica): (NodeId, NodeId),
    k: Key,
    span: u64,
    kvs: KvPairs<i64>,
) {
    let step = Replicate {
        range: KeyRange::new(k, k + 1).unwrap(),
        seq: 1,
        span,
        update: ShardUpdate::Apply(kvs),
        dedupe: Default::default(),
    };
    let body = Message::Replicate {
        updates: vec![step],
    };
    let env = Envelope::new(primary, replica, c.config().epoch, body);
    let frame = Codec::default().encode(&env).unwrap();
    let now = c.now;
    c.driver(replica).handle_frame(now, primary, &frame);
    c.collect();
}

/// How often `replica` refused a message from `primary` for `reason`.
fn refusals(c: &Cluster, (primary, replica): (NodeId, NodeId), reason: &Refusal) -> usize {
    c.events[&replica]
        .iter()
        .filter(
            |e| matches!(e, Event::Refused { from, reason: r } if *from == primary && r == reason),
        )
        .count()
}

/// A cluster of three servers with one replica each, a key, and its (primary, replica).
fn replica_pair() -> (Cluster, Key, (NodeId, NodeId)) {
    let c = Cluster::new(3, 1, 1, Consistency::Eventual);
    let k = Cluster::keys(4)[1];
    let ring = c.ring();
    let owners = ring.owners(k);
    let pair = (owners[0], owners[1]);
    (c, k, pair)
}

/// A replication step must stand for at least one step, none below the first: a replica
/// refuses, visibly, one that spans none (it would apply a step again) or reaches below step 1,
/// and applies a well-formed one.
#[test]
fn replica_convergence_a_step_spanning_no_step_is_refused() {
    let (mut c, k, pair) = replica_pair();
    let one = || KvPairs::new(vec![k], vec![7], 1).unwrap();
    deliver_step(&mut c, pair, k, 0, one());
    deliver_step(&mut c, pair, k, 2, one());
    assert_eq!(refusals(&c, pair, &Refusal::Unexpected), 2);
    assert_eq!(c.server(pair.1).received_total(k), vec![0]);
    deliver_step(&mut c, pair, k, 1, one());
    assert_eq!(refusals(&c, pair, &Refusal::Unexpected), 2);
    assert_eq!(c.server(pair.1).received_total(k), vec![7]);
}

/// A replication step whose rows are of another width than the job's is refused, visibly, and
/// not applied; the step of the right width that follows is.
#[test]
fn a_replication_step_of_another_width_is_refused() {
    let (mut c, k, pair) = replica_pair();
    deliver_step(
        &mut c,
        pair,
        k,
        1,
        KvPairs::new(vec![k], vec![7, 8], 2).unwrap(),
    );
    assert_eq!(refusals(&c, pair, &Refusal::ForeignJob), 1);
    assert_eq!(c.server(pair.1).received_total(k), vec![0]);
    deliver_step(
        &mut c,
        pair,
        k,
        1,
        KvPairs::new(vec![k], vec![7], 1).unwrap(),
    );
    assert_eq!(refusals(&c, pair, &Refusal::ForeignJob), 1);
    assert_eq!(c.server(pair.1).received_total(k), vec![7]);
}

fn finished_at(said: &[Event<i64>]) -> Vec<u64> {
    said.iter()
        .filter_map(|e| match e {
            Event::JobFinished { epoch } => Some(*epoch),
            _ => None,
        })
        .collect()
}

#[test]
fn a_job_ends_on_every_server_and_then_on_the_coordinator_once_every_worker_left() {
    let mut c = Cluster::new(2, 2, 1, Consistency::Sequential);
    let keys = Cluster::keys(8);
    let (s1, s2, w1, w2) = (NodeId(1), NodeId(2), NodeId(3), NodeId(4));
    c.iterate(w1, &keys);
    c.iterate(w2, &keys);
    assert!(c.run_until(10_000 * MS, |c| c.iteration(w1) == 1
        && c.iteration(w2) == 1));
    c.leave(w1);
    // One worker still at work: nobody may stop.
    c.run_until(2_000 * MS, |_| false);
    for node in [COORD, s1, s2] {
        assert_eq!(finished_at(&c.events[&node]), [] as [u64; 0], "{node}");
    }
    c.leave(w2);
    let epoch = c.config().epoch;
    assert!(c.run_until(5_000 * MS, |c| !finished_at(&c.events[&COORD]).is_empty()));
    assert_eq!(finished_at(&c.events[&s1]), [epoch]);
    assert_eq!(finished_at(&c.events[&s2]), [epoch]);
    assert_eq!(finished_at(&c.events[&COORD]), [epoch]);
    // Said once.
    c.run_until(5_000 * MS, |_| false);
    assert_eq!(finished_at(&c.events[&COORD]), [epoch]);
}

#[test]
fn the_coordinator_waits_for_every_server_to_hear_that_the_job_ended() {
    let mut c = Cluster::new(2, 1, 1, Consistency::Eventual);
    let keys = Cluster::keys(8);
    let (s1, s2, w) = (NodeId(1), NodeId(2), NodeId(3));
    c.iterate(w, &keys);
    assert!(c.run_until(10_000 * MS, |c| c.iteration(w) == 1));
    // The second server hears nothing from the coordinator, and the coordinator nothing
    // from it, until the link heals.
    c.cut.insert((COORD, s2));
    c.cut.insert((s2, COORD));
    c.leave(w);
    c.run_until(300 * MS, |_| false);
    assert_eq!(finished_at(&c.events[&s1]).len(), 1);
    assert!(finished_at(&c.events[&s2]).is_empty());
    assert!(
        finished_at(&c.events[&COORD]).is_empty(),
        "a server has not heard"
    );
    c.cut.clear();
    assert!(c.run_until(5_000 * MS, |c| !finished_at(&c.events[&COORD]).is_empty()));
    assert_eq!(finished_at(&c.events[&s2]).len(), 1);
}

#[test]
fn a_job_whose_last_worker_died_has_not_finished() {
    let mut c = Cluster::new(2, 2, 1, Consistency::Eventual);
    let keys = Cluster::keys(8);
    let (w1, w2) = (NodeId(3), NodeId(4));
    c.iterate(w1, &keys);
    c.iterate(w2, &keys);
    assert!(c.run_until(10_000 * MS, |c| c.iteration(w1) == 1
        && c.iteration(w2) == 1));
    c.leave(w1);
    c.crash(w2);
    assert!(c.run_until(60_000 * MS, |c| c.config().workers.is_empty()));
    c.run_until(5_000 * MS, |_| false);
    for node in [COORD, NodeId(1), NodeId(2)] {
        assert!(finished_at(&c.events[&node]).is_empty(), "{node}");
    }
}

#[test]
fn a_job_a_server_left_ends_on_the_servers_still_in_it() {
    let mut c = Cluster::new(3, 1, 1, Consistency::Eventual);
    let keys = Cluster::keys(32);
    let w = NodeId(4);
    c.push(w, &keys, 2);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    c.driver(NodeId(1)).leave().unwrap();
    c.collect();
    assert!(c.run_until(60_000 * MS, |c| {
        c.events[&NodeId(1)].contains(&Event::Fenced)
    }));
    c.crash(NodeId(1));
    c.leave(w);
    assert!(c.run_until(5_000 * MS, |c| !finished_at(&c.events[&COORD]).is_empty()));
    assert!(finished_at(&c.events[&NodeId(1)]).is_empty());
}

#[test]
fn a_server_whose_last_word_is_lost_ends_the_job_at_the_heartbeat_timeout() {
    let mut c = Cluster::new(2, 1, 1, Consistency::Eventual);
    let keys = Cluster::keys(8);
    let (s2, w) = (NodeId(2), NodeId(3));
    c.iterate(w, &keys);
    assert!(c.run_until(10_000 * MS, |c| c.iteration(w) == 1));
    // The second server hears that the job finished and stops, but what it said last never
    // reaches the coordinator.
    c.cut.insert((s2, COORD));
    c.leave(w);
    assert!(c.run_until(1_000 * MS, |c| !finished_at(&c.events[&s2]).is_empty()));
    c.crash(s2);
    assert!(c.run_until(10_000 * MS, |c| !finished_at(&c.events[&COORD]).is_empty()));
    // Two servers, one replica: it could never have been declared dead.
    assert!(!c.coordinator().dead().contains(&s2));
}

/// The coordinator's status says what an operator needs: a healthy job is not degraded; a
/// crashed server is silent, then dead, with fewer replicas until the ring is refilled.
#[test]
fn the_status_shows_a_crashed_server_silent_then_dead_and_the_job_degraded() {
    use pserver_core::status::NodeState;
    let mut c = Cluster::new(2, 1, 1, Consistency::Eventual);
    c.run_until(1_000 * MS, |_| false);
    let healthy = c.coordinator().status();
    assert!(!healthy.is_degraded(), "{healthy}");
    assert_eq!(healthy.nodes.len(), 3);
    assert!(
        healthy.nodes.iter().all(|n| n.state == NodeState::Live),
        "{healthy}"
    );
    c.crash(NodeId(2));
    assert!(c.run_until(10_000 * MS, |c| {
        c.coordinator().status().nodes[1].state == NodeState::Silent
    }));
    assert!(c.coordinator().status().is_degraded());
    assert!(c.run_until(10_000 * MS, |c| c.settled_on(&[1])));
    let after = c.coordinator().status();
    assert_eq!(after.nodes[1].state, NodeState::Dead, "{after}");
    assert_eq!((after.replicas_held, after.replicas_asked), (0, 1));
    let text = after.to_string();
    assert!(text.contains("node n2 server dead"), "{text}");
    assert!(text.ends_with("degraded yes"), "{text}");
}

/// A job that keeps one replica waits for a lost server, and takes it back once its process
/// restarts: the earlier process's copies are gone, so nothing is kept by keeping it out.
#[test]
fn a_job_keeping_min_replicas_takes_a_restarted_server_back() {
    let mut c = Cluster::keeping(2, 1, 1, 1);
    let keys = Cluster::keys(16);
    let w = NodeId(3);
    c.push(w, &keys, 2);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    c.crash(NodeId(2));
    c.run_until(5_000 * MS, |_| false);
    assert_eq!(c.config().servers, vec![NodeId(1), NodeId(2)], "kept");
    c.start_server(NodeId(2));
    assert!(c.run_until(60_000 * MS, |c| c.settled_on(&[1, 2])));
    assert!(c.run_until(10_000 * MS, |c| c.all_hold(&keys, 2)));
    c.assert_converged(&keys);
}

/// How many times `node` said that `dead` died.
fn heard_dead(c: &Cluster, node: NodeId, dead: NodeId) -> usize {
    c.events.get(&node).map_or(0, |e| {
        e.iter().filter(|e| **e == Event::NodeDead(dead)).count()
    })
}

/// A server's death reaches every node, not only the coordinator: each live server and
/// worker says it once, when the configuration without it arrives.
#[test]
fn every_live_node_hears_once_that_a_server_was_declared_dead() {
    let mut c = Cluster::new(3, 2, 1, Consistency::Eventual);
    let keys = Cluster::keys(24);
    let w1 = NodeId(4);
    c.push(w1, &keys, 1);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w1) == 1));
    let victim = NodeId(2);
    c.crash(victim);
    let live = [COORD, NodeId(1), NodeId(3), w1, NodeId(5)];
    assert!(
        c.run_until(60_000 * MS, |c| live
            .iter()
            .all(|&n| heard_dead(c, n, victim) > 0)),
        "not every node heard: {:?}",
        live.map(|n| heard_dead(&c, n, victim))
    );
    // Later configurations do not say it again.
    c.push(w1, &keys, 1);
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w1) == 2));
    for n in live {
        assert_eq!(heard_dead(&c, n, victim), 1, "{n}");
        for other in [NodeId(1), NodeId(3), w1, NodeId(5)] {
            assert_eq!(heard_dead(&c, n, other), 0, "{n} heard that {other} died");
        }
    }
}

/// A worker whose server it cannot reach says, once, past the job's stall limit, that it
/// stalled and what it waits for; once a request completes it may say so again.
#[test]
fn a_worker_cut_off_from_its_server_says_once_that_it_stalled_and_what_it_waits_for() {
    let mut c = Cluster::new(1, 1, 0, Consistency::Eventual);
    let (s, w) = (NodeId(1), NodeId(2));
    c.driver(w).worker().unwrap().set_stall_limit(2_000 * MS);
    let stalls = |c: &Cluster| -> Vec<(Time, Vec<Wait>)> {
        c.events[&w]
            .iter()
            .filter_map(|e| match e {
                Event::Worker(WorkerEvent::Stalled {
                    for_at_least,
                    waits,
                    ..
                }) => Some((*for_at_least, waits.clone())),
                _ => None,
            })
            .collect()
    };
    let keys = Cluster::keys(8);
    c.cut.insert((w, s));
    c.push(w, &keys, 1);
    assert!(!c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    let said = stalls(&c);
    assert_eq!(said.len(), 1, "{said:?}");
    let (waited, waits) = &said[0];
    assert!(*waited >= 2_000 * MS && *waited < 3_000 * MS, "{waited}");
    assert!(!waits.is_empty());
    assert!(
        waits.iter().all(|wait| wait.server == s && wait.push),
        "{waits:?}"
    );
    // Reached again: the push completes, and a later stall is said anew.
    c.cut.remove(&(w, s));
    assert!(c.run_until(10_000 * MS, |c| c.pushes_done(w) == 1));
    assert_eq!(stalls(&c).len(), 1);
    c.cut.insert((w, s));
    c.push(w, &keys, 1);
    assert!(!c.run_until(10_000 * MS, |c| c.pushes_done(w) == 2));
    assert_eq!(stalls(&c).len(), 2);
}
