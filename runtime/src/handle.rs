//! What the application holds: cheap, cloneable handles that talk to a node's event loop over
//! bounded queues.

use pserver_core::driver::Refusals;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use pserver_core::{
    Epoch, Iteration, JobError, KeyRange, KeySelection, KvPairs, NodeId, Value, WorkerError,
};

use pserver_core::pace::Coverage;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Why a call on a node handle failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RuntimeError {
    /// The coordinator removed this worker from the cluster; restart it to rejoin. A push not
    /// yet durable may be lost.
    #[error("the worker was removed from the cluster (fenced); restart it to rejoin")]
    Fenced,
    /// The worker took a call before it was ready: the node loop holds calls until then, so
    /// this says a bug.
    #[error("the worker is not ready for calls yet")]
    NotReady,
    /// The node's event loop has stopped (for a push awaited for durability: before every
    /// replica confirmed it, so it may not survive a server failure).
    #[error("the node has shut down")]
    ShutDown,
    /// The worker left the job ([`WorkerHandle::leave`]).
    #[error("the worker has left the job")]
    Left,
    /// None of the worker's open requests completed within
    /// [`crate::RuntimeConfig::stall_limit`].
    #[error("no request completed for {secs} s, the stall limit: waiting for {waiting}")]
    Stalled {
        /// How long nothing completed.
        secs: u64,
        /// What the worker waited for: servers, keys, retransmissions.
        waiting: String,
    },
    /// The coordinator has been silent for [`crate::RuntimeConfig::stall_limit`]: it stopped
    /// or is cut off, and a server can neither take part in a change nor hear that the job
    /// ended.
    #[error(
        "the coordinator has been silent for {secs} s, the stall limit: it stopped, or this node is cut off from it"
    )]
    CoordinatorSilent {
        /// How long it has been silent.
        secs: u64,
    },
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
    /// The worker was asked to leave with changes its filters hold; the runtime flushes them
    /// first, so this means a push came between.
    #[error(
        "the job's filters hold {rows} rows this worker has not pushed yet: flush them before it leaves"
    )]
    Unflushed {
        /// Rows held.
        rows: usize,
    },
    /// The worker waits before a checkpoint's cut: a push now would land in the iteration
    /// the servers are writing. Push once the advance completes.
    #[error(
        "the worker waits at checkpoint {cut} for the servers to write it: push after the advance to iteration {cut} completes"
    )]
    AtCheckpoint {
        /// The iteration it waits before.
        cut: Iteration,
    },
    /// A server could not write or load a checkpoint (ARCHITECTURE.md §11).
    #[error("{0}")]
    Checkpoint(String),
    /// The node's configuration cannot work over its transport.
    #[error("{0}")]
    Config(String),
    /// The job cannot work, or the node is not part of it.
    #[error(transparent)]
    Job(#[from] JobError),
}

impl From<WorkerError> for RuntimeError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Fenced => RuntimeError::Fenced,
            // The node loop holds calls until the worker is ready.
            WorkerError::NotReady => RuntimeError::NotReady,
            WorkerError::WidthMismatch { expected, got } => {
                RuntimeError::WidthMismatch { expected, got }
            }
            WorkerError::Unflushed { rows } => RuntimeError::Unflushed { rows },
            WorkerError::AtCheckpoint { cut } => RuntimeError::AtCheckpoint { cut },
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
    Push {
        kvs: KvPairs<V>,
        /// How much of the iteration it covers with the parts before.
        covers: Coverage,
        /// Answered on [`pserver_core::events::WorkerEvent::PushDone`].
        done: oneshot::Sender<Result<(), RuntimeError>>,
        /// Answered on [`pserver_core::events::WorkerEvent::PushDurable`].
        durable: oneshot::Sender<Result<(), RuntimeError>>,
    },
    Pull(
        KeySelection,
        oneshot::Sender<Result<KvPairs<V>, RuntimeError>>,
    ),
    Advance(oneshot::Sender<Result<Iteration, RuntimeError>>),
    Shares(oneshot::Sender<Result<Vec<usize>, RuntimeError>>),
    Iteration(oneshot::Sender<Result<Iteration, RuntimeError>>),
    ResumedFrom(oneshot::Sender<Result<Option<Iteration>, RuntimeError>>),
    SharesInRound {
        first: Iteration,
        length: Iteration,
        round: u64,
        reply: oneshot::Sender<Result<Vec<pserver_core::pace::RoundShare>, RuntimeError>>,
    },
    /// Push what the filters hold back; answered as a push.
    Flush {
        done: oneshot::Sender<Result<(), RuntimeError>>,
        durable: oneshot::Sender<Result<(), RuntimeError>>,
    },
    /// Work per second of the application's own compute; nothing to answer.
    Speed(u32),
    Leave(oneshot::Sender<Result<(), RuntimeError>>),
    Leads(oneshot::Sender<Result<bool, RuntimeError>>),
}

