//! Exactly-once bookkeeping for one worker's pushes to one shard (ARCHITECTURE.md §4,
//! exactly-once).

use std::collections::BTreeMap;

use crate::ids::NodeId;
use crate::key::{Key, KeyRange};
use crate::wire::{AppliedSpan, DedupeRecord, RequestId, SmallVec};

/// Which rows of one worker's push requests a shard has applied.
///
/// A high-water mark (every request below it is settled: acknowledged, never to be sent again,
/// as the worker says in each push) plus, per unsettled request, the spans of keys applied.
/// Keying by request and key, not by slice, is what lets a resend be recognised after the
/// worker sliced the request again under a new ring, and after the shard moved to another
/// server: the window travels with the shard. It holds only the worker's unsettled requests,
/// so it stays as small as the worker's window of requests in flight.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct DedupeWindow {
    settled_below: RequestId,
    applied: BTreeMap<RequestId, SmallVec<[(Key, Key); 1]>>,
}

impl DedupeWindow {
    /// Every request below `below` is settled; forgets what it no longer needs.
    pub(crate) fn settle(&mut self, below: RequestId) {
        if below > self.settled_below {
            self.settled_below = below;
            // In place: a split would allocate a new map with every push that settles some.
            self.applied.retain(|&request, _| request >= below);
        }
    }

    /// True when the row of `key` of `request` was applied before (or the request is settled,
    /// hence was applied). Only the tests ask: the server asks for spans, not keys.
    #[cfg(test)]
    pub(crate) fn is_applied(&self, request: RequestId, key: Key) -> bool {
        request < self.settled_below
            || self
                .applied
                .get(&request)
                .is_some_and(|spans| spans.iter().any(|&(a, b)| a <= key && key <= b))
    }

    /// True when no row of `request` was applied before and it is not settled: all of its
    /// rows are fresh, without a look at spans.
    pub(crate) fn untouched(&self, request: RequestId) -> bool {
        request >= self.settled_below && !self.applied.contains_key(&request)
    }

    /// The parts of `within` holding no row of `request` applied before, in key order: empty
    /// for a settled request, `within` itself for a request never seen. A few spans per
    /// request, so this costs a sort of those, not a look per key.
    pub(crate) fn fresh_ranges(&self, request: RequestId, within: KeyRange) -> Vec<KeyRange> {
        if request < self.settled_below {
            return Vec::new();
        }
        let mut spans = self.applied.get(&request).cloned().unwrap_or_default();
        spans.sort_unstable();
        let mut fresh = Vec::new();
        let mut from = within.start();
        for (first, last) in spans {
            if first > from {
                if let Ok(gap) = KeyRange::new(from, first.min(within.end())) {
                    if !gap.is_empty() {
                        fresh.push(gap);
                    }
                }
            }
            // last <= MAX_KEY, so last + 1 is at most the end of the key space.
            from = from.max(last.saturating_add(1));
            if from >= within.end() {
                return fresh;
            }
        }
        if let Ok(rest) = KeyRange::new(from, within.end()) {
            if !rest.is_empty() {
                fresh.push(rest);
            }
        }
        fresh
    }

    /// Records that the rows of `span` have been applied.
    pub(crate) fn record(&mut self, span: AppliedSpan) {
        if span.request >= self.settled_below {
            let spans = self.applied.entry(span.request).or_default();
            if !spans.contains(&(span.first, span.last)) {
                spans.push((span.first, span.last));
            }
        }
    }

    /// Takes in what another copy of the shard recorded (replication, transfers).
    pub(crate) fn merge(&mut self, record: &DedupeRecord) {
        self.settle(record.settled_below);
        for &span in &record.applied {
            self.record(span);
        }
    }

