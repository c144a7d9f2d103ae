//! The messages nodes exchange (ARCHITECTURE.md §2) and the envelope that carries them.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::consistency::Consistency;
use crate::filter::KeysDigest;
use crate::forms::seq;
use crate::ids::{Epoch, Iteration, NodeId, Role, Time};
use crate::key::{Key, KeyRange};
use crate::kv::KvPairs;
use crate::pace::{Coverage, Pace, Position};
use crate::ring::{Ring, RingConfig, RingError};
use crate::selection::{KeyList, KeySelection};
use crate::store::SharedRows;
use crate::value::Value;
use crate::wire::rows::RowValues;

/// The wire protocol version this build speaks. Frames of any other version are refused.
pub const PROTOCOL_VERSION: u16 = 18;

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

/// The membership and ring of one epoch, as the coordinator broadcasts it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// Version of this configuration; bumped on every membership change.
    pub epoch: Epoch,
    /// The coordinator: the active one, which publishes configurations.
    pub coordinator: NodeId,
    /// Standby coordinators, sorted: each holds every configuration before it is published
    /// and may take over when the active one goes silent (ARCHITECTURE.md §11). Only those
    /// listed may ask members for a term.
    #[serde(with = "seq")]
    pub standbys: Vec<NodeId>,
    /// The term of the coordinator that published it: 0 for a job's first coordinator, higher
    /// for each that took its place. A node refuses a configuration of a lower term than one it
    /// holds ([`crate::events::Refusal::StaleTerm`]): a coordinator that was taken over from speaks
    /// for the job no more.
    pub term: u64,
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
    /// Servers joining: members that are not on the ring yet. While a change is under way
    /// (`joining` or `leaving` not empty), every server that the next ring (`servers` and
    /// `joining`, without `leaving`) gives a range it does not hold yet copies that range from
    /// its primary and follows its updates; once all have caught up the coordinator publishes
    /// the next ring (ARCHITECTURE.md §8).
    #[serde(with = "seq")]
    pub joining: Vec<NodeId>,
    /// Servers leaving: still on the ring until those taking their ranges have caught up.
    #[serde(with = "seq")]
    pub leaving: Vec<NodeId>,
    /// The job's work, cut into one share per worker it started with (an application's part
    /// of the data, say): share `i` is worked on by `shares[i]`. The shares of a worker that
    /// dies pass to live workers ([`ClusterConfig::hand_over_shares`]), so that no part of the
    /// work is left undone; those of a worker that left stay with it (see `left`).
    #[serde(with = "seq")]
    pub shares: Vec<NodeId>,
    /// Workers that left the job on their own ([`Message::Leave`]), sorted: done with their
    /// shares, or stopped by their operator. Their shares pass to nobody: leaving is not
    /// dying, and a finished share trained again by another worker would be trained twice.
    /// Servers whose leaving completed are listed too, so that a member that missed the
    /// configurations of the change does not take them for dead
    /// ([`ClusterConfig::dead_since`]).
    #[serde(with = "seq")]
    pub left: Vec<NodeId>,
    /// Key ranges lost so far, sorted: every holder of each failed before its rows were
    /// copied (more failures than the ring has replicas), and its values started again from
    /// zero. A server reports each loss ([`Message::Lost`]); listed here, it reaches every
    /// worker, which emits [`crate::Event::RangeLost`] for it, so that a job can fail instead
    /// of ending with a model that silently lost part of its values.
    #[serde(with = "seq")]
    pub lost: Vec<KeyRange>,
    /// The incarnation each server member (on the ring or joining) registered with, sorted by
    /// node. A server process that finds itself listed under another incarnation is a
    /// restart of that node the coordinator has not heard from yet: the configuration speaks
    /// of the earlier process, whose ranges the new one does not hold. A server missing from
    /// the list (a configuration made by hand, say) is taken at its word.
    #[serde(with = "seq")]
    pub incarnations: Vec<(NodeId, u64)>,
    /// What the coordinator decided about stragglers: the staleness bound in force and the
    /// iterations workers were told to skip ([`Pace`]). Every server holds pulls to it.
    pub pace: Pace,
    /// Whole-job checkpoints: how often the workers meet for one, and the last one every
    /// server wrote ([`Checkpoints`]).
    pub checkpoints: Checkpoints,
}

/// Whole-job checkpoints (ARCHITECTURE.md §11). Before every iteration that is a multiple of
/// `every` (a *cut*), each worker waits until a configuration records the cut taken; each
/// server, once every worker has finished the iterations below the cut, takes a copy of its
/// shards and hands it to its driver to write ([`crate::events::ServerEvent::CheckpointDue`]), and tells the
/// coordinator that it took it and, later, that it wrote it. The coordinator records the cut
/// taken once every server on the ring took its copy (the workers go on while the copies are
/// written), and complete once every server wrote it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Checkpoints {
    /// Iterations between cuts; 0 takes none.
    pub every: Iteration,
    /// The last cut every server on the ring took its copy of, 0 for none: the workers have
    /// gone past it. Never below `complete`.
    pub taken: Iteration,
    /// The last cut every server on the ring wrote, 0 for none. In a job's first
    /// configuration, the cut the job resumes from: servers load their shards of it, workers
    /// start in its iteration.
    pub complete: Iteration,
}

