//! Stragglers in the deterministic simulator (ARCHITECTURE.md §9): every invariant holds with
//! detection, skip-ahead, adaptive tau, partial pushes and shares sized by speed all on, under each speed profile
//! (a worker always slow, transient stragglers, a worker that slows down mid-job), and skip-ahead
//! does what it is for.

use pserver_core::Consistency;

use pserver_core::pace::{Balance, StragglerPolicy, TauRange};
use pserver_models::sim::{Faults, PaceReport, SimConfig, SimFailure, SimReport, run};

/// Everything the coordinator may do about stragglers, at once.
fn every_feature() -> StragglerPolicy {
    let mut policy = StragglerPolicy::skip_ahead();
    policy.adaptive_tau = Some(TauRange { min: 1, max: 4 });
    policy.balance = Some(Balance::shares(3));
    policy
}

/// The three speed profiles, applied to `cfg`.
fn profiles(cfg: SimConfig) -> [(&'static str, SimConfig); 3] {
    [
        (
            "a worker always 4x slower",
            SimConfig {
                slow_worker: 4.0,
                ..cfg.clone()
            },
        ),
        (
            "each iteration one worker 4x slower",
            SimConfig {
                straggler: 4.0,
                ..cfg.clone()
            },
        ),
        (
            "a worker 4x slower from mid-job",
            SimConfig {
                slows_down: 4.0,
                ..cfg
            },
        ),
    ]
}

fn run_seeds(cfg: &SimConfig, seeds: std::ops::Range<u64>) -> (Vec<SimReport>, Vec<SimFailure>) {
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for seed in seeds {
        match run(&SimConfig {
            seed,
            ..cfg.clone()
        }) {
            Ok(r) => reports.push(r),
            Err(f) => failures.push(f),
        }
    }
    (reports, failures)
}

#[test]
fn every_invariant_holds_with_every_straggler_feature_on_under_each_speed_profile() {
    let base = SimConfig {
        consistency: Consistency::BoundedDelay(1),
        workers: 4,
        iterations: 16,
        stragglers: every_feature(),
        parts: 3,
        faults: Faults {
            drop: 0.05,
            dup: 0.05,
            reorder: true,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    for (profile, cfg) in profiles(base) {
        let (reports, failures) = run_seeds(&cfg, 0..60);
        let listed: Vec<String> = failures.iter().map(ToString::to_string).collect();
        assert!(failures.is_empty(), "{profile}:\n{}", listed.join("\n"));
        let mut pace = PaceReport::default();
        for r in &reports {
            pace.add(&r.pace);
        }
        // Not vacuous: every feature acted.
        assert!(pace.flagged > 0 && pace.skips > 0, "{profile}: {pace:?}");
        assert!(pace.parts_kept > 0, "{profile}: {pace:?}");
        assert!(
            pace.tau_changes > 0 && pace.max_tau > 1,
            "{profile}: {pace:?}"
        );
        assert!(pace.shares_moved > 0, "{profile}: {pace:?}");
    }
}

#[test]
fn every_invariant_holds_when_servers_crash_and_fail_over_while_stragglers_are_skipped() {
    let base = SimConfig {
        consistency: Consistency::BoundedDelay(2),
        servers: 3,
        workers: 4,
        iterations: 16,
        crash_servers: 1,
        stragglers: every_feature(),
        parts: 2,
        faults: Faults {
            drop: 0.05,
            reorder: true,
            crash: true,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    let mut base = base;
    base.ring.replicas = 1;
    for (profile, cfg) in profiles(base) {
        let (reports, failures) = run_seeds(&cfg, 0..30);
        let listed: Vec<String> = failures.iter().map(ToString::to_string).collect();
        assert!(failures.is_empty(), "{profile}:\n{}", listed.join("\n"));
        assert!(reports.iter().any(|r| r.pace.skips > 0), "{profile}");
        assert!(
            reports.iter().any(|r| r.server_faults.crashed() > 0),
            "{profile}"
        );
    }
}

#[test]
fn skip_ahead_ends_a_job_with_a_permanently_slow_worker_in_under_0_6_of_sequential_time() {
    let cfg = |consistency, stragglers, parts| SimConfig {
        consistency,
        stragglers,
        parts,
        slow_worker: 4.0,
        workers: 4,
        iterations: 20,
        ..SimConfig::default()
    };
    let mean = |cfg: SimConfig| {
        let (reports, failures) = run_seeds(&cfg, 0..5);
        assert!(failures.is_empty(), "{failures:?}");
        reports.iter().map(|r| r.finish as f64).sum::<f64>() / reports.len() as f64
    };
    let sequential = mean(cfg(Consistency::Sequential, StragglerPolicy::default(), 1));
    let bounded = mean(cfg(
        Consistency::BoundedDelay(4),
        StragglerPolicy::default(),
        1,
    ));
    let skipping = mean(cfg(
        Consistency::BoundedDelay(1),
        StragglerPolicy::skip_ahead(),
        4,
    ));
    // Bounded delay alone only lets the others run ahead and wait; skipping the slow worker
    // ahead does not wait for it.
    assert!(bounded > 0.85 * sequential, "{bounded} vs {sequential}");
    assert!(skipping < 0.6 * sequential, "{skipping} vs {sequential}");
}

#[test]
fn a_run_with_every_straggler_feature_on_replays_exactly() {
    let cfg = SimConfig {
        seed: 11,
        consistency: Consistency::BoundedDelay(1),
        workers: 4,
        iterations: 12,
        slow_worker: 3.0,
        stragglers: every_feature(),
        parts: 2,
        faults: Faults {
            drop: 0.05,
            reorder: true,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    let (a, b) = (run(&cfg).unwrap(), run(&cfg).unwrap());
    assert!(a.pace.skips > 0);
    assert_eq!(a, b);
    assert!(
        cfg.replay_command()
            .contains("--skip-ahead --adaptive-tau 1:4 --shares 3 --parts 2")
    );
}

/// The simulator catches a server that strays from what the coordinator decided, the same
/// breaks `pserver check` catches.
#[cfg(feature = "mutations")]
#[test]
fn staleness_catches_servers_that_stray_from_the_skips_and_the_bound_decided() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::{Invariant, run_mutated};
    // A skip is tested where a worker is always slow (the others soon need its first
    // iteration after the skip), adaptive tau where stragglers come and go (it rises and falls).
    for (mutation, policy, slow_worker, straggler) in [
        (
            Mutation::SkipPastDecision,
            StragglerPolicy::skip_ahead(),
            4.0,
            1.0,
        ),
        (
            Mutation::TauPastDecision,
            // A narrow range, so that tau keeps moving: doubling, a wide one soon sits at its
            // top, where pulls are seldom held at all.
            StragglerPolicy::adaptive(TauRange { min: 1, max: 2 }),
            1.0,
            4.0,
        ),
    ] {
        let caught = (0..20)
            .filter_map(|seed| {
                let cfg = SimConfig {
                    seed,
                    consistency: Consistency::BoundedDelay(1),
                    workers: 4,
                    iterations: 16,
                    slow_worker,
                    straggler,
                    stragglers: policy,
                    // A part pushed early is one a pull answered too soon can miss.
                    parts: 4,
                    updater: Some(pserver_models::sim::SimUpdater::Sum),
                    ..SimConfig::default()
                };
                run_mutated(&cfg, mutation).err()
            })
            .filter(|f| f.invariant == Invariant::Staleness)
            .count();
        assert!(caught >= 10, "{mutation}: only {caught} of 20 seeds caught");
    }
}

/// Runs seeds `0..n` of `cfg` as they are, each of which must pass, and with `mutation`;
/// returns how many of the mutated runs broke `invariant`, and the first other failure.
#[cfg(feature = "mutations")]
fn caught_by(
    cfg: impl Fn(u64) -> SimConfig,
    mutation: pserver_core::mutation::Mutation,
    invariant: pserver_models::sim::Invariant,
    n: u64,
) -> usize {
    let mut caught = 0;
    for seed in 0..n {
        run(&cfg(seed)).unwrap_or_else(|f| panic!("without {mutation}: {f}"));
        match pserver_models::sim::run_mutated(&cfg(seed), mutation) {
            Err(f) if f.invariant == invariant => caught += 1,
            Err(f) => panic!("{mutation} broke another invariant first: {f}"),
            Ok(_) => {}
        }
    }
    caught
}

/// Adaptive tau past the top of its range keeps staleness and the in-flight bound (servers
/// and workers follow the bound published): only tau-range, on every configuration a
/// coordinator sends, sees it.
#[cfg(feature = "mutations")]
#[test]
fn tau_range_catches_adaptive_tau_rising_past_its_range() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let cfg = |seed| SimConfig {
        seed,
        consistency: Consistency::BoundedDelay(1),
        workers: 4,
        iterations: 12,
        straggler: 4.0,
        stragglers: StragglerPolicy::adaptive(TauRange { min: 1, max: 2 }),
        ..SimConfig::default()
    };
    let caught = caught_by(cfg, Mutation::TauPastRange, Invariant::TauRange, 8);
    assert_eq!(caught, 8, "only {caught} of 8 seeds broke tau-range");
}

/// A worker 8x slower gives shares until it holds the fewest; moved past the bounds, it gives
/// its last one too. Nothing else notices a worker with no share.
#[cfg(feature = "mutations")]
#[test]
fn share_bounds_catches_moves_past_the_fewest_and_the_most() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let cfg = |seed| SimConfig {
        seed,
        workers: 4,
        iterations: 12,
        slow_worker: 8.0,
        stragglers: StragglerPolicy::balanced(Balance::shares(3)),
        ..SimConfig::default()
    };
    let caught = caught_by(cfg, Mutation::SharesPastBounds, Invariant::ShareBounds, 8);
    assert_eq!(caught, 8, "only {caught} of 8 seeds broke share-bounds");
}

/// Workers of one speed holding as many shares each have nothing to gain from a move, and no
/// share moves; moved without a gain, the first goes to a worker holding as many as its giver.
#[cfg(feature = "mutations")]
#[test]
fn share_move_catches_moves_that_make_no_step_quicker() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let cfg = |seed| SimConfig {
        seed,
        workers: 4,
        iterations: 12,
        stragglers: StragglerPolicy::balanced(Balance::shares(3)),
        ..SimConfig::default()
    };
    let caught = caught_by(cfg, Mutation::MoveWithoutGain, Invariant::ShareMove, 8);
    assert_eq!(caught, 8, "only {caught} of 8 seeds broke share-move");
}
