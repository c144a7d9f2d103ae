//! Range vector clocks (the paper's §4.1, Algorithm 1).
//!
//! Parameter server traffic is ranged: a worker pushes or pulls a whole key range in one
//! iteration, so a clock that stored one timestamp per key would cost as much as the parameters
//! themselves. A [`RangeClock`] stores one timestamp per *segment* of the key space and merges
//! adjacent segments that carry the same timestamp, so a clock touched by `m` ranged operations
//! holds `O(m)` segments, however many keys those ranges cover.

use core::fmt;
use std::collections::BTreeMap;

use crate::ids::Iteration;
use crate::key::{Key, KeyRange};

/// A timestamp for every key of `[0, u64::MAX)`, stored as coalesced segments.
///
/// Invariants: the segments cover the whole key space; no two adjacent segments carry the same
/// timestamp (so the representation of a given key-to-timestamp function is unique, which makes
/// the derived `Eq` and `Hash` agree with key-wise equality).
///
/// ```
/// use pserver_core::KeyRange;
/// use pserver_core::node::RangeClock;
/// let mut c = RangeClock::<u32>::new();
/// c.set(KeyRange::new(0, 500_000)?, 3);
/// c.set(KeyRange::new(500_000, 1_000_000)?, 3);
/// assert_eq!(c.get(123_456), 3);
/// assert_eq!(c.segment_count(), 2); // [0, 1e6) -> 3 and [1e6, MAX) -> 0
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RangeClock<T = Iteration> {
    /// Segment start -> timestamp; a segment runs to the next start (or to `u64::MAX`).
    /// Always holds an entry at key 0.
    starts: BTreeMap<Key, T>,
}

impl<T: Copy + Ord + Default> Default for RangeClock<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy + Ord + Default> RangeClock<T> {
    /// A clock reading `T::default()` on every key.
    pub fn new() -> Self {
        Self::filled(T::default())
    }

    /// A clock reading `t` on every key.
    pub fn filled(t: T) -> Self {
        RangeClock {
            starts: BTreeMap::from([(0, t)]),
        }
    }

    /// The timestamp of `key`.
    pub fn get(&self, key: Key) -> T {
        self.starts
            .range(..=key)
            .next_back()
            .map_or_else(T::default, |(_, &t)| t)
    }

    /// Sets every key of `range` to `t` (Algorithm 1: split the segments at the range's bounds,
    /// overwrite the segments inside, merge with equal neighbours).
    pub fn set(&mut self, range: KeyRange, t: T) {
        if range.is_empty() {
            return;
        }
        let (start, end) = (range.start(), range.end());
        let after = self.get(end);
        let inside: Vec<Key> = self.starts.range(start..end).map(|(&k, _)| k).collect();
        for k in inside {
            self.starts.remove(&k);
        }
        self.starts.insert(start, t);
        if end != u64::MAX {
            self.starts.insert(end, after);
            if after == t {
                self.starts.remove(&end);
            }
        }
        if start > 0 && self.get(start - 1) == t {
            self.starts.remove(&start);
        }
    }

    /// Raises every key of `range` to at least `t`, leaving later timestamps alone.
    pub fn advance(&mut self, range: KeyRange, t: T) {
        let lower: Vec<KeyRange> = self
            .segments_in(range)
            .filter(|&(_, cur)| cur < t)
            .map(|(r, _)| r)
            .collect();
        for r in lower {
            self.set(r, t);
        }
    }

    /// Key-wise maximum with `other`: afterwards every key reads the later of the two clocks.
    pub fn merge(&mut self, other: &RangeClock<T>) {
        for (r, t) in other.segments() {
            self.advance(r, t);
        }
    }

    /// The earliest timestamp of any key in `range`, or `None` for an empty range.
    pub fn min_in(&self, range: KeyRange) -> Option<T> {
        self.segments_in(range).map(|(_, t)| t).min()
    }

    /// The latest timestamp of any key in `range`, or `None` for an empty range.
    pub fn max_in(&self, range: KeyRange) -> Option<T> {
        self.segments_in(range).map(|(_, t)| t).max()
    }

    /// Number of segments held (at least 1).
    pub fn segment_count(&self) -> usize {
        self.starts.len()
    }

    /// Every segment with its timestamp, in key order, covering the whole key space.
    pub fn segments(&self) -> impl Iterator<Item = (KeyRange, T)> + '_ {
        self.segments_in(KeyRange::FULL)
    }

    /// The segments overlapping `range`, clipped to it, in key order.
    pub fn segments_in(&self, range: KeyRange) -> impl Iterator<Item = (KeyRange, T)> + '_ {
        let first = (!range.is_empty()).then(|| (range.start(), self.get(range.start())));
        let rest = self
            .starts
            .range(range.start()..range.end())
            .map(|(&k, &t)| (k, t))
            .filter(move |&(k, _)| k != range.start());
        let mut starts = first.into_iter().chain(rest).peekable();
        core::iter::from_fn(move || {
            let (from, t) = starts.next()?;
            let to = starts.peek().map_or(range.end(), |&(k, _)| k);
            // from < to <= range.end() by construction of the iterator.
            KeyRange::new(from, to).ok().map(|r| (r, t))
        })
    }
}

