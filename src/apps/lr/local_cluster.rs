//! A training run in one process: the boot of a local cluster (over the in-memory transport,
//! or TCP or UDP on loopback), a task per worker running the worker loop on its shares, and the
//! epochs they report collected into one [`Trained`]. `pserver train`, the benchmarks and the
//! end-to-end tests train through [`train_local`] and [`train_local_until`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use pserver_runtime::{ClusterSpec, LocalCluster, RuntimeError, WorkerHandle};
use pserver_transport::mem::MemNetwork;
use pserver_transport::tcp::Secret;
use tokio::sync::mpsc;

use super::config::{LrConfig, Wire, config_error};
use super::epochs::{EpochReport, Epochs, Trained, WorkerMessage};
use super::pace::PaceWatch;
use super::slowdown::{Slowdowns, Transient};
use super::stream::{StreamedFile, WindowReader};
use super::test_rows::TestRows;
use super::worker::{
    MeasureSpec, MeasuredModel, Rows, RowsTrained, WorkerEpoch, WorkerRun, run_shares, whole_shares,
};
use crate::apps::loopback::{self, Bound, Sockets};
use crate::data::libsvm::Examples;

/// A secret made for this run, which no other process knows.
fn run_secret() -> Secret {
    use std::hash::{BuildHasher, Hasher};
    let state = std::collections::hash_map::RandomState::new();
    let secret: Vec<u8> = (0..4u64)
        .flat_map(|i| {
            let mut h = state.build_hasher();
            h.write_u64(i);
            h.finish().to_le_bytes()
        })
        .collect();
    Secret::new(secret)
}

/// The training rows of a run: held in memory, or read from a file a window at a time.
#[derive(Clone)]
pub(crate) enum TrainRows {
    /// Every row, parsed.
    Memory(Arc<Examples>),
    /// A file streamed through (`pserver train --stream`).
    Stream(Arc<StreamedFile>),
}

impl TrainRows {
    /// Rows an epoch trains: those held, or the streamed file's but those it holds out.
    pub(crate) fn len(&self) -> usize {
        match self {
            TrainRows::Memory(rows) => rows.len(),
            TrainRows::Stream(file) => file.trained_rows(),
        }
    }
}

impl From<Examples> for TrainRows {
    fn from(rows: Examples) -> Self {
        TrainRows::Memory(Arc::new(rows))
    }
}

impl From<Arc<Examples>> for TrainRows {
    fn from(rows: Arc<Examples>) -> Self {
        TrainRows::Memory(rows)
    }
}

impl From<StreamedFile> for TrainRows {
    fn from(file: StreamedFile) -> Self {
        TrainRows::Stream(Arc::new(file))
    }
}

/// How a run's workers find their training rows: in memory, with the permutation of them
/// dealt into shares, or in a streamed file.
#[derive(Clone)]
enum Dealt {
    Memory {
        train: Arc<Examples>,
        dealt: Arc<Vec<usize>>,
    },
    Stream(Arc<StreamedFile>),
}

/// A run's rows, shared by its workers: training rows, test rows and validation rows.
#[derive(Clone)]
struct RunData {
    train: Dealt,
    test: Arc<TestRows>,
    validation: Option<Arc<TestRows>>,
}

