//! Standby coordinators and terms (ARCHITECTURE.md §11).
//!
//! The active coordinator keeps one of the job's other coordinators ([`CoordinatorConfig::peers`])
//! as its standby, listed in every configuration ([`ClusterConfig::standbys`]). It sends the
//! standby its state with every configuration it decides and every failure check, and
//! publishes a configuration only once the standby acknowledged it: a standby holds every
//! configuration a member can hold.
//!
//! A standby that hears nothing from the active one for the heartbeat timeout asks the members
//! for a term one above every term it knows. A member grants it only if its configuration lists
//! the standby and it too left heartbeats unanswered for the timeout; it refuses
//! configurations of older terms from then on and answers with the configuration it holds.
//! With grants from a majority of its configuration's voters ([`ClusterConfig::voters`]) the
//! standby publishes the newest configuration it knows under its term, as the first epoch of
//! that term ([`crate::ids::first_epoch_of_term`]), without the coordinator it took over from.
//! Terms own disjoint epochs, so two coordinators never publish the same epoch; a standby cut
//! off from the active one but not from the members gets no grants, since they hear the active
//! one, and cannot publish.
//!
//! A standby that stops acknowledging is dropped. The active coordinator publishes the newest
//! configuration the standby is known to hold, without it, and then nothing more until a
//! majority of the voters of every configuration the dropped standby may hold were heard at
//! that epoch without having granted a newer term ([`Fence`]): any majority that would grant
//! the standby a term holds a member that refuses it. Whatever the active one decided that the
//! standby did not acknowledge waits behind the fence, so that a standby that takes over after
//! all never undoes a change members hold. A coordinator that hears of a newer term from the
//! one holding it steps down and waits to be taken as a standby again.

use std::collections::{BTreeMap, BTreeSet};

use super::{Coordinator, CoordinatorConfig, CoordinatorError};
use crate::effects::{CoordinatorEvent, Effects, Event, Refusal};
use crate::ids::{Epoch, NodeId, first_epoch_of_term};
use crate::pace::PaceWatch;
use crate::value::Value;
use crate::wire::{ClusterConfig, Envelope, Message, StandbyState};

/// What a coordinator does now.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Mode {
    /// It publishes configurations.
    Active,
    /// It holds the active one's state; `silent` failure checks passed since it last came.
    Standby { silent: u64 },
    /// It asks the members for `term`: the configurations of those that granted it, and the
    /// failure checks since it asked.
    Candidate {
        term: u64,
        grants: BTreeMap<NodeId, ClusterConfig>,
        checks: u64,
    },
}

/// The active coordinator asking the members for a newer term of its own.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Renewal {
    term: u64,
    grants: BTreeSet<NodeId>,
    checks: u64,
}

/// A configuration that dropped a standby, published: nothing more is until a majority of
/// each of `voter_sets` was heard at `epoch` or later.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Fence {
    epoch: Epoch,
    voter_sets: BTreeSet<Vec<NodeId>>,
    heard: BTreeSet<NodeId>,
}

impl Fence {
    fn holds(&self) -> bool {
        !self.voter_sets.iter().all(|voters| {
            let count = voters.iter().filter(|v| self.heard.contains(v)).count();
            count * 2 > voters.len()
        })
    }
}

impl Coordinator {
    /// A standby coordinator: it waits for an active coordinator to take it as its standby,
    /// holds that one's state, and takes over when it goes silent. `cfg.peers` names the job's
    /// other coordinators.
    pub fn standby(cfg: CoordinatorConfig) -> Result<Self, CoordinatorError> {
        let mut c = Coordinator::with_ring_checked(cfg)?;
        c.mode = Mode::Standby { silent: 0 };
        Ok(c)
    }

    /// Runs a deliberately broken protocol (see [`crate::mutation::Mutation`]).
    #[cfg(feature = "mutations")]
    pub fn set_mutation(&mut self, mutation: Option<crate::mutation::Mutation>) {
        self.mutation = mutation;
    }

