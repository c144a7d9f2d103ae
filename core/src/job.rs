//! The one description of a job (ARCHITECTURE.md §1): its nodes, its ring, its consistency
//! model, its timing, its message limits and the servers' side of the application. Every
//! stack builds its nodes from a [`JobSpec`]: the runtime's clusters, the cluster file, the
//! trainers, the simulator and the model checker; and a job that cannot work is refused here,
//! once, with a [`JobError`].

use thiserror::Error;

use crate::consistency::Consistency;
use crate::coordinator::{Coordinator, CoordinatorConfig, CoordinatorError};
use crate::driver::Driver;
use crate::filter::Filters;
use crate::ids::{Iteration, NodeId, NodeLayout, Standbys};
use crate::key::{Key, KeyRange};
use crate::pace::StragglerPolicy;
use crate::ring::RingConfig;
use crate::server::{Server, ServerConfig};
use crate::slots::PushSlots;
use crate::store::StoreLayout;
use crate::timing::Timing;
use crate::updater::Updater;
use crate::value::Value;
use crate::wire::{Codec, DEFAULT_MAX_FRAME};
use crate::worker::{DEFAULT_MAX_SLICE_BYTES, Worker, WorkerConfig};

/// The shape of a job and everything its nodes must agree on. Nodes are numbered as
/// [`NodeLayout`] says: the coordinator 0, then the servers, then the workers.
///
/// [`JobSpec::new`] gives the defaults; change the fields that differ, then build each node
/// with [`JobSpec::driver`] (or its configuration with [`JobSpec::server_config`] and the
/// like). [`JobSpec::validate`] says whether the job can work at all.
///
/// ```
/// use pserver_core::{Consistency, JobSpec, NodeId};
/// let mut job = JobSpec::new(2, 3);
/// job.consistency = Consistency::BoundedDelay(2);
/// job.ring.replicas = 1;
/// let server = job.driver::<f32>(NodeId(1), 0)?;
/// assert_eq!(server.id(), NodeId(1));
/// job.ring.replicas = 2; // two servers cannot hold a primary and two replicas
/// assert!(job.validate::<f32>().is_err());
/// # Ok::<(), pserver_core::JobError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct JobSpec {
    /// Servers.
    pub servers: usize,
    /// Workers.
    pub workers: usize,
    /// The consistency model. Default: sequential.
    pub consistency: Consistency,
    /// How the ring is built. Default: 64 virtual nodes, no replicas, seed 0.
    pub ring: RingConfig,
    /// Values per key. Default 1.
    pub width: usize,
    /// The servers' update rule. Default: [`Updater::Sum`].
    pub updater: Updater,
    /// Timeouts and intervals.
    pub timing: Timing,
    /// The largest frame a node sends or accepts: set it to what one datagram of your
    /// transport carries, and every message is cut to it. Default: [`DEFAULT_MAX_FRAME`].
    pub max_frame: usize,
    /// The largest slice a worker puts in one message, at most: the driver cuts slices
    /// smaller where `max_frame` asks for it. Default: [`DEFAULT_MAX_SLICE_BYTES`].
    pub max_slice_bytes: usize,
    /// The largest part of a server's answer to a range pull, and of a copy of a shard.
    /// Default: [`DEFAULT_MAX_SLICE_BYTES`].
    pub max_reply_bytes: usize,
    /// Push slices (and, separately, pull slices) a worker keeps on the network. Default 64.
    pub max_slices_in_flight: usize,
    /// Bytes of push slices (and, separately, of pull slices) a worker keeps on the network.
    /// Default: unbounded.
    pub max_bytes_in_flight: u64,
    /// Seed of the workers' retransmission jitter.
    pub seed: u64,
    /// Keys the servers update without the rule's regularizer: a model's intercept, which
    /// regularization would pull towards zero for no benefit. Default: none.
    pub unregularized: Option<KeyRange>,
    /// How servers lay out their rows: in key order, for dense keys (the default), or behind
    /// a hash table, for sparse models whose batches touch scattered keys.
    pub store: StoreLayout,
    /// How stragglers are told and dealt with: skip-ahead and adaptive tau, under bounded
    /// delay (ARCHITECTURE.md §9). Default: not at all.
    pub stragglers: StragglerPolicy,
    /// Round-robin push slots: servers let large push slices in a few at a time, the workers
    /// taking turns (ARCHITECTURE.md §9). Default: none, every slice goes at once.
    pub push_slots: Option<PushSlots>,
    /// Filters every worker runs its pushes through (ARCHITECTURE.md §10). Default: none.
    pub filters: Filters,
    /// What this process's workers know of the keys they will use: all lie below this
    /// bound (a training file's dimension, say). A worker tells the coordinator when it
    /// registers, and a coordinator whose ring was given no key space
    /// ([`RingConfig::key_space`](crate::ring::RingConfig::key_space) left at the whole `u64`
    /// range) spreads the ring over the largest bound it hears, so that every server holds a
    /// fair part of the keys. Default: none, for keys spread over the whole range (hashed).
    pub keys_below: Option<Key>,
    /// Workers say how far they are (their iteration) in every heartbeat, so that the
    /// coordinator can tell how far the job has come ([`crate::node::Coordinator::progress`])
    /// where no straggler policy needs it already. Default: false.
    pub report_progress: bool,
    /// The fewest replicas a key may be left with when servers crash or leave
    /// ([`CoordinatorConfig::min_replicas`]): 0 by default, for a job that goes on while one
    /// server holds each range.
    pub min_replicas: u32,
    /// Standby coordinators, each ready to take over from the active one
    /// (ARCHITECTURE.md §11); nodes register with every coordinator until a configuration
    /// names the active one. Default: none.
    pub standbys: Standbys,
    /// Iterations between whole-job checkpoints ([`crate::wire::Checkpoints`]): before each
    /// multiple of it the workers wait until every server wrote its shards. Default 0: none.
    pub checkpoint_every: Iteration,
}

