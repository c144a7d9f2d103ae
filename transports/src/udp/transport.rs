//! The UDP transport: one socket per node, frames fragmented below the MTU, a receive task
//! that authenticates and reassembles.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use pserver_core::NodeId;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sha2::Sha256;
use tokio::net::UdpSocket;
use tokio::sync::{Mutex as TokioMutex, mpsc};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::fragment::{FragmentHeader, Reassembler, ReassemblyLimits, fragment};
use crate::refusal_log::{self, RefusalLog};
use crate::tcp::Secret;
use crate::{Address, FlowLimits, Transport, TransportError};

/// Bytes of the MAC each datagram ends with when a secret is configured: HMAC-SHA256,
/// truncated to 128 bits.
pub const MAC_LEN: usize = 16;
/// Default payload bytes per datagram: below a 1,500-byte Ethernet MTU with room for the IP,
/// UDP and fragment headers and the MAC.
pub const DEFAULT_MAX_PAYLOAD: usize = 1400;
/// The largest datagram the receive task reads.
const MAX_DATAGRAM: usize = 65_536;

/// How a [`UdpTransport`] binds, authenticates and reassembles.
///
/// [`UdpConfig::new`] takes what has no sensible default; the other fields start at the values
/// their docs give and may be changed before [`UdpTransport::bind`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct UdpConfig {
    /// This node.
    pub id: NodeId,
    /// The address to bind; port 0 picks a free port (see [`UdpTransport::local_addr`]).
    pub listen: SocketAddr,
    /// Every node this one may talk to, at its address: an IP address, or a host name that
    /// the transport resolves when it starts and again every [`RESOLVE_EVERY`] (a pod that
    /// restarts comes back under its name at another IP). Datagrams from any other address
    /// are dropped (and counted), as are datagrams whose header names another node than the
    /// one at their source address. An entry for `id` itself is ignored.
    pub peers: BTreeMap<NodeId, Address>,
    /// With a secret, every datagram carries a MAC that the receiver checks before it
    /// reassembles anything. Default: none.
    pub secret: Option<Secret>,
    /// Payload bytes per datagram. Default: [`DEFAULT_MAX_PAYLOAD`].
    pub max_payload: usize,
    /// What the receiver holds of incomplete frames, and the longest frame, which `send` also
    /// enforces. Default: [`ReassemblyLimits::default`].
    pub limits: ReassemblyLimits,
    /// Fault injection: the fraction of outgoing datagrams dropped, for tests of recovery from
    /// loss. Default: 0.
    pub drop_outgoing: f64,
    /// Seed of the fault injector.
    pub seed: u64,
    /// Frames reassembled but not yet taken by `recv`; beyond it the receive task waits.
    /// Default: 1024.
    pub recv_queue: usize,
    /// The socket's receive and send buffers, in bytes: a frame's datagrams arrive in a burst,
    /// and what overflows the receive buffer is lost. The kernel caps it (on Linux at
    /// `net.core.rmem_max`). Default: 4 MiB.
    pub socket_buffer: usize,
}

impl UdpConfig {
    /// A configuration with the default limits and no secret.
    pub fn new<A: Into<Address>>(
        id: NodeId,
        listen: SocketAddr,
        peers: impl IntoIterator<Item = (NodeId, A)>,
    ) -> Self {
        UdpConfig {
            id,
            listen,
            peers: peers.into_iter().map(|(n, a)| (n, a.into())).collect(),
            secret: None,
            max_payload: DEFAULT_MAX_PAYLOAD,
            limits: ReassemblyLimits::default(),
            drop_outgoing: 0.0,
            seed: 0,
            recv_queue: 1024,
            socket_buffer: 4 << 20,
        }
    }
}

