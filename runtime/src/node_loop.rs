//! One node's event loop: the crate docs say what it waits on, in what order it drains the
//! driver, and how it stops.

use pserver_core::driver::Transmit;
use pserver_core::events::{CoordinatorEvent, Refusal, ServerEvent, WorkerEvent};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::sync::{Arc, OnceLock};

use pserver_core::pace::Coverage;
use pserver_core::store::ParamStore;
use pserver_core::wire::{ClusterConfig, ShardCopy};
use pserver_core::{
    Driver, DriverError, Epoch, Event, Iteration, KeyRange, KvPairs, NodeId, Output, RequestId,
    Role, Time, UpdateRule, Value,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, debug, info, info_span, warn};

use super::RuntimeConfig;
use super::checkpoint::{CheckpointDir, shards_of, usable_shards, write_shards};
use super::handle::{Command, NodeHandle, NodeMetrics, NodeReport, RuntimeError, WorkerHandle};

/// How often the coordinator sums up the job.
const SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// How often the coordinator says how far the workers are, when they say it and it changed.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The coordinator's line on how far each worker is.
fn progress_line(progress: &BTreeMap<NodeId, Iteration>) -> String {
    let each: Vec<String> = progress.iter().map(|(w, i)| format!("{w} {i}")).collect();
    format!(
        "job progress: iteration of each worker: {}",
        each.join(", ")
    )
}

/// The coordinator's summary of `config`, with the nodes it declared dead so far.
fn summary(config: &pserver_core::wire::ClusterConfig, dead: u64) -> String {
    let list = |nodes: &[NodeId]| {
        let names: Vec<String> = nodes.iter().map(ToString::to_string).collect();
        format!("[{}]", names.join(", "))
    };
    format!(
        "epoch {}: servers {}, replicas {} of {}, workers {}, joining {}, leaving {}, left {}, {dead} declared dead, {} ranges lost",
        config.epoch,
        list(&config.servers),
        config.replicas_held(),
        config.ring.replicas,
        list(&config.workers),
        list(&config.joining),
        list(&config.leaving),
        list(&config.left),
        config.lost.len()
    )
}

/// How often the loop does its housekeeping (stall watch, metrics, summaries) at most: the
/// hot path, one iteration per frame, reads the clock once for all of it.
const HOUSEKEEPING_EVERY: std::time::Duration = std::time::Duration::from_millis(250);
use pserver_transport::refusal_log::{self, RefusalLog};
use pserver_transport::{Transport, TransportError};

type Reply<T> = oneshot::Sender<Result<T, RuntimeError>>;

/// Pause after a receive error other than a closed transport.
const RECV_ERROR_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// A node started by [`spawn_node`].
#[derive(Debug)]
pub struct Spawned<V: Value, U: UpdateRule<V>, S: ParamStore<V>> {
    /// Stops the node and waits for it.
    pub node: NodeHandle<Driver<V, U, S>>,
    /// The application's handle, if the node is a worker.
    pub worker: Option<WorkerHandle<V>>,
}

