//! A server's or worker's watch on the coordinator (ARCHITECTURE.md §2).
//!
//! The coordinator answers every heartbeat. A node counts the heartbeats it sent since it last
//! heard from the coordinator, and says once when the count passes
//! [`Timing::coordinator_timeout`](crate::Timing::coordinator_timeout) worth, and once when the
//! coordinator is heard again: without it, a node whose peer died would wait with nothing in
//! its log to say that the one node that could deal with the death is gone.
//!
//! The same count decides whether the node grants a standby coordinator a term
//! (ARCHITECTURE.md §11): only once the active one left heartbeats unanswered for
//! [`Timing::heartbeat_timeout`](crate::Timing::heartbeat_timeout), the time it takes the
//! coordinator to declare a node dead. Having granted a term, the node says so with every
//! heartbeat, and the coordinator of an older term does not count it towards what it may publish.

use crate::cluster::Cluster;
use crate::effects::{Effects, Event, NoGrant, Refusal};
use crate::ids::{Epoch, NodeId, Standbys, Time};
use crate::timing::Timing;
use crate::value::Value;
use crate::wire::{ClusterConfig, Envelope, Message};

/// Heartbeats unanswered, saturating past the larger of the numbers allowed, and the highest
/// term granted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct CoordinatorWatch {
    unanswered: u64,
    granted: u64,
    /// The servers the coordinator last said it keeps on the ring though silent.
    degraded: Vec<NodeId>,
    /// The `sent_at` of the answer that said so (or said none are, after some were): an
    /// older answer, late or duplicated, says nothing new.
    degraded_at: Time,
}

impl CoordinatorWatch {
    /// Call after every heartbeat sent to the coordinator; `standbys` when the configuration
    /// held lists a standby, which the count may then be asked to grant a term.
    pub(crate) fn heartbeat_sent<V: Value>(
        &mut self,
        timing: &Timing,
        standbys: bool,
        out: &mut Effects<V>,
    ) {
        let said = timing.unanswered_heartbeats_allowed();
        let grants = standbys.then(|| timing.missed_checks_allowed());
        // Counted no further than anything reads it, so that a node's state stays bounded
        // (the model checker needs it).
        let Some(cap) = said.max(grants) else {
            return;
        };
        if self.unanswered <= cap {
            self.unanswered += 1;
            if said.is_some_and(|allowed| self.unanswered == allowed + 1) {
                out.emit(Event::CoordinatorSilent {
                    for_at_least: timing.coordinator_timeout,
                });
            }
        }
    }

    /// The highest term this node granted a standby, 0 if none.
    pub(crate) fn granted(&self) -> u64 {
        self.granted
    }

    /// A standby asks for `term`. Granted when the configuration held lists it as a standby,
    /// every term held or granted is older, and the active coordinator left heartbeats
    /// unanswered for the heartbeat timeout; the answer is the configuration held. The active
    /// coordinator itself is granted a newer term without the wait. A node
    /// grants each term once.
    pub(crate) fn on_term_ask(
        &mut self,
        timing: &Timing,
        config: Option<&ClusterConfig>,
        from: NodeId,
        asker: Ask,
    ) -> Result<ClusterConfig, NoGrant> {
        let Ask { term, epoch } = asker;
        let config = config.ok_or(NoGrant::NoConfig)?;
        // The coordinator followed renews its own term: members granted a standby one it
        // did not win.
        let renewal = from == config.coordinator;
        // A standby holding a newer configuration than this node's may be listed in it: the
        // configuration that took a standby may not have reached this node before the
        // coordinator died. One that dropped the standby is newer than any the standby holds.
        let listed = config.standbys.contains(&from) || epoch > config.epoch;
        if !renewal && !listed {
            return Err(NoGrant::NotStandby);
        }
        let held = config.term.max(self.granted);
        if term <= held {
            return Err(NoGrant::NotAbove { held });
        }
        if !renewal && self.unanswered <= timing.missed_checks_allowed() {
            return Err(NoGrant::CoordinatorHeard);
        }
        self.granted = term;
        Ok(config.clone())
    }

    /// The coordinator answered the heartbeat sent at `sent_at` listing `degraded`, the silent
    /// servers it keeps on the ring: says [`Event::RingDegraded`] for each not listed in the
    /// last answer taken, so that every member hears it once per silence, as the coordinator
    /// says it. An answer to an older heartbeat than that one (late, or a duplicate) is
    /// passed over. While none is listed, nothing is kept, not even the time.
    pub(crate) fn heard_degraded<V: Value>(
        &mut self,
        sent_at: Time,
        degraded: &[NodeId],
        out: &mut Effects<V>,
    ) {
        if self.degraded == degraded || sent_at < self.degraded_at {
            return;
        }
        for &server in degraded {
            if !self.degraded.contains(&server) {
                out.emit(Event::RingDegraded(server));
            }
        }
        self.degraded = degraded.to_vec();
        self.degraded_at = sent_at;
    }

