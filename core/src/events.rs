//! What a node tells its application: events, grouped by the role that says them, and why
//! input was refused (ARCHITECTURE.md §1).

use core::fmt;

use crate::ids::{Epoch, Iteration, NodeId, Time};
use crate::key::KeyRange;
use crate::kv::KvPairs;
use crate::pace::Coverage;
use crate::value::Value;
use crate::wire::DecodeError;
use crate::wire::{RequestId, ShardCopy};

/// What became of a worker's requests and iterations: said by workers only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkerEvent<V: Value> {
    /// The worker entered this iteration (after `advance`, once consistency allows it).
    Advanced(Iteration),
    /// A push is done for its iteration: every slice was acknowledged or, in sequential mode
    /// with replicas, taken in by its server (its replicas get it with the iteration's sum).
    /// The application may go on; [`WorkerEvent::PushDurable`] follows once the replicas hold it.
    PushDone(RequestId),
    /// Every slice of a push was acknowledged: its servers and their replicas hold it, and it
    /// survives as many server crashes as there are replicas. Comes with or after
    /// [`WorkerEvent::PushDone`]; until then the worker keeps the push and resends it where needed.
    PushDurable(RequestId),
    /// Every slice of a pull was answered; the values in key order.
    PullDone(RequestId, KvPairs<V>),
    /// The coordinator told this worker to skip ahead ([`crate::pace::Pace::skipped_below`]): it
    /// left iteration `from` for `to` at once. The iterations in between count as finished;
    /// what it pushed of `from` still counts, what it had not pushed is dropped.
    SkippedAhead {
        /// The iteration it was in.
        from: Iteration,
        /// The iteration it is in now.
        to: Iteration,
        /// How much of `from` its pushes covered ([`crate::node::Worker::push_part`]).
        covered: Coverage,
    },
    /// The oldest request this worker has not done (a push not yet counted for its
    /// iteration, a pull not answered), or else an advance the consistency model holds, has
    /// waited [`crate::Timing::stall_limit`]. Said once per request (or iteration), however
    /// well later requests complete. The worker goes on trying; an application that cannot
    /// wait longer stops it.
    Stalled {
        /// The request, or `None` for an advance.
        request: Option<RequestId>,
        /// How long it has waited.
        for_at_least: Time,
        /// Its slices unanswered, with the servers they wait for; none for an advance, or a
        /// request whose progress the servers have not acknowledged.
        waits: Vec<Wait>,
    },
}

/// One unanswered slice of a worker's open request ([`crate::node::Worker::waits`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Wait {
    /// The request it is a slice of.
    pub request: RequestId,
    /// A push (otherwise a pull).
    pub push: bool,
    /// The iteration the request belongs to.
    pub iteration: Iteration,
    /// The server it is addressed to.
    pub server: NodeId,
    /// The keys it covers, first to last (none for an empty slice).
    pub keys: Option<KeyRange>,
    /// How many times it was sent again, unanswered.
    pub attempts: u8,
}

/// What a server's driver must do for the job's checkpoints: said by servers only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServerEvent<V: Value> {
    /// Every worker finished the iterations below `cut` and waits there
    /// ([`crate::wire::Checkpoints`]): `shards` is a copy of every shard this server holds, as
    /// of the cut. The driver writes them where they survive the process (written whole or
    /// not at all) and then calls [`crate::driver::ServerCalls::checkpoint_written`]; the workers go on
    /// once every server has. Said again, with the shards of the new ring, if the ring
    /// changes before the coordinator records the cut.
    CheckpointDue {
        /// The iteration the workers wait before.
        cut: Iteration,
        /// The shards, each with its range, rows and update-rule state, the rows shared with
        /// the store: dropped before the workers go on, they cost no copy.
        shards: Vec<ShardCopy<V>>,
    },
    /// The job resumes from the checkpoint of `cut` (with its first
    /// configuration): the driver reads the shards this server wrote at that cut and hands
    /// them to [`crate::driver::ServerCalls::restore`] before anything else. Until then the server serves
    /// nothing; messages wait.
    Restore {
        /// The cut.
        cut: Iteration,
    },
}

