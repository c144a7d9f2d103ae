//! `pserver coordinator | server | worker` (one node per process, over TCP) and `pserver local`
//! (a whole cluster in one process, over the in-memory transport).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use pserver_core::store::Store;
use pserver_core::{Consistency, Driver, Key, KeyRange, KvPairs, NodeId, Role, Updater, Value};
use pserver_runtime::{
    ClusterSpec, LocalCluster, NodeHandle, NodeReport, RuntimeError, Spawned, WorkerHandle,
    spawn_node,
};
use pserver_transport::TransportError;
use pserver_transport::mem::{MemFaults, MemNetwork};
use pserver_transport::tcp::TcpTransport;
use pserver_transport::udp::UdpTransport;
use pserver_transport::{Address, Transport};

use super::cluster_file::ProcessWire;
use super::values::output_file;
use thiserror::Error;

use super::cluster_file::{ClusterFile, ClusterFileError, Job, LrJob, MfJob};
use super::metrics::{Sources, TransportCounters};
use super::script::{Script, WorkerSummary};
use super::signals::Stop;
use crate::apps::lr::{
    MeasureSpec, Rows, ShareRows, StreamedFile, StreamedTest, TestRows, WindowReader, WorkerRun,
    base_for_init, load_model, run_shares, save_model, whole_shares,
};
use crate::apps::mf;
use crate::apps::mf_file::{load_mf, save_mf};
use crate::data::libsvm::{
    DataError, Examples, IndexBase, Labels, count_rows, held_out, holds_rows, is_row, lines_before,
    max_index, no_examples, parse_lines, parse_part, parse_whole, read_bytes, shard,
};
use std::collections::BTreeMap;

/// Why a node or a local cluster could not run. Each is one line a user can act on; the CLI
/// exits with status 2 for them.
#[derive(Debug, Error)]
pub(crate) enum RunError {
    /// The cluster file is missing, malformed or incomplete.
    #[error(transparent)]
    ClusterFile(#[from] ClusterFileError),
    /// The transport could not start (a port in use, say).
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// The worker never received a configuration.
    #[error(
        "could not join the cluster: no configuration from the coordinator at {address} within {secs}s{why}; is it running, are all nodes of {file} started, and is the secret the same?"
    )]
    JoinTimeout {
        /// The coordinator's address.
        address: String,
        /// How long the worker waited.
        secs: u64,
        /// The cluster file.
        file: String,
        /// Why the coordinator could not be reached, if the transport knows: ` (cannot
        /// resolve ...)`.
        why: String,
    },
    /// The node stopped with an error.
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    /// The training data could not be read.
    #[error("{0}")]
    Data(String),
    /// The metrics endpoint could not listen.
    #[error("cannot serve metrics at {address}: {why}")]
    Metrics {
        /// The address asked for.
        address: String,
        /// Why.
        why: String,
    },
    /// SIGINT or SIGTERM stopped the worker, which left the job first.
    #[error("{}", .0.word())]
    Stopped(Stop),
    /// The job lost key ranges with their holders, and does not allow it.
    #[error(
        "the job lost {}: every server holding them failed before they were copied (more failures than the ring's replicas), and their values started again from zero; set allow_loss = true in the job to accept this",
        lost_list(.0)
    )]
    Lost(Vec<KeyRange>),
}

/// `ranges` as a reader takes them in.
fn lost_list(ranges: &[KeyRange]) -> String {
    let shown: Vec<String> = ranges.iter().take(8).map(ToString::to_string).collect();
    let more = ranges.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let noun = if ranges.len() == 1 {
        "key range"
    } else {
        "key ranges"
    };
    format!("{noun} {}{tail}", shown.join(", "))
}

/// What a process-mode node did, for its last line of output.
#[derive(Debug)]
pub(crate) enum NodeOutcome {
    /// The coordinator stopped.
    Coordinator(Ended),
    /// A server stopped; per key index of the script, the total it holds.
    Server {
        /// Totals per key index (zero for keys it does not own).
        totals: Vec<i64>,
        /// Messages it refused.
        refused: u64,
        /// Why it stopped.
        ended: Ended,
    },
    /// A worker finished its script.
    Worker(WorkerSummary),
    /// A server of an lr or mf job stopped.
    ModelServer {
        /// Rows it held as a primary.
        rows: usize,
        /// Of which non-zero.
        nonzero: usize,
        /// Messages it refused.
        refused: u64,
        /// Why it stopped.
        ended: Ended,
    },
    /// A worker finished training.
    Trained {
        /// Epochs done.
        epochs: u32,
    },
}

/// A node started over TCP, with its configuration in force.
struct Started<V: Value> {
    role: Role,
    spawned: Spawned<V, Updater, Store<V>>,
    transport: NodeTransport,
    /// The metrics endpoint, if the node serves one.
    metrics: Option<super::metrics::Endpoint>,
}

/// The transport a node process runs over, as its cluster file names it.
enum NodeTransport {
    Tcp(Arc<TcpTransport>),
    Udp(Arc<UdpTransport>),
}

impl NodeTransport {
    async fn bind(file: &ClusterFile, id: NodeId) -> Result<Self, RunError> {
        Ok(match file.transport {
            ProcessWire::Tcp => {
                NodeTransport::Tcp(Arc::new(TcpTransport::bind(file.tcp(id)?).await?))
            }
            ProcessWire::Udp => {
                NodeTransport::Udp(Arc::new(UdpTransport::bind(file.udp(id)?).await?))
            }
        })
    }

    fn shared(&self) -> Arc<dyn Transport> {
        match self {
            NodeTransport::Tcp(t) => Arc::clone(t) as Arc<dyn Transport>,
            NodeTransport::Udp(t) => Arc::clone(t) as Arc<dyn Transport>,
        }
    }

