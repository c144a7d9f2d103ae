//! A node's view of the cluster: the configuration of an epoch and the ring built from it.

use crate::effects::Refusal;
use crate::key::Key;
use crate::message::ClusterConfig;
use crate::node::{Epoch, NodeId};
use crate::ring::{Ring, RingError};

/// A configuration together with its ring (rebuilt locally; rings are deterministic).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Cluster {
    pub(crate) config: ClusterConfig,
    pub(crate) ring: Ring,
}

impl Cluster {
    pub(crate) fn new(config: ClusterConfig) -> Result<Cluster, RingError> {
        let ring = Ring::new(config.servers.iter().copied(), config.ring)?;
        Ok(Cluster { config, ring })
    }

    /// The cluster of `config` if it supersedes `current`: a newer epoch of the same job, with a
    /// ring that can be built. The configuration in force again is `Ok(None)` (coordinators
    /// resend it freely). The consistency model is fixed for the life of a job, so a
    /// configuration that changes it belongs to another job and is refused, as is a corrupt one.
    pub(crate) fn successor(
        current: Option<&Cluster>,
        config: ClusterConfig,
    ) -> Result<Option<Cluster>, Refusal> {
        if let Some(current) = current {
            if config == current.config {
                return Ok(None);
            }
            if config.epoch <= current.epoch() {
                return Err(Refusal::StaleEpoch {
                    epoch: config.epoch,
                    current: current.epoch(),
                });
            }
            if config.consistency != current.config.consistency {
                return Err(Refusal::ForeignJob);
            }
        }
        Cluster::new(config)
            .map(Some)
            .map_err(|_| Refusal::ForeignJob)
    }

    pub(crate) fn epoch(&self) -> Epoch {
        self.config.epoch
    }

    pub(crate) fn is_worker(&self, node: NodeId) -> bool {
        self.config.workers.contains(&node)
    }

    pub(crate) fn workers(&self) -> &[NodeId] {
        &self.config.workers
    }

    pub(crate) fn servers(&self) -> &[NodeId] {
        &self.config.servers
    }

    pub(crate) fn primary(&self, key: Key) -> NodeId {
        self.ring.primary(key)
    }
}
