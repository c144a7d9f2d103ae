//! Node identities and roles.

use core::fmt;

use serde::{Deserialize, Serialize};

/// A small integer naming one process of the cluster.
///
/// Node ids are chosen by whoever launches the cluster (or handed out by the coordinator) and are
/// stable for the life of the process; they never encode an address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// What a node does in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Owns membership, the ring and the epoch (the paper's server manager and task scheduler).
    Coordinator,
    /// Holds a share of the parameters, applies pushes through its updater, answers pulls.
    Server,
    /// Computes on its data shard; pushes updates and pulls parameters.
    Worker,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Coordinator => "coordinator",
            Role::Server => "server",
            Role::Worker => "worker",
        })
    }
}

/// A worker's logical clock, advanced by the application once per iteration.
pub type Iteration = u32;

/// Version of the cluster configuration (membership and ring). Every message carries one.
pub type Epoch = u64;

/// Configurations a coordinator term may publish: the epochs of term `t` are
/// `t * EPOCHS_PER_TERM + 1` on. Two coordinators that each believe themselves active (one taking
/// over from the other) publish under different terms, so their epochs never meet
/// (ARCHITECTURE.md §11). A coordinator that publishes this many configurations in one term
/// stops publishing ([`crate::node::Coordinator`]); at one a second that takes thirty years.
pub const EPOCHS_PER_TERM: Epoch = 1_000_000_000;

/// The first epoch a coordinator of `term` publishes.
pub fn first_epoch_of_term(term: u64) -> Epoch {
    term.saturating_mul(EPOCHS_PER_TERM).saturating_add(1)
}

/// The term whose coordinator published `epoch`.
pub(crate) fn term_of_epoch(epoch: Epoch) -> u64 {
    epoch.saturating_sub(1) / EPOCHS_PER_TERM
}

/// Nanoseconds since an origin that the driver chooses. Passed into every call; the core never
/// reads a clock of its own.
pub type Time = u64;

/// The standby coordinators a node knows from the start (ARCHITECTURE.md §11): a short list
/// kept inline, so that the node configurations holding it stay `Copy`. Build it with
/// [`Standbys::new`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Standbys {
    ids: [Option<NodeId>; Standbys::MAX],
}

/// More standby coordinators than [`Standbys::MAX`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{given} standby coordinators given, at most {max} are kept", max = Standbys::MAX)]
pub struct TooManyStandbys {
    /// How many were given.
    pub given: usize,
}

impl Standbys {
    /// The most standbys a job may have: each acknowledges every configuration before it is
    /// published, so that every one more slows every change.
    pub const MAX: usize = 4;

    /// The standbys `ids`, sorted, each once.
    pub fn new(ids: &[NodeId]) -> Result<Standbys, TooManyStandbys> {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() > Standbys::MAX {
            return Err(TooManyStandbys {
                given: sorted.len(),
            });
        }
        let mut standbys = Standbys::default();
        for (slot, id) in standbys.ids.iter_mut().zip(sorted) {
            *slot = Some(id);
        }
        Ok(standbys)
    }

    /// The standbys, sorted.
    pub fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.ids.iter().map_while(|id| *id)
    }

    /// The standbys as a sorted list.
    pub fn to_vec(&self) -> Vec<NodeId> {
        self.iter().collect()
    }

    /// True with no standby.
    pub fn is_empty(&self) -> bool {
        self.ids[0].is_none()
    }
}

/// The conventional numbering of a cluster's nodes, used by the simulator, the models and
/// single-process runs: the coordinator is node 0, then the servers, then the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeLayout {
    /// Number of servers.
    pub servers: usize,
    /// Number of workers.
    pub workers: usize,
}

impl NodeLayout {
    /// The coordinator: node 0.
    pub fn coordinator(self) -> NodeId {
        NodeId(0)
    }

    /// The servers: nodes `1..=servers`.
    pub fn servers(self) -> impl Iterator<Item = NodeId> {
        (1..=self.servers as u32).map(NodeId)
    }

    /// The workers: the nodes after the servers.
    pub fn workers(self) -> impl Iterator<Item = NodeId> {
        let first = self.servers as u32 + 1;
        (first..first + self.workers as u32).map(NodeId)
    }
}
