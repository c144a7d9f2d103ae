//! A job's shape, the nodes it is made of, and whole clusters in one process.

use std::path::PathBuf;
use std::sync::Arc;

use pserver_core::{Driver, JobSpec, KvPairs, NodeId, Value};
use tokio::sync::watch;

use super::handle::{NodeHandle, NodeMetrics, NodeReport, RuntimeError, WorkerHandle};
use super::{RuntimeConfig, spawn_node};
use pserver_transport::mem::MemNetwork;
use pserver_transport::{FlowLimits, Transport};

/// A job ([`JobSpec`]: its shape and everything its nodes agree on) and how this process's
/// runtime drives its nodes.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterSpec {
    /// The job.
    pub job: JobSpec,
    /// How each node's event loop runs.
    pub runtime: RuntimeConfig,
    /// Rows the job starts from (a saved model: a warm start), given to every server built
    /// here ([`pserver_core::driver::ServerCalls::start_from`]); each keeps those of its keys. Default:
    /// none, every value starting at zero.
    pub initial: Option<Arc<KvPairs<f64>>>,
    /// Where the servers built here write their whole-job checkpoints: server `N` in
    /// `server-N` below it ([`RuntimeConfig::checkpoints`]). Default: none.
    pub checkpoints: Option<PathBuf>,
}

impl ClusterSpec {
    /// A job of `servers` servers and `workers` workers with the defaults.
    pub fn new(servers: usize, workers: usize) -> Self {
        ClusterSpec::of(JobSpec::new(servers, workers))
    }

    /// `job`, driven with the runtime's defaults.
    pub fn of(job: JobSpec) -> Self {
        ClusterSpec {
            job,
            runtime: RuntimeConfig::default(),
            initial: None,
            checkpoints: None,
        }
    }

    /// This spec with the limits a transport asks for ([`Transport::flow_limits`]) where they
    /// are tighter than its own.
    pub fn within(&self, limits: FlowLimits) -> ClusterSpec {
        let mut spec = self.clone();
        if let Some(bytes) = limits.max_slice_bytes {
            spec.job.max_slice_bytes = spec.job.max_slice_bytes.min(bytes);
            spec.job.max_reply_bytes = spec.job.max_reply_bytes.min(bytes);
        }
        if let Some(bytes) = limits.max_bytes_in_flight {
            spec.job.max_bytes_in_flight = spec.job.max_bytes_in_flight.min(bytes);
        }
        spec
    }

    /// The checkpoint directory of server `id`, under [`ClusterSpec::checkpoints`].
    pub fn checkpoints_of(&self, id: NodeId) -> Option<PathBuf> {
        let root = self.checkpoints.as_ref()?;
        Some(root.join(format!("server-{}", id.0)))
    }

    /// The driver of node `id`, built from the job ([`JobSpec::driver`]); an error if `id` is
    /// not part of the job or the job cannot work.
    pub fn driver<V: Value>(&self, id: NodeId) -> Result<Driver<V>, RuntimeError> {
        // Each start of a server process registers as a new incarnation, so that the
        // coordinator tells a restart (state lost) from a resent registration.
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut driver = self.job.driver(id, incarnation)?;
        let server = driver.node().as_server().is_some();
        if let Some(rows) = self.initial.as_ref().filter(|_| server) {
            let values: Vec<V> = rows.values().iter().map(|&v| V::from_f64(v)).collect();
            let width = rows.width().max(1);
            let keyed = rows.keys().iter().copied().zip(values.chunks(width));
            driver
                .server()
                .map_err(|e| RuntimeError::Config(e.to_string()))?
                .start_from(keyed)
                .map_err(|e| RuntimeError::Config(format!("the rows to start from: {e}")))?;
        }
        Ok(driver)
    }
}

/// A whole cluster in this process, over one [`MemNetwork`]: for tests, and for
/// `pserver local`.
#[derive(Debug)]
pub struct LocalCluster<V: Value> {
    /// The workers' application handles, in node order.
    pub workers: Vec<WorkerHandle<V>>,
    coordinator: NodeHandle<Driver<V>>,
    servers: Vec<NodeHandle<Driver<V>>>,
    worker_nodes: Vec<NodeHandle<Driver<V>>>,
}

/// What a [`LocalCluster`] left behind when it stopped.
#[derive(Debug)]
pub struct LocalReport<V: Value> {
    /// The coordinator.
    pub coordinator: NodeReport<Driver<V>>,
    /// The servers, in node order.
    pub servers: Vec<NodeReport<Driver<V>>>,
    /// The workers, in node order.
    pub workers: Vec<NodeReport<Driver<V>>>,
}

