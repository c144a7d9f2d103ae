//! pserver's core inside a network stack of your own: here, one thread per node and channels.
//!
//! The core never opens a socket, reads a clock or spawns a thread. Each node lives in a
//! [`Driver`], and this loop around it is everything a network stack has to provide:
//!
//! 1. once, first: `driver.start(now)` (servers and workers register with the coordinator);
//! 2. a frame arrived from peer `from`: `driver.handle_frame_bytes(now, from, &frame)`;
//! 3. the deadline passed: `driver.handle_timeout(now)`;
//! 4. after every call, poll `driver.poll_output()` until it says `Output::Wait`: send each
//!    `Output::Transmit` to its `to`, act on each `Output::Event` (a worker's application
//!    pushes, pulls and advances from there, through `driver.worker()?`);
//! 5. sleep until the next frame or the deadline `Output::Wait` gave, whichever comes first.
//!
//! Bytes and time go in; frames, one deadline and events come out. The transport may lose,
//! duplicate or reorder frames like UDP (the nodes retransmit and de-duplicate); it only has to
//! say truthfully which peer a frame came from. Here a "socket" is an mpsc channel and the clock
//! is nanoseconds since one `Instant`: put real ones in their place and nothing else changes.
//!
//! The job: a coordinator, 2 servers and 3 workers under bounded delay 1. Each worker pushes 1
//! to each of 100 keys per iteration for 10 iterations, pulling before each push; at the end
//! every key must hold exactly 30.

use pserver_core::events::WorkerEvent;
use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use pserver_core::{
    Bytes, Consistency, Driver, Event, Iteration, JobSpec, Key, KeyList, KeySelection, KvPairs,
    NodeId, Output, RequestId, Time,
};

const SERVERS: [NodeId; 2] = [NodeId(1), NodeId(2)];
const WORKERS: [NodeId; 3] = [NodeId(3), NodeId(4), NodeId(5)];
const KEYS: u64 = 100;
const ITERATIONS: Iteration = 10;
const TAU: Iteration = 1;
/// What every key must hold at the end: each worker pushes 1 per iteration.
const TOTAL: i64 = WORKERS.len() as i64 * ITERATIONS as i64;
const WALL_LIMIT: Duration = Duration::from_secs(30);

/// Crosses threads, so it must be `Send`; `?` converts the core's errors into it.
type BoxError = Box<dyn Error + Send + Sync>;

/// What arrives on a node's one "socket".
enum Inbox {
    /// A frame, with the peer it came from as the transport saw it.
    Frame(NodeId, Bytes),
    /// The job is over. A message rather than dropped senders, because every node holds a
    /// sender to every other, itself included.
    Stop,
}

/// One sender per node, indexed by node id: the whole routing table of this network.
type Network = Vec<Sender<Inbox>>;

/// A worker telling main that it finished (`Ok`), or any node telling main why it gave up.
type Status = (NodeId, Result<(), String>);

/// The nanosecond clock every driver is fed: one origin for the process, so that deadlines
/// computed on one thread mean the same on another.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> Time {
        self.0.elapsed().as_nanos() as Time
    }
}

/// The keys every worker touches, spread over the whole key space so that both servers own
/// some of them.
fn keys() -> Vec<Key> {
    (0..KEYS).map(|i| i * (u64::MAX / 128)).collect()
}

/// A worker's application, as a state machine driven by the driver's events. Exactly one
/// request is outstanding at a time apart from pushes, which keeps every step easy to check.
struct Workload {
    id: NodeId,
    keys: Vec<Key>,
    phase: Phase,
    pushes_issued: u64,
    pushes_done: u64,
    status: Sender<Status>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first configuration.
    Registering,
    /// `advance` called; waiting for the consistency model to let the worker in.
    Advancing,
    /// The pull of this iteration is out.
    Pulling {
        request: RequestId,
        iteration: Iteration,
    },
    /// Past the last iteration; waiting for the last pushes to be acknowledged.
    Draining,
    /// Reported to main; nothing more to do but serve the protocol until stopped.
    Finished,
}

impl Workload {
    fn new(id: NodeId, status: Sender<Status>) -> Self {
        Workload {
            id,
            keys: keys(),
            phase: Phase::Registering,
            pushes_issued: 0,
            pushes_done: 0,
            status,
        }
    }

