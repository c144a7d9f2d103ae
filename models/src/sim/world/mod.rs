//! The simulation loop: one event queue on virtual time for every node, message and timer.

mod checks;
mod coordinators;
mod faults;
mod policies;

use core::cmp::Ordering;
use core::hash::{Hash, Hasher};
use pserver_core::events::{CoordinatorEvent, Refusal, WorkerEvent};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use super::ledger::Ledger;
use super::network::Network;
use super::oracle::Oracle;
use super::rng::SimRng;
use super::rule::ServerRule;
use super::{Invariant, MS, PaceReport, SimConfig, SimFailure, SimReport, SimUpdater};
use pserver_core::Bytes;

use pserver_core::Consistency;
use pserver_core::Driver;
use pserver_core::Event;
use pserver_core::KvPairs;
use pserver_core::Output;
use pserver_core::filter::KeysDigest;
use pserver_core::node::Coordinator;
use pserver_core::node::Worker;
use pserver_core::node::{Server, ServerConfig};
use pserver_core::pace::Coverage;
use pserver_core::pace::{Pace, Position};
use pserver_core::ring::Ring;
use pserver_core::wire::ClusterConfig;
use pserver_core::wire::Codec;
use pserver_core::wire::{
    Envelope, Message, Pull, PullReply, PullRows, PullValues, Push, ShardUpdate,
};
use pserver_core::{Epoch, Iteration, NodeId, Time};
use pserver_core::{Key, KeyRange};
use pserver_core::{KeyList, KeySelection, RangeList, RequestId};
use std::sync::Arc;

/// How much later than others a membership message may arrive under membership stress.
const MEMBERSHIP_LATE: Time = 800 * MS;

/// What travels the simulated network: a frame, or the envelope itself when the run skips the
/// wire.
#[derive(Clone, Debug)]
enum Packet {
    Frame(Bytes),
    Envelope(Box<Envelope<f64>>),
}

#[derive(Clone, Debug)]
enum Action {
    Deliver {
        from: NodeId,
        to: NodeId,
        /// When it was sent, to tell an earlier process's messages from a later one's.
        sent_at: Time,
        packet: Packet,
        /// The epoch a `Redirect` names, to count the redirects workers follow.
        redirect: Option<Epoch>,
        /// A server has worked through it in its receive queue (see "Receive queues" in the
        /// module docs): it is handled now.
        received: bool,
        /// The position a worker's heartbeat carries: the speeds a coordinator holds
        /// ([`policies`]).
        position: Option<Position>,
    },
    /// A node's earliest timer deadline.
    Wake(NodeId),
    /// A part of a worker's compute is done; the number tells the iteration's work started
    /// last, so that work a skip dropped is not pushed.
    ComputeDone(NodeId, u64),
    Crash(NodeId),
    Isolate(NodeId),
    Heal(NodeId),
    /// A server crash of the fault plan: of this server, or of one the plan picks then.
    CrashServer(Option<NodeId>),
    /// A crashed server comes back as a fresh process.
    RestartServer(NodeId),
    /// The active coordinator's process dies.
    CrashCoordinator,
    /// A crashed coordinator comes back as a fresh standby.
    RestartCoordinator(NodeId),
    /// The active coordinator is cut off from every node for this long.
    IsolateCoordinator(Time),
    /// A server is cut off from every other server.
    CutOff(NodeId),
    /// A new server starts and registers.
    JoinServer(NodeId),
    /// A server of the ring, picked then, asks to leave.
    LeaveServer,
    /// The first isolation of a flapping server.
    FlapStart(NodeId),
    /// Its links to the other servers come back.
    Reconnect(NodeId),
}

