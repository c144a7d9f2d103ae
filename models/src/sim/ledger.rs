//! What the simulated workers pushed and had acknowledged: the ground truth the invariants are
//! checked against. Pushed values are small integers (sent as `f64`), kept here as `i64` so that
//! every total is exact.

use std::collections::BTreeMap;

use pserver_core::KvPairs;
use pserver_core::RequestId;
use pserver_core::{Iteration, NodeId};

#[derive(Clone, Debug)]
struct PushRecord {
    iteration: Iteration,
    kvs: KvPairs<i64>,
    acked: bool,
}

/// Every push issued in a simulation, by worker and request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ledger {
    pushes: BTreeMap<(NodeId, RequestId), PushRecord>,
    /// Per key index: sum issued and sum acknowledged, over all workers.
    issued: Vec<i64>,
    acked: Vec<i64>,
}

impl Ledger {
    pub(crate) fn new(keys: usize) -> Self {
        Ledger {
            pushes: BTreeMap::new(),
            issued: vec![0; keys],
            acked: vec![0; keys],
        }
    }

    pub(crate) fn issue(
        &mut self,
        worker: NodeId,
        id: RequestId,
        iteration: Iteration,
        pushed: &KvPairs<f64>,
        index: impl Fn(u64) -> usize,
    ) {
        // The simulated deltas are small integers, exact in f64: the ledger keeps them exactly.
        let values = pushed.iter().map(|(_, v)| v[0] as i64).collect();
        let Ok(kvs) = KvPairs::new(pushed.keys().to_vec(), values, 1) else {
            return;
        };
        for (k, v) in kvs.iter() {
            self.issued[index(k)] += v[0];
        }
        self.pushes.insert(
            (worker, id),
            PushRecord {
                iteration,
                kvs,
                acked: false,
            },
        );
    }

    /// Marks a push acknowledged; false if it was never issued or already acknowledged.
    pub(crate) fn ack(
        &mut self,
        worker: NodeId,
        id: RequestId,
        index: impl Fn(u64) -> usize,
    ) -> bool {
        let Some(rec) = self.pushes.get_mut(&(worker, id)) else {
            return false;
        };
        if rec.acked {
            return false;
        }
        rec.acked = true;
        for (k, v) in rec.kvs.iter() {
            self.acked[index(k)] += v[0];
        }
        true
    }

    pub(crate) fn issued(&self, key_index: usize) -> i64 {
        self.issued[key_index]
    }

    pub(crate) fn acked(&self, key_index: usize) -> i64 {
        self.acked[key_index]
    }

    /// Sum for `key` of the pushes of `workers` in iterations below `below`, each worker's
    /// from the iteration given with it on (the ones before it were skipped).
    pub(crate) fn required(
        &self,
        key: u64,
        workers: &[(NodeId, Iteration)],
        below: Iteration,
    ) -> i64 {
        self.pushes
            .iter()
            .filter(|((w, _), r)| {
                r.iteration < below
                    && workers
                        .iter()
                        .any(|&(lw, skipped)| lw == *w && r.iteration >= skipped)
            })
            .filter_map(|(_, r)| r.kvs.get(key).map(|v| v[0]))
            .sum()
    }

    /// Sums for `key` of the pushes of `workers`: `(issued, acknowledged)`.
    pub(crate) fn by_workers(&self, key: u64, workers: &[NodeId]) -> (i64, i64) {
        let mut out = (0, 0);
        for ((w, _), r) in &self.pushes {
            if workers.contains(w) {
                if let Some(v) = r.kvs.get(key) {
                    out.0 += v[0];
                    if r.acked {
                        out.1 += v[0];
                    }
                }
            }
        }
        out
    }
}
