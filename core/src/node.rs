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
