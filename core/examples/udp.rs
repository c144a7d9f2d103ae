//! pserver's core over plain UDP sockets: one thread per node, one `std::net::UdpSocket` each,
//! no async runtime and no fragmentation code.
//!
//! The job sets its frame limit to what one datagram carries on a 1,500-byte Ethernet link
//! (1,472 bytes), and the driver fits everything it builds to it: a worker's slices, a
//! server's answers and replication batches. So each frame is one datagram, sent whole with
//! `send_to` and handed to the driver whole from `recv_from`. The loop is the one of
//! `threads.rs`, with a socket in place of the channel:
//!
//! 1. once, first: `driver.start(now)`;
//! 2. a datagram arrived: look its source address up in the peer table and call
//!    `driver.handle_frame(now, from, &buf[..len])`: the receive buffer is reused, and the
//!    driver copies out of it only the values it keeps;
//! 3. the deadline passed: `driver.handle_timeout(now)`;
//! 4. after every call, poll `driver.poll_output_into(&mut send_buf)` until `Output::Wait`:
//!    each frame is written into the one send buffer and sent with `send_to`; each event goes
//!    to the application, which pushes, pulls and advances through `driver.worker()?`;
//! 5. wait on the socket until the next datagram or the deadline `Output::Wait` gave.
//!
//! To show that the protocol needs nothing more of the network than UDP gives, this example's
//! sockets also lose one datagram in ten and send one in twenty twice, on purpose: workers
//! retransmit and servers de-duplicate, so every push is still applied exactly once.
//!
//! The job: a coordinator, 3 servers with one replica each and 2 workers under a staleness
//! bound of one iteration. Each worker pushes 1 to each of 1,000 keys per iteration for 8
//! iterations (a push is about 16 KB, a dozen datagrams); at the end the servers' values,
//! read through `driver.server()?.read(..)`, must hold exactly 16 for every key, each key
//! once.

use std::collections::BTreeMap;
use std::error::Error;
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use pserver_core::events::WorkerEvent;
use pserver_core::{
    Consistency, Driver, Event, Iteration, JobSpec, Key, KeyRange, KvPairs, NodeId, Output, Time,
};

const SERVERS: usize = 3;
const WORKERS: usize = 2;
const KEYS: u64 = 1_000;
const ITERATIONS: Iteration = 8;
/// What one datagram carries on a 1,500-byte link: 1,500 less 20 bytes of IPv4 header and 8
/// of UDP header.
const DATAGRAM: usize = 1_472;
/// Every key's value at the end: each worker pushes 1 per iteration.
const TOTAL: i64 = WORKERS as i64 * ITERATIONS as i64;
const WALL_LIMIT: Duration = Duration::from_secs(60);
/// How long a node waits on its socket at most, so that it sees the stop flag.
const POLL: Duration = Duration::from_millis(20);

type BoxError = Box<dyn Error + Send + Sync>;

/// The nanosecond clock every driver is fed, from one origin for the process.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> Time {
        self.0.elapsed().as_nanos() as Time
    }
}

/// Who is where: each node's address, and back.
#[derive(Clone)]
struct Peers {
    addr: BTreeMap<NodeId, SocketAddr>,
    node: BTreeMap<SocketAddr, NodeId>,
}

/// A node's socket, which loses and duplicates datagrams on purpose (see the module docs).
struct Socket {
    udp: UdpSocket,
    peers: Peers,
    /// A xorshift state, seeded per node: each node loses the same share of what it sends,
    /// whichever datagrams those turn out to be.
    dice: u64,
    sent: u64,
    lost: u64,
    largest: usize,
}

impl Socket {
    fn roll(&mut self) -> u64 {
        self.dice ^= self.dice << 13;
        self.dice ^= self.dice >> 7;
        self.dice ^= self.dice << 17;
        self.dice % 100
    }

    /// Sends `frame` to `to`; false when the kernel refused it, which the caller tells the
    /// driver.
    fn send(&mut self, to: NodeId, frame: &[u8]) -> Result<bool, BoxError> {
        if frame.len() > DATAGRAM {
            return Err(format!("a frame of {} bytes for {to}", frame.len()).into());
        }
        self.largest = self.largest.max(frame.len());
        let addr = *self
            .peers
            .addr
            .get(&to)
            .ok_or(format!("no address for {to}"))?;
        let roll = self.roll();
        if roll < 10 {
            self.lost += 1;
            return Ok(true);
        }
        let copies = if roll >= 95 { 2 } else { 1 };
        let mut sent = true;
        for _ in 0..copies {
            self.sent += 1;
            // UDP promises nothing: a datagram the kernel would not take is a lost one, and
            // the driver backs off what it resends there.
            if let Err(e) = self.udp.send_to(frame, addr) {
                eprintln!("send to {to} failed: {e}");
                sent = false;
            }
        }
        Ok(sent)
    }
}

