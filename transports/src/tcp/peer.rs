//! One task per peer owns everything about the way to that peer: whether it is connected, the
//! dial in flight, the reconnect backoff, and which of two connections to keep.

use std::time::Duration;

use pserver_core::NodeId;

use pserver_core::wire::FrameParts;
use tokio::net::TcpStream;
use tokio::sync::{Mutex as TokioMutex, mpsc, oneshot};
use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::{debug, info, warn};

use super::conn;
use super::handshake::{self, Established};
use super::shared::{Shared, Tasks};
use super::stats::Count;
use crate::Address;
use crate::sync::Arc;

/// Whether a new connection to a peer replaces the current one. Both ends reach the same
/// verdict without talking: of two connections dialed by different nodes, the one dialed by
/// the lower node id wins; a connection dialed by the same node as the current one replaces it
/// (a node dials only when it has no connection, so its dialer has given up on the old one).
pub(super) fn supersedes(current_dialer: NodeId, new_dialer: NodeId) -> bool {
    new_dialer <= current_dialer
}

/// The delay after `current`: doubled, capped at `max`.
pub(super) fn next_backoff(current: Duration, max: Duration) -> Duration {
    current.saturating_mul(2).min(max)
}

/// What the peer task hears from the tasks it spawned.
enum Event {
    /// A dial ended: the connection, or why it failed.
    Dialed(Result<Established, DialError>),
    /// The connection with this id ended.
    Closed(u64),
}

/// The connection in use.
struct Current {
    id: u64,
    dialer: NodeId,
    /// Dropping it retires the connection.
    _demote: oneshot::Sender<()>,
}

/// The state of the way to one peer, owned by its task.
pub(super) struct PeerTask {
    peer: NodeId,
    addr: Address,
    /// Whether the peer's name failed to resolve at the last dial, said once until it does.
    unresolved: bool,
    shared: Arc<Shared>,
    tasks: Tasks,
    /// Frames for the peer; the current connection's writer holds the lock.
    queue: Arc<TokioMutex<mpsc::Receiver<FrameParts>>>,
    /// Authenticated connections the listener accepted from this peer.
    accepted: mpsc::Receiver<Established>,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    current: Option<Current>,
    dialing: bool,
    backoff: Duration,
    not_before: Instant,
    next_id: u64,
}

impl PeerTask {
    /// The task for `peer`, fed by its queue and by the listener.
    pub(super) fn new(
        peer: NodeId,
        addr: Address,
        shared: Arc<Shared>,
        tasks: Tasks,
        queue: mpsc::Receiver<FrameParts>,
        accepted: mpsc::Receiver<Established>,
    ) -> PeerTask {
        let (events_tx, events) = mpsc::unbounded_channel();
        let backoff = shared.reconnect_min;
        PeerTask {
            peer,
            addr,
            unresolved: false,
            shared,
            tasks,
            queue: Arc::new(TokioMutex::new(queue)),
            accepted,
            events_tx,
            events,
            current: None,
            dialing: false,
            backoff,
            not_before: Instant::now(),
            next_id: 0,
        }
    }

    /// Whether frames wait in the queue.
    fn pending(&self) -> bool {
        self.shared
            .peers
            .get(&self.peer)
            .is_some_and(|h| h.queue.capacity() < h.queue.max_capacity())
    }

    /// Runs until the transport shuts down (the spawner cancels it).
    pub(super) async fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        let Some(handle) = shared.peers.get(&self.peer) else {
            return;
        };
        loop {
            let idle = self.current.is_none() && !self.dialing;
            let want_dial = idle && self.pending();
            tokio::select! {
                Some(est) = self.accepted.recv() => self.offer(est),
                Some(ev) = self.events.recv() => self.on_event(ev),
                () = sleep_until(self.not_before), if want_dial => self.dial(),
                // `send` wakes us when a frame waits and nobody carries it.
                () = handle.wake.notified(), if idle && !want_dial => {}
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Dialed(Ok(est)) => {
                self.dialing = false;
                if std::mem::take(&mut self.unresolved) {
                    info!(peer = %self.peer, "{} resolves now", self.addr);
                }
                self.shared.unreachable_now().remove(&self.peer);
                self.offer(est);
            }
            Event::Dialed(Err(e)) => {
                self.dialing = false;
                if matches!(e, DialError::Unresolved(_))
                    && !std::mem::replace(&mut self.unresolved, true)
                {
                    // Pods come up in any order: said once, then retried with the backoff.
                    warn!(peer = %self.peer, "{e}; retrying");
                }
                self.shared
                    .unreachable_now()
                    .insert(self.peer, e.to_string());
                self.delay_next_dial();
            }
            Event::Closed(id) => {
                if self.current.as_ref().is_some_and(|c| c.id == id) {
                    self.current = None;
                    self.delay_next_dial();
                }
            }
        }
    }

    fn delay_next_dial(&mut self) {
        self.not_before = Instant::now() + self.backoff;
        self.backoff = next_backoff(self.backoff, self.shared.reconnect_max);
    }