/// What the coordinator decided or saw of the job: said by coordinators only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CoordinatorEvent {
    /// A worker left the job on its own): done, or stopped by its operator.
    /// Its shares pass to nobody ([`crate::wire::ClusterConfig::left`]).
    WorkerLeft(NodeId),
    /// The coordinator published a ring whose keys have another number of replicas than the
    /// ring before: fewer than asked after servers crashed or left with too few servers left
    /// for `k` ([`crate::ring::Ring::surviving`]), or more again once servers joined. Below
    /// `asked`, a further crash may lose ranges ([`Event::RangeLost`]).
    ReplicasChanged {
        /// Replicas each key has besides its primary now.
        held: u32,
        /// The ring's `k`.
        asked: u32,
    },
    /// A standby coordinator took over from the active one, which went silent: members
    /// granted it `term`, and it published the configuration of `epoch`;
    /// ARCHITECTURE.md §11).
    TookOver {
        /// The coordinator it took over from.
        from: NodeId,
        /// Its term.
        term: u64,
        /// Its first configuration.
        epoch: Epoch,
    },
    /// The active coordinator dropped a standby that stopped acknowledging its state: it
    /// publishes without it).
    StandbyDropped(NodeId),
    /// Members granted a standby a term it did not win; the active coordinator took a newer
    /// term itself, its configuration published again as the first epoch of it
    ///).
    TermRenewed {
        /// The term.
        term: u64,
        /// The first epoch of it.
        epoch: Epoch,
    },
    /// This coordinator heard of a newer term than its own and stopped publishing: another
    /// took over).
    SteppedDown {
        /// The newer term.
        term: u64,
    },
    /// The coordinator found a worker lagging the others;
    /// [`crate::pace::Detection`]). Said once, until [`CoordinatorEvent::StragglerCleared`].
    Straggler {
        /// The worker.
        worker: NodeId,
        /// How many whole iterations it is behind the median of the others.
        behind: Iteration,
    },
    /// A worker flagged as a straggler keeps up again).
    StragglerCleared(NodeId),
    /// The staleness bound in force changed ([`crate::pace::TauRange`]).
    TauChanged {
        /// The bound before.
        from: Iteration,
        /// The bound now.
        to: Iteration,
    },
    /// The coordinator moved a share of the job's work from a slower worker to a faster one
    /// ([`crate::pace::StragglerPolicy::balance`]), in the configuration it published.
    ShareMoved {
        /// Which share ([`crate::wire::ClusterConfig::shares`]).
        share: usize,
        /// The worker that held it.
        from: NodeId,
        /// The worker that holds it now.
        to: NodeId,
    },
    /// Every server on the ring took its copy of the shards as of `cut`):
    /// the workers go on while the copies are written.
    CheckpointTaken {
        /// The cut.
        cut: Iteration,
    },
    /// Every server on the ring wrote its shards as of `cut`): a job
    /// restarted whole may resume from it.
    CheckpointComplete {
        /// The cut.
        cut: Iteration,
    },
}