    /// Call for every message from the coordinator.
    pub(crate) fn heard<V: Value>(&mut self, timing: &Timing, out: &mut Effects<V>) {
        let silent = timing
            .unanswered_heartbeats_allowed()
            .is_some_and(|allowed| self.unanswered > allowed);
        if silent {
            out.emit(Event::CoordinatorBack);
        }
        self.unanswered = 0;
    }
}

/// A coordinator's ask for a term: the term, and the epoch of the configuration it holds (the
/// envelope's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask {
    pub(crate) term: u64,
    pub(crate) epoch: Epoch,
}

/// Where a node sends its registration: the active coordinator of the configuration it holds,
/// or, before it holds one, every coordinator it was told of (whichever is active answers).
pub(crate) fn register_with(
    cluster: Option<&Cluster>,
    coordinator: NodeId,
    standbys: Standbys,
) -> Vec<NodeId> {
    match cluster {
        Some(c) => vec![c.config.coordinator],
        None => std::iter::once(coordinator)
            .chain(standbys.iter())
            .collect(),
    }
}

/// Sends a standby the grant of `term`, or says why it was refused.
pub(crate) fn answer_term_ask<V: Value>(
    me: NodeId,
    epoch: Epoch,
    from: NodeId,
    term: u64,
    answer: Result<ClusterConfig, NoGrant>,
    out: &mut Effects<V>,
) {
    match answer {
        Ok(config) => {
            out.emit(Event::TermGranted { to: from, term });
            let body = Message::TermGrant {
                term,
                config: Box::new(config),
            };
            out.send(Envelope::new(me, from, epoch, body));
        }
        Err(reason) => out.refuse(from, Refusal::TermNotGranted { term, reason }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_10_silent_after_30() -> Timing {
        Timing {
            heartbeat_interval: 10,
            coordinator_timeout: 30,
            ..Timing::default()
        }
    }

    fn events(out: &mut Effects<f32>) -> Vec<Event<f32>> {
        std::mem::take(&mut out.events)
    }

    #[test]
    fn silence_is_said_once_after_the_timeout_and_the_return_once() {
        let timing = every_10_silent_after_30();
        let (mut watch, mut out) = (CoordinatorWatch::default(), Effects::default());
        for _ in 0..3 {
            watch.heartbeat_sent(&timing, false, &mut out);
        }
        assert!(events(&mut out).is_empty(), "three unanswered are allowed");
        for _ in 0..5 {
            watch.heartbeat_sent(&timing, false, &mut out);
        }
        assert_eq!(
            events(&mut out),
            vec![Event::CoordinatorSilent { for_at_least: 30 }]
        );
        watch.heard(&timing, &mut out);
        watch.heard(&timing, &mut out);
        assert_eq!(events(&mut out), vec![Event::CoordinatorBack]);
    }

    #[test]
    fn a_kept_server_is_said_once_per_silence_and_late_answers_say_nothing() {
        let (mut watch, mut out) = (CoordinatorWatch::default(), Effects::default());
        let n = NodeId(2);
        watch.heard_degraded(10, &[], &mut out);
        assert_eq!(
            watch,
            CoordinatorWatch::default(),
            "nothing kept while none is listed"
        );
        watch.heard_degraded(20, &[n], &mut out);
        watch.heard_degraded(30, &[n], &mut out);
        assert_eq!(events(&mut out), vec![Event::RingDegraded(n)]);
        watch.heard_degraded(40, &[], &mut out);
        // The answer to the heartbeat of 20, duplicated and late, after n was heard again.
        watch.heard_degraded(20, &[n], &mut out);
        assert!(events(&mut out).is_empty());
        // Silent again: said again.
        watch.heard_degraded(50, &[n], &mut out);
        assert_eq!(events(&mut out), vec![Event::RingDegraded(n)]);
    }

    #[test]
    fn an_answer_within_the_timeout_keeps_the_node_quiet() {
        let timing = every_10_silent_after_30();
        let (mut watch, mut out) = (CoordinatorWatch::default(), Effects::default());
        for _ in 0..10 {
            watch.heartbeat_sent(&timing, false, &mut out);
            watch.heartbeat_sent(&timing, false, &mut out);
            watch.heard(&timing, &mut out);
        }
        assert!(events(&mut out).is_empty());
    }

    #[test]
    fn a_timeout_of_zero_says_nothing_and_counts_only_where_a_standby_may_ask() {
        let timing = Timing {
            coordinator_timeout: 0,
            ..Timing::default()
        };
        let (mut watch, mut out) = (CoordinatorWatch::default(), Effects::default());
        for _ in 0..100 {
            watch.heartbeat_sent(&timing, false, &mut out);
        }
        assert!(events(&mut out).is_empty());
        assert_eq!(watch, CoordinatorWatch::default());
        for _ in 0..100 {
            watch.heartbeat_sent(&timing, true, &mut out);
        }
        assert!(events(&mut out).is_empty());
        let allowed = timing.missed_checks_allowed();
        assert_eq!(
            watch.unanswered,
            allowed + 1,
            "counted only as far as a grant needs"
        );
    }
}
