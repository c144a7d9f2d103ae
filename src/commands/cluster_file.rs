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
//!
//! [job]
//! keys = 1000
//! iterations = 20
//!
//! [[node]]
//! id = 0
//! role = "coordinator"
//! address = "127.0.0.1:7400"
//! # then the servers (ids 1..=S), then the workers
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pserver_core::{Consistency, NodeId, Role};
use pserver_transport::runtime::ClusterSpec;
use pserver_transport::tcp::{Secret, TcpConfig};
use pserver_transport::udp::UdpConfig;
use serde::Deserialize;
use serde::de::value::StrDeserializer;
use serde::de::{DeserializeOwned, Deserializer, IntoDeserializer};
use thiserror::Error;

use super::script::Script;

/// The environment variable that may carry the secret instead of a file.
pub const SECRET_ENV: &str = "PSERVER_SECRET";

/// Why a cluster file cannot be used. Every message names the file and, where there is one,
/// the field.
#[derive(Debug, Error)]
pub enum ClusterFileError {
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    cluster_id: String,
    #[serde(default = "default_consistency")]
    consistency: String,
    secret_file: Option<PathBuf>,
    #[serde(default)]
    transport: Choice<ProcessWire>,
    #[serde(default)]
    ring: RawRing,
    #[serde(default)]
    job: RawJob,
    #[serde(rename = "node", default)]
    nodes: Vec<RawNode>,
}

