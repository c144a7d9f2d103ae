//! Coordinator succession, checked: the core's active and standby coordinators and two workers
//! on a network that loses and reorders messages, with timers that fire in any order, and the
//! active coordinator crashing at any point. The job's one server is named in the
//! configurations but not run: servers watch the coordinator with the same code as workers
//! (`crate::watch` in the core), and a silent server is a voter that grants nothing, which
//! the two workers outvote.
//!
//! The property `single-coordinator` holds in every state explored: no two configurations of
//! the same epoch ever exist (held by a node or on the network), and no node's term or epoch
//! ever goes back (ARCHITECTURE.md §11). Timers firing in any order and messages lost at will
//! make every node suspect every other, so takeovers, standbys dropped and coordinators
//! stepping down are all reached. Terms, configurations and messages in flight are bounded
//! (`within_boundary`), which keeps the search finite.

use std::collections::{BTreeMap, BTreeSet};

use pserver_core::node::{
    Coordinator, CoordinatorConfig, Effects, Node, Standbys, TimerCmd, TimerId, Worker,
    WorkerConfig,
};
use pserver_core::wire::{ClusterConfig, Envelope, Message};
use pserver_core::{Consistency, NodeId, Timing};
use stateright::{Model, Property};

/// The active coordinator the model starts with.
pub(crate) const ACTIVE: NodeId = NodeId(0);
/// Its standby.
pub(crate) const STANDBY: NodeId = NodeId(9);
const SERVER: NodeId = NodeId(1);
const WORKERS: [NodeId; 2] = [NodeId(2), NodeId(3)];

/// The shape of the succession model.
#[derive(Clone, Debug)]
pub struct StandbyModel {
    /// The active coordinator may crash.
    pub crash: bool,
    /// Highest term explored.
    pub max_term: u64,
    /// Most configurations explored.
    pub max_configs: usize,
    /// Most messages in flight.
    pub max_in_flight: usize,
    /// Most timer firings, over all nodes: what bounds the search's depth.
    pub max_fires: u32,
    #[cfg(feature = "mutations")]
    mutation: Option<pserver_core::mutation::Mutation>,
}

impl Default for StandbyModel {
    fn default() -> Self {
        StandbyModel {
            crash: true,
            max_term: 1,
            max_configs: 4,
            max_in_flight: 3,
            max_fires: 6,
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }
}

impl StandbyModel {
    /// The default bounds, the active coordinator crashing if `crash`, and at most
    /// `max_fires` timer firings.
    pub fn new(crash: bool, max_fires: u32) -> Self {
        StandbyModel {
            crash,
            max_fires,
            ..StandbyModel::default()
        }
    }

    /// Runs a deliberately broken protocol on both coordinators.
    #[cfg(feature = "mutations")]
    pub fn mutate(&mut self, mutation: pserver_core::mutation::Mutation) {
        self.mutation = Some(mutation);
    }
}

/// One state: the nodes, their timers, the network, and what the property remembers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StandbyState {
    nodes: Vec<Node<i64>>,
    timers: Vec<BTreeSet<TimerId>>,
    crashed: Vec<bool>,
    /// Messages in flight, sorted, so that the order they were sent in makes no new state.
    net: Vec<Keyed>,
    /// Every configuration seen, by epoch.
    seen: BTreeMap<u64, ClusterConfig>,
    /// Each node's highest (term, epoch) held so far.
    highest: Vec<(u64, u64)>,
    /// Timers fired so far.
    fires: u32,
    /// What went wrong, if anything.
    broken: Option<String>,
}

/// An envelope with the key it is sorted by.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Keyed(String, EnvelopeBox);

/// An envelope that sorts by its key only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EnvelopeBox(Box<Envelope<i64>>);

impl PartialOrd for EnvelopeBox {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for EnvelopeBox {
    fn cmp(&self, _other: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// One step of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StandbyAction {
    /// The message at this place in flight arrives.
    Deliver(usize),
    /// It is lost.
    Lose(usize),
    /// A node's timer fires.
    Fire(usize, TimerId),
    /// The active coordinator's process dies.
    Crash,
}

fn timing() -> Timing {
    let mut t = Timing::default();
    t.heartbeat_interval = 1;
    t.heartbeat_timeout = 1;
    t.coordinator_timeout = 0;
    t
}

fn coordinator_config(id: NodeId, peer: NodeId) -> CoordinatorConfig {
    let mut cfg = CoordinatorConfig::new(id, 1, WORKERS.len());
    cfg.consistency = Consistency::Eventual;
    cfg.timing = timing();
    cfg.ring.replicas = 0;
    cfg.ring.vnodes = 1;
    cfg.peers = Standbys::new(&[peer]).unwrap_or_default();
    cfg
}

impl StandbyState {
    fn apply(&mut self, i: usize, out: Effects<i64>) {
        for cmd in out.timers {
            match cmd {
                TimerCmd::Set { timer, .. } => {
                    self.timers[i].insert(timer);
                }
                TimerCmd::Cancel(timer) => {
                    self.timers[i].remove(&timer);
                }
            }
        }
        for env in out.sends {
            self.note(&env);
            self.net
                .push(Keyed(format!("{env:?}"), EnvelopeBox(Box::new(env))));
        }
        self.net.sort();
        self.observe();
    }

