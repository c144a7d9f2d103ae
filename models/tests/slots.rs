//! Round-robin push slots in the deterministic simulator (ARCHITECTURE.md §9): every
//! invariant holds with slots on under loss, duplication, reordering and a crashed worker;
//! with four workers pushing together the servers' peak receive queue falls by half or more
//! while the job takes as long; and a run with slots replays exactly.

use pserver_core::Consistency;

use pserver_core::slots::PushSlots;
use pserver_models::sim::{Faults, MS, SimConfig, SimReport, run};

/// Slices of the default run's 16 keys are a few hundred bytes: most need a slot.
const SMALL: PushSlots = PushSlots {
    min_bytes: 64,
    at_once: 1,
};

#[test]
fn every_invariant_holds_with_push_slots_under_drops_dups_reorder_and_a_crash() {
    let faults = Faults {
        drop: 0.05,
        dup: 0.05,
        reorder: true,
        crash: true,
        ..Faults::default()
    };
    let mut grants = 0;
    for consistency in [Consistency::Sequential, Consistency::BoundedDelay(1)] {
        for (at_once, receive_rate) in [(1, None), (2, Some(2_000))] {
            for seed in 0..12 {
                let cfg = SimConfig {
                    seed,
                    workers: 4,
                    consistency,
                    faults,
                    push_slots: Some(PushSlots { at_once, ..SMALL }),
                    receive_rate,
                    ..SimConfig::default()
                };
                let report = run(&cfg).unwrap_or_else(|f| panic!("{f}"));
                grants += report.slot_grants;
            }
        }
    }
    assert!(grants > 0, "slots were never granted: nothing was tested");
}

/// Runs the workload of four workers pushing together for `seed`, with and without slots.
fn with_and_without(seed: u64, slots: PushSlots) -> (SimReport, SimReport) {
    let without = SimConfig::pushing_together(seed);
    let with = SimConfig {
        push_slots: Some(slots),
        ..without.clone()
    };
    let run = |cfg: &SimConfig| run(cfg).unwrap_or_else(|f| panic!("{f}"));
    (run(&without), run(&with))
}

#[test]
fn with_four_workers_pushing_together_slots_halve_the_peak_receive_queue_in_the_same_time() {
    let slots = PushSlots {
        min_bytes: 8 << 10,
        at_once: 1,
    };
    let (mut finish_without, mut finish_with) = (0, 0);
    for seed in 0..4 {
        let (without, with) = with_and_without(seed, slots);
        assert!(with.slot_grants > 0);
        assert!(
            2 * with.peak_receive_queue_bytes <= without.peak_receive_queue_bytes,
            "seed {seed}: peak {} bytes with slots, {} without",
            with.peak_receive_queue_bytes,
            without.peak_receive_queue_bytes
        );
        finish_without += without.finish;
        finish_with += with.finish;
    }
    assert!(
        10 * finish_with <= 11 * finish_without,
        "finish {} ms with slots, {} ms without",
        finish_with / MS,
        finish_without / MS
    );
}

#[test]
fn without_slots_a_receive_queue_changes_when_messages_are_handled_and_nothing_else() {
    let cfg = SimConfig::pushing_together(1);
    let report = run(&cfg).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.slot_grants, 0);
    assert!(report.peak_receive_queue_bytes > 0);
    let instant = run(&SimConfig {
        receive_rate: None,
        ..cfg
    })
    .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(instant.peak_receive_queue_bytes, 0);
    assert!(instant.finish < report.finish);
}

#[test]
fn a_run_with_push_slots_replays_exactly() {
    let cfg = SimConfig {
        seed: 7,
        workers: 4,
        faults: Faults {
            drop: 0.05,
            dup: 0.05,
            reorder: true,
            ..Faults::default()
        },
        push_slots: Some(SMALL),
        receive_rate: Some(2_000),
        ..SimConfig::default()
    };
    let first = run(&cfg).unwrap_or_else(|f| panic!("{f}"));
    assert!(first.slot_grants > 0);
    assert_eq!(run(&cfg).unwrap_or_else(|f| panic!("{f}")), first);
    assert!(
        cfg.replay_command()
            .contains("--push-slots 64:1 --receive-rate 2000")
    );
}

/// A server that grants one slot more than the job's `at_once` breaks nothing a push is judged
/// by (every slice still arrives once): only slot-limit, which reads the slots each server
/// holds granted after every step, sees it.
#[cfg(feature = "mutations")]
#[test]
fn slot_limit_catches_servers_that_grant_past_at_once() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::{Invariant, run_mutated};
    // Four workers pushing together: every server has asks waiting at every iteration.
    let cfg = |seed| SimConfig {
        push_slots: Some(PushSlots {
            min_bytes: 8 << 10,
            at_once: 1,
        }),
        ..SimConfig::pushing_together(seed)
    };
    let mut caught = 0;
    for seed in 0..4 {
        run(&cfg(seed)).unwrap_or_else(|f| panic!("{f}"));
        match run_mutated(&cfg(seed), Mutation::SlotsPastAtOnce) {
            Err(f) if f.invariant == Invariant::SlotLimit => caught += 1,
            Err(f) => panic!("another invariant broke first: {f}"),
            Ok(_) => {}
        }
    }
    assert_eq!(caught, 4, "only {caught} of 4 seeds broke slot-limit");
}