    /// Takes a new authenticated connection: keeps it or retires it by the tie-break, and runs
    /// it either way (a retired connection still delivers what the peer already sent on it).
    fn offer(&mut self, est: Established) {
        let id = self.next_id;
        self.next_id += 1;
        let (demote_tx, demote_rx) = oneshot::channel();
        let keep = self
            .current
            .as_ref()
            .is_none_or(|c| supersedes(c.dialer, est.dialer));
        if keep {
            let new = Current {
                id,
                dialer: est.dialer,
                _demote: demote_tx,
            };
            if let Some(old) = self.current.replace(new) {
                debug!(peer = %self.peer, "connection {} replaces connection {}", id, old.id);
                self.shared.counters.bump(Count::Superseded);
            }
            self.backoff = self.shared.reconnect_min;
        } else {
            drop(demote_tx);
            debug!(
                peer = %self.peer,
                dialer = %est.dialer,
                "keeping the current connection, retiring the new one"
            );
            self.shared.counters.bump(Count::Superseded);
            // The peer dialed although we hold a connection: either both dialed at once, or
            // the peer lost ours (it restarted). A keepalive on ours finds out: a dead
            // connection's write fails, which frees the way for the peer's next dial.
            if let Some(h) = self.shared.peers.get(&self.peer) {
                // Counted like any frame, since the writer that takes it counts it written:
                // uncounted, it left the count of frames unwritten one short, and shutdown
                // stopped with a node's last frame still queued.
                self.shared.queued();
                if h.queue.try_send(FrameParts::default()).is_err() {
                    self.shared.written(1);
                }
            }
        }
        let (shared, queue, events) = (
            Arc::clone(&self.shared),
            Arc::clone(&self.queue),
            self.events_tx.clone(),
        );
        self.tasks.spawn(async move {
            conn::run(est, &shared, &queue, demote_rx).await;
            let _ = events.send(Event::Closed(id));
        });
    }

    fn dial(&mut self) {
        self.dialing = true;
        let (shared, events, peer, addr) = (
            Arc::clone(&self.shared),
            self.events_tx.clone(),
            self.peer,
            self.addr.clone(),
        );
        self.tasks.spawn(async move {
            let est = dial_address(&shared, peer, &addr).await;
            let _ = events.send(Event::Dialed(est));
        });
    }
}

/// Why a dial failed, as the transport tells whoever asks why a peer cannot be reached
/// ([`super::TcpTransport::unreachable`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum DialError {
    /// The peer's host name does not resolve (yet).
    #[error("{0}")]
    Unresolved(String),
    /// Nothing accepted the connection in time.
    #[error("{0}")]
    Connect(String),
    /// The handshake failed: another cluster, secret, version or node.
    #[error("{0}")]
    Handshake(String),
}

/// Resolves `addr` (a host name is looked up again on every dial: a pod that restarted is at
/// another IP under the same name), then dials the addresses it stands for in turn.
pub(super) async fn dial_address(
    shared: &Shared,
    peer: NodeId,
    addr: &Address,
) -> Result<Established, DialError> {
    let deadline = Instant::now() + shared.handshake_timeout;
    let found = match timeout_at(deadline, addr.resolve()).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            return Err(DialError::Unresolved(format!(
                "cannot resolve {addr}, the address of {peer}: {e}"
            )));
        }
        Err(_) => {
            return Err(DialError::Unresolved(format!(
                "cannot resolve {addr}, the address of {peer}: no answer within {:?}",
                shared.handshake_timeout
            )));
        }
    };
    let mut last = None;
    for at in found {
        match dial(shared, peer, at).await {
            Ok(est) => return Ok(est),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| DialError::Connect(format!("{addr} resolves to no address"))))
}

/// Connects to `peer` at `addr` and authenticates both ends.
pub(super) async fn dial(
    shared: &Shared,
    peer: NodeId,
    addr: std::net::SocketAddr,
) -> Result<Established, DialError> {
    let deadline = Instant::now() + shared.handshake_timeout;
    let mut stream = match timeout_at(deadline, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            debug!(%peer, remote = %addr, "cannot connect to {peer} at {addr}: {e}");
            return Err(DialError::Connect(format!(
                "cannot connect to {peer} at {addr}: {e}"
            )));
        }
        Err(_) => {
            debug!(%peer, remote = %addr, "connecting to {peer} at {addr} timed out");
            return Err(DialError::Connect(format!(
                "connecting to {peer} at {addr} timed out"
            )));
        }
    };
    if let Err(e) = stream.set_nodelay(true) {
        debug!(remote = %addr, "cannot set TCP_NODELAY: {e}");
    }
    match handshake::dial(&mut stream, &shared.auth, peer, deadline).await {
        Ok(()) => {
            shared.counters.bump(Count::Established);
            debug!(%peer, remote = %addr, "connected to {peer}");
            Ok(Established {
                stream,
                peer,
                dialer: shared.auth.me,
                addr,
            })
        }
        Err(e) => {
            shared.counters.bump(Count::Refused);
            // Redialed with every backoff: logged at the same bounded rate as refusals here.
            shared
                .refusals
                .refused(e.kind(), || format!("to {peer} at {addr} (dialed): {e}"));
            Err(DialError::Handshake(format!(
                "{peer} at {addr} refused: {e}"
            )))
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn both_ends_keep_the_same_connection() {
        let (lo, hi) = (NodeId(1), NodeId(2));
        // Whichever of the two arrives first at either end, the one dialed by n1 stays.
        assert!(supersedes(hi, lo));
        assert!(!supersedes(lo, hi));
        // A redial by the node that dialed the current connection replaces it.
        assert!(supersedes(lo, lo) && supersedes(hi, hi));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let max = Duration::from_millis(2000);
        let mut d = Duration::from_millis(50);
        let mut seen = vec![d];
        for _ in 0..8 {
            d = next_backoff(d, max);
            seen.push(d);
        }
        let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [50, 100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }
}
