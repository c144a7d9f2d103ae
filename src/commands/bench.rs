//! `pserver bench`: push and pull throughput and small-request latency over each transport,
//! next to raw TCP baselines measured in the same run, so that every figure reads as a ratio
//! to what the machine's loopback can do.
//!
//! Every measure is one `name value unit` line; [`Measure::line`] gives it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;

use pserver_core::{Consistency, Key, KeyList, KeyRange, KeySelection, KvPairs, NodeId, RangeList};
use pserver_transport::mem::MemNetwork;
use pserver_transport::runtime::{ClusterSpec, LocalCluster, RuntimeError, WorkerHandle};
use pserver_transport::tcp::{Secret, TcpConfig, TcpTransport};
use pserver_transport::udp::{UdpConfig, UdpTransport};
use pserver_transport::{Transport, TransportError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::CliError;

/// Measure push and pull throughput and small-request latency over each transport (mem,
/// tcp, udp; one server and one worker, then two of each, on loopback), with a raw TCP
/// stream and ping-pong as baselines measured in the same run. Build with --release.
///
/// Dense requests carry contiguous keys; sparse ones 1M keys drawn from 2^40 (64K with
/// --quick); `udp_lossy` drops 0.1% of the datagrams. Every dense measure checks that the
/// servers end with exactly the pushes sent, and fails otherwise. Prints one `name value
/// unit` line per measure (GB/s of values, million keys per second, microseconds); --table
/// adds each figure's ratio to the raw TCP baseline.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Seconds instead of minutes: requests of 1K and 64K values, few repetitions (a smoke
    /// test of the benchmark itself).
    #[arg(long)]
    quick: bool,
    /// Also print a table with each figure's ratio to the raw TCP baselines.
    #[arg(long)]
    table: bool,
    /// The transports to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "mem,tcp,udp")]
    transports: Vec<Wire>,
    /// Only these dense request sizes, comma-separated (values per request); by default all
    /// of them (1K and 64K with --quick).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<DenseSize>,
    /// Only these kinds of measure, comma-separated: dense push/pull, sparse push/pull, small
    /// round trips; by default all of them. The raw TCP baselines always run.
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<Kind>,
    /// Only these cluster shapes, comma-separated (servers `s`, workers `w`); by default both.
    #[arg(long, value_delimiter = ',')]
    topologies: Vec<Topology>,
}

/// Runs `pserver bench`: prints every measure as it is known, then with `--table` the table of
/// ratios to the raw TCP baselines.
pub fn run(args: BenchArgs) -> Result<(), CliError> {
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: a debug build; benchmark figures come from `cargo run --release -- bench`"
        );
    }
    let rt = super::runtime()?;
    let opts = BenchOptions {
        quick: args.quick,
        transports: args.transports,
        sizes: args.sizes,
        kinds: args.kinds,
        topologies: args.topologies,
    };
    let measures = rt
        .block_on(run_bench(&opts, |m| println!("{}", m.line())))
        .map_err(CliError::failed)?;
    if args.table {
        print_table(&measures);
    }
    Ok(())
}

/// Every measure with its ratio to the raw TCP baseline of its unit.
fn print_table(measures: &[Measure]) {
    let base = |name: &str| {
        measures
            .iter()
            .find(|m| m.name == name)
            .map_or(f64::NAN, |m| m.value)
    };
    let (stream, ping) = (base("raw_tcp.stream"), base("raw_tcp.ping_pong.p50"));
    println!();
    println!(
        "{:<36} {:>12} {:<7} {:>10}",
        "measure", "value", "unit", "vs raw TCP"
    );
    for m in measures {
        // Key rates have no byte baseline to compare with.
        let ratio = match m.unit {
            "GB/s" => format!("{:.2}x", m.value / stream),
            "us" => format!("{:.2}x", m.value / ping),
            _ => "-".to_owned(),
        };
        println!(
            "{:<36} {:>12.4} {:<7} {:>10}",
            m.name, m.value, m.unit, ratio
        );
    }
}

