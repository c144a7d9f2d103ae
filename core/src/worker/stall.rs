//! A worker's watch on its own requests: past the job's stall limit
//! ([`crate::Timing::stall_limit`]) with nothing completed while something waits, it says so
//! once ([`crate::events::WorkerEvent::Stalled`]), naming what it waits for, so that every
//! embedder gets the bound the runtime used to keep alone (ARCHITECTURE.md §2).
//!
//! Progress is a push done, a push durable, a pull answered or an iteration entered. Looked
//! at with each heartbeat, so a stall is said at most a heartbeat late.

use crate::ids::Time;

/// When the wait began, whether anything completed since the last look, and whether this
/// stall was said. Left at its default when the job sets no limit, so that the model checker
/// sees no more states.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct StallWatch {
    since: Option<Time>,
    progressed: bool,
    said: bool,
}

impl StallWatch {
    /// Something completed.
    pub(super) fn progressed(&mut self, limit: Time) {
        if limit > 0 {
            self.progressed = true;
        }
    }

    /// Looks at the worker at `now`: `waiting` when anything it was asked for is not done.
    /// Returns how long nothing has completed, once per stall, when that passes `limit`.
    pub(super) fn look(&mut self, now: Time, waiting: bool, limit: Time) -> Option<Time> {
        if limit == 0 {
            return None;
        }
        if !waiting || self.progressed {
            *self = StallWatch {
                since: waiting.then_some(now),
                ..StallWatch::default()
            };
            return None;
        }
        let since = *self.since.get_or_insert(now);
        let waited = now.saturating_sub(since);
        (waited >= limit && !std::mem::replace(&mut self.said, true)).then_some(waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_said_once_past_the_limit_and_again_after_progress() {
        let mut w = StallWatch::default();
        assert_eq!(w.look(0, true, 10), None);
        assert_eq!(w.look(9, true, 10), None);
        assert_eq!(w.look(10, true, 10), Some(10));
        assert_eq!(w.look(30, true, 10), None, "said once");
        w.progressed(10);
        assert_eq!(w.look(31, true, 10), None);
        assert_eq!(w.look(40, true, 10), None);
        assert_eq!(w.look(41, true, 10), Some(10));
    }

    #[test]
    fn nothing_waiting_or_no_limit_is_no_stall() {
        let mut w = StallWatch::default();
        assert_eq!(w.look(0, false, 10), None);
        assert_eq!(w.look(100, false, 10), None);
        assert_eq!(w.look(200, true, 10), None, "the wait begins now");
        assert_eq!(w.look(209, true, 10), None);
        let mut off = StallWatch::default();
        off.progressed(0);
        assert_eq!(off.look(1_000, true, 0), None);
        assert_eq!(off, StallWatch::default(), "no limit: no state");
    }
}
