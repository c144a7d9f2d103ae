//! What every task of a TCP transport shares: its settings and counters, the way to each peer,
//! and the spawner that ties the tasks' lives to the transport's.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use pserver_core::NodeId;
use pserver_core::wire::FrameParts;
use tokio::sync::{Notify, mpsc, watch};

use super::handshake::{Auth, Established};
use super::stats::Counters;
#[allow(unused_imports)] // for the docs' links
use super::{TcpConfig, TcpStats};
use crate::refusal_log::RefusalLog;

/// The way to one peer, as `send` and the listener see it.
pub(super) struct PeerHandle {
    /// Frames waiting for the peer.
    pub(super) queue: mpsc::Sender<FrameParts>,
    /// Wakes the peer's task when a frame is queued.
    pub(super) wake: Notify,
    /// Connections the listener authenticated as this peer.
    pub(super) accepted: mpsc::Sender<Established>,
}

/// What every task of a transport reads: settings, counters, and the ways in and out.
pub(super) struct Shared {
    /// What the handshake checks and proves.
    pub(super) auth: Auth,
    /// The largest frame sent or accepted.
    pub(super) max_frame: usize,
    /// See [`TcpConfig::handshake_timeout`].
    pub(super) handshake_timeout: Duration,
    /// See [`TcpConfig::frame_timeout`].
    pub(super) frame_timeout: Duration,
    /// See [`TcpConfig::reconnect_min`].
    pub(super) reconnect_min: Duration,
    /// See [`TcpConfig::reconnect_max`].
    pub(super) reconnect_max: Duration,
    /// The counters behind [`TcpStats`].
    pub(super) counters: Counters,
    /// Refused connections, logged at a bounded rate.
    pub(super) refusals: RefusalLog,
    /// Frames dropped on a full send queue, logged at a bounded rate.
    pub(super) drops: RefusalLog,
    /// Frames for `recv`.
    pub(super) inbound: mpsc::Sender<(NodeId, Bytes)>,
    /// Every peer.
    pub(super) peers: BTreeMap<NodeId, PeerHandle>,
    /// Why each peer could not be reached at its last dial, until a dial succeeds.
    pub(super) unreachable: std::sync::Mutex<BTreeMap<NodeId, String>>,
    /// Frames queued and not yet written (or lost with their connection): counted from the
    /// moment `send` queues one until a writer is done with it, so that no frame is between
    /// the counts.
    pub(super) unwritten: std::sync::atomic::AtomicUsize,
    /// Woken each time a writer is done with a batch.
    pub(super) wrote: Notify,
}

impl Shared {
    /// The peers that could not be reached at their last dial, and why.
    pub(super) fn unreachable_now(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, String>> {
        // Nothing is left half-done under this lock: a poisoned one is still whole.
        self.unreachable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether every frame queued so far has been written, or lost with its connection.
    pub(super) fn flushed(&self) -> bool {
        self.unwritten.load(std::sync::atomic::Ordering::Acquire) == 0
    }

    /// Counts a frame queued.
    pub(super) fn queued(&self) {
        self.unwritten
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Counts `n` frames done with: written, lost, or never queued after all.
    pub(super) fn written(&self, n: usize) {
        self.unwritten
            .fetch_sub(n, std::sync::atomic::Ordering::AcqRel);
        self.wrote.notify_waiters();
    }
}

/// A batch of frames a writer took from a queue: counted as unwritten until it is dropped,
/// written or not (a connection that broke loses it, and the core resends what matters).
pub(super) struct Taken<'a> {
    shared: &'a Shared,
    pub(super) frames: usize,
}

impl<'a> Taken<'a> {
    pub(super) fn new(shared: &'a Shared) -> Self {
        Taken { shared, frames: 0 }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.shared.written(self.frames);
    }
}

/// Spawns the transport's tasks so that shutdown (or dropping the transport) ends all of them,
/// and so that shutdown can wait until they have.
#[derive(Clone)]
pub(super) struct Tasks {
    /// Turns true when the transport stops.
    pub(super) stop: watch::Receiver<bool>,
    /// Held by every task: shutdown waits until the last is dropped.
    pub(super) alive: mpsc::Sender<()>,
}

impl Tasks {
    /// Spawns `fut`, cancelled when the transport stops.
    pub(super) fn spawn<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        let (mut stop, alive) = (self.stop.clone(), self.alive.clone());
        tokio::spawn(async move {
            let _alive = alive;
            tokio::select! {
                biased;
                () = stopped(&mut stop) => {}
                () = fut => {}
            }
        });
    }
}

/// Completes once the transport is shut down or dropped.
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
