//! A logistic-regression job on separate processes over loopback TCP, with a standby
//! coordinator and a checkpoint after every epoch, run twice: once without faults, then under
//! a seeded schedule that kills a server with SIGKILL and starts it again, kills a worker, kills
//! the active coordinator, and pauses a node past the heartbeat timeout, and at the end kills
//! every process at once and starts them all again, the servers resuming from their
//! checkpoints. The job under faults must end
//! as well as the one without, every process with the status its fate calls for, and no worker
//! may wait past its stall limit.
//!
//! `PSERVER_CHAOS_SEED=N cargo test --test chaos` replays the schedule of seed `N`.

#![cfg(unix)]

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod common;

use common::{Children, LR_ROWS, fields, free_port, http_get, lr_cluster_of, pserver, signal};

/// Servers 1 to 3: with one replica per range, the ring holds with any one of them gone.
const SERVERS: u32 = 3;
/// Workers 4 to 6.
const WORKERS: u32 = 3;
/// The standby coordinator, whose id comes after the workers'.
const STANDBY: u32 = SERVERS + WORKERS + 1;
/// Enough epochs (a fifth of a second each in a debug build) for every fault to come, and be
/// dealt with, while the workers still train.
const EPOCHS: u32 = 40;
/// A worker whose requests see nothing complete for this long exits with status 1.
const STALL_LIMIT_SECS: u64 = 30;
/// How far the final test AUC under faults may be from the fault-free job's. Fault-free runs
/// of this job end within 0.001 of each other: the rest of the bound is what faults may cost.
const AUC_TOLERANCE: f64 = 0.005;
/// Pauses a worker, kills the active coordinator, then, under the standby that took over,
/// kills the worker that measures the model and kills and restarts a server: the schedule that
/// asks the most of the new coordinator.
const DEFAULT_SEED: u64 = 0;
/// Every wait of one run of the job ends by then.
const RUN_BOUND: Duration = Duration::from_secs(150);
/// Minibatches of an epoch: the largest of the workers' shares of the rows (cut at line
/// boundaries, 2,001 rows), 100 rows a minibatch. The servers write a checkpoint after each
/// epoch.
const STEPS: usize = (LR_ROWS / WORKERS as usize + 1).div_ceil(100);

#[test]
fn a_training_job_under_kills_restarts_and_a_pause_ends_as_well_as_a_fault_free_one() {
    let seed = match std::env::var("PSERVER_CHAOS_SEED") {
        Ok(s) => s.parse().expect("PSERVER_CHAOS_SEED is a number"),
        Err(_) => DEFAULT_SEED,
    };
    let schedule = Schedule::new(seed);
    eprintln!("{schedule}");
    let clean = run("clean", None);
    let faulty = run("faults", Some(&schedule));
    eprintln!("test AUC after {EPOCHS} epochs: {clean:.4} fault-free, {faulty:.4} under faults");
    assert!(
        (faulty - clean).abs() <= AUC_TOLERANCE,
        "{schedule}\nthe job ended with a test AUC of {faulty:.4} under faults, {clean:.4} without"
    );
}

/// Runs the job, under the faults of `schedule` if there is one, checks how every process
/// ended, and returns the test AUC the job ended with.
fn run(name: &str, schedule: Option<&Schedule>) -> f64 {
    let dir = std::env::temp_dir().join(format!("pserver-chaos-{name}-{}", std::process::id()));
    let mut cluster = Cluster::start(&dir);
    if let Some(schedule) = schedule {
        cluster.inflict(schedule);
    }
    let auc = cluster.finish(schedule);
    let _ = std::fs::remove_dir_all(&dir);
    auc
}

/// One fault, on a node named by its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL a server, then start it again once the coordinator declared it dead.
    KillServer(u32),
    /// SIGKILL a worker.
    KillWorker(u32),
    /// SIGSTOP a node until the coordinator declared it dead, then SIGCONT it.
    Pause(u32),
    /// SIGKILL the active coordinator, and wait for the standby to take over.
    KillCoordinator,
    /// SIGKILL every process at once, as a power cut would, and start them all again, the
    /// servers resuming from their checkpoints.
    PowerCut,
}

