//! The cluster file: one TOML file naming every node's address, the consistency model, the ring
//! and the job, shared by every process of a cluster.
//!
//! ```toml
//! cluster_id = "demo"
//! consistency = "bounded:2"
//! secret_file = "secret.key"   # relative to this file; or set PSERVER_SECRET instead
//!
//! [ring]
//! vnodes = 64
//! seed = 0
//! replicas = 1                 # copies of each range besides its primary; default 1 (0 with one server)
//! min_replicas = 0             # fewest copies the job goes on with after servers crash; default 0
//! key_space = 1048576          # the job's keys are 0..key_space (an lr job: the data's
//!                              # dimension), spread over every server; default all of u64
//!
//! [job]                        # app = "lr" and "mf" take data files: docs/operating.md
//! keys = 1000
//! iterations = 20
//! checkpoint_every = 0         # iterations between whole-job checkpoints (servers started
//!                              # with --checkpoint-dir write them); default 0, none
//!
//! [filters]                    # none by default
//! key_cache = 256              # lists kept per peer
//! compress = true              # with key_cache
//! sigmod = 5                   # the significantly-modified filter's threshold
//! kkt = 500                    # an lr job with updater "ftrl" and l1 above 0: full check period
//!
//! [[node]]
//! id = 0
//! role = "coordinator"
//! address = "127.0.0.1:7400"
//! # then the servers (ids 1..=S), then the workers, then any standby coordinators (a second
//! # `role = "coordinator"`, its id after the workers'), which take over if the first dies
//! ```

mod raw;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pserver_core::{Consistency, NodeId, Role, Updater};

use pserver_core::filter::{Filters, Kkt, Threshold};
use pserver_runtime::ClusterSpec;
use pserver_transport::Address;
use pserver_transport::tcp::{Secret, TcpConfig};
use pserver_transport::udp::UdpConfig;
use thiserror::Error;

use super::script::Script;
use super::values::{
    Fraction, KktEvery, Rate, Strength, Transport, UpdateRule, key_caching_of, threshold_of,
};
use crate::apps::lr::{Keep, LrConfig, Rates, Wire};
use crate::apps::mf::{self, MfConfig};
use crate::data::libsvm::{IndexBase, Labels};
use raw::{App, Choice, Raw, RawBase, RawFilters, RawJob, RawNode, RawRing};

/// The environment variable that may carry the secret instead of a file.
pub(crate) const SECRET_ENV: &str = "PSERVER_SECRET";

/// Why a cluster file cannot be used. Every message names the file and, where there is one,
/// the field.
#[derive(Debug, Error)]
pub(crate) enum ClusterFileError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A field has a value that cannot work.
    #[error("{path}: {field}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// No secret was given.
    #[error(
        "{path}: no secret: set secret_file in the cluster file or the {SECRET_ENV} environment variable (never on the command line)"
    )]
    NoSecret {
        /// The file.
        path: PathBuf,
    },
    /// The secret file could not be read.
    #[error("{path}: secret_file {secret}: cannot read: {source}")]
    SecretFile {
        /// The cluster file.
        path: PathBuf,
        /// The secret file.
        secret: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What the workers of a cluster do.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Job {
    /// The scripted workload, checked exactly (i64 values, summed).
    Script,
    /// Sparse logistic regression (f32 values, FTRL-Proximal on the servers).
    Lr(Box<LrJob>),
    /// Matrix factorization (f32 factors of width `rank`, SGD on the servers).
    Mf(Box<MfJob>),
}

/// A matrix-factorization job: where the ratings are and how to train.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MfJob {
    /// Training ratings (MovieLens u.data or ratings.dat, or CSV with a header); every worker
    /// reads them all and trains its share.
    pub data: PathBuf,
    /// Test ratings, measured after every epoch by the worker holding the first share; without
    /// them, `test_fraction` of `data` is held out.
    pub test: Option<PathBuf>,
    /// The fraction of `data` held out for testing when there is no `test`.
    pub test_fraction: f64,
    /// Where the worker holding the first share saves the model after the last epoch.
    pub save: Option<PathBuf>,
    /// The saved model the job starts from: every node reads it, and the servers start the
    /// users and items of the data it holds where it left them.
    pub init: Option<PathBuf>,
    /// How to train (`servers` and `workers` are the file's).
    pub cfg: MfConfig,
}