fn default_consistency() -> String {
    "sequential".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRing {
    #[serde(default = "default_vnodes")]
    vnodes: u32,
    #[serde(default)]
    seed: u64,
    replicas: Option<u32>,
}

fn default_vnodes() -> u32 {
    64
}

impl Default for RawRing {
    fn default() -> Self {
        RawRing {
            vnodes: default_vnodes(),
            seed: 0,
            replicas: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    #[serde(default)]
    app: Choice<App>,
    #[serde(default = "default_keys")]
    keys: u64,
    #[serde(default = "default_iterations")]
    iterations: u32,
    #[serde(default)]
    compute_ms: u64,
    data: Option<PathBuf>,
    test: Option<PathBuf>,
    #[serde(default = "default_epochs")]
    epochs: u32,
    #[serde(default = "default_batch")]
    batch: usize,
    #[serde(default = "default_alpha")]
    alpha: f64,
    #[serde(default = "default_l1")]
    l1: f64,
    #[serde(default = "default_l2")]
    l2: f64,
}

/// What the workers of a cluster run (`app` of the `[job]` table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum App {
    #[default]
    Script,
    Lr,
}

/// A field whose value is one of a fixed set of names, those of `T`'s variants; or else what
/// the file says instead, so that the error can name the field and say what it accepts.
#[derive(Debug, PartialEq, Eq)]
enum Choice<T> {
    Known(T),
    Other(String),
}

impl<T> Choice<T> {
    /// The choice made, or what the file says instead.
    fn known(self) -> Result<T, String> {
        match self {
            Choice::Known(t) => Ok(t),
            Choice::Other(s) => Err(s),
        }
    }
}

impl<T: Default> Default for Choice<T> {
    fn default() -> Self {
        Choice::Known(T::default())
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Choice<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        let as_variant: StrDeserializer<'_, serde::de::value::Error> =
            name.as_str().into_deserializer();
        Ok(T::deserialize(as_variant).map_or(Choice::Other(name), Choice::Known))
    }
}

fn default_epochs() -> u32 {
    10
}

fn default_batch() -> usize {
    100
}

fn default_alpha() -> f64 {
    0.3
}

fn default_l1() -> f64 {
    1.0
}

fn default_l2() -> f64 {
    1.0
}

/// What the workers of a cluster do.
#[derive(Clone, Debug, PartialEq)]
pub enum Job {
    /// The scripted workload, checked exactly (i64 values, summed).
    Script,
    /// Sparse logistic regression (f32 values, FTRL-Proximal on the servers).
    Lr(LrJob),
}

/// A logistic-regression job: where the data is and how to train.
#[derive(Clone, Debug, PartialEq)]
pub struct LrJob {
    /// Training data (LIBSVM); every worker reads its own byte range of it.
    pub data: PathBuf,
    /// Test data, measured by the first worker after every epoch.
    pub test: Option<PathBuf>,
    /// How to train.
    pub cfg: crate::apps::lr::LrConfig,
}

fn default_keys() -> u64 {
    1000
}

fn default_iterations() -> u32 {
    20
}

impl Default for RawJob {
    fn default() -> Self {
        RawJob {
            app: Choice::default(),
            keys: default_keys(),
            iterations: default_iterations(),
            compute_ms: 0,
            data: None,
            test: None,
            epochs: default_epochs(),
            batch: default_batch(),
            alpha: default_alpha(),
            l1: default_l1(),
            l2: default_l2(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: u32,
    role: Choice<NodeRole>,
    address: String,
}

/// A node's `role`; core's [`Role`] is spelled with capitals in serde's formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum NodeRole {
    Coordinator,
    Server,
    Worker,
}

impl From<NodeRole> for Role {
    fn from(role: NodeRole) -> Self {
        match role {
            NodeRole::Coordinator => Role::Coordinator,
            NodeRole::Server => Role::Server,
            NodeRole::Worker => Role::Worker,
        }
    }
}

/// A validated cluster file.
#[derive(Clone, Debug)]
pub struct ClusterFile {
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
    /// Every node's address, by id.
    pub addresses: BTreeMap<NodeId, SocketAddr>,
    /// Every node's role, by id.
    pub roles: BTreeMap<NodeId, Role>,
    /// How the nodes talk.
    pub transport: ProcessWire,
    secret_file: Option<PathBuf>,
}

/// The transport a cluster file names (`transport = "tcp"` or `"udp"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessWire {
    /// Authenticated TCP connections.
    #[default]
    Tcp,
    /// UDP datagrams, each with a MAC from the shared secret.
    Udp,
}

impl ClusterFile {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ClusterFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Validates the text of a cluster file read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ClusterFileError> {
        let raw: Raw = toml::from_str(text).map_err(|e| ClusterFileError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        let invalid = |field: &str, message: String| ClusterFileError::Invalid {
            path: path.to_owned(),
            field: field.to_owned(),
            message,
        };
        let consistency: Consistency = raw
            .consistency
            .parse()
            .map_err(|e| invalid("consistency", format!("{e}")))?;
        let transport = raw.transport.known().map_err(|other| {
            invalid(
                "transport",
                format!(
                    "`{other}` is not a transport for separate processes: use \"tcp\" or \"udp\" (`pserver local` runs the in-memory one)"
                ),
            )
        })?;
        if raw.cluster_id.is_empty() || raw.cluster_id.len() > 256 {
            return Err(invalid("cluster_id", "must be 1 to 256 bytes long".into()));
        }
        let mut addresses = BTreeMap::new();
        let mut roles = BTreeMap::new();
        for (i, node) in raw.nodes.into_iter().enumerate() {
            let field = |name: &str| format!("node[{i}].{name}");
            let role: Role = node
                .role
                .known()
                .map_err(|other| {
                    invalid(
                        &field("role"),
                        format!("`{other}` is not coordinator, server or worker"),
                    )
                })?
                .into();
            let address: SocketAddr = node.address.parse().map_err(|_| {
                invalid(
                    &field("address"),
                    format!("`{}` is not an address like 127.0.0.1:7400", node.address),
                )
            })?;
            let id = NodeId(node.id);
            if addresses.insert(id, address).is_some() {
                return Err(invalid(
                    &field("id"),
                    format!("node id {} appears twice", node.id),
                ));
            }
            roles.insert(id, role);
        }
        let count = |r: Role| roles.values().filter(|&&x| x == r).count();
        let (servers, workers) = (count(Role::Server), count(Role::Worker));
        if count(Role::Coordinator) != 1 || servers == 0 || workers == 0 {
            return Err(invalid(
                "node",
                format!(
                    "a cluster needs one coordinator, at least one server and one worker; this one has {}, {servers} and {workers}",
                    count(Role::Coordinator)
                ),
            ));
        }
        let mut spec = ClusterSpec::new(servers, workers);
        spec.consistency = consistency;
        spec.ring.vnodes = raw.ring.vnodes;
        spec.ring.seed = raw.ring.seed;
        // One replica of every range by default, so that a server may die without losing
        // anything, when there is a second server to hold it.
        spec.ring.replicas = raw.ring.replicas.unwrap_or(u32::from(servers > 1));
        if spec.ring.replicas as usize >= servers {
            return Err(invalid(
                "ring.replicas",
                format!(
                    "{} replicas need at least {} servers, but the file names {servers}",
                    spec.ring.replicas,
                    spec.ring.replicas + 1
                ),
            ));
        }
        let layout = spec.layout();
        let expected = std::iter::once((layout.coordinator(), Role::Coordinator))
            .chain(layout.servers().map(|s| (s, Role::Server)))
            .chain(layout.workers().map(|w| (w, Role::Worker)));
        for (id, role) in expected {
            if roles.get(&id) != Some(&role) {
                return Err(invalid(
                    "node",
                    format!(
                        "node ids must be 0 for the coordinator, 1..={servers} for the servers and {}..={} for the workers; {id} should be a {role}",
                        servers + 1,
                        servers + workers
                    ),
                ));
            }
        }
        if raw.job.keys == 0 || raw.job.keys > 10_000_000 {
            return Err(invalid("job.keys", "must be between 1 and 10000000".into()));
        }
        let relative = |f: PathBuf| match path.parent() {
            Some(dir) if f.is_relative() => dir.join(f),
            _ => f,
        };
        let app = raw.job.app.known().map_err(|other| {
            invalid(
                "job.app",
                format!("`{other}` is not a job: expected \"script\" or \"lr\""),
            )
        })?;
        let job = match app {
            App::Script => Job::Script,
            App::Lr => {
                let data = raw.job.data.clone().map(relative).ok_or_else(|| {
                    invalid("job.data", "an lr job needs the training data file".into())
                })?;
                spec.updater = pserver_core::Updater::FtrlProximal {
                    alpha: raw.job.alpha,
                    beta: 1.0,
                    l1: raw.job.l1,
                    l2: raw.job.l2,
                };
                Job::Lr(LrJob {
                    data,
                    test: raw.job.test.clone().map(relative),
                    cfg: crate::apps::lr::LrConfig {
                        servers,
                        workers,
                        consistency,
                        epochs: raw.job.epochs,
                        batch: raw.job.batch.max(1),
                        updater: spec.updater,
                        transport: crate::apps::lr::Wire::Tcp,
                    },
                })
            }
        };
        spec.driver::<i64>(layout.coordinator())
            .map_err(|e| invalid("ring", e.to_string()))?;
        let script = Script {
            keys: raw.job.keys,
            iterations: raw.job.iterations,
            compute: Duration::from_millis(raw.job.compute_ms),
        };
        let secret_file = raw.secret_file.map(|f| match path.parent() {
            Some(dir) if f.is_relative() => dir.join(f),
            _ => f,
        });
        Ok(ClusterFile {
            path: path.to_owned(),
            cluster_id: raw.cluster_id,
            spec,
            script,
            job,
            addresses,
            roles,
            transport,
            secret_file,
        })
    }

    /// The shared secret: the environment variable if set, else the secret file.
    pub fn secret(&self) -> Result<Secret, ClusterFileError> {
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
    pub fn tcp(&self, id: NodeId) -> Result<TcpConfig, ClusterFileError> {
        let listen = *self
            .addresses
            .get(&id)
            .ok_or_else(|| ClusterFileError::Invalid {
                path: self.path.clone(),
                field: "node".into(),
                message: format!("there is no node with id {}", id.0),
            })?;
        let mut cfg = TcpConfig::new(
            id,
            listen,
            self.addresses.clone(),
            self.cluster_id.clone(),
            self.secret()?,
        );
        cfg.max_frame = self.spec.max_frame + 64;
        Ok(cfg)
    }

    /// The UDP transport's configuration for node `id`: the same addresses (as UDP ports) and
    /// the shared secret, which keys every datagram's MAC.
    pub fn udp(&self, id: NodeId) -> Result<UdpConfig, ClusterFileError> {
        let tcp = self.tcp(id)?;
        let mut cfg = UdpConfig::new(id, tcp.listen, tcp.peers);
        cfg.secret = Some(tcp.secret);
        cfg.limits.max_frame = tcp.max_frame;
        Ok(cfg)
    }

    /// The role of node `id`, or an error naming the file.
    pub fn role(&self, id: NodeId) -> Result<Role, ClusterFileError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
cluster_id = "t"
consistency = "bounded:2"
secret_file = "s.key"
[job]
keys = 10
iterations = 3
[[node]]
id = 0
role = "coordinator"
address = "127.0.0.1:7400"
[[node]]
id = 1
role = "server"
address = "127.0.0.1:7401"
[[node]]
id = 2
role = "worker"
address = "127.0.0.1:7402"
"#;

    fn parse(text: &str) -> Result<ClusterFile, ClusterFileError> {
        ClusterFile::parse(Path::new("/etc/pserver/c.toml"), text)
    }

    #[test]
    fn a_good_file_gives_the_job_and_every_address() {
        let f = parse(GOOD).unwrap();
        assert_eq!(f.spec.consistency, Consistency::BoundedDelay(2));
        assert_eq!((f.spec.servers, f.spec.workers), (1, 1));
        assert_eq!(f.script.iterations, 3);
        assert_eq!(f.addresses.len(), 3);
        assert_eq!(f.secret_file, Some(PathBuf::from("/etc/pserver/s.key")));
    }

    #[test]
    fn the_transport_is_tcp_by_default_udp_on_request_and_nothing_else() {
        assert_eq!(parse(GOOD).unwrap().transport, ProcessWire::Tcp);
        let udp = GOOD.replace(
            "cluster_id = \"t\"",
            "cluster_id = \"t\"\ntransport = \"udp\"",
        );
        let f = parse(&udp).unwrap();
        assert_eq!(f.transport, ProcessWire::Udp);
        let mem = GOOD.replace(
            "cluster_id = \"t\"",
            "cluster_id = \"t\"\ntransport = \"mem\"",
        );
        let e = parse(&mem).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/pserver/c.toml: transport: `mem`") && e.contains("\"udp\""),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let bad_role = GOOD.replace("\"server\"", "\"sever\"");
        let e = parse(&bad_role).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/pserver/c.toml: node[1].role: `sever`"),
            "{e}"
        );
        let bad_addr = GOOD.replace("127.0.0.1:7402", "localhost");
        let e = parse(&bad_addr).unwrap_err().to_string();
        assert!(e.contains("node[2].address"), "{e}");
        let bad_consistency = GOOD.replace("bounded:2", "bounded");
        let e = parse(&bad_consistency).unwrap_err().to_string();
        assert!(e.contains("c.toml: consistency:"), "{e}");
        let e = parse("cluster_id = 3").unwrap_err().to_string();
        assert!(e.contains("c.toml:") && e.contains("line 1"), "{e}");
        let swapped = GOOD.replace("id = 1", "id = 9");
        let e = parse(&swapped).unwrap_err().to_string();
        assert!(e.contains("node ids must be"), "{e}");
        let bad_app = GOOD.replace("keys = 10", "app = \"nn\"\nkeys = 10");
        let e = parse(&bad_app).unwrap_err().to_string();
        assert!(e.starts_with("/etc/pserver/c.toml: job.app: `nn`"), "{e}");
        let not_a_name = GOOD.replace("\"worker\"", "3");
        let e = parse(&not_a_name).unwrap_err().to_string();
        assert!(
            e.contains("line 18") && e.contains("expected a string"),
            "{e}"
        );
    }

    #[test]
    fn a_job_runs_the_script_unless_it_names_lr() {
        assert_eq!(parse(GOOD).unwrap().job, Job::Script);
        let lr = GOOD.replace("keys = 10", "app = \"lr\"\ndata = \"t.svm\"\nkeys = 10");
        let Job::Lr(job) = parse(&lr).unwrap().job else {
            panic!("not an lr job");
        };
        assert_eq!(job.data, PathBuf::from("/etc/pserver/t.svm"));
    }
}
