//! Whole clusters under faults in the deterministic simulator, one test per invariant of
//! ARCHITECTURE.md §4. Every run checks every invariant after every step; each test stresses the
//! faults its invariant is most exposed to. Together they run over 1,000 faulty seeds.

use pserver_core::ring::Ring;
use pserver_core::{Consistency, MAX_KEY};
use pserver_models::sim::{Faults, MS, SimConfig, SimFailure, SimReport, SimUpdater, run};

const MODELS: [Consistency; 3] = [
    Consistency::Sequential,
    Consistency::BoundedDelay(2),
    Consistency::Eventual,
];

/// Runs `seeds` for each model and fails the test with every broken seed's replay command.
fn run_all(
    models: &[Consistency],
    seeds: std::ops::Range<u64>,
    make: impl Fn(u64, Consistency) -> SimConfig,
) -> Vec<SimReport> {
    let mut reports = Vec::new();
    let mut failures: Vec<SimFailure> = Vec::new();
    for &model in models {
        for seed in seeds.clone() {
            match run(&make(seed, model)) {
                Ok(r) => reports.push(r),
                Err(f) => failures.push(f),
            }
        }
    }
    let listed: Vec<String> = failures.iter().map(ToString::to_string).collect();
    assert!(
        failures.is_empty(),
        "{} runs failed:\n{}",
        failures.len(),
        listed.join("\n")
    );
    reports
}

fn faulty(seed: u64, consistency: Consistency, faults: Faults) -> SimConfig {
    SimConfig {
        seed,
        consistency,
        faults,
        ..SimConfig::default()
    }
}

#[test]
fn staleness_invariant_holds_under_loss_reordering_and_stragglers() {
    let faults = Faults {
        drop: 0.1,
        dup: 0.05,
        reorder: true,
        ..Faults::default()
    };
    let models = [
        Consistency::Sequential,
        Consistency::BoundedDelay(1),
        Consistency::BoundedDelay(3),
    ];
    let reports = run_all(&models, 0..120, |seed, c| SimConfig {
        straggler: 3.0,
        slow_worker: if seed % 2 == 0 { 2.0 } else { 1.0 },
        workers: 4,
        ..faulty(seed, c, faults)
    });
    assert!(reports.iter().all(|r| r.dropped > 0), "loss was injected");
}

#[test]
fn exactly_once_holds_under_heavy_loss_and_duplication() {
    let faults = Faults {
        drop: 0.2,
        dup: 0.2,
        reorder: true,
        ..Faults::default()
    };
    run_all(&MODELS, 0..100, |seed, c| SimConfig {
        servers: 3,
        ..faulty(seed, c, faults)
    });
}

#[test]
fn in_flight_iterations_stay_within_tau_plus_one() {
    let faults = Faults {
        drop: 0.05,
        reorder: true,
        ..Faults::default()
    };
    let models = [Consistency::Sequential, Consistency::BoundedDelay(2)];
    run_all(&models, 0..100, |seed, c| SimConfig {
        straggler: 5.0,
        iterations: 8,
        ..faulty(seed, c, faults)
    });
}

