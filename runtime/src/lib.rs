//! # pserver-runtime
//!
//! The API an application of pserver uses: run coordinators, servers and workers on tokio over any
//! [`Transport`] (in memory, TCP or UDP, from `pserver-transport`, or one of your own), and push
//! and pull through a worker's [`WorkerHandle`]. [`LocalCluster`] starts a whole cluster in one
//! process; [`spawn_node`] starts one node of a cluster that spans processes. A [`ClusterSpec`] is
//! a job ([`JobSpec`](pserver_core::JobSpec)) and how this process's runtime drives its nodes.
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
//!
//! # The event loop
//!
//! One tokio task per node drives the core's [`Driver`]. Each node's event loop waits on four
//! things at once: a frame from the transport, the driver's next timer deadline, a call from the
//! application ([`WorkerHandle`]) and a request to stop. Whatever happens, it feeds the driver,
//! then sends every frame the driver has and hands every event to whoever waits for it. No protocol
//! logic lives here: dispatch, timers and refusals are the driver's (ARCHITECTURE.md §1).
//!
//! A frame arrives through [`Driver::handle_frame_bytes`], its values read where the transport
//! received them; the timers are one `sleep_until` on [`Driver::poll_timeout`]. Frames leave
//! through [`Transport::send_parts`], taken from [`Driver::poll_output_parts`]: the head, then
//! each values trailer lent from where it is kept, so that a transport that writes vectored
//! (TCP) sends a push's values from the application's vector.
//!
//! [`WorkerHandle`] talks to the loop over a bounded queue ([`RuntimeConfig::command_queue`]), and
//! the loop takes no more calls while [`RuntimeConfig::max_open_requests`] requests are open, so a
//! fast application waits instead of growing memory. What a worker puts on the network is bounded
//! by the tighter of the job's settings and what the transport asks for ([`ClusterSpec::within`]).
//!
//! # When a call returns
//!
//! A push completes twice: [`WorkerHandle::push`] (or awaiting the [`PushTicket`] from
//! [`WorkerHandle::start_push`]) returns on [`pserver_core::events::WorkerEvent::PushDone`],
//! once the push counts for its iteration, and [`WorkerHandle::push_durable`] (or
//! [`PushTicket::durable`]) on [`pserver_core::events::WorkerEvent::PushDurable`], once every
//! replica holds it. The two differ only in sequential mode with replicas (ARCHITECTURE.md §8).
//!
//! Stopping a worker first finishes the calls it accepted and waits for its pushes to become
//! durable (within [`RuntimeConfig::drain_timeout`]). A waiter left open fails with
//! [`RuntimeError::ShutDown`] ([`RuntimeError::Fenced`] if the coordinator removed the worker,
//! [`RuntimeError::Left`] once it left), never hangs, and so does every later call.
//! [`WorkerHandle::leave`] waits for what the application started, asks the coordinator to take the
//! worker out and returns on the confirming fence.
//!
//! Every wait has an end: a worker whose open requests see nothing complete for
//! [`RuntimeConfig::stall_warning`] logs which servers and keys its unanswered slices wait for
//! ([`Worker::waits`](pserver_core::node::Worker::waits)), at most that often, and past
//! [`RuntimeConfig::stall_limit`] fails them all with [`RuntimeError::Stalled`], saying the same.
//! The limit is the core's ([`pserver_core::Timing::stall_limit`]): the worker says it stalled
//! ([`pserver_core::events::WorkerEvent::Stalled`]) and the loop ends on that event.
//!
//! # What a node reports
//!
//! The loop publishes its counters a few times a second ([`NodeHandle::metrics`]), which a process
//! serves as Prometheus `/metrics`; [`NodeHandle::run_until`] lets a process serving a node end
//! when the node is fenced, not only on a signal. The loop logs the refusals the driver reports.
//! Refused connections, datagrams and messages, frames a transport drops (a full TCP send queue, a
//! partial UDP frame) and sends that fail are counted (the transports' stats, [`NodeMetrics`]) and
//! logged at a bounded rate ([`refusal_log`](pserver_transport::refusal_log): the first of each
//! window in full, a summary by reason at its end).

pub mod checkpoint;
mod cluster;
mod handle;
mod node_loop;

/// The protocol core whose types this crate's API takes and gives.
pub use pserver_core as core;
/// The transports a node runs over, re-exported so that an application names one version.
pub use pserver_transport as transport;

pub use cluster::{ClusterSpec, LocalCluster, LocalReport};
pub use handle::{
    LeaveHandle, NodeHandle, NodeMetrics, NodeReport, PushTicket, RuntimeError, WorkerHandle,
};
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
    /// A worker whose oldest open request waits this long gives up: every open and later
    /// call fails with [`RuntimeError::Stalled`], saying what it waited for, and the loop
    /// ends. The bound is the core's ([`pserver_core::Timing::stall_limit`], set from this
    /// one; a job that sets it there is bounded by it too), and calls made before the worker
    /// is ready are held to it as well. A server whose coordinator is silent this long ends
    /// too ([`RuntimeError::CoordinatorSilent`]): a coordinator that stopped after the job
    /// ended never tells a server cut off at that moment. Default: never.
    pub stall_limit: Option<Duration>,
    /// A server: where it writes its whole-job checkpoints ([`checkpoint::CheckpointDir`],
    /// ARCHITECTURE.md §11), one file per cut, the newest few kept. Default: none; a job
    /// that takes checkpoints then waits at its first cut for ever, so give every server one.
    pub checkpoints: Option<std::path::PathBuf>,
    /// A server: offer the checkpoints in `checkpoints` that read back whole, so that the job
    /// resumes from the newest every server holds. Default: false, the job starts over.
    pub resume: bool,
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
            checkpoints: None,
            resume: false,
        }
    }
}

#[allow(unused_imports)] // for the docs' links
use {pserver_core::Driver, pserver_transport::Transport};
