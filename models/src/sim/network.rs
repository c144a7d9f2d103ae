//! The simulated network: latency, loss, duplication, reordering and partitions, all drawn from
//! the simulation's seeded generator.

use std::collections::{BTreeMap, BTreeSet};

use super::rng::SimRng;
use pserver_core::{NodeId, Time};

/// Which faults the network injects.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Probability that a message is lost.
    pub drop: f64,
    /// Probability that a message is delivered twice.
    pub dup: f64,
    /// Deliver messages between a pair out of order (otherwise per-pair FIFO, like TCP).
    pub reorder: bool,
    /// Cut nodes off for a while, then heal.
    pub partition: bool,
    /// Crash one worker mid-run.
    pub crash: bool,
}

impl Faults {
    /// True when any fault is on.
    pub fn any(&self) -> bool {
        self.drop > 0.0 || self.dup > 0.0 || self.reorder || self.partition || self.crash
    }
}

/// Decides when (and whether) each message arrives.
#[derive(Clone, Debug)]
pub(crate) struct Network {
    faults: Faults,
    latency: Time,
    /// Latest delivery time per ordered pair, to keep FIFO when reordering is off.
    last: BTreeMap<(NodeId, NodeId), Time>,
    isolated: BTreeSet<NodeId>,
    /// Links that lose everything sent on them, as (from, to).
    cut: BTreeSet<(NodeId, NodeId)>,
    pub(crate) sent: u64,
    pub(crate) dropped: u64,
}

impl Network {
    pub(crate) fn new(faults: Faults, latency: Time) -> Self {
        Network {
            faults,
            latency,
            last: BTreeMap::new(),
            isolated: BTreeSet::new(),
            cut: BTreeSet::new(),
            sent: 0,
            dropped: 0,
        }
    }

    pub(crate) fn isolate(&mut self, node: NodeId) {
        self.isolated.insert(node);
    }

    pub(crate) fn heal(&mut self, node: NodeId) {
        self.isolated.remove(&node);
    }

    /// Cuts the links between `node` and each of `peers`, both ways.
    pub(crate) fn cut_off(&mut self, node: NodeId, peers: impl IntoIterator<Item = NodeId>) {
        for peer in peers {
            if peer != node {
                self.cut.insert((node, peer));
                self.cut.insert((peer, node));
            }
        }
    }

    /// Restores every link of `node` that [`Network::cut_off`] cut.
    pub(crate) fn reconnect(&mut self, node: NodeId) {
        self.cut.retain(|&(a, b)| a != node && b != node);
    }

    /// Delivery times of one message sent now: none (lost), one, or two (duplicated). A
    /// message `late` by up to that much more is delivered out of order.
    pub(crate) fn deliveries(
        &mut self,
        rng: &mut SimRng,
        now: Time,
        from: NodeId,
        to: NodeId,
        late: Option<Time>,
    ) -> Vec<Time> {
        self.sent += 1;
        if self.isolated.contains(&from)
            || self.isolated.contains(&to)
            || self.cut.contains(&(from, to))
            || rng.chance(self.faults.drop)
        {
            self.dropped += 1;
            return Vec::new();
        }
        let copies = if rng.chance(self.faults.dup) { 2 } else { 1 };
        (0..copies)
            .map(|_| {
                let jitter = rng.below(self.latency / 2 + 1);
                let mut at = now + self.latency + jitter;
                if let Some(late) = late {
                    at += rng.below(late + 1);
                } else if self.faults.reorder {
                    at += rng.below(self.latency * 4 + 1);
                } else {
                    let last = self.last.entry((from, to)).or_default();
                    at = at.max(*last);
                    *last = at;
                }
                at
            })
            .collect()
    }
}
