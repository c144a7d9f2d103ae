//! `pserver launch`: a whole cluster as separate processes on this machine, in one command (what
//! ps-lite's `local.sh` and dmlc-tracker's local mode do). It writes a cluster file with a node
//! per process on free loopback ports and a fresh secret, starts `pserver coordinator`,
//! `pserver server` and `pserver worker` from the same binary, prefixes each line they print with
//! the node's name, and ends with the job's status: the processes are the ones an operator runs
//! by hand, so that what works here works across machines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pserver_core::Consistency;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::CliError;
use super::cluster_file::ClusterFile;
use super::signals::{Stop, stop_requested};
use super::values::{Transport, output_file};

/// The arguments of `pserver launch`.
#[derive(clap::Args, Debug)]
pub(crate) struct LaunchArgs {
    /// Servers to start.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    servers: u32,
    /// Workers to start.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Run the job of this cluster file: its consistency model, ring, job and filters. Its
    /// nodes are replaced by the ones started here, on loopback ports, and its secret by a
    /// fresh one; relative paths in its `[job]` stay relative to the file.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["data", "test", "epochs", "save", "consistency", "transport"]
    )]
    config: Option<PathBuf>,
    /// Without --config: training data of the logistic-regression job (LIBSVM, optionally
    /// .gz).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "data/adult/adult.train.svm.gz"
    )]
    data: PathBuf,
    /// Without --config: test data, measured after every epoch.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "data/adult/adult.test.svm.gz"
    )]
    test: PathBuf,
    /// Without --config: passes over the training data.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    epochs: u32,
    /// Without --config: save the model (the epoch with the lowest test log loss) here.
    #[arg(long, value_name = "FILE", value_parser = output_file)]
    save: Option<PathBuf>,
    /// Without --config: the consistency model (sequential, bounded:TAU, eventual).
    #[arg(long, default_value = "bounded:4")]
    consistency: Consistency,
    /// Without --config: how the processes talk (tcp or udp).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    transport: Transport,
    /// Start a standby coordinator too (id after the workers'), which takes over if the
    /// first one dies: `pserver status --config FILE` names the one in charge.
    #[arg(long)]
    standby: bool,
    /// Keep the cluster file and the secret in this directory (created if missing). By
    /// default they go to a temporary directory, removed at the end.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Once every worker has ended, how long the coordinator and servers may take to end
    /// too before they are stopped and the launch fails.
    #[arg(long, default_value_t = 60, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    end_timeout_secs: u64,
}

/// How long processes asked to stop with SIGTERM get before SIGKILL: a server leaving the job
/// waits up to its own `--leave-timeout-secs` (25 s by default).
const STOP_GRACE: Duration = Duration::from_secs(30);

/// One process of the cluster.
struct Node {
    name: String,
    role: &'static str,
    /// Signals for the task that owns the process: it sends them only while the process is
    /// not reaped, so that a pid freed for another process is never signalled.
    signals: mpsc::UnboundedSender<Signal>,
    ended: bool,
}

/// The role of node `id` in a launch of `servers` servers and `workers` workers: the
/// coordinator first, then the servers, the workers, and a standby coordinator last.
fn role_of(id: usize, servers: usize, workers: usize) -> &'static str {
    match id {
        0 => "coordinator",
        i if i <= servers => "server",
        i if i <= servers + workers => "worker",
        _ => "coordinator",
    }
}

