//! Stateright actors that are thin adapters over the core's nodes: each call hands the message or
//! timer to the core struct and translates the resulting [`Effects`] into stateright's [`Out`].
//! The only logic here is the workers' scripted application and a few observation flags.

use pserver_core::events::WorkerEvent;
use std::borrow::Cow;

use pserver_core::node::CoordinatorError;
use pserver_core::node::{
    Coordinator, CoordinatorConfig, Server, ServerConfig, Worker, WorkerConfig,
};
use pserver_core::node::{Effects, TimerCmd, TimerId};
use pserver_core::pace::{Pace, Position};
use pserver_core::wire::ClusterConfig;
use pserver_core::wire::{Envelope, Message};
use pserver_core::{
    Epoch, Event, Iteration, KeyList, KeySelection, KvPairs, NodeId, RequestId, Time, Updater,
};
use stateright::actor::{Actor, Id, Out, model_timeout};

use super::config::{ClusterModelConfig, MAX_RETRANSMISSIONS, NetworkKind, STRAGGLER_OTHERS_IN};

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

/// A timer of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelTimer {
    /// A core node's timer, tagged with the actor that set it when crashes are modelled (0
    /// otherwise).
    ///
    /// Stateright leaves `crashed` out of a state's fingerprint, and hashes each actor's set of
    /// timers without a delimiter, so two states that differ only in which actor crashed (its
    /// timers cancelled) get the same fingerprint when the actors had the same timers set: the
    /// checker would explore the crash of one server and take the crash of another for it.
    /// With the actor in every timer, the timers of different actors never hash alike.
    Node {
        /// The actor that set it (0 when no crash is modelled).
        actor: u32,
        /// The core's timer.
        timer: TimerId,
    },
    /// The replication model's failure detector (a coordinator timer, one per server): the
    /// coordinator finds this server silent, having heard from every other member, for as many
    /// failure checks as it takes to declare it dead. The checker fires it at any point; runs
    /// where it names a server that has not crashed are outside the model (an accurate
    /// failure detector), and once one declared a server dead the others are cancelled.
    Detect(NodeId),
    /// Straggler detection ([`ClusterModelConfig::pace`], a coordinator timer, one per
    /// worker): every member is heard from, this worker reporting iteration 0 and the others
    /// [`STRAGGLER_OTHERS_IN`], and the coordinator runs its failure check, whose pace check
    /// decides. The checker fires it at any point. The first pace timer to fire cancels the
    /// others ([`ModelTimer::Calm`] included): each decision publishes a configuration, and
    /// every configuration in flight multiplies the interleavings, so one per run.
    Straggle(NodeId),
    /// With adaptive tau: every worker is heard from at [`STRAGGLER_OTHERS_IN`], nobody lags,
    /// and the failure check lowers tau. The alternative to [`ModelTimer::Straggle`].
    Calm,
}

/// What every node actor shares from the model configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The actor tag of this actor's core timers ([`ModelTimer::Node`]).
    pub timer_tag: u32,
    /// The coordinator of the replication model: the servers its failure detector may find
    /// silent ([`ModelTimer::Detect`]); empty otherwise.
    pub detect: Vec<NodeId>,
    /// True in the replication model, whose failure detector ([`ModelTimer::Detect`]) needs no
    /// heartbeats: the heartbeat timer is still kept set, and its firings send nothing, only so
    /// that a crash, which cancels the crashed actor's timers, changes the state's fingerprint
    /// (stateright leaves `crashed` out of it).
    pub heartbeat_marks_crash: bool,
    /// Heartbeats and failure checks are modelled only when crashes are.
    pub failure_detection: bool,
    /// The coordinator of a model with [`ClusterModelConfig::pace`]: the workers its straggler
    /// detection may find lagging ([`ModelTimer::Straggle`]); empty otherwise.
    pub stragglers: Vec<NodeId>,
    /// With adaptive tau, the coordinator may find no worker lagging ([`ModelTimer::Calm`]),
    /// and its bound then falls.
    pub calm: bool,
    /// Workers note the epochs of the answers to their pulls ([`Pulled::answered_at`]): the
    /// pace may differ from one configuration to the next ([`ClusterModelConfig::pace`]).
    pub pace: bool,
    /// Retransmission is modelled only on the lossy network: on the reliable ordered one the
    /// model takes acknowledgements to beat the timeout, because every retransmission would
    /// otherwise lengthen a FIFO channel without end.
    pub retransmission: bool,
    /// Start with this configuration in force instead of registering.
    pub config: Option<ClusterConfig>,
    /// Workers keep a clock and a retransmission budget ([`ClusterModelConfig::backoff`]).
    pub backoff: bool,
    /// With replicas: the keys whose values each server remembers the most it ever held
    /// ([`ServerActorState::ever_held`]).
    pub held_keys: Vec<u64>,
    #[cfg(feature = "mutations")]
    pub(crate) mutation: Option<pserver_core::mutation::Mutation>,
}