/// Why a job cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum JobError {
    /// The coordinator cannot run the job: no servers or workers, or a ring the servers cannot
    /// form.
    #[error(transparent)]
    Shape(#[from] CoordinatorError),
    /// Rows of no values.
    #[error("rows must hold at least one value (width 0)")]
    ZeroWidth,
    /// A worker could never send a slice.
    #[error("workers must be allowed at least one slice in flight")]
    NoSlicesInFlight,
    /// A frame limit some message of the job can never meet.
    #[error(
        "frames of at most {max_frame} bytes cannot carry every message of this job (its configuration, or one row with its state and de-duplication records): it needs a frame limit of at least {smallest} bytes"
    )]
    FrameTooSmall {
        /// The frame limit asked for.
        max_frame: usize,
        /// The smallest limit every message of the job fits ([`JobSpec::smallest_frame`]).
        smallest: usize,
    },
    /// A straggler policy the job cannot follow.
    #[error("{0}")]
    Stragglers(&'static str),
    /// Push slots of which none may be granted.
    #[error("push slots must let at least one slice in at a time (at_once 0)")]
    NoPushSlots,
    /// A node id outside the job's layout.
    #[error(
        "node {id} is not part of a job of {servers} servers and {workers} workers (nodes n0..n{last})"
    )]
    NotInJob {
        /// The id asked for.
        id: NodeId,
        /// The job's servers.
        servers: usize,
        /// The job's workers.
        workers: usize,
        /// The last node id of the job.
        last: usize,
    },
}

impl JobSpec {
    /// A job of `servers` servers and `workers` workers with the defaults.
    pub fn new(servers: usize, workers: usize) -> Self {
        JobSpec {
            servers,
            workers,
            consistency: Consistency::Sequential,
            ring: RingConfig {
                vnodes: 64,
                replicas: 0,
                seed: 0,
                ..RingConfig::default()
            },
            width: 1,
            updater: Updater::Sum,
            timing: Timing::default(),
            max_frame: DEFAULT_MAX_FRAME,
            max_slice_bytes: DEFAULT_MAX_SLICE_BYTES,
            max_reply_bytes: DEFAULT_MAX_SLICE_BYTES,
            max_slices_in_flight: 64,
            max_bytes_in_flight: u64::MAX,
            seed: 0,
            unregularized: None,
            store: StoreLayout::Ordered,
            stragglers: StragglerPolicy::default(),
            push_slots: None,
            filters: Filters::none(),
            keys_below: None,
            report_progress: false,
            min_replicas: 0,
            checkpoint_every: 0,
            standbys: Standbys::default(),
        }
    }

    /// How the nodes are numbered.
    pub fn layout(&self) -> NodeLayout {
        NodeLayout {
            servers: self.servers,
            workers: self.workers,
        }
    }

    /// How many shares the job's work is cut into ([`crate::wire::ClusterConfig::shares`]): one per
    /// worker, or [`crate::pace::Balance::per_worker`] each where shares are sized by speed.
    pub fn share_count(&self) -> usize {
        self.workers * self.stragglers.shares_per_worker()
    }