/// One measured figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Measure {
    /// Dotted name, e.g. `tcp.1s1w.dense_push.1M`.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Its unit: `GB/s`, `us`, `Mkeys/s`.
    pub unit: &'static str,
}

impl Measure {
    /// The machine-readable line: `name value unit`.
    pub fn line(&self) -> String {
        format!("{} {:.4} {}", self.name, self.value, self.unit)
    }
}

// The choices of the options below have no help of their own (`help = None`), so that
// `--help` lists their names on one line after the option's own explanation.

/// A transport `pserver bench` measures.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// Channels inside the process.
    #[value(help = None)]
    Mem,
    /// Authenticated TCP connections on loopback.
    #[value(help = None)]
    Tcp,
    /// UDP datagrams on loopback.
    #[value(help = None)]
    Udp,
}

/// The size of the requests of a dense measure.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseSize {
    /// 1K values per request.
    #[value(name = "1K", help = None)]
    K1,
    /// 64K values per request.
    #[value(name = "64K", help = None)]
    K64,
    /// 1M values per request.
    #[value(name = "1M", help = None)]
    M1,
    /// 16M values per request.
    #[value(name = "16M", help = None)]
    M16,
}

impl DenseSize {
    /// Values per request.
    pub fn values(self) -> usize {
        match self {
            DenseSize::K1 => 1 << 10,
            DenseSize::K64 => 64 << 10,
            DenseSize::M1 => 1 << 20,
            DenseSize::M16 => 16 << 20,
        }
    }
}

/// A kind of measure.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Dense push and pull: contiguous keys.
    #[value(help = None)]
    Dense,
    /// Sparse push and pull: keys drawn at random from 2^40.
    #[value(help = None)]
    Sparse,
    /// Round trips of 1-key pushes, one at a time.
    #[value(help = None)]
    Rtt,
}

/// The shape of a measured cluster.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One server and one worker.
    #[value(name = "1s1w", help = None)]
    OneEach,
    /// Two servers and two workers.
    #[value(name = "2s2w", help = None)]
    TwoEach,
}

impl Topology {
    /// Servers and workers.
    fn shape(self) -> (usize, usize) {
        match self {
            Topology::OneEach => (1, 1),
            Topology::TwoEach => (2, 2),
        }
    }
}

/// How `choice` is spelled on the command line, which is how measure names spell it too.
fn spelled<T: ValueEnum>(choice: T) -> String {
    choice
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// What to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchOptions {
    /// Seconds rather than minutes: small requests only, few repetitions.
    pub quick: bool,
    /// The transports to measure, in this order.
    pub transports: Vec<Wire>,
    /// Only the dense measures of these sizes; all when empty.
    pub sizes: Vec<DenseSize>,
    /// Only these kinds of measure; all when empty.
    pub kinds: Vec<Kind>,
    /// Only these cluster shapes; both when empty.
    pub topologies: Vec<Topology>,
}

/// Whether `item` is among `only`, which stands for everything when empty.
fn wants<T: PartialEq>(only: &[T], item: T) -> bool {
    only.is_empty() || only.contains(&item)
}

/// The sizes of the dense measures: those in `only`, or by default all of them (the two
/// smallest when `quick`).
fn dense_sizes(quick: bool, only: &[DenseSize]) -> Vec<DenseSize> {
    let sizes = DenseSize::value_variants().iter().copied();
    if !only.is_empty() {
        sizes.filter(|s| only.contains(s)).collect()
    } else if quick {
        sizes.take(2).collect()
    } else {
        sizes.collect()
    }
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The cluster or a request failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A socket of the raw baselines failed.
    #[error("raw TCP baseline: {0}")]
    Io(#[from] std::io::Error),
    /// The servers did not end with exactly what was pushed.
    #[error("{0}")]
    Inexact(String),
    /// A measure did not finish in time.
    #[error("{0} did not finish within {1} s")]
    Timeout(String, u64),
}

fn runtime_err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(e.to_string())
}

