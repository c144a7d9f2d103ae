//! `pserver bench checkpoint`: what a whole-job checkpoint costs (ARCHITECTURE.md §11), each
//! figure next to its baseline measured in the same run.
//!
//! - A server holding a model of about `--mb` megabytes (1 GiB by default: FTRL weights and
//!   their two values of state) writes a checkpoint: the time from the workers' advance into
//!   the cut to its completion (the shards taken from the store, encoded, written, flushed to
//!   the disk, renamed, and the cut recorded by the coordinator), next to `cp` of the file it
//!   wrote and `cp` followed by a flush of the copy (the checkpoint flushes), on the same
//!   disk; three rounds of the three, the medians reported. Also how long the workers were
//!   held at the cut: until the server took its copy, not until it was written. Then the job
//!   is started again from the checkpoint, with the default heartbeat timeout: the time until
//!   the server serves the model again, which must be the model written.
//! - Training with a checkpoint after every epoch (`pserver train --checkpoint-dir`'s
//!   default) next to the same training without, on `bench train`'s generated problem, in
//!   `--rounds` pairs of runs whose order alternates: the median of each's times, and the
//!   slowdown as the median of the pairs' ratios.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use pserver_core::{Key, KvPairs};
use pserver_runtime::{ClusterSpec, LocalCluster};
use pserver_transport::mem::MemNetwork;

use super::stragglers::median;
use super::train::{TrainSize, data};
use super::{BenchError, Measure, runtime_err};
use crate::apps::lr::{LrConfig, Slowdowns, train_local};

/// Checkpoints of the model written, each next to `cp` of it: the medians are reported.
const WRITES: usize = 3;

/// Bytes a key's row takes in a checkpoint of FTRL rows: the key (consecutive keys, a byte
/// each as the wire encodes them), its weight and its two values of state.
const BYTES_PER_ROW: u64 = 1 + 4 + 8;