impl Fault {
    fn node(self) -> u32 {
        match self {
            Fault::KillServer(n) | Fault::KillWorker(n) | Fault::Pause(n) => n,
            Fault::KillCoordinator | Fault::PowerCut => 0,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fault::KillServer(n) => write!(f, "kill -9 server {n} and restart it"),
            Fault::KillWorker(n) => write!(f, "kill -9 worker {n}"),
            Fault::Pause(n) => write!(f, "pause {} {n} until it is declared dead", role(n)),
            Fault::KillCoordinator => write!(f, "kill -9 the active coordinator"),
            Fault::PowerCut => write!(f, "kill -9 every process and start them all again"),
        }
    }
}

/// A fault, when it comes: `after` epochs past the epoch the previous one was dealt with by,
/// then `delay` into that epoch.
struct Step {
    fault: Fault,
    after: u32,
    delay: Duration,
}

struct Schedule {
    seed: u64,
    steps: Vec<Step>,
}

impl Schedule {
    /// The faults seed `seed` draws: which server is killed and restarted, which worker is
    /// killed, which other node is paused, in which order and when.
    fn new(seed: u64) -> Schedule {
        let mut draw = Draw(seed);
        let server = 1 + draw.below(SERVERS);
        let worker = SERVERS + 1 + draw.below(WORKERS);
        let others: Vec<u32> = (1..=SERVERS + WORKERS)
            .filter(|&n| n != server && n != worker)
            .collect();
        let paused = others[draw.below(others.len() as u32) as usize];
        let mut faults = vec![
            Fault::KillServer(server),
            Fault::KillWorker(worker),
            Fault::Pause(paused),
            Fault::KillCoordinator,
        ];
        for i in (1..faults.len()).rev() {
            faults.swap(i, draw.below(i as u32 + 1) as usize);
        }
        // A server paused while the killed one is off the ring would leave one server, too
        // few for a replica: the coordinator would keep it, and it would never be fenced.
        let place = |fault: fn(&Fault) -> bool| faults.iter().position(fault).expect("drawn");
        let kill = place(|f| matches!(f, Fault::KillServer(_)));
        let pause = place(|f| matches!(f, Fault::Pause(_)));
        if paused <= SERVERS && pause < kill {
            faults.swap(kill, pause);
        }
        // Last: every node the cluster file names comes back, the worker killed before too.
        faults.push(Fault::PowerCut);
        let steps = faults
            .into_iter()
            .enumerate()
            .map(|(i, fault)| Step {
                fault,
                after: u32::from(i == 0) + 1 + draw.below(3),
                delay: Duration::from_millis(draw.below(150).into()),
            })
            .collect();
        Schedule { seed, steps }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "chaos seed {0} (PSERVER_CHAOS_SEED={0} replays it):",
            self.seed
        )?;
        for (i, step) in self.steps.iter().enumerate() {
            let more = if i == 0 { "" } else { " more" };
            let sep = if i + 1 == self.steps.len() { "" } else { ";" };
            let (after, ms) = (step.after, step.delay.as_millis());
            let epochs = if after == 1 { "epoch" } else { "epochs" };
            write!(
                f,
                " after {after}{more} {epochs} and {ms} ms, {}{sep}",
                step.fault
            )?;
        }
        Ok(())
    }
}

/// SplitMix64: the schedule is the same for a seed wherever the test runs.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u32) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % u64::from(n)) as u32
    }
}

fn role(id: u32) -> &'static str {
    match id {
        0 | STANDBY => "coordinator",
        n if n <= SERVERS => "server",
        _ => "worker",
    }
}

/// A line a process of the cluster wrote.
struct Line {
    node: u32,
    stdout: bool,
    text: String,
}

/// What the processes said so far that the test acts on.
#[derive(Default)]
struct Seen {
    /// Per worker, the last epoch it finished.
    epochs: BTreeMap<u32, u32>,
    /// The nodes the coordinator declared dead, in order.
    dead: Vec<u32>,
    /// Whether the standby coordinator said it took over.
    took_over: bool,
    /// Per node, the epoch of the first configuration each of its processes was a member of.
    served_from: BTreeMap<u32, Vec<u64>>,
    /// Every test AUC measured, with its epoch, in the order they were printed.
    aucs: Vec<(u32, f64)>,
    /// Whether a worker took over the share of one that is gone.
    took_share: bool,
    /// The furthest epoch a worker had finished when every process was killed, and the first
    /// epoch a worker finished after they were all started again.
    power_cut: Option<(u32, Option<u32>)>,
    /// The cuts the servers resumed from.
    resumed: Vec<u32>,
    /// The last lines, to show when a wait fails.
    tail: VecDeque<String>,
}

