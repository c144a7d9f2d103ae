//! `pserver bench train`: training throughput and what it learns, next to a floor and to
//! Vowpal Wabbit measured in the same run, on two shapes of generated data: click-like binary
//! rows, and text-like rows of valued words (`train.text.*`).
//!
//! The floor is the same update rule (FTRL-Proximal with the job's rates, the intercept exempt
//! from regularization) over the same rows in the same minibatches, in one thread, with the
//! weights in a flat array: no parameter server at all. Every in-process pserver figure reads
//! as a ratio to it. Parsing is timed apart, and is in no in-process rows/s figure. Vowpal
//! Wabbit, when installed, trains one pass over the same rows in the same run (its figure
//! includes its own parsing, which it does on a thread of its own). `pserver train` is also
//! run as a user runs it, a process of its own on the same files for one epoch
//! (`process.*`), measured from outside as VW is: parsing, startup and evaluation included.
//!
//! Each way that trains several epochs says after which epoch, and after how many seconds of
//! training, its test AUC first reached VW's after its one pass (`epochs_to_vw_auc`,
//! `secs_to_vw_auc`).

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use pserver_core::{Key, KvPairs, UpdateRule};

use super::child::{self, Scratch};
use super::reached::Reached;
use super::usage::{cpu_secs, peak_rss_mb, reset_peak_rss};
use super::{BenchError, Measure, runtime_err, vw};
use crate::apps::lr::{BIAS_KEY, LrConfig, Slowdowns, Wire, evaluate, train_local};
use crate::data::libsvm::{Examples, IndexBase, parse};
use crate::data::synthetic::{GenConfig, Shape, write};

/// The size of the generated problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TrainSize {
    /// Training rows.
    pub(super) rows: u64,
    /// Test rows (after the training rows, of the same true model).
    pub(super) test_rows: u64,
    /// Features.
    pub(super) features: u64,
    /// Passes over the training rows.
    pub(super) epochs: u32,
    /// Features of a row.
    pub(super) per_row: usize,
    /// Binary click features or valued words.
    pub(super) shape: Shape,
}

impl TrainSize {
    /// Tens of seconds in all; a few with `quick`; `rows` training rows (and a tenth as many
    /// test rows) when given.
    pub(super) fn new(quick: bool, rows: Option<u64>) -> Self {
        let size = Self::default_for(quick);
        match rows {
            Some(rows) => TrainSize {
                rows,
                test_rows: (rows / 10).max(1),
                ..size
            },
            None => size,
        }
    }

    fn default_for(quick: bool) -> Self {
        if quick {
            TrainSize {
                rows: 20_000,
                test_rows: 5_000,
                features: 1 << 16,
                epochs: 2,
                per_row: 30,
                shape: Shape::Click,
            }
        } else {
            TrainSize {
                rows: 500_000,
                test_rows: 50_000,
                features: 1 << 22,
                epochs: 3,
                per_row: 30,
                shape: Shape::Click,
            }
        }
    }

    /// The text-shaped problem: 20,000 rows of 90 words of 100,000, as a set of product
    /// reviews is (`pserver gen --shape text`); a quarter as many rows with `quick`.
    pub(super) fn text(quick: bool) -> Self {
        TrainSize {
            rows: if quick { 5_000 } else { 20_000 },
            test_rows: if quick { 2_000 } else { 5_000 },
            features: 100_000,
            epochs: if quick { 2 } else { 5 },
            per_row: 90,
            shape: Shape::Text,
        }
    }

    /// What the names of this problem's measures start with after `train.`.
    fn prefix(&self) -> &'static str {
        match self.shape {
            Shape::Click => "",
            Shape::Text => "text.",
        }
    }
}

/// Generates and parses the training and test sets; emits the parse time.
pub(super) fn data(
    size: TrainSize,
    emit: &mut impl FnMut(Measure),
) -> Result<(Examples, Examples), BenchError> {
    data_in(size, None, emit)
}