async fn run_worker(
    cfg: LrConfig,
    handle: WorkerHandle<f32>,
    RunData {
        train,
        test,
        validation,
    }: RunData,
    messages: mpsc::UnboundedSender<WorkerMessage>,
    counter: RowsTrained,
    (slowdown, transient): (f64, Option<Transient>),
) -> Result<(), RuntimeError> {
    let (rows, dimensions) = match &train {
        Dealt::Memory { train, .. } => (train.len(), train.dimensions()),
        Dealt::Stream(file) => (file.rows(), file.dimensions()),
    };
    let steps = cfg.share_rows(rows).div_ceil(cfg.share_batch());
    let run = WorkerRun {
        measure: MeasureSpec {
            test: Some(&*test),
            validation: validation.as_deref(),
            model: true,
            keys_below: Some(dimensions.max(test.dimensions())),
        },
        counter: Some(&counter),
        slowdown,
        transient,
    };
    let report = |e: WorkerEpoch| {
        let _ = messages.send(WorkerMessage::Loss {
            epoch: e.epoch,
            loss: e.loss,
            rows: e.rows,
            pulled_ahead: e.pulled_ahead,
            train_secs: e.train_secs,
            skipped_rows: e.skipped_rows,
            batches: e.batches,
        });
        if let Some(MeasuredModel {
            test: Some((test_logloss, test_auc)),
            validation,
            nnz,
            weights,
        }) = e.model
        {
            let _ = messages.send(WorkerMessage::Model {
                epoch: e.epoch,
                test_logloss,
                validation_logloss: validation,
                test_auc,
                nnz,
                weights,
            });
        }
    };
    match train {
        Dealt::Memory { train, dealt } => {
            let per = cfg.share_rows(train.len());
            let rows_of = |share: usize| {
                let share = (share * per).min(train.len())..((share + 1) * per).min(train.len());
                Ok((train.clone(), dealt[share].to_vec()))
            };
            run_shares(&cfg, &handle, whole_shares(rows_of), steps, run, report).await
        }
        Dealt::Stream(file) => {
            let window_steps = file.window_steps(&cfg);
            let mut reader = WindowReader::new(file);
            let rows = Rows {
                of: |share, window| reader.window(share, window),
                window_steps,
            };
            run_shares(&cfg, &handle, rows, steps, run, report).await
        }
    }
}

/// The epochs a resumed job's checkpoint holds: the iteration it resumed from, in epochs of
/// `steps` iterations (0 for a job that starts from the beginning).
async fn epochs_done(cluster: &LocalCluster<f32>, steps: usize) -> Result<u32, RuntimeError> {
    let Some(worker) = cluster.workers.first() else {
        return Ok(0);
    };
    worker.ready().await?;
    let Some(cut) = worker.resumed_from().await? else {
        return Ok(0);
    };
    let cut = cut as usize;
    if cut % steps != 0 {
        return Err(config_error(format!(
            "the checkpoint was taken before iteration {cut}, which starts no epoch of this run \
             ({steps} iterations each): resume with the data, --workers and --batch that wrote it"
        )));
    }
    Ok((cut / steps) as u32)
}

/// Trains on `train` in one process over the in-memory transport, measuring on `test` after
/// every epoch, its workers slowed as `slowdowns` says (not at all by default); `on_epoch`
/// sees each report as it is made.
pub(crate) async fn train_local(
    cfg: &LrConfig,
    slowdowns: Slowdowns,
    train: impl Into<TrainRows>,
    test: impl Into<TestRows>,
    on_epoch: impl FnMut(&EpochReport),
) -> Result<Trained, RuntimeError> {
    let counter = RowsTrained::default();
    train_local_until(
        cfg,
        slowdowns,
        train,
        test,
        &counter,
        on_epoch,
        std::future::pending(),
    )
    .await
}

/// Splits the rows that choose the epoch kept and when to stop out of `train`, as
/// `cfg.validation` says, so that the test rows decide neither.
fn held_out(
    cfg: &LrConfig,
    train: Arc<Examples>,
) -> Result<(Arc<Examples>, Option<Arc<Examples>>), RuntimeError> {
    let Some(fraction) = cfg.validation else {
        return Ok((train, None));
    };
    let (rest, held) = train.hold_out(fraction, crate::seeded::mix(cfg.seed ^ 0x7a1d));
    if rest.is_empty() || held.is_empty() {
        return Err(config_error(format!(
            "holding out {fraction} of the {} training rows to choose the epoch leaves none to {}: give more rows, another --validation-fraction, or --keep last",
            train.len(),
            if rest.is_empty() {
                "train on"
            } else {
                "choose with"
            }
        )));
    }
    Ok((Arc::new(rest), Some(Arc::new(held))))
}