/// What a [`UdpTransport`] sent, received and dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UdpStats {
    /// Datagrams handed to the socket.
    pub sent: u64,
    /// Bytes of those datagrams, fragment headers and MACs included.
    pub bytes_sent: u64,
    /// Outgoing datagrams the fault injector dropped.
    pub injected_drops: u64,
    /// Datagrams received.
    pub received: u64,
    /// Datagrams from an address outside the peer table, or naming another node than the one
    /// at their address.
    pub unknown_source: u64,
    /// Datagrams whose MAC did not verify (or that were too short to carry one).
    pub bad_mac: u64,
    /// Datagrams the reassembler refused (truncated, inconsistent, corrupt, too large).
    pub refused: u64,
    /// Frames delivered to `recv`.
    pub frames: u64,
    /// Incomplete frames the reassembler dropped: a fragment did not come within the
    /// reassembly timeout, or newer frames needed the room. The core resends what matters.
    pub incomplete_dropped: u64,
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    bytes_sent: AtomicU64,
    injected_drops: AtomicU64,
    received: AtomicU64,
    unknown_source: AtomicU64,
    bad_mac: AtomicU64,
    refused: AtomicU64,
    frames: AtomicU64,
    incomplete_dropped: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// How often peers given by name are resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(2);

/// Where each peer is now, as last resolved.
#[derive(Default)]
struct PeerTable {
    /// The address each resolved peer is sent to.
    to: BTreeMap<NodeId, SocketAddr>,
    /// The peer at each address it may send from.
    from: HashMap<SocketAddr, NodeId>,
    /// Why each peer whose name does not resolve does not.
    unresolved: BTreeMap<NodeId, String>,
}

impl PeerTable {
    /// Puts `peer` at `addrs` (it sends to the first), in place of where it was.
    fn place(&mut self, peer: NodeId, addrs: &[SocketAddr]) {
        self.from.retain(|_, n| *n != peer);
        self.unresolved.remove(&peer);
        for &a in addrs {
            self.from.insert(a, peer);
        }
        if let Some(&first) = addrs.first() {
            self.to.insert(peer, first);
        }
    }
}

struct Shared {
    id: NodeId,
    socket: UdpSocket,
    /// Every peer, as configured.
    peers: BTreeMap<NodeId, Address>,
    /// Where they are now.
    table: std::sync::RwLock<PeerTable>,
    key: Option<Hmac<Sha256>>,
    max_payload: usize,
    max_frame: usize,
    /// The receive buffer the kernel granted, in bytes of datagrams.
    recv_buffer: usize,
    next_frame: AtomicU64,
    drop_outgoing: f64,
    rng: Mutex<SmallRng>,
    counters: Counters,
    /// Refused datagrams, logged at a bounded rate.
    refusals: RefusalLog,
    /// Incomplete frames dropped, logged at a bounded rate.
    drops: RefusalLog,
}

/// Carries frames over UDP between the nodes of a peer table ([`UdpConfig`]).
///
/// A frame is cut into datagrams of at most [`UdpConfig::max_payload`] bytes of payload; the
/// receiver puts it back together within [`UdpConfig::limits`]. A lost datagram loses its
/// frame, which the core retransmits. `send` does not wait for the peer, only for the local
/// socket buffer.
pub struct UdpTransport {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    inbound: TokioMutex<mpsc::Receiver<(NodeId, Bytes)>>,
    task: JoinHandle<()>,
    /// Resolves the peers given by name, if there are any.
    resolver: Option<JoinHandle<()>>,
}

impl fmt::Debug for UdpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpTransport")
            .field("id", &self.shared.id)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

fn io_error(context: String, source: std::io::Error) -> TransportError {
    TransportError::Io { context, source }
}

impl UdpTransport {
    /// Binds `cfg.listen` and starts the receive task.
    ///
    /// Fails with [`TransportError::Io`], naming the address, if it cannot bind there, or if
    /// the configuration is unusable (no payload room, a drop fraction outside 0..=1).
    pub async fn bind(cfg: UdpConfig) -> Result<UdpTransport, TransportError> {
        let key = checked_key(&cfg)?;
        let socket = bind_socket(cfg.listen, cfg.socket_buffer)
            .map_err(|e| io_error(format!("binding UDP socket on {}", cfg.listen), e))?;
        Self::start(cfg, key, socket)
    }