/// Runs `pserver launch`.
pub(crate) fn run(args: LaunchArgs) -> Result<(), CliError> {
    let (dir, temporary) = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| CliError::Input(format!("{}: cannot create: {e}", dir.display())))?;
            (dir.clone(), false)
        }
        None => {
            let dir = std::env::temp_dir().join(format!("pserver-launch-{}", std::process::id()));
            std::fs::create_dir_all(&dir)
                .map_err(|e| CliError::Input(format!("{}: cannot create: {e}", dir.display())))?;
            (dir, true)
        }
    };
    let result = launch(&args, &dir);
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn launch(args: &LaunchArgs, dir: &Path) -> Result<(), CliError> {
    let config = write_cluster_file(args, dir)?;
    // Refused here, in one line, rather than by every process at once.
    ClusterFile::load(&config).map_err(CliError::input)?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Input(format!("cannot find the pserver binary: {e}")))?;
    eprintln!(
        "launching a coordinator{}, {} servers and {} workers: cluster file {}",
        if args.standby { " and a standby" } else { "" },
        args.servers,
        args.workers,
        config.display()
    );
    eprintln!(
        "where the job stands, while it runs: pserver status --config {}",
        config.display()
    );
    let end_timeout = Duration::from_secs(args.end_timeout_secs);
    super::runtime()?.block_on(supervise(&exe, &config, args, end_timeout))
}

/// Free loopback ports, one per node, each free for both TCP and UDP when found. They are
/// held until all are found, so that no two are the same.
///
/// They come from below the kernel's ephemeral range: a port from within it (what binding
/// port 0 gives) may be taken for an outgoing connection of the nodes that start first,
/// before the node it was meant for binds it.
fn free_ports(n: usize) -> Result<Vec<u16>, CliError> {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let (low, high) = (
        ephemeral.saturating_sub(12_000).max(1_024),
        ephemeral.max(2_048),
    );
    let span = high - low;
    // Hashed, so that launches started together (with neighbouring pids) look far apart.
    let start = (crate::seeded::mix(u64::from(std::process::id())) % u64::from(span)) as u32;
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for k in 0..span {
        if ports.len() == n {
            break;
        }
        let Ok(port) = u16::try_from(low + (start + k) % span) else {
            continue;
        };
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if let (Ok(tcp), Ok(udp)) = (tcp, udp) {
            ports.push(port);
            held.push((tcp, udp));
        }
    }
    if ports.len() < n {
        return Err(CliError::Input(format!(
            "cannot find {n} free loopback ports between {low} and {high}"
        )));
    }
    Ok(ports)
}

/// `path` as an absolute path, so that the cluster file written elsewhere finds it.
fn absolute(path: &Path) -> Result<String, CliError> {
    std::path::absolute(path)
        .map(|p| p.display().to_string())
        .map_err(|e| CliError::Input(format!("{}: {e}", path.display())))
}

/// Writes the cluster file of the launch (and its secret) into `dir`; returns its path.
fn write_cluster_file(args: &LaunchArgs, dir: &Path) -> Result<PathBuf, CliError> {
    let mut table = match &args.config {
        Some(file) => job_of(file)?,
        None => {
            let mut job = toml::Table::new();
            job.insert("app".into(), "lr".into());
            job.insert("data".into(), absolute(&args.data)?.into());
            job.insert("test".into(), absolute(&args.test)?.into());
            job.insert("epochs".into(), i64::from(args.epochs).into());
            if let Some(save) = &args.save {
                job.insert("save".into(), absolute(save)?.into());
            }
            let mut table = toml::Table::new();
            table.insert("consistency".into(), args.consistency.to_string().into());
            table.insert("transport".into(), args.transport.to_string().into());
            table.insert("job".into(), job.into());
            table
        }
    };
    table.insert(
        "cluster_id".into(),
        format!("launch-{}", std::process::id()).into(),
    );
    let secret = dir.join("secret.key");
    write_secret(&secret)?;
    table.insert("secret_file".into(), "secret.key".into());
    let (servers, workers) = (args.servers as usize, args.workers as usize);
    let nodes = 1 + servers + workers + usize::from(args.standby);
    // One port per node, then one per coordinator for its /status and /metrics.
    let coordinators = 1 + usize::from(args.standby);
    let mut ports = free_ports(nodes + coordinators)?;
    let mut status_ports = ports.split_off(nodes).into_iter();
    let nodes: Vec<toml::Value> = ports
        .iter()
        .enumerate()
        .map(|(id, port)| {
            let role = role_of(id, servers, workers);
            let mut node = toml::Table::new();
            node.insert("id".into(), (id as i64).into());
            node.insert("role".into(), role.into());
            node.insert("address".into(), format!("127.0.0.1:{port}").into());
            if role == "coordinator"
                && let Some(status_port) = status_ports.next()
            {
                node.insert("metrics".into(), format!("127.0.0.1:{status_port}").into());
            }
            node.into()
        })
        .collect();
    table.insert("node".into(), nodes.into());
    let text = toml::to_string(&table)
        .map_err(|e| CliError::Input(format!("cannot write the cluster file: {e}")))?;
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text)
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))?;
    Ok(path)
}