/// A logistic-regression job: where the data is and how to train.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LrJob {
    /// Training data (LIBSVM); every worker reads its own byte range of it.
    pub data: PathBuf,
    /// Test data, measured after every epoch by the worker holding the first share.
    pub test: Option<PathBuf>,
    /// Where the worker holding the first share saves the model: the epoch with the lowest
    /// test log loss, or the last without a test set.
    pub save: Option<PathBuf>,
    /// The saved model the job starts from (`pserver train --save`'s file): the servers start
    /// their keys there, and the data is read with the model's index base.
    pub init: Option<PathBuf>,
    /// How every file of the job counts its feature indices.
    pub index_base: IndexBase,
    /// How every file's labels read: binary, or rows of this label positive and the rest
    /// negative (`pserver train --positive`).
    pub labels: Labels,
    /// With `stream`, the rows of a window each worker reads of its share at a time
    /// (`pserver train --stream --window`): the worker then never holds the file.
    pub window: Option<usize>,
    /// How to train.
    pub cfg: crate::apps::lr::LrConfig,
}

/// A validated cluster file.
#[derive(Clone, Debug)]
pub(crate) struct ClusterFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// The cluster's name; nodes of another cluster are refused.
    pub cluster_id: String,
    /// The job's shape.
    pub spec: ClusterSpec,
    /// The workers' script.
    pub script: Script,
    /// What the workers do.
    pub job: Job,
    /// Every node's address, by id: an IP address, or a host name resolved on every connect.
    pub addresses: BTreeMap<NodeId, Address>,
    /// Every node's role, by id.
    pub roles: BTreeMap<NodeId, Role>,
    /// Where nodes serve `/healthz`, `/metrics` and (the coordinator) `/status`, by id, for
    /// those whose `[[node]]` names a `metrics` address (`--metrics` overrides it).
    pub metrics: BTreeMap<NodeId, Address>,
    /// How the nodes talk.
    pub transport: ProcessWire,
    /// Whether the job may end well after losing key ranges with their holders (more
    /// servers failed than the ring has replicas): `job.allow_loss`, false by default, so
    /// that such a job's workers exit non-zero naming the ranges.
    pub allow_loss: bool,
    secret_file: Option<PathBuf>,
}

/// The transport a cluster file names (`transport = "tcp"` or `"udp"`): one that crosses
/// processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProcessWire {
    /// Authenticated TCP connections.
    Tcp,
    /// UDP datagrams, each with a MAC from the shared secret.
    Udp,
}

