//! The coordinator: the paper's server manager. It owns membership, the ring and the epoch
//! (ARCHITECTURE.md §2, §8).
//!
//! # Failure
//!
//! The coordinator declares a server silent past the heartbeat timeout dead and publishes a new
//! epoch without it (`ClusterConfig::without_server`), in which each of its ranges passes to its
//! first replica. Servers left too few for the ring's `k` replicas hold as many as they can
//! (`Ring::surviving`: two servers with one replica go on as one), said with
//! `crate::events::CoordinatorEvent::ReplicasChanged` at every change, and a server that registers again restores them. A
//! server is kept, with `Event::RingDegraded`, when it is the last, or when the servers left would
//! hold fewer replicas than `CoordinatorConfig::min_replicas`.
//!
//! # Membership changes
//!
//! A change of servers takes two epochs (`Phase`). First the coordinator publishes the
//! configuration with the change listed (`ClusterConfig::joining`, `leaving`): the ring in force is
//! unchanged, and the servers the next ring gives ranges they do not hold yet copy and follow them.
//! Once every server of the next ring reported `CaughtUp`, it publishes the next ring. A crash
//! during a change removes the server from the change; a change the servers left cannot complete is
//! called off. A `Leave` is taken only at the epoch in force: a crashed server's messages may still
//! be on the network after it restarted, and an earlier process's `Leave` must not take the new one
//! out.
//!
//! A server registering while the job runs joins this way: a new machine, a server declared dead
//! that came back, or a process that restarted and lost its state (it registers with a new
//! `ServerConfig::incarnation`, is taken off the ring and joins again). Every configuration names
//! the incarnation each server member registered with (`ClusterConfig::incarnations`), and the
//! coordinator refuses a registration from an earlier incarnation than the last it took (a late
//! resend).
//!
//! Workers have no data to move: a worker registering while the job runs joins in the next epoch
//! (`crate::worker`'s progress says where it starts). A worker that calls `Worker::leave` is
//! removed at once, listed in `ClusterConfig::left` (`crate::events::CoordinatorEvent::WorkerLeft` here), and fenced, which
//! is its confirmation.

mod standby;

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use standby::{Fence, Mode, Renewal};

use crate::cluster::Cluster;
use crate::consistency::Consistency;
use crate::effects::{CoordinatorEvent, Effects, Event, Refusal, TimerId};
use crate::ids::{Epoch, Iteration, NodeId, Role, Standbys, Time};
use crate::key::{Key, KeyRange};
use crate::pace::{self, Pace, PaceWatch, StragglerPolicy};
use crate::ring::{Ring, RingConfig, RingError};
use crate::status::{ClusterStatus, NodeState, NodeStatus, Phase};
use crate::timing::Timing;
use crate::value::Value;
use crate::wire::{Checkpoints, ClusterConfig, Envelope, Message};

/// What the coordinator is told at start: the shape of the job. Build it with
/// [`CoordinatorConfig::new`] and change the fields that differ from the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CoordinatorConfig {
    /// This coordinator.
    pub id: NodeId,
    /// Servers to wait for before the first configuration.
    pub servers: usize,
    /// Workers to wait for before the first configuration.
    pub workers: usize,
    /// How the ring is built.
    pub ring: RingConfig,
    /// The job's consistency model.
    pub consistency: Consistency,
    /// Timeouts and intervals.
    pub timing: Timing,
    /// How stragglers are told and dealt with (ARCHITECTURE.md §9). Default: not at all.
    pub stragglers: StragglerPolicy,
    /// The fewest replicas a key may be left with when servers crash or leave (at most the
    /// ring's `k`). Default 0: the job goes on as long as one server holds each range, with
    /// [`crate::events::CoordinatorEvent::ReplicasChanged`] at every change. A server whose loss would leave fewer is
    /// kept on the ring ([`Event::RingDegraded`]) and the job waits for it.
    pub min_replicas: u32,
    /// The job's other coordinators (ARCHITECTURE.md §11). The active one takes one of them
    /// as its standby, which holds its state and takes over when it goes silent; the others
    /// wait to be taken. Default: none, and the job ends with its coordinator.
    pub peers: Standbys,
    /// Iterations between whole-job checkpoints ([`crate::wire::Checkpoints`]). Default 0:
    /// none.
    pub checkpoint_every: Iteration,
}

impl CoordinatorConfig {
    /// A job of `servers` servers and `workers` workers: sequential consistency, the default
    /// ring and timing.
    pub fn new(id: NodeId, servers: usize, workers: usize) -> Self {
        CoordinatorConfig {
            id,
            servers,
            workers,
            ring: RingConfig::default(),
            consistency: Consistency::Sequential,
            timing: Timing::default(),
            stragglers: StragglerPolicy::default(),
            min_replicas: 0,
            checkpoint_every: 0,
            peers: Standbys::default(),
        }
    }
}

/// Why a coordinator could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoordinatorError {
    /// The servers expected cannot form the ring asked for.
    #[error("cannot build the ring for {servers} servers: {source}")]
    Ring {
        /// Servers expected.
        servers: usize,
        /// Why the ring is impossible.
        #[source]
        source: RingError,
    },
    /// A job needs at least one worker.
    #[error("a job needs at least one worker")]
    NoWorkers,
    /// A job needs at least one server.
    #[error("a job needs at least one server")]
    NoServers,
    /// `min_replicas` above the ring's replicas: no ring could ever be kept.
    #[error("min_replicas {min} is more than the ring's {replicas} replicas")]
    MinReplicas {
        /// The fewest replicas asked to keep.
        min: u32,
        /// The ring's replicas.
        replicas: u32,
    },
}

