//! The cluster model: every property holds on small configurations, the state spaces are pinned
//! so that a change shows in review, and each property catches a deliberately broken protocol.

use pserver_core::Consistency;
use pserver_models::cluster::{
    CheckReport, ClusterModelConfig, NetworkKind, Strategy, Verdict, check, cluster_model,
};

use crate::bounded;

fn config(consistency: Consistency, network: NetworkKind, iterations: u32) -> ClusterModelConfig {
    ClusterModelConfig {
        keys: 1,
        iterations,
        consistency,
        network,
        ..ClusterModelConfig::default()
    }
}

const ALWAYS: [&str; 6] = [
    "exactly-once",
    "staleness",
    "pull complete",
    "in-flight bound",
    "completion",
    "livelock-free",
];

/// Checks `cfg` exhaustively, asserts every `always` property holds, and returns the report.
fn holds(cfg: ClusterModelConfig) -> CheckReport {
    let report = check(cluster_model(cfg.clone()).unwrap(), Strategy::Bfs, 2);
    assert!(!report.violated(), "{cfg:?}\n{report}");
    for name in ALWAYS {
        assert_eq!(report.verdict(name), Some(&Verdict::Holds), "{name}");
    }
    assert_eq!(report.verdict("job finished"), Some(&Verdict::Found));
    report
}

#[test]
fn every_property_holds_on_the_ordered_network_and_the_state_space_is_pinned() {
    let report = holds(config(Consistency::Sequential, NetworkKind::Ordered, 1));
    assert_eq!(report.unique, 482);
    assert_eq!(report.verdict("pull waited"), Some(&Verdict::Found));
    let report = holds(config(
        Consistency::BoundedDelay(1),
        NetworkKind::Ordered,
        1,
    ));
    assert_eq!(report.unique, 1081);
    let report = holds(config(Consistency::Sequential, NetworkKind::Ordered, 2));
    assert_eq!(report.unique, 6990);
}

