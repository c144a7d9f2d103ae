//! The coordinator: the paper's server manager. It owns membership, the ring and the epoch.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use crate::consistency::Consistency;
use crate::effects::{Effects, Event, Refusal, TimerId};
use crate::message::{ClusterConfig, Envelope, Message};
use crate::node::{Epoch, NodeId, Role, Time};
use crate::ring::{Ring, RingConfig, RingError};
use crate::timing::Timing;
use crate::value::Value;

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
}

/// The coordinator node (sans-IO).
///
/// Waits until the expected servers and workers have registered, then publishes epoch 1 (the
/// members, the ring configuration and the consistency model). Afterwards it answers every
/// registration, configuration request and stale heartbeat with the current configuration, and
/// removes nodes that stay silent past the heartbeat timeout, publishing a new epoch.
///
/// A server removed from the ring passes each of its ranges to the range's first replica, which
/// holds the data already (ARCHITECTURE.md §8). A server is kept, however silent, when the
/// servers left could not hold the ring's replicas: [`Event::RingDegraded`] says so.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coordinator {
    cfg: CoordinatorConfig,
    members: BTreeMap<NodeId, Role>,
    config: Option<ClusterConfig>,
    /// Failure checks in a row each member has been silent for. Counting checks instead of
    /// storing arrival times keeps the state bounded, which the model checker needs.
    silent_checks: BTreeMap<NodeId, u64>,
    dead: BTreeSet<NodeId>,
}

impl Coordinator {
    /// A coordinator for a job of the given shape.
    pub fn new(cfg: CoordinatorConfig) -> Result<Self, CoordinatorError> {
        let probe = (0..cfg.servers).map(|i| NodeId(i as u32));
        Ring::new(probe, cfg.ring).map_err(|source| CoordinatorError::Ring {
            servers: cfg.servers,
            source,
        })?;
        if cfg.workers == 0 {
            return Err(CoordinatorError::NoWorkers);
        }
        Ok(Coordinator {
            cfg,
            members: BTreeMap::new(),
            config: None,
            silent_checks: BTreeMap::new(),
            dead: BTreeSet::new(),
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
        let mut c = Coordinator::new(CoordinatorConfig {
            id: config.coordinator,
            servers: config.servers.len(),
            workers: config.workers.len(),
            ring: config.ring,
            consistency: config.consistency,
            ..cfg
        })?;
        Ring::new(config.servers.iter().copied(), config.ring).map_err(|source| {
            CoordinatorError::Ring {
                servers: config.servers.len(),
                source,
            }
        })?;
        let roles = config
            .servers
            .iter()
            .map(|&s| (s, Role::Server))
            .chain(config.workers.iter().map(|&w| (w, Role::Worker)));
        c.members.extend(roles);
        c.config = Some(config);
        Ok(c)
    }

    /// This coordinator's id.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// The configuration in force, once published.
    pub fn config(&self) -> Option<&ClusterConfig> {
        self.config.as_ref()
    }

    /// The current epoch, 0 before the first configuration.
    pub fn epoch(&self) -> Epoch {
        self.config.as_ref().map_or(0, |c| c.epoch)
    }

    /// Nodes declared dead.
    pub fn dead(&self) -> &BTreeSet<NodeId> {
        &self.dead
    }

    /// Starts failure detection. Call once, first.
    pub fn start<V: Value>(&mut self, now: Time, out: &mut Effects<V>) {
        out.set_timer(
            TimerId::FailureCheck,
            now + self.cfg.timing.heartbeat_interval,
        );
    }

    fn send_config<V: Value>(&self, to: NodeId, out: &mut Effects<V>) {
        if let Some(config) = &self.config {
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
        self.silent_checks.remove(&from);
        match env.body {
            Message::Register { role } => {
                if !self.dead.contains(&from) && self.config.is_none() {
                    self.members.entry(from).or_insert(role);
                    self.publish_when_complete(out);
                } else {
                    // Members get the configuration again; latecomers and the dead learn that
                    // they are not members.
                    self.send_config(from, out);
                }
            }
            Message::ConfigRequest => self.send_config(from, out),
            Message::Heartbeat { .. } if env.epoch < self.epoch() => self.send_config(from, out),
            Message::Heartbeat { .. } => {}
            _ => out.refuse(from, Refusal::Unexpected),
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
        self.config = Some(ClusterConfig {
            epoch: 1,
            coordinator: self.cfg.id,
            servers: of(Role::Server),
            workers: of(Role::Worker),
            ring: self.cfg.ring,
            consistency: self.cfg.consistency,
        });
        out.emit(Event::Ready { epoch: 1 });
        self.broadcast(out);
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
        let Some(config) = &self.config else {
            return;
        };
        let allowed = self.cfg.timing.missed_checks_allowed();
        let mut silent = Vec::new();
        for &n in config.workers.iter().chain(&config.servers) {
            let missed = self.silent_checks.entry(n).or_default();
            // Saturates: a server kept because the ring could not lose it (`RingDegraded`) is
            // counted silent on every check, and its count must not grow without end.
            *missed = (*missed + 1).min(allowed + 1);
            if *missed > allowed {
                silent.push(n);
            }
        }
        self.declare_dead(&silent, out);
    }

    /// Removes `nodes` from the membership and publishes a new epoch. Servers go one at a time,
    /// each only if the ring of the servers left can still be built.
    fn declare_dead<V: Value>(&mut self, nodes: &[NodeId], out: &mut Effects<V>) {
        let Some(config) = &mut self.config else {
            return;
        };
        let mut removed = Vec::new();
        for &n in nodes {
            if config.workers.contains(&n) {
                config.workers.retain(|&w| w != n);
                removed.push(n);
            } else if config.servers.contains(&n) {
                match config.without_server(n) {
                    Ok(next) => {
                        config.servers = next.servers;
                        removed.push(n);
                    }
                    Err(_) => out.emit(Event::RingDegraded(n)),
                }
            }
        }
        if removed.is_empty() {
            return;
        }
        config.epoch += 1;
        for n in removed {
            self.dead.insert(n);
            self.silent_checks.remove(&n);
            out.emit(Event::NodeDead(n));
        }
        self.broadcast(out);
    }
}
