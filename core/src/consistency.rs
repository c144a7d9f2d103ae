//! Consistency models (ARCHITECTURE.md §4): how stale a pull may be, and how far ahead a worker may
//! run.

use core::fmt;
use core::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::ids::Iteration;

/// How much staleness a job tolerates.
///
/// **Staleness invariant:** a pull issued by a worker in iteration `c` returns values that
/// include every push, from every live worker, for all iterations below
/// [`Consistency::required_below`]`(c)` (`c - tau`). Servers hold a pull until they can meet it;
/// a worker has at most `tau + 1` iterations in flight.
///
/// ```
/// use pserver_core::Consistency;
/// let c: Consistency = "bounded:2".parse()?;
/// assert_eq!(c, Consistency::BoundedDelay(2));
/// assert_eq!(c.required_below(5), 3);
/// assert_eq!(Consistency::Sequential.required_below(5), 5);
/// assert_eq!(Consistency::Eventual.required_below(5), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Consistency {
    /// Bulk synchronous: every pull sees all pushes of all earlier iterations (`tau = 0`), and
    /// servers apply one iteration's pushes from all workers together.
    #[default]
    Sequential,
    /// Stale synchronous: a pull in iteration `c` sees all pushes of iterations below `c - tau`.
    BoundedDelay(Iteration),
    /// Fully asynchronous: pulls never wait and workers never stall.
    Eventual,
}

impl Consistency {
    /// The staleness bound `tau`, or `None` for [`Consistency::Eventual`].
    pub fn tau(self) -> Option<Iteration> {
        match self {
            Consistency::Sequential => Some(0),
            Consistency::BoundedDelay(tau) => Some(tau),
            Consistency::Eventual => None,
        }
    }

    /// Iterations whose pushes a pull issued in iteration `c` must include: all below this.
    pub fn required_below(self, c: Iteration) -> Iteration {
        self.tau().map_or(0, |tau| c.saturating_sub(tau))
    }

    /// Whether a worker that has finished every iteration below `finished_below` may enter
    /// iteration `c`, keeping at most `tau + 1` iterations in flight.
    pub fn may_enter(self, c: Iteration, finished_below: Iteration) -> bool {
        self.tau()
            .is_none_or(|tau| c.saturating_sub(finished_below) <= tau)
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Consistency::Sequential => f.write_str("sequential"),
            Consistency::BoundedDelay(tau) => write!(f, "bounded:{tau}"),
            Consistency::Eventual => f.write_str("eventual"),
        }
    }
}

/// A consistency model could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "unknown consistency model `{0}`: expected sequential, bounded:TAU (e.g. bounded:2) or eventual"
)]
pub struct ParseConsistencyError(String);

impl FromStr for Consistency {
    type Err = ParseConsistencyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sequential" => Ok(Consistency::Sequential),
            "eventual" => Ok(Consistency::Eventual),
            _ => s
                .strip_prefix("bounded:")
                .and_then(|t| t.parse().ok())
                .map(Consistency::BoundedDelay)
                .ok_or_else(|| ParseConsistencyError(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_tau_plus_one_iterations_in_flight() {
        let b = Consistency::BoundedDelay(2);
        assert!(b.may_enter(4, 2));
        assert!(!b.may_enter(5, 2));
        assert!(Consistency::Sequential.may_enter(3, 3));
        assert!(!Consistency::Sequential.may_enter(4, 3));
        assert!(Consistency::Eventual.may_enter(1000, 0));
    }

    #[test]
    fn models_parse_and_print_alike() {
        for c in [
            Consistency::Sequential,
            Consistency::BoundedDelay(7),
            Consistency::Eventual,
        ] {
            assert_eq!(c.to_string().parse::<Consistency>(), Ok(c));
        }
        let err = "bounded:x".parse::<Consistency>().unwrap_err();
        assert!(err.to_string().contains("bounded:TAU"));
    }
}
