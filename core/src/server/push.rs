//! Pushes: applied once per key by the primary of their range, replicated, and acknowledged
//! once every replica holds them (ARCHITECTURE.md §4, §8).

use crate::consistency::Consistency;
use crate::effects::{Effects, Refusal};
use crate::ids::{NodeId, Time};
use crate::key::Key;
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Message, Push, Replicate, ShardUpdate};

use super::{Server, shard};

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// A worker pushes: the rows each primary shard has not applied yet become a step of its
    /// update order; the push is acknowledged once every replica holds its steps (taken in
    /// first, in sequential mode), or redirected if this server is not the primary of every
    /// key.
    pub(super) fn on_push(&mut self, now: Time, from: NodeId, push: Push<V>, out: &mut Effects<V>) {
        let owned = push.kvs.is_empty()
            || self
                .cluster
                .as_ref()
                .is_some_and(|c| crate::slicing::primary_of_pairs(c, self.cfg.id, &push.kvs));
        if !owned {
            self.redirect(from, push.slice, out);
            return;
        }
        if push.kvs.width() != self.cfg.width {
            // A worker of another job; it will not be acknowledged.
            out.refuse(from, Refusal::ForeignJob);
            return;
        }
        let Some(span) = push.kvs.span() else {
            self.send(from, Message::PushAck(push.slice), out);
            return;
        };
        let sequential = self.consistency() == Consistency::Sequential;
        let starts: Vec<Key> = self.shard_starts_in(span);
        let mut waits = Vec::new();
        let mut updates = Vec::new();
        for start in starts {
            let Some(shard) = self.shards.get_mut(&start) else {
                continue;
            };
            // The span of the push may reach over ranges this server only replicates; the
            // ownership check above leaves no rows there.
            if !shard.is_primary() || push.kvs.slice(shard.range).is_empty() {
                continue;
            }
            if let Some(window) = shard.dedupe.get_mut(&from) {
                window.settle(push.settled_below);
            }
            let dedupe = !mutated!(self, NoDedupe);
            let fresh = shard.fresh_rows(from, push.slice.request, &push.kvs, dedupe);
            if !fresh.is_empty() {
                let update = if sequential && push.iteration >= shard.applied_below {
                    ShardUpdate::Buffer {
                        iteration: push.iteration,
                        kvs: fresh.clone(),
                    }
                } else {
                    ShardUpdate::Apply(fresh.clone())
                };
                let record = shard::record_of(from, push.settled_below, push.slice.request, &fresh);
                let entry = Replicate {
                    range: shard.range,
                    seq: shard.seq + 1,
                    span: 1,
                    update,
                    dedupe: vec![record],
                };
                updates.push(entry);
            }
            // A resend waits for the replicas too: they may not have its rows yet.
            waits.push((shard.range, shard.seq + u64::from(!fresh.is_empty())));
        }
        for entry in updates {
            self.commit(entry, out);
        }
        waits.retain(|&(range, seq)| !self.replicated(range, seq));
        if waits.is_empty() || mutated!(self, AckBeforeReplicate) {
            self.send(from, Message::PushAck(push.slice), out);
        } else {
            if sequential {
                // Its replicas get it with the iteration's sum, once every worker finished
                // the iteration, which this push may be what it waits for.
                self.send(from, Message::PushTaken(push.slice), out);
            }
            self.unreplicated.insert((from, push.slice), waits);
            self.arm_replication(now, out);
        }
    }
}
