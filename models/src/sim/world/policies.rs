//! The straggler and slot policies judged directly (ARCHITECTURE.md §9). Servers and workers
//! follow whatever the configuration decides, so a policy that decides wrongly keeps every
//! safety invariant; each policy gets an invariant of its own:
//!
//! - **slot-limit**: after every step, no live server holds more push slots granted than the
//!   job's `PushSlots::at_once`.
//! - **tau-range**: every configuration a coordinator sends has `Pace::tau` within the job's
//!   `TauRange` where adaptive tau is on, and none set otherwise.
//! - **share-bounds** (shares sized by speed): every share moved by speed leaves its giver
//!   with at least `Balance::fewest` shares and its taker with at most `Balance::most`. In every
//!   configuration a coordinator sends, every live worker that no configuration seen so far
//!   left out holds at least `fewest`; and unless a worker left out came back into the job, a
//!   live worker holds more than `most` only while every live worker holds at least `most`. The
//!   design promises no more: a dead worker's shares pass at once to the live worker holding
//!   the fewest, whatever the bounds (so workers too few to hold the job within `most` hold
//!   more), and a worker that comes back holds what it held, none if it had died.
//! - **share-move**: one decision moves at most one share by speed, from a live worker to
//!   another, and to a worker that would then be quicker than the giver was by a quarter, by
//!   the speeds the coordinator held: `5 (t + 1) / s_t < 4 g / s_g` for `g` and `t` shares held
//!   before the move. With equal speeds that is a worker holding fewer shares than the giver; a
//!   faster one may hold as many or more (that is the point of sizing shares by speed).
//!
//! What a coordinator decided is read from the wire, not from the coordinator: every
//! configuration it decides goes out at once, to its standby with its state or to every
//! member, unless a fence holds it back (ARCHITECTURE.md §11). A move is judged at the step the
//! coordinator says it moved a share (`pserver_core::events::CoordinatorEvent::ShareMoved`): the configuration it sent in that
//! step is the move's outcome, the one of the epoch before it in the same term the decision's
//! input, and the speeds it held are followed from the heartbeats it took in. Around a fence
//! consecutive epochs are no single decision (a dropped standby's configuration is published
//! again, then what was decided after it), so configurations alone are not compared.

use std::collections::BTreeMap;

use pserver_core::NodeId;
use pserver_core::node::Coordinator;
use pserver_core::pace::{Position, ShareMove};
use pserver_core::status::NodeState;
use pserver_core::wire::ClusterConfig;
use pserver_core::{Epoch, Role};

use super::World;
use crate::sim::{Invariant, SimFailure};

/// What the policy checks remember from one step to the next.
#[derive(Clone, Debug, Default)]
pub(super) struct PolicyWatch {
    /// Per coordinator process, per worker, every position the coordinator may hold for it.
    /// It holds the furthest it took in since it last forgot the worker, the later of equal
    /// ones: so only a position that no later one reached, kept here furthest first.
    reports: BTreeMap<NodeId, BTreeMap<NodeId, Vec<Position>>>,
    /// Per coordinator process, the newest configuration it sent, and the step it was first
    /// sent in.
    sent: BTreeMap<NodeId, (u64, ClusterConfig)>,
    /// Workers out of the job at some point: some configuration left them out, or a
    /// coordinator declared them dead or took their leave. With an epoch they were out from,
    /// or were at least out after (what the coordinator had sent when it said so).
    departed: BTreeMap<NodeId, Epoch>,
    /// A worker out of the job is listed again by a newer configuration: it came back, or a
    /// configuration from before it went out was published again.
    rejoined: bool,
}

impl PolicyWatch {
    /// `coordinator` took over: like the core's coordinator, it learns where workers are again.
    pub(super) fn took_over(&mut self, coordinator: NodeId) {
        self.reports.remove(&coordinator);
    }

    /// `coordinator` is a fresh process: nothing it held before counts.
    pub(super) fn restarted(&mut self, coordinator: NodeId) {
        self.reports.remove(&coordinator);
        self.sent.remove(&coordinator);
    }
}

/// The shares `worker` holds in `config`.
fn held(config: &ClusterConfig, worker: NodeId) -> usize {
    config.shares.iter().filter(|&&s| s == worker).count()
}

/// Whether `coordinator` takes a position `worker` reports: while it is active, from a worker
/// of the configuration it decided (which its status reports, published or not).
fn takes_position(coordinator: &Coordinator, worker: NodeId) -> bool {
    coordinator.is_active()
        && coordinator.status().nodes.iter().any(|n| {
            n.id == worker
                && n.role == Role::Worker
                && !matches!(
                    n.state,
                    NodeState::Registered | NodeState::Dead | NodeState::Left
                )
        })
}