impl<V: Value + Send + Sync> LocalCluster<V> {
    /// Starts every node of `spec` on `network` (on the current tokio runtime). The nodes
    /// register with the coordinator; [`WorkerHandle::ready`] says when the job has begun.
    pub fn start(spec: &ClusterSpec, network: &MemNetwork) -> Result<Self, RuntimeError> {
        Self::start_over(spec, |id| {
            let transport = network
                .endpoint(id)
                .map_err(|e| RuntimeError::Config(e.to_string()))?;
            Ok(Arc::new(transport))
        })
    }

    /// Starts every node of `spec`, each over the transport `endpoint` gives for its id (TCP
    /// connections on loopback, say).
    pub fn start_over(
        spec: &ClusterSpec,
        mut endpoint: impl FnMut(NodeId) -> Result<Arc<dyn Transport>, RuntimeError>,
    ) -> Result<Self, RuntimeError> {
        let mut spawn = |id: NodeId| -> Result<_, RuntimeError> {
            let transport = endpoint(id)?;
            let driver = spec.within(transport.flow_limits()).driver::<V>(id)?;
            let mut runtime = spec.runtime.clone();
            runtime.checkpoints = spec.checkpoints_of(id);
            Ok(spawn_node(driver, transport, runtime))
        };
        let layout = spec.job.layout();
        let coordinator = spawn(layout.coordinator())?.node;
        let mut servers = Vec::new();
        for id in layout.servers() {
            servers.push(spawn(id)?.node);
        }
        let mut workers = Vec::new();
        let mut worker_nodes = Vec::new();
        for id in layout.workers() {
            let spawned = spawn(id)?;
            worker_nodes.push(spawned.node);
            workers.extend(spawned.worker);
        }
        Ok(LocalCluster {
            workers,
            coordinator,
            servers,
            worker_nodes,
        })
    }

    /// The latest counts of node `id` (`None` if it is not one of the cluster's).
    pub fn metrics(&self, id: NodeId) -> Option<NodeMetrics> {
        std::iter::once(&self.coordinator)
            .chain(&self.servers)
            .chain(&self.worker_nodes)
            .find(|n| n.id() == id)
            .map(NodeHandle::metrics)
    }

    /// The counts of node `id` as they change, the last of them kept once the node has
    /// stopped (`None` if it is not one of the cluster's): read after
    /// [`LocalCluster::shutdown`] for a run's final counts.
    pub fn metrics_receiver(&self, id: NodeId) -> Option<watch::Receiver<NodeMetrics>> {
        std::iter::once(&self.coordinator)
            .chain(&self.servers)
            .chain(&self.worker_nodes)
            .find(|n| n.id() == id)
            .map(NodeHandle::metrics_receiver)
    }

    /// Stops the workers (each finishing what it started), then the servers and the
    /// coordinator, and returns what each left behind.
    pub async fn shutdown(self) -> Result<LocalReport<V>, RuntimeError> {
        let mut workers = Vec::new();
        for node in self.worker_nodes {
            workers.push(node.shutdown().await?);
        }
        let mut servers = Vec::new();
        for node in self.servers {
            servers.push(node.shutdown().await?);
        }
        let coordinator = self.coordinator.shutdown().await?;
        Ok(LocalReport {
            coordinator,
            servers,
            workers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transport_s_limits_apply_only_where_they_are_tighter() {
        let mut spec = ClusterSpec::new(1, 1);
        spec.job.max_slice_bytes = 1 << 20;
        spec.job.max_reply_bytes = 1 << 21;
        let limits = FlowLimits {
            max_slice_bytes: Some(1 << 16),
            max_bytes_in_flight: Some(1 << 22),
        };
        let within = spec.within(limits).job;
        assert_eq!(within.max_slice_bytes, 1 << 16);
        assert_eq!(within.max_reply_bytes, 1 << 16);
        assert_eq!(within.max_bytes_in_flight, 1 << 22);
        spec.job.max_slice_bytes = 1 << 10;
        spec.job.max_reply_bytes = 1 << 11;
        spec.job.max_bytes_in_flight = 1 << 12;
        let within = spec.within(limits).job;
        assert_eq!(
            (within.max_slice_bytes, within.max_reply_bytes),
            (1 << 10, 1 << 11)
        );
        assert_eq!(within.max_bytes_in_flight, 1 << 12);
        assert_eq!(spec.within(FlowLimits::default()), spec);
    }
}
