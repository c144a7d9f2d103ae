//! Stateright actors that are thin adapters over the core's nodes: each call hands the message or
//! timer to the core struct and translates the resulting [`Effects`] into stateright's [`Out`].
//! The only logic here is the workers' scripted application and a few observation flags.

use std::borrow::Cow;

use pserver_core::{
    ClusterConfig, Coordinator, CoordinatorConfig, CoordinatorError, Effects, Envelope, Event,
    Iteration, KeyList, KeySelection, KvPairs, Message, RequestId, Server, ServerConfig, TimerCmd,
    TimerId, Updater, Worker, WorkerConfig,
};
use stateright::actor::{Actor, Id, Out, model_timeout};

use super::config::{ClusterModelConfig, NetworkKind};

/// One actor of the model.
#[derive(Clone, Debug)]
pub enum ClusterActor {
    /// The coordinator, as it starts.
    Coordinator(Box<Coordinator>, Settings),
    /// A server.
    Server(ServerConfig, Settings),
    /// A worker and its script.
    Worker(WorkerConfig, Settings, Script),
}

/// What every node actor shares from the model configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Heartbeats and failure checks are modelled only when crashes are.
    pub failure_detection: bool,
    /// Retransmission is modelled only on the lossy network: on the reliable ordered one the
    /// model takes acknowledgements to beat the timeout, because every retransmission would
    /// otherwise lengthen a FIFO channel without end.
    pub retransmission: bool,
    /// Start with this configuration in force instead of registering.
    pub config: Option<ClusterConfig>,
    #[cfg(feature = "mutations")]
    pub(crate) mutation: Option<pserver_core::Mutation>,
}

/// The workload of a worker: each iteration pushes 1 to every key and advances, then pulls every
/// key in the next iteration.
#[derive(Clone, Debug)]
pub struct Script {
    /// The keys.
    pub keys: Vec<u64>,
    /// Iterations to run.
    pub iterations: Iteration,
}

/// A worker and where its script is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerActorState {
    /// The core worker.
    pub node: Worker<i64>,
    /// Pushes issued.
    pub pushed: u32,
    /// Pushes acknowledged.
    pub acked: u32,
    /// The open pull and the iteration it was issued in.
    pub pulling: Option<(RequestId, Iteration)>,
    /// Every completed pull: the iteration it was issued in and the values it returned.
    pub pulled: Vec<(Iteration, Vec<i64>)>,
    /// The script has run every iteration.
    pub finished: bool,
    /// The worker was removed from the cluster.
    pub fenced: bool,
    /// Some request of this worker was redirected and then completed.
    pub followed_redirect: bool,
    redirected: Vec<RequestId>,
}

impl WorkerActorState {
    /// Done: script finished and nothing left open.
    pub fn done(&self) -> bool {
        self.finished && self.node.open_requests() == 0
    }
}

/// A server and what the model observed of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerActorState {
    /// The core server.
    pub node: Server<i64>,
    /// It acknowledged a push without applying it (a duplicate).
    pub suppressed_duplicate: bool,
}

/// The state of one actor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClusterActorState {
    /// The coordinator.
    Coordinator(Box<Coordinator>),
    /// A server.
    Server(Box<ServerActorState>),
    /// A worker.
    Worker(Box<WorkerActorState>),
}

fn id_of(node: pserver_core::NodeId) -> Id {
    Id::from(node.0 as usize)
}

/// Hands the core's effects to stateright: sends and timer commands. Heartbeats and failure
/// checks are dropped when the model has no crashes, because they cannot matter then and only
/// multiply states.
fn forward(effects: &mut Effects<i64>, settings: &Settings, o: &mut Out<ClusterActor>) {
    let modelled = |t: TimerId| match t {
        TimerId::Heartbeat | TimerId::FailureCheck => settings.failure_detection,
        TimerId::Retransmit => settings.retransmission,
        TimerId::Register => settings.retransmission,
    };
    for env in effects.sends.drain(..) {
        if !settings.failure_detection && matches!(env.body, Message::Heartbeat { .. }) {
            continue;
        }
        o.send(id_of(env.to), env);
    }
    for cmd in effects.timers.drain(..) {
        match cmd {
            TimerCmd::Set { timer, .. } if modelled(timer) => o.set_timer(timer, model_timeout()),
            TimerCmd::Set { .. } => {}
            TimerCmd::Cancel(timer) => o.cancel_timer(timer),
        }
    }
}