/// The workload of a worker: each iteration pushes to every key and advances, then pulls every
/// key in the next iteration. The push of iteration `i` sets this worker's column `i` to 1, so
/// every value read later says exactly which pushes it includes.
#[derive(Clone, Debug)]
pub struct Script {
    /// The keys.
    pub keys: Vec<u64>,
    /// Iterations to run.
    pub iterations: Iteration,
    /// Values per key ([`ClusterModelConfig::width`]).
    pub width: usize,
    /// This worker's column of iteration 0 ([`ClusterModelConfig::column`]).
    pub first_column: usize,
    /// The model, for the keys each iteration pushes ([`ClusterModelConfig::pushes`]).
    pub model: ClusterModelConfig,
}

/// A worker and where its script is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerActorState {
    /// The core worker.
    pub node: Worker<i64>,
    /// The push request of each iteration so far, with its iteration: one per iteration but
    /// those the worker was told to skip before it pushed them.
    pub pushes: Vec<(Iteration, RequestId)>,
    /// Bit `i`: the push of iteration `i` was acknowledged (`PushDurable`).
    pub acked: u64,
    /// Bit `i`: the push of iteration `i` counted for its iteration (`PushDone`: acknowledged,
    /// or, in sequential mode with replicas, taken in by its servers).
    pub counted: u64,
    /// The open pull and the iteration it was issued in.
    pub pulling: Option<(RequestId, Iteration)>,
    /// With [`ClusterModelConfig::pace`]: the epochs of the answers to the open pull so far,
    /// sorted ([`Pulled::answered_at`]).
    pub answered_at: Vec<Epoch>,
    /// Every completed pull.
    pub pulled: Vec<Pulled>,
    /// A pull completed with other keys than it asked for, or a pull completed that was not
    /// open.
    pub bad_pull: bool,
    /// The worker's clock: 0 unless backoff is modelled, when each retransmission timer firing
    /// moves it to that timer's deadline.
    pub clock: Time,
    /// The retransmission timer's deadline, when set.
    pub retransmit_at: Option<Time>,
    /// Retransmission timer firings so far.
    pub retransmissions: u8,
    /// Some retransmission was followed by a doubled timeout.
    pub backed_off: bool,
    /// Key caching: it named a key list instead of sending it.
    pub named_list: bool,
    /// Key caching: a server asked it for a list it named.
    pub list_asked: bool,
    /// The script has run every iteration.
    pub finished: bool,
    /// The worker was removed from the cluster.
    pub fenced: bool,
    /// Some request of this worker was redirected and then completed.
    pub followed_redirect: bool,
    /// The coordinator told this worker to skip ahead, and it entered a later iteration
    /// ([`pserver_core::events::WorkerEvent::SkippedAhead`]).
    pub skipped_ahead: bool,
    redirected: Vec<RequestId>,
}

impl WorkerActorState {
    /// Done: script finished and nothing left open.
    pub fn done(&self) -> bool {
        self.finished && self.node.open_requests() == 0
    }

    /// Whether the push of `iteration` was issued.
    pub fn issued(&self, iteration: Iteration) -> bool {
        self.pushes.iter().any(|&(it, _)| it == iteration)
    }

