//! A count-min sketch on the parameter server: workers count a stream of items into `depth`
//! rows of `width` counters (one key per counter), servers sum, and a query pulls an item's
//! `depth` counters and takes the smallest. With `width = ceil(e / eps)` and
//! `depth = ceil(ln(1 / delta))`, an estimate exceeds the true count by more than `eps * N`
//! (N items counted) with probability at most `delta` (Cormode and Muthukrishnan, 2005).

use crate::seeded::mix;
use std::collections::BTreeMap;

use pserver_core::{Consistency, Key, KeyList, KeySelection, KvPairs, Updater};
use pserver_runtime::{ClusterSpec, LocalCluster, RuntimeError};
use pserver_transport::mem::MemNetwork;

/// What to count and how precisely.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SketchConfig {
    /// Servers.
    pub servers: usize,
    /// Workers; each counts an equal share of the stream.
    pub workers: usize,
    /// Items in the stream.
    pub items: u64,
    /// Distinct items the stream draws from (Zipf-like: item `i` about as often as `1 / (i + 1)`).
    pub distinct: u64,
    /// Additive error bound, as a fraction of the stream's length.
    pub eps: f64,
    /// Probability that an estimate breaks the bound.
    pub delta: f64,
    /// Seed of the stream and the row hashes.
    pub seed: u64,
}

impl Default for SketchConfig {
    fn default() -> Self {
        SketchConfig {
            servers: 2,
            workers: 3,
            items: 200_000,
            distinct: 50_000,
            eps: 0.001,
            delta: 0.01,
            seed: 0,
        }
    }
}

/// How the sketch did against exact counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SketchReport {
    /// Counters per row.
    pub width: u64,
    /// Rows.
    pub depth: u64,
    /// Distinct items queried (every item the stream held).
    pub queried: usize,
    /// Queries whose over-count exceeded `eps * N`.
    pub over_bound: usize,
    /// The largest over-count seen.
    pub max_overcount: i64,
    /// `eps * N`.
    pub bound: f64,
    /// Queries that under-counted (must be none: a count-min sketch never does).
    pub under_counted: usize,
}

/// The stream: `n` items, item `i` drawn with weight about `1 / (i + 1)`.
fn stream(cfg: &SketchConfig) -> Vec<u64> {
    let harmonic = (cfg.distinct as f64).ln() + 0.577;
    (0..cfg.items)
        .map(|j| {
            // Inverse of the harmonic CDF: exp(u * H) - 1, from a uniform u.
            let u = (mix(cfg.seed ^ j.wrapping_mul(0x2545_f491_4f6c_dd1d)) >> 11) as f64
                / (1u64 << 53) as f64;
            ((u * harmonic).exp() - 1.0)
                .floor()
                .clamp(0.0, (cfg.distinct - 1) as f64) as u64
        })
        .collect()
}

/// The key of row `r`'s counter for `item`.
fn counter(cfg: &SketchConfig, width: u64, r: u64, item: u64) -> Key {
    r * width + mix(cfg.seed.wrapping_add(r.wrapping_mul(0x9e37)) ^ item) % width
}

/// Counts the stream on a cluster in this process and checks every item's estimate.
pub(crate) async fn run(cfg: &SketchConfig) -> Result<SketchReport, RuntimeError> {
    let width = (std::f64::consts::E / cfg.eps).ceil() as u64;
    let depth = (1.0 / cfg.delta).ln().ceil().max(1.0) as u64;
    let mut spec = ClusterSpec::new(cfg.servers, cfg.workers);
    spec.job.consistency = Consistency::Eventual;
    spec.job.updater = Updater::Sum;
    let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &MemNetwork::reliable())?;
    let items = stream(cfg);
    let per = items.len().div_ceil(cfg.workers.max(1));
    let mut tasks = Vec::new();
    for (w, handle) in cluster.workers.iter().enumerate() {
        let handle = handle.clone();
        let mine: Vec<u64> = items.iter().skip(w * per).take(per).copied().collect();
        let cfg = *cfg;
        tasks.push(tokio::spawn(async move {
            handle.ready().await?;
            // Counted locally in batches and pushed as one sparse vector per batch: the
            // paper's aggregation at the worker.
            for batch in mine.chunks(10_000) {
                let mut counts: BTreeMap<Key, i64> = BTreeMap::new();
                for &item in batch {
                    for r in 0..depth {
                        *counts.entry(counter(&cfg, width, r, item)).or_default() += 1;
                    }
                }
                let (keys, values) = counts.into_iter().unzip();
                let kvs = KvPairs::new(keys, values, 1)
                    .map_err(|e| RuntimeError::Config(e.to_string()))?;
                handle.push(kvs).await?;
            }
            Ok::<(), RuntimeError>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|_| RuntimeError::ShutDown)??;
    }
    let mut exact: BTreeMap<u64, i64> = BTreeMap::new();
    for &item in &items {
        *exact.entry(item).or_default() += 1;
    }
    // Every counter, in one pull, then a minimum per item.
    let mut keys: Vec<Key> = exact
        .keys()
        .flat_map(|&item| (0..depth).map(move |r| (r, item)))
        .map(|(r, item)| counter(cfg, width, r, item))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let list = KeyList::new(keys).map_err(|e| RuntimeError::Config(e.to_string()))?;
    let counters = cluster.workers[0].pull(KeySelection::Keys(list)).await?;
    let bound = cfg.eps * items.len() as f64;
    let mut report = SketchReport {
        width,
        depth,
        queried: exact.len(),
        over_bound: 0,
        max_overcount: 0,
        bound,
        under_counted: 0,
    };
    for (&item, &truth) in &exact {
        let estimate = (0..depth)
            .filter_map(|r| counters.get(counter(cfg, width, r, item)).map(|v| v[0]))
            .min()
            .unwrap_or(0);
        let over = estimate - truth;
        report.under_counted += usize::from(over < 0);
        report.max_overcount = report.max_overcount.max(over);
        report.over_bound += usize::from(over as f64 > bound);
    }
    cluster.shutdown().await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    // The count-min sketch on the parameter server keeps its promise: never under-counts, and
    // over-counts by more than eps * N for at most a delta fraction of queries.

    use super::{SketchConfig, run};

    #[test]
    fn over_counts_stay_within_eps_n_with_probability_one_minus_delta() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (mut queried, mut over, mut largest) = (0, 0, 0);
        for seed in 0..8 {
            let cfg = SketchConfig {
                items: 20_000,
                distinct: 5_000,
                eps: 0.01,
                delta: 0.05,
                seed,
                ..SketchConfig::default()
            };
            let report = rt.block_on(run(&cfg)).expect("the sketch runs");
            assert_eq!(report.under_counted, 0, "seed {seed}: {report:?}");
            assert_eq!((report.width, report.depth), (272, 3));
            queried += report.queried;
            over += report.over_bound;
            largest = largest.max(report.max_overcount);
        }
        let fraction = over as f64 / queried as f64;
        eprintln!("{over} of {queried} queries over eps * N; largest over-count {largest}");
        assert!(
            fraction <= 0.05,
            "{over} of {queried} queries over the bound"
        );
        // The bound is not vacuous: collisions do inflate some counts.
        assert!(largest > 0);
    }
}
