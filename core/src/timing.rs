//! Timeouts and intervals. The core never reads a clock: these durations are added to the `now`
//! the driver passes in.

use crate::node::Time;

const MS: Time = 1_000_000;

/// The durations nodes use, in nanoseconds of the driver's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Timing {
    /// Between heartbeats to the coordinator.
    pub heartbeat_interval: Time,
    /// Silence after which the coordinator declares a node dead.
    pub heartbeat_timeout: Time,
    /// First retransmission timeout; doubles per attempt.
    pub rto_initial: Time,
    /// Cap on the retransmission timeout.
    pub rto_max: Time,
    /// Between registration attempts until a configuration arrives.
    pub register_retry: Time,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat_interval: 100 * MS,
            heartbeat_timeout: 2_000 * MS,
            rto_initial: 20 * MS,
            rto_max: 1_000 * MS,
            register_retry: 100 * MS,
        }
    }
}

/// Attempts beyond this no longer lengthen the timeout; keeps the counter small.
pub(crate) const MAX_BACKOFF_STEPS: u8 = 16;

impl Timing {
    /// Retransmission timeout after `attempts` sends: exponential, capped at `rto_max`.
    pub fn rto(&self, attempts: u8) -> Time {
        let steps = u32::from(attempts.min(MAX_BACKOFF_STEPS));
        self.rto_initial
            .saturating_mul(1u64 << steps)
            .min(self.rto_max)
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