impl ClusterFile {
    /// Reads and validates `path`.
    pub(crate) fn load(path: &Path) -> Result<Self, ClusterFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Validates the text of a cluster file read from `path`.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self, ClusterFileError> {
        let raw: Raw = toml::from_str(text).map_err(|e| ClusterFileError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        let origin = Origin { path };
        let consistency: Consistency = raw
            .consistency
            .parse()
            .map_err(|e| origin.invalid("consistency", format!("{e}")))?;
        let not_for_processes = |other: &str| {
            origin.invalid(
                "transport",
                format!(
                    "`{other}` is not a transport for separate processes: use \"tcp\" or \"udp\" (`pserver local` runs the in-memory one)"
                ),
            )
        };
        let transport = match raw.transport.known() {
            Ok(Transport::Tcp) => ProcessWire::Tcp,
            Ok(Transport::Udp) => ProcessWire::Udp,
            Ok(Transport::Mem) => return Err(not_for_processes("mem")),
            Err(other) => return Err(not_for_processes(&other)),
        };
        if raw.cluster_id.is_empty() || raw.cluster_id.len() > 256 {
            return Err(origin.invalid("cluster_id", "must be 1 to 256 bytes long"));
        }
        let Nodes {
            addresses,
            roles,
            metrics,
        } = nodes(raw.nodes, &origin)?;
        let mut spec = spec(&roles, consistency, &raw.ring, &origin)?;
        if raw.job.keys == 0 || raw.job.keys > 10_000_000 {
            return Err(origin.invalid("job.keys", "must be between 1 and 10000000"));
        }
        if raw.job.iterations == 0 {
            return Err(origin.invalid("job.iterations", "must be at least 1"));
        }
        let script = Script {
            keys: raw.job.keys,
            iterations: raw.job.iterations,
            compute: Duration::from_millis(raw.job.compute_ms),
        };
        let allow_loss = raw.job.allow_loss;
        // 0 waits for ever.
        spec.runtime.stall_limit =
            (raw.job.stall_limit_secs > 0).then(|| Duration::from_secs(raw.job.stall_limit_secs));
        // Said at least once before giving up.
        if let Some(limit) = spec.runtime.stall_limit {
            spec.runtime.stall_warning = spec.runtime.stall_warning.min(limit / 2);
        }
        spec.job.checkpoint_every = raw.job.checkpoint_every;
        let mut job = job(raw.job, &mut spec, &origin)?;
        // The coordinator says how far the job has come at the default log level.
        spec.job.report_progress = true;
        spec.job.filters = filters(&raw.filters, &job, &origin)?;
        if let Job::Lr(lr) = &mut job {
            // The application's copy of the job says what the nodes run.
            lr.cfg.job.filters = spec.job.filters;
            lr.cfg.job.checkpoint_every = spec.job.checkpoint_every;
        }
        spec.job
            .validate::<i64>()
            .map_err(|e| origin.invalid("ring", e.to_string()))?;
        Ok(ClusterFile {
            path: path.to_owned(),
            cluster_id: raw.cluster_id,
            spec,
            script,
            job,
            addresses,
            roles,
            metrics,
            transport,
            allow_loss,
            secret_file: raw.secret_file.map(|f| origin.relative(f)),
        })
    }

    /// The shared secret: the environment variable if set, else the secret file.
    pub(crate) fn secret(&self) -> Result<Secret, ClusterFileError> {
        if let Some(s) = std::env::var_os(SECRET_ENV).filter(|s| !s.is_empty()) {
            return Ok(Secret::new(s.into_encoded_bytes()));
        }
        let Some(file) = &self.secret_file else {
            return Err(ClusterFileError::NoSecret {
                path: self.path.clone(),
            });
        };
        let bytes = std::fs::read(file).map_err(|source| ClusterFileError::SecretFile {
            path: self.path.clone(),
            secret: file.clone(),
            source,
        })?;
        let trimmed = bytes.trim_ascii().to_vec();
        if trimmed.is_empty() {
            return Err(ClusterFileError::Invalid {
                path: self.path.clone(),
                field: "secret_file".into(),
                message: format!("{} is empty", file.display()),
            });
        }
        Ok(Secret::new(trimmed))
    }

    /// The TCP transport's configuration for node `id`.
    pub(crate) fn tcp(&self, id: NodeId) -> Result<TcpConfig, ClusterFileError> {
        // A node given by name listens on every interface at its port.
        let listen = self
            .addresses
            .get(&id)
            .ok_or_else(|| ClusterFileError::Invalid {
                path: self.path.clone(),
                field: "node".into(),
                message: format!("there is no node with id {}", id.0),
            })?
            .listen();
        let mut cfg = TcpConfig::new(
            id,
            listen,
            self.addresses.clone(),
            self.cluster_id.clone(),
            self.secret()?,
        );
        cfg.max_frame = self.spec.job.max_frame + 64;
        Ok(cfg)
    }

    /// The UDP transport's configuration for node `id`: the same addresses (as UDP ports) and
    /// the shared secret, which keys every datagram's MAC.
    pub(crate) fn udp(&self, id: NodeId) -> Result<UdpConfig, ClusterFileError> {
        let tcp = self.tcp(id)?;
        let mut cfg = UdpConfig::new(id, tcp.listen, tcp.peers);
        cfg.secret = Some(tcp.secret);
        cfg.limits.max_frame = tcp.max_frame;
        Ok(cfg)
    }

    /// The role of node `id`, or an error naming the file.
    pub(crate) fn role(&self, id: NodeId) -> Result<Role, ClusterFileError> {
        self.roles
            .get(&id)
            .copied()
            .ok_or_else(|| ClusterFileError::Invalid {
                path: self.path.clone(),
                field: "node".into(),
                message: format!("there is no node with id {}", id.0),
            })
    }
}

/// The file the fields being validated come from: errors name it, and paths in it are
/// relative to its directory.
struct Origin<'a> {
    path: &'a Path,
}

