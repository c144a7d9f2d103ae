//! `pserver bench --filters`: the bytes filters save, what they cost in test AUC and rows/s,
//! each next to unfiltered training in the same run (ARCHITECTURE.md §10).
//!
//! Two problems: the shipped UCI Adult data (2 servers, 4 workers, 10 epochs, rows shuffled
//! every epoch, as `pserver train` runs by default), and a generated one (the training
//! benchmark's generator; 2 servers, 4 workers, 3 epochs in file order, so that each worker's
//! minibatches, and their key lists, come back every epoch). Every configuration reports the
//! bytes every node sent in its last epoch (the first fills the caches), its test AUC, its
//! training rows/s and the CPU seconds the process used per million rows, and each the ratio
//! to unfiltered training: `bytes_cut` (unfiltered bytes over filtered), `auc_delta`,
//! `rows_per_sec_ratio` and `cpu_ratio`. Each figure is the median of a few runs, taken in
//! rounds of every configuration once.

use std::path::Path;
use std::sync::Arc;

use pserver_core::filter::{Filters, KeyCaching, Kkt, Threshold};

use super::stragglers::median;
use super::train::{self, TrainSize};
use super::usage;
use super::{BenchError, Measure, runtime_err};
use crate::apps::lr::{DEFAULT_L1, LrConfig, Slowdowns, Trained, Wire, train_local};
use crate::data::libsvm::{Examples, IndexBase, read};

/// Every configuration: its name in the measures, and its filters; key caching keeps
/// `lists` lists per peer.
fn configurations(lists: u32) -> Vec<(&'static str, Filters)> {
    let caching = KeyCaching::new(lists).unwrap_or_default();
    let mut sigmod = Filters::key_caching_compressed(caching);
    sigmod.significantly_modified = Threshold::new(1.0);
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
    /// CPU seconds the process used per million rows trained, where `/proc` tells.
    cpu_secs_per_mrow: Option<f64>,
}

impl Run {
    /// Each figure's median over `runs` of one configuration: rows/s and CPU on two shared
    /// cores move by tens of percent from one run to the next, the bytes by retransmissions.
    fn median(runs: &[Run]) -> Run {
        let of = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
        let cpu: Vec<f64> = runs.iter().filter_map(|r| r.cpu_secs_per_mrow).collect();
        Run {
            last_epoch_bytes: of(&|r| r.last_epoch_bytes),
            late_epoch_bytes: of(&|r| r.late_epoch_bytes),
            mean_epoch_bytes: of(&|r| r.mean_epoch_bytes),
            auc: of(&|r| r.auc),
            rows_per_sec: of(&|r| r.rows_per_sec),
            cpu_secs_per_mrow: (cpu.len() == runs.len()).then(|| median(cpu)),
        }
    }
}

fn measured(trained: &Trained, cpu_secs: Option<f64>) -> Run {
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
        cpu_secs_per_mrow: cpu_secs.map(|cpu| cpu * 1e6 / (rows.max(1) as f64)),
    }
}

/// Runs every configuration on `problem` over `wire`, `rounds` times each, and emits the
/// median of its figures and their ratios to unfiltered training's. A round runs every
/// configuration once, so that what slows the machine for a while slows them alike.
async fn compare(
    problem: &str,
    base: &LrConfig,
    wire: Wire,
    (train, test): (&Arc<Examples>, &Arc<Examples>),
    (lists, only, rounds): (u32, &[&str], usize),
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let wire_name = match wire {
        Wire::Mem => "mem",
        Wire::Tcp => "tcp",
        Wire::Udp => "udp",
    };
    let configurations: Vec<(&str, Filters)> = configurations(lists)
        .into_iter()
        .filter(|(name, _)| only.contains(name))
        .collect();
    let mut runs: Vec<Vec<Run>> = configurations.iter().map(|_| Vec::new()).collect();
    let mut savings = vec![Vec::new(); configurations.len()];
    for _ in 0..rounds.max(1) {
        for (at, (_, filters)) in configurations.iter().enumerate() {
            let mut cfg = base.clone();
            cfg.transport = wire;
            cfg.job.filters = *filters;
            let cpu_before = usage::cpu_secs();
            let trained = train_local(
                &cfg,
                Slowdowns::default(),
                Arc::clone(train),
                Arc::clone(test),
                |_| {},
            )
            .await?;
            let cpu = cpu_before.zip(usage::cpu_secs()).map(|(a, b)| b - a);
            runs[at].push(measured(&trained, cpu));
            savings[at] = trained.filters;
        }
    }
    let mut unfiltered: Option<Run> = None;
    for (((name, _), runs), savings) in configurations.iter().zip(runs).zip(savings) {
        let run = Run::median(&runs);
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
        if let Some(cpu) = run.cpu_secs_per_mrow {
            put("cpu_secs_per_mrow", cpu, "s");
        }
        for (filter, saving) in &savings {
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
                if let Some((cpu, unfiltered_cpu)) =
                    run.cpu_secs_per_mrow.zip(none.cpu_secs_per_mrow)
                {
                    put("cpu_ratio", cpu / unfiltered_cpu.max(1e-9), "x");
                }
            }
        }
    }
    Ok(())
}

/// Runs the filters measures: the shipped data over mem, the generated problem of `size`
/// over mem and over tcp (`tcp_only`: over tcp only), every configuration `rounds` times;
/// `quick`, two epochs of the shipped data (a smoke test of the benchmark itself). Runs from
/// the repository's root.
pub(super) async fn run_filters_bench(
    quick: bool,
    tcp_only: bool,
    size: TrainSize,
    rounds: usize,
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
            (256, &all, rounds),
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
            (lists, &all, rounds),
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
        (lists, &over_tcp, rounds),
        emit,
    )
    .await
}
