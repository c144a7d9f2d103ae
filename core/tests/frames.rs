//! A job at the smallest frame limit `JobSpec::validate` accepts, on a network that loses
//! frames: every message fits, replication batches and copies included, and every push is
//! applied exactly once.

use pserver_core::events::WorkerEvent;
use std::collections::{BTreeMap, VecDeque};

use pserver_core::ring::RingConfig;
use pserver_core::wire::{Codec, Message};
use pserver_core::*;

const MS: Time = 1_000_000;

/// A job of 3 servers with one replica and 2 workers, its frames limited to `frame` bytes.
fn job(consistency: Consistency, frame: Option<usize>) -> JobSpec {
    let mut job = JobSpec::new(3, 2);
    job.ring = RingConfig {
        vnodes: 16,
        replicas: 1,
        seed: 7,
        ..RingConfig::default()
    };
    job.consistency = consistency;
    job.updater = Updater::Sum;
    let frame = frame.unwrap_or_else(|| job.smallest_frame::<i64>());
    job.max_frame = frame;
    job.max_slice_bytes = frame;
    job.max_reply_bytes = frame;
    job.validate::<i64>().unwrap();
    job
}

/// Every key's primary holds `total`, and no node built a frame over `frame` bytes.
fn assert_exact(c: &Net, keys: &[Key], total: i64, frame: usize, consistency: Consistency) {
    assert!(
        c.largest <= frame,
        "{consistency:?}: a frame of {} bytes over {frame}",
        c.largest
    );
    for d in c.nodes.values() {
        assert_eq!(
            d.refusals().unencodable,
            0,
            "{} built a frame too large",
            d.id()
        );
    }
    let config = c.nodes[&NodeId(0)]
        .node()
        .as_coordinator()
        .and_then(|c| c.config().cloned())
        .unwrap();
    let ring = config.ring_in_force().unwrap();
    for &k in keys {
        let server = c.nodes[&ring.primary(k)].node().as_server().unwrap();
        assert_eq!(
            server.received_total(k),
            vec![total],
            "key {k}, {consistency:?}"
        );
    }
}

fn keys() -> Vec<Key> {
    (0..400u64).map(|i| i * (u64::MAX / 400)).collect()
}

#[test]
fn a_job_at_its_smallest_frame_carries_every_push_exactly_once_over_a_lossy_network() {
    for consistency in [Consistency::Eventual, Consistency::Sequential] {
        let job = job(consistency, None);
        let mut c = Net::start(&job);
        let keys = keys();
        c.run(
            |c| c.workers.iter().all(|w| c.ready.contains(w)),
            consistency,
        );
        c.push_all(&keys, 3);
        c.run(|c| c.durable_each(3), consistency);
        // Each push once: 3 x 1 from one worker, 3 x 2 from the other.
        assert_exact(&c, &keys, 9, job.max_frame, consistency);
    }
}

/// Frames of a datagram through a server's crash: its ranges fail over, and the new replicas'
/// copies are cut to fit, in sequential mode by the rows of the pushes buffered for
/// unfinished iterations too (a 6 KB copy at this limit when they were not).
#[test]
fn datagram_frames_carry_the_copies_of_a_fail_over() {
    const DATAGRAM: usize = 1_472;
    for consistency in [
        Consistency::Eventual,
        Consistency::BoundedDelay(1),
        Consistency::Sequential,
    ] {
        let job = job(consistency, Some(DATAGRAM));
        let mut c = Net::start(&job);
        let keys = keys();
        c.run(
            |c| c.workers.iter().all(|w| c.ready.contains(w)),
            consistency,
        );
        c.push_all(&keys, 3);
        c.run(|c| c.durable_each(3), consistency);
        c.down = Some(NodeId(1));
        c.push_all(&keys, 3);
        c.run(|c| c.durable_each(6), consistency);
        assert!(c.copies > 0, "{consistency:?}: no range was copied");
        assert_exact(&c, &keys, 18, DATAGRAM, consistency);
    }
}