struct Scheduled {
    at: Time,
    seq: u64,
    action: Action,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    // Earliest first in a max-heap.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The scripted application on one worker: pull, compute, push, advance, for each iteration;
/// with [`SimConfig::parts`], compute and push in parts.
#[derive(Clone, Debug, Default)]
struct App {
    /// Key indices of the current iteration's pull and push.
    keys: Vec<u64>,
    /// Iteration each open pull was issued in.
    pulls: BTreeMap<RequestId, (Iteration, KeySelection)>,
    /// The pull whose answer the current iteration computes on.
    current: Option<RequestId>,
    /// Counts the iterations' work started; a skip starts new work.
    generation: u64,
    /// Parts of the current iteration's compute pushed.
    parts_done: u32,
    /// The iteration's work is all pushed and the application waits for `advance`.
    advancing: bool,
    busy: Time,
    finished_at: Option<Time>,
    crashed: bool,
    done: bool,
    /// The application asked to leave the job, its work done.
    leaving: bool,
    /// The coordinator took it out at its word: it left, it did not crash.
    left: bool,
    /// Per key index, the sum of what the application pushed, before any filter: what its
    /// requests must carry in all once it flushed.
    computed: BTreeMap<usize, i64>,
}

struct World<'a> {
    cfg: &'a SimConfig,
    rng: SimRng,
    now: Time,
    seq: u64,
    steps: u64,
    queue: BinaryHeap<Scheduled>,
    /// Per node, the deadline its pending wake-up is for.
    wakeups: BTreeMap<NodeId, Time>,
    net: Network,
    nodes: BTreeMap<NodeId, Driver<f64, ServerRule>>,
    apps: BTreeMap<NodeId, App>,
    ledger: Ledger,
    oracle: Oracle,
    updater: SimUpdater,
    /// The rule the servers run: the updater's, wrapped under the wrong-sign mutation.
    server_rule: ServerRule,
    /// With a ring change, the configuration each node starts with (no registration).
    start_configs: BTreeMap<NodeId, ClusterConfig>,
    /// The ring in force: that of the coordinator's configuration (before the first one, that
    /// of the configuration the run starts from). It changes when a crashed server is removed.
    ring: Ring,
    /// The epoch of the configuration `ring` was built from.
    ring_epoch: Epoch,
    /// The ring in force before the last change, if it changed.
    previous_ring: Option<Ring>,
    /// Whether ranges have replicas: the oracle is then left out (see the module docs).
    replicated: bool,
    /// Servers whose process is down: they receive, send and fire nothing.
    down: BTreeSet<NodeId>,
    /// When the running process of each server started after the run began.
    started: BTreeMap<NodeId, Time>,
    /// The server fault plan and what has come of it.
    plan: faults::Plan,
    /// Server configuration shared by every server, to start a fresh one on a restart.
    server_config: ServerConfig,
    #[cfg(feature = "mutations")]
    mutation: Option<pserver_core::mutation::Mutation>,
    /// Redirects the workers followed.
    redirects: u64,
    /// Values sent in pushes and in replication updates ([`crate::sim::SimReport`]).
    pushed_values: u64,
    replicated_values: u64,
    /// The (iteration, key) pairs pushed, and the values per key: [`SimReport::aggregate_values`].
    pushed_keys: BTreeSet<(Iteration, Key)>,
    width: u64,
    codec: Codec,
    /// The keys of the run, in order; a key's position is its index in the ledger.
    keys: Vec<u64>,
    /// The command that replays this run.
    replay: String,
    /// The pace of every configuration the coordinator published, by epoch: the bound and
    /// the skips a server on that epoch holds pulls to.
    paces: BTreeMap<Epoch, Pace>,
    /// The epochs of the servers that answered each open pull, by worker and request.
    reply_epochs: BTreeMap<(NodeId, RequestId), BTreeSet<Epoch>>,
    /// What the coordinator found and decided about stragglers.
    pace: PaceReport,
    /// Per server, its receive queue ([`SimConfig::receive_rate`]).
    receiving: BTreeMap<NodeId, ReceiveQueue>,
    /// Push slots granted.
    slot_grants: u64,
    /// Every key list a worker sent whole, by name: what a push naming one carried (key
    /// caching).
    lists_sent: BTreeMap<KeysDigest, Arc<Vec<Key>>>,
    /// Values per key.
    job_width: usize,
    /// Every worker was asked to leave, its work done, to end the job.
    ending: bool,
    /// When the coordinator said the job finished ([`Event::JobFinished`]).
    job_finished: Option<Time>,
    /// The coordinator whose configurations are in force: the first, then each that took
    /// over.
    active: NodeId,
    /// When the last coordinator fault began, until a standby takes over.
    coordinator_fault_at: Option<Time>,
    /// Per takeover, the time from the fault to the new coordinator's first configuration.
    takeovers: Vec<Time>,
    /// How many times a coordinator declared each node dead, and how many times each member
    /// said so of each: `heard-dead` (never more than declared).
    declared_dead: BTreeMap<NodeId, u32>,
    heard_dead: BTreeMap<(NodeId, NodeId), u32>,
    /// Every configuration seen, by epoch: `single-coordinator`.
    configs_seen: BTreeMap<Epoch, ClusterConfig>,
    /// Per running process, the highest (term, epoch) it held: neither may go back.
    highest: BTreeMap<NodeId, (u64, Epoch)>,
    /// What the straggler and slot policy checks remember between steps.
    policies: policies::PolicyWatch,
}

/// What has reached one server and is not handled yet: each message's bytes and when the
/// server will have worked through it, in arrival order.
#[derive(Clone, Debug, Default)]
struct ReceiveQueue {
    queued: VecDeque<(Time, u64)>,
    /// When the server will have worked through everything queued.
    busy_until: Time,
    /// The most bytes queued at once.
    peak: u64,
}

impl ReceiveQueue {
    /// `bytes` arrived at `now`, for a server working through `rate` bytes a millisecond.
    /// Returns when the server will have worked through them.
    fn arrive(&mut self, now: Time, bytes: u64, rate: u64) -> Time {
        // What was worked through by now left the queue, whether or not its handling still
        // runs (a crash may have dropped it).
        while self.queued.front().is_some_and(|&(done, _)| done <= now) {
            self.queued.pop_front();
        }
        let work = (u128::from(bytes) * u128::from(MS) / u128::from(rate.max(1))) as Time;
        self.busy_until = self.busy_until.max(now) + work;
        self.queued.push_back((self.busy_until, bytes));
        let queued = self.queued.iter().map(|&(_, b)| b).sum();
        self.peak = self.peak.max(queued);
        self.busy_until
    }
}

/// What [`World::observe`] makes of a message for its delivery.
#[derive(Clone, Copy, Debug, Default)]
struct Observed {
    /// The epoch a `Redirect` names, to count the redirects workers follow.
    redirect: Option<Epoch>,
    /// A membership message (delayed under membership stress).
    membership: bool,
    /// The position a heartbeat carries.
    position: Option<Position>,
}

/// The position of `key` among `keys` (a key of the run).
fn index_of(keys: &[u64], key: u64) -> usize {
    keys.binary_search(&key).unwrap_or(0)
}

/// Runs one simulation to its end, checking every invariant after every step.
///
/// ```
/// use pserver_models::sim::{run, SimConfig};
/// let report = run(&SimConfig { seed: 3, ..SimConfig::default() })?;
/// assert!(report.steps > 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run(cfg: &SimConfig) -> Result<SimReport, SimFailure> {
    let mut world = World::new(cfg, false)?;
    world.start()?;
    world.run()
}

/// Runs one simulation with a deliberately broken protocol on every server and worker, or
/// broken update rules on the servers, to see the invariant checks catch it. A failure's
/// replay command names the mutation.
#[cfg(feature = "mutations")]
pub fn run_mutated(
    cfg: &SimConfig,
    mutation: impl Into<super::SimMutation>,
) -> Result<SimReport, SimFailure> {
    let mutation = mutation.into();
    let mut world = World::new(cfg, mutation == super::SimMutation::WrongSign)?;
    if let super::SimMutation::Protocol(m) = mutation {
        for d in world.nodes.values_mut() {
            d.set_mutation(Some(m));
        }
        world.mutation = Some(m);
    }
    world.replay = format!("{} --mutation {mutation}", world.replay);
    world.start()?;
    world.run()
}

/// A cluster that could not be set up, reported like a broken invariant so that the seed and
/// the replay command are printed the same way.
fn setup_failure(cfg: &SimConfig, e: impl core::fmt::Display) -> SimFailure {
    SimFailure {
        invariant: Invariant::Setup,
        seed: cfg.seed,
        step: 0,
        at: 0,
        detail: e.to_string(),
        replay: cfg.replay_command(),
    }
}

