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
//!   extra pushes never stand in for another's missing one. With straggler decisions
//!   ([`ClusterModelConfig::pace`]), `tau` and the iterations a worker was told to skip are
//!   those of the configurations of the servers that answered the pull.
//! - `pull complete` (always): every pull completed once, with exactly the keys it asked for
//!   and values the servers really held (each column 0 or 1, only for pushes issued, never
//!   ahead of what the owner has applied).
//! - `in-flight bound` (always): no worker is more than `tau + 1` iterations ahead of its
//!   counted pushes (acknowledged, or in sequential mode with replicas taken in by their
//!   servers; `durability` asks for the acknowledgement) and the iterations it was told to
//!   skip; with adaptive tau, `tau` is the highest any configuration published.
//! - `completion` (always): when nothing is in flight and no node waits on a timer, every
//!   surviving worker has finished its script (asked of runs where no server crashed, until
//!   key ranges are replicated).
//! - `livelock-free` (judged after the search, [`liveness`]): from every reachable state the
//!   job can still finish. Stateright's `eventually` only follows acyclic paths, and
//!   `completion` never looks at a state where a retransmission timer is pending, so a worker
//!   retransmitting forever to a server that never answers escapes both; this search does not.
//! - with ranges copied between servers ([`ClusterModelConfig::replicas`] or
//!   [`ClusterModelConfig::joins`], the replication model): `durability` (no acknowledged push
//!   lost while at most `replicas` servers are lost), `single-owner` (one primary per key and
//!   epoch; at quiescence the coordinator's) and `replica-convergence` (at quiescence replicas
//!   hold what their primary holds), always; and `exactly-once` judged per range holder
//!   instead of summed over servers.
//! - reachability (sometimes): a pull had to wait, a duplicate push was suppressed, a redirect
//!   was followed, a retransmission timeout was doubled, the whole job finished; in the
//!   replication model, a range failed over to its replica (with crashes), a server that
//!   joined serves a range (with joins), a new holder installed a copy; with straggler
//!   decisions, a straggler skipped ahead, and tau was raised and lowered.
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
//!
//! With replicas, only servers crash and failure detection is an accurate oracle
//! ([`ModelTimer::Detect`]): heartbeats and periodic failure checks would multiply every state
//! by their interleavings. Straggler detection is driven the same way
//! ([`ModelTimer::Straggle`], [`ModelTimer::Calm`]): the coordinator is handed positions in
//! which a worker lags, or none does, and its own failure check decides, once per run.
//!
//! A server that joins ([`ClusterModelConfig::joins`]) is an actor after the workers that
//! starts as a fresh server process: its `Register` is on the network from the start, so the
//! checker chooses when the coordinator admits it, and from then on it runs the core's join
//! (copy, follow, catch up, switch) like any server.

mod actor;
mod check;
mod config;
pub mod liveness;

pub use actor::{
    ClusterActor, ClusterActorState, CoordinatorActorState, ModelTimer, Pulled, ServerActorState,
    WorkerActorState,
};
pub use check::{
    CheckReport, LIVELOCK_MAX_STATES, PropertyResult, Strategy, Verdict, check,
    check_cluster_model, check_with, describe,
};
pub use config::{
    ClusterModelConfig, MAX_RETRANSMISSIONS, NetworkKind, PaceModel, STRAGGLER_OTHERS_IN,
};

use pserver_core::node::Coordinator;
use pserver_core::node::CoordinatorError;
use pserver_core::node::TimerId;
use pserver_core::pace::Pace;
use pserver_core::ring::Ring;
use pserver_core::{Consistency, Epoch, Iteration, Key, NodeId};
use stateright::actor::{ActorModel, ActorModelState, LossyNetwork, Network};
use stateright::{Expectation, Model};

/// The model type.
pub type ClusterModel = ActorModel<ClusterActor, ClusterModelConfig, ()>;

/// The state the properties look at.
pub type ClusterState = ActorModelState<ClusterActor, ()>;