/// The coordinator node (sans-IO).
///
/// Waits until the expected servers and workers have registered, then publishes epoch 1 (the
/// members, the ring configuration and the consistency model). Afterwards it answers every
/// registration, configuration request and stale heartbeat with the current configuration, and
/// removes nodes that stay silent past the heartbeat timeout, publishing a new epoch.
///
/// A server removed from the ring passes each of its ranges to the range's first replica, which
/// holds the data already (ARCHITECTURE.md §8); servers left too few for the ring's replicas
/// hold fewer ([`crate::events::CoordinatorEvent::ReplicasChanged`]). A server is kept, however silent, when no server or
/// fewer than [`CoordinatorConfig::min_replicas`] replicas would be left:
/// [`Event::RingDegraded`] says so.
///
/// Membership changes while the job runs in two steps ([`Phase`]). A server that registers
/// once the job runs (a new one, one declared dead, or one that restarted and lost its state)
/// and a server that asks to leave are first listed in a configuration as joining or leaving;
/// the servers the next ring gives a range they do not hold copy it and follow its updates,
/// and report [`Message::CaughtUp`]. Only when all have does the coordinator publish the next
/// ring, so that no range is given to a server without its data, and a leaving server keeps
/// serving until its ranges are held elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coordinator {
    cfg: CoordinatorConfig,
    members: BTreeMap<NodeId, Role>,
    config: Option<ClusterConfig>,
    /// Failure checks in a row each member has been silent for. Counting checks instead of
    /// storing arrival times keeps the state bounded, which the model checker needs.
    silent_checks: BTreeMap<NodeId, u64>,
    dead: BTreeSet<NodeId>,
    /// Silent servers kept on the ring because too few would be left without them, each
    /// reported once ([`Event::RingDegraded`]) until it is heard from again.
    kept_silent: BTreeSet<NodeId>,
    /// Servers that asked to be taken off the ring (to leave, or restarted) but could not be,
    /// each reported once until a configuration is published.
    kept_asking: BTreeSet<NodeId>,
    /// Servers that reported catching up with the change of the current epoch.
    caught_up: BTreeSet<NodeId>,
    /// The incarnation each node last registered with.
    incarnations: BTreeMap<NodeId, u64>,
    /// Where workers reported they are, to tell stragglers.
    pace_watch: PaceWatch,
    /// Workers found lagging at the last check.
    stragglers: BTreeSet<NodeId>,
    /// The bounds below which the workers that registered before the job started said their
    /// keys lie ([`crate::JobSpec::keys_below`]).
    keys_below: BTreeMap<NodeId, Key>,
    /// The first epoch of the configurations in a row that say the job finished
    /// ([`ClusterConfig::job_finished`]), if the one in force does.
    finished_since: Option<Epoch>,
    /// The servers heard from at `finished_since` or later: they hold a configuration that
    /// says so, and stop.
    finished_heard: BTreeSet<NodeId>,
    /// Whether [`Event::JobFinished`] was said for `finished_since`.
    finish_said: bool,
    /// Active, standby, or asking members for a term (ARCHITECTURE.md §11).
    mode: Mode,
    /// The configuration members may hold: the last one every standby acknowledged (the one
    /// decided, `config`, once they have).
    published: Option<ClusterConfig>,
    /// The highest term this coordinator knows of.
    term_seen: u64,
    /// Per standby: the epoch it last acknowledged, and failure checks since it was heard.
    standby_acks: BTreeMap<NodeId, (Epoch, u64)>,
    /// Per standby: the voters of each configuration it may hold as its latest, by epoch. A
    /// standby dropped may still ask members for a term with any of them.
    may_hold: BTreeMap<NodeId, BTreeMap<Epoch, Vec<NodeId>>>,
    /// Per standby: the newest configuration it is known to hold.
    standby_holds: BTreeMap<NodeId, ClusterConfig>,
    /// Set after publishing a configuration that dropped a standby: nothing more is published
    /// until a majority of members hold it.
    fence: Option<Fence>,
    /// The active coordinator asking for a newer term of its own: members granted a standby
    /// a term it did not win.
    renewing: Option<Renewal>,
    /// Set at a failure check that heard fewer than a majority of the voters: the silence it
    /// counts since is this coordinator's own, not the members'.
    cut_off: bool,
    /// The members heard since the last failure check.
    heard_since_check: BTreeSet<NodeId>,
    /// Before the job starts: per server started to resume, the checkpoints it holds whole.
    offered_cuts: BTreeMap<NodeId, Vec<Iteration>>,
    /// Per server, the last cut it took a copy of every shard of, and the epoch it held then
    /// ([`Message::CheckpointTaken`]; a cut written was taken too).
    cut_taken: BTreeMap<NodeId, (Iteration, Epoch)>,
    /// Per server, the last cut it wrote, still holding the ranges it copied, and the epoch
    /// it held then ([`Message::Checkpointed`]).
    cut_written: BTreeMap<NodeId, (Iteration, Epoch)>,
    /// The epoch of the last configuration that changed more than the pace: what a server
    /// said of its ranges before it is of ranges it may no longer hold.
    ring_since: Epoch,
    #[cfg(feature = "mutations")]
    mutation: Option<crate::mutation::Mutation>,
}

impl Coordinator {
    /// A coordinator for a job of the given shape.
    pub fn new(cfg: CoordinatorConfig) -> Result<Self, CoordinatorError> {
        let probe = (0..cfg.servers).map(|i| NodeId(i as u32));
        Ring::new(probe, cfg.ring).map_err(|source| CoordinatorError::Ring {
            servers: cfg.servers,
            source,
        })?;
        Coordinator::with_ring_checked(cfg)
    }

