//! The whole protocol as a stateright actor model: a coordinator, servers and workers, each an
//! adapter over the core's own node, on an ordered or a lossy network, with optional crashes.
//!
//! Every worker's push of iteration `i` writes 1 into a column of its own (worker, iteration),
//! so that any value read says exactly which pushes it includes. Properties, named as in
//! ARCHITECTURE.md §4:
//!
//! - `exactly-once` (always): on every key, each (worker, iteration) column summed over the
//!   servers is 0 or 1; 1 for every acknowledged push, 0 for every push not yet issued.
//! - `staleness` (always): a pull issued in iteration `c` returned, on every key, the push of
//!   every live worker for every iteration below `c - tau`, judged push by push: a worker's own
//!   extra pushes never stand in for another's missing one.
//! - `pull complete` (always): every pull completed once, with exactly the keys it asked for
//!   and values the servers really held (each column 0 or 1, only for pushes issued, never
//!   ahead of what the owner has applied).
//! - `in-flight bound` (always): no worker is more than `tau + 1` iterations ahead of its
//!   acknowledged pushes.
//! - `completion` (always): when nothing is in flight and no node waits on a timer, every
//!   surviving worker has finished its script (asked of runs where no server crashed, until
//!   key ranges are replicated).
//! - `livelock-free` (judged after the search, [`liveness`]): from every reachable state the
//!   job can still finish. Stateright's `eventually` only follows acyclic paths, and
//!   `completion` never looks at a state where a retransmission timer is pending, so a worker
//!   retransmitting forever to a server that never answers escapes both; this search does not.
//! - reachability (sometimes): a pull had to wait, a duplicate push was suppressed, a redirect
//!   was followed, a retransmission timeout was doubled, the whole job finished.
//!
//! The lossy network is stateright's unordered duplicating network without explicit drops: a
//! message that is never delivered again is indistinguishable, for every safety property, from
//! a lost one, and `completion` counts a state as quiescent as soon as no retransmission timer
//! is left, because losing everything in flight is always possible. This checks the same
//! behaviours as explicit drops without their exponential number of network states.
//!
//! Time is not modelled (every node's clock reads 0, every timer may fire at any point),
//! except with [`ClusterModelConfig::backoff`], where each worker's clock moves to the deadline
//! of the retransmission timer that fires, so that doubled timeouts are explored.

mod actor;
mod check;
mod config;
pub mod liveness;

pub use actor::{ClusterActor, ClusterActorState, ServerActorState, WorkerActorState};
pub use check::{
    CheckReport, LIVELOCK_MAX_STATES, PropertyResult, Strategy, Verdict, check,
    check_cluster_model, check_with, describe,
};
pub use config::{ClusterModelConfig, MAX_RETRANSMISSIONS, NetworkKind};

use pserver_core::{CoordinatorError, TimerId};
use stateright::actor::{ActorModel, ActorModelState, LossyNetwork, Network};
use stateright::{Expectation, Model};

/// The model type.
pub type ClusterModel = ActorModel<ClusterActor, ClusterModelConfig, ()>;

/// The state the properties look at.
pub type ClusterState = ActorModelState<ClusterActor, ()>;

/// Makes every server and worker of `model` run a deliberately broken protocol, to see the
/// checker catch it.
#[cfg(feature = "mutations")]
pub fn mutate(model: &mut ClusterModel, mutation: pserver_core::Mutation) {
    for actor in &mut model.actors {
        actor.set_mutation(Some(mutation));
    }
}

/// Builds the model of `cfg`, with every property.
pub fn cluster_model(cfg: ClusterModelConfig) -> Result<ClusterModel, CoordinatorError> {
    let actors = ClusterActor::all(&cfg)?;
    let (network, lossy) = match cfg.network {
        NetworkKind::Ordered => (Network::new_ordered([]), LossyNetwork::No),
        NetworkKind::Lossy => (Network::new_unordered_duplicating([]), LossyNetwork::No),
    };
    let crashes = cfg.crashes;
    Ok(ActorModel::new(cfg, ())
        .within_boundary(within_boundary)
        .actors(actors)
        .init_network(network)
        .lossy_network(lossy)
        .max_crashes(crashes)
        .property(Expectation::Always, "exactly-once", exactly_once)
        .property(Expectation::Always, "staleness", staleness)
        .property(Expectation::Always, "pull complete", pull_complete)
        .property(Expectation::Always, "in-flight bound", in_flight_bound)
        .property(Expectation::Always, "completion", completion)
        .property(Expectation::Sometimes, "pull waited", pull_waited)
        .property(
            Expectation::Sometimes,
            "duplicate suppressed",
            duplicate_suppressed,
        )
        .property(
            Expectation::Sometimes,
            "redirect followed",
            redirect_followed,
        )
        .property(
            Expectation::Sometimes,
            "retransmission backed off",
            backed_off,
        )
        .property(Expectation::Sometimes, "job finished", job_finished))
}