impl<T: fmt::Debug + Copy + Ord + Default> fmt::Debug for RangeClock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.segments()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Positions `0..SPACE` stand for keys: the lower half for `0..SPACE / 2`, the upper half
    /// for the keys just below the end of the key space, up to the largest legal key. Position
    /// `SPACE` is the end of the key space itself, so ranges ending there end at `u64::MAX`.
    const SPACE: u64 = 64;

    fn key(p: u64) -> u64 {
        if p < SPACE / 2 {
            p
        } else {
            u64::MAX - (SPACE - p)
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Set(u64, u64, u32),
        Advance(u64, u64, u32),
        Merge(Vec<(u64, u64, u32)>),
    }

    /// The key range of positions `a..b` (in either order).
    fn range(a: u64, b: u64) -> KeyRange {
        KeyRange::new(key(a.min(b)), key(a.max(b))).unwrap()
    }

    fn positions(a: u64, b: u64) -> std::ops::Range<usize> {
        a.min(b) as usize..a.max(b) as usize
    }

    fn op() -> impl Strategy<Value = Op> {
        let r = (0..=SPACE, 0..=SPACE, 0u32..5);
        prop_oneof![
            r.clone().prop_map(|(a, b, t)| Op::Set(a, b, t)),
            r.clone().prop_map(|(a, b, t)| Op::Advance(a, b, t)),
            proptest::collection::vec(r, 0..4).prop_map(Op::Merge),
        ]
    }

    /// One timestamp per position. The keys between the halves behave like the last key of the
    /// lower half: every range holds both or neither.
    fn naive_apply(naive: &mut [u32], op: &Op) {
        let mut set = |a: u64, b: u64, t: u32, only_raise: bool| {
            for slot in &mut naive[positions(a, b)] {
                *slot = if only_raise { (*slot).max(t) } else { t };
            }
        };
        match op {
            Op::Set(a, b, t) => set(*a, *b, *t, false),
            Op::Advance(a, b, t) => set(*a, *b, *t, true),
            Op::Merge(sets) => {
                let mut other = vec![0u32; naive.len()];
                for &(a, b, t) in sets {
                    for slot in &mut other[positions(a, b)] {
                        *slot = t;
                    }
                }
                for (slot, o) in naive.iter_mut().zip(other) {
                    *slot = (*slot).max(o);
                }
            }
        }
    }

    fn clock_apply(clock: &mut RangeClock<u32>, op: &Op) {
        match op {
            Op::Set(a, b, t) => clock.set(range(*a, *b), *t),
            Op::Advance(a, b, t) => clock.advance(range(*a, *b), *t),
            Op::Merge(sets) => {
                let mut other = RangeClock::new();
                for &(a, b, t) in sets {
                    other.set(range(a, b), t);
                }
                clock.merge(&other);
            }
        }
    }

    proptest! {
        #[test]
        fn range_clock_agrees_with_a_per_key_clock(ops in proptest::collection::vec(op(), 0..24)) {
            let mut clock = RangeClock::<u32>::new();
            let mut naive = vec![0u32; SPACE as usize];
            for op in &ops {
                clock_apply(&mut clock, op);
                naive_apply(&mut naive, op);
            }
            for p in 0..SPACE {
                prop_assert_eq!(clock.get(key(p)), naive[p as usize], "key {}", key(p));
            }
            prop_assert_eq!(clock.get(crate::MAX_KEY), naive[SPACE as usize - 1]);
            // A key of the gap between the halves.
            prop_assert_eq!(clock.get(1 << 40), naive[SPACE as usize / 2 - 1]);
            for a in 0..=SPACE {
                for b in a..=SPACE {
                    let keys = &naive[positions(a, b)];
                    prop_assert_eq!(clock.min_in(range(a, b)), keys.iter().copied().min());
                    prop_assert_eq!(clock.max_in(range(a, b)), keys.iter().copied().max());
                }
            }
        }

        #[test]
        fn adjacent_equal_segments_coalesce(ops in proptest::collection::vec(op(), 0..24)) {
            let mut clock = RangeClock::<u32>::new();
            for op in &ops {
                clock_apply(&mut clock, op);
            }
            let segs: Vec<_> = clock.segments().collect();
            prop_assert_eq!(segs.len(), clock.segment_count());
            prop_assert_eq!(segs[0].0.start(), 0);
            prop_assert_eq!(segs[segs.len() - 1].0.end(), u64::MAX);
            for w in segs.windows(2) {
                prop_assert_eq!(w[0].0.end(), w[1].0.start());
                prop_assert_ne!(w[0].1, w[1].1);
            }
            // Unique representation: a clock rebuilt from the segments is equal (and hashes equal).
            let mut rebuilt = RangeClock::new();
            for (r, t) in segs {
                rebuilt.set(r, t);
            }
            prop_assert_eq!(rebuilt, clock);
        }
    }

    #[test]
    fn a_million_keys_set_in_a_handful_of_ranges_stay_a_handful_of_segments() {
        let mut clock = RangeClock::<u32>::new();
        // Four ranges of 250,000 keys, each set key by key as a worker's pushes would arrive.
        for key in 0..1_000_000u64 {
            let t = 1 + (key / 250_000) as u32 % 2;
            clock.set(KeyRange::single(key).unwrap(), t);
        }
        assert_eq!(clock.segment_count(), 5);
        assert_eq!(clock.get(0), 1);
        assert_eq!(clock.get(250_000), 2);
        assert_eq!(clock.get(999_999), 2);
        assert_eq!(clock.get(1_000_000), 0);
        // Advancing all of it to one iteration collapses it to two segments.
        clock.advance(KeyRange::new(0, 1_000_000).unwrap(), 3);
        assert_eq!(clock.segment_count(), 2);
    }

    #[test]
    fn debug_output_lists_the_segments() {
        let mut clock = RangeClock::<u32>::new();
        clock.set(KeyRange::new(10, 20).unwrap(), 3);
        assert_eq!(
            format!("{clock:?}"),
            format!("{{[0, 10): 0, [10, 20): 3, [20, {}): 0}}", u64::MAX)
        );
    }
}
