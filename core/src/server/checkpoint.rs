//! Whole-job checkpoints as a server takes them (ARCHITECTURE.md §11): once every worker has
//! finished the iterations below the next cut and waits there, the server takes a copy of
//! every shard it holds (a count on the store's rows, nothing read), hands it to its driver
//! ([`crate::events::ServerEvent::CheckpointDue`]) and tells the coordinator, which lets the workers go on once
//! every server has; once the driver says the copy is written, the server tells the
//! coordinator again, which records the cut complete. Each is said with every heartbeat until
//! a configuration records it. A job restarted whole loads the shards of the cut its
//! coordinator chose ([`crate::events::ServerEvent::Restore`]) before it serves anything.
//!
//! Nothing is pushed between the cut and its record as taken: every worker waits before it,
//! and every push of the iterations below it was acknowledged, so by every replica too. The
//! primary and the replicas of a range therefore copy the same rows, and a restart needs no
//! copies: each server loads the ranges it held, primary and replica alike, and the ring is
//! the same as long as the servers are. A copy is of the ranges the server held when it took
//! it: once the workers have gone on, a server whose ranges changed before its copy was
//! written does not say it wrote the cut, and the cut is never recorded complete (the next
//! one is taken as usual). One copy is written at a time: the next cut is taken once the last
//! is written, so a disk slower than the iterations holds the workers back rather than
//! queueing copies of the model.

use crate::consistency::Consistency;
use crate::effects::{Effects, Event, ServerEvent};
use crate::ids::{Iteration, Time};
use crate::key::KeyRange;
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Envelope, Message, ShardCopy};

use super::Server;

/// Messages held while a server waits for its shards to be restored; beyond this,
/// retransmission recovers.
const MAX_HELD: usize = 64;

/// A server's part in whole-job checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct Checkpointing {
    /// Cuts whose shards this process holds whole, offered with its registration.
    pub(super) offered: Vec<Iteration>,
    /// The cut whose shards the driver is to hand over before the server serves anything.
    pub(super) restoring: Option<Iteration>,
    /// The last cut whose shards went to the driver, and their ranges.
    taken: Option<(Iteration, Vec<KeyRange>)>,
    /// Whether the driver wrote them.
    written: bool,
}

