//! Real sockets for a cluster in one process: a TCP or UDP transport for every node, each on a
//! loopback port of its own. This is how `pserver train --transport tcp|udp` and the
//! benchmarks run the network path without a cluster file.

use std::collections::BTreeMap;
use std::sync::Arc;

use pserver_core::NodeId;
use pserver_runtime::ClusterSpec;
use pserver_transport::tcp::{Secret, TcpConfig, TcpTransport};
use pserver_transport::udp::{UdpConfig, UdpTransport};
use pserver_transport::{Transport, TransportError};

/// Which sockets the nodes talk over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sockets {
    /// Authenticated TCP connections, one listening port per node.
    Tcp,
    /// UDP datagrams, one port per node. Inside one process nobody else is on the path, so
    /// the datagrams carry no MAC.
    Udp,
}

/// One node's transport, with its own counters.
pub(crate) enum Bound {
    /// Over TCP.
    Tcp(Arc<TcpTransport>),
    /// Over UDP.
    Udp(Arc<UdpTransport>),
}

impl Bound {
    /// The transport, as the runtime takes it.
    pub(crate) fn shared(&self) -> Arc<dyn Transport> {
        match self {
            Bound::Tcp(t) => t.clone(),
            Bound::Udp(t) => t.clone(),
        }
    }

    /// Bytes this node has handed to the network.
    pub(crate) fn bytes_sent(&self) -> u64 {
        match self {
            Bound::Tcp(t) => t.stats().bytes_sent,
            Bound::Udp(t) => t.stats().bytes_sent,
        }
    }
}

/// A transport over `sockets` for every node of `spec`, each knowing all the others. Every
/// socket is bound (on port 0) before the peer tables are built and is handed to its
/// transport as it is, so no other socket can take a port in between. TCP peers prove
/// `secret` to each other under `cluster_id`; over UDP, a fraction `drop` of the outgoing
/// datagrams is lost on purpose (seeded by node), to measure loss.
pub(crate) async fn bind(
    spec: &ClusterSpec,
    sockets: Sockets,
    cluster_id: &str,
    secret: &Secret,
    drop: f64,
) -> Result<BTreeMap<NodeId, Bound>, TransportError> {
    enum Socket {
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
        let (socket, addr) = match sockets {
            Sockets::Tcp => {
                let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(probe)?;
                let addr = l.local_addr().map_err(probe)?;
                (Socket::Tcp(l), addr)
            }
            Sockets::Udp => {
                let s = std::net::UdpSocket::bind("127.0.0.1:0").map_err(probe)?;
                let addr = s.local_addr().map_err(probe)?;
                (Socket::Udp(s), addr)
            }
        };
        addrs.insert(id, addr);
        bound.push((id, socket));
    }
    // Room for the frame's own framing on top of the job's largest frame.
    let max_frame = spec.job.max_frame + 64;
    let mut transports = BTreeMap::new();
    for (id, socket) in bound {
        let t = match socket {
            Socket::Tcp(listener) => {
                let mut cfg =
                    TcpConfig::new(id, addrs[&id], addrs.clone(), cluster_id, secret.clone());
                cfg.max_frame = max_frame;
                Bound::Tcp(Arc::new(TcpTransport::with_listener(cfg, listener).await?))
            }
            Socket::Udp(socket) => {
                let mut cfg = UdpConfig::new(id, addrs[&id], addrs.clone());
                cfg.limits.max_frame = max_frame;
                cfg.drop_outgoing = drop;
                cfg.seed = u64::from(id.0);
                Bound::Udp(Arc::new(UdpTransport::with_socket(cfg, socket).await?))
            }
        };
        transports.insert(id, t);
    }
    Ok(transports)
}
