//! A job's shape, the nodes it is made of, and whole clusters in one process.

use std::sync::Arc;

use pserver_core::node::NodeLayout;
use pserver_core::ring::RingConfig;
use pserver_core::{
    Codec, Consistency, Coordinator, CoordinatorConfig, DEFAULT_MAX_FRAME, DEFAULT_MAX_SLICE_BYTES,
    Driver, NodeId, Server, ServerConfig, Timing, Updater, Value, Worker, WorkerConfig,
};

use super::handle::{NodeHandle, NodeReport, RuntimeError, WorkerHandle};
use super::{RuntimeConfig, spawn_node};
use crate::mem::MemNetwork;
use crate::{FlowLimits, Transport};

/// The shape of a job: how many nodes of each kind, and everything they must agree on. Nodes
/// are numbered as [`NodeLayout`] says: the coordinator 0, then the servers, then the workers.
///
/// [`ClusterSpec::new`] gives the defaults; change the fields that differ.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterSpec {
    /// Servers.
    pub servers: usize,
    /// Workers.
    pub workers: usize,
    /// The consistency model. Default: sequential.
    pub consistency: Consistency,
    /// How the ring is built. Default: 64 virtual nodes, no replicas, seed 0.
    pub ring: RingConfig,
    /// Values per key. Default 1.
    pub width: usize,
    /// The servers' update rule. Default: [`Updater::Sum`].
    pub updater: Updater,
    /// Timeouts and intervals.
    pub timing: Timing,
    /// The largest frame a node sends or accepts. Default: [`DEFAULT_MAX_FRAME`].
    pub max_frame: usize,
    /// The largest slice a worker puts in one message, and the largest part of an answer to a
    /// range pull; must leave room in `max_frame`. Default: [`DEFAULT_MAX_SLICE_BYTES`].
    pub max_slice_bytes: usize,
    /// Push slices (and, separately, pull slices) a worker keeps on the network. Default 64.
    pub max_slices_in_flight: usize,
    /// Bytes of push slices (and, separately, of pull slices) a worker keeps on the network.
    /// Default: unbounded.
    pub max_bytes_in_flight: u64,
    /// Seed of the workers' retransmission jitter.
    pub seed: u64,
    /// How each node's event loop runs.
    pub runtime: RuntimeConfig,
}

impl ClusterSpec {
    /// A job of `servers` servers and `workers` workers with the defaults.
    pub fn new(servers: usize, workers: usize) -> Self {
        ClusterSpec {
            servers,
            workers,
            consistency: Consistency::Sequential,
            ring: RingConfig {
                vnodes: 64,
                replicas: 0,
                seed: 0,
            },
            width: 1,
            updater: Updater::Sum,
            timing: Timing::default(),
            max_frame: DEFAULT_MAX_FRAME,
            max_slice_bytes: DEFAULT_MAX_SLICE_BYTES,
            max_slices_in_flight: 64,
            max_bytes_in_flight: u64::MAX,
            seed: 0,
            runtime: RuntimeConfig::default(),
        }
    }

    /// This spec with the limits a transport asks for ([`Transport::flow_limits`]) where they
    /// are tighter than its own.
    pub fn within(&self, limits: FlowLimits) -> ClusterSpec {
        let mut spec = self.clone();
        if let Some(bytes) = limits.max_slice_bytes {
            spec.max_slice_bytes = spec.max_slice_bytes.min(bytes);
        }
        if let Some(bytes) = limits.max_bytes_in_flight {
            spec.max_bytes_in_flight = spec.max_bytes_in_flight.min(bytes);
        }
        spec
    }

    /// How the nodes are numbered.
    pub fn layout(&self) -> NodeLayout {
        NodeLayout {
            servers: self.servers,
            workers: self.workers,
        }
    }