    /// A coordinator for `cfg`, whose ring was checked by the caller.
    fn with_ring_checked(cfg: CoordinatorConfig) -> Result<Self, CoordinatorError> {
        if cfg.workers == 0 {
            return Err(CoordinatorError::NoWorkers);
        }
        if cfg.min_replicas > cfg.ring.replicas {
            return Err(CoordinatorError::MinReplicas {
                min: cfg.min_replicas,
                replicas: cfg.ring.replicas,
            });
        }
        Ok(Coordinator {
            cfg,
            members: BTreeMap::new(),
            config: None,
            silent_checks: BTreeMap::new(),
            dead: BTreeSet::new(),
            kept_silent: BTreeSet::new(),
            kept_asking: BTreeSet::new(),
            caught_up: BTreeSet::new(),
            incarnations: BTreeMap::new(),
            pace_watch: PaceWatch::default(),
            stragglers: BTreeSet::new(),
            keys_below: BTreeMap::new(),
            finished_since: None,
            finished_heard: BTreeSet::new(),
            finish_said: false,
            mode: Mode::Active,
            published: None,
            term_seen: 0,
            standby_acks: BTreeMap::new(),
            may_hold: BTreeMap::new(),
            standby_holds: BTreeMap::new(),
            fence: None,
            renewing: None,
            cut_off: false,
            heard_since_check: BTreeSet::new(),
            offered_cuts: BTreeMap::new(),
            cut_taken: BTreeMap::new(),
            cut_written: BTreeMap::new(),
            ring_since: 0,
            #[cfg(feature = "mutations")]
            mutation: None,
        })
    }

    /// A coordinator whose members are known up front (static membership): epoch 1 is in force
    /// from the start, with `servers` and `workers` as members, and nodes can be started with
    /// [`Coordinator::config`] instead of registering.
    pub fn bootstrapped(
        cfg: CoordinatorConfig,
        servers: &[NodeId],
        workers: &[NodeId],
    ) -> Result<Self, CoordinatorError> {
        let mut c = Coordinator::new(CoordinatorConfig {
            servers: servers.len(),
            workers: workers.len(),
            ..cfg
        })?;
        if servers.is_empty() {
            return Err(CoordinatorError::NoServers);
        }
        let roles = servers
            .iter()
            .map(|&s| (s, Role::Server))
            .chain(workers.iter().map(|&w| (w, Role::Worker)));
        c.members.extend(roles);
        // Every node is handed the configuration directly, so there is nothing to broadcast.
        c.publish_when_complete::<i64>(&mut Effects::new());
        Ok(c)
    }

    /// A coordinator taking over a job whose configuration `config` is in force (its servers
    /// and workers are the members); nodes are started with that configuration or learn it
    /// when they ask.
    pub fn resume(cfg: CoordinatorConfig, config: ClusterConfig) -> Result<Self, CoordinatorError> {
        if config.servers.is_empty() {
            return Err(CoordinatorError::NoServers);
        }
        // The configuration in force may hold fewer replicas than its ring asks for, after
        // crashes; a job that starts may not.
        config
            .ring_in_force()
            .map_err(|source| CoordinatorError::Ring {
                servers: config.servers.len(),
                source,
            })?;
        let mut c = Coordinator::with_ring_checked(CoordinatorConfig {
            id: config.coordinator,
            servers: config.servers.len(),
            workers: config.workers.len(),
            ring: config.ring,
            consistency: config.consistency,
            ..cfg
        })?;
        let roles = config
            .servers
            .iter()
            .map(|&s| (s, Role::Server))
            .chain(config.workers.iter().map(|&w| (w, Role::Worker)));
        c.members.extend(roles);
        c.incarnations.extend(config.incarnations.iter().copied());
        c.term_seen = config.term;
        c.published = Some(config.clone());
        c.config = Some(config);
        Ok(c)
    }

    /// The iteration each live worker last said it is in, where workers say so
    /// ([`crate::JobSpec::report_progress`], or a straggler policy); empty otherwise.
    pub fn progress(&self) -> BTreeMap<NodeId, crate::ids::Iteration> {
        let Some(config) = &self.config else {
            return BTreeMap::new();
        };
        config
            .workers
            .iter()
            .filter(|w| self.pace_watch.has_reported(**w))
            .map(|&w| (w, self.pace_watch.iteration_of(w)))
            .collect()
    }

    /// Where the job stands: every node the coordinator knows and what it knows of it, the
    /// epoch, lost ranges and replicas, for an operator.
    pub fn status(&self) -> ClusterStatus {
        let allowed = self.cfg.timing.missed_checks_allowed();
        let state_of = |node: NodeId| -> NodeState {
            let Some(config) = &self.config else {
                return NodeState::Registered;
            };
            if self.dead.contains(&node) {
                return NodeState::Dead;
            }
            let member = config.workers.contains(&node)
                || config.servers.contains(&node)
                || config.joining.contains(&node);
            if !member {
                // A worker that left, or a server whose leaving completed.
                return NodeState::Left;
            }
            if self.kept_silent.contains(&node) {
                return NodeState::Kept;
            }
            let missed = self.silent_checks.get(&node).copied().unwrap_or(0);
            if missed * 2 > allowed.max(1) {
                return NodeState::Silent;
            }
            if config.joining.contains(&node) {
                NodeState::Joining
            } else if config.leaving.contains(&node) {
                NodeState::Leaving
            } else {
                NodeState::Live
            }
        };
        let nodes = self
            .members
            .iter()
            .map(|(&id, &role)| NodeStatus {
                id,
                role,
                state: state_of(id),
            })
            .collect();
        let config = self.published.as_ref();
        ClusterStatus {
            coordinator: self.cfg.id,
            term: config.map_or(0, |c| c.term),
            active: self.mode == Mode::Active,
            epoch: self.epoch(),
            phase: self.phase(),
            nodes,
            lost: config.map_or_else(Vec::new, |c| c.lost.clone()),
            replicas_held: config.map_or(self.cfg.ring.replicas, ClusterConfig::replicas_held),
            replicas_asked: self.cfg.ring.replicas,
            checkpoints: config.map_or_else(
                || Checkpoints {
                    every: self.cfg.checkpoint_every,
                    ..Checkpoints::default()
                },
                |c| c.checkpoints,
            ),
            finished: self.finish_said,
        }
    }

