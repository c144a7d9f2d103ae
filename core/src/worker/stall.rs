//! A worker's watch on its own requests: when the oldest thing it was asked for has waited
//! the job's stall limit ([`crate::Timing::stall_limit`]), it says so once
//! ([`crate::events::WorkerEvent::Stalled`]), naming what it waits for, so that every
//! embedder gets the bound the runtime used to keep alone (ARCHITECTURE.md §2).
//!
//! What waits is the oldest request not done (a push not yet counted for its iteration, or
//! a pull not answered), or else an advance the consistency model holds. Requests that
//! complete behind it do not hide it: a slice stuck on one server is said however well the
//! others answer. Looked at with each heartbeat, so a stall is said at most a heartbeat late.

use crate::ids::{Iteration, Time};
use crate::wire::RequestId;

/// What a worker waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Waiting {
    /// Its oldest request not done.
    Request(RequestId),
    /// An advance out of this iteration, the consistency model holding it.
    Advance(Iteration),
}

/// What the worker waited on at the last look, since when, and whether the stall was said.
/// Left at its default when the job sets no limit, so that the model checker sees no more
/// states.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct StallWatch {
    watching: Option<(Waiting, Time)>,
    said: bool,
}

impl StallWatch {
    /// Looks at the worker at `now`, waiting on `waiting` (nothing: `None`). Returns how long
    /// it has, once per stall, when that reaches `limit`.
    pub(super) fn look(
        &mut self,
        now: Time,
        waiting: Option<Waiting>,
        limit: Time,
    ) -> Option<Time> {
        if limit == 0 {
            return None;
        }
        let since = match (self.watching, waiting) {
            (Some((was, since)), Some(is)) if was == is => since,
            _ => {
                *self = StallWatch {
                    watching: waiting.map(|w| (w, now)),
                    said: false,
                };
                return None;
            }
        };
        let waited = now.saturating_sub(since);
        (waited >= limit && !std::mem::replace(&mut self.said, true)).then_some(waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_said_once_past_the_limit_and_again_for_the_next_request() {
        let mut w = StallWatch::default();
        let first = Some(Waiting::Request(1));
        assert_eq!(w.look(0, first, 10), None);
        assert_eq!(w.look(9, first, 10), None);
        assert_eq!(w.look(10, first, 10), Some(10));
        assert_eq!(w.look(30, first, 10), None, "said once");
        // The first is done: the next oldest is watched from now.
        let second = Some(Waiting::Request(2));
        assert_eq!(w.look(31, second, 10), None);
        assert_eq!(w.look(40, second, 10), None);
        assert_eq!(w.look(41, second, 10), Some(10));
    }

    #[test]
    fn an_advance_that_waits_is_watched_by_iteration() {
        let mut w = StallWatch::default();
        assert_eq!(w.look(0, Some(Waiting::Advance(3)), 10), None);
        assert_eq!(w.look(10, Some(Waiting::Advance(3)), 10), Some(10));
        assert_eq!(
            w.look(11, Some(Waiting::Advance(4)), 10),
            None,
            "entered the next"
        );
    }

    #[test]
    fn nothing_waiting_or_no_limit_is_no_stall() {
        let mut w = StallWatch::default();
        assert_eq!(w.look(0, None, 10), None);
        assert_eq!(w.look(100, None, 10), None);
        assert_eq!(
            w.look(200, Some(Waiting::Request(1)), 10),
            None,
            "the wait begins now"
        );
        assert_eq!(w.look(209, Some(Waiting::Request(1)), 10), None);
        let mut off = StallWatch::default();
        assert_eq!(off.look(1_000, Some(Waiting::Request(1)), 0), None);
        assert_eq!(off, StallWatch::default(), "no limit: no state");
    }
}