/// The configuration each node starts with when the run begins with its ring changed: epoch 1
/// as the coordinator would publish it, then one seeded server taken off the ring (epoch 2).
/// The coordinator and the servers start on epoch 2; each worker on epoch 1 or 2, by the seed,
/// at least one on epoch 1 so that redirects happen.
fn ring_change_configs(
    cfg: &SimConfig,
) -> Result<BTreeMap<NodeId, ClusterConfig>, pserver_core::ring::RingError> {
    let workers: Vec<NodeId> = cfg.worker_ids().collect();
    let first = ClusterConfig {
        epoch: 1,
        coordinator: cfg.coordinator_id(),
        standbys: Vec::new(),
        term: 0,
        servers: cfg.server_ids().collect(),
        shares: ClusterConfig::deal(&workers, cfg.stragglers.shares_per_worker()),
        workers,
        ring: cfg.ring,
        consistency: cfg.consistency,
        joining: Vec::new(),
        leaving: Vec::new(),
        left: vec![],
        lost: vec![],
        incarnations: Vec::new(),
        pace: Default::default(),
        checkpoints: Default::default(),
    };
    let gone = cfg.server_taken_off().unwrap_or(NodeId(0));
    let second = first.without_server(gone)?;
    let mut configs = BTreeMap::new();
    for id in core::iter::once(cfg.coordinator_id()).chain(cfg.server_ids()) {
        configs.insert(id, second.clone());
    }
    let mut old: Vec<bool> = (0..cfg.workers as u64)
        .map(|i| pserver_core::testing::hash_words(cfg.seed, &[0x4550_4f43, i]) % 2 == 0)
        .collect();
    if !old.contains(&true) {
        let i =
            pserver_core::testing::hash_words(cfg.seed, &[0x004f_4c44]) % cfg.workers.max(1) as u64;
        if let Some(o) = old.get_mut(i as usize) {
            *o = true;
        }
    }
    for (id, old) in cfg.worker_ids().zip(old) {
        let config = if old { &first } else { &second };
        configs.insert(id, config.clone());
    }
    Ok(configs)
}

impl<'a> World<'a> {
    /// A world whose servers hand their update rule every delta negated if `wrong_sign`.
    fn new(cfg: &'a SimConfig, wrong_sign: bool) -> Result<Self, SimFailure> {
        cfg.validate().map_err(|e| setup_failure(cfg, e))?;
        let updater = cfg.resolved_updater();
        let server_rule = ServerRule::new(updater.rule(), wrong_sign);
        let job = cfg.job();
        let start_configs = if cfg.resolved_ring_change() {
            ring_change_configs(cfg).map_err(|e| setup_failure(cfg, e))?
        } else {
            BTreeMap::new()
        };
        let taken_off = cfg.server_taken_off().filter(|_| !start_configs.is_empty());
        let coordinator = match start_configs.get(&cfg.coordinator_id()) {
            Some(config) => Coordinator::resume(job.coordinator_config(), config.clone()),
            None => Coordinator::new(job.coordinator_config()),
        }
        .map_err(|e| setup_failure(cfg, e))?;
        let mut nodes = BTreeMap::new();
        nodes.insert(cfg.coordinator_id(), Driver::new(coordinator));
        if let Some(standby) = cfg.standby_id() {
            let standby_node = Coordinator::standby(job.standby_config(standby))
                .map_err(|e| setup_failure(cfg, e))?;
            nodes.insert(standby, Driver::new(standby_node));
        }
        let server_config = job.server_config(cfg.coordinator_id());
        for id in cfg.server_ids() {
            nodes.insert(
                id,
                Driver::new(Server::new(job.server_config(id), server_rule)),
            );
        }
        for id in cfg.worker_ids() {
            nodes.insert(id, Driver::new(Worker::new(job.worker_config(id))));
        }
        let apps = cfg.worker_ids().map(|id| (id, App::default())).collect();
        // Every invariant is judged against the ring in force: after a ring change, the ring of
        // the servers' (newest) configuration.
        let ring = cfg.ring_in_force().map_err(|e| setup_failure(cfg, e))?;
        let ring_epoch = start_configs
            .get(&cfg.coordinator_id())
            .map_or(1, |c| c.epoch);
        // The failure names the run's resolved choices, so that it says what it ran.
        let replay = SimConfig {
            updater: Some(updater),
            ring_change: Some(!start_configs.is_empty()),
            ..cfg.clone()
        }
        .replay_command();
        Ok(World {
            cfg,
            rng: SimRng::new(cfg.seed),
            now: 0,
            seq: 0,
            steps: 0,
            queue: BinaryHeap::new(),
            wakeups: BTreeMap::new(),
            net: Network::new(cfg.faults, cfg.latency),
            nodes,
            apps,
            ledger: Ledger::new(cfg.keys as usize),
            oracle: Oracle::new(updater.rule(), cfg.consistency == Consistency::Sequential),
            updater,
            server_rule,
            start_configs,
            keys: cfg.key_layout(&ring),
            ring,
            ring_epoch,
            previous_ring: None,
            replicated: cfg.ring.replicas > 0,
            down: BTreeSet::new(),
            started: BTreeMap::new(),
            plan: faults::Plan::new(cfg.seed),
            server_config,
            #[cfg(feature = "mutations")]
            mutation: None,
            redirects: 0,
            pushed_values: 0,
            replicated_values: 0,
            pushed_keys: BTreeSet::new(),
            width: 0,
            codec: Codec::default(),
            replay,
            paces: BTreeMap::new(),
            reply_epochs: BTreeMap::new(),
            pace: PaceReport::default(),
            receiving: BTreeMap::new(),
            slot_grants: 0,
            lists_sent: BTreeMap::new(),
            job_width: job.width,
            ending: false,
            job_finished: None,
            active: cfg.coordinator_id(),
            coordinator_fault_at: None,
            takeovers: Vec::new(),
            // The server a run starts with taken off the ring left it as the dead do: workers
            // that start on the ring before hear that it died.
            declared_dead: taken_off.map(|gone| (gone, 1)).into_iter().collect(),
            heard_dead: BTreeMap::new(),
            configs_seen: BTreeMap::new(),
            highest: BTreeMap::new(),
            policies: policies::PolicyWatch::default(),
        })
    }

    /// The coordinator whose configurations are in force: the first, or the last that took
    /// over (a crashed one until another takes over).
    pub(super) fn coordinator(&self) -> Option<&Coordinator> {
        self.nodes
            .get(&self.active)
            .and_then(|d| d.node().as_coordinator())
    }