    /// Every node id of the job, coordinator first.
    pub fn node_ids(&self) -> Vec<NodeId> {
        let layout = self.layout();
        core::iter::once(layout.coordinator())
            .chain(layout.servers())
            .chain(layout.workers())
            .collect()
    }

    /// Whether the job can work with values of type `V`: servers and workers to run it, a
    /// ring its servers can form, rows of at least one value, and a frame limit every message
    /// can be cut to ([`JobSpec::smallest_frame`]). Slices and answers larger than a frame
    /// need not be lowered: the driver cuts them to the frame limit.
    pub fn validate<V: Value>(&self) -> Result<(), JobError> {
        if self.servers == 0 {
            return Err(CoordinatorError::NoServers.into());
        }
        Coordinator::new(self.coordinator_config())?;
        if self.width == 0 {
            return Err(JobError::ZeroWidth);
        }
        if self.max_slices_in_flight == 0 {
            return Err(JobError::NoSlicesInFlight);
        }
        self.validate_stragglers()?;
        if self.push_slots.is_some_and(|s| s.at_once == 0) {
            return Err(JobError::NoPushSlots);
        }
        let smallest = self.smallest_frame::<V>();
        if self.max_frame < smallest {
            return Err(JobError::FrameTooSmall {
                max_frame: self.max_frame,
                smallest,
            });
        }
        Ok(())
    }

    /// The smallest frame limit under which every message of the job fits, each cut as far
    /// as it can be: its configuration with every member listed and every number at its
    /// longest, and a slice, an answer, a replication step and a copy of a shard of one row,
    /// the copy with the row's update-rule state and a de-duplication record and a clock for
    /// every worker. Slices, answers, batches and copies are cut to the frame limit; what
    /// cannot be cut must fit. Below this limit no run of the job can work; at it, a run
    /// without failures does. Copies are cut by the rows they carry, stored and (in
    /// sequential mode) buffered for unfinished iterations; their de-duplication records (a
    /// span per request each worker has unsettled on the range) are not cut, and may take a
    /// copy made after a fail-over past a tight limit (1,608 bytes where a small job needs
    /// 232).
    pub fn smallest_frame<V: Value>(&self) -> usize {
        use crate::wire::{
            AppliedSpan, ClockRecord, DedupeRecord, Envelope, Message, PullReply, Push, Replicate,
            ShardUpdate, SliceRef, Transfer,
        };
        const MAX_ID: NodeId = NodeId(u32::MAX);
        let width = self.width.max(1);
        let aux = crate::updater::UpdateRule::<V>::aux_width(&self.updater);
        let row =
            |n: usize| crate::kv::KvPairs::new(vec![Key::MAX - 1], vec![V::default(); n], n).ok();
        let Some(one) = row(width) else {
            return 0;
        };
        let state = if aux > 0 { row(width * aux) } else { None };
        let range = KeyRange::new(Key::MAX - 2, Key::MAX).unwrap_or(KeyRange::FULL);
        let slice = SliceRef {
            request: u64::MAX,
            slice: u32::MAX,
        };
        let record = |worker| DedupeRecord {
            worker,
            settled_below: u64::MAX,
            applied: crate::wire::smallvec![AppliedSpan {
                request: u64::MAX,
                first: Key::MAX - 1,
                last: Key::MAX - 1,
            }],
        };
        let workers: Vec<NodeId> = self.layout().workers().collect();
        let mut bodies = vec![
            Message::Push(Push {
                slice,
                iteration: Iteration::MAX,
                covers: crate::pace::Coverage::WHOLE,
                settled_below: u64::MAX,
                kvs: one.clone(),
            }),
            Message::PullReply(PullReply {
                slice,
                complete_below: Iteration::MAX,
                kvs: one.clone(),
                resume: Some(Key::MAX),
            }),
            Message::Replicate {
                updates: vec![Replicate {
                    range,
                    seq: u64::MAX,
                    span: u64::MAX,
                    update: ShardUpdate::Buffer {
                        iteration: Iteration::MAX,
                        kvs: one.clone(),
                    },
                    dedupe: crate::wire::smallvec![record(MAX_ID)],
                }],
            },
            Message::Transfer(Transfer {
                range,
                seq: u64::MAX,
                values: one,
                state,
                pending: Vec::new(),
                applied_below: Iteration::MAX,
                dedupe: workers.iter().map(|&w| record(w)).collect(),
                clocks: workers
                    .iter()
                    .map(|&worker| ClockRecord {
                        worker,
                        segments: vec![(range, Iteration::MAX)],
                    })
                    .collect(),
            }),
        ];
        let coordinator = self.coordinator_config();
        let servers: Vec<NodeId> = self.layout().servers().collect();
        if let Ok(c) = Coordinator::bootstrapped(coordinator, &servers, &workers)
            && let Some(config) = c.config()
        {
            let mut config = config.clone();
            config.epoch = u64::MAX;
            config.term = u64::MAX;
            config.incarnations = servers.iter().map(|&s| (s, u64::MAX)).collect();
            bodies.push(Message::Config(config));
        }
        let codec = Codec::new(usize::MAX);
        bodies
            .into_iter()
            .filter_map(|body| {
                let env = Envelope::new(MAX_ID, MAX_ID, u64::MAX, body);
                codec.encode(&env).ok().map(|frame| frame.len())
            })
            .max()
            .unwrap_or(0)
    }

