//! The invariants, checked against the ledger of what the workers pushed and against the
//! oracle's replay of what each server acknowledged.

use std::collections::BTreeMap;

use super::World;
use crate::sim::{Invariant, SimFailure, SimUpdater};
use pserver_core::KeyRange;
use pserver_core::KeySelection;
use pserver_core::KvPairs;
use pserver_core::pace::Pace;
use pserver_core::{Epoch, Iteration, NodeId, RequestId};

/// Above this many keys the oracle compares every key only at the end of a run (and the keys of
/// each step's server are left alone), and single ownership is checked only at the end, to keep
/// long runs fast.
const ORACLE_KEYS_PER_STEP: u64 = 1024;

/// `v` as an integer, if it is one that `f64` holds exactly.
fn exact(v: f64) -> Option<i64> {
    (v.fract() == 0.0 && v.abs() < 9_007_199_254_740_992.0).then_some(v as i64)
}

impl World<'_> {
    fn live_workers(&self) -> Vec<NodeId> {
        self.coordinator()
            .and_then(|c| c.config())
            .map(|c| c.workers.clone())
            .unwrap_or_default()
    }

    /// Whether the run's values are sums the ledger can judge: with `Sum` always, with another
    /// rule through the oracle, which only follows runs without replicas.
    fn sums_known(&self) -> bool {
        self.updater == SimUpdater::Sum || !self.replicated
    }

    /// Everything the key's primary in the ring in force took in for `key`: its own total with
    /// `Sum`, the oracle's sum of the deltas it acknowledged otherwise (the oracle holds the
    /// server to it). `None` when that cannot be told (another rule with replicas).
    fn total(&self, key: u64) -> Result<Option<i64>, SimFailure> {
        let owner = self.ring.primary(key);
        let Some(server) = self.server(owner) else {
            return Ok(None);
        };
        // A server restarted with nothing, named by a ring the coordinator has yet to replace,
        // serves nothing either: judged once it holds the key again.
        if !server.shards().any(|(r, _)| r.contains(key)) && self.now < self.cfg.time_limit {
            return Ok(None);
        }
        let total = match self.updater {
            SimUpdater::Sum => server.received_total(key)[0],
            _ if self.replicated => return Ok(None),
            _ => self.oracle.received(owner, key),
        };
        match exact(total) {
            Some(t) => Ok(Some(t)),
            None => Err(self.fail(
                Invariant::ExactlyOnce,
                format!("key {key}: its server took in {total}, which no sum of the pushes is"),
            )),
        }
    }

    /// The server's stored value of every key (every key of the run, when `all` or the run
    /// has few keys) equals the oracle's, bit for bit.
    pub(super) fn check_oracle(&self, server: NodeId, all: bool) -> Result<(), SimFailure> {
        if !all && self.cfg.keys > ORACLE_KEYS_PER_STEP {
            return Ok(());
        }
        let Some(s) = self.server(server) else {
            return Ok(());
        };
        for &key in &self.keys {
            let held = s.value(key).map(|row| row[0]);
            let want = self.oracle.value(server, key);
            if held.map(f64::to_bits) != want.map(f64::to_bits) {
                return Err(self.fail(
                    Invariant::Oracle,
                    format!(
                        "{server} stores {held:?} for key {key}, but replaying the pushes it acknowledged through {:?} gives {want:?}",
                        self.updater.rule()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A completed pull answered exactly what it asked (every key of a key list; only keys of
    /// the ranges), and every key it asked for, answered or not (a key missing from a range
    /// answer reads as 0), holds every push it must.
    pub(super) fn check_pull(
        &mut self,
        node: NodeId,
        id: RequestId,
        iteration: Iteration,
        asked: &KeySelection,
        kvs: &KvPairs<f64>,
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
        if !self.sums_known() {
            // Another rule with replicas: which sum a value stands for is not known.
            return Ok(());
        }
        // Each server answered under the pace of its epoch (ARCHITECTURE.md §9): the bound in
        // force then, and the iterations workers had been told to skip. The pull is held to
        // the weakest of the epochs that answered it.
        let epochs = self.reply_epochs.remove(&(node, id)).unwrap_or_default();
        let default_pace = Pace::default();
        let paces: Vec<&Pace> = if epochs.is_empty() {
            vec![&default_pace]
        } else {
            epochs
                .iter()
                .map(|e| self.paces.get(e).unwrap_or(&default_pace))
                .collect()
        };
        let live = self.live_workers();
        let bounds: Vec<(Iteration, Vec<(NodeId, Iteration)>)> = paces
            .iter()
            .map(|p| {
                let below = p
                    .consistency(self.cfg.consistency)
                    .required_below(iteration);
                let skipped = live.iter().map(|&w| (w, p.skipped_below(w))).collect();
                (below, skipped)
            })
            .collect();
        let below = bounds.iter().map(|b| b.0).min().unwrap_or(0);
        for key in requested {
            let v = kvs.get(key).map_or(0.0, |v| v[0]);
            // With `Sum` the value is the sum applied; otherwise the oracle says at which sum
            // of applied deltas the server held it.
            let applied = match self.updater {
                SimUpdater::Sum => exact(v),
                _ => {
                    let owner = self.ring.primary(key);
                    let Some(applied) = self.oracle.applied_when_held(owner, key, v) else {
                        return Err(self.fail(
                            Invariant::Oracle,
                            format!(
                                "{node} pulled key {key} in iteration {iteration} and got {v}, a value its server {owner} never held"
                            ),
                        ));
                    };
                    exact(applied)
                }
            };
            let need = bounds
                .iter()
                .map(|(below, skipped)| self.ledger.required(key, skipped, *below))
                .min()
                .unwrap_or(0);
            let most = self.ledger.issued(super::index_of(&self.keys, key));
            if applied.is_none_or(|a| a < need || a > most) {
                return Err(self.fail(
                    Invariant::Staleness,
                    format!(
                        "{node} pulled key {key} in iteration {iteration} and got {v} (pushes summing to {applied:?} applied), but the pushes of {live:?} below iteration {below} sum to {need} (at most {most} was ever pushed)"
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn check_step(&self) -> Result<(), SimFailure> {
        // Adaptive tau: a worker that entered iterations under a higher bound keeps them when
        // it falls, so the bound is the highest one in force so far.
        let published = self.paces.values().filter_map(|p| p.tau).max();
        if let Some(tau) = self
            .cfg
            .consistency
            .tau()
            .map(|t| t.max(published.unwrap_or(0)))
        {
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
        self.check_work_coverage()?;
        if self.cfg.keys <= ORACLE_KEYS_PER_STEP {
            self.check_single_owner(false)?;
        }
        if self.replicated {
            // Without replicas the primary is the only holder: exactly-once below says more.
            self.check_durability()?;
        }
        for i in 0..self.cfg.keys {
            let key = self.keys[i as usize];
            let Some(total) = self.total(key)? else {
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
                        "key {key}: its server {} (ring of epoch {}) holds {total}, but acknowledged pushes sum to {acked} and issued ones to {issued}",
                        self.ring.primary(key),
                        self.ring_epoch
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
        if self.ending && self.job_finished.is_none() {
            let left: Vec<String> = self
                .apps
                .iter()
                .filter(|(_, a)| a.left)
                .map(|(id, _)| id.to_string())
                .collect();
            return Err(self.fail(
                Invariant::Completion,
                format!(
                    "every worker asked to leave ({} confirmed), but the coordinator never said the job finished",
                    left.join(", ")
                ),
            ));
        }
        if !self.replicated {
            for server in self.cfg.server_ids() {
                self.check_oracle(server, true)?;
            }
        }
        if self.settles() {
            self.check_single_owner(true)?;
            self.check_durability()?;
            if let Some(detail) = self.divergence() {
                return Err(self.fail(Invariant::ReplicaConvergence, detail));
            }
        }
        let (lost, survivors): (Vec<NodeId>, Vec<NodeId>) =
            self.apps.keys().partition(|id| self.apps[*id].crashed);
        // Filters delay changes and drop none: once a worker flushed, its requests carried
        // what its application pushed (ARCHITECTURE.md §10).
        for &id in &survivors {
            for (i, &key) in self.keys.iter().enumerate() {
                let (issued, _) = self.ledger.by_workers(key, &[id]);
                let computed = self.apps[&id].computed.get(&i).copied().unwrap_or(0);
                if issued != computed {
                    return Err(self.fail(
                        Invariant::ExactlyOnce,
                        format!(
                            "key {key}: {id} pushed {computed} in all, but its requests carried {issued}: its filters lost the rest"
                        ),
                    ));
                }
            }
        }
        for i in 0..self.cfg.keys {
            let key = self.keys[i as usize];
            let total = match self.total(key)? {
                Some(total) => total,
                None if !self.sums_known() => continue,
                None => 0,
            };
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

impl World<'_> {
    /// Per live server, the ranges of the shards it holds (primary or replica), by start.
    fn live_shard_ranges(&self) -> Vec<(NodeId, Vec<KeyRange>)> {
        self.server_nodes()
            .into_iter()
            .filter(|s| !self.down.contains(s))
            .filter_map(|id| {
                let mut ranges: Vec<KeyRange> = self.server(id)?.shards().map(|(r, _)| r).collect();
                ranges.sort_by_key(|r| r.start());
                Some((id, ranges))
            })
            .collect()
    }

    /// Durability: every key some acknowledged push wrote is held by a live server, and (with
    /// sums the ledger can judge) one live holder's total covers every acknowledged push.
    pub(super) fn check_durability(&self) -> Result<(), SimFailure> {
        let held = self.live_shard_ranges();
        for (i, &key) in self.keys.iter().enumerate() {
            let acked = self.ledger.acked(i);
            if acked == 0 {
                continue;
            }
            let holders: Vec<NodeId> = held
                .iter()
                .filter(|(_, ranges)| {
                    let i = ranges.partition_point(|r| r.start() <= key);
                    i > 0 && ranges[i - 1].contains(key)
                })
                .map(|&(id, _)| id)
                .collect();
            if holders.is_empty() {
                return Err(self.fail(
                    Invariant::Durability,
                    format!(
                        "key {key}: acknowledged pushes sum to {acked}, but no live server holds it (crashed: {:?})",
                        self.down
                    ),
                ));
            }
            if self.updater != SimUpdater::Sum {
                continue;
            }
            let best = holders
                .iter()
                .filter_map(|&s| self.server(s))
                .map(|s| s.received_total(key)[0])
                .fold(f64::NEG_INFINITY, f64::max);
            if best < acked as f64 {
                return Err(self.fail(
                    Invariant::Durability,
                    format!(
                        "key {key}: acknowledged pushes sum to {acked}, but its live holders {holders:?} hold at most {best} (crashed: {:?})",
                        self.down
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Work coverage: every share of the work has a live member worker while any is left
    /// (or the worker that left the job with it done), and no live worker on the coordinator's
    /// epoch does a share given to another.
    fn check_work_coverage(&self) -> Result<(), SimFailure> {
        let Some(config) = self.coordinator().and_then(|c| c.config()) else {
            return Ok(());
        };
        let count = self.cfg.workers * self.cfg.stragglers.shares_per_worker();
        if config.shares.len() != count {
            return Err(self.fail(
                Invariant::WorkCoverage,
                format!(
                    "{} shares for {} workers, where the job has {count}",
                    config.shares.len(),
                    self.cfg.workers
                ),
            ));
        }
        if config.workers.is_empty() {
            return Ok(());
        }
        if let Some((share, holder)) = config
            .shares
            .iter()
            .enumerate()
            .find(|(_, h)| !config.workers.contains(h) && !config.left.contains(h))
        {
            return Err(self.fail(
                Invariant::WorkCoverage,
                format!("share {share} is left with {holder}, who is not a member"),
            ));
        }
        for (id, w) in self.workers() {
            let current =
                w.epoch() == config.epoch && self.apps.get(&id).is_some_and(|a| !a.crashed);
            if current && w.shares() != config.shares_of(id) {
                return Err(self.fail(
                    Invariant::WorkCoverage,
                    format!(
                        "{id} does shares {:?}, but the coordinator gave it {:?}",
                        w.shares(),
                        config.shares_of(id)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Single owner: among the live servers on one epoch, at most one holds a primary shard
    /// containing a key; at quiescence (`settled`) exactly one live server does, the primary
    /// the coordinator's ring names.
    pub(super) fn check_single_owner(&self, settled: bool) -> Result<(), SimFailure> {
        let mut seen: BTreeMap<(Epoch, u64), NodeId> = BTreeMap::new();
        let mut primaries: BTreeMap<u64, Vec<NodeId>> = BTreeMap::new();
        for id in self
            .server_nodes()
            .into_iter()
            .filter(|s| !self.down.contains(s))
        {
            let Some(server) = self.server(id) else {
                continue;
            };
            let epoch = server.epoch();
            for (range, primary) in server.shards() {
                if !primary {
                    continue;
                }
                let from = self.keys.partition_point(|&k| k < range.start());
                for &key in self.keys[from..].iter().take_while(|&&k| k < range.end()) {
                    primaries.entry(key).or_default().push(id);
                    if let Some(other) = seen.insert((epoch, key), id) {
                        if other != id {
                            return Err(self.fail(
                                Invariant::SingleOwner,
                                format!(
                                    "key {key}: {other} and {id} are both its primary on epoch {epoch}"
                                ),
                            ));
                        }
                    }
                }
            }
        }
        if settled {
            for &key in &self.keys {
                let want = self.ring.primary(key);
                let got = primaries.get(&key).map_or(&[][..], Vec::as_slice);
                if got != [want] {
                    return Err(self.fail(
                        Invariant::SingleOwner,
                        format!(
                            "key {key}: at quiescence its primary shards are on {got:?}, but the coordinator's ring (epoch {}) names {want}",
                            self.ring_epoch
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