    /// Whether `node` is one of the run's coordinators.
    pub(super) fn is_coordinator(&self, node: NodeId) -> bool {
        node == self.cfg.coordinator_id() || Some(node) == self.cfg.standby_id()
    }

    /// Every server process of the run, those that joined while it ran included.
    pub(super) fn server_nodes(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, d)| d.node().as_server().is_some())
            .map(|(&id, _)| id)
            .collect()
    }

    pub(super) fn server(&self, id: NodeId) -> Option<&Server<f64, ServerRule>> {
        self.nodes.get(&id).and_then(|d| d.node().as_server())
    }

    pub(super) fn worker(&self, id: NodeId) -> Option<&Worker<f64>> {
        self.nodes.get(&id).and_then(|d| d.node().as_worker())
    }

    pub(super) fn workers(&self) -> impl Iterator<Item = (NodeId, &Worker<f64>)> {
        self.nodes
            .iter()
            .filter_map(|(&id, d)| Some((id, d.node().as_worker()?)))
    }

    fn schedule(&mut self, at: Time, action: Action) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at,
            seq: self.seq,
            action,
        });
    }

    fn fail(&self, invariant: Invariant, detail: String) -> SimFailure {
        SimFailure {
            invariant,
            seed: self.cfg.seed,
            step: self.steps,
            at: self.now,
            detail,
            replay: self.replay.clone(),
        }
    }

    /// Rough length of a run without faults, to place faults inside it.
    fn horizon(&self) -> Time {
        let per_iteration = self.cfg.compute * 2 + self.cfg.latency * 8;
        per_iteration * u64::from(self.cfg.iterations.max(1))
    }

    fn start(&mut self) -> Result<(), SimFailure> {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            if let Some(d) = self.nodes.get_mut(&id) {
                match self.start_configs.get(&id) {
                    Some(config) => d.start_configured(0, config.clone()),
                    None => d.start(0),
                }
            }
            self.drain(id)?;
        }
        let horizon = self.horizon();
        if self.cfg.faults.partition {
            let nodes: Vec<NodeId> = self.cfg.server_ids().chain(self.cfg.worker_ids()).collect();
            for _ in 0..1 + self.rng.below(3) {
                let node = nodes[self.rng.below(nodes.len() as u64) as usize];
                let at = self.rng.below(horizon);
                let length = 100 * MS + self.rng.below(1_400 * MS);
                self.schedule(at, Action::Isolate(node));
                self.schedule(at + length, Action::Heal(node));
            }
        }
        if self.cfg.faults.crash && self.cfg.workers > 1 {
            let victim = self.rng.below(self.cfg.workers as u64) as usize;
            if let Some(node) = self.cfg.worker_ids().nth(victim) {
                let at = self.rng.below(horizon);
                self.schedule(at, Action::Crash(node));
            }
        }
        self.plan_server_faults();
        if self.cfg.coordinator_faults.crash {
            let at = self.rng.below(horizon);
            self.schedule(at, Action::CrashCoordinator);
        }
        if self.cfg.coordinator_faults.partition {
            let at = self.rng.below(horizon);
            let length = 500 * MS + self.rng.below(4_500 * MS);
            self.schedule(at, Action::IsolateCoordinator(length));
        }
        Ok(())
    }

    fn run(mut self) -> Result<SimReport, SimFailure> {
        while let Some(next) = self.queue.pop() {
            if self.finished() {
                if !self.ending && self.can_end() {
                    self.end_job()?;
                }
                if !self.ending || self.job_finished.is_some() {
                    break;
                }
            }
            self.now = next.at;
            if self.now > self.cfg.time_limit {
                return Err(self.time_out());
            }
            self.steps += 1;
            self.step(next.action)?;
            self.refresh_ring();
            self.check_step()?;
            self.check_slot_limit()?;
            if self.cfg.coordinator_faults.any() {
                self.check_single_coordinator()?;
            }
            self.track_recovery();
        }
        self.check_end()?;
        Ok(self.report())
    }

    /// Whether the job can end once every worker is done: no worker crashed or was fenced,
    /// which may leave a share of the work that no live worker holds.
    fn can_end(&self) -> bool {
        self.apps.values().all(|a| !a.crashed)
    }

    /// Every worker leaves the job, its work done, as the CLI's workers do: the servers and
    /// then the coordinator must say that the job finished ([`Event::JobFinished`]).
    fn end_job(&mut self) -> Result<(), SimFailure> {
        self.ending = true;
        let workers: Vec<NodeId> = self.apps.keys().copied().collect();
        for id in workers {
            if let Some(app) = self.apps.get_mut(&id) {
                app.leaving = true;
            }
            if let Some(d) = self.nodes.get_mut(&id) {
                d.leave().map_err(|e| {
                    self.fail(Invariant::Completion, format!("{id} cannot leave: {e}"))
                })?;
            }
            self.drain(id)?;
        }
        Ok(())
    }

    fn all_done(&self) -> bool {
        self.apps.iter().all(|(&id, app)| {
            app.crashed || (app.done && self.worker(id).is_some_and(|w| w.open_requests() == 0))
        })
    }

    fn stuck_report(&self) -> String {
        let stuck: Vec<String> = self
            .apps
            .iter()
            .filter(|(_, a)| !a.crashed && !a.done)
            .filter_map(|(&id, _)| self.worker(id))
            .map(|w| {
                format!(
                    "{} in iteration {} with {} open requests",
                    w.id(),
                    w.iteration(),
                    w.open_requests()
                )
            })
            .collect();
        format!(
            "run not complete after {}ms of virtual time: {}{}",
            self.now / MS,
            stuck.join("; "),
            self.coordinators_said()
        )
    }

    /// True when the node is a worker or server whose process crashed: it takes no more
    /// input.
    fn is_down(&self, node: NodeId) -> bool {
        self.down.contains(&node) || self.apps.get(&node).is_some_and(|a| a.crashed)
    }

    fn step(&mut self, action: Action) -> Result<(), SimFailure> {
        let now = self.now;
        // A fault planned for after the workers were done would have come after the run,
        // which ended there before jobs ended: the job's end is checked under the faults that
        // came before it (the network's own losses go on).
        let starts_a_fault = matches!(
            action,
            Action::Crash(_)
                | Action::CrashCoordinator
                | Action::IsolateCoordinator(_)
                | Action::Isolate(_)
                | Action::CrashServer(_)
                | Action::FlapStart(_)
                | Action::CutOff(_)
                | Action::JoinServer(_)
                | Action::LeaveServer
        );
        if self.ending && starts_a_fault {
            return Ok(());
        }
        let node = match action {
            Action::Deliver {
                from,
                to,
                sent_at,
                packet,
                redirect,
                received,
                position,
            } => {
                if let Some(rate) = self.cfg.receive_rate.filter(|_| !received)
                    && !self.is_down(to)
                    && self.server(to).is_some()
                {
                    let bytes = match &packet {
                        Packet::Frame(frame) => frame.len(),
                        Packet::Envelope(env) => self.codec.encode(env).map_or(0, |f| f.len()),
                    } as u64;
                    let done = self
                        .receiving
                        .entry(to)
                        .or_default()
                        .arrive(now, bytes, rate);
                    let action = Action::Deliver {
                        from,
                        to,
                        sent_at,
                        packet,
                        redirect,
                        received: true,
                        position,
                    };
                    self.schedule(done, action);
                    return Ok(());
                }
                if !self.is_down(to) {
                    self.count_late(from, to, sent_at);
                    if let Some(at) = position {
                        self.heard_position(from, to, at);
                    }
                    if let Some(d) = self.nodes.get_mut(&to) {
                        // A worker follows a redirect to a newer epoch than its own.
                        if let Some(w) = d.node().as_worker() {
                            if redirect.is_some_and(|e| e > w.epoch()) {
                                self.redirects += 1;
                            }
                        }
                        match packet {
                            Packet::Frame(frame) => d.handle_frame_bytes(now, from, &frame),
                            Packet::Envelope(env) => d.handle_message(now, *env),
                        }
                    }
                }
                to
            }
            Action::Wake(node) => {
                if self.wakeups.get(&node) != Some(&now) {
                    return Ok(());
                }
                self.wakeups.remove(&node);
                if !self.is_down(node) {
                    if let Some(d) = self.nodes.get_mut(&node) {
                        d.handle_timeout(now);
                    }
                }
                node
            }
            Action::ComputeDone(node, generation) => {
                if self
                    .apps
                    .get(&node)
                    .is_some_and(|a| a.generation == generation)
                {
                    self.finish_compute(node);
                }
                node
            }
            Action::Crash(node) => {
                if self.coordinator().is_none_or(|c| c.config().is_none()) {
                    // The coordinator waits for every expected worker before the job starts; a
                    // crash before that is a failed launch, not a fault to tolerate. Try later.
                    self.schedule(now + 10 * MS, Action::Crash(node));
                } else if let Some(app) = self.apps.get_mut(&node) {
                    app.crashed = true;
                }
                node
            }
            Action::Isolate(node) => {
                self.net.isolate(node);
                node
            }
            Action::Heal(node) => {
                self.net.heal(node);
                if self.is_coordinator(node) {
                    // No standby took over while it was cut off: nothing to time.
                    self.coordinator_fault_at = None;
                }
                node
            }
            Action::CrashServer(victim) => match self.crash_server(victim) {
                Some(node) => node,
                None => return Ok(()),
            },
            Action::RestartServer(node) => {
                self.restart_server(node);
                node
            }
            Action::CrashCoordinator => match self.crash_coordinator() {
                Some(node) => node,
                None => return Ok(()),
            },
            Action::RestartCoordinator(node) => {
                self.restart_coordinator(node)?;
                node
            }
            Action::IsolateCoordinator(length) => match self.isolate_coordinator(length) {
                Some(node) => node,
                None => return Ok(()),
            },
            Action::FlapStart(node) => {
                self.plan.happened.flaps += 1;
                self.net.isolate(node);
                node
            }
            Action::CutOff(node) => {
                self.plan.happened.cut_offs += 1;
                let servers = self.server_nodes();
                self.net.cut_off(node, servers);
                node
            }
            Action::Reconnect(node) => {
                self.net.reconnect(node);
                node
            }
            Action::JoinServer(node) => {
                self.join_server(node);
                node
            }
            Action::LeaveServer => match self.leave_server() {
                Some(node) => node,
                None => return Ok(()),
            },
        };
        self.drain(node)
    }

    /// Carries out what a node's driver has for the world: frames onto the network, events to
    /// the worker's application (whose calls may produce more), and a wake-up at its next timer
    /// deadline.
    fn drain(&mut self, node: NodeId) -> Result<(), SimFailure> {
        // A crashed process says nothing more, and its timers never fire.
        if self.is_down(node) {
            self.wakeups.remove(&node);
            return Ok(());
        }
        loop {
            let Some(d) = self.nodes.get_mut(&node) else {
                return Ok(());
            };
            let mut packets = Vec::new();
            let mut events: Vec<Event<f64>> = Vec::new();
            let deadline = loop {
                let output = if self.cfg.wire {
                    d.poll_output().map_frame(Packet::Frame)
                } else {
                    d.poll_output_message()
                        .map_frame(|env| Packet::Envelope(Box::new(env)))
                };
                match output {
                    Output::Transmit(t) => packets.push((t.to, t.frame)),
                    Output::Event(event) => events.push(event),
                    Output::Wait { until } => break until,
                }
            };
            if let Some(Event::Unencodable { to, error }) = events
                .iter()
                .find(|e| matches!(e, Event::Unencodable { .. }))
            {
                return Err(self.fail(Invariant::Codec, format!("{node} -> {to}: {error}")));
            }
            let applied_below = d.node().as_server().map(Server::applied_below);
            for (to, packet) in packets {
                let Observed {
                    redirect,
                    membership,
                    position,
                } = self.observe(node, to, &packet)?;
                let late = (membership && self.cfg.membership_stress).then_some(MEMBERSHIP_LATE);
                for at in self.net.deliveries(&mut self.rng, self.now, node, to, late) {
                    let packet = packet.clone();
                    self.schedule(
                        at,
                        Action::Deliver {
                            from: node,
                            to,
                            sent_at: self.now,
                            packet,
                            redirect,
                            received: false,
                            position,
                        },
                    );
                }
            }
            if let Some(applied_below) = applied_below.filter(|_| !self.replicated) {
                self.oracle
                    .advance(node, applied_below)
                    .map_err(|detail| self.fail(Invariant::Oracle, detail))?;
                self.check_oracle(node, false)?;
            }
            if events.is_empty() {
                if let Some(at) = deadline {
                    // A deadline already past is due now; virtual time never runs back.
                    let at = at.max(self.now);
                    if self.wakeups.get(&node) != Some(&at) {
                        self.wakeups.insert(node, at);
                        self.schedule(at, Action::Wake(node));
                    }
                }
                return Ok(());
            }
            for event in events {
                self.on_event(node, event)?;
            }
        }
    }

    /// Shows the oracle what a node sends: the pushes workers send, and the acknowledgements
    /// servers send (the first for a slice is when the server took it in); and the policy
    /// checks the configurations coordinators send.
    fn observe(
        &mut self,
        from: NodeId,
        to: NodeId,
        packet: &Packet,
    ) -> Result<Observed, SimFailure> {
        let decoded;
        let env = match packet {
            Packet::Envelope(env) => env,
            Packet::Frame(frame) => match self.codec.decode::<f64>(frame) {
                Ok(env) => {
                    decoded = env;
                    &decoded
                }
                Err(e) => {
                    let detail = format!("{from} sent {to} a frame that does not decode: {e}");
                    return Err(self.fail(Invariant::Codec, detail));
                }
            },
        };
        // A push naming a key list is the push of the list's keys: the oracle sees it so.
        let named;
        let body = match &env.body {
            Message::Push(push) => {
                let keys = push.kvs.keys();
                self.lists_sent
                    .entry(KeysDigest::of(keys))
                    .or_insert_with(|| Arc::new(keys.to_vec()));
                &env.body
            }
            Message::Pull(Pull {
                keys: KeySelection::Keys(list),
                ..
            }) => {
                self.lists_sent
                    .entry(KeysDigest::of(list.keys()))
                    .or_insert_with(|| Arc::new(list.keys().to_vec()));
                &env.body
            }
            Message::PushCached(push) => {
                let kvs = self
                    .lists_sent
                    .get(&push.keys)
                    .and_then(|keys| push.values.with_keys(keys, self.job_width));
                let Some(kvs) = kvs else {
                    let detail = format!(
                        "{from} sent {to} a push naming a key list it never sent whole, or values for another number of keys"
                    );
                    return Err(self.fail(Invariant::Oracle, detail));
                };
                named = Message::Push(Push {
                    slice: push.slice,
                    iteration: push.iteration,
                    covers: push.covers,
                    settled_below: push.settled_below,
                    kvs,
                });
                &named
            }
            body => body,
        };
        match body {
            Message::Push(push) => {
                self.pushed_values += push.kvs.values().len() as u64;
                self.width = push.kvs.width() as u64;
                let iteration = push.iteration;
                self.pushed_keys
                    .extend(push.kvs.keys().iter().map(|&k| (iteration, k)));
            }
            Message::Replicate { updates } => {
                self.replicated_values += updates
                    .iter()
                    .map(|u| match &u.update {
                        ShardUpdate::Apply(kvs) | ShardUpdate::Buffer { kvs, .. } => {
                            kvs.values().len() as u64
                        }
                        ShardUpdate::ApplyBelow(_) => 0,
                    })
                    .sum::<u64>();
            }
            _ => {}
        }
        match body {
            Message::Push(push) if !self.replicated => self.oracle.sent(from, to, push),
            Message::PushAck(slice) if !self.replicated && self.server(from).is_some() => self
                .oracle
                .acked(from, to, *slice)
                .map_err(|detail| self.fail(Invariant::Oracle, detail))?,
            Message::Redirect { epoch, .. } => {
                return Ok(Observed {
                    redirect: Some(*epoch),
                    ..Observed::default()
                });
            }
            Message::Heartbeat { at, .. } => {
                return Ok(Observed {
                    position: *at,
                    ..Observed::default()
                });
            }
            Message::Config(config) if self.is_coordinator(from) => {
                self.paces.insert(config.epoch, config.pace.clone());
                self.judge_config(from, config)?;
                self.seen_config(config)?;
            }
            Message::Standby(state) => {
                self.judge_config(from, &state.config)?;
                self.seen_config(&state.config)?;
            }
            Message::PullReply(PullReply { slice, .. })
            | Message::PullValues(PullValues { slice, .. })
            | Message::PullRows(PullRows { slice, .. }) => {
                self.reply_epochs
                    .entry((to, slice.request))
                    .or_default()
                    .insert(env.epoch);
            }
            Message::Transfer(_) => self.copy_sent(to),
            Message::SlotGrant(_) => self.slot_grants += 1,
            Message::TransferAck { range, .. } => self.copy_installed(from, to, *range),
            _ => {}
        }
        let membership = matches!(
            env.body,
            Message::Register { .. }
                | Message::Config(_)
                | Message::ConfigRequest
                | Message::CaughtUp { .. }
                | Message::Leave
                | Message::Transfer(_)
                | Message::TransferAck { .. }
                | Message::Lost(_)
        );
        Ok(Observed {
            membership,
            ..Observed::default()
        })
    }

    fn on_event(&mut self, node: NodeId, event: Event<f64>) -> Result<(), SimFailure> {
        match event {
            Event::Coordinator(CoordinatorEvent::TookOver { .. }) => {
                self.active = node;
                self.policies.took_over(node);
                if let Some(at) = self.coordinator_fault_at.take() {
                    self.takeovers.push(self.now - at);
                }
                return Ok(());
            }
            // Members hear of deaths too; the coordinator's declaration is the one that counts.
            Event::NodeDead(dead) if self.is_coordinator(node) => {
                *self.declared_dead.entry(dead).or_default() += 1;
                self.worker_out(node, dead);
                self.node_dead(dead);
                return Ok(());
            }
            Event::NodeDead(dead) => {
                let heard = self.heard_dead.entry((node, dead)).or_default();
                *heard += 1;
                let declared = self.declared_dead.get(&dead).copied().unwrap_or(0);
                if *heard > declared {
                    let detail = format!(
                        "{node} said {heard} times that {dead} died, declared dead {declared} times"
                    );
                    return Err(self.fail(Invariant::HeardDead, detail));
                }
                return Ok(());
            }
            Event::Coordinator(CoordinatorEvent::WorkerLeft(worker)) => {
                self.worker_out(node, worker);
                return Ok(());
            }
            Event::Coordinator(CoordinatorEvent::Straggler { .. }) => {
                self.pace.flagged += 1;
                return Ok(());
            }
            Event::Coordinator(CoordinatorEvent::ShareMoved { share, from, to }) => {
                self.pace.shares_moved += 1;
                return self.share_moved(node, share, from, to);
            }
            Event::Coordinator(CoordinatorEvent::TauChanged { to, .. }) => {
                self.pace.tau_changes += 1;
                self.pace.max_tau = self.pace.max_tau.max(to);
                return Ok(());
            }
            Event::JobFinished { .. } => {
                // A node that stops while a worker still has work would leave it undone.
                if let Some((&w, _)) = self.apps.iter().find(|(_, a)| !a.leaving && !a.crashed) {
                    return Err(self.fail(
                        Invariant::Completion,
                        format!("{node} said the job finished while {w} was still at work"),
                    ));
                }
                if self.coordinator().is_some_and(|c| c.id() == node) {
                    self.job_finished.get_or_insert(self.now);
                }
                return Ok(());
            }
            _ => {}
        }
        if matches!(event, Event::Fenced) && self.server(node).is_some() {
            self.plan.leaving.remove(&node);
            return Ok(());
        }
        if let Event::Refused { from, reason } = &event {
            // The simulated network never corrupts or forges: a frame that does not decode is
            // a codec bug.
            if let Refusal::Undecodable(e) = reason {
                let detail = format!("{node} could not decode a frame from {from}: {e}");
                return Err(self.fail(Invariant::Codec, detail));
            }
            return Ok(());
        }
        if self.apps.get(&node).is_none_or(|a| a.crashed) {
            return Ok(());
        }
        match event {
            Event::Ready { .. } => self.begin_iteration(node),
            Event::Worker(WorkerEvent::PullDone(id, kvs)) => {
                let Some((iteration, asked)) =
                    self.apps.get_mut(&node).and_then(|a| a.pulls.remove(&id))
                else {
                    return Err(self.fail(
                        Invariant::PullComplete,
                        format!("{node} reported pull {id} done twice or never issued it"),
                    ));
                };
                self.check_pull(node, id, iteration, &asked, &kvs)?;
                // A pull of work a skip dropped is checked, and nothing more.
                if self.apps.get(&node).and_then(|a| a.current) == Some(id) {
                    self.start_part(node, iteration);
                }
            }
            Event::Worker(WorkerEvent::PushDone(_)) => {}
            Event::Worker(WorkerEvent::PushDurable(id)) => {
                let keys = &self.keys;
                if !self.ledger.ack(node, id, |k| index_of(keys, k)) {
                    return Err(self.fail(
                        Invariant::ExactlyOnce,
                        format!("{node} reported push {id} done twice or never issued it"),
                    ));
                }
            }
            Event::Worker(WorkerEvent::Advanced(iteration)) => self.enter(node, iteration),
            Event::Worker(WorkerEvent::SkippedAhead { from, to, covered }) => {
                self.pace.skips += 1;
                self.pace.skipped_iterations += u64::from(to - from);
                if covered > Coverage(0) {
                    self.pace.parts_kept += 1;
                }
                // An application waiting on `advance` hears `Advanced` next; any other drops
                // what it was doing and starts the iteration it was moved to.
                if self.apps.get(&node).is_some_and(|a| !a.advancing) {
                    self.enter(node, to);
                }
            }
            Event::Fenced => {
                if let Some(app) = self.apps.get_mut(&node) {
                    if app.leaving {
                        app.left = true;
                    } else {
                        app.crashed = true;
                    }
                }
            }
            // Nothing else changes what the workload does next; refusals were counted above.
            _ => {}
        }
        Ok(())
    }

    /// The worker's application enters `iteration`: it is done past the last, or starts the
    /// iteration's work.
    fn enter(&mut self, node: NodeId, iteration: Iteration) {
        if iteration >= self.cfg.iterations {
            // A worker moved past the end skipped its last iteration's flush.
            self.flush(node);
            if let Some(app) = self.apps.get_mut(&node) {
                app.done = true;
                app.current = None;
                app.generation += 1;
                app.finished_at = Some(self.now);
            }
        } else {
            self.begin_iteration(node);
        }
    }

    /// Computes the next part of the iteration's work.
    fn start_part(&mut self, node: NodeId, iteration: Iteration) {
        let parts = self.cfg.parts.max(1);
        let duration = self.compute_time(node, iteration) / u64::from(parts);
        let Some(app) = self.apps.get_mut(&node) else {
            return;
        };
        app.busy += duration;
        let generation = app.generation;
        self.schedule(self.now + duration, Action::ComputeDone(node, generation));
    }

    fn compute_time(&mut self, node: NodeId, iteration: Iteration) -> Time {
        let jitter = self.rng.below(self.cfg.compute / 5 + 1);
        let base = self.cfg.compute + jitter;
        let slow = pserver_core::testing::hash_words(self.cfg.seed, &[u64::from(iteration)])
            % self.cfg.workers as u64;
        let index = u64::from(node.0) - self.cfg.servers as u64 - 1;
        let mut factor = if slow == index {
            self.cfg.straggler
        } else {
            1.0
        };
        if index == self.cfg.slow_index as u64 {
            factor *= self.cfg.slow_worker;
            if iteration >= self.cfg.iterations / 2 {
                factor *= self.cfg.slows_down;
            }
        }
        let factor = factor.max(1.0);
        // An iteration's work is a step of every share held: the job's work is the same
        // however it is cut, and a worker holding more shares computes longer.
        let per_worker = self.cfg.stragglers.shares_per_worker() as f64;
        let held = self.nodes.get_mut(&node).map_or(per_worker, |driver| {
            // The application knows its own speed: shares' work per second of compute.
            if let Ok(mut worker) = driver.worker() {
                worker.report_speed((1_000_000.0 / factor) as u32);
            }
            driver
                .node()
                .as_worker()
                .map_or(per_worker, |w| w.shares().len() as f64)
        });
        (base as f64 * factor * held / per_worker) as Time
    }

    /// Pulls the keys of the iteration: a random subset, or now and then the whole key space as
    /// one dense range.
    fn begin_iteration(&mut self, node: NodeId) {
        let keys: Vec<u64> = (0..self.cfg.keys)
            .filter(|_| self.rng.chance(0.5))
            .collect();
        let selection = if self.rng.chance(0.25) {
            let last = self.keys.last().copied().unwrap_or(0);
            let all = KeyRange::new(0, last + 1);
            match all.ok().and_then(|r| RangeList::new(vec![r]).ok()) {
                Some(list) => KeySelection::Ranges(list),
                None => KeySelection::Keys(KeyList::default()),
            }
        } else {
            let list: Vec<u64> = keys.iter().map(|&i| self.keys[i as usize]).collect();
            KeySelection::Keys(KeyList::new(list).unwrap_or_default())
        };
        let now = self.now;
        let Some(driver) = self.nodes.get_mut(&node) else {
            return;
        };
        let iteration = driver.node().as_worker().map_or(0, Worker::iteration);
        if let Ok(id) = driver
            .worker()
            .and_then(|mut w| w.pull(now, selection.clone()))
        {
            if let Some(app) = self.apps.get_mut(&node) {
                app.keys = keys;
                app.pulls.insert(id, (iteration, selection));
                app.current = Some(id);
                app.generation += 1;
                app.parts_done = 0;
                app.advancing = false;
            }
        }
    }

    /// A part of the iteration's compute is done: its values are pushed (for the keys of the
    /// iteration, the part's share of them), and after the last part the worker advances.
    fn finish_compute(&mut self, node: NodeId) {
        let Some(app) = self.apps.get(&node).filter(|a| !a.crashed) else {
            return;
        };
        let parts = self.cfg.parts.max(1);
        let part = app.parts_done;
        // Part `p` pushes every `parts`-th key from the `p`-th: the parts cover the keys once.
        let keys: Vec<u64> = app
            .keys
            .iter()
            .skip(part as usize)
            .step_by(parts as usize)
            .map(|&i| self.keys[i as usize])
            .collect();
        // Small integers: exact in f64, so that sums stay exact whatever their order.
        let values: Vec<f64> = keys
            .iter()
            .map(|_| (1 + self.rng.below(100)) as f64)
            .collect();
        let Ok(kvs) = KvPairs::new(keys, values, 1) else {
            return;
        };
        let now = self.now;
        let Some(driver) = self.nodes.get_mut(&node) else {
            return;
        };
        let iteration = driver.node().as_worker().map_or(0, Worker::iteration);
        let last = part + 1 >= parts;
        let covers = Coverage::parts(part + 1, parts);
        let pushed = driver
            .worker()
            .and_then(|mut w| w.push_part(now, kvs.clone(), covers));
        if let Ok(id) = pushed {
            self.issue(node, id, iteration);
            if let Some(app) = self.apps.get_mut(&node) {
                for (k, v) in kvs.iter() {
                    *app.computed.entry(index_of(&self.keys, k)).or_default() += v[0] as i64;
                }
            }
        }
        if let Some(app) = self.apps.get_mut(&node) {
            app.parts_done = part + 1;
            app.advancing = last;
        }
        if last && iteration + 1 >= self.cfg.iterations {
            // The last iteration: what the filters held back goes with it.
            self.flush(node);
        }
        if last {
            // The scripted application ignores a refused advance: the worker was fenced.
            if let Some(driver) = self.nodes.get_mut(&node) {
                let _ = driver.worker().and_then(|mut w| w.advance(now));
            }
        } else {
            self.start_part(node, iteration);
        }
    }

    /// Enters push `id` of `node` in the ledger with the rows its request carries: what the
    /// job's filters passed of the application's push (nothing, if they held it all back).
    fn issue(&mut self, node: NodeId, id: RequestId, iteration: Iteration) {
        let Some(rows) = self
            .nodes
            .get(&node)
            .and_then(|d| d.node().as_worker())
            .and_then(|w| w.push_rows(id))
            .or_else(|| KvPairs::empty(1).ok())
        else {
            return;
        };
        let keys = &self.keys;
        self.ledger
            .issue(node, id, iteration, &rows, |k| index_of(keys, k));
    }

    /// Pushes what `node`'s filters hold, in its current iteration.
    fn flush(&mut self, node: NodeId) {
        let now = self.now;
        let Some(driver) = self.nodes.get_mut(&node) else {
            return;
        };
        let iteration = driver.node().as_worker().map_or(0, Worker::iteration);
        if let Ok(Some(id)) = driver.worker().and_then(|mut w| w.flush(now)) {
            self.issue(node, id, iteration);
        }
    }

    fn report(&self) -> SimReport {
        let finish = self
            .apps
            .values()
            .filter_map(|a| a.finished_at)
            .max()
            .unwrap_or(self.now);
        let idle: Vec<f64> = self
            .apps
            .values()
            .filter_map(|a| {
                let end = a.finished_at?;
                (end > 0).then(|| 1.0 - a.busy as f64 / end as f64)
            })
            .collect();
        let idle_fraction = if idle.is_empty() {
            0.0
        } else {
            idle.iter().sum::<f64>() / idle.len() as f64
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        // Node state holding f64 is not `Hash`; its debug form names every value exactly (the
        // shortest text that reads back to the same bits).
        for d in self.nodes.values() {
            format!("{:?}", d.node()).hash(&mut h);
        }
        SimReport {
            steps: self.steps,
            finish,
            idle_fraction,
            messages: self.net.sent,
            dropped: self.net.dropped,
            crashed: self.apps.values().filter(|a| a.crashed).count(),
            redirects: self.redirects,
            updater: self.updater,
            ring_change: !self.start_configs.is_empty(),
            server_faults: self.plan.happened,
            recoveries: self.plan.recoveries.clone(),
            pushed_values: self.pushed_values,
            replicated_values: self.replicated_values,
            aggregate_values: self.pushed_keys.len() as u64 * self.width,
            pace: PaceReport {
                max_tau: self
                    .pace
                    .max_tau
                    .max(self.cfg.consistency.tau().unwrap_or(0)),
                ..self.pace
            },
            peak_receive_queue_bytes: self.receiving.values().map(|q| q.peak).max().unwrap_or(0),
            slot_grants: self.slot_grants,
            filter_savings: self
                .nodes
                .values()
                .flat_map(|d| {
                    d.node()
                        .as_worker()
                        .map(Worker::filter_savings)
                        .unwrap_or_default()
                })
                .fold(BTreeMap::new(), |mut sums, (name, s)| {
                    sums.entry(name).or_default().add(s);
                    sums
                }),
            fingerprint: h.finish(),
            takeovers: self.takeovers.clone(),
        }
    }
}