#[test]
fn every_property_holds_on_the_lossy_network_and_the_state_space_is_pinned() {
    let report = holds(config(Consistency::Sequential, NetworkKind::Lossy, 1));
    assert_eq!(report.unique, 12_647);
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

#[test]
fn a_ring_change_is_followed_by_redirects_on_both_networks() {
    for (network, consistency, iterations) in [
        (NetworkKind::Lossy, Consistency::Sequential, 1),
        (NetworkKind::Ordered, Consistency::BoundedDelay(1), 2),
    ] {
        let report = holds(ClusterModelConfig {
            ring_change: true,
            ..config(consistency, network, iterations)
        });
        assert_eq!(
            report.verdict("redirect followed"),
            Some(&Verdict::Found),
            "{network}"
        );
        assert_eq!(report.verdict("pull waited"), Some(&Verdict::Found));
    }
}

#[test]
fn under_bounded_delay_a_pull_is_held_from_the_second_iteration_on() {
    // The largest of the suite's configurations: within a bound unless PSERVER_EXHAUSTIVE
    // is set (crate::bounded).
    let (report, exhaustive) = bounded::check(config(
        Consistency::BoundedDelay(1),
        NetworkKind::Ordered,
        2,
    ));
    bounded::assert_holds(
        &report,
        exhaustive,
        &ALWAYS,
        &["pull waited", "job finished"],
        322_730,
    );
}

#[test]
fn with_backoff_a_retransmission_doubles_its_timeout() {
    let report = holds(ClusterModelConfig {
        workers: 1,
        backoff: true,
        ..config(Consistency::Sequential, NetworkKind::Lossy, 2)
    });
    assert_eq!(
        report.verdict("retransmission backed off"),
        Some(&Verdict::Found)
    );
    let without = holds(config(Consistency::Sequential, NetworkKind::Lossy, 1));
    assert_eq!(
        without.verdict("retransmission backed off"),
        Some(&Verdict::NotFound)
    );
}

/// One worker straggles, at any point, and is told to skip to iteration 1: servers stop
/// waiting for its iteration 0, it enters iteration 1 (answering the advance it waited on, or
/// after the pull it had open), and pulls are judged without its skipped push.
#[test]
fn with_skip_ahead_every_property_holds_and_the_state_space_is_pinned() {
    let report = holds(ClusterModelConfig::skip_ahead());
    assert_eq!(
        report.verdict("straggler skipped ahead"),
        Some(&Verdict::Found)
    );
    assert_eq!(report.verdict("pull waited"), Some(&Verdict::Found));
    assert_eq!(report.unique, 155_313);
}

/// The coordinator's check, at any point, raises the bound (a straggler) or lowers it (none):
/// pulls are judged against the bound of the configuration that answered them, and the
/// in-flight bound against the highest published.
#[test]
fn with_adaptive_tau_every_property_holds_and_the_state_space_is_pinned() {
    let report = holds(ClusterModelConfig::adaptive_tau());
    assert_eq!(report.verdict("tau raised"), Some(&Verdict::Found));
    assert_eq!(report.verdict("tau lowered"), Some(&Verdict::Found));
    assert_eq!(report.unique, 42_081);
}

#[test]
fn with_key_caching_every_property_holds_and_a_list_the_server_lacks_is_asked_for() {
    let report = holds(ClusterModelConfig::key_caching(NetworkKind::Ordered));
    assert_eq!(report.verdict("list named"), Some(&Verdict::Found));
    assert_eq!(report.verdict("list asked for"), Some(&Verdict::NotFound));
    assert_eq!(report.unique, 15);
    // Two iterations on the lossy network take a minute in release (238,172 states):
    // `pserver check --key-cache` runs them. One iteration names the push when it is sent
    // again, which may overtake the push that carried the list.
    let report = holds(ClusterModelConfig {
        iterations: 1,
        ..ClusterModelConfig::key_caching(NetworkKind::Lossy)
    });
    assert_eq!(report.verdict("list asked for"), Some(&Verdict::Found));
    assert_eq!(report.unique, 1564);
}

#[cfg(feature = "mutations")]
mod mutations {
    use super::*;
    use pserver_core::mutation::Mutation;

    fn violated_in(cfg: ClusterModelConfig, mutation: Mutation, property: &str) -> CheckReport {
        let mut model = cluster_model(cfg).unwrap();
        pserver_models::cluster::mutate(&mut model, mutation);
        // One thread: the counterexample found first, whose steps the tests look at, is then
        // the same in every run.
        let report = check(model, Strategy::Bfs, 1);
        match report.verdict(property) {
            Some(Verdict::Violated(_)) => report,
            other => panic!("{mutation}: {property} is {other:?}\n{report}"),
        }
    }

    fn steps(report: &CheckReport, property: &str) -> Vec<String> {
        match report.verdict(property) {
            Some(Verdict::Violated(steps)) => steps.clone(),
            _ => Vec::new(),
        }
    }

    fn violated(mutation: Mutation, network: NetworkKind, property: &str) -> Vec<String> {
        let cfg = config(Consistency::Sequential, network, 1);
        steps(&violated_in(cfg, mutation, property), property)
    }

    #[test]
    fn completion_catches_workers_that_name_a_list_by_a_stale_cache_entry() {
        // The pull of both keys goes by the name of the one-key list pushed before; the
        // server answers that list's values, which the worker refuses, and the pull never
        // completes.
        let cfg = ClusterModelConfig::key_caching(NetworkKind::Ordered);
        let report = violated_in(cfg, Mutation::StaleKeyCache, "completion");
        let steps = steps(&report, "completion");
        assert!(
            steps.iter().any(|s| s.contains("PullCached")),
            "the counterexample names a list: {steps:?}"
        );
        // Without the mutation the same model holds (see
        // with_key_caching_every_property_holds_and_a_list_the_server_lacks_is_asked_for).
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

    /// The pull of the worker that ran ahead holds as many pushes as the bound asks for, all
    /// its own: only a check per worker and iteration sees that the other's is missing.
    #[test]
    fn staleness_catches_servers_that_wait_only_for_the_worker_asking() {
        let cfg = config(Consistency::BoundedDelay(1), NetworkKind::Ordered, 2);
        let report = violated_in(cfg, Mutation::OwnProgressOnly, "staleness");
        let steps = steps(&report, "staleness");
        assert!(steps.iter().any(|s| s.contains("PullReply")), "{steps:?}");
    }

    /// Servers count the straggler as having finished iteration 1 too: the other worker's
    /// pull in iteration 2 is answered without the straggler's push of iteration 1.
    #[test]
    fn staleness_catches_servers_that_count_a_skip_past_the_decision() {
        let report = violated_in(
            ClusterModelConfig::skip_ahead(),
            Mutation::SkipPastDecision,
            "staleness",
        );
        let steps = steps(&report, "staleness");
        assert!(steps.iter().any(|s| s.contains("straggling")), "{steps:?}");
        assert!(steps.iter().any(|s| s.contains("PullReply")), "{steps:?}");
    }

    /// Under the bound lowered to 0, a server holds the pull of iteration 1 to a bound of 1
    /// and answers it without the other worker's push of iteration 0.
    #[test]
    fn staleness_catches_servers_that_hold_pulls_past_adaptive_tau() {
        let report = violated_in(
            ClusterModelConfig::adaptive_tau(),
            Mutation::TauPastDecision,
            "staleness",
        );
        let steps = steps(&report, "staleness");
        assert!(
            steps.iter().any(|s| s.contains("nobody straggling")),
            "{steps:?}"
        );
        assert!(steps.iter().any(|s| s.contains("PullReply")), "{steps:?}");
    }

    #[test]
    fn the_in_flight_bound_catches_workers_that_advance_without_acknowledgements() {
        violated(
            Mutation::EagerAdvance,
            NetworkKind::Ordered,
            "in-flight bound",
        );
    }

    #[test]
    fn pull_complete_catches_workers_that_lose_a_key_of_the_answer() {
        let steps = violated(Mutation::ShortPull, NetworkKind::Ordered, "pull complete");
        assert!(steps.iter().any(|s| s.contains("PullReply")), "{steps:?}");
    }

    #[test]
    fn completion_catches_workers_that_never_retransmit() {
        violated(Mutation::NoRetransmit, NetworkKind::Lossy, "completion");
    }

    /// A worker that ignores redirects retransmits to the old owner forever: a retransmission
    /// timer is always pending, so `completion` (asked of quiescent states) still holds, and
    /// only the livelock search sees that the job can no longer finish.
    #[test]
    fn livelock_freedom_catches_workers_that_ignore_redirects() {
        let cfg = ClusterModelConfig {
            ring_change: true,
            ..config(Consistency::Sequential, NetworkKind::Lossy, 1)
        };
        let report = violated_in(cfg, Mutation::IgnoreRedirect, "livelock-free");
        assert_eq!(report.verdict("completion"), Some(&Verdict::Holds));
        let steps = steps(&report, "livelock-free");
        assert!(steps.iter().any(|s| s.contains("Redirect")), "{steps:?}");
    }
}

#[test]
fn registration_is_checked_too() {
    let report = holds(ClusterModelConfig {
        registration: true,
        ..config(Consistency::Sequential, NetworkKind::Ordered, 1)
    });
    assert_eq!(report.unique, 857);
}