/// Makes every server and worker of `model` run a deliberately broken protocol, to see the
/// checker catch it.
#[cfg(feature = "mutations")]
pub fn mutate(model: &mut ClusterModel, mutation: pserver_core::mutation::Mutation) {
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
    let joins = cfg.joins;
    let replicated = cfg.copies_ranges();
    let pace = cfg.pace;
    let key_caching = cfg.key_caching;
    let mut model = ActorModel::new(cfg, ())
        .within_boundary(within_boundary)
        .actors(actors)
        .init_network(network)
        .lossy_network(lossy)
        .max_crashes(crashes)
        .property(Expectation::Always, "exactly-once", exactly_once);
    if replicated {
        model = model
            .property(Expectation::Always, "durability", durability)
            .property(Expectation::Always, "single-owner", single_owner)
            .property(
                Expectation::Always,
                "replica-convergence",
                replica_convergence,
            );
    }
    model = model
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
        );
    if key_caching.is_some() {
        model = model
            .property(Expectation::Sometimes, "list named", list_named)
            .property(Expectation::Sometimes, "list asked for", list_asked);
    }
    if replicated && crashes > 0 {
        model = model.property(
            Expectation::Sometimes,
            "primary failed over",
            primary_failed_over,
        );
    }
    if replicated && joins > 0 {
        model = model.property(Expectation::Sometimes, "server joined", server_joined);
    }
    if replicated {
        model = model.property(Expectation::Sometimes, "replica refilled", replica_refilled);
    }
    if pace.is_some_and(|p| p.skip_ahead) {
        model = model.property(
            Expectation::Sometimes,
            "straggler skipped ahead",
            skipped_ahead,
        );
    }
    if pace.is_some_and(|p| p.adaptive_tau.is_some()) {
        model = model
            .property(Expectation::Sometimes, "tau raised", tau_raised)
            .property(Expectation::Sometimes, "tau lowered", tau_lowered);
    }
    Ok(model.property(Expectation::Sometimes, "job finished", job_finished))
}

/// The names of the model's properties, in order.
pub fn property_names(model: &ClusterModel) -> Vec<&'static str> {
    model.properties().iter().map(|p| p.name).collect()
}

/// Messages one channel of the ordered network may hold when failure detection is modelled:
/// every heartbeat appends to a FIFO channel, so those checks are bounded, and states with a
/// longer channel are not explored further.
pub const MAX_CHANNEL: usize = 3;

/// Heartbeats one channel of the ordered network may hold in the replication model. Every
/// heartbeat carries the same thing (its time is always 0 in the model), and the coordinator
/// only notes that the sender is alive, so a second heartbeat queued behind the first adds no
/// behaviour: anything it could do, the sender's next heartbeat after the first was delivered
/// does too. Leaving out the states with a second one cuts the interleavings of redundant
/// heartbeats without losing a behaviour.
pub const MAX_HEARTBEATS: usize = 1;

