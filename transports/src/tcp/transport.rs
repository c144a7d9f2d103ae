//! The transport itself: binding, `send` and `recv`, the listener, and the tasks' lifecycle.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pserver_core::NodeId;
use pserver_core::wire::FrameParts;
use pserver_core::wire::PROTOCOL_VERSION;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex as TokioMutex, Notify, mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::handshake::{self, Auth, Established, MAX_CLUSTER_ID};
use super::peer::PeerTask;
use super::shared::{PeerHandle, Shared, Tasks, stopped};
use super::stats::{Count, Counters};
use super::{TcpConfig, TcpStats};
use crate::refusal_log::{self, RefusalLog};
use crate::sync::Arc;
use crate::{Address, Transport, TransportError};

/// Frames received but not yet taken by `recv`; readers wait when it is full.
const INBOUND_QUEUE: usize = 1024;
/// Pause after a failed `accept` (out of file descriptors, say) so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// How long [`TcpTransport::shutdown`] waits for queued frames to be written.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_millis(500);

/// A [`Transport`] over TCP with authenticated peers; see the [module documentation](super).
///
/// Dropping it stops its tasks and closes its sockets without waiting; [`shutdown`] waits.
///
/// [`shutdown`]: TcpTransport::shutdown
pub struct TcpTransport {
    pub(super) shared: Arc<Shared>,
    local_addr: SocketAddr,
    inbound: TokioMutex<mpsc::Receiver<(NodeId, Bytes)>>,
    stop: watch::Sender<bool>,
    tasks_done: TokioMutex<mpsc::Receiver<()>>,
}

impl fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpTransport")
            .field("id", &self.shared.auth.me)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

fn invalid(msg: String) -> TransportError {
    TransportError::Io {
        context: "invalid TCP transport configuration".into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, msg),
    }
}

fn check_cluster_id(cfg: &TcpConfig) -> Result<(), TransportError> {
    if cfg.cluster_id.len() > MAX_CLUSTER_ID {
        return Err(invalid(format!(
            "cluster id of {} bytes exceeds the limit of {MAX_CLUSTER_ID} bytes",
            cfg.cluster_id.len()
        )));
    }
    Ok(())
}

impl TcpTransport {
    /// Listens on `cfg.listen` and starts the transport's tasks. Peers are dialed when there is
    /// a frame for them.
    ///
    /// Fails with [`TransportError::Io`], naming the address, if it cannot listen there (the
    /// port is in use, say), or if the cluster id is longer than 256 bytes.
    pub async fn bind(cfg: TcpConfig) -> Result<TcpTransport, TransportError> {
        check_cluster_id(&cfg)?;
        let listener =
            TcpListener::bind(cfg.listen)
                .await
                .map_err(|source| TransportError::Io {
                    context: format!("cannot listen on {}", cfg.listen),
                    source,
                })?;
        Self::start(cfg, listener)
    }