/// As [`data`], and with `files` also writes the two sets there as `train.svm` and
/// `test.svm`, for the programs run on them.
fn data_in(
    size: TrainSize,
    files: Option<&Path>,
    emit: &mut impl FnMut(Measure),
) -> Result<(Examples, Examples), BenchError> {
    let text = |rows: u64, first_row: u64| -> Result<Vec<u8>, BenchError> {
        let cfg = GenConfig {
            rows,
            features: size.features,
            per_row: size.per_row,
            first_row,
            seed: 1,
            shape: size.shape,
            ..GenConfig::default()
        };
        let mut out = Vec::new();
        write(&cfg, &mut out).map_err(runtime_err)?;
        Ok(out)
    };
    let (train, test) = (text(size.rows, 0)?, text(size.test_rows, size.rows)?);
    if let Some(dir) = files {
        std::fs::write(dir.join("train.svm"), &train)?;
        std::fs::write(dir.join("test.svm"), &test)?;
    }
    let began = Instant::now();
    let train = parse("train", &train, IndexBase::Zero).map_err(runtime_err)?;
    let secs = began.elapsed().as_secs_f64();
    let test = parse("test", &test, IndexBase::Zero).map_err(runtime_err)?;
    emit(Measure {
        name: format!("train.{}parse.rows_per_sec", size.prefix()),
        value: train.len() as f64 / secs.max(1e-9),
        unit: "rows/s",
    });
    Ok((train, test))
}

fn emit_reached(name: &str, r: &Reached, emit: &mut impl FnMut(Measure)) {
    let mut put = |what: String, value: f64, unit: &'static str| {
        emit(Measure {
            name: format!("train.{name}.{what}"),
            value,
            unit,
        })
    };
    put("rows_per_sec".into(), r.rows_per_sec, "rows/s");
    if r.epochs.len() > 1 {
        for (i, &rate) in r.epochs.iter().enumerate() {
            put(format!("epoch{}.rows_per_sec", i + 1), rate, "rows/s");
        }
        // Time of the first epoch over the mean of the later ones.
        let later =
            r.epochs[1..].iter().map(|x| 1.0 / x).sum::<f64>() / (r.epochs.len() - 1) as f64;
        put(
            "first_epoch_vs_later".into(),
            (1.0 / r.epochs[0]) / later,
            "ratio",
        );
    }
    if let Some(cpu) = r.cpu_secs_per_mrow {
        put("cpu_secs_per_mrow".into(), cpu, "s");
    }
    if let Some(mb) = r.peak_rss_mb {
        put("peak_rss".into(), mb, "MB");
    }
    if let Some(secs) = r.measure_secs {
        put("measure_secs_per_epoch".into(), secs, "s");
    }
    if r.curve.len() > 1 {
        for (i, &(_, auc)) in r.curve.iter().enumerate() {
            put(format!("epoch{}.test_auc", i + 1), auc, "auc");
        }
    }
    put("test_auc".into(), r.auc, "auc");
}

/// When `r` first reached VW's test AUC: the epoch, the seconds of training until then, and
/// those seconds over VW's whole run; said on stderr when it never did.
fn emit_reaching_vw(name: &str, r: &Reached, vw: &Reached, emit: &mut impl FnMut(Measure)) {
    let Some(&(vw_secs, target)) = vw.curve.last() else {
        return;
    };
    match r.first_reaching(target) {
        Some((epoch, secs)) => {
            for (what, value, unit) in [
                ("epochs_to_vw_auc", epoch as f64, "epochs"),
                ("secs_to_vw_auc", secs, "s"),
                ("secs_to_vw_auc_vs_vw", secs / vw_secs.max(1e-9), "ratio"),
            ] {
                emit(Measure {
                    name: format!("train.{name}.{what}"),
                    value,
                    unit,
                });
            }
        }
        None => eprintln!(
            "train.{name}: VW's test AUC {target:.4} not reached in {} epochs",
            r.curve.len()
        ),
    }
}

