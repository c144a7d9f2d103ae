//! The one-node oracle: replays, per server, the pushes that server acknowledged, through the
//! same update rule, and says what every key must hold (see the module docs of `sim`).

use std::collections::{BTreeMap, BTreeSet};

use pserver_core::KvPairs;
use pserver_core::wire::{Push, SliceRef};
use pserver_core::{Iteration, NodeId};
use pserver_core::{UpdateRule, Updater};

/// A push slice as its worker sent it.
#[derive(Clone, Debug)]
struct Sent {
    server: NodeId,
    iteration: Iteration,
    kvs: KvPairs<f64>,
}

/// One key on one server, as the oracle computes it.
#[derive(Clone, Debug)]
struct Row {
    weight: f64,
    aux: Vec<f64>,
    /// Sum of the deltas applied so far.
    applied: f64,
}

/// What one server must hold.
#[derive(Clone, Debug, Default)]
struct Replica {
    /// Push slices this server acknowledged, by worker.
    accepted: BTreeSet<(NodeId, SliceRef)>,
    /// Sequential mode: accepted pushes per iteration, in acknowledgement order.
    pending: BTreeMap<Iteration, Vec<KvPairs<f64>>>,
    /// Sequential mode: every iteration below this one is applied.
    applied_below: Iteration,
    rows: BTreeMap<u64, Row>,
    /// Per key: sum of every accepted delta, applied or buffered.
    received: BTreeMap<u64, f64>,
    /// Per key: every value the key held, with the sum of the deltas applied to reach it.
    history: BTreeMap<u64, Vec<(u64, f64)>>,
}

/// The oracle of a whole run.
#[derive(Clone, Debug)]
pub(crate) struct Oracle {
    rule: Updater,
    sequential: bool,
    sent: BTreeMap<(NodeId, SliceRef), Sent>,
    replicas: BTreeMap<NodeId, Replica>,
}

impl Oracle {
    pub(crate) fn new(rule: Updater, sequential: bool) -> Self {
        Oracle {
            rule,
            sequential,
            sent: BTreeMap::new(),
            replicas: BTreeMap::new(),
        }
    }

    /// `worker` sent `push` to `server`. A slice's content never changes, so the first copy is
    /// kept.
    pub(crate) fn sent(&mut self, worker: NodeId, server: NodeId, push: &Push<f64>) {
        self.sent
            .entry((worker, push.slice))
            .or_insert_with(|| Sent {
                server,
                iteration: push.iteration,
                kvs: push.kvs.clone(),
            });
    }

    /// `server` acknowledged `slice` of `worker`: the first time, it accepted the slice.
    pub(crate) fn acked(
        &mut self,
        server: NodeId,
        worker: NodeId,
        slice: SliceRef,
    ) -> Result<(), String> {
        let replica = self.replicas.entry(server).or_default();
        if !replica.accepted.insert((worker, slice)) {
            return Ok(());
        }
        let Some(sent) = self.sent.get(&(worker, slice)) else {
            return Err(format!(
                "{server} acknowledged push slice {slice:?} of {worker}, which {worker} never sent"
            ));
        };
        if sent.server != server {
            return Err(format!(
                "{server} acknowledged push slice {slice:?} of {worker}, which {worker} sent to {}",
                sent.server
            ));
        }
        for (key, v) in sent.kvs.iter() {
            *replica.received.entry(key).or_default() += v[0];
        }
        if self.sequential && sent.iteration >= replica.applied_below {
            replica
                .pending
                .entry(sent.iteration)
                .or_default()
                .push(sent.kvs.clone());
        } else {
            let deltas: Vec<(u64, f64)> = sent.kvs.iter().map(|(k, v)| (k, v[0])).collect();
            apply(self.rule, replica, deltas);
        }
        Ok(())
    }

    /// `server` reports every iteration below `applied_below` applied: apply the buffered ones,
    /// each as one key-wise sum in acknowledgement order.
    pub(crate) fn advance(
        &mut self,
        server: NodeId,
        applied_below: Iteration,
    ) -> Result<(), String> {
        let replica = self.replicas.entry(server).or_default();
        if applied_below < replica.applied_below {
            return Err(format!(
                "{server} went back from applying every iteration below {} to below {applied_below}",
                replica.applied_below
            ));
        }
        while replica.applied_below < applied_below {
            let batch = replica
                .pending
                .remove(&replica.applied_below)
                .unwrap_or_default();
            // Key by key, adding each push's delta in acknowledgement order.
            let mut sums: BTreeMap<u64, f64> = BTreeMap::new();
            for kvs in &batch {
                for (key, v) in kvs.iter() {
                    sums.entry(key)
                        .and_modify(|acc| *acc += v[0])
                        .or_insert(v[0]);
                }
            }
            apply(self.rule, replica, sums.into_iter().collect());
            replica.applied_below += 1;
        }
        Ok(())
    }

    /// The value `server` must store for `key`, `None` if it never applied anything to it.
    pub(crate) fn value(&self, server: NodeId, key: u64) -> Option<f64> {
        self.replicas
            .get(&server)
            .and_then(|r| r.rows.get(&key))
            .map(|row| row.weight)
    }

    /// Sum of the deltas `server` accepted for `key`, applied or buffered.
    pub(crate) fn received(&self, server: NodeId, key: u64) -> f64 {
        self.replicas
            .get(&server)
            .and_then(|r| r.received.get(&key))
            .copied()
            .unwrap_or(0.0)
    }

    /// The largest sum of applied deltas at which `server` held `value` for `key` (a key never
    /// written reads as 0 with nothing applied); `None` if it never held that value.
    pub(crate) fn applied_when_held(&self, server: NodeId, key: u64, value: f64) -> Option<f64> {
        let bits = value.to_bits();
        let initial = (bits == 0.0f64.to_bits()).then_some(0.0);
        let seen = self
            .replicas
            .get(&server)
            .and_then(|r| r.history.get(&key))
            .into_iter()
            .flatten()
            .filter(|&&(b, _)| b == bits)
            .map(|&(_, applied)| applied);
        initial.into_iter().chain(seen).reduce(f64::max)
    }
}

/// Applies one delta per key, in key order, as a server's `apply` does.
fn apply(rule: Updater, replica: &mut Replica, deltas: Vec<(u64, f64)>) {
    let aux_width = UpdateRule::<f64>::aux_width(&rule);
    for (key, delta) in deltas {
        let row = replica.rows.entry(key).or_insert_with(|| Row {
            weight: 0.0,
            aux: vec![0.0; aux_width],
            applied: 0.0,
        });
        rule.apply(&mut row.weight, &mut row.aux, delta);
        row.applied += delta;
        replica
            .history
            .entry(key)
            .or_default()
            .push((row.weight.to_bits(), row.applied));
    }
}
