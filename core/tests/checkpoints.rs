//! Whole-job checkpoints (ARCHITECTURE.md §11), on whole clusters of drivers exchanging frames
//! on a queue with virtual time, each server's "disk" a map the test keeps: workers wait at a
//! cut until every server took its copy, and go on while the copies are written; the cut is
//! complete once every server wrote it, and never if a server's ranges changed in between; a
//! job restarted whole resumes from the newest cut every server holds, with the values it had
//! there; a checkpoint written under another ring is refused.

use pserver_core::events::{CoordinatorEvent, ServerEvent, WorkerEvent};
use std::collections::{BTreeMap, VecDeque};

use pserver_core::ring::RingConfig;
use pserver_core::wire::ShardCopy;
use pserver_core::*;

const SECOND: Time = 1_000_000_000;
const EVERY: Iteration = 2;

/// Two servers with one replica and two workers, summing pushes; a checkpoint every
/// [`EVERY`] iterations.
fn job() -> JobSpec {
    job_of(2)
}

/// [`job`] with `servers` servers.
fn job_of(servers: usize) -> JobSpec {
    let mut job = JobSpec::new(servers, 2);
    job.ring = RingConfig {
        vnodes: 4,
        replicas: 1,
        seed: 5,
        ..RingConfig::default()
    };
    job.consistency = Consistency::BoundedDelay(1);
    job.updater = Updater::Sum;
    job.checkpoint_every = EVERY;
    job
}

/// What each server wrote, by cut.
type Disk = BTreeMap<Iteration, Vec<ShardCopy<i64>>>;

struct Cluster {
    job: JobSpec,
    now: Time,
    nodes: BTreeMap<NodeId, Driver<i64>>,
    queue: VecDeque<(NodeId, NodeId, Bytes)>,
    events: BTreeMap<NodeId, Vec<Event<i64>>>,
    /// Per server, its checkpoints.
    disks: BTreeMap<NodeId, Disk>,
    /// Servers that write what they are handed at once.
    writing: bool,
}

impl Cluster {
    /// The job's nodes, every server offering the cuts `offered` gives it, started.
    fn start(job: JobSpec, disks: BTreeMap<NodeId, Disk>, offered: &[(NodeId, Vec<u32>)]) -> Self {
        let mut nodes = BTreeMap::new();
        let layout = job.layout();
        for id in std::iter::once(layout.coordinator())
            .chain(layout.servers())
            .chain(layout.workers())
        {
            let mut driver = job.driver::<i64>(id, 1).unwrap();
            if let Some((_, cuts)) = offered.iter().find(|(s, _)| *s == id) {
                driver
                    .server()
                    .unwrap()
                    .offer_checkpoints(cuts.clone())
                    .unwrap();
            }
            nodes.insert(id, driver);
        }
        for d in nodes.values_mut() {
            d.start(0);
        }
        let mut c = Cluster {
            job,
            now: 0,
            nodes,
            queue: VecDeque::new(),
            events: BTreeMap::new(),
            disks,
            writing: true,
        };
        c.collect();
        c
    }

    fn servers(&self) -> Vec<NodeId> {
        self.job.layout().servers().collect()
    }

    fn workers(&self) -> Vec<NodeId> {
        self.job.layout().workers().collect()
    }

    fn driver(&mut self, id: NodeId) -> &mut Driver<i64> {
        self.nodes.get_mut(&id).unwrap()
    }

    /// Moves frames to the queue and events to the log; a server handed its shards writes
    /// them to its disk (when `writing`), one restoring reads them back.
    fn collect(&mut self) {
        let now = self.now;
        for (&id, d) in &mut self.nodes {
            loop {
                while let Some(t) = d.poll_transmit() {
                    self.queue.push_back((id, t.to, t.frame));
                }
                let Some(event) = d.poll_event() else {
                    break;
                };
                match &event {
                    Event::Server(ServerEvent::CheckpointDue { cut, shards }) if self.writing => {
                        let disk = self.disks.entry(id).or_default();
                        disk.insert(*cut, shards.clone());
                        d.server().unwrap().checkpoint_written(now, *cut).unwrap();
                    }
                    Event::Server(ServerEvent::Restore { cut }) => {
                        let shards = self.disks[&id][cut].clone();
                        d.server().unwrap().restore(now, *cut, shards).unwrap();
                    }
                    _ => {}
                }
                self.events.entry(id).or_default().push(event);
            }
        }
    }