impl Seen {
    fn note(&mut self, line: Line) {
        let value = |key: &str| {
            line.text
                .split_whitespace()
                .find_map(|f| f.strip_prefix(key))
                .map(str::to_owned)
        };
        let number = |key: &str| value(key).and_then(|v| v.parse::<f64>().ok());
        if line.stdout {
            if let Some(epoch) = number("iter=") {
                let epoch = epoch as u32;
                self.epochs.insert(line.node, epoch);
                if let Some((_, first @ None)) = &mut self.power_cut {
                    *first = Some(epoch);
                }
                if let Some(auc) = number("test_auc=") {
                    self.aucs.push((epoch, auc));
                }
            }
        } else if line.text.contains("took over from coordinator") {
            self.took_over = true;
        } else if line
            .text
            .contains("took over the share of a worker that is gone")
        {
            self.took_share = true;
        } else if let Some(at) = line
            .text
            .split("resumed from the checkpoint of iteration ")
            .nth(1)
        {
            let cut = at.split_whitespace().next().and_then(|c| c.parse().ok());
            self.resumed.push(cut.expect("the cut resumed from"));
        } else if line.text.contains("node declared dead") {
            let node = value("node=").and_then(|n| n.trim_start_matches('n').parse().ok());
            self.dead.push(node.expect("the dead node's id"));
        } else if line.text.contains("configuration received")
            && let Some(epoch) = number("epoch=")
        {
            let epochs = self.served_from.entry(line.node).or_default();
            epochs.push(epoch as u64);
        }
        if self.tail.len() == 200 {
            self.tail.pop_front();
        }
        let stream = if line.stdout { "out" } else { "err" };
        self.tail
            .push_back(format!("{} {stream}: {}", line.node, line.text));
    }

    /// The furthest epoch any worker finished.
    fn epoch(&self) -> u32 {
        self.epochs.values().copied().max().unwrap_or(0)
    }

    fn tail(&self) -> String {
        self.tail.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// The processes of one run of the job, and what they wrote.
struct Cluster {
    config: String,
    roles: Vec<&'static str>,
    /// Each coordinator's metrics endpoint: the active one's epoch says when a ring change is
    /// complete.
    metrics: BTreeMap<u32, String>,
    /// The coordinator that publishes now.
    active: u32,
    children: Children,
    /// Per process, the threads reading its stdout and stderr, which return all it wrote.
    readers: BTreeMap<String, (JoinHandle<String>, JoinHandle<String>)>,
    lines: Receiver<Line>,
    send: Sender<Line>,
    seen: Seen,
    ends_by: Instant,
}

impl Cluster {
    /// Writes the job into `dir` and starts every node.
    fn start(dir: &std::path::Path) -> Cluster {
        let _ = std::fs::remove_dir_all(dir);
        let job = format!("stall_limit_secs = {STALL_LIMIT_SECS}\ncheckpoint_every = {STEPS}\n");
        let (config, roles) = lr_cluster_of(
            dir,
            SERVERS as usize,
            WORKERS as usize,
            EPOCHS,
            &job,
            |_| {},
        );
        // The default with more than one server, said outright: the schedule counts on it.
        let text = std::fs::read_to_string(&config).unwrap();
        let mut text = text.replacen("[job]\n", "[ring]\nreplicas = 1\n\n[job]\n", 1);
        text += &format!(
            "\n[[node]]\nid = {STANDBY}\nrole = \"coordinator\"\naddress = \"127.0.0.1:{}\"\n",
            free_port()
        );
        std::fs::write(&config, text).unwrap();
        let (send, lines) = channel();
        let mut cluster = Cluster {
            config,
            roles,
            metrics: [0, STANDBY]
                .into_iter()
                .map(|id| (id, format!("127.0.0.1:{}", free_port())))
                .collect(),
            active: 0,
            children: Children(Vec::new()),
            readers: BTreeMap::new(),
            lines,
            send,
            seen: Seen::default(),
            ends_by: Instant::now() + RUN_BOUND,
        };
        for id in (0..cluster.roles.len() as u32).chain([STANDBY]) {
            cluster.spawn(id, &format!("{} {id}", role(id)));
        }
        cluster
    }

    /// Starts node `id` as a process named `process`.
    fn spawn(&mut self, id: u32, process: &str) {
        let id_arg = id.to_string();
        let mut args = vec![role(id), "--config", &self.config, "--id", &id_arg];
        if let Some(metrics) = self.metrics.get(&id) {
            args.extend(["--metrics", metrics]);
        }
        // Every server writes its checkpoints, and offers them when it starts: a restart
        // while the job runs takes its ranges from their replicas all the same.
        let checkpoints = format!("{}-ckpt-{id}", self.config);
        if role(id) == "server" {
            args.extend(["--checkpoint-dir", &checkpoints, "--resume"]);
        }
        // Info for the joining server's first configuration.
        let mut child = pserver(&args)
            .env("RUST_LOG", "info")
            .spawn()
            .expect("start a node");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let readers = (
            read_lines(stdout, id, true, self.send.clone()),
            read_lines(stderr, id, false, self.send.clone()),
        );
        self.readers.insert(process.to_owned(), readers);
        self.children.0.push((process.to_owned(), child));
    }

    fn child(&mut self, process: &str) -> &mut Child {
        match self.children.0.iter_mut().find(|(name, _)| name == process) {
            Some((_, child)) => child,
            None => panic!("no process {process} runs"),
        }
    }

    /// The deadline of a wait that may last `within`, and no longer than the run.
    fn deadline(&self, within: Duration) -> Instant {
        (Instant::now() + within).min(self.ends_by)
    }

    /// Takes in what the processes write until `done` holds of it.
    fn until(&mut self, within: Duration, what: &str, done: impl Fn(&Seen) -> bool) {
        let deadline = self.deadline(within);
        loop {
            while let Ok(line) = self.lines.try_recv() {
                self.seen.note(line);
            }
            if done(&self.seen) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{what}: not in time; the cluster's last lines:\n{}",
                self.seen.tail()
            );
            if let Ok(line) = self
                .lines
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                self.seen.note(line);
            }
        }
    }

