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

/// Nanoseconds since an origin that the driver chooses. Passed into every call; the core never
/// reads a clock of its own.
pub type Time = u64;

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