/// [`train_local`], ending early when `stop` completes (Ctrl-C, say): the result then holds the
/// epochs finished so far, and the model of the last of them.
/// `counter` counts the rows trained as training goes.
pub(crate) async fn train_local_until(
    cfg: &LrConfig,
    slowdowns: Slowdowns,
    train: impl Into<TrainRows>,
    test: impl Into<TestRows>,
    counter: &RowsTrained,
    mut on_epoch: impl FnMut(&EpochReport),
    stop: impl Future<Output = ()>,
) -> Result<Trained, RuntimeError> {
    let began = Instant::now();
    // Shared, never copied: a run holds one copy of the rows, however many runs share it.
    let (train, test): (TrainRows, Arc<TestRows>) = (train.into(), Arc::new(test.into()));
    // `rows` lays out the steps of an epoch; `trained` is what an epoch trains of them.
    let (train, rows, trained, dimensions, validation) = match train {
        TrainRows::Memory(train) => {
            let (train, validation) = held_out(cfg, train)?;
            // Shares are contiguous runs of a seeded permutation of the rows: each holds a
            // fair sample of a file sorted by label (or by anything else), not one end of it.
            // The permutation is what is dealt; the rows themselves are not copied.
            let mut dealt: Vec<usize> = (0..train.len()).collect();
            if cfg.shuffle {
                crate::seeded::shuffle(&mut dealt, crate::seeded::mix(cfg.seed ^ 0x5a17));
            }
            let (rows, dimensions) = (train.len(), train.dimensions());
            let dealt = Arc::new(dealt);
            let validation = validation.map(|rows| Arc::new(TestRows::Held(rows)));
            (
                Dealt::Memory { train, dealt },
                rows,
                rows,
                dimensions,
                validation,
            )
        }
        TrainRows::Stream(file) => {
            if cfg.validation.is_some() {
                return Err(config_error(
                    "--stream: a streamed file holds no rows out to choose the epoch yet: leave out --validation-fraction, or train without --stream",
                ));
            }
            // Rows held out to test on keep their places in the windows, untrained.
            let (rows, trained) = (file.rows(), file.trained_rows());
            let dimensions = file.dimensions();
            (Dealt::Stream(file), rows, trained, dimensions, None)
        }
    };
    let mut spec = ClusterSpec::of(cfg.protocol_job());
    spec.initial = cfg.initial.clone();
    // A checkpoint after every epoch: a resumed run starts where an epoch begins.
    let steps = cfg.share_rows(rows).div_ceil(cfg.share_batch()).max(1);
    if cfg.checkpoints.is_some() {
        spec.job.checkpoint_every = steps as pserver_core::Iteration;
    }
    spec.checkpoints = cfg.checkpoints.clone();
    spec.runtime.resume = cfg.resume;
    // Every node lives and dies with this one process: a replica on a server beside its
    // primary would survive nothing its primary does not, and would double the model's memory
    // and the servers' work. A run survives a crash through its checkpoints.
    spec.job.ring.replicas = 0;
    // The job's keys are the data's features: the ring spreads them over every server, where
    // over the whole 64-bit key space they would all fall to one.
    if spec.job.ring.key_space == u64::MAX {
        spec.job.ring.key_space = dimensions.max(test.dimensions()).max(1);
    }
    // Held pulls wait for the slowest worker; never declare a busy worker dead for that, nor
    // take a coordinator whose loop is as busy for a silent one.
    spec.job.timing.heartbeat_timeout = Duration::from_secs(60).as_nanos() as u64;
    spec.job.timing.coordinator_timeout = spec.job.timing.heartbeat_timeout;
    // Stragglers are told and dealt with at failure checks: a run of seconds needs them a few
    // times a second, not every tenth of one.
    if spec.job.stragglers.detect.is_some() {
        let often = Duration::from_millis(10).as_nanos() as u64;
        spec.job.timing.heartbeat_interval = spec.job.timing.heartbeat_interval.min(often);
    }
    let network = MemNetwork::reliable();
    let sockets = match cfg.transport {
        Wire::Mem => None,
        Wire::Tcp => Some(Sockets::Tcp),
        Wire::Udp => Some(Sockets::Udp),
    };
    let bound = match sockets {
        None => None,
        Some(sockets) => Some(
            loopback::bind(&spec, sockets, "train", &run_secret(), 0.0)
                .await
                .map_err(config_error)?,
        ),
    };
    let cluster: LocalCluster<f32> = match &bound {
        None => LocalCluster::start(&spec, &network)?,
        Some(transports) => LocalCluster::start_over(&spec, |id| {
            transports
                .get(&id)
                .map(Bound::shared)
                .ok_or_else(|| config_error(format!("no transport for {id}")))
        })?,
    };
    let bytes_sent = || match &bound {
        None => network.stats().bytes_sent,
        Some(transports) => transports.values().map(Bound::bytes_sent).sum(),
    };
    let done = epochs_done(&cluster, steps).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let data = RunData {
        train,
        test: test.clone(),
        validation,
    };
    // A worker that fails says so at once: the others may be waiting for it at a consistency
    // bound, and would wait for ever.
    let (failed_tx, mut failed) = mpsc::unbounded_channel::<usize>();
    let mut tasks: Vec<_> = cluster
        .workers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let slowdown = slowdowns.factor_of(i);
            let transient = slowdowns.transient_of(i, cfg.job.workers, cfg.seed);
            let worker = run_worker(
                cfg.clone(),
                h.clone(),
                data.clone(),
                tx.clone(),
                counter.clone(),
                (slowdown, transient),
            );
            let failed_tx = failed_tx.clone();
            tokio::spawn(async move {
                let result = worker.await;
                if result.is_err() {
                    let _ = failed_tx.send(i);
                }
                result
            })
        })
        .collect();
    drop((tx, failed_tx));
    let mut epochs = Epochs::new(cfg, trained).after(done);
    let pace = PaceWatch::new(&cluster, &spec.job);
    let mut stop = std::pin::pin!(stop);
    loop {
        let message = tokio::select! {
            message = rx.recv() => message,
            Some(worker) = failed.recv() => {
                for (i, t) in tasks.iter().enumerate() {
                    if i != worker {
                        t.abort();
                    }
                }
                let failure = tasks.swap_remove(worker).await;
                drop(cluster);
                return Err(match failure {
                    Ok(Err(e)) => e,
                    _ => RuntimeError::ShutDown,
                });
            }
            () = &mut stop => {
                // Workers may be waiting on each other at a consistency bound: end them all at
                // once rather than one by one.
                for t in &tasks {
                    t.abort();
                }
                drop(cluster);
                epochs.pace = pace.read();
                return epochs.trained();
            }
        };
        let Some(message) = message else {
            break;
        };
        epochs.note(message);
        while let Some(report) = epochs.next_report(began, bytes_sent()) {
            on_epoch(report);
        }
        if let Some(patience) = cfg.early_stop
            && epochs.since_best() >= patience
        {
            for t in &tasks {
                t.abort();
            }
            drop(cluster);
            epochs.pace = pace.read();
            epochs.filters = pace.filter_savings();
            epochs.stopped_early = Some(epochs.reports.len() as u32);
            return epochs.trained();
        }
    }
    for t in tasks {
        t.await.map_err(|_| RuntimeError::ShutDown)??;
    }
    cluster.shutdown().await?;
    epochs.pace = pace.read();
    epochs.filters = pace.filter_savings();
    epochs.trained()
}
