//! Pushes: applied once per key by the primary of their range, replicated, and acknowledged once
//! every replica holds them (ARCHITECTURE.md §4, §8).
//!
//! # Acknowledgement
//!
//! A push is acknowledged only when every replica of every shard it touched has applied its step
//! (`Server::unreplicated`); a resend whose rows were all applied waits the same way, because a new
//! replica may not have them yet. A server that no longer leads all of a range a push waits on (it
//! left the ring, or the range failed over) drops the wait instead of acknowledging: the range's
//! new primary may lack the push, and the worker resends it there.
//!
//! # Two stages in sequential mode
//!
//! Sequential mode buffers pushes and aggregates them on an `ApplyBelow` step once every worker
//! finished the iteration. If a push were acknowledged only once the replicas hold it, the replicas
//! would need every push before the aggregate could exist. Instead a primary with replicas answers
//! a buffered push with `PushTaken`: the worker counts the push for its iteration
//! (`crate::events::WorkerEvent::PushDone`), takes it out of its window, and keeps it (resent only at the longest
//! timeout) until `PushAck` says the replicas hold it (`crate::events::WorkerEvent::PushDurable`). Workers report both
//! kinds of progress (`Progress::finished_below`, acknowledged; `taken_below`, taken in), and the
//! servers aggregate on either. The replicas get the iteration's pushes as one sum
//! (`super::replication`).
//!
//! Taken in counts at one epoch. What a server took in but has not replicated dies with it, and a
//! process restarted under the same id may sit at the same place on the ring. So a worker counts a
//! slice as taken only at the epoch of the `PushTaken` (`Slice::taken`), sends every slice taken at
//! an earlier epoch again when it adopts a new one, and refuses a `PushTaken` from an earlier
//! epoch; a server counts taken progress only from a `Progress` of its own epoch. Finished progress
//! is not scoped: an acknowledged push is durable.

use crate::consistency::Consistency;
use crate::effects::{Effects, Refusal};
use crate::ids::{NodeId, Time};
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Message, Push, Replicate, ShardUpdate, smallvec};

use super::replication::commit_step;
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
        let dedupe = !mutated!(self, NoDedupe);
        // Counted first, so that the one vector the push keeps, and each replica's steps, are
        // allocated once.
        let touched = self.shards_in(span).count();
        let mut waits = Vec::with_capacity(touched);
        self.batches.expect(touched);
        // The shards are walked in place and each step committed as it is made: collecting
        // the starts, then the steps, cost a growing vector or two per push.
        let Server {
            shards,
            batches,
            updater,
            cfg,
            ..
        } = self;
        let first = super::reaching_into(shards, span).map_or(span.start(), |(&k, _)| k);
        for (_, shard) in shards.range_mut(first..span.end()) {
            // The span of the push may reach over ranges this server only replicates; the
            // ownership check above leaves no rows there.
            if !shard.is_primary() || push.kvs.slice(shard.range).is_empty() {
                continue;
            }
            if let Some(window) = shard.dedupe.get_mut(&from) {
                window.settle(push.settled_below);
            }
            let fresh = shard.fresh_rows(from, push.slice.request, &push.kvs, dedupe);
            if !fresh.is_empty() {
                let record = shard::record_of(from, push.settled_below, push.slice.request, &fresh);
                let update = if sequential && push.iteration >= shard.applied_below {
                    ShardUpdate::Buffer {
                        iteration: push.iteration,
                        kvs: fresh,
                    }
                } else {
                    ShardUpdate::Apply(fresh)
                };
                let entry = Replicate {
                    range: shard.range,
                    seq: shard.seq + 1,
                    span: 1,
                    update,
                    dedupe: smallvec![record],
                };
                commit_step(shard, batches, updater, cfg, entry);
            }
            // A resend waits for the replicas too: they may not have its rows yet. The step
            // just taken, if any, is the shard's last.
            waits.push((shard.range, shard.seq));
        }
        self.batches.expect(0);
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
