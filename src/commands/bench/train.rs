//! `pserver bench --train`: training throughput, next to a floor measured in the same run.
//!
//! The floor is the same update rule (FTRL-Proximal with the job's rates, the intercept exempt
//! from regularization) over the same rows in the same minibatches, in one thread, with the
//! weights in a flat array: no parameter server at all. Every pserver figure reads as a ratio
//! to it. Parsing is timed apart, and is in no rows/s figure. Vowpal Wabbit, when installed,
//! trains one pass over the same rows in the same run (its figure includes its own parsing,
//! which it does on a thread of its own).

use std::sync::Arc;
use std::time::Instant;

use pserver_core::{Key, KvPairs, UpdateRule};

use super::reached::Reached;
use super::usage::{cpu_secs, peak_rss_mb, reset_peak_rss};
use super::{BenchError, Measure, runtime_err, vw};
use crate::apps::lr::{BIAS_KEY, LrConfig, Slowdowns, Wire, evaluate, train_local};
use crate::data::libsvm::{Examples, IndexBase, parse};
use crate::data::synthetic::{GenConfig, write};

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
            }
        } else {
            TrainSize {
                rows: 500_000,
                test_rows: 50_000,
                features: 1 << 22,
                epochs: 3,
            }
        }
    }
}

/// Generates and parses the training and test sets; emits the parse time.
pub(super) fn data(
    size: TrainSize,
    emit: &mut impl FnMut(Measure),
) -> Result<(Examples, Examples), BenchError> {
    let text = |rows: u64, first_row: u64| -> Result<Vec<u8>, BenchError> {
        let cfg = GenConfig {
            rows,
            features: size.features,
            first_row,
            seed: 1,
            ..GenConfig::default()
        };
        let mut out = Vec::new();
        write(&cfg, &mut out).map_err(runtime_err)?;
        Ok(out)
    };
    let (train, test) = (text(size.rows, 0)?, text(size.test_rows, size.rows)?);
    let began = Instant::now();
    let train = parse("train", &train, IndexBase::Zero).map_err(runtime_err)?;
    let secs = began.elapsed().as_secs_f64();
    let test = parse("test", &test, IndexBase::Zero).map_err(runtime_err)?;
    emit(Measure {
        name: "train.parse.rows_per_sec".into(),
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
    put("test_auc".into(), r.auc, "auc");
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
    let (cpu0, began) = (cpu_secs(), Instant::now());
    let batch = cfg.batch.max(1);
    let mut epochs = Vec::new();
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
        epochs.push(train.len() as f64 / epoch_began.elapsed().as_secs_f64().max(1e-9));
    }
    let secs = began.elapsed().as_secs_f64();
    let cpu = cpu_secs().zip(cpu0).map(|(b, a)| b - a);
    let (keys, weights): (Vec<Key>, Vec<f32>) = w
        .iter()
        .enumerate()
        .filter(|(_, x)| **x != 0.0)
        .map(|(k, &x)| (if k == bias { BIAS_KEY } else { k as Key }, x))
        .unzip();
    let auc = KvPairs::new(keys, weights, 1).map_or(0.5, |m| evaluate(&m, test).1);
    let rows = train.len() as f64 * f64::from(cfg.epochs);
    Reached {
        rows_per_sec: rows / secs.max(1e-9),
        epochs,
        cpu_secs_per_mrow: cpu.map(|c| c / rows * 1e6),
        peak_rss_mb: peak_rss_mb(),
        auc,
        measure_secs: None,
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
    })
}

/// Runs the training measures on a generated problem of `size`. Each way of training
/// reports its own peak RSS, over the data every way shares (generated and parsed before).
pub(super) async fn run_train_bench(
    size: TrainSize,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let (train, test) = data(size, emit)?;
    let (train, test) = (Arc::new(train), Arc::new(test));
    let cfg = LrConfig {
        epochs: size.epochs,
        // In file order, as the floor: the generated rows are in random order already.
        shuffle: false,
        ..LrConfig::default()
    };
    let own_peaks = reset_peak_rss();
    if let Some(mb) = peak_rss_mb() {
        emit(Measure {
            name: "train.data_rss".into(),
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
    emit_reached("floor", &floor, emit);
    let vw = match vw::command() {
        Some(command) => match vw::reached(&command, &train, &test) {
            Ok(reached) => {
                let vs_floor = reached.rows_per_sec / floor.rows_per_sec;
                emit_reached("vw", &reached, emit);
                emit_ratio("vw", "vs_floor", vs_floor, emit);
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
    for (name, shape) in [
        ("mem.1s1w", (1, 1, Wire::Mem)),
        ("mem.2s2w", (2, 2, Wire::Mem)),
        ("tcp.1s1w", (1, 1, Wire::Tcp)),
    ] {
        if own_peaks {
            reset_peak_rss();
        }
        let reached = own(pserver(&cfg, shape, &train, &test).await?);
        emit_reached(name, &reached, emit);
        emit_ratio(
            name,
            "vs_floor",
            reached.rows_per_sec / floor.rows_per_sec,
            emit,
        );
        if let Some(vw) = &vw {
            emit_ratio(name, "vs_vw", reached.rows_per_sec / vw.rows_per_sec, emit);
        }
    }
    if let Some(mb) = peak_rss_mb().filter(|_| !own_peaks) {
        emit(Measure {
            name: "train.peak_rss".into(),
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
        "{:<10} {:>12} {:>9} {:>7} {:>11} {:>13} {:>10} {:>9}",
        "way", "rows/s", "vs floor", "vs VW", "CPU s/Mrow", "1st/later ep", "peak MB", "test AUC"
    );
    for way in ["floor", "vw", "mem.1s1w", "mem.2s2w", "tcp.1s1w"] {
        let Some(rate) = get(way, "rows_per_sec") else {
            continue;
        };
        let (floor, vw) = (get("floor", "rows_per_sec"), get("vw", "rows_per_sec"));
        println!(
            "{:<10} {:>12.0} {:>9} {:>7} {:>11} {:>13} {:>10} {:>9}",
            way,
            rate,
            show(floor.map(|f| rate / f), 3),
            show(vw.map(|v| rate / v), 3),
            show(get(way, "cpu_secs_per_mrow"), 2),
            show(get(way, "first_epoch_vs_later"), 2),
            show(get(way, "peak_rss"), 0),
            show(get(way, "test_auc"), 4),
        );
    }
}