/// Runs every measure, calling `report` with each as soon as it is known.
pub async fn run_bench(
    opts: &BenchOptions,
    mut report: impl FnMut(&Measure),
) -> Result<Vec<Measure>, BenchError> {
    let mut all = Vec::new();
    let mut emit = |m: Measure| {
        report(&m);
        all.push(m);
    };
    for m in raw_tcp(opts.quick).await? {
        emit(m);
    }
    for &wire in &opts.transports {
        for &topology in Topology::value_variants() {
            if !wants(&opts.topologies, topology) {
                continue;
            }
            let (servers, workers) = topology.shape();
            let mut spec = ClusterSpec::new(servers, workers);
            spec.consistency = Consistency::Eventual;
            let cluster = start(&spec, wire, 0.0).await?;
            for w in &cluster.workers {
                w.ready().await?;
            }
            let prefix = format!("{}.{}", spelled(wire), spelled(topology));
            let sizes = if wants(&opts.kinds, Kind::Dense) {
                dense_sizes(opts.quick, &opts.sizes)
            } else {
                Vec::new()
            };
            for size in sizes {
                let figures = dense(&cluster.workers, size.values(), opts.quick, &prefix).await;
                let (push, pull) = match figures {
                    Ok(figures) => figures,
                    // Reported, and the transport's larger requests are skipped: they would
                    // not finish either.
                    Err(e @ BenchError::Timeout(..)) => {
                        eprintln!("{e}: skipped, with the larger requests");
                        break;
                    }
                    Err(e) => return Err(e),
                };
                let size = spelled(size);
                for m in push_and_pull_measures(&prefix, "dense", &size, (push, pull), "GB/s") {
                    emit(m);
                }
            }
            if wants(&opts.kinds, Kind::Sparse) {
                let (keys, name) = if opts.quick {
                    (64 << 10, "64K")
                } else {
                    (1 << 20, "1M")
                };
                match sparse(&cluster.workers, keys, opts.quick, &prefix).await {
                    Ok(figures) => {
                        for m in push_and_pull_measures(&prefix, "sparse", name, figures, "Mkeys/s")
                        {
                            emit(m);
                        }
                    }
                    Err(e @ BenchError::Timeout(..)) => eprintln!("{e}: skipped"),
                    Err(e) => return Err(e),
                }
            }
            if wants(&opts.kinds, Kind::Rtt) {
                let requests = if opts.quick { 200 } else { 10_000 };
                let (p50, p99) = round_trips(&cluster.workers[0], requests).await?;
                emit(Measure {
                    name: format!("{prefix}.small_push_rtt.p50"),
                    value: p50,
                    unit: "us",
                });
                emit(Measure {
                    name: format!("{prefix}.small_push_rtt.p99"),
                    value: p99,
                    unit: "us",
                });
            }
            cluster.shutdown().await?;
        }
        let lossy_wanted =
            wants(&opts.kinds, Kind::Dense) && wants(&opts.topologies, Topology::OneEach);
        if wire == Wire::Udp && lossy_wanted {
            emit_lossy(opts, &mut emit).await?;
        }
    }
    Ok(all)
}

/// The push and the pull figure of one measure, named `{prefix}.{kind}_push.{size}` and
/// `{prefix}.{kind}_pull.{size}`.
fn push_and_pull_measures(
    prefix: &str,
    kind: &str,
    size: &str,
    (push, pull): (f64, f64),
    unit: &'static str,
) -> [Measure; 2] {
    [("push", push), ("pull", pull)].map(|(way, value)| Measure {
        name: format!("{prefix}.{kind}_{way}.{size}"),
        value,
        unit,
    })
}

/// Fraction of datagrams the lossy UDP measure drops.
const LOSSY_DROP: f64 = 0.001;