/// The names of the model's properties, in order.
pub fn property_names(model: &ClusterModel) -> Vec<&'static str> {
    model.properties().iter().map(|p| p.name).collect()
}

/// Messages one channel of the ordered network may hold when failure detection is modelled:
/// every heartbeat appends to a FIFO channel, so those checks are bounded, and states with a
/// longer channel are not explored further.
pub const MAX_CHANNEL: usize = 3;

fn within_boundary(cfg: &ClusterModelConfig, state: &ClusterState) -> bool {
    match &state.network {
        Network::Ordered(channels) if cfg.crashes > 0 => {
            channels.values().all(|c| c.len() <= MAX_CHANNEL)
        }
        _ => true,
    }
}

fn servers(state: &ClusterState) -> impl Iterator<Item = &ServerActorState> {
    state.actor_states.iter().filter_map(|s| match &**s {
        ClusterActorState::Server(s) => Some(&**s),
        _ => None,
    })
}

/// Workers with their actor index.
fn workers(state: &ClusterState) -> impl Iterator<Item = (usize, &WorkerActorState)> {
    state
        .actor_states
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match &**s {
            ClusterActorState::Worker(w) => Some((i, &**w)),
            _ => None,
        })
}

/// The 0-based indexes of the workers in the configuration in force (removed workers are no
/// longer waited for).
fn live_workers(model: &ClusterModel, state: &ClusterState) -> Vec<usize> {
    match state.actor_states.first().map(|s| &**s) {
        Some(ClusterActorState::Coordinator(c)) => match c.config() {
            Some(config) => config
                .workers
                .iter()
                .filter_map(|&w| model.cfg.worker_index(w))
                .collect(),
            None => (0..model.cfg.workers).collect(),
        },
        _ => (0..model.cfg.workers).collect(),
    }
}

/// The workers' states in index order.
fn worker_states(state: &ClusterState) -> Vec<&WorkerActorState> {
    workers(state).map(|(_, w)| w).collect()
}

/// Key `k`'s values summed over servers, as `value` reads them (stored or, with `received`,
/// stored plus buffered).
fn server_values(model: &ClusterModel, state: &ClusterState, k: u64, received: bool) -> Vec<i64> {
    let mut total = vec![0i64; model.cfg.width()];
    for s in servers(state) {
        let row = if received {
            s.node.received_total(k)
        } else {
            s.node.value(k).map(<[i64]>::to_vec).unwrap_or_default()
        };
        for (t, v) in total.iter_mut().zip(row) {
            *t += v;
        }
    }
    total
}

/// Every (worker, iteration) column of every key on the servers is 0 or 1: 1 for every
/// acknowledged push, 0 for every push not yet issued.
fn exactly_once(model: &ClusterModel, state: &ClusterState) -> bool {
    let ws = worker_states(state);
    model.cfg.key_list().iter().all(|&k| {
        let total = server_values(model, state, k, true);
        ws.iter().enumerate().all(|(index, w)| {
            (0..model.cfg.iterations).all(|it| {
                let v = total[model.cfg.column(index, it)];
                let issued = it < w.pushed();
                (0..=1).contains(&v) && (!w.is_acked(it) || v == 1) && (issued || v == 0)
            })
        })
    })
}

/// Every pull issued in iteration `c` includes, on every key, the push of every live worker
/// for every iteration below `c - tau`: judged push by push, so that one worker's extra pushes
/// can never stand in for another's missing one.
fn staleness(model: &ClusterModel, state: &ClusterState) -> bool {
    let cfg = &model.cfg;
    let live = live_workers(model, state);
    let width = cfg.width();
    workers(state).all(|(_, w)| {
        w.pulled.iter().all(|(c, values)| {
            let required = cfg.consistency.required_below(*c).min(cfg.iterations);
            values.chunks(width).all(|row| {
                live.iter().all(|&index| {
                    (0..required).all(|it| row.get(cfg.column(index, it)) == Some(&1))
                })
            })
        })
    })
}