#[test]
fn every_request_completes_after_partitions_heal_and_workers_crash() {
    let faults = Faults {
        drop: 0.05,
        dup: 0.02,
        reorder: true,
        partition: true,
        crash: true,
    };
    let reports = run_all(&MODELS, 0..100, |seed, c| faulty(seed, c, faults));
    let crashed = reports.iter().filter(|r| r.crashed > 0).count();
    assert!(
        crashed > reports.len() / 2,
        "only {crashed} runs lost a worker"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let cfg = SimConfig {
        seed: 42,
        consistency: Consistency::BoundedDelay(1),
        faults: Faults {
            drop: 0.1,
            dup: 0.1,
            reorder: true,
            partition: true,
            crash: true,
        },
        straggler: 2.0,
        ..SimConfig::default()
    };
    let a = run(&cfg).unwrap();
    let b = run(&cfg).unwrap();
    assert_eq!(a, b);
    let other = run(&SimConfig { seed: 43, ..cfg }).unwrap();
    assert_ne!(a.fingerprint, other.fingerprint);
}

#[test]
fn a_failing_run_prints_its_seed_and_the_command_that_replays_it() {
    let cfg = SimConfig {
        seed: 7,
        time_limit: MS,
        faults: Faults {
            drop: 0.1,
            reorder: true,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    let failure = run(&cfg).unwrap_err();
    let text = failure.to_string();
    assert!(text.starts_with("seed 7 broke completion"), "{text}");
    assert!(
        text.contains("replay: pserver sim seeds --seeds 1 --first-seed 7 --servers 2 --workers 3 --keys 16 --iterations 4 --consistency sequential --drop 0.1 --reorder --time-limit-ms 1"),
        "{text}"
    );
}

#[test]
fn bounded_delay_finishes_sooner_than_sequential_with_stragglers() {
    let time = |consistency| {
        let reports = run_all(&[consistency], 0..5, |seed, c| SimConfig {
            seed,
            consistency: c,
            straggler: 4.0,
            workers: 4,
            iterations: 20,
            ..SimConfig::default()
        });
        reports.iter().map(|r| r.finish).sum::<u64>()
    };
    let sequential = time(Consistency::Sequential);
    let bounded = time(Consistency::BoundedDelay(4));
    assert!(
        bounded < sequential,
        "bounded {bounded} vs sequential {sequential}"
    );
}

#[cfg(feature = "mutations")]
#[test]
fn the_simulator_catches_every_mutation() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let faults = Faults {
        drop: 0.1,
        dup: 0.05,
        reorder: true,
        ..Faults::default()
    };
    for (mutation, invariant) in [
        (Mutation::NoDedupe, Invariant::ExactlyOnce),
        (Mutation::NoGating, Invariant::Staleness),
        (Mutation::NoRetransmit, Invariant::Completion),
    ] {
        let caught = (0..20)
            .filter_map(|seed| {
                // The ledger's checks are exact on sums.
                let cfg = SimConfig {
                    time_limit: 60_000 * MS,
                    updater: Some(SimUpdater::Sum),
                    ..faulty(seed, Consistency::Sequential, faults)
                };
                pserver_models::sim::run_mutated(&cfg, mutation).err()
            })
            .filter(|f| f.invariant == invariant)
            .count();
        assert!(
            caught >= 10,
            "{mutation}: only {caught} of 20 seeds broke {invariant}"
        );
    }
}

/// The mutations the model checker's newer properties catch are caught here too, each by its
/// own invariant. (`ignore-redirect` is not: here heartbeats bring a worker the new
/// configuration anyway, which only slows it down.)
#[cfg(feature = "mutations")]
#[test]
fn the_simulator_catches_what_the_new_model_properties_catch() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let faults = Faults {
        drop: 0.05,
        reorder: true,
        ..Faults::default()
    };
    for (mutation, invariant, consistency, ring_change) in [
        (
            Mutation::OwnProgressOnly,
            Invariant::Staleness,
            Consistency::BoundedDelay(1),
            false,
        ),
        (
            Mutation::EagerAdvance,
            Invariant::InFlight,
            Consistency::Sequential,
            false,
        ),
        (
            Mutation::ShortPull,
            Invariant::PullComplete,
            Consistency::Sequential,
            false,
        ),
    ] {
        let caught = (0..20)
            .filter_map(|seed| {
                let cfg = SimConfig {
                    time_limit: 30_000 * MS,
                    updater: Some(SimUpdater::Sum),
                    ring_change: Some(ring_change),
                    straggler: 3.0,
                    ..faulty(seed, consistency, faults)
                };
                pserver_models::sim::run_mutated(&cfg, mutation).err()
            })
            .filter(|f| f.invariant == invariant)
            .count();
        assert!(
            caught >= 10,
            "{mutation}: only {caught} of 20 seeds broke {invariant}"
        );
    }
}

#[test]
fn a_permanently_slow_worker_sets_the_pace_whatever_the_staleness_bound() {
    let time = |consistency| {
        let cfg = SimConfig {
            consistency,
            slow_worker: 4.0,
            workers: 4,
            iterations: 20,
            ..SimConfig::default()
        };
        run(&cfg).unwrap().finish
    };
    let (sequential, bounded) = (
        time(Consistency::Sequential),
        time(Consistency::BoundedDelay(4)),
    );
    // Bounded delay only lets the fast workers run ahead; the slow one's 20 iterations at 4x
    // still take the same time, so the job ends within a few percent of the sequential one.
    assert!(
        bounded * 100 >= sequential * 90,
        "bounded {bounded} vs sequential {sequential}"
    );
    assert!(bounded <= sequential);
}

#[test]
fn seeds_lay_keys_out_at_the_edges_of_the_key_space_and_of_ring_segments() {
    let ring = Ring::new(SimConfig::default().server_ids(), SimConfig::default().ring).unwrap();
    let layouts: Vec<Vec<u64>> = (0..24)
        .map(|seed| {
            SimConfig {
                seed,
                ..SimConfig::default()
            }
            .key_layout(&ring)
        })
        .collect();
    for keys in &layouts {
        assert_eq!(keys.len(), 16);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }
    assert!(
        layouts
            .iter()
            .any(|k| k.contains(&0) && k.contains(&MAX_KEY))
    );
    assert!(
        layouts
            .iter()
            .any(|k| k.windows(2).any(|w| w[1] - w[0] == 128))
    );
    assert!(
        layouts
            .iter()
            .any(|k| k.windows(2).any(|w| w[1] - w[0] == 16_384))
    );
    let boundaries: Vec<u64> = ring
        .segments()
        .map(|(r, _)| r.start())
        .filter(|&s| s > 0)
        .collect();
    assert!(layouts.iter().any(|k| {
        boundaries
            .iter()
            .any(|&b| k.contains(&(b - 1)) && k.contains(&b))
    }));
    // And every layout runs clean under faults.
    for seed in 0..24 {
        let cfg = faulty(
            seed,
            Consistency::BoundedDelay(1),
            Faults {
                drop: 0.1,
                dup: 0.05,
                reorder: true,
                ..Faults::default()
            },
        );
        run(&cfg).unwrap_or_else(|f| panic!("{f}"));
    }
}

/// Runs `cfg(seed)` for every seed and fails with every broken seed's replay command.
fn run_seeds(seeds: std::ops::Range<u64>, cfg: impl Fn(u64) -> SimConfig) -> Vec<SimReport> {
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for seed in seeds {
        match run(&cfg(seed)) {
            Ok(r) => reports.push(r),
            Err(f) => failures.push(f.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "{} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    reports
}

fn lossy() -> Faults {
    Faults {
        drop: 0.1,
        dup: 0.1,
        reorder: true,
        ..Faults::default()
    }
}

#[test]
fn every_update_rule_agrees_with_the_oracle_under_loss_duplication_and_reordering() {
    for updater in SimUpdater::ALL {
        let reports = run_seeds(0..240, |seed| SimConfig {
            updater: Some(updater),
            ..faulty(seed, MODELS[seed as usize % MODELS.len()], lossy())
        });
        assert!(reports.iter().all(|r| r.updater == updater));
        assert!(reports.iter().any(|r| r.ring_change), "{updater}");
    }
}

#[test]
fn the_seed_picks_every_update_rule_and_sometimes_a_ring_change() {
    let reports = run_seeds(0..64, |seed| SimConfig {
        seed,
        ..SimConfig::default()
    });
    for updater in SimUpdater::ALL {
        assert!(reports.iter().any(|r| r.updater == updater), "{updater}");
    }
    let changed = reports.iter().filter(|r| r.ring_change).count();
    assert!(
        (4..=32).contains(&changed),
        "{changed} of 64 runs changed the ring"
    );
    // Fixing the choices in the configuration overrides the seed, and the replay says so.
    let cfg = SimConfig {
        updater: Some(SimUpdater::Ftrl),
        ring_change: Some(true),
        ..SimConfig::default()
    };
    let report = run(&cfg).unwrap();
    assert_eq!(
        (report.updater, report.ring_change),
        (SimUpdater::Ftrl, true)
    );
    assert!(
        cfg.replay_command()
            .ends_with(" --updater ftrl --ring-change"),
        "{}",
        cfg.replay_command()
    );
}

#[test]
fn workers_on_the_old_ring_are_redirected_and_nothing_is_lost() {
    let models = [
        Consistency::Sequential,
        Consistency::BoundedDelay(1),
        Consistency::Eventual,
    ];
    let reports = run_seeds(0..300, |seed| SimConfig {
        servers: 2 + seed as usize % 3,
        ring_change: Some(true),
        ..faulty(seed, models[seed as usize % models.len()], lossy())
    });
    assert!(reports.iter().all(|r| r.ring_change));
    // A run follows no redirect when its workers on epoch 1 never touched a moved range
    // before their first heartbeat brought them epoch 2 (its keys may all lie elsewhere).
    let redirected = reports.iter().filter(|r| r.redirects > 0).count();
    assert!(
        redirected * 5 >= reports.len() * 4,
        "only {redirected} of {} runs followed a redirect",
        reports.len()
    );
    // Without a ring change nobody is redirected.
    let plain = run_seeds(0..50, |seed| SimConfig {
        ring_change: Some(false),
        ..faulty(seed, Consistency::Sequential, lossy())
    });
    assert!(plain.iter().all(|r| r.redirects == 0));
}

#[test]
fn a_changed_ring_lays_keys_out_around_the_boundaries_of_the_ring_in_force() {
    let configs: Vec<SimConfig> = (0..64)
        .map(|seed| SimConfig {
            seed,
            servers: 3,
            ring_change: Some(true),
            ..SimConfig::default()
        })
        .collect();
    let mut around_new_boundaries = 0;
    for cfg in &configs {
        let gone = cfg.server_taken_off().unwrap();
        let ring = cfg.ring_in_force().unwrap();
        assert!(ring.segments().all(|(_, owners)| owners[0] != gone));
        let keys = cfg.key_layout(&ring);
        let boundaries: Vec<u64> = ring
            .segments()
            .map(|(r, _)| r.start())
            .filter(|&s| s > 0)
            .collect();
        if boundaries
            .iter()
            .any(|&b| keys.contains(&(b - 1)) && keys.contains(&b))
        {
            around_new_boundaries += 1;
        }
    }
    assert!(around_new_boundaries > 0);
    // With one server there is no ring to change to.
    let failure = run(&SimConfig {
        servers: 1,
        ring_change: Some(true),
        ..SimConfig::default()
    })
    .unwrap_err();
    assert_eq!(failure.invariant, pserver_models::sim::Invariant::Setup);
}

#[cfg(feature = "mutations")]
#[test]
fn the_oracle_catches_an_update_rule_applied_with_the_wrong_sign() {
    use pserver_models::sim::{Invariant, SimMutation};
    for updater in [SimUpdater::Sgd, SimUpdater::AdaGrad, SimUpdater::Ftrl] {
        for seed in 0..20 {
            let cfg = SimConfig {
                updater: Some(updater),
                ..faulty(seed, MODELS[seed as usize % MODELS.len()], lossy())
            };
            let failure = pserver_models::sim::run_mutated(&cfg, SimMutation::WrongSign)
                .expect_err("a wrong sign must not pass");
            assert_eq!(failure.invariant, Invariant::Oracle, "{failure}");
            assert!(
                failure.replay.contains("--mutation wrong-sign"),
                "{failure}"
            );
        }
    }
}

#[cfg(feature = "mutations")]
#[test]
fn the_oracle_catches_duplicates_applied_again_whatever_the_update_rule() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let faults = Faults {
        drop: 0.2,
        dup: 0.2,
        reorder: true,
        ..Faults::default()
    };
    for updater in [SimUpdater::Sgd, SimUpdater::AdaGrad, SimUpdater::Ftrl] {
        let caught = (0..20)
            .filter_map(|seed| {
                let cfg = SimConfig {
                    updater: Some(updater),
                    ..faulty(seed, Consistency::Eventual, faults)
                };
                pserver_models::sim::run_mutated(&cfg, Mutation::NoDedupe).err()
            })
            .filter(|f| f.invariant == Invariant::Oracle)
            .count();
        assert!(caught >= 10, "{updater}: only {caught} of 20 seeds");
    }
}

/// A run of three servers, each range with one replica, where one server crashes.
fn one_crash(seed: u64, consistency: Consistency, faults: Faults) -> SimConfig {
    let mut cfg = SimConfig {
        servers: 3,
        crash_servers: 1,
        ..faulty(seed, consistency, faults)
    };
    cfg.ring.replicas = 1;
    cfg
}

fn every_fault() -> Faults {
    Faults {
        drop: 0.05,
        dup: 0.05,
        reorder: true,
        partition: true,
        crash: true,
    }
}

fn total_faults(reports: &[SimReport]) -> pserver_models::sim::ServerFaults {
    let mut all = pserver_models::sim::ServerFaults::default();
    for r in reports {
        all.add(&r.server_faults);
    }
    all
}

#[test]
fn durability_holds_when_a_primary_crashes_with_one_replica() {
    let reports = run_all(&MODELS, 0..40, |seed, c| SimConfig {
        updater: Some(SimUpdater::Sum),
        ..one_crash(seed, c, every_fault())
    });
    let faults = total_faults(&reports);
    // Nearly every run lost a server (a crash planned after the last worker finished does not
    // happen), and every run waited until it recovered.
    let crashed = reports
        .iter()
        .filter(|r| r.server_faults.crashed() == 1)
        .count();
    assert!(crashed * 10 >= reports.len() * 9, "{crashed}: {faults:?}");
    assert!(
        reports
            .iter()
            .all(|r| r.recoveries.len() == r.server_faults.crashed()),
        "{faults:?}"
    );
    assert!(faults.crashes > 0 && faults.restarts > 0, "{faults:?}");
    assert!(faults.cut_offs > 0 && faults.flaps > 0, "{faults:?}");
}

/// The smallest replicated cluster a user can configure: two servers, one replica. The one
/// left serves alone while the other is down, and a restarted one copies every range back;
/// a restart within the heartbeat timeout is a new process the ring must take off first.
#[test]
fn two_servers_with_one_replica_survive_a_crash_and_a_restart() {
    for quick_restart in [false, true] {
        let reports = run_all(&MODELS, 0..60, |seed, c| {
            let mut cfg = SimConfig {
                servers: 2,
                updater: Some(SimUpdater::Sum),
                quick_restart,
                ..one_crash(seed, c, every_fault())
            };
            cfg.ring.replicas = 1;
            cfg
        });
        let faults = total_faults(&reports);
        assert!(faults.crashes > 10 && faults.restarts > 10, "{faults:?}");
        assert!(
            reports
                .iter()
                .all(|r| r.recoveries.len() == r.server_faults.crashed()),
            "{faults:?}"
        );
    }
}

/// Three servers with two replicas: every server holds every range, and two may crash.
#[test]
fn three_servers_with_two_replicas_survive_two_crashes() {
    let reports = run_all(&MODELS, 0..40, |seed, c| SimConfig {
        servers: 3,
        ..two_crashes(seed, c, every_fault())
    });
    // Most runs lose both (a crash planned after the last worker finished does not happen),
    // and the last server then serves the job alone; every crash is recovered from.
    let both = reports
        .iter()
        .filter(|r| r.server_faults.crashed() == 2)
        .count();
    assert!(
        both * 10 >= reports.len() * 7,
        "{both} of {}",
        reports.len()
    );
    assert!(
        reports
            .iter()
            .all(|r| r.recoveries.len() == r.server_faults.crashed())
    );
}

#[test]
fn single_owner_holds_across_fail_over_cut_off_servers_and_flapping_ones() {
    let reports = run_all(&MODELS, 40..80, |seed, c| one_crash(seed, c, every_fault()));
    let faults = total_faults(&reports);
    assert!(faults.cut_offs > 10 && faults.flaps > 10, "{faults:?}");
    // Without a crash, cut-offs and flaps alone never cost a server its membership.
    let calm = run_all(&MODELS, 0..20, |seed, c| SimConfig {
        crash_servers: 0,
        ..one_crash(seed, c, every_fault())
    });
    assert!(calm.iter().all(|r| r.recoveries.is_empty()));
}

#[test]
fn exactly_once_follows_the_ring_in_force_across_fail_over() {
    let faults = Faults {
        drop: 0.2,
        dup: 0.2,
        reorder: true,
        ..Faults::default()
    };
    run_all(&MODELS, 0..40, |seed, c| SimConfig {
        updater: Some(SimUpdater::Sum),
        workers: 4,
        ..one_crash(seed, c, faults)
    });
}

#[test]
fn replica_convergence_holds_for_every_update_rule_after_fail_over() {
    for updater in SimUpdater::ALL {
        let reports = run_seeds(0..30, |seed| SimConfig {
            updater: Some(updater),
            ..one_crash(seed, MODELS[seed as usize % MODELS.len()], lossy())
        });
        assert!(reports.iter().all(|r| r.recoveries.len() == 1), "{updater}");
    }
}

/// Five servers, two replicas per range, two crashes: the second may hit the server a copy is
/// on its way to, or the copy's sender as soon as a replica installed it.
fn two_crashes(seed: u64, consistency: Consistency, faults: Faults) -> SimConfig {
    let mut cfg = SimConfig {
        servers: 5,
        crash_servers: 2,
        iterations: 8,
        updater: Some(SimUpdater::Sum),
        ..faulty(seed, consistency, faults)
    };
    cfg.ring.replicas = 2;
    cfg
}

#[test]
fn two_replicas_survive_two_crashes_one_while_a_copy_is_on_its_way() {
    let reports = run_all(&MODELS, 0..24, |seed, c| {
        two_crashes(seed, c, every_fault())
    });
    let faults = total_faults(&reports);
    assert!(faults.crashes_during_copy > 0, "{faults:?}");
    assert!(faults.crashes_after_copy > 0, "{faults:?}");
    assert!(faults.crashed() > reports.len(), "{faults:?}");
}

#[test]
fn recovery_takes_about_the_heartbeat_timeout() {
    let reports = run_seeds(0..20, |seed| {
        one_crash(seed, Consistency::Sequential, lossy())
    });
    for r in &reports {
        let t = r.recoveries[0];
        // Detection is the coordinator's heartbeat timeout (2 s); the rest is the new epoch
        // reaching the promoted replicas.
        assert!((2_000 * MS..3_000 * MS).contains(&t), "{}ms", t / MS);
    }
}

#[test]
fn a_seed_with_server_faults_replays_exactly() {
    let cfg = one_crash(42, Consistency::BoundedDelay(1), every_fault());
    let a = run(&cfg).unwrap();
    assert_eq!(a, run(&cfg).unwrap());
    assert!(
        cfg.replay_command()
            .ends_with(" --replicas 1 --crash-servers 1"),
        "{}",
        cfg.replay_command()
    );
}

#[test]
fn runs_outside_the_fault_model_are_refused_at_setup() {
    use pserver_models::sim::Invariant;
    let too_many_crashes = SimConfig {
        crash_servers: 2,
        ..one_crash(0, Consistency::Sequential, Faults::default())
    };
    let mut too_many_replicas = SimConfig::default();
    too_many_replicas.ring.replicas = 2;
    for cfg in [too_many_crashes, too_many_replicas] {
        let failure = run(&cfg).unwrap_err();
        assert_eq!(failure.invariant, Invariant::Setup, "{failure}");
    }
}

#[cfg(feature = "mutations")]
fn caught_by(
    mutation: pserver_core::mutation::Mutation,
    seeds: std::ops::Range<u64>,
    cfg: impl Fn(u64) -> SimConfig,
) -> Vec<SimFailure> {
    seeds
        .filter_map(|seed| pserver_models::sim::run_mutated(&cfg(seed), mutation).err())
        .collect()
}

#[cfg(feature = "mutations")]
#[test]
fn durability_catches_acknowledging_before_the_replicas_have_a_push() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let failures = caught_by(Mutation::AckBeforeReplicate, 0..40, |seed| SimConfig {
        updater: Some(SimUpdater::Sum),
        time_limit: 60_000 * MS,
        ..one_crash(seed, MODELS[seed as usize % MODELS.len()], every_fault())
    });
    assert!(
        failures
            .iter()
            .any(|f| f.invariant == Invariant::Durability),
        "{failures:?}"
    );
}

/// A primary sends each replica server one batch for the steps of every shard a push touched
/// there. A replica that takes in only the first shard of a batch and acknowledges the rest is
/// caught: its values part from its primary's, or it falls out of step for good (it applies
/// no step after one it skipped) and pushes waiting on it never complete.
#[cfg(feature = "mutations")]
#[test]
fn replica_convergence_catches_a_replica_that_takes_in_part_of_a_batch() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let failures = caught_by(Mutation::PartialBatch, 0..12, |seed| {
        one_crash(seed, MODELS[seed as usize % MODELS.len()], every_fault())
    });
    assert_eq!(failures.len(), 12, "{failures:?}");
    assert!(
        failures.iter().all(|f| matches!(
            f.invariant,
            Invariant::ReplicaConvergence
                | Invariant::Durability
                | Invariant::Oracle
                | Invariant::Completion
        )),
        "{failures:?}"
    );
    assert!(
        failures
            .iter()
            .any(|f| f.invariant == Invariant::ReplicaConvergence),
        "{failures:?}"
    );
}

/// Copies that leave the de-duplication state behind let a resend be applied again once the
/// copy's holder serves the range: a restarted server joining again through copies, or a new
/// replica promoted after a second crash. With two replicas and two crashes about one seed in
/// ten gets there.
#[cfg(feature = "mutations")]
#[test]
fn exactly_once_catches_copies_that_leave_the_de_duplication_state_behind() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let faults = Faults {
        drop: 0.05,
        dup: 0.05,
        reorder: true,
        ..Faults::default()
    };
    let failures = caught_by(Mutation::DropDedupOnTransfer, 0..40, |seed| SimConfig {
        time_limit: 60_000 * MS,
        ..two_crashes(seed, Consistency::Sequential, faults)
    });
    assert!(
        failures
            .iter()
            .any(|f| f.invariant == Invariant::ExactlyOnce),
        "{failures:?}"
    );
}

