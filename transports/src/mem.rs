//! In-memory transport: tokio channels between the nodes of one process, with seeded fault
//! injection, for tests and for single-process clusters.
//!
//! A [`MemNetwork`] is the wire; [`MemNetwork::endpoint`] plugs a node into it and returns the
//! node's [`MemTransport`]. The network can lose, duplicate and delay (and so reorder) frames
//! at the rates given by [`MemFaults`], cut links ([`MemNetwork::partition`],
//! [`MemNetwork::isolate`]) and counts the fate of every frame ([`MemNetwork::stats`]).
//!
//! # Structure
//!
//! The shared state (endpoint table, partitions, the fault RNG and the counters) lives in a
//! plain `Fabric` that decides and records the fate of each frame without touching tokio; it
//! takes its locks and atomics from [`crate::sync`] and is model-checked under loom. The tokio
//! part is thin: a bounded `mpsc` channel per endpoint, and one spawned task per delayed frame.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::sync::PoisonError;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pserver_core::NodeId;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use crate::sync::{Arc, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::{Transport, TransportError};

/// The faults a [`MemNetwork`] injects. All are off by default.
///
/// Build one with the `with_*` methods (the struct is `#[non_exhaustive]`, so it cannot be
/// written as a literal outside this crate):
///
/// ```
/// use std::time::Duration;
/// use pserver_transport::mem::MemFaults;
///
/// let faults = MemFaults::default()
///     .with_drop(0.1)
///     .with_dup(0.05)
///     .with_delay(Duration::from_millis(1), Duration::from_millis(20))
///     .with_seed(42);
/// assert_eq!(faults.capacity, MemFaults::DEFAULT_CAPACITY);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MemFaults {
    /// Probability that a frame is lost. Values at or below 0 never drop, at or above 1
    /// always drop.
    pub drop: f64,
    /// Probability that a frame that is not lost is delivered twice.
    pub dup: f64,
    /// If set, every copy of every frame is held back for a delay drawn uniformly from
    /// `min..=max` (the pair is taken in either order). Frames with different delays overtake
    /// each other, so this is also how the network reorders. Delayed frames are delivered by
    /// a spawned tokio task: sending needs a tokio runtime with time enabled.
    pub delay: Option<(Duration, Duration)>,
    /// Seed of the network's one fault RNG.
    pub seed: u64,
    /// How many frames each endpoint's receive queue holds; a frame arriving at a full queue
    /// is dropped (and counted in [`MemStats::dropped_full`]). At least 1.
    pub capacity: usize,
}

impl MemFaults {
    /// The receive-queue capacity of an endpoint unless [`MemFaults::with_capacity`] says
    /// otherwise.
    pub const DEFAULT_CAPACITY: usize = 4096;

    /// Loses each frame with probability `p`.
    #[must_use]
    pub fn with_drop(mut self, p: f64) -> Self {
        self.drop = p;
        self
    }

    /// Delivers each surviving frame twice with probability `p`.
    #[must_use]
    pub fn with_dup(mut self, p: f64) -> Self {
        self.dup = p;
        self
    }

    /// Delays every frame by a duration drawn uniformly from `min..=max`.
    #[must_use]
    pub fn with_delay(mut self, min: Duration, max: Duration) -> Self {
        self.delay = Some((min, max));
        self
    }

    /// Seeds the fault RNG.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets the receive-queue capacity of each endpoint (at least 1).
    #[must_use]
    pub fn with_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(1);
        self
    }

    fn injects_anything(&self) -> bool {
        self.drop > 0.0 || self.dup > 0.0 || self.delay.is_some()
    }
}

impl Default for MemFaults {
    fn default() -> Self {
        MemFaults {
            drop: 0.0,
            dup: 0.0,
            delay: None,
            seed: 0,
            capacity: Self::DEFAULT_CAPACITY,
        }
    }
}

/// What happened to the frames of a [`MemNetwork`], counted since it was created.
///
/// Every frame a `send` accepted (`sent`), plus every extra copy (`duplicated`), ends up in
/// exactly one of `delivered` or a `dropped_*` counter, or is still `in_flight` (held back by a
/// delay fault); [`MemStats::balanced`] checks it. The counters are read one by one, so a
/// snapshot taken while frames are moving may be off by the frames in motion; once the network
/// is quiet it adds up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MemStats {
    /// Frames accepted by `send` (sends that returned an error are not counted).
    pub sent: u64,
    /// Copies placed in the destination's receive queue.
    pub delivered: u64,
    /// Frames lost to the `drop` fault.
    pub dropped_fault: u64,
    /// Frames lost to a partition or an isolation.
    pub dropped_partition: u64,
    /// Extra copies made by the `dup` fault.
    pub duplicated: u64,
    /// Copies lost because the destination's receive queue was full.
    pub dropped_full: u64,
    /// Copies lost because the destination was gone (closed or dropped, when the frame was
    /// sent or when its delay ran out), or because the runtime shut down before a delayed
    /// copy's delay ran out.
    pub dropped_unreachable: u64,
    /// Copies held back by a delay fault and not yet delivered or dropped.
    pub in_flight: u64,
    /// Bytes of the frames counted in `sent`.
    pub bytes_sent: u64,
}

impl MemStats {
    /// Whether every frame sent (and every duplicate) is accounted for:
    /// `sent + duplicated == delivered + dropped_* + in_flight`.
    pub fn balanced(&self) -> bool {
        self.sent + self.duplicated
            == self.delivered
                + self.dropped_fault
                + self.dropped_partition
                + self.dropped_full
                + self.dropped_unreachable
                + self.in_flight
    }
}