    /// The transport's counters, for the metrics endpoint.
    fn counters(&self) -> TransportCounters {
        match self {
            NodeTransport::Tcp(t) => {
                let t = Arc::clone(t);
                Arc::new(move || {
                    let s = t.stats();
                    vec![
                        (
                            "tcp_connections_established",
                            "Connections whose handshake succeeded",
                            s.connections_established,
                        ),
                        (
                            "tcp_handshakes_refused",
                            "Connections refused: wrong secret, cluster, version or node, garbage, timeout",
                            s.handshakes_refused,
                        ),
                        (
                            "tcp_frames_received",
                            "Frames received from authenticated peers",
                            s.frames_received,
                        ),
                        (
                            "tcp_frames_sent",
                            "Frames written to a connection",
                            s.frames_sent,
                        ),
                        (
                            "tcp_frames_dropped",
                            "Frames dropped because a peer's queue was full",
                            s.frames_dropped,
                        ),
                        (
                            "tcp_bytes_sent",
                            "Bytes of the frames written",
                            s.bytes_sent,
                        ),
                        (
                            "tcp_bad_framing_closes",
                            "Connections closed for breaking the framing",
                            s.bad_framing_closes,
                        ),
                    ]
                })
            }
            NodeTransport::Udp(t) => {
                let t = Arc::clone(t);
                Arc::new(move || {
                    let s = t.stats();
                    vec![
                        (
                            "udp_datagrams_sent",
                            "Datagrams handed to the socket",
                            s.sent,
                        ),
                        ("udp_datagrams_received", "Datagrams received", s.received),
                        (
                            "udp_unknown_source",
                            "Datagrams refused: from outside the peer table, or naming another sender",
                            s.unknown_source,
                        ),
                        (
                            "udp_bad_mac",
                            "Datagrams refused: their MAC did not verify",
                            s.bad_mac,
                        ),
                        (
                            "udp_refused",
                            "Datagrams the reassembler refused",
                            s.refused,
                        ),
                        (
                            "udp_frames_received",
                            "Frames put back together and delivered",
                            s.frames,
                        ),
                        (
                            "udp_incomplete_frames_dropped",
                            "Incomplete frames dropped: a fragment timed out, or newer frames needed the room",
                            s.incomplete_dropped,
                        ),
                    ]
                })
            }
        }
    }

    /// Why each peer that cannot be reached now cannot.
    fn unreachable(&self) -> BTreeMap<NodeId, String> {
        match self {
            NodeTransport::Tcp(t) => t.unreachable(),
            NodeTransport::Udp(t) => t.unreachable(),
        }
    }

    fn local_addr(&self) -> std::net::SocketAddr {
        match self {
            NodeTransport::Tcp(t) => t.local_addr(),
            NodeTransport::Udp(t) => t.local_addr(),
        }
    }

    async fn shutdown(&self) {
        match self {
            NodeTransport::Tcp(t) => t.shutdown().await,
            NodeTransport::Udp(t) => t.shutdown(),
        }
    }
}

/// Binds node `id`'s port, starts its event loop and, for servers and workers, waits until
/// the job has started.
async fn start<V: Value + Send + Sync>(
    file: &ClusterFile,
    id: NodeId,
    options: &NodeOptions,
    keys_below: Option<Key>,
    initial: Option<Arc<KvPairs<f64>>>,
) -> Result<Started<V>, RunError> {
    let join_timeout = options.join_timeout;
    let role = file.role(id)?;
    let transport = NodeTransport::bind(file, id).await?;
    let mut spec = file.spec.within(transport.shared().flow_limits());
    spec.job.keys_below = keys_below;
    spec.initial = initial;
    let driver: Driver<V> = spec.driver(id)?;
    tracing::info!(%id, %role, address = %transport.local_addr(), "listening");
    let mut runtime = file.spec.runtime.clone();
    runtime.checkpoints = options.checkpoints.clone();
    runtime.resume = options.resume;
    let spawned = spawn_node(driver, transport.shared(), runtime);
    // The file's address for this node's endpoint, unless the command line gives one.
    let serve_at = options
        .metrics
        .or_else(|| file.metrics.get(&id).map(Address::listen));
    let metrics = match serve_at {
        Some(addr) => {
            let sources = Sources {
                id,
                role,
                node: spawned.node.metrics_receiver(),
                transport: transport.counters(),
            };
            let served = super::metrics::serve(addr, sources);
            Some(served.map_err(|e| RunError::Metrics {
                address: addr.to_string(),
                why: e.to_string(),
            })?)
        }
        None => None,
    };
    if role != Role::Coordinator
        && tokio::time::timeout(join_timeout, spawned.node.ready())
            .await
            .is_err()
    {
        let coordinator = file.spec.job.layout().coordinator();
        let why = transport
            .unreachable()
            .remove(&coordinator)
            .map_or_else(String::new, |why| format!(" ({why})"));
        return Err(RunError::JoinTimeout {
            why,
            address: file
                .addresses
                .get(&coordinator)
                .map_or_else(String::new, ToString::to_string),
            secs: join_timeout.as_secs(),
            file: file.path.display().to_string(),
        });
    }
    Ok(Started {
        role,
        spawned,
        transport,
        metrics,
    })
}

/// How a node process runs, besides what its cluster file says.
#[derive(Clone, Debug)]
pub(crate) struct NodeOptions {
    /// Servers and workers give up if the job has not started after this long.
    pub join_timeout: Duration,
    /// Serve `/healthz` and `/metrics` here.
    pub metrics: Option<std::net::SocketAddr>,
    /// The coordinator and servers keep serving after the job finished.
    pub serve_forever: bool,
    /// How long a server asked to stop by SIGTERM waits to be out of the job.
    pub leave_timeout: Duration,
    /// A server's whole-job checkpoint directory.
    pub checkpoints: Option<PathBuf>,
    /// A server offers its checkpoints, so that the job resumes from them.
    pub resume: bool,
}

/// Runs node `id` of the cluster file until it is done (a worker) or told to stop by SIGINT or
/// SIGTERM (the coordinator and servers).
pub(crate) async fn run_node(
    file: &ClusterFile,
    id: NodeId,
    options: &NodeOptions,
) -> Result<NodeOutcome, RunError> {
    match &file.job {
        Job::Script => run_script_node(file, id, options).await,
        Job::Lr(job) => run_lr_node(file, job, id, options).await,
        Job::Mf(job) => run_mf_node(file, job, id, options).await,
    }
}