impl Origin<'_> {
    /// The error for a field of this file.
    fn invalid(&self, field: &str, message: impl Into<String>) -> ClusterFileError {
        ClusterFileError::Invalid {
            path: self.path.to_owned(),
            field: field.to_owned(),
            message: message.into(),
        }
    }

    /// `file` as named in this file: a relative path is relative to the file's directory.
    fn relative(&self, file: PathBuf) -> PathBuf {
        match self.path.parent() {
            Some(dir) if file.is_relative() => dir.join(file),
            _ => file,
        }
    }
}

/// Every node's address and role, by id.
struct Nodes {
    addresses: BTreeMap<NodeId, Address>,
    roles: BTreeMap<NodeId, Role>,
    metrics: BTreeMap<NodeId, Address>,
}

/// What `{i}` stands for in a `[[node]]` address with a `count`.
const PLACE: &str = "{i}";

/// The nodes the file names, each at most once: one per `[[node]]` with an `id`, or, where no
/// `[[node]]` has one, `count` per entry (its address with `{i}` counting from 0), numbered as
/// the layout numbers them (the coordinator 0, then the servers in the file's order, then the
/// workers).
fn nodes(nodes: Vec<RawNode>, origin: &Origin<'_>) -> Result<Nodes, ClusterFileError> {
    let with_ids = nodes.iter().filter(|n| n.id.is_some()).count();
    if with_ids != 0 && with_ids != nodes.len() {
        return Err(origin.invalid(
            "node",
            format!(
                "{with_ids} of {} [[node]] entries have an id: give every node an id, or none (then ids follow the layout: the coordinator 0, the servers from 1, the workers after)",
                nodes.len()
            ),
        ));
    }
    type Listed = (Option<NodeId>, Role, Address, String, Option<Address>);
    let mut listed: Vec<Listed> = Vec::new();
    for (i, node) in nodes.into_iter().enumerate() {
        let field = |name: &str| format!("node[{i}].{name}");
        let role: Role = node
            .role
            .known()
            .map_err(|other| {
                origin.invalid(
                    &field("role"),
                    format!("`{other}` is not coordinator, server or worker"),
                )
            })?
            .into();
        let patterned = node.address.contains(PLACE);
        let count = match (node.count, node.id, patterned) {
            (Some(0), ..) => return Err(origin.invalid(&field("count"), "must be at least 1")),
            (Some(_), Some(_), _) => {
                return Err(origin.invalid(
                    &field("count"),
                    "names several nodes, each with an id of its own: leave out id",
                ));
            }
            (Some(n), None, true) => n,
            (Some(1) | None, _, false) => 1,
            (Some(n), None, false) => {
                return Err(origin.invalid(
                    &field("address"),
                    format!(
                        "`{}` is one address for {n} nodes: put {PLACE} where they differ, as in pserver-server-{PLACE}.pserver-server:7400",
                        node.address
                    ),
                ));
            }
            (None, _, true) => {
                return Err(origin.invalid(
                    &field("address"),
                    format!(
                        "`{}` has {PLACE} but no count says how many nodes",
                        node.address
                    ),
                ));
            }
        };
        for place in 0..count {
            let written = node.address.replace(PLACE, &place.to_string());
            let shown = if count > 1 {
                format!("{} ({PLACE} = {place})", field("address"))
            } else {
                field("address")
            };
            let address: Address =
                written
                    .parse()
                    .map_err(|e: pserver_transport::AddressError| {
                        origin.invalid(&shown, e.to_string())
                    })?;
            if address.port() == 0 {
                // Port 0 asks the system for any free port, which no other node could know.
                return Err(origin.invalid(
                    &shown,
                    format!(
                        "`{written}` has port 0: every node needs a fixed port the others can reach"
                    ),
                ));
            }
            let metrics = match &node.metrics {
                Some(pattern) => {
                    let written = pattern.replace(PLACE, &place.to_string());
                    let parsed =
                        written
                            .parse()
                            .map_err(|e: pserver_transport::AddressError| {
                                origin.invalid(&field("metrics"), e.to_string())
                            })?;
                    Some(parsed)
                }
                None => None,
            };
            listed.push((node.id.map(NodeId), role, address, shown, metrics));
        }
    }
    if with_ids == 0 {
        // The layout's order: the coordinator, the servers, the workers, each in file order,
        // then the standby coordinators (every coordinator after the first).
        let first = listed
            .iter()
            .position(|(_, role, ..)| *role == Role::Coordinator);
        let rank = |at: usize, r: &Role| match r {
            Role::Coordinator if Some(at) == first => 0,
            Role::Coordinator => 3,
            Role::Server => 1,
            Role::Worker => 2,
        };
        let mut ranked: Vec<(usize, _)> = listed
            .into_iter()
            .enumerate()
            .map(|(at, entry)| (rank(at, &entry.1), entry))
            .collect();
        ranked.sort_by_key(|(rank, _)| *rank);
        listed = ranked.into_iter().map(|(_, entry)| entry).collect();
        for (n, entry) in listed.iter_mut().enumerate() {
            entry.0 = Some(NodeId(n as u32));
        }
    }
    let mut addresses: BTreeMap<NodeId, Address> = BTreeMap::new();
    let mut roles = BTreeMap::new();
    let mut metrics = BTreeMap::new();
    for (id, role, address, field, serves) in listed {
        let id = id.unwrap_or(NodeId(0));
        // Two nodes cannot listen on one address: the second would fail to bind, or on
        // different machines a peer would reach the wrong one. Host names are compared in
        // lower case, as `Address` keeps them.
        if let Some((other, _)) = addresses.iter().find(|(_, a)| **a == address) {
            return Err(origin.invalid(
                &field,
                format!("{address} is also the address of node {other}"),
            ));
        }
        if addresses.insert(id, address).is_some() {
            return Err(origin.invalid(&field, format!("node id {} appears twice", id.0)));
        }
        roles.insert(id, role);
        if let Some(serves) = serves {
            metrics.insert(id, serves);
        }
    }
    Ok(Nodes {
        addresses,
        roles,
        metrics,
    })
}