/// Something the application (or the driver) should know, grouped by the role that says it:
/// a worker's requests ([`Event::Worker`]), a server's checkpoints ([`Event::Server`]), the
/// coordinator's decisions ([`Event::Coordinator`]); the rest any node may say.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Event<V: Value> {
    /// A worker's requests and iterations.
    Worker(WorkerEvent<V>),
    /// A server's checkpoints.
    Server(ServerEvent<V>),
    /// The coordinator's decisions.
    Coordinator(CoordinatorEvent),
    /// The node received its first configuration and serves requests (a server: the first
    /// configuration that lists it as a member).
    Ready {
        /// The configuration's epoch.
        epoch: Epoch,
    },
    /// The coordinator no longer counts this node as a member: it must stop. A server gets it
    /// once it has left ([`crate::node::Server::leave`]) or was declared dead while still running;
    /// started again (with a new incarnation), it joins as a new member.
    Fenced,
    /// A node was declared dead: silent past [`crate::Timing::heartbeat_timeout`], or a server
    /// restarted as a new process. The coordinator says it when it declares it; every server
    /// and worker once a configuration without it arrives
    /// ([`crate::wire::ClusterConfig::dead_since`]). A dead server's ranges pass to their
    /// replicas; a dead worker's shares to the live workers.
    NodeDead(NodeId),
    /// This server is silent past the timeout, restarted, or asked to leave, but stays in the
    /// ring, because without it no server would be left, or fewer replicas than
    /// [`crate::node::CoordinatorConfig::min_replicas`]. A silent server's ranges are not
    /// served until it answers again. The coordinator says it when it keeps the server; every
    /// server and worker, of a server kept though silent, once the coordinator's answer to
    /// its heartbeat lists it (both once per silence).
    RingDegraded(NodeId),
    /// A server became the primary of a range that no live server held a copy of (more
    /// servers failed than the ring has replicas, faster than copies were refilled): the range
    /// starts again from zero. Every value pushed to it before is lost. Emitted on that
    /// server, on the coordinator once the server reported it, and on every other server and
    /// every worker once a configuration lists it ([`crate::wire::ClusterConfig::lost`]).
    RangeLost(KeyRange),
    /// Every worker left the job, its work done ([`crate::wire::ClusterConfig::job_finished`]),
    /// as of the configuration of `epoch`. A server says it once it holds that configuration
    /// (and tells the coordinator it does); the coordinator, once every server of the ring
    /// told it. Nothing more will be pushed or pulled: a process may write what the job
    /// asked for and stop. Said again if workers join and leave again.
    JobFinished {
        /// The first configuration that said so.
        epoch: Epoch,
    },
    /// A server or worker has heard nothing from the coordinator for
    /// [`crate::Timing::coordinator_timeout`]: no failure, join or leave can be dealt with
    /// until it is back, so a request whose server died waits. Said once per silence.
    CoordinatorSilent {
        /// How long it has been silent at least: the timeout.
        for_at_least: Time,
    },
    /// The coordinator was heard again after [`Event::CoordinatorSilent`].
    CoordinatorBack,
    /// This member granted a standby coordinator a term: it refuses configurations of older
    /// terms from now on (servers and workers).
    TermGranted {
        /// The standby.
        to: NodeId,
        /// The term.
        term: u64,
    },
    /// A message this node built could not be encoded (larger than the codec's frame limit),
    /// and was not sent: it reaches its addressee only if the node builds it again smaller.
    /// Counted in [`crate::driver::Refusals::unencodable`] too.
    Unencodable {
        /// Whom it was for.
        to: NodeId,
        /// Why.
        error: crate::wire::EncodeError,
    },
    /// The node refused a message (see [`Refusal`]). Nothing in the node changed; drivers count
    /// these and log them, so that input the protocol cannot use never vanishes silently.
    Refused {
        /// Who sent it (as the message claims, or as the transport saw it).
        from: NodeId,
        /// Why it was refused.
        reason: Refusal,
    },
}