async fn run_script_node(
    file: &ClusterFile,
    id: NodeId,
    options: &NodeOptions,
) -> Result<NodeOutcome, RunError> {
    let Started {
        role,
        spawned,
        transport,
        metrics,
    } = start::<i64>(file, id, options, None, None).await?;
    let outcome = match (role, spawned.worker) {
        (Role::Worker, Some(worker)) => {
            let script = async {
                let done = |it| tracing::info!(iteration = it + 1, "iteration done");
                Ok(file.script.run_reporting(id, &worker, done).await?)
            };
            NodeOutcome::Worker(work_then_leave(spawned.node, &worker, file, script).await?)
        }
        (Role::Server, _) => {
            let (report, ended) = serve(spawned.node, role, options).await?;
            NodeOutcome::Server {
                totals: server_totals(&report, &file.script),
                refused: report.refusals.total(),
                ended,
            }
        }
        _ => {
            let (_, ended) = serve(spawned.node, role, options).await?;
            NodeOutcome::Coordinator(ended)
        }
    };
    if let Some(endpoint) = metrics {
        endpoint.stop();
    }
    transport.shutdown().await;
    Ok(outcome)
}

/// Any worker of an lr job may come to hold the first share and save: each checks at once
/// that it could.
fn can_save(job: &LrJob) -> Result<(), DataError> {
    match &job.save {
        Some(path) => output_file(&path.display().to_string())
            .map(drop)
            .map_err(|why| DataError {
                path: path.display().to_string(),
                line: 0,
                column: 0,
                message: format!("cannot save the model there: {why}"),
            }),
        None => Ok(()),
    }
}

/// What a logistic-regression worker reads before it joins: the training file's text, its
/// own share of the rows, the steps every worker takes per epoch, and the test set.
struct LrData {
    name: String,
    /// Every key of the training and test rows lies below this, which the worker tells the
    /// coordinator so that a ring given no key space is spread over the data's features.
    keys_below: Option<Key>,
    workers: usize,
    text: Vec<u8>,
    base: IndexBase,
    /// How the files' labels read.
    labels: Labels,
    shares: BTreeMap<usize, Arc<Examples>>,
    steps: usize,
    test: Option<Examples>,
    /// The fraction of the file's rows held out of training and the seed that draws them.
    held: Option<(f64, u64)>,
    /// The held-out rows of the whole file, which choose the epoch saved.
    validation: Option<Examples>,
}

impl LrData {
    /// Reads the files of `job` for worker `index`, deciding the index base over the training
    /// and test files as `pserver train` does.
    fn read(job: &LrJob, index: usize, base: IndexBase) -> Result<LrData, DataError> {
        let name = job.data.display().to_string();
        can_save(job)?;
        let text = read_bytes(&job.data)?;
        if !holds_rows(&text) {
            return Err(no_examples(name));
        }
        let test = match &job.test {
            Some(path) => Some((path.display().to_string(), read_bytes(path)?)),
            None => None,
        };
        let files = std::iter::once((name.as_str(), &text[..]))
            .chain(test.iter().map(|(n, t)| (n.as_str(), &t[..])));
        let (base, _) = base.resolve(files)?;
        // Keys count from 0: a one-based file's index i is key i - 1.
        let largest = std::iter::once(&text[..])
            .chain(test.iter().map(|(_, t)| &t[..]))
            .filter_map(max_index)
            .max();
        let keys_below = largest.map(|i| {
            let key = if base == IndexBase::One {
                i.saturating_sub(1)
            } else {
                i
            };
            key.saturating_add(1)
        });
        let workers = job.cfg.job.workers.max(1);
        // Every worker counts the rows of every share alike, so all take the same number of
        // steps: enough for the largest share, whatever the lengths of its lines.
        let steps = (0..workers)
            .map(|s| count_rows(&text[shard(&text, s, workers)]))
            .max()
            .unwrap_or(0)
            .div_ceil(job.cfg.batch.max(1));
        let test = match test {
            Some((test_name, test_text)) => {
                Some(parse_whole(&test_name, &test_text, base, job.labels)?)
            }
            None => None,
        };
        let held = job.cfg.validation.map(|f| (f, job.cfg.seed));
        // Any worker may come to hold the first share and measure: each draws the held-out
        // rows of the whole file, as `pserver train` draws them from its rows.
        let validation = match held {
            Some((fraction, seed)) => {
                // Only the held rows are parsed: the worker's own rows are its share's.
                let (mut held, mut rows) = (Examples::new(), 0);
                for (number, line) in text.split(|&b| b == b'\n').enumerate() {
                    if !is_row(line) {
                        continue;
                    }
                    if held_out(rows, fraction, seed) {
                        let one_based = base == IndexBase::One;
                        parse_part(&mut held, &name, line, one_based, job.labels, number)?;
                    }
                    rows += 1;
                }
                if held.is_empty() || held.len() == rows {
                    // No rows to choose with: every epoch would measure a loss of 0.
                    return Err(DataError {
                        path: name,
                        line: 0,
                        column: 0,
                        message: format!(
                            "holding out job.validation_fraction {fraction} of its {rows} rows to choose the epoch saved leaves none to {}: give more rows, another fraction, or validation_fraction = 0",
                            if held.is_empty() {
                                "choose with"
                            } else {
                                "train on"
                            }
                        ),
                    });
                }
                Some(held)
            }
            None => None,
        };
        let mut data = LrData {
            name,
            keys_below,
            workers,
            text,
            base,
            labels: job.labels,
            shares: BTreeMap::new(),
            steps,
            test,
            held,
            validation,
        };
        data.share(index)?;
        Ok(data)
    }

    /// The rows of share `share`, parsed on first use, and which of them are trained: all but
    /// those held out for validation.
    fn share(&mut self, share: usize) -> Result<ShareRows, DataError> {
        let range = shard(&self.text, share, self.workers);
        let rows = match self.shares.get(&share) {
            Some(rows) => rows.clone(),
            None => {
                let before = lines_before(&self.text, range.start);
                let rows = Arc::new(parse_lines(
                    &self.name,
                    &self.text[range.clone()],
                    self.base,
                    before,
                    self.labels,
                )?);
                self.shares.insert(share, rows.clone());
                rows
            }
        };
        let trained = match self.held {
            Some((fraction, seed)) => {
                // A row's place in the whole file, which draws it in or out.
                let first = count_rows(&self.text[..range.start]);
                (0..rows.len())
                    .filter(|r| !held_out(first + r, fraction, seed))
                    .collect()
            }
            None => (0..rows.len()).collect(),
        };
        Ok((rows, trained))
    }
}