/// A worker's application: push 1 to every key, advance, and again, until the last
/// iteration's pushes are done.
struct Workload {
    keys: Vec<Key>,
    pushes_issued: u64,
    pushes_done: u64,
    finished: bool,
}

impl Workload {
    fn on_event(
        &mut self,
        d: &mut Driver<i64>,
        now: Time,
        event: Event<i64>,
    ) -> Result<(), BoxError> {
        match event {
            Event::Ready { .. } => self.work(d, now)?,
            Event::Worker(WorkerEvent::Advanced(i)) if i < ITERATIONS => self.work(d, now)?,
            Event::Worker(WorkerEvent::Advanced(_)) => {}
            Event::Worker(WorkerEvent::PushDone(_)) => self.pushes_done += 1,
            Event::Worker(WorkerEvent::PushDurable(_)) => {}
            Event::Worker(WorkerEvent::Stalled { .. }) | Event::Unencodable { .. } => {
                return Err(format!("{event:?}").into());
            }
            // Refusals (a late duplicate, say) and news of the cluster: nothing to do here.
            _ => {}
        }
        let last = d.node().as_worker().map_or(0, |w| w.iteration());
        self.finished = last >= ITERATIONS && self.pushes_done == self.pushes_issued;
        Ok(())
    }

    fn work(&mut self, d: &mut Driver<i64>, now: Time) -> Result<(), BoxError> {
        let mut worker = d.worker()?;
        let ones = vec![1; self.keys.len()];
        worker.push(now, KvPairs::new(self.keys.clone(), ones, 1)?)?;
        self.pushes_issued += 1;
        worker.advance(now)?;
        Ok(())
    }
}

/// Sends every frame and hands every event to the application until the driver says to
/// wait; returns the deadline it gave.
fn flush(
    d: &mut Driver<i64>,
    socket: &mut Socket,
    send_buf: &mut Vec<u8>,
    clock: Clock,
    app: &mut Option<Workload>,
) -> Result<Option<Time>, BoxError> {
    loop {
        match d.poll_output_into(send_buf) {
            Output::Transmit(t) => {
                if !socket.send(t.to, &send_buf[..t.frame])? {
                    d.send_failed(clock.now(), t.to);
                }
            }
            Output::Event(event) => match (app.as_mut(), event) {
                (Some(workload), event) => workload.on_event(d, clock.now(), event)?,
                (None, event @ Event::Unencodable { .. }) => {
                    return Err(format!("{event:?}").into());
                }
                (None, _) => {}
            },
            Output::Wait { until } => return Ok(until),
        }
    }
}

/// What a node's thread hands back: its driver, to read, and what its socket counted.
struct Ended {
    driver: Driver<i64>,
    sent: u64,
    lost: u64,
    largest: usize,
}