    /// This coordinator's id.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// The configuration in force, once published: what members hold. A standby's is the
    /// last the active one sent it.
    pub fn config(&self) -> Option<&ClusterConfig> {
        match self.mode {
            Mode::Active => self.published.as_ref(),
            _ => self.config.as_ref(),
        }
    }

    /// The epoch of [`Coordinator::config`], 0 before the first configuration.
    pub fn epoch(&self) -> Epoch {
        self.config().map_or(0, |c| c.epoch)
    }

    /// The epoch of the configuration decided last, published or waiting for the standby.
    fn decided_epoch(&self) -> Epoch {
        self.config.as_ref().map_or(0, |c| c.epoch)
    }

    /// Nodes declared dead (feature `testing`; a driver reports [`crate::Event::NodeDead`]).
    #[cfg(feature = "testing")]
    pub fn dead(&self) -> &BTreeSet<NodeId> {
        &self.dead
    }

    fn is_server(&self, node: NodeId) -> bool {
        self.config
            .as_ref()
            .is_some_and(|c| c.servers.contains(&node) || c.joining.contains(&node))
    }

    fn is_worker(&self, node: NodeId) -> bool {
        self.config
            .as_ref()
            .is_some_and(|c| c.workers.contains(&node))
    }

    /// A worker registering while the job runs joins it at once: it has nothing to copy, and
    /// the servers count it as having finished what the others had (it asks them where to
    /// start).
    fn admit_worker<V: Value>(&mut self, worker: NodeId, out: &mut Effects<V>) {
        let Some(config) = &self.config else {
            return;
        };
        let mut next = config.clone();
        next.workers.push(worker);
        next.workers.sort_unstable();
        // Back in the job, its shares are its own again.
        next.left.retain(|&w| w != worker);
        self.dead.remove(&worker);
        self.silent_checks.remove(&worker);
        self.members.insert(worker, Role::Worker);
        self.publish(next, out);
    }

    /// A server lost `ranges` with their holders: the next configuration lists them, so that
    /// every member hears of it ([`ClusterConfig::lost`]). A report of ranges listed already
    /// is answered with the configuration, which is its acknowledgement.
    fn list_lost<V: Value>(&mut self, server: NodeId, ranges: Vec<KeyRange>, out: &mut Effects<V>) {
        let Some(config) = &self.config else {
            return;
        };
        let mut next = config.clone();
        let mut new = false;
        for range in ranges {
            if let Err(at) = next.lost.binary_search(&range) {
                next.lost.insert(at, range);
                out.emit(Event::RangeLost(range));
                new = true;
            }
        }
        if new {
            self.publish(next, out);
        } else {
            self.send_config(server, out);
        }
    }

    /// A worker asking to leave is removed at once, and its shares with it: they pass to
    /// nobody, as a dead worker's would. Its last job is to be fenced.
    fn remove_worker<V: Value>(&mut self, worker: NodeId, out: &mut Effects<V>) {
        let Some(config) = &self.config else {
            return;
        };
        let mut next = config.clone();
        next.workers.retain(|&w| w != worker);
        if let Err(at) = next.left.binary_search(&worker) {
            next.left.insert(at, worker);
        }
        self.silent_checks.remove(&worker);
        out.emit(Event::Coordinator(CoordinatorEvent::WorkerLeft(worker)));
        self.publish(next, out);
    }

    /// Where the job's membership stands.
    pub fn phase(&self) -> Phase {
        match &self.config {
            None => Phase::Forming,
            Some(c) if c.is_changing() => Phase::Reconfiguring,
            Some(_) => Phase::Running,
        }
    }

    /// Starts failure detection. Call once, first.
    pub fn start<V: Value>(&mut self, now: Time, out: &mut Effects<V>) {
        out.set_timer(
            TimerId::FailureCheck,
            now + self.cfg.timing.heartbeat_interval,
        );
    }

    fn send_config<V: Value>(&self, to: NodeId, out: &mut Effects<V>) {
        if let Some(config) = &self.published {
            let body = Message::Config(config.clone());
            out.send(Envelope::new(self.cfg.id, to, config.epoch, body));
        }
    }

    /// Sends the configuration to every member, the dead included: a worker wrongly suspected
    /// learns that it was removed and stops.
    fn broadcast<V: Value>(&self, out: &mut Effects<V>) {
        for &node in self.members.keys() {
            self.send_config(node, out);
        }
    }