/// The floor: FTRL over a flat weight array in one thread, minibatch by minibatch in file
/// order, each step the summed gradient of its rows, as a worker pushes it.
fn floor(cfg: &LrConfig, train: &Examples, test: &Examples) -> Reached {
    let dims = train.dimensions().max(test.dimensions()) as usize;
    let bias = dims;
    let (mut w, mut aux) = (vec![0f32; dims + 1], vec![0f32; 2 * (dims + 1)]);
    let rule = cfg.job.updater;
    let free = UpdateRule::<f32>::unregularized(&rule);
    let mut grad = vec![0f32; dims + 1];
    let mut touched: Vec<usize> = Vec::new();
    let cpu0 = cpu_secs();
    let batch = cfg.batch.max(1);
    let mut epochs = Vec::new();
    let (mut curve, mut trained_secs, mut measure_cpu) = (Vec::new(), 0.0, 0.0);
    let model = |w: &[f32]| {
        let (keys, weights): (Vec<Key>, Vec<f32>) = w
            .iter()
            .enumerate()
            .filter(|(_, x)| **x != 0.0)
            .map(|(k, &x)| (if k == bias { BIAS_KEY } else { k as Key }, x))
            .unzip();
        KvPairs::new(keys, weights, 1).map_or(0.5, |m| evaluate(&m, test).1)
    };
    for _ in 0..cfg.epochs {
        let epoch_began = Instant::now();
        for from in (0..train.len()).step_by(batch) {
            let rows = from..(from + batch).min(train.len());
            for r in rows {
                let row = train.row(r);
                let z: f64 = f64::from(w[bias])
                    + row
                        .iter()
                        .map(|(k, v)| f64::from(w[k as usize]) * f64::from(v))
                        .sum::<f64>();
                let p = 1.0 / (1.0 + (-z.clamp(-35.0, 35.0)).exp());
                let g = (p - f64::from(train.labels()[r])) as f32;
                for (k, v) in row.iter() {
                    let k = k as usize;
                    if grad[k] == 0.0 {
                        touched.push(k);
                    }
                    grad[k] += g * v;
                }
                grad[bias] += g;
            }
            for &k in &touched {
                rule.apply(&mut w[k], &mut aux[2 * k..2 * k + 2], grad[k]);
                grad[k] = 0.0;
            }
            touched.clear();
            free.apply(&mut w[bias], &mut aux[2 * bias..2 * bias + 2], grad[bias]);
            grad[bias] = 0.0;
        }
        let epoch_secs = epoch_began.elapsed().as_secs_f64();
        epochs.push(train.len() as f64 / epoch_secs.max(1e-9));
        trained_secs += epoch_secs;
        // Measured apart: neither its time nor its CPU is the floor's training.
        let measuring = cpu_secs();
        curve.push((trained_secs, model(&w)));
        measure_cpu += cpu_secs().zip(measuring).map_or(0.0, |(b, a)| b - a);
    }
    let cpu = cpu_secs().zip(cpu0).map(|(b, a)| b - a - measure_cpu);
    let rows = train.len() as f64 * f64::from(cfg.epochs);
    Reached {
        rows_per_sec: rows / trained_secs.max(1e-9),
        epochs,
        cpu_secs_per_mrow: cpu.map(|c| c / rows * 1e6),
        peak_rss_mb: peak_rss_mb(),
        auc: curve.last().map_or(0.5, |&(_, auc)| auc),
        measure_secs: None,
        curve,
    }
}