/// An in-process network of nodes joined by tokio channels, with seeded fault injection.
///
/// Cloning is cheap and every clone is the same network. Each node gets its [`MemTransport`]
/// from [`MemNetwork::endpoint`].
///
/// # Determinism
///
/// All fault decisions of a network come from one RNG seeded with [`MemFaults::seed`], drawn
/// under a lock in the order frames are sent. A run on a current-thread runtime (or any run
/// that sends frames in the same order) with the same seed makes the same decisions. On a
/// multi-threaded runtime the order in which tasks draw depends on scheduling, and so does the
/// outcome.
///
/// # Runtime
///
/// Frames without a delay go straight into the receiver's queue, so a reliable network works
/// with any executor. Delayed frames are delivered by a spawned tokio task sleeping on the
/// tokio timer: with [`MemFaults::delay`] set, `send` must run inside a tokio runtime with
/// time enabled. (Outside any runtime a delayed frame is delivered at once, with a warning;
/// frames still waiting when their runtime shuts down are lost and counted as unreachable.)
///
/// # Example
///
/// ```
/// use bytes::Bytes;
/// use pserver_core::NodeId;
/// use pserver_transport::mem::{MemFaults, MemNetwork};
/// use pserver_transport::{Transport, TransportError};
///
/// let rt = tokio::runtime::Builder::new_current_thread()
///     .enable_time()
///     .build()?;
/// rt.block_on(async {
///     let net = MemNetwork::reliable();
///     let a = net.endpoint(NodeId(1))?;
///     let b = net.endpoint(NodeId(2))?;
///     a.send(NodeId(2), Bytes::from_static(b"hello")).await?;
///     let (from, frame) = b.recv().await?;
///     assert_eq!((from, &frame[..]), (NodeId(1), &b"hello"[..]));
///
///     // Cut the link: frames are lost, not refused.
///     net.partition(NodeId(1), NodeId(2));
///     a.send(NodeId(2), Bytes::from_static(b"lost")).await?;
///     assert_eq!(net.stats().dropped_partition, 1);
///
///     // A lossy, seeded network.
///     let lossy = MemNetwork::new(MemFaults::default().with_drop(0.5).with_seed(7));
///     let _c = lossy.endpoint(NodeId(3))?;
///     Ok::<_, TransportError>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct MemNetwork {
    fabric: Arc<Fabric<Tx>>,
}

impl MemNetwork {
    /// A network that injects `faults`.
    pub fn new(faults: MemFaults) -> Self {
        MemNetwork {
            fabric: Arc::new(Fabric::new(faults)),
        }
    }

    /// A network without faults (receive queues of [`MemFaults::DEFAULT_CAPACITY`]).
    pub fn reliable() -> Self {
        Self::new(MemFaults::default())
    }

    /// The faults this network injects.
    pub fn faults(&self) -> &MemFaults {
        &self.fabric.faults
    }

    /// Plugs node `id` into the network.
    ///
    /// An id can have one live endpoint at a time: registering an id whose endpoint is still
    /// open fails with [`TransportError::Io`] of kind [`io::ErrorKind::AddrInUse`]. Once that
    /// endpoint is closed or dropped the id can be registered again (a restarted node); frames
    /// still delayed in flight then reach the new endpoint. On a closed network this fails with
    /// [`TransportError::Closed`].
    pub fn endpoint(&self, id: NodeId) -> Result<MemTransport, TransportError> {
        let (tx, rx) = mpsc::channel(self.fabric.faults.capacity.max(1));
        let generation = self.fabric.register(id, Tx(tx))?;
        Ok(MemTransport {
            id,
            generation,
            fabric: Arc::clone(&self.fabric),
            rx: tokio::sync::Mutex::new(rx),
        })
    }

    /// Cuts the link between `a` and `b` both ways: frames sent on it are lost (and counted in
    /// [`MemStats::dropped_partition`]) until [`MemNetwork::heal`] or [`MemNetwork::heal_all`].
    /// Frames already delayed in flight still arrive. The nodes need not be registered yet.
    pub fn partition(&self, a: NodeId, b: NodeId) {
        self.fabric.cut(a, b);
    }

    /// Restores the link between `a` and `b` cut by [`MemNetwork::partition`]. It does not
    /// undo [`MemNetwork::isolate`].
    pub fn heal(&self, a: NodeId, b: NodeId) {
        self.fabric.heal(a, b);
    }

    /// Restores every link: undoes all partitions and isolations.
    pub fn heal_all(&self) {
        self.fabric.heal_all();
    }

    /// Cuts `n` off from every other node, both ways, until [`MemNetwork::rejoin`] or
    /// [`MemNetwork::heal_all`]. Frames `n` sends to itself still arrive.
    pub fn isolate(&self, n: NodeId) {
        self.fabric.isolate(n);
    }

    /// Undoes [`MemNetwork::isolate`] for `n` (pairwise partitions stay).
    pub fn rejoin(&self, n: NodeId) {
        self.fabric.rejoin(n);
    }

    /// Shuts the network down: every endpoint's `recv` and `send` then fail with
    /// [`TransportError::Closed`], as does [`MemNetwork::endpoint`].
    pub fn close(&self) {
        self.fabric.close();
    }

    /// The network's counters.
    pub fn stats(&self) -> MemStats {
        self.fabric.stats()
    }
}

impl fmt::Debug for MemNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemNetwork")
            .field("faults", &self.fabric.faults)
            .field("stats", &self.fabric.stats())
            .finish_non_exhaustive()
    }
}

/// One node's connection to a [`MemNetwork`]; implements [`Transport`].
///
/// Dropping it (or calling [`MemTransport::close`]) unregisters the node: frames sent to it
/// afterwards are silently lost and counted in [`MemStats::dropped_unreachable`], as a crashed
/// peer looks like loss. Sending to an id that was never registered fails with
/// [`TransportError::UnknownPeer`].
pub struct MemTransport {
    id: NodeId,
    generation: u64,
    fabric: Arc<Fabric<Tx>>,
    rx: tokio::sync::Mutex<mpsc::Receiver<(NodeId, Bytes)>>,
}

