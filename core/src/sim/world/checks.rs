//! The invariants, checked against the ledger of what the workers pushed.

use super::World;
use crate::kv::KvPairs;
use crate::message::KeySelection;
use crate::node::{Iteration, NodeId};
use crate::sim::{Invariant, SimFailure};

impl World<'_> {
    fn live_workers(&self) -> Vec<NodeId> {
        self.coordinator()
            .and_then(|c| c.config())
            .map(|c| c.workers.clone())
            .unwrap_or_default()
    }

    fn total(&self, key: u64) -> Option<i64> {
        let owner = self.ring.primary(key);
        self.server(owner).map(|s| s.received_total(key)[0])
    }

    /// A completed pull answered exactly what it asked (every key of a key list; only keys of
    /// the ranges), and every key it asked for, answered or not (a key missing from a range
    /// answer reads as 0), holds every push it must.
    pub(super) fn check_pull(
        &self,
        node: NodeId,
        iteration: Iteration,
        asked: &KeySelection,
        kvs: &KvPairs<i64>,
    ) -> Result<(), SimFailure> {
        let requested: Vec<u64> = match asked {
            KeySelection::Keys(list) => {
                if kvs.keys() != list.keys() {
                    return Err(self.fail(
                        Invariant::PullComplete,
                        format!(
                            "{node} asked for keys {:?} and was answered {:?}",
                            list.keys(),
                            kvs.keys()
                        ),
                    ));
                }
                list.keys().to_vec()
            }
            KeySelection::Ranges(ranges) => {
                if let Some(k) = kvs.keys().iter().find(|&&k| !ranges.contains(k)) {
                    return Err(self.fail(
                        Invariant::PullComplete,
                        format!("{node} was answered key {k}, outside the ranges it asked for"),
                    ));
                }
                self.keys
                    .iter()
                    .copied()
                    .filter(|&k| ranges.contains(k))
                    .collect()
            }
        };
        let below = self.cfg.consistency.required_below(iteration);
        let live = self.live_workers();
        for key in requested {
            let v = [kvs.get(key).map_or(0, |v| v[0])];
            let need = self.ledger.required(key, &live, below);
            let most = self.ledger.issued(super::index_of(&self.keys, key));
            if v[0] < need || v[0] > most {
                return Err(self.fail(
                    Invariant::Staleness,
                    format!(
                        "{node} pulled key {key} in iteration {iteration} and got {}, but the pushes of {live:?} below iteration {below} sum to {need} (at most {most} was ever pushed)",
                        v[0]
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn check_step(&self) -> Result<(), SimFailure> {
        if let Some(tau) = self.cfg.consistency.tau() {
            for (id, w) in self.workers() {
                if self.apps.get(&id).is_some_and(|a| !a.crashed) && w.in_flight() > tau + 1 {
                    return Err(self.fail(
                        Invariant::InFlight,
                        format!(
                            "{id} has {} iterations in flight (iteration {}, finished below {}), tau = {tau}",
                            w.in_flight(),
                            w.iteration(),
                            w.finished_below()
                        ),
                    ));
                }
            }
        }
        if self.coordinator().is_none_or(|c| c.config().is_none()) {
            return Ok(());
        }
        for i in 0..self.cfg.keys {
            let key = self.keys[i as usize];
            let Some(total) = self.total(key) else {
                continue;
            };
            let (acked, issued) = (
                self.ledger.acked(i as usize),
                self.ledger.issued(i as usize),
            );
            if total < acked || total > issued {
                return Err(self.fail(
                    Invariant::ExactlyOnce,
                    format!(
                        "key {key}: its server holds {total}, but acknowledged pushes sum to {acked} and issued ones to {issued}"
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn check_end(&self) -> Result<(), SimFailure> {
        if !self.all_done() {
            return Err(self.fail(Invariant::Completion, self.stuck_report()));
        }
        let (lost, survivors): (Vec<NodeId>, Vec<NodeId>) =
            self.apps.keys().partition(|id| self.apps[*id].crashed);
        for i in 0..self.cfg.keys {
            let key = self.keys[i as usize];
            let total = self.total(key).unwrap_or_default();
            let (survived, _) = self.ledger.by_workers(key, &survivors);
            let (lost_issued, lost_acked) = self.ledger.by_workers(key, &lost);
            let extra = total - survived;
            if extra < lost_acked || extra > lost_issued {
                return Err(self.fail(
                    Invariant::ExactlyOnce,
                    format!(
                        "key {key}: its server holds {total}; surviving workers pushed {survived}, crashed ones {lost_acked}..={lost_issued}"
                    ),
                ));
            }
        }
        Ok(())
    }
}