    /// Call for every message addressed to the coordinator.
    pub fn on_message<V: Value>(&mut self, _now: Time, env: Envelope<V>, out: &mut Effects<V>) {
        let from = env.from;
        if env.to != self.cfg.id {
            return out.refuse(from, Refusal::Misaddressed { to: env.to });
        }
        match env.body {
            Message::Standby(state) => return self.on_standby_state(from, *state, out),
            Message::StandbyAck { term, epoch } => {
                return self.on_standby_ack(from, term, epoch, out);
            }
            Message::TermGrant { term, config } => return self.on_grant(from, term, *config, out),
            body if self.mode != Mode::Active => return self.as_standby(from, body, out),
            _ => {}
        }
        self.silent_checks.remove(&from);
        self.heard_since_check.insert(from);
        self.kept_silent.remove(&from);
        match env.body {
            Message::Register {
                role,
                incarnation,
                keys_below,
                checkpoints,
            } => {
                if let Some(&known) = self.incarnations.get(&from).filter(|&&i| incarnation < i) {
                    return out.refuse(
                        from,
                        Refusal::OtherIncarnation {
                            known,
                            claimed: incarnation,
                        },
                    );
                }
                let known = self.incarnations.get(&from) == Some(&incarnation);
                if !self.dead.contains(&from) && self.config.is_none() {
                    self.members.entry(from).or_insert(role);
                    self.incarnations.insert(from, incarnation);
                    if let (Role::Worker, Some(bound)) = (role, keys_below) {
                        self.keys_below.insert(from, bound);
                    }
                    if role == Role::Server {
                        self.offered_cuts.insert(from, checkpoints);
                    }
                    self.publish_when_complete(out);
                } else if role == Role::Server && !(known && self.is_server(from)) {
                    self.incarnations.insert(from, incarnation);
                    self.admit_server(from, out);
                } else if role == Role::Worker && !self.is_worker(from) {
                    self.admit_worker(from, out);
                } else {
                    // Members get the configuration again; latecomers and the dead learn that
                    // they are not members.
                    self.send_config(from, out);
                }
            }
            Message::CaughtUp { epoch } if epoch == self.decided_epoch() => {
                self.caught_up.insert(from);
                self.switch_when_caught_up(out);
            }
            Message::CaughtUp { epoch } => out.refuse(
                from,
                Refusal::StaleEpoch {
                    epoch,
                    current: self.decided_epoch(),
                },
            ),
            Message::Lost(ranges) if self.is_server(from) => self.list_lost(from, ranges, out),
            Message::CheckpointTaken { cut } if self.is_server(from) => {
                self.cut_taken.insert(from, (cut, env.epoch));
                self.record_checkpoint(out);
            }
            Message::Checkpointed { cut } if self.is_server(from) => {
                self.cut_taken.insert(from, (cut, env.epoch));
                self.cut_written.insert(from, (cut, env.epoch));
                self.record_checkpoint(out);
            }
            // Only at the epoch in force: an older `Leave` may be from an earlier process of
            // a server, delayed past its restart (which always starts a new epoch), and must
            // not take the new one out. A node that leaves says so again with every
            // heartbeat, at the epoch it is told. (A worker that restarts while still a member
            // starts no new epoch, so its earlier process's `Leave` at the same epoch is still
            // taken.)
            Message::Leave if env.epoch < self.epoch() => {
                out.refuse(
                    from,
                    Refusal::StaleEpoch {
                        epoch: env.epoch,
                        current: self.epoch(),
                    },
                );
                self.send_config(from, out);
            }
            Message::Leave if self.is_worker(from) => self.remove_worker(from, out),
            Message::Leave => self.retire_server(from, out),
            Message::ConfigRequest => self.send_config(from, out),
            Message::Heartbeat { .. } if self.config.is_none() && env.epoch > 0 => {
                // A member of a job this coordinator never published: it restarted and lost
                // the job. Answering would tell the member its coordinator lives, and hold
                // off the standby that can take over (ARCHITECTURE.md §11).
                out.refuse(from, Refusal::UnknownSender);
            }
            Message::Heartbeat { sent_at, at, term } => {
                if let Some(at) = at.filter(|_| self.is_worker(from)) {
                    self.pace_watch.report(from, at);
                }
                if self.finished_since.is_some_and(|e| env.epoch >= e) && self.is_server(from) {
                    self.finished_heard.insert(from);
                    self.say_when_finished(out);
                }
                self.heard_at(from, env.epoch, term, out);
                if env.epoch < self.epoch() {
                    self.send_config(from, out);
                } else {
                    // Only those still on the ring: one taken off it since is no longer kept.
                    let on_ring =
                        |n: &&NodeId| self.config.as_ref().is_some_and(|c| c.servers.contains(n));
                    let body = Message::HeartbeatAck {
                        sent_at,
                        degraded: self.kept_silent.iter().filter(on_ring).copied().collect(),
                    };
                    out.send(Envelope::new(self.cfg.id, from, self.epoch(), body));
                }
            }
            _ => out.refuse(from, Refusal::Unexpected),
        }
    }

    /// A server registering while the job runs, other than a resend of a member's registration,
    /// joins it. One that is on the ring already restarted and lost its state: it is taken off
    /// the ring first, in the same epoch.
    fn admit_server<V: Value>(&mut self, server: NodeId, out: &mut Effects<V>) {
        let Some(config) = &self.config else {
            return;
        };
        let mut next = config.clone();
        next.joining.retain(|&s| s != server);
        // A server that left and registers again is a member again.
        next.left.retain(|&s| s != server);
        if next.servers.contains(&server) {
            // Not held to `min_replicas`: the earlier process's copies are gone with it, and
            // keeping it on the ring would keep nothing but the new process out.
            match config.without_server(server).ok() {
                Some(without) => next = without,
                None => {
                    if self.kept_asking.insert(server) {
                        out.emit(Event::RingDegraded(server));
                    }
                    return self.send_config(server, out);
                }
            }
        }
        next.joining.push(server);
        next.joining.sort_unstable();
        if next.next_ring().is_err() {
            return self.send_config(server, out);
        }
        self.dead.remove(&server);
        self.silent_checks.remove(&server);
        self.members.insert(server, Role::Server);
        self.publish(next, out);
    }