impl Checkpoints {
    /// The last cut the workers may go past: the last one taken or complete.
    pub fn passed(&self) -> Iteration {
        self.taken.max(self.complete)
    }

    /// The next cut to take: the first multiple of `every` above the last one taken.
    pub fn next_cut(&self) -> Option<Iteration> {
        (self.every > 0).then(|| (self.passed() / self.every + 1).saturating_mul(self.every))
    }

    /// Whether a worker must wait before entering `iteration`: it is a cut not yet taken.
    pub fn waits_before(&self, iteration: Iteration) -> bool {
        self.every > 0 && iteration > self.passed() && iteration % self.every == 0
    }

    /// Whether a cut was taken whose copies are still being written.
    pub fn writing(&self) -> bool {
        self.taken > self.complete
    }
}

impl ClusterConfig {
    /// Whether `other` differs from this configuration in its epoch, its [`Pace`], its
    /// shares and its [`Checkpoints`] at most: the same members on the same ring, so that a change from one to the
    /// other moves no range and removes nobody. Shares move alone only by speed
    /// ([`crate::pace::StragglerPolicy::balance`]); those of a worker that died move with the
    /// membership.
    pub fn differs_only_in_pace(&self, other: &ClusterConfig) -> bool {
        // Every field named, so that a field added later is compared or left out on purpose.
        let ClusterConfig {
            epoch: _,
            pace: _,
            shares: _,
            checkpoints: _,
            coordinator,
            standbys,
            term,
            servers,
            workers,
            ring,
            consistency,
            joining,
            leaving,
            left,
            lost,
            incarnations,
        } = self;
        *coordinator == other.coordinator
            && *standbys == other.standbys
            && *term == other.term
            && *servers == other.servers
            && *workers == other.workers
            && *ring == other.ring
            && *consistency == other.consistency
            && *joining == other.joining
            && *leaving == other.leaving
            && *left == other.left
            && *lost == other.lost
            && *incarnations == other.incarnations
    }

