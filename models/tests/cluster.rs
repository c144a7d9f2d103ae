//! The cluster model: every property holds on small configurations, the state spaces are pinned
//! so that a change shows in review, and each property catches a deliberately broken protocol.

use pserver_core::Consistency;
use pserver_models::cluster::{
    CheckReport, ClusterModelConfig, NetworkKind, Strategy, Verdict, check, cluster_model,
};

fn config(consistency: Consistency, network: NetworkKind, iterations: u32) -> ClusterModelConfig {
    ClusterModelConfig {
        keys: 1,
        iterations,
        consistency,
        network,
        ..ClusterModelConfig::default()
    }
}

/// Checks `cfg` exhaustively, asserts every `always` property holds, and returns the report.
fn holds(cfg: ClusterModelConfig) -> CheckReport {
    let report = check(cluster_model(cfg.clone()).unwrap(), Strategy::Bfs, 2);
    assert!(!report.violated(), "{cfg:?}\n{report}");
    for name in ["exactly-once", "staleness", "completion"] {
        assert_eq!(report.verdict(name), Some(&Verdict::Holds), "{name}");
    }
    assert_eq!(report.verdict("job finished"), Some(&Verdict::Found));
    report
}

#[test]
fn every_property_holds_on_the_ordered_network_and_the_state_space_is_pinned() {
    let report = holds(config(Consistency::Sequential, NetworkKind::Ordered, 1));
    assert_eq!(report.unique, 370);
    assert_eq!(report.verdict("pull waited"), Some(&Verdict::Found));
    let report = holds(config(
        Consistency::BoundedDelay(1),
        NetworkKind::Ordered,
        1,
    ));
    assert_eq!(report.unique, 1081);
    let report = holds(config(Consistency::Sequential, NetworkKind::Ordered, 2));
    assert_eq!(report.unique, 5669);
}

#[test]
fn every_property_holds_on_the_lossy_network_and_the_state_space_is_pinned() {
    let report = holds(config(Consistency::Sequential, NetworkKind::Lossy, 1));
    assert_eq!(report.unique, 9729);
    assert_eq!(report.verdict("pull waited"), Some(&Verdict::Found));
    assert_eq!(
        report.verdict("duplicate suppressed"),
        Some(&Verdict::Found)
    );
}

#[test]
fn an_impossible_model_is_refused() {
    let cfg = ClusterModelConfig {
        servers: 0,
        ..ClusterModelConfig::default()
    };
    assert!(cluster_model(cfg).is_err());
}

#[cfg(feature = "mutations")]
mod mutations {
    use super::*;
    use pserver_core::Mutation;

    fn violated(mutation: Mutation, network: NetworkKind, property: &str) -> Vec<String> {
        let cfg = config(Consistency::Sequential, network, 1);
        let mut model = cluster_model(cfg).unwrap();
        pserver_models::cluster::mutate(&mut model, mutation);
        let report = check(model, Strategy::Bfs, 2);
        match report.verdict(property) {
            Some(Verdict::Violated(steps)) => steps.clone(),
            other => panic!("{mutation}: {property} is {other:?}\n{report}"),
        }
    }

    #[test]
    fn exactly_once_catches_servers_that_apply_duplicates() {
        let steps = violated(Mutation::NoDedupe, NetworkKind::Lossy, "exactly-once");
        assert!(steps.iter().any(|s| s.contains("Push")), "{steps:?}");
    }

    #[test]
    fn staleness_catches_servers_that_answer_pulls_at_once() {
        let steps = violated(Mutation::NoGating, NetworkKind::Ordered, "staleness");
        assert!(steps.iter().any(|s| s.contains("PullReply")), "{steps:?}");
    }

    #[test]
    fn completion_catches_workers_that_never_retransmit() {
        violated(Mutation::NoRetransmit, NetworkKind::Lossy, "completion");
    }
}

#[test]
fn registration_is_checked_too() {
    let report = holds(ClusterModelConfig {
        registration: true,
        ..config(Consistency::Sequential, NetworkKind::Ordered, 1)
    });
    assert_eq!(report.unique, 679);
}