    /// Every node id of the job, coordinator first.
    pub fn node_ids(&self) -> Vec<NodeId> {
        let layout = self.layout();
        std::iter::once(layout.coordinator())
            .chain(layout.servers())
            .chain(layout.workers())
            .collect()
    }

    fn worker_config<V: Value>(&self, id: NodeId) -> Result<WorkerConfig, RuntimeError> {
        let mut wc = WorkerConfig::new(id, self.layout().coordinator());
        wc.width = self.width;
        wc.timing = self.timing;
        wc.max_slice_bytes = self.max_slice_bytes;
        wc.max_slices_in_flight = self.max_slices_in_flight;
        wc.max_bytes_in_flight = self.max_bytes_in_flight;
        wc.seed = self.seed;
        let needed = wc.frame_needed::<V>();
        if needed > self.max_frame {
            return Err(RuntimeError::Config(format!(
                "slices of {} bytes with {} values of width {} need frames of {needed} bytes, but the frame limit is {}: lower the slice size or raise the frame limit",
                self.max_slice_bytes,
                V::NAME,
                self.width,
                self.max_frame
            )));
        }
        Ok(wc)
    }

    /// The driver of node `id`, built from this spec; an error if `id` is not part of the job
    /// or the spec cannot work (no servers, a ring the servers cannot hold, slices larger than
    /// frames).
    pub fn driver<V: Value>(&self, id: NodeId) -> Result<Driver<V>, RuntimeError> {
        let layout = self.layout();
        let coordinator = layout.coordinator();
        let codec = Codec::new(self.max_frame);
        let bad = |e: &dyn std::fmt::Display| RuntimeError::Config(e.to_string());
        if self.servers == 0 {
            return Err(RuntimeError::Config(
                "a job needs at least one server".into(),
            ));
        }
        // Validates the job (ring, worker count) for every node, not only the coordinator.
        let mut job = CoordinatorConfig::new(coordinator, self.servers, self.workers);
        job.ring = self.ring;
        job.consistency = self.consistency;
        job.timing = self.timing;
        let boss = Coordinator::new(job).map_err(|e| bad(&e))?;
        let worker_cfg = self.worker_config::<V>(layout.workers().next().unwrap_or(coordinator))?;
        if id == coordinator {
            return Ok(Driver::with_codec(boss, codec));
        }
        if layout.servers().any(|s| s == id) {
            let mut sc = ServerConfig::new(id, coordinator);
            sc.width = self.width;
            sc.timing = self.timing;
            sc.max_reply_bytes = self.max_slice_bytes;
            // Each start of a server process registers as a new incarnation, so that the
            // coordinator tells a restart (state lost) from a resent registration.
            sc.incarnation = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            return Ok(Driver::with_codec(Server::new(sc, self.updater), codec));
        }
        if layout.workers().any(|w| w == id) {
            let mut wc = worker_cfg;
            wc.id = id;
            return Ok(Driver::with_codec(Worker::new(wc), codec));
        }
        Err(RuntimeError::Config(format!(
            "node {id} is not part of a job of {} servers and {} workers (nodes n0..n{})",
            self.servers,
            self.workers,
            self.servers + self.workers
        )))
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
            Ok(spawn_node(driver, transport, spec.runtime.clone()))
        };
        let layout = spec.layout();
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
        spec.max_slice_bytes = 1 << 20;
        let limits = FlowLimits {
            max_slice_bytes: Some(1 << 16),
            max_bytes_in_flight: Some(1 << 22),
        };
        let within = spec.within(limits);
        assert_eq!(within.max_slice_bytes, 1 << 16);
        assert_eq!(within.max_bytes_in_flight, 1 << 22);
        spec.max_slice_bytes = 1 << 10;
        spec.max_bytes_in_flight = 1 << 12;
        let within = spec.within(limits);
        assert_eq!(
            (within.max_slice_bytes, within.max_bytes_in_flight),
            (1 << 10, 1 << 12)
        );
        assert_eq!(spec.within(FlowLimits::default()), spec);
    }
}
