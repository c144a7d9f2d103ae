//! The messages nodes exchange (ARCHITECTURE.md §2) and the envelope that carries them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::consistency::Consistency;
use crate::key::{Key, KeyRange};
use crate::kv::{KvError, KvPairs, check_keys};
use crate::node::{Epoch, Iteration, NodeId, Role, Time};
use crate::ring::{Ring, RingConfig, RingError};
use crate::value::Value;
use crate::wire::seq;

/// The wire protocol version this build speaks. Frames of any other version are refused.
pub const PROTOCOL_VERSION: u16 = 1;

/// Identifies a worker's request; unique per worker, increasing.
pub type RequestId = u64;

/// Identifies one slice (one server's share) of a request.
pub type SliceId = u32;

/// One addressed message: who sends it, to whom, under which configuration epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Envelope<V: Value> {
    /// Wire protocol version; [`PROTOCOL_VERSION`] for everything this build sends.
    pub version: u16,
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// The sender's configuration epoch.
    pub epoch: Epoch,
    /// What is said.
    pub body: Message<V>,
}

impl<V: Value> Envelope<V> {
    /// An envelope of the current [`PROTOCOL_VERSION`].
    pub fn new(from: NodeId, to: NodeId, epoch: Epoch, body: Message<V>) -> Self {
        Envelope {
            version: PROTOCOL_VERSION,
            from,
            to,
            epoch,
            body,
        }
    }
}

/// Names one slice of one worker's request. The de-duplication key is `(worker, request,
/// slice)`, the worker being the envelope's sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SliceRef {
    /// The request.
    pub request: RequestId,
    /// The slice within it.
    pub slice: SliceId,
}

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

    /// The keys.
    pub fn keys(&self) -> &[Key] {
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
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
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

/// The membership and ring of one epoch, as the coordinator broadcasts it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// Version of this configuration; bumped on every membership change.
    pub epoch: Epoch,
    /// The coordinator.
    pub coordinator: NodeId,
    /// Live servers.
    #[serde(with = "seq")]
    pub servers: Vec<NodeId>,
    /// Live workers.
    #[serde(with = "seq")]
    pub workers: Vec<NodeId>,
    /// How the ring is built from `servers`.
    pub ring: RingConfig,
    /// The job's consistency model.
    pub consistency: Consistency,
}

impl ClusterConfig {
    /// The next epoch's configuration with `server` taken off the ring: its key ranges pass to
    /// the servers that follow it. Nothing moves with them, so the new owners start those
    /// ranges empty; a job changes its ring this way only before data was written to the
    /// moved ranges (ARCHITECTURE.md §8). Workers still on the old epoch are redirected and
    /// re-slice their requests.
    ///
    /// ```
    /// use pserver_core::{ClusterConfig, Consistency, NodeId, RingConfig};
    /// let config = ClusterConfig {
    ///     epoch: 1,
    ///     coordinator: NodeId(0),
    ///     servers: vec![NodeId(1), NodeId(2), NodeId(3)],
    ///     workers: vec![NodeId(4)],
    ///     ring: RingConfig::default(),
    ///     consistency: Consistency::Sequential,
    /// };
    /// let next = config.without_server(NodeId(1)).unwrap();
    /// assert_eq!((next.epoch, &next.servers[..]), (2, &[NodeId(2), NodeId(3)][..]));
    /// // The default ring keeps one replica besides the primary: one server is too few.
    /// assert!(next.without_server(NodeId(2)).is_err());
    /// ```
    pub fn without_server(&self, server: NodeId) -> Result<ClusterConfig, RingError> {
        if !self.servers.contains(&server) {
            return Err(RingError::UnknownServer(server));
        }
        let servers: Vec<NodeId> = self
            .servers
            .iter()
            .copied()
            .filter(|&s| s != server)
            .collect();
        Ring::new(servers.iter().copied(), self.ring)?;
        Ok(ClusterConfig {
            epoch: self.epoch + 1,
            servers,
            ..self.clone()
        })
    }
}

/// A worker's update for one slice of a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct Push<V: Value> {
    /// Which slice this is.
    pub slice: SliceRef,
    /// The worker's iteration the update belongs to.
    pub iteration: Iteration,
    /// Every push request of this worker below this id is acknowledged and will never be sent
    /// again, so servers may forget them: this keeps de-duplication state bounded.
    pub settled_below: RequestId,
    /// The update.
    pub kvs: KvPairs<V>,
}