/// `pserver train` in this process with `servers` and `workers` over `wire`.
async fn pserver(
    cfg: &LrConfig,
    (servers, workers, wire): (usize, usize, Wire),
    train: &Arc<Examples>,
    test: &Arc<Examples>,
) -> Result<Reached, BenchError> {
    let mut cfg = cfg.clone();
    cfg.job.servers = servers;
    cfg.job.workers = workers;
    cfg.transport = wire;
    let cpu0 = cpu_secs();
    let trained = train_local(
        &cfg,
        Slowdowns::default(),
        Arc::clone(train),
        Arc::clone(test),
        |_| {},
    )
    .await?;
    let cpu = cpu_secs().zip(cpu0).map(|(b, a)| b - a);
    let rows: usize = trained.reports.iter().map(|r| r.rows).sum();
    // The steps alone, as the floor's time leaves out its AUC; the measurement of the model
    // after each epoch is reported apart.
    let secs: f64 = trained.reports.iter().map(|r| r.train_secs).sum();
    let epoch_secs: f64 = trained.reports.iter().map(|r| r.epoch_secs).sum();
    Ok(Reached {
        rows_per_sec: rows as f64 / secs.max(1e-9),
        epochs: trained
            .reports
            .iter()
            .map(|r| r.rows as f64 / r.train_secs.max(1e-9))
            .collect(),
        measure_secs: Some((epoch_secs - secs).max(0.0) / trained.reports.len().max(1) as f64),
        cpu_secs_per_mrow: cpu.map(|c| c / rows.max(1) as f64 * 1e6),
        peak_rss_mb: peak_rss_mb(),
        auc: trained.reports.last().map_or(0.5, |r| r.test_auc),
        curve: trained
            .reports
            .iter()
            .scan(0.0, |secs, r| {
                *secs += r.train_secs;
                Some((*secs, r.test_auc))
            })
            .collect(),
    })
}

/// Loaded runs of VW and of 2 + 2 in the contention measure.
const CONTENDED_PAIRS: usize = 3;

/// A busy loop on a thread per core, the competing load of a shared machine, until dropped.
struct Busy {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn on_every_core() -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..cores)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Busy { stop, threads }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// How a `pserver train` process runs.
#[derive(Clone, Copy, Debug)]
enum Run {
    /// With these servers and workers, its rows held.
    Nodes(usize, usize),
    /// With its default nodes, its training and test files read a part at a time.
    Streamed,
}

/// `pserver train` as a process of its own, as a user runs it, for one epoch on the files in
/// `dir` (of `rows` training rows) with `how` (its nodes, streaming), measured from outside.
fn process(dir: &Path, how: Run, rows: usize) -> Result<Reached, BenchError> {
    let exe = std::env::current_exe()?;
    let os = |s: &str| OsString::from(s);
    let mut args = vec![
        os("train"),
        os("--data"),
        dir.join("train.svm").into_os_string(),
        os("--test"),
        dir.join("test.svm").into_os_string(),
        os("--index-base"),
        os("0"),
        os("--epochs"),
        os("1"),
    ];
    match how {
        Run::Nodes(servers, workers) => args.extend([
            os("--servers"),
            os(&servers.to_string()),
            os("--workers"),
            os(&workers.to_string()),
        ]),
        Run::Streamed => args.push(os("--stream")),
    }
    let (secs, cpu, peak, out) =
        child::run(&[exe.into_os_string()], &args, &dir.join("train.log"))?;
    let line = out
        .lines()
        .find(|l| l.starts_with("iter=1 "))
        .ok_or_else(|| BenchError::Inexact(format!("pserver train printed no epoch: {out}")))?;
    let auc: f64 = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("test_auc="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| BenchError::Inexact(format!("no test_auc in {line}")))?;
    Ok(Reached::one_pass(rows, secs, cpu, peak, auc))
}

/// Runs the training measures on the generated problem of `size` and then on the
/// text-shaped one. Each way of training reports its own peak RSS, over the data every way
/// shares (generated and parsed before).
pub(super) async fn run_train_bench(
    size: TrainSize,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let quick = size.rows < 100_000;
    run_shape(size, emit).await?;
    run_shape(TrainSize::text(quick), emit).await
}

