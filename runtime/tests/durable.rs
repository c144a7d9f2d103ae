//! The two completions of a push through the runtime: it counts for its iteration
//! (`WorkerHandle::push`, awaiting a `PushTicket`), and it is durable
//! (`WorkerHandle::push_durable`, `PushTicket::durable`), in a cluster whose keys each have one
//! replica. The servers are cut off from each other to hold durability back.

use std::time::Duration;

use pserver_core::{Consistency, Driver, Key, KvPairs, NodeId};
use pserver_runtime::{ClusterSpec, LocalCluster, NodeReport, RuntimeError};
use pserver_transport::mem::MemNetwork;
use tokio::time::timeout;

use crate::common;
use common::rt;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SERVERS: [NodeId; 2] = [NodeId(1), NodeId(2)];
const WORKER: NodeId = NodeId(3);

/// Long enough for anything that can happen to happen; reached only when something hangs.
const BOUND: Duration = Duration::from_secs(30);

/// Two servers, one replica of every key: each server holds every key, as primary of some and
/// replica of the others.
fn replicated(workers: usize, consistency: Consistency) -> ClusterSpec {
    let mut spec = ClusterSpec::new(SERVERS.len(), workers);
    spec.job.ring.replicas = 1;
    spec.job.consistency = consistency;
    spec
}

/// Keys spread over the key space, so that both servers are the primary of some.
fn rows() -> Result<(Vec<Key>, KvPairs<i64>), Box<dyn std::error::Error>> {
    let keys: Vec<Key> = (0..64).map(|k| k * 0x0400_0000_0000_0001).collect();
    let values = (1..=64).collect();
    let kvs = KvPairs::new(keys.clone(), values, 1)?;
    Ok((keys, kvs))
}

/// Every key is held by both servers, each with the value pushed (once).
fn assert_on_every_replica(servers: &[NodeReport<Driver<i64>>], keys: &[Key]) {
    let mut primaries = [0usize; 2];
    for (i, report) in servers.iter().enumerate() {
        let server = report.node.node().as_server().unwrap();
        primaries[i] = server.shards().filter(|(_, primary)| *primary).count();
        for (k, key) in keys.iter().enumerate() {
            let held = server.shards().any(|(range, _)| range.contains(*key));
            assert!(held, "{} holds no shard of key {key}", server.id());
            assert_eq!(
                server.received_total(*key),
                [k as i64 + 1],
                "{} on key {key}",
                server.id()
            );
        }
    }
    assert!(
        primaries.iter().all(|&n| n > 0),
        "both servers must be primaries, so that each is some key's replica: {primaries:?}"
    );
}

#[test]
fn push_durable_returns_once_every_replica_holds_the_push() {
    // Sequential mode answers in two stages; the others acknowledge a push only once the
    // replicas hold it, so both events come out of the same step.
    for consistency in [
        Consistency::Sequential,
        Consistency::BoundedDelay(1),
        Consistency::Eventual,
    ] {
        rt().block_on(async {
            let network = MemNetwork::reliable();
            let spec = replicated(1, consistency);
            let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
            let worker = cluster.workers[0].clone();
            let (keys, kvs) = rows()?;
            timeout(BOUND, worker.push_durable(kvs)).await??;
            // From here on no replica can get anything more: what they hold, they held when
            // the push was reported durable.
            network.partition(SERVERS[0], SERVERS[1]);
            let report = cluster.shutdown().await?;
            assert_on_every_replica(&report.servers, &keys);
            Ok::<(), Box<dyn std::error::Error>>(())
        })
        .unwrap_or_else(|e| panic!("{consistency}: {e}"));
    }
}

#[test]
fn a_push_counts_while_its_replicas_are_cut_off_and_is_durable_once_they_hold_it() -> TestResult {
    rt().block_on(async {
        let network = MemNetwork::reliable();
        let spec = replicated(1, Consistency::Sequential);
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        network.partition(SERVERS[0], SERVERS[1]);
        let (keys, kvs) = rows()?;
        let mut ticket = worker.start_push(kvs).await?;
        // Taken in by its primaries, the push counts: the iteration may end.
        timeout(BOUND, &mut ticket).await??;
        assert_eq!(timeout(BOUND, worker.advance()).await??, 1);
        // Awaiting a resolved ticket again gives the same answer.
        assert_eq!(timeout(BOUND, &mut ticket).await?, Ok(()));
        // No replica can have it while the servers cannot reach each other, however long
        // this waits: durability must not be reported.
        let durable = ticket.durable();
        tokio::pin!(durable);
        assert!(
            timeout(Duration::from_millis(500), &mut durable)
                .await
                .is_err(),
            "durable while every replica was cut off from its primary"
        );
        network.heal(SERVERS[0], SERVERS[1]);
        timeout(BOUND, durable).await??;
        network.partition(SERVERS[0], SERVERS[1]);
        let report = cluster.shutdown().await?;
        assert_on_every_replica(&report.servers, &keys);
        Ok(())
    })
}

#[test]
fn a_durability_waiter_on_a_stopping_worker_fails_with_shut_down() -> TestResult {
    rt().block_on(async {
        let network = MemNetwork::reliable();
        let mut spec = replicated(1, Consistency::Sequential);
        spec.runtime.drain_timeout = Duration::from_millis(200);
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        network.partition(SERVERS[0], SERVERS[1]);
        let (_, kvs) = rows()?;
        let mut counted = worker.start_push(kvs.clone()).await?;
        timeout(BOUND, &mut counted).await??;
        // One asked for durability only, never for the first stage.
        let unasked = worker.start_push(kvs).await?;
        // Stopping drains within 200 ms, which cannot make anything durable here.
        timeout(BOUND, cluster.shutdown()).await??;
        assert_eq!(
            timeout(BOUND, counted.durable()).await?,
            Err(RuntimeError::ShutDown)
        );
        assert_eq!(
            timeout(BOUND, unasked.durable()).await?,
            Err(RuntimeError::ShutDown)
        );
        Ok(())
    })
}

#[test]
fn a_durability_waiter_on_a_fenced_worker_fails_with_fenced() -> TestResult {
    rt().block_on(async {
        let network = MemNetwork::reliable();
        let mut spec = replicated(2, Consistency::Sequential);
        spec.job.timing.heartbeat_interval = 10_000_000;
        spec.job.timing.heartbeat_timeout = 50_000_000;
        let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
        let worker = cluster.workers[0].clone();
        worker.ready().await?;
        network.partition(SERVERS[0], SERVERS[1]);
        let (_, kvs) = rows()?;
        let mut ticket = worker.start_push(kvs).await?;
        timeout(BOUND, &mut ticket).await??;
        let durable = ticket.durable();
        tokio::pin!(durable);
        // Silent long enough to be declared dead; back on the network, the worker learns it
        // was removed. Nothing can become durable meanwhile: only the fence can answer.
        let answer = timeout(BOUND, async {
            loop {
                network.isolate(WORKER);
                tokio::time::sleep(Duration::from_millis(200)).await;
                network.rejoin(WORKER);
                if let Ok(answer) = timeout(Duration::from_millis(500), &mut durable).await {
                    return answer;
                }
            }
        })
        .await?;
        assert_eq!(answer, Err(RuntimeError::Fenced));
        cluster.shutdown().await?;
        Ok(())
    })
}
