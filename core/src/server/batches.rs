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
//! unacknowledged; steps beyond wait, gathering more, until one is. A batch counts as
//! acknowledged once the replica acknowledged its last step, by any `ReplicateAck`: the
//! replica's position in each shard's update order only grows, so an acknowledgement lost or
//! refused at an epoch change is made up by the next, and a batch for a shard the replica no
//! longer follows (or needs a whole copy of) counts no more. Every step sent is in the shard's
//! log first, so a step that waits is never the only record of it: when batches go missing,
//! the replication timer forgets what was in flight and waiting and resends from the log what
//! each replica lacks.

use std::collections::BTreeMap;

use crate::effects::Effects;
use crate::ids::NodeId;
use crate::key::{Key, KeyRange};
use crate::sizes;
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Message, Replicate};

use super::Server;
use super::shard::{ReplicaState, Shard, ShardRole, Steps};

/// Steps gathered for the replica servers, and the batches each has not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Batches<V: Value> {
    /// Per replica server, steps not sent yet, in the order they were made.
    waiting: BTreeMap<NodeId, Vec<Replicate<V>>>,
    /// Per replica server, the last step (its range and place in the update order) of each
    /// batch sent and not acknowledged.
    in_flight: BTreeMap<NodeId, Vec<(KeyRange, u64)>>,
    /// How many steps the call under way may gather for one replica ([`Batches::expect`]).
    expected: Expected,
}

/// A number of steps to make room for at once: no state of the protocol, so it leaves two
/// servers' states equal (the model checker counts states by them) whatever it holds.
#[derive(Clone, Copy, Debug, Default)]
struct Expected(usize);

impl PartialEq for Expected {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Expected {}

impl core::hash::Hash for Expected {
    fn hash<H: core::hash::Hasher>(&self, _: &mut H) {}
}

impl<V: Value> Default for Batches<V> {
    fn default() -> Self {
        Batches {
            waiting: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            expected: Expected::default(),
        }
    }
}

impl<V: Value> Batches<V> {
    /// Says that the call under way may gather up to `steps` steps for a replica (a push, a
    /// step per shard it touches), so that each replica's list is made that large at once
    /// rather than grown step by step; 0 once the call is done.
    pub(super) fn expect(&mut self, steps: usize) {
        self.expected = Expected(steps);
    }

    /// Adds `steps` to what goes to `replica`.
    pub(super) fn gather(
        &mut self,
        replica: NodeId,
        steps: impl IntoIterator<Item = Replicate<V>>,
    ) {
        let waiting = self.waiting.entry(replica).or_default();
        if waiting.capacity() == 0 {
            waiting.reserve(self.expected.0);
        }
        waiting.extend(steps);
        if waiting.is_empty() {
            self.waiting.remove(&replica);
        }
    }

    /// Logs `steps` on `shard`, for replicas that fall behind, and gathers them for each
    /// replica in step: a copy for each but the last, which takes the steps.
    pub(super) fn ship<S: ParamStore<V>>(&mut self, shard: &mut Shard<V, S>, steps: Steps<V>) {
        if !shard.log_steps(&steps) {
            return;
        }
        let mut replicas = shard.in_step().peekable();
        while let Some(replica) = replicas.next() {
            if replicas.peek().is_none() {
                self.gather(replica, steps);
                break;
            }
            self.gather(replica, steps.iter().cloned());
        }
        drop(replicas);
        shard.bound_log();
    }