/// The training measures on one generated problem.
async fn run_shape(size: TrainSize, emit: &mut impl FnMut(Measure)) -> Result<(), BenchError> {
    let dir = Scratch::new("train")?;
    let (train, test) = data_in(size, Some(&dir.0), emit)?;
    let (train, test) = (Arc::new(train), Arc::new(test));
    let prefix = size.prefix();
    let cfg = LrConfig {
        epochs: size.epochs,
        // In file order, as the floor: the generated rows are in random order already.
        shuffle: false,
        ..LrConfig::default()
    };
    let own_peaks = reset_peak_rss();
    if let Some(mb) = peak_rss_mb() {
        emit(Measure {
            name: format!("train.{prefix}data_rss"),
            value: mb,
            unit: "MB",
        });
    }
    // Where the peak cannot be reset, it is the process's so far: no way's own.
    let own = |mut r: Reached| {
        if !own_peaks {
            r.peak_rss_mb = None;
        }
        r
    };
    let floor = own(floor(&cfg, &train, &test));
    emit_reached(&format!("{prefix}floor"), &floor, emit);
    let vw = match vw::command() {
        Some(command) => match vw::reached(&command, &train, &test) {
            Ok(reached) => {
                let vs_floor = reached.rows_per_sec / floor.rows_per_sec;
                emit_reached(&format!("{prefix}vw"), &reached, emit);
                emit_ratio(&format!("{prefix}vw"), "vs_floor", vs_floor, emit);
                Some(reached)
            }
            // A baseline that breaks is not a reason to lose pserver's figures.
            Err(e) => {
                eprintln!("vw: skipped, it failed: {e}");
                None
            }
        },
        None => {
            eprintln!(
                "vw: skipped, neither the vw command nor the vowpalwabbit Python module is installed (pip install vowpalwabbit)"
            );
            None
        }
    };
    if let Some(vw) = &vw {
        emit_reaching_vw(&format!("{prefix}floor"), &floor, vw, emit);
    }
    for (name, shape) in [
        ("mem.1s1w", (1, 1, Wire::Mem)),
        ("mem.2s2w", (2, 2, Wire::Mem)),
        ("tcp.1s1w", (1, 1, Wire::Tcp)),
    ] {
        if own_peaks {
            reset_peak_rss();
        }
        let name = format!("{prefix}{name}");
        let reached = own(pserver(&cfg, shape, &train, &test).await?);
        emit_reached(&name, &reached, emit);
        emit_ratio(
            &name,
            "vs_floor",
            reached.rows_per_sec / floor.rows_per_sec,
            emit,
        );
        if let Some(vw) = &vw {
            emit_ratio(&name, "vs_vw", reached.rows_per_sec / vw.rows_per_sec, emit);
            emit_reaching_vw(&name, &reached, vw, emit);
        }
    }
    // Streamed runs with the defaults; their peak is set against the file's size, which it
    // must not follow.
    let file_mb = std::fs::metadata(dir.0.join("train.svm"))?.len() as f64 / f64::from(1 << 20);
    let mut two = None;
    for (name, how) in [
        ("process.1s1w", Run::Nodes(1, 1)),
        ("process.2s2w", Run::Nodes(2, 2)),
        ("process.stream", Run::Streamed),
    ] {
        let name = format!("{prefix}{name}");
        let reached = process(&dir.0, how, train.len())?;
        emit_reached(&name, &reached, emit);
        if let Some(vw) = &vw {
            emit_ratio(&name, "vs_vw", reached.rows_per_sec / vw.rows_per_sec, emit);
            if let (Some(cpu), Some(vw_cpu)) = (reached.cpu_secs_per_mrow, vw.cpu_secs_per_mrow) {
                emit_ratio(&name, "cpu_vs_vw", cpu / vw_cpu, emit);
            }
        }
        match how {
            Run::Streamed => {
                if let Some(mb) = reached.peak_rss_mb {
                    emit_ratio(&name, "rss_vs_file", mb / file_mb, emit);
                }
            }
            Run::Nodes(2, 2) => two = Some(reached),
            Run::Nodes(..) => {}
        }
    }
    // Under contention, on the click shape: VW and 2 + 2 again while every core also runs
    // a busy loop, each slowdown its loaded time over its quiet one; the median of three
    // pairs, as one loaded run moves with the scheduler by tens of percent.
    if let (Shape::Click, Some(vw), Some(two), Some(command)) =
        (size.shape, &vw, &two, vw::command())
    {
        let slowdown = |quiet: &Reached, loaded: &Reached| quiet.rows_per_sec / loaded.rows_per_sec;
        let mut pairs = Vec::new();
        for _ in 0..CONTENDED_PAIRS {
            let busy = Busy::on_every_core();
            let vw_loaded = vw::reached(&command, &train, &test)?;
            let two_loaded = process(&dir.0, Run::Nodes(2, 2), train.len())?;
            drop(busy);
            pairs.push((slowdown(vw, &vw_loaded), slowdown(two, &two_loaded)));
        }
        pairs.sort_by(|a, b| (a.1 / a.0).total_cmp(&(b.1 / b.0)));
        let (vw_slowdown, two_slowdown) = pairs[pairs.len() / 2];
        emit_ratio("contended.vw", "slowdown", vw_slowdown, emit);
        emit_ratio("contended.process.2s2w", "slowdown", two_slowdown, emit);
        emit_ratio(
            "contended.process.2s2w",
            "slowdown_vs_vw",
            two_slowdown / vw_slowdown,
            emit,
        );
    }
    if let Some(mb) = peak_rss_mb().filter(|_| !own_peaks) {
        emit(Measure {
            name: format!("train.{prefix}peak_rss"),
            value: mb,
            unit: "MB",
        });
    }
    Ok(())
}