    /// The next epoch's configuration with `server` taken off the ring: each of its key ranges
    /// passes to the range's first replica, which holds the range's data already
    /// (ARCHITECTURE.md §8); with no replicas the new owners start those ranges empty. Workers
    /// still on the old epoch are redirected and re-slice their requests.
    ///
    /// ```
    /// use pserver_core::{Consistency, NodeId};
    /// use pserver_core::wire::ClusterConfig;
    /// use pserver_core::ring::RingConfig;
    /// let config = ClusterConfig {
    ///     epoch: 1,
    ///     coordinator: NodeId(0),
    ///     standbys: vec![],
    ///     term: 0,
    ///     servers: vec![NodeId(1), NodeId(2), NodeId(3)],
    ///     workers: vec![NodeId(4)],
    ///     ring: RingConfig::default(),
    ///     consistency: Consistency::Sequential,
    ///     joining: vec![],
    ///     leaving: vec![],
    ///     shares: vec![NodeId(4)],
    ///     left: vec![],
    ///     lost: vec![],
    ///     incarnations: vec![],
    ///     pace: Default::default(),
    ///     checkpoints: Default::default(),
    /// };
    /// let next = config.without_server(NodeId(1)).unwrap();
    /// assert_eq!((next.epoch, &next.servers[..]), (2, &[NodeId(2), NodeId(3)][..]));
    /// // The default ring keeps one replica besides the primary: one server holds none, and
    /// // no server is none at all.
    /// let last = next.without_server(NodeId(2)).unwrap();
    /// assert_eq!((last.replicas_held(), last.ring.replicas), (0, 1));
    /// assert!(last.without_server(NodeId(3)).is_err());
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
        Ring::surviving(servers.iter().copied(), self.ring)?;
        let next = ClusterConfig {
            epoch: self.epoch + 1,
            servers,
            leaving: self
                .leaving
                .iter()
                .copied()
                .filter(|&s| s != server)
                .collect(),
            ..self.clone()
        };
        // A change under way that the servers left cannot complete is called off.
        Ok(if next.next_ring().is_ok() {
            next
        } else {
            ClusterConfig {
                joining: Vec::new(),
                leaving: Vec::new(),
                ..next
            }
        })
    }

    /// The incarnation `server` registered with, if the configuration records it (see
    /// [`ClusterConfig::incarnations`]).
    pub fn incarnation_of(&self, server: NodeId) -> Option<u64> {
        self.incarnations
            .binary_search_by_key(&server, |&(n, _)| n)
            .ok()
            .map(|i| self.incarnations[i].1)
    }

    /// True while servers are joining or leaving.
    pub fn is_changing(&self) -> bool {
        !self.joining.is_empty() || !self.leaving.is_empty()
    }

    /// The servers of the next ring: `servers` and `joining`, without `leaving`, sorted.
    pub fn next_servers(&self) -> Vec<NodeId> {
        let mut next: Vec<NodeId> = self
            .servers
            .iter()
            .chain(&self.joining)
            .copied()
            .filter(|s| !self.leaving.contains(s))
            .collect();
        next.sort_unstable();
        next.dedup();
        next
    }

    /// The ring once the change under way completes (the ring in force when none is).
    pub fn next_ring(&self) -> Result<Ring, RingError> {
        Ring::surviving(self.next_servers(), self.ring)
    }

    /// The ring in force: its servers may be too few for the replicas asked for
    /// ([`Ring::surviving`]).
    pub fn ring_in_force(&self) -> Result<Ring, RingError> {
        Ring::surviving(self.servers.iter().copied(), self.ring)
    }

    /// The replicas each key has besides its primary on the ring in force: the ring's `k`, or
    /// fewer after servers were lost and none joined ([`Ring::replicas_held`]).
    pub fn replicas_held(&self) -> u32 {
        crate::ring::held_replicas(self.ring.replicas, self.servers.len())
    }

    /// Every coordinator this configuration names: the active one, then the standbys.
    pub fn coordinators(&self) -> impl Iterator<Item = NodeId> + '_ {
        std::iter::once(self.coordinator).chain(self.standbys.iter().copied())
    }

    /// The members that vote on a coordinator's term, each once: the servers on the ring or
    /// joining it and the workers (ARCHITECTURE.md §11).
    pub fn voters(&self) -> Vec<NodeId> {
        let mut voters: Vec<NodeId> = self
            .servers
            .iter()
            .chain(&self.joining)
            .chain(&self.workers)
            .copied()
            .collect();
        voters.sort_unstable();
        voters.dedup();
        voters
    }

    /// Whether `heard` holds more than half of this configuration's voters.
    pub fn is_majority(&self, heard: &std::collections::BTreeSet<NodeId>) -> bool {
        let voters = self.voters();
        let count = voters.iter().filter(|v| heard.contains(v)).count();
        count * 2 > voters.len()
    }

    /// The live worker holding the lowest-numbered share a live worker holds: the one an
    /// application asks to do what one worker does for all (measure the model, save it).
    /// It passes on when that worker dies or leaves; `None` with no live worker holding a
    /// share.
    pub fn lead_worker(&self) -> Option<NodeId> {
        self.shares
            .iter()
            .copied()
            .find(|w| self.workers.contains(w))
    }

    /// The first shares of a job of `workers`, `per_worker` each, dealt in turn: worker `i`
    /// holds shares `i`, `i + W`, `i + 2W`, ... ([`ClusterConfig::shares`]).
    ///
    /// ```
    /// use pserver_core::NodeId;
    /// use pserver_core::wire::ClusterConfig;
    /// let (a, b) = (NodeId(2), NodeId(3));
    /// assert_eq!(ClusterConfig::deal(&[a, b], 2), [a, b, a, b]);
    /// ```
    pub fn deal(workers: &[NodeId], per_worker: usize) -> Vec<NodeId> {
        (0..workers.len() * per_worker)
            .map(|i| workers[i % workers.len()])
            .collect()
    }

    /// The shares `worker` works on in round `round` of an application that works in rounds
    /// of `length` iterations, round 1 starting at iteration `first`: those it holds, but a
    /// share moved by speed ([`crate::pace::Pace::moves`]) belongs to the worker it came from up to
    /// the end of the round that worker was in, and to its new holder from the next.
    ///
    /// ```
    /// use pserver_core::{Consistency, NodeId};
    /// use pserver_core::pace::ShareMove;
    /// use pserver_core::wire::ClusterConfig;
    /// let (a, b) = (NodeId(2), NodeId(3));
    /// let mut config = ClusterConfig {
    ///     epoch: 3,
    ///     coordinator: NodeId(0),
    ///     standbys: vec![],
    ///     term: 0,
    ///     servers: vec![NodeId(1)],
    ///     workers: vec![a, b],
    ///     ring: Default::default(),
    ///     consistency: Consistency::Sequential,
    ///     joining: vec![],
    ///     leaving: vec![],
    ///     shares: vec![a, b, b],
    ///     left: vec![],
    ///     lost: vec![],
    ///     incarnations: vec![],
    ///     pace: Default::default(),
    ///     checkpoints: Default::default(),
    /// };
    /// // Share 2 came from `a` in its iteration 25: rounds of 10 from iteration 0.
    /// config.pace.moves = vec![ShareMove { share: 2, from: a, at: 25 }];
    /// assert_eq!(config.shares_in_round(a, 0, 10, 3), [0, 2]);
    /// assert_eq!(config.shares_in_round(b, 0, 10, 3), [1]);
    /// assert_eq!(config.shares_in_round(b, 0, 10, 4), [1, 2]);
    /// assert_eq!(config.handed_over_in(2, 0, 10), Some(4));
    /// ```
    pub fn shares_in_round(
        &self,
        worker: NodeId,
        first: Iteration,
        length: Iteration,
        round: u64,
    ) -> Vec<usize> {
        let round_of = |at: Iteration| u64::from(at.saturating_sub(first) / length.max(1)) + 1;
        (0..self.shares.len())
            .filter(|&i| {
                let holder = match self.pace.moved(i) {
                    Some(m) if round_of(m.at) >= round => m.from,
                    _ => self.shares[i],
                };
                holder == worker
            })
            .collect()
    }

    /// The round from which the worker holding `share` holds it, where it was moved to it by
    /// speed ([`ClusterConfig::shares_in_round`]): a worker that learns of the move only
    /// during that round does the share's work of the round from its beginning, so that
    /// none of it is left undone.
    pub fn handed_over_in(&self, share: usize, first: Iteration, length: Iteration) -> Option<u64> {
        self.pace
            .moved(share)
            .map(|m| u64::from(m.at.saturating_sub(first) / length.max(1)) + 2)
    }

    /// The shares `worker` works on, in order (see [`ClusterConfig::shares`]).
    pub fn shares_of(&self, worker: NodeId) -> Vec<usize> {
        (0..self.shares.len())
            .filter(|&i| self.shares[i] == worker)
            .collect()
    }

    /// Whether the job is over: every worker left it on its own ([`Message::Leave`]), none is
    /// still a member, and every share of the work is held by one that left (none passed to a
    /// worker that died before it could be done). A job whose last worker died has not
    /// finished: its work is undone. Servers and the coordinator may stop once they hear it
    /// ([`crate::Event::JobFinished`]).
    ///
    /// ```
    /// use pserver_core::{Consistency, NodeId};
    /// use pserver_core::wire::ClusterConfig;
    /// use pserver_core::ring::RingConfig;
    /// let mut config = ClusterConfig {
    ///     epoch: 1,
    ///     coordinator: NodeId(0),
    ///     standbys: vec![],
    ///     term: 0,
    ///     servers: vec![NodeId(1)],
    ///     workers: vec![NodeId(2)],
    ///     ring: RingConfig { replicas: 0, ..RingConfig::default() },
    ///     consistency: Consistency::Sequential,
    ///     joining: vec![],
    ///     leaving: vec![],
    ///     shares: vec![NodeId(2)],
    ///     left: vec![],
    ///     lost: vec![],
    ///     incarnations: vec![],
    ///     pace: Default::default(),
    ///     checkpoints: Default::default(),
    /// };
    /// assert!(!config.job_finished());
    /// config.workers.clear();
    /// // Silent and declared dead: its share is not done.
    /// assert!(!config.job_finished());
    /// config.left.push(NodeId(2));
    /// assert!(config.job_finished());
    /// ```
    pub fn job_finished(&self) -> bool {
        self.workers.is_empty()
            && !self.left.is_empty()
            && self
                .shares
                .iter()
                .all(|w| self.left.binary_search(w).is_ok())
    }

    /// The members of `before` this configuration says died: servers and workers gone from
    /// it without being listed in `left`, sorted. Every server and worker says each with
    /// [`crate::Event::NodeDead`], as the coordinator did when it declared it, however many
    /// configurations in between it missed. A server that restarted and registered again is
    /// not gone (it is joining).
    ///
    /// ```
    /// use pserver_core::node::Coordinator;
    /// use pserver_core::{JobSpec, NodeId};
    /// let job = JobSpec::new(3, 2); // n1-n3 servers, n4-n5 workers
    /// let (servers, workers) = ([NodeId(1), NodeId(2), NodeId(3)], [NodeId(4), NodeId(5)]);
    /// let coordinator = Coordinator::bootstrapped(job.coordinator_config(), &servers, &workers)?;
    /// let before = coordinator.config().cloned().ok_or("no configuration")?;
    /// let mut after = before.clone();
    /// after.servers = vec![NodeId(1)];
    /// after.workers.clear();
    /// after.left = vec![NodeId(3), NodeId(5)];
    /// // n3 and n5 left: n2 and n4 died.
    /// assert_eq!(after.dead_since(&before), vec![NodeId(2), NodeId(4)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dead_since(&self, before: &ClusterConfig) -> Vec<NodeId> {
        let here = |n: &NodeId| {
            self.servers.contains(n)
                || self.joining.contains(n)
                || self.workers.contains(n)
                || self.left.binary_search(n).is_ok()
        };
        let mut dead: Vec<NodeId> = before
            .servers
            .iter()
            .chain(&before.joining)
            .chain(&before.workers)
            .copied()
            .filter(|n| !here(n))
            .collect();
        dead.sort_unstable();
        dead.dedup();
        dead
    }

    /// Gives every share whose worker died (is no longer one of `workers`, and not one of
    /// `left`) to the live worker that holds the fewest (the lowest id among equals), one
    /// share at a time, so that the work of the workers lost spreads over those left. With no
    /// worker left, shares stay where they are until one joins.
    ///
    /// ```
    /// use pserver_core::{Consistency, NodeId};
    /// use pserver_core::wire::ClusterConfig;
    /// use pserver_core::ring::RingConfig;
    /// let w = |i| NodeId(i);
    /// let mut config = ClusterConfig {
    ///     epoch: 1,
    ///     coordinator: NodeId(0),
    ///     standbys: vec![],
    ///     term: 0,
    ///     servers: vec![NodeId(1)],
    ///     workers: vec![w(2), w(3), w(4)],
    ///     ring: RingConfig { replicas: 0, ..RingConfig::default() },
    ///     consistency: Consistency::Sequential,
    ///     joining: vec![],
    ///     leaving: vec![],
    ///     shares: vec![w(2), w(3), w(4)],
    ///     left: vec![],
    ///     lost: vec![],
    ///     incarnations: vec![],
    ///     pace: Default::default(),
    ///     checkpoints: Default::default(),
    /// };
    /// config.workers.retain(|&n| n != w(3));
    /// config.hand_over_shares();
    /// assert_eq!(config.shares_of(w(2)), [0, 1]);
    /// assert_eq!(config.shares_of(w(4)), [2]);
    /// // A worker that left on its own keeps its shares: they are done.
    /// assert_eq!(config.lead_worker(), Some(w(2)));
    /// config.workers.retain(|&n| n != w(2));
    /// config.left.push(w(2));
    /// config.hand_over_shares();
    /// assert_eq!(config.shares_of(w(2)), [0, 1]);
    /// // What one worker does for all passes to the next live one.
    /// assert_eq!(config.lead_worker(), Some(w(4)));
    /// ```
    pub fn hand_over_shares(&mut self) {
        if self.workers.is_empty() {
            return;
        }
        for i in 0..self.shares.len() {
            if self.workers.contains(&self.shares[i]) || self.left.contains(&self.shares[i]) {
                continue;
            }
            let least = self
                .workers
                .iter()
                .copied()
                .min_by_key(|&w| (self.shares.iter().filter(|&&s| s == w).count(), w));
            if let Some(w) = least {
                self.shares[i] = w;
            }
        }
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
    /// How much of the iteration's work the worker had pushed with this push, its parts
    /// before included ([`crate::node::Worker::push_part`]; the whole iteration otherwise).
    pub covers: Coverage,
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

/// A [`Pull`] of a key list the server was sent before, by name (key caching,
/// ARCHITECTURE.md §10). A server that does not hold the list answers
/// [`Message::KeysUnknown`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PullCached {
    /// Which slice this is.
    pub slice: SliceRef,
    /// The worker's iteration.
    pub iteration: Iteration,
    /// The name of the keys wanted.
    pub keys: KeysDigest,
}

