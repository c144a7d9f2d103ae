//! `pserver bench --filters`: the bytes filters save, what they cost in test AUC and rows/s,
//! each next to unfiltered training in the same run (ARCHITECTURE.md §10).
//!
//! Two problems: the shipped UCI Adult data (2 servers, 4 workers, 10 epochs, rows shuffled
//! every epoch, as `pserver train` runs by default), and a generated one (the training
//! benchmark's generator; 2 servers, 4 workers, 3 epochs in file order, so that each worker's
//! minibatches, and their key lists, come back every epoch). Every configuration reports the
//! bytes every node sent in its last epoch (the first fills the caches), its test AUC and its
//! training rows/s, and each the ratio to unfiltered training: `bytes_cut` (unfiltered bytes
//! over filtered), `auc_delta` and `rows_per_sec_ratio`.

use std::path::Path;
use std::sync::Arc;

use pserver_core::{Filters, KeyCaching, Kkt, Threshold};

use super::train::{self, TrainSize};
use super::{BenchError, Measure, runtime_err};
use crate::apps::lr::{DEFAULT_L1, LrConfig, Trained, Wire, train_local};
use crate::data::libsvm::{Examples, IndexBase, read};

/// Every configuration: its name in the measures, and its filters; key caching keeps
/// `lists` lists per peer.
fn configurations(lists: u32) -> Vec<(&'static str, Filters)> {
    let caching = KeyCaching::new(lists).unwrap_or_default();
    let mut sigmod = Filters::key_caching_compressed(caching);
    sigmod.significantly_modified = Threshold::new(0.05);
    let mut kkt = Filters::key_caching_compressed(caching);
    kkt.kkt = Threshold::new(DEFAULT_L1).and_then(|l1| Kkt::new(l1, KKT_EVERY));
    vec![
        ("none", Filters::none()),
        ("keycache", Filters::key_caching(caching)),
        (
            "keycache_compress",
            Filters::key_caching_compressed(caching),
        ),
        ("keycache_compress_sigmod", sigmod),
        ("keycache_compress_kkt", kkt),
    ]
}

/// The KKT filter's full-check period in the benchmark: `train --kkt`'s default.
const KKT_EVERY: u32 = 500;

/// What one run measured.
struct Run {
    last_epoch_bytes: f64,
    /// The epoch before the last: late in training, without what the filters flush at the
    /// end.
    late_epoch_bytes: f64,
    /// Every epoch's, on average, the final flush included.
    mean_epoch_bytes: f64,
    auc: f64,
    rows_per_sec: f64,
}

fn measured(trained: &Trained) -> Run {
    let reports = &trained.reports;
    let sent: Vec<u64> = reports.iter().map(|r| r.bytes_sent).collect();
    let last_epoch_bytes = match sent.as_slice() {
        [.., before, last] => last.saturating_sub(*before),
        [only] => *only,
        [] => 0,
    } as f64;
    let late_epoch_bytes = match sent.as_slice() {
        [.., before, late, _] => late.saturating_sub(*before),
        [late, _] => *late,
        _ => last_epoch_bytes as u64,
    } as f64;
    let mean_epoch_bytes = sent.last().map_or(0.0, |&b| b as f64 / sent.len() as f64);
    let rows: usize = reports.iter().map(|r| r.rows).sum();
    let secs: f64 = reports.iter().map(|r| r.train_secs).sum();
    Run {
        last_epoch_bytes,
        late_epoch_bytes,
        mean_epoch_bytes,
        auc: reports.last().map_or(0.5, |r| r.test_auc),
        rows_per_sec: rows as f64 / secs.max(1e-9),
    }
}