/// What a logistic-regression worker trains on: the file held, or streamed.
enum LrInput {
    /// The training file's text held, its shares parsed as they are needed.
    Held(LrData),
    /// The training file read a window of a share at a time (`job.stream`).
    Streamed(StreamedLr),
}

impl LrInput {
    fn keys_below(&self) -> Option<Key> {
        match self {
            LrInput::Held(data) => data.keys_below,
            LrInput::Streamed(data) => Some(data.keys_below),
        }
    }
}

/// What a worker of a streamed logistic-regression job reads before it joins: the training
/// file counted (every line parsed), and its test and validation rows, read again from their
/// files a part at a time whenever the model is measured. Shares are runs of the file's rows
/// (`crate::apps::lr::StreamedFile`), not byte ranges as [`LrData`]'s are, so that each worker
/// reads only the windows of the shares it trains.
struct StreamedLr {
    keys_below: Key,
    base: IndexBase,
    steps: usize,
    window_steps: usize,
    reader: WindowReader,
    test: Option<TestRows>,
    validation: Option<TestRows>,
    /// Whether the worker's own shares include the first.
    holds_first: bool,
}

impl StreamedLr {
    /// Reads the files of `job` for worker `index`, deciding the index base over the training
    /// and test files as `pserver train` does, and reading windows of `window` rows.
    fn read(
        job: &LrJob,
        index: usize,
        base: IndexBase,
        window: usize,
    ) -> Result<StreamedLr, DataError> {
        can_save(job)?;
        let files = std::iter::once(job.data.as_path()).chain(job.test.as_deref());
        let (base, _) = base.resolve_files(files)?;
        let one_based = base == IndexBase::One;
        let held = job.cfg.validation.map(|f| (f, job.cfg.seed));
        let file = StreamedFile::open(&job.data, one_based, job.labels, &job.cfg, window, held)?;
        let validation = match held {
            Some((fraction, seed)) => {
                let rows = StreamedTest::held(&job.data, one_based, job.labels, (fraction, seed));
                let rows = rows.map_err(|mut e| {
                    e.message = format!("job.validation_fraction: {}", e.message);
                    e
                })?;
                Some(TestRows::Streamed(rows))
            }
            None => None,
        };
        let test = match &job.test {
            Some(path) => Some(TestRows::Streamed(StreamedTest::open(
                path, one_based, job.labels,
            )?)),
            None => None,
        };
        let keys_below = test
            .iter()
            .map(TestRows::dimensions)
            .fold(file.dimensions(), u64::max)
            .max(1);
        Ok(StreamedLr {
            keys_below,
            base,
            steps: job
                .cfg
                .share_rows(file.rows())
                .div_ceil(job.cfg.share_batch()),
            window_steps: file.window_steps(&job.cfg),
            reader: WindowReader::new(Arc::new(file)),
            test,
            validation,
            holds_first: index == 0,
        })
    }
}

/// A logistic-regression node. A worker reads the byte range of the training file that is its
/// share (cut at line boundaries), trains on it, and prints one line per epoch; whoever holds
/// the first share also measures the whole model on the test file and saves it. A worker
/// handed the share of a worker that died or left reads that share's rows too, and trains on
/// both from then on; if that share is the first, it measures and saves from then on.
async fn run_lr_node(
    file: &ClusterFile,
    job: &LrJob,
    id: NodeId,
    options: &NodeOptions,
) -> Result<NodeOutcome, RunError> {
    let layout = file.spec.job.layout();
    let index = layout.workers().position(|w| w == id);
    // The model to start from: its rows for a server, its index base for a worker.
    let init = match &job.init {
        Some(path) if index.is_some() || layout.servers().any(|s| s == id) => {
            let model = load_model(path).map_err(RunError::Data)?;
            let base = base_for_init(path, model.base, job.index_base, "job.index_base")
                .map_err(RunError::Data)?;
            Some((model, base))
        }
        _ => None,
    };
    let base = init.as_ref().map_or(job.index_base, |(_, base)| *base);
    let initial = init
        .filter(|_| index.is_none())
        .map(|(model, _)| Arc::new(model.rows(job.cfg.bias)));
    // Read before joining, so that a bad file is reported at once.
    let data = match index {
        Some(index) => {
            let read = match job.window {
                None => LrData::read(job, index, base).map(LrInput::Held),
                Some(window) => StreamedLr::read(job, index, base, window).map(LrInput::Streamed),
            };
            Some(read.map_err(|e| RunError::Data(e.to_string()))?)
        }
        None => None,
    };
    let keys_below = data.as_ref().and_then(LrInput::keys_below);
    let train = async |worker: &WorkerHandle<f32>, mut data: LrInput| {
        train_lr_worker(job, id, worker, &mut data).await
    };
    run_model_node(file, id, options, (data, initial), keys_below, train).await
}

async fn run_mf_node(
    file: &ClusterFile,
    job: &MfJob,
    id: NodeId,
    options: &NodeOptions,
) -> Result<NodeOutcome, RunError> {
    let layout = file.spec.job.layout();
    let is_worker = layout.workers().any(|w| w == id);
    let is_server = layout.servers().any(|s| s == id);
    if let Some(path) = job.save.as_ref().filter(|_| is_worker)
        && let Err(why) = output_file(&path.display().to_string())
    {
        return Err(RunError::Data(format!(
            "{}: cannot save the model there: {why}",
            path.display()
        )));
    }
    let init = match &job.init {
        Some(path) if is_worker || is_server => {
            Some((path, load_mf(path).map_err(RunError::Data)?))
        }
        _ => None,
    };
    // Read before joining, so that a bad file is reported at once; every worker reads every
    // rating, so that users and items are numbered alike everywhere, and so does every server
    // of a job that starts from a model, to find its users and items.
    let data = if is_worker || (is_server && init.is_some()) {
        let read = mf::load(
            &job.data,
            job.test.as_deref(),
            job.test_fraction,
            job.cfg.seed,
            "job.test_fraction",
        );
        Some(read.map_err(RunError::Data)?)
    } else {
        None
    };
    let mut data = data;
    let initial = match (&init, data.as_mut()) {
        (Some((path, model)), Some(data)) => {
            let rows = mf::initial_rows(&job.cfg, model, &data.ids)
                .map_err(|e| RunError::Data(format!("{}: {e}", path.display())))?;
            // The biases were learnt around the saved mean: predictions stay around it.
            data.center = Some(model.mean);
            Some(Arc::new(rows)).filter(|_| is_server)
        }
        _ => None,
    };
    let data = data.filter(|_| is_worker);
    let keys_below = data.as_ref().map(mf::keys_below);
    let train = async |worker: &WorkerHandle<f32>, data: mf::MfData| {
        train_mf_worker(job, id, worker, &data).await
    };
    run_model_node(file, id, options, (data, initial), keys_below, train).await
}