    fn index(&self, id: NodeId) -> Option<usize> {
        self.nodes.iter().position(|n| n.id() == id)
    }

    /// A configuration on the network is one some coordinator decided: it must agree with
    /// every other of its epoch.
    fn note(&mut self, env: &Envelope<i64>) {
        let config = match &env.body {
            Message::Config(c) => c,
            Message::Standby(state) => &state.config,
            Message::TermGrant { config, .. } => config,
            _ => return,
        };
        self.seen_config(config);
    }

    fn seen_config(&mut self, config: &ClusterConfig) {
        match self.seen.get(&config.epoch) {
            Some(known) if known != config => {
                self.broken.get_or_insert_with(|| {
                    format!(
                        "two configurations of epoch {}: {known:?} and {config:?}",
                        config.epoch
                    )
                });
            }
            Some(_) => {}
            None => {
                self.seen.insert(config.epoch, config.clone());
            }
        }
    }

    /// What every node holds: agreeing with what was seen, and never older than before.
    fn observe(&mut self) {
        for i in 0..self.nodes.len() {
            let held = self.nodes[i].config().cloned();
            let term = match self.nodes[i].as_coordinator() {
                Some(c) => c.term(),
                None => held.as_ref().map_or(0, |c| c.term),
            };
            let epoch = held.as_ref().map_or(0, |c| c.epoch);
            if let Some(config) = &held {
                self.seen_config(config);
            }
            let (was_term, was_epoch) = self.highest[i];
            let crashed = self.crashed[i];
            if !crashed
                && (term < was_term
                    || (self.nodes[i].as_coordinator().is_none() && epoch < was_epoch))
            {
                self.broken.get_or_insert_with(|| {
                    format!("{} went back from term {was_term} epoch {was_epoch} to term {term} epoch {epoch}", self.nodes[i].id())
                });
            }
            self.highest[i] = (term.max(was_term), epoch.max(was_epoch));
        }
    }
}

impl Model for StandbyModel {
    type State = StandbyState;
    type Action = StandbyAction;

    fn init_states(&self) -> Vec<StandbyState> {
        let Ok(active) =
            Coordinator::bootstrapped(coordinator_config(ACTIVE, STANDBY), &[SERVER], &WORKERS)
        else {
            return Vec::new();
        };
        let Some(first) = active.config().cloned() else {
            return Vec::new();
        };
        #[allow(unused_mut)]
        let mut standby = match Coordinator::standby(coordinator_config(STANDBY, ACTIVE)) {
            Ok(s) => s,
            Err(_) => return Vec::new(),
        };
        let standbys = Standbys::new(&[STANDBY]).unwrap_or_default();
        let mut nodes: Vec<Node<i64>> = vec![active.into(), standby.into()];
        for w in WORKERS {
            let mut cfg = WorkerConfig::new(w, ACTIVE);
            cfg.standbys = standbys;
            cfg.timing = timing();
            nodes.push(Worker::new(cfg).into());
        }
        #[cfg(feature = "mutations")]
        for node in &mut nodes {
            if let Node::Coordinator(c) = node {
                c.set_mutation(self.mutation);
            }
        }
        let n = nodes.len();
        let mut state = StandbyState {
            nodes,
            timers: vec![BTreeSet::new(); n],
            crashed: vec![false; n],
            net: Vec::new(),
            seen: BTreeMap::new(),
            highest: vec![(0, 0); n],
            fires: 0,
            broken: None,
        };
        for i in 0..n {
            let mut out = Effects::new();
            match i {
                0 | 1 => state.nodes[i].start(0, &mut out),
                _ => state.nodes[i].start_configured(0, first.clone(), &mut out),
            }
            state.apply(i, out);
        }
        // The job starts with the standby taken: the active coordinator invites it, and every
        // message is delivered until none is left.
        let mut out = Effects::new();
        state.nodes[0].on_timer(0, TimerId::FailureCheck, &mut out);
        state.apply(0, out);
        while !state.net.is_empty() {
            let Keyed(_, EnvelopeBox(env)) = state.net.remove(0);
            if let Some(to) = state.index(env.to) {
                let mut out = Effects::new();
                state.nodes[to].on_message(0, *env, &mut out);
                state.apply(to, out);
            }
        }
        let taken = state
            .nodes
            .iter()
            .skip(2)
            .all(|m| m.config().is_some_and(|c| c.standbys == [STANDBY]));
        if !taken {
            return Vec::new();
        }
        vec![state]
    }