/// A [`Push`] over a key list the server was sent before, by name (key caching,
/// ARCHITECTURE.md §10). A server that does not hold the list answers
/// [`Message::KeysUnknown`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct PushCached<V: Value> {
    /// Which slice this is.
    pub slice: SliceRef,
    /// The worker's iteration the update belongs to.
    pub iteration: Iteration,
    /// As [`Push::covers`].
    pub covers: Coverage,
    /// As [`Push::settled_below`].
    pub settled_below: RequestId,
    /// The name of the update's keys.
    pub keys: KeysDigest,
    /// The update's values, in the keys' order.
    pub values: RowValues<V>,
}

/// A server's answer to a [`Pull`] of a key list, without the keys: they are those the slice
/// asked for, in order (key caching, ARCHITECTURE.md §10).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct PullValues<V: Value> {
    /// The slice answered.
    pub slice: SliceRef,
    /// As [`PullReply::complete_below`].
    pub complete_below: Iteration,
    /// The values of every key asked for.
    pub values: RowValues<V>,
}

/// A server's answer to a [`Pull`] of key ranges where the job compresses values
/// (ARCHITECTURE.md §10): a [`PullReply`] whose values are packed. A model's rows are mostly
/// zero under L1 regularization, and a pull of the whole model (a worker measuring it, an
/// export) took more bytes an epoch than all the minibatches' pull answers together.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct PullRows<V: Value> {
    /// The slice answered.
    pub slice: SliceRef,
    /// As [`PullReply::complete_below`].
    pub complete_below: Iteration,
    /// The keys answered: those the server holds in the ranges asked for (below `resume`).
    pub keys: KeyList,
    /// Their values, in the keys' order.
    pub values: RowValues<V>,
    /// As [`PullReply::resume`].
    pub resume: Option<Key>,
}