/// The cluster's shape, from the nodes' roles, which must number them as the layout does.
fn spec(
    roles: &BTreeMap<NodeId, Role>,
    consistency: Consistency,
    ring: &RawRing,
    origin: &Origin<'_>,
) -> Result<ClusterSpec, ClusterFileError> {
    let count = |r: Role| roles.values().filter(|&&x| x == r).count();
    let (servers, workers) = (count(Role::Server), count(Role::Worker));
    if count(Role::Coordinator) == 0 || servers == 0 || workers == 0 {
        return Err(origin.invalid(
            "node",
            format!(
                "a cluster needs a coordinator, at least one server and one worker; this one has {}, {servers} and {workers}",
                count(Role::Coordinator)
            ),
        ));
    }
    let mut spec = ClusterSpec::new(servers, workers);
    spec.job.consistency = consistency;
    spec.job.ring.vnodes = ring.vnodes;
    spec.job.ring.seed = ring.seed;
    spec.job.ring.key_space = match ring.key_space {
        Some(0) => {
            return Err(origin.invalid(
                "ring.key_space",
                "must be at least 1: the job's keys are 0..key_space",
            ));
        }
        Some(k) => k,
        None => u64::MAX,
    };
    // One replica of every range by default, so that a server may die without losing
    // anything, when there is a second server to hold it.
    spec.job.ring.replicas = ring.replicas.unwrap_or(u32::from(servers > 1));
    if spec.job.ring.replicas as usize >= servers {
        return Err(origin.invalid(
            "ring.replicas",
            format!(
                "{} replicas need at least {} servers, but the file names {servers}",
                spec.job.ring.replicas,
                u64::from(spec.job.ring.replicas) + 1
            ),
        ));
    }
    if ring.min_replicas > spec.job.ring.replicas {
        return Err(origin.invalid(
            "ring.min_replicas",
            format!(
                "{} is more than the ring's {} replicas",
                ring.min_replicas, spec.job.ring.replicas
            ),
        ));
    }
    spec.job.min_replicas = ring.min_replicas;
    let layout = spec.job.layout();
    let expected = std::iter::once((layout.coordinator(), Role::Coordinator))
        .chain(layout.servers().map(|s| (s, Role::Server)))
        .chain(layout.workers().map(|w| (w, Role::Worker)));
    let last = (servers + workers) as u32;
    let standbys: Vec<NodeId> = roles
        .iter()
        .filter(|&(&id, &role)| role == Role::Coordinator && id != layout.coordinator())
        .map(|(&id, _)| id)
        .collect();
    if let Some(early) = standbys.iter().find(|s| s.0 <= last) {
        return Err(origin.invalid(
            "node",
            format!(
                "{early} is a second coordinator (a standby): its id must follow the workers', above {last}"
            ),
        ));
    }
    spec.job.standbys = pserver_core::node::Standbys::new(&standbys)
        .map_err(|e| origin.invalid("node", e.to_string()))?;
    for (id, role) in expected {
        if roles.get(&id) != Some(&role) {
            return Err(origin.invalid(
                "node",
                format!(
                    "node ids must be 0 for the coordinator, 1..={servers} for the servers and {}..={} for the workers; {id} should be a {role}",
                    servers + 1,
                    servers + workers
                ),
            ));
        }
    }
    Ok(spec)
}