    /// True while this coordinator publishes configurations.
    pub fn is_active(&self) -> bool {
        self.mode == Mode::Active
    }

    /// The highest term this coordinator knows of.
    pub fn term(&self) -> u64 {
        self.term_seen
    }

    /// The state a standby holds of this coordinator.
    fn standby_state(&self) -> Option<StandbyState> {
        Some(StandbyState {
            config: self.config.clone()?,
            published: self.published.as_ref().map_or(0, |p| p.epoch),
            members: self.members.iter().map(|(&n, &r)| (n, r)).collect(),
            incarnations: self.incarnations.iter().map(|(&n, &i)| (n, i)).collect(),
            dead: self.dead.iter().copied().collect(),
        })
    }

    /// Sends the standby the state decided.
    pub(super) fn replicate<V: Value>(&self, out: &mut Effects<V>) {
        let Some(config) = &self.config else {
            return;
        };
        if config.standbys.is_empty() {
            return;
        }
        let Some(state) = self.standby_state() else {
            return;
        };
        for &to in &config.standbys {
            let body = Message::Standby(Box::new(state.clone()));
            out.send(Envelope::new(self.cfg.id, to, config.epoch, body));
        }
    }

    /// Without a standby, sends every peer the state: one that acknowledges it is taken as the
    /// standby, and a coordinator taken over from learns of the newer term and steps down.
    fn invite<V: Value>(&self, out: &mut Effects<V>) {
        if self.fence.is_some() {
            return;
        }
        let Some(state) = self.standby_state() else {
            return;
        };
        for peer in self.cfg.peers.iter() {
            let body = Message::Standby(Box::new(state.clone()));
            out.send(Envelope::new(self.cfg.id, peer, state.config.epoch, body));
        }
    }

    /// Records, for each standby, that it may hold the configuration just decided.
    pub(super) fn note_may_hold(&mut self) {
        let Some(config) = &self.config else {
            return;
        };
        let voters = config.voters();
        for &s in &config.standbys {
            self.may_hold
                .entry(s)
                .or_default()
                .insert(config.epoch, voters.clone());
        }
    }

    /// Publishes the configuration decided once the standby holds it and no fence holds.
    pub(super) fn release<V: Value>(&mut self, out: &mut Effects<V>) {
        if self.mode != Mode::Active
            || self.renewing.is_some()
            || self.fence.as_ref().is_some_and(Fence::holds)
        {
            return;
        }
        self.fence = None;
        let Some(config) = &self.config else {
            return;
        };
        if self.published.as_ref() == Some(config) {
            return;
        }
        let acked = |s: &NodeId| {
            self.standby_acks
                .get(s)
                .is_some_and(|&(epoch, _)| epoch >= config.epoch)
        };
        if !config.standbys.iter().all(acked) {
            return;
        }
        for s in &config.standbys {
            self.standby_holds.insert(*s, config.clone());
        }
        self.published = Some(config.clone());
        self.broadcast(out);
    }

    /// A member was heard at `epoch`, holding or having granted `term`.
    pub(super) fn heard_at<V: Value>(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        term: u64,
        out: &mut Effects<V>,
    ) {
        if term > self.term_seen {
            // It granted a standby a newer term, which the standby did not win (or this
            // coordinator would have heard of it): it cannot count towards what this one
            // publishes until this one holds a newer term still.
            return self.renew_term(term + 1, out);
        }
        let Some(fence) = self.fence.as_mut().filter(|f| epoch >= f.epoch) else {
            return;
        };
        if fence.heard.insert(from) && !fence.holds() {
            self.release(out);
        }
    }

    /// Asks the members for `term`, to publish under it: members that granted a standby a
    /// term it did not win count towards nothing until then.
    fn renew_term<V: Value>(&mut self, term: u64, out: &mut Effects<V>) {
        if self.renewing.as_ref().is_some_and(|r| r.term >= term) {
            return;
        }
        self.term_seen = self.term_seen.max(term);
        self.renewing = Some(Renewal {
            term,
            grants: BTreeSet::new(),
            checks: 0,
        });
        self.ask_renewal(out);
    }

