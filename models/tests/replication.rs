//! The replication model: fail-over of replicated key ranges under a server crash. Every
//! property holds on the default configuration, whose state space is pinned, and the
//! replication mutations are caught where one crash can reach them.
//!
//! Each exhaustive check of the default configuration takes a few minutes (README, "Model
//! checking").

use pserver_models::cluster::{ClusterModelConfig, Strategy, Verdict, check, cluster_model};

/// The default configuration's distinct states (breadth first; the same depth first).
const DEFAULT_UNIQUE: usize = 930_471;

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
    let report = check(
        cluster_model(ClusterModelConfig::replication()).unwrap(),
        Strategy::Bfs,
        2,
    );
    for name in ALWAYS {
        assert_eq!(
            report.verdict(name),
            Some(&Verdict::Holds),
            "{name}\n{report}"
        );
    }
    for name in ["primary failed over", "replica refilled", "job finished"] {
        assert_eq!(report.verdict(name), Some(&Verdict::Found), "{name}");
    }
    assert_eq!(report.unique, DEFAULT_UNIQUE);
}

#[test]
fn the_replication_properties_are_only_in_replicated_models() {
    let names = |cfg| {
        pserver_models::cluster::property_names(&cluster_model(cfg).unwrap())
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let plain = names(ClusterModelConfig::default());
    let replicated = names(ClusterModelConfig::replication());
    for name in ["durability", "single-owner", "replica-convergence"] {
        assert!(!plain.iter().any(|n| n == name), "{name}");
        assert!(replicated.iter().any(|n| n == name), "{name}");
    }
}

#[cfg(feature = "mutations")]
mod mutations {
    use super::*;
    use pserver_core::Mutation;
    use pserver_models::cluster::CheckReport;

    fn mutated(mutation: Mutation) -> CheckReport {
        let mut model = cluster_model(ClusterModelConfig::replication()).unwrap();
        pserver_models::cluster::mutate(&mut model, mutation);
        check(model, Strategy::Bfs, 2)
    }

    /// The primary acknowledges the push before its replica has it and crashes: no live server
    /// holds an acknowledged push.
    #[test]
    fn durability_catches_primaries_that_acknowledge_before_replicating() {
        let report = mutated(Mutation::AckBeforeReplicate);
        let Some(Verdict::Violated(steps)) = report.verdict("durability") else {
            panic!("{report}");
        };
        assert!(steps.iter().any(|s| s.contains("PushAck")), "{steps:?}");
        assert!(
            steps.last().is_some_and(|s| s.contains("crashes")),
            "{steps:?}"
        );
    }

    /// A new replica that takes itself to be in step without the copy never converges: after
    /// the replica of a range crashed, the range's new replica stays empty while its primary
    /// holds the push. (It would break durability only if it were promoted, which takes a
    /// second ring change.)
    #[test]
    fn replica_convergence_catches_new_replicas_that_skip_the_copy() {
        let report = mutated(Mutation::PromoteStaleReplica);
        let Some(Verdict::Violated(steps)) = report.verdict("replica-convergence") else {
            panic!("{report}");
        };
        assert!(steps.iter().any(|s| s.contains("crashes")), "{steps:?}");
        assert!(steps.iter().any(|s| s.contains("Config")), "{steps:?}");
        assert_eq!(report.verdict("durability"), Some(&Verdict::Holds));
    }

    /// Copies without de-duplication state only matter once a replica refilled by a copy is
    /// promoted and a resend reaches it: after a second ring change. With three servers and one
    /// replica per range the coordinator can remove one server only (two could not hold the
    /// replicas), so one crash makes one ring change, the refilled replica is never promoted,
    /// and every property holds. A server join (or a fourth server and a second crash) makes
    /// the mutation reachable; the verdict pinned here is the honest one for one crash, so that
    /// this test fails, and is to be turned into a violation test, once the model reaches it.
    #[test]
    fn dropping_dedup_state_on_transfer_needs_a_second_ring_change_to_break_exactly_once() {
        let report = mutated(Mutation::DropDedupOnTransfer);
        for name in ALWAYS {
            assert_eq!(
                report.verdict(name),
                Some(&Verdict::Holds),
                "{name}\n{report}"
            );
        }
        assert_eq!(report.verdict("replica refilled"), Some(&Verdict::Found));
        assert_eq!(report.unique, DEFAULT_UNIQUE);
    }
}