    fn actions(&self, state: &StandbyState, actions: &mut Vec<StandbyAction>) {
        for i in 0..state.net.len() {
            actions.push(StandbyAction::Deliver(i));
            actions.push(StandbyAction::Lose(i));
        }
        for (i, timers) in state.timers.iter().enumerate() {
            if state.crashed[i] {
                continue;
            }
            for &t in timers {
                if matches!(t, TimerId::FailureCheck | TimerId::Heartbeat) {
                    actions.push(StandbyAction::Fire(i, t));
                }
            }
        }
        if self.crash && !state.crashed[0] {
            actions.push(StandbyAction::Crash);
        }
    }

    fn next_state(&self, state: &StandbyState, action: StandbyAction) -> Option<StandbyState> {
        let mut next = state.clone();
        match action {
            StandbyAction::Deliver(at) => {
                let Keyed(_, EnvelopeBox(env)) = next.net.remove(at);
                let to = next.index(env.to)?;
                if !next.crashed[to] {
                    let mut out = Effects::new();
                    next.nodes[to].on_message(0, *env, &mut out);
                    next.apply(to, out);
                }
            }
            StandbyAction::Lose(at) => {
                next.net.remove(at);
            }
            StandbyAction::Fire(i, timer) => {
                next.fires += 1;
                let mut out = Effects::new();
                next.nodes[i].on_timer(0, timer, &mut out);
                next.apply(i, out);
            }
            StandbyAction::Crash => {
                next.crashed[0] = true;
                next.timers[0].clear();
            }
        }
        Some(next)
    }

    fn within_boundary(&self, state: &StandbyState) -> bool {
        let terms = state.nodes.iter().filter_map(Node::as_coordinator);
        terms.map(Coordinator::term).max().unwrap_or(0) <= self.max_term
            && state.seen.len() <= self.max_configs
            && state.net.len() <= self.max_in_flight
            && state.fires <= self.max_fires
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("single-coordinator", |_, s: &StandbyState| {
                s.broken.is_none()
            }),
            Property::sometimes("standby asks", |_, s: &StandbyState| {
                s.nodes[1].as_coordinator().is_some_and(|c| c.term() > 0)
            }),
            Property::sometimes("member grants", |_, s: &StandbyState| {
                s.net
                    .iter()
                    .any(|k| matches!(k.1.0.body, Message::TermGrant { .. }))
            }),
            Property::sometimes("standby takes over", |_, s: &StandbyState| {
                s.nodes[1]
                    .as_coordinator()
                    .is_some_and(|c| c.is_active() && c.term() > 0)
            }),
            Property::sometimes("standby dropped", |_, s: &StandbyState| {
                !s.crashed[0]
                    && s.nodes[0]
                        .as_coordinator()
                        .and_then(Coordinator::config)
                        .is_some_and(|c| c.standbys.is_empty() && c.term == 0)
            }),
        ]
    }
}

impl StandbyState {
    /// Why the state breaks `single-coordinator`, if it does.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateright::Checker;

    #[test]
    fn no_two_coordinators_publish_an_epoch_and_takeovers_and_drops_are_reached() {
        let checker = StandbyModel::default()
            .checker()
            .threads(2)
            .spawn_dfs()
            .join();
        checker.assert_properties();
        // Six timer firings reach a takeover (two standby checks, two unanswered heartbeats
        // from each worker) and some 180,000 states; pinned loosely, so that a model that
        // stops exploring shows.
        assert!(
            checker.unique_state_count() > 100_000,
            "{}",
            checker.unique_state_count()
        );
    }

    #[cfg(feature = "mutations")]
    #[test]
    fn a_standby_that_takes_over_without_a_higher_term_is_caught() {
        let mut model = StandbyModel {
            crash: false,
            max_fires: 8,
            ..StandbyModel::default()
        };
        model.mutate(pserver_core::mutation::Mutation::TakeOverWithoutTerm);
        let checker = model
            .checker()
            .threads(2)
            .finish_when(stateright::HasDiscoveries::AnyFailures)
            .spawn_dfs()
            .join();
        let found = checker.discovery("single-coordinator");
        let broken = found
            .as_ref()
            .and_then(|path| path.last_state().broken().map(str::to_owned));
        assert!(
            broken.is_some_and(|b| b.starts_with("two configurations of epoch")),
            "the mutation is not caught"
        );
    }
}