/// A worker's read of one slice of a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pull {
    /// Which slice this is.
    pub slice: SliceRef,
    /// The worker's iteration; the server holds the pull until the consistency model allows it.
    pub iteration: Iteration,
    /// The keys wanted.
    pub keys: KeySelection,
}

/// A server's answer to a [`Pull`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct PullReply<V: Value> {
    /// The slice answered.
    pub slice: SliceRef,
    /// Every worker's pushes for iterations below this one are included.
    pub complete_below: Iteration,
    /// The values, in key order.
    pub kvs: KvPairs<V>,
    /// `None`: the answer is whole. `Some(k)`: the answer to a range pull was too large for one
    /// message and covers only the keys below `k`; the worker asks again from `k` on.
    pub resume: Option<Key>,
}

/// Which of a worker's requests a server has applied, replicated and transferred with the data
/// so that de-duplication survives fail-over.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DedupeRecord {
    /// The worker.
    pub worker: NodeId,
    /// Every request at or below this id has been applied.
    pub high_water: RequestId,
    /// Slices above the high-water mark applied out of order.
    #[serde(with = "seq")]
    pub above: Vec<SliceRef>,
}

/// A primary's aggregated update for a range, sent to the range's replicas.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct Replicate<V: Value> {
    /// The replicated range.
    pub range: KeyRange,
    /// Position in the range's update order; replicas apply in `seq` order.
    pub seq: u64,
    /// The aggregated update, already passed through the primary's updater.
    pub update: KvPairs<V>,
    /// The de-duplication state after this update.
    #[serde(with = "seq")]
    pub dedupe: Vec<DedupeRecord>,
}

/// A worker's progress on a key range, as a server's clock records it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClockRecord {
    /// The worker.
    pub worker: NodeId,
    /// `(range, iteration)` segments of the worker's range clock.
    #[serde(with = "seq")]
    pub segments: Vec<(KeyRange, Iteration)>,
}

/// A chunk of a range moving to a new owner (recovery, re-replication, a joining server).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct Transfer<V: Value> {
    /// The range being moved.
    pub range: KeyRange,
    /// Chunk number within the transfer, from 0.
    pub chunk: u32,
    /// True on the last chunk.
    pub last: bool,
    /// Parameters of this chunk.
    pub data: KvPairs<V>,
    /// De-duplication state of the range.
    #[serde(with = "seq")]
    pub dedupe: Vec<DedupeRecord>,
    /// Workers' clocks on the range.
    #[serde(with = "seq")]
    pub clocks: Vec<ClockRecord>,
}

/// Every message body of the protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub enum Message<V: Value> {
    /// A node announces itself to the coordinator.
    Register {
        /// What the node will do.
        role: Role,
    },
    /// The coordinator's configuration for an epoch.
    Config(ClusterConfig),
    /// A node asks the coordinator for the current configuration (after a redirect).
    ConfigRequest,
    /// Liveness signal to the coordinator.
    Heartbeat {
        /// The sender's time when it sent the heartbeat (for diagnostics; not compared across
        /// nodes).
        sent_at: Time,
    },
    /// A worker's update slice.
    Push(Push<V>),
    /// A server acknowledges a push slice (also re-sent for a duplicate).
    PushAck(SliceRef),
    /// A worker's read slice.
    Pull(Pull),
    /// A server's answer to a pull slice.
    PullReply(PullReply<V>),
    /// The receiver is not the primary of the slice at the sender's epoch.
    Redirect {
        /// The slice refused.
        slice: SliceRef,
        /// The server's epoch; the worker fetches a configuration at least this new.
        epoch: Epoch,
    },
    /// A worker has finished every iteration below `finished_below` (all their pushes acked,
    /// and it advanced past them). Re-sent until acknowledged.
    Progress {
        /// Every iteration below this one is finished.
        finished_below: Iteration,
    },
    /// A server has recorded a worker's progress up to `finished_below`.
    ProgressAck {
        /// The progress recorded.
        finished_below: Iteration,
    },
    /// A primary's update for its replicas.
    Replicate(Replicate<V>),
    /// A replica has applied updates of a range up to `seq`.
    ReplicateAck {
        /// The range.
        range: KeyRange,
        /// Highest sequence number applied.
        seq: u64,
    },
    /// A chunk of a range moving to a new owner.
    Transfer(Transfer<V>),
    /// The new owner has stored a transfer chunk.
    TransferAck {
        /// The range.
        range: KeyRange,
        /// The chunk stored.
        chunk: u32,
    },
}

impl<V: Value> Message<V> {
    /// Number of message kinds this version knows; the wire tags are `0..KINDS`.
    pub const KINDS: u32 = 15;
}
