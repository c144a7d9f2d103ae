//! Deliberately broken variants of the protocol, compiled only with the `mutations` feature.
//!
//! Each one switches off one mechanism an invariant rests on. The model checker's tests turn
//! them on one at a time to show that every property can fail, so that none passes vacuously.
//!
//! A node reads its own mutation (`mutated!`). Code that holds no node, such as the
//! coordinator's pace decisions in [`crate::pace`], reads the mutation of the node a
//! [`crate::Driver`] is driving on this thread, for the length of the call
//! (`driven_mutated!`): so the policy mutations are switched on like every other, with
//! [`crate::Driver::set_mutation`].

use core::cell::Cell;
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
    /// Servers hold a pull back only until the worker asking has finished the required
    /// iterations, not every worker (breaks staleness, though not a count of pushes).
    OwnProgressOnly,
    /// Workers enter the next iteration without waiting for their pushes to be acknowledged
    /// (breaks the in-flight bound).
    EagerAdvance,
    /// Workers drop the last key when they assemble a pull's answer (breaks pull complete).
    ShortPull,
    /// Workers ignore redirects and keep resending to the old owner: a livelock wherever
    /// nothing else brings them the new configuration (the model checker leaves heartbeats out
    /// when nothing crashes), which breaks livelock freedom while every quiescent state still
    /// looks complete.
    IgnoreRedirect,
    /// Primaries acknowledge a push as soon as they applied it, before their replicas have it
    /// (breaks durability: a primary that dies takes acknowledged pushes with it).
    AckBeforeReplicate,
    /// A server made a replica of a range takes itself to be in step at once, without the copy
    /// of the range, and may be promoted so (breaks durability).
    PromoteStaleReplica,
    /// Copies of a shard leave its de-duplication state behind (breaks exactly-once across
    /// fail-over and joins: the new holder applies a resent push again).
    DropDedupOnTransfer,
    /// Servers count a worker told to skip ahead as having finished one iteration more than
    /// the configuration says (breaks staleness: a pull goes out without that worker's push of
    /// the first iteration it did not skip).
    SkipPastDecision,
    /// Servers hold pulls to one iteration more than the bound adaptive tau set in the
    /// configuration (breaks staleness: a pull misses pushes the bound in force requires).
    TauPastDecision,
    /// Workers drop what their filters hold when they flush, instead of pushing it (breaks
    /// exactly-once: what a worker's requests carry falls short of what it pushed).
    FilterForgets,
    /// Workers name every key list they send a server by the list they used last with it, as
    /// a cache that keeps one entry per peer and checks only that it holds one would (breaks
    /// exactly-once, where the server puts values on the keys of that stale entry, or
    /// completion, where it refuses them or answers a pull with another list's values).
    StaleKeyCache,
    /// A standby coordinator takes over without a higher term: it publishes the next epoch
    /// of the term it knows (breaks single-coordinator: the coordinator it took over from,
    /// alive and cut off, publishes that epoch too).
    TakeOverWithoutTerm,
    /// Servers grant one push slot more at once than the job's `PushSlots::at_once` (breaks the
    /// simulator's slot-limit: pushes still arrive exactly once, only more of them together).
    SlotsPastAtOnce,
    /// Adaptive tau rises to one above the top of its range at a check that finds a straggler
    /// (breaks the simulator's tau-range: servers and workers follow the bound published, so
    /// staleness and the in-flight bound still hold).
    TauPastRange,
    /// The coordinator moves shares by speed past the job's bounds by one: a giver holding
    /// `Balance::fewest` still gives, a taker holding `Balance::most` still takes (breaks the
    /// simulator's share-bounds).
    SharesPastBounds,
    /// The coordinator moves a share from the slowest worker to the one quickest with one more
    /// even when that one would then be no quicker than the giver was (breaks the simulator's
    /// share-move: with equal speeds, a share goes to a worker holding as many as the giver).
    MoveWithoutGain,
    /// A replica applies the steps of only the first shard in a replication batch that holds
    /// several shards' steps, and acknowledges the others as applied (breaks replica
    /// convergence, and durability once the primary fails: the replica lacks what it
    /// acknowledged).
    PartialBatch,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 20] = [
        Mutation::NoDedupe,
        Mutation::NoGating,
        Mutation::NoRetransmit,
        Mutation::OwnProgressOnly,
        Mutation::EagerAdvance,
        Mutation::ShortPull,
        Mutation::IgnoreRedirect,
        Mutation::AckBeforeReplicate,
        Mutation::PromoteStaleReplica,
        Mutation::DropDedupOnTransfer,
        Mutation::SkipPastDecision,
        Mutation::TauPastDecision,
        Mutation::FilterForgets,
        Mutation::StaleKeyCache,
        Mutation::TakeOverWithoutTerm,
        Mutation::SlotsPastAtOnce,
        Mutation::TauPastRange,
        Mutation::SharesPastBounds,
        Mutation::MoveWithoutGain,
        Mutation::PartialBatch,
    ];
}

impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mutation::NoDedupe => "no-dedupe",
            Mutation::NoGating => "no-gating",
            Mutation::NoRetransmit => "no-retransmit",
            Mutation::OwnProgressOnly => "own-progress-only",
            Mutation::EagerAdvance => "eager-advance",
            Mutation::ShortPull => "short-pull",
            Mutation::IgnoreRedirect => "ignore-redirect",
            Mutation::AckBeforeReplicate => "ack-before-replicate",
            Mutation::PromoteStaleReplica => "promote-stale-replica",
            Mutation::DropDedupOnTransfer => "drop-dedup-on-transfer",
            Mutation::SkipPastDecision => "skip-past-decision",
            Mutation::TauPastDecision => "tau-past-decision",
            Mutation::FilterForgets => "filter-forgets",
            Mutation::StaleKeyCache => "stale-key-cache",
            Mutation::TakeOverWithoutTerm => "take-over-without-term",
            Mutation::SlotsPastAtOnce => "slots-past-at-once",
            Mutation::TauPastRange => "tau-past-range",
            Mutation::SharesPastBounds => "shares-past-bounds",
            Mutation::MoveWithoutGain => "move-without-gain",
            Mutation::PartialBatch => "partial-batch",
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
                let names: Vec<String> = Mutation::ALL.iter().map(ToString::to_string).collect();
                format!(
                    "unknown mutation `{s}`: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

std::thread_local! {
    /// The mutation of the node a driver is driving on this thread, while it drives it.
    static DRIVEN: Cell<Option<Mutation>> = const { Cell::new(None) };
}

/// Runs `f` with `mutation` as the driven node's: what `driven_mutated!` reads. The mutation
/// in force before is restored afterwards, so that one node's mutation never leaks into the
/// next node driven on the same thread.
pub(crate) fn driving<T>(mutation: Option<Mutation>, f: impl FnOnce() -> T) -> T {
    /// Puts the outer mutation back even if `f` panics (a test that catches the panic goes on
    /// on this thread).
    struct Restore(Option<Mutation>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DRIVEN.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(DRIVEN.with(|d| d.replace(mutation)));
    f()
}

/// The mutation of the node being driven on this thread, if a driver is driving one.
pub(crate) fn driven() -> Option<Mutation> {
    DRIVEN.with(Cell::get)
}