/// The job's nodes on one FIFO queue with virtual time, every tenth frame lost; a node that
/// is `down` receives nothing, sends nothing and fires no timers.
struct Net {
    nodes: BTreeMap<NodeId, Driver<i64>>,
    workers: Vec<NodeId>,
    queue: VecDeque<(NodeId, NodeId, Bytes)>,
    now: Time,
    sent: u64,
    largest: usize,
    copies: u64,
    down: Option<NodeId>,
    ready: std::collections::BTreeSet<NodeId>,
    durable: BTreeMap<NodeId, usize>,
}

impl Net {
    fn start(job: &JobSpec) -> Self {
        let mut nodes: BTreeMap<NodeId, Driver<i64>> = job
            .node_ids()
            .into_iter()
            .map(|id| (id, job.driver::<i64>(id, 1).unwrap()))
            .collect();
        for d in nodes.values_mut() {
            d.start(0);
        }
        Net {
            nodes,
            workers: job.layout().workers().collect(),
            queue: VecDeque::new(),
            now: 0,
            sent: 0,
            largest: 0,
            copies: 0,
            down: None,
            ready: Default::default(),
            durable: BTreeMap::new(),
        }
    }

    fn durable_each(&self, n: usize) -> bool {
        self.workers.iter().all(|w| self.durable.get(w) == Some(&n))
    }

    /// Each worker pushes `keys` `times` times, worker `i` the value `1 + i`.
    fn push_all(&mut self, keys: &[Key], times: usize) {
        for (i, &w) in self.workers.iter().enumerate() {
            for _ in 0..times {
                let kvs = KvPairs::new(keys.to_vec(), vec![1 + i as i64; keys.len()], 1).unwrap();
                self.nodes
                    .get_mut(&w)
                    .unwrap()
                    .worker()
                    .unwrap()
                    .push(self.now, kvs)
                    .unwrap();
            }
        }
    }

    fn collect(&mut self) {
        let codec = Codec::new(usize::MAX);
        for (&id, d) in &mut self.nodes {
            while let Some(t) = d.poll_transmit() {
                if self.down == Some(id) {
                    continue;
                }
                self.sent += 1;
                self.largest = self.largest.max(t.frame.len());
                if let Ok(Message::Transfer(_)) = codec.decode::<i64>(&t.frame).map(|e| e.body) {
                    self.copies += 1;
                }
                if self.sent % 10 != 0 {
                    self.queue.push_back((id, t.to, t.frame));
                }
            }
            while let Some(e) = d.poll_event() {
                match e {
                    Event::Worker(WorkerEvent::PushDurable(_)) => {
                        *self.durable.entry(id).or_default() += 1
                    }
                    Event::Ready { .. } => {
                        self.ready.insert(id);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Delivers frames and fires timers until `done` holds; fails the test past ten minutes
    /// of virtual time.
    fn run(&mut self, done: impl Fn(&Net) -> bool, consistency: Consistency) {
        let end = self.now + 600_000 * MS;
        loop {
            self.collect();
            if done(self) {
                return;
            }
            if let Some((from, to, frame)) = self.queue.pop_front() {
                if self.down != Some(to) {
                    let now = self.now;
                    self.nodes
                        .get_mut(&to)
                        .unwrap()
                        .handle_frame(now, from, &frame);
                }
                continue;
            }
            let next = self
                .nodes
                .iter()
                .filter(|(id, _)| self.down != Some(**id))
                .filter_map(|(&id, d)| Some((d.poll_timeout()?, id)))
                .min();
            match next {
                Some((at, id)) if at <= end => {
                    self.now = self.now.max(at);
                    let now = self.now;
                    self.nodes.get_mut(&id).unwrap().handle_timeout(now);
                }
                _ => panic!(
                    "{consistency:?}: stalled at {} ms, durable {:?}, largest frame {}, unencodable {:?}",
                    self.now / MS,
                    self.durable,
                    self.largest,
                    self.nodes
                        .values()
                        .map(|d| (d.id(), d.refusals().unencodable))
                        .collect::<Vec<_>>()
                ),
            }
        }
    }
}
