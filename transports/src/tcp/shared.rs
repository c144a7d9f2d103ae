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
