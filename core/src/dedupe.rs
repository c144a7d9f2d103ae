//! Exactly-once bookkeeping for one worker's pushes at one server (ARCHITECTURE.md §4, exactly-once).

use std::collections::BTreeSet;

use crate::message::{RequestId, SliceRef};

/// Which of one worker's push slices a server has applied.
///
/// A high-water mark (every request below it is settled: acknowledged, never to be sent again,
/// as the worker says in each push) plus the slices applied at or above it. The set holds only
/// the worker's unsettled requests, so it stays as small as the worker's window of requests in
/// flight instead of growing with the job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DedupeWindow {
    settled_below: RequestId,
    applied: BTreeSet<SliceRef>,
}

impl DedupeWindow {
    /// Every request below `below` is settled; forgets what it no longer needs.
    pub fn settle(&mut self, below: RequestId) {
        if below > self.settled_below {
            self.settled_below = below;
            self.applied = self.applied.split_off(&SliceRef {
                request: below,
                slice: 0,
            });
        }
    }

    /// True when `slice` was applied before (or is settled, hence was).
    pub fn is_duplicate(&self, slice: SliceRef) -> bool {
        slice.request < self.settled_below || self.applied.contains(&slice)
    }

    /// Records that `slice` has been applied.
    pub fn record(&mut self, slice: SliceRef) {
        if slice.request >= self.settled_below {
            self.applied.insert(slice);
        }
    }

    /// The high-water mark.
    pub fn settled_below(&self) -> RequestId {
        self.settled_below
    }

    /// Slices remembered above the high-water mark.
    pub fn len(&self) -> usize {
        self.applied.len()
    }

    /// True when nothing is remembered above the high-water mark.
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(request: RequestId, slice: u32) -> SliceRef {
        SliceRef { request, slice }
    }

    #[test]
    fn a_duplicate_is_recognised_before_and_after_settling() {
        let mut w = DedupeWindow::default();
        assert!(!w.is_duplicate(s(3, 0)));
        w.record(s(3, 0));
        assert!(w.is_duplicate(s(3, 0)));
        assert!(!w.is_duplicate(s(3, 1)));
        w.record(s(5, 2));
        assert_eq!(w.len(), 2);
        assert!(!w.is_empty());
        w.settle(4);
        assert_eq!(w.len(), 1, "settling forgets only what is below the mark");
        assert!(w.is_duplicate(s(5, 2)));
        w.settle(6);
        assert!(w.is_duplicate(s(3, 0)));
        assert!(w.is_empty());
        // A stale settle from a delayed message never lowers the mark.
        w.settle(2);
        assert_eq!(w.settled_below(), 6);
    }

    #[test]
    fn dedupe_state_stays_bounded_over_a_long_job() {
        let mut w = DedupeWindow::default();
        for request in 1..100_000u64 {
            // The worker keeps at most 8 requests unsettled.
            w.settle(request.saturating_sub(8));
            w.record(s(request, 0));
            assert!(w.len() <= 9);
        }
    }
}
