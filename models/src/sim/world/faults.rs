//! Server faults: the seeded plan of server crashes (for good, with a restart, or while a copy
//! of a range is on its way to the server), servers cut off from the other servers and
//! flapping ones; and how the cluster recovers (see "Server faults" in the `sim` module docs).

use std::collections::BTreeSet;

use super::{Action, World};
use crate::sim::rng::SimRng;
use crate::sim::{Invariant, MS, ServerFaults, SimFailure};
use pserver_core::Driver;
use pserver_core::KeyRange;
use pserver_core::node::Server;
use pserver_core::{NodeId, Time};

/// How late, under membership stress, what a crashed server sent may still arrive.
const LATE_AFTER_CRASH: Time = 3_000 * MS;

/// What a planned server crash is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CrashKind {
    /// The server stays down.
    Crash,
    /// A fresh process of the server starts once the coordinator declared it dead.
    Restart,
    /// The server crashes right after a copy of a range was sent to it.
    DuringCopy,
    /// The server crashes right after a replica that held a range before installed a copy of
    /// it the server sent, before the pushes that waited for that copy are acknowledged (only
    /// with two replicas or more: the replicas that had the range before still hold every
    /// acknowledged push).
    AfterCopy,
}

/// The server fault plan of a run and what has come of it.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    /// A stream of its own, so that runs without server faults draw exactly what they drew
    /// before server faults existed.
    rng: SimRng,
    /// The crashes to come, in order.
    kinds: Vec<CrashKind>,
    /// Crashes that happened.
    crashed: usize,
    /// Crashed servers to restart once the coordinator declared them dead.
    restart: BTreeSet<NodeId>,
    /// Restarts planned and not carried out yet.
    restarts_pending: usize,
    /// Joins and leaves planned and not carried out yet.
    membership_pending: usize,
    /// Servers that asked to leave and have not yet learned that they are out (the moment a
    /// real server process stops).
    pub(super) leaving: BTreeSet<NodeId>,
    /// The next crash waits for the next copy of a range to be sent (or, for a crash of the
    /// sender, to be acknowledged).
    copy_armed: Option<CrashKind>,
    /// The next crash waits until the cluster recovered from the last one and refilled its
    /// replicas.
    waiting_refill: bool,
    /// Times of the crashes the cluster has not recovered from yet.
    open: Vec<Time>,
    /// The faults that happened.
    pub(super) happened: ServerFaults,
    /// Recovery time of every crash recovered from.
    pub(super) recoveries: Vec<Time>,
}

impl Plan {
    pub(super) fn new(seed: u64) -> Self {
        Plan {
            rng: SimRng::new(pserver_core::testing::hash_words(seed, &[0x5345_5256])),
            kinds: Vec::new(),
            crashed: 0,
            restart: BTreeSet::new(),
            restarts_pending: 0,
            membership_pending: 0,
            leaving: BTreeSet::new(),
            copy_armed: None,
            waiting_refill: false,
            open: Vec::new(),
            happened: ServerFaults::default(),
            recoveries: Vec::new(),
        }
    }
}

