//! A node's view of the cluster: the configuration of an epoch and the ring built from it.

use crate::consistency::Consistency;
use crate::effects::Refusal;
use crate::ids::{Epoch, NodeId};
use crate::key::{Key, KeyRange};
use crate::ring::{Ring, RingError};
use crate::wire::ClusterConfig;

/// A configuration together with its ring (rebuilt locally; rings are deterministic).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Cluster {
    pub(crate) config: ClusterConfig,
    pub(crate) ring: Ring,
    /// The ring a change under way leads to.
    pub(crate) next: Option<Ring>,
    /// The first epoch of this membership: epochs since then changed only the pace
    /// (ARCHITECTURE.md §9), so what servers sent each other under them still holds.
    pub(crate) members_since: Epoch,
}

impl Cluster {
    pub(crate) fn new(config: ClusterConfig) -> Result<Cluster, RingError> {
        let ring = config.ring_in_force()?;
        if let Some(&s) = config.joining.iter().find(|s| config.servers.contains(s)) {
            return Err(RingError::DuplicateServer(s));
        }
        if let Some(&s) = config.leaving.iter().find(|s| !config.servers.contains(s)) {
            return Err(RingError::UnknownServer(s));
        }
        let next = if config.is_changing() {
            Some(config.next_ring()?)
        } else {
            None
        };
        let members_since = config.epoch;
        Ok(Cluster {
            config,
            ring,
            next,
            members_since,
        })
    }

    /// The cluster of `config` if it supersedes `current`: a newer epoch of the same job, with a
    /// ring that can be built. The configuration in force again is `Ok(None)` (coordinators
    /// resend it freely). The consistency model is fixed for the life of a job, so a
    /// configuration that changes it belongs to another job and is refused, as is a corrupt one.
    pub(crate) fn successor(
        current: Option<&Cluster>,
        config: ClusterConfig,
    ) -> Result<Option<Cluster>, Refusal> {
        if let Some(current) = current {
            if config == current.config {
                return Ok(None);
            }
            if config.term < current.config.term {
                return Err(Refusal::StaleTerm {
                    term: config.term,
                    current: current.config.term,
                });
            }
            if config.epoch <= current.epoch() {
                return Err(Refusal::StaleEpoch {
                    epoch: config.epoch,
                    current: current.epoch(),
                });
            }
            if config.consistency != current.config.consistency {
                return Err(Refusal::ForeignJob);
            }
        }
        let mut next = Cluster::new(config).map_err(|_| Refusal::ForeignJob)?;
        if let Some(current) = current.filter(|c| c.config.differs_only_in_pace(&next.config)) {
            next.members_since = current.members_since;
        }
        Ok(Some(next))
    }

    /// The consistency model in force: the job's, with the bound adaptive tau set.
    pub(crate) fn consistency(&self) -> Consistency {
        self.config.pace.consistency(self.config.consistency)
    }

    pub(crate) fn epoch(&self) -> Epoch {
        self.config.epoch
    }

    pub(crate) fn is_worker(&self, node: NodeId) -> bool {
        self.config.workers.contains(&node)
    }

    pub(crate) fn workers(&self) -> &[NodeId] {
        &self.config.workers
    }

    pub(crate) fn servers(&self) -> &[NodeId] {
        &self.config.servers
    }

    /// Servers on the ring or joining it.
    pub(crate) fn is_server(&self, node: NodeId) -> bool {
        self.config.servers.contains(&node) || self.config.joining.contains(&node)
    }

    /// Whether `holds` is true of every piece of `range` ([`Cluster::pieces_in`]), given the
    /// owners of the piece on the ring in force and on the next ring: looked at per message
    /// between servers, so it walks the rings rather than building the pieces.
    pub(crate) fn every_piece_in(
        &self,
        range: KeyRange,
        mut holds: impl FnMut(&[NodeId], Option<&[NodeId]>) -> bool,
    ) -> bool {
        let next = self.next.as_ref();
        let starts = self.ring.segments_in(range).map(|(r, _)| r.start());
        let next_starts = next
            .into_iter()
            .flat_map(|n| n.segments_in(range).map(|(r, _)| r.start()));
        starts
            .chain(next_starts)
            .all(|k| holds(self.ring.owners(k), next.map(|n| n.owners(k))))
    }

    /// The key space cut where either ring (in force or next) changes owners, each piece with
    /// its holders: the primary, its replicas, then the servers the next ring gives the piece
    /// that do not hold it yet (they copy it and follow its updates like replicas).
    pub(crate) fn pieces_in(&self, range: KeyRange) -> Vec<(KeyRange, Vec<NodeId>)> {
        let mut cuts: Vec<Key> = self
            .ring
            .segments_in(range)
            .map(|(r, _)| r.start())
            .collect();
        if let Some(next) = &self.next {
            cuts.extend(next.segments_in(range).map(|(r, _)| r.start()));
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces = Vec::with_capacity(cuts.len());
        for (i, &start) in cuts.iter().enumerate() {
            let end = cuts.get(i + 1).copied().unwrap_or(range.end());
            let Ok(piece) = KeyRange::new(start, end) else {
                continue;
            };
            let mut holders = self.ring.owners(start).to_vec();
            if let Some(next) = &self.next {
                for &n in next.owners(start) {
                    if !holders.contains(&n) {
                        holders.push(n);
                    }
                }
            }
            pieces.push((piece, holders));
        }
        pieces
    }

    /// True when the next ring gives `node` the key (whether or not it holds it now).
    pub(crate) fn will_hold(&self, node: NodeId, key: Key) -> bool {
        self.next
            .as_ref()
            .is_some_and(|next| next.owners(key).contains(&node))
    }
}
