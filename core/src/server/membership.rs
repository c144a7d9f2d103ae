//! Membership as a server lives it: adopting each configuration the coordinator publishes
//! (ARCHITECTURE.md §8), and keeping the messages that arrive before the configuration their sender
//! already knows.
//!
//! A process that hears of a configuration about an earlier start of its node (one broadcast before
//! its own registration reached the coordinator, naming another incarnation in
//! `ClusterConfig::incarnations`) refuses it and keeps registering until a configuration lists it.
//!
//! A leaving server (`Server::leave`) keeps serving until its ranges are held elsewhere, after
//! which it drops its shards and emits `Event::Fenced`, as does a live server declared dead: the
//! process stops, and started again it joins as a new member.

use crate::cluster::Cluster;
use crate::effects::{Effects, Event, Refusal, TimerId};
use crate::ids::{NodeId, Time};
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{ClusterConfig, Envelope, Message};

use super::Server;
use super::replication::Resend;

/// Messages kept while a server waits for a configuration; beyond this, retransmission recovers.
const MAX_EARLY: usize = 64;

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// Takes in `config` if it succeeds the configuration in force: re-cuts the shards along
    /// its ring, lets go of what this server no longer serves, and takes in what waited for it.
    pub(super) fn adopt(
        &mut self,
        now: Time,
        from: NodeId,
        config: ClusterConfig,
        out: &mut Effects<V>,
    ) {
        let mine = self.cfg.incarnation;
        if let Some(listed) = config.incarnation_of(self.cfg.id).filter(|&i| i != mine) {
            // The configuration gives ranges to an earlier start of this node, which held
            // them; this process holds none of it, and serving them would answer pulls and
            // de-duplicate pushes from empty shards. It waits for a configuration that lists
            // it under its own incarnation.
            return out.refuse(
                from,
                Refusal::OtherIncarnation {
                    known: mine,
                    claimed: listed,
                },
            );
        }
        let cluster = match Cluster::successor(self.cluster.as_ref(), config) {
            Ok(Some(cluster)) => cluster,
            Ok(None) => return,
            Err(reason) => return out.refuse(from, reason),
        };
        let first = self.cluster.is_none();
        // De-duplication windows are kept even for removed workers: forgetting one would let a
        // late duplicate be applied again if the worker ever came back.
        self.held.retain(|(w, _), _| cluster.is_worker(*w));
        let fresh_start = first && (self.started_configured || cluster.epoch() == 1);
        let rejoined = self.newly_joining(&cluster);
        self.count_joiners_as_caught_up(&cluster);
        if first && !fresh_start {
            self.progress_unheard = cluster.workers().iter().copied().collect();
            self.late_start = true;
        }
        self.progress_unheard.retain(|w| cluster.is_worker(*w));
        let was_member = self.is_member();
        let was_finished = self
            .cluster
            .as_ref()
            .is_some_and(|c| c.config.job_finished());
        self.hear_failures(&cluster, out);
        self.lost_unlisted
            .retain(|r| cluster.config.lost.binary_search(r).is_err());
        // What is queued or gathered goes to the replicas of the ring it was taken in under.
        self.ship_queued();
        self.send_batches(true, out);
        self.cluster = Some(cluster);
        if was_member && !self.is_member() {
            // It left, or the coordinator declared it dead: its ranges are served elsewhere
            // now, and the process must stop (it may start again, as a new member).
            out.emit(Event::Fenced);
        }
        self.reshard(fresh_start, &rejoined, out);
        self.restore_when_resuming(fresh_start, out);
        self.retain_slot_workers(now, out);
        self.report_lost(out);
        self.drop_unserved_pulls();
        self.resend_replication(Resend::Changed, out);
        // A replica that was behind may have left the range's holders: what every holder
        // left has is acknowledged now.
        self.ack_replicated(out);
        self.report_caught_up(out);
        if !self.listed && self.is_member() {
            self.listed = true;
            out.cancel_timer(TimerId::Register);
            out.emit(Event::Ready {
                epoch: self.epoch(),
            });
            self.ask_for_progress(out);
        }
        self.apply_finished_iterations(now, out);
        self.arm_replication(now, out);
        self.answer_held(out);
        if self.checkpointing.restoring.is_none() {
            self.replay_early(now, out);
        }
        self.say_when_finished(now, was_finished, out);
        self.report_checkpoint(out);
        self.checkpoint_when_due(now, out);
    }

    /// Says what `next` tells of failures since the configuration held: the members the
    /// coordinator declared dead, and the ranges lost that this server did not lose itself
    /// (it said those when it found them).
    fn hear_failures(&self, next: &Cluster, out: &mut Effects<V>) {
        let Some(held) = self.cluster.as_ref() else {
            return;
        };
        for dead in next.config.dead_since(&held.config) {
            if dead != self.cfg.id {
                out.emit(Event::NodeDead(dead));
            }
        }
        for range in &next.config.lost {
            let listed = held.config.lost.binary_search(range).is_ok();
            if !listed && !self.lost_unlisted.contains(range) {
                out.emit(Event::RangeLost(*range));
            }
        }
    }

    /// Says that the job is over when the configuration just taken in is the first to say so,
    /// and tells the coordinator at once, with a heartbeat at that epoch, that this server
    /// holds it: the coordinator stops only once every server of the ring has
    /// (ARCHITECTURE.md §8).
    fn say_when_finished(&self, now: Time, was_finished: bool, out: &mut Effects<V>) {
        let Some(cluster) = self.cluster.as_ref() else {
            return;
        };
        if was_finished || !self.is_member() || !cluster.config.job_finished() {
            return;
        }
        out.emit(Event::JobFinished {
            epoch: cluster.epoch(),
        });
        let body = Message::Heartbeat {
            sent_at: now,
            at: None,
            term: self.term_held(),
        };
        self.send(self.coordinator_id(), body, out);
    }

    /// Tells the coordinator of the ranges this server lost that no configuration lists yet.
    pub(super) fn report_lost(&self, out: &mut Effects<V>) {
        if !self.lost_unlisted.is_empty() {
            let ranges = self.lost_unlisted.clone();
            self.send(self.coordinator_id(), Message::Lost(ranges), out);
        }
    }

    /// The servers `next` lists as joining that the configuration in force did not. One
    /// listed as joining anew holds nothing, whatever it held before (it may have restarted):
    /// what this server knew of its copies is void.
    fn newly_joining(&self, next: &Cluster) -> Vec<NodeId> {
        next.config
            .joining
            .iter()
            .copied()
            .filter(|n| {
                self.cluster
                    .as_ref()
                    .is_none_or(|old| !old.config.joining.contains(n))
            })
            .collect()
    }

    /// A sender already knows a configuration we lack (it raced ahead of the broadcast): keep
    /// its message for when the configuration arrives rather than waste a retransmission
    /// timeout, and ask for the configuration if we had one.
    pub(super) fn keep_early(&mut self, env: Envelope<V>, out: &mut Effects<V>) {
        if self.cluster.is_some() {
            self.send(self.coordinator_id(), Message::ConfigRequest, out);
        }
        if self.early.contains(&env) {
            return;
        }
        if self.early.len() < MAX_EARLY {
            self.early.push(env);
        } else {
            out.refuse(env.from, Refusal::Overflow);
        }
    }

    /// Takes in the kept messages that the configuration in force now covers.
    pub(super) fn replay_early(&mut self, now: Time, out: &mut Effects<V>) {
        let epoch = self.epoch();
        let (ready, later): (Vec<Envelope<V>>, _) = core::mem::take(&mut self.early)
            .into_iter()
            .partition(|e| e.epoch <= epoch);
        self.early = later;
        for env in ready {
            self.take_message(now, env, out);
        }
    }
}