/// Starts `driver`'s node on the current tokio runtime, over `transport`. Returns the handle
/// that stops it and, for a worker, the application's handle.
///
/// The loop runs inside a `node` tracing span carrying the node's id and role.
pub fn spawn_node<V, U, S, T>(
    mut driver: Driver<V, U, S>,
    transport: Arc<T>,
    cfg: RuntimeConfig,
) -> Spawned<V, U, S>
where
    V: Value + Send + Sync,
    U: UpdateRule<V> + Send + Sync + 'static,
    S: ParamStore<V> + Send + Sync + 'static,
    T: Transport + ?Sized,
{
    let id = driver.id();
    let role = driver.node().role();
    // The bound on a stall is the core's: every embedder gets it, and this loop hears it as
    // an event.
    if let (Some(limit), Ok(mut worker)) = (cfg.stall_limit, driver.worker()) {
        worker.set_stall_limit(limit.as_nanos().try_into().unwrap_or(Time::MAX));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let (cmd_tx, cmd_rx) = mpsc::channel(cfg.command_queue.max(1));
    let (ready_tx, ready_rx) = watch::channel(None);
    let (finished_tx, finished_rx) = watch::channel(None);
    let server_leave = Arc::new(tokio::sync::Notify::new());
    let ended = Arc::new(OnceLock::new());
    let (lost_tx, lost_rx) = watch::channel(Vec::new());
    let (skipped_tx, skipped_rx) = watch::channel(0);
    let (metrics_tx, metrics_rx) = watch::channel(NodeMetrics::default());
    let (disk_tx, disk_rx) = mpsc::unbounded_channel();
    let worker = (role == Role::Worker).then(|| WorkerHandle {
        commands: cmd_tx,
        ready: ready_rx.clone(),
        ended: Arc::clone(&ended),
        lost: lost_rx,
        skipped: skipped_rx,
    });
    let span = info_span!("node", id = %id, role = %role);
    let looped = NodeLoop {
        driver,
        transport,
        cfg,
        origin: Instant::now(),
        pushes: BTreeMap::new(),
        durables: BTreeMap::new(),
        pulls: BTreeMap::new(),
        advances: VecDeque::new(),
        early: VecDeque::new(),
        ready: ready_tx,
        finished: finished_tx,
        server_leave: Arc::clone(&server_leave),
        server_leaving: false,
        fenced: false,
        leave: None,
        left: false,
        progress_at: Instant::now(),
        stall_warned_at: None,
        stalled: None,
        ended,
        lost: lost_tx,
        skipped: skipped_tx,
        counts: NodeMetrics::default(),
        metrics: metrics_tx,
        housekeep_at: Instant::now(),
        summarized_at: Instant::now(),
        progressed_at: Instant::now(),
        progress_said: BTreeMap::new(),
        refused_messages: RefusalLog::new("message", refusal_log::WINDOW),
        failed_sends: RefusalLog::drops("message", refusal_log::WINDOW),
        coordinator_silent_since: None,
        seen_epoch: 0,
        seen_members: None,
        recovering_since: None,
        checkpoints: None,
        disk: disk_tx,
    };
    let task = tokio::spawn(looped.run(cmd_rx, stop_rx, disk_rx).instrument(span));
    let node = NodeHandle {
        id,
        ready: ready_rx,
        finished: finished_rx,
        server_leave,
        metrics: metrics_rx,
        stop: stop_tx,
        task,
    };
    Spawned { node, worker }
}

struct NodeLoop<V: Value, U: UpdateRule<V>, S: ParamStore<V>, T: Transport + ?Sized> {
    driver: Driver<V, U, S>,
    transport: Arc<T>,
    cfg: RuntimeConfig,
    origin: Instant,
    /// Pushes not yet counted for their iteration: what `push` waits for.
    pushes: BTreeMap<RequestId, Reply<()>>,
    /// Pushes not yet durable whose ticket still exists. Not open requests: in sequential
    /// mode a push becomes durable only once its iteration is applied, so counting them could
    /// hold back the `advance` that applies it. Each entry lives no longer than the core's own
    /// record of the push.
    durables: BTreeMap<RequestId, Reply<()>>,
    pulls: BTreeMap<RequestId, Reply<KvPairs<V>>>,
    advances: VecDeque<Reply<Iteration>>,
    /// A worker's requests made before it was ready: the core refuses them until then, so
    /// they wait here, and go in order once it is.
    early: VecDeque<Command<V>>,
    ready: watch::Sender<Option<u64>>,
    /// The epoch of the configuration that said the job finished ([`Event::JobFinished`]).
    finished: watch::Sender<Option<Epoch>>,
    /// Asks a server to leave the job ([`NodeHandle::leave_handle`]).
    server_leave: Arc<tokio::sync::Notify>,
    /// The server asked the coordinator to take it out: its fence is the confirmation.
    server_leaving: bool,
    fenced: bool,
    /// The application asked the worker to leave the job.
    leave: Option<Leaving>,
    /// The coordinator took the worker out because it asked to leave: its fence is the
    /// confirmation, not a removal.
    left: bool,
    /// When a request last completed, or requests were opened with none open before: how
    /// long the worker has waited without progress.
    progress_at: Instant,
    /// When the worker last said what it waits for.
    stall_warned_at: Option<Instant>,
    /// Nothing completed within the stall limit: why the loop ends.
    stalled: Option<RuntimeError>,
    /// Why the loop ended, for the worker handle's calls that come after.
    ended: Arc<OnceLock<RuntimeError>>,
    /// The ranges the job lost, for the worker handle.
    lost: watch::Sender<Vec<KeyRange>>,
    /// Where the coordinator last told the worker to skip to.
    skipped: watch::Sender<Iteration>,
    /// What the loop counts; published now and then.
    counts: NodeMetrics,
    metrics: watch::Sender<NodeMetrics>,
    /// When the housekeeping is due next.
    housekeep_at: Instant,
    /// When the coordinator last summed up the job's membership.
    summarized_at: Instant,
    /// When the coordinator last said how far the workers are, and what it said.
    progressed_at: Instant,
    progress_said: BTreeMap<NodeId, Iteration>,
    /// Messages refused as undecodable or spoofed, logged at a bounded rate.
    refused_messages: RefusalLog,
    /// Messages the transport would not send, logged at a bounded rate.
    failed_sends: RefusalLog,
    /// Since when the node has said that the coordinator is silent.
    coordinator_silent_since: Option<Instant>,
    /// The epoch the loop last saw the node on.
    seen_epoch: Epoch,
    /// The configuration of that epoch: a new epoch that changes only the pace (what the
    /// coordinator decided about stragglers) is no recovery.
    seen_members: Option<pserver_core::wire::ClusterConfig>,
    /// The configuration changed while requests were open: since the last completion before.
    recovering_since: Option<Instant>,
    /// A server's checkpoint directory ([`RuntimeConfig::checkpoints`]).
    checkpoints: Option<Arc<CheckpointDir>>,
    /// Where a checkpoint written or read on a blocking thread says it is done.
    disk: mpsc::UnboundedSender<DiskDone<V>>,
}

/// What `work` returns, or an error if it panicked: a disk thread that died without a word
/// would leave the workers waiting at the cut, or the server restoring, for ever.
fn unpanicked<T>(work: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
        .unwrap_or_else(|_| Err("the thread writing or reading it panicked".into()))
}

/// A checkpoint a blocking thread wrote or read, for the node loop.
enum DiskDone<V: Value> {
    /// The shards of a cut written (the file, for the log), or why not.
    Written(Iteration, Result<String, String>),
    /// The shards of the cut the job resumes from, or why they could not be read.
    Read(Iteration, Result<Vec<ShardCopy<V>>, String>),
}

/// Whole-job checkpoints kept per server: the newest, and the ones before it in case the
/// newest is torn or the other servers never completed it.
const CHECKPOINTS_KEPT: usize = 3;

/// A worker's request to leave, until the coordinator confirms it.
struct Leaving {
    reply: oneshot::Sender<Result<(), RuntimeError>>,
    /// Whether the worker has asked the coordinator yet: only once what the application
    /// started has completed, or `by` has passed.
    asked: bool,
    by: Instant,
}

impl<V, U, S, T> NodeLoop<V, U, S, T>
where
    V: Value + Send + Sync,
    U: UpdateRule<V> + Send + Sync + 'static,
    S: ParamStore<V> + Send + Sync + 'static,
    T: Transport + ?Sized,
{
    fn now(&self) -> Time {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn open_requests(&self) -> usize {
        self.pushes.len() + self.pulls.len() + self.advances.len() + self.early.len()
    }

    /// Why the loop ends, or ended.
    fn ending(&self) -> RuntimeError {
        if let Some(stalled) = &self.stalled {
            stalled.clone()
        } else if self.left {
            RuntimeError::Left
        } else if self.fenced {
            RuntimeError::Fenced
        } else {
            RuntimeError::ShutDown
        }
    }

    /// The coordinator sums up the job every [`SUMMARY_EVERY`]: conditions are logged when
    /// they change, and this line says where they stand, at WARN while any is bad.
    fn summarize(&mut self) {
        self.say_progress();
        if self.summarized_at.elapsed() < SUMMARY_EVERY {
            return;
        }
        self.summarized_at = Instant::now();
        let Some(config) = self.driver.node().as_coordinator().and_then(|c| c.config()) else {
            return;
        };
        let line = summary(config, self.counts.nodes_dead);
        if self.counts.nodes_dead > 0
            || !config.lost.is_empty()
            || config.replicas_held() < config.ring.replicas
        {
            warn!("{line}");
        } else {
            info!("{line}");
        }
    }

    /// The coordinator says how far each worker is every [`PROGRESS_EVERY`], when the workers
    /// report it ([`pserver_core::JobSpec::report_progress`]) and it moved.
    fn say_progress(&mut self) {
        if self.progressed_at.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.progressed_at = Instant::now();
        let Some(coordinator) = self.driver.node().as_coordinator() else {
            return;
        };
        let progress = coordinator.progress();
        if !progress.is_empty() && progress != self.progress_said {
            info!("{}", progress_line(&progress));
            self.progress_said = progress;
        }
    }

    /// Every [`HOUSEKEEPING_EVERY`]: what the worker waits for, the metrics a scrape reads
    /// (a fraction of a second old), the coordinator's summary, the refusal log's window.
    fn housekeep(&mut self) {
        let now = Instant::now();
        if now < self.housekeep_at {
            return;
        }
        self.housekeep_at = now + HOUSEKEEPING_EVERY;
        self.watch_for_stalls();
        self.publish_metrics();
        self.summarize();
        self.refused_messages.tick();
        self.failed_sends.tick();
    }

    /// Publishes the counts.
    fn publish_metrics(&mut self) {
        let node = self.driver.node();
        let waits = node.as_worker().map(pserver_core::node::Worker::waits);
        let metrics = NodeMetrics {
            epoch: node.epoch(),
            checkpoint: node.config().map_or(0, |c| c.checkpoints.complete),
            open_requests: self.open_requests() as u64,
            resends_open: waits.map_or(0, |w| w.iter().map(|x| u64::from(x.attempts)).sum()),
            held_pulls: node.as_server().map_or(0, |s| s.held_pulls() as u64),
            replicas_held: node.config().map_or(0, |c| u64::from(c.replicas_held())),
            replicas_asked: node.config().map_or(0, |c| u64::from(c.ring.replicas)),
            refusals: self.driver.refusals(),
            retransmissions: self.driver.retransmissions(),
            filter_savings: node
                .as_worker()
                .map(|w| w.filter_savings())
                .unwrap_or_default(),
            status: node.as_coordinator().map(|c| c.status()),
            ..self.counts.clone()
        };
        self.metrics.send_replace(metrics);
    }

    /// Says what the worker waits for when its open requests see no progress for
    /// [`RuntimeConfig::stall_warning`], and gives up past [`RuntimeConfig::stall_limit`]. The
    /// worker's heartbeat wakes the loop often enough to notice.
    fn watch_for_stalls(&mut self) {
        if self.stalled.is_some() {
            return;
        }
        if let (Some(limit), Some(since), Some(_)) = (
            self.cfg.stall_limit,
            self.coordinator_silent_since,
            self.driver.node().as_server(),
        ) && since.elapsed() >= limit
        {
            let secs = since.elapsed().as_secs();
            tracing::error!(secs, "the coordinator has been silent past the stall limit");
            self.stalled = Some(RuntimeError::CoordinatorSilent { secs });
            return;
        }
        if self.open_requests() == 0 {
            return;
        }
        let waited = self.progress_at.elapsed();
        let secs = waited.as_secs();
        // The core bounds the requests it holds; calls waiting for the worker to be ready
        // are this loop's own.
        if !self.early.is_empty() && self.cfg.stall_limit.is_some_and(|limit| waited >= limit) {
            let waiting = "a configuration: the worker is not ready".to_owned();
            tracing::error!(
                secs,
                "no request completed within the stall limit: waiting for {waiting}"
            );
            self.stalled = Some(RuntimeError::Stalled { secs, waiting });
            return;
        }
        if waited < self.cfg.stall_warning {
            return;
        }
        if self
            .stall_warned_at
            .is_none_or(|at| at.elapsed() >= self.cfg.stall_warning)
        {
            self.stall_warned_at = Some(Instant::now());
            let open = self.open_requests();
            warn!(
                secs,
                open,
                "nothing completed for {secs} s: waiting for {}",
                self.waiting_for()
            );
        }
    }

    /// The servers and keys a worker's open slices wait for, in a line.
    fn waiting_for(&self) -> String {
        let waits = self
            .driver
            .node()
            .as_worker()
            .map(pserver_core::node::Worker::waits)
            .unwrap_or_default();
        if waits.is_empty() {
            return "the servers to acknowledge this worker's progress".to_owned();
        }
        let mut by_server: BTreeMap<NodeId, (usize, Option<KeyRange>, u8)> = BTreeMap::new();
        for w in &waits {
            let entry = by_server.entry(w.server).or_insert((0, None, 0));
            entry.0 += 1;
            entry.1 = match (entry.1, w.keys) {
                (Some(a), Some(b)) => {
                    KeyRange::new(a.start().min(b.start()), a.end().max(b.end())).ok()
                }
                (a, b) => a.or(b),
            };
            entry.2 = entry.2.max(w.attempts);
        }
        let parts: Vec<String> = by_server
            .iter()
            .map(|(server, (slices, keys, attempts))| {
                let keys = keys.map_or_else(String::new, |k| format!(" over keys {k}"));
                format!("server {server}: {slices} slices{keys}, sent again up to {attempts} times")
            })
            .collect();
        let mut line = parts.join("; ");
        if let Some(at) = self.coordinator_silent_since {
            let secs = at.elapsed().as_secs();
            line.push_str(&format!(
                "; the coordinator has been silent for {secs} s, so no failure can be dealt with"
            ));
        }
        line
    }

    /// Asks the coordinator to take the worker out once nothing the application started is
    /// open any more (or the drain timeout has passed); the worker's heartbeat wakes the loop
    /// often enough to see either.
    /// A server leaves the job: it keeps serving until its ranges are held elsewhere, and is
    /// then fenced, which ends the loop (ARCHITECTURE.md §8). Other nodes have nothing to hand
    /// over: asked to leave, they go on until stopped.
    fn leave_as_server(&mut self) {
        if self.driver.node().as_server().is_none() {
            debug!("only a server leaves this way");
            return;
        }
        info!("leaving the job: waiting for the ranges held here to be held elsewhere");
        self.server_leaving = true;
        if let Err(e) = self.driver.leave() {
            warn!(error = %e, "cannot leave");
        }
    }

    fn ask_to_leave_when_done(&mut self) {
        let done = self.open_requests() == 0 && self.driver.is_idle();
        if let Some(leaving) = &mut self.leave
            && !leaving.asked
            && (done || Instant::now() >= leaving.by)
        {
            leaving.asked = true;
            if let Err(e) = self.driver.leave() {
                warn!(error = %e, "cannot leave");
                // The application hears why instead of waiting for a removal that never comes.
                if let Some(leaving) = self.leave.take() {
                    let _ = leaving.reply.send(Err(runtime_error(e)));
                }
            }
        }
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command<V>>,
        mut stop: watch::Receiver<bool>,
        mut disk: mpsc::UnboundedReceiver<DiskDone<V>>,
    ) -> Result<NodeReport<Driver<V, U, S>>, RuntimeError> {
        if let Err(e) = self.open_checkpoints() {
            self.stalled = Some(RuntimeError::Checkpoint(e));
        }
        let now = self.now();
        match self.cfg.configured.clone() {
            Some(config) => self.driver.start_configured(now, config),
            None => self.driver.start(now),
        }
        info!("started");
        let mut commands_open = true;
        let mut draining: Option<Instant> = None;
        loop {
            // Timers first: under a steady stream of frames the select below might otherwise
            // never get to them, and a node that misses its heartbeats is declared dead.
            let now = self.now();
            if self.driver.poll_timeout().is_some_and(|t| t <= now) {
                self.driver.handle_timeout(now);
            }
            self.ask_to_leave_when_done();
            self.housekeep();
            self.flush().await;
            if self.fenced || self.stalled.is_some() {
                // Said before the queue closes, so that a call turned away says why.
                let _ = self.ended.set(self.ending());
                commands.close();
                while let Ok(command) = commands.try_recv() {
                    command.refuse(self.ending());
                }
                break;
            }
            if let Some(deadline) = draining {
                let idle = self.open_requests() == 0 && !commands_open && self.driver.is_idle();
                if idle || Instant::now() >= deadline {
                    break;
                }
            }
            let timer = self
                .driver
                .poll_timeout()
                .map(|t| self.origin + std::time::Duration::from_nanos(t));
            let accept = commands_open && self.open_requests() < self.cfg.max_open_requests;
            tokio::select! {
                biased;
                changed = stop.changed(), if draining.is_none() => {
                    // A dropped stop handle means nobody can stop the node any more: stop now.
                    let _ = changed;
                    draining = Some(Instant::now() + self.cfg.drain_timeout);
                    // Calls already queued were accepted by their callers' point of view: take
                    // them, but no new ones.
                    commands.close();
                    debug!(open = self.open_requests(), "stopping");
                }
                received = self.transport.recv() => match received {
                    Ok((from, frame)) => {
                        self.counts.frames_received += 1;
                        let now = self.now();
                        self.driver.handle_frame_bytes(now, from, &frame);
                    }
                    Err(TransportError::Closed) => {
                        info!("transport closed");
                        break;
                    }
                    Err(e) => {
                        warn!(error = %e, "receive failed");
                        // Whatever failed is unlikely to heal at once: do not spin on it.
                        tokio::time::sleep(RECV_ERROR_PAUSE).await;
                    }
                },
                () = self.server_leave.notified(), if !self.server_leaving => self.leave_as_server(),
                Some(done) = disk.recv() => match done {
                    DiskDone::Written(cut, result) => self.checkpoint_written(cut, result),
                    DiskDone::Read(cut, shards) => self.restored(cut, shards),
                },
                command = commands.recv(), if accept => match command {
                    Some(command) => self.apply(command),
                    None => commands_open = false,
                },
                () = sleep_until(timer.unwrap_or_else(Instant::now)), if timer.is_some() => {
                    let now = self.now();
                    self.driver.handle_timeout(now);
                }
                () = sleep_until(draining.unwrap_or_else(Instant::now)), if draining.is_some() => {}
            }
        }
        self.flush().await;
        self.publish_metrics();
        let failure = self.ending();
        let _ = self.ended.set(failure.clone());
        if let Some(leaving) = self.leave.take() {
            let _ = leaving.reply.send(if self.left {
                Ok(())
            } else {
                Err(failure.clone())
            });
        }
        self.fail_all(&failure);
        info!(refused = self.driver.refusals().total(), "stopped");
        Ok(NodeReport {
            refusals: self.driver.refusals(),
            send_errors: self.counts.send_errors,
            fenced: self.fenced && !self.left,
            left: self.left,
            stalled: self.stalled.clone(),
            node: self.driver,
        })
    }

    fn apply(&mut self, command: Command<V>) {
        let now = self.now();
        if self.leave.is_some() {
            return command.refuse(RuntimeError::Left);
        }
        if self.open_requests() == 0 {
            // A wait begins: nothing was open, so nothing was stalled.
            self.progress_at = Instant::now();
        }
        let request = matches!(
            command,
            Command::Push { .. } | Command::Flush { .. } | Command::Pull(..) | Command::Advance(_)
        );
        let unready = self
            .driver
            .node()
            .as_worker()
            .is_some_and(|w| !w.is_ready());
        if request && unready && !self.fenced {
            // Refused by the core until the worker is ready: it goes in then, in order.
            self.early.push_back(command);
            return;
        }
        match command {
            Command::Push {
                kvs,
                covers,
                done,
                durable,
            } => {
                let pushed = self
                    .driver
                    .worker()
                    .and_then(|mut w| w.push_part(now, kvs, covers))
                    .map(Some);
                self.wait_for_push(pushed, done, durable);
            }
            Command::Flush { done, durable } => {
                let pushed = self.driver.worker().and_then(|mut w| w.flush(now));
                self.wait_for_push(pushed, done, durable);
            }
            Command::Pull(keys, reply) => {
                match self.driver.worker().and_then(|mut w| w.pull(now, keys)) {
                    Ok(id) => {
                        self.pulls.insert(id, reply);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(runtime_error(e)));
                    }
                }
            }
            Command::Advance(reply) => {
                match self.driver.worker().and_then(|mut w| w.advance(now)) {
                    Ok(()) => self.advances.push_back(reply),
                    Err(e) => {
                        let _ = reply.send(Err(runtime_error(e)));
                    }
                }
            }
            Command::Shares(reply) => {
                let node = self.driver.node();
                let shares = node.as_worker().map(|w| w.shares());
                let _ = reply.send(shares.ok_or(RuntimeError::NotAWorker(self.driver.id())));
            }
            Command::SharesInRound {
                first,
                length,
                round,
                reply,
            } => {
                let node = self.driver.node();
                let shares = node
                    .as_worker()
                    .map(|w| w.shares_in_round(first, length, round));
                let _ = reply.send(shares.ok_or(RuntimeError::NotAWorker(self.driver.id())));
            }
            Command::Iteration(reply) => {
                let node = self.driver.node();
                let at = node.as_worker().map(pserver_core::node::Worker::iteration);
                let _ = reply.send(at.ok_or(RuntimeError::NotAWorker(self.driver.id())));
            }
            Command::ResumedFrom(reply) => {
                let node = self.driver.node();
                let from = node
                    .as_worker()
                    .map(pserver_core::node::Worker::resumed_from);
                let _ = reply.send(from.ok_or(RuntimeError::NotAWorker(self.driver.id())));
            }
            Command::Speed(per_sec) => {
                // Only a worker has a speed to say; anything else has no application calling.
                if let Ok(mut worker) = self.driver.worker() {
                    worker.report_speed(per_sec);
                }
            }
            Command::Leads(reply) => {
                let node = self.driver.node();
                let leads = node.as_worker().map(pserver_core::node::Worker::leads);
                let _ = reply.send(leads.ok_or(RuntimeError::NotAWorker(self.driver.id())));
            }
            Command::Leave(reply) => {
                if self.driver.node().as_worker().is_none() {
                    let _ = reply.send(Err(RuntimeError::NotAWorker(self.driver.id())));
                } else {
                    debug!(open = self.open_requests(), "leaving the job");
                    // What the filters hold back goes first: the worker leaves once it is
                    // acknowledged, like every other push (ARCHITECTURE.md §10).
                    let now = self.now();
                    if let Err(e) = self.driver.worker().and_then(|mut w| w.flush(now)) {
                        warn!(error = %e, "cannot push what the filters hold before leaving");
                    }
                    self.leave = Some(Leaving {
                        reply,
                        asked: false,
                        by: Instant::now() + self.cfg.drain_timeout,
                    });
                }
            }
        }
    }

    /// Keeps the waiters of a push the driver took (`None`: there was nothing to push, and
    /// both are answered at once), or answers them with its error.
    fn wait_for_push(
        &mut self,
        pushed: Result<Option<RequestId>, DriverError>,
        done: oneshot::Sender<Result<(), RuntimeError>>,
        durable: oneshot::Sender<Result<(), RuntimeError>>,
    ) {
        match pushed {
            Ok(Some(id)) => {
                // Both events come out of the driver only at the next flush, after this:
                // however early they come, their waiters are in place.
                self.pushes.insert(id, done);
                if !durable.is_closed() {
                    self.durables.insert(id, durable);
                }
            }
            Ok(None) => {
                let _ = durable.send(Ok(()));
                let _ = done.send(Ok(()));
            }
            Err(e) => {
                let e = runtime_error(e);
                let _ = durable.send(Err(e.clone()));
                let _ = done.send(Err(e));
            }
        }
    }

    /// Sends what the driver has queued and hands its events out.
    async fn flush(&mut self) {
        // Whether the configuration changed while requests were open is read before the
        // events: a completion in the same step must not hide the change, nor end it at once.
        let epoch = self.driver.node().epoch();
        if epoch != self.seen_epoch {
            let config = self.driver.node().config();
            let members_changed = match (&self.seen_members, config) {
                (Some(seen), Some(now)) => !seen.differs_only_in_pace(now),
                _ => true,
            };
            if members_changed && self.open_requests() > 0 && self.recovering_since.is_none() {
                self.recovering_since = Some(self.progress_at);
            }
            self.seen_members = config.cloned();
        }
        loop {
            match self.driver.poll_output_parts() {
                Output::Transmit(Transmit { to, frame }) => {
                    self.counts.frames_sent += 1;
                    self.counts.bytes_sent += frame.len() as u64;
                    if let Err(e) = self.transport.send_parts(to, frame).await {
                        self.counts.send_errors += 1;
                        let now = self.now();
                        self.driver.send_failed(now, to);
                        // The core resends what matters; the operator hears of it at a bounded
                        // rate.
                        let detail = || format!("for {to}: {e}");
                        self.failed_sends.dropped("send failed", detail);
                    }
                }
                Output::Event(event) => self.on_event(event),
                Output::Wait { .. } => break,
            }
        }
        if epoch != self.seen_epoch {
            self.seen_epoch = epoch;
            // Each membership change and the end of each ring change, as it happens: an
            // operator (or a test) need not wait for the periodic summary to see where it is.
            if let Some(config) = self.driver.node().as_coordinator().and_then(|c| c.config()) {
                info!("published {}", summary(config, self.counts.nodes_dead));
                if epoch == 1 {
                    // Where the keys are taken to lie, so that a job whose keys are not
                    // spread that way can tell why one server does all the work.
                    let ring = &config.ring;
                    if ring.key_space == u64::MAX {
                        info!(
                            "ring: {} points per server over the whole 64-bit key space: the \
                             job's keys are taken to be hashed (spread over it)",
                            ring.vnodes
                        );
                    } else {
                        info!(
                            "ring: {} points per server over keys 0..{} (the data's \
                             dimension the workers gave, or ring.key_space)",
                            ring.vnodes, ring.key_space
                        );
                    }
                }
                for server in idle_servers(config) {
                    warn!(
                        server = %server,
                        "server {server} is the primary of no key below {}: the ring's key space \
                         is too small for its servers (ring.key_space in a cluster file)",
                        config.ring.key_space
                    );
                }
            }
        }
    }

    /// A request completed: the wait, and any recovery, is over.
    fn progressed(&mut self) {
        self.progress_at = Instant::now();
        if let Some(since) = self.recovering_since.take() {
            let took = since.elapsed();
            self.counts.recoveries += 1;
            self.counts.last_recovery = took;
            // A join or a ring switch right after a crash is a short recovery of its own: the
            // longest keeps what the crash cost.
            self.counts.longest_recovery = self.counts.longest_recovery.max(took);
            info!(
                millis = self.counts.last_recovery.as_millis() as u64,
                "requests complete again after a configuration change"
            );
        }
    }

    fn on_event(&mut self, event: Event<V>) {
        match event {
            Event::Ready { epoch } => {
                info!(epoch, "configuration received");
                self.ready.send_replace(Some(epoch));
                for command in core::mem::take(&mut self.early) {
                    self.apply(command);
                }
            }
            Event::Worker(WorkerEvent::Advanced(iteration)) => {
                self.progressed();
                self.counts.iterations += 1;
                if let Some(reply) = self.advances.pop_front() {
                    let _ = reply.send(Ok(iteration));
                }
            }
            Event::Worker(WorkerEvent::PushDone(id)) => {
                self.progressed();
                self.counts.pushes += 1;
                if let Some(reply) = self.pushes.remove(&id) {
                    let _ = reply.send(Ok(()));
                }
                // A ticket dropped or spent on the first stage will not ask: forget it now
                // rather than at the second event, which may be an iteration away.
                if self.durables.get(&id).is_some_and(Reply::is_closed) {
                    self.durables.remove(&id);
                }
            }
            Event::Worker(WorkerEvent::PushDurable(id)) => {
                // The core emits `PushDone` first or in the same step, but a durable push is
                // done whatever the order: nobody may be left waiting for the first stage.
                if let Some(reply) = self.pushes.remove(&id) {
                    let _ = reply.send(Ok(()));
                }
                if let Some(reply) = self.durables.remove(&id) {
                    let _ = reply.send(Ok(()));
                }
            }
            Event::Worker(WorkerEvent::PullDone(id, kvs)) => {
                self.progressed();
                self.counts.pulls += 1;
                if let Some(reply) = self.pulls.remove(&id) {
                    let _ = reply.send(Ok(kvs));
                }
            }
            Event::NodeDead(node) if self.driver.node().role() == Role::Coordinator => {
                self.counts.nodes_dead += 1;
                warn!(node = %node, "node declared dead");
            }
            Event::NodeDead(node) => {
                info!(node = %node, "the coordinator declared node {node} dead")
            }
            Event::Worker(WorkerEvent::Stalled { for_at_least, .. }) => {
                let secs = std::time::Duration::from_nanos(for_at_least).as_secs();
                let waiting = self.waiting_for();
                tracing::error!(
                    secs,
                    "no request completed within the stall limit: waiting for {waiting}"
                );
                self.stalled = Some(RuntimeError::Stalled { secs, waiting });
            }
            Event::Coordinator(CoordinatorEvent::TookOver { from, term, epoch }) => warn!(
                from = %from,
                term,
                epoch,
                "took over from coordinator {from}, silent past the heartbeat timeout: this coordinator publishes now, under term {term}"
            ),
            Event::Coordinator(CoordinatorEvent::SteppedDown { term }) => warn!(
                term,
                "another coordinator took over under term {term}: this one stepped down and stands by"
            ),
            Event::Coordinator(CoordinatorEvent::StandbyDropped(node)) => warn!(
                node = %node,
                "standby coordinator {node} stopped answering and was dropped: the job has no standby until one answers"
            ),
            Event::Coordinator(CoordinatorEvent::TermRenewed { term, epoch }) => info!(
                term,
                epoch,
                "members granted a standby a term it did not win: this coordinator renewed its own, term {term}"
            ),
            Event::TermGranted { to, term } => info!(
                to = %to,
                term,
                "granted standby coordinator {to} term {term}: the active coordinator is silent"
            ),
            Event::RingDegraded(node) => warn!(
                node = %node,
                "server silent or leaving, but kept on the ring: without it, no server or fewer replicas than the job's min_replicas would be left"
            ),
            Event::Coordinator(CoordinatorEvent::ReplicasChanged { held, asked })
                if held < asked =>
            {
                warn!(
                    held,
                    asked,
                    "the ring holds fewer replicas than asked: the servers left are too few for \
                 them, and a further server crash may lose ranges until servers join"
                )
            }
            Event::Coordinator(CoordinatorEvent::ReplicasChanged { held, asked }) => {
                info!(held, asked, "the ring holds replicas again")
            }
            Event::RangeLost(range) => {
                tracing::error!(
                    %range,
                    "every holder of this range failed before it was copied: it starts again from zero"
                );
                self.lost.send_modify(|lost| lost.push(range));
                self.counts.ranges_lost += 1;
            }
            Event::Fenced => {
                if self.server_leaving || self.leave.as_ref().is_some_and(|l| l.asked) {
                    info!("left the job");
                    self.left = true;
                } else {
                    warn!("removed from the cluster");
                }
                self.fenced = true;
            }
            Event::Coordinator(CoordinatorEvent::WorkerLeft(node)) => {
                info!(node = %node, "worker left the job")
            }
            Event::Unencodable { to, error } => {
                warn!(to = %to, error = %error, "message not sent: it does not fit a frame");
            }
            Event::Server(ServerEvent::CheckpointDue { cut, shards }) => {
                self.write_checkpoint(cut, shards)
            }
            Event::Coordinator(CoordinatorEvent::CheckpointTaken { cut }) => {
                debug!(
                    cut,
                    "checkpoint {cut} taken: every server copied its shards, the workers go on"
                );
            }
            Event::Coordinator(CoordinatorEvent::CheckpointComplete { cut }) => {
                info!(
                    cut,
                    "checkpoint {cut} complete: every server wrote its shards"
                );
                // At once rather than at the next housekeeping: whoever waits for the
                // checkpoint hears of it when it is recorded.
                self.publish_metrics();
            }
            Event::Server(ServerEvent::Restore { cut }) => self.restore(cut),
            Event::JobFinished { epoch } => {
                info!(epoch, "the job finished: every worker left, its work done");
                self.finished.send_replace(Some(epoch));
            }
            Event::Coordinator(CoordinatorEvent::Straggler { worker, behind }) => {
                self.counts.stragglers += 1;
                warn!(
                    worker = %worker,
                    behind,
                    "{worker} is a straggler: {behind} iterations behind the median of the others"
                );
            }
            Event::Coordinator(CoordinatorEvent::StragglerCleared(worker)) => {
                info!(worker = %worker, "{worker} keeps up again");
            }
            Event::Coordinator(CoordinatorEvent::ShareMoved { share, from, to }) => {
                self.counts.shares_moved += 1;
                info!(share, from = %from, to = %to, "share {share} moved from {from} to {to}, the faster");
            }
            Event::Coordinator(CoordinatorEvent::TauChanged { from, to }) => {
                info!(from, to, "staleness bound now tau = {to} (was {from})");
            }
            Event::Worker(WorkerEvent::SkippedAhead { from, to, covered }) => {
                self.counts.skipped_iterations += u64::from(to - from);
                let pushed = f64::from(covered.0) / f64::from(Coverage::WHOLE.0);
                info!(
                    from,
                    to,
                    "told to skip ahead: left iteration {from} ({:.0}% of it pushed) for {to}",
                    pushed * 100.0
                );
                // The application's advance, if it waited, was answered with `Advanced`.
                self.skipped.send_replace(to);
            }
            Event::CoordinatorSilent { for_at_least } => {
                let silent = std::time::Duration::from_nanos(for_at_least);
                let secs = silent.as_secs();
                warn!(
                    secs,
                    "the coordinator has not answered for {secs} s: no failure, join or leave \
                     can be dealt with until it is back"
                );
                let now = Instant::now();
                self.coordinator_silent_since = Some(now.checked_sub(silent).unwrap_or(now));
            }
            Event::CoordinatorBack => {
                let secs = self
                    .coordinator_silent_since
                    .take()
                    .map_or(0, |at| at.elapsed().as_secs());
                info!(secs, "the coordinator answers again");
            }
            Event::Refused { from, reason } => match reason {
                // What a broken or hostile peer sends: said at a bounded rate.
                Refusal::Undecodable(_) => {
                    let detail = || format!("from {from}: {reason}");
                    self.refused_messages.refused("undecodable", detail);
                }
                Refusal::SpoofedSender { .. } => {
                    let detail = || format!("from {from}: {reason}");
                    self.refused_messages.refused("spoofed sender", detail);
                }
                _ => debug!(from = %from, reason = %reason, "message refused"),
            },
            _ => {}
        }
    }

    /// A server with a checkpoint directory opens it, and when the job resumes offers the
    /// checkpoints in it that read back whole.
    fn open_checkpoints(&mut self) -> Result<(), String> {
        let Some(path) = self.cfg.checkpoints.clone() else {
            return Ok(());
        };
        if self.driver.node().as_server().is_none() {
            return Ok(());
        }
        let dir = CheckpointDir::new(&path).map_err(|e| {
            format!(
                "{}: cannot make the checkpoint directory: {e}",
                path.display()
            )
        })?;
        if self.cfg.resume {
            let (good, refused) = dir
                .good_for(usable_shards::<V>)
                .map_err(|e| format!("{}: cannot read the checkpoints: {e}", path.display()))?;
            for (file, why) in refused {
                warn!("checkpoint {}: refused, {why}", file.display());
            }
            let cuts: Vec<Iteration> = good
                .iter()
                .filter_map(|&c| Iteration::try_from(c).ok())
                .collect();
            info!(dir = %path.display(), cuts = ?cuts, "offering the checkpoints that read back whole");
            self.driver
                .server()
                .map_err(|e| e.to_string())?
                .offer_checkpoints(cuts)
                .map_err(|e| e.to_string())?;
        }
        self.checkpoints = Some(Arc::new(dir));
        Ok(())
    }

    /// Writes a server's shards of `cut` on a thread of its own at a low priority: the loop
    /// goes on answering heartbeats, and the workers training, while the disk works.
    fn write_checkpoint(&mut self, cut: Iteration, shards: Vec<ShardCopy<V>>) {
        let Some(dir) = self.checkpoints.clone() else {
            self.stalled = Some(RuntimeError::Checkpoint(format!(
                "the job takes a checkpoint before iteration {cut}, but this server has no \
                 checkpoint directory to write it to (--checkpoint-dir): the workers would wait for ever"
            )));
            return;
        };
        let done = self.disk.clone();
        let failed = self.disk.clone();
        let writer = std::thread::Builder::new().name("checkpoint-writer".into());
        let spawned = writer.spawn(move || {
            crate::checkpoint::in_background();
            let result = unpanicked(|| {
                let began = std::time::Instant::now();
                let shown = |e: io::Error| format!("{}: {e}", dir.path().display());
                let written = write_shards(&dir, u64::from(cut), &shards);
                // Dropped before the server hears: the rows are the store's own, and a write
                // to a leaf still shared here would copy it.
                drop(shards);
                written.map_err(shown).and_then(|(path, bytes)| {
                    dir.retain_newest(CHECKPOINTS_KEPT).map_err(shown)?;
                    Ok(format!(
                        "{} ({bytes} bytes in {} ms, written and flushed)",
                        path.display(),
                        began.elapsed().as_millis()
                    ))
                })
            });
            let _ = done.send(DiskDone::Written(cut, result));
        });
        if let Err(e) = spawned {
            let why = format!("cannot start a thread to write it: {e}");
            let _ = failed.send(DiskDone::Written(cut, Err(why)));
        }
    }

    /// A checkpoint written on the blocking thread: the server tells the coordinator, or,
    /// if it could not be written, stops (the workers cannot go on without it).
    fn checkpoint_written(&mut self, cut: Iteration, result: Result<String, String>) {
        match result {
            Ok(what) => {
                info!(cut, "checkpoint {cut} written: {what}");
                let now = self.now();
                let written = self
                    .driver
                    .server()
                    .map_err(|e| e.to_string())
                    .and_then(|mut s| s.checkpoint_written(now, cut).map_err(|e| e.to_string()));
                if let Err(e) = written {
                    // The ring changed meanwhile: the shards of the new one are being written.
                    debug!(cut, "checkpoint written, but {e}");
                }
            }
            Err(e) => {
                self.stalled = Some(RuntimeError::Checkpoint(format!(
                    "cannot write the checkpoint of iteration {cut}: {e}"
                )));
            }
        }
    }

    /// The job resumes from `cut`: the server reads its shards of it on a blocking thread
    /// (a model's file takes seconds to read and decode, while the node goes on answering
    /// heartbeats and holds what it cannot serve yet), then loads them before serving.
    fn restore(&mut self, cut: Iteration) {
        let Some(dir) = self.checkpoints.clone() else {
            return self.restored(cut, Err("this server has no checkpoint directory".into()));
        };
        let done = self.disk.clone();
        tokio::task::spawn_blocking(move || {
            let shards = unpanicked(|| {
                let checkpoint = dir
                    .read(u64::from(cut))
                    .map_err(|e| format!("{}: {e}", dir.path().display()))?;
                shards_of::<V>(&checkpoint.payload)
                    .map_err(|e| format!("{}: {e}", checkpoint.path.display()))
            });
            let _ = done.send(DiskDone::Read(cut, shards));
        });
    }

    /// The shards of `cut` read back: the server takes them and serves.
    fn restored(&mut self, cut: Iteration, shards: Result<Vec<ShardCopy<V>>, String>) {
        let loaded = shards.and_then(|shards| {
            let now = self.now();
            self.driver
                .server()
                .map_err(|e| e.to_string())
                .and_then(|mut s| s.restore(now, cut, shards).map_err(|e| e.to_string()))
        });
        match loaded {
            Ok(()) => info!(cut, "resumed from the checkpoint of iteration {cut}"),
            Err(e) => {
                self.stalled = Some(RuntimeError::Checkpoint(format!(
                    "cannot resume from the checkpoint of iteration {cut}: {e}"
                )));
            }
        }
    }

    fn fail_all(&mut self, failure: &RuntimeError) {
        for (_, reply) in core::mem::take(&mut self.pushes) {
            let _ = reply.send(Err(failure.clone()));
        }
        for (_, reply) in core::mem::take(&mut self.durables) {
            let _ = reply.send(Err(failure.clone()));
        }
        for (_, reply) in core::mem::take(&mut self.pulls) {
            let _ = reply.send(Err(failure.clone()));
        }
        for reply in self.advances.drain(..) {
            let _ = reply.send(Err(failure.clone()));
        }
        for command in self.early.drain(..) {
            command.refuse(failure.clone());
        }
    }
}

fn runtime_error(e: DriverError) -> RuntimeError {
    match e {
        DriverError::NotAWorker(id) => RuntimeError::NotAWorker(id),
        DriverError::Worker(e) => e.into(),
        _ => RuntimeError::ShutDown,
    }
}

/// The servers of `config` that are the primary of no key of the job's key space, and so get
/// no work: a ring whose key space is smaller than its servers' points can cover.
fn idle_servers(config: &ClusterConfig) -> Vec<NodeId> {
    let Ok(ring) = config.ring_in_force() else {
        return Vec::new();
    };
    let Ok(space) = KeyRange::new(0, config.ring.key_space) else {
        return Vec::new();
    };
    let busy: BTreeSet<NodeId> = ring
        .segments_in(space)
        .filter_map(|(_, owners)| owners.first().copied())
        .collect();
    config
        .servers
        .iter()
        .copied()
        .filter(|s| !busy.contains(s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pserver_core::Consistency;
    use pserver_core::ring::RingConfig;
    use pserver_core::wire::ClusterConfig;

    #[test]
    fn a_ring_whose_key_space_leaves_a_server_without_keys_is_found() {
        let config = |servers: u32, key_space: u64| ClusterConfig {
            epoch: 1,
            coordinator: NodeId(0),
            standbys: Vec::new(),
            term: 0,
            servers: (1..=servers).map(NodeId).collect(),
            workers: vec![NodeId(servers + 1)],
            ring: RingConfig {
                key_space,
                ..RingConfig::default()
            },
            consistency: Consistency::Eventual,
            joining: vec![],
            leaving: vec![],
            shares: vec![NodeId(servers + 1)],
            left: vec![],
            lost: vec![],
            incarnations: vec![],
            pace: Default::default(),
            checkpoints: Default::default(),
        };
        // Four servers, two keys: at most two of them are anybody's primary.
        assert!(idle_servers(&config(4, 2)).len() >= 2);
        assert_eq!(idle_servers(&config(4, 1 << 20)), Vec::<NodeId>::new());
        assert_eq!(idle_servers(&config(3, u64::MAX)), Vec::<NodeId>::new());
    }

    #[test]
    fn the_coordinators_summary_names_every_member_and_what_went_wrong() {
        let n = NodeId;
        let config = ClusterConfig {
            epoch: 7,
            coordinator: n(0),
            standbys: Vec::new(),
            term: 0,
            servers: vec![n(1), n(2)],
            workers: vec![n(4)],
            ring: RingConfig::default(),
            consistency: Consistency::Eventual,
            joining: vec![n(3)],
            leaving: vec![],
            shares: vec![n(4), n(5)],
            left: vec![n(5)],
            lost: vec![KeyRange::new(0, 10).unwrap_or(KeyRange::FULL)],
            incarnations: vec![],
            pace: Default::default(),
            checkpoints: Default::default(),
        };
        assert_eq!(
            summary(&config, 2),
            "epoch 7: servers [n1, n2], replicas 1 of 1, workers [n4], joining [n3], leaving [], \
             left [n5], 2 declared dead, 1 ranges lost"
        );
    }
}