/// The job of the cluster file `file`, without its nodes and secret, its `[job]` paths made
/// absolute.
fn job_of(file: &Path) -> Result<toml::Table, CliError> {
    // The file must be a good one as it is: errors name it, not the one written from it.
    ClusterFile::load(file).map_err(CliError::input)?;
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::Input(format!("{}: cannot read: {e}", file.display())))?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e| CliError::Input(format!("{}: {e}", file.display())))?;
    table.remove("node");
    table.remove("secret_file");
    let base = file.parent().unwrap_or(Path::new("."));
    if let Some(toml::Value::Table(job)) = table.get_mut("job") {
        for key in ["data", "test", "save", "init"] {
            if let Some(toml::Value::String(path)) = job.get_mut(key) {
                let joined = base.join(&*path);
                *path = absolute(&joined)?;
            }
        }
    }
    Ok(table)
}

/// A fresh secret, readable by this user only.
fn write_secret(path: &Path) -> Result<(), CliError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| CliError::Input(format!("cannot draw a secret: {e}")))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))?;
    std::io::Write::write_all(&mut file, hex.as_bytes())
        .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", path.display())))
}

/// Starts every node, forwards their output, and waits for the job to end.
async fn supervise(
    exe: &Path,
    config: &Path,
    args: &LaunchArgs,
    end_timeout: Duration,
) -> Result<(), CliError> {
    let (servers, workers) = (args.servers as usize, args.workers as usize);
    let (ended_tx, mut ended) = mpsc::unbounded_channel();
    let mut nodes: BTreeMap<usize, Node> = BTreeMap::new();
    let mut forwarding = Vec::new();
    for id in 0..=servers + workers + usize::from(args.standby) {
        let role = role_of(id, servers, workers);
        let name = format!("{role} {id}");
        let mut command = Command::new(exe);
        command
            .args([role, "--config"])
            .arg(config)
            .args(["--id", &id.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        end_with_the_launch(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| CliError::Input(format!("cannot start {name}: {e}")))?;
        forwarding.extend(forward(&mut child, &name));
        let tx = ended_tx.clone();
        let (signals, mut signalled) = mpsc::unbounded_channel::<Signal>();
        tokio::spawn(async move {
            let status = loop {
                tokio::select! {
                    biased;
                    status = child.wait() => break status,
                    Some(signal) = signalled.recv() => {
                        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                            let _ = kill(Pid::from_raw(pid), signal);
                        }
                    }
                }
            };
            let _ = tx.send((id, status));
        });
        nodes.insert(
            id,
            Node {
                name,
                role,
                signals,
                ended: false,
            },
        );
    }
    let mut running = nodes.len();
    let mut workers_left = workers;
    let mut failure: Option<CliError> = None;
    let mut end_by: Option<tokio::time::Instant> = None;
    let mut stopping = false;
    while running > 0 {
        let deadline = end_by.unwrap_or_else(tokio::time::Instant::now);
        tokio::select! {
            Some((id, status)) = ended.recv() => {
                running -= 1;
                let Some(node) = nodes.get_mut(&id) else { continue };
                node.ended = true;
                let node = &nodes[&id];
                let code = status.ok().and_then(|s| s.code());
                let ok = code == Some(0);
                if node.role == "worker" {
                    workers_left -= 1;
                }
                if !ok && !stopping {
                    eprintln!("launch: {} ended with {}", node.name, describe(code));
                    failure.get_or_insert(CliError::Exited(code.map_or(1, |c| c as u8)));
                    // A node that failed leaves the job unfinished: the others would wait for
                    // it.
                    stopping = true;
                    terminate(&nodes, Signal::SIGTERM);
                    end_by = Some(tokio::time::Instant::now() + STOP_GRACE);
                } else if workers_left == 0 && end_by.is_none() {
                    end_by = Some(tokio::time::Instant::now() + end_timeout);
                }
            }
            stop = stop_requested(), if !stopping => {
                stopping = true;
                failure = Some(match stop {
                    Stop::Interrupt => CliError::Interrupted,
                    Stop::Terminate => CliError::Terminated,
                });
                terminate(&nodes, Signal::SIGTERM);
                end_by = Some(tokio::time::Instant::now() + STOP_GRACE);
            }
            () = tokio::time::sleep_until(deadline), if end_by.is_some() => {
                if stopping {
                    terminate(&nodes, Signal::SIGKILL);
                    end_by = None;
                } else {
                    failure = Some(CliError::Failed(format!(
                        "every worker ended, but the coordinator or a server did not end within {}s",
                        end_timeout.as_secs()
                    )));
                    stopping = true;
                    terminate(&nodes, Signal::SIGTERM);
                    end_by = Some(tokio::time::Instant::now() + STOP_GRACE);
                }
            }
        }
    }
    // Every line a node printed is out before the launch says how it ended.
    for task in forwarding {
        let _ = task.await;
    }
    match failure {
        Some(e) => Err(e),
        None => {
            eprintln!("launch: the job finished, every process exited 0");
            Ok(())
        }
    }
}

/// Has the node started by `command` get SIGTERM if the launch dies first (killed with
/// SIGKILL, say), so that no node outlives it by more than its own drain.
#[cfg(target_os = "linux")]
fn end_with_the_launch(command: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes one system call (prctl) and allocates
    // nothing.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
}

/// Elsewhere the nodes outlive a launch that is killed; one that is asked to stop stops them.
#[cfg(not(target_os = "linux"))]
fn end_with_the_launch(_: &mut Command) {}

/// An exit code as a person reads it.
fn describe(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit status {c}"),
        None => "a signal".into(),
    }
}