    /// Starts the transport on a socket the caller has already bound, in place of binding
    /// `cfg.listen`: [`local_addr`](Self::local_addr) reports the socket's address. The
    /// socket's buffers are sized as `cfg.socket_buffer` asks.
    ///
    /// A caller that binds every node's socket (on port 0, say) before it builds the peer
    /// tables keeps each port from the moment it learns it: no other socket can take the port
    /// between finding it free and binding it again.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::collections::BTreeMap;
    /// use pserver_core::NodeId;
    /// use pserver_transport::udp::{UdpConfig, UdpTransport};
    ///
    /// let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    /// let addr = socket.local_addr()?;
    /// let cfg = UdpConfig::new(NodeId(1), addr, BTreeMap::from([(NodeId(1), addr)]));
    /// let transport = UdpTransport::with_socket(cfg, socket).await?;
    /// assert_eq!(transport.local_addr(), addr);
    /// # Ok(()) }
    /// ```
    ///
    /// Fails as [`bind`](Self::bind) does on an unusable configuration, and with
    /// [`TransportError::Io`] if the socket cannot be made non-blocking.
    pub async fn with_socket(
        cfg: UdpConfig,
        socket: std::net::UdpSocket,
    ) -> Result<UdpTransport, TransportError> {
        let key = checked_key(&cfg)?;
        size_buffers(socket2::SockRef::from(&socket), cfg.socket_buffer);
        let socket = socket
            .set_nonblocking(true)
            .and_then(|()| UdpSocket::from_std(socket))
            .map_err(|e| io_error("handing the UDP socket to the runtime".into(), e))?;
        Self::start(cfg, key, socket)
    }

    fn start(
        cfg: UdpConfig,
        key: Option<Hmac<Sha256>>,
        socket: UdpSocket,
    ) -> Result<UdpTransport, TransportError> {
        let local_addr = socket
            .local_addr()
            .map_err(|e| io_error("reading the UDP socket's address".into(), e))?;
        // Linux reports twice what it grants, the other half being its own bookkeeping.
        let recv_buffer = socket2::SockRef::from(&socket)
            .recv_buffer_size()
            .map_or(cfg.socket_buffer, |granted| granted / 2)
            .min(cfg.socket_buffer);
        let mut peers = cfg.peers.clone();
        peers.remove(&cfg.id);
        let mut table = PeerTable::default();
        for (&n, a) in &peers {
            if let Some(ip) = a.ip() {
                table.place(n, &[ip]);
            } else {
                table.unresolved.insert(n, format!("{a} not resolved yet"));
            }
        }
        let named = peers.values().any(|a| a.host().is_some());
        let shared = Arc::new(Shared {
            id: cfg.id,
            socket,
            peers,
            table: std::sync::RwLock::new(table),
            key,
            max_payload: cfg.max_payload,
            max_frame: cfg.limits.max_frame,
            recv_buffer,
            next_frame: AtomicU64::new(0),
            drop_outgoing: cfg.drop_outgoing,
            rng: Mutex::new(SmallRng::seed_from_u64(cfg.seed)),
            counters: Counters::default(),
            refusals: RefusalLog::new("datagram", refusal_log::WINDOW),
            drops: RefusalLog::drops("partial frame", refusal_log::WINDOW),
        });
        let (tx, rx) = mpsc::channel(cfg.recv_queue.max(1));
        let task = tokio::spawn(receive(Arc::clone(&shared), cfg.limits, tx));
        let resolver = named.then(|| tokio::spawn(resolve_names(Arc::clone(&shared))));
        Ok(UdpTransport {
            shared,
            local_addr,
            inbound: TokioMutex::new(rx),
            task,
            resolver,
        })
    }

