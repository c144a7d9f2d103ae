//! The replication model: key ranges copied between servers, in its three configurations,
//! fail-over of replicated ranges under a server crash (on three servers, and on two, which
//! leaves one) and a server joining a running job. Every property holds on each, whose state
//! spaces are pinned, and each replication mutation
//! is caught, by the invariant each test names.
//!
//! The suite checks both configurations within a bound ([`crate::bounded`]), which reaches
//! every interesting state of either in seconds; `scripts/check-exhaustive` checks every
//! state, in a few minutes for fail-over.

use pserver_core::Consistency;
use pserver_models::cluster::{
    ClusterModelConfig, Strategy, Verdict, check_cluster_model, cluster_model,
};

use crate::bounded;

/// The fail-over configuration's distinct states (breadth first; the same depth first).
const FAIL_OVER_UNIQUE: usize = 926_835;

/// The two-server fail-over configuration's distinct states (breadth first).
const PAIR_UNIQUE: usize = 2_208;

/// The join configuration's distinct states (breadth first; the same depth first).
const JOIN_UNIQUE: usize = 614_053;

const ALWAYS: [&str; 9] = [
    "exactly-once",
    "durability",
    "single-owner",
    "replica-convergence",
    "staleness",
    "pull complete",
    "in-flight bound",
    "completion",
    "livelock-free",
];

#[test]
fn every_property_holds_across_fail_over_and_the_state_space_is_pinned() {
    let (report, exhaustive) = bounded::check(ClusterModelConfig::replication());
    bounded::assert_holds(
        &report,
        exhaustive,
        &ALWAYS,
        &["primary failed over", "replica refilled", "job finished"],
        FAIL_OVER_UNIQUE,
    );
    assert_eq!(report.verdict("server joined"), None);
}

/// Two servers with one replica, one of which crashes: the other holds every range alone, with
/// every acknowledged push. Small enough to check every state in every run.
#[test]
fn every_property_holds_when_one_of_two_servers_crashes_and_the_state_space_is_pinned() {
    let cfg = ClusterModelConfig::replication_pair();
    let report = check_cluster_model(cluster_model(cfg).unwrap(), Strategy::Bfs, 2, None);
    for name in ALWAYS {
        assert_eq!(
            report.verdict(name),
            Some(&Verdict::Holds),
            "{name}\n{report}"
        );
    }
    for name in ["primary failed over", "job finished"] {
        assert_eq!(
            report.verdict(name),
            Some(&Verdict::Found),
            "{name}\n{report}"
        );
    }
    // Nothing to refill: the server left is the only one.
    assert_eq!(report.verdict("replica refilled"), Some(&Verdict::NotFound));
    assert_eq!(report.unique, PAIR_UNIQUE);
}

/// The new server copies the key's range while the worker pushes, the ring switches to it, and
/// the worker's resend of a push the copy already holds is recognised there.
#[test]
fn every_property_holds_across_a_join_and_the_state_space_is_pinned() {
    let (report, exhaustive) = bounded::check(ClusterModelConfig::replication_join());
    bounded::assert_holds(
        &report,
        exhaustive,
        &ALWAYS,
        &[
            "server joined",
            "replica refilled",
            "duplicate suppressed",
            "redirect followed",
            "job finished",
        ],
        JOIN_UNIQUE,
    );
    assert_eq!(report.verdict("primary failed over"), None);
}

/// Sequential mode: a primary takes pushes in (`PushTaken`) and replicates each iteration's
/// sum only once every worker finished it, and the worker goes on before its push is durable.
/// The full state space does not fit in memory; a bounded breadth-first check covers every
/// interleaving of the crash, the fail-over and the first push, and every property holds.
#[test]
fn every_property_holds_across_fail_over_in_sequential_mode_within_a_bound() {
    let cfg = ClusterModelConfig {
        consistency: Consistency::Sequential,
        ..ClusterModelConfig::replication()
    };
    let report = check_cluster_model(cluster_model(cfg).unwrap(), Strategy::Bfs, 2, Some(300_000));
    for name in ALWAYS.iter().filter(|&&n| n != "livelock-free") {
        assert_eq!(
            report.verdict(name),
            Some(&Verdict::Holds),
            "{name}\n{report}"
        );
    }
    for name in ["primary failed over", "replica refilled", "job finished"] {
        assert_eq!(report.verdict(name), Some(&Verdict::Found), "{name}");
    }
}

#[test]
fn the_replication_model_checks_fail_over_and_a_join() {
    let suite = ClusterModelConfig::replication_suite();
    assert_eq!(
        suite,
        vec![
            ClusterModelConfig::replication(),
            ClusterModelConfig::replication_pair(),
            ClusterModelConfig::replication_join()
        ]
    );
    assert!(suite[0].crashes > 0 && suite[0].replicas > 0 && suite[0].joins == 0);
    assert_eq!(
        (suite[1].servers, suite[1].replicas, suite[1].crashes),
        (2, 1, 1)
    );
    assert!(suite[2].joins > 0 && suite[2].crashes == 0);
}