impl World<'_> {
    /// Whether the run goes on after the workers finished until the cluster is quiescent, and
    /// then checks the replicas and the owners.
    pub(super) fn settles(&self) -> bool {
        self.replicated
            || self.cfg.crash_servers > 0
            || self.cfg.join_servers > 0
            || self.cfg.leave_servers > 0
    }

    /// The servers of the job (the ring's, before any crash).
    fn member_servers(&self) -> Vec<NodeId> {
        let gone = self.cfg.server_taken_off();
        self.cfg.server_ids().filter(|&s| Some(s) != gone).collect()
    }

    /// Draws the server faults: `crash_servers` crashes of seeded kinds (the first at a seeded
    /// time, each later one once the cluster recovered from the one before, or right after a
    /// copy is sent when it is a crash during a copy), and with `--partition` and replicas a
    /// server cut off from the others, a flapping server, or both.
    pub(super) fn plan_server_faults(&mut self) {
        let horizon = self.horizon().max(1);
        let members = self.member_servers();
        let mut kinds = Vec::new();
        for i in 0..self.cfg.crash_servers {
            // A crash around a copy needs a copy: only a recovery sends one. Crashing its sender
            // leaves the promoted replica's own copy, so that takes a second replica.
            let choices = match i {
                0 => 2,
                _ if self.cfg.ring.replicas < 2 => 3,
                _ => 4,
            };
            kinds.push(match self.plan.rng.below(choices) {
                0 => CrashKind::Crash,
                1 => CrashKind::Restart,
                2 => CrashKind::DuringCopy,
                _ => CrashKind::AfterCopy,
            });
        }
        self.plan.kinds = kinds;
        // Joins take ids after the workers'; joins and leaves come at seeded times.
        let first_new = (self.cfg.servers + self.cfg.workers + 1) as u32;
        self.plan.membership_pending = self.cfg.join_servers + self.cfg.leave_servers;
        // Under stress every change comes within a short while of one moment, so that they
        // overlap.
        let stress = self.cfg.membership_stress;
        let around = if stress {
            Some(self.plan.rng.below(horizon))
        } else {
            None
        };
        let when = |rng: &mut SimRng| match around {
            Some(t) => t + rng.below(horizon / 4 + 1),
            None => rng.below(horizon),
        };
        for i in 0..self.cfg.join_servers {
            let at = when(&mut self.plan.rng);
            self.schedule(at, Action::JoinServer(NodeId(first_new + i as u32)));
        }
        for _ in 0..self.cfg.leave_servers {
            let at = when(&mut self.plan.rng);
            self.schedule(at, Action::LeaveServer);
        }
        let mut first_crash =
            (self.cfg.crash_servers > 0).then(|| (when(&mut self.plan.rng), None));
        if self.cfg.faults.partition && self.replicated && !members.is_empty() {
            let pick = self.plan.rng.below(3);
            if pick != 1 {
                let node = members[self.plan.rng.below(members.len() as u64) as usize];
                let at = self.plan.rng.below(horizon);
                // Shorter than the heartbeat timeout: the server stays a member.
                let length = 100 * MS + self.plan.rng.below(1_400 * MS);
                self.schedule(at, Action::CutOff(node));
                self.schedule(at + length, Action::Reconnect(node));
                // Now and then the first crash is of the cut-off server, while it is cut off:
                // a primary whose replicas do not have its latest pushes.
                if let Some(crash) = first_crash.as_mut() {
                    if self.plan.rng.chance(0.5) {
                        *crash = (at + self.plan.rng.below(length), Some(node));
                    }
                }
            }
            if pick != 0 {
                let node = members[self.plan.rng.below(members.len() as u64) as usize];
                let mut at = self.plan.rng.below(horizon);
                let times = 3 + self.plan.rng.below(4);
                for i in 0..times {
                    let length = 20 * MS + self.plan.rng.below(180 * MS);
                    let isolate = if i == 0 {
                        Action::FlapStart(node)
                    } else {
                        Action::Isolate(node)
                    };
                    self.schedule(at, isolate);
                    self.schedule(at + length, Action::Heal(node));
                    at += length + 20 * MS + self.plan.rng.below(180 * MS);
                }
            }
        }
        if let Some((at, victim)) = first_crash {
            self.schedule(at, Action::CrashServer(victim));
        }
    }

    /// Crashes the next planned server (`victim`, or one the plan picks among the live
    /// members): its process stops, and what it sent that is still on the network is lost (under
    /// membership stress, delayed instead).
    /// Returns the server crashed.
    pub(super) fn crash_server(&mut self, victim: Option<NodeId>) -> Option<NodeId> {
        let Some(config) = self.coordinator().and_then(|c| c.config()).cloned() else {
            // As with a worker: a crash before the job started is a failed launch. Try later.
            self.schedule(self.now + 10 * MS, Action::CrashServer(victim));
            return None;
        };
        let kind = *self.plan.kinds.get(self.plan.crashed)?;
        let live: Vec<NodeId> = config
            .servers
            .iter()
            .copied()
            .filter(|s| !self.down.contains(s))
            .collect();
        let victim = match victim.filter(|v| live.contains(v)) {
            Some(v) => v,
            None if live.is_empty() => return None,
            None => live[self.plan.rng.below(live.len() as u64) as usize],
        };
        self.count_overlap();
        self.down.insert(victim);
        self.wakeups.remove(&victim);
        let queue = core::mem::take(&mut self.queue);
        if self.cfg.membership_stress {
            // Still on the network, and late: it may arrive after the server restarted. Drawn
            // in the queue's own order, not the heap's layout, so that a seed replays anywhere.
            let rng = &mut self.plan.rng;
            self.queue = queue
                .into_sorted_vec()
                .into_iter()
                .rev()
                .map(|mut s| {
                    if matches!(s.action, Action::Deliver { from, .. } if from == victim) {
                        s.at += rng.below(LATE_AFTER_CRASH + 1);
                    }
                    s
                })
                .collect();
        } else {
            self.queue = queue
                .into_iter()
                .filter(|s| !matches!(s.action, Action::Deliver { from, .. } if from == victim))
                .collect();
        }
        self.plan.crashed += 1;
        self.plan.open.push(self.now);
        match kind {
            CrashKind::Crash => self.plan.happened.crashes += 1,
            CrashKind::Restart => {
                self.plan.happened.restarts += 1;
                self.plan.restarts_pending += 1;
                if self.cfg.quick_restart {
                    let at = self.now + 50 * MS + self.plan.rng.below(1_000 * MS);
                    self.schedule(at, Action::RestartServer(victim));
                } else {
                    self.plan.restart.insert(victim);
                }
            }
            CrashKind::DuringCopy => self.plan.happened.crashes_during_copy += 1,
            CrashKind::AfterCopy => self.plan.happened.crashes_after_copy += 1,
        }
        match self.plan.kinds.get(self.plan.crashed) {
            Some(&k @ (CrashKind::DuringCopy | CrashKind::AfterCopy)) => {
                self.plan.copy_armed = Some(k);
            }
            Some(_) => self.plan.waiting_refill = true,
            None => {}
        }
        Some(victim)
    }

    /// Starts a fresh server process `node` that registers. A new process is a new incarnation:
    /// the coordinator takes it for a restart or a join, never for a resend of an old
    /// process's registration.
    fn start_server_process(&mut self, node: NodeId) {
        let mut sc = self.server_config;
        sc.id = node;
        sc.incarnation = self.now + 1;
        let mut d = Driver::new(Server::new(sc, self.server_rule));
        #[cfg(feature = "mutations")]
        d.set_mutation(self.mutation);
        d.start(self.now);
        self.nodes.insert(node, d);
        self.started.insert(node, self.now);
        self.highest.remove(&node);
    }

    /// Counts a message that crosses from one process of a server to another: sent by an
    /// earlier process than the one running now, or to one.
    pub(super) fn count_late(&mut self, from: NodeId, to: NodeId, sent_at: Time) {
        let started = |n| self.started.get(&n).copied().unwrap_or(0);
        if sent_at < started(from) {
            self.plan.happened.late_from_earlier_process += 1;
        }
        if sent_at < started(to) {
            self.plan.happened.late_to_later_process += 1;
        }
    }

    /// Counts a join, leave or crash that comes while another change is under way.
    fn count_overlap(&mut self) {
        if self.overlapping() {
            self.plan.happened.overlapping += 1;
        }
    }

    /// Whether a change is under way: a configuration still changing its ring, or a crash not
    /// yet recovered from.
    fn overlapping(&self) -> bool {
        let changing = self
            .coordinator()
            .and_then(|c| c.config())
            .is_some_and(pserver_core::wire::ClusterConfig::is_changing);
        changing || !self.plan.open.is_empty()
    }

    /// A fresh process of a crashed server starts and registers.
    pub(super) fn restart_server(&mut self, node: NodeId) {
        self.start_server_process(node);
        self.down.remove(&node);
        self.wakeups.remove(&node);
        // The new process knows nothing of the old one's wish to leave.
        self.plan.leaving.remove(&node);
        self.plan.restarts_pending = self.plan.restarts_pending.saturating_sub(1);
    }

    /// A new server process starts and registers: the coordinator lists it as joining, it
    /// copies the ranges the next ring gives it, then the ring switches.
    pub(super) fn join_server(&mut self, node: NodeId) {
        if self.coordinator().is_none_or(|c| c.config().is_none()) {
            // The job has not started: joining is for a running job. Try later.
            self.schedule(self.now + 10 * MS, Action::JoinServer(node));
            return;
        }
        self.count_overlap();
        self.start_server_process(node);
        self.plan.happened.joins += 1;
        self.plan.membership_pending -= 1;
    }

    /// A live server of the ring, picked by the seed, asks to leave. `None` when no server
    /// may leave now (too few would be left): tried again later.
    pub(super) fn leave_server(&mut self) -> Option<NodeId> {
        let config = self.coordinator().and_then(|c| c.config()).cloned();
        // Under stress a server asks whether or not a change is under way.
        let stress = self.cfg.membership_stress;
        let Some(config) = config.filter(|c| stress || !c.is_changing()) else {
            self.schedule(self.now + 10 * MS, Action::LeaveServer);
            return None;
        };
        let candidates: Vec<NodeId> = config
            .servers
            .iter()
            .copied()
            .filter(|s| !self.down.contains(s))
            .collect();
        if candidates.len() <= self.cfg.ring.replicas as usize + 1 {
            self.schedule(self.now + 10 * MS, Action::LeaveServer);
            return None;
        }
        let node = candidates[self.plan.rng.below(candidates.len() as u64) as usize];
        let overlapping = self.overlapping();
        let d = self.nodes.get_mut(&node)?;
        d.leave().ok()?;
        self.plan.happened.overlapping += usize::from(overlapping);
        self.plan.happened.leaves += 1;
        self.plan.membership_pending -= 1;
        self.plan.leaving.insert(node);
        Some(node)
    }

    /// A server sent `to` a copy of a range: a crash armed for this moment hits `to`.
    pub(super) fn copy_sent(&mut self, to: NodeId) {
        if self.plan.copy_armed == Some(CrashKind::DuringCopy) && !self.down.contains(&to) {
            self.plan.copy_armed = None;
            self.schedule(self.now, Action::CrashServer(Some(to)));
        }
    }

    /// `replica` acknowledged installing a copy of `range` that `sender` sent it: a crash
    /// armed for this moment hits `sender`, if the replica held the range before the ring last
    /// changed (its copy replaced one that had the range's every push).
    pub(super) fn copy_installed(&mut self, replica: NodeId, sender: NodeId, range: KeyRange) {
        let held_before = self
            .previous_ring
            .as_ref()
            .is_some_and(|r| r.owners(range.start()).contains(&replica));
        if self.plan.copy_armed == Some(CrashKind::AfterCopy)
            && held_before
            && !self.down.contains(&sender)
        {
            self.plan.copy_armed = None;
            self.schedule(self.now, Action::CrashServer(Some(sender)));
        }
    }

    /// The coordinator declared `node` dead: a server planned to restart does, a little later.
    pub(super) fn node_dead(&mut self, node: NodeId) {
        if self.plan.restart.remove(&node) {
            let at = self.now + self.plan.rng.below(500 * MS);
            self.schedule(at, Action::RestartServer(node));
        }
    }

    /// Rebuilds the ring in force when the coordinator published a new configuration.
    pub(super) fn refresh_ring(&mut self) {
        let Some(config) = self.coordinator().and_then(|c| c.config()) else {
            return;
        };
        if config.epoch == self.ring_epoch {
            return;
        }
        let epoch = config.epoch;
        // A crashed server that was leaving may be taken off the ring without ever being
        // declared dead: it restarts once it is off.
        let off: Vec<NodeId> = self
            .plan
            .restart
            .iter()
            .copied()
            .filter(|s| !config.servers.contains(s))
            .collect();
        if let Ok(ring) = config.ring_in_force() {
            self.previous_ring = Some(core::mem::replace(&mut self.ring, ring));
            self.ring_epoch = epoch;
        }
        for node in off {
            self.node_dead(node);
        }
    }

    /// Closes the recoveries that are over, and schedules the next crash once the cluster has
    /// recovered and refilled its replicas.
    pub(super) fn track_recovery(&mut self) {
        if !self.plan.open.is_empty() && self.served() {
            let now = self.now;
            let done: Vec<Time> = self.plan.open.drain(..).map(|t| now - t).collect();
            self.plan.recoveries.extend(done);
        }
        if self.plan.waiting_refill && self.plan.open.is_empty() && self.refilled() {
            self.plan.waiting_refill = false;
            let at = self.now + self.plan.rng.below(self.horizon().max(1));
            self.schedule(at, Action::CrashServer(None));
        }
    }

    /// True when `server` holds shards (primary ones, if `primary`) covering `range`.
    fn holds(&self, server: NodeId, range: KeyRange, primary: bool) -> bool {
        let Some(s) = self.server(server) else {
            return false;
        };
        let mut held: Vec<KeyRange> = s
            .shards()
            .filter(|&(_, p)| p || !primary)
            .map(|(r, _)| r)
            .collect();
        held.sort_by_key(|r| r.start());
        let mut at = range.start();
        for r in held {
            if at >= range.end() {
                break;
            }
            if r.start() <= at && r.end() > at {
                at = r.end();
            }
        }
        at >= range.end()
    }

    /// The live servers of the coordinator's configuration.
    fn live_members(&self) -> Vec<NodeId> {
        self.ring
            .servers()
            .iter()
            .copied()
            .filter(|s| !self.down.contains(s))
            .collect()
    }

    /// Every range is served again: no crashed server is left in the coordinator's ring, and
    /// every range's primary there has adopted its epoch and holds the range as primary.
    pub(super) fn served(&self) -> bool {
        if self.coordinator().is_none_or(|c| c.config().is_none()) {
            return false;
        }
        if self.ring.servers().iter().any(|s| self.down.contains(s)) {
            return false;
        }
        self.ring.segments().all(|(range, owners)| {
            self.server(owners[0])
                .is_some_and(|s| s.epoch() == self.ring_epoch)
                && self.holds(owners[0], range, true)
        })
    }

    /// Served, every member on the epoch in force with no push waiting for its replicas, and
    /// every owner of every range holding it.
    fn quiescent(&self) -> bool {
        self.coordinator()
            .is_some_and(|c| c.phase() == pserver_core::node::Phase::Running)
            && self.plan.membership_pending == 0
            && self.plan.leaving.iter().all(|s| self.down.contains(s))
            && self.plan.open.is_empty()
            && self.plan.restarts_pending == 0
            && self.served()
            && self.live_members().iter().all(|&s| {
                self.server(s)
                    .is_some_and(|s| s.epoch() == self.ring_epoch && s.unreplicated_pushes() == 0)
            })
            && self
                .ring
                .segments()
                .all(|(range, owners)| owners.iter().all(|&o| self.holds(o, range, false)))
    }

    /// Quiescent with every replica holding its primary's values: the cluster has recovered
    /// and refilled its replicas.
    fn refilled(&self) -> bool {
        self.quiescent() && self.divergence().is_none()
    }

    /// The first key on which a live replica holds other values than its primary, described.
    pub(super) fn divergence(&self) -> Option<String> {
        for &key in &self.keys {
            let owners = self.ring.owners(key);
            let Some(primary) = self.server(owners[0]) else {
                continue;
            };
            let total: Vec<u64> = primary
                .received_total(key)
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let value = primary.value(key).map(|row| row[0].to_bits());
            for &r in owners[1..].iter().filter(|r| !self.down.contains(r)) {
                let Some(replica) = self.server(r) else {
                    continue;
                };
                let r_total: Vec<u64> = replica
                    .received_total(key)
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let r_value = replica.value(key).map(|row| row[0].to_bits());
                if r_total != total || r_value != value {
                    return Some(format!(
                        "key {key}: replica {r} holds {:?} (received {:?}), its primary {} holds {:?} (received {:?})",
                        replica.value(key),
                        replica.received_total(key),
                        owners[0],
                        primary.value(key),
                        primary.received_total(key),
                    ));
                }
            }
        }
        None
    }

    /// Whether the run is over: every worker done and, when it settles, the cluster quiescent
    /// with its replicas converged.
    pub(super) fn finished(&self) -> bool {
        if !self.all_done() {
            return false;
        }
        !self.settles() || self.refilled()
    }

    /// The failure of a run past its time limit: unfinished work, a cluster that never
    /// recovered, or replicas that never converged.
    pub(super) fn time_out(&self) -> SimFailure {
        if !self.all_done() {
            return self.fail(Invariant::Completion, self.stuck_report());
        }
        if self.ending && self.job_finished.is_none() && self.refilled() {
            return self.fail(
                Invariant::Completion,
                format!(
                    "every worker left, but after {}ms of virtual time the coordinator has not said the job finished{}",
                    self.now / MS,
                    self.coordinators_said()
                ),
            );
        }
        if self.quiescent() {
            if let Some(detail) = self.divergence() {
                return self.fail(Invariant::ReplicaConvergence, detail);
            }
        }
        let detail = format!(
            "every worker finished, but after {}ms of virtual time the cluster has not recovered: coordinator {:?} on epoch {}, crashes not recovered from {}, restarts pending {}, membership changes pending {}, every range served {}, members {:?} on epochs {:?}, pushes waiting for replicas {:?}",
            self.now / MS,
            self.coordinator().map(|c| c.phase()),
            self.ring_epoch,
            self.plan.open.len(),
            self.plan.restarts_pending,
            self.plan.membership_pending,
            self.served(),
            self.live_members(),
            self.live_members()
                .iter()
                .map(|&s| self.server(s).map_or(0, Server::epoch))
                .collect::<Vec<_>>(),
            self.live_members()
                .iter()
                .map(|&s| self.server(s).map_or(0, Server::unreplicated_pushes))
                .collect::<Vec<_>>(),
        );
        let missing = self
            .ring
            .segments()
            .flat_map(|(range, owners)| owners.iter().map(move |&o| (range, o)))
            .find(|&(range, o)| !self.holds(o, range, false));
        let detail = match missing {
            Some((range, o)) => format!("{detail}; {o} does not hold {range}, which it owns"),
            None => detail,
        };
        self.fail(Invariant::Completion, detail)
    }
}
