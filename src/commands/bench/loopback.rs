//! Clusters on loopback, over each transport.

use std::collections::BTreeMap;
use std::sync::Arc;

use pserver_core::NodeId;
use pserver_runtime::{ClusterSpec, LocalCluster, RuntimeError};
use pserver_transport::mem::MemNetwork;
use pserver_transport::tcp::{Secret, TcpConfig, TcpTransport};
use pserver_transport::udp::{UdpConfig, UdpTransport};
use pserver_transport::{Transport, TransportError};

use super::options::Transport as Wire;
use super::{BenchError, runtime_err};

/// A cluster over `wire` on loopback.
pub(super) async fn start(
    spec: &ClusterSpec,
    wire: Wire,
    drop: f64,
) -> Result<LocalCluster<f32>, BenchError> {
    if wire == Wire::Mem {
        return Ok(LocalCluster::start(spec, &MemNetwork::reliable())?);
    }
    let transports = bind_transports(spec, wire, drop)
        .await
        .map_err(runtime_err)?;
    Ok(LocalCluster::start_over(spec, |id| {
        transports
            .get(&id)
            .cloned()
            .ok_or_else(|| RuntimeError::Config(format!("no transport for {id}")))
    })?)
}

/// A transport over `wire` (TCP, else UDP) for every node of `spec`, each on its own loopback
/// port. Every socket is bound before the peer tables are built and handed to its transport
/// as it is, so no other socket can take a port in between.
async fn bind_transports(
    spec: &ClusterSpec,
    wire: Wire,
    drop: f64,
) -> Result<BTreeMap<NodeId, Arc<dyn Transport>>, TransportError> {
    enum Bound {
        Tcp(std::net::TcpListener),
        Udp(std::net::UdpSocket),
    }
    let probe = |e| TransportError::Io {
        context: "binding a loopback port".into(),
        source: e,
    };
    let mut addrs = BTreeMap::new();
    let mut bound = Vec::new();
    for id in spec.job.node_ids() {
        let (socket, addr) = if wire == Wire::Tcp {
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(probe)?;
            let addr = l.local_addr().map_err(probe)?;
            (Bound::Tcp(l), addr)
        } else {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").map_err(probe)?;
            let addr = s.local_addr().map_err(probe)?;
            (Bound::Udp(s), addr)
        };
        addrs.insert(id, addr);
        bound.push((id, socket));
    }
    let secret = Secret::new(b"pserver-bench".to_vec());
    let mut transports: BTreeMap<NodeId, Arc<dyn Transport>> = BTreeMap::new();
    for (id, socket) in bound {
        let t: Arc<dyn Transport> = match socket {
            Bound::Tcp(listener) => {
                let mut cfg =
                    TcpConfig::new(id, addrs[&id], addrs.clone(), "bench", secret.clone());
                cfg.max_frame = spec.job.max_frame + 64;
                Arc::new(TcpTransport::with_listener(cfg, listener).await?)
            }
            Bound::Udp(socket) => {
                let mut cfg = UdpConfig::new(id, addrs[&id], addrs.clone());
                cfg.limits.max_frame = spec.job.max_frame + 64;
                cfg.drop_outgoing = drop;
                cfg.seed = u64::from(id.0);
                Arc::new(UdpTransport::with_socket(cfg, socket).await?)
            }
        };
        transports.insert(id, t);
    }
    Ok(transports)
}