/// A server that restarts before the coordinator declared it dead registers as a new
/// incarnation: it is taken off the ring (its ranges pass to their replicas) and joins again
/// through copies, so nothing acknowledged is lost (seed 4 of `pserver sim seeds --servers 3
/// --replicas 1 --crash-servers 1 --quick-restart --updater sum` lost pushes when a restarted
/// server was taken back as the holder of its ranges).
#[test]
fn exactly_once_holds_when_a_server_restarts_within_the_heartbeat_timeout() {
    run_all(&MODELS, 0..20, |seed, c| SimConfig {
        updater: Some(SimUpdater::Sum),
        quick_restart: true,
        ..one_crash(seed, c, lossy())
    });
}

/// Servers join while the workers push and pull: each copies the ranges the next ring gives it
/// while the old holders serve, then the ring switches; no push is lost or applied twice, every
/// key has one primary, and the replicas converge.
#[test]
fn exactly_once_and_single_owner_hold_while_servers_join() {
    let reports = run_all(&MODELS, 0..12, |seed, c| {
        let mut cfg = SimConfig {
            servers: 3,
            join_servers: 1,
            ..faulty(seed, c, lossy())
        };
        cfg.ring.replicas = 1;
        cfg
    });
    let joins: usize = reports.iter().map(|r| r.server_faults.joins).sum();
    assert_eq!(joins, reports.len(), "every run had its join");
}

