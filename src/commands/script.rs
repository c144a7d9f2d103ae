//! The script job: each worker pulls every key, computes, pushes one deterministic value per
//! key and advances, for N iterations. What it pushes is a function of (worker, iteration,
//! key), so the totals every server must end with are known in advance and a run can be
//! checked exactly.

use std::time::Duration;

use pserver_core::{Key, KeyList, KeySelection, KvPairs, NodeId};
use pserver_runtime::{RuntimeError, WorkerHandle};

/// The workload every worker of a job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Script {
    /// Keys pushed and pulled each iteration, spread over the whole key space.
    pub keys: u64,
    /// Iterations per worker.
    pub iterations: u32,
    /// Simulated compute time per iteration.
    pub compute: Duration,
}

/// What one worker did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WorkerSummary {
    /// Iterations completed.
    pub iterations: u32,
    /// Pushes acknowledged.
    pub pushes: u64,
    /// The sum of every value pushed.
    pub pushed_sum: i64,
}

impl Script {
    /// Key `i` of the script: indices spread evenly over the key space, so that every server's
    /// ranges get some.
    pub(crate) fn key(&self, i: u64) -> Key {
        i * ((u64::MAX - 1) / self.keys.max(1))
    }

    /// Every key of the script, in order.
    pub(crate) fn key_list(&self) -> Vec<Key> {
        (0..self.keys).map(|i| self.key(i)).collect()
    }

    /// What `worker` pushes to key index `k` in `iteration`.
    pub(crate) fn value(worker: NodeId, iteration: u32, k: u64) -> i64 {
        1 + ((u64::from(worker.0) * 7 + u64::from(iteration) * 13 + k) % 10) as i64
    }

    /// Per key index, the total the servers must hold once `workers` have run every iteration.
    pub(crate) fn expected_totals(&self, workers: impl IntoIterator<Item = NodeId>) -> Vec<i64> {
        let mut totals = vec![0i64; self.keys as usize];
        for w in workers {
            for it in 0..self.iterations {
                for (k, total) in totals.iter_mut().enumerate() {
                    *total += Script::value(w, it, k as u64);
                }
            }
        }
        totals
    }

    /// Runs the script on one worker: waits for the job to start (in the iteration of the
    /// checkpoint it resumes from, if it does), then for each iteration pulls
    /// every key, computes, pushes and advances without waiting for the push's
    /// acknowledgement (the consistency model decides how far ahead it may run). Returns once
    /// every push is acknowledged.
    /// Calls `done(iteration)` as each iteration is entered past.
    pub(crate) async fn run_reporting(
        &self,
        id: NodeId,
        worker: &WorkerHandle<i64>,
        done: impl Fn(u32),
    ) -> Result<WorkerSummary, RuntimeError> {
        worker.ready().await?;
        let keys = KeyList::new(self.key_list())
            .map_err(|e| RuntimeError::Config(format!("script keys: {e}")))?;
        let mut acks = Vec::new();
        let mut pushed_sum = 0i64;
        // A job resumed from a checkpoint holds every iteration before it already.
        let from = worker.resumed_from().await?.unwrap_or(0);
        for it in from..self.iterations {
            worker.pull(KeySelection::Keys(keys.clone())).await?;
            if !self.compute.is_zero() {
                tokio::time::sleep(self.compute).await;
            }
            let values: Vec<i64> = (0..self.keys).map(|k| Script::value(id, it, k)).collect();
            pushed_sum += values.iter().sum::<i64>();
            let kvs = KvPairs::new(keys.keys().to_vec(), values, 1)
                .map_err(|e| RuntimeError::Config(format!("script values: {e}")))?;
            acks.push(worker.start_push(kvs).await?);
            worker.advance().await?;
            done(it);
        }
        let pushes = acks.len() as u64;
        for ack in acks {
            ack.await?;
        }
        Ok(WorkerSummary {
            iterations: self.iterations,
            pushes,
            pushed_sum,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_totals_add_every_workers_every_iteration() {
        let s = Script {
            keys: 3,
            iterations: 2,
            compute: Duration::ZERO,
        };
        let totals = s.expected_totals([NodeId(4)]);
        let want: Vec<i64> = (0..3)
            .map(|k| Script::value(NodeId(4), 0, k) + Script::value(NodeId(4), 1, k))
            .collect();
        assert_eq!(totals, want);
        assert!(s.key(2) > s.key(1) && s.key(1) > 0);
    }
}