    /// Waits for `process` to end, taking in what the others write meanwhile, and returns how
    /// it ended, its stdout and its stderr.
    fn ended(&mut self, process: &str, within: Duration) -> (ExitStatus, String, String) {
        let deadline = self.deadline(within);
        let status = loop {
            while let Ok(line) = self.lines.try_recv() {
                self.seen.note(line);
            }
            if let Some(status) = self.child(process).try_wait().expect("poll a child") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{process} did not end in time; the cluster's last lines:\n{}",
                self.seen.tail()
            );
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(20)) {
                self.seen.note(line);
            }
        };
        // Reaped: nothing is left for the guard to kill.
        self.children.0.retain(|(name, _)| name != process);
        let (stdout, stderr) = self.readers.remove(process).expect("its readers");
        let stdout = stdout.join().expect("read its stdout");
        let stderr = stderr.join().expect("read its stderr");
        (status, stdout, stderr)
    }

    /// The epoch the active coordinator's configuration is in, as its metrics say.
    fn coordinator_epoch(&self) -> u64 {
        let scrape = http_get(&self.metrics[&self.active], "/metrics");
        scrape
            .lines()
            .find(|l| l.starts_with("pserver_epoch{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no pserver_epoch in:\n{scrape}")) as u64
    }

    fn until_coordinator_epoch(&mut self, epoch: u64, within: Duration, what: &str) {
        let deadline = self.deadline(within);
        while self.coordinator_epoch() < epoch {
            assert!(
                Instant::now() < deadline,
                "{what}: the coordinator is still in epoch {}, not {epoch}; the cluster's last \
                 lines:\n{}",
                self.coordinator_epoch(),
                self.seen.tail()
            );
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(50)) {
                self.seen.note(line);
            }
        }
    }

    /// Brings on each fault of `schedule` in turn, once the one before has been dealt with.
    fn inflict(&mut self, schedule: &Schedule) {
        let mut dealt_with = 0;
        for step in &schedule.steps {
            let at = dealt_with + step.after;
            assert!(
                at + 5 <= EPOCHS,
                "{schedule}\n{} would come at epoch {at} of {EPOCHS}: the job is too short",
                step.fault
            );
            let when = format!("a worker through epoch {at}, when {} comes", step.fault);
            self.until(Duration::from_secs(60), &when, |seen| seen.epoch() >= at);
            std::thread::sleep(step.delay);
            let came = self.seen.epoch();
            self.bring(step.fault);
            dealt_with = self.seen.epoch();
            eprintln!(
                "{} at epoch {came}, dealt with by epoch {dealt_with}",
                step.fault
            );
        }
    }

    /// Brings on `fault` and waits until the cluster has dealt with it.
    fn bring(&mut self, fault: Fault) {
        let node = fault.node();
        let process = format!("{} {node}", role(node));
        match fault {
            Fault::KillServer(_) => {
                self.kill(node, &process);
                self.restart(node, &process);
            }
            Fault::KillWorker(_) => self.kill(node, &process),
            Fault::KillCoordinator => {
                let process = format!("coordinator {}", self.active);
                self.child(&process).kill().expect("kill -9");
                let killed_at = Instant::now();
                let (status, _, _) = self.ended(&process, Duration::from_secs(10));
                assert_eq!(status.signal(), Some(9), "{process}: {status}");
                self.until(Duration::from_secs(30), "the standby takes over", |seen| {
                    seen.took_over
                });
                // Printed, not asserted: timing belongs to measurements, and the README's
                // figure comes from here.
                eprintln!(
                    "the standby took over {} ms after kill -9 of the active coordinator",
                    killed_at.elapsed().as_millis()
                );
                self.active = STANDBY;
            }
            Fault::PowerCut => self.power_cut(),
            Fault::Pause(_) => {
                signal(self.child(&process), "-STOP");
                self.until_dead(node, &process);
                signal(self.child(&process), "-CONT");
                let (status, _, stderr) = self.ended(&process, Duration::from_secs(30));
                assert_eq!(status.code(), Some(3), "{process}: {status}\n{stderr}");
                let said = format!(
                    "{} n{node} was removed from the cluster (fenced)",
                    role(node)
                );
                assert!(stderr.contains(&said), "{process}: {stderr}");
            }
        }
    }

    /// Kills every process at once, starts every node again, and waits until a worker has
    /// finished an epoch after the restart.
    fn power_cut(&mut self) {
        let at = self.seen.epoch();
        for (_, child) in &mut self.children.0 {
            let _ = child.kill();
        }
        let processes: Vec<String> = self.children.0.iter().map(|(n, _)| n.clone()).collect();
        for process in processes {
            let (status, _, _) = self.ended(&process, Duration::from_secs(10));
            assert_eq!(status.signal(), Some(9), "{process}: {status}");
        }
        self.seen.power_cut = Some((at, None));
        self.active = 0;
        for id in (0..self.roles.len() as u32).chain([STANDBY]) {
            self.spawn(id, &format!("{} {id} after the power cut", role(id)));
        }
        self.until(
            Duration::from_secs(60),
            "a worker finishes an epoch after the power cut",
            |seen| seen.power_cut.is_some_and(|(_, first)| first.is_some()),
        );
    }

    /// SIGKILLs node `node`'s `process` and waits until the coordinator declares it dead.
    fn kill(&mut self, node: u32, process: &str) {
        self.child(process).kill().expect("kill -9");
        let (status, _, _) = self.ended(process, Duration::from_secs(10));
        assert_eq!(status.signal(), Some(9), "{process}: {status}");
        self.until_dead(node, process);
    }

    fn until_dead(&mut self, node: u32, process: &str) {
        let what = format!("the coordinator declares {process} dead");
        self.until(Duration::from_secs(30), &what, |seen| {
            seen.dead.contains(&node)
        });
    }

    /// Starts server `node` again, and waits until the ring holds it again.
    fn restart(&mut self, node: u32, process: &str) {
        let before = self.seen.served_from.get(&node).map_or(0, Vec::len);
        self.spawn(node, &format!("{process} restarted"));
        let what = format!("{process} restarted joins the job");
        self.until(Duration::from_secs(60), &what, |seen| {
            seen.served_from
                .get(&node)
                .is_some_and(|e| e.len() > before)
        });
        // Joining, it copies the ranges the next ring gives it; the coordinator puts that ring
        // in force, in the next epoch, once it holds them all. Until then another server lost
        // would leave the ring too few servers for a replica.
        let joining = self.seen.served_from[&node][before];
        let back = format!("the ring takes {process} back");
        self.until_coordinator_epoch(joining + 1, Duration::from_secs(60), &back);
    }

    /// Waits for the workers still running to finish the job, stops the coordinator and the
    /// servers as an operator would, checks how each process ended, and returns the test AUC
    /// of the job's last epoch.
    fn finish(mut self, schedule: Option<&Schedule>) -> f64 {
        let workers: Vec<String> = self
            .children
            .0
            .iter()
            .map(|(name, _)| name.clone())
            .filter(|name| name.starts_with("worker"))
            .collect();
        let mut rows = 0.0;
        for process in &workers {
            let (status, stdout, stderr) = self.ended(process, RUN_BOUND);
            // Exit status 0 also says that no wait lasted past the stall limit.
            assert_eq!(status.code(), Some(0), "{process}: {status}\n{stderr}");
            assert!(!stderr.contains("stall limit"), "{process}: {stderr}");
            let node = process.split_whitespace().nth(1).expect("worker N");
            let done = format!("worker n{node} trained epochs={EPOCHS}");
            assert!(stdout.contains(&done), "{process}: {stdout}");
            rows += fields(&stdout, "rows=").last().copied().unwrap_or_default();
        }
        while let Ok(line) = self.lines.try_recv() {
            self.seen.note(line);
        }
        assert_eq!(
            rows as usize, LR_ROWS,
            "the last epoch trains every row once"
        );
        assert_eq!(
            self.seen.took_share,
            schedule.is_some(),
            "a live worker took over the shares of those gone"
        );
        if let Some((at, first)) = self.seen.power_cut {
            // Every server resumed from the same cut, the end of an epoch no earlier than the
            // last one a worker had finished; the workers went on from the epoch after it.
            let resumed = &self.seen.resumed;
            assert_eq!(resumed.len(), SERVERS as usize, "{resumed:?}");
            assert!(resumed.iter().all(|&c| c == resumed[0]), "{resumed:?}");
            let epochs = resumed[0] as usize / STEPS;
            assert_eq!(resumed[0] as usize % STEPS, 0, "{resumed:?}");
            assert!(
                epochs as u32 >= at,
                "resumed after epoch {epochs}, cut at {at}"
            );
            assert_eq!(
                first,
                Some(epochs as u32 + 1),
                "no epoch before the cut again"
            );
            eprintln!("every process killed after epoch {at}: resumed after epoch {epochs}");
        }
        for (_, child) in &self.children.0 {
            signal(child, "-INT");
        }
        let rest: Vec<String> = self.children.0.iter().map(|(n, _)| n.clone()).collect();
        let mut coordinator_log = String::new();
        for process in rest {
            let (status, _, stderr) = self.ended(&process, Duration::from_secs(30));
            assert_eq!(status.code(), Some(0), "{process}: {status}\n{stderr}");
            if process.starts_with("coordinator") {
                coordinator_log += &stderr;
            }
        }
        assert_eq!(
            self.seen.took_over,
            schedule.is_some(),
            "the standby takes over when, and only when, the active coordinator is killed"
        );
        while let Ok(line) = self.lines.try_recv() {
            self.seen.note(line);
        }
        for never in ["but kept on the ring", "every holder of this range failed"] {
            assert!(!coordinator_log.contains(never), "{coordinator_log}");
        }
        let faulted: Vec<u32> = schedule
            .iter()
            .flat_map(|s| s.steps.iter().map(|step| step.fault))
            .filter(|&fault| !matches!(fault, Fault::KillCoordinator | Fault::PowerCut))
            .map(Fault::node)
            .collect();
        assert_eq!(
            self.seen.dead, faulted,
            "declared dead, against the nodes brought down:\n{coordinator_log}"
        );
        // Whoever leads measures: after the lead leaves at the end, the next may measure the
        // same epoch, with more of the pushes in.
        let last = self.seen.aucs.iter().rfind(|&&(epoch, _)| epoch == EPOCHS);
        match last {
            Some(&(_, auc)) => auc,
            None => panic!("no test AUC for epoch {EPOCHS}: {:?}", self.seen.aucs),
        }
    }
}

/// A thread reading `stream` line by line, sending each on `send`; it returns them all once
/// the stream closes.
fn read_lines(
    stream: impl std::io::Read + Send + 'static,
    node: u32,
    stdout: bool,
    send: Sender<Line>,
) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut all = String::new();
        for text in std::io::BufReader::new(stream)
            .lines()
            .map_while(Result::ok)
        {
            all += &text;
            all.push('\n');
            let _ = send.send(Line { node, stdout, text });
        }
        all
    })
}
