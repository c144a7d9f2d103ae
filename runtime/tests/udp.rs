//! A whole cluster over the UDP transport on loopback, with the fault injector dropping
//! outgoing datagrams: every push must still be applied exactly once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pserver_core::{Key, KvPairs, NodeId};
use pserver_runtime::{ClusterSpec, LocalCluster, RuntimeError};
use pserver_transport::Transport;
use pserver_transport::udp::{UdpConfig, UdpTransport};

use crate::common;
use common::rt;

const KEYS: u64 = 1_000;
const ITERATIONS: i64 = 10;

/// Every node of `spec` on its own loopback UDP socket, with a secret, small datagrams (so
/// that frames fragment) and `drop` of the outgoing datagrams lost.
async fn transports(spec: &ClusterSpec, drop: f64) -> BTreeMap<NodeId, Arc<UdpTransport>> {
    let sockets: BTreeMap<NodeId, std::net::UdpSocket> = spec
        .job
        .node_ids()
        .into_iter()
        .map(|id| (id, std::net::UdpSocket::bind("127.0.0.1:0").unwrap()))
        .collect();
    let addrs: BTreeMap<NodeId, SocketAddr> = sockets
        .iter()
        .map(|(&id, s)| (id, s.local_addr().unwrap()))
        .collect();
    let mut out = BTreeMap::new();
    for (id, socket) in sockets {
        let mut cfg = UdpConfig::new(id, addrs[&id], addrs.clone());
        cfg.secret = Some(pserver_transport::tcp::Secret::new(b"udp-test".to_vec()));
        cfg.max_payload = 512;
        cfg.drop_outgoing = drop;
        cfg.seed = u64::from(id.0) + 1;
        let t = UdpTransport::with_socket(cfg, socket).await.unwrap();
        out.insert(id, Arc::new(t));
    }
    out
}

#[test]
fn with_5_percent_of_datagrams_dropped_every_push_is_applied_exactly_once() {
    rt().block_on(async {
        let spec = ClusterSpec::new(2, 2);
        let udp = transports(&spec, 0.05).await;
        let cluster: LocalCluster<i64> = LocalCluster::start_over(&spec, |id| {
            let t: Arc<dyn Transport> = udp[&id].clone();
            Ok(t)
        })?;
        let keys: Vec<Key> = (0..KEYS).map(|k| k * 7_919).collect();
        let mut runs = Vec::new();
        for (w, worker) in cluster.workers.iter().enumerate() {
            let worker = worker.clone();
            let keys = keys.clone();
            runs.push(tokio::spawn(async move {
                worker.ready().await?;
                for it in 0..ITERATIONS {
                    let vals: Vec<i64> = (0..KEYS as i64).map(|k| k + it + w as i64).collect();
                    worker.push(KvPairs::new(keys.clone(), vals, 1)?).await?;
                    worker.advance().await?;
                }
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }));
        }
        for run in runs {
            tokio::time::timeout(Duration::from_secs(120), run)
                .await
                .expect("the job finishes")?
                .map_err(|e| RuntimeError::Config(e.to_string()))?;
        }
        let report = cluster.shutdown().await?;
        for (i, k) in keys.iter().enumerate() {
            let want: i64 = (0..2i64)
                .flat_map(|w| (0..ITERATIONS).map(move |it| i as i64 + it + w))
                .sum();
            let total: i64 = report
                .servers
                .iter()
                .map(|s| s.node.node().as_server().unwrap().received_total(*k)[0])
                .sum();
            assert_eq!(total, want, "key {k}");
        }
        let dropped: u64 = udp.values().map(|t| t.stats().injected_drops).sum();
        let frames: u64 = udp.values().map(|t| t.stats().frames).sum();
        assert!(dropped > 0, "the injector dropped nothing");
        assert!(frames > 0);
        eprintln!("udp: {dropped} datagrams dropped, {frames} frames delivered");
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

/// The runtime gives workers over UDP the transport's flow limits: a dense push far larger
/// than a UDP slice reaches the server as that many frames, and whole.
#[test]
fn workers_over_udp_cut_requests_into_the_slices_the_transport_asks_for() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new(1, 1);
        spec.job.consistency = pserver_core::Consistency::Eventual;
        let udp = transports(&spec, 0.0).await;
        let server = spec.job.layout().servers().next().unwrap();
        let limits = udp[&server].flow_limits();
        let slice = limits.max_slice_bytes.expect("UDP limits the slice size");
        assert_eq!(slice, pserver_transport::udp::SLICE_DATAGRAMS * 512);
        assert!(limits.max_bytes_in_flight.is_some_and(|b| b > 0));
        let cluster: LocalCluster<i64> = LocalCluster::start_over(&spec, |id| {
            let t: Arc<dyn Transport> = udp[&id].clone();
            Ok(t)
        })?;
        let worker = &cluster.workers[0];
        worker.ready().await?;
        let n: u64 = 200_000;
        let before = udp[&server].stats().frames;
        let kvs = KvPairs::new((0..n).collect(), vec![1i64; n as usize], 1)?;
        tokio::time::timeout(Duration::from_secs(120), worker.push(kvs))
            .await
            .expect("the push finishes")?;
        let frames = udp[&server].stats().frames - before;
        // A slice counts at most 18 bytes a row of i64 (a key's longest varint and its value).
        let slices = n * 18 / slice as u64;
        assert!(
            frames >= slices,
            "{frames} frames for {slices} slices or more"
        );
        let range = pserver_core::KeyRange::new(0, n)?;
        let list = pserver_core::RangeList::new(vec![range])?;
        let pulled = worker
            .pull(pserver_core::KeySelection::Ranges(list))
            .await?;
        assert_eq!(pulled.len(), n as usize);
        assert!(pulled.values().iter().all(|&v| v == 1));
        cluster.shutdown().await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}
