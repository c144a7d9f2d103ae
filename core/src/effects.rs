//! What a node asks of its driver: messages to send, timers to set or cancel, and events for the
//! application.

use crate::ids::{NodeId, Time};
use crate::value::Value;
use crate::wire::Envelope;

pub(crate) use crate::events::{
    CoordinatorEvent, Event, NoGrant, Refusal, ServerEvent, WorkerEvent,
};

/// The timers a node may run. Each node kind uses a few of them; setting a timer that is already
/// set moves its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimerId {
    /// Resend whatever is unacknowledged and due.
    Retransmit,
    /// Send the next heartbeat to the coordinator.
    Heartbeat,
    /// Resend registration until a configuration arrives.
    Register,
    /// The coordinator looks for nodes that went silent.
    FailureCheck,
    /// A primary resends what replicas behind it miss.
    Replicate,
    /// A server takes back the push slots whose lease ran out ([`crate::slots::PushSlots`]).
    SlotLease,
}

/// A timer command for the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimerCmd {
    /// Call `on_timer(timer)` at `at` (or as soon after as the driver can).
    Set {
        /// Which timer.
        timer: TimerId,
        /// When it fires.
        at: Time,
    },
    /// Forget the timer.
    Cancel(TimerId),
}

/// The output of one call into a node. The driver drains it after every call: sends each
/// envelope, applies each timer command in order, hands events to the application.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Effects<V: Value> {
    /// Messages to send.
    pub sends: Vec<Envelope<V>>,
    /// Timer commands, to apply in order.
    pub timers: Vec<TimerCmd>,
    /// Events for the application.
    pub events: Vec<Event<V>>,
    /// How many of `sends` are messages sent again because they went unanswered (a worker's
    /// request slices and progress reports): counted by the driver, for operators.
    pub retransmitted: u64,
}

impl<V: Value> Default for Effects<V> {
    fn default() -> Self {
        Effects {
            sends: Vec::new(),
            timers: Vec::new(),
            events: Vec::new(),
            retransmitted: 0,
        }
    }
}

impl<V: Value> Effects<V> {
    /// Nothing to do yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.timers.is_empty() && self.events.is_empty()
    }

    /// Empties all three lists, keeping their allocations, and the count.
    pub fn clear(&mut self) {
        self.sends.clear();
        self.timers.clear();
        self.events.clear();
        self.retransmitted = 0;
    }

    pub(crate) fn send(&mut self, env: Envelope<V>) {
        self.sends.push(env);
    }

    pub(crate) fn set_timer(&mut self, timer: TimerId, at: Time) {
        self.timers.push(TimerCmd::Set { timer, at });
    }

    pub(crate) fn cancel_timer(&mut self, timer: TimerId) {
        self.timers.push(TimerCmd::Cancel(timer));
    }

    pub(crate) fn emit(&mut self, event: Event<V>) {
        self.events.push(event);
    }

    pub(crate) fn refuse(&mut self, from: NodeId, reason: Refusal) {
        self.events.push(Event::Refused { from, reason });
    }
}
