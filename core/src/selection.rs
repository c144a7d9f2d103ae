//! What a pull asks for: a list of keys, or key ranges (ARCHITECTURE.md §3).

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::forms::{deserialize_keys, seq, serialize_keys};
use crate::key::{Key, KeyRange};
use crate::kv::{KvError, check_keys};

/// Strictly increasing keys (at most [`crate::MAX_KEY`]), delta-encoded on the wire.
///
/// Shared, not copied, when cloned: a pull's keys go into every (re)transmission of its slice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeyList(Arc<Vec<Key>>);

impl KeyList {
    /// Validates that `keys` are strictly increasing and not reserved.
    pub fn new(keys: Vec<Key>) -> Result<Self, KvError> {
        check_keys(&keys)?;
        Ok(KeyList(Arc::new(keys)))
    }

    pub(crate) fn from_validated(keys: Vec<Key>) -> Self {
        KeyList(Arc::new(keys))
    }

    /// A list over keys already validated, shared.
    pub(crate) fn from_shared(keys: Arc<Vec<Key>>) -> Self {
        KeyList(keys)
    }

    /// The keys.
    pub fn keys(&self) -> &[Key] {
        &self.0
    }

    /// The shared key storage, for a vector over the same keys.
    pub(crate) fn shared(&self) -> &Arc<Vec<Key>> {
        &self.0
    }
}

/// Non-empty, sorted, disjoint key ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct RangeList(Vec<KeyRange>);

/// Ranges given to [`RangeList::new`] were empty, unsorted or overlapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ranges must be non-empty, sorted and disjoint; range {index} breaks that")]
pub struct BadRangeList {
    /// Position of the offending range.
    pub index: usize,
}

impl RangeList {
    /// The parts of these ranges at or above `from`.
    pub fn from_key(&self, from: Key) -> RangeList {
        let ranges = self
            .0
            .iter()
            .filter(|r| r.end() > from)
            .filter_map(|r| KeyRange::new(r.start().max(from), r.end()).ok())
            .collect();
        RangeList(ranges)
    }

    /// Validates that the ranges are non-empty, sorted and disjoint.
    pub fn new(ranges: Vec<KeyRange>) -> Result<Self, BadRangeList> {
        for (index, r) in ranges.iter().enumerate() {
            let after_previous = index == 0 || ranges[index - 1].end() <= r.start();
            if r.is_empty() || !after_previous {
                return Err(BadRangeList { index });
            }
        }
        Ok(RangeList(ranges))
    }

    /// The ranges, sorted.
    pub fn ranges(&self) -> &[KeyRange] {
        &self.0
    }

    /// True when some range holds `key`.
    pub fn contains(&self, key: Key) -> bool {
        let i = self.0.partition_point(|r| r.end() <= key);
        self.0.get(i).is_some_and(|r| r.contains(key))
    }
}

impl<'de> Deserialize<'de> for RangeList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ranges: Vec<KeyRange> = seq::deserialize(d)?;
        RangeList::new(ranges).map_err(serde::de::Error::custom)
    }
}

/// What a pull asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KeySelection {
    /// Every stored key of these ranges (dense pulls).
    Ranges(RangeList),
    /// Exactly these keys (sparse pulls: the features a worker's data touches). Keys the server
    /// has never seen read as zero.
    Keys(KeyList),
}

impl KeySelection {
    /// The smallest range holding every key asked for; `None` when nothing is asked.
    pub fn span(&self) -> Option<KeyRange> {
        let (first, end) = match self {
            KeySelection::Keys(list) => {
                let keys = list.keys();
                (*keys.first()?, keys.last()?.checked_add(1)?)
            }
            KeySelection::Ranges(list) => {
                let ranges = list.ranges();
                (ranges.first()?.start(), ranges.last()?.end())
            }
        };
        KeyRange::new(first, end).ok()
    }
}

/// Wire form of [`KeyList`]: `(count, key deltas as bytes)`.
impl Serialize for KeyList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_keys(self.keys(), s)
    }
}

impl<'de> Deserialize<'de> for KeyList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_keys(d).map(KeyList::from_validated)
    }
}