    /// The address the socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What was sent, received and dropped so far.
    pub fn stats(&self) -> UdpStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        UdpStats {
            sent: get(&c.sent),
            bytes_sent: get(&c.bytes_sent),
            injected_drops: get(&c.injected_drops),
            received: get(&c.received),
            unknown_source: get(&c.unknown_source),
            bad_mac: get(&c.bad_mac),
            refused: get(&c.refused),
            frames: get(&c.frames),
            incomplete_dropped: get(&c.incomplete_dropped),
        }
    }

    /// Stops the receive task: frames not yet taken by `recv` are still delivered, then `recv`
    /// reports [`TransportError::Closed`].
    pub fn shutdown(&self) {
        self.task.abort();
        if let Some(r) = &self.resolver {
            r.abort();
        }
    }

    /// Why each peer given by a name that does not resolve (yet) cannot be sent to. For
    /// saying why a node could not join its cluster.
    pub fn unreachable(&self) -> BTreeMap<NodeId, String> {
        self.shared.table().unresolved.clone()
    }

    fn drop_injected(&self) -> bool {
        if self.shared.drop_outgoing <= 0.0 {
            return false;
        }
        let mut rng = self
            .shared
            .rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        rng.random::<f64>() < self.shared.drop_outgoing
    }
}

impl Drop for UdpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    /// The peer table, for reading.
    fn table(&self) -> std::sync::RwLockReadGuard<'_, PeerTable> {
        // Nothing is left half-done under this lock: a poisoned one is still whole.
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Resolves every peer given by name now and every [`RESOLVE_EVERY`], for as long as the
/// transport runs. A name that does not resolve is said once (pods come up in any order) and
/// tried again; one that resolves at another address than before is said too.
async fn resolve_names(shared: Arc<Shared>) {
    let named: Vec<(NodeId, Address)> = shared
        .peers
        .iter()
        .filter(|(_, a)| a.host().is_some())
        .map(|(&n, a)| (n, a.clone()))
        .collect();
    let mut warned = std::collections::BTreeSet::new();
    let mut tick = tokio::time::interval(RESOLVE_EVERY);
    loop {
        tick.tick().await;
        for (peer, addr) in &named {
            let found = addr.resolve().await;
            let mut table = shared.table.write().unwrap_or_else(PoisonError::into_inner);
            match found {
                Ok(mut found) => {
                    // Sent to from this socket: an address of its family first.
                    let v4 = shared.socket.local_addr().is_ok_and(|a| a.is_ipv4());
                    found.sort_by_key(|a| a.is_ipv4() != v4);
                    if warned.remove(peer) {
                        info!(%peer, "{addr} resolves now");
                    }
                    match table.to.get(peer) {
                        Some(was) if !found.contains(was) => {
                            info!(%peer, "{addr} is at {} now, not {was}", found[0]);
                        }
                        _ => {}
                    }
                    table.place(*peer, &found);
                }
                Err(e) => {
                    let why = format!("cannot resolve {addr}, the address of {peer}: {e}");
                    if warned.insert(*peer) {
                        warn!(%peer, "{why}; retrying");
                    }
                    // Where it was last is still the best guess for sending.
                    table.unresolved.insert(*peer, why);
                }
            }
        }
    }
}

