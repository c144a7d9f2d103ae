//! `pserver bench --train`: training throughput, next to a floor measured in the same run.
//!
//! The floor is the same update rule (FTRL-Proximal with the job's rates, the intercept exempt
//! from regularization) over the same rows in the same minibatches, in one thread, with the
//! weights in a flat array: no parameter server at all. Every pserver figure reads as a ratio
//! to it. Parsing is timed apart, and is in no rows/s figure.

use std::time::Instant;

use pserver_core::{Key, KvPairs, UpdateRule};

use super::{BenchError, Measure, runtime_err};
use crate::apps::lr::{BIAS_KEY, LrConfig, Wire, evaluate, train_local};
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
    /// Tens of seconds in all; a few with `quick`.
    pub(super) fn new(quick: bool) -> Self {
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

/// CPU seconds this process has used (user and system), from `/proc/self/stat`; `None` where
/// there is no such file.
fn cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: the fields that follow start after its `)`.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // /proc reports in USER_HZ, 100 on every Linux.
    Some(ticks / 100.0)
}

/// The peak resident set of this process so far, in MB, from `/proc/self/status`.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Generates and parses the training and test sets; emits the parse time.
fn data(
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

/// What one way of training reached.
struct Reached {
    rows_per_sec: f64,
    cpu_secs_per_mrow: Option<f64>,
    auc: f64,
}

fn emit_reached(name: &str, r: &Reached, emit: &mut impl FnMut(Measure)) {
    emit(Measure {
        name: format!("train.{name}.rows_per_sec"),
        value: r.rows_per_sec,
        unit: "rows/s",
    });
    if let Some(cpu) = r.cpu_secs_per_mrow {
        emit(Measure {
            name: format!("train.{name}.cpu_secs_per_mrow"),
            value: cpu,
            unit: "s",
        });
    }
    emit(Measure {
        name: format!("train.{name}.test_auc"),
        value: r.auc,
        unit: "auc",
    });
}

/// The floor: FTRL over a flat weight array in one thread, minibatch by minibatch in file
/// order, each step the mean gradient of its rows, as a worker pushes it.
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
    for _ in 0..cfg.epochs {
        for from in (0..train.len()).step_by(batch) {
            let rows = from..(from + batch).min(train.len());
            let n = rows.len() as f32;
            for r in rows {
                let (idx, val) = train.row(r);
                let z: f64 = f64::from(w[bias])
                    + idx
                        .iter()
                        .zip(val)
                        .map(|(&k, &v)| f64::from(w[k as usize]) * f64::from(v))
                        .sum::<f64>();
                let p = 1.0 / (1.0 + (-z.clamp(-35.0, 35.0)).exp());
                let g = (p - f64::from(train.labels()[r])) as f32 / n;
                for (&k, &v) in idx.iter().zip(val) {
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
        cpu_secs_per_mrow: cpu.map(|c| c / rows * 1e6),
        auc,
    }
}

/// `pserver train` in this process with `servers` and `workers` over `wire`.
async fn pserver(
    cfg: &LrConfig,
    (servers, workers, wire): (usize, usize, Wire),
    train: &Examples,
    test: &Examples,
) -> Result<Reached, BenchError> {
    let mut cfg = cfg.clone();
    cfg.job.servers = servers;
    cfg.job.workers = workers;
    cfg.transport = wire;
    let cpu0 = cpu_secs();
    let trained = train_local(&cfg, train.clone(), test.clone(), |_| {}).await?;
    let cpu = cpu_secs().zip(cpu0).map(|(b, a)| b - a);
    let rows: usize = trained.reports.iter().map(|r| r.rows).sum();
    // Per epoch: the test measurement after it counts, as in the floor's AUC it does not.
    let secs: f64 = trained.reports.iter().map(|r| r.epoch_secs).sum();
    Ok(Reached {
        rows_per_sec: rows as f64 / secs.max(1e-9),
        cpu_secs_per_mrow: cpu.map(|c| c / rows.max(1) as f64 * 1e6),
        auc: trained.reports.last().map_or(0.5, |r| r.test_auc),
    })
}

/// Runs the training measures on a generated problem of `size`.
pub(super) async fn run_train_bench(
    size: TrainSize,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let (train, test) = data(size, emit)?;
    let cfg = LrConfig {
        epochs: size.epochs,
        // In file order, as the floor: the generated rows are in random order already.
        shuffle: false,
        ..LrConfig::default()
    };
    let floor = floor(&cfg, &train, &test);
    emit_reached("floor", &floor, emit);
    for (name, shape) in [
        ("mem.1s1w", (1, 1, Wire::Mem)),
        ("mem.2s2w", (2, 2, Wire::Mem)),
        ("tcp.1s1w", (1, 1, Wire::Tcp)),
    ] {
        let reached = pserver(&cfg, shape, &train, &test).await?;
        emit_reached(name, &reached, emit);
        emit(Measure {
            name: format!("train.{name}.vs_floor"),
            value: reached.rows_per_sec / floor.rows_per_sec.max(1e-9),
            unit: "ratio",
        });
    }
    if let Some(mb) = peak_rss_mb() {
        emit(Measure {
            name: "train.peak_rss".into(),
            value: mb,
            unit: "MB",
        });
    }
    Ok(())
}