    /// A server asking to leave is listed as leaving until its ranges are held elsewhere.
    fn retire_server<V: Value>(&mut self, server: NodeId, out: &mut Effects<V>) {
        let Some(config) = &self.config else {
            return;
        };
        if !config.servers.contains(&server) || config.leaving.contains(&server) {
            return self.send_config(server, out);
        }
        let mut next = config.clone();
        next.leaving.push(server);
        next.leaving.sort_unstable();
        if next.next_ring().is_err() || !self.keeps_min_replicas(&next) {
            if self.kept_asking.insert(server) {
                out.emit(Event::RingDegraded(server));
            }
            return self.send_config(server, out);
        }
        self.publish(next, out);
    }

    /// Whether the ring in force under `config`, and the ring its change leads to, hold each
    /// key with at least [`CoordinatorConfig::min_replicas`] replicas.
    fn keeps_min_replicas(&self, config: &ClusterConfig) -> bool {
        let next = crate::ring::held_replicas(config.ring.replicas, config.next_servers().len());
        config.replicas_held().min(next) >= self.cfg.min_replicas
    }

    /// Puts `next` in force as the next epoch and tells every member; switches to the next
    /// ring at once if nobody has anything to copy.
    fn publish<V: Value>(&mut self, mut next: ClusterConfig, out: &mut Effects<V>) {
        if let Some(now) = &self.config
            && now.replicas_held() != next.replicas_held()
        {
            out.emit(Event::Coordinator(CoordinatorEvent::ReplicasChanged {
                held: next.replicas_held(),
                asked: next.ring.replicas,
            }));
        }
        let moved = self
            .config
            .as_ref()
            .is_none_or(|now| !now.differs_only_in_pace(&next));
        next.epoch = self.decided_epoch() + 1;
        if moved {
            self.ring_since = next.epoch;
        }
        debug_assert_eq!(
            crate::ids::term_of_epoch(next.epoch),
            next.term,
            "a term publishes at most EPOCHS_PER_TERM configurations"
        );
        self.kept_asking.clear();
        next.hand_over_shares();
        next.pace.retain_workers(&next.workers);
        next.incarnations = server_incarnations(&self.incarnations, &next);
        self.config = Some(next);
        self.caught_up.clear();
        self.note_may_hold();
        self.replicate(out);
        self.release(out);
        self.say_when_finished(out);
        self.switch_when_caught_up(out);
    }

    /// Says [`Event::JobFinished`] once the configuration in force says every worker left,
    /// done, and every server on the ring has been heard from at an epoch that said so: each
    /// holds it and stops, so the coordinator may stop too. A server that stays silent is
    /// declared dead in time, which ends the wait for it.
    fn say_when_finished<V: Value>(&mut self, out: &mut Effects<V>) {
        let Some(config) = self.config.as_ref() else {
            return;
        };
        if !config.job_finished() {
            self.finished_since = None;
            self.finished_heard.clear();
            self.finish_said = false;
            return;
        }
        let since = *self.finished_since.get_or_insert(config.epoch);
        let all_heard = config
            .servers
            .iter()
            .chain(&config.joining)
            .all(|s| self.finished_heard.contains(s));
        if all_heard && !self.finish_said {
            self.finish_said = true;
            out.emit(Event::JobFinished { epoch: since });
        }
    }

    /// Publishes the next ring once every server it gives a range it does not hold yet has
    /// caught up with that range.
    fn switch_when_caught_up<V: Value>(&mut self, out: &mut Effects<V>) {
        let Some(config) = self.config.as_ref().filter(|c| c.is_changing()) else {
            return;
        };
        let Ok(cluster) = Cluster::new(config.clone()) else {
            return;
        };
        let all_caught_up = cluster
            .pieces_in(KeyRange::FULL)
            .iter()
            .flat_map(|(piece, holders)| {
                // Every holder of the next ring, not only those new to the piece: a server on
                // the ring in force may not hold its piece yet either (a replica chosen when
                // another server died during the change, still waiting for its copy).
                holders
                    .iter()
                    .filter(|&&n| cluster.will_hold(n, piece.start()))
                    .copied()
                    .collect::<Vec<_>>()
            })
            .all(|n| self.caught_up.contains(&n));
        if all_caught_up {
            let mut next = ClusterConfig {
                servers: config.next_servers(),
                joining: Vec::new(),
                leaving: Vec::new(),
                ..config.clone()
            };
            // Servers whose leaving completed are listed as gone on their own, so that no
            // member takes their absence for a death, however many epochs it missed.
            for &server in &config.leaving {
                if let Err(at) = next.left.binary_search(&server) {
                    next.left.insert(at, server);
                }
            }
            self.publish(next, out);
        }
    }

    fn count(&self, role: Role) -> usize {
        self.members.values().filter(|&&r| r == role).count()
    }

    fn publish_when_complete<V: Value>(&mut self, out: &mut Effects<V>) {
        if self.count(Role::Server) < self.cfg.servers
            || self.count(Role::Worker) < self.cfg.workers
        {
            return;
        }
        let of = |role: Role| -> Vec<NodeId> {
            self.members
                .iter()
                .filter(|&(_, &r)| r == role)
                .map(|(&n, _)| n)
                .collect()
        };
        let workers = of(Role::Worker);
        let shares = ClusterConfig::deal(&workers, self.cfg.stragglers.shares_per_worker());
        let servers = of(Role::Server);
        let resumed = self.resume_cut(&servers);
        let checkpoints = Checkpoints {
            every: self.cfg.checkpoint_every,
            taken: resumed,
            complete: resumed,
        };
        self.config = Some(ClusterConfig {
            epoch: 1,
            coordinator: self.cfg.id,
            standbys: Vec::new(),
            term: 0,
            servers,
            workers,
            ring: self.first_ring(),
            consistency: self.cfg.consistency,
            joining: Vec::new(),
            leaving: Vec::new(),
            shares,
            left: vec![],
            lost: vec![],
            incarnations: Vec::new(),
            pace: Pace::default(),
            checkpoints,
        });
        if let Some(config) = &mut self.config {
            config.incarnations = server_incarnations(&self.incarnations, config);
        }
        out.emit(Event::Ready { epoch: 1 });
        self.release(out);
    }