/// Sends `signal` to every node still running (one that ended already ignores it). SIGTERM
/// goes to the workers only, which leave the job; the coordinator and servers get SIGINT and
/// stop where they are, since the whole job is ending and no server need hand its ranges
/// over first.
fn terminate(nodes: &BTreeMap<usize, Node>, signal: Signal) {
    for node in nodes.values().filter(|n| !n.ended) {
        let signal = match signal {
            Signal::SIGTERM if node.role != "worker" => Signal::SIGINT,
            other => other,
        };
        let _ = node.signals.send(signal);
    }
}

/// Prints each line `child` writes, prefixed with its node's name: stdout to stdout, stderr to
/// stderr.
fn forward(child: &mut Child, name: &str) -> Vec<tokio::task::JoinHandle<()>> {
    let prefix = format!("[{name}] ");
    let out = child
        .stdout
        .take()
        .map(|out| prefixed(out, prefix.clone(), false));
    let err = child.stderr.take().map(|err| prefixed(err, prefix, true));
    out.into_iter().chain(err).collect()
}

/// Copies the lines of `from` to stdout (or stderr), each after `prefix`, until it ends.
fn prefixed(
    from: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    prefix: String,
    to_stderr: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(from).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if to_stderr {
                eprintln!("{prefix}{line}");
            } else {
                println!("{prefix}{line}");
            }
        }
    })
}
