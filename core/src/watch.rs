//! A server's or worker's watch on the coordinator (ARCHITECTURE.md §2).
//!
//! The coordinator answers every heartbeat. A node counts the heartbeats it sent since it last
//! heard from the coordinator, and says once when the count passes
//! [`Timing::coordinator_timeout`](crate::Timing::coordinator_timeout) worth, and once when the
//! coordinator is heard again: without it, a node whose peer died would wait with nothing in
//! its log to say that the one node that could deal with the death is gone.

use crate::effects::{Effects, Event};
use crate::timing::Timing;
use crate::value::Value;

/// Heartbeats unanswered, saturating at the number allowed plus one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct CoordinatorWatch {
    unanswered: u64,
}

impl CoordinatorWatch {
    /// Call after every heartbeat sent to the coordinator.
    pub(crate) fn heartbeat_sent<V: Value>(&mut self, timing: &Timing, out: &mut Effects<V>) {
        let Some(allowed) = timing.unanswered_heartbeats_allowed() else {
            return;
        };
        if self.unanswered <= allowed {
            self.unanswered += 1;
            if self.unanswered > allowed {
                out.emit(Event::CoordinatorSilent {
                    for_at_least: timing.coordinator_timeout,
                });
            }
        }
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
            watch.heartbeat_sent(&timing, &mut out);
        }
        assert!(events(&mut out).is_empty(), "three unanswered are allowed");
        for _ in 0..5 {
            watch.heartbeat_sent(&timing, &mut out);
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
    fn an_answer_within_the_timeout_keeps_the_node_quiet() {
        let timing = every_10_silent_after_30();
        let (mut watch, mut out) = (CoordinatorWatch::default(), Effects::default());
        for _ in 0..10 {
            watch.heartbeat_sent(&timing, &mut out);
            watch.heartbeat_sent(&timing, &mut out);
            watch.heard(&timing, &mut out);
        }
        assert!(events(&mut out).is_empty());
    }

    #[test]
    fn a_timeout_of_zero_watches_nothing_and_keeps_no_count() {
        let timing = Timing {
            coordinator_timeout: 0,
            ..Timing::default()
        };
        let (mut watch, mut out) = (CoordinatorWatch::default(), Effects::default());
        for _ in 0..100 {
            watch.heartbeat_sent(&timing, &mut out);
        }
        assert!(events(&mut out).is_empty());
        assert_eq!(watch, CoordinatorWatch::default());
    }
}