/// Runs node `id` of a job that trains a model of f32 rows: a worker trains on `data` (read
/// before joining, its keys all below `keys_below`) with `train` and leaves the job; a server
/// holds the model's rows until the job ends; the coordinator serves.
async fn run_model_node<D>(
    file: &ClusterFile,
    id: NodeId,
    options: &NodeOptions,
    (data, initial): (Option<D>, Option<Arc<KvPairs<f64>>>),
    keys_below: Option<Key>,
    train: impl AsyncFnOnce(&WorkerHandle<f32>, D) -> Result<u32, RunError>,
) -> Result<NodeOutcome, RunError> {
    let Started {
        role,
        spawned,
        transport,
        metrics,
    } = start::<f32>(file, id, options, keys_below, initial).await?;
    let outcome = match (role, spawned.worker, data) {
        (Role::Worker, Some(worker), Some(data)) => {
            let training = train(&worker, data);
            let epochs = work_then_leave(spawned.node, &worker, file, training).await?;
            NodeOutcome::Trained { epochs }
        }
        (Role::Server, _, _) => {
            let (report, ended) = serve(spawned.node, role, options).await?;
            let (rows, nonzero) = model_server_summary(&report);
            NodeOutcome::ModelServer {
                rows,
                nonzero,
                refused: report.refusals.total(),
                ended,
            }
        }
        _ => {
            let (_, ended) = serve(spawned.node, role, options).await?;
            NodeOutcome::Coordinator(ended)
        }
    };
    if let Some(endpoint) = metrics {
        endpoint.stop();
    }
    transport.shutdown().await;
    Ok(outcome)
}

/// Trains one worker of an mf job: every epoch, each share it holds then (its own, and those
/// of workers that died); the worker holding the first share then measures the model. Prints
/// a line per epoch; returns the epochs done.
async fn train_mf_worker(
    job: &MfJob,
    id: NodeId,
    worker: &WorkerHandle<f32>,
    data: &mf::MfData,
) -> Result<u32, RunError> {
    let cfg = &job.cfg;
    let shares = mf::Shares::of(data, cfg.workers, cfg);
    let baseline = data.baseline_rmse();
    worker.ready().await?;
    for epoch in 1..=cfg.epochs {
        let began = Instant::now();
        let mut rows = 0;
        for share in worker.shares().await? {
            mf::train_share(worker, cfg, data, shares, share, epoch).await?;
            rows += shares.ratings(data, share).len();
        }
        let secs = began.elapsed().as_secs_f64();
        let mut line = format!("worker {id} iter={epoch} rows={rows}");
        if worker.leads().await? {
            let (train, test) = mf::measure(worker, cfg, data).await?;
            line +=
                &format!(" train_rmse={train:.4} test_rmse={test:.4} baseline_rmse={baseline:.4}");
        }
        line += &format!(
            " rows_per_sec={:.0} secs={secs:.2}",
            rows as f64 / secs.max(1e-9)
        );
        println!("{line}");
    }
    if let Some(path) = &job.save
        && worker.leads().await?
    {
        let model = mf::Model::pull(worker, cfg, data).await?;
        save_mf(path, &model.file(&data.ids, data.mean())).map_err(RunError::Data)?;
    }
    Ok(cfg.epochs)
}

/// Trains one worker of an lr job, printing a line per epoch with its time and rows/s; returns
/// the epochs done.
async fn train_lr_worker(
    job: &LrJob,
    id: NodeId,
    worker: &WorkerHandle<f32>,
    data: &mut LrInput,
) -> Result<u32, RunError> {
    let config = |e: DataError| RuntimeError::Config(e.to_string());
    match data {
        LrInput::Held(data) => {
            let measured = Measured {
                test: data.test.take().map(TestRows::from),
                validation: data.validation.take().map(TestRows::from),
                keys_below: data.keys_below,
                base: data.base,
                holds_first: data.shares.contains_key(&0),
            };
            let steps = data.steps;
            let rows = whole_shares(|share| data.share(share).map_err(config));
            train_lr_rows(job, id, worker, measured, (rows, steps)).await
        }
        LrInput::Streamed(data) => {
            let measured = Measured {
                test: data.test.take(),
                validation: data.validation.take(),
                keys_below: Some(data.keys_below),
                base: data.base,
                holds_first: data.holds_first,
            };
            let reader = &mut data.reader;
            let rows = Rows {
                of: |share, window| reader.window(share, window),
                window_steps: data.window_steps,
            };
            train_lr_rows(job, id, worker, measured, (rows, data.steps)).await
        }
    }
}

/// What the worker of an lr job measures its model on, and where it saves it.
struct Measured {
    test: Option<TestRows>,
    validation: Option<TestRows>,
    keys_below: Option<Key>,
    base: IndexBase,
    /// Whether the worker holds the first share from the start, rather than taking it over.
    holds_first: bool,
}

