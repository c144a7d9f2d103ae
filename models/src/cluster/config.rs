//! What a cluster model is made of.

use core::fmt;
use core::str::FromStr;

use pserver_core::filter::{Filters, KeyCaching};
use pserver_core::node::NodeLayout;
use pserver_core::pace::{Detection, StragglerPolicy, TauRange};
use pserver_core::ring::{Ring, RingConfig};
use pserver_core::{Consistency, Iteration, JobSpec, Key, NodeId, Timing};

/// How the model's network behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NetworkKind {
    /// Per-pair FIFO and reliable, like TCP.
    Ordered,
    /// Unordered, duplicating and lossy, like UDP.
    Lossy,
}

impl fmt::Display for NetworkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetworkKind::Ordered => "ordered",
            NetworkKind::Lossy => "lossy",
        })
    }
}

impl FromStr for NetworkKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ordered" => Ok(NetworkKind::Ordered),
            "lossy" => Ok(NetworkKind::Lossy),
            _ => Err(format!("unknown network `{s}`: expected ordered or lossy")),
        }
    }
}

/// What the coordinator may decide about stragglers in a bounded-delay model
/// ([`ClusterModelConfig::pace`], ARCHITECTURE.md §9).
///
/// Time is not modelled, and heartbeats are left out unless crashes are, so workers report no
/// positions: the coordinator's detection is driven by model timers instead
/// ([`crate::cluster::ModelTimer::Straggle`], [`crate::cluster::ModelTimer::Calm`]), which
/// hand it positions in which one worker lags, or none does, and run its own failure check, so
/// that the core's `check_pace` decides and publishes. Safety must hold whatever positions the
/// coordinator believes, so these are as good as real ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PaceModel {
    /// A straggler is told to skip to the others' iteration ([`StragglerPolicy::skip_ahead`]).
    pub skip_ahead: bool,
    /// The staleness bound rises by one at a check that finds a straggler and falls by one at
    /// a check that finds none ([`StragglerPolicy::adaptive_tau`]), within this range.
    pub adaptive_tau: Option<TauRange>,
}

impl PaceModel {
    /// Skip-ahead alone.
    pub const SKIP_AHEAD: PaceModel = PaceModel {
        skip_ahead: true,
        adaptive_tau: None,
    };

    /// Adaptive tau alone.
    pub const ADAPTIVE_TAU: PaceModel = PaceModel {
        skip_ahead: false,
        // The job's bound is 1 ([`ClusterModelConfig::adaptive_tau`]): one more or one less.
        adaptive_tau: Some(TauRange { min: 0, max: 2 }),
    };
}

/// The shape of a cluster model: deliberately tiny, because every actor multiplies the states.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterModelConfig {
    /// Servers.
    pub servers: usize,
    /// Workers, each running `iterations` of push-then-pull.
    pub workers: usize,
    /// Keys every worker pushes and pulls (spread over the servers).
    pub keys: u64,
    /// Iterations per worker.
    pub iterations: u32,
    /// The job's consistency model.
    pub consistency: Consistency,
    /// The network.
    pub network: NetworkKind,
    /// Actors that may crash. With 0, failure detection is left out of the model.
    pub crashes: usize,
    /// Model the registration phase. Off, the cluster starts with epoch 1 in force
    /// ([`pserver_core::node::Coordinator::bootstrapped`]), which keeps the state space small.
    pub registration: bool,
    /// Start with the ring already changed on the coordinator and the servers: the owner of the
    /// first key was taken off the ring ([`pserver_core::wire::ClusterConfig::without_server`], epoch
    /// 2) before any data was written, while the workers still hold epoch 1. Their first
    /// requests are redirected and re-sliced. Implies starting configured (no registration).
    pub ring_change: bool,
    /// Replicas of every key range ([`RingConfig::replicas`]). With replicas, only servers
    /// crash (the model's crashes are the servers' failures that replication is for), and the
    /// replication properties (`durability`, `single-owner`, `replica-convergence`) are
    /// checked.
    pub replicas: u32,
    /// Model retransmission timeouts that double (lossy network only): each worker keeps a
    /// clock that a retransmission timer moves to its deadline, and retransmits at most
    /// [`MAX_RETRANSMISSIONS`] times, which keeps the clocks, and so the state space, finite.
    pub backoff: bool,
    /// Servers that join while the job runs: server processes outside the first ring (node ids
    /// after the workers', [`ClusterModelConfig::joiner_ids`]) that register with the
    /// coordinator when the checker delivers their `Register`, at any point of the run. The
    /// coordinator lists them as joining, they copy the ranges the next ring gives them and
    /// follow their updates, and once they caught up the ring switches
    /// ([`pserver_core::node::Phase::Reconfiguring`]). Ranges move with their data, with or without
    /// replicas, so the replication properties are checked
    /// ([`ClusterModelConfig::copies_ranges`]). Not with `registration` or `ring_change`: a
    /// join is into a job that runs on its first configuration.
    pub joins: usize,
    /// Straggler detection, with skip-ahead and/or adaptive tau ([`PaceModel`]); `None`: off.
    /// Once per run, at a point the checker chooses, the coordinator checks the pace and
    /// finds one worker lagging (in iteration 0 while the others report
    /// [`STRAGGLER_OTHERS_IN`]), or with adaptive tau possibly nobody. It decides only under
    /// bounded delay.
    pub pace: Option<PaceModel>,
    /// Key caching ([`pserver_core::filter::KeyCaching`], lists kept per peer): workers name
    /// the key lists they sent a server before, servers answer pulls without keys. So that
    /// lists differ, each iteration's push leaves out one key ([`ClusterModelConfig::pushes`]).
    pub key_caching: Option<KeyCaching>,
}

