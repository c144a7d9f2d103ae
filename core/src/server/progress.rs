//! Workers' progress as a server keeps it: how far each worker has come on each key range, and what
//! that lets the server do: answer held pulls, and in sequential mode apply the iterations every
//! worker finished (ARCHITECTURE.md §8).
//!
//! A server that joined a running job sends `ProgressRequest` to every worker it has not heard
//! from, on every heartbeat until it has: a worker may still count what the process before it
//! acknowledged.

use crate::cluster::Cluster;
use crate::consistency::Consistency;
use crate::effects::Effects;
use crate::ids::{Epoch, Iteration, NodeId, Time};
use crate::key::KeyRange;
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Message, Replicate, ShardUpdate, SmallVec};

use super::Server;

/// A worker's taken progress ([`Message::Progress`]) and the epoch it reported it at: counted
/// only while that epoch is in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Taken {
    epoch: Epoch,
    below: Iteration,
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// A worker reports its progress: finished, and taken in at the epoch it sent it at.
    pub(super) fn on_progress(
        &mut self,
        now: Time,
        from: NodeId,
        sent_at: Epoch,
        finished_below: Iteration,
        taken_below: Iteration,
        out: &mut Effects<V>,
    ) {
        self.progress_unheard.remove(&from);
        let clock = self.progress.entry(from).or_default();
        clock.advance(KeyRange::FULL, finished_below);
        let recorded = clock.min_in(KeyRange::FULL).unwrap_or(finished_below);
        let epoch = self.epoch();
        // Taken progress is kept only where it runs ahead of finished progress (in
        // sequential mode with replicas), and only at the epoch it was reported in.
        let taken = if sent_at != epoch {
            0
        } else if taken_below > recorded {
            let entry = self.taken.entry(from).or_insert(Taken { epoch, below: 0 });
            if entry.epoch != epoch {
                *entry = Taken { epoch, below: 0 };
            }
            entry.below = entry.below.max(taken_below);
            entry.below
        } else {
            self.taken
                .get(&from)
                .filter(|t| t.epoch == epoch)
                .map_or(recorded, |t| t.below.max(recorded))
        };
        let body = Message::ProgressAck {
            finished_below: recorded,
            taken_below: taken,
        };
        self.send(from, body, out);
        self.apply_finished_iterations(now, out);
        self.answer_held(out);
    }

    /// Asks every worker this process has not heard its progress from for it.
    pub(super) fn ask_for_progress(&self, out: &mut Effects<V>) {
        for &w in &self.progress_unheard {
            self.send(w, Message::ProgressRequest, out);
        }
    }

    /// A worker that joined a running job has nothing to push for the iterations the others
    /// finished: count it as having finished them too, so that nobody waits for it, and tell
    /// it where to start when it asks.
    pub(super) fn count_joiners_as_caught_up(&mut self, next: &Cluster) {
        let Some(old) = &self.cluster else {
            return;
        };
        let staying = old.workers().iter().filter(|w| next.is_worker(**w));
        let floor = match staying.map(|&w| self.finished_in(w, KeyRange::FULL)).min() {
            Some(min) => min,
            None => self
                .progress
                .values()
                .filter_map(|c| c.min_in(KeyRange::FULL))
                .max()
                .unwrap_or(0),
        };
        for &w in next.workers() {
            if !old.is_worker(w) {
                let clock = self.progress.entry(w).or_default();
                clock.advance(KeyRange::FULL, floor);
            }
        }
    }

    /// Sequential mode: applies, in order, each buffered iteration that every live worker has
    /// finished, aggregated over workers so that the update rule sees one sum per key.
    pub(super) fn apply_finished_iterations(&mut self, now: Time, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        if cluster.config.consistency != Consistency::Sequential {
            return;
        }
        let workers = cluster.workers();
        let behind: Vec<Replicate<V>> = self
            .shards
            .values()
            .filter(|s| s.is_primary())
            .filter_map(|s| {
                let done_below = workers
                    .iter()
                    .map(|&w| self.finished_in(w, s.range))
                    .min()?;
                (s.applied_below < done_below).then(|| Replicate {
                    range: s.range,
                    seq: s.seq + 1,
                    span: 1,
                    update: ShardUpdate::ApplyBelow(done_below),
                    dedupe: SmallVec::new(),
                })
            })
            .collect();
        let any = !behind.is_empty();
        for entry in behind {
            self.commit(entry);
        }
        if any {
            self.arm_replication(now, out);
        }
    }

    /// The iterations `worker` finished on every key of `range`: acknowledged, or taken in
    /// at this epoch by the primaries of their keys (which this server is, where it asks).
    pub(super) fn finished_in(&self, worker: NodeId, range: KeyRange) -> Iteration {
        let finished = self
            .progress
            .get(&worker)
            .and_then(|c| c.min_in(range))
            .unwrap_or(0);
        let taken = self
            .taken
            .get(&worker)
            .filter(|t| t.epoch == self.epoch())
            .map_or(0, |t| t.below);
        // Iterations the coordinator told the worker to skip are waited for no more
        // (ARCHITECTURE.md §9).
        let skipped = self
            .cluster
            .as_ref()
            .map_or(0, |c| c.config.pace.skipped_below(worker));
        let skipped = if skipped > 0 && mutated!(self, SkipPastDecision) {
            skipped + 1
        } else {
            skipped
        };
        finished.max(taken).max(skipped)
    }
}