/// Every pull completed once, with exactly the keys it asked for, and with values the servers
/// really hold: each column 0 or 1, only for pushes issued, and never ahead of what the owner
/// has applied by now (stores only grow).
fn pull_complete(model: &ClusterModel, state: &ClusterState) -> bool {
    let cfg = &model.cfg;
    let keys = cfg.key_list();
    let width = cfg.width();
    let ws = worker_states(state);
    let applied: Vec<Vec<i64>> = keys
        .iter()
        .map(|&k| server_values(model, state, k, false))
        .collect();
    ws.iter().all(|w| {
        !w.bad_pull
            && w.pulled.iter().all(|(_, values)| {
                values.len() == keys.len() * width
                    && values.chunks(width).zip(&applied).all(|(row, held)| {
                        ws.iter().enumerate().all(|(index, other)| {
                            (0..cfg.iterations).all(|it| {
                                let col = cfg.column(index, it);
                                let v = row[col];
                                (0..=1).contains(&v)
                                    && v <= held[col]
                                    && (it < other.pushed() || v == 0)
                            })
                        })
                    })
            })
    })
}

/// No worker is more than `tau + 1` iterations ahead of its acknowledged work: it is in
/// iteration at most `tau` past the first iteration whose push is not yet acknowledged.
fn in_flight_bound(model: &ClusterModel, state: &ClusterState) -> bool {
    let Some(tau) = model.cfg.consistency.tau() else {
        return true;
    };
    workers(state).all(|(_, w)| w.node.iteration() <= w.acked_below() + tau)
}

/// Nothing more will happen: no timer is set but the periodic heartbeats and failure checks,
/// and no message can still arrive. On the lossy network any message in flight may be lost, so
/// only the timers count there: a state without timers reaches quiescence by losing the rest.
fn quiescent(model: &ClusterModel, state: &ClusterState) -> bool {
    let idle_network = model.cfg.network == NetworkKind::Lossy
        || state
            .network
            .iter_deliverable()
            .all(|env| state.crashed[usize::from(env.dst)]);
    let idle_timers = state.timers_set.iter().enumerate().all(|(i, timers)| {
        state.crashed[i]
            || timers
                .iter()
                .all(|t| matches!(t, TimerId::Heartbeat | TimerId::FailureCheck))
    });
    idle_network && idle_timers
}

/// A server (or the coordinator) crashed: until key ranges are replicated its requests are
/// lost with it, so completion is not asked of such runs.
fn lost_server(state: &ClusterState) -> bool {
    let worker_ids: Vec<usize> = workers(state).map(|(i, _)| i).collect();
    state
        .crashed
        .iter()
        .enumerate()
        .any(|(i, &crashed)| crashed && !worker_ids.contains(&i))
}

/// Every worker that can still finish has: done, removed, or crashed.
fn finished_or_excused(state: &ClusterState) -> bool {
    lost_server(state) || workers(state).all(|(i, w)| w.done() || w.fenced || state.crashed[i])
}

/// Once quiescent, every surviving worker is done. A worker that spent its retransmission
/// budget ([`ClusterModelConfig::backoff`]) stops retransmitting by the model's choice, not the
/// protocol's, so such states are left to `livelock-free`.
fn completion(model: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).any(|(_, w)| model.cfg.backoff && w.gave_up())
        || !quiescent(model, state)
        || finished_or_excused(state)
}

/// The goal of `livelock-free`: every worker that can still finish has.
pub fn livelock_goal(_: &ClusterModel, state: &ClusterState) -> bool {
    finished_or_excused(state)
}

fn pull_waited(_: &ClusterModel, state: &ClusterState) -> bool {
    servers(state).any(|s| s.node.held_pulls() > 0)
}

fn duplicate_suppressed(_: &ClusterModel, state: &ClusterState) -> bool {
    servers(state).any(|s| s.suppressed_duplicate)
}

fn redirect_followed(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).any(|(_, w)| w.followed_redirect)
}

fn backed_off(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).any(|(_, w)| w.backed_off)
}

fn job_finished(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).all(|(_, w)| w.done())
}