impl<V: Value> Command<V> {
    /// Answers the call with `error` without running it.
    pub(crate) fn refuse(self, error: RuntimeError) {
        match self {
            Command::Push { done, durable, .. } | Command::Flush { done, durable } => {
                let _ = durable.send(Err(error.clone()));
                let _ = done.send(Err(error));
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
            Command::Speed(_) => {}
            Command::Iteration(reply) => {
                let _ = reply.send(Err(error));
            }
            Command::ResumedFrom(reply) => {
                let _ = reply.send(Err(error));
            }
            Command::SharesInRound { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Command::Leave(reply) => {
                let _ = reply.send(Err(error));
            }
            Command::Leads(reply) => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// A worker's application handle: push, pull and advance from any task. Clone it freely; all
/// clones drive the same worker.
///
/// Calls wait in a bounded queue in front of the node, and the node takes no more calls while
/// [`crate::RuntimeConfig::max_open_requests`] requests are open, so an application
/// faster than the network waits instead of growing memory.
#[derive(Debug)]
pub struct WorkerHandle<V: Value> {
    pub(crate) commands: mpsc::Sender<Command<V>>,
    pub(crate) ready: watch::Receiver<Option<Epoch>>,
    /// Why the event loop ended, once it has: a call made afterwards fails with it.
    pub(crate) ended: Arc<OnceLock<RuntimeError>>,
    /// The key ranges the job lost so far ([`pserver_core::Event::RangeLost`]).
    pub(crate) lost: watch::Receiver<Vec<KeyRange>>,
    /// The iteration the coordinator last told the worker to skip to
    /// ([`pserver_core::events::WorkerEvent::SkippedAhead`]); 0 before any.
    pub(crate) skipped: watch::Receiver<Iteration>,
}

impl<V: Value> Clone for WorkerHandle<V> {
    fn clone(&self) -> Self {
        WorkerHandle {
            commands: self.commands.clone(),
            ready: self.ready.clone(),
            ended: Arc::clone(&self.ended),
            lost: self.lost.clone(),
            skipped: self.skipped.clone(),
        }
    }
}

impl<V: Value> WorkerHandle<V> {
    /// Why a call found the event loop gone: fenced, or shut down.
    fn gone(&self) -> RuntimeError {
        self.ended.get().cloned().unwrap_or(RuntimeError::ShutDown)
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, RuntimeError>>) -> Command<V>,
    ) -> Result<T, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .await
            .map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }

    /// Waits until the worker has its first configuration; returns its epoch.
    pub async fn ready(&self) -> Result<Epoch, RuntimeError> {
        wait_ready(&self.ready).await.map_err(|_| self.gone())
    }

    /// Pushes `kvs` in the current iteration; returns once the push counts for the iteration
    /// (its servers took it in, [`pserver_core::events::WorkerEvent::PushDone`]). It may not yet survive a
    /// server failure: in sequential mode with replicas the servers copy it to their replicas
    /// later, with the iteration's sum, while the worker keeps it and resends it where needed;
    /// see [`WorkerHandle::push_durable`]. Calls made before the worker is ready wait for its
    /// configuration.
    pub async fn push(&self, kvs: KvPairs<V>) -> Result<(), RuntimeError> {
        let PushTicket { mut done, durable } = self.start_push(kvs).await?;
        // Nobody will ask: a closed waiter is one the node need not keep.
        drop(durable);
        std::future::poll_fn(|cx| done.poll(cx)).await
    }

    /// Pushes `kvs` in the current iteration; returns once the push is durable
    /// ([`pserver_core::events::WorkerEvent::PushDurable`]): its servers and every replica of the keys it
    /// touched hold it, so it survives as many server failures as the ring has replicas.
    /// Without replicas, or outside sequential mode, that is when [`WorkerHandle::push`]
    /// returns too. In sequential mode with replicas it comes later, when the servers copy the
    /// iteration's pushes to the replicas (ARCHITECTURE.md §8): to go on meanwhile, use
    /// [`WorkerHandle::start_push`] and await [`PushTicket::durable`] later.
    ///
    /// Fails with [`RuntimeError::ShutDown`] if the worker stops first (a stopping worker
    /// waits for its pushes to become durable within
    /// [`crate::RuntimeConfig::drain_timeout`]), and with [`RuntimeError::Fenced`] if
    /// the coordinator removed it.
    pub async fn push_durable(&self, kvs: KvPairs<V>) -> Result<(), RuntimeError> {
        self.start_push(kvs).await?.durable().await
    }

    /// Pushes, in the current iteration, what the job's filters held back
    /// ([`pserver_core::node::Worker::flush`]), and returns once that push counts for its
    /// iteration (at once when they hold nothing). After it, the servers hold every change
    /// the application pushed; leaving ([`WorkerHandle::leave`]) flushes by itself.
    pub async fn flush(&self) -> Result<(), RuntimeError> {
        let (done_tx, done) = oneshot::channel();
        let (durable_tx, durable) = oneshot::channel();
        let command = Command::Flush {
            done: done_tx,
            durable: durable_tx,
        };
        self.commands.send(command).await.map_err(|_| self.gone())?;
        drop(durable);
        done.await.map_err(|_| self.gone())?
    }

    /// Hands `kvs` to the worker (waiting only while its call queue is full) and returns a
    /// [`PushTicket`]: await the ticket for the moment [`WorkerHandle::push`] returns (the
    /// push counts for its iteration), or [`PushTicket::durable`] for the moment
    /// [`WorkerHandle::push_durable`] returns (every replica holds it). So push, then advance,
    /// without waiting a round trip.
    pub async fn start_push(&self, kvs: KvPairs<V>) -> Result<PushTicket, RuntimeError> {
        self.start_push_part(kvs, Coverage::WHOLE).await
    }

    /// [`WorkerHandle::start_push`] for a part of the iteration's work: with the parts pushed
    /// before, `covers` of it ([`pserver_core::node::Worker::push_part`]). An application that
    /// pushes its iteration in parts loses only the part it had not pushed when the
    /// coordinator tells it to skip ahead ([`WorkerHandle::skipped_to`]).
    pub async fn start_push_part(
        &self,
        kvs: KvPairs<V>,
        covers: Coverage,
    ) -> Result<PushTicket, RuntimeError> {
        let (done_tx, done) = oneshot::channel();
        let (durable_tx, durable) = oneshot::channel();
        let command = Command::Push {
            kvs,
            covers,
            done: done_tx,
            durable: durable_tx,
        };
        self.commands.send(command).await.map_err(|_| self.gone())?;
        Ok(PushTicket {
            done: Stage::Waiting(done),
            durable,
        })
    }

    /// Pulls `keys` in the current iteration, once the consistency model allows it.
    pub async fn pull(&self, keys: KeySelection) -> Result<KvPairs<V>, RuntimeError> {
        self.start_pull(keys).await?.await
    }

    /// Hands a pull of `keys` to the worker now, in the current iteration (waiting only while
    /// its call queue is full), and returns the answer to await later: the paper's
    /// asynchronous task, so that an application pulls its next minibatch's weights while it
    /// computes on this one. The pull is held, like any other, until the consistency model
    /// allows it in the iteration it was sent in.
    pub async fn start_pull(
        &self,
        keys: KeySelection,
    ) -> Result<impl Future<Output = Result<KvPairs<V>, RuntimeError>> + Send + 'static, RuntimeError>
    {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Pull(keys, tx))
            .await
            .map_err(|_| self.gone())?;
        Ok(async move { rx.await.map_err(|_| RuntimeError::ShutDown)? })
    }

    /// Ends the current iteration; returns the iteration entered, once the consistency model
    /// lets the worker enter it.
    pub async fn advance(&self) -> Result<Iteration, RuntimeError> {
        self.call(Command::Advance).await
    }

    /// The shares of the job's work this worker does now
    /// ([`pserver_core::wire::ClusterConfig::shares`]): its own, and those handed to it when other
    /// workers died. Ask again at every step; the answer changes with the membership.
    pub async fn shares(&self) -> Result<Vec<usize>, RuntimeError> {
        self.call(Command::Shares).await
    }

    /// The shares this worker does in round `round` of an application that works in rounds
    /// of `length` iterations, round 1 starting at iteration `first` (an epoch of `length`
    /// steps, say): [`WorkerHandle::shares`], except that a share moved by speed
    /// ([`pserver_core::pace::StragglerPolicy::balance`]) changes hands where rounds meet
    /// ([`pserver_core::wire::ClusterConfig::shares_in_round`]). Ask at every step.
    pub async fn shares_in_round(
        &self,
        first: Iteration,
        length: Iteration,
        round: u64,
    ) -> Result<Vec<pserver_core::pace::RoundShare>, RuntimeError> {
        self.call(|reply| Command::SharesInRound {
            first,
            length,
            round,
            reply,
        })
        .await
    }

    /// The iteration the worker is in: where its next pushes and pulls belong. It moves on
    /// with [`WorkerHandle::advance`], and on its own when the coordinator tells the worker
    /// to skip ahead ([`WorkerHandle::skipped_to`]).
    pub async fn iteration(&self) -> Result<Iteration, RuntimeError> {
        self.call(Command::Iteration).await
    }

    /// The whole-job checkpoint the job resumed from: the worker started in its iteration,
    /// every iteration before it trained by the run that wrote it ([`pserver_core::wire::Checkpoints`]).
    /// `None` for a job that started from the beginning, or a worker that joined a running
    /// one.
    pub async fn resumed_from(&self) -> Result<Option<Iteration>, RuntimeError> {
        self.call(Command::ResumedFrom).await
    }

    /// Says how fast the application works: the work it does per second of its own compute,
    /// waiting left out (rows per second, say). Where the job sizes shares by speed
    /// ([`pserver_core::pace::StragglerPolicy::balance`]) the coordinator moves shares from slow
    /// workers to fast ones by it; say it again as it changes.
    pub async fn report_speed(&self, per_sec: u32) -> Result<(), RuntimeError> {
        self.commands
            .send(Command::Speed(per_sec))
            .await
            .map_err(|_| self.gone())
    }

    /// Whether this worker leads: it holds the lowest-numbered share a live worker holds
    /// ([`pserver_core::wire::ClusterConfig::lead_worker`]), and so does what one worker does for
    /// all. Ask again when it matters; it passes on when the leader dies or leaves.
    pub async fn leads(&self) -> Result<bool, RuntimeError> {
        self.call(Command::Leads).await
    }

    /// The key ranges the job lost so far: every holder of each failed before it was copied,
    /// and its values started again from zero ([`pserver_core::wire::ClusterConfig::lost`]). A job
    /// that does not accept loss fails when this is not empty at its end.
    pub fn lost_ranges(&self) -> Vec<KeyRange> {
        self.lost.borrow().clone()
    }

    /// The iteration the coordinator last told this worker to skip to (0 before any): a
    /// straggler under skip-ahead ([`pserver_core::pace::StragglerPolicy::skip_ahead`]) is moved to
    /// the others' iteration, and its next pushes and pulls belong there. An application that
    /// sees it rise mid-iteration may drop the rest of the iteration's work.
    pub fn skipped_to(&self) -> Iteration {
        *self.skipped.borrow()
    }

    /// Leaves the job: done, or stopped by its operator. Once what the application started
    /// has completed (or [`crate::RuntimeConfig::drain_timeout`] has passed), the
    /// worker asks the coordinator to take it out ([`pserver_core::node::Worker::leave`]);
    /// nobody waits on its progress any more, its shares pass to nobody
    /// ([`pserver_core::wire::ClusterConfig::left`]), and it is never declared dead. Returns once the
    /// coordinator confirmed and the worker's loop has ended; every later call fails with
    /// [`RuntimeError::Left`]. Without a coordinator to confirm it this waits on: bound it
    /// with a timeout.
    pub async fn leave(&self) -> Result<(), RuntimeError> {
        self.call(Command::Leave).await
    }
}

/// A push the worker took ([`WorkerHandle::start_push`]), with its two completions.
///
/// - Awaiting the ticket itself resolves when the push counts for its iteration
///   ([`pserver_core::events::WorkerEvent::PushDone`]): what [`WorkerHandle::push`] waits for. Await
///   `&mut ticket` to keep the ticket for [`PushTicket::durable`] afterwards.
/// - [`PushTicket::durable`] resolves when every replica holds the push
///   ([`pserver_core::events::WorkerEvent::PushDurable`]): what [`WorkerHandle::push_durable`] waits for.
///   It never comes before the first.
///
/// Either fails with the push's error: [`RuntimeError::ShutDown`] when the worker stops
/// first, [`RuntimeError::Fenced`] when the coordinator removed it. Dropping the ticket leaves
/// the push to go on; the worker then keeps nothing for it beyond what the push itself needs.
/// A push waiting for durability holds none of
/// [`crate::RuntimeConfig::max_open_requests`] once it counts for its iteration.
#[derive(Debug)]
#[must_use = "the push goes on without its ticket: await it, or drop it not to wait"]
pub struct PushTicket {
    done: Stage,
    durable: oneshot::Receiver<Result<(), RuntimeError>>,
}

/// Where the first completion stands: a ticket may be awaited again after it resolved (by
/// `&mut`), which a oneshot receiver does not allow.
#[derive(Debug)]
enum Stage {
    Waiting(oneshot::Receiver<Result<(), RuntimeError>>),
    Resolved(Result<(), RuntimeError>),
}

impl PushTicket {
    /// Waits until every server and every replica of the keys the push touched holds it, so
    /// that it survives as many server failures as the ring has replicas
    /// ([`pserver_core::events::WorkerEvent::PushDurable`]).
    pub fn durable(self) -> impl Future<Output = Result<(), RuntimeError>> + Send + 'static {
        let durable = self.durable;
        async move { durable.await.map_err(|_| RuntimeError::ShutDown)? }
    }
}

impl Stage {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), RuntimeError>> {
        let answer = match self {
            Stage::Resolved(answer) => return Poll::Ready(answer.clone()),
            Stage::Waiting(done) => {
                ready!(Pin::new(done).poll(cx)).unwrap_or(Err(RuntimeError::ShutDown))
            }
        };
        *self = Stage::Resolved(answer.clone());
        Poll::Ready(answer)
    }
}