/// The rows of one worker request that a shard applied: the request, and the first and last
/// key of the rows. A request's rows in one key range travel together in one slice, so the span
/// names them exactly, however the worker sliced the request (ARCHITECTURE.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AppliedSpan {
    /// The worker's request.
    pub request: RequestId,
    /// Smallest key applied.
    pub first: Key,
    /// Largest key applied.
    pub last: Key,
}

/// One worker's de-duplication state on a shard, as replication and transfers carry it: it
/// travels with the key range it protects, so a resend is recognised wherever the range goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DedupeRecord {
    /// The worker.
    pub worker: NodeId,
    /// Every request of the worker below this id is settled and will never be sent again.
    pub settled_below: RequestId,
    /// Rows applied for the worker's unsettled requests: a push's record holds one span, kept
    /// in place, so that replicating a push allocates nothing per shard.
    #[serde(with = "seq")]
    pub applied: SmallVec<[AppliedSpan; 1]>,
}

/// What a primary did to a shard; its replicas do the same, in the same order, through the
/// same update rule, which reproduces the primary's values and updater state bit for bit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub enum ShardUpdate<V: Value> {
    /// Apply these deltas through the update rule.
    Apply(KvPairs<V>),
    /// Sequential mode: keep these deltas until every worker finished `iteration`.
    Buffer {
        /// The iteration the deltas belong to.
        iteration: Iteration,
        /// The deltas.
        kvs: KvPairs<V>,
    },
    /// Sequential mode: apply, in order, the key-wise sum of every buffered iteration below
    /// this one.
    ApplyBelow(Iteration),
}