    /// Asks every voter of the configuration in force that has not granted the renewal.
    fn ask_renewal<V: Value>(&self, out: &mut Effects<V>) {
        let (Some(renewal), Some(config)) = (&self.renewing, &self.published) else {
            return;
        };
        for voter in config.voters() {
            if !renewal.grants.contains(&voter) {
                let body = Message::TermAsk { term: renewal.term };
                out.send(Envelope::new(self.cfg.id, voter, config.epoch, body));
            }
        }
    }

    /// Granted its renewed term by a majority: publishes the configuration in force again as
    /// the term's first epoch, then what was decided since, as before.
    fn renewed<V: Value>(&mut self, out: &mut Effects<V>) {
        let (Some(renewal), Some(published), Some(decided)) = (
            self.renewing.take(),
            self.published.clone(),
            self.config.clone(),
        ) else {
            return;
        };
        let term = renewal.term;
        let mut first = published;
        first.term = term;
        first.epoch = first_epoch_of_term(term);
        if let Some(fence) = &mut self.fence {
            // The configuration that dropped a standby, again: a majority must hold it.
            fence.epoch = first.epoch;
            fence.heard.clear();
        }
        out.emit(Event::Coordinator(CoordinatorEvent::TermRenewed {
            term,
            epoch: first.epoch,
        }));
        self.config = Some(first.clone());
        self.published = Some(first);
        self.note_may_hold();
        self.broadcast(out);
        self.replicate(out);
        let mut next = decided;
        next.term = term;
        let mut same = next.clone();
        same.epoch = first_epoch_of_term(term);
        if Some(&same) != self.published.as_ref() {
            self.publish(next, out);
        }
    }

    /// Drops the silent `standbys`: publishes the newest configuration each is known to hold
    /// without them, fenced, and holds back what was decided since behind the fence.
    fn drop_standbys<V: Value>(&mut self, silent: &[NodeId], out: &mut Effects<V>) {
        let (Some(decided), Some(published)) = (self.config.clone(), self.published.clone()) else {
            return;
        };
        let mut base = silent
            .iter()
            .filter_map(|s| self.standby_holds.get(s))
            .max_by_key(|c| c.epoch)
            .cloned()
            .unwrap_or(published);
        let mut voter_sets = BTreeSet::new();
        for s in silent {
            self.standby_acks.remove(s);
            self.standby_holds.remove(s);
            voter_sets.extend(
                self.may_hold
                    .remove(s)
                    .into_iter()
                    .flat_map(BTreeMap::into_values),
            );
            out.emit(Event::Coordinator(CoordinatorEvent::StandbyDropped(*s)));
        }
        let keep = |standbys: &mut Vec<NodeId>| standbys.retain(|s| !silent.contains(s));
        keep(&mut base.standbys);
        base.epoch = decided.epoch + 1;
        voter_sets.insert(base.voters());
        let mut next = decided;
        keep(&mut next.standbys);
        let held_back = {
            let mut same = next.clone();
            same.epoch = base.epoch;
            same != base
        };
        self.fence = Some(Fence {
            epoch: base.epoch,
            voter_sets,
            heard: BTreeSet::new(),
        });
        self.published = Some(base.clone());
        self.config = Some(base);
        self.broadcast(out);
        if held_back {
            // Decided after what the dropped standby holds: published once the fence lifts.
            self.publish(next, out);
        }
    }