/// In the replication model only servers crash (those of the first ring or joining), and the
/// failure detector is accurate: a state where the coordinator or a worker crashed, or where
/// the coordinator declared a server dead that has not crashed, is outside the model and not
/// explored.
fn within_boundary(cfg: &ClusterModelConfig, state: &ClusterState) -> bool {
    if cfg.copies_ranges()
        && state
            .crashed
            .iter()
            .enumerate()
            .any(|(i, &crashed)| crashed && !cfg.is_server_actor(i))
    {
        return false;
    }
    if cfg.copies_ranges()
        && coordinator(state).is_some_and(|c| c.dead().iter().any(|d| !state.crashed[d.0 as usize]))
    {
        return false;
    }
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
    match coordinator(state).and_then(Coordinator::config) {
        Some(config) => config
            .workers
            .iter()
            .filter_map(|&w| model.cfg.worker_index(w))
            .collect(),
        None => (0..model.cfg.workers).collect(),
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

/// Per column, the most any server ever held of key `k`, stored or buffered
/// ([`ServerActorState::ever_held`]).
fn most_held(model: &ClusterModel, state: &ClusterState, k: u64) -> Vec<i64> {
    let width = model.cfg.width();
    let at = model.cfg.key_list().iter().position(|&key| key == k);
    let mut most = vec![0i64; width];
    for s in servers(state) {
        let Some(row) = at.and_then(|i| s.ever_held.get(i * width..(i + 1) * width)) else {
            continue;
        };
        for (m, &v) in most.iter_mut().zip(row) {
            *m = (*m).max(v);
        }
    }
    most
}

/// Every (worker, iteration) column of every key on the servers is 0 or 1: 1 for every
/// acknowledged push, 0 for every push not yet issued. Without replicas a key has one holder at
/// a time, so the column is summed over the servers (a push applied by two owners counts
/// twice). With replicas every holder of a range has its own copy of the same pushes, so the
/// column is judged per holder instead: 0 or 1 on every server, 0 for pushes not issued, and 1
/// for every acknowledged push on the key's primary in the coordinator's ring once it holds
/// the range as primary at the coordinator's epoch.
fn exactly_once(model: &ClusterModel, state: &ClusterState) -> bool {
    let ws = worker_states(state);
    if model.cfg.copies_ranges() {
        return exactly_once_per_holder(model, state, &ws);
    }
    let cfg = &model.cfg;
    cfg.key_list().iter().enumerate().all(|(i, &k)| {
        let total = server_values(model, state, k, true);
        ws.iter().enumerate().all(|(index, w)| {
            (0..cfg.iterations).all(|it| {
                let v = total[cfg.column(index, it)];
                let pushed = cfg.pushes(it, i);
                let issued = w.issued(it) && pushed;
                (0..=1).contains(&v) && (!w.is_acked(it) || !pushed || v == 1) && (issued || v == 0)
            })
        })
    })
}

fn exactly_once_per_holder(
    model: &ClusterModel,
    state: &ClusterState,
    ws: &[&WorkerActorState],
) -> bool {
    let cfg = &model.cfg;
    let current = current_ring(state);
    cfg.key_list().iter().enumerate().all(|(i, &k)| {
        let primary = current
            .as_ref()
            .and_then(|(epoch, ring)| serving_primary(state, *epoch, ring, k));
        let primary_row = primary.map(|p| p.node.received_total(k));
        servers(state).all(|s| {
            let row = s.node.received_total(k);
            ws.iter().enumerate().all(|(index, w)| {
                (0..cfg.iterations).all(|it| {
                    let v = row[cfg.column(index, it)];
                    (0..=1).contains(&v) && ((w.issued(it) && cfg.pushes(it, i)) || v == 0)
                })
            })
        }) && primary_row.is_none_or(|row| {
            ws.iter().enumerate().all(|(index, w)| {
                (0..cfg.iterations).all(|it| {
                    !w.is_acked(it) || !cfg.pushes(it, i) || row[cfg.column(index, it)] == 1
                })
            })
        })
    })
}

/// The coordinator's epoch and ring.
fn current_ring(state: &ClusterState) -> Option<(Epoch, Ring)> {
    let config = coordinator(state)?.config()?;
    let ring = config.ring_in_force().ok()?;
    Some((config.epoch, ring))
}

fn coordinator(state: &ClusterState) -> Option<&Coordinator> {
    coordinator_actor(state).map(|c| &c.node)
}

fn coordinator_actor(state: &ClusterState) -> Option<&CoordinatorActorState> {
    match state.actor_states.first().map(|s| &**s) {
        Some(ClusterActorState::Coordinator(c)) => Some(c),
        _ => None,
    }
}

/// The highest staleness bound any configuration published so far holds pulls and workers to:
/// the job's, or adaptive tau's where it set a higher one. A worker may have entered
/// iterations under it that a lower bound published later would not let it enter.
fn highest_consistency(model: &ClusterModel, state: &ClusterState) -> Consistency {
    let job = model.cfg.consistency;
    match (job, coordinator_actor(state).and_then(|c| c.most_tau())) {
        (Consistency::BoundedDelay(tau), Some(most)) => Consistency::BoundedDelay(tau.max(most)),
        _ => job,
    }
}

/// The weakest bound the servers that answered `pull` held it to: under the configurations of
/// the epochs they answered at, the highest tau, and per worker (by index) the highest skip.
/// Without straggler decisions every configuration has the job's bound and skips nothing.
fn weakest_bound(
    model: &ClusterModel,
    state: &ClusterState,
    pull: &Pulled,
) -> (Consistency, Vec<Iteration>) {
    let cfg = &model.cfg;
    let Some(coordinator) = coordinator_actor(state).filter(|_| cfg.pace.is_some()) else {
        return (cfg.consistency, vec![0; cfg.workers]);
    };
    let default = Pace::default();
    let paces: Vec<&Pace> = pull
        .answered_at
        .iter()
        .map(|&e| coordinator.pace_at(e).unwrap_or(&default))
        .collect();
    let consistency = paces
        .iter()
        .map(|p| p.consistency(cfg.consistency))
        .max_by_key(|c| c.tau())
        .unwrap_or_else(|| highest_consistency(model, state));
    let skipped = cfg
        .worker_ids()
        .map(|w| paces.iter().map(|p| p.skipped_below(w)).max().unwrap_or(0))
        .collect();
    (consistency, skipped)
}

/// Whether server `s` has not crashed (actor index = node id).
fn live(state: &ClusterState, s: &ServerActorState) -> bool {
    !state.crashed[s.node.id().0 as usize]
}

fn holds_primary(s: &ServerActorState, k: Key) -> bool {
    s.node
        .shards()
        .any(|(range, primary)| primary && range.contains(k))
}

/// The primary of `k` in `ring` (the coordinator's, at `epoch`), when it is live, has adopted
/// `epoch` and holds a primary shard containing `k`: the server that answers for `k` now.
fn serving_primary<'a>(
    state: &'a ClusterState,
    epoch: Epoch,
    ring: &Ring,
    k: Key,
) -> Option<&'a ServerActorState> {
    let id = ring.primary(k);
    servers(state).find(|s| {
        s.node.id() == id && live(state, s) && s.node.epoch() == epoch && holds_primary(s, k)
    })
}

