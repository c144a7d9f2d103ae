//! Keys and half-open key ranges.

use core::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A parameter key. The key space is `[0, u64::MAX)`: `u64::MAX` itself is reserved as the
/// exclusive end of the full range, so every key lies inside [`KeyRange::FULL`].
pub type Key = u64;

/// The largest usable key.
pub const MAX_KEY: Key = u64::MAX - 1;

/// A half-open range of keys `[start, end)`.
///
/// Invariant: `start <= end`. An empty range (`start == end`) is allowed and contains nothing.
///
/// ```
/// use pserver_core::KeyRange;
/// let r = KeyRange::new(10, 20)?;
/// assert!(r.contains(10) && !r.contains(20));
/// let (lo, hi) = r.split_at(15);
/// assert_eq!((lo.len(), hi.len()), (5, 5));
/// assert_eq!(r.intersect(KeyRange::new(18, 30)?), KeyRange::new(18, 20).ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct KeyRange {
    start: Key,
    end: Key,
}

/// A key range was asked for with its end before its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("invalid key range [{start}, {end}): the end must not be before the start")]
pub struct InvalidRange {
    /// The requested start.
    pub start: Key,
    /// The requested end.
    pub end: Key,
}

impl KeyRange {
    /// The whole key space, `[0, u64::MAX)`.
    pub const FULL: KeyRange = KeyRange {
        start: 0,
        end: u64::MAX,
    };

    /// The range `[start, end)`; fails if `end < start`.
    pub fn new(start: Key, end: Key) -> Result<Self, InvalidRange> {
        if end < start {
            return Err(InvalidRange { start, end });
        }
        Ok(KeyRange { start, end })
    }

    /// The range holding exactly `key`. Fails for the reserved key `u64::MAX`.
    pub fn single(key: Key) -> Result<Self, InvalidRange> {
        match key.checked_add(1) {
            Some(end) if key <= MAX_KEY => Ok(KeyRange { start: key, end }),
            _ => Err(InvalidRange {
                start: key,
                end: key,
            }),
        }
    }

    /// First key of the range.
    pub fn start(self) -> Key {
        self.start
    }

    /// One past the last key of the range.
    pub fn end(self) -> Key {
        self.end
    }

    /// Number of keys in the range.
    pub fn len(self) -> u64 {
        self.end - self.start
    }

    /// True when the range holds no key.
    pub fn is_empty(self) -> bool {
        self.start == self.end
    }

    /// True when `key` lies in the range.
    pub fn contains(self, key: Key) -> bool {
        self.start <= key && key < self.end
    }

    /// True when every key of `other` lies in `self` (an empty `other` is covered by anything).
    pub fn covers(self, other: KeyRange) -> bool {
        other.is_empty() || (self.start <= other.start && other.end <= self.end)
    }

    /// The keys both ranges hold, or `None` when they are disjoint.
    pub fn intersect(self, other: KeyRange) -> Option<KeyRange> {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        (start < end).then_some(KeyRange { start, end })
    }

    /// Splits at `at` into `[start, at)` and `[at, end)`; `at` is clamped into the range so
    /// either half may be empty.
    pub fn split_at(self, at: Key) -> (KeyRange, KeyRange) {
        let at = at.clamp(self.start, self.end);
        (
            KeyRange {
                start: self.start,
                end: at,
            },
            KeyRange {
                start: at,
                end: self.end,
            },
        )
    }

    /// Splits into `parts` contiguous ranges of near-equal length (the first `len % parts` are
    /// one key longer). Returns an empty vector when `parts == 0`.
    pub fn split_even(self, parts: u64) -> Vec<KeyRange> {
        if parts == 0 {
            return Vec::new();
        }
        let base = self.len() / parts;
        let extra = self.len() % parts;
        let mut start = self.start;
        (0..parts)
            .map(|i| {
                let end = start + base + u64::from(i < extra);
                let r = KeyRange { start, end };
                start = end;
                r
            })
            .collect()
    }

    /// Iterates over the keys of the range in increasing order.
    pub fn keys(self) -> core::ops::Range<Key> {
        self.start..self.end
    }
}

impl fmt::Debug for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", self.start, self.end)
    }
}

impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl<'de> Deserialize<'de> for KeyRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (start, end) = <(Key, Key)>::deserialize(d)?;
        KeyRange::new(start, end).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range() -> impl Strategy<Value = KeyRange> {
        (0u64..200, 0u64..200).prop_map(|(a, b)| KeyRange::new(a.min(b), a.max(b)).unwrap())
    }

    #[test]
    fn new_refuses_reversed_bounds() {
        assert_eq!(KeyRange::new(5, 4), Err(InvalidRange { start: 5, end: 4 }));
        assert!(KeyRange::single(u64::MAX).is_err());
        assert_eq!(KeyRange::single(MAX_KEY).unwrap().len(), 1);
    }

    proptest! {
        #[test]
        fn intersect_holds_exactly_the_common_keys(a in range(), b in range(), k in 0u64..210) {
            let both = a.contains(k) && b.contains(k);
            let i = a.intersect(b);
            prop_assert_eq!(i.is_some_and(|i| i.contains(k)), both);
            if let Some(i) = i { prop_assert!(!i.is_empty()); }
        }

        #[test]
        fn split_at_partitions_the_range(r in range(), at in 0u64..210, k in 0u64..210) {
            let (lo, hi) = r.split_at(at);
            prop_assert_eq!(lo.end(), hi.start());
            prop_assert_eq!(lo.len() + hi.len(), r.len());
            prop_assert_eq!(r.contains(k), lo.contains(k) || hi.contains(k));
            prop_assert!(!(lo.contains(k) && hi.contains(k)));
        }

        #[test]
        fn split_even_partitions_into_near_equal_parts(r in range(), parts in 1u64..9) {
            let pieces = r.split_even(parts);
            prop_assert_eq!(pieces.len() as u64, parts);
            prop_assert_eq!(pieces[0].start(), r.start());
            prop_assert_eq!(pieces[pieces.len() - 1].end(), r.end());
            for w in pieces.windows(2) { prop_assert_eq!(w[0].end(), w[1].start()); }
            let max = pieces.iter().map(|p| p.len()).max().unwrap();
            let min = pieces.iter().map(|p| p.len()).min().unwrap();
            prop_assert!(max - min <= 1);
        }

        #[test]
        fn keys_iterates_every_key_once(r in range()) {
            let keys: Vec<Key> = r.keys().collect();
            prop_assert_eq!(keys.len() as u64, r.len());
            prop_assert!(keys.iter().all(|&k| r.contains(k)));
            prop_assert!(keys.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
