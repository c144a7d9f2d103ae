//! The runtime over the in-memory transport: application handles, requests larger than a frame,
//! back-pressure and shutdown.

use std::time::Duration;

use pserver_core::{Consistency, Key, KeyList, KeySelection, KvPairs};
use pserver_runtime::{ClusterSpec, LocalCluster, RuntimeError};
use pserver_transport::mem::{MemFaults, MemNetwork};

use crate::common;
use common::rt;

/// One push of `keys` keys through a cluster whose frames hold at most `max_frame` bytes, over
/// a network that loses and duplicates: it must complete, and be applied exactly once.
fn one_huge_push(max_frame: usize, max_slice_bytes: usize, keys: u64) {
    rt().block_on(async {
        let mut spec = ClusterSpec::new(2, 1);
        spec.job.consistency = Consistency::Eventual;
        spec.job.max_frame = max_frame;
        spec.job.max_slice_bytes = max_slice_bytes;
        spec.job.max_reply_bytes = max_slice_bytes;
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
fn a_push_far_larger_than_a_1_mib_frame_completes_exactly_once_with_slices_cut_to_the_frame() {
    one_huge_push(1 << 20, 256 << 10, 1_500_000);
    // The default slice size (4 MiB) under a 1 MiB frame limit: the driver cuts slices to
    // the frame, and the job needs nothing else set.
    one_huge_push(
        1 << 20,
        ClusterSpec::new(1, 1).job.max_slice_bytes,
        1_500_000,
    );
}

#[test]
fn handles_report_typed_errors() {
    rt().block_on(async {
        let spec = ClusterSpec::new(1, 1);
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &MemNetwork::reliable())?;
        let worker = cluster.workers[0].clone();
        let wide = KvPairs::new(vec![1], vec![1, 2], 2)?;
        let mismatch = Err(RuntimeError::WidthMismatch {
            expected: 1,
            got: 2,
        });
        assert_eq!(worker.push(wide.clone()).await, mismatch);
        // A push refused outright fails both of its completions.
        assert_eq!(worker.push_durable(wide.clone()).await, mismatch);
        let mut ticket = worker.start_push(wide).await?;
        assert_eq!((&mut ticket).await, mismatch);
        assert_eq!(ticket.durable().await, mismatch);
        cluster.shutdown().await?;
        let keys = KeySelection::Keys(KeyList::new(vec![1])?);
        assert_eq!(worker.pull(keys).await, Err(RuntimeError::ShutDown));
        let narrow = KvPairs::new(vec![1], vec![1], 1)?;
        assert_eq!(
            worker.push_durable(narrow).await,
            Err(RuntimeError::ShutDown)
        );
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

#[test]
fn a_fast_application_waits_instead_of_growing_the_queue() {
    // Paused time: the runtime's clock moves only when every task waits, so "still waiting
    // after 300 ms" means the call was never taken, however loaded the machine is.
    let paused = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    paused
        .block_on(async {
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
fn shutdown_finishes_calls_already_accepted_even_those_still_queued() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new(1, 1);
        spec.job.consistency = Consistency::Eventual;
        spec.runtime.max_open_requests = 1;
        let network = MemNetwork::new(MemFaults::default().with_drop(0.3).with_seed(5));
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        // Cut off, the worker cannot finish the first push, so the second stays in the queue.
        let me = pserver_core::NodeId(2);
        network.isolate(me);
        let first = worker
            .start_push(KvPairs::new(vec![1], vec![1], 1)?)
            .await?;
        let second = worker
            .start_push(KvPairs::new(vec![2], vec![1], 1)?)
            .await?;
        let stopping = tokio::spawn(cluster.shutdown());
        // However the stop and the rejoin interleave, both accepted calls must complete.
        tokio::task::yield_now().await;
        network.rejoin(me);
        let report = stopping.await??;
        assert_eq!(first.await, Ok(()));
        assert_eq!(second.await, Ok(()));
        let server = report.servers[0].node.node().as_server().unwrap();
        assert_eq!(server.value(1), Some(&[1][..]));
        assert_eq!(server.value(2), Some(&[1][..]));
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

#[test]
fn a_worker_declared_dead_is_fenced_and_says_so() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new(1, 2);
        spec.job.timing.heartbeat_interval = 10_000_000;
        spec.job.timing.heartbeat_timeout = 50_000_000;
        let network = MemNetwork::reliable();
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        // Silent long enough to be declared dead; back on the network, it learns it was removed.
        let me = pserver_core::NodeId(2);
        network.isolate(me);
        let pushed = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let kvs = KvPairs::new(vec![1], vec![1], 1)?;
                match worker.start_push(kvs).await {
                    Err(e) => return Ok::<_, Box<dyn std::error::Error>>(e),
                    Ok(ack) => {
                        network.rejoin(me);
                        if let Err(e) = ack.await {
                            return Ok(e);
                        }
                        network.isolate(me);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        })
        .await??;
        assert_eq!(pushed, RuntimeError::Fenced);
        // Every later call says why too, not only that the node is gone.
        assert_eq!(worker.advance().await, Err(RuntimeError::Fenced));
        let keys = KeySelection::Keys(KeyList::new(vec![1])?);
        assert_eq!(worker.pull(keys).await, Err(RuntimeError::Fenced));
        cluster.shutdown().await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

#[test]
fn a_worker_that_leaves_is_taken_out_and_keeps_its_share() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new(1, 2);
        spec.job.consistency = Consistency::Eventual;
        let network = MemNetwork::reliable();
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let (first, second) = (cluster.workers[0].clone(), cluster.workers[1].clone());
        first.ready().await?;
        second.ready().await?;
        assert_eq!(first.shares().await?, [0]);
        first.push(KvPairs::new(vec![1], vec![5], 1)?).await?;
        first.leave().await?;
        // Taken out at its own request: every later call says so.
        assert_eq!(first.advance().await, Err(RuntimeError::Left));
        // The other worker is not given the share of the one that left.
        assert_eq!(second.shares().await?, [1]);
        let report = cluster.shutdown().await?;
        assert!(report.workers[0].left && !report.workers[0].fenced);
        let coordinator = report.coordinator.node.node().as_coordinator().unwrap();
        let config = coordinator.config().unwrap();
        let (first_id, second_id) = (pserver_core::NodeId(2), pserver_core::NodeId(3));
        assert_eq!(config.workers, [second_id]);
        assert_eq!(config.left, [first_id]);
        assert_eq!(
            config.shares,
            [first_id, second_id],
            "nobody took the share over"
        );
        let server = report.servers[0].node.node().as_server().unwrap();
        assert_eq!(server.value(1), Some(&[5][..]));
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

#[test]
fn a_worker_that_leaves_pushes_what_its_filters_held_back_first() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new(1, 1);
        spec.job.consistency = Consistency::Eventual;
        let theta = pserver_core::filter::Threshold::new(10.0).ok_or("threshold")?;
        spec.job.filters = pserver_core::filter::Filters::significantly_modified(theta);
        let network = MemNetwork::reliable();
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        // Key 1 adds up to 12 and goes on the third push; key 2 to 9, held back.
        for _ in 0..3 {
            worker
                .push(KvPairs::new(vec![1, 2], vec![4, 3], 1)?)
                .await?;
            worker.advance().await?;
        }
        worker.leave().await?;
        let report = cluster.shutdown().await?;
        let server = report.servers[0].node.node().as_server().unwrap();
        assert_eq!(server.value(1), Some(&[12][..]));
        assert_eq!(
            server.value(2),
            Some(&[9][..]),
            "the held change went before leaving"
        );
        let savings = report.workers[0]
            .node
            .node()
            .as_worker()
            .map(|w| w.filter_savings())
            .ok_or("not a worker")?;
        assert_eq!(savings.len(), 1);
        assert_eq!((savings[0].1.rows_in, savings[0].1.rows_out), (6, 2));
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

#[test]
fn a_worker_counts_the_recovery_from_a_server_death_and_how_long_it_took() {
    rt().block_on(async {
        // Three servers: two are left to hold a range and its replica.
        let mut spec = ClusterSpec::new(3, 1);
        spec.job.ring.replicas = 1;
        spec.job.timing.heartbeat_interval = 10_000_000;
        spec.job.timing.heartbeat_timeout = 200_000_000;
        let network = MemNetwork::reliable();
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        let (server, me) = (pserver_core::NodeId(1), pserver_core::NodeId(4));
        // Keys over the whole key space: some are on every server.
        let keys: Vec<u64> = (0..64).map(|i| i * (u64::MAX / 64)).collect();
        let kvs = || KvPairs::new(keys.clone(), vec![1; keys.len()], 1);
        worker.push(kvs()?).await?;
        let before = cluster.metrics(me).ok_or("no worker")?;
        assert_eq!(before.recoveries, 0);
        network.isolate(server);
        // Waits until the coordinator declares the server dead and the replica takes over.
        worker.push(kvs()?).await?;
        let after = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let m = cluster.metrics(me).ok_or("no worker")?;
                if m.recoveries > 0 {
                    return Ok::<_, Box<dyn std::error::Error>>(m);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await??;
        assert_eq!(after.recoveries, 1);
        // Nobody can declare the server dead before its heartbeats were missed for about
        // the timeout (less one check): the recovery cannot have been shorter.
        assert!(
            after.last_recovery >= Duration::from_millis(150),
            "{:?}",
            after.last_recovery
        );
        assert_eq!(after.longest_recovery, after.last_recovery);
        let report = cluster.shutdown().await?;
        // The servers left hold both pushes, each once, on every key.
        for &k in &keys {
            let held: Vec<_> = report.servers[1..]
                .iter()
                .filter_map(|s| s.node.node().as_server().map(|s| s.received_total(k)))
                .collect();
            assert!(held.contains(&vec![2]), "key {k}: {held:?}");
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })
    .unwrap();
}