/// Servers that crashed or that the coordinator declared dead (a live server wrongly suspected
/// drops its shards when it learns it was removed, so it is lost as much as a crashed one).
fn lost_servers(model: &ClusterModel, state: &ClusterState) -> usize {
    let dead = coordinator(state).map(Coordinator::dead);
    model
        .cfg
        .all_server_ids()
        .filter(|&id| state.crashed[id.0 as usize] || dead.is_some_and(|d| d.contains(&id)))
        .count()
}

/// No acknowledged push is lost while at most `replicas` servers are lost (crashed, or removed
/// by the coordinator): for every key and every acknowledged (worker, iteration) column, some
/// live server holds the column, and the key's primary in the coordinator's ring, once it is
/// live, has adopted the coordinator's epoch and holds a primary shard for the key, has it.
fn durability(model: &ClusterModel, state: &ClusterState) -> bool {
    let cfg = &model.cfg;
    if lost_servers(model, state) > cfg.replicas as usize {
        return true;
    }
    let current = current_ring(state);
    let ws = worker_states(state);
    cfg.key_list().iter().enumerate().all(|(i, &k)| {
        let primary = current
            .as_ref()
            .and_then(|(epoch, ring)| serving_primary(state, *epoch, ring, k))
            .map(|p| p.node.received_total(k));
        let rows: Vec<Vec<i64>> = servers(state)
            .filter(|s| live(state, s))
            .map(|s| s.node.received_total(k))
            .collect();
        ws.iter().enumerate().all(|(index, w)| {
            (0..cfg.iterations)
                .filter(|&it| w.is_acked(it) && cfg.pushes(it, i))
                .all(|it| {
                    let col = cfg.column(index, it);
                    rows.iter().any(|row| row[col] == 1)
                        && primary.as_ref().is_none_or(|row| row[col] == 1)
                })
        })
    })
}

/// Among live servers on the same epoch, at most one holds a primary shard containing a given
/// key; at quiescence the live holders of a primary shard of the key are exactly the
/// coordinator's ring's primary (none while that primary is crashed and not yet removed).
fn single_owner(model: &ClusterModel, state: &ClusterState) -> bool {
    let quiet = quiescent(model, state);
    let current = current_ring(state);
    model.cfg.key_list().iter().all(|&k| {
        let holders: Vec<(Epoch, NodeId)> = servers(state)
            .filter(|s| live(state, s) && holds_primary(s, k))
            .map(|s| (s.node.epoch(), s.node.id()))
            .collect();
        let one_per_epoch = holders
            .iter()
            .enumerate()
            .all(|(i, (e, _))| holders[i + 1..].iter().all(|(other, _)| other != e));
        let settled = !quiet
            || current.as_ref().is_none_or(|(_, ring)| {
                let primary = ring.primary(k);
                let want: Vec<NodeId> = servers(state)
                    .filter(|s| s.node.id() == primary && live(state, s))
                    .map(|s| s.node.id())
                    .collect();
                holders.iter().map(|&(_, id)| id).collect::<Vec<_>>() == want
            });
        one_per_epoch && settled
    })
}

/// At quiescence every live replica of a key in the coordinator's ring holds exactly what the
/// key's live primary holds (stored plus buffered).
fn replica_convergence(model: &ClusterModel, state: &ClusterState) -> bool {
    if !quiescent(model, state) {
        return true;
    }
    let Some((_, ring)) = current_ring(state) else {
        return true;
    };
    let by_id = |id: NodeId| servers(state).find(|s| s.node.id() == id && live(state, s));
    model.cfg.key_list().iter().all(|&k| {
        let owners = ring.owners(k);
        let Some(primary) = by_id(owners[0]) else {
            return true;
        };
        let want = primary.node.received_total(k);
        owners[1..]
            .iter()
            .filter_map(|&r| by_id(r))
            .all(|r| r.node.received_total(k) == want)
    })
}

