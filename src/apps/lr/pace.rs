//! What a run's nodes found and did about stragglers, and what its filters saved, read from
//! their metrics: a single-process run reports both at its end ([`PaceCounts`],
//! [`PaceWatch`]).

use pserver_core::JobSpec;
use pserver_core::filter::FilterSaving;
use pserver_runtime::{LocalCluster, NodeMetrics};
use tokio::sync::watch;

/// What was found and done about stragglers in a run ([`pserver_core::pace::StragglerPolicy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PaceCounts {
    /// Times the coordinator found a worker lagging.
    pub stragglers: u64,
    /// Shares it moved from slower workers to faster ones.
    pub shares_moved: u64,
    /// Iterations workers were told to skip, over every worker.
    pub skipped_iterations: u64,
}

/// Where a run's [`PaceCounts`] are read from: the coordinator's and the workers' counts,
/// which hold their last values once the nodes have stopped.
pub(crate) struct PaceWatch {
    coordinator: Option<watch::Receiver<NodeMetrics>>,
    workers: Vec<watch::Receiver<NodeMetrics>>,
}

impl PaceWatch {
    /// Watches the coordinator and the workers of `cluster`, which runs `job`.
    pub(crate) fn new(cluster: &LocalCluster<f32>, job: &JobSpec) -> Self {
        let layout = job.layout();
        PaceWatch {
            coordinator: cluster.metrics_receiver(layout.coordinator()),
            workers: layout
                .workers()
                .filter_map(|w| cluster.metrics_receiver(w))
                .collect(),
        }
    }

    /// The counts so far: the coordinator's findings and moves, the workers' skips summed.
    pub(crate) fn read(&self) -> PaceCounts {
        let coordinator = self
            .coordinator
            .as_ref()
            .map(|c| c.borrow().clone())
            .unwrap_or_default();
        PaceCounts {
            stragglers: coordinator.stragglers,
            shares_moved: coordinator.shares_moved,
            skipped_iterations: self
                .workers
                .iter()
                .map(|w| w.borrow().skipped_iterations)
                .sum(),
        }
    }

    /// Each filter's saving, summed over the workers, in the order the workers name them.
    pub(crate) fn filter_savings(&self) -> Vec<(&'static str, FilterSaving)> {
        let mut sums: Vec<(&'static str, FilterSaving)> = Vec::new();
        for w in &self.workers {
            for &(name, saving) in &w.borrow().filter_savings {
                match sums.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, sum)) => sum.add(saving),
                    None => sums.push((name, saving)),
                }
            }
        }
        sums
    }
}
