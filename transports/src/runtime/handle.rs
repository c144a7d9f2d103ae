//! What the application holds: cheap, cloneable handles that talk to a node's event loop over
//! bounded queues.

use pserver_core::{Epoch, Iteration, KeySelection, KvPairs, NodeId, Refusals, Value, WorkerError};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Why a call on a node handle failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RuntimeError {
    /// The coordinator removed this worker from the cluster; restart it to rejoin.
    #[error("the worker was removed from the cluster (fenced); restart it to rejoin")]
    Fenced,
    /// The node's event loop has stopped.
    #[error("the node has shut down")]
    ShutDown,
    /// The pushed rows have another width than the job's.
    #[error("pushed rows have {got} values per key, but this job uses {expected}")]
    WidthMismatch {
        /// The job's width.
        expected: usize,
        /// The pushed width.
        got: usize,
    },
    /// The node is not a worker.
    #[error("node {0} is not a worker: only workers push, pull and advance")]
    NotAWorker(NodeId),
    /// The node's configuration cannot work over its transport.
    #[error("{0}")]
    Config(String),
}

impl From<WorkerError> for RuntimeError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Fenced => RuntimeError::Fenced,
            WorkerError::WidthMismatch { expected, got } => {
                RuntimeError::WidthMismatch { expected, got }
            }
        }
    }
}

/// The epoch of the node's first configuration, once it has one.
async fn wait_ready(ready: &watch::Receiver<Option<Epoch>>) -> Result<Epoch, RuntimeError> {
    let mut ready = ready.clone();
    let epoch = ready
        .wait_for(Option::is_some)
        .await
        .map_err(|_| RuntimeError::ShutDown)?;
    epoch.ok_or(RuntimeError::ShutDown)
}

/// An application call, carried to the event loop with the channel that answers it.
#[derive(Debug)]
pub(crate) enum Command<V: Value> {
    Push(KvPairs<V>, oneshot::Sender<Result<(), RuntimeError>>),
    Pull(
        KeySelection,
        oneshot::Sender<Result<KvPairs<V>, RuntimeError>>,
    ),
    Advance(oneshot::Sender<Result<Iteration, RuntimeError>>),
    Shares(oneshot::Sender<Result<Vec<usize>, RuntimeError>>),
}

impl<V: Value> Command<V> {
    /// Answers the call with `error` without running it.
    pub(crate) fn refuse(self, error: RuntimeError) {
        match self {
            Command::Push(_, reply) => {
                let _ = reply.send(Err(error));
            }
            Command::Pull(_, reply) => {
                let _ = reply.send(Err(error));
            }
            Command::Advance(reply) => {
                let _ = reply.send(Err(error));
            }
            Command::Shares(reply) => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// A worker's application handle: push, pull and advance from any task. Clone it freely; all
/// clones drive the same worker.
///
/// Calls wait in a bounded queue in front of the node, and the node takes no more calls while
/// [`crate::runtime::RuntimeConfig::max_open_requests`] requests are open, so an application
/// faster than the network waits instead of growing memory.
#[derive(Debug)]
pub struct WorkerHandle<V: Value> {
    pub(crate) commands: mpsc::Sender<Command<V>>,
    pub(crate) ready: watch::Receiver<Option<Epoch>>,
}

impl<V: Value> Clone for WorkerHandle<V> {
    fn clone(&self) -> Self {
        WorkerHandle {
            commands: self.commands.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<V: Value> WorkerHandle<V> {
    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, RuntimeError>>) -> Command<V>,
    ) -> Result<T, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .await
            .map_err(|_| RuntimeError::ShutDown)?;
        rx.await.map_err(|_| RuntimeError::ShutDown)?
    }

    /// Waits until the worker has its first configuration; returns its epoch.
    pub async fn ready(&self) -> Result<Epoch, RuntimeError> {
        wait_ready(&self.ready).await
    }

    /// Pushes `kvs` in the current iteration; returns once the push counts for its iteration
    /// ([`pserver_core::Event::PushDone`]): every slice acknowledged by its server or, in
    /// sequential mode with replicas, taken in by it, the replicas getting the iteration's
    /// sum later (the worker keeps and resends the push until they hold it). Calls made
    /// before the worker is ready wait for its configuration.
    pub async fn push(&self, kvs: KvPairs<V>) -> Result<(), RuntimeError> {
        self.start_push(kvs).await?.await
    }

    /// Hands `kvs` to the worker and returns at once with a future that resolves when the push
    /// is acknowledged: push, then advance without waiting a round trip.
    pub async fn start_push(
        &self,
        kvs: KvPairs<V>,
    ) -> Result<impl Future<Output = Result<(), RuntimeError>> + use<V>, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Push(kvs, tx))
            .await
            .map_err(|_| RuntimeError::ShutDown)?;
        Ok(async move { rx.await.map_err(|_| RuntimeError::ShutDown)? })
    }

    /// Pulls `keys` in the current iteration, once the consistency model allows it.
    pub async fn pull(&self, keys: KeySelection) -> Result<KvPairs<V>, RuntimeError> {
        self.call(|tx| Command::Pull(keys, tx)).await
    }

    /// Ends the current iteration; returns the iteration entered, once the consistency model
    /// lets the worker enter it.
    pub async fn advance(&self) -> Result<Iteration, RuntimeError> {
        self.call(Command::Advance).await
    }

    /// The shares of the job's work this worker does now
    /// ([`pserver_core::ClusterConfig::shares`]): its own, and those handed to it when other
    /// workers died or left. Ask again at every step; the answer changes with the membership.
    pub async fn shares(&self) -> Result<Vec<usize>, RuntimeError> {
        self.call(Command::Shares).await
    }
}

/// What a node's event loop reports when it stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport<N> {
    /// The node as it stopped (inspect a server's values, a worker's progress).
    pub node: N,
    /// Input the node refused over its life.
    pub refusals: Refusals,
    /// Frames the transport would not take.
    pub send_errors: u64,
}

/// Controls one node's event loop: stop it, wait for it.
#[derive(Debug)]
pub struct NodeHandle<N> {
    pub(crate) id: NodeId,
    pub(crate) ready: watch::Receiver<Option<Epoch>>,
    pub(crate) stop: watch::Sender<bool>,
    pub(crate) task: JoinHandle<Result<NodeReport<N>, RuntimeError>>,
}

impl<N> NodeHandle<N> {
    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Waits until the node has its first configuration (a coordinator: until it published
    /// one); returns its epoch.
    pub async fn ready(&self) -> Result<Epoch, RuntimeError> {
        wait_ready(&self.ready).await
    }

    /// Asks the node to stop and waits for it. A worker first finishes what the application
    /// started (within [`crate::runtime::RuntimeConfig::drain_timeout`]), so that acknowledged
    /// work is on the servers; every node sends what it has queued.
    pub async fn shutdown(self) -> Result<NodeReport<N>, RuntimeError> {
        let _ = self.stop.send(true);
        self.join().await
    }

    /// Waits for the node to stop by itself (fenced, or its transport closed).
    pub async fn join(self) -> Result<NodeReport<N>, RuntimeError> {
        self.task.await.map_err(|_| RuntimeError::ShutDown)?
    }
}