    /// Forgets the batches in flight whose last step `arrived` says the replica acknowledged
    /// (or no longer needs).
    fn settle(&mut self, arrived: impl Fn(NodeId, KeyRange, u64) -> bool) {
        self.in_flight.retain(|&replica, batches| {
            batches.retain(|&(range, seq)| !arrived(replica, range, seq));
            !batches.is_empty()
        });
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
    fn take(&mut self, room: usize, bound: usize, all: bool) -> Vec<(NodeId, Vec<Replicate<V>>)> {
        let mut out = Vec::new();
        let mut emptied = Vec::new();
        for (&replica, steps) in &mut self.waiting {
            let in_flight = self.in_flight.entry(replica).or_default();
            while !steps.is_empty() && (all || in_flight.len() < bound) {
                let n = fitting(steps, room);
                // The steps that fit go out in the vector they waited in: no new one, and
                // none grown step by step, per batch.
                let batch = if n == steps.len() {
                    core::mem::take(steps)
                } else {
                    let rest = steps.split_off(n);
                    core::mem::replace(steps, rest)
                };
                if let Some(last) = batch.last() {
                    in_flight.push((last.range, last.seq));
                }
                out.push((replica, batch));
            }
            if steps.is_empty() {
                emptied.push(replica);
            }
        }
        for replica in emptied {
            self.waiting.remove(&replica);
        }
        self.in_flight.retain(|_, batches| !batches.is_empty());
        out
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// Sends what was gathered for the replica servers, within the bound on batches in flight
    /// (past it too when `all`: before the ring changes, what is gathered goes out under the
    /// configuration it was made in).
    pub(super) fn send_batches(&mut self, all: bool, out: &mut Effects<V>) {
        let shards = &self.shards;
        self.batches
            .settle(|replica, range, seq| step_arrived(shards, replica, range, seq));
        if !self.batches.has_waiting() {
            return;
        }
        let room = sizes::steps_within(self.cfg.max_frame);
        let bound = self.cfg.replication_in_flight.max(1) as usize;
        for (to, updates) in self.batches.take(room, bound, all) {
            self.send(to, Message::Replicate { updates }, out);
        }
    }
}

/// How many of the first `steps` fit in `room` bytes; at least one, which may be larger.
fn fitting<V: Value>(steps: &[Replicate<V>], room: usize) -> usize {
    let mut bytes = 0usize;
    let mut n = 0;
    for step in steps {
        bytes = bytes.saturating_add(sizes::step_bytes(step));
        if n > 0 && bytes > room {
            break;
        }
        n += 1;
    }
    n.max(1)
}

/// True when `replica` acknowledged step `seq` of the shard holding `range`'s first key, or
/// has no use for it any more: this server no longer leads that shard, the replica no longer
/// follows it, or it waits for a whole copy.
fn step_arrived<V: Value, S>(
    shards: &BTreeMap<Key, Shard<V, S>>,
    replica: NodeId,
    range: KeyRange,
    seq: u64,
) -> bool {
    let Some((_, shard)) = shards.range(..=range.start()).next_back() else {
        return true;
    };
    if !shard.range.contains(range.start()) {
        return true;
    }
    match &shard.role {
        ShardRole::Primary { replicas, .. } => match replicas.get(&replica) {
            Some(ReplicaState::Acked(a)) => *a >= seq,
            Some(ReplicaState::NeedsCopy | ReplicaState::Copying(_)) | None => true,
        },
        ShardRole::Replica { .. } => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvPairs;
    use crate::wire::ShardUpdate;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);

    fn step(seq: u64, rows: u64) -> Replicate<f32> {
        let keys: Vec<u64> = (0..rows).collect();
        let update = if rows == 0 {
            ShardUpdate::ApplyBelow(1)
        } else {
            ShardUpdate::Apply(KvPairs::new(keys, vec![1.0; rows as usize], 1).unwrap())
        };
        Replicate {
            range: KeyRange::new(seq * 10, seq * 10 + 10).unwrap(),
            seq,
            span: 1,
            update,
            dedupe: Default::default(),
        }
    }

    fn seqs(batch: &[Replicate<f32>]) -> Vec<u64> {
        batch.iter().map(|s| s.seq).collect()
    }

    #[test]
    fn batches_are_cut_to_the_room_and_held_at_the_bound_until_acknowledged() {
        let bare = sizes::step_bytes(&step(1, 0));
        let mut b = Batches::<f32>::default();
        b.gather(A, (1..=10).map(|s| step(s, 0)));
        b.gather(B, [step(1, 0)]);
        // Three bare steps fit the room, a fourth does not; two batches may be in flight.
        let sent = b.take(3 * bare + bare / 2, 2, false);
        let to_a: Vec<Vec<u64>> = sent
            .iter()
            .filter(|(r, _)| *r == A)
            .map(|(_, s)| seqs(s))
            .collect();
        assert_eq!(to_a, vec![vec![1, 2, 3], vec![4, 5, 6]]);
        assert_eq!(sent.iter().filter(|(r, _)| *r == B).count(), 1);
        assert!(b.has_waiting());
        assert_eq!(
            b.in_flight[&A],
            vec![(step(3, 0).range, 3), (step(6, 0).range, 6)]
        );
        // At the bound nothing more goes to A until a batch is acknowledged.
        assert!(b.take(3 * bare + bare / 2, 2, false).is_empty());
        b.settle(|r, _, seq| r == A && seq <= 3);
        let sent = b.take(3 * bare + bare / 2, 2, false);
        assert_eq!(
            sent.iter().map(|(_, s)| seqs(s)).collect::<Vec<_>>(),
            vec![vec![7, 8, 9]]
        );
        assert_eq!(b.in_flight[&B].len(), 1);
        // Before the ring changes everything goes, past the bound.
        b.gather(A, (11..=14).map(|s| step(s, 0)));
        let sent = b.take(3 * bare + bare / 2, 2, true);
        assert_eq!(
            sent.iter().map(|(_, s)| seqs(s)).collect::<Vec<_>>(),
            vec![vec![10, 11, 12], vec![13, 14]]
        );
        assert!(!b.has_waiting());
        assert_eq!(b.in_flight[&A].len(), 4);
        b.forget();
        assert_eq!(b, Batches::default());
    }

    #[test]
    fn a_step_larger_than_the_room_goes_alone() {
        let mut b = Batches::<f32>::default();
        b.gather(A, [step(1, 0), step(2, 100), step(3, 0)]);
        let room = sizes::step_bytes(&step(2, 100)) - 1;
        let sent = b.take(room, 8, false);
        assert_eq!(
            sent.iter().map(|(_, s)| seqs(s)).collect::<Vec<_>>(),
            vec![vec![1], vec![2], vec![3]]
        );
    }
}