/// Why a server did not take a call about checkpoints.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The node is not a server.
    #[error("only a server writes and restores checkpoints")]
    NotAServer,
    /// The server registered already: what it holds is offered only before it starts.
    #[error("the server has started: checkpoints are offered only before")]
    Started,
    /// No shards of this cut were handed out to be written.
    #[error("no checkpoint of iteration {cut} was due")]
    NotDue {
        /// The cut named.
        cut: Iteration,
    },
    /// The server is not waiting for the shards of this cut.
    #[error("the server is not waiting to restore iteration {cut}")]
    NotRestoring {
        /// The cut named.
        cut: Iteration,
    },
    /// The checkpoint holds no copy of a range this server holds now: the ring differs from
    /// the one it was written under (other servers, or another key space).
    #[error(
        "the checkpoint of iteration {cut} holds no copy of keys {range}: the ring is not the one it was written under (start the same servers as then)"
    )]
    MissingRange {
        /// The cut.
        cut: Iteration,
        /// The range with no copy.
        range: KeyRange,
    },
    /// A copy of another row shape than the job's.
    #[error(
        "the checkpoint's copy of keys {range} has rows of another width or update rule than the job's"
    )]
    Shape {
        /// The range.
        range: KeyRange,
    },
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// Offers the cuts whose shards this server holds whole, with its registration: the
    /// coordinator resumes the job from the newest every server holds. Call before
    /// [`Server::start`].
    pub fn offer_checkpoints(&mut self, cuts: Vec<Iteration>) -> Result<(), CheckpointError> {
        if self.cluster.is_some() {
            return Err(CheckpointError::Started);
        }
        self.checkpointing.offered = cuts;
        Ok(())
    }

    /// The driver wrote the shards of `cut` it was handed ([`crate::events::ServerEvent::CheckpointDue`]): the
    /// coordinator hears so.
    pub fn checkpoint_written(
        &mut self,
        now: Time,
        cut: Iteration,
        out: &mut Effects<V>,
    ) -> Result<(), CheckpointError> {
        match &self.checkpointing.taken {
            Some((taken, _)) if *taken == cut && !self.checkpointing.written => {
                self.checkpointing.written = true;
                self.report_checkpoint(out);
                self.checkpoint_when_due(now, out);
                Ok(())
            }
            _ => Err(CheckpointError::NotDue { cut }),
        }
    }

    /// Whether shards handed to the driver ([`crate::events::ServerEvent::CheckpointDue`]) are not written yet: the
    /// server is not done until they are.
    pub fn writing_checkpoint(&self) -> bool {
        self.checkpointing.taken.is_some() && !self.checkpointing.written
    }

    /// Loads the shards this server wrote at `cut` ([`crate::events::ServerEvent::Restore`]): every range it holds
    /// takes the rows and update-rule state of its copy; workers count as having finished the
    /// iterations below the cut, which is what the copies' clocks say. De-duplication state
    /// is not restored: every worker is a new process with new request numbers. Then the
    /// messages that waited are taken in.
    pub fn restore(
        &mut self,
        now: Time,
        cut: Iteration,
        shards: Vec<ShardCopy<V>>,
        out: &mut Effects<V>,
    ) -> Result<(), CheckpointError> {
        if self.checkpointing.restoring != Some(cut) {
            return Err(CheckpointError::NotRestoring { cut });
        }
        let mut copies: std::collections::BTreeMap<KeyRange, ShardCopy<V>> =
            shards.into_iter().map(|t| (t.range, t)).collect();
        let width = self.cfg.width;
        let aux_width = self.updater.aux_width();
        // Checked whole before anything is loaded, so that a refused checkpoint leaves the
        // shards as they were.
        for shard in self.shards.values() {
            let range = shard.range;
            let copy = copies
                .get(&range)
                .ok_or(CheckpointError::MissingRange { cut, range })?;
            if !super::shard::fits_checkpoint(copy, width, aux_width) {
                return Err(CheckpointError::Shape { range });
            }
        }
        for shard in self.shards.values_mut() {
            if let Some(copy) = copies.remove(&shard.range) {
                shard.store.load_rows(&copy.rows);
            }
            shard.applied_below = shard.applied_below.max(cut);
        }
        if let Some(cluster) = &self.cluster {
            for &w in cluster.workers() {
                self.progress
                    .entry(w)
                    .or_default()
                    .advance(KeyRange::FULL, cut);
            }
        }
        self.checkpointing.restoring = None;
        // Configurations that came while the shards were read, in the order they came, as if
        // they had come after; then what waited for them.
        let (configs, rest): (Vec<_>, Vec<_>) = core::mem::take(&mut self.early)
            .into_iter()
            .partition(|e| matches!(e.body, Message::Config(_)));
        self.early = rest;
        for env in configs {
            self.take_message(now, env, out);
        }
        self.replay_early(now, out);
        self.answer_held(out);
        self.send_batches(false, out);
        Ok(())
    }

    /// With its first configuration: a job that resumes from a checkpoint has the driver
    /// load this server's shards of it first.
    pub(super) fn restore_when_resuming(&mut self, fresh_start: bool, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let cut = cluster.config.checkpoints.complete;
        if fresh_start && cluster.epoch() == 1 && cut > 0 && self.is_member() {
            self.checkpointing.restoring = Some(cut);
            out.emit(Event::Server(ServerEvent::Restore { cut }));
        }
    }

    /// Keeps a message that came while the server waits for its shards: nothing is served
    /// from shards about to be replaced.
    pub(super) fn hold_while_restoring(&mut self, env: Envelope<V>, out: &mut Effects<V>) {
        if self.early.contains(&env) {
            return;
        }
        // A configuration is held whatever else is: the server must not miss one, and the
        // coordinator publishes few while a server reads its shards.
        if self.early.len() < MAX_HELD || matches!(env.body, Message::Config(_)) {
            self.early.push(env);
        } else {
            out.refuse(env.from, crate::effects::Refusal::Overflow);
        }
    }

    /// Hands every shard to the driver once every worker has finished the iterations below
    /// the next cut (and, in sequential mode, every shard applied them), the ring is not
    /// changing, the last copy handed out is written, and no copy of the shards held now was
    /// taken for that cut already.
    pub(super) fn checkpoint_when_due(&mut self, _now: Time, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Some(cut) = cluster.config.checkpoints.next_cut() else {
            return;
        };
        if !self.is_member()
            || self.checkpointing.restoring.is_some()
            || self.writing_checkpoint()
            || cluster.config.is_changing()
            || cluster.workers().is_empty()
        {
            return;
        }
        // Taken under another ring while the workers still wait at the cut: the stores are
        // still as of the cut, and the copy of the new ranges is taken.
        if self
            .checkpointing
            .taken
            .as_ref()
            .is_some_and(|(c, ranges)| *c == cut && *ranges == self.shard_ranges())
        {
            return;
        }
        let workers_done = cluster
            .workers()
            .iter()
            .all(|&w| self.finished_in(w, KeyRange::FULL) >= cut);
        let applied = cluster.config.consistency != Consistency::Sequential
            || self.shards.values().all(|s| s.applied_below >= cut);
        if !workers_done || !applied {
            return;
        }
        let shards = self.snapshot();
        self.checkpointing.taken = Some((cut, self.shard_ranges()));
        self.checkpointing.written = false;
        out.emit(Event::Server(ServerEvent::CheckpointDue { cut, shards }));
        self.report_checkpoint(out);
    }

    /// Tells the coordinator that this server took its copy of the next cut, or wrote the
    /// copy of the last one taken, as long as no configuration records that and the copy is
    /// of the shards this server holds now.
    pub(super) fn report_checkpoint(&self, out: &mut Effects<V>) {
        let (Some(cluster), Some((cut, ranges))) = (&self.cluster, &self.checkpointing.taken)
        else {
            return;
        };
        if *ranges != self.shard_ranges() {
            return;
        }
        let recorded = cluster.config.checkpoints;
        let said = if self.checkpointing.written && recorded.complete < *cut {
            Message::Checkpointed { cut: *cut }
        } else if recorded.taken < *cut {
            Message::CheckpointTaken { cut: *cut }
        } else {
            return;
        };
        self.send(self.coordinator_id(), said, out);
    }

    fn shard_ranges(&self) -> Vec<KeyRange> {
        self.shards.values().map(|s| s.range).collect()
    }
}