    fn validate_stragglers(&self) -> Result<(), JobError> {
        let policy = &self.stragglers;
        let decides = policy.skip_ahead || policy.adaptive_tau.is_some();
        if decides && !matches!(self.consistency, Consistency::BoundedDelay(_)) {
            return Err(JobError::Stragglers(
                "skip-ahead and adaptive tau need bounded delay (bounded:TAU): sequential consistency applies an iteration's pushes together, and eventual consistency holds nobody",
            ));
        }
        if decides && policy.detect.is_none() {
            return Err(JobError::Stragglers(
                "skip-ahead and adaptive tau act on the stragglers detection finds: turn detection on",
            ));
        }
        if policy.balance.is_some() && policy.detect.is_none() {
            return Err(JobError::Stragglers(
                "sizing shares by speed needs the speeds workers report with detection: turn detection on",
            ));
        }
        if let Some(b) = policy.balance
            && !(1 <= b.fewest && b.fewest <= b.per_worker && b.per_worker <= b.most)
        {
            return Err(JobError::Stragglers(
                "shares sized by speed need 1 <= fewest <= per worker <= most",
            ));
        }
        if let Some(range) = policy.adaptive_tau
            && range.min > range.max
        {
            return Err(JobError::Stragglers(
                "adaptive tau's range is empty: its minimum is above its maximum",
            ));
        }
        if let Some(d) = policy.detect
            && d.slower_by_percent > 0
            && d.window == 0
        {
            return Err(JobError::Stragglers(
                "a rate check needs a window of at least one check",
            ));
        }
        Ok(())
    }

    /// The coordinator's configuration.
    pub fn coordinator_config(&self) -> CoordinatorConfig {
        let mut cfg =
            CoordinatorConfig::new(self.layout().coordinator(), self.servers, self.workers);
        cfg.ring = self.ring;
        cfg.consistency = self.consistency;
        cfg.timing = self.timing;
        cfg.stragglers = self.stragglers;
        cfg.min_replicas = self.min_replicas;
        cfg.checkpoint_every = self.checkpoint_every;
        cfg.peers = self.standbys;
        cfg
    }

    /// The configuration of standby coordinator `id` (one of [`JobSpec::standbys`]): its
    /// peers are the layout's coordinator and the other standbys.
    pub fn standby_config(&self, id: NodeId) -> CoordinatorConfig {
        let mut cfg = self.coordinator_config();
        cfg.id = id;
        let peers: Vec<NodeId> = std::iter::once(self.layout().coordinator())
            .chain(self.standbys.iter())
            .filter(|&p| p != id)
            .collect();
        cfg.peers = Standbys::new(&peers).unwrap_or(self.standbys);
        cfg
    }

    /// The configuration of server `id` (not checked against the layout).
    pub fn server_config(&self, id: NodeId) -> ServerConfig {
        let mut cfg = ServerConfig::new(id, self.layout().coordinator());
        cfg.width = self.width;
        cfg.timing = self.timing;
        cfg.max_reply_bytes = self.max_reply_bytes;
        cfg.max_frame = self.max_frame;
        cfg.unregularized = self.unregularized;
        cfg.store = self.store;
        cfg.push_slots = self.push_slots;
        cfg.key_caching = self.filters.key_caching;
        cfg.compression = self.filters.compression;
        cfg.standbys = self.standbys;
        cfg
    }