    fn on_event(
        &mut self,
        d: &mut Driver<i64>,
        now: Time,
        event: Event<i64>,
    ) -> Result<(), BoxError> {
        match (self.phase, event) {
            (Phase::Registering, Event::Ready { .. }) => self.work(d, now)?,
            (Phase::Advancing, Event::Worker(WorkerEvent::Advanced(i))) if i < ITERATIONS => {
                let keys = KeySelection::Keys(KeyList::new(self.keys.clone())?);
                let request = d.worker()?.pull(now, keys)?;
                self.phase = Phase::Pulling {
                    request,
                    iteration: i,
                };
            }
            (Phase::Advancing, Event::Worker(WorkerEvent::Advanced(_))) => {
                self.phase = Phase::Draining;
                self.finish_if_drained();
            }
            (
                Phase::Pulling { request, iteration },
                Event::Worker(WorkerEvent::PullDone(id, kvs)),
            ) if id == request => {
                self.check_pull(iteration, &kvs)?;
                self.work(d, now)?;
            }
            (_, Event::Worker(WorkerEvent::PushDone(_))) => {
                self.pushes_done += 1;
                self.finish_if_drained();
            }
            // Follows `PushDone`; this job has no replicas to wait for.
            (_, Event::Worker(WorkerEvent::PushDurable(_))) => {}
            (_, Event::Refused { from, reason }) => note_refusal(d.id(), from, &reason),
            (phase, event) => return Err(format!("{event:?} while {phase:?}").into()),
        }
        Ok(())
    }

    /// One iteration's work: push 1 to every key, then end the iteration.
    fn work(&mut self, d: &mut Driver<i64>, now: Time) -> Result<(), BoxError> {
        let ones = vec![1; self.keys.len()];
        let mut worker = d.worker()?;
        worker.push(now, KvPairs::new(self.keys.clone(), ones, 1)?)?;
        self.pushes_issued += 1;
        worker.advance(now)?;
        self.phase = Phase::Advancing;
        Ok(())
    }

    /// Bounded delay `TAU`: a pull from iteration `c` is answered only once every worker has
    /// finished every iteration below `c - TAU` (all its pushes acknowledged, so applied), so it
    /// sees at least those pushes. It can never see more than the whole job pushes.
    fn check_pull(&self, iteration: Iteration, kvs: &KvPairs<i64>) -> Result<(), BoxError> {
        if kvs.keys() != self.keys.as_slice() {
            return Err(format!("pull in iteration {iteration} answered other keys").into());
        }
        let settled = iteration.saturating_sub(TAU);
        let floor = WORKERS.len() as i64 * i64::from(settled);
        for (key, row) in kvs.iter() {
            let value = row.first().copied().unwrap_or_default();
            if !(floor..=TOTAL).contains(&value) {
                return Err(format!(
                    "pull in iteration {iteration} read {value} for key {key:#x}, \
                     expected {floor}..={TOTAL}"
                )
                .into());
            }
        }
        Ok(())
    }

    fn finish_if_drained(&mut self) {
        if self.phase == Phase::Draining && self.pushes_done == self.pushes_issued {
            self.phase = Phase::Finished;
            // Main may already have given up and gone; nothing to tell then.
            let _ = self.status.send((self.id, Ok(())));
        }
    }
}

/// Coordinator and servers run no application; they only have to say when something went
/// wrong that this fault-free run should never see.
fn on_infrastructure_event(d: &Driver<i64>, event: Event<i64>) -> Result<(), BoxError> {
    match event {
        Event::Ready { .. } => Ok(()),
        Event::Refused { from, reason } => {
            note_refusal(d.id(), from, &reason);
            Ok(())
        }
        other => Err(format!("unexpected {other:?}").into()),
    }
}

/// Refusals are the protocol working (a late duplicate, say), not failures; they are shown
/// because silently dropped input hides bugs.
fn note_refusal(me: NodeId, from: NodeId, reason: &impl std::fmt::Display) {
    eprintln!("{me}: refused a message from {from}: {reason}");
}

/// Hands every frame to the network and every event to the application until the driver
/// says to wait (the application's calls may make more of either), and returns the deadline
/// it gave.
fn flush(
    d: &mut Driver<i64>,
    net: &Network,
    clock: Clock,
    app: &mut Option<Workload>,
) -> Result<Option<Time>, BoxError> {
    loop {
        match d.poll_output() {
            Output::Transmit(t) => match net.get(t.to.0 as usize) {
                // A peer that already stopped is a lost frame, which the protocol tolerates.
                Some(peer) => {
                    let _ = peer.send(Inbox::Frame(d.id(), t.frame));
                }
                None => eprintln!("{}: no route to {}", d.id(), t.to),
            },
            Output::Event(event) => match app {
                Some(workload) => workload.on_event(d, clock.now(), event)?,
                None => on_infrastructure_event(d, event)?,
            },
            Output::Wait { until } => return Ok(until),
        }
    }
}

/// The whole network stack of one node: wait for a frame or the deadline, feed it in, flush.
fn run_node(
    mut d: Driver<i64>,
    inbox: Receiver<Inbox>,
    net: Network,
    clock: Clock,
    mut app: Option<Workload>,
) -> Result<Driver<i64>, BoxError> {
    d.start(clock.now());
    let mut deadline = flush(&mut d, &net, clock, &mut app)?;
    loop {
        let now = clock.now();
        // Checked before waiting, not only on a timeout: under steady traffic the wait would
        // rarely time out and retransmissions and heartbeats would starve.
        if deadline.is_some_and(|at| at <= now) {
            d.handle_timeout(now);
            deadline = flush(&mut d, &net, clock, &mut app)?;
            continue;
        }
        let input = match deadline {
            Some(at) => match inbox.recv_timeout(Duration::from_nanos(at - now)) {
                Ok(input) => input,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => Inbox::Stop,
            },
            None => inbox.recv().unwrap_or(Inbox::Stop),
        };
        match input {
            Inbox::Frame(from, frame) => {
                d.handle_frame_bytes(clock.now(), from, &frame);
                deadline = flush(&mut d, &net, clock, &mut app)?;
            }
            Inbox::Stop => return Ok(d),
        }
    }
}