/// The iteration the other workers report when one is found straggling in iteration 0
/// ([`ClusterModelConfig::pace`]): with skip-ahead, the iteration the straggler skips to. One,
/// the least that moves a worker forward, leaves the most iterations after the skip in which a
/// pull can miss the push of an iteration the skip did not cover.
pub const STRAGGLER_OTHERS_IN: Iteration = 1;

/// Retransmission timer firings each worker gets when [`ClusterModelConfig::backoff`] is on.
pub const MAX_RETRANSMISSIONS: u8 = 2;

impl Default for ClusterModelConfig {
    fn default() -> Self {
        ClusterModelConfig {
            servers: 2,
            workers: 2,
            keys: 2,
            iterations: 2,
            consistency: Consistency::Sequential,
            network: NetworkKind::Lossy,
            crashes: 0,
            registration: false,
            ring_change: false,
            replicas: 0,
            backoff: false,
            joins: 0,
            pace: None,
            key_caching: None,
        }
    }
}

impl ClusterModelConfig {
    /// The replication model's fail-over configuration, the first of
    /// [`ClusterModelConfig::replication_suite`]: three servers, each key range with a primary
    /// and one replica, one server crash with failure detection, on the ordered network. One
    /// worker pushes one key in one iteration and pulls it, under eventual consistency: the
    /// smallest job in which a push is replicated, its primary may die before or after
    /// acknowledging it, the range fails over to the replica and a new replica is refilled with
    /// a copy, and which is still checked exhaustively in minutes (sequential consistency adds
    /// a `Progress` to every server and an `ApplyBelow` step on every shard, and does not fit
    /// in 8 GB). docs/verification.md, "State spaces", has the measurements.
    pub fn replication() -> Self {
        ClusterModelConfig {
            servers: 3,
            workers: 1,
            keys: 1,
            iterations: 1,
            consistency: Consistency::Eventual,
            network: NetworkKind::Ordered,
            crashes: 1,
            replicas: 1,
            ..ClusterModelConfig::default()
        }
    }

    /// The smallest replicated cluster a user can configure, the second of
    /// [`ClusterModelConfig::replication_suite`]: two servers and one replica, one of which
    /// crashes, with the job of [`ClusterModelConfig::replication`]. The server left holds
    /// every range alone, with no replica to send to (`Ring::surviving`), and must still hold
    /// every push acknowledged before the crash.
    pub fn replication_pair() -> Self {
        ClusterModelConfig {
            servers: 2,
            ..ClusterModelConfig::replication()
        }
    }

    /// The replication model's join configuration, the third of
    /// [`ClusterModelConfig::replication_suite`]: one server holds the whole key space, and a
    /// second server registers at a point the checker chooses and takes the key's range over
    /// (the ring's seed makes it the key's primary), with the same job as
    /// [`ClusterModelConfig::replication`]. The range is copied to the new server while pushes
    /// go on, the new server follows its updates and counts for acknowledgements, the ring
    /// switches once it caught up, and the worker resends what it has not seen acknowledged to
    /// the new primary: the smallest shape in which a copy is followed by a resend of a push
    /// the copy already holds. No replicas: with one replica per range on two servers, a join
    /// exceeded 48 million distinct states (docs/verification.md, "The replication model").
    pub fn replication_join() -> Self {
        ClusterModelConfig {
            servers: 1,
            crashes: 0,
            replicas: 0,
            joins: 1,
            ..ClusterModelConfig::replication()
        }
    }