    /// Every failure check of the active coordinator: the standby gets the state again (it
    /// may have been lost; it is also how the standby knows the active one lives), and one
    /// silent past the timeout is dropped.
    pub(super) fn check_standbys<V: Value>(&mut self, out: &mut Effects<V>) {
        if self.config.is_none() {
            return;
        }
        let allowed = self.cfg.timing.missed_checks_allowed();
        if let Some(renewal) = &mut self.renewing {
            renewal.checks += 1;
            if renewal.checks > allowed {
                // Another may have been granted this term meanwhile.
                let term = renewal.term + 1;
                self.renewing = None;
                self.renew_term(term, out);
            } else {
                self.ask_renewal(out);
            }
        }
        let Some(config) = &self.config else {
            return;
        };
        let mut silent = Vec::new();
        for &s in &config.standbys {
            let (_, checks) = self.standby_acks.entry(s).or_insert((0, 0));
            *checks += 1;
            if *checks > allowed {
                silent.push(s);
            }
        }
        if !silent.is_empty() {
            return self.drop_standbys(&silent, out);
        }
        if config.standbys.is_empty() {
            return self.invite(out);
        }
        self.replicate(out);
    }

    /// A standby's acknowledgement, or a peer's answer to an invitation.
    pub(super) fn on_standby_ack<V: Value>(
        &mut self,
        from: NodeId,
        term: u64,
        epoch: Epoch,
        out: &mut Effects<V>,
    ) {
        if self.mode != Mode::Active || term > self.term_seen {
            // A standby asking members for a newer term does not hold this one's state; it is
            // dropped in time if it does not come back.
            return;
        }
        let Some(config) = &self.config else {
            return;
        };
        if config.standbys.contains(&from) {
            let entry = self.standby_acks.entry(from).or_insert((0, 0));
            entry.0 = entry.0.max(epoch);
            entry.1 = 0;
            let acked = entry.0;
            if acked == config.epoch {
                self.standby_holds.insert(from, config.clone());
            }
            if let Some(held) = self.may_hold.get_mut(&from) {
                // What it acknowledged is the oldest it may hold as its latest.
                held.retain(|&e, _| e >= acked);
            }
            return self.release(out);
        }
        if !self.cfg.peers.iter().any(|p| p == from) {
            return out.refuse(from, Refusal::UnknownSender);
        }
        if config.standbys.is_empty() && self.fence.is_none() {
            // Taken as the standby: the configuration naming it is published once it holds it.
            let mut next = config.clone();
            next.standbys = vec![from];
            self.standby_acks.insert(from, (0, 0));
            self.publish(next, out);
        }
    }

    /// The active coordinator's state, or another's that took over.
    pub(super) fn on_standby_state<V: Value>(
        &mut self,
        from: NodeId,
        state: StandbyState,
        out: &mut Effects<V>,
    ) {
        let term = state.config.term;
        let held = self.config.as_ref().map_or(0, |c| c.term);
        let stale = match self.mode {
            // Against the term it won, not the highest it asked for: a renewal that failed
            // does not make a coordinator newer than one that took over.
            Mode::Active => term <= held,
            // A candidate that hears from the active coordinator again follows it: members
            // that granted it a term say so in their heartbeats, and nothing it was granted is
            // used.
            _ => term < held,
        };
        if stale {
            // From a coordinator taken over from. The active one sends it its own state: it
            // steps down, and may be taken as the standby. A standby asking for a term says
            // only the term, which the active one does not take as an acknowledgement.
            let body = match self.standby_state().filter(|_| self.mode == Mode::Active) {
                Some(mine) => Message::Standby(Box::new(mine)),
                None => Message::StandbyAck {
                    term: self.term_seen,
                    epoch: self.decided_epoch(),
                },
            };
            out.send(Envelope::new(self.cfg.id, from, self.decided_epoch(), body));
            return out.refuse(
                from,
                Refusal::StaleTerm {
                    term,
                    current: self.term_seen,
                },
            );
        }
        let held_epoch = self.config.as_ref().map_or(0, |c| c.epoch);
        if term == held && state.config.epoch < held_epoch && self.mode != Mode::Active {
            // A late copy of an older state: the newer one it holds came from the same
            // coordinator.
            let body = Message::StandbyAck {
                term,
                epoch: held_epoch,
            };
            return out.send(Envelope::new(self.cfg.id, from, held_epoch, body));
        }
        if self.mode == Mode::Active {
            out.emit(Event::Coordinator(CoordinatorEvent::SteppedDown { term }));
        }
        self.term_seen = self.term_seen.max(term);
        self.mode = Mode::Standby { silent: 0 };
        self.renewing = None;
        self.fence = None;
        self.standby_acks.clear();
        self.standby_holds.clear();
        self.may_hold.clear();
        // Kept to answer nodes that register with every coordinator: only what members may
        // hold already.
        if state.published == state.config.epoch {
            self.published = Some(state.config.clone());
        } else if self.published.as_ref().is_some_and(|p| p.term != term) {
            self.published = None;
        }
        self.members = state.members.into_iter().collect();
        self.incarnations = state.incarnations.into_iter().collect();
        self.dead = state.dead.into_iter().collect();
        let epoch = state.config.epoch;
        if state.config.job_finished() && !self.finish_said {
            // Every worker left: the job is over, and the process holding this standby may
            // stop with the active one.
            self.finish_said = true;
            out.emit(Event::JobFinished { epoch });
        }
        self.config = Some(state.config);
        let body = Message::StandbyAck { term, epoch };
        out.send(Envelope::new(self.cfg.id, from, epoch, body));
    }

