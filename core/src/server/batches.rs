//! Replication steps on their way to the replica servers: one batch per replica server per
//! call, cut to the frame limit, with a bound on batches unacknowledged (ARCHITECTURE.md §8).
//!
//! A push that touches many shards makes a step on each, and the shards of one primary are
//! replicated on a few servers only. Every step a call makes (a push's, an iteration's sums,
//! steps resent from the log) is gathered per replica server and goes out when the call ends
//! ([`Server::send_batches`]) as one `Replicate` message per replica server, cut where the
//! next step would take it past `ServerConfig::max_frame`; the replica answers each message
//! with one `ReplicateAck`. So replication costs a frame and an acknowledgement per replica
//! server, however many ring segments the push crossed.
//!
//! At most `ServerConfig::replication_in_flight` batches to one replica server go
//! unacknowledged; steps beyond wait, gathering more, until an acknowledgement comes. Every
//! step sent is in the shard's log first, so a step that waits is never the only record of
//! it: when acknowledgements are lost, the replication timer forgets what was in flight and
//! waiting and resends from the log what each replica lacks.

use std::collections::BTreeMap;

use crate::effects::Effects;
use crate::ids::NodeId;
use crate::sizes;
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Message, Replicate};

use super::Server;

/// Steps gathered for the replica servers, and the batches each has not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Batches<V: Value> {
    /// Per replica server, steps not sent yet, in the order they were made.
    waiting: BTreeMap<NodeId, Vec<Replicate<V>>>,
    /// Per replica server, batches sent and not acknowledged.
    in_flight: BTreeMap<NodeId, u32>,
}

impl<V: Value> Default for Batches<V> {
    fn default() -> Self {
        Batches {
            waiting: BTreeMap::new(),
            in_flight: BTreeMap::new(),
        }
    }
}

impl<V: Value> Batches<V> {
    /// Adds `steps` to what goes to `replica`.
    pub(super) fn gather(
        &mut self,
        replica: NodeId,
        steps: impl IntoIterator<Item = Replicate<V>>,
    ) {
        let waiting = self.waiting.entry(replica).or_default();
        waiting.extend(steps);
        if waiting.is_empty() {
            self.waiting.remove(&replica);
        }
    }

    /// `replica` acknowledged a batch.
    pub(super) fn acked(&mut self, replica: NodeId) {
        if let Some(n) = self.in_flight.get_mut(&replica) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.in_flight.remove(&replica);
            }
        }
    }

    /// Forgets every batch in flight and every step waiting: the log holds them, and the
    /// caller resends from it what each replica lacks.
    pub(super) fn forget(&mut self) {
        self.waiting.clear();
        self.in_flight.clear();
    }

    /// True when steps wait for a replica's acknowledgement.
    pub(super) fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Takes the batches to send now, each at most `room` bytes of steps (one step alone may
    /// be larger), at most `bound` in flight per replica unless `all`.
    fn take(&mut self, room: usize, bound: u32, all: bool) -> Vec<(NodeId, Vec<Replicate<V>>)> {
        let mut out = Vec::new();
        let mut emptied = Vec::new();
        for (&replica, steps) in &mut self.waiting {
            let mut in_flight = self.in_flight.get(&replica).copied().unwrap_or(0);
            let mut rest = core::mem::take(steps).into_iter().peekable();
            while rest.peek().is_some() && (all || in_flight < bound) {
                let mut batch = Vec::new();
                let mut bytes = 0usize;
                while let Some(step) = rest.next_if(|s| {
                    batch.is_empty() || bytes.saturating_add(sizes::step_bytes(s)) <= room
                }) {
                    bytes = bytes.saturating_add(sizes::step_bytes(&step));
                    batch.push(step);
                }
                in_flight = in_flight.saturating_add(1);
                out.push((replica, batch));
            }
            if in_flight > 0 {
                self.in_flight.insert(replica, in_flight);
            }
            steps.extend(rest);
            if steps.is_empty() {
                emptied.push(replica);
            }
        }
        for replica in emptied {
            self.waiting.remove(&replica);
        }
        out
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// Sends what was gathered for the replica servers, within the bound on batches in flight
    /// (past it too when `all`: before the ring changes, what is gathered goes out under the
    /// configuration it was made in).
    pub(super) fn send_batches(&mut self, all: bool, out: &mut Effects<V>) {
        if !self.batches.has_waiting() {
            return;
        }
        let room = sizes::steps_within(self.cfg.max_frame);
        let bound = self.cfg.replication_in_flight.max(1);
        for (to, updates) in self.batches.take(room, bound, all) {
            self.send(to, Message::Replicate { updates }, out);
        }
    }
}