/// Dense push and pull over UDP with [`LOSSY_DROP`] of the datagrams lost: 1M values per
/// request (64K with `--quick`), every push still applied exactly once.
async fn emit_lossy(opts: &BenchOptions, emit: &mut impl FnMut(Measure)) -> Result<(), BenchError> {
    let (size, name) = if opts.quick {
        (64 << 10, "64K")
    } else {
        (1 << 20, "1M")
    };
    let mut spec = ClusterSpec::new(1, 1);
    spec.consistency = Consistency::Eventual;
    let cluster = start(&spec, Wire::Udp, LOSSY_DROP).await?;
    cluster.workers[0].ready().await?;
    let prefix = "udp_lossy.1s1w";
    match dense(&cluster.workers, size, opts.quick, prefix).await {
        Ok((push, pull)) => {
            for m in push_and_pull_measures(prefix, "dense", name, (push, pull), "GB/s") {
                emit(m);
            }
        }
        Err(e @ BenchError::Timeout(..)) => eprintln!("{e}: skipped"),
        Err(e) => return Err(e),
    }
    cluster.shutdown().await?;
    Ok(())
}

/// A cluster over `wire` on loopback.
async fn start(spec: &ClusterSpec, wire: Wire, drop: f64) -> Result<LocalCluster<f32>, BenchError> {
    if wire == Wire::Mem {
        return Ok(LocalCluster::start(spec, &MemNetwork::reliable())?);
    }
    let transports = bind_transports(spec, wire, drop)
        .await
        .map_err(runtime_err)?;
    Ok(LocalCluster::start_over(spec, |id| {
        transports
            .get(&id)
            .cloned()
            .ok_or_else(|| RuntimeError::Config(format!("no transport for {id}")))
    })?)
}

/// A transport over `wire` (TCP, else UDP) for every node of `spec`, each on its own loopback
/// port. Every socket is bound before the peer tables are built and handed to its transport
/// as it is, so no other socket can take a port in between.
async fn bind_transports(
    spec: &ClusterSpec,
    wire: Wire,
    drop: f64,
) -> Result<BTreeMap<NodeId, Arc<dyn Transport>>, TransportError> {
    enum Bound {
        Tcp(std::net::TcpListener),
        Udp(std::net::UdpSocket),
    }
    let probe = |e| TransportError::Io {
        context: "binding a loopback port".into(),
        source: e,
    };
    let mut addrs = BTreeMap::new();
    let mut bound = Vec::new();
    for id in spec.node_ids() {
        let (socket, addr) = if wire == Wire::Tcp {
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(probe)?;
            let addr = l.local_addr().map_err(probe)?;
            (Bound::Tcp(l), addr)
        } else {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").map_err(probe)?;
            let addr = s.local_addr().map_err(probe)?;
            (Bound::Udp(s), addr)
        };
        addrs.insert(id, addr);
        bound.push((id, socket));
    }
    let secret = Secret::new(b"pserver-bench".to_vec());
    let mut transports: BTreeMap<NodeId, Arc<dyn Transport>> = BTreeMap::new();
    for (id, socket) in bound {
        let t: Arc<dyn Transport> = match socket {
            Bound::Tcp(listener) => {
                let mut cfg =
                    TcpConfig::new(id, addrs[&id], addrs.clone(), "bench", secret.clone());
                cfg.max_frame = spec.max_frame + 64;
                Arc::new(TcpTransport::with_listener(cfg, listener).await?)
            }
            Bound::Udp(socket) => {
                let mut cfg = UdpConfig::new(id, addrs[&id], addrs.clone());
                cfg.limits.max_frame = spec.max_frame + 64;
                cfg.drop_outgoing = drop;
                cfg.seed = u64::from(id.0);
                Arc::new(UdpTransport::with_socket(cfg, socket).await?)
            }
        };
        transports.insert(id, t);
    }
    Ok(transports)
}