/// The update rule of an lr job, and its rates: each must be a number it can mean, and given
/// only to a rule that uses it.
fn updater(job: &RawJob, origin: &Origin<'_>) -> Result<Updater, ClusterFileError> {
    let rate = |field: &str, value: Option<f64>| {
        value
            .map(|v| Rate::new(v).map(Rate::get))
            .transpose()
            .map_err(|e| origin.invalid(field, e))
    };
    let strength = |field: &str, value: Option<f64>| {
        value
            .map(|v| Strength::new(v).map(Strength::get))
            .transpose()
            .map_err(|e| origin.invalid(field, e))
    };
    let rule = match job
        .updater
        .as_ref()
        .unwrap_or(&Choice::Known(UpdateRule::Ftrl))
    {
        Choice::Known(rule) => rule
            .lr_rule()
            .map_err(|e| origin.invalid("job.updater", e))?,
        Choice::Other(other) => {
            return Err(origin.invalid(
                "job.updater",
                format!(
                    "`{other}` is not an update rule: expected \"ftrl\", \"adagrad\" or \"sgd\""
                ),
            ));
        }
    };
    let rates = Rates {
        lr: rate("job.lr", job.lr)?,
        alpha: rate("job.alpha", job.alpha)?,
        l1: strength("job.l1", job.l1)?,
        l2: strength("job.l2", job.l2)?,
    };
    rule.updater(rates).map_err(|u| {
        origin.invalid(
            &format!("job.{}", u.rate),
            format!(
                "not used by updater \"{}\", which takes {}",
                u.rule,
                u.takes.join(", ")
            ),
        )
    })
}

/// The `[filters]` table, for `job`: each filter's setting must be one it can mean.
fn filters(raw: &RawFilters, job: &Job, origin: &Origin<'_>) -> Result<Filters, ClusterFileError> {
    let mut filters = Filters::none();
    if let Some(theta) = raw.sigmod {
        filters.significantly_modified =
            Some(threshold_of(theta).map_err(|e| origin.invalid("filters.sigmod", e))?);
    }
    if let Some(lists) = raw.key_cache {
        filters.key_caching =
            Some(key_caching_of(lists).map_err(|e| origin.invalid("filters.key_cache", e))?);
    }
    if raw.compress && filters.key_caching.is_none() {
        return Err(origin.invalid(
            "filters.compress",
            "compresses what key caching sends without keys: give filters.key_cache too",
        ));
    }
    filters.compression = raw.compress;
    if let Some(every) = raw.kkt {
        let every = KktEvery::new(every).map_err(|e| origin.invalid("filters.kkt", e))?;
        let l1 = match job {
            Job::Lr(lr) => match lr.cfg.job.updater {
                Updater::FtrlProximal { l1, .. } => l1,
                _ => {
                    return Err(origin.invalid(
                        "filters.kkt",
                        "needs an L1-regularised model: job.updater \"ftrl\"",
                    ));
                }
            },
            Job::Script | Job::Mf(_) => {
                return Err(origin.invalid(
                    "filters.kkt",
                    "needs an L1-regularised model: an lr job (job.app = \"lr\")",
                ));
            }
        };
        let bound = Threshold::new(l1)
            .filter(|b| b.get() > 0.0)
            .ok_or_else(|| {
                origin.invalid("filters.kkt", format!("needs job.l1 above 0, not {l1}"))
            })?;
        filters.kkt = Kkt::new(bound, every.get());
    }
    Ok(filters)
}