    /// A message for the active coordinator reached a standby: a node registering with every
    /// coordinator it knows (one that missed every configuration, say), or following one that
    /// stepped down. It is sent the last configuration the standby knows to be published, if
    /// any: the one it holds may not be published yet (the active coordinator may drop the
    /// standby and publish an older one), so it is no answer to give.
    pub(super) fn as_standby<V: Value>(
        &mut self,
        from: NodeId,
        body: Message<V>,
        out: &mut Effects<V>,
    ) {
        match (&self.published, body) {
            (
                Some(config),
                Message::Register { .. } | Message::ConfigRequest | Message::Heartbeat { .. },
            ) if config.coordinator != self.cfg.id => {
                let body = Message::Config(config.clone());
                out.send(Envelope::new(self.cfg.id, from, config.epoch, body));
            }
            _ => out.refuse(from, Refusal::Unexpected),
        }
    }

    /// After a takeover, sends the configuration in force to every member silent for half
    /// the heartbeat timeout, and again every few checks: one that missed the takeover's
    /// broadcast still heartbeats the coordinator taken over from, and learns of the new one
    /// so.
    pub(super) fn remind_silent<V: Value>(&self, out: &mut Effects<V>) {
        let taken_over = self.published.as_ref().is_some_and(|c| c.term > 0);
        if self.cfg.peers.is_empty() || !taken_over {
            return;
        }
        // From half-way to the timeout, every few checks: a reminder can be lost too, and
        // a member that never hears of the takeover is declared dead though alive.
        let halfway = self.cfg.timing.missed_checks_allowed() / 2 + 1;
        for (&node, &missed) in &self.silent_checks {
            if missed >= halfway && (missed - halfway) % 3 == 0 {
                self.send_config(node, out);
            }
        }
    }

    /// A failure check of a standby or candidate.
    pub(super) fn standby_check<V: Value>(&mut self, out: &mut Effects<V>) {
        let allowed = self.cfg.timing.missed_checks_allowed();
        let listed = self
            .config
            .as_ref()
            .is_some_and(|c| c.standbys.contains(&self.cfg.id));
        let ask = match &mut self.mode {
            Mode::Active => return,
            Mode::Standby { silent } => {
                *silent = (*silent + 1).min(allowed + 1);
                if *silent <= allowed {
                    return;
                }
                listed.then_some(self.term_seen + 1)
            }
            // A round without a majority: another may have been granted this term, and the
            // next round asks for the one above.
            Mode::Candidate { term, checks, .. } => {
                *checks += 1;
                Some(if *checks > allowed { *term + 1 } else { *term })
            }
        };
        if let Some(term) = ask {
            self.ask_for(term, out);
        }
    }