/// Measures a checkpoint of a model of about `mb` megabytes in `dir`, and training with and
/// without a checkpoint after every epoch (`rounds` runs of each, alternating).
pub(super) async fn run_checkpoint_bench(
    mb: u64,
    dir: &Path,
    (size, rounds): (TrainSize, usize),
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let scratch = dir.join(format!("pserver-bench-checkpoint-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| runtime_err(format!("{}: {e}", scratch.display())))?;
    let result = async {
        write_model(mb, &scratch, emit).await?;
        // The model's files go before training is timed: gigabytes of their pages in the
        // page cache, and the kernel reclaiming them, would weigh on the runs that write.
        let _ = std::fs::remove_dir_all(scratch.join("model"));
        training(size, rounds, &scratch, emit).await
    }
    .await;
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// One server holding about `mb` megabytes of FTRL rows writes one checkpoint; then `cp`.
async fn write_model(
    mb: u64,
    dir: &Path,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let rows = (mb << 20) / BYTES_PER_ROW;
    let keys: Vec<Key> = (0..rows).collect();
    let values: Vec<f64> = (0..rows).map(|k| (k % 1000) as f64 * 1e-3 - 0.5).collect();
    let initial = KvPairs::new(keys, values, 1).map_err(runtime_err)?;
    let mut spec = ClusterSpec::new(1, 1);
    spec.job.ring.replicas = 0;
    spec.job.ring.key_space = rows.max(1);
    spec.job.updater = LrConfig::default().job.updater;
    spec.job.checkpoint_every = 1;
    // Loading a model this size takes the server longer than the default heartbeat timeout
    // (ARCHITECTURE.md §11 says why): measured here is the checkpoint, not that.
    spec.job.timing.heartbeat_timeout = std::time::Duration::from_secs(600).as_nanos() as u64;
    spec.job.timing.coordinator_timeout = spec.job.timing.heartbeat_timeout;
    spec.initial = Some(Arc::new(initial));
    spec.checkpoints = Some(dir.join("model"));
    let cluster: LocalCluster<f32> =
        LocalCluster::start(&spec, &MemNetwork::reliable()).map_err(runtime_err)?;
    let worker = &cluster.workers[0];
    worker.ready().await.map_err(runtime_err)?;
    // Answered once the server holds the model: the time below is the checkpoint's alone.
    let probe = pserver_core::KeySelection::Keys(
        pserver_core::KeyList::new(vec![0, rows / 2, rows.saturating_sub(1)])
            .map_err(runtime_err)?,
    );
    let before = worker.pull(probe.clone()).await.map_err(runtime_err)?;
    let mut recorded = cluster
        .metrics_receiver(pserver_core::NodeId(0))
        .ok_or_else(|| runtime_err("the cluster has no coordinator"))?;
    // Each round a checkpoint (the workers advance into the next cut, and go on once the
    // server took its copy; the coordinator records the cut once it is written), then `cp` of
    // the file it wrote and `cp` with a flush, side by side: this disk's speed moves between
    // runs.
    let copy = dir.join("copy.bin");
    let (mut writes, mut pauses, mut cps, mut cps_synced) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..WRITES {
        let began = Instant::now();
        let cut = worker.advance().await.map_err(runtime_err)?;
        pauses.push(began.elapsed().as_secs_f64());
        recorded
            .wait_for(|m| m.checkpoint >= cut)
            .await
            .map_err(|_| runtime_err("the coordinator stopped before the checkpoint"))?;
        writes.push(began.elapsed().as_secs_f64());
        let written = newest_checkpoint(&spec.checkpoints_of(pserver_core::NodeId(1)))?;
        bytes = std::fs::metadata(&written).map_err(runtime_err)?.len();
        cps.push(timed(|| run("cp", &[&written, &copy]))?);
        std::fs::remove_file(&copy).map_err(runtime_err)?;
        cps_synced.push(timed(|| {
            run("cp", &[&written, &copy])?;
            std::fs::File::open(&copy).and_then(|f| f.sync_all())?;
            Ok(())
        })?);
        std::fs::remove_file(&copy).map_err(runtime_err)?;
    }
    cluster.shutdown().await.map_err(runtime_err)?;
    let first = writes[0];
    let pause = median(pauses);
    let (secs, cp, cp_synced) = (median(writes), median(cps), median(cps_synced));
    // The job started again from the checkpoint, with the default heartbeat timeout: until
    // the server serves the model again.
    spec.initial = None;
    spec.runtime.resume = true;
    spec.job.timing = pserver_core::Timing::default();
    let began = Instant::now();
    let cluster: LocalCluster<f32> =
        LocalCluster::start(&spec, &MemNetwork::reliable()).map_err(runtime_err)?;
    let worker = &cluster.workers[0];
    let after = worker.pull(probe).await.map_err(runtime_err)?;
    let restore = began.elapsed().as_secs_f64();
    cluster.shutdown().await.map_err(runtime_err)?;
    if after != before {
        return Err(runtime_err(format!(
            "the model read back from the checkpoint is not the one written: {before:?} then {after:?}"
        ))
        .into());
    }
    emit_each(
        emit,
        &[
            (
                "checkpoint.model.bytes",
                bytes as f64 / f64::from(1 << 20),
                "MiB",
            ),
            ("checkpoint.write.secs", secs, "s"),
            ("checkpoint.workers_held.secs", pause, "s"),
            ("checkpoint.write.first.secs", first, "s"),
            ("checkpoint.cp.secs", cp, "s"),
            ("checkpoint.cp_and_flush.secs", cp_synced, "s"),
            ("checkpoint.write_vs_cp", secs / cp.max(1e-9), "x"),
            (
                "checkpoint.write_vs_cp_and_flush",
                secs / cp_synced.max(1e-9),
                "x",
            ),
            (
                "checkpoint.write_first_vs_cp_and_flush",
                first / cp_synced.max(1e-9),
                "x",
            ),
            ("checkpoint.restore.secs", restore, "s"),
        ],
    );
    Ok(())
}

/// The newest checkpoint file server 1 wrote (their names order them).
fn newest_checkpoint(dir: &Option<PathBuf>) -> Result<PathBuf, BenchError> {
    let dir = dir
        .as_ref()
        .ok_or_else(|| runtime_err("no checkpoint directory"))?;
    std::fs::read_dir(dir)
        .map_err(runtime_err)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .max()
        .ok_or_else(|| runtime_err(format!("{}: no checkpoint written", dir.display())).into())
}

fn run(program: &str, args: &[&Path]) -> Result<(), BenchError> {
    let status = std::process::Command::new(program)
        .args(args)
        .status()
        .map_err(|e| runtime_err(format!("{program}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(runtime_err(format!("{program}: {status}")).into())
    }
}

fn timed(f: impl FnOnce() -> Result<(), BenchError>) -> Result<f64, BenchError> {
    let began = Instant::now();
    f()?;
    Ok(began.elapsed().as_secs_f64())
}

/// Training on the generated problem with and without a checkpoint after every epoch, in
/// pairs of runs whose order alternates (so that whatever the first run of a pair leaves the
/// second, such as memory to reclaim or pages to write back, falls on each side alike): the
/// medians of the wall times, and the median of each pair's ratio.
async fn training(
    size: TrainSize,
    rounds: usize,
    dir: &Path,
    emit: &mut impl FnMut(Measure),
) -> Result<(), BenchError> {
    let (train, test) = data(size, emit)?;
    let (train, test) = (Arc::new(train), Arc::new(test));
    let cfg = LrConfig {
        epochs: size.epochs,
        ..LrConfig::default()
    };
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for checkpoints in order {
            let mut cfg = cfg.clone();
            if checkpoints {
                cfg.checkpoints = Some(dir.join(format!("train-{round}")));
            }
            let began = Instant::now();
            let trained = train_local(
                &cfg,
                Slowdowns::default(),
                Arc::clone(&train),
                Arc::clone(&test),
                |_| {},
            )
            .await?;
            let secs = began.elapsed().as_secs_f64();
            if trained.reports.len() != size.epochs as usize {
                return Err(runtime_err("a training run ended early").into());
            }
            if checkpoints { &mut with } else { &mut without }.push(secs);
        }
    }
    let slowdown = median(with.iter().zip(&without).map(|(a, b)| a / b).collect());
    let (without, with) = (median(without), median(with));
    emit_each(
        emit,
        &[
            ("checkpoint.train.without.secs", without, "s"),
            ("checkpoint.train.every_epoch.secs", with, "s"),
            ("checkpoint.train.slowdown", slowdown, "x"),
        ],
    );
    Ok(())
}

/// Emits each `(name, value, unit)`.
fn emit_each(emit: &mut impl FnMut(Measure), measures: &[(&str, f64, &'static str)]) {
    for &(name, value, unit) in measures {
        emit(Measure {
            name: name.into(),
            value,
            unit,
        });
    }
}