/// [`train_lr_worker`] on `rows`, `steps` minibatches an epoch.
async fn train_lr_rows(
    job: &LrJob,
    id: NodeId,
    worker: &WorkerHandle<f32>,
    measured: Measured,
    (rows, steps): (
        Rows<impl FnMut(usize, usize) -> Result<(ShareRows, usize), RuntimeError>>,
        usize,
    ),
) -> Result<u32, RunError> {
    let Measured {
        test,
        validation,
        keys_below,
        base,
        holds_first,
    } = measured;
    // Epoch 1's time starts when the job does, not while the nodes are still joining.
    worker.ready().await?;
    // A worker that takes over the first share, or goes on from a checkpoint, starts from the
    // model saved before, so that it replaces it only with a better one.
    let took_over = !holds_first || worker.resumed_from().await?.is_some();
    let measure = MeasureSpec {
        test: test.as_ref(),
        validation: validation.as_ref(),
        model: job.save.is_some(),
        keys_below,
    };
    let mut epochs = 0;
    let mut best: Option<f64> = None;
    let mut save_failed = None;
    let mut began = Instant::now();
    let run = WorkerRun {
        measure,
        ..WorkerRun::default()
    };
    run_shares(&job.cfg, worker, rows, steps, run, |e| {
        epochs = e.epoch;
        let secs = began.elapsed().as_secs_f64();
        began = Instant::now();
        let mut line = format!(
            "worker {id} iter={} rows={} train_logloss={:.4}",
            e.epoch,
            e.rows,
            e.loss / e.rows.max(1) as f64
        );
        if let Some(model) = &e.model {
            if let Some((loss, auc)) = model.test {
                line += &format!(" test_logloss={loss:.4} test_auc={auc:.4}");
            }
            line += &format!(" nnz={}", model.nnz);
            if let Some(loss) = model.validation {
                line += &format!(" valid_logloss={loss:.4}");
            }
            // The best epoch by validation log loss, else by test log loss, or the latest
            // without either; written as soon as it is known, so that a later failure cannot
            // lose it.
            let loss = model.validation.or(model.test.map(|(loss, _)| loss));
            if took_over
                && best.is_none()
                && let Some(path) = &job.save
            {
                best = saved_loss(path, base, validation.as_ref(), test.as_ref());
            }
            let better = match (loss, best) {
                (Some(loss), _) if loss.is_nan() => false,
                (Some(loss), Some(best)) => loss < best,
                _ => true,
            };
            if let (Some(path), true) = (&job.save, better) {
                best = loss;
                if let Err(e) = save_replacing(path, &model.weights, base) {
                    save_failed.get_or_insert(e);
                }
            }
        }
        line += &format!(
            " rows_per_sec={:.0} secs={secs:.2}",
            e.rows as f64 / secs.max(1e-9)
        );
        // Never silent: rows a skip left untrained.
        if e.skipped_rows > 0 {
            line += &format!(" skipped_rows={}", e.skipped_rows);
        }
        println!("{line}");
    })
    .await?;
    match save_failed {
        Some(e) => Err(RunError::Data(e)),
        None => Ok(epochs),
    }
}

/// The log loss on the validation rows, or else the test rows, of the model saved at `path`,
/// if there is one read with `base`.
fn saved_loss(
    path: &std::path::Path,
    base: IndexBase,
    validation: Option<&TestRows>,
    test: Option<&TestRows>,
) -> Option<f64> {
    let saved = load_model(path).ok()?;
    if saved.base != base {
        return None;
    }
    let rows = validation.or(test)?;
    rows.evaluate(&saved.weights).ok().map(|(loss, _)| loss)
}

/// Writes the model to a file beside `path`, then renames it over `path`: a reader never sees
/// half a model.
fn save_replacing(
    path: &std::path::Path,
    weights: &pserver_core::KvPairs<f32>,
    base: IndexBase,
) -> Result<(), String> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    save_model(&partial, weights, base)?;
    std::fs::rename(&partial, path).map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

/// The rows a stopped server of a model held as a primary, and how many of them are non-zero.
fn model_server_summary(report: &NodeReport<Driver<f32>>) -> (usize, usize) {
    let (mut rows, mut nonzero) = (0, 0);
    if let Some(server) = report.node.node().as_server() {
        server.for_each_primary_row(&mut |_, row| {
            rows += 1;
            nonzero += usize::from(row.iter().any(|w| *w != 0.0));
        });
    }
    (rows, nonzero)
}

/// Per key index of the script, what a stopped server has applied to the ranges it is the
/// primary of (zeros for other keys, its replicas' copies included, so that the servers'
/// totals add up to the job's). Pushes received but still waiting for their iteration to close
/// (in sequential mode) do not count: a finished job has none.
pub(crate) fn server_totals(report: &NodeReport<Driver<i64>>, script: &Script) -> Vec<i64> {
    let Some(server) = report.node.node().as_server() else {
        return Vec::new();
    };
    let primary: Vec<pserver_core::KeyRange> = server
        .shards()
        .filter(|&(_, is_primary)| is_primary)
        .map(|(r, _)| r)
        .collect();
    (0..script.keys)
        .map(|k| script.key(k))
        .map(|key| {
            let served = primary.iter().any(|r| r.contains(key));
            let value = server.value(key).map_or(0, |row| row[0]);
            if served { value } else { 0 }
        })
        .collect()
}

/// How long a worker waits for the coordinator to confirm that it left the job, past the
/// runtime's drain timeout (after which it asks to leave whatever is still open).
const LEAVE_CONFIRM: Duration = Duration::from_secs(10);

/// Runs a worker's `job` to its end, or until SIGINT or SIGTERM; either way the worker then
/// leaves the job and stops. Leaving is not dying (ARCHITECTURE.md §8): the coordinator takes
/// it out at its word, never declares it dead, and gives its shares to nobody. A job that
/// failed does not leave: silent, its worker is declared dead and its shares go to the
/// workers left.
async fn work_then_leave<V: Value, T>(
    node: NodeHandle<Driver<V>>,
    worker: &WorkerHandle<V>,
    file: &ClusterFile,
    job: impl Future<Output = Result<T, RunError>>,
) -> Result<T, RunError> {
    let outcome = tokio::select! {
        done = job => done,
        stop = super::signals::stop_requested() => Err(RunError::Stopped(stop)),
    };
    if matches!(outcome, Ok(_) | Err(RunError::Stopped(_))) {
        let within = file.spec.runtime.drain_timeout + LEAVE_CONFIRM;
        match tokio::time::timeout(within, worker.leave()).await {
            Ok(Ok(())) => tracing::info!("left the job"),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not leave the job"),
            Err(_) => tracing::warn!(
                secs = within.as_secs(),
                "the coordinator did not confirm that this worker left; stopping anyway, \
                 to be declared dead in time"
            ),
        }
    }
    node.shutdown().await?;
    // A job that lost part of its values ends in failure unless it said it accepts that;
    // read after leaving, whose confirmation may be what brought the news.
    let lost = worker.lost_ranges();
    match outcome {
        Ok(_) if !lost.is_empty() && !file.allow_loss => Err(RunError::Lost(lost)),
        outcome => outcome,
    }
}

