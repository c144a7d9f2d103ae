//! Training sparse logistic regression on a slice of the shipped UCI Adult data, in one
//! process. Each test pins a bound that a regression in the protocol, the runtime or the
//! trainer would break.

use std::path::Path;
use std::time::Duration;

use super::{EpochReport, LrConfig, SlowWorker, Slowdowns, Trained, train_local};
use crate::data::libsvm::{Examples, IndexBase, read};
use pserver_core::pace::{Balance, StragglerPolicy};
use pserver_core::{Consistency, Updater};

fn adult(name: &str, rows: usize) -> Examples {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/adult")
        .join(name);
    read(&path, IndexBase::Auto)
        .expect("the shipped data")
        .head(rows)
}

fn train(cfg: &LrConfig) -> Vec<EpochReport> {
    trained(cfg).reports
}

fn trained(cfg: &LrConfig) -> Trained {
    slowed(cfg, Slowdowns::default())
}

/// Trains `cfg` with its workers slowed as `slowdowns` says.
fn slowed(cfg: &LrConfig, slowdowns: Slowdowns) -> Trained {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (train, test) = (
        adult("adult.train.svm.gz", 12_000),
        adult("adult.test.svm.gz", 3_000),
    );
    rt.block_on(train_local(cfg, slowdowns, train, test, |_| {}))
        .expect("training runs")
}

fn small(cfg: LrConfig) -> LrConfig {
    LrConfig { epochs: 4, ..cfg }
}

/// Four asynchronous workers, each pulling its next batch's weights a step ahead, do not
/// lower their training loss in lockstep: how far each worker's pushes lag the others' depends
/// on the scheduler, so on a loaded machine the first epoch may fall less (CI saw 0.43 where a
/// quiet machine gives 0.47-0.55) and a settled epoch may sit up to 7% above the one before.
/// The bounds leave that noise room and still fail a run that stops learning (the base rate's
/// loss is 0.55) or climbs away from its best.
#[test]
fn default_settings_reach_a_good_auc_on_a_slice_and_keep_their_training_loss_down() {
    let reports = train(&small(LrConfig::default()));
    eprintln!("{reports:?}");
    assert_eq!(reports.len(), 4);
    let last = reports.last().unwrap();
    assert!(last.test_auc >= 0.89, "{reports:?}");
    let loss: Vec<f64> = reports.iter().map(|r| r.train_logloss).collect();
    for (i, &l) in loss.iter().enumerate().skip(1) {
        assert!(l < loss[0], "epoch {} above the first: {loss:?}", i + 1);
        let best = loss[..i].iter().copied().fold(f64::INFINITY, f64::min);
        assert!(l < 1.1 * best, "epoch {}: {loss:?}", i + 1);
    }
}

/// Compared at each run's best epoch, which is what `--save` keeps: an asynchronous run's
/// model at the end of an epoch is a snapshot taken while other workers push, and it moves
/// from epoch to epoch more than a sequential run's.
#[test]
fn four_workers_under_bounded_delay_reach_the_best_test_logloss_of_one_sequential_worker() {
    let best = |workers: usize, consistency: Consistency| {
        let mut cfg = LrConfig {
            epochs: 6,
            ..LrConfig::default()
        };
        cfg.job.workers = workers;
        cfg.job.consistency = consistency;
        let reports = train(&cfg);
        assert_eq!(reports.len(), 6);
        reports
            .iter()
            .map(|r| r.test_logloss)
            .fold(f64::INFINITY, f64::min)
    };
    let (a, b) = (
        best(1, Consistency::Sequential),
        best(4, Consistency::BoundedDelay(4)),
    );
    // Bounded delay costs a little at the default rates on a 12,000-row slice, never more
    // than 2%.
    assert!((a - b).abs() <= 0.02 * a, "1 worker {a}, 4 workers {b}");
}

#[test]
fn a_larger_l1_makes_a_sparser_model() {
    let nnz = |l1: f64| {
        let mut cfg = small(LrConfig::default());
        cfg.job.updater = Updater::FtrlProximal {
            alpha: 0.3,
            beta: 1.0,
            l1,
            l2: 1.0,
        };
        train(&cfg).last().unwrap().nnz
    };
    let (loose, tight, tighter) = (nnz(0.01), nnz(1.0), nnz(10.0));
    eprintln!("nnz {loose} {tight} {tighter}");
    assert!(
        loose > tight && tight > tighter,
        "{loose} {tight} {tighter}"
    );
    assert!(tighter > 0);
}

/// Under sequential consistency, so that what the model learns does not depend on how the
/// scheduler staggers the workers: under bounded delay a loaded machine moved the TCP run's
/// test AUC 0.0101 from the in-memory run's.
#[test]
fn training_over_loopback_tcp_and_udp_reaches_what_training_in_memory_does() {
    use super::Wire;
    let sequential = || {
        let mut cfg = small(LrConfig::default());
        cfg.job.consistency = Consistency::Sequential;
        cfg
    };
    let mem = train(&sequential());
    let a = mem.last().unwrap();
    for wire in [Wire::Tcp, Wire::Udp] {
        let over = train(&LrConfig {
            transport: wire,
            ..sequential()
        });
        let b = over.last().unwrap();
        assert!(
            (a.test_auc - b.test_auc).abs() < 0.002,
            "mem {a:?} {wire:?} {b:?}"
        );
        assert!(b.bytes_sent > 0, "{wire:?} {b:?}");
    }
}

