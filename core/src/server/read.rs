//! Reading a server's values from outside: the rows of a key range it leads, and how far its
//! iterations are applied there, without reaching into its shards (ARCHITECTURE.md §8).

use crate::ids::Iteration;
use crate::key::KeyRange;
use crate::kv::{KvPairs, PairsBuilder};
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::ShardCopy;

use super::Server;

/// What a server holds of a key range ([`Server::read`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RangeRead<V: Value> {
    /// The rows written in the parts of the range this server leads, in key order. A key
    /// never written there is absent: its value is zero.
    pub rows: KvPairs<V>,
    /// The parts of the range this server leads (is the primary of), in key order: the
    /// job's values there. The rest is led by other servers.
    pub led: Vec<KeyRange>,
    /// Sequential mode: on every part read, each iteration below this one is applied and no
    /// later one is, so the rows are the job's values at that iteration boundary. 0 in the
    /// other modes, which apply pushes as they come.
    pub applied_below: Iteration,
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// The rows of `range` this server leads, with where they lie and how far their
    /// iterations are applied. Replicas are left out: a range's primary holds what its
    /// replicas hold, and more.
    pub fn read(&self, range: KeyRange) -> RangeRead<V> {
        let mut rows = PairsBuilder::new(self.cfg.width);
        let mut led = Vec::new();
        let mut applied_below: Option<Iteration> = None;
        for start in self.shard_starts_in(range) {
            let Some(shard) = self.shards.get(&start).filter(|s| s.is_primary()) else {
                continue;
            };
            let Some(part) = shard.range.intersect(range) else {
                continue;
            };
            shard.store.for_each_run_in(part, &mut |keys, values| {
                rows.extend(keys, values);
                core::ops::ControlFlow::Continue(())
            });
            match led.last_mut() {
                Some(last) if KeyRange::end(*last) == part.start() => {
                    *last = KeyRange::new(last.start(), part.end()).unwrap_or(*last);
                }
                _ => led.push(part),
            }
            applied_below =
                Some(applied_below.map_or(shard.applied_below, |a| a.min(shard.applied_below)));
        }
        RangeRead {
            rows: rows.finish(),
            led,
            applied_below: applied_below.unwrap_or(0),
        }
    }

    /// A copy of every shard this server holds, led or replicated, as of now: each shard at
    /// the same point of this server's update order, with its rows and update-rule state. Later
    /// writes never reach it: the ordered store shares its leaves and copies one only when it
    /// writes one a snapshot still holds; other stores copy the rows
    /// ([`crate::store::ParamStore::shared_rows_in`]). While the server waits for the shards
    /// of a checkpoint it resumes from ([`crate::events::ServerEvent::Restore`]), they are not
    /// filled yet: a snapshot then holds none of their rows. What a checkpoint
    /// writes ([`crate::events::ServerEvent::CheckpointDue`] is this, taken at the job's cut,
    /// where every server's snapshot together is the job's state at one iteration boundary).
    pub fn snapshot(&self) -> Vec<ShardCopy<V>> {
        let width = self.cfg.width;
        let aux_width = self.updater.aux_width();
        self.shards
            .values()
            .map(|s| {
                let mut copy = s.checkpoint_copy(width, aux_width);
                copy.clocks = super::replication::clock_records(&self.progress, s.range);
                copy
            })
            .collect()
    }
}