    /// Starts the transport on a listener the caller has already bound, in place of binding
    /// `cfg.listen`: [`local_addr`](Self::local_addr) reports the listener's address.
    ///
    /// A caller that binds every node's listener (on port 0, say) before it builds the peer
    /// tables keeps each port from the moment it learns it: no other socket can take the port
    /// between finding it free and listening on it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::collections::BTreeMap;
    /// use pserver_core::NodeId;
    /// use pserver_transport::tcp::{Secret, TcpConfig, TcpTransport};
    ///
    /// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let addr = listener.local_addr()?;
    /// let peers = BTreeMap::from([(NodeId(1), addr)]);
    /// let cfg = TcpConfig::new(NodeId(1), addr, peers, "demo", Secret::new(b"s3cret".to_vec()));
    /// let transport = TcpTransport::with_listener(cfg, listener).await?;
    /// assert_eq!(transport.local_addr(), addr);
    /// # Ok(()) }
    /// ```
    ///
    /// Fails with [`TransportError::Io`] if the listener cannot be made non-blocking, or if
    /// the cluster id is longer than 256 bytes.
    pub async fn with_listener(
        cfg: TcpConfig,
        listener: std::net::TcpListener,
    ) -> Result<TcpTransport, TransportError> {
        check_cluster_id(&cfg)?;
        let listener = listener
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(listener))
            .map_err(|source| TransportError::Io {
                context: "cannot hand the listener to the runtime".into(),
                source,
            })?;
        Self::start(cfg, listener)
    }

    fn start(cfg: TcpConfig, listener: TcpListener) -> Result<TcpTransport, TransportError> {
        let local_addr = listener.local_addr().map_err(|source| TransportError::Io {
            context: format!("cannot read the address bound for {}", cfg.listen),
            source,
        })?;
        let peer_addrs: BTreeMap<NodeId, Address> = cfg
            .peers
            .iter()
            .filter(|(id, _)| **id != cfg.id)
            .map(|(&id, addr)| (id, addr.clone()))
            .collect();
        let auth = Auth::new(
            cfg.id,
            cfg.cluster_id.clone().into_bytes(),
            &cfg.secret,
            peer_addrs.keys().copied().collect::<BTreeSet<_>>(),
            PROTOCOL_VERSION,
        )
        .map_err(|e| invalid(format!("unusable secret: {e}")))?;

        let mut handles = BTreeMap::new();
        let mut receivers = Vec::new();
        for (&id, addr) in &peer_addrs {
            let (queue, queue_rx) = mpsc::channel(cfg.send_queue.max(1));
            let (accepted, accepted_rx) = mpsc::channel(4);
            handles.insert(
                id,
                PeerHandle {
                    queue,
                    wake: Notify::new(),
                    accepted,
                },
            );
            receivers.push((id, addr.clone(), queue_rx, accepted_rx));
        }
        let (inbound, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
        let reconnect_min = cfg.reconnect_min.max(Duration::from_millis(1));
        let shared = Arc::new(Shared {
            auth,
            max_frame: cfg.max_frame.min(u32::MAX as usize),
            handshake_timeout: cfg.handshake_timeout,
            frame_timeout: cfg.frame_timeout,
            reconnect_min,
            reconnect_max: cfg.reconnect_max.max(reconnect_min),
            counters: Counters::default(),
            refusals: RefusalLog::new("connection", refusal_log::WINDOW),
            drops: RefusalLog::drops("frame", refusal_log::WINDOW),
            inbound,
            peers: handles,
            unreachable: std::sync::Mutex::new(BTreeMap::new()),
            unwritten: std::sync::atomic::AtomicUsize::new(0),
            wrote: Notify::new(),
        });

        let (stop, stop_rx) = watch::channel(false);
        let (alive, tasks_done) = mpsc::channel(1);
        let tasks = Tasks {
            stop: stop_rx,
            alive,
        };
        for (id, addr, queue_rx, accepted_rx) in receivers {
            let task = PeerTask::new(
                id,
                addr,
                Arc::clone(&shared),
                tasks.clone(),
                queue_rx,
                accepted_rx,
            );
            tasks.spawn(task.run());
        }
        tasks.spawn(accept_loop(listener, Arc::clone(&shared), tasks.clone()));
        debug!(id = %cfg.id, %local_addr, "TCP transport listening");
        Ok(TcpTransport {
            shared,
            local_addr,
            inbound: TokioMutex::new(inbound_rx),
            stop,
            tasks_done: TokioMutex::new(tasks_done),
        })
    }

    /// The address the listener is bound to (with the actual port if `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Why each peer that could not be reached at its last dial could not: a name that does
    /// not resolve, a refused or timed-out connection, a refused handshake. A peer leaves the
    /// list once a dial to it succeeds. For saying why a node could not join its cluster.
    pub fn unreachable(&self) -> BTreeMap<NodeId, String> {
        self.shared.unreachable_now().clone()
    }

    /// The transport's counters.
    pub fn stats(&self) -> TcpStats {
        self.shared.counters.snapshot()
    }

    /// Closes the listener and every connection and waits until all of the transport's tasks
    /// have ended. Afterwards `send` and `recv` return [`TransportError::Closed`], and the
    /// port is free to bind again.
    ///
    /// What was queued before goes out first, for up to [`SHUTDOWN_FLUSH`]: a node's last
    /// frames (a server telling the coordinator that it heard the job end, say) are not lost
    /// to its own exit. Frames for a peer that cannot be reached wait no longer than that.
    pub async fn shutdown(&self) {
        let until = Instant::now() + SHUTDOWN_FLUSH;
        loop {
            // Registered before the check, so that a batch written in between still wakes it.
            let wrote = self.shared.wrote.notified();
            if self.shared.flushed() || tokio::time::timeout_at(until, wrote).await.is_err() {
                break;
            }
        }
        self.stop.send_replace(true);
        let mut done = self.tasks_done.lock().await;
        while done.recv().await.is_some() {}
    }

    fn is_closed(&self) -> bool {
        *self.stop.borrow()
    }

    /// Frames queued and not yet written, as shutdown counts them.
    #[cfg(test)]
    pub(super) fn unwritten(&self) -> usize {
        self.shared
            .unwritten
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

#[async_trait]
impl Transport for TcpTransport {
    /// Queues `frame` for `to` and returns at once. Fails if the frame exceeds `max_frame`
    /// ([`TransportError::FrameTooLarge`]), `to` is not a peer ([`TransportError::UnknownPeer`]),
    /// or the transport is shut down. A frame beyond the peer's queue is dropped and counted,
    /// and an empty frame is not sent: both return `Ok`.
    async fn send(&self, to: NodeId, frame: Bytes) -> Result<(), TransportError> {
        self.send_parts(to, frame.into()).await
    }

    /// Queues the frame's parts for one vectored write: its large parts (the values of a
    /// push or a reply) go from where they are to the socket, with no copy into a frame.
    async fn send_parts(&self, to: NodeId, frame: FrameParts) -> Result<(), TransportError> {
        if self.is_closed() {
            return Err(TransportError::Closed);
        }
        if frame.len() > self.shared.max_frame {
            return Err(TransportError::FrameTooLarge {
                len: frame.len(),
                limit: self.shared.max_frame,
            });
        }
        let peer = self
            .shared
            .peers
            .get(&to)
            .ok_or(TransportError::UnknownPeer(to))?;
        if frame.is_empty() {
            return Ok(());
        }
        // Counted first: a writer may take the frame as soon as it is queued.
        self.shared.queued();
        match peer.queue.try_send(frame) {
            Ok(()) => {
                peer.wake.notify_one();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.shared.written(1);
                self.shared.counters.bump(Count::Dropped);
                // The core resends what matters; a peer that cannot keep up is worth a line,
                // but not one per frame.
                let detail = || format!("for {to}: its send queue is full");
                self.shared.drops.dropped("send queue full", detail);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.shared.written(1);
                Err(TransportError::Closed)
            }
        }
    }

    /// Waits for the next frame from an authenticated peer. Cancel-safe. Returns
    /// [`TransportError::Closed`] once the transport is shut down.
    async fn recv(&self) -> Result<(NodeId, Bytes), TransportError> {
        let mut stop = self.stop.subscribe();
        if *stop.borrow_and_update() {
            return Err(TransportError::Closed);
        }
        let mut inbound = tokio::select! {
            biased;
            () = stopped(&mut stop) => return Err(TransportError::Closed),
            guard = self.inbound.lock() => guard,
        };
        tokio::select! {
            biased;
            () = stopped(&mut stop) => Err(TransportError::Closed),
            frame = inbound.recv() => frame.ok_or(TransportError::Closed),
        }
    }
}

/// Accepts connections for as long as the transport lives; each gets its own handshake task,
/// so a slow or hostile client holds up nobody else.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, tasks: Tasks) {
    let mut summaries = tokio::time::interval(refusal_log::WINDOW);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = summaries.tick() => {
                shared.refusals.tick();
                shared.drops.tick();
                continue;
            }
        };
        match accepted {
            Ok((stream, addr)) => {
                shared.counters.bump(Count::Accepted);
                tasks.spawn(accept_one(stream, addr, Arc::clone(&shared)));
            }
            Err(e) => {
                warn!("accepting a TCP connection failed: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

/// Authenticates an accepted connection and hands it to its peer's task.
async fn accept_one(stream: TcpStream, addr: SocketAddr, shared: Arc<Shared>) {
    if let Some(est) = authenticate(stream, addr, &shared).await {
        if let Some(h) = shared.peers.get(&est.peer) {
            let _ = h.accepted.send(est).await;
        }
    }
}

/// The acceptor's handshake on a fresh connection; logs and counts a refusal.
pub(super) async fn authenticate(
    mut stream: TcpStream,
    addr: SocketAddr,
    shared: &Shared,
) -> Option<Established> {
    if let Err(e) = stream.set_nodelay(true) {
        debug!(remote = %addr, "cannot set TCP_NODELAY: {e}");
    }
    let deadline = Instant::now() + shared.handshake_timeout;
    match handshake::accept(&mut stream, &shared.auth, deadline).await {
        Ok(peer) => {
            shared.counters.bump(Count::Established);
            debug!(%peer, remote = %addr, "accepted a connection from {peer}");
            Some(Established {
                stream,
                peer,
                dialer: peer,
                addr,
            })
        }
        Err(e) => {
            shared.counters.bump(Count::Refused);
            shared
                .refusals
                .refused(e.kind(), || format!("from {addr}: {e}"));
            None
        }
    }
}