    /// This window as `worker`'s record, for replication and transfers.
    pub(crate) fn to_record(&self, worker: NodeId) -> DedupeRecord {
        let applied = self
            .applied
            .iter()
            .flat_map(|(&request, spans)| {
                spans.iter().map(move |&(first, last)| AppliedSpan {
                    request,
                    first,
                    last,
                })
            })
            .collect();
        DedupeRecord {
            worker,
            settled_below: self.settled_below,
            applied,
        }
    }

    /// The high-water mark.
    #[cfg(test)]
    pub(crate) fn settled_below(&self) -> RequestId {
        self.settled_below
    }

    /// Spans remembered above the high-water mark.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn len(&self) -> usize {
        self.applied.values().map(SmallVec::len).sum()
    }

    /// True when nothing is remembered above the high-water mark.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.applied.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(request: RequestId, first: Key, last: Key) -> AppliedSpan {
        AppliedSpan {
            request,
            first,
            last,
        }
    }

    #[test]
    fn a_duplicate_is_recognised_before_and_after_settling() {
        let mut w = DedupeWindow::default();
        assert!(!w.is_applied(3, 10));
        w.record(span(3, 10, 20));
        assert!(w.is_applied(3, 10) && w.is_applied(3, 15) && w.is_applied(3, 20));
        assert!(!w.is_applied(3, 21), "rows outside the span are fresh");
        assert!(!w.is_applied(4, 15), "another request's rows are fresh");
        w.record(span(5, 0, 0));
        assert_eq!(w.len(), 2);
        assert!(!w.is_empty());
        w.settle(4);
        assert_eq!(w.len(), 1, "settling forgets only what is below the mark");
        assert!(w.is_applied(5, 0));
        assert!(
            w.is_applied(3, 99),
            "a settled request is never applied again"
        );
        w.settle(6);
        assert!(w.is_empty());
        // A stale settle from a delayed message never lowers the mark.
        w.settle(2);
        assert_eq!(w.settled_below(), 6);
    }

    proptest::proptest! {
        /// The fresh ranges hold exactly the keys of `within` that no applied span covers.
        #[test]
        fn fresh_ranges_hold_exactly_the_keys_no_span_covers(
            spans in proptest::collection::vec((0u64..60, 0u64..8), 0..5),
            settled in proptest::bool::weighted(0.1),
            a in 0u64..70,
            b in 0u64..70,
        ) {
            let mut w = DedupeWindow::default();
            for &(first, len) in &spans {
                w.record(span(3, first, first + len));
            }
            if settled {
                w.settle(4);
            }
            let within = KeyRange::new(a.min(b), a.max(b)).unwrap();
            let fresh = w.fresh_ranges(3, within);
            for pair in fresh.windows(2) {
                proptest::prop_assert!(pair[0].end() < pair[1].start(), "{fresh:?}");
            }
            for k in within.keys() {
                let in_fresh = fresh.iter().any(|r| r.contains(k));
                proptest::prop_assert_eq!(in_fresh, !w.is_applied(3, k), "key {}", k);
            }
            proptest::prop_assert!(fresh.iter().all(|r| within.covers(*r) && !r.is_empty()));
        }
    }

    #[test]
    fn a_window_survives_the_trip_through_its_record() {
        let mut w = DedupeWindow::default();
        w.settle(2);
        w.record(span(2, 1, 4));
        w.record(span(2, 9, 9));
        w.record(span(7, 3, 3));
        let mut copy = DedupeWindow::default();
        copy.merge(&w.to_record(crate::NodeId(1)));
        assert_eq!(copy, w);
        copy.merge(&w.to_record(crate::NodeId(1)));
        assert_eq!(copy, w, "merging the same record twice changes nothing");
    }

    #[test]
    fn dedupe_state_stays_bounded_over_a_long_job() {
        let mut w = DedupeWindow::default();
        for request in 1..100_000u64 {
            // The worker keeps at most 8 requests unsettled.
            w.settle(request.saturating_sub(8));
            w.record(span(request, 0, 5));
            assert!(w.len() <= 9);
        }
    }
}