/// Joins, leaves and a crash piled up: four servers, one replica, a join, a leave and a crash
/// within a short while of each other, membership messages late and out of order.
fn membership_stress(seed: u64, consistency: Consistency) -> SimConfig {
    let mut cfg = SimConfig {
        servers: 4,
        crash_servers: 1,
        join_servers: 1,
        leave_servers: 1,
        membership_stress: true,
        ..faulty(seed, consistency, every_fault_but_partitions())
    };
    cfg.ring.replicas = 1;
    cfg
}

fn every_fault_but_partitions() -> Faults {
    Faults {
        drop: 0.05,
        dup: 0.05,
        reorder: true,
        ..Faults::default()
    }
}

/// A server joins while another leaves or while a crash is being recovered from, and the
/// acknowledgements of one change arrive after the next began: no push is lost or applied
/// twice, every key has one primary, every request completes, the replicas converge. (`pserver
/// sim seeds --membership-stress` runs 5,000 seeds of each mix; see docs/verification.md.)
#[test]
fn every_invariant_holds_while_membership_changes_overlap() {
    let reports = run_all(&MODELS, 0..30, membership_stress);
    let f = total_faults(&reports);
    assert_eq!((f.joins, f.leaves), (reports.len(), reports.len()));
    assert_eq!(f.crashed(), reports.len());
    let overlapped = reports
        .iter()
        .filter(|r| r.server_faults.overlapping > 0)
        .count();
    assert!(
        2 * overlapped >= reports.len(),
        "only {overlapped} of {} runs' changes overlapped",
        reports.len()
    );
}