impl Future for PushTicket {
    type Output = Result<(), RuntimeError>;

    /// Ready once the push counts for its iteration ([`pserver_core::events::WorkerEvent::PushDone`]).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.done.poll(cx)
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
    /// Whether the node stopped because the coordinator removed it from the cluster.
    pub fenced: bool,
    /// Whether the node stopped because it left the job ([`WorkerHandle::leave`],
    /// [`NodeHandle::leave_handle`]).
    pub left: bool,
    /// Why the node stopped by itself past a limit of [`crate::RuntimeConfig`]: a worker's
    /// requests stalled ([`RuntimeError::Stalled`]), a server's coordinator fell silent
    /// ([`RuntimeError::CoordinatorSilent`]).
    pub stalled: Option<RuntimeError>,
}

/// What a node's event loop has done, for an operator's dashboard ([`NodeHandle::metrics`]).
/// Counted since the node started; refreshed a few times a second while it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeMetrics {
    /// The configuration epoch the node is on.
    pub epoch: Epoch,
    /// The last whole-job checkpoint every server wrote, as the node's configuration records
    /// it: 0 for none (ARCHITECTURE.md §11).
    pub checkpoint: Iteration,
    /// Frames received and handed to the node.
    pub frames_received: u64,
    /// Frames the node sent.
    pub frames_sent: u64,
    /// Bytes of the frames sent.
    pub bytes_sent: u64,
    /// A worker's pushes done.
    pub pushes: u64,
    /// A worker's pulls answered.
    pub pulls: u64,
    /// A worker's iterations advanced.
    pub iterations: u64,
    /// A worker's requests open now.
    pub open_requests: u64,
    /// A worker's unanswered slices sent again, summed over its open slices now.
    pub resends_open: u64,
    /// A worker's messages sent again because they went unanswered, since it started
    /// ([`pserver_core::Driver::retransmissions`]).
    pub retransmissions: u64,
    /// A server's pulls held until the consistency model lets them be answered, now.
    pub held_pulls: u64,
    /// Replicas each key has besides its primary on the ring in force, as this node's
    /// configuration says: fewer than `replicas_asked` after servers were lost
    /// ([`pserver_core::events::CoordinatorEvent::ReplicasChanged`]).
    pub replicas_held: u64,
    /// The ring's replicas `k`.
    pub replicas_asked: u64,
    /// Nodes the coordinator declared dead.
    pub nodes_dead: u64,
    /// Key ranges lost with their holders, as this node heard of them.
    pub ranges_lost: u64,
    /// Input the node refused, by reason.
    pub refusals: Refusals,
    /// A worker's recoveries: configuration changes (a server declared dead, joining or
    /// leaving) that came while it had requests open, each ended by its next completed request.
    pub recoveries: u64,
    /// How long the last recovery held the worker's requests: from the last request that
    /// completed before the configuration changed to the first one after.
    pub last_recovery: std::time::Duration,
    /// Messages the transport would not send (an unknown peer, a closed transport).
    pub send_errors: u64,
    /// The longest recovery so far, measured the same way.
    pub longest_recovery: std::time::Duration,
    /// Workers the coordinator found lagging, each time one started to (the coordinator).
    pub stragglers: u64,
    /// Iterations a worker was told to skip (a worker; [`pserver_core::pace::Pace`]).
    pub skipped_iterations: u64,
    /// Shares moved from slower workers to faster ones (the coordinator;
    /// [`pserver_core::pace::StragglerPolicy::balance`]).
    pub shares_moved: u64,
    /// What each of a worker's filters saved so far, by name ([`pserver_core::filter`]).
    pub filter_savings: Vec<(&'static str, pserver_core::filter::FilterSaving)>,
    /// Where the job stands (the coordinator; [`pserver_core::node::Coordinator::status`]).
    pub status: Option<pserver_core::status::ClusterStatus>,
}