/// Dense push and pull of `size` contiguous keys by every worker, repeated; GB/s of values
/// each way, all workers together.
async fn dense(
    workers: &[WorkerHandle<f32>],
    size: usize,
    quick: bool,
    what: &str,
) -> Result<(f64, f64), BenchError> {
    let keys: Vec<Key> = (0..size as Key).collect();
    let kvs = KvPairs::new(keys, vec![1.0f32; size], 1).map_err(runtime_err)?;
    let range = KeyRange::new(0, size as Key).map_err(runtime_err)?;
    let selection = KeySelection::Ranges(RangeList::new(vec![range]).map_err(runtime_err)?);
    // The first push creates the servers' rows; the figures are for pushes into rows that
    // exist, as in training after its first step.
    workers[0].push(kvs.clone()).await?;
    let before = workers[0].pull(selection.clone()).await?;
    let (push, pull, pushes) = push_and_pull(
        workers,
        kvs,
        selection.clone(),
        quick,
        format!("{what} dense requests of {size}"),
    )
    .await?;
    // Every push added one to every key: the totals say whether each was applied exactly once.
    let after = workers[0].pull(selection).await?;
    let exact = after.len() == size
        && after.iter().all(|(k, v)| {
            let was = before.get(k).map_or(0.0, |b| b[0]);
            v[0] - was == pushes as f32
        });
    if !exact {
        return Err(BenchError::Inexact(format!(
            "{what} dense push of {size}: the servers do not hold exactly {pushes} pushes"
        )));
    }
    let bytes = (size * 4) as f64;
    Ok((bytes / push / 1e9, bytes / pull / 1e9))
}

/// Push and pull of `count` keys drawn at random from 2^40, by every worker, repeated; million
/// keys per second each way, all workers together.
async fn sparse(
    workers: &[WorkerHandle<f32>],
    count: usize,
    quick: bool,
    what: &str,
) -> Result<(f64, f64), BenchError> {
    let mut keys = std::collections::BTreeSet::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    while keys.len() < count {
        // splitmix64: a fixed, seeded key set, the same in every run.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        keys.insert((z ^ (z >> 31)) >> 24);
    }
    let keys: Vec<Key> = keys.into_iter().collect();
    let list = KeyList::new(keys.clone()).map_err(runtime_err)?;
    let kvs = KvPairs::new(keys, vec![1.0f32; count], 1).map_err(runtime_err)?;
    let (push, pull, _) = push_and_pull(
        workers,
        kvs,
        KeySelection::Keys(list),
        quick,
        format!("{what} sparse requests of {count}"),
    )
    .await?;
    Ok((count as f64 / push / 1e6, count as f64 / pull / 1e6))
}

/// Seconds per request of `kvs` pushed, then of `selection` pulled, each worker repeating its
/// share with several requests in flight; and how many pushes there were.
async fn push_and_pull(
    workers: &[WorkerHandle<f32>],
    kvs: KvPairs<f32>,
    selection: KeySelection,
    quick: bool,
    what: String,
) -> Result<(f64, f64, usize), BenchError> {
    // About 256 MiB of values per measure (4 MiB quick), at least 3 requests per worker.
    let budget: usize = if quick { 4 << 20 } else { 256 << 20 };
    let per_worker = (budget / (kvs.len().max(1) * 4)).clamp(3, 20_000);
    let reps = per_worker * workers.len();
    // Several requests in flight, so that small ones measure throughput, not round trips.
    let lanes = (per_worker / 3).clamp(1, 16) * workers.len();
    let limit = Duration::from_secs(if quick { 60 } else { 120 });
    let next = std::sync::atomic::AtomicUsize::new(0);
    let pick = || &workers[next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % workers.len()];
    let push_secs = run_lanes(
        lanes,
        reps,
        || {
            let worker = pick().clone();
            let kvs = kvs.clone();
            async move { worker.push(kvs).await.map(|_| ()) }
        },
        limit,
        format!("{what}: push"),
    )
    .await?;
    let pull_secs = run_lanes(
        lanes,
        reps,
        || {
            let worker = pick().clone();
            let selection = selection.clone();
            async move { worker.pull(selection).await.map(|_| ()) }
        },
        limit,
        format!("{what}: pull"),
    )
    .await?;
    Ok((push_secs / reps as f64, pull_secs / reps as f64, reps))
}