    /// Asks every voter that has not granted it for `term`.
    fn ask_for<V: Value>(&mut self, term: u64, out: &mut Effects<V>) {
        let Some(config) = &self.config else {
            return;
        };
        let granted = match &self.mode {
            Mode::Candidate {
                term: asked,
                grants,
                ..
            } if *asked == term => grants.keys().copied().collect(),
            _ => BTreeSet::new(),
        };
        if !matches!(&self.mode, Mode::Candidate { term: asked, .. } if *asked == term) {
            self.mode = Mode::Candidate {
                term,
                grants: BTreeMap::new(),
                checks: 0,
            };
            self.term_seen = self.term_seen.max(term);
        }
        for voter in config.voters() {
            if !granted.contains(&voter) {
                let body = Message::TermAsk { term };
                out.send(Envelope::new(self.cfg.id, voter, config.epoch, body));
            }
        }
    }

    /// A member granted a term.
    pub(super) fn on_grant<V: Value>(
        &mut self,
        from: NodeId,
        term: u64,
        config: ClusterConfig,
        out: &mut Effects<V>,
    ) {
        if let Some(renewal) = self.renewing.as_mut().filter(|r| r.term == term) {
            renewal.grants.insert(from);
            let majority = self
                .published
                .as_ref()
                .is_some_and(|c| c.is_majority(&renewal.grants));
            if majority && self.mode == Mode::Active {
                self.renewed(out);
            }
            return;
        }
        let Mode::Candidate {
            term: asked,
            grants,
            ..
        } = &mut self.mode
        else {
            return out.refuse(from, Refusal::Unexpected);
        };
        if term != *asked {
            return out.refuse(
                from,
                Refusal::StaleTerm {
                    term,
                    current: *asked,
                },
            );
        }
        grants.insert(from, config);
        let heard: BTreeSet<NodeId> = grants.keys().copied().collect();
        if self.config.as_ref().is_some_and(|c| c.is_majority(&heard)) {
            self.take_over(out);
        }
    }

    /// Granted a term by a majority: publishes the newest configuration known, as the first
    /// epoch of the term, without the coordinator taken over from.
    fn take_over<V: Value>(&mut self, out: &mut Effects<V>) {
        let Mode::Candidate { term, grants, .. } = std::mem::replace(&mut self.mode, Mode::Active)
        else {
            return;
        };
        let Some(base) = self
            .config
            .iter()
            .chain(grants.values())
            .max_by_key(|c| (c.term, c.epoch))
            .cloned()
        else {
            return;
        };
        let from = base.coordinator;
        #[cfg(feature = "mutations")]
        let (next_base_term, next_base_epoch) = (base.term, base.epoch);
        let mut next = base;
        next.coordinator = self.cfg.id;
        next.standbys = Vec::new();
        next.term = term;
        next.epoch = first_epoch_of_term(term);
        #[cfg(feature = "mutations")]
        if self.mutation == Some(crate::mutation::Mutation::TakeOverWithoutTerm) {
            next.term = next_base_term;
            next.epoch = next_base_epoch + 1;
        }
        next.incarnations = super::server_incarnations(&self.incarnations, &next);
        // What it learns from the members it learns again: who is silent, where workers are.
        self.silent_checks.clear();
        self.kept_silent.clear();
        self.kept_asking.clear();
        self.caught_up.clear();
        self.pace_watch = PaceWatch::default();
        self.stragglers.clear();
        self.standby_acks.clear();
        self.standby_holds.clear();
        self.may_hold.clear();
        self.fence = None;
        self.renewing = None;
        self.term_seen = term;
        let epoch = next.epoch;
        self.config = Some(next.clone());
        self.published = Some(next);
        out.emit(Event::Coordinator(CoordinatorEvent::TookOver {
            from,
            term,
            epoch,
        }));
        self.broadcast(out);
        self.say_when_finished(out);
        self.switch_when_caught_up(out);
    }
}