/// Asks a server to leave its job ([`NodeHandle::leave_handle`]); it outlives the node's handle.
#[derive(Clone, Debug)]
pub struct LeaveHandle(std::sync::Arc<tokio::sync::Notify>);

impl LeaveHandle {
    /// Asks the server to leave; asking again changes nothing.
    pub fn leave(&self) {
        self.0.notify_one();
    }
}

/// Controls one node's event loop: stop it, wait for it.
#[derive(Debug)]
pub struct NodeHandle<N> {
    pub(crate) id: NodeId,
    pub(crate) ready: watch::Receiver<Option<Epoch>>,
    pub(crate) finished: watch::Receiver<Option<Epoch>>,
    pub(crate) server_leave: std::sync::Arc<tokio::sync::Notify>,
    pub(crate) metrics: watch::Receiver<NodeMetrics>,
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

    /// Completes with the epoch of the configuration that said the job finished: every worker
    /// left, its work done ([`pserver_core::Event::JobFinished`]; a server or the coordinator).
    /// It outlives the handle, so that a process may wait for it in
    /// [`NodeHandle::run_until`]; it never completes if the node stops first.
    pub fn job_finished(&self) -> impl Future<Output = Epoch> + Send + 'static {
        let mut finished = self.finished.clone();
        async move {
            let epoch = finished.wait_for(Option::is_some).await.map(|e| *e);
            match epoch {
                Ok(epoch) => epoch.unwrap_or_default(),
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// A handle that asks a server to leave the job: the coordinator moves its ranges to the
    /// other servers first, and the node stops once it is out ([`NodeReport::left`]), with
    /// nothing acknowledged lost. A leave the ring cannot take (the last server, or fewer
    /// replicas than the job's `min_replicas` would be left) never completes: bound the wait,
    /// as [`NodeHandle::run_until`] does.
    /// For other nodes it does nothing.
    pub fn leave_handle(&self) -> LeaveHandle {
        LeaveHandle(std::sync::Arc::clone(&self.server_leave))
    }

    /// What the node has done so far, refreshed a few times a second.
    pub fn metrics(&self) -> NodeMetrics {
        self.metrics.borrow().clone()
    }

    /// A receiver of [`NodeHandle::metrics`] that outlives the handle (for a metrics
    /// endpoint).
    pub fn metrics_receiver(&self) -> watch::Receiver<NodeMetrics> {
        self.metrics.clone()
    }

    /// Asks the node to stop and waits for it. A worker first finishes what the application
    /// started (within [`crate::RuntimeConfig::drain_timeout`]), so that acknowledged
    /// work is on the servers; every node sends what it has queued.
    pub async fn shutdown(self) -> Result<NodeReport<N>, RuntimeError> {
        let _ = self.stop.send(true);
        self.join().await
    }

    /// Waits for the node to stop by itself (fenced, or its transport closed).
    pub async fn join(self) -> Result<NodeReport<N>, RuntimeError> {
        self.task.await.map_err(|_| RuntimeError::ShutDown)?
    }

    /// Runs the node until `stop` completes, then stops it as [`NodeHandle::shutdown`] does;
    /// or until it stops by itself first ([`NodeReport::fenced`] says whether it was fenced).
    /// A process serving a node waits here, so that a fenced node ends its process.
    pub async fn run_until(
        self,
        stop: impl Future<Output = ()>,
    ) -> Result<NodeReport<N>, RuntimeError> {
        let NodeHandle {
            stop: stopper,
            mut task,
            ..
        } = self;
        tokio::select! {
            () = stop => {
                let _ = stopper.send(true);
            }
            ended = &mut task => return ended.map_err(|_| RuntimeError::ShutDown)?,
        }
        task.await.map_err(|_| RuntimeError::ShutDown)?
    }
}