#[async_trait]
impl Transport for UdpTransport {
    /// Fragments `frame` and sends its datagrams to `to`. Fails if the frame exceeds the frame
    /// limit ([`TransportError::FrameTooLarge`]), `to` is not a peer
    /// ([`TransportError::UnknownPeer`]), or the socket fails.
    async fn send(&self, to: NodeId, frame: Bytes) -> Result<(), TransportError> {
        let shared = &self.shared;
        if frame.len() > shared.max_frame {
            return Err(TransportError::FrameTooLarge {
                len: frame.len(),
                limit: shared.max_frame,
            });
        }
        if !shared.peers.contains_key(&to) {
            return Err(TransportError::UnknownPeer(to));
        }
        let Some(addr) = shared.table().to.get(&to).copied() else {
            let why = shared
                .table()
                .unresolved
                .get(&to)
                .cloned()
                .unwrap_or_default();
            return Err(io_error(
                format!("cannot send to {to}"),
                std::io::Error::new(std::io::ErrorKind::NotFound, why),
            ));
        };
        let id = shared.next_frame.fetch_add(1, Ordering::Relaxed);
        let datagrams = fragment(shared.id, id, &frame, shared.max_payload).map_err(|_| {
            TransportError::FrameTooLarge {
                len: frame.len(),
                limit: shared.max_payload * super::fragment::MAX_FRAGMENTS,
            }
        })?;
        for datagram in datagrams {
            let datagram = match &shared.key {
                Some(key) => with_mac(key, &datagram),
                None => datagram,
            };
            if self.drop_injected() {
                bump(&shared.counters.injected_drops);
                continue;
            }
            shared
                .socket
                .send_to(&datagram, addr)
                .await
                .map_err(|e| io_error(format!("sending a datagram to {to} at {addr}"), e))?;
            bump(&shared.counters.sent);
            shared
                .counters
                .bytes_sent
                .fetch_add(datagram.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Waits for the next reassembled frame. Cancel-safe: frames wait in a channel.
    async fn recv(&self) -> Result<(NodeId, Bytes), TransportError> {
        let mut inbound = self.inbound.lock().await;
        inbound.recv().await.ok_or(TransportError::Closed)
    }

    /// Slices of [`SLICE_DATAGRAMS`] datagrams at most, so that a lost datagram costs little
    /// to resend, and a window of a [`WINDOW_SHARE`] of the receive buffer per worker and
    /// kind, so that bursts from several workers do not overflow the servers' buffers (what
    /// overflows is lost).
    fn flow_limits(&self) -> FlowLimits {
        let shared = &self.shared;
        FlowLimits {
            max_slice_bytes: Some(SLICE_DATAGRAMS * shared.max_payload),
            max_bytes_in_flight: Some((shared.recv_buffer / WINDOW_SHARE) as u64),
        }
    }
}

/// Datagrams of payload in the largest slice [`UdpTransport`] asks workers for. Measured with
/// `pserver bench`: 64 keeps a dense push of 1M values near its lossless speed with 0.1% of
/// the datagrams lost, where 256 loses three quarters of it.
pub const SLICE_DATAGRAMS: usize = 64;

/// The part of the receive buffer a worker may fill with push slices, or with pull slices.
pub const WINDOW_SHARE: usize = 2;

/// A non-blocking UDP socket on `addr` with buffers of `buffer` bytes (as far as the kernel
/// allows), registered with the tokio runtime.
/// The MAC key `cfg` asks for, once its limits are checked.
fn checked_key(cfg: &UdpConfig) -> Result<Option<Hmac<Sha256>>, TransportError> {
    let invalid = |msg: String| {
        io_error(
            "invalid UDP transport configuration".into(),
            std::io::Error::new(std::io::ErrorKind::InvalidInput, msg),
        )
    };
    let overhead = super::fragment::HEADER_LEN + MAC_LEN;
    if cfg.max_payload == 0 || cfg.max_payload + overhead > MAX_DATAGRAM - 64 {
        return Err(invalid(format!(
            "max_payload of {} bytes: it must be between 1 and {}",
            cfg.max_payload,
            MAX_DATAGRAM - 64 - overhead
        )));
    }
    if !(0.0..=1.0).contains(&cfg.drop_outgoing) {
        return Err(invalid(format!(
            "drop_outgoing of {}: it must be a fraction between 0 and 1",
            cfg.drop_outgoing
        )));
    }
    match &cfg.secret {
        Some(secret) => Hmac::<Sha256>::new_from_slice(secret.bytes())
            .map(Some)
            .map_err(|e| invalid(format!("secret unusable as an HMAC key: {e}"))),
        None => Ok(None),
    }
}

/// Asks for `buffer` bytes of receive and send buffer. Best effort: a smaller buffer only
/// means more loss under bursts.
fn size_buffers(socket: socket2::SockRef<'_>, buffer: usize) {
    let _ = socket.set_recv_buffer_size(buffer);
    let _ = socket.set_send_buffer_size(buffer);
}

fn bind_socket(addr: SocketAddr, buffer: usize) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    size_buffers(socket2::SockRef::from(&socket), buffer);
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

fn with_mac(key: &Hmac<Sha256>, datagram: &[u8]) -> Bytes {
    let mut mac = key.clone();
    mac.update(datagram);
    let tag = mac.finalize().into_bytes();
    let mut out = BytesMut::with_capacity(datagram.len() + MAC_LEN);
    out.put_slice(datagram);
    out.put_slice(&tag[..MAC_LEN]);
    out.freeze()
}

/// The datagram without its MAC, if the MAC verifies.
fn verified<'a>(key: &Hmac<Sha256>, datagram: &'a [u8]) -> Option<&'a [u8]> {
    let body_len = datagram.len().checked_sub(MAC_LEN)?;
    let (body, tag) = datagram.split_at(body_len);
    let mut mac = key.clone();
    mac.update(body);
    mac.verify_truncated_left(tag).ok()?;
    Some(body)
}

/// The receive task: reads datagrams, drops those from outside the peer table or with a bad
/// MAC, reassembles the rest, and expires incomplete frames twice per timeout.
async fn receive(shared: Arc<Shared>, limits: ReassemblyLimits, tx: mpsc::Sender<(NodeId, Bytes)>) {
    let mut reassembler = Reassembler::new(limits);
    // What the reassembler had dropped when last counted.
    let mut dropped = (0, 0);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut tick = tokio::time::interval((limits.timeout / 2).max(Duration::from_millis(1)));
    let c = &shared.counters;
    loop {
        let (n, addr) = tokio::select! {
            got = shared.socket.recv_from(&mut buf) => match got {
                Ok(got) => got,
                Err(e) => {
                    // ICMP errors surface here on some systems (a peer's port closed): the
                    // socket stays usable.
                    debug!(error = %e, "UDP receive failed");
                    continue;
                }
            },
            _ = tick.tick() => {
                reassembler.expire(Instant::now());
                note_drops(&shared, &reassembler, &mut dropped);
                shared.refusals.tick();
                shared.drops.tick();
                continue;
            }
        };
        bump(&c.received);
        let known = shared.table().from.get(&addr).copied();
        let Some(peer) = known else {
            bump(&c.unknown_source);
            let detail = || format!("from {addr}: not an address of this cluster");
            shared.refusals.refused("unknown address", detail);
            continue;
        };
        let datagram = &buf[..n];
        let body = match &shared.key {
            Some(key) => match verified(key, datagram) {
                Some(body) => body,
                None => {
                    bump(&c.bad_mac);
                    let detail = || format!("from {addr} ({peer}): its MAC does not verify");
                    shared.refusals.refused("wrong secret", detail);
                    continue;
                }
            },
            None => datagram,
        };
        if FragmentHeader::read(body).is_ok_and(|h| h.from != peer) {
            bump(&c.unknown_source);
            let detail = || format!("from {addr} ({peer}): it names another sender");
            shared.refusals.refused("spoofed sender", detail);
            continue;
        }
        let accepted = reassembler.accept(Instant::now(), Bytes::copy_from_slice(body));
        note_drops(&shared, &reassembler, &mut dropped);
        match accepted {
            Ok(Some((_, frame))) => {
                bump(&c.frames);
                if tx.send((peer, frame)).await.is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(e) => {
                bump(&c.refused);
                let detail = || format!("from {addr} ({peer}): {e}");
                shared.refusals.refused("malformed", detail);
            }
        }
    }
}

/// Counts and logs the incomplete frames the reassembler dropped since `seen` (expired,
/// evicted).
fn note_drops(shared: &Shared, reassembler: &Reassembler, seen: &mut (u64, u64)) {
    let stats = reassembler.stats();
    let (expired, evicted) = (stats.expired - seen.0, stats.evicted - seen.1);
    *seen = (stats.expired, stats.evicted);
    shared
        .counters
        .incomplete_dropped
        .fetch_add(expired + evicted, Ordering::Relaxed);
    let detail = || "(a fragment did not come within the reassembly timeout)".to_owned();
    shared.drops.dropped_many("timed out", expired, detail);
    let detail = || "(newer frames needed the room)".to_owned();
    shared.drops.dropped_many("no room", evicted, detail);
}

#[cfg(test)]
mod tests;
