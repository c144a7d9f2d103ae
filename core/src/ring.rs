//! Consistent hashing of the key space onto servers, with virtual nodes and replicas.
//!
//! Keys are not hashed: the ring *is* the key space, so that a key range maps to a few
//! contiguous server ranges and range push/pull stays ranged (the paper's §4.3). Each server
//! places `vnodes` points at seeded hash positions within the job's key space `[0, K)`
//! ([`RingConfig::key_space`], the whole `[0, u64::MAX)` by default): a job whose keys are the
//! features `0..K` of its data says so, or its workers say it when they register
//! ([`crate::JobSpec::keys_below`]), and its keys spread over every server instead of all
//! falling below the lowest of points strewn over 2^64. A point owns the keys from the previous
//! point up to itself, wrapping around (keys at or above `K` belong to the first point). A key's primary is the server of the first point above
//! it, and its `k` replicas are the next `k` distinct servers met walking on from that point, so
//! when a server leaves, each of its ranges falls to its first replica. A server's points
//! depend only on the seed and its own id, so adding or removing a server moves only the ranges
//! next to that server's points.

use core::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::hash::hash_words;
use crate::ids::NodeId;
use crate::key::{Key, KeyRange};

/// Most virtual nodes a server may place. Rings are rebuilt from configurations received over
/// the network, so their size must be bounded.
pub const MAX_VNODES: u32 = 4096;

/// Most servers a ring may hold.
pub const MAX_SERVERS: usize = 65_536;

/// How a ring is built: everything besides the server list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RingConfig {
    /// Virtual nodes per server (1..=[`MAX_VNODES`]). More virtual nodes even out the shares.
    pub vnodes: u32,
    /// Replicas `k` per key range besides the primary (`k < servers`).
    pub replicas: u32,
    /// Seed of the point placement. Every node of a cluster must use the same seed.
    pub seed: u64,
    /// The end `K` of the key space `[0, K)` the job's keys lie in: points are placed there.
    /// Keys at or above it still have owners, those of the keys from the last point on.
    /// Default `u64::MAX`, the whole key space.
    pub key_space: Key,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            vnodes: 64,
            replicas: 1,
            seed: 0,
            key_space: u64::MAX,
        }
    }
}

impl RingConfig {
    /// Whether `servers` servers can hold the `k` replicas asked for, as a job's servers must
    /// when it starts.
    pub fn check_servers(&self, servers: usize) -> Result<(), RingError> {
        if self.replicas as usize >= servers {
            return Err(RingError::TooFewServers {
                replicas: self.replicas,
                servers,
            });
        }
        Ok(())
    }
}

/// The replicas `servers` servers can hold of the `asked` for: all but the primary's.
pub(crate) fn held_replicas(asked: u32, servers: usize) -> u32 {
    let others = u32::try_from(servers.saturating_sub(1)).unwrap_or(u32::MAX);
    asked.min(others)
}

/// Why a ring could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RingError {
    /// A ring needs at least one server.
    #[error("a ring needs at least one server")]
    NoServers,
    /// The same server id was given twice.
    #[error("server {0} appears twice in the ring")]
    DuplicateServer(NodeId),
    /// Asked to remove a server that the ring does not hold.
    #[error("server {0} is not in the ring")]
    UnknownServer(NodeId),
    /// `replicas` must be smaller than the number of servers.
    #[error("{replicas} replicas need at least {} servers, but the ring has {servers}", u64::from(*replicas) + 1)]
    TooFewServers {
        /// Replicas asked for.
        replicas: u32,
        /// Servers available.
        servers: usize,
    },
    /// `vnodes` was 0 or above [`MAX_VNODES`].
    #[error("virtual nodes per server must be between 1 and {MAX_VNODES}, got {0}")]
    BadVnodes(u32),
    /// The key space `[0, 0)` holds no key.
    #[error("the key space must hold at least one key")]
    EmptyKeySpace,
    /// More than [`MAX_SERVERS`] servers.
    #[error("a ring holds at most {MAX_SERVERS} servers, got {0}")]
    TooManyServers(usize),
}