/// Why a server or the coordinator stopped without an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Every worker left, its work done, and the node was not asked to serve forever.
    JobFinished,
    /// A server asked to leave by SIGTERM is out of the job: its ranges are held elsewhere.
    Left,
    /// SIGINT, or SIGTERM on the coordinator: stopped where it was.
    Stopped(Stop),
}

/// Serves until the job finishes (unless `options.serve_forever`), or until SIGINT or
/// SIGTERM; then stops the node. SIGTERM makes a server leave the job first, so that its
/// ranges are held elsewhere and nothing acknowledged is lost, waiting at most
/// `options.leave_timeout` (ARCHITECTURE.md §8).
async fn serve<V: Value>(
    node: NodeHandle<Driver<V>>,
    role: Role,
    options: &NodeOptions,
) -> Result<(NodeReport<Driver<V>>, Ended), RunError> {
    let finished = node.job_finished();
    let finished_while_leaving = node.job_finished();
    let leave = node.leave_handle();
    let mut ended = Ended::JobFinished;
    let report = node
        .run_until(async {
            tokio::select! {
                stop = super::signals::stop_requested() => {
                    ended = Ended::Stopped(stop);
                    if stop == Stop::Terminate && role == Role::Server {
                        // The node stops by itself once it is out; this bounds the wait. A
                        // job that ends meanwhile needs the server no more.
                        leave.leave();
                        tokio::select! {
                            () = tokio::time::sleep(options.leave_timeout) => tracing::warn!(
                                secs = options.leave_timeout.as_secs(),
                                "could not leave the job in time: stopping anyway"
                            ),
                            _ = finished_while_leaving => ended = Ended::JobFinished,
                        }
                    }
                }
                _ = finished, if !options.serve_forever => {}
            }
        })
        .await?;
    if report.left {
        return Ok((report, Ended::Left));
    }
    if let Some(stalled) = report.stalled {
        return Err(RunError::Runtime(stalled));
    }
    // A fenced node ends its process: the cluster went on without it, and its id and port
    // must be free for a restart.
    if report.fenced {
        return Err(RunError::Runtime(RuntimeError::Fenced));
    }
    Ok((report, ended))
}

/// A whole cluster in one process.
#[derive(Clone, Debug)]
pub(crate) struct LocalOptions {
    /// Servers.
    pub servers: usize,
    /// Workers.
    pub workers: usize,
    /// The consistency model.
    pub consistency: Consistency,
    /// The workers' script.
    pub script: Script,
    /// Probability that the in-memory network loses a frame.
    pub drop: f64,
    /// Probability that it delivers a frame twice.
    pub dup: f64,
    /// Seed of the network's faults and the workers' jitter.
    pub seed: u64,
    /// Largest frame, in bytes.
    pub max_frame: usize,
    /// Largest slice, in bytes.
    pub max_slice_bytes: usize,
}

/// What a local run ended with.
#[derive(Debug)]
pub(crate) struct LocalOutcome {
    /// Each worker and its summary, in node order.
    pub workers: Vec<(NodeId, WorkerSummary)>,
    /// Per key index, the total over all servers.
    pub totals: Vec<i64>,
    /// Per key index, what the workers pushed.
    pub expected: Vec<i64>,
    /// Wall-clock seconds.
    pub secs: f64,
    /// Messages the nodes refused.
    pub refused: u64,
}

impl LocalOutcome {
    /// True when every server total is exactly what the workers pushed.
    pub(crate) fn exact(&self) -> bool {
        self.totals == self.expected
    }
}

