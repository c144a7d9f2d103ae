//! The count-min sketch on the parameter server keeps its promise: never under-counts, and
//! over-counts by more than eps * N for at most a delta fraction of queries.

use pserver::apps::sketch::{SketchConfig, run};

#[test]
fn over_counts_stay_within_eps_n_with_probability_one_minus_delta() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (mut queried, mut over, mut largest) = (0, 0, 0);
    for seed in 0..8 {
        let cfg = SketchConfig {
            items: 20_000,
            distinct: 5_000,
            eps: 0.01,
            delta: 0.05,
            seed,
            ..SketchConfig::default()
        };
        let report = rt.block_on(run(&cfg)).expect("the sketch runs");
        assert_eq!(report.under_counted, 0, "seed {seed}: {report:?}");
        assert_eq!((report.width, report.depth), (272, 3));
        queried += report.queried;
        over += report.over_bound;
        largest = largest.max(report.max_overcount);
    }
    let fraction = over as f64 / queried as f64;
    eprintln!("{over} of {queried} queries over eps * N; largest over-count {largest}");
    assert!(
        fraction <= 0.05,
        "{over} of {queried} queries over the bound"
    );
    // The bound is not vacuous: collisions do inflate some counts.
    assert!(largest > 0);
}