impl World<'_> {
    /// A worker's heartbeat carrying its position reaches `to`; call before `to` handles it.
    pub(super) fn heard_position(&mut self, from: NodeId, to: NodeId, at: Position) {
        let takes = self
            .nodes
            .get(&to)
            .and_then(|d| d.node().as_coordinator())
            .is_some_and(|c| takes_position(c, from));
        if !takes {
            return;
        }
        let place = |p: &Position| (p.iteration, p.covered);
        let kept = self
            .policies
            .reports
            .entry(to)
            .or_default()
            .entry(from)
            .or_default();
        // A position this one reaches is replaced by it, wherever the coordinator still holds it.
        kept.retain(|p| place(p) > place(&at));
        kept.push(at);
    }

    /// slot-limit: no live server holds more slots granted than the job lets in at once.
    pub(super) fn check_slot_limit(&self) -> Result<(), SimFailure> {
        let Some(slots) = self.cfg.push_slots else {
            return Ok(());
        };
        let limit = usize::from(slots.at_once.max(1));
        for id in self.server_nodes() {
            if self.down.contains(&id) {
                continue;
            }
            let Some((granted, waiting)) = self.server(id).map(|s| s.push_slots()) else {
                continue;
            };
            if granted > limit {
                return Err(self.fail(
                    Invariant::SlotLimit,
                    format!(
                        "{id} holds {granted} push slots granted at once ({waiting} asks waiting), but the job lets in {limit}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// tau-range and share-bounds on a configuration coordinator `from` sends (alone, or in
    /// its state for a standby).
    pub(super) fn judge_config(
        &mut self,
        from: NodeId,
        config: &ClusterConfig,
    ) -> Result<(), SimFailure> {
        let range = self.cfg.stragglers.adaptive_tau;
        let tau_ok = match (config.pace.tau, range) {
            (None, _) => true,
            (Some(tau), Some(r)) => r.min <= tau && tau <= r.max,
            (Some(_), None) => false,
        };
        if !tau_ok {
            return Err(self.fail(
                Invariant::TauRange,
                format!(
                    "{from} sent the configuration of epoch {} with tau {:?}, but the job's adaptive tau ranges over {range:?}",
                    config.epoch, config.pace.tau
                ),
            ));
        }
        let newer = self
            .policies
            .sent
            .get(&from)
            .is_none_or(|(_, c)| (c.term, c.epoch) < (config.term, config.epoch));
        if newer {
            self.policies
                .sent
                .insert(from, (self.steps, config.clone()));
        }
        self.check_share_bounds(config)
    }

    /// `coordinator` says `worker` is out of the job (declared dead, or left).
    pub(super) fn worker_out(&mut self, coordinator: NodeId, worker: NodeId) {
        if !self.cfg.worker_ids().any(|w| w == worker) {
            return;
        }
        // The configuration without it, decided by now, is no older than any it sent: one
        // of a newer epoch that lists the worker again comes from a later decision.
        let after = self
            .policies
            .sent
            .get(&coordinator)
            .map_or(0, |(_, c)| c.epoch);
        let out = self.policies.departed.entry(worker).or_insert(after);
        *out = (*out).min(after);
    }

    /// share-bounds on one configuration (see the module docs for what is promised).
    fn check_share_bounds(&mut self, config: &ClusterConfig) -> Result<(), SimFailure> {
        let Some(balance) = self.cfg.stragglers.balance else {
            return Ok(());
        };
        for w in self.cfg.worker_ids() {
            if !config.workers.contains(&w) {
                let first = self.policies.departed.entry(w).or_insert(config.epoch);
                *first = (*first).min(config.epoch);
            } else if self
                .policies
                .departed
                .get(&w)
                .is_some_and(|&e| e < config.epoch)
            {
                self.policies.rejoined = true;
            }
        }
        let (fewest, most) = (
            usize::from(balance.fewest.max(1)),
            usize::from(balance.most),
        );
        let never_out = |w: &&NodeId| !self.policies.departed.contains_key(*w);
        if let Some(&w) = config
            .workers
            .iter()
            .filter(never_out)
            .find(|&&w| held(config, w) < fewest)
        {
            return Err(self.fail(
                Invariant::ShareBounds,
                format!(
                    "{w}, in the job since it began, holds {} shares in the configuration of epoch {}, fewer than the fewest ({fewest}): shares {:?}",
                    held(config, w),
                    config.epoch,
                    config.shares
                ),
            ));
        }
        if self.policies.rejoined {
            return Ok(());
        }
        let over = config.workers.iter().find(|&&w| held(config, w) > most);
        let under = config.workers.iter().find(|&&w| held(config, w) < most);
        if let (Some(&over), Some(&under)) = (over, under) {
            return Err(self.fail(
                Invariant::ShareBounds,
                format!(
                    "{over} holds {} shares in the configuration of epoch {}, more than the most ({most}), while {under} holds {}: shares {:?}",
                    held(config, over),
                    config.epoch,
                    held(config, under),
                    config.shares
                ),
            ));
        }
        Ok(())
    }

    /// `coordinator` said it moved `share` from `from` to `to`: the step it decided in. The
    /// configuration it sent in this step holding the move is the decision's outcome (none
    /// went out if a fence held it back: nothing is judged then), the one of the epoch before
    /// it in the term its input.
    pub(super) fn share_moved(
        &self,
        coordinator: NodeId,
        share: usize,
        from: NodeId,
        to: NodeId,
    ) -> Result<(), SimFailure> {
        let Some(balance) = self.cfg.stragglers.balance else {
            return Ok(());
        };
        let Some((step, after)) = self.policies.sent.get(&coordinator) else {
            return Ok(());
        };
        let decided = *step == self.steps
            && after.shares.get(share) == Some(&to)
            && after.pace.moved(share).is_some_and(|m| m.from == from);
        if !decided {
            return Ok(());
        }
        let before = after
            .epoch
            .checked_sub(1)
            .and_then(|e| self.configs_seen.get(&e))
            .filter(|b| b.term == after.term);
        if let Some(before) = before {
            self.check_one_move(before, after, share, from)?;
        }
        let (fewest, most) = (
            usize::from(balance.fewest.max(1)),
            usize::from(balance.most),
        );
        let (giver, taker) = (held(after, from), held(after, to));
        if giver < fewest || taker > most {
            return Err(self.fail(
                Invariant::ShareBounds,
                format!(
                    "{coordinator} moved share {share} from {from} to {to} in epoch {}, leaving them {giver} and {taker} shares, outside {fewest}..={most}",
                    after.epoch
                ),
            ));
        }
        self.check_gain(coordinator, after, share, from, to)
    }

    /// share-move: `after`, decided right after `before`, moved `share` from `from` and
    /// nothing else, from a worker of the job to another.
    fn check_one_move(
        &self,
        before: &ClusterConfig,
        after: &ClusterConfig,
        share: usize,
        from: NodeId,
    ) -> Result<(), SimFailure> {
        let new: Vec<&ShareMove> = after
            .pace
            .moves
            .iter()
            .filter(|m| before.pace.moved(m.share as usize) != Some(*m))
            .collect();
        if new.len() > 1 {
            return Err(self.fail(
                Invariant::ShareMove,
                format!(
                    "{} moved {} shares in one decision (epoch {} to {}): {new:?}",
                    after.coordinator,
                    new.len(),
                    before.epoch,
                    after.epoch
                ),
            ));
        }
        let to = after.shares.get(share).copied();
        let moved = before.shares.get(share) == Some(&from)
            && before.workers.contains(&from)
            && to.is_some_and(|t| t != from && before.workers.contains(&t));
        if !moved {
            return Err(self.fail(
                Invariant::ShareMove,
                format!(
                    "{} moved share {share} in epoch {}, held by {:?} before and by {to:?} after, from {from}, but not from one worker of the job to another (workers {:?})",
                    after.coordinator,
                    after.epoch,
                    before.shares.get(share),
                    before.workers
                ),
            ));
        }
        Ok(())
    }

    /// share-move: the taker, with the share, would be quicker than the giver was by a
    /// quarter, by the speeds `coordinator` held.
    fn check_gain(
        &self,
        coordinator: NodeId,
        after: &ClusterConfig,
        share: usize,
        from: NodeId,
        to: NodeId,
    ) -> Result<(), SimFailure> {
        // Before the move the giver held one more, the taker one fewer.
        let (g, t) = (held(after, from) as u128 + 1, held(after, to) as u128 - 1);
        let speeds = |w: NodeId| -> Vec<u32> {
            self.policies
                .reports
                .get(&coordinator)
                .and_then(|r| r.get(&w))
                .map(|ps| ps.iter().map(|p| p.speed).filter(|&s| s > 0).collect())
                .unwrap_or_default()
        };
        let (giver_speeds, taker_speeds) = (speeds(from), speeds(to));
        // Of the speeds the coordinator may have held, those most in the move's favour.
        let (Some(&sg), Some(&st)) = (giver_speeds.iter().min(), taker_speeds.iter().max()) else {
            return Err(self.fail(
                Invariant::ShareMove,
                format!(
                    "{coordinator} moved share {share} from {from} to {to} in epoch {}, holding no speed of {}",
                    after.epoch,
                    if giver_speeds.is_empty() { from } else { to }
                ),
            ));
        };
        if 5 * (t + 1) * u128::from(sg) >= 4 * g * u128::from(st) {
            return Err(self.fail(
                Invariant::ShareMove,
                format!(
                    "{coordinator} moved share {share} in epoch {} from {from} ({g} shares, speed {sg}) to {to} ({t} shares, speed {st}), which would be no quicker with it than {from} was by a quarter",
                    after.epoch
                ),
            ));
        }
        Ok(())
    }
}