    /// Whether the push of `iteration` was acknowledged.
    pub fn is_acked(&self, iteration: Iteration) -> bool {
        iteration < 64 && self.acked & (1 << iteration) != 0
    }

    /// Every iteration below this one had its push acknowledged, or was skipped
    /// ([`Worker::skipped_below`]).
    pub fn acked_below(&self) -> Iteration {
        self.first_without(self.acked)
    }

    /// Every iteration below this one had its push counted ([`pserver_core::events::WorkerEvent::PushDone`]), or was
    /// skipped ([`Worker::skipped_below`]): what the worker's in-flight bound counts as
    /// finished.
    pub fn counted_below(&self) -> Iteration {
        self.first_without(self.counted)
    }

    /// The first iteration the worker was not told to skip whose bit in `bits` is clear.
    fn first_without(&self, bits: u64) -> Iteration {
        let skipped = self.node.skipped_below();
        (skipped..64)
            .find(|&i| bits & (1 << i) == 0)
            .unwrap_or(skipped.max(64))
    }

    /// The iteration of push `id`.
    fn iteration_of(&self, id: RequestId) -> Option<Iteration> {
        self.pushes
            .iter()
            .find_map(|&(it, p)| (p == id).then_some(it))
    }

    /// The retransmission budget is spent: no more retransmissions will be modelled.
    pub fn gave_up(&self) -> bool {
        self.retransmissions >= MAX_RETRANSMISSIONS
    }
}

/// A completed pull.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pulled {
    /// The iteration it was issued in.
    pub iteration: Iteration,
    /// The values it returned, key by key.
    pub values: Vec<i64>,
    /// With [`ClusterModelConfig::pace`], the epochs of the servers' answers to it, sorted:
    /// each server held the pull to the bound of its configuration, so the pull is judged
    /// against the weakest of those. Empty otherwise: every configuration has the job's pace.
    pub answered_at: Vec<Epoch>,
}

/// A server and what the model observed of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerActorState {
    /// The core server.
    pub node: Server<i64>,
    /// It acknowledged a push without applying it (a duplicate).
    pub suppressed_duplicate: bool,
    /// It took in a whole copy of a shard (`Transfer`) as a new replica and acknowledged it.
    pub installed_copy: bool,
    /// With replicas: per key (in key order) and column, the most this server ever held, stored
    /// or buffered. A server removed from the ring drops its shards, so what it answered a pull
    /// with is remembered here. Empty without replicas.
    pub ever_held: Vec<i64>,
}

impl ServerActorState {
    /// Raises [`ServerActorState::ever_held`] to what the server holds now.
    fn note_held(&mut self, settings: &Settings) {
        if settings.held_keys.is_empty() {
            return;
        }
        let now: Vec<i64> = settings
            .held_keys
            .iter()
            .flat_map(|&k| self.node.received_total(k))
            .collect();
        if self.ever_held.len() != now.len() {
            self.ever_held = now;
        } else {
            for (e, v) in self.ever_held.iter_mut().zip(now) {
                *e = (*e).max(v);
            }
        }
    }
}

/// The coordinator and the pace of every configuration it published, which properties judge
/// against: servers and workers may hold any of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CoordinatorActorState {
    /// The core coordinator.
    pub node: Coordinator,
    /// The pace of each configuration published so far, by epoch ([`ClusterConfig::pace`]).
    /// An epoch not listed was set up by the model (a ring change's first) with the default.
    pub published: Vec<(Epoch, Pace)>,
}

impl CoordinatorActorState {
    fn new(node: Coordinator) -> Self {
        let mut state = CoordinatorActorState {
            node,
            published: Vec::new(),
        };
        if let Some(config) = state.node.config().cloned() {
            state.note(&config);
        }
        state
    }

    /// The pace of the configuration of `epoch`.
    pub fn pace_at(&self, epoch: Epoch) -> Option<&Pace> {
        self.published
            .iter()
            .find_map(|(e, pace)| (*e == epoch).then_some(pace))
    }