    /// The cut a job starts from: the newest checkpoint every server of the first ring holds
    /// whole, 0 (the beginning) when they hold none in common.
    fn resume_cut(&self, servers: &[NodeId]) -> Iteration {
        let mut common: Option<BTreeSet<Iteration>> = None;
        for s in servers {
            let held: BTreeSet<Iteration> = self
                .offered_cuts
                .get(s)
                .map(|c| c.iter().copied().collect())
                .unwrap_or_default();
            common = Some(match common {
                None => held,
                Some(c) => c.intersection(&held).copied().collect(),
            });
        }
        common.and_then(|c| c.last().copied()).unwrap_or(0)
    }

    /// Records the next cut taken once every server on the ring took its copy of it at the
    /// epoch in force, with no ring change under way: a configuration recording it lets the
    /// workers go on. Records the last cut taken complete once every server on the ring wrote
    /// it (ARCHITECTURE.md §11). A server whose ranges changed after it took its copy never
    /// says it wrote it, and the cut stays incomplete.
    fn record_checkpoint<V: Value>(&mut self, out: &mut Effects<V>) {
        let Some(config) = self.config.as_ref().filter(|c| !c.is_changing()) else {
            return;
        };
        let mut next = config.clone();
        if let Some(cut) = config.checkpoints.next_cut() {
            let all = config
                .servers
                .iter()
                .all(|s| self.cut_taken.get(s) == Some(&(cut, config.epoch)));
            if all {
                next.checkpoints.taken = cut;
            }
        }
        let cut = next.checkpoints.taken;
        // Said under the ring in force: a report from before a ring change is of ranges the
        // server may no longer hold, and one that still holds them says so again.
        let written = cut > next.checkpoints.complete
            && config.servers.iter().all(|s| {
                self.cut_written
                    .get(s)
                    .is_some_and(|&(c, at)| c == cut && at >= self.ring_since)
            });
        if written {
            next.checkpoints.complete = cut;
        }
        if next.checkpoints == config.checkpoints {
            return;
        }
        self.cut_taken.retain(|_, &mut (c, _)| c > cut);
        self.cut_written.retain(|_, &mut (c, _)| c >= cut);
        if cut > config.checkpoints.taken {
            out.emit(Event::Coordinator(CoordinatorEvent::CheckpointTaken {
                cut,
            }));
        }
        self.publish(next, out);
        if written {
            out.emit(Event::Coordinator(CoordinatorEvent::CheckpointComplete {
                cut,
            }));
        }
    }

    /// The ring of the first configuration: the job's, but where the job gave it no key space,
    /// spread over the keys the workers said they use, so that keys of a small dimension do
    /// not all fall into the one segment at the start of the `u64` range.
    fn first_ring(&self) -> RingConfig {
        let mut ring = self.cfg.ring;
        if ring.key_space == RingConfig::default().key_space
            && let Some(&bound) = self.keys_below.values().max()
        {
            ring.key_space = bound.max(1);
        }
        ring
    }

    /// Call when a timer the coordinator set fires. Every `heartbeat_interval` the coordinator
    /// counts one more silent check for each worker it has not heard from since the last one;
    /// a worker silent for more than `heartbeat_timeout` worth of checks is declared dead.
    pub fn on_timer<V: Value>(&mut self, now: Time, timer: TimerId, out: &mut Effects<V>) {
        if timer != TimerId::FailureCheck {
            return;
        }
        out.set_timer(
            TimerId::FailureCheck,
            now + self.cfg.timing.heartbeat_interval,
        );
        if self.mode != Mode::Active {
            return self.standby_check(out);
        }
        self.check_standbys(out);
        let Some(config) = &self.config else {
            return;
        };
        let allowed = self.cfg.timing.missed_checks_allowed();
        // With peers, a check that heard fewer than a majority since the last is one this
        // coordinator was most likely cut off for: it counts as nobody's silence
        // (ARCHITECTURE.md §11). Not once the job finished: the members stop then, so that
        // hearing nobody is what the end looks like, and a server whose last word was lost
        // must still be counted silent for the coordinator to stop.
        let heard = std::mem::take(&mut self.heard_since_check);
        let deaf = self.finished_since.is_none()
            && !self.cfg.peers.is_empty()
            && self
                .published
                .as_ref()
                .is_some_and(|p| !p.is_majority(&heard));
        let mut silent = Vec::new();
        for &n in config
            .workers
            .iter()
            .chain(&config.servers)
            .chain(&config.joining)
        {
            let missed = self.silent_checks.entry(n).or_default();
            if deaf {
                continue;
            }
            // Saturates: a server kept because the ring could not lose it (`RingDegraded`) is
            // counted silent on every check, and its count must not grow without end.
            *missed = (*missed + 1).min(allowed + 1);
            if *missed > allowed {
                silent.push(n);
            }
        }
        if self.finished_since.is_some() {
            // The job is over: a server silent since stopped, whether or not its last word
            // arrived, and there is nothing left to move its ranges for.
            let servers: Vec<NodeId> = silent
                .iter()
                .copied()
                .filter(|&n| self.is_server(n))
                .collect();
            self.finished_heard.extend(servers);
            self.say_when_finished(out);
            silent.retain(|&n| !self.is_server(n));
        }
        if !self.cfg.peers.is_empty() {
            if !self.hears_majority() {
                // Most members silent at once: this coordinator is the one cut off, more
                // likely than they all died, and a standby may be taking over. Declaring them
                // dead would take the job apart once the link is back (ARCHITECTURE.md §11).
                self.cut_off = true;
                silent.clear();
            } else if std::mem::take(&mut self.cut_off) {
                // Back in touch with a majority: a member not heard yet was silent while this
                // coordinator was cut off, and gets a whole timeout of its own before it is
                // declared dead.
                self.silent_checks
                    .values_mut()
                    .for_each(|missed| *missed = 0);
                silent.clear();
            }
        }
        self.declare_dead(&silent, out);
        self.remind_silent(out);
        self.check_pace(out);
    }