/// A node's thread hands its driver back when stopped, so that main can read the final state.
type NodeThread = JoinHandle<Result<Driver<i64>, BoxError>>;

struct Cluster {
    net: Network,
    threads: Vec<(NodeId, NodeThread)>,
}

impl Cluster {
    fn spawn(status: &Sender<Status>) -> Result<Self, BoxError> {
        // The job numbers its nodes as the constants above do: n0 the coordinator, the servers,
        // then the workers. Its servers sum what they are pushed, with no replicas.
        let mut job = JobSpec::new(SERVERS.len(), WORKERS.len());
        job.consistency = Consistency::BoundedDelay(TAU);
        let mut nodes: Vec<(Driver<i64>, Option<Workload>)> = Vec::new();
        for id in job.node_ids() {
            let workload = WORKERS
                .contains(&id)
                .then(|| Workload::new(id, status.clone()));
            nodes.push((job.driver(id, 0)?, workload));
        }
        // Every channel exists before any thread runs, so no early frame has nowhere to go.
        let (net, inboxes): (Network, Vec<Receiver<Inbox>>) =
            nodes.iter().map(|_| mpsc::channel()).unzip();
        let clock = Clock(Instant::now());
        let mut threads = Vec::new();
        for ((d, app), inbox) in nodes.into_iter().zip(inboxes) {
            let id = d.id();
            let (net, status) = (net.clone(), status.clone());
            let handle = thread::Builder::new()
                .name(format!("node-{id}"))
                .spawn(move || {
                    let result = run_node(d, inbox, net, clock, app);
                    if let Err(e) = &result {
                        // Main learns at once instead of at the wall-time limit.
                        let _ = status.send((id, Err(e.to_string())));
                    }
                    result
                })?;
            threads.push((id, handle));
        }
        Ok(Cluster { net, threads })
    }

    /// Stops every node and collects the drivers of the ones that ended cleanly.
    fn stop(self) -> Result<BTreeMap<NodeId, Driver<i64>>, BoxError> {
        for peer in &self.net {
            // A node that already ended has nothing left to stop.
            let _ = peer.send(Inbox::Stop);
        }
        let mut drivers = BTreeMap::new();
        for (id, handle) in self.threads {
            let d = handle
                .join()
                .map_err(|_| format!("node {id} panicked"))?
                .map_err(|e| format!("node {id}: {e}"))?;
            drivers.insert(id, d);
        }
        Ok(drivers)
    }
}

fn run() -> Result<String, BoxError> {
    let started = Instant::now();
    let (status_tx, status) = mpsc::channel();
    let cluster = Cluster::spawn(&status_tx)?;
    drop(status_tx);
    let mut finished = 0;
    let outcome = loop {
        if finished == WORKERS.len() {
            break Ok(());
        }
        let left = WALL_LIMIT.saturating_sub(started.elapsed());
        match status.recv_timeout(left) {
            Ok((_, Ok(()))) => finished += 1,
            Ok((id, Err(e))) => break Err(format!("node {id} failed: {e}")),
            Err(RecvTimeoutError::Timeout) => {
                break Err(format!(
                    "only {finished} of {} workers finished within {WALL_LIMIT:?}",
                    WORKERS.len()
                ));
            }
            Err(RecvTimeoutError::Disconnected) => {
                break Err(format!(
                    "every node ended with only {finished} of {} workers finished",
                    WORKERS.len()
                ));
            }
        }
    };
    // Stopped either way, so that a failed run exits instead of hanging on live threads.
    let drivers = cluster.stop();
    outcome?;
    let drivers = drivers?;

    let keys = keys();
    let mut wrong = Vec::new();
    for &key in &keys {
        let total: i64 = SERVERS
            .iter()
            .filter_map(|s| drivers.get(s)?.node().as_server())
            .map(|server| server.received_total(key).first().copied().unwrap_or(0))
            .sum();
        if total != TOTAL {
            wrong.push(format!("key {key:#x} holds {total}"));
        }
    }
    if !wrong.is_empty() {
        let shown = wrong.len().min(5);
        return Err(format!(
            "{} of {} keys do not hold {TOTAL}: {}{}",
            wrong.len(),
            keys.len(),
            wrong[..shown].join(", "),
            if shown < wrong.len() { ", ..." } else { "" }
        )
        .into());
    }
    Ok(format!(
        "threads: {} workers x {ITERATIONS} iterations on {} keys over {} servers: \
         every total is {TOTAL} ({:.2?})",
        WORKERS.len(),
        keys.len(),
        SERVERS.len(),
        started.elapsed()
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("threads: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