impl MemTransport {
    /// The node this endpoint belongs to.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Unregisters the node: `send` and `recv` fail with [`TransportError::Closed`] from now
    /// on (a `recv` waiting at the time wakes up with it), frames queued and not yet received
    /// are discarded, and the id may be registered again.
    pub fn close(&self) {
        self.fabric.unregister(self.id, self.generation);
    }
}

impl fmt::Debug for MemTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemTransport")
            .field("id", &self.id)
            .field("open", &self.fabric.is_live(self.id, self.generation))
            .finish_non_exhaustive()
    }
}

impl Drop for MemTransport {
    fn drop(&mut self) {
        // Unregister before the receiver goes, so nothing is offered to a dead channel.
        self.fabric.unregister(self.id, self.generation);
    }
}

#[async_trait]
impl Transport for MemTransport {
    /// Never waits: the frame goes into the destination's queue, is dropped (and counted), or
    /// is handed to a task that delivers it after its delay fault.
    async fn send(&self, to: NodeId, frame: Bytes) -> Result<(), TransportError> {
        if let Some(later) = self.fabric.send(self.id, self.generation, to, frame)? {
            schedule(&self.fabric, self.id, to, later);
        }
        Ok(())
    }

    /// Cancel-safe: a frame is taken off the queue only by a `recv` that returns it.
    async fn recv(&self) -> Result<(NodeId, Bytes), TransportError> {
        if !self.fabric.is_live(self.id, self.generation) {
            return Err(TransportError::Closed);
        }
        let mut rx = self.rx.lock().await;
        // Closed while this call waited for the lock: do not hand out what was queued.
        if !self.fabric.is_live(self.id, self.generation) {
            return Err(TransportError::Closed);
        }
        rx.recv().await.ok_or(TransportError::Closed)
    }
}

/// Spawns one task per delayed copy of a frame.
fn schedule(fabric: &Arc<Fabric<Tx>>, from: NodeId, to: NodeId, later: Later) {
    for delay in later.delays() {
        let pending = Pending {
            fabric: Arc::clone(fabric),
            from,
            to,
            frame: Some(later.frame.clone()),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    tokio::time::sleep(delay).await;
                    pending.deliver();
                });
            }
            Err(_) => {
                tracing::warn!(
                    %from, %to,
                    "mem transport: delay fault outside a tokio runtime, delivering at once"
                );
                pending.deliver();
            }
        }
    }
}

/// A delayed copy on its way. If its task is dropped before the delay runs out (the runtime
/// shut down), the copy is counted as lost.
struct Pending {
    fabric: Arc<Fabric<Tx>>,
    from: NodeId,
    to: NodeId,
    frame: Option<Bytes>,
}

impl Pending {
    fn deliver(mut self) {
        if let Some(frame) = self.frame.take() {
            self.fabric.deliver(self.from, self.to, frame, true);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.frame.take().is_some() {
            self.fabric.abandon();
        }
    }
}

/// The sending half of an endpoint's queue.
struct Tx(mpsc::Sender<(NodeId, Bytes)>);

impl Mailbox for Tx {
    fn offer(&self, from: NodeId, frame: Bytes) -> Offer {
        match self.0.try_send((from, frame)) {
            Ok(()) => Offer::Accepted,
            Err(TrySendError::Full(_)) => Offer::Full,
            Err(TrySendError::Closed(_)) => Offer::Gone,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The shared state: no tokio below this line.
// ---------------------------------------------------------------------------------------------

/// Where the fabric puts a frame for a registered endpoint. Must not block.
trait Mailbox {
    fn offer(&self, from: NodeId, frame: Bytes) -> Offer;
}

/// What a mailbox did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offer {
    Accepted,
    Full,
    Gone,
}

/// Why a frame was lost at send time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DropReason {
    Fault,
    Partition,
    Unreachable,
}

/// The fate the fabric decides for a frame at send time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Deliver `copies` (1 or 2) copies, each after its delay if there are delays.
    Deliver {
        copies: usize,
        delays: Option<[Duration; 2]>,
    },
    Drop(DropReason),
}

/// The delayed copies of a frame, for the caller to deliver later with `Fabric::deliver`.
#[derive(Debug)]
struct Later {
    frame: Bytes,
    copies: usize,
    delays: [Duration; 2],
}

impl Later {
    fn delays(&self) -> impl Iterator<Item = Duration> + '_ {
        self.delays.iter().copied().take(self.copies)
    }
}

enum Slot<M> {
    Live {
        generation: u64,
        mailbox: M,
    },
    /// Registered once, closed since: frames to it are lost, not refused.
    Gone,
}

struct Table<M> {
    endpoints: BTreeMap<NodeId, Slot<M>>,
    /// Cut links, each as (smaller id, larger id).
    cuts: BTreeSet<(NodeId, NodeId)>,
    isolated: BTreeSet<NodeId>,
    next_generation: u64,
    closed: bool,
}

impl<M> Table<M> {
    fn is_live(&self, id: NodeId, generation: u64) -> bool {
        matches!(self.endpoints.get(&id), Some(Slot::Live { generation: g, .. }) if *g == generation)
    }

    fn severed(&self, a: NodeId, b: NodeId) -> bool {
        (a != b && (self.isolated.contains(&a) || self.isolated.contains(&b)))
            || self.cuts.contains(&link(a, b))
    }
}

fn link(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    delivered: AtomicU64,
    dropped_fault: AtomicU64,
    dropped_partition: AtomicU64,
    duplicated: AtomicU64,
    dropped_full: AtomicU64,
    dropped_unreachable: AtomicU64,
    in_flight: AtomicU64,
    bytes_sent: AtomicU64,
}