    /// The configuration of worker `id` (not checked against the layout).
    pub fn worker_config(&self, id: NodeId) -> WorkerConfig {
        let mut cfg = WorkerConfig::new(id, self.layout().coordinator());
        cfg.width = self.width;
        cfg.timing = self.timing;
        cfg.max_slice_bytes = self.max_slice_bytes;
        cfg.max_slices_in_flight = self.max_slices_in_flight;
        cfg.max_bytes_in_flight = self.max_bytes_in_flight;
        cfg.seed = self.seed;
        cfg.report_position = self.stragglers.detect.is_some() || self.report_progress;
        cfg.push_slots = self.push_slots;
        cfg.filters = self.filters;
        cfg.keys_below = self.keys_below;
        cfg.standbys = self.standbys;
        cfg
    }

    /// The codec every node of the job uses.
    pub fn codec(&self) -> Codec {
        Codec::new(self.max_frame)
    }

    /// The driver of node `id`, once the job is [valid](JobSpec::validate) and `id` part of
    /// it. A server is started as process `incarnation`: a number that grows with every start
    /// of the server's process (wall-clock nanoseconds will do), so that the coordinator tells
    /// a restart, which lost its state, from a resent registration (ARCHITECTURE.md §8).
    pub fn driver<V: Value>(&self, id: NodeId, incarnation: u64) -> Result<Driver<V>, JobError> {
        self.validate::<V>()?;
        let layout = self.layout();
        let codec = self.codec();
        if id == layout.coordinator() {
            let coordinator = Coordinator::new(self.coordinator_config())?;
            return Ok(Driver::with_codec(coordinator, codec));
        }
        if self.standbys.iter().any(|s| s == id) {
            let standby = Coordinator::standby(self.standby_config(id))?;
            return Ok(Driver::with_codec(standby, codec));
        }
        if layout.servers().any(|s| s == id) {
            let mut cfg = self.server_config(id);
            cfg.incarnation = incarnation;
            return Ok(Driver::with_codec(Server::new(cfg, self.updater), codec));
        }
        if layout.workers().any(|w| w == id) {
            return Ok(Driver::with_codec(
                Worker::new(self.worker_config(id)),
                codec,
            ));
        }
        Err(JobError::NotInJob {
            id,
            servers: self.servers,
            workers: self.workers,
            last: self.servers + self.workers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_of_a_valid_job_is_built_with_the_job_s_settings() {
        let mut job = JobSpec::new(2, 2);
        job.width = 3;
        job.max_reply_bytes = 1 << 16;
        let ids = job.node_ids();
        assert_eq!(ids, (0..5).map(NodeId).collect::<Vec<_>>());
        for id in ids {
            let d = job.driver::<f64>(id, 7).expect("a node of the job");
            assert_eq!(d.id(), id);
            assert_eq!(d.codec(), job.codec());
        }
        assert_eq!(job.server_config(NodeId(1)).max_reply_bytes, 1 << 16);
        job.max_frame = 1 << 20;
        assert_eq!(job.server_config(NodeId(1)).max_frame, 1 << 20);
        assert_eq!(job.worker_config(NodeId(3)).width, 3);
    }

    /// A server of a job that declares a small key space lays its shards' parts of it out up
    /// front; one of a job that declares none, or one too large to lay out, does not.
    #[test]
    fn a_declared_key_space_is_laid_out_up_front_and_no_other() {
        for (space, laid_out) in [(1000, 1000), (u64::MAX, 0), (1 << 40, 0)] {
            let mut job = JobSpec::new(1, 1);
            job.store = StoreLayout::Hashed;
            job.ring.key_space = space;
            let (s, w) = (NodeId(1), NodeId(2));
            let coordinator =
                crate::coordinator::Coordinator::bootstrapped(job.coordinator_config(), &[s], &[w])
                    .expect("a job that can run");
            let config = coordinator.config().cloned().expect("a configuration");
            let mut d = job.driver::<f32>(s, 0).expect("a server of the job");
            d.start_configured(0, config);
            let crate::driver::Node::Server(server) = d.node() else {
                panic!("node 1 is not a server");
            };
            let spans: usize = server
                .shard_stores()
                .map(|store| match store {
                    crate::store::Store::Hashed(h) => h.direct_keys(),
                    crate::store::Store::Ordered(_) => 0,
                })
                .sum();
            assert_eq!(spans, laid_out, "key space {space}");
        }
    }

    #[test]
    fn servers_keep_their_rows_in_the_layout_the_job_names() {
        let mut job = JobSpec::new(1, 1);
        for layout in [StoreLayout::Hashed, StoreLayout::Ordered] {
            job.store = layout;
            let d = job
                .driver::<f32>(NodeId(1), 0)
                .expect("a server of the job");
            let crate::driver::Node::Server(server) = d.node() else {
                panic!("node 1 is not a server");
            };
            let hashed = matches!(server.template(), crate::store::Store::Hashed(_));
            assert_eq!(hashed, layout == StoreLayout::Hashed);
        }
    }

    #[test]
    fn a_job_that_cannot_work_is_refused_with_its_reason() {
        let bad = |change: fn(&mut JobSpec)| {
            let mut job = JobSpec::new(2, 2);
            change(&mut job);
            job.validate::<f32>().err()
        };
        assert_eq!(
            bad(|j| j.servers = 0),
            Some(JobError::Shape(CoordinatorError::NoServers))
        );
        assert_eq!(
            bad(|j| j.workers = 0),
            Some(JobError::Shape(CoordinatorError::NoWorkers))
        );
        assert!(matches!(
            bad(|j| j.ring.replicas = 2),
            Some(JobError::Shape(CoordinatorError::Ring { servers: 2, .. }))
        ));
        assert_eq!(
            bad(|j| {
                j.ring.replicas = 1;
                j.min_replicas = 2;
            }),
            Some(JobError::Shape(CoordinatorError::MinReplicas {
                min: 2,
                replicas: 1
            }))
        );
        assert_eq!(bad(|j| j.width = 0), Some(JobError::ZeroWidth));
        assert_eq!(
            bad(|j| j.max_slices_in_flight = 0),
            Some(JobError::NoSlicesInFlight)
        );
        // Slices and answers larger than a frame are cut to it by the driver: a datagram's
        // frame limit is all an embedder sets.
        assert_eq!(bad(|j| j.max_frame = 1024), None);
        assert_eq!(
            bad(|j| {
                j.push_slots = Some(PushSlots {
                    min_bytes: 1,
                    at_once: 0,
                })
            }),
            Some(JobError::NoPushSlots)
        );
        let mut tight = JobSpec::new(2, 2);
        let smallest = tight.smallest_frame::<f32>();
        tight.max_frame = smallest - 1;
        assert_eq!(
            tight.validate::<f32>(),
            Err(JobError::FrameTooSmall {
                max_frame: smallest - 1,
                smallest
            })
        );
        assert_eq!(bad(|_| {}), None);
    }

    #[test]
    fn a_node_outside_the_layout_is_refused() {
        let job = JobSpec::new(1, 1);
        assert_eq!(
            job.driver::<f32>(NodeId(2), 0).err(),
            None,
            "the one worker"
        );
        assert!(matches!(
            job.driver::<f32>(NodeId(3), 0),
            Err(JobError::NotInJob { last: 2, .. })
        ));
    }

    /// A datagram's 1,472 bytes carry every message of a small job, not of one with a thousand
    /// workers (its configuration lists them all); the error names the limit that works.
    #[test]
    fn the_smallest_frame_grows_with_the_job_and_is_named_when_refused() {
        let fitted = |mut job: JobSpec, frame: usize| {
            job.max_frame = frame;
            job.max_slice_bytes = frame;
            job.max_reply_bytes = frame;
            job
        };
        let small = fitted(JobSpec::new(3, 2), 1_472);
        assert!(small.smallest_frame::<f32>() < 1_472);
        assert_eq!(small.validate::<f32>(), Ok(()));
        let mut wide = JobSpec::new(3, 2);
        wide.width = 100;
        wide.updater = Updater::FtrlProximal {
            alpha: 0.1,
            beta: 1.0,
            l1: 0.0,
            l2: 0.0,
        };
        // One row and its state: 300 values of 8 bytes.
        assert!(wide.smallest_frame::<f64>() > 2_400);
        let crowd = fitted(JobSpec::new(3, 1_000), 1_472);
        let smallest = crowd.smallest_frame::<f32>();
        assert!(smallest > 1_472, "{smallest}");
        let err = crowd.validate::<f32>().unwrap_err();
        assert_eq!(
            err,
            JobError::FrameTooSmall {
                max_frame: 1_472,
                smallest
            }
        );
        assert!(err.to_string().contains(&smallest.to_string()), "{err}");
        assert_eq!(fitted(crowd, smallest).validate::<f32>(), Ok(()));
    }
}
