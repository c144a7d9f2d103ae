//! What the hand-driven node tests share: the coordinator's id, a small ring, and the
//! configurations that tests hand to nodes. Each test file uses only part of it.
#![allow(dead_code)]

use pserver_core::ring::*;
use pserver_core::wire::ClusterConfig;
use pserver_core::wire::*;
use pserver_core::*;

pub(crate) const COORD: NodeId = NodeId(0);

/// Eight virtual nodes per server and no replicas: every key has exactly one owner.
pub(crate) fn ring() -> RingConfig {
    RingConfig {
        vnodes: 8,
        replicas: 0,
        seed: 1,
        ..RingConfig::default()
    }
}

/// The configuration of `epoch` with servers `servers` (node ids) and `workers`.
pub(crate) fn config(
    epoch: Epoch,
    servers: &[u32],
    workers: &[NodeId],
    c: Consistency,
) -> ClusterConfig {
    ClusterConfig {
        epoch,
        coordinator: COORD,
        standbys: Vec::new(),
        term: 0,
        servers: servers.iter().map(|&s| NodeId(s)).collect(),
        workers: workers.to_vec(),
        ring: ring(),
        consistency: c,
        joining: Vec::new(),
        leaving: Vec::new(),
        shares: workers.to_vec(),
        left: vec![],
        lost: vec![],
        incarnations: Vec::new(),
        pace: Default::default(),
        checkpoints: Default::default(),
    }
}

/// `config` as the coordinator sends it to `to`.
pub(crate) fn deliver_config<V: Value>(to: NodeId, config: &ClusterConfig) -> Envelope<V> {
    Envelope::new(COORD, to, config.epoch, Message::Config(config.clone()))
}