/// A crashed server's messages still on the network arrive after it restarted, and what was
/// sent to its earlier process (configurations included) reaches the new one.
#[test]
fn every_invariant_holds_when_an_earlier_incarnations_messages_arrive_late() {
    let reports = run_all(&MODELS, 0..30, |seed, c| SimConfig {
        quick_restart: true,
        ..membership_stress(seed, c)
    });
    let f = total_faults(&reports);
    assert!(f.restarts > 0);
    assert!(
        f.late_from_earlier_process > 0 && f.late_to_later_process > 0,
        "{f:?}"
    );
}

#[test]
fn a_seed_under_membership_stress_replays_exactly() {
    let cfg = SimConfig {
        quick_restart: true,
        ..membership_stress(7, Consistency::BoundedDelay(1))
    };
    assert!(cfg.replay_command().contains("--membership-stress"));
    let (a, b) = (run(&cfg).unwrap(), run(&cfg).unwrap());
    assert_eq!(a, b);
}

/// Seeds of the sequential membership stress that broke invariants:
/// - 2655 broke durability before the coordinator took a `Leave` only at the epoch in force (a
///   server asked to leave while another had crashed and a third joined);
/// - 13775 broke exactly-once: a copy of a range arriving after a newer copy of part of it was
///   not installed at all, yet acknowledged, so the joining server became primary of the rest
///   of the range without its values. A replica now installs an older copy around the parts it
///   holds newer.
#[test]
fn the_membership_stress_seeds_that_broke_invariants_pass() {
    for seed in [2655, 13775] {
        let cfg = SimConfig {
            updater: Some(SimUpdater::Sum),
            ring_change: Some(false),
            ..membership_stress(seed, Consistency::Sequential)
        };
        run(&cfg).unwrap_or_else(|f| panic!("{f}"));
    }
}