/// Under sequential consistency each batch needs the push of the one before: a worker asked
/// to pipeline must pull nothing ahead, and ends with the very model it would without.
#[test]
fn under_sequential_consistency_the_pipelined_loop_reaches_the_unpipelined_model_bit_for_bit() {
    let run = |pipeline: bool| {
        let mut cfg = small(LrConfig::default());
        cfg.job.workers = 1;
        cfg.job.consistency = Consistency::Sequential;
        cfg.pipeline = pipeline;
        trained(&cfg)
    };
    let (piped, plain) = (run(true), run(false));
    assert!(
        piped.reports.iter().all(|r| r.pulled_ahead == 0),
        "{:?}",
        piped.reports
    );
    assert_eq!(piped.model, plain.model);
    let losses = |t: &Trained| {
        t.reports
            .iter()
            .map(|r| (r.rows, r.train_logloss.to_bits()))
            .collect::<Vec<_>>()
    };
    assert_eq!(losses(&piped), losses(&plain));
}

/// Pulling ahead under bounded delay trains every row of every epoch, and reaches the test
/// AUC of the loop that waits for each batch's weights, within the 0.002 that speed may not
/// cost (compared at each run's best epoch: an asynchronous run's end-of-epoch snapshot is
/// taken while the other worker pushes).
#[test]
fn a_pipelined_run_trains_every_row_and_reaches_what_an_unpipelined_run_does() {
    let run = |pipeline: bool| {
        let mut cfg = small(LrConfig::default());
        cfg.job.workers = 2;
        cfg.job.consistency = Consistency::BoundedDelay(2);
        cfg.pipeline = pipeline;
        assert_eq!(cfg.pipelined(), pipeline);
        train(&cfg)
    };
    let (piped, plain) = (run(true), run(false));
    for reports in [&piped, &plain] {
        assert!(reports.iter().all(|r| r.rows == 12_000), "{reports:?}");
    }
    // Every batch but each worker's first of an epoch had its weights pulled ahead; none
    // without pipelining.
    let batches = 12_000 / 100;
    assert!(
        piped.iter().all(|r| r.pulled_ahead == batches - 2),
        "{piped:?}"
    );
    assert!(plain.iter().all(|r| r.pulled_ahead == 0), "{plain:?}");
    let best = |reports: &[EpochReport]| reports.iter().map(|r| r.test_auc).fold(0.0, f64::max);
    let (a, b) = (best(&piped), best(&plain));
    assert!((a - b).abs() <= 0.002, "pipelined {a}, unpipelined {b}");
}

/// Failure checks every two milliseconds, so that a run of a second or so sees many.
fn watched(mut cfg: LrConfig, policy: StragglerPolicy) -> LrConfig {
    cfg.job.stragglers = policy;
    cfg.job.timing.heartbeat_interval = Duration::from_millis(2).as_nanos() as u64;
    cfg
}

/// A worker a hundred times slower is told again and again to skip ahead. The rows no
/// worker trains are exactly those it counted as dropped, no row is trained twice, and the
/// others' progress still makes a good model.
#[test]
fn a_slow_worker_skipped_ahead_drops_only_the_rows_it_counts_and_the_run_still_learns() {
    let mut cfg = watched(small(LrConfig::default()), StragglerPolicy::skip_ahead());
    cfg.job.consistency = Consistency::BoundedDelay(2);
    let slow = Slowdowns {
        slow_worker: Some(SlowWorker {
            worker: 1,
            factor: 100.0,
        }),
        ..Slowdowns::default()
    };
    let trained = slowed(&cfg, slow);
    let reports = &trained.reports;
    assert_eq!(reports.len(), 4);
    assert!(trained.pace.stragglers > 0, "{:?}", trained.pace);
    assert!(trained.pace.skipped_iterations > 0, "{:?}", trained.pace);
    let skipped: usize = reports.iter().map(|r| r.skipped_rows).sum();
    assert!(skipped > 0, "{reports:?}");
    for r in reports {
        assert_eq!(r.skipped_rows, r.skipped_ahead_rows, "{r:?}");
        assert_eq!(r.repeated_rows, 0, "{r:?}");
        assert_eq!(r.rows + r.skipped_rows, 12_000, "{r:?}");
    }
    assert!(reports.last().unwrap().test_auc >= 0.88, "{reports:?}");
}

/// With four shares per worker sized by speed, a worker twenty times slower hands shares
/// to the others where epochs meet: every row of every epoch is still trained, none twice,
/// and the model is as good.
#[test]
fn shares_move_from_a_slow_worker_where_epochs_meet_and_every_row_is_trained_once() {
    let cfg = watched(
        small(LrConfig::default()),
        StragglerPolicy::balanced(Balance::shares(4)),
    );
    let slow = Slowdowns {
        slow_worker: Some(SlowWorker {
            worker: 2,
            factor: 20.0,
        }),
        ..Slowdowns::default()
    };
    let trained = slowed(&cfg, slow);
    let reports = &trained.reports;
    assert_eq!(reports.len(), 4);
    assert!(trained.pace.shares_moved > 0, "{:?}", trained.pace);
    for r in reports {
        assert_eq!((r.skipped_rows, r.repeated_rows), (0, 0), "{r:?}");
        assert_eq!(r.rows, 12_000, "{r:?}");
    }
    assert!(reports.last().unwrap().test_auc >= 0.89, "{reports:?}");
}
