//! The runtime over the in-memory transport: application handles, requests larger than a frame,
//! back-pressure and shutdown.

use std::time::Duration;

use pserver_core::{Consistency, Key, KeyList, KeySelection, KvPairs};
use pserver_transport::mem::{MemFaults, MemNetwork};
use pserver_transport::runtime::{ClusterSpec, LocalCluster, RuntimeError};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One push of `keys` keys through a cluster whose frames hold at most `max_frame` bytes, over
/// a network that loses and duplicates: it must complete, and be applied exactly once.
fn one_huge_push(max_frame: usize, max_slice_bytes: usize, keys: u64) {
    rt().block_on(async {
        let mut spec = ClusterSpec::new(2, 1);
        spec.consistency = Consistency::Eventual;
        spec.max_frame = max_frame;
        spec.max_slice_bytes = max_slice_bytes;
        let faults = MemFaults::default()
            .with_drop(0.05)
            .with_dup(0.05)
            .with_seed(3);
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &MemNetwork::new(faults))?;
        let worker = cluster.workers[0].clone();
        let ks: Vec<Key> = (0..keys).map(|k| k * 1_000_003).collect();
        let vs: Vec<i64> = (0..keys as i64).map(|k| k % 11 + 1).collect();
        let kvs = KvPairs::new(ks.clone(), vs.clone(), 1)?;
        let wire_bytes = kvs.len() * 9;
        assert!(wire_bytes > 10 * max_frame, "the push must dwarf a frame");
        tokio::time::timeout(Duration::from_secs(60), worker.push(kvs)).await??;
        worker.advance().await?;
        let report = cluster.shutdown().await?;
        for (k, v) in ks.iter().zip(&vs) {
            let total: i64 = report
                .servers
                .iter()
                .map(|s| s.node.node().as_server().unwrap().received_total(*k)[0])
                .sum();
            assert_eq!(total, *v, "key {k}");
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

#[test]
fn a_push_far_larger_than_a_64_kib_frame_completes_exactly_once() {
    one_huge_push(64 << 10, 16 << 10, 200_000);
}

#[test]
fn a_push_far_larger_than_the_frame_limit_completes_exactly_once_with_default_slices() {
    // The default slice size (4 MiB) under a 1 MiB frame limit cannot work: refused up front.
    let mut spec = ClusterSpec::new(1, 1);
    spec.max_frame = 1 << 20;
    let err = spec.driver::<i64>(pserver_core::NodeId(2)).unwrap_err();
    assert!(err.to_string().contains("frame limit"), "{err}");
    one_huge_push(1 << 20, 256 << 10, 1_500_000);
}

#[test]
fn handles_report_typed_errors() {
    rt().block_on(async {
        let spec = ClusterSpec::new(1, 1);
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &MemNetwork::reliable())?;
        let worker = cluster.workers[0].clone();
        let wide = KvPairs::new(vec![1], vec![1, 2], 2)?;
        assert_eq!(
            worker.push(wide).await,
            Err(RuntimeError::WidthMismatch {
                expected: 1,
                got: 2
            })
        );
        cluster.shutdown().await?;
        let keys = KeySelection::Keys(KeyList::new(vec![1])?);
        assert_eq!(worker.pull(keys).await, Err(RuntimeError::ShutDown));
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

#[test]
fn a_fast_application_waits_instead_of_growing_the_queue() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new(1, 1);
        spec.runtime.command_queue = 2;
        spec.runtime.max_open_requests = 3;
        let network = MemNetwork::reliable();
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        // Cut the worker off: nothing it sends is answered, so its requests stay open.
        network.isolate(pserver_core::NodeId(2));
        let mut acks = Vec::new();
        for i in 0..5u64 {
            let kvs = KvPairs::new(vec![i], vec![1], 1)?;
            acks.push(worker.start_push(kvs).await?);
        }
        // 3 open in the node, 2 in the queue: the next call must wait.
        let kvs = KvPairs::new(vec![9], vec![1], 1)?;
        let blocked =
            tokio::time::timeout(Duration::from_millis(300), worker.start_push(kvs)).await;
        assert!(blocked.is_err(), "a sixth call was taken without waiting");
        network.rejoin(pserver_core::NodeId(2));
        for ack in acks {
            tokio::time::timeout(Duration::from_secs(30), ack).await??;
        }
        cluster.shutdown().await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

#[test]
fn shutdown_waits_for_what_the_worker_started() {
    rt().block_on(async {
        let spec = ClusterSpec::new(1, 1);
        let network = MemNetwork::new(MemFaults::default().with_drop(0.3).with_seed(5));
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        let kvs = KvPairs::new((0..100).collect(), vec![1; 100], 1)?;
        let ack = worker.start_push(kvs).await?;
        // Stop at once: the push was handed over, so it must still reach the server.
        let report = cluster.shutdown().await?;
        assert_eq!(ack.await, Ok(()));
        let server = report.servers[0].node.node().as_server().unwrap();
        assert!((0..100).all(|k| server.received_total(k) == vec![1]));
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}
