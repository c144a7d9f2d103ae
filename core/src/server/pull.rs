//! Pulls: who serves them, when the consistency model lets them be answered, and the answers, a
//! range pull's in parts that each fit a message (ARCHITECTURE.md §3).
//!
//! A range pull is answered in parts of at most `ServerConfig::max_reply_bytes`, each part saying
//! where the next begins (`PullReply::resume`), and the worker asks again from there under the same
//! slice: a range's server alone knows how many keys it holds, so only it can cut the answer.

use core::ops::ControlFlow;

use crate::consistency::Consistency;
use crate::effects::Effects;
use crate::ids::{Iteration, NodeId};
use crate::key::{Key, KeyRange};
use crate::kv::{KvPairs, PairsBuilder};
use crate::selection::{KeyList, KeySelection, RangeList};
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Message, Pull, PullReply, PullRows, PullValues, RowValues, SliceRef};

use super::Server;

/// A pull waiting until the consistency model lets it be answered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct HeldPull {
    iteration: Iteration,
    keys: KeySelection,
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// A worker pulls: answered at once if the consistency model allows, else held; redirected
    /// if this server is not the primary of every key asked for.
    pub(super) fn on_pull(&mut self, from: NodeId, pull: Pull, out: &mut Effects<V>) {
        if !self.serves(&pull.keys) {
            self.redirect(from, pull.slice, out);
            return;
        }
        let held = HeldPull {
            iteration: pull.iteration,
            keys: pull.keys,
        };
        if self.may_answer(from, &held) {
            self.answer(from, pull.slice, &held, out);
        } else {
            self.held.insert((from, pull.slice), held);
        }
    }

    /// Answers every held pull that the consistency model now lets through.
    pub(super) fn answer_held(&mut self, out: &mut Effects<V>) {
        let ready: Vec<(NodeId, SliceRef)> = self
            .held
            .iter()
            .filter(|((asking, _), h)| self.may_answer(*asking, h))
            .map(|(&k, _)| k)
            .collect();
        for key in ready {
            if let Some(h) = self.held.remove(&key) {
                self.answer(key.0, key.1, &h, out);
            }
        }
    }

    /// Lets go of the pulls held for ranges this server no longer serves: their workers send
    /// them again, re-sliced under the new ring.
    pub(super) fn drop_unserved_pulls(&mut self) {
        let held = core::mem::take(&mut self.held);
        self.held = held
            .into_iter()
            .filter(|(_, h)| self.serves(&h.keys))
            .collect();
    }

    fn may_answer(&self, asking: NodeId, pull: &HeldPull) -> bool {
        let Some(cluster) = &self.cluster else {
            return false;
        };
        if mutated!(self, NoGating) {
            return true;
        }
        let Some(span) = pull.keys.span() else {
            return true;
        };
        // The bound of the configuration in force, adaptive tau's where it moves
        // (ARCHITECTURE.md §9).
        let consistency = match cluster.consistency() {
            Consistency::BoundedDelay(tau)
                if cluster.config.pace.tau.is_some() && mutated!(self, TauPastDecision) =>
            {
                Consistency::BoundedDelay(tau + 1)
            }
            consistency => consistency,
        };
        let required = consistency.required_below(pull.iteration);
        let workers_done = cluster
            .workers()
            .iter()
            .filter(|&&w| w == asking || !mutated!(self, OwnProgressOnly))
            .all(|&w| self.finished_in(w, span) >= required);
        let applied = || {
            self.shard_starts_in(span)
                .iter()
                .filter_map(|s| self.shards.get(s))
                .filter(|s| s.is_primary())
                .all(|s| s.applied_below >= required)
        };
        workers_done && (consistency != Consistency::Sequential || applied())
    }

    /// True when this server is the primary of every key of `keys`.
    fn serves(&self, keys: &KeySelection) -> bool {
        match keys {
            KeySelection::Keys(keys) => self.owns_all(keys.keys()),
            KeySelection::Ranges(ranges) => ranges.ranges().iter().all(|&r| self.owns_range(r)),
        }
    }

    /// Whether a push or pull may be served, or must be redirected.
    fn owns_all(&self, keys: &[Key]) -> bool {
        keys.is_empty()
            || self
                .cluster
                .as_ref()
                .is_some_and(|c| crate::slicing::primary_of_keys(c, self.cfg.id, keys))
    }

    fn owns_range(&self, range: KeyRange) -> bool {
        self.cluster.as_ref().is_some_and(|c| {
            c.ring
                .segments_in(range)
                .all(|(_, owners)| owners[0] == self.cfg.id)
        })
    }

    fn answer(&self, to: NodeId, slice: SliceRef, pull: &HeldPull, out: &mut Effects<V>) {
        let (kvs, resume) = match &pull.keys {
            KeySelection::Keys(list) => (self.values_of(list), None),
            KeySelection::Ranges(ranges) => self.rows_in(ranges),
        };
        // The bound this answer was held to: adaptive tau's where it moves.
        let complete_below = self
            .cluster
            .as_ref()
            .map_or(0, |c| c.consistency().required_below(pull.iteration));
        let body = match &pull.keys {
            // With key caching the worker has the keys it asked for (ARCHITECTURE.md §10).
            KeySelection::Keys(_) if self.cfg.key_caching.is_some() => {
                Message::PullValues(PullValues {
                    slice,
                    complete_below,
                    values: if self.cfg.compression {
                        RowValues::packed(&kvs)
                    } else {
                        RowValues::of(&kvs)
                    },
                })
            }
            // With compression, a range's values are packed too; its keys go as a list.
            KeySelection::Ranges(_) if self.cfg.compression => Message::PullRows(PullRows {
                slice,
                complete_below,
                keys: KeyList::from_validated(kvs.keys().to_vec()),
                values: RowValues::packed(&kvs),
                resume,
            }),
            _ => Message::PullReply(PullReply {
                slice,
                complete_below,
                kvs,
                resume,
            }),
        };
        self.send(to, body, out);
    }

    /// The values of every key of `list`; a key no shard holds reads as zero.
    fn values_of(&self, list: &KeyList) -> KvPairs<V> {
        let width = self.cfg.width;
        let keys = list.keys().to_vec();
        let mut values = Vec::with_capacity(keys.len() * width);
        // Shard by shard, so that each store reads its keys in one ordered pass.
        let mut rest = list.keys();
        while let Some(&first) = rest.first() {
            let shard = self.shard_of(first);
            let n = shard.map_or(1, |s| rest.partition_point(|&k| s.range.contains(k)));
            let n = n.max(1);
            match shard {
                Some(shard) => shard.store.values_of(&rest[..n], width, &mut values),
                None => values.resize(values.len() + n * width, V::default()),
            }
            rest = &rest[n..];
        }
        KvPairs::from_validated(keys, values, width)
    }

    /// The stored rows of `ranges`, as many as one reply carries, and where the rest begins
    /// when they do not all fit.
    fn rows_in(&self, ranges: &RangeList) -> (KvPairs<V>, Option<Key>) {
        let width = self.cfg.width;
        let mut resume = None;
        // Beyond the rows one message may carry, remember only where to resume.
        let most = self.cfg.rows_per_reply::<V>();
        // Room for every row the reply can hold, reserved once: the rows asked for, at
        // most what one reply carries and what the shards hold.
        let asked = ranges
            .ranges()
            .iter()
            .map(|r| r.len())
            .fold(0, u64::saturating_add);
        let held: usize = self.shards.values().map(|s| s.store.len()).sum();
        let room = usize::try_from(asked).map_or(most, |n| n.min(most).min(held));
        let mut rows = PairsBuilder::with_capacity(width, room);
        'ranges: for &r in ranges.ranges() {
            for start in self.shard_starts_in(r) {
                let Some(shard) = self.shards.get(&start) else {
                    continue;
                };
                let Some(part) = shard.range.intersect(r) else {
                    continue;
                };
                shard
                    .store
                    .for_each_run_in(part, &mut |run_keys, run_values| {
                        let room = most - rows.len();
                        let take = run_keys.len().min(room);
                        rows.extend(&run_keys[..take], &run_values[..take * width]);
                        resume = run_keys.get(take).copied();
                        // Full: the rest of the range waits for the next part, unread.
                        if resume.is_some() {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        }
                    });
                if resume.is_some() {
                    break 'ranges;
                }
            }
        }
        (rows.finish(), resume)
    }
}