    /// Whether more than half of the voters of the configuration in force were heard within
    /// half the heartbeat timeout.
    fn hears_majority(&self) -> bool {
        let Some(config) = &self.published else {
            return true;
        };
        let recent = self.cfg.timing.missed_checks_allowed() / 2;
        let heard: BTreeSet<NodeId> = config
            .voters()
            .into_iter()
            .filter(|v| self.silent_checks.get(v).copied().unwrap_or(0) <= recent)
            .collect();
        config.is_majority(&heard)
    }

    /// Tells stragglers from the positions workers reported, says which started and stopped
    /// lagging, and publishes what the job's policy decides for them (ARCHITECTURE.md §9).
    /// Nothing is decided while servers join or leave: a new epoch would make them report
    /// catching up again.
    fn check_pace<V: Value>(&mut self, out: &mut Effects<V>) {
        let Some(detect) = self.cfg.stragglers.detect else {
            return;
        };
        let Some(config) = self.config.as_ref().filter(|c| !c.is_changing()) else {
            return;
        };
        self.pace_watch.retain(&config.workers);
        self.stragglers.retain(|w| config.workers.contains(w));
        let lagging = self
            .pace_watch
            .check(&config.workers, &config.pace, &detect);
        for (&worker, lag) in &lagging {
            if self.stragglers.insert(worker) {
                out.emit(Event::Coordinator(CoordinatorEvent::Straggler {
                    worker,
                    behind: lag.behind,
                }));
            }
        }
        let cleared: Vec<NodeId> = self
            .stragglers
            .iter()
            .filter(|w| !lagging.contains_key(w))
            .copied()
            .collect();
        for worker in cleared {
            self.stragglers.remove(&worker);
            out.emit(Event::Coordinator(CoordinatorEvent::StragglerCleared(
                worker,
            )));
        }
        let mut next = config.clone();
        if self.cfg.stragglers.decides(config.consistency) {
            next.pace = pace::decide(
                &self.cfg.stragglers,
                config.consistency,
                &config.pace,
                &lagging,
            );
            let job_tau = config.consistency.tau().unwrap_or(0);
            let (from, to) = (
                config.pace.tau.unwrap_or(job_tau),
                next.pace.tau.unwrap_or(job_tau),
            );
            if from != to {
                out.emit(Event::Coordinator(CoordinatorEvent::TauChanged {
                    from,
                    to,
                }));
            }
        }
        if let Some(balance) = &self.cfg.stragglers.balance
            && let Some((share, to)) =
                self.pace_watch
                    .rebalance(&config.shares, &config.workers, &config.pace, balance)
        {
            let from = next.shares[share];
            next.shares[share] = to;
            let at = self.pace_watch.iteration_of(from);
            next.pace.record_move(share, from, at);
            out.emit(Event::Coordinator(CoordinatorEvent::ShareMoved {
                share,
                from,
                to,
            }));
        }
        if next != *config {
            self.publish(next, out);
        }
    }

    /// Removes `nodes` from the membership and publishes a new epoch. Servers go one at a time,
    /// each only if the ring of the servers left can still be built.
    fn declare_dead<V: Value>(&mut self, nodes: &[NodeId], out: &mut Effects<V>) {
        let Some(config) = &self.config else {
            return;
        };
        let mut next = config.clone();
        let mut removed = Vec::new();
        for &n in nodes {
            if next.workers.contains(&n) {
                next.workers.retain(|&w| w != n);
                removed.push(n);
            } else if next.joining.contains(&n) {
                next.joining.retain(|&s| s != n);
                removed.push(n);
            } else if next.servers.contains(&n) {
                match next
                    .without_server(n)
                    .ok()
                    .filter(|c| self.keeps_min_replicas(c))
                {
                    Some(without) => {
                        next = without;
                        removed.push(n);
                    }
                    // Said once, not on every check it stays silent.
                    None if self.kept_silent.insert(n) => out.emit(Event::RingDegraded(n)),
                    None => {}
                }
            }
        }
        if removed.is_empty() {
            return;
        }
        for n in removed {
            self.dead.insert(n);
            self.silent_checks.remove(&n);
            // No longer kept: the ring does without it now.
            self.kept_silent.remove(&n);
            out.emit(Event::NodeDead(n));
        }
        self.publish(next, out);
    }
}

/// The registered incarnation of every server member of `config`, sorted by node
/// ([`ClusterConfig::incarnations`]).
fn server_incarnations(
    registered: &BTreeMap<NodeId, u64>,
    config: &ClusterConfig,
) -> Vec<(NodeId, u64)> {
    let mut servers: Vec<NodeId> = config
        .servers
        .iter()
        .chain(&config.joining)
        .copied()
        .collect();
    servers.sort_unstable();
    servers.dedup();
    servers
        .into_iter()
        .filter_map(|n| registered.get(&n).map(|&i| (n, i)))
        .collect()
}