/// Why a node or its driver refused a message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The frame did not decode.
    Undecodable(DecodeError),
    /// The frame claims another sender than the peer the transport received it from.
    SpoofedSender {
        /// The sender the frame claims.
        claimed: NodeId,
    },
    /// The message is addressed to another node.
    Misaddressed {
        /// Its addressee.
        to: NodeId,
    },
    /// The sender is not a member of the configuration in force.
    UnknownSender,
    /// The message belongs to an epoch this node has moved past (an old configuration, a
    /// redirect to a configuration it already has).
    StaleEpoch {
        /// The message's epoch.
        epoch: Epoch,
        /// This node's epoch.
        current: Epoch,
    },
    /// A configuration from a coordinator of an older term than the one whose configuration the
    /// node holds ([`crate::wire::ClusterConfig::term`]): one that another took over from.
    StaleTerm {
        /// The configuration's term.
        term: u64,
        /// The term of the configuration the node holds.
        current: u64,
    },
    /// A standby asked this member for a term it does not grant (ARCHITECTURE.md §11).
    TermNotGranted {
        /// The term asked for.
        term: u64,
        /// Why not.
        reason: NoGrant,
    },
    /// The message belongs to another job: a configuration that changes the consistency model,
    /// values of another width, a ring that cannot be built.
    ForeignJob,
    /// A kind of message this node does not take (a pull sent to a worker, say).
    Unexpected,
    /// A pull answer whose keys or width do not match the slice it answers.
    BadAnswer,
    /// A push naming a key list sent before carries values for another number of rows than
    /// the list has keys (key caching, ARCHITECTURE.md §10).
    RowsMismatch,
    /// Messages from the future arrived faster than the configuration they need; beyond a bound
    /// they are refused and retransmission recovers them.
    Overflow,
    /// The node has been removed from the cluster and takes no more messages.
    Fenced,
    /// The message speaks of another process of the same server node than the one the
    /// receiver knows: a configuration listing this server process under the incarnation of
    /// an earlier start (the process keeps registering until the coordinator lists it), or a
    /// registration from an earlier start than the one the coordinator took last (a late
    /// resend from a process that is gone).
    OtherIncarnation {
        /// The incarnation the receiver knows: its own, or the one registered last.
        known: u64,
        /// The incarnation the message speaks of.
        claimed: u64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Undecodable(e) => write!(f, "undecodable frame: {e}"),
            Refusal::SpoofedSender { claimed } => {
                write!(f, "frame claims to come from {claimed}, not from its peer")
            }
            Refusal::Misaddressed { to } => write!(f, "addressed to {to}"),
            Refusal::UnknownSender => f.write_str("sender is not a member of the configuration"),
            Refusal::StaleEpoch { epoch, current } => {
                write!(f, "stale epoch {epoch} (this node is at {current})")
            }
            Refusal::StaleTerm { term, current } => write!(
                f,
                "configuration of coordinator term {term}, older than the term {current} this node follows"
            ),
            Refusal::TermNotGranted { term, reason } => {
                write!(f, "term {term} not granted: {reason}")
            }
            Refusal::ForeignJob => f.write_str("message belongs to another job"),
            Refusal::Unexpected => f.write_str("a message kind this node does not take"),
            Refusal::BadAnswer => f.write_str("answer does not match the slice it answers"),
            Refusal::RowsMismatch => {
                f.write_str("values for another number of rows than the named key list has")
            }
            Refusal::Overflow => f.write_str("too many messages waiting for a configuration"),
            Refusal::Fenced => f.write_str("this node was removed from the cluster"),
            Refusal::OtherIncarnation { known, claimed } => write!(
                f,
                "speaks of incarnation {claimed} of the node, not of incarnation {known}"
            ),
        }
    }
}

/// Why a member does not grant a standby coordinator a term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NoGrant {
    /// The configuration the member holds does not list the asker as a standby.
    NotStandby,
    /// The member hears from its coordinator: nothing is to be taken over.
    CoordinatorHeard,
    /// The member holds or granted this term or a later one.
    NotAbove {
        /// The highest term the member holds or granted.
        held: u64,
    },
    /// The member holds no configuration yet.
    NoConfig,
}

impl fmt::Display for NoGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoGrant::NotStandby => f.write_str("the asker is not a standby of this configuration"),
            NoGrant::CoordinatorHeard => f.write_str("the active coordinator is heard"),
            NoGrant::NotAbove { held } => write!(f, "term {held} is held or granted already"),
            NoGrant::NoConfig => f.write_str("this node holds no configuration"),
        }
    }
}
