//! # pserver-runtime
//!
//! The API an application of pserver uses: run coordinators, servers and workers on tokio over
//! any [`Transport`] (in memory, TCP or UDP, from `pserver-transport`, or one of your own), and
//! push and pull through a worker's [`WorkerHandle`]. [`LocalCluster`] starts a whole cluster in
//! one process; [`spawn_node`] starts one node of a cluster that spans processes.
//!
//! One tokio task per node drives the core's [`Driver`].
//! Each node's event loop waits on four things at once: a frame from the transport, the
//! driver's next timer deadline, a call from the application ([`WorkerHandle`]) and a request to
//! stop. Whatever happens, it feeds the driver, then sends every frame the driver has and hands
//! every event to whoever waits for it. No protocol logic lives here: dispatch, timers and
//! refusals are the driver's (ARCHITECTURE.md §1).
//!
//! ```
//! use pserver_core::{KeyList, KeySelection, KvPairs};
//! use pserver_transport::mem::MemNetwork;
//! use pserver_runtime::{ClusterSpec, LocalCluster};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! rt.block_on(async {
//!     let spec = ClusterSpec::new(1, 1);
//!     let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &MemNetwork::reliable())?;
//!     let worker = &cluster.workers[0];
//!     worker.push(KvPairs::new(vec![7], vec![5], 1)?).await?;
//!     worker.advance().await?;
//!     let keys = KeySelection::Keys(KeyList::new(vec![7])?);
//!     assert_eq!(worker.pull(keys).await?.values(), &[5]);
//!     cluster.shutdown().await?;
//!     Ok(())
//! })
//! # }
//! ```

mod cluster;
mod handle;
mod node_loop;

/// The protocol core whose types this crate's API takes and gives.
pub use pserver_core as core;
/// The transports a node runs over, re-exported so that an application names one version.
pub use pserver_transport as transport;

pub use cluster::{ClusterSpec, LocalCluster, LocalReport};
pub use handle::{NodeHandle, NodeMetrics, NodeReport, PushTicket, RuntimeError, WorkerHandle};
pub use node_loop::{Spawned, spawn_node};

use std::time::Duration;

use pserver_core::wire::ClusterConfig;

/// How a node's event loop runs. [`RuntimeConfig::default`] suits most jobs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeConfig {
    /// Application calls queued in front of a worker before callers wait. Default 64.
    pub command_queue: usize,
    /// Requests a worker has open before it takes no further calls. Default 256.
    pub max_open_requests: usize,
    /// How long a stopping worker waits for its open requests to complete. Default 10 s.
    pub drain_timeout: Duration,
    /// Start with this configuration in force (static membership) instead of registering.
    pub configured: Option<ClusterConfig>,
    /// A worker with requests open that sees none complete for this long says what it waits
    /// for (which servers, which keys), again at most this often. Default 10 s.
    pub stall_warning: Duration,
    /// A worker that sees none of its open requests complete for this long gives up: every
    /// open and later call fails with [`RuntimeError::Stalled`], saying what it waited for,
    /// and the loop ends. Default: never.
    pub stall_limit: Option<Duration>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            command_queue: 64,
            max_open_requests: 256,
            drain_timeout: Duration::from_secs(10),
            configured: None,
            stall_warning: Duration::from_secs(10),
            stall_limit: None,
        }
    }
}

#[allow(unused_imports)] // for the docs' links
use {pserver_core::Driver, pserver_transport::Transport};