    /// Skip-ahead ([`PaceModel::SKIP_AHEAD`]): one server, two workers, one key, two
    /// iterations under bounded delay 0 on the ordered network. A worker skipped past
    /// iteration 0 pushes in iteration 1, and the other worker's pull in iteration 2 needs that
    /// push: the fewest iterations in which a server that counts the skip as reaching further
    /// than the configuration says answers a pull too early. docs/verification.md, "State
    /// spaces", has the measurements.
    pub fn skip_ahead() -> Self {
        ClusterModelConfig {
            servers: 1,
            keys: 1,
            iterations: 2,
            consistency: Consistency::BoundedDelay(0),
            network: NetworkKind::Ordered,
            pace: Some(PaceModel::SKIP_AHEAD),
            ..ClusterModelConfig::default()
        }
    }

    /// Key caching ([`ClusterModelConfig::key_caching`]): one server, one worker, two keys
    /// over two iterations under sequential consistency, on `network`. The worker pushes
    /// each key alone in turn and pulls both, so it sends the server three lists of keys, two
    /// of the same length, and names each the second time it sends it; on the lossy network
    /// a named slice may overtake the one that carried its list, and the server asks for the
    /// list again.
    pub fn key_caching(network: NetworkKind) -> Self {
        ClusterModelConfig {
            servers: 1,
            workers: 1,
            keys: 2,
            iterations: 2,
            consistency: Consistency::Sequential,
            network,
            key_caching: KeyCaching::new(2),
            ..ClusterModelConfig::default()
        }
    }

    /// Adaptive tau ([`PaceModel::ADAPTIVE_TAU`]): one server, two workers, one key, one
    /// iteration under bounded delay 1 on the ordered network, so that the coordinator's check
    /// raises the bound to 2 when it finds a straggler and lowers it to 0 when it finds none.
    /// Under the lowered bound the pull of iteration 1 needs every worker's push of iteration
    /// 0, which a server that holds pulls to one more than the bound does not wait for; and a
    /// worker that entered iteration 1 under the job's bound is still in it.
    pub fn adaptive_tau() -> Self {
        ClusterModelConfig {
            servers: 1,
            keys: 1,
            iterations: 1,
            consistency: Consistency::BoundedDelay(1),
            network: NetworkKind::Ordered,
            pace: Some(PaceModel::ADAPTIVE_TAU),
            ..ClusterModelConfig::default()
        }
    }

    /// What `pserver check replication` checks, each configuration exhaustively:
    /// fail-over ([`ClusterModelConfig::replication`]), fail-over of two servers to one
    /// ([`ClusterModelConfig::replication_pair`]) and a join
    /// ([`ClusterModelConfig::replication_join`]). Together they would be checked in one
    /// model only at a size far beyond minutes: a join alone multiplies the states of the job
    /// it runs beside by hundreds.
    pub fn replication_suite() -> Vec<Self> {
        vec![
            Self::replication(),
            Self::replication_pair(),
            Self::replication_join(),
        ]
    }

    /// Whether key ranges are copied between servers, by replication or to servers that join:
    /// then every holder of a range holds its own copy of the same pushes, properties judge
    /// each holder, and the replication properties (`durability`, `single-owner`,
    /// `replica-convergence`) are checked.
    pub fn copies_ranges(&self) -> bool {
        self.replicas > 0 || self.joins > 0
    }

    /// How the model numbers its actors (actor index = node id).
    pub fn layout(&self) -> NodeLayout {
        NodeLayout {
            servers: self.servers,
            workers: self.workers,
        }
    }

    /// The coordinator's node id (actor 0).
    pub fn coordinator(&self) -> NodeId {
        self.layout().coordinator()
    }

    /// Server node ids (actors `1..=servers`).
    pub fn server_ids(&self) -> impl Iterator<Item = NodeId> {
        self.layout().servers()
    }

    /// Worker node ids (the actors after the servers).
    pub fn worker_ids(&self) -> impl Iterator<Item = NodeId> {
        self.layout().workers()
    }