/// One step of a shard's update order, from its primary to its replicas.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct Replicate<V: Value> {
    /// The shard's key range.
    pub range: KeyRange,
    /// Position in the shard's update order: the last step this entry stands for.
    pub seq: u64,
    /// How many consecutive steps of the update order, ending at `seq`, this entry stands
    /// for: replicas apply it only right after step `seq - span`. Usually 1; more when a
    /// primary ships the buffered pushes of one iteration that queued up while its replicas
    /// were still acknowledging earlier steps as one sum (ARCHITECTURE.md §8). An entry with a
    /// span of 0, or one reaching below step 1, is refused.
    pub span: u64,
    /// What changed.
    pub update: ShardUpdate<V>,
    /// De-duplication state the update adds: the record of the push a step stands for, kept
    /// in place (a shipped iteration's sum carries the records of all its pushes).
    #[serde(with = "seq")]
    pub dedupe: SmallVec<[DedupeRecord; 1]>,
}

/// A replica's position in a shard's update order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardAck {
    /// The shard's key range.
    pub range: KeyRange,
    /// The last update applied; `None` when the replica holds no copy it may extend (it needs
    /// a [`Transfer`]).
    pub seq: Option<u64>,
}

/// Deltas a sequential-mode shard keeps for an iteration that is not finished yet.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct BufferedPush<V: Value> {
    /// The iteration.
    pub iteration: Iteration,
    /// The deltas.
    pub kvs: KvPairs<V>,
}

/// A worker's progress on a key range: the iterations it finished, by segment of its range clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClockRecord {
    /// The worker.
    pub worker: NodeId,
    /// `(range, finished below)` segments.
    #[serde(with = "seq")]
    pub segments: Vec<(KeyRange, Iteration)>,
}

/// A whole shard on its way to a new holder (a new replica, or a new owner): everything that
/// moves with a key range, as of update `seq`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct Transfer<V: Value> {
    /// The shard's key range.
    pub range: KeyRange,
    /// The last update the copy includes.
    pub seq: u64,
    /// Stored values.
    pub values: KvPairs<V>,
    /// The update rule's state of the same keys, `aux_width x width` per key; `None` when the
    /// rule keeps none.
    pub state: Option<KvPairs<V>>,
    /// Sequential mode: deltas buffered for unfinished iterations, in arrival order.
    #[serde(with = "seq")]
    pub pending: Vec<BufferedPush<V>>,
    /// Sequential mode: every iteration below this one is applied.
    pub applied_below: Iteration,
    /// De-duplication state.
    #[serde(with = "seq")]
    pub dedupe: Vec<DedupeRecord>,
    /// The workers' range clocks on the range, so that the new holder knows at once how far
    /// each worker has come there.
    #[serde(with = "seq")]
    pub clocks: Vec<ClockRecord>,
}

/// A whole shard as a checkpoint holds it ([`crate::events::ServerEvent::CheckpointDue`],
/// [`crate::driver::ServerCalls::restore`]): what a [`Transfer`] carries, with the rows shared with the
/// store instead of copied out of it, so that writing a model's checkpoint costs what writing
/// its bytes does (ARCHITECTURE.md §11).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct ShardCopy<V: Value> {
    /// The shard's key range.
    pub range: KeyRange,
    /// The last update the copy includes.
    pub seq: u64,
    /// Stored rows with their update-rule state.
    pub rows: SharedRows<V>,
    /// Sequential mode: deltas buffered for unfinished iterations, in arrival order.
    #[serde(with = "seq")]
    pub pending: Vec<BufferedPush<V>>,
    /// Sequential mode: every iteration below this one is applied.
    pub applied_below: Iteration,
    /// De-duplication state.
    #[serde(with = "seq")]
    pub dedupe: Vec<DedupeRecord>,
    /// The workers' range clocks on the range.
    #[serde(with = "seq")]
    pub clocks: Vec<ClockRecord>,
}

