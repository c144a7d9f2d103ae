//! Filters in the deterministic simulator (ARCHITECTURE.md §10): with the
//! significantly-modified filter on, every invariant holds under loss, duplication,
//! reordering and a crashed worker, and what each surviving worker's requests carried sums to
//! what it pushed; a filter that forgets what it held is caught. The same for the KKT filter,
//! alone and under key caching with compression, where it holds a row back by pushing zeros.

use pserver_core::Consistency;

use pserver_core::filter::{Filters, KeyCaching, Kkt, Threshold};
use pserver_models::sim::{Faults, SimConfig, run};

fn config(seed: u64, consistency: Consistency) -> SimConfig {
    SimConfig {
        seed,
        workers: 3,
        consistency,
        faults: Faults {
            drop: 0.05,
            dup: 0.05,
            reorder: true,
            crash: seed % 2 == 0,
            ..Faults::default()
        },
        // Pushed values are 1 to 100: a key's change goes every two or three pushes.
        filters: Filters::significantly_modified(Threshold::new(150.0).unwrap()),
        ..SimConfig::default()
    }
}

#[test]
fn every_invariant_holds_with_the_significantly_modified_filter_and_nothing_is_lost() {
    let (mut rows_in, mut rows_out) = (0, 0);
    for consistency in [
        Consistency::Sequential,
        Consistency::BoundedDelay(2),
        Consistency::Eventual,
    ] {
        for seed in 0..20 {
            let report = run(&config(seed, consistency)).unwrap_or_else(|f| panic!("{f}"));
            let saving = report.filter_savings["sigmod"];
            rows_in += saving.rows_in;
            rows_out += saving.rows_out;
        }
    }
    assert!(rows_in > 0, "the filter saw no push: nothing was tested");
    assert!(
        rows_out < rows_in * 3 / 4,
        "the filter held little back: {rows_out} of {rows_in} rows went"
    );
}

/// The KKT filter holds the pushes of keys a pull answered zero for: in the simulator, keys
/// no push reached yet. Pushed values are 1 to 100, so under a bound of 150 a key's first
/// change waits, and goes with its next push or after three pushes.
#[test]
fn every_invariant_holds_with_the_kkt_filter_and_nothing_is_lost() {
    let kkt = Kkt::new(Threshold::new(150.0).unwrap(), 3).unwrap();
    let mut cached = Filters::key_caching_compressed(KeyCaching::new(4).unwrap());
    cached.kkt = Some(kkt);
    for filters in [Filters::kkt(kkt), cached] {
        let (mut rows_in, mut rows_out) = (0, 0);
        for consistency in [Consistency::BoundedDelay(2), Consistency::Eventual] {
            for seed in 0..15 {
                let cfg = SimConfig {
                    filters,
                    ..config(seed, consistency)
                };
                let report = run(&cfg).unwrap_or_else(|f| panic!("{f}"));
                let saving = report.filter_savings["kkt"];
                rows_in += saving.rows_in;
                rows_out += saving.rows_out;
            }
        }
        assert!(rows_in > 0, "the filter saw no push: nothing was tested");
        assert!(
            rows_out < rows_in,
            "{filters:?}: the filter held nothing back ({rows_out} of {rows_in} rows went)"
        );
    }
}

#[cfg(feature = "mutations")]
#[test]
fn exactly_once_catches_a_filter_that_forgets_what_it_held() {
    use pserver_core::mutation::Mutation;
    use pserver_models::sim::Invariant;
    let caught = (0..20)
        .filter_map(|seed| {
            pserver_models::sim::run_mutated(
                &config(seed, Consistency::BoundedDelay(2)),
                Mutation::FilterForgets,
            )
            .err()
        })
        .find(|f| f.invariant == Invariant::ExactlyOnce)
        .unwrap_or_else(|| panic!("no seed caught a filter that forgets"));
    assert!(caught.detail.contains("filters lost"), "{caught}");
}
