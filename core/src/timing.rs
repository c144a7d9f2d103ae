//! Timeouts and intervals. The core never reads a clock: these durations are added to the `now`
//! the driver passes in.

use crate::ids::Time;

const MS: Time = 1_000_000;

/// The durations nodes use, in nanoseconds of the driver's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Timing {
    /// Between heartbeats to the coordinator.
    pub heartbeat_interval: Time,
    /// Silence after which the coordinator declares a node dead.
    pub heartbeat_timeout: Time,
    /// Silence of the coordinator after which a server or worker says so
    /// ([`crate::Event::CoordinatorSilent`]): the coordinator answers every heartbeat, so a
    /// node that hears nothing for this long knows that no failure, join or leave can be dealt
    /// with until it is back. 0: never watched (the model checker's setting, where the watch
    /// would only multiply states).
    pub coordinator_timeout: Time,
    /// First retransmission timeout; doubles per attempt.
    pub rto_initial: Time,
    /// Cap on the retransmission timeout.
    pub rto_max: Time,
    /// Between registration attempts until a configuration arrives.
    pub register_retry: Time,
    /// Added to a message's retransmission timeout for every whole MiB of requests the worker
    /// has on the network when it sends: a large message, or one queued behind large ones, is
    /// not resent only because it takes long to move. The default allows 100 MiB/s. Messages
    /// below a MiB in all add nothing.
    pub rto_per_mib: Time,
    /// How long a worker may go with nothing it was asked for completing (no push done, no
    /// pull answered, no iteration entered) while something waits, before it says it stalled
    /// ([`crate::events::WorkerEvent::Stalled`], once per stall, naming what it waits for).
    /// Looked at with each heartbeat. 0: never (the default; the runtime sets its
    /// `stall_limit` here).
    pub stall_limit: Time,
    /// How many times the retransmission timeout may double. The attempt counter kept per
    /// message never exceeds it, so 0 keeps no counter at all (the model checker's setting).
    pub max_doublings: u8,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat_interval: 100 * MS,
            heartbeat_timeout: 2_000 * MS,
            coordinator_timeout: 2_000 * MS,
            rto_initial: 20 * MS,
            rto_max: 1_000 * MS,
            register_retry: 100 * MS,
            rto_per_mib: 10 * MS,
            stall_limit: 0,
            max_doublings: 16,
        }
    }
}

impl Timing {
    /// Retransmission timeout after `attempts` sends: exponential, capped at `rto_max`.
    pub fn rto(&self, attempts: u8) -> Time {
        let steps = u32::from(attempts.min(self.max_doublings.min(63)));
        self.rto_initial
            .saturating_mul(1u64 << steps)
            .min(self.rto_max)
    }
}

impl Timing {
    /// The attempt counter after one more send.
    pub(crate) fn next_attempt(&self, attempts: u8) -> u8 {
        attempts.saturating_add(1).min(self.max_doublings)
    }

    /// Heartbeats in a row the coordinator may leave unanswered before a node says it is
    /// silent; `None` when nodes do not watch it.
    pub(crate) fn unanswered_heartbeats_allowed(&self) -> Option<u64> {
        (self.coordinator_timeout > 0)
            .then(|| (self.coordinator_timeout / self.heartbeat_interval.max(1)).max(1))
    }

    /// Failure checks in a row that a node may miss before it is declared dead.
    pub(crate) fn missed_checks_allowed(&self) -> u64 {
        self.heartbeat_timeout / self.heartbeat_interval.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let t = Timing::default();
        assert_eq!(t.rto(0), 20 * MS);
        assert_eq!(t.rto(1), 40 * MS);
        assert_eq!(t.rto(5), 640 * MS);
        assert_eq!(t.rto(6), 1_000 * MS);
        assert_eq!(t.rto(255), 1_000 * MS);
    }
}