/// What the workers do. A logistic-regression job also sets the servers' update rule in
/// `spec`.
fn job(
    mut job: RawJob,
    spec: &mut ClusterSpec,
    origin: &Origin<'_>,
) -> Result<Job, ClusterFileError> {
    let app = std::mem::take(&mut job.app).known().map_err(|other| {
        origin.invalid(
            "job.app",
            format!("`{other}` is not a job: expected \"script\", \"lr\" or \"mf\""),
        )
    })?;
    if app == App::Script {
        return Ok(Job::Script);
    }
    let data = job
        .data
        .clone()
        .map(|f| origin.relative(f))
        .ok_or_else(|| origin.invalid("job.data", "this job needs the training data file"))?;
    // Checked here rather than left to training: a NaN rate trains to NaN, a zero batch
    // never ends an epoch, and the nodes would find out only after joining.
    if job.epochs == 0 {
        return Err(origin.invalid("job.epochs", "must be at least 1"));
    }
    if job.batch == 0 {
        return Err(origin.invalid("job.batch", "must be at least 1"));
    }
    if app == App::Mf {
        // Its workers would train every epoch again on top of the restored factors.
        if job.checkpoint_every > 0 {
            return Err(origin.invalid(
                "job.checkpoint_every",
                "an mf job cannot resume from whole-job checkpoints yet: leave it 0 (pserver train mf --checkpoint-dir checkpoints in one process)",
            ));
        }
        return mf_job(job, data, spec, origin);
    }
    for (field, given) in [
        ("job.rank", job.rank.is_some()),
        ("job.test_fraction", job.test_fraction.is_some()),
    ] {
        if given {
            return Err(origin.invalid(field, "only an mf job (job.app = \"mf\") takes it"));
        }
    }
    spec.job.updater = updater(&job, origin)?;
    // The names `--index-base` takes on the command line: `0`, `1`, `auto`.
    let (name, shown) = match &job.index_base {
        RawBase::Number(n) => (n.to_string(), n.to_string()),
        RawBase::Name(s) => (s.clone(), format!("\"{s}\"")),
    };
    let index_base = <IndexBase as clap::ValueEnum>::from_str(&name, false).map_err(|_| {
        origin.invalid(
            "job.index_base",
            format!("{shown} is not an index base: expected 0, 1 or \"auto\""),
        )
    })?;
    spec.job.store = LrConfig::default().job.store;
    // As `pserver train`: with a model to save from several epochs, a tenth of the training
    // rows chooses the epoch kept, so that the test rows never do.
    let validation = match job.validation_fraction {
        // Every row trained, the test rows choosing, as before there was a choice.
        Some(0.0) => 0.0,
        Some(given) => Fraction::new(given)
            .map_err(|e| origin.invalid("job.validation_fraction", e))?
            .get(),
        None if job.save.is_some() && job.epochs > 1 => 0.1,
        None => 0.0,
    };
    let window = match (job.stream, job.window) {
        (false, Some(_)) => {
            return Err(origin.invalid(
                "job.window",
                "the rows a streamed job reads at a time: set job.stream = true, or leave it out",
            ));
        }
        (false, None) => None,
        (true, None) => Some(DEFAULT_WINDOW),
        (true, Some(0)) => return Err(origin.invalid("job.window", "must be at least 1")),
        (true, Some(rows)) => Some(usize::try_from(rows).unwrap_or(usize::MAX)),
    };
    let labels = match job.positive {
        None => Labels::Binary,
        // As the data file's labels are read: to the nearest f32.
        Some(label) if label.is_finite() => Labels::Positive(label as f32),
        Some(label) => {
            return Err(origin.invalid(
                "job.positive",
                format!("{label} is not a label a data file can hold"),
            ));
        }
    };
    let cfg = LrConfig {
        job: spec.job.clone(),
        epochs: job.epochs,
        batch: job.batch,
        transport: Wire::Tcp,
        bias: job.bias,
        shuffle: job.shuffle,
        seed: job.seed,
        keep: Keep::Best,
        early_stop: None,
        validation: (validation > 0.0).then_some(validation),
        pipeline: true,
        initial: None,
        checkpoints: None,
        resume: false,
    }
    .with_bias(job.bias);
    // The servers are built from `spec`: they must know the intercept's key too, and hold
    // pulled-ahead batches to the bound the pipelined workers need.
    spec.job = cfg.protocol_job();
    Ok(Job::Lr(Box::new(LrJob {
        data,
        test: job.test.map(|f| origin.relative(f)),
        save: job.save.map(|f| origin.relative(f)),
        init: job.init.map(|f| origin.relative(f)),
        index_base,
        labels,
        window,
        cfg,
    })))
}