fn emit_ratio(name: &str, what: &str, value: f64, emit: &mut impl FnMut(Measure)) {
    emit(Measure {
        name: format!("train.{name}.{what}"),
        value,
        unit: "ratio",
    });
}

/// The training measures as a table: one row per way of training, each rate with its ratio
/// to the floor and to VW.
pub(super) fn print_table(measures: &[Measure]) {
    let get = |way: &str, what: &str| {
        let name = format!("train.{way}.{what}");
        measures.iter().find(|m| m.name == name).map(|m| m.value)
    };
    let show =
        |x: Option<f64>, digits: usize| x.map_or("-".to_owned(), |x| format!("{x:.digits$}"));
    println!();
    println!(
        "{:<18} {:>10} {:>9} {:>7} {:>11} {:>8} {:>9} {:>9} {:>12}",
        "way",
        "rows/s",
        "vs floor",
        "vs VW",
        "CPU s/Mrow",
        "peak MB",
        "AUC ep 1",
        "test AUC",
        "to VW's AUC"
    );
    let ways = [
        "floor",
        "vw",
        "mem.1s1w",
        "mem.2s2w",
        "tcp.1s1w",
        "process.1s1w",
        "process.2s2w",
        "process.stream",
    ];
    for way in ways
        .iter()
        .map(|w| w.to_string())
        .chain(ways.iter().map(|w| format!("text.{w}")))
    {
        let way = way.as_str();
        let Some(rate) = get(way, "rows_per_sec") else {
            continue;
        };
        let shape = if way.starts_with("text.") {
            "text."
        } else {
            ""
        };
        let (floor, vw) = (
            get(&format!("{shape}floor"), "rows_per_sec"),
            get(&format!("{shape}vw"), "rows_per_sec"),
        );
        let reach = match (
            get(way, "epochs_to_vw_auc"),
            get(way, "secs_to_vw_auc_vs_vw"),
        ) {
            (Some(epochs), Some(ratio)) => format!("ep {epochs:.0}, {ratio:.2}x"),
            _ => "-".to_owned(),
        };
        println!(
            "{:<18} {:>10.0} {:>9} {:>7} {:>11} {:>8} {:>9} {:>9} {:>12}",
            way,
            rate,
            show(floor.map(|f| rate / f), 3),
            show(vw.map(|v| rate / v), 3),
            show(get(way, "cpu_secs_per_mrow"), 2),
            show(get(way, "peak_rss"), 0),
            show(get(way, "epoch1.test_auc").or(get(way, "test_auc")), 4),
            show(get(way, "test_auc"), 4),
            reach,
        );
    }
}