    /// Node ids of the servers that join while the job runs (the actors after the workers).
    pub fn joiner_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        let first = (self.servers + self.workers + 1) as u32;
        (first..first + self.joins as u32).map(NodeId)
    }

    /// Every server node id: those of the first ring, then those that join.
    pub fn all_server_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        self.layout().servers().chain(self.joiner_ids())
    }

    /// Whether the actor at `index` (= node id) is a server, of the first ring or joining.
    pub fn is_server_actor(&self, index: usize) -> bool {
        self.all_server_ids().any(|id| id.0 as usize == index)
    }

    /// The keys, spread evenly over the key space.
    pub fn key_list(&self) -> Vec<Key> {
        let stride = (u64::MAX - 1) / self.keys.max(1);
        (0..self.keys).map(|i| i * stride).collect()
    }

    /// The job every actor is built from: the model's shape, ring, timing and row width, and
    /// the defaults for everything else.
    pub fn job(&self) -> JobSpec {
        let mut job = JobSpec::new(self.servers, self.workers);
        job.consistency = self.consistency;
        job.ring = self.ring();
        job.timing = self.timing();
        job.width = self.width();
        if let Some(pace) = self.pace {
            job.stragglers = self.stragglers(pace);
        }
        if let Some(caching) = self.key_caching {
            job.filters = Filters::key_caching(caching);
        }
        job
    }

    /// Whether the push of `iteration` goes to the key at `index` of
    /// [`ClusterModelConfig::key_list`]: every key, but with key caching and two keys or more
    /// every iteration leaves out the key at `iteration` modulo the keys, so that a worker
    /// sends each server different lists.
    pub fn pushes(&self, iteration: Iteration, index: usize) -> bool {
        !(self.key_caching.is_some()
            && self.keys >= 2
            && index as u64 == u64::from(iteration) % self.keys)
    }

    /// The job's straggler policy for `pace`. Detection flags any worker behind the others at
    /// all (a lag of 0), so that one iteration behind is enough to skip.
    fn stragglers(&self, pace: PaceModel) -> StragglerPolicy {
        let mut policy = StragglerPolicy::default();
        policy.detect = Some(Detection::lagging(0));
        policy.skip_ahead = pace.skip_ahead;
        policy.adaptive_tau = pace.adaptive_tau;
        policy
    }

    /// Timing for the checker, where a node is declared dead after two silent failure checks
    /// and durations are otherwise irrelevant (the checker fires any set timer at any point);
    /// nodes do not watch the coordinator.
    /// Without [`ClusterModelConfig::backoff`] there is no backoff, so no attempt counters in
    /// the state; with it the timeout is 1, then 2.
    pub fn timing(&self) -> Timing {
        let mut t = Timing::default();
        t.heartbeat_interval = 1;
        t.heartbeat_timeout = 1;
        t.coordinator_timeout = 0;
        t.register_retry = 1;
        let (rto, doublings) = if self.backoff { (1, 1) } else { (0, 0) };
        t.rto_initial = rto;
        t.rto_max = rto << doublings;
        t.max_doublings = doublings;
        t
    }

    /// Values per key: one column per (worker, iteration), so that a value says exactly which
    /// pushes it includes.
    pub fn width(&self) -> usize {
        (self.workers * self.iterations as usize).max(1)
    }

    /// The column of the push of the worker at `index` (0-based) in `iteration`.
    pub fn column(&self, index: usize, iteration: u32) -> usize {
        index * self.iterations as usize + iteration as usize
    }

    /// The 0-based index of worker `id`.
    pub fn worker_index(&self, id: NodeId) -> Option<usize> {
        self.worker_ids().position(|w| w == id)
    }

    /// A ring whose seed spreads the keys over as many servers as they can reach, so that
    /// requests really are sliced. With replicas, one virtual node per server: every segment
    /// is a shard with its own update order, and in sequential mode every primary shard takes
    /// an `ApplyBelow` step for every iteration and streams it to its replica, so each segment
    /// multiplies the messages in flight. With [`ClusterModelConfig::joins`], the seed also
    /// makes the first server to join the primary of the first key once every joiner is on the
    /// ring: the key's range moves to a server that starts without it.
    pub fn ring(&self) -> RingConfig {
        let keys = self.key_list();
        let joined: Vec<NodeId> = self.all_server_ids().collect();
        let first_joiner = self.joiner_ids().next();
        let spread = |seed: u64| {
            let config = RingConfig {
                vnodes: if self.copies_ranges() { 1 } else { 2 },
                replicas: self.replicas,
                seed,
                ..RingConfig::default()
            };
            let Ok(ring) = Ring::new(self.server_ids(), config) else {
                return (0, false, config);
            };
            let mut owners: Vec<NodeId> = keys.iter().map(|&k| ring.primary(k)).collect();
            owners.sort();
            owners.dedup();
            let moves_to_joiner = first_joiner.is_none_or(|j| {
                Ring::new(joined.iter().copied(), config)
                    .is_ok_and(|next| keys.first().is_some_and(|&k| next.primary(k) == j))
            });
            (owners.len(), moves_to_joiner, config)
        };
        let want = self.servers.min(keys.len());
        (0..64)
            .map(spread)
            .find(|&(n, moves, _)| n >= want && moves)
            .map_or_else(|| spread(0).2, |(_, _, c)| c)
    }
}
