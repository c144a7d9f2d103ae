//! Coordinator faults and the `single-coordinator` invariant (see "Coordinator faults" in the
//! module docs of [`crate::sim`]).

use pserver_core::Driver;
use pserver_core::node::Coordinator;
use pserver_core::wire::ClusterConfig;
use pserver_core::{NodeId, Time};

use super::{Action, World};
use crate::sim::{Invariant, MS, SimFailure};

/// How long a crashed coordinator stays down before its process starts again: half the runs
/// well within the heartbeat timeout (a supervisor restarting it at once, before anybody
/// noticed), half past it.
const COORDINATOR_DOWN: [Time; 2] = [300 * MS, 3_000 * MS];

impl World<'_> {
    /// Whether the coordinator in force has a standby holding its state: a fault before that
    /// would end the job, which is no fault the job was given a standby for.
    fn standby_taken(&self) -> bool {
        self.coordinator()
            .filter(|c| c.is_active() && !self.down.contains(&c.id()))
            .and_then(Coordinator::config)
            .is_some_and(|c| !c.standbys.is_empty())
    }

    /// Where each coordinator stands, for a failure's detail: empty with one coordinator.
    pub(super) fn coordinators_said(&self) -> String {
        if self.cfg.standby_id().is_none() {
            return String::new();
        }
        let said: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|(id, d)| Some((id, d.node().as_coordinator()?)))
            .map(|(id, c)| {
                let held = c.config();
                format!(
                    "{id} {} term {} epoch {} standbys {:?}{}",
                    if c.is_active() { "active" } else { "standby" },
                    c.term(),
                    held.map_or(0, |h| h.epoch),
                    held.map(|h| h.standbys.clone()).unwrap_or_default(),
                    if self.down.contains(id) {
                        " (down)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        format!(" (coordinators: {})", said.join("; "))
    }

    /// Kills the active coordinator's process, once it has a standby; later otherwise.
    pub(super) fn crash_coordinator(&mut self) -> Option<NodeId> {
        if !self.standby_taken() {
            self.schedule(self.now + 100 * MS, Action::CrashCoordinator);
            return None;
        }
        let active = self.active;
        self.down.insert(active);
        self.wakeups.remove(&active);
        self.coordinator_fault_at.get_or_insert(self.now);
        let down = COORDINATOR_DOWN[self.rng.below(2) as usize];
        self.schedule(self.now + down, Action::RestartCoordinator(active));
        Some(active)
    }

    /// Starts a crashed coordinator's process again, knowing nothing, as `pserver coordinator`
    /// starts it: the job's first coordinator as at the job's start, which must neither pass
    /// for the one in charge nor hold off a takeover (ARCHITECTURE.md §11), a standby as a
    /// standby.
    pub(super) fn restart_coordinator(&mut self, node: NodeId) -> Result<(), SimFailure> {
        let job = self.cfg.job();
        let fresh = if node == self.cfg.coordinator_id() {
            Coordinator::new(job.coordinator_config())
        } else {
            Coordinator::standby(job.standby_config(node))
        }
        .map_err(|e| self.fail(Invariant::Setup, e.to_string()))?;
        let mut d = Driver::new(fresh);
        #[cfg(feature = "mutations")]
        d.set_mutation(self.mutation);
        d.start(self.now);
        self.nodes.insert(node, d);
        self.down.remove(&node);
        self.highest.remove(&node);
        self.policies.restarted(node);
        Ok(())
    }

    /// Cuts the active coordinator off from every node for `length`, once it has a standby.
    pub(super) fn isolate_coordinator(&mut self, length: Time) -> Option<NodeId> {
        if !self.standby_taken() {
            self.schedule(self.now + 100 * MS, Action::IsolateCoordinator(length));
            return None;
        }
        let active = self.active;
        self.net.isolate(active);
        self.coordinator_fault_at.get_or_insert(self.now);
        self.schedule(self.now + length, Action::Heal(active));
        Some(active)
    }

    /// A configuration some coordinator decided: it must agree with every other of its epoch.
    pub(super) fn seen_config(&mut self, config: &ClusterConfig) -> Result<(), SimFailure> {
        match self.configs_seen.get(&config.epoch) {
            Some(known) if known != config => Err(self.fail(
                Invariant::SingleCoordinator,
                format!(
                    "two configurations of epoch {}: one of coordinator {} term {}, one of coordinator {} term {}",
                    config.epoch, known.coordinator, known.term, config.coordinator, config.term
                ),
            )),
            Some(_) => Ok(()),
            None => {
                self.configs_seen.insert(config.epoch, config.clone());
                Ok(())
            }
        }
    }

    /// `single-coordinator` over what every running process holds: each configuration agrees
    /// with every other of its epoch, and no coordinator's term and no member's epoch goes
    /// back.
    pub(super) fn check_single_coordinator(&mut self) -> Result<(), SimFailure> {
        let held: Vec<(NodeId, Option<ClusterConfig>, Option<u64>)> = self
            .nodes
            .iter()
            .filter(|(id, _)| !self.is_down(**id))
            .map(|(&id, d)| {
                let term = d.node().as_coordinator().map(Coordinator::term);
                (id, d.node().config().cloned(), term)
            })
            .collect();
        for (id, config, coordinator_term) in held {
            if let Some(config) = &config {
                self.seen_config(config)?;
            }
            let held = config.as_ref().map_or((0, 0), |c| (c.term, c.epoch));
            let now = match coordinator_term {
                // A coordinator's term never goes back, nor, within the term it holds, the
                // epoch of the configuration it holds.
                Some(term) => (term, if term == held.0 { held.1 } else { 0 }),
                None => held,
            };
            let before = self.highest.get(&id).copied().unwrap_or_default();
            if now < before {
                return Err(self.fail(
                    Invariant::SingleCoordinator,
                    format!(
                        "{id} went back from term {} epoch {} to term {} epoch {}",
                        before.0, before.1, now.0, now.1
                    ),
                ));
            }
            self.highest.insert(id, now);
        }
        Ok(())
    }
}