    /// The highest staleness bound adaptive tau set in any configuration published so far
    /// (`None` while none set one): a worker may have entered iterations under it.
    pub fn most_tau(&self) -> Option<Iteration> {
        self.published.iter().filter_map(|(_, p)| p.tau).max()
    }

    /// Notes every configuration the coordinator sends in `effects`: one superseded within the
    /// same step may still reach a node.
    fn note_sent(&mut self, effects: &Effects<i64>) {
        for env in &effects.sends {
            if let Message::Config(config) = &env.body {
                self.note(config);
            }
        }
    }

    fn note(&mut self, config: &ClusterConfig) {
        if self.pace_at(config.epoch).is_none() {
            self.published.push((config.epoch, config.pace.clone()));
        }
    }
}

/// The state of one actor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClusterActorState {
    /// The coordinator.
    Coordinator(Box<CoordinatorActorState>),
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
        TimerId::Heartbeat => settings.failure_detection || settings.heartbeat_marks_crash,
        TimerId::FailureCheck => settings.failure_detection,
        TimerId::Retransmit | TimerId::Replicate => settings.retransmission,
        TimerId::Register => settings.retransmission,
        // Set only by servers of a job with push slots, which the models do not run.
        TimerId::SlotLease => settings.retransmission,
    };
    for env in effects.sends.drain(..) {
        if !settings.failure_detection && matches!(env.body, Message::Heartbeat { .. }) {
            continue;
        }
        // Answers to heartbeats feed only the nodes' watch on the coordinator, which the
        // checker's timing turns off (`coordinator_timeout` 0).
        if matches!(env.body, Message::HeartbeatAck { .. }) {
            continue;
        }
        o.send(id_of(env.to), env);
    }
    for cmd in effects.timers.drain(..) {
        match cmd {
            TimerCmd::Set { timer, .. } if modelled(timer) => {
                o.set_timer(settings.tag(timer), model_timeout());
            }
            TimerCmd::Set { .. } => {}
            TimerCmd::Cancel(timer) => o.cancel_timer(settings.tag(timer)),
        }
    }
}

impl Settings {
    fn tag(&self, timer: TimerId) -> ModelTimer {
        ModelTimer::Node {
            actor: self.timer_tag,
            timer,
        }
    }
}

impl ClusterActor {
    fn settings_mut(&mut self) -> &mut Settings {
        match self {
            ClusterActor::Coordinator(_, s) | ClusterActor::Server(_, s) => s,
            ClusterActor::Worker(_, s, _) => s,
        }
    }

    /// Makes this actor run a deliberately broken protocol.
    #[cfg(feature = "mutations")]
    pub(crate) fn set_mutation(&mut self, mutation: Option<pserver_core::mutation::Mutation>) {
        self.settings_mut().mutation = mutation;
    }