/// Runs `reps` calls of `call` on `lanes` concurrent tasks, within `limit`; returns the
/// seconds they took.
async fn run_lanes<F, Fut>(
    lanes: usize,
    reps: usize,
    call: F,
    limit: Duration,
    what: String,
) -> Result<f64, BenchError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), RuntimeError>> + Send + 'static,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let n = reps / lanes + usize::from(lane < reps % lanes);
        let calls: Vec<Fut> = (0..n).map(|_| call()).collect();
        tasks.spawn(async move {
            for c in calls {
                c.await?;
            }
            Ok::<(), RuntimeError>(())
        });
    }
    let all = async {
        while let Some(done) = tasks.join_next().await {
            done.map_err(runtime_err)??;
        }
        Ok::<(), BenchError>(())
    };
    tokio::time::timeout(limit, all)
        .await
        .map_err(|_| BenchError::Timeout(what, limit.as_secs()))??;
    Ok(start.elapsed().as_secs_f64())
}

/// One 1-key push at a time, `n` times: p50 and p99 of the round trip, in microseconds.
async fn round_trips(worker: &WorkerHandle<f32>, n: usize) -> Result<(f64, f64), BenchError> {
    let kvs = KvPairs::new(vec![7], vec![1.0f32], 1).map_err(runtime_err)?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        worker.push(kvs.clone()).await?;
        times.push(start.elapsed());
    }
    Ok(percentiles(&mut times))
}

fn percentiles(times: &mut [Duration]) -> (f64, f64) {
    times.sort();
    let at = |q: f64| {
        let i = ((times.len() as f64 - 1.0) * q).round() as usize;
        times.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    (at(0.5), at(0.99))
}

/// The baselines: one raw tokio TCP stream on loopback (GB/s) and an 8-byte ping-pong (p50,
/// microseconds).
async fn raw_tcp(quick: bool) -> Result<Vec<Measure>, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let total: usize = if quick { 16 << 20 } else { 1 << 30 };
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < total {
            let want = (total - got).min(buf.len());
            let n = s.read(&mut buf[..want]).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        // Ping-pong on the same connection.
        let mut ping = [0u8; 8];
        while s.read_exact(&mut ping).await.is_ok() {
            s.write_all(&ping).await?;
        }
        Ok::<usize, std::io::Error>(got)
    });
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let chunk = vec![1u8; 1 << 20];
    let start = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(&chunk).await?;
        sent += chunk.len();
    }
    s.flush().await?;
    // The reader reads the same amount before it answers pings: the first pong ends the
    // stream measure.
    let mut pong = [0u8; 8];
    s.write_all(&[0u8; 8]).await?;
    s.read_exact(&mut pong).await?;
    let stream = total as f64 / start.elapsed().as_secs_f64() / 1e9;
    let n = if quick { 200 } else { 10_000 };
    let mut times = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let start = Instant::now();
        s.write_all(&i.to_le_bytes()).await?;
        s.read_exact(&mut pong).await?;
        times.push(start.elapsed());
    }
    drop(s);
    reader.await.map_err(runtime_err)??;
    let (p50, _) = percentiles(&mut times);
    Ok(vec![
        Measure {
            name: "raw_tcp.stream".into(),
            value: stream,
            unit: "GB/s",
        },
        Measure {
            name: "raw_tcp.ping_pong.p50".into(),
            value: p50,
            unit: "us",
        },
    ])
}