    fn run_until(&mut self, limit: Time, mut done: impl FnMut(&Cluster) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if let Some((from, to, frame)) = self.queue.pop_front() {
                let now = self.now;
                if let Some(d) = self.nodes.get_mut(&to) {
                    d.handle_frame(now, from, &frame);
                }
            } else {
                let next = self
                    .nodes
                    .iter()
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

    /// The shards `server` was last handed, written to its disk now.
    fn write_due(&mut self, server: NodeId) -> Iteration {
        let (cut, shards) = self.events[&server]
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::Server(ServerEvent::CheckpointDue { cut, shards }) => {
                    Some((*cut, shards.clone()))
                }
                _ => None,
            })
            .expect("shards were handed out");
        self.disks.entry(server).or_default().insert(cut, shards);
        let now = self.now;
        self.driver(server)
            .server()
            .unwrap()
            .checkpoint_written(now, cut)
            .unwrap();
        self.collect();
        cut
    }

    /// The cuts `server` was handed its shards of, in order.
    fn handed(&self, server: NodeId) -> Vec<Iteration> {
        self.events.get(&server).map_or_else(Vec::new, |events| {
            events
                .iter()
                .filter_map(|e| match e {
                    Event::Server(ServerEvent::CheckpointDue { cut, .. }) => Some(*cut),
                    _ => None,
                })
                .collect()
        })
    }

    /// What `pserver status` prints of the coordinator.
    fn status(&self) -> String {
        let coordinator = self.nodes[&self.job.layout().coordinator()].node();
        coordinator.as_coordinator().unwrap().status().to_string()
    }

    /// The checkpoints the coordinator's configuration records.
    fn recorded(&self) -> wire::Checkpoints {
        self.nodes[&self.job.layout().coordinator()]
            .node()
            .config()
            .map(|k| k.checkpoints)
            .unwrap_or_default()
    }

    fn said(&self, node: NodeId, what: impl Fn(&Event<i64>) -> bool) -> bool {
        self.events.get(&node).is_some_and(|e| e.iter().any(what))
    }

    fn iteration(&self, worker: NodeId) -> Iteration {
        self.nodes[&worker].node().as_worker().unwrap().iteration()
    }

    fn ready(&mut self) {
        let workers = self.workers();
        let ready = self.run_until(20 * SECOND, |c| {
            workers
                .iter()
                .all(|&w| c.said(w, |e| matches!(e, Event::Ready { .. })))
        });
        assert!(ready, "every worker starts");
    }

    /// Every worker pushes `value` to every key, then asks to advance.
    fn iterate(&mut self, value: i64) {
        let now = self.now;
        for w in self.workers() {
            let kvs = KvPairs::new(keys(), vec![value; keys().len()], 1).unwrap();
            self.driver(w).worker().unwrap().push(now, kvs).unwrap();
            self.driver(w).worker().unwrap().advance(now).unwrap();
        }
        self.collect();
    }

    /// Runs until every worker is in `iteration`.
    fn reach(&mut self, iteration: Iteration) -> bool {
        let workers = self.workers();
        self.run_until(30 * SECOND, |c| {
            workers.iter().all(|&w| c.iteration(w) >= iteration)
        })
    }