/// Every pull issued in iteration `c` includes, on every key, the push of every live worker
/// for every iteration below `c - tau`: judged push by push, so that one worker's extra pushes
/// can never stand in for another's missing one. With straggler decisions
/// ([`ClusterModelConfig::pace`]) a server holds a pull to the configuration of its epoch, so
/// `tau` is that configuration's, and a worker's pushes below the iteration it told the worker
/// to skip to are not required (ARCHITECTURE.md §9); where servers at several epochs answered
/// one pull, the weakest of their bounds.
fn staleness(model: &ClusterModel, state: &ClusterState) -> bool {
    let cfg = &model.cfg;
    let live = live_workers(model, state);
    let width = cfg.width();
    workers(state).all(|(_, w)| {
        w.pulled.iter().all(|pull| {
            let (consistency, skipped) = weakest_bound(model, state, pull);
            let required = consistency
                .required_below(pull.iteration)
                .min(cfg.iterations);
            pull.values.chunks(width).enumerate().all(|(i, row)| {
                live.iter().all(|&index| {
                    (skipped[index]..required)
                        .filter(|&it| cfg.pushes(it, i))
                        .all(|it| row.get(cfg.column(index, it)) == Some(&1))
                })
            })
        })
    })
}

/// Every pull completed once, with exactly the keys it asked for, and with values the servers
/// really hold: each column 0 or 1, only for pushes issued, and never ahead of what the owner
/// has applied by now (stores only grow). With replicas a range changes holders, the new
/// primary may still hold buffered a push the old one had applied, and a server removed from
/// the ring drops its shards, so a value read must have been held, stored or buffered, by some
/// server at some point.
fn pull_complete(model: &ClusterModel, state: &ClusterState) -> bool {
    let cfg = &model.cfg;
    let keys = cfg.key_list();
    let width = cfg.width();
    let ws = worker_states(state);
    let applied: Vec<Vec<i64>> = keys
        .iter()
        .map(|&k| {
            if cfg.copies_ranges() {
                most_held(model, state, k)
            } else {
                server_values(model, state, k, false)
            }
        })
        .collect();
    ws.iter().all(|w| {
        !w.bad_pull
            && w.pulled.iter().all(|pull| {
                pull.values.len() == keys.len() * width
                    && pull.values.chunks(width).zip(&applied).enumerate().all(
                        |(i, (row, held))| {
                            ws.iter().enumerate().all(|(index, other)| {
                                (0..cfg.iterations).all(|it| {
                                    let col = cfg.column(index, it);
                                    let v = row[col];
                                    (0..=1).contains(&v)
                                        && v <= held[col]
                                        && ((other.issued(it) && cfg.pushes(it, i)) || v == 0)
                                })
                            })
                        },
                    )
            })
    })
}

/// No worker is more than `tau + 1` iterations ahead of its acknowledged work: it is in
/// iteration at most `tau` past the first iteration whose push is not yet acknowledged and that
/// it was not told to skip. With adaptive tau, `tau` is the highest published: a worker that
/// entered iterations under a raised bound keeps them when it falls.
fn in_flight_bound(model: &ClusterModel, state: &ClusterState) -> bool {
    let Some(tau) = highest_consistency(model, state).tau() else {
        return true;
    };
    workers(state).all(|(_, w)| w.node.iteration() <= w.counted_below() + tau)
}

/// Nothing more will happen: no timer is set but the periodic heartbeats and failure checks,
/// no message can still arrive, and (with replicas) no crashed server waits to be removed. On the lossy network any message in flight may be lost, so
/// only the timers count there: a state without timers reaches quiescence by losing the rest.
fn quiescent(model: &ClusterModel, state: &ClusterState) -> bool {
    let idle_network = model.cfg.network == NetworkKind::Lossy
        || state
            .network
            .iter_deliverable()
            .all(|env| state.crashed[usize::from(env.dst)]);
    let idle_timers = state.timers_set.iter().enumerate().all(|(i, timers)| {
        state.crashed[i]
            || timers.iter().all(|t| match t {
                ModelTimer::Node { timer, .. } => {
                    matches!(timer, TimerId::Heartbeat | TimerId::FailureCheck)
                }
                ModelTimer::Detect(_) | ModelTimer::Straggle(_) | ModelTimer::Calm => true,
            })
    });
    idle_network && idle_timers && !failure_pending(model, state)
}