/// Bumps a counter. Relaxed suffices: each counter is an independent tally, and readers that
/// need them to add up read after the writers are done (joined, or quiet).
fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The shared state of a network: who is registered, which links are cut, the fault RNG and
/// the counters. Decides and records the fate of every frame; `M` is where frames go.
struct Fabric<M> {
    faults: MemFaults,
    rng: Mutex<SmallRng>,
    table: Mutex<Table<M>>,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections here do not panic, and if one did the state is still consistent
    // enough to keep counting frames.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn draw_delay(rng: &mut SmallRng, (a, b): (Duration, Duration)) -> Duration {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (lo, hi) = (nanos(a.min(b)), nanos(a.max(b)));
    Duration::from_nanos(rng.random_range(lo..=hi))
}

impl<M: Mailbox> Fabric<M> {
    fn new(faults: MemFaults) -> Self {
        Fabric {
            rng: Mutex::new(SmallRng::seed_from_u64(faults.seed)),
            faults,
            table: Mutex::new(Table {
                endpoints: BTreeMap::new(),
                cuts: BTreeSet::new(),
                isolated: BTreeSet::new(),
                next_generation: 0,
                closed: false,
            }),
            counters: Counters::default(),
        }
    }

    /// Registers `id` with `mailbox`; returns the registration's generation, which
    /// `unregister` and `route` check so that a stale handle cannot act for a newer one.
    fn register(&self, id: NodeId, mailbox: M) -> Result<u64, TransportError> {
        let mut table = lock(&self.table);
        if table.closed {
            return Err(TransportError::Closed);
        }
        if let Some(Slot::Live { .. }) = table.endpoints.get(&id) {
            return Err(TransportError::Io {
                context: format!("registering node {id} on the in-memory network"),
                source: io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "the node id already has an open endpoint",
                ),
            });
        }
        let generation = table.next_generation;
        table.next_generation += 1;
        table.endpoints.insert(
            id,
            Slot::Live {
                generation,
                mailbox,
            },
        );
        Ok(generation)
    }

    /// Unregisters `id` if its live registration is `generation`; whether it was.
    fn unregister(&self, id: NodeId, generation: u64) -> bool {
        let mut table = lock(&self.table);
        if !table.is_live(id, generation) {
            return false;
        }
        let old = table.endpoints.insert(id, Slot::Gone);
        drop(table);
        // The mailbox (the channel's sender) is dropped here, outside the lock.
        drop(old);
        true
    }

    fn is_live(&self, id: NodeId, generation: u64) -> bool {
        lock(&self.table).is_live(id, generation)
    }

    fn close(&self) {
        let mut table = lock(&self.table);
        table.closed = true;
        let old: Vec<Slot<M>> = table
            .endpoints
            .values_mut()
            .map(|slot| std::mem::replace(slot, Slot::Gone))
            .collect();
        drop(table);
        drop(old);
    }

    fn cut(&self, a: NodeId, b: NodeId) {
        lock(&self.table).cuts.insert(link(a, b));
    }

    fn heal(&self, a: NodeId, b: NodeId) {
        lock(&self.table).cuts.remove(&link(a, b));
    }

    fn heal_all(&self) {
        let mut table = lock(&self.table);
        table.cuts.clear();
        table.isolated.clear();
    }

    fn isolate(&self, n: NodeId) {
        lock(&self.table).isolated.insert(n);
    }

    fn rejoin(&self, n: NodeId) {
        lock(&self.table).isolated.remove(&n);
    }

    /// Decides the fate of a frame `from` (registration `generation`) sends to `to`, and counts
    /// it. Errors (sender closed, destination never registered) are not counted as sent.
    fn route(
        &self,
        from: NodeId,
        generation: u64,
        to: NodeId,
        len: usize,
    ) -> Result<Fate, TransportError> {
        {
            let table = lock(&self.table);
            if table.closed || !table.is_live(from, generation) {
                return Err(TransportError::Closed);
            }
            let reachable = match table.endpoints.get(&to) {
                None => return Err(TransportError::UnknownPeer(to)),
                Some(Slot::Gone) => false,
                Some(Slot::Live { .. }) => true,
            };
            bump(&self.counters.sent, 1);
            bump(&self.counters.bytes_sent, len as u64);
            if table.severed(from, to) {
                bump(&self.counters.dropped_partition, 1);
                return Ok(Fate::Drop(DropReason::Partition));
            }
            if !reachable {
                bump(&self.counters.dropped_unreachable, 1);
                return Ok(Fate::Drop(DropReason::Unreachable));
            }
        }
        let faults = &self.faults;
        if !faults.injects_anything() {
            return Ok(Fate::Deliver {
                copies: 1,
                delays: None,
            });
        }
        let mut rng = lock(&self.rng);
        // Draw only for the faults that are on, in a fixed order: drop, dup, one delay per copy.
        if faults.drop > 0.0 && rng.random::<f64>() < faults.drop {
            drop(rng);
            bump(&self.counters.dropped_fault, 1);
            return Ok(Fate::Drop(DropReason::Fault));
        }
        let copies = if faults.dup > 0.0 && rng.random::<f64>() < faults.dup {
            2
        } else {
            1
        };
        let delays = faults.delay.map(|range| {
            let mut delays = [Duration::ZERO; 2];
            for d in delays.iter_mut().take(copies) {
                *d = draw_delay(&mut rng, range);
            }
            delays
        });
        drop(rng);
        bump(&self.counters.duplicated, copies as u64 - 1);
        if delays.is_some() {
            bump(&self.counters.in_flight, copies as u64);
        }
        Ok(Fate::Deliver { copies, delays })
    }

    /// Puts one copy of a frame into `to`'s mailbox if `to` is registered, and counts the
    /// outcome. `delayed` says the copy was counted in flight by `route`.
    fn deliver(&self, from: NodeId, to: NodeId, frame: Bytes, delayed: bool) {
        let offer = {
            let table = lock(&self.table);
            match table.endpoints.get(&to) {
                Some(Slot::Live { mailbox, .. }) => mailbox.offer(from, frame),
                _ => Offer::Gone,
            }
        };
        match offer {
            Offer::Accepted => bump(&self.counters.delivered, 1),
            Offer::Full => {
                tracing::trace!(%from, %to, "mem transport: receive queue full, frame dropped");
                bump(&self.counters.dropped_full, 1);
            }
            Offer::Gone => bump(&self.counters.dropped_unreachable, 1),
        }
        if delayed {
            self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A delayed copy that will never be delivered.
    fn abandon(&self) {
        bump(&self.counters.dropped_unreachable, 1);
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Routes a frame and delivers its undelayed copies; returns the delayed ones, if any.
    fn send(
        &self,
        from: NodeId,
        generation: u64,
        to: NodeId,
        frame: Bytes,
    ) -> Result<Option<Later>, TransportError> {
        match self.route(from, generation, to, frame.len())? {
            Fate::Drop(reason) => {
                tracing::trace!(%from, %to, ?reason, "mem transport: frame dropped");
                Ok(None)
            }
            Fate::Deliver {
                copies,
                delays: None,
            } => {
                for _ in 1..copies {
                    self.deliver(from, to, frame.clone(), false);
                }
                self.deliver(from, to, frame, false);
                Ok(None)
            }
            Fate::Deliver {
                copies,
                delays: Some(delays),
            } => Ok(Some(Later {
                frame,
                copies,
                delays,
            })),
        }
    }

    fn stats(&self) -> MemStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MemStats {
            sent: get(&c.sent),
            delivered: get(&c.delivered),
            dropped_fault: get(&c.dropped_fault),
            dropped_partition: get(&c.dropped_partition),
            duplicated: get(&c.duplicated),
            dropped_full: get(&c.dropped_full),
            dropped_unreachable: get(&c.dropped_unreachable),
            in_flight: get(&c.in_flight),
            bytes_sent: get(&c.bytes_sent),
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::thread;

    /// A bounded mailbox without tokio.
    #[derive(Clone)]
    struct Inbox {
        capacity: usize,
        frames: Arc<Mutex<Vec<(NodeId, Bytes)>>>,
    }

    impl Inbox {
        fn new(capacity: usize) -> Self {
            Inbox {
                capacity,
                frames: Arc::new(Mutex::new(Vec::new())),
            }
        }
        fn len(&self) -> u64 {
            self.frames.lock().unwrap().len() as u64
        }
    }

    impl Mailbox for Inbox {
        fn offer(&self, from: NodeId, frame: Bytes) -> Offer {
            let mut frames = self.frames.lock().unwrap();
            if frames.len() >= self.capacity {
                Offer::Full
            } else {
                frames.push((from, frame));
                Offer::Accepted
            }
        }
    }

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);

    fn frame() -> Bytes {
        Bytes::from_static(b"f")
    }

    #[test]
    fn registration_is_exclusive_and_a_stale_unregister_spares_the_new_endpoint() {
        loom::model(|| {
            let fabric = Arc::new(Fabric::<Inbox>::new(MemFaults::default()));
            let f = Arc::clone(&fabric);
            let first = thread::spawn(move || {
                let g = f.register(A, Inbox::new(1)).ok();
                if let Some(g) = g {
                    assert!(f.unregister(A, g));
                }
                g
            });
            let f = Arc::clone(&fabric);
            let second = thread::spawn(move || f.register(A, Inbox::new(1)).ok());
            let (g1, g2) = (first.join().unwrap(), second.join().unwrap());
            // The first thread registers unless the second already holds the id; the second
            // registers unless the first holds it at that moment.
            assert!(g1.is_some() || g2.is_some());
            assert_ne!(g1, g2);
            match g2 {
                // The first thread's unregister must not have removed the second's endpoint.
                Some(g2) => assert!(fabric.is_live(A, g2)),
                None => {
                    let table = fabric.table.lock().unwrap();
                    assert!(matches!(table.endpoints.get(&A), Some(Slot::Gone)));
                }
            }
            if let Some(g1) = g1 {
                assert!(!fabric.is_live(A, g1));
            }
        });
    }

    #[test]
    fn counters_add_up_while_the_destination_goes_away() {
        loom::model(|| {
            let faults = MemFaults::default()
                .with_drop(0.3)
                .with_dup(0.5)
                .with_seed(3);
            let fabric = Arc::new(Fabric::new(faults));
            let inbox = Inbox::new(1);
            let ga = fabric.register(A, inbox.clone()).unwrap();
            let gb = fabric.register(B, inbox.clone()).unwrap();
            let f = Arc::clone(&fabric);
            let sender = thread::spawn(move || {
                for _ in 0..2 {
                    assert!(f.send(A, ga, B, frame()).unwrap().is_none());
                }
            });
            let f = Arc::clone(&fabric);
            let closer = thread::spawn(move || assert!(f.unregister(B, gb)));
            sender.join().unwrap();
            closer.join().unwrap();
            let s = fabric.stats();
            assert_eq!(s.sent, 2);
            assert_eq!(s.in_flight, 0);
            assert!(s.balanced(), "{s:?}");
            assert_eq!(s.delivered, inbox.len());
            assert!(s.delivered <= 1, "the inbox holds one frame");
        });
    }

    #[test]
    fn a_partition_racing_a_send_either_drops_the_frame_or_delivers_it_once() {
        loom::model(|| {
            let fabric = Arc::new(Fabric::new(MemFaults::default()));
            let inbox = Inbox::new(4);
            let ga = fabric.register(A, inbox.clone()).unwrap();
            fabric.register(B, inbox.clone()).unwrap();
            let f = Arc::clone(&fabric);
            let sender = thread::spawn(move || f.send(A, ga, B, frame()).unwrap());
            let f = Arc::clone(&fabric);
            let cutter = thread::spawn(move || f.cut(B, A));
            assert!(sender.join().unwrap().is_none());
            cutter.join().unwrap();
            let s = fabric.stats();
            assert_eq!((s.sent, s.delivered + s.dropped_partition), (1, 1));
            assert_eq!(s.delivered, inbox.len());
            assert!(s.balanced());
            // The cut holds both ways afterwards.
            fabric.send(B, 1, A, frame()).unwrap();
            assert_eq!(fabric.stats().dropped_partition, s.dropped_partition + 1);
        });
    }

    #[test]
    fn delayed_copies_stay_in_flight_until_delivered_and_senders_share_a_full_queue() {
        loom::model(|| {
            let faults =
                MemFaults::default().with_delay(Duration::from_millis(1), Duration::from_millis(2));
            let fabric = Arc::new(Fabric::new(faults));
            let inbox = Inbox::new(1);
            let ga = fabric.register(A, inbox.clone()).unwrap();
            let gb = fabric.register(B, inbox.clone()).unwrap();
            let later_a = fabric.send(A, ga, B, frame()).unwrap().unwrap();
            let later_b = fabric.send(B, gb, B, frame()).unwrap().unwrap();
            assert_eq!(fabric.stats().in_flight, 2);
            // Two "timer tasks" deliver concurrently into a queue with room for one.
            let handles: Vec<_> = [(A, later_a), (B, later_b)]
                .into_iter()
                .map(|(from, later)| {
                    let f = Arc::clone(&fabric);
                    thread::spawn(move || {
                        for _ in later.delays() {
                            f.deliver(from, B, later.frame.clone(), true);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let s = fabric.stats();
            assert_eq!((s.in_flight, s.delivered, s.dropped_full), (0, 1, 1));
            assert!(s.balanced());
            assert_eq!(inbox.len(), 1);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tokio::time::timeout;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);
    const C: NodeId = NodeId(3);
    const LIMIT: Duration = Duration::from_secs(10);

    fn numbered(i: u32) -> Bytes {
        Bytes::copy_from_slice(&i.to_le_bytes())
    }

    fn number(frame: &Bytes) -> u32 {
        u32::from_le_bytes(frame[..].try_into().unwrap())
    }

    /// Receives exactly `n` frames.
    async fn take(t: &MemTransport, n: u64) -> Vec<(NodeId, Bytes)> {
        let mut got = Vec::new();
        for _ in 0..n {
            got.push(t.recv().await.unwrap());
        }
        got
    }

    /// Whether a `recv` would wait (nothing queued).
    async fn is_quiet(t: &MemTransport) -> bool {
        timeout(Duration::from_millis(1), t.recv()).await.is_err()
    }

    #[tokio::test]
    async fn frames_arrive_unaltered_with_their_sender_and_in_order_per_pair() {
        timeout(LIMIT, async {
            let net = MemNetwork::reliable();
            let (a, b, c) = (
                net.endpoint(A).unwrap(),
                net.endpoint(B).unwrap(),
                net.endpoint(C).unwrap(),
            );
            assert_eq!((a.id(), b.id(), c.id()), (A, B, C));
            for i in 0..100 {
                a.send(C, numbered(i)).await.unwrap();
                b.send(C, numbered(1000 + i)).await.unwrap();
            }
            a.send(B, Bytes::from_static(b"\x00\xffarbitrary bytes"))
                .await
                .unwrap();
            let got = take(&c, 200).await;
            let from = |n: NodeId| {
                got.iter()
                    .filter(|(f, _)| *f == n)
                    .map(|(_, b)| number(b))
                    .collect::<Vec<_>>()
            };
            assert_eq!(from(A), (0..100).collect::<Vec<_>>());
            assert_eq!(from(B), (1000..1100).collect::<Vec<_>>());
            let (f, frame) = b.recv().await.unwrap();
            assert_eq!((f, &frame[..]), (A, &b"\x00\xffarbitrary bytes"[..]));
            let s = net.stats();
            assert_eq!((s.sent, s.delivered), (201, 201));
            assert!(s.balanced());
            assert!(is_quiet(&c).await);
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_drop_rate_loses_about_that_fraction_and_the_counters_add_up() {
        timeout(LIMIT, async {
            let faults = MemFaults::default()
                .with_drop(0.3)
                .with_seed(11)
                .with_capacity(10_000);
            let net = MemNetwork::new(faults);
            let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
            for i in 0..10_000 {
                a.send(B, numbered(i)).await.unwrap();
            }
            let s = net.stats();
            assert_eq!(s.sent, 10_000);
            let fraction = s.dropped_fault as f64 / s.sent as f64;
            assert!((0.25..0.35).contains(&fraction), "dropped {fraction}");
            assert_eq!(s.delivered + s.dropped_fault, 10_000);
            assert!(s.balanced(), "{s:?}");
            // Survivors arrive in order, each once.
            let got: Vec<u32> = take(&b, s.delivered)
                .await
                .iter()
                .map(|(_, f)| number(f))
                .collect();
            assert!(got.windows(2).all(|w| w[0] < w[1]));
            assert!(is_quiet(&b).await);
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_dup_rate_duplicates_frames_and_counts_them() {
        timeout(LIMIT, async {
            let net = MemNetwork::new(MemFaults::default().with_dup(0.2).with_seed(5));
            let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
            for i in 0..1000 {
                a.send(B, numbered(i)).await.unwrap();
            }
            let s = net.stats();
            assert!((150..250).contains(&s.duplicated), "{s:?}");
            assert_eq!(s.delivered, 1000 + s.duplicated);
            assert!(s.balanced());
            let mut seen = BTreeMap::<u32, u64>::new();
            for (_, f) in take(&b, s.delivered).await {
                *seen.entry(number(&f)).or_default() += 1;
            }
            assert_eq!(seen.len(), 1000);
            assert!(seen.values().all(|&n| n == 1 || n == 2));
            assert_eq!(
                seen.values().filter(|&&n| n == 2).count() as u64,
                s.duplicated
            );
            assert!(is_quiet(&b).await);
        })
        .await
        .unwrap();
    }

    /// Sends 500 numbered frames through a faulty network with `seed`; what arrives, in order.
    async fn faulty_run(seed: u64) -> Vec<u32> {
        let faults = MemFaults::default()
            .with_drop(0.2)
            .with_dup(0.2)
            .with_delay(Duration::from_millis(1), Duration::from_millis(20))
            .with_seed(seed);
        let net = MemNetwork::new(faults);
        let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
        for i in 0..500 {
            a.send(B, numbered(i)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let s = net.stats();
        assert_eq!(s.in_flight, 0);
        assert!(s.balanced(), "{s:?}");
        let got = take(&b, s.delivered).await;
        assert!(is_quiet(&b).await);
        got.iter().map(|(_, f)| number(f)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_seed_makes_the_same_decisions_and_another_seed_does_not() {
        timeout(LIMIT, async {
            let first = faulty_run(1).await;
            assert_eq!(first, faulty_run(1).await);
            assert_ne!(first, faulty_run(2).await);
        })
        .await
        .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn delays_reorder_frames_but_deliver_each_exactly_once() {
        timeout(LIMIT, async {
            let faults = MemFaults::default()
                .with_delay(Duration::ZERO, Duration::from_millis(10))
                .with_seed(9);
            let net = MemNetwork::new(faults);
            let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
            for i in 0..300 {
                a.send(B, numbered(i)).await.unwrap();
            }
            assert!(net.stats().in_flight > 0);
            let got: Vec<u32> = take(&b, 300).await.iter().map(|(_, f)| number(f)).collect();
            assert!(got.windows(2).any(|w| w[0] > w[1]), "no reordering");
            let mut sorted = got.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..300).collect::<Vec<_>>());
            let s = net.stats();
            assert_eq!((s.sent, s.delivered, s.in_flight), (300, 300, 0));
            assert!(s.balanced());
            assert!(is_quiet(&b).await);
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_partition_cuts_both_directions_and_heal_restores_them() {
        timeout(LIMIT, async {
            let net = MemNetwork::reliable();
            let (a, b, c) = (
                net.endpoint(A).unwrap(),
                net.endpoint(B).unwrap(),
                net.endpoint(C).unwrap(),
            );
            net.partition(A, B);
            a.send(B, numbered(1)).await.unwrap();
            b.send(A, numbered(2)).await.unwrap();
            a.send(C, numbered(3)).await.unwrap();
            assert_eq!(net.stats().dropped_partition, 2);
            assert!(is_quiet(&a).await && is_quiet(&b).await);
            assert_eq!(number(&c.recv().await.unwrap().1), 3);
            net.heal(B, A);
            a.send(B, numbered(4)).await.unwrap();
            b.send(A, numbered(5)).await.unwrap();
            assert_eq!(b.recv().await.unwrap(), (A, numbered(4)));
            assert_eq!(a.recv().await.unwrap(), (B, numbered(5)));
            let s = net.stats();
            assert_eq!((s.sent, s.delivered, s.dropped_partition), (5, 3, 2));
            assert!(s.balanced());
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn isolation_cuts_a_node_off_from_everybody_until_healed() {
        timeout(LIMIT, async {
            let net = MemNetwork::reliable();
            let (a, b, c) = (
                net.endpoint(A).unwrap(),
                net.endpoint(B).unwrap(),
                net.endpoint(C).unwrap(),
            );
            net.isolate(A);
            for (from, to) in [(&a, B), (&a, C), (&b, A), (&c, A)] {
                from.send(to, numbered(0)).await.unwrap();
            }
            assert_eq!(net.stats().dropped_partition, 4);
            b.send(C, numbered(1)).await.unwrap();
            assert_eq!(c.recv().await.unwrap(), (B, numbered(1)));
            // heal of one pair does not lift the isolation; rejoin does.
            net.heal(A, B);
            a.send(B, numbered(2)).await.unwrap();
            assert_eq!(net.stats().dropped_partition, 5);
            net.rejoin(A);
            a.send(B, numbered(3)).await.unwrap();
            assert_eq!(b.recv().await.unwrap(), (A, numbered(3)));
            // heal_all lifts isolations and partitions alike.
            net.isolate(C);
            net.partition(A, B);
            net.heal_all();
            a.send(B, numbered(4)).await.unwrap();
            a.send(C, numbered(5)).await.unwrap();
            assert_eq!(b.recv().await.unwrap(), (A, numbered(4)));
            assert_eq!(c.recv().await.unwrap(), (A, numbered(5)));
            assert!(is_quiet(&a).await && is_quiet(&b).await && is_quiet(&c).await);
            assert!(net.stats().balanced());
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let net = MemNetwork::new(MemFaults::default().with_capacity(4));
        let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
        timeout(Duration::from_secs(1), async {
            for i in 0..10 {
                a.send(B, numbered(i)).await.unwrap();
            }
        })
        .await
        .expect("send blocked on a full queue");
        let s = net.stats();
        assert_eq!((s.sent, s.delivered, s.dropped_full), (10, 4, 6));
        assert!(s.balanced());
        timeout(LIMIT, async {
            let got: Vec<u32> = take(&b, 4).await.iter().map(|(_, f)| number(f)).collect();
            assert_eq!(got, vec![0, 1, 2, 3]);
            assert!(is_quiet(&b).await);
            // Room again.
            a.send(B, numbered(10)).await.unwrap();
            assert_eq!(b.recv().await.unwrap(), (A, numbered(10)));
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn bytes_sent_counts_every_accepted_frame_once() {
        timeout(LIMIT, async {
            let net = MemNetwork::new(MemFaults::default().with_dup(0.5).with_seed(1));
            let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
            a.send(B, Bytes::from_static(b"abc")).await.unwrap();
            a.send(B, Bytes::from_static(b"hello")).await.unwrap();
            let _ = a.send(NodeId(9), Bytes::from_static(b"refused")).await;
            assert_eq!(net.stats().bytes_sent, 8);
            drop(b);
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn sending_to_an_unregistered_id_is_an_unknown_peer() {
        timeout(LIMIT, async {
            let net = MemNetwork::reliable();
            let a = net.endpoint(A).unwrap();
            let err = a.send(NodeId(9), numbered(0)).await.unwrap_err();
            assert!(
                matches!(err, TransportError::UnknownPeer(NodeId(9))),
                "{err}"
            );
            assert_eq!(net.stats(), MemStats::default());
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn sending_to_a_dropped_endpoint_is_silently_lost_and_counted() {
        timeout(LIMIT, async {
            let net = MemNetwork::reliable();
            let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
            drop(b);
            a.send(B, numbered(0)).await.unwrap();
            let s = net.stats();
            assert_eq!((s.sent, s.dropped_unreachable, s.delivered), (1, 1, 0));
            assert!(s.balanced());
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn an_id_has_one_open_endpoint_and_can_come_back_after_it_closes() {
        timeout(LIMIT, async {
            let net = MemNetwork::reliable();
            let a = net.endpoint(A).unwrap();
            let b = net.endpoint(B).unwrap();
            match net.endpoint(B) {
                Err(TransportError::Io { source, .. }) => {
                    assert_eq!(source.kind(), io::ErrorKind::AddrInUse);
                }
                other => panic!("expected AddrInUse, got {other:?}"),
            }
            b.close();
            let b2 = net.endpoint(B).unwrap();
            // The old handle can neither act for the new endpoint nor unregister it.
            assert!(matches!(
                b.send(A, numbered(0)).await,
                Err(TransportError::Closed)
            ));
            drop(b);
            a.send(B, numbered(1)).await.unwrap();
            assert_eq!(b2.recv().await.unwrap(), (A, numbered(1)));
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn recv_returns_closed_after_the_endpoint_or_the_network_closes() {
        timeout(LIMIT, async {
            let net = MemNetwork::reliable();
            let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
            a.send(B, numbered(0)).await.unwrap();
            b.close();
            assert!(matches!(b.recv().await, Err(TransportError::Closed)));
            assert!(matches!(
                b.send(A, numbered(1)).await,
                Err(TransportError::Closed)
            ));

            // A recv waiting when the network closes wakes up with Closed.
            let a = std::sync::Arc::new(a);
            let waiter = tokio::spawn({
                let a = std::sync::Arc::clone(&a);
                async move { a.recv().await }
            });
            tokio::task::yield_now().await;
            net.close();
            assert!(matches!(waiter.await.unwrap(), Err(TransportError::Closed)));
            assert!(matches!(a.recv().await, Err(TransportError::Closed)));
            assert!(matches!(
                a.send(B, numbered(2)).await,
                Err(TransportError::Closed)
            ));
            assert!(matches!(net.endpoint(C), Err(TransportError::Closed)));
        })
        .await
        .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn recv_is_cancel_safe() {
        timeout(LIMIT, async {
            let faults = MemFaults::default()
                .with_delay(Duration::from_millis(3), Duration::from_millis(30))
                .with_seed(4);
            let net = MemNetwork::new(faults);
            let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
            for i in 0..50 {
                a.send(B, numbered(i)).await.unwrap();
            }
            let mut got = Vec::new();
            let mut cancelled = 0;
            while got.len() < 50 {
                match timeout(Duration::from_millis(1), b.recv()).await {
                    Ok(r) => got.push(number(&r.unwrap().1)),
                    Err(_) => cancelled += 1,
                }
            }
            assert!(cancelled > 0);
            got.sort_unstable();
            assert_eq!(got, (0..50).collect::<Vec<_>>());
        })
        .await
        .unwrap();
    }

    #[test]
    fn delayed_frames_left_when_the_runtime_shuts_down_are_counted_lost() {
        let net = MemNetwork::new(
            MemFaults::default().with_delay(Duration::from_secs(60), Duration::from_secs(60)),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (a, _b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
        rt.block_on(async {
            timeout(LIMIT, a.send(B, numbered(0)))
                .await
                .unwrap()
                .unwrap();
        });
        assert_eq!(net.stats().in_flight, 1);
        drop(rt);
        let s = net.stats();
        assert_eq!((s.in_flight, s.dropped_unreachable), (0, 1));
        assert!(s.balanced());
    }

    #[test]
    fn delays_outside_a_runtime_deliver_at_once() {
        let net = MemNetwork::new(
            MemFaults::default().with_delay(Duration::from_secs(60), Duration::from_secs(60)),
        );
        let (a, b) = (net.endpoint(A).unwrap(), net.endpoint(B).unwrap());
        // A minimal executor: the send future never waits, so one poll finishes it.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut send = a.send(B, numbered(7));
        assert!(send.as_mut().poll(&mut cx).is_ready());
        let s = net.stats();
        assert_eq!((s.delivered, s.in_flight), (1, 0));
        drop(b);
    }
}