/// A job with a standby coordinator, its active coordinator crashing and cut off, every other
/// fault of the simulator too: every invariant holds, `single-coordinator` included, and
/// standbys take over, in the median run within twice the heartbeat timeout of the fault.
#[test]
fn coordinator_crashes_and_partitions_mixed_with_every_fault_break_nothing() {
    use pserver_models::sim::CoordinatorFaults;
    let reports = run_all(&MODELS, 0..12, |seed, consistency| SimConfig {
        workers: 3,
        iterations: 30,
        coordinator_faults: CoordinatorFaults {
            crash: true,
            partition: true,
        },
        ..one_crash(seed, consistency, every_fault())
    });
    let takeovers: Vec<pserver_core::Time> =
        reports.iter().flat_map(|r| r.takeovers.clone()).collect();
    // Each run crashes the coordinator for 0.3 s or 3 s and cuts it off for 0.5 to 5 s; only
    // faults outlasting the heartbeat timeout call for a takeover, about one per run. Which
    // faults a seed draws moves with every message the run sends.
    assert!(
        2 * takeovers.len() >= reports.len(),
        "{} takeovers in {} runs",
        takeovers.len(),
        reports.len()
    );
    // Most take one round of asking; where a member could not grant in it (one restarting,
    // or cut off), a second round follows.
    let timeout = pserver_core::Timing::default().heartbeat_timeout;
    let mut sorted = takeovers.clone();
    sorted.sort_unstable();
    assert!(sorted[sorted.len() / 2] <= 2 * timeout, "{sorted:?}");
}

/// A standby that takes over without a newer term publishes an epoch the coordinator it took
/// over from publishes too: `single-coordinator` catches it.
#[cfg(feature = "mutations")]
#[test]
fn the_simulator_catches_a_standby_taking_over_without_a_newer_term() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::{CoordinatorFaults, Invariant};
    let caught = (0..20)
        .filter_map(|seed| {
            let cfg = SimConfig {
                iterations: 30,
                coordinator_faults: CoordinatorFaults {
                    crash: false,
                    partition: true,
                },
                ..faulty(seed, Consistency::Sequential, Faults::default())
            };
            pserver_models::sim::run_mutated(&cfg, Mutation::TakeOverWithoutTerm).err()
        })
        .filter(|f| f.invariant == Invariant::SingleCoordinator)
        .count();
    assert!(
        caught >= 5,
        "only {caught} of 20 seeds broke single-coordinator"
    );
}