impl<V: Value> ShardCopy<V> {
    /// The same shard as a [`Transfer`], its rows copied into its own vectors (taken over
    /// when they are held nowhere else).
    pub fn into_transfer(self) -> Transfer<V> {
        let (width, aux_width) = (self.rows.width(), self.rows.aux_width());
        let (keys, values, aux) = self.rows.into_parts();
        let values = KvPairs::from_validated(keys, values, width);
        let state = (aux_width > 0).then(|| values.beside(aux, width * aux_width));
        Transfer {
            range: self.range,
            seq: self.seq,
            values,
            state,
            pending: self.pending,
            applied_below: self.applied_below,
            dedupe: self.dedupe,
            clocks: self.clocks,
        }
    }
}

/// Every message body of the protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub enum Message<V: Value> {
    /// A node announces itself to the coordinator.
    Register {
        /// What the node will do.
        role: Role,
        /// Which start of the node this is: a registration with another incarnation than the
        /// coordinator knows is a node that restarted and lost its state, not a resend.
        incarnation: u64,
        /// A worker's keys all lie below this bound, if it knows one
        /// ([`crate::JobSpec::keys_below`]).
        keys_below: Option<Key>,
        /// A server started to resume a job: the cuts whose shards it holds whole, from
        /// which the coordinator picks the newest every server holds ([`Checkpoints`]).
        #[serde(with = "seq")]
        checkpoints: Vec<Iteration>,
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
        /// A worker's position, where the job detects stragglers
        /// ([`crate::pace::StragglerPolicy::detect`]); otherwise none.
        at: Option<Position>,
        /// The highest coordinator term the sender holds or granted a standby: a member that
        /// granted a newer term than the coordinator's does not count towards what it may
        /// publish (ARCHITECTURE.md §11).
        term: u64,
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
        /// Every iteration below this one is finished, every push of it acknowledged.
        finished_below: Iteration,
        /// Sequential mode: every push of every iteration below this one was taken in
        /// (`PushTaken`) or acknowledged by a server that is the primary of its keys at the
        /// message's epoch, which holds it. Servers count it only at that epoch: a range that
        /// moves may leave taken pushes behind, and the worker resends them.
        taken_below: Iteration,
    },
    /// A server has recorded a worker's progress.
    ProgressAck {
        /// The progress recorded.
        finished_below: Iteration,
        /// The taken progress recorded at the message's epoch.
        taken_below: Iteration,
    },
    /// A primary's updates for a replica, in shard order.
    Replicate {
        /// The updates, each of one shard.
        #[serde(with = "steps")]
        updates: Vec<Replicate<V>>,
    },
    /// A replica's position in the update order of the shards it was sent.
    ReplicateAck {
        /// One per shard.
        #[serde(with = "seq")]
        acks: Vec<ShardAck>,
    },
    /// A whole shard for a new holder.
    Transfer(Transfer<V>),
    /// The new holder has installed the copy of `range` as of `seq`.
    TransferAck {
        /// The shard's key range.
        range: KeyRange,
        /// The update the copy included.
        seq: u64,
    },
    /// A server holds copies of every range the next ring of `epoch` gives it, and follows
    /// their updates: the coordinator may switch to that ring.
    CaughtUp {
        /// The configuration whose change the server caught up with.
        epoch: Epoch,
    },
    /// A server took a copy of every shard it holds at the epoch of the envelope, as of the
    /// cut ([`Checkpoints`]), and hands it to be written; repeated with every heartbeat until
    /// a configuration records the cut taken.
    CheckpointTaken {
        /// The cut.
        cut: Iteration,
    },
    /// A server wrote the copies it took of the cut, and still holds the ranges it took them
    /// of ([`Checkpoints`]); repeated with every heartbeat until a configuration records the
    /// cut complete.
    Checkpointed {
        /// The cut.
        cut: Iteration,
    },
    /// A server asks to leave the job: the coordinator moves its ranges away first.
    Leave,
    /// A server that joined the running job asks a worker for its progress: an earlier
    /// process with the server's id may have acknowledged it, but this one never heard it.
    /// Repeated with every heartbeat until the worker's `Progress` arrives.
    ProgressRequest,
    /// Sequential mode: a server has taken a push slice in, and it counts towards its
    /// iteration, but its replicas do not hold it yet: they get each iteration's pushes as
    /// one sum once the iteration is finished. The worker counts the slice as done for its
    /// iteration and keeps it, resending it now and then, until `PushAck` says the replicas
    /// hold it (ARCHITECTURE.md §8).
    PushTaken(SliceRef),
    /// A server tells the coordinator of key ranges it lost with their holders
    /// ([`crate::Event::RangeLost`]), repeated with every heartbeat until a configuration
    /// lists them ([`ClusterConfig::lost`]).
    Lost(#[serde(with = "seq")] Vec<KeyRange>),
    /// The coordinator's answer to a heartbeat: it is alive. Servers and workers that hear
    /// nothing from it for [`crate::Timing::coordinator_timeout`] say so
    /// ([`crate::Event::CoordinatorSilent`]).
    HeartbeatAck {
        /// The heartbeat's `sent_at`, echoed.
        sent_at: Time,
        /// Servers silent past the timeout that the coordinator keeps on the ring, since
        /// without them too few would be left: members say so too
        /// ([`crate::Event::RingDegraded`]). Usually empty.
        #[serde(with = "seq")]
        degraded: Vec<NodeId>,
    },
    /// A worker asks the server of a large push slice for a slot before it sends the slice
    /// ([`crate::slots::PushSlots`]), so that workers pushing together take turns. Resent like a
    /// slice until granted.
    SlotAsk {
        /// The slice waiting.
        slice: SliceRef,
        /// The bytes it moves, as the worker counts them: what the server needs to know
        /// whether it needs a slot, and how long to hold one for it.
        bytes: u32,
    },
    /// A server lets a push slice in: the worker sends it now. Sent again for a repeated ask,
    /// and at once for a slice that arrived already; a grant the worker does not wait for is
    /// ignored.
    SlotGrant(SliceRef),
    /// A worker's pull slice naming a key list sent before (key caching).
    PullCached(PullCached),
    /// A worker's push slice naming a key list sent before (key caching).
    PushCached(PushCached<V>),
    /// A server does not hold the key list a slice named: the worker sends the slice again
    /// with its whole list.
    KeysUnknown(SliceRef),
    /// A server's answer to a key-list pull slice, without the keys (key caching).
    PullValues(PullValues<V>),
    /// A server's answer to a range pull slice, its values packed (value compression).
    PullRows(PullRows<V>),
    /// The active coordinator's state for a standby, sent with every configuration it decides
    /// (before publishing it) and every heartbeat interval (ARCHITECTURE.md §11).
    Standby(Box<StandbyState>),
    /// A standby holds the state of `epoch` under `term`; a `term` above the active one's says
    /// that a newer term exists, and the active one steps down.
    StandbyAck {
        /// The term the standby follows.
        term: u64,
        /// The epoch of the configuration it holds.
        epoch: Epoch,
    },
    /// A standby that heard nothing from the active coordinator asks a member for `term`.
    TermAsk {
        /// The term asked for: above every term the standby knows.
        term: u64,
    },
    /// A member grants `term`: it refuses configurations of lower terms from now on, and sends
    /// the configuration it holds, which the new coordinator's first one succeeds.
    TermGrant {
        /// The term granted.
        term: u64,
        /// The configuration the member holds.
        config: Box<ClusterConfig>,
    },
}