/// Rows of a window with `job.stream` and no `job.window`, as `pserver train --window`.
const DEFAULT_WINDOW: usize = 20_000;

/// A matrix-factorization job: SGD on the servers, factors of width `rank`.
fn mf_job(
    job: RawJob,
    data: PathBuf,
    spec: &mut ClusterSpec,
    origin: &Origin<'_>,
) -> Result<Job, ClusterFileError> {
    if job
        .updater
        .as_ref()
        .is_some_and(|u| *u != Choice::Known(UpdateRule::Sgd))
    {
        return Err(origin.invalid(
            "job.updater",
            "an mf job trains with \"sgd\" (its rate is job.lr)",
        ));
    }
    for (field, given) in [
        ("job.alpha", job.alpha.is_some()),
        ("job.l1", job.l1.is_some()),
        ("job.validation_fraction", job.validation_fraction.is_some()),
        ("job.positive", job.positive.is_some()),
        ("job.stream", job.stream),
        ("job.window", job.window.is_some()),
    ] {
        if given {
            return Err(origin.invalid(field, "not used by an mf job"));
        }
    }
    if job.test.is_some() && job.test_fraction.is_some() {
        return Err(origin.invalid(
            "job.test_fraction",
            "holds out part of job.data when there is no job.test: give one or the other",
        ));
    }
    let rank = match job.rank {
        Some(r @ 1..=1000) => r as usize,
        Some(r) => {
            return Err(origin.invalid("job.rank", format!("{r} is not a rank from 1 to 1000")));
        }
        None => 10,
    };
    let lr = Rate::new(job.lr.unwrap_or(0.05)).map_err(|e| origin.invalid("job.lr", e))?;
    let l2 = Strength::new(job.l2.unwrap_or(0.05)).map_err(|e| origin.invalid("job.l2", e))?;
    let test_fraction = Fraction::new(job.test_fraction.unwrap_or(0.1))
        .map_err(|e| origin.invalid("job.test_fraction", e))?;
    let cfg = MfConfig {
        servers: spec.job.servers,
        workers: spec.job.workers,
        consistency: spec.job.consistency,
        rank,
        epochs: job.epochs,
        batch: job.batch,
        lr: lr.get(),
        l2: l2.get(),
        seed: job.seed,
        // A cluster job saves its last epoch: it holds no ratings out to choose another.
        early_stop: None,
        keep_best: false,
    };
    mf::job_of(&cfg, &mut spec.job);
    Ok(Job::Mf(Box::new(MfJob {
        data,
        test: job.test.map(|f| origin.relative(f)),
        test_fraction: test_fraction.get(),
        save: job.save.map(|f| origin.relative(f)),
        init: job.init.map(|f| origin.relative(f)),
        cfg,
    })))
}
