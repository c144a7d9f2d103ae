//! The measures over a cluster: dense and sparse push and pull throughput, and small-request
//! round trips.

use std::time::{Duration, Instant};

use pserver_core::{Key, KeyList, KeyRange, KeySelection, KvPairs, RangeList};
use pserver_runtime::{RuntimeError, WorkerHandle};

use super::{BenchError, runtime_err};

/// Dense push and pull of `size` contiguous keys by every worker, repeated; GB/s of values
/// each way, all workers together.
pub(super) async fn dense(
    workers: &[WorkerHandle<f32>],
    size: usize,
    quick: bool,
    what: &str,
) -> Result<(f64, f64), BenchError> {
    let keys: Vec<Key> = (0..size as Key).collect();
    let kvs = KvPairs::new(keys, vec![1.0f32; size], 1).map_err(runtime_err)?;
    let range = KeyRange::new(0, size as Key).map_err(runtime_err)?;
    let selection = KeySelection::Ranges(RangeList::new(vec![range]).map_err(runtime_err)?);
    // The first push creates the servers' rows; the figures are for pushes into rows that
    // exist, as in training after its first step.
    workers[0].push(kvs.clone()).await?;
    let before = workers[0].pull(selection.clone()).await?;
    let (push, pull, pushes) = push_and_pull(
        workers,
        kvs,
        selection.clone(),
        quick,
        format!("{what} dense requests of {size}"),
    )
    .await?;
    // Every push added one to every key: the totals say whether each was applied exactly once.
    let after = workers[0].pull(selection).await?;
    let exact = after.len() == size
        && after.iter().all(|(k, v)| {
            let was = before.get(k).map_or(0.0, |b| b[0]);
            v[0] - was == pushes as f32
        });
    if !exact {
        return Err(BenchError::Inexact(format!(
            "{what} dense push of {size}: the servers do not hold exactly {pushes} pushes"
        )));
    }
    let bytes = (size * 4) as f64;
    Ok((bytes / push / 1e9, bytes / pull / 1e9))
}

/// Keys of a sparse request are drawn from `[0, SPARSE_SPACE)`: 16 times as many as the largest
/// sparse request holds, and the key space the bench's ring is told of.
pub(super) const SPARSE_SPACE: Key = 1 << 24;

/// `count` distinct keys drawn at random from [`SPARSE_SPACE`], sorted: a fixed, seeded key
/// set (splitmix64), the same in every run.
pub(super) fn sparse_keys(count: usize) -> Vec<Key> {
    let mut keys = std::collections::BTreeSet::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    while keys.len() < count.min(SPARSE_SPACE as usize) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        keys.insert(((z ^ (z >> 31)) >> 40) % SPARSE_SPACE);
    }
    keys.into_iter().collect()
}

/// Push and pull of `count` keys drawn at random from [`SPARSE_SPACE`], by every worker,
/// repeated; million keys per second each way, all workers together.
pub(super) async fn sparse(
    workers: &[WorkerHandle<f32>],
    count: usize,
    quick: bool,
    what: &str,
) -> Result<(f64, f64), BenchError> {
    let keys = sparse_keys(count);
    let list = KeyList::new(keys.clone()).map_err(runtime_err)?;
    let kvs = KvPairs::new(keys, vec![1.0f32; count], 1).map_err(runtime_err)?;
    let (push, pull, _) = push_and_pull(
        workers,
        kvs,
        KeySelection::Keys(list),
        quick,
        format!("{what} sparse requests of {count}"),
    )
    .await?;
    Ok((count as f64 / push / 1e6, count as f64 / pull / 1e6))
}

/// Seconds per request of `kvs` pushed, then of `selection` pulled, each worker repeating its
/// share with several requests in flight; and how many pushes there were.
async fn push_and_pull(
    workers: &[WorkerHandle<f32>],
    kvs: KvPairs<f32>,
    selection: KeySelection,
    quick: bool,
    what: String,
) -> Result<(f64, f64, usize), BenchError> {
    // About 256 MiB of values per measure (4 MiB quick), at least 3 requests per worker.
    let budget: usize = if quick { 4 << 20 } else { 256 << 20 };
    let per_worker = (budget / (kvs.len().max(1) * 4)).clamp(3, 20_000);
    let reps = per_worker * workers.len();
    // Several requests in flight, so that small ones measure throughput, not round trips.
    let lanes = (per_worker / 3).clamp(1, 16) * workers.len();
    let limit = Duration::from_secs(if quick { 60 } else { 120 });
    let next = std::sync::atomic::AtomicUsize::new(0);
    let pick = || &workers[next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % workers.len()];
    let push_secs = run_lanes(
        lanes,
        reps,
        || {
            let worker = pick().clone();
            let kvs = kvs.clone();
            async move { worker.push(kvs).await.map(|_| ()) }
        },
        limit,
        format!("{what}: push"),
    )
    .await?;
    let pull_secs = run_lanes(
        lanes,
        reps,
        || {
            let worker = pick().clone();
            let selection = selection.clone();
            async move { worker.pull(selection).await.map(|_| ()) }
        },
        limit,
        format!("{what}: pull"),
    )
    .await?;
    Ok((push_secs / reps as f64, pull_secs / reps as f64, reps))
}

/// Runs `reps` calls of `call` on `lanes` concurrent tasks, within `limit`; returns the
/// seconds they took.
async fn run_lanes<F, Fut>(
    lanes: usize,
    reps: usize,
    call: F,
    limit: Duration,
    what: String,
) -> Result<f64, BenchError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), RuntimeError>> + Send + 'static,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let n = reps / lanes + usize::from(lane < reps % lanes);
        let calls: Vec<Fut> = (0..n).map(|_| call()).collect();
        tasks.spawn(async move {
            for c in calls {
                c.await?;
            }
            Ok::<(), RuntimeError>(())
        });
    }
    let all = async {
        while let Some(done) = tasks.join_next().await {
            done.map_err(runtime_err)??;
        }
        Ok::<(), BenchError>(())
    };
    tokio::time::timeout(limit, all)
        .await
        .map_err(|_| BenchError::Timeout(what, limit.as_secs()))??;
    Ok(start.elapsed().as_secs_f64())
}

/// One 1-key push at a time, `n` times: p50 and p99 of the round trip, in microseconds.
pub(super) async fn round_trips(
    worker: &WorkerHandle<f32>,
    n: usize,
) -> Result<(f64, f64), BenchError> {
    let kvs = KvPairs::new(vec![7], vec![1.0f32], 1).map_err(runtime_err)?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        worker.push(kvs.clone()).await?;
        times.push(start.elapsed());
    }
    Ok(percentiles(&mut times))
}

pub(super) fn percentiles(times: &mut [Duration]) -> (f64, f64) {
    times.sort();
    let at = |q: f64| {
        let i = ((times.len() as f64 - 1.0) * q).round() as usize;
        times.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    (at(0.5), at(0.99))
}