/// With replicas, a crashed server that the coordinator still counts as a member, on the ring
/// or joining it: its ranges will pass to their replicas (or its join be called off) once the
/// failure checks find it silent, so the heartbeats and failure checks still have work to do.
fn failure_pending(model: &ClusterModel, state: &ClusterState) -> bool {
    model.cfg.copies_ranges()
        && coordinator(state)
            .and_then(Coordinator::config)
            .is_some_and(|c| {
                c.servers
                    .iter()
                    .chain(&c.joining)
                    .any(|&s| state.crashed[s.0 as usize])
            })
}

/// Runs whose requests may be lost, so that completion is not asked of them: without replicas,
/// any run where a server (or the coordinator) crashed; with replicas (where only servers
/// crash), runs that lost more servers than there are replicas.
fn lost_server(model: &ClusterModel, state: &ClusterState) -> bool {
    if model.cfg.copies_ranges() {
        return lost_servers(model, state) > model.cfg.replicas as usize;
    }
    let worker_ids: Vec<usize> = workers(state).map(|(i, _)| i).collect();
    state
        .crashed
        .iter()
        .enumerate()
        .any(|(i, &crashed)| crashed && !worker_ids.contains(&i))
}

/// Every worker that can still finish has: done, removed, or crashed.
fn finished_or_excused(model: &ClusterModel, state: &ClusterState) -> bool {
    lost_server(model, state)
        || workers(state).all(|(i, w)| w.done() || w.fenced || state.crashed[i])
}

/// Once quiescent, every surviving worker is done. A worker that spent its retransmission
/// budget ([`ClusterModelConfig::backoff`]) stops retransmitting by the model's choice, not the
/// protocol's, so such states are left to `livelock-free`.
fn completion(model: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).any(|(_, w)| model.cfg.backoff && w.gave_up())
        || !quiescent(model, state)
        || finished_or_excused(model, state)
}

/// The goal of `livelock-free`: every worker that can still finish has.
pub fn livelock_goal(model: &ClusterModel, state: &ClusterState) -> bool {
    finished_or_excused(model, state)
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

fn list_named(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).any(|(_, w)| w.named_list)
}

fn list_asked(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).any(|(_, w)| w.list_asked)
}

fn backed_off(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).any(|(_, w)| w.backed_off)
}

/// Some key's primary in the coordinator's ring is no longer its primary of the first epoch
/// but another server of the first ring (its replica), and the new primary serves it.
fn primary_failed_over(model: &ClusterModel, state: &ClusterState) -> bool {
    let Ok(first) = Ring::new(model.cfg.server_ids(), model.cfg.ring()) else {
        return false;
    };
    let Some((epoch, ring)) = current_ring(state) else {
        return false;
    };
    model.cfg.key_list().iter().any(|&k| {
        let now = ring.primary(k);
        now != first.primary(k)
            && first.servers().contains(&now)
            && serving_primary(state, epoch, &ring, k).is_some()
    })
}

/// A server that joined while the job ran is the primary of some key in the coordinator's ring
/// and serves it.
fn server_joined(model: &ClusterModel, state: &ClusterState) -> bool {
    let Some((epoch, ring)) = current_ring(state) else {
        return false;
    };
    model.cfg.key_list().iter().any(|&k| {
        model.cfg.joiner_ids().any(|j| j == ring.primary(k))
            && serving_primary(state, epoch, &ring, k).is_some()
    })
}

fn replica_refilled(_: &ClusterModel, state: &ClusterState) -> bool {
    servers(state).any(|s| s.installed_copy)
}

fn skipped_ahead(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).any(|(_, w)| w.skipped_ahead)
}

/// Some configuration published a staleness bound above the job's.
fn tau_raised(model: &ClusterModel, state: &ClusterState) -> bool {
    let job = model.cfg.consistency.tau();
    coordinator_actor(state).is_some_and(|c| c.published.iter().any(|(_, p)| p.tau > job))
}

/// Some configuration published a staleness bound below the job's.
fn tau_lowered(model: &ClusterModel, state: &ClusterState) -> bool {
    let job = model.cfg.consistency.tau();
    coordinator_actor(state).is_some_and(|c| {
        c.published
            .iter()
            .any(|(_, p)| p.tau.is_some() && p.tau < job)
    })
}

fn job_finished(_: &ClusterModel, state: &ClusterState) -> bool {
    workers(state).all(|(_, w)| w.done())
}