    /// The actors of a model: coordinator, servers, workers, in node-id order. Fails when the
    /// servers cannot hold the ring.
    pub fn all(cfg: &ClusterModelConfig) -> Result<Vec<ClusterActor>, CoordinatorError> {
        let job = cfg.job();
        let coordinator_cfg = job.coordinator_config();
        let coordinator = if cfg.registration && !cfg.ring_change {
            Coordinator::new(coordinator_cfg)?
        } else {
            let servers: Vec<_> = cfg.server_ids().collect();
            let workers: Vec<_> = cfg.worker_ids().collect();
            Coordinator::bootstrapped(coordinator_cfg, &servers, &workers)?
        };
        let settings = Settings {
            timer_tag: 0,
            detect: Vec::new(),
            heartbeat_marks_crash: cfg.crashes > 0 && cfg.copies_ranges(),
            failure_detection: cfg.crashes > 0 && !cfg.copies_ranges(),
            stragglers: Vec::new(),
            calm: false,
            pace: cfg.pace.is_some(),
            retransmission: cfg.network == NetworkKind::Lossy,
            config: coordinator.config().cloned(),
            backoff: cfg.backoff && cfg.network == NetworkKind::Lossy,
            held_keys: if cfg.copies_ranges() {
                cfg.key_list()
            } else {
                Vec::new()
            },
            #[cfg(feature = "mutations")]
            mutation: None,
        };
        let (coordinator, server_settings) = match (&settings.config, cfg.ring_change) {
            (Some(old), true) => {
                let (coordinator, new) = changed_ring(cfg, coordinator_cfg, old)?;
                let server_settings = Settings {
                    config: Some(new),
                    ..settings.clone()
                };
                (coordinator, server_settings)
            }
            _ => (coordinator, settings.clone()),
        };
        let mut actors = vec![ClusterActor::Coordinator(
            Box::new(coordinator),
            server_settings.clone(),
        )];
        actors.extend(
            cfg.server_ids()
                .map(|id| ClusterActor::Server(job.server_config(id), server_settings.clone())),
        );
        actors.extend(cfg.worker_ids().enumerate().map(|(index, id)| {
            let wc = job.worker_config(id);
            let script = Script {
                keys: cfg.key_list(),
                iterations: cfg.iterations,
                width: job.width,
                first_column: cfg.column(index, 0),
                model: cfg.clone(),
            };
            ClusterActor::Worker(wc, settings.clone(), script)
        }));
        // A joining server starts as a fresh process that registers: its `Register` is on the
        // network from the start, and the checker delivers it at any point of the run.
        actors.extend(cfg.joiner_ids().map(|id| {
            let sc = job.server_config(id);
            let settings = Settings {
                config: None,
                ..server_settings.clone()
            };
            ClusterActor::Server(sc, settings)
        }));
        if cfg.crashes > 0 {
            for (i, actor) in actors.iter_mut().enumerate() {
                actor.settings_mut().timer_tag = i as u32;
            }
            if cfg.copies_ranges() {
                actors[0].settings_mut().detect = cfg.all_server_ids().collect();
            }
        }
        if let Some(pace) = cfg.pace {
            let settings = actors[0].settings_mut();
            settings.stragglers = cfg.worker_ids().collect();
            settings.calm = pace.adaptive_tau.is_some();
        }
        Ok(actors)
    }
}

/// The coordinator's failure checks find `victim` silent: before each check every other member
/// (joining servers included) is heard from (a heartbeat at the current epoch), and as many
/// checks run as it takes to declare a silent member dead.
fn detect(c: &mut Coordinator, victim: NodeId, out: &mut Effects<i64>) {
    let Some(config) = c.config() else {
        return;
    };
    if !config.servers.contains(&victim) && !config.joining.contains(&victim) {
        return;
    }
    for _ in 0..DETECTION_CHECKS {
        let Some(config) = c.config() else {
            return;
        };
        let (epoch, heard): (_, Vec<NodeId>) = (
            config.epoch,
            config
                .workers
                .iter()
                .chain(&config.servers)
                .chain(&config.joining)
                .copied()
                .filter(|&n| n != victim)
                .collect(),
        );
        for from in heard {
            let body = Message::Heartbeat {
                sent_at: 0,
                at: None,
                term: 0,
            };
            c.on_message(0, Envelope::new(from, c.id(), epoch, body), out);
        }
        c.on_timer(0, TimerId::FailureCheck, out);
    }
}

/// Failure checks a silent member survives before it is declared dead, plus one: the model's
/// timing ([`ClusterModelConfig::timing`]) allows one missed check.
const DETECTION_CHECKS: usize = 2;

/// One failure check of the coordinator after it heard from every member: `straggler` (if
/// any) reports iteration 0 and every other worker [`STRAGGLER_OTHERS_IN`], so that the core's
/// own pace check finds the straggler lagging, or nobody. Every member is heard from, so that
/// the check declares nobody dead.
fn pace_check(c: &mut Coordinator, straggler: Option<NodeId>, out: &mut Effects<i64>) {
    let Some(config) = c.config() else {
        return;
    };
    let epoch = config.epoch;
    let heard: Vec<(NodeId, Option<Position>)> = config
        .workers
        .iter()
        .map(|&w| {
            let iteration = if Some(w) == straggler {
                0
            } else {
                STRAGGLER_OTHERS_IN
            };
            let at = Position {
                iteration,
                ..Position::default()
            };
            (w, Some(at))
        })
        .chain(
            config
                .servers
                .iter()
                .chain(&config.joining)
                .map(|&s| (s, None)),
        )
        .collect();
    for (from, at) in heard {
        let body = Message::Heartbeat {
            sent_at: 0,
            at,
            term: 0,
        };
        c.on_message(0, Envelope::new(from, c.id(), epoch, body), out);
    }
    c.on_timer(0, TimerId::FailureCheck, out);
}

