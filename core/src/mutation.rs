//! Deliberately broken variants of the protocol, compiled only with the `mutations` feature.
//!
//! Each one switches off one mechanism an invariant rests on. The model checker's tests turn
//! them on one at a time to show that every property can fail, so that none passes vacuously.

use core::fmt;
use core::str::FromStr;

/// A mechanism switched off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Servers apply every push, duplicates included (breaks exactly-once).
    NoDedupe,
    /// Servers answer every pull at once (breaks staleness).
    NoGating,
    /// Workers never retransmit (breaks completion on a lossy network).
    NoRetransmit,
    /// Servers hand their update rule the negated delta: a gradient ascended instead of
    /// descended, a count subtracted (breaks the simulator's update-rule oracle).
    WrongSign,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 4] = [
        Mutation::NoDedupe,
        Mutation::NoGating,
        Mutation::NoRetransmit,
        Mutation::WrongSign,
    ];
}

impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mutation::NoDedupe => "no-dedupe",
            Mutation::NoGating => "no-gating",
            Mutation::NoRetransmit => "no-retransmit",
            Mutation::WrongSign => "wrong-sign",
        })
    }
}

impl FromStr for Mutation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mutation::ALL
            .into_iter()
            .find(|m| m.to_string() == s)
            .ok_or_else(|| {
                format!("unknown mutation `{s}`: expected no-dedupe, no-gating, no-retransmit or wrong-sign")
            })
    }
}