impl ClusterActor {
    /// Makes this actor run a deliberately broken protocol.
    #[cfg(feature = "mutations")]
    pub(crate) fn set_mutation(&mut self, mutation: Option<pserver_core::Mutation>) {
        match self {
            ClusterActor::Coordinator(_, s) | ClusterActor::Server(_, s) => s.mutation = mutation,
            ClusterActor::Worker(_, s, _) => s.mutation = mutation,
        }
    }

    /// The actors of a model: coordinator, servers, workers, in node-id order. Fails when the
    /// servers cannot hold the ring.
    pub fn all(cfg: &ClusterModelConfig) -> Result<Vec<ClusterActor>, CoordinatorError> {
        let timing = cfg.timing();
        let mut coordinator_cfg =
            CoordinatorConfig::new(cfg.coordinator(), cfg.servers, cfg.workers);
        coordinator_cfg.ring = cfg.ring();
        coordinator_cfg.consistency = cfg.consistency;
        coordinator_cfg.timing = timing;
        let coordinator = if cfg.registration {
            Coordinator::new(coordinator_cfg)?
        } else {
            let servers: Vec<_> = cfg.server_ids().collect();
            let workers: Vec<_> = cfg.worker_ids().collect();
            Coordinator::bootstrapped(coordinator_cfg, &servers, &workers)?
        };
        let settings = Settings {
            failure_detection: cfg.crashes > 0,
            retransmission: cfg.network == NetworkKind::Lossy,
            config: coordinator.config().cloned(),
            #[cfg(feature = "mutations")]
            mutation: None,
        };
        let mut actors = vec![ClusterActor::Coordinator(
            Box::new(coordinator),
            settings.clone(),
        )];
        actors.extend(cfg.server_ids().map(|id| {
            let mut sc = ServerConfig::new(id, cfg.coordinator());
            sc.timing = timing;
            ClusterActor::Server(sc, settings.clone())
        }));
        let script = Script {
            keys: cfg.key_list(),
            iterations: cfg.iterations,
        };
        actors.extend(cfg.worker_ids().map(|id| {
            let mut wc = WorkerConfig::new(id, cfg.coordinator());
            wc.timing = timing;
            ClusterActor::Worker(wc, settings.clone(), script.clone())
        }));
        Ok(actors)
    }
}

impl Script {
    /// Pushes 1 to every key for the current iteration, then ends the iteration.
    fn push_and_advance(&self, w: &mut WorkerActorState, out: &mut Effects<i64>) {
        let ones = vec![1i64; self.keys.len()];
        if let Ok(kvs) = KvPairs::new(self.keys.clone(), ones, 1) {
            if w.node.push(0, kvs, out).is_ok() {
                w.pushed += 1;
            }
        }
        let _ = w.node.advance(0, out);
    }

    /// Pulls every key in the iteration just entered: the values the last push produced.
    fn pull(&self, w: &mut WorkerActorState, out: &mut Effects<i64>) {
        let it = w.node.iteration();
        if let Ok(list) = KeyList::new(self.keys.clone()) {
            if let Ok(id) = w.node.pull(0, KeySelection::Keys(list), out) {
                w.pulling = Some((id, it));
            }
        }
    }

    /// Reacts to the worker's events until none are left. Each iteration: push, advance, and
    /// once in the next iteration pull (in sequential mode that pull waits for every worker).
    fn react(
        &self,
        w: &mut WorkerActorState,
        out: &mut Effects<i64>,
        settings: &Settings,
        o: &mut Out<ClusterActor>,
    ) {
        while !out.events.is_empty() {
            let events: Vec<Event<i64>> = out.events.drain(..).collect();
            for event in events {
                match event {
                    Event::Ready { .. } if self.iterations > 0 => self.push_and_advance(w, out),
                    Event::Ready { .. } => w.finished = true,
                    Event::PushDone(id) => {
                        w.acked += 1;
                        w.followed_redirect |= w.redirected.contains(&id);
                    }
                    Event::Advanced(_) => self.pull(w, out),
                    Event::PullDone(id, kvs) => {
                        w.followed_redirect |= w.redirected.contains(&id);
                        if let Some((_, it)) = w.pulling.take_if(|(open, _)| *open == id) {
                            w.pulled.push((it, kvs.values().to_vec()));
                            if it >= self.iterations {
                                w.finished = true;
                            } else {
                                self.push_and_advance(w, out);
                            }
                        }
                    }
                    Event::Fenced => w.fenced = true,
                    _ => {}
                }
            }
            forward(out, settings, o);
        }
        forward(out, settings, o);
    }
}

impl Actor for ClusterActor {
    type Msg = Envelope<i64>;
    type Timer = TimerId;
    type State = ClusterActorState;