/// A contiguous run of keys with the same owners.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Segment {
    start: Key,
    /// Primary first, then the `k` replicas; all distinct.
    owners: Vec<NodeId>,
}

/// The key space partitioned onto servers: for every key, one primary and `k` distinct replicas.
///
/// Deterministic: the same servers and [`RingConfig`] give the same ring on every node.
///
/// ```
/// use pserver_core::NodeId;
/// use pserver_core::ring::{Ring, RingConfig};
/// let servers = (0..4).map(NodeId);
/// let config = RingConfig { vnodes: 16, replicas: 1, seed: 7, ..RingConfig::default() };
/// let ring = Ring::new(servers, config)?;
/// let owners = ring.owners(42);
/// assert_eq!(owners.len(), 2);
/// assert_ne!(owners[0], owners[1]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Ring {
    config: RingConfig,
    /// Sorted, distinct.
    servers: Vec<NodeId>,
    /// Sorted by start; the first starts at 0; neighbours have different owners.
    segments: Vec<Segment>,
}

impl Ring {
    /// Builds the ring of `servers` under `config`, with every key held by its primary and
    /// `k` replicas: `k` must be below the number of servers.
    pub fn new(
        servers: impl IntoIterator<Item = NodeId>,
        config: RingConfig,
    ) -> Result<Ring, RingError> {
        let ring = Ring::surviving(servers, config)?;
        config.check_servers(ring.servers.len())?;
        Ok(ring)
    }

    /// Builds the ring of the servers a job has left, which may be too few for its `k`
    /// replicas: each key is held by its primary and as many of its replicas as the other
    /// servers allow ([`Ring::replicas_held`]). The job goes on with fewer copies than asked
    /// after crashes rather than stall (ARCHITECTURE.md §8), and the ring holds `k` again
    /// once enough servers join, with points placed as they would have been all along.
    pub fn surviving(
        servers: impl IntoIterator<Item = NodeId>,
        config: RingConfig,
    ) -> Result<Ring, RingError> {
        let mut servers: Vec<NodeId> = servers.into_iter().collect();
        servers.sort_unstable();
        if let Some(w) = servers.windows(2).find(|w| w[0] == w[1]) {
            return Err(RingError::DuplicateServer(w[0]));
        }
        if servers.is_empty() {
            return Err(RingError::NoServers);
        }
        if servers.len() > MAX_SERVERS {
            return Err(RingError::TooManyServers(servers.len()));
        }
        if config.vnodes == 0 || config.vnodes > MAX_VNODES {
            return Err(RingError::BadVnodes(config.vnodes));
        }
        if config.key_space == 0 {
            return Err(RingError::EmptyKeySpace);
        }
        let segments = build_segments(&servers, config);
        Ok(Ring {
            config,
            servers,
            segments,
        })
    }

    /// The configuration the ring was built from.
    pub fn config(&self) -> RingConfig {
        self.config
    }

    /// The replicas each key has besides its primary: the `k` asked for, or fewer where the
    /// ring has too few servers for them ([`Ring::surviving`]).
    pub fn replicas_held(&self) -> u32 {
        held_replicas(self.config.replicas, self.servers.len())
    }

    /// The servers of the ring, sorted.
    pub fn servers(&self) -> &[NodeId] {
        &self.servers
    }

    /// The same ring with `server` added.
    pub fn with_server(&self, server: NodeId) -> Result<Ring, RingError> {
        Ring::new(self.servers.iter().copied().chain([server]), self.config)
    }

    /// The same ring with `server` removed.
    pub fn without_server(&self, server: NodeId) -> Result<Ring, RingError> {
        if !self.servers.contains(&server) {
            return Err(RingError::UnknownServer(server));
        }
        Ring::new(
            self.servers.iter().copied().filter(|&s| s != server),
            self.config,
        )
    }

    fn segment_index(&self, key: Key) -> usize {
        // segments[0].start == 0, so the partition point is at least 1.
        self.segments.partition_point(|s| s.start <= key) - 1
    }