/// Runs every configuration on `problem` over `wire` and emits its figures and ratios.
async fn compare(
    problem: &str,
    base: &LrConfig,
    wire: Wire,
    (train, test): (&Arc<Examples>, &Arc<Examples>),
    (lists, only): (u32, &[&str]),
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let wire_name = match wire {
        Wire::Mem => "mem",
        Wire::Tcp => "tcp",
    };
    let mut unfiltered: Option<Run> = None;
    for (name, filters) in configurations(lists) {
        if !only.contains(&name) {
            continue;
        }
        let mut cfg = base.clone();
        cfg.transport = wire;
        cfg.job.filters = filters;
        let trained = train_local(&cfg, Arc::clone(train), Arc::clone(test), |_| {}).await?;
        let run = measured(&trained);
        let mut put = |what: &str, value: f64, unit: &'static str| {
            emit(Measure {
                name: format!("filters.{problem}.{wire_name}.{name}.{what}"),
                value,
                unit,
            });
        };
        put("epoch_bytes", run.last_epoch_bytes, "bytes");
        put("late_epoch_bytes", run.late_epoch_bytes, "bytes");
        put("mean_epoch_bytes", run.mean_epoch_bytes, "bytes");
        put("test_auc", run.auc, "auc");
        put("rows_per_sec", run.rows_per_sec, "rows/s");
        for (filter, saving) in &trained.filters {
            put(
                &format!("{filter}_bytes_saved"),
                saving.bytes_saved as f64,
                "bytes",
            );
        }
        match &unfiltered {
            None => unfiltered = Some(run),
            Some(none) => {
                put(
                    "bytes_cut",
                    none.last_epoch_bytes / run.last_epoch_bytes.max(1.0),
                    "x",
                );
                put(
                    "late_bytes_cut",
                    none.late_epoch_bytes / run.late_epoch_bytes.max(1.0),
                    "x",
                );
                put(
                    "mean_bytes_cut",
                    none.mean_epoch_bytes / run.mean_epoch_bytes.max(1.0),
                    "x",
                );
                put("auc_delta", run.auc - none.auc, "auc");
                put(
                    "rows_per_sec_ratio",
                    run.rows_per_sec / none.rows_per_sec.max(1e-9),
                    "x",
                );
            }
        }
    }
    Ok(())
}

/// Runs the filters measures: the shipped data over mem, the generated problem of `size`
/// over mem and over tcp (`tcp_only`: over tcp only); `quick`, two epochs of the shipped
/// data (a smoke test of the benchmark itself). Runs from the repository's root.
pub(super) async fn run_filters_bench(
    quick: bool,
    tcp_only: bool,
    size: TrainSize,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let all = [
        "none",
        "keycache",
        "keycache_compress",
        "keycache_compress_sigmod",
        "keycache_compress_kkt",
    ];
    let adult = |name: &str| -> Result<Arc<Examples>, BenchError> {
        let path = Path::new("data/adult").join(name);
        Ok(Arc::new(read(&path, IndexBase::Auto).map_err(runtime_err)?))
    };
    let (train, test) = (adult("adult.train.svm.gz")?, adult("adult.test.svm.gz")?);
    let shipped = LrConfig {
        epochs: if quick { 2 } else { 10 },
        ..LrConfig::default()
    };
    // Rows shuffled every epoch make new lists: a pull's list comes back with its push only.
    let shipped_data = (&train, &test);
    if !tcp_only {
        compare(
            "adult",
            &shipped,
            Wire::Mem,
            shipped_data,
            (256, &all),
            emit,
        )
        .await?;
    }
    let (train, test) = train::data(size, emit)?;
    let (train, test) = (Arc::new(train), Arc::new(test));
    let mut generated = LrConfig {
        epochs: size.epochs,
        // In file order, as the training benchmark: the generated rows are in random order.
        shuffle: false,
        ..LrConfig::default()
    };
    generated.job.servers = 2;
    generated.job.workers = 4;
    // Enough lists for each worker's minibatches of an epoch on each server: 2 million rows
    // make 5,000 minibatches per worker.
    let lists = u32::try_from(size.rows / 400).unwrap_or(u32::MAX).max(256);
    let data = (&train, &test);
    if !tcp_only {
        compare(
            "generated",
            &generated,
            Wire::Mem,
            data,
            (lists, &all),
            emit,
        )
        .await?;
    }
    let over_tcp = ["none", "keycache_compress", "keycache_compress_kkt"];
    compare(
        "generated",
        &generated,
        Wire::Tcp,
        data,
        (lists, &over_tcp),
        emit,
    )
    .await
}