/// The coordinator and the epoch-2 configuration of a ring change: the owner of the first key
/// is taken off the ring of `old`.
fn changed_ring(
    cfg: &ClusterModelConfig,
    coordinator_cfg: CoordinatorConfig,
    old: &ClusterConfig,
) -> Result<(Coordinator, ClusterConfig), CoordinatorError> {
    let ring_error = |source| CoordinatorError::Ring {
        servers: cfg.servers,
        source,
    };
    let ring = old.ring_in_force().map_err(ring_error)?;
    let first = cfg.key_list().first().copied().unwrap_or(0);
    let new = old
        .without_server(ring.primary(first))
        .map_err(ring_error)?;
    let coordinator = Coordinator::resume(coordinator_cfg, new.clone())?;
    Ok((coordinator, new))
}

impl Script {
    /// Pushes this worker's column of the current iteration to every key, then ends the
    /// iteration.
    fn push_and_advance(&self, w: &mut WorkerActorState, out: &mut Effects<i64>) {
        let it = w.node.iteration();
        debug_assert!(!w.issued(it), "one push per iteration");
        let keys: Vec<u64> = (0..self.keys.len())
            .filter(|&i| self.model.pushes(it, i))
            .map(|i| self.keys[i])
            .collect();
        let mut values = vec![0i64; keys.len() * self.width];
        for row in values.chunks_mut(self.width) {
            if let Some(v) = row.get_mut(self.first_column + it as usize) {
                *v = 1;
            }
        }
        if let Ok(kvs) = KvPairs::new(keys, values, self.width) {
            if let Ok(id) = w.node.push(w.clock, kvs, out) {
                w.pushes.push((it, id));
            }
        }
        let _ = w.node.advance(w.clock, out);
    }

    /// Pulls every key in the iteration just entered: the values the last push produced.
    fn pull(&self, w: &mut WorkerActorState, out: &mut Effects<i64>) {
        let it = w.node.iteration();
        if let Ok(list) = KeyList::new(self.keys.clone()) {
            if let Ok(id) = w.node.pull(w.clock, KeySelection::Keys(list), out) {
                w.pulling = Some((id, it));
            }
        }
    }

    /// Reacts to the worker's events until none are left. Each iteration: push, advance, and
    /// once in the next iteration pull (in sequential mode that pull waits for every worker).
    /// A worker told to skip ahead goes on from the iteration it entered: an advance it waited
    /// on is answered with that iteration, whose pull it then issues; a pull it had open
    /// completes, and the worker pushes in the iteration it is in now, never in those skipped.
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
                    Event::Worker(WorkerEvent::PushDone(id)) => {
                        if let Some(it) = w.iteration_of(id) {
                            w.counted |= 1 << it;
                        }
                        w.followed_redirect |= w.redirected.contains(&id);
                    }
                    Event::Worker(WorkerEvent::PushDurable(id)) => {
                        if let Some(it) = w.iteration_of(id) {
                            w.acked |= 1 << it;
                        }
                    }
                    Event::Worker(WorkerEvent::SkippedAhead { .. }) => w.skipped_ahead = true,
                    Event::Worker(WorkerEvent::Advanced(_)) => self.pull(w, out),
                    Event::Worker(WorkerEvent::PullDone(id, kvs)) => {
                        w.followed_redirect |= w.redirected.contains(&id);
                        match w.pulling.take_if(|(open, _)| *open == id) {
                            Some((_, it)) => {
                                w.bad_pull |= kvs.keys() != self.keys.as_slice();
                                w.pulled.push(Pulled {
                                    iteration: it,
                                    values: kvs.values().to_vec(),
                                    answered_at: core::mem::take(&mut w.answered_at),
                                });
                                if w.node.iteration() >= self.iterations {
                                    w.finished = true;
                                } else {
                                    self.push_and_advance(w, out);
                                }
                            }
                            None => w.bad_pull = true,
                        }
                    }
                    Event::Fenced => w.fenced = true,
                    _ => {}
                }
            }
            track_retransmission(w, out, settings);
            w.named_list |= out
                .sends
                .iter()
                .any(|e| matches!(e.body, Message::PushCached(_) | Message::PullCached(_)));
            forward(out, settings, o);
        }
        track_retransmission(w, out, settings);
        forward(out, settings, o);
    }
}