/// Runs the script on a whole cluster in this process and collects the servers' totals.
pub(crate) async fn run_local(opts: &LocalOptions) -> Result<LocalOutcome, RunError> {
    let start = Instant::now();
    let mut spec = ClusterSpec::new(opts.servers, opts.workers);
    spec.job.consistency = opts.consistency;
    spec.job.seed = opts.seed;
    spec.job.max_frame = opts.max_frame;
    spec.job.max_slice_bytes = opts.max_slice_bytes;
    spec.job.max_reply_bytes = opts.max_slice_bytes;
    let faults = MemFaults::default()
        .with_drop(opts.drop)
        .with_dup(opts.dup)
        .with_seed(opts.seed);
    let network = MemNetwork::new(faults);
    let cluster: LocalCluster<i64> = LocalCluster::start(&spec, &network)?;
    let ids: Vec<NodeId> = spec.job.layout().workers().collect();
    // Drawn only on a terminal; one step per worker iteration.
    let bar = ProgressBar::new(u64::from(opts.script.iterations) * ids.len() as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {pos}/{len} worker iterations {elapsed}")
    {
        bar.set_style(style);
    }
    let runs = ids.iter().zip(&cluster.workers).map(|(&id, handle)| {
        let handle: WorkerHandle<i64> = handle.clone();
        let script = opts.script;
        let bar = bar.clone();
        tokio::spawn(async move { script.run_reporting(id, &handle, |_| bar.inc(1)).await })
    });
    let runs: Vec<_> = runs.collect();
    let mut workers = Vec::new();
    for (&id, run) in ids.iter().zip(runs) {
        let summary = run.await.map_err(|_| RuntimeError::ShutDown)??;
        workers.push((id, summary));
    }
    bar.finish_and_clear();
    let report = cluster.shutdown().await?;
    let mut totals = vec![0i64; opts.script.keys as usize];
    let mut refused = report.coordinator.refusals.total();
    for server in &report.servers {
        refused += server.refusals.total();
        for (t, v) in totals.iter_mut().zip(server_totals(server, &opts.script)) {
            *t += v;
        }
    }
    refused += report
        .workers
        .iter()
        .map(|w| w.refusals.total())
        .sum::<u64>();
    Ok(LocalOutcome {
        workers,
        expected: opts.script.expected_totals(ids),
        totals,
        secs: start.elapsed().as_secs_f64(),
        refused,
    })
}

/// Where a server writes its totals on exit, one `key_index total` line per key it holds.
pub(crate) fn dump_totals(path: &PathBuf, totals: &[i64]) -> std::io::Result<()> {
    let text: String = totals
        .iter()
        .enumerate()
        .filter(|(_, t)| **t != 0)
        .map(|(k, t)| format!("{k} {t}\n"))
        .collect();
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::lr::{LrConfig, evaluate};
    use crate::data::libsvm::parse;

    #[test]
    fn a_cluster_worker_decides_the_index_base_over_both_files_as_train_does() {
        let dir = std::env::temp_dir().join(format!("pserver-lrdata-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (train, test) = (dir.join("train.svm"), dir.join("test.svm"));
        // Zero-based, but only the test file shows it.
        std::fs::write(&train, "1 1:1 3:1\n0 2:1\n1 3:1\n0 1:1\n").unwrap();
        std::fs::write(&test, "1 0:1 1:1\n").unwrap();
        let mut cfg = LrConfig::default();
        cfg.job.workers = 2;
        let job = job_on(train.clone(), Some(test), IndexBase::Auto, cfg);
        let mut data = LrData::read(&job, 1, job.index_base).unwrap();
        assert_eq!(data.base, IndexBase::Zero);
        let text = std::fs::read(&train).unwrap();
        let whole = parse("train", &text, IndexBase::Zero).unwrap();
        let (first, _) = data.share(0).unwrap();
        let (second, _) = data.share(1).unwrap();
        assert_eq!(first.len() + second.len(), whole.len());
        assert_eq!(first.row(0), whole.row(0));
        assert_eq!(second.row(second.len() - 1), whole.row(whole.len() - 1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An lr job of `cfg` on `data` (and `test`), read with `index_base`: binary labels,
    /// nothing saved or started from.
    fn job_on(data: PathBuf, test: Option<PathBuf>, index_base: IndexBase, cfg: LrConfig) -> LrJob {
        LrJob {
            data,
            test,
            save: None,
            init: None,
            index_base,
            labels: Labels::Binary,
            window: None,
            cfg,
        }
    }

    #[test]
    fn a_job_naming_its_positive_label_reads_every_other_label_as_negative() {
        let dir = std::env::temp_dir().join(format!("pserver-positive-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (train, test) = (dir.join("train.svm"), dir.join("test.svm"));
        std::fs::write(&train, "3 1:1\n2 2:1\n1 3:1\n3 1:1\n").unwrap();
        std::fs::write(&test, "3 1:1\n2 1:1\n").unwrap();
        let mut cfg = LrConfig::default();
        cfg.job.workers = 2;
        let mut job = job_on(train, Some(test), IndexBase::One, cfg);
        job.labels = Labels::Positive(3.0);
        let mut data = LrData::read(&job, 0, IndexBase::One).unwrap();
        let mut labels = Vec::new();
        for share in 0..2 {
            let (rows, _) = data.share(share).unwrap();
            labels.extend_from_slice(rows.labels());
        }
        assert_eq!(labels, [1.0, 0.0, 0.0, 1.0]);
        assert_eq!(data.test.as_ref().unwrap().labels(), [1.0, 0.0]);
        // Without it, a third class is refused, naming its line.
        job.labels = Labels::Binary;
        let e = match LrData::read(&job, 0, IndexBase::One) {
            Ok(_) => panic!("a third class was read"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("test.svm:1:1: expected a binary label"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_validation_rows_are_those_the_whole_file_holds_out_and_no_share_trains() {
        let dir = std::env::temp_dir().join(format!("pserver-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let train = dir.join("train.svm");
        let text: String = (0..200)
            .map(|r| {
                format!(
                    "{} {}:1\n{}",
                    r % 2,
                    r + 1,
                    if r % 50 == 7 { "# note\n\n" } else { "" }
                )
            })
            .collect();
        std::fs::write(&train, &text).unwrap();
        let mut cfg = LrConfig::default();
        cfg.job.workers = 3;
        cfg.validation = Some(0.3);
        cfg.seed = 5;
        let job = job_on(train, None, IndexBase::One, cfg);
        let mut data = LrData::read(&job, 0, IndexBase::One).unwrap();
        let whole = parse("train", text.as_bytes(), IndexBase::One).unwrap();
        let (_, held) = whole.hold_out(0.3, 5);
        assert_eq!(data.validation.as_ref(), Some(&held));
        // Every row is trained by one share or held out, never both.
        let mut trained = 0;
        for share in 0..3 {
            let (rows, mine) = data.share(share).unwrap();
            trained += mine.len();
            for r in mine {
                let id = rows.row(r).ids().next().unwrap();
                assert!((0..held.len()).all(|h| held.row(h).ids().next() != Some(id)));
            }
        }
        assert_eq!(trained + held.len(), whole.len());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_job_whose_validation_draw_holds_no_row_is_refused_not_saved_from_epoch_one() {
        let dir = std::env::temp_dir().join(format!("pserver-nodraw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let train = dir.join("train.svm");
        std::fs::write(&train, "1 1:1\n0 2:1\n1 3:1\n0 1:1\n").unwrap();
        let mut cfg = LrConfig::default();
        cfg.job.workers = 2;
        cfg.validation = Some(0.001);
        let job = job_on(train, None, IndexBase::One, cfg);
        let e = match LrData::read(&job, 0, IndexBase::One) {
            Ok(_) => panic!("four rows held one out at 0.001"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("leaves none to choose with"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_worker_taking_over_the_first_share_scores_the_saved_model_it_may_replace() {
        let dir = std::env::temp_dir().join(format!("pserver-saved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let test = parse("test", b"1 1:1\n0 2:1\n", IndexBase::Zero).unwrap();
        let weights = pserver_core::KvPairs::new(vec![1, 2], vec![2.0f32, -2.0], 1).unwrap();
        let path = dir.join("model.bin");
        let held = TestRows::from(test.clone());
        assert_eq!(saved_loss(&path, IndexBase::Zero, None, Some(&held)), None);
        save_replacing(&path, &weights, IndexBase::Zero).unwrap();
        let loss = saved_loss(&path, IndexBase::Zero, None, Some(&held)).unwrap();
        assert_eq!(loss, evaluate(&weights, &test).0);
        // The validation rows choose before the test rows, and nothing without either.
        let validation = parse("valid", b"0 1:1\n", IndexBase::Zero).unwrap();
        let valid = TestRows::from(validation.clone());
        let on_validation = saved_loss(&path, IndexBase::Zero, Some(&valid), Some(&held));
        assert_eq!(on_validation, Some(evaluate(&weights, &validation).0));
        assert_ne!(on_validation, Some(loss));
        assert_eq!(saved_loss(&path, IndexBase::Zero, None, None), None);
        // A model read with another base says nothing about this job's.
        assert_eq!(saved_loss(&path, IndexBase::One, None, Some(&held)), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
