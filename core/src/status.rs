//! Where a job stands, as its coordinator sees it: what an operator's status command prints
//! (ARCHITECTURE.md §2).

use core::fmt;

use crate::ids::{Epoch, NodeId, Role};
use crate::key::KeyRange;

/// Where the coordinator is in the life of the job's membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Waiting for the expected servers and workers to register; no configuration yet.
    Forming,
    /// A configuration is in force and no server is joining or leaving.
    Running,
    /// Servers are joining or leaving: those the next ring gives ranges copy them; the next
    /// ring is published once every one of them has caught up.
    Reconfiguring,
}

/// What the coordinator knows of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeState {
    /// Registered; the job has not started.
    Registered,
    /// A server on the ring, or a worker in the job, heard from lately.
    Live,
    /// A server copying the ranges the next ring gives it.
    Joining,
    /// A server whose ranges are moving to the others.
    Leaving,
    /// A member that missed more than half the heartbeat checks the timeout allows: it is
    /// declared dead if it stays silent.
    Silent,
    /// A server silent past the timeout but kept on the ring (`Event::RingDegraded`).
    Kept,
    /// A member declared dead: removed from the job.
    Dead,
    /// A worker that left the job.
    Left,
}

impl NodeState {
    /// Whether the job is worse off for this node's state.
    pub fn is_degraded(self) -> bool {
        matches!(self, NodeState::Silent | NodeState::Kept | NodeState::Dead)
    }

    fn word(self) -> &'static str {
        match self {
            NodeState::Registered => "registered",
            NodeState::Live => "live",
            NodeState::Joining => "joining",
            NodeState::Leaving => "leaving",
            NodeState::Silent => "silent",
            NodeState::Kept => "kept",
            NodeState::Dead => "dead",
            NodeState::Left => "left",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.word())
    }
}

/// One node of the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeStatus {
    /// The node.
    pub id: NodeId,
    /// Its role.
    pub role: Role,
    /// What the coordinator knows of it.
    pub state: NodeState,
}

/// Where a job stands, as its coordinator sees it ([`crate::node::Coordinator::status`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ClusterStatus {
    /// The coordinator.
    pub coordinator: NodeId,
    /// The coordinator's term: 0, the first, while a job has one coordinator.
    pub term: u64,
    /// Whether it publishes configurations, rather than standing by (ARCHITECTURE.md §11): a
    /// standby's view is the active one's state as last replicated to it.
    pub active: bool,
    /// The epoch of the configuration in force (0 before the job starts).
    pub epoch: Epoch,
    /// Where the membership stands.
    pub phase: Phase,
    /// Every node the coordinator knows, by id.
    pub nodes: Vec<NodeStatus>,
    /// Key ranges lost with every holder ([`crate::wire::ClusterConfig::lost`]).
    pub lost: Vec<KeyRange>,
    /// Replicas each key has besides its primary on the ring in force.
    pub replicas_held: u32,
    /// The ring's `k`.
    pub replicas_asked: u32,
    /// Whether every worker left, its work done ([`crate::Event::JobFinished`]).
    pub finished: bool,
    /// Iterations between whole-job checkpoints, 0 for none, and the last cut every server
    /// wrote, 0 for none yet ([`crate::wire::Checkpoints`]).
    pub checkpoints: crate::wire::Checkpoints,
}

impl ClusterStatus {
    /// Whether the job runs worse than it was set up to: a node silent, kept or dead, a range
    /// lost, or fewer replicas than asked.
    pub fn is_degraded(&self) -> bool {
        self.nodes.iter().any(|n| n.state.is_degraded())
            || !self.lost.is_empty()
            || self.replicas_held < self.replicas_asked
    }
}

/// One line per fact, `name value...`, so that scripts can read it; the last says whether the
/// job is degraded.
impl fmt::Display for ClusterStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = match self.phase {
            Phase::Forming => "forming",
            Phase::Running => "running",
            Phase::Reconfiguring => "reconfiguring",
        };
        let mode = if self.active { "active" } else { "standby" };
        writeln!(
            f,
            "coordinator {} term {} {mode}",
            self.coordinator, self.term
        )?;
        writeln!(f, "epoch {} {phase}", self.epoch)?;
        writeln!(
            f,
            "replicas {} of {}",
            self.replicas_held, self.replicas_asked
        )?;
        for n in &self.nodes {
            writeln!(f, "node {} {} {}", n.id, n.role, n.state)?;
        }
        let lost: Vec<String> = self.lost.iter().map(ToString::to_string).collect();
        writeln!(f, "lost {} {}", lost.len(), lost.join(" "))?;
        writeln!(f, "finished {}", if self.finished { "yes" } else { "no" })?;
        match self.checkpoints {
            c if c.every == 0 => writeln!(f, "checkpoint none taken")?,
            c if c.complete == 0 => writeln!(f, "checkpoint none yet, every {}", c.every)?,
            c => writeln!(
                f,
                "checkpoint before iteration {}, every {}",
                c.complete, c.every
            )?,
        }
        if self.checkpoints.writing() {
            writeln!(
                f,
                "writing checkpoint before iteration {}",
                self.checkpoints.taken
            )?;
        }
        write!(
            f,
            "degraded {}",
            if self.is_degraded() { "yes" } else { "no" }
        )
    }
}
