//! Any node of the protocol behind one type, so that a driver dispatches in one place.

use crate::coordinator::Coordinator;
use crate::effects::{Effects, TimerId};
use crate::ids::{Epoch, NodeId, Role, Time};
use crate::server::Server;
use crate::store::{ParamStore, Store};
use crate::updater::{UpdateRule, Updater};
use crate::value::Value;
use crate::wire::{ClusterConfig, Envelope};
use crate::worker::Worker;

/// A coordinator, a server or a worker: the three state machines of the protocol behind the
/// shape they share (`start`, `on_message`, `on_timer`).
///
/// ```
/// use pserver_core::node::Node;
/// use pserver_core::{NodeId, Role};
/// use pserver_core::node::{Worker, WorkerConfig};
/// let cfg = WorkerConfig::new(NodeId(3), NodeId(0));
/// let node: Node<f32> = Node::from(Worker::new(cfg));
/// assert_eq!((node.id(), node.role()), (NodeId(3), Role::Worker));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node<V: Value, U: UpdateRule<V> = Updater, S: ParamStore<V> = Store<V>> {
    /// The coordinator (boxed, like the others, so that a `Node` is small to move).
    Coordinator(Box<Coordinator>),
    /// A server.
    Server(Box<Server<V, U, S>>),
    /// A worker.
    Worker(Box<Worker<V>>),
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> From<Coordinator> for Node<V, U, S> {
    fn from(c: Coordinator) -> Self {
        Node::Coordinator(Box::new(c))
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> From<Server<V, U, S>> for Node<V, U, S> {
    fn from(s: Server<V, U, S>) -> Self {
        Node::Server(Box::new(s))
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> From<Worker<V>> for Node<V, U, S> {
    fn from(w: Worker<V>) -> Self {
        Node::Worker(Box::new(w))
    }
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Node<V, U, S> {
    /// The node's id.
    pub fn id(&self) -> NodeId {
        match self {
            Node::Coordinator(c) => c.id(),
            Node::Server(s) => s.id(),
            Node::Worker(w) => w.id(),
        }
    }

    /// What the node does.
    pub fn role(&self) -> Role {
        match self {
            Node::Coordinator(_) => Role::Coordinator,
            Node::Server(_) => Role::Server,
            Node::Worker(_) => Role::Worker,
        }
    }

    /// The epoch of the configuration the node has, 0 before the first.
    pub fn epoch(&self) -> Epoch {
        match self {
            Node::Coordinator(c) => c.epoch(),
            Node::Server(s) => s.epoch(),
            Node::Worker(w) => w.epoch(),
        }
    }

    /// The configuration the node has: the one in force, or for the coordinator the one it
    /// published last.
    pub fn config(&self) -> Option<&ClusterConfig> {
        match self {
            Node::Coordinator(c) => c.config(),
            Node::Server(s) => s.config(),
            Node::Worker(w) => w.config(),
        }
    }

    /// Registers with the coordinator (servers and workers) or starts failure detection (the
    /// coordinator). Call once, first.
    pub fn start(&mut self, now: Time, out: &mut Effects<V>) {
        match self {
            Node::Coordinator(c) => c.start(now, out),
            Node::Server(s) => s.start(now, out),
            Node::Worker(w) => w.start(now, out),
        }
    }

    /// Starts with `config` in force (static membership) instead of registering. A coordinator
    /// starts as with [`Node::start`]: it was built with its configuration
    /// ([`Coordinator::bootstrapped`]).
    pub fn start_configured(&mut self, now: Time, config: ClusterConfig, out: &mut Effects<V>) {
        match self {
            Node::Coordinator(c) => c.start(now, out),
            Node::Server(s) => s.start_configured(now, config, out),
            Node::Worker(w) => w.start_configured(now, config, out),
        }
    }

    /// Hands the node a message addressed to it.
    pub fn on_message(&mut self, now: Time, env: Envelope<V>, out: &mut Effects<V>) {
        match self {
            Node::Coordinator(c) => c.on_message(now, env, out),
            Node::Server(s) => s.on_message(now, env, out),
            Node::Worker(w) => w.on_message(now, env, out),
        }
    }

    /// Fires one of the node's timers.
    pub fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Effects<V>) {
        match self {
            Node::Coordinator(c) => c.on_timer(now, timer, out),
            Node::Server(s) => s.on_timer(now, timer, out),
            Node::Worker(w) => w.on_timer(now, timer, out),
        }
    }

    /// The coordinator, if this is one.
    pub fn as_coordinator(&self) -> Option<&Coordinator> {
        match self {
            Node::Coordinator(c) => Some(c),
            _ => None,
        }
    }

    /// The server, if this is one.
    pub fn as_server(&self) -> Option<&Server<V, U, S>> {
        match self {
            Node::Server(s) => Some(s),
            _ => None,
        }
    }

    /// The worker, if this is one.
    pub fn as_worker(&self) -> Option<&Worker<V>> {
        match self {
            Node::Worker(w) => Some(w),
            _ => None,
        }
    }

    /// The worker, mutably, if this is one. Calls on it write into an [`Effects`] that the
    /// caller must carry out; a [`crate::Driver`] does that itself in its `push`, `pull` and
    /// `advance`.
    pub fn as_worker_mut(&mut self) -> Option<&mut Worker<V>> {
        match self {
            Node::Worker(w) => Some(w),
            _ => None,
        }
    }
}
