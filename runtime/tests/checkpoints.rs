//! Whole-job checkpoints through the runtime (ARCHITECTURE.md §11): the servers of a local
//! cluster write their shards to disk at every cut; the cluster started again with `resume`
//! goes on from the newest cut every server holds whole, and a torn file sends it to the one
//! before.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pserver_core::{Consistency, Iteration, Key, KeyList, KeySelection, KvPairs, NodeId};
use pserver_runtime::checkpoint::CheckpointDir;
use pserver_runtime::{ClusterSpec, LocalCluster};
use pserver_transport::mem::MemNetwork;
use tokio::time::timeout;

use crate::common::rt;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Long enough for anything that can happen to happen; reached only when something hangs.
const BOUND: Duration = Duration::from_secs(30);

const SERVERS: [NodeId; 2] = [NodeId(1), NodeId(2)];

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pserver-job-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Two servers with one replica, two workers, a checkpoint every 2 iterations under `root`.
fn spec(root: &Path, resume: bool) -> ClusterSpec {
    let mut spec = ClusterSpec::new(SERVERS.len(), 2);
    spec.job.ring.replicas = 1;
    spec.job.consistency = Consistency::BoundedDelay(1);
    spec.job.checkpoint_every = 2;
    spec.checkpoints = Some(root.to_path_buf());
    spec.runtime.resume = resume;
    spec
}

fn keys() -> Vec<Key> {
    (0..64).map(|k| k * 0x0400_0000_0000_0001).collect()
}

/// Every worker of `cluster` pushes `i + 1` to every key in iteration `i`, from the
/// iteration it is in up to `until`.
async fn train(cluster: &LocalCluster<i64>, until: Iteration) -> TestResult {
    for w in &cluster.workers {
        w.ready().await?;
    }
    let from = cluster.workers[0].iteration().await?;
    for i in from..until {
        for w in &cluster.workers {
            let kvs = KvPairs::new(keys(), vec![i64::from(i) + 1; keys().len()], 1)?;
            drop(w.start_push(kvs).await?);
        }
        // Together: at a cut, each waits until the other has finished the iteration too.
        let [a, b] = &cluster.workers[..] else {
            return Err("two workers".into());
        };
        tokio::try_join!(a.advance(), b.advance())?;
    }
    Ok(())
}

async fn pulled(cluster: &LocalCluster<i64>) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
    let keys = KeySelection::Keys(KeyList::new(keys())?);
    Ok(cluster.workers[0].pull(keys).await?.values().to_vec())
}

/// What every key holds after iterations `0..n`.
fn total(n: Iteration) -> i64 {
    2 * (1..=i64::from(n)).sum::<i64>()
}

#[test]
fn a_cluster_restarted_whole_resumes_from_its_checkpoint_and_a_torn_file_sends_it_to_the_one_before()
-> TestResult {
    let root = scratch("resume");
    rt().block_on(async {
        let first: LocalCluster<i64> =
            LocalCluster::start(&spec(&root, false), &MemNetwork::reliable())?;
        timeout(BOUND, train(&first, 5)).await??;
        first.shutdown().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let spec_of = spec(&root, true);
    for s in SERVERS {
        let dir = CheckpointDir::new(spec_of.checkpoints_of(s).unwrap())?;
        assert_eq!(dir.iterations()?, [4, 2], "{s} wrote both cuts");
    }
    // The first server's newest file is torn: every server offers what reads back whole, and
    // the job goes on from the newest cut they all hold.
    let dir = CheckpointDir::new(spec_of.checkpoints_of(SERVERS[0]).unwrap())?;
    let newest = dir.path().join(format!("ckpt-{:020}.bin", 4));
    let bytes = std::fs::read(&newest)?;
    std::fs::write(&newest, &bytes[..bytes.len() / 2])?;
    rt().block_on(async {
        let again: LocalCluster<i64> = LocalCluster::start(&spec_of, &MemNetwork::reliable())?;
        for w in &again.workers {
            timeout(BOUND, w.ready()).await??;
            assert_eq!(w.iteration().await?, 2, "the workers start at the cut");
            assert_eq!(w.resumed_from().await?, Some(2));
        }
        assert!(
            timeout(BOUND, pulled(&again))
                .await??
                .iter()
                .all(|&v| v == total(2))
        );
        timeout(BOUND, train(&again, 5)).await??;
        let values = timeout(BOUND, pulled(&again)).await??;
        assert!(values.iter().all(|&v| v == total(5)), "{values:?}");
        again.shutdown().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    // And with every file whole, from the newest.
    rt().block_on(async {
        let third: LocalCluster<i64> = LocalCluster::start(&spec_of, &MemNetwork::reliable())?;
        for w in &third.workers {
            timeout(BOUND, w.ready()).await??;
            assert_eq!(w.iteration().await?, 4);
        }
        assert!(
            timeout(BOUND, pulled(&third))
                .await??
                .iter()
                .all(|&v| v == total(4))
        );
        third.shutdown().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}