/// What a standby coordinator holds of the active one: everything a coordinator decides from
/// that is not in the configuration (ARCHITECTURE.md §11). What it learns from heartbeats
/// (silence, workers' positions) it learns again once it takes over.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StandbyState {
    /// The configuration the active coordinator decided last: published, or to be once every
    /// standby holds it.
    pub config: ClusterConfig,
    /// The epoch of the configuration the active coordinator published last: `config`'s own
    /// once it is published.
    pub published: Epoch,
    /// Every node that registered, with its role.
    #[serde(with = "seq")]
    pub members: Vec<(NodeId, Role)>,
    /// The incarnation each node last registered with.
    #[serde(with = "seq")]
    pub incarnations: Vec<(NodeId, u64)>,
    /// Nodes declared dead.
    #[serde(with = "seq")]
    pub dead: Vec<NodeId>,
}

impl<V: Value> Message<V> {
    /// Number of message kinds this version knows; the wire tags are `0..KINDS`.
    pub const KINDS: u32 = 34;
}

/// `#[serde(with = "steps")]` for the steps of a replication batch: as [`seq`], but the keys
/// of every step's pairs decode into one list ([`crate::arena`]), so that a batch costs a key
/// list, not one per step.
pub(crate) mod steps {
    use serde::de::Error as _;
    use serde::{Deserializer, Serializer};

    use super::{Replicate, ShardUpdate};
    use crate::forms::seq;
    use crate::value::Value;

    pub(crate) fn serialize<V: Value, S: Serializer>(
        v: &[Replicate<V>],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        seq::serialize(v, s)
    }

    pub(crate) fn deserialize<'de, V, D>(d: D) -> Result<Vec<Replicate<V>>, D::Error>
    where
        V: Value,
        D: Deserializer<'de>,
    {
        let arena = crate::arena::open();
        let mut steps: Vec<Replicate<V>> = seq::deserialize(d)?;
        let whole = arena.close(|stand_in, keys| {
            for step in &mut steps {
                match &mut step.update {
                    ShardUpdate::Apply(kvs) | ShardUpdate::Buffer { kvs, .. } => {
                        kvs.rebase_keys(stand_in, keys);
                    }
                    ShardUpdate::ApplyBelow(_) => {}
                }
            }
        });
        // Every pair decoded into the arena was pointed at its keys: none holds the stand-in
        // whose place the keys took, whose list is empty.
        if !whole {
            return Err(D::Error::custom("pairs left outside the batch's key list"));
        }
        Ok(steps)
    }
}