#[test]
fn the_replication_properties_are_only_in_models_that_copy_ranges() {
    let names = |cfg| {
        pserver_models::cluster::property_names(&cluster_model(cfg).unwrap())
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let plain = names(ClusterModelConfig::default());
    for cfg in ClusterModelConfig::replication_suite() {
        let copying = names(cfg);
        for name in ["durability", "single-owner", "replica-convergence"] {
            assert!(!plain.iter().any(|n| n == name), "{name}");
            assert!(copying.iter().any(|n| n == name), "{name}");
        }
    }
}

#[cfg(feature = "mutations")]
mod mutations {
    use super::*;
    use pserver_core::mutation::Mutation;
    use pserver_models::cluster::{CheckReport, check};

    /// Checks `cfg` with every node running `mutation`, and returns the report with the steps
    /// of the counterexample to `property`; fails the test if `property` was not violated.
    fn violation(
        cfg: ClusterModelConfig,
        mutation: Mutation,
        property: &str,
    ) -> (CheckReport, Vec<String>) {
        let mut model = cluster_model(cfg).unwrap();
        pserver_models::cluster::mutate(&mut model, mutation);
        // One thread: which of several shortest counterexamples is found first is then the
        // same in every run, and the assertions below may name its steps.
        let report = check(model, Strategy::Bfs, 1);
        let Some(Verdict::Violated(steps)) = report.verdict(property) else {
            panic!("{property} not violated:\n{report}");
        };
        let steps = steps.clone();
        (report, steps)
    }

    /// The primary acknowledges the push before its replica has it and crashes: no live server
    /// holds an acknowledged push.
    #[test]
    fn durability_catches_primaries_that_acknowledge_before_replicating() {
        let (_, steps) = violation(
            ClusterModelConfig::replication(),
            Mutation::AckBeforeReplicate,
            "durability",
        );
        assert!(steps.iter().any(|s| s.contains("PushAck")), "{steps:?}");
        assert!(
            steps.last().is_some_and(|s| s.contains("crashes")),
            "{steps:?}"
        );
    }

    /// The same without a crash: the old holder of a range acknowledges a push the joining
    /// server, which copied the range before it, does not have, and the ring switches to the
    /// joining server.
    #[test]
    fn durability_catches_primaries_that_acknowledge_before_the_joining_server_has_the_push() {
        let (_, steps) = violation(
            ClusterModelConfig::replication_join(),
            Mutation::AckBeforeReplicate,
            "durability",
        );
        for step in ["Register", "Transfer", "PushAck", "CaughtUp"] {
            assert!(steps.iter().any(|s| s.contains(step)), "{step}: {steps:?}");
        }
        assert!(steps.iter().all(|s| !s.contains("crashes")), "{steps:?}");
    }

    /// A new replica that takes itself to be in step without the copy never converges: after
    /// the replica of a range crashed, the range's new replica stays empty while its primary
    /// holds the push. (It would break durability only if it were promoted, which takes a
    /// second ring change.)
    #[test]
    fn replica_convergence_catches_new_replicas_that_skip_the_copy() {
        let (report, steps) = violation(
            ClusterModelConfig::replication(),
            Mutation::PromoteStaleReplica,
            "replica-convergence",
        );
        assert!(steps.iter().any(|s| s.contains("crashes")), "{steps:?}");
        assert!(steps.iter().any(|s| s.contains("Config")), "{steps:?}");
        assert_eq!(report.verdict("durability"), Some(&Verdict::Holds));
    }

    /// The promotion that fail-over cannot reach, a join does: the joining server takes itself
    /// to be in step without the copy, reports that it caught up, and is made the primary of a
    /// range whose acknowledged push it never had.
    #[test]
    fn durability_catches_joining_servers_that_take_over_without_the_copy() {
        let (_, steps) = violation(
            ClusterModelConfig::replication_join(),
            Mutation::PromoteStaleReplica,
            "durability",
        );
        assert!(steps.iter().any(|s| s.contains("PushAck")), "{steps:?}");
        assert!(steps.iter().any(|s| s.contains("CaughtUp")), "{steps:?}");
        assert!(steps.iter().all(|s| !s.contains("Transfer")), "{steps:?}");
    }

    /// Copies without de-duplication state: the joining server copies the range with a push
    /// the worker has not seen acknowledged, the ring switches to it, and the worker resends
    /// the push there, where it is applied a second time. (Fail-over alone cannot reach this:
    /// with one crash among three servers the replica refilled by a copy is never promoted.)
    #[test]
    fn exactly_once_catches_copies_that_leave_the_dedup_state_behind() {
        let (_, steps) = violation(
            ClusterModelConfig::replication_join(),
            Mutation::DropDedupOnTransfer,
            "exactly-once",
        );
        let joiner = ClusterModelConfig::replication_join()
            .joiner_ids()
            .next()
            .unwrap();
        let transfer = steps.iter().position(|s| s.contains("Transfer"));
        let resend = steps.iter().rposition(|s| s.contains("Push("));
        assert!(transfer.is_some() && transfer < resend, "{steps:?}");
        assert!(
            steps
                .last()
                .is_some_and(|s| s.contains(&format!("-> {joiner}: Push("))),
            "{steps:?}"
        );
    }
}