/// The whole network stack of one node.
fn run_node(
    mut d: Driver<i64>,
    mut socket: Socket,
    clock: Clock,
    mut app: Option<Workload>,
    done: Sender<NodeId>,
    stop: Arc<AtomicBool>,
) -> Result<Ended, BoxError> {
    let mut recv_buf = vec![0u8; 65_536];
    let mut send_buf = Vec::with_capacity(DATAGRAM);
    d.start(clock.now());
    let mut deadline = flush(&mut d, &mut socket, &mut send_buf, clock, &mut app)?;
    let mut said_done = false;
    while !stop.load(Ordering::Relaxed) {
        if !said_done && app.as_ref().is_some_and(|a| a.finished) {
            said_done = true;
            let _ = done.send(d.id());
        }
        let now = clock.now();
        if deadline.is_some_and(|at| at <= now) {
            d.handle_timeout(now);
            deadline = flush(&mut d, &mut socket, &mut send_buf, clock, &mut app)?;
            continue;
        }
        let wait = deadline.map_or(POLL, |at| Duration::from_nanos(at - now).min(POLL));
        socket
            .udp
            .set_read_timeout(Some(wait.max(Duration::from_micros(1))))?;
        match socket.udp.recv_from(&mut recv_buf) {
            Ok((len, addr)) => {
                // A datagram from an address that is no node of the job is not the
                // protocol's to refuse: it never names a sender this loop could check.
                let Some(&from) = socket.peers.node.get(&addr) else {
                    eprintln!("{}: a datagram from {addr}, no node of the job", d.id());
                    continue;
                };
                d.handle_frame(clock.now(), from, &recv_buf[..len]);
                deadline = flush(&mut d, &mut socket, &mut send_buf, clock, &mut app)?;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Ended {
        driver: d,
        sent: socket.sent,
        lost: socket.lost,
        largest: socket.largest,
    })
}

fn keys() -> Vec<Key> {
    (0..KEYS).map(|i| i * (u64::MAX / (KEYS + 1))).collect()
}

/// Runs the job and checks every key's value, read from the servers.
pub fn run() -> Result<String, BoxError> {
    let started = Instant::now();
    let mut job = JobSpec::new(SERVERS, WORKERS);
    job.consistency = Consistency::BoundedDelay(1);
    job.ring.replicas = 1;
    job.max_frame = DATAGRAM;
    job.validate::<i64>()?;
    let ids = job.node_ids();
    let mut sockets = Vec::new();
    let mut peers = Peers {
        addr: BTreeMap::new(),
        node: BTreeMap::new(),
    };
    for &id in &ids {
        let udp = UdpSocket::bind("127.0.0.1:0")?;
        let addr = udp.local_addr()?;
        peers.addr.insert(id, addr);
        peers.node.insert(addr, id);
        sockets.push(udp);
    }
    let workers: Vec<NodeId> = ids[ids.len() - WORKERS..].to_vec();
    let clock = Clock(Instant::now());
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done) = mpsc::channel();
    let mut threads: Vec<(NodeId, JoinHandle<Result<Ended, BoxError>>)> = Vec::new();
    for (&id, udp) in ids.iter().zip(sockets) {
        let driver = job.driver::<i64>(id, 0)?;
        let socket = Socket {
            udp,
            peers: peers.clone(),
            dice: 0x9e37_79b9_7f4a_7c15 ^ (u64::from(id.0) + 1),
            sent: 0,
            lost: 0,
            largest: 0,
        };
        let app = workers.contains(&id).then(|| Workload {
            keys: keys(),
            pushes_issued: 0,
            pushes_done: 0,
            finished: false,
        });
        let (done, stop) = (done_tx.clone(), stop.clone());
        let handle = thread::Builder::new()
            .name(format!("node-{id}"))
            .spawn(move || run_node(driver, socket, clock, app, done, stop))?;
        threads.push((id, handle));
    }
    drop(done_tx);
    let mut finished = 0;
    let outcome = loop {
        if finished == WORKERS {
            break Ok(());
        }
        match done.recv_timeout(WALL_LIMIT.saturating_sub(started.elapsed())) {
            Ok(_) => finished += 1,
            Err(_) => break Err(format!("{finished} of {WORKERS} workers finished in time")),
        }
    };
    stop.store(true, Ordering::Relaxed);
    let mut ended = BTreeMap::new();
    for (id, handle) in threads {
        let node = handle
            .join()
            .map_err(|_| format!("node {id} panicked"))?
            .map_err(|e| format!("node {id}: {e}"))?;
        ended.insert(id, node);
    }
    outcome?;

    // Each key is read once, from the server that leads it.
    let mut values: BTreeMap<Key, i64> = BTreeMap::new();
    for id in &ids[1..=SERVERS] {
        let Some(node) = ended.get_mut(id) else {
            continue;
        };
        let read = node.driver.server()?.read(KeyRange::FULL);
        for (key, row) in read.rows.iter() {
            if values.insert(key, row[0]).is_some() {
                return Err(format!("key {key:#x} led by two servers").into());
            }
        }
    }
    let wrong: Vec<String> = keys()
        .iter()
        .filter(|k| values.get(k) != Some(&TOTAL))
        .take(5)
        .map(|k| format!("key {k:#x} holds {:?}", values.get(k)))
        .collect();
    if !wrong.is_empty() {
        return Err(format!("keys not at {TOTAL}: {}", wrong.join(", ")).into());
    }
    let sent: u64 = ended.values().map(|e| e.sent).sum();
    let lost: u64 = ended.values().map(|e| e.lost).sum();
    let largest = ended.values().map(|e| e.largest).max().unwrap_or(0);
    Ok(format!(
        "udp: {WORKERS} workers x {ITERATIONS} iterations on {KEYS} keys over {SERVERS} servers \
         with a replica each: every value is {TOTAL}; {sent} datagrams sent, {lost} lost on \
         purpose, the largest {largest} bytes ({:.2?})",
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
            eprintln!("udp: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    /// The example is part of the test suite: the job ends with every value exact, over
    /// sockets that lose and duplicate datagrams, with no frame over a datagram.
    #[test]
    fn the_job_over_udp_sockets_ends_with_every_value_exact() {
        match super::run() {
            Ok(summary) => assert!(summary.contains("every value is"), "{summary}"),
            Err(e) => panic!("{e}"),
        }
    }
}
