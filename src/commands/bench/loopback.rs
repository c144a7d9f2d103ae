//! Clusters on loopback, over each transport.

use pserver_runtime::{ClusterSpec, LocalCluster, RuntimeError};
use pserver_transport::mem::MemNetwork;
use pserver_transport::tcp::Secret;

use super::options::Transport as Wire;
use super::{BenchError, runtime_err};
use crate::apps::loopback::{Bound, Sockets, bind};

/// A cluster over `wire` on loopback.
pub(super) async fn start(
    spec: &ClusterSpec,
    wire: Wire,
    drop: f64,
) -> Result<LocalCluster<f32>, BenchError> {
    if wire == Wire::Mem {
        return Ok(LocalCluster::start(spec, &MemNetwork::reliable())?);
    }
    let sockets = if wire == Wire::Tcp {
        Sockets::Tcp
    } else {
        Sockets::Udp
    };
    let secret = Secret::new(b"pserver-bench".to_vec());
    let transports = bind(spec, sockets, "bench", &secret, drop)
        .await
        .map_err(runtime_err)?;
    Ok(LocalCluster::start_over(spec, |id| {
        transports
            .get(&id)
            .map(Bound::shared)
            .ok_or_else(|| RuntimeError::Config(format!("no transport for {id}")))
    })?)
}