    /// Primary first, then the `k` replicas of `key`.
    pub fn owners(&self, key: Key) -> &[NodeId] {
        &self.segments[self.segment_index(key)].owners
    }

    /// The primary server of `key`.
    pub fn primary(&self, key: Key) -> NodeId {
        self.owners(key)[0]
    }

    /// The `k` replicas of `key` (excluding its primary).
    pub fn replicas(&self, key: Key) -> &[NodeId] {
        &self.owners(key)[1..]
    }

    /// Every segment of the key space with its owners (primary first), in key order.
    pub fn segments(&self) -> impl Iterator<Item = (KeyRange, &[NodeId])> + '_ {
        self.segments_in(KeyRange::FULL)
    }

    /// The segments overlapping `range`, clipped to it, in key order.
    pub fn segments_in(&self, range: KeyRange) -> impl Iterator<Item = (KeyRange, &[NodeId])> + '_ {
        let first = if range.is_empty() {
            self.segments.len()
        } else {
            self.segment_index(range.start())
        };
        self.segments[first..]
            .iter()
            .enumerate()
            .map_while(move |(i, seg)| {
                let end = self
                    .segments
                    .get(first + i + 1)
                    .map_or(u64::MAX, |next| next.start);
                let whole = KeyRange::new(seg.start, end).ok()?;
                whole.intersect(range).map(|r| (r, &seg.owners[..]))
            })
    }

    /// The parts of the key space whose primary differs in `new`, as `(range, old primary, new
    /// primary)` in key order: what a membership change moves.
    pub fn primary_changes<'a>(
        &'a self,
        new: &'a Ring,
    ) -> impl Iterator<Item = (KeyRange, NodeId, NodeId)> + 'a {
        self.segments().flat_map(move |(range, owners)| {
            new.segments_in(range)
                .filter(move |(_, n)| n[0] != owners[0])
                .map(move |(part, n)| (part, owners[0], n[0]))
        })
    }

    /// Number of keys each server holds as primary, for every server of the ring.
    pub fn primary_shares(&self) -> Vec<(NodeId, u64)> {
        let mut shares: Vec<(NodeId, u64)> = self.servers.iter().map(|&s| (s, 0)).collect();
        for (range, owners) in self.segments() {
            if let Ok(i) = self.servers.binary_search(&owners[0]) {
                shares[i].1 += range.len();
            }
        }
        shares
    }
}

fn build_segments(servers: &[NodeId], config: RingConfig) -> Vec<Segment> {
    let mut points: Vec<(Key, NodeId)> = servers
        .iter()
        .flat_map(|&s| {
            (0..config.vnodes).map(move |v| {
                let h = hash_words(config.seed, &[u64::from(s.0), u64::from(v)]);
                // Positions live in [0, K), the job's key space.
                (h % config.key_space, s)
            })
        })
        .collect();
    points.sort_unstable();
    // On the (astronomically unlikely) collision the lower server id keeps the point, on every
    // node alike.
    points.dedup_by_key(|p| p.0);

    let want = held_replicas(config.replicas, servers.len()) as usize + 1;
    let owners_from = |i: usize| {
        let mut owners = Vec::with_capacity(want);
        for j in 0..points.len() {
            let s = points[(i + j) % points.len()].1;
            if !owners.contains(&s) {
                owners.push(s);
                if owners.len() == want {
                    break;
                }
            }
        }
        owners
    };

    let mut segments: Vec<Segment> = Vec::with_capacity(points.len() + 1);
    let mut push = |start: Key, owners: Vec<NodeId>| match segments.last() {
        Some(last) if last.owners == owners => {}
        _ => segments.push(Segment { start, owners }),
    };
    // A point owns the keys from the previous point up to itself, so a removed point's keys
    // fall to the next point: the first replica, which already holds them.
    if points[0].0 > 0 {
        push(0, owners_from(0));
    }
    for i in 0..points.len() {
        push(points[i].0, owners_from((i + 1) % points.len()));
    }
    segments
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("config", &self.config)
            .field("servers", &self.servers)
            .field("segments", &self.segments.len())
            .finish()
    }
}