    /// Pulls every key from the first worker.
    fn pull(&mut self) -> Vec<i64> {
        let now = self.now;
        let worker = self.workers()[0];
        let list = KeyList::new(keys()).unwrap();
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
    (0..32).map(|i| i * (u64::MAX / 32)).collect()
}

/// A job run through `iterations` iterations, each worker pushing `i + 1` to every key in
/// iteration `i`: every checkpoint it took is on its servers' disks.
fn run(iterations: Iteration) -> Cluster {
    let mut c = Cluster::start(job(), BTreeMap::new(), &[]);
    c.ready();
    for i in 0..iterations {
        c.iterate(i64::from(i) + 1);
        assert!(c.reach(i + 1), "the workers enter iteration {}", i + 1);
    }
    c
}

/// What every key holds after `iterations` iterations of [`run`]'s two workers.
fn total(iterations: Iteration) -> i64 {
    2 * (1..=i64::from(iterations)).sum::<i64>()
}

/// The ranges `server` holds, primary and replica alike.
fn held(c: &Cluster, server: NodeId) -> Vec<KeyRange> {
    let server = c.nodes[&server].node().as_server().unwrap();
    server.shards().map(|(range, _)| range).collect()
}

/// Every value in `shards`.
fn rows_of(shards: &[ShardCopy<i64>]) -> Vec<i64> {
    let mut rows = Vec::new();
    for t in shards {
        t.rows
            .for_each_run(&mut |_, values, _| rows.extend_from_slice(values));
    }
    rows
}

/// Workers wait before a cut until every server took its copy, and go on while the copies are
/// written; the copies keep the values of the cut whatever is pushed after; the cut is
/// recorded complete once every server wrote its copy; a server takes the next cut only once
/// its last copy is written, so the workers wait for a disk slower than their iterations.
#[test]
fn workers_go_on_once_every_server_took_its_copy_and_the_cut_is_complete_once_written() {
    let mut c = Cluster::start(job(), BTreeMap::new(), &[]);
    c.ready();
    c.writing = false;
    c.iterate(1);
    assert!(c.reach(1), "iteration 1 is no cut: the workers enter it");
    for w in c.workers() {
        let kvs = KvPairs::new(keys(), vec![2; keys().len()], 1).unwrap();
        let now = c.now;
        c.driver(w).worker().unwrap().push(now, kvs).unwrap();
    }
    c.collect();
    // The pushes of iteration 1 are in, and the workers have not asked to leave it: nobody
    // copies anything.
    c.run_until(10 * SECOND, |_| false);
    let servers = c.servers();
    assert!(servers.iter().all(|&s| c.handed(s).is_empty()));
    for w in c.workers() {
        let now = c.now;
        c.driver(w).worker().unwrap().advance(now).unwrap();
    }
    c.collect();
    assert!(
        c.reach(EVERY),
        "once every server took its copy, the workers go on"
    );
    for &s in &servers {
        assert_eq!(c.handed(s), [EVERY], "{s} took its copy of the cut");
        assert!(
            !c.nodes[&s].is_idle(),
            "{s} is not done while its copy is unwritten"
        );
    }
    let recorded = c.recorded();
    assert_eq!((recorded.taken, recorded.complete), (EVERY, 0));
    assert!(c.said(NodeId(0), |e| matches!(
        e,
        Event::Coordinator(CoordinatorEvent::CheckpointTaken { cut: EVERY })
    )));
    let status = c.status();
    assert!(
        status.contains("checkpoint none yet, every 2\n"),
        "{status}"
    );
    assert!(
        status.contains("writing checkpoint before iteration 2\n"),
        "{status}"
    );
    // Iteration 2 pushed into the stores: the copies still hold the values of the cut.
    c.iterate(3);
    assert!(c.reach(EVERY + 1));
    for &s in &servers {
        let rows = c.events[&s]
            .iter()
            .find_map(|e| match e {
                Event::Server(ServerEvent::CheckpointDue { shards, .. }) => Some(rows_of(shards)),
                _ => None,
            })
            .unwrap_or_default();
        assert!(!rows.is_empty(), "{s} holds keys");
        assert!(rows.iter().all(|&v| v == total(2)), "{s} copied {rows:?}");
    }
    // Iteration 3 done: the next cut waits for the copies of the last to be written.
    c.iterate(4);
    c.run_until(10 * SECOND, |_| false);
    for w in c.workers() {
        assert_eq!(
            c.iteration(w),
            2 * EVERY - 1,
            "{w} waits before the next cut"
        );
        let kvs = KvPairs::new(keys(), vec![1; keys().len()], 1).unwrap();
        let now = c.now;
        assert!(
            matches!(
                c.driver(w).worker().unwrap().push(now, kvs),
                Err(DriverError::Worker(WorkerError::AtCheckpoint { cut: 4 }))
            ),
            "a push while {w} waits at the cut is refused"
        );
    }
    assert!(servers.iter().all(|&s| c.handed(s) == [EVERY]));
    let first = servers[0];
    assert_eq!(c.write_due(first), EVERY);
    c.run_until(10 * SECOND, |_| false);
    assert_eq!(
        c.handed(first),
        [EVERY, 2 * EVERY],
        "written, it takes the next"
    );
    assert!(
        c.workers().iter().all(|&w| c.iteration(w) == 2 * EVERY - 1),
        "one server's copy is not the ring's"
    );
    let recorded = c.recorded();
    assert_eq!(
        (recorded.taken, recorded.complete),
        (EVERY, 0),
        "one server's write is not the ring's"
    );
    assert!(!c.said(NodeId(0), |e| matches!(
        e,
        Event::Coordinator(CoordinatorEvent::CheckpointComplete { .. })
    )));
    let second = servers[1];
    assert_eq!(c.write_due(second), EVERY);
    assert!(
        c.reach(2 * EVERY),
        "both wrote the first cut and took the second"
    );
    assert!(c.said(NodeId(0), |e| matches!(
        e,
        Event::Coordinator(CoordinatorEvent::CheckpointComplete { cut: EVERY })
    )));
    let recorded = c.recorded();
    assert_eq!((recorded.taken, recorded.complete), (2 * EVERY, EVERY));
    let status = c.status();
    assert!(
        status.contains("checkpoint before iteration 2, every 2\n")
            && status.contains("writing checkpoint before iteration 4\n"),
        "{status}"
    );
    for &s in &servers {
        let rows = rows_of(&c.disks[&s][&EVERY]);
        assert!(rows.iter().all(|&v| v == total(2)), "{s} wrote {rows:?}");
        assert_eq!(c.write_due(s), 2 * EVERY);
        assert!(c.nodes[&s].is_idle(), "{s} wrote everything it took");
        let now = c.now;
        assert!(matches!(
            c.driver(s)
                .server()
                .unwrap()
                .checkpoint_written(now, 2 * EVERY),
            Err(node::CheckpointError::NotDue { cut: 4 })
        ));
    }
    c.run_until(10 * SECOND, |_| false);
    assert_eq!(c.recorded().complete, 2 * EVERY);
    assert!(!c.status().contains("writing"), "{}", c.status());
    for &s in &servers {
        let rows = rows_of(&c.disks[&s][&(2 * EVERY)]);
        assert!(rows.iter().all(|&v| v == total(4)), "{s} wrote {rows:?}");
    }
}

/// A server whose ranges change after it took its copy of a cut (here, one of three servers
/// leaves before it wrote its copy, and the other two take its ranges) does not say it wrote
/// the cut, and what it said before the change no longer counts: the copy is of the ranges it
/// held then, which a restart on the new ring could not load, and its store has moved past
/// the cut, so the cut is never recorded complete. The next cut is taken and completed on the
/// new ring.
#[test]
fn a_cut_whose_ring_changed_before_it_was_written_is_never_complete() {
    let mut c = Cluster::start(job_of(3), BTreeMap::new(), &[]);
    c.ready();
    c.writing = false;
    for i in 0..EVERY {
        c.iterate(i64::from(i) + 1);
        assert!(c.reach(i + 1));
    }
    assert_eq!(c.recorded().taken, EVERY);
    let servers = c.servers();
    let (leaver, ring) = (servers[2], vec![servers[0], servers[1]]);
    let held_before: Vec<Vec<KeyRange>> = ring.iter().map(|&s| held(&c, s)).collect();
    // The two that stay write theirs, and say so, before the third leaves.
    for &s in &ring {
        assert_eq!(c.write_due(s), EVERY);
    }
    c.run_until(SECOND, |_| false);
    assert_eq!(c.recorded().complete, 0, "{leaver} did not write its copy");
    c.driver(leaver).leave().unwrap();
    c.collect();
    let on_new_ring = |c: &Cluster, id: NodeId| {
        c.nodes[&id]
            .node()
            .config()
            .is_some_and(|k| k.servers == ring && !k.is_changing())
    };
    let coordinator = c.job.layout().coordinator();
    let left = c.run_until(60 * SECOND, |c| {
        on_new_ring(c, coordinator) && ring.iter().all(|&s| on_new_ring(c, s))
    });
    assert!(left, "{leaver} leaves the ring");
    for (&s, before) in ring.iter().zip(&held_before) {
        assert_ne!(held(&c, s), *before, "{s} took ranges of {leaver}");
    }
    c.run_until(10 * SECOND, |_| false);
    assert_eq!(
        c.recorded().complete,
        0,
        "the copies are of the ranges held before"
    );
    for i in EVERY..2 * EVERY {
        c.iterate(i64::from(i) + 1);
        assert!(c.reach(i + 1), "the next cut is taken on the new ring");
    }
    for &s in &ring {
        assert_eq!(c.handed(s), [EVERY, 2 * EVERY]);
        assert_eq!(c.write_due(s), 2 * EVERY);
    }
    c.run_until(10 * SECOND, |_| false);
    let recorded = c.recorded();
    assert_eq!((recorded.taken, recorded.complete), (2 * EVERY, 2 * EVERY));
    assert!(
        !c.said(coordinator, |e| matches!(
            e,
            Event::Coordinator(CoordinatorEvent::CheckpointComplete { cut: EVERY })
        )),
        "the first cut was never complete"
    );
    for &s in &ring {
        let rows = rows_of(&c.disks[&s][&(2 * EVERY)]);
        assert_eq!(rows.len(), keys().len(), "{s} holds every key");
        assert!(rows.iter().all(|&v| v == total(4)), "{s} wrote {rows:?}");
    }
}

#[test]
fn a_job_restarted_whole_resumes_from_the_newest_cut_every_server_holds() {
    let done = run(5);
    let servers = done.servers();
    for s in &servers {
        let cuts: Vec<_> = done.disks[s].keys().copied().collect();
        assert_eq!(cuts, [2, 4], "{s} wrote every cut");
    }
    // The first server lost its newest checkpoint (torn, say): the job resumes from the one
    // before, which every server holds.
    let disks = done.disks.clone();
    let offered = [(servers[0], vec![2]), (servers[1], vec![2, 4])];
    let mut c = Cluster::start(job(), disks, &offered);
    c.ready();
    for s in &servers {
        assert!(c.said(*s, |e| matches!(
            e,
            Event::Server(ServerEvent::Restore { cut: 2 })
        )));
    }
    for w in c.workers() {
        assert_eq!(c.iteration(w), 2, "{w} starts in the cut's iteration");
        let worker = c.nodes[&w].node().as_worker().unwrap();
        assert_eq!(worker.resumed_from(), Some(2));
    }
    assert!(
        c.pull().iter().all(|&v| v == total(2)),
        "the values of the cut"
    );
    // Iterations 2 and 3 again, and on past the next cut.
    for i in 2..5 {
        c.iterate(i64::from(i) + 1);
        assert!(c.reach(i + 1), "the workers enter iteration {}", i + 1);
    }
    assert!(c.pull().iter().all(|&v| v == total(5)), "nothing twice");
}

#[test]
fn every_server_offering_all_its_cuts_resumes_from_the_newest() {
    let done = run(5);
    let offered: Vec<_> = done
        .servers()
        .into_iter()
        .map(|s| (s, vec![2, 4]))
        .collect();
    let mut c = Cluster::start(job(), done.disks.clone(), &offered);
    c.ready();
    assert!(c.workers().iter().all(|&w| c.iteration(w) == 4));
    assert!(c.pull().iter().all(|&v| v == total(4)));
}

#[test]
fn a_checkpoint_written_under_another_ring_is_refused() {
    let done = run(3);
    let mut other = job();
    other.ring.seed = 6;
    let server = done.servers()[0];
    let mut driver = other.driver::<i64>(server, 1).unwrap();
    driver.server().unwrap().offer_checkpoints(vec![2]).unwrap();
    // The configuration of a job resuming from cut 2, on a ring of another seed.
    let servers: Vec<NodeId> = other.layout().servers().collect();
    let workers: Vec<NodeId> = other.layout().workers().collect();
    let coordinator =
        node::Coordinator::bootstrapped(other.coordinator_config(), &servers, &workers).unwrap();
    let mut config = coordinator.config().unwrap().clone();
    config.checkpoints.complete = 2;
    driver.start_configured(0, config);
    let restore = std::iter::from_fn(|| driver.poll_event())
        .any(|e| e == Event::Server(ServerEvent::Restore { cut: 2 }));
    assert!(restore);
    let shards = done.disks[&server][&2].clone();
    let refused = driver.server().unwrap().restore(0, 2, shards);
    assert!(
        matches!(
            refused,
            Err(node::CheckpointError::MissingRange { cut: 2, .. })
        ),
        "{refused:?}"
    );
}

/// A configuration that comes while a resuming server reads its shards waits for them: the
/// server adopts it once they are loaded, so that a ring change never cuts or ships the
/// still-empty shards, and it holds the checkpoint's rows.
#[test]
fn a_configuration_that_comes_while_the_shards_are_read_is_adopted_after_them() {
    let done = run(3);
    let job = job();
    let server = done.servers()[0];
    let coordinator_id = job.layout().coordinator();
    let mut driver = job.driver::<i64>(server, 1).unwrap();
    driver.server().unwrap().offer_checkpoints(vec![2]).unwrap();
    let servers: Vec<NodeId> = job.layout().servers().collect();
    let workers: Vec<NodeId> = job.layout().workers().collect();
    let coordinator =
        node::Coordinator::bootstrapped(job.coordinator_config(), &servers, &workers).unwrap();
    let mut config = coordinator.config().unwrap().clone();
    config.checkpoints.complete = 2;
    driver.start_configured(0, config.clone());
    let restore = std::iter::from_fn(|| driver.poll_event())
        .any(|e| e == Event::Server(ServerEvent::Restore { cut: 2 }));
    assert!(restore);
    let mut next = config;
    next.epoch += 1;
    let env = wire::Envelope::new(
        coordinator_id,
        server,
        next.epoch,
        wire::Message::<i64>::Config(next),
    );
    let frame = wire::Codec::default().encode(&env).unwrap();
    driver.handle_frame(0, coordinator_id, &frame);
    assert_eq!(
        driver.node().epoch(),
        1,
        "adopted before the shards were loaded"
    );
    let shards = done.disks[&server][&2].clone();
    driver
        .server()
        .unwrap()
        .restore(0, 2, shards.clone())
        .unwrap();
    assert_eq!(driver.node().epoch(), 2, "not adopted once they were");
    let held = driver.node().as_server().unwrap();
    let mut rows = 0;
    for copy in &shards {
        copy.rows.for_each_run(&mut |keys, values, _| {
            for (&k, &v) in keys.iter().zip(values) {
                assert_eq!(held.value(k), Some(&[v][..]), "key {k}");
                rows += 1;
            }
        });
    }
    assert!(rows > 0);
}

/// A server's snapshot is what a checkpoint writes: taken at the cut, it holds what the
/// checkpoint was handed; it keeps the values it was taken with whatever is pushed after,
/// while a snapshot taken later holds the new ones.
#[test]
fn a_snapshot_taken_at_the_cut_is_the_checkpoint_and_keeps_its_values() {
    let mut c = run(EVERY);
    let servers = c.servers();
    let mut at_cut = BTreeMap::new();
    for &s in &servers {
        let handed = c.events[&s]
            .iter()
            .find_map(|e| match e {
                Event::Server(ServerEvent::CheckpointDue { cut: EVERY, shards }) => {
                    Some(shards.clone())
                }
                _ => None,
            })
            .expect("the cut was handed out");
        let snapshot = c.driver(s).server().unwrap().snapshot();
        assert_eq!(snapshot, handed, "{s}: nothing was pushed since the cut");
        assert!(!rows_of(&snapshot).is_empty());
        assert!(rows_of(&snapshot).iter().all(|&v| v == total(EVERY)), "{s}");
        at_cut.insert(s, snapshot);
    }
    c.iterate(10);
    assert!(c.reach(EVERY + 1));
    // Under bounded delay the workers go on before their pushes are in: let them land.
    c.run_until(10 * SECOND, |_| false);
    for &s in &servers {
        let kept = &at_cut[&s];
        assert!(rows_of(kept).iter().all(|&v| v == total(EVERY)), "{s}");
        let now = c.driver(s).server().unwrap().snapshot();
        assert!(
            rows_of(&now).iter().all(|&v| v == total(EVERY) + 20),
            "{s}: {:?}",
            rows_of(&now)
        );
        assert_eq!(
            now.iter().map(|c| c.range).collect::<Vec<_>>(),
            kept.iter().map(|c| c.range).collect::<Vec<_>>()
        );
    }
}
