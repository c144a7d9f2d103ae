//! Deliberately broken runs (feature `mutations`): the core's protocol mutations, and one of
//! the simulator's own, which breaks what only the simulator's oracle judges.

use core::fmt;
use core::str::FromStr;

use pserver_core::mutation::Mutation;

/// What a mutated run breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimMutation {
    /// A mechanism of the protocol switched off in every server and worker.
    Protocol(Mutation),
    /// Servers hand their update rule the negated delta: a gradient ascended instead of
    /// descended, a count subtracted (breaks the update-rule oracle). The protocol is intact;
    /// only the rule the servers are given is wrapped.
    WrongSign,
}

impl From<Mutation> for SimMutation {
    fn from(m: Mutation) -> Self {
        SimMutation::Protocol(m)
    }
}

impl fmt::Display for SimMutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimMutation::Protocol(m) => m.fmt(f),
            SimMutation::WrongSign => f.write_str("wrong-sign"),
        }
    }
}

impl FromStr for SimMutation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "wrong-sign" {
            return Ok(SimMutation::WrongSign);
        }
        s.parse()
            .map(SimMutation::Protocol)
            .map_err(|e| format!("{e}, wrong-sign"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mutation_name_parses_back() {
        let all = Mutation::ALL.map(SimMutation::from);
        for m in all.into_iter().chain([SimMutation::WrongSign]) {
            assert_eq!(m.to_string().parse::<SimMutation>(), Ok(m));
        }
        assert!(
            "wrong-way"
                .parse::<SimMutation>()
                .unwrap_err()
                .contains("wrong-sign")
        );
    }
}
