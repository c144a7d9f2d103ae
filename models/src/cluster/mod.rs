//! The whole protocol as a stateright actor model: a coordinator, servers and workers, each an
//! adapter over the core's own node, on an ordered or a lossy network, with optional crashes.
//!
//! Properties, named as in ARCHITECTURE.md §4:
//!
//! - `exactly-once` (always): every key's total on the servers lies between the pushes
//!   acknowledged and the pushes issued.
//! - `staleness` (always): a pull issued in iteration `c` returned, for every key, at least the
//!   pushes of every live worker for the iterations below `c - tau`.
//! - `completion` (always): when nothing is in flight and no node waits on a timer, every
//!   surviving worker has finished its script (asked of runs where no server crashed, until
//!   key ranges are replicated). (Stateright's `eventually` only follows acyclic
//!   paths, so liveness is stated as a property of quiescent states.)
//!
//! The lossy network is stateright's unordered duplicating network without explicit drops: a
//! message that is never delivered again is indistinguishable, for every safety property, from
//! a lost one, and `completion` counts a state as quiescent as soon as no retransmission timer
//! is left, because losing everything in flight is always possible. This checks the same
//! behaviours as explicit drops without their exponential number of network states.
//! - reachability (sometimes): a pull had to wait, a duplicate push was suppressed, a redirect
//!   was followed, the whole job finished.

mod actor;
mod check;
mod config;

pub use actor::{ClusterActor, ClusterActorState, ServerActorState, WorkerActorState};
pub use check::{CheckReport, PropertyResult, Strategy, Verdict, check, check_with, describe};
pub use config::{ClusterModelConfig, NetworkKind};

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

fn live_workers(model: &ClusterModel, state: &ClusterState) -> i64 {
    match state.actor_states.first().map(|s| &**s) {
        Some(ClusterActorState::Coordinator(c)) => {
            c.config()
                .map_or(model.cfg.workers, |config| config.workers.len()) as i64
        }
        _ => model.cfg.workers as i64,
    }
}

/// Every push adds 1 to every key, so the totals are counts of pushes.
fn exactly_once(model: &ClusterModel, state: &ClusterState) -> bool {
    let issued: i64 = workers(state).map(|(_, w)| i64::from(w.pushed)).sum();
    let acked: i64 = workers(state).map(|(_, w)| i64::from(w.acked)).sum();
    model.cfg.key_list().iter().all(|&k| {
        let total: i64 = servers(state).map(|s| s.node.received_total(k)[0]).sum();
        acked <= total && total <= issued
    })
}

fn staleness(model: &ClusterModel, state: &ClusterState) -> bool {
    let live = live_workers(model, state);
    let issued: i64 = workers(state).map(|(_, w)| i64::from(w.pushed)).sum();
    workers(state).all(|(_, w)| {
        w.pulled.iter().all(|(it, values)| {
            let need = live * i64::from(model.cfg.consistency.required_below(*it));
            values.iter().all(|&v| need <= v && v <= issued)
        })
    })
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

/// Until key ranges are replicated, a crashed server (or coordinator) takes its requests with
/// it, so completion is asked of runs where only workers crashed.
fn completion(model: &ClusterModel, state: &ClusterState) -> bool {
    let worker_ids: Vec<usize> = workers(state).map(|(i, _)| i).collect();
    let lost_server = state
        .crashed
        .iter()
        .enumerate()
        .any(|(i, &crashed)| crashed && !worker_ids.contains(&i));
    lost_server
        || !quiescent(model, state)
        || workers(state).all(|(i, w)| w.done() || w.fenced || state.crashed[i])
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

fn job_finished(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).all(|(_, w)| w.done())
}