/// With backoff, remembers the deadline of the worker's retransmission timer (the time it will
/// be fired at), and once the worker's budget is spent stops handing that timer to the checker.
fn track_retransmission(w: &mut WorkerActorState, out: &mut Effects<i64>, settings: &Settings) {
    if !settings.backoff {
        return;
    }
    out.timers.retain(|cmd| match *cmd {
        TimerCmd::Set {
            timer: TimerId::Retransmit,
            at,
        } => {
            w.retransmit_at = Some(at);
            !w.gave_up()
        }
        TimerCmd::Cancel(TimerId::Retransmit) => {
            w.retransmit_at = None;
            true
        }
        _ => true,
    });
}

impl Actor for ClusterActor {
    type Msg = Envelope<i64>;
    type Timer = ModelTimer;
    type State = ClusterActorState;

    fn on_start(&self, _id: Id, o: &mut Out<Self>) -> Self::State {
        let mut out = Effects::new();
        match self {
            ClusterActor::Coordinator(c, settings) => {
                let mut c = (**c).clone();
                c.start(0, &mut out);
                forward(&mut out, settings, o);
                for &server in &settings.detect {
                    o.set_timer(ModelTimer::Detect(server), model_timeout());
                }
                for &worker in &settings.stragglers {
                    o.set_timer(ModelTimer::Straggle(worker), model_timeout());
                }
                if settings.calm {
                    o.set_timer(ModelTimer::Calm, model_timeout());
                }
                ClusterActorState::Coordinator(Box::new(CoordinatorActorState::new(c)))
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
                    installed_copy: false,
                    ever_held: Vec::new(),
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
                    pushes: Vec::new(),
                    acked: 0,
                    counted: 0,
                    pulling: None,
                    answered_at: Vec::new(),
                    pulled: Vec::new(),
                    bad_pull: false,
                    clock: 0,
                    retransmit_at: None,
                    retransmissions: 0,
                    backed_off: false,
                    named_list: false,
                    list_asked: false,
                    finished: false,
                    fenced: false,
                    followed_redirect: false,
                    skipped_ahead: false,
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
                c.node.on_message(0, msg, &mut out);
                c.note_sent(&out);
                forward(&mut out, settings, o);
            }
            (ClusterActor::Server(_, settings), ClusterActorState::Server(s)) => {
                let push = match &msg.body {
                    Message::Push(p) => Some(p.kvs.clone()),
                    _ => None,
                };
                let transfer = matches!(msg.body, Message::Transfer(_));
                let before: Vec<Vec<i64>> = push
                    .iter()
                    .flat_map(|kvs| kvs.keys().iter().map(|&k| s.node.received_total(k)))
                    .collect();
                s.node.on_message(0, msg, &mut out);
                if let Some(kvs) = push {
                    let acked = out
                        .sends
                        .iter()
                        .any(|e| matches!(e.body, Message::PushAck(_)));
                    let after: Vec<Vec<i64>> = kvs
                        .keys()
                        .iter()
                        .map(|&k| s.node.received_total(k))
                        .collect();
                    s.suppressed_duplicate |= acked && !kvs.is_empty() && before == after;
                }
                s.installed_copy |= transfer
                    && out
                        .sends
                        .iter()
                        .any(|e| matches!(e.body, Message::TransferAck { .. }));
                s.note_held(settings);
                forward(&mut out, settings, o);
            }
            (ClusterActor::Worker(_, settings, script), ClusterActorState::Worker(w)) => {
                if let Message::Redirect { slice, .. } = &msg.body {
                    if !w.redirected.contains(&slice.request) {
                        w.redirected.push(slice.request);
                    }
                }
                let answered = match &msg.body {
                    Message::PullReply(reply) => Some(reply.slice),
                    Message::PullValues(reply) => Some(reply.slice),
                    Message::PullRows(reply) => Some(reply.slice),
                    _ => None,
                };
                if let Some(slice) = answered {
                    let open = w.pulling.is_some_and(|(id, _)| id == slice.request);
                    if settings.pace && open {
                        if let Err(at) = w.answered_at.binary_search(&msg.epoch) {
                            w.answered_at.insert(at, msg.epoch);
                        }
                    }
                }
                w.list_asked |= matches!(msg.body, Message::KeysUnknown(_));
                w.node.on_message(w.clock, msg, &mut out);
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
        let timer = match *timer {
            ModelTimer::Node { timer, .. } => timer,
            ModelTimer::Detect(victim) => {
                if let (ClusterActor::Coordinator(_, settings), ClusterActorState::Coordinator(c)) =
                    (self, state.to_mut())
                {
                    let dead = c.node.dead().len();
                    detect(&mut c.node, victim, &mut out);
                    c.note_sent(&out);
                    forward(&mut out, settings, o);
                    if c.node.dead().len() > dead {
                        for &server in &settings.detect {
                            o.cancel_timer(ModelTimer::Detect(server));
                        }
                    } else {
                        // Not a member yet (a server that has still to join): it may be
                        // found silent once it is.
                        o.set_timer(ModelTimer::Detect(victim), model_timeout());
                    }
                }
                return;
            }
            ModelTimer::Straggle(_) | ModelTimer::Calm => {
                if let (ClusterActor::Coordinator(_, settings), ClusterActorState::Coordinator(c)) =
                    (self, state.to_mut())
                {
                    let straggler = match *timer {
                        ModelTimer::Straggle(worker) => Some(worker),
                        _ => None,
                    };
                    if c.node.config().is_none() {
                        // Registration is not over: nobody can lag yet.
                        o.set_timer(*timer, model_timeout());
                        return;
                    }
                    pace_check(&mut c.node, straggler, &mut out);
                    c.note_sent(&out);
                    forward(&mut out, settings, o);
                    for &worker in &settings.stragglers {
                        o.cancel_timer(ModelTimer::Straggle(worker));
                    }
                    o.cancel_timer(ModelTimer::Calm);
                }
                return;
            }
        };
        let timer = &timer;
        match (self, state.to_mut()) {
            (ClusterActor::Coordinator(_, settings), ClusterActorState::Coordinator(c)) => {
                c.node.on_timer(0, *timer, &mut out);
                c.note_sent(&out);
                forward(&mut out, settings, o);
            }
            (ClusterActor::Server(_, settings), ClusterActorState::Server(s)) => {
                s.node.on_timer(0, *timer, &mut out);
                s.note_held(settings);
                forward(&mut out, settings, o);
            }
            (ClusterActor::Worker(cfg, settings, script), ClusterActorState::Worker(w)) => {
                if settings.backoff && *timer == TimerId::Retransmit {
                    // The timer fires at its deadline; a timeout set after this firing that is
                    // longer than the first one was doubled.
                    w.clock = w.retransmit_at.take().unwrap_or(w.clock).max(w.clock);
                    w.retransmissions = w.retransmissions.saturating_add(1);
                    w.node.on_timer(w.clock, *timer, &mut out);
                    let first = cfg.timing.rto_initial;
                    w.backed_off |= out.timers.iter().any(|cmd| {
                        matches!(*cmd, TimerCmd::Set { timer: TimerId::Retransmit, at }
                            if at >= w.clock + 2 * first)
                    });
                } else {
                    w.node.on_timer(w.clock, *timer, &mut out);
                }
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
