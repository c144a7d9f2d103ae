//! The cluster file as TOML gives it, before validation: every field with its default.

use std::path::PathBuf;

use pserver_core::Role;
use serde::Deserialize;
use serde::de::value::StrDeserializer;
use serde::de::{DeserializeOwned, Deserializer, IntoDeserializer};

use crate::commands::values::{Transport, UpdateRule};

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Raw {
    pub(super) cluster_id: String,
    #[serde(default = "default_consistency")]
    pub(super) consistency: String,
    pub(super) secret_file: Option<PathBuf>,
    #[serde(default = "default_transport")]
    pub(super) transport: Choice<Transport>,
    #[serde(default)]
    pub(super) ring: RawRing,
    #[serde(default)]
    pub(super) job: RawJob,
    #[serde(default)]
    pub(super) filters: RawFilters,
    #[serde(rename = "node", default)]
    pub(super) nodes: Vec<RawNode>,
}

fn default_consistency() -> String {
    "sequential".into()
}

/// The `[ring]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRing {
    #[serde(default = "default_vnodes")]
    pub(super) vnodes: u32,
    #[serde(default)]
    pub(super) seed: u64,
    pub(super) replicas: Option<u32>,
    #[serde(default)]
    pub(super) min_replicas: u32,
    pub(super) key_space: Option<u64>,
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
            min_replicas: 0,
            key_space: None,
        }
    }
}

/// The `[filters]` table: what every worker's pushes and pulls go through; none by default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFilters {
    pub(super) sigmod: Option<f64>,
    pub(super) key_cache: Option<u32>,
    #[serde(default)]
    pub(super) compress: bool,
    pub(super) kkt: Option<u32>,
}

/// The `[job]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJob {
    #[serde(default)]
    pub(super) app: Choice<App>,
    #[serde(default = "default_keys")]
    pub(super) keys: u64,
    #[serde(default = "default_iterations")]
    pub(super) iterations: u32,
    #[serde(default)]
    pub(super) compute_ms: u64,
    pub(super) data: Option<PathBuf>,
    pub(super) test: Option<PathBuf>,
    #[serde(default = "default_epochs")]
    pub(super) epochs: u32,
    #[serde(default = "default_batch")]
    pub(super) batch: usize,
    pub(super) updater: Option<Choice<UpdateRule>>,
    pub(super) lr: Option<f64>,
    pub(super) alpha: Option<f64>,
    pub(super) l1: Option<f64>,
    pub(super) l2: Option<f64>,
    pub(super) save: Option<PathBuf>,
    pub(super) init: Option<PathBuf>,
    #[serde(default = "yes")]
    pub(super) bias: bool,
    #[serde(default = "yes")]
    pub(super) shuffle: bool,
    #[serde(default)]
    pub(super) seed: u64,
    #[serde(default)]
    pub(super) index_base: RawBase,
    #[serde(default)]
    pub(super) allow_loss: bool,
    #[serde(default = "default_stall_limit_secs")]
    pub(super) stall_limit_secs: u64,
    pub(super) rank: Option<u32>,
    pub(super) test_fraction: Option<f64>,
    pub(super) validation_fraction: Option<f64>,
    pub(super) positive: Option<f64>,
    #[serde(default)]
    pub(super) checkpoint_every: u32,
    #[serde(default)]
    pub(super) stream: bool,
    pub(super) window: Option<u64>,
}

/// A worker that sees nothing complete for five minutes gives up.
fn default_stall_limit_secs() -> u64 {
    300
}

/// `index_base`: `0`, `1` or `"auto"` (numbers written as strings are taken too).
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub(super) enum RawBase {
    Number(i64),
    Name(String),
}

impl Default for RawBase {
    fn default() -> Self {
        RawBase::Name("auto".into())
    }
}

fn yes() -> bool {
    true
}

/// What the workers of a cluster run (`app` of the `[job]` table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum App {
    #[default]
    Script,
    Lr,
    Mf,
}

/// A field whose value is one of a fixed set of names, those of `T`'s variants; or else what
/// the file says instead, so that the error can name the field and say what it accepts.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Choice<T> {
    Known(T),
    Other(String),
}

impl<T> Choice<T> {
    /// The choice made, or what the file says instead.
    pub(super) fn known(self) -> Result<T, String> {
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

fn default_transport() -> Choice<Transport> {
    Choice::Known(Transport::Tcp)
}

fn default_epochs() -> u32 {
    10
}

fn default_batch() -> usize {
    100
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
            updater: None,
            lr: None,
            alpha: None,
            l1: None,
            l2: None,
            save: None,
            init: None,
            bias: true,
            shuffle: true,
            seed: 0,
            index_base: RawBase::default(),
            allow_loss: false,
            stall_limit_secs: default_stall_limit_secs(),
            rank: None,
            test_fraction: None,
            validation_fraction: None,
            positive: None,
            checkpoint_every: 0,
            stream: false,
            window: None,
        }
    }
}

/// One `[[node]]`: one node, or `count` of them whose addresses differ in `{i}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    pub(super) id: Option<u32>,
    pub(super) role: Choice<NodeRole>,
    pub(super) address: String,
    pub(super) count: Option<u32>,
    pub(super) metrics: Option<String>,
}

/// A node's `role`; core's [`Role`] is spelled with capitals in serde's formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum NodeRole {
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