    fn on_start(&self, _id: Id, o: &mut Out<Self>) -> Self::State {
        let mut out = Effects::new();
        match self {
            ClusterActor::Coordinator(c, settings) => {
                let mut c = (**c).clone();
                c.start(0, &mut out);
                forward(&mut out, settings, o);
                ClusterActorState::Coordinator(Box::new(c))
            }
            ClusterActor::Server(cfg, settings) => {
                #[allow(unused_mut)]
                let mut node = Server::new(*cfg, Updater::Sum);
                #[cfg(feature = "mutations")]
                node.set_mutation(settings.mutation);
                match &settings.config {
                    Some(config) => node.start_configured(0, config.clone(), &mut out),
                    None => node.start(0, &mut out),
                }
                forward(&mut out, settings, o);
                ClusterActorState::Server(Box::new(ServerActorState {
                    node,
                    suppressed_duplicate: false,
                }))
            }
            ClusterActor::Worker(cfg, settings, script) => {
                #[allow(unused_mut)]
                let mut node = Worker::new(*cfg);
                #[cfg(feature = "mutations")]
                node.set_mutation(settings.mutation);
                match &settings.config {
                    Some(config) => node.start_configured(0, config.clone(), &mut out),
                    None => node.start(0, &mut out),
                }
                let mut w = WorkerActorState {
                    node,
                    pushed: 0,
                    acked: 0,
                    pulling: None,
                    pulled: Vec::new(),
                    finished: false,
                    fenced: false,
                    followed_redirect: false,
                    redirected: Vec::new(),
                };
                script.react(&mut w, &mut out, settings, o);
                ClusterActorState::Worker(Box::new(w))
            }
        }
    }

    fn on_msg(
        &self,
        _id: Id,
        state: &mut Cow<Self::State>,
        _src: Id,
        msg: Self::Msg,
        o: &mut Out<Self>,
    ) {
        let mut out = Effects::new();
        match (self, state.to_mut()) {
            (ClusterActor::Coordinator(_, settings), ClusterActorState::Coordinator(c)) => {
                c.on_message(0, msg, &mut out);
                forward(&mut out, settings, o);
            }
            (ClusterActor::Server(_, settings), ClusterActorState::Server(s)) => {
                let push = match &msg.body {
                    Message::Push(p) => Some(p.kvs.clone()),
                    _ => None,
                };
                let before: Vec<i64> = push
                    .iter()
                    .flat_map(|kvs| kvs.keys().iter().map(|&k| s.node.received_total(k)[0]))
                    .collect();
                s.node.on_message(0, msg, &mut out);
                if let Some(kvs) = push {
                    let acked = out
                        .sends
                        .iter()
                        .any(|e| matches!(e.body, Message::PushAck(_)));
                    let after: Vec<i64> = kvs
                        .keys()
                        .iter()
                        .map(|&k| s.node.received_total(k)[0])
                        .collect();
                    s.suppressed_duplicate |= acked && !kvs.is_empty() && before == after;
                }
                forward(&mut out, settings, o);
            }
            (ClusterActor::Worker(_, settings, script), ClusterActorState::Worker(w)) => {
                if let Message::Redirect { slice, .. } = &msg.body {
                    if !w.redirected.contains(&slice.request) {
                        w.redirected.push(slice.request);
                    }
                }
                w.node.on_message(0, msg, &mut out);
                script.react(w, &mut out, settings, o);
            }
            _ => {}
        }
    }

    fn on_timeout(
        &self,
        _id: Id,
        state: &mut Cow<Self::State>,
        timer: &Self::Timer,
        o: &mut Out<Self>,
    ) {
        let mut out = Effects::new();
        match (self, state.to_mut()) {
            (ClusterActor::Coordinator(_, settings), ClusterActorState::Coordinator(c)) => {
                c.on_timer(0, *timer, &mut out);
                forward(&mut out, settings, o);
            }
            (ClusterActor::Server(_, settings), ClusterActorState::Server(s)) => {
                s.node.on_timer(0, *timer, &mut out);
                forward(&mut out, settings, o);
            }
            (ClusterActor::Worker(_, settings, script), ClusterActorState::Worker(w)) => {
                w.node.on_timer(0, *timer, &mut out);
                script.react(w, &mut out, settings, o);
            }
            _ => {}
        }
    }

    fn name(&self) -> String {
        match self {
            ClusterActor::Coordinator(c, _) => format!("coordinator {}", c.id()),
            ClusterActor::Server(s, _) => format!("server {}", s.id),
            ClusterActor::Worker(w, _, _) => format!("worker {}", w.id),
        }
    }
}
