//! The suite's bound on the larger model checks. `PSERVER_EXHAUSTIVE=1` (as
//! `scripts/check-exhaustive` sets it) checks them over every state instead, where their state
//! counts are pinned and `livelock-free` is judged (docs/verification.md, "The replication model").

use pserver_models::cluster::{
    CheckReport, ClusterModelConfig, Strategy, Verdict, check_cluster_model, cluster_model,
};

/// States (with repeats) a bounded check generates, breadth first: enough to reach every
/// state the suite looks for, in seconds.
pub(crate) const BOUND: usize = 1_000_000;

/// Checks `cfg` breadth first on two threads: up to [`BOUND`] generated states, or every
/// state with `PSERVER_EXHAUSTIVE` set. Gives the report and whether it was exhaustive.
pub(crate) fn check(cfg: ClusterModelConfig) -> (CheckReport, bool) {
    let exhaustive = std::env::var_os("PSERVER_EXHAUSTIVE").is_some();
    let bound = (!exhaustive).then_some(BOUND);
    let report = check_cluster_model(cluster_model(cfg).unwrap(), Strategy::Bfs, 2, bound);
    (report, exhaustive)
}

/// Asserts that every property of `always` holds (`livelock-free` is judged only on an
/// exhaustive search), that each of `found` was reached, and that the state space is `unique`
/// states (exhaustive) or the search went to the bound.
pub(crate) fn assert_holds(
    report: &CheckReport,
    exhaustive: bool,
    always: &[&str],
    found: &[&str],
    unique: usize,
) {
    for &name in always {
        let expected = if name == "livelock-free" && !exhaustive {
            Verdict::NotChecked
        } else {
            Verdict::Holds
        };
        assert_eq!(report.verdict(name), Some(&expected), "{name}\n{report}");
    }
    for &name in found {
        assert_eq!(
            report.verdict(name),
            Some(&Verdict::Found),
            "{name}\n{report}"
        );
    }
    if exhaustive {
        assert_eq!(report.unique, unique);
    } else {
        assert!(report.states >= BOUND, "{report}");
    }
}
