//! Whole clusters: separate processes over loopback TCP and UDP, and one process over the
//! in-memory transport with faults. All run the script (pull, compute, push, advance) and check that
//! every server ends with exactly what the workers pushed.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pserver_core::{Consistency, NodeId};

mod common;

use common::{
    Children, LR_ROWS, expected_totals, fields, free_port, http_get, line_with, log_lines,
    lr_cluster_of, pserver, signal, summed_dumps, wait_all, watch_log,
};

const SERVERS: u32 = 2;
const WORKERS: u32 = 3;
const KEYS: u64 = 1000;
const ITERATIONS: u32 = 20;

fn write_cluster_file(dir: &Path, ports: &[u16], consistency: &str, iterations: u32) -> PathBuf {
    write_cluster(dir, ports, SERVERS, consistency, iterations, 0)
}

/// A cluster file for `ports` (coordinator, then `servers` servers, then workers), whose
/// workers compute for `compute_ms` each iteration.
fn write_cluster(
    dir: &Path,
    ports: &[u16],
    servers: u32,
    consistency: &str,
    iterations: u32,
    compute_ms: u64,
) -> PathBuf {
    let mut text = format!(
        "cluster_id = \"test\"\nconsistency = \"{consistency}\"\nsecret_file = \"secret.key\"\n\n[job]\nkeys = {KEYS}\niterations = {iterations}\ncompute_ms = {compute_ms}\n"
    );
    for (id, port) in ports.iter().enumerate() {
        let role = match id as u32 {
            0 => "coordinator",
            i if i <= servers => "server",
            _ => "worker",
        };
        text +=
            &format!("\n[[node]]\nid = {id}\nrole = \"{role}\"\naddress = \"127.0.0.1:{port}\"\n");
    }
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text).expect("write the cluster file");
    path
}

fn wait_for(child: &mut Child, deadline: Instant, what: &str) {
    while child.try_wait().expect("poll a child").is_none() {
        assert!(Instant::now() < deadline, "{what} did not finish in time");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn finish(mut child: Child) -> Output {
    child.kill().ok();
    child.wait_with_output().expect("collect a child's output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes hostile bytes to `port` until it has tried each kind once: random garbage, a 4 GiB
/// length prefix, half of a hello.
fn attack(port: u16) {
    let payloads: [Vec<u8>; 3] = [
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect(),
        u32::MAX.to_le_bytes().to_vec(),
        b"PSRVTCP1\x01".to_vec(),
    ];
    for payload in payloads {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.write_all(&payload);
                break;
            }
            assert!(Instant::now() < deadline, "server port never opened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn separate_processes_over_tcp_end_with_exactly_what_the_workers_pushed() {
    let dir = std::env::temp_dir().join(format!("pserver-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret.key"), "s3cret-for-tests\n").unwrap();
    let ports: Vec<u16> = (0..=SERVERS + WORKERS).map(|_| free_port()).collect();
    let config = write_cluster_file(&dir, &ports, "bounded:2", ITERATIONS);
    let config_arg = config.to_str().unwrap();
    let mut children = Children(Vec::new());
    let mut start = |role: &str, id: u32, extra: &[&str]| {
        let id_arg = id.to_string();
        let mut args = vec![role, "--config", config_arg, "--id", &id_arg];
        args.extend_from_slice(extra);
        let child = pserver(&args).spawn().expect("start a node");
        children.0.push((format!("{role} {id}"), child));
    };
    let dumps: Vec<PathBuf> = (1..=SERVERS)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    start("coordinator", 0, &[]);
    // The first server serves its metrics: the refusals below must show there.
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    for s in 1..=SERVERS {
        let dump = dumps[s as usize - 1].to_str().unwrap().to_owned();
        if s == 1 {
            // Serving forever, so that its metrics can be read after the job.
            let extra = [
                "--dump",
                &dump,
                "--metrics",
                &metrics_addr,
                "--serve-forever",
            ];
            start("server", s, &extra);
        } else {
            start("server", s, &["--dump", &dump]);
        }
    }
    for w in SERVERS + 1..=SERVERS + WORKERS {
        start("worker", w, &[]);
    }
    // Garbage on a server's port for as long as the workers use it: it must cost only those
    // connections.
    let server_port = ports[1];
    let workers_done = Arc::new(AtomicBool::new(false));
    let attack_began = Instant::now();
    let attacker = {
        let done = Arc::clone(&workers_done);
        std::thread::spawn(move || {
            let mut rounds = 0;
            while rounds < 3 || !done.load(Ordering::Relaxed) {
                attack(server_port);
                rounds += 1;
                // Paced, so that the attack tests the server and not this machine's supply of
                // ephemeral ports.
                std::thread::sleep(Duration::from_millis(50));
            }
            rounds
        })
    };
    // A node with the wrong secret tries to join, from an address of its own.
    let mut intruder_ports = ports.clone();
    intruder_ports[SERVERS as usize + 1] = free_port();
    let intruder_dir = dir.join("intruder");
    std::fs::create_dir_all(&intruder_dir).unwrap();
    std::fs::write(intruder_dir.join("secret.key"), "not-the-secret\n").unwrap();
    // Another job (twice the iterations): admitted, it would change the totals.
    let intruder_config =
        write_cluster_file(&intruder_dir, &intruder_ports, "bounded:2", 2 * ITERATIONS);
    let id_arg = (SERVERS + 1).to_string();
    let intruder = pserver(&[
        "worker",
        "--config",
        intruder_config.to_str().unwrap(),
        "--id",
        &id_arg,
        "--join-timeout-secs",
        "3",
    ])
    .spawn()
    .expect("start the intruder");

    let deadline = Instant::now() + Duration::from_secs(120);
    let intruder = {
        let mut intruder = intruder;
        wait_for(&mut intruder, deadline, "the intruder");
        finish(intruder)
    };
    assert_eq!(
        intruder.status.code(),
        Some(2),
        "{}",
        text(&intruder.stderr)
    );
    assert!(
        text(&intruder.stderr).contains("could not join the cluster"),
        "{}",
        text(&intruder.stderr)
    );
    // Said at its first refused handshake, before the join timeout, and again in its last
    // line.
    let said = text(&intruder.stderr);
    let first = said.find("closed the connection during the handshake");
    let last = said.find("error: could not join");
    assert!(first.is_some() && first < last, "{said}");
    assert!(
        said.lines().last().unwrap_or_default().contains("refused"),
        "{said}"
    );
    let first_worker = 1 + SERVERS as usize;
    for (name, child) in &mut children.0[first_worker..] {
        wait_for(child, deadline, name);
    }
    workers_done.store(true, Ordering::Relaxed);
    let rounds = attacker.join().expect("the attack ran");
    // Every garbage connection is counted where an operator looks.
    let health = http_get(&metrics_addr, "/healthz");
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let scrape = http_get(&metrics_addr, "/metrics");
    let labels = "{node=\"n1\",role=\"server\"}";
    let counter = |name: &str| -> u64 {
        let prefix = format!("pserver_{name}_total{labels} ");
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in:\n{scrape}"))
    };
    assert!(
        counter("tcp_handshakes_refused") >= 3 * rounds as u64,
        "{scrape}"
    );
    assert!(counter("frames_received") > 0, "{scrape}");
    let attack_secs = attack_began.elapsed().as_secs();
    for (name, child) in children.0.drain(first_worker..) {
        let out = finish(child);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains(&format!("iterations={ITERATIONS}")),
            "{name}: {}",
            text(&out.stdout)
        );
    }
    // The job is done: stop servers and coordinator as an operator would.
    for (_, child) in &children.0 {
        let status = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }
    let mut stopped = Vec::new();
    for (name, mut child) in children.0.drain(..) {
        wait_for(&mut child, deadline, &name);
        stopped.push((name, child.wait_with_output().expect("output")));
    }
    for (name, out) in &stopped {
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }
    let server_log = text(&stopped[1].1.stderr);
    // Every garbage connection was refused, but the log says so in at most two lines per
    // 10 s window: the first refusal in full, then a summary of the rest.
    let lines = server_log.matches("refused").count();
    let windows = attack_secs / 10 + 2;
    assert!(
        server_log.contains("refused a connection from 127.0.0.1:"),
        "{server_log}"
    );
    assert!(
        (1..=2 * windows as usize).contains(&lines),
        "{rounds} rounds of garbage in {attack_secs} s, {lines} lines:\n{server_log}"
    );
    let coordinator_log = text(&stopped[0].1.stderr);
    assert!(
        coordinator_log.contains("authentication failed: wrong secret"),
        "the coordinator does not say why it refused the intruder:\n{coordinator_log}"
    );

    let workers = (SERVERS + 1..=SERVERS + WORKERS).map(NodeId);
    assert_eq!(
        summed_dumps(&dumps),
        expected_totals(KEYS, ITERATIONS, workers)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_server_killed_mid_job_over_tcp_loses_no_push() {
    const SERVERS3: u32 = 3;
    const WORKERS2: u32 = 2;
    const LONG: u32 = 40;
    let dir = std::env::temp_dir().join(format!("pserver-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret.key"), "s3cret-for-tests\n").unwrap();
    let ports: Vec<u16> = (0..=SERVERS3 + WORKERS2).map(|_| free_port()).collect();
    // One replica per range, the cluster file's default with more than one server.
    let config = write_cluster(&dir, &ports, SERVERS3, "bounded:1", LONG, 25);
    let config_arg = config.to_str().unwrap();
    let mut children = Children(Vec::new());
    let dumps: Vec<PathBuf> = (1..=SERVERS3)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    let mut start = |role: &str, id: u32, extra: &[&str], log: &str| {
        let id_arg = id.to_string();
        let mut args = vec![role, "--config", config_arg, "--id", &id_arg];
        args.extend_from_slice(extra);
        let child = pserver(&args)
            .env("RUST_LOG", log)
            .spawn()
            .expect("start a node");
        children.0.push((format!("{role} {id}"), child));
    };
    start("coordinator", 0, &[], "warn");
    for s in 1..=SERVERS3 {
        let dump = dumps[s as usize - 1].to_str().unwrap().to_owned();
        start("server", s, &["--dump", &dump], "warn");
    }
    for w in SERVERS3 + 1..=SERVERS3 + WORKERS2 {
        start("worker", w, &[], "info");
    }
    // Kill the first server once the first worker is a few iterations into the job.
    let first_worker = 1 + SERVERS3 as usize;
    let stderr = children.0[first_worker]
        .1
        .stderr
        .take()
        .expect("piped stderr");
    let (seen, progress) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut log = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("iteration done") {
                let _ = seen.send(());
            }
            log += &line;
            log.push('\n');
        }
        log
    });
    for done in 0..5 {
        if progress.recv_timeout(Duration::from_secs(60)).is_err() {
            // Stopping every node closes the worker's stderr, so its log can be shown.
            drop(children);
            let log = reader.join().unwrap_or_default();
            panic!("the first worker finished {done} iterations, then none for 60 s:\n{log}");
        }
    }
    children.0[1].1.kill().expect("kill server 1");
    let deadline = Instant::now() + Duration::from_secs(120);
    for (name, child) in &mut children.0[first_worker..] {
        wait_for(child, deadline, name);
    }
    let worker_log = reader.join().expect("the worker's log");
    for (name, child) in children.0.drain(first_worker..) {
        let out = finish(child);
        assert!(
            out.status.success(),
            "{name}: {}\n{worker_log}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains(&format!("iterations={LONG}")),
            "{name}"
        );
    }
    for (_, child) in children.0.iter().filter(|(name, _)| name != "server 1") {
        let status = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }
    let mut stopped = Vec::new();
    for (name, mut child) in children.0.drain(..) {
        wait_for(&mut child, deadline, &name);
        stopped.push((name, child.wait_with_output().expect("output")));
    }
    let coordinator_log = text(&stopped[0].1.stderr);
    assert!(
        coordinator_log.contains("node declared dead"),
        "the coordinator never noticed: {coordinator_log}"
    );
    let workers = (SERVERS3 + 1..=SERVERS3 + WORKERS2).map(NodeId);
    assert_eq!(
        summed_dumps(&dumps[1..]),
        expected_totals(KEYS, LONG, workers),
        "the survivors hold every push exactly once"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_server_sent_sigterm_leaves_the_job_first_and_nothing_acknowledged_is_lost() {
    const LONG: u32 = 60;
    let shape = (3, 2);
    let (dir, _, config) = script_cluster("sigterm", shape, "bounded:1", LONG, 25);
    let dumps: Vec<PathBuf> = (1..=3)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    let log = |role: &str| if role == "worker" { "info" } else { "warn" };
    let mut children = start_nodes(&config, shape, log, |id| match id {
        1..=3 => vec![
            "--dump".into(),
            dumps[id as usize - 1].display().to_string(),
        ],
        _ => Vec::new(),
    });
    let (progress, worker_log) = watch_log(&mut children.0[4].1, "iteration done");
    for done in 0..5 {
        assert!(
            progress.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the first worker finished {done} iterations, then none for 60 s"
        );
    }
    signal(&children.0[1].1, "-TERM");
    let outputs = wait_all(&mut children, Instant::now() + Duration::from_secs(120));
    for (name, out) in &outputs {
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }
    let left = text(&outputs["server 1"].stdout);
    assert!(left.contains("ended=left"), "{left}");
    // It handed its ranges over: it was never declared dead, and the others hold every push.
    let coordinator = text(&outputs["coordinator 0"].stderr);
    assert!(!coordinator.contains("node declared dead"), "{coordinator}");
    let worker_log = worker_log.join().expect("the worker's log");
    assert_eq!(
        summed_dumps(&dumps[1..]),
        expected_totals(KEYS, LONG, (4..=5).map(NodeId)),
        "{worker_log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The smallest replicated cluster, two servers with one replica, on real processes: a server
/// killed with `kill -9` is taken off the ring and the job goes on on the other, said at WARN;
/// started again, it copies every range and the ring holds a replica again; then the other
/// server is killed, and the restarted one ends the job holding every push exactly once. A
/// `quick` restart comes before the coordinator missed the server: the new process is taken
/// off the ring under its earlier process's name, and joins.
fn two_servers_with_one_replica_survive_kill_9_and_restart(transport: &str, quick: bool) {
    const LONG: u32 = 600;
    let shape = (2, 2);
    let name = format!("two-k1-{transport}-{quick}");
    let (dir, _, config) = script_cluster(&name, shape, "bounded:1", LONG, 25);
    let file = std::fs::read_to_string(&config).unwrap();
    let chosen = format!("transport = \"{transport}\"\n[job]\n");
    std::fs::write(&config, file.replacen("[job]\n", &chosen, 1)).unwrap();
    let dumps: Vec<PathBuf> = (1..=2)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    let dump_of = |id: u32| {
        vec![
            "--dump".to_owned(),
            dumps[id as usize - 1].display().to_string(),
        ]
    };
    let log = |role: &str| if role == "server" { "warn" } else { "info" };
    let mut children = start_nodes(&config, shape, log, |id| match id {
        1 | 2 => dump_of(id),
        _ => Vec::new(),
    });
    let (coordinator, coordinator_log) = log_lines(&mut children.0[0].1);
    let (progress, worker_log) = watch_log(&mut children.0[3].1, "iteration done");
    for done in 0..5 {
        assert!(
            progress.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the first worker finished {done} iterations, then none for 60 s"
        );
    }
    let fewer = "fewer replicas than asked";
    children.0[2].1.kill().expect("kill -9 server 2");
    // Gone before its port is taken again.
    children.0[2].1.wait().expect("reap server 2");
    if !quick {
        assert!(
            line_with(&coordinator, fewer, Duration::from_secs(30)),
            "the coordinator takes server 2 off the ring"
        );
    }
    let mut args = vec!["server", "--config", config.to_str().unwrap(), "--id", "2"];
    let dump = dump_of(2);
    args.extend(dump.iter().map(String::as_str));
    let restarted = pserver(&args)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("restart");
    let (_, killed) = std::mem::replace(&mut children.0[2], ("server 2".into(), restarted));
    let _ = finish(killed);
    if quick {
        assert!(
            line_with(&coordinator, fewer, Duration::from_secs(30)),
            "the coordinator takes the earlier process off the ring"
        );
    }
    assert!(
        line_with(
            &coordinator,
            "holds replicas again",
            Duration::from_secs(60)
        ),
        "the restarted server rejoins and the ring holds a replica again"
    );
    children.0[1].1.kill().expect("kill -9 server 1");
    assert!(
        line_with(&coordinator, fewer, Duration::from_secs(30)),
        "the coordinator takes server 1 off the ring"
    );
    let (_, killed) = children.0.remove(1);
    let _ = finish(killed);
    let outputs = wait_all(&mut children, Instant::now() + Duration::from_secs(120));
    let coordinator_log = coordinator_log.join().expect("the coordinator's log");
    let worker_log = worker_log.join().expect("the worker's log");
    for (name, out) in &outputs {
        assert!(
            out.status.success(),
            "{name}: {}\n{coordinator_log}",
            text(&out.stderr)
        );
        if name.starts_with("worker") {
            assert!(text(&out.stdout).contains(&format!("iterations={LONG}")));
        }
    }
    assert!(
        text(&outputs["server 2"].stdout).contains("ended=job-finished"),
        "the job ends by itself"
    );
    assert!(
        !coordinator_log.contains("every holder of this range failed"),
        "{coordinator_log}"
    );
    assert_eq!(
        summed_dumps(&dumps[1..]),
        expected_totals(KEYS, LONG, (3..=4).map(NodeId)),
        "the restarted server holds every push exactly once\n{worker_log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_servers_with_one_replica_survive_kill_9_and_restart_over_tcp() {
    two_servers_with_one_replica_survive_kill_9_and_restart("tcp", false);
}

#[test]
fn two_servers_with_one_replica_survive_kill_9_and_restart_over_udp() {
    two_servers_with_one_replica_survive_kill_9_and_restart("udp", false);
}

#[test]
fn two_servers_with_one_replica_survive_kill_9_and_a_restart_before_it_is_missed_over_udp() {
    two_servers_with_one_replica_survive_kill_9_and_restart("udp", true);
}

/// Every process of a job killed at once (as a power cut would), then every one started again
/// with the servers given --resume: the job goes on from the last checkpoint every server wrote,
/// no iteration before it pushed again, and ends with exactly what the workers pushed.
#[test]
fn every_process_killed_at_once_and_started_with_resume_goes_on_from_the_last_checkpoint() {
    const LONG: u32 = 120;
    const EVERY: u32 = 10;
    let shape = (2, 2);
    let (dir, _, config) = script_cluster("power-cut", shape, "bounded:1", LONG, 20);
    let file = std::fs::read_to_string(&config).unwrap();
    let every = format!("[job]\ncheckpoint_every = {EVERY}\n");
    let metrics = format!(
        "role = \"coordinator\"\nmetrics = \"127.0.0.1:{}\"\n",
        free_port()
    );
    let file =
        file.replacen("[job]\n", &every, 1)
            .replacen("role = \"coordinator\"\n", &metrics, 1);
    std::fs::write(&config, file).unwrap();
    let dumps: Vec<PathBuf> = (1..=2)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    let server_args = |id: u32, resume: bool| -> Vec<String> {
        let mut args = vec![
            "--checkpoint-dir".to_owned(),
            dir.join(format!("ckpt-{id}")).display().to_string(),
            "--dump".to_owned(),
            dumps[id as usize - 1].display().to_string(),
        ];
        if resume {
            args.push("--resume".to_owned());
        }
        args
    };
    let log = |_: &str| "info";
    let mut children = start_nodes(&config, shape, log, |id| match id {
        1 | 2 => server_args(id, false),
        _ => Vec::new(),
    });
    let (coordinator, _) = log_lines(&mut children.0[0].1);
    assert!(
        line_with(
            &coordinator,
            "checkpoint 30 complete",
            Duration::from_secs(90)
        ),
        "the servers write the checkpoints of iterations 10, 20 and 30"
    );
    let (_, status) = status_until(&config, "checkpoint before iteration");
    assert!(
        status.contains(&format!(", every {EVERY}")),
        "pserver status names the last checkpoint:\n{status}"
    );
    for (name, child) in &mut children.0 {
        child
            .kill()
            .unwrap_or_else(|e| panic!("kill -9 {name}: {e}"));
    }
    for (_, child) in &mut children.0 {
        let _ = child.wait();
    }
    let mut children = start_nodes(&config, shape, log, |id| match id {
        1 | 2 => server_args(id, true),
        _ => Vec::new(),
    });
    let (worker, worker_log) = log_lines(&mut children.0[3].1);
    assert!(
        line_with(&worker, "configuration received", Duration::from_secs(60)),
        "the job starts again"
    );
    let outputs = wait_all(&mut children, Instant::now() + Duration::from_secs(120));
    let worker_log = worker_log.join().expect("the worker's log");
    for (name, out) in &outputs {
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }
    for s in ["server 1", "server 2"] {
        let log = text(&outputs[s].stderr);
        assert!(
            log.contains("resumed from the checkpoint of iteration"),
            "{s}: {log}"
        );
    }
    // The worker pushed only the iterations after the cut the job resumed from.
    let pushes = fields(&text(&outputs["worker 3"].stdout), "pushes=")[0] as u64;
    assert!(
        pushes <= u64::from(LONG - 30) && pushes % u64::from(EVERY) == 0,
        "resumed at a cut of 30 or later: {pushes} pushes\n{worker_log}"
    );
    assert_eq!(
        summed_dumps(&dumps),
        expected_totals(KEYS, LONG, (3..=4).map(NodeId)),
        "every iteration counted once across the two runs"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A script cluster of `servers` and `workers` in a fresh directory named after `name`, its
/// workers computing `compute_ms` an iteration: the directory, the ports by node id, and the
/// cluster file.
fn script_cluster(
    name: &str,
    (servers, workers): (u32, u32),
    consistency: &str,
    iterations: u32,
    compute_ms: u64,
) -> (PathBuf, Vec<u16>, PathBuf) {
    let dir = std::env::temp_dir().join(format!("pserver-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret.key"), "s3cret-for-tests\n").unwrap();
    let ports: Vec<u16> = (0..=servers + workers).map(|_| free_port()).collect();
    let config = write_cluster(&dir, &ports, servers, consistency, iterations, compute_ms);
    (dir, ports, config)
}

/// Starts every node of `config` (the coordinator, `servers` servers, then workers) with the
/// log level `log` gives its role and the arguments `extra` gives its id.
fn start_nodes(
    config: &Path,
    (servers, workers): (u32, u32),
    log: impl Fn(&str) -> &'static str,
    extra: impl Fn(u32) -> Vec<String>,
) -> Children {
    let mut children = Children(Vec::new());
    for id in 0..=servers + workers {
        let role = match id {
            0 => "coordinator",
            i if i <= servers => "server",
            _ => "worker",
        };
        let id_arg = id.to_string();
        let extra = extra(id);
        let mut args = vec![role, "--config", config.to_str().unwrap(), "--id", &id_arg];
        args.extend(extra.iter().map(String::as_str));
        let child = pserver(&args)
            .env("RUST_LOG", log(role))
            .spawn()
            .expect("start a node");
        children.0.push((format!("{role} {id}"), child));
    }
    children
}

#[test]
fn a_worker_that_finishes_leaves_and_is_never_declared_dead() {
    let shape = (SERVERS, WORKERS);
    let (dir, _, config) = script_cluster("leave", shape, "eventual", ITERATIONS, 0);
    let log = |role: &str| if role == "server" { "warn" } else { "info" };
    let mut children = start_nodes(&config, shape, log, |_| Vec::new());
    let (leaves, coordinator_log) = watch_log(&mut children.0[0].1, "worker left the job");
    let deadline = Instant::now() + Duration::from_secs(120);
    let first_worker = 1 + SERVERS as usize;
    for (name, mut child) in children.0.drain(first_worker..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().expect("output");
        let err = text(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        assert!(err.contains("left the job"), "{name}: {err}");
    }
    // The coordinator took each worker out at its word.
    for left in 0..WORKERS {
        assert!(
            leaves.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the coordinator saw {left} of {WORKERS} workers leave"
        );
    }
    for (_, child) in &children.0 {
        signal(child, "-INT");
    }
    for (name, mut child) in children.0.drain(..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().expect("output");
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }
    let log = coordinator_log.join().expect("the coordinator's log");
    assert!(!log.contains("node declared dead"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_stopped_by_its_operator_leaves_the_job_and_says_so() {
    const LONG: u32 = 200;
    let shape = (SERVERS, WORKERS);
    let (dir, _, config) = script_cluster("stop", shape, "bounded:1", LONG, 25);
    let log = |role: &str| if role == "server" { "warn" } else { "info" };
    let mut children = start_nodes(&config, shape, log, |_| Vec::new());
    let (leaves, coordinator_log) = watch_log(&mut children.0[0].1, "worker left the job");
    let last = children.0.len() - 1;
    let (iterations, stopped_log) = watch_log(&mut children.0[last].1, "iteration done");
    for _ in 0..3 {
        assert!(iterations.recv_timeout(Duration::from_secs(60)).is_ok());
    }
    signal(&children.0[last].1, "-INT");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (name, mut stopped) = children.0.remove(last);
    wait_for(&mut stopped, deadline, &name);
    assert_eq!(stopped.wait().expect("status").code(), Some(130), "{name}");
    let said = stopped_log.join().expect("the stopped worker's log");
    assert!(said.contains("left the job"), "{said}");
    assert!(
        leaves.recv_timeout(Duration::from_secs(30)).is_ok(),
        "the coordinator never saw the stopped worker leave"
    );
    // The others are not held back by it: bounded delay goes on without its progress.
    let deadline = Instant::now() + Duration::from_secs(120);
    for (name, mut child) in children.0.drain(1 + SERVERS as usize..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().expect("output");
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains(&format!("iterations={LONG}")),
            "{name}"
        );
    }
    for (_, child) in &children.0 {
        signal(child, "-INT");
    }
    for (name, mut child) in children.0.drain(..) {
        wait_for(&mut child, deadline, &name);
    }
    let log = coordinator_log.join().expect("the coordinator's log");
    assert!(!log.contains("node declared dead"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lost_range_fails_the_job() {
    const SERVERS4: u32 = 4;
    const WORKERS2: u32 = 2;
    const LONG: u32 = 60;
    let shape = (SERVERS4, WORKERS2);
    // One replica per range: two servers killed at once lose the ranges they both held.
    let (dir, _, config) = script_cluster("lost", shape, "bounded:1", LONG, 25);
    let log = |role: &str| if role == "worker" { "info" } else { "warn" };
    let mut children = start_nodes(&config, shape, log, |_| Vec::new());
    let (losses, coordinator_log) =
        watch_log(&mut children.0[0].1, "every holder of this range failed");
    let first_worker = 1 + SERVERS4 as usize;
    let (iterations, first_log) = watch_log(&mut children.0[first_worker].1, "iteration done");
    for _ in 0..3 {
        assert!(iterations.recv_timeout(Duration::from_secs(60)).is_ok());
    }
    for victim in [1, 2] {
        children.0[victim].1.kill().expect("kill a server");
    }
    assert!(
        losses.recv_timeout(Duration::from_secs(60)).is_ok(),
        "the coordinator never heard of the loss"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first_log = Some(first_log);
    for (name, mut child) in children.0.drain(first_worker..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().expect("output");
        let err = match first_log.take() {
            Some(reader) => reader.join().expect("the first worker's log"),
            None => text(&out.stderr),
        };
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        let last = err.trim().lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: the job lost key range") && last.contains("allow_loss"),
            "{name}: {last}"
        );
    }
    for (_, child) in children.0.iter().skip(3) {
        signal(child, "-INT");
    }
    signal(&children.0[0].1, "-INT");
    drop(children);
    drop(coordinator_log.join());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A script cluster of `shape` (long enough never to finish) whose workers give up after
/// `stall_secs` without progress, started with the log levels `log` gives, once its first
/// worker is three iterations in: the directory, the nodes, the first worker's index and the
/// reader of its log.
fn stalling_cluster(
    name: &str,
    shape: (u32, u32),
    stall_secs: u32,
    ring: &str,
    log: impl Fn(&str) -> &'static str,
) -> (PathBuf, Children, usize, std::thread::JoinHandle<String>) {
    const LONG: u32 = 400;
    let (dir, _, config) = script_cluster(name, shape, "bounded:1", LONG, 25);
    let text_of_config = std::fs::read_to_string(&config).unwrap();
    let limit = format!("{ring}[job]\nstall_limit_secs = {stall_secs}\n");
    std::fs::write(&config, text_of_config.replacen("[job]\n", &limit, 1)).unwrap();
    let mut children = start_nodes(&config, shape, log, |_| Vec::new());
    let first_worker = 1 + shape.0 as usize;
    let (iterations, first_log) = watch_log(&mut children.0[first_worker].1, "iteration done");
    for _ in 0..3 {
        assert!(iterations.recv_timeout(Duration::from_secs(60)).is_ok());
    }
    (dir, children, first_worker, first_log)
}

/// Waits for every worker from `first` on to end with status 1 and, last, the stall limit's
/// one-line reason, whose tail `why` holds; returns each worker's log.
fn workers_stall(
    children: &mut Children,
    first: usize,
    first_log: std::thread::JoinHandle<String>,
    why: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first_log = Some(first_log);
    let mut logs = Vec::new();
    for (name, mut child) in children.0.drain(first..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().expect("output");
        let err = match first_log.take() {
            Some(reader) => reader.join().expect("the first worker's log"),
            None => text(&out.stderr),
        };
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        let last = err.trim().lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: no request completed for") && why(last),
            "{name}: {last}"
        );
        logs.push((name, err));
    }
    logs
}

#[test]
fn a_worker_stalled_on_an_unavailable_range_says_why_and_ends() {
    let shape = (3, 2);
    let log = |role: &str| if role == "worker" { "info" } else { "warn" };
    // The job keeps one replica or stalls.
    let ring = "[ring]\nmin_replicas = 1\n\n";
    let (dir, mut children, first_worker, first_log) =
        stalling_cluster("stall", shape, 4, ring, log);
    // Two of three servers gone with one replica a range, and a job that keeps one: the one
    // left alone could hold none, so a silent server is kept on the ring, and its ranges are
    // served by nobody.
    for victim in [1, 2] {
        children.0[victim].1.kill().expect("kill a server");
    }
    let waiting = |last: &str| last.contains("the stall limit: waiting for server n");
    for (name, err) in workers_stall(&mut children, first_worker, first_log, waiting) {
        assert!(err.contains("nothing completed for"), "{name}: {err}");
    }
    for (_, child) in children.0.iter().skip(3) {
        signal(child, "-INT");
    }
    signal(&children.0[0].1, "-INT");
    let (_, coordinator) = children.0.remove(0);
    let log = text(&coordinator.wait_with_output().expect("output").stderr);
    let degraded = log.matches("but kept on the ring").count();
    assert!((1..=2).contains(&degraded), "said {degraded} times:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_silent_coordinator_is_noticed_and_a_worker_it_leaves_stalled_ends() {
    let shape = (2, 2);
    let (dir, mut children, first_worker, first_log) =
        stalling_cluster("silent", shape, 6, "", |_| "info");
    // The coordinator dies, then a server: nobody is left to declare the server dead, and
    // every request to its ranges waits.
    children.0[0].1.kill().expect("kill the coordinator");
    children.0[1].1.kill().expect("kill a server");
    let silent = |last: &str| last.contains("the coordinator has been silent for");
    for (name, err) in workers_stall(&mut children, first_worker, first_log, silent) {
        let said = err.matches("the coordinator has not answered for").count();
        assert_eq!(said, 1, "{name}: {err}");
    }
    // The server left says so too, once, in plain text: its log goes to a pipe. It can
    // neither take part in a change nor hear that the job ended: past the stall limit it
    // ends by itself, saying why.
    wait_for(
        &mut children.0[2].1,
        Instant::now() + Duration::from_secs(60),
        "the server left",
    );
    let (_, server) = children.0.remove(2);
    let out = server.wait_with_output().expect("output");
    let log = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    let last = log.trim().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: the coordinator has been silent for"),
        "{log}"
    );
    assert_eq!(
        log.matches("the coordinator has not answered for").count(),
        1,
        "{log}"
    );
    assert!(
        !log.contains('\x1b'),
        "escape codes in a piped log: {log:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_fenced_server_process_exits_and_frees_its_port() {
    const SERVERS3: u32 = 3;
    const WORKERS2: u32 = 2;
    const LONG: u32 = 60;
    let shape = (SERVERS3, WORKERS2);
    // One replica per range: the others go on without the paused server and lose nothing.
    let (dir, ports, config) = script_cluster("fence", shape, "bounded:1", LONG, 25);
    let dumps: Vec<PathBuf> = (1..=SERVERS3)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    let log = |role: &str| if role == "worker" { "info" } else { "warn" };
    let dump_of = |id: u32| match id.checked_sub(1).and_then(|i| dumps.get(i as usize)) {
        Some(dump) => vec!["--dump".to_owned(), dump.to_str().unwrap().to_owned()],
        None => Vec::new(),
    };
    let mut children = start_nodes(&config, shape, log, dump_of);
    let (deaths, coordinator_log) = watch_log(&mut children.0[0].1, "node declared dead");
    let first_worker = 1 + SERVERS3 as usize;
    let (iterations, worker_log) = watch_log(&mut children.0[first_worker].1, "iteration done");
    for done in 0..3 {
        if iterations.recv_timeout(Duration::from_secs(60)).is_err() {
            drop(children);
            let log = worker_log.join().unwrap_or_default();
            panic!("the first worker finished {done} iterations, then none for 60 s:\n{log}");
        }
    }
    // Pause server 1 until the coordinator declares it dead, then let it run again.
    signal(&children.0[1].1, "-STOP");
    let declared = deaths.recv_timeout(Duration::from_secs(60));
    signal(&children.0[1].1, "-CONT");
    assert!(
        declared.is_ok(),
        "the coordinator never declared the paused server dead"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let (name, mut fenced) = children.0.remove(1);
    wait_for(&mut fenced, deadline, &name);
    let out = fenced.wait_with_output().expect("output");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{name}: {err}");
    assert!(
        err.contains("server n1 was removed from the cluster (fenced)"),
        "{name}: {err}"
    );
    TcpListener::bind(("127.0.0.1", ports[1])).expect("the fenced server's port is free");
    // The rest of the job runs to its end, and the survivors hold every push exactly once.
    let deadline = Instant::now() + Duration::from_secs(120);
    let workers_at = first_worker - 1;
    for (name, mut child) in children.0.drain(workers_at..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().expect("output");
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains(&format!("iterations={LONG}")),
            "{name}"
        );
    }
    drop(worker_log.join());
    for (_, child) in &children.0 {
        signal(child, "-INT");
    }
    for (name, mut child) in children.0.drain(..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().expect("output");
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }
    drop(coordinator_log.join());
    let workers = (SERVERS3 + 1..=SERVERS3 + WORKERS2).map(NodeId);
    assert_eq!(
        summed_dumps(&dumps[1..]),
        expected_totals(KEYS, LONG, workers),
        "the survivors hold every push exactly once"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_process_over_a_lossy_duplicating_network_ends_with_the_same_exact_totals() {
    for consistency in [Consistency::BoundedDelay(2), Consistency::Sequential] {
        lossy_local_run(consistency);
    }
}

fn lossy_local_run(consistency: Consistency) {
    let consistency = consistency.to_string();
    let (servers, workers, keys, iterations) = (
        SERVERS.to_string(),
        WORKERS.to_string(),
        KEYS.to_string(),
        ITERATIONS.to_string(),
    );
    let out = pserver(&[
        "local",
        "--servers",
        &servers,
        "--workers",
        &workers,
        "--keys",
        &keys,
        "--iterations",
        &iterations,
        "--consistency",
        &consistency,
        "--drop",
        "0.1",
        "--dup",
        "0.05",
        "--seed",
        "7",
    ])
    .output()
    .expect("run pserver local");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let finished: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("worker ") && l.contains(&format!("iterations={ITERATIONS} ")))
        .collect();
    assert_eq!(finished.len(), WORKERS as usize, "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.contains(" totals=exact "), "{stdout}");
}

#[test]
fn a_bad_cluster_file_a_port_in_use_or_no_coordinator_is_one_line_and_status_2() {
    let dir = std::env::temp_dir().join(format!("pserver-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("nope.toml");
    let out = pserver(&["server", "--config", missing.to_str().unwrap(), "--id", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("nope.toml: cannot read"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut ports: Vec<u16> = (0..=SERVERS + WORKERS).map(|_| free_port()).collect();
    ports[1] = port;
    let config = write_cluster_file(&dir, &ports, "sequential", ITERATIONS);
    std::fs::write(dir.join("secret.key"), "x").unwrap();
    let out = pserver(&["server", "--config", config.to_str().unwrap(), "--id", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // A dump file that cannot be written is said before the node waits for anybody.
    let nowhere = dir.join("no-such-dir").join("dump.txt");
    let out = pserver(&[
        "server",
        "--config",
        config.to_str().unwrap(),
        "--id",
        "2",
        "--join-timeout-secs",
        "20",
        "--dump",
        nowhere.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("dump.txt: cannot write"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // Nobody else runs: the coordinator is unreachable.
    let out = pserver(&[
        "worker",
        "--config",
        config.to_str().unwrap(),
        "--id",
        &(SERVERS + 1).to_string(),
        "--join-timeout-secs",
        "1",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("could not join the cluster"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{}", ports[0])), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    std::fs::write(&config, "cluster_id = \"t\"\nconsistency = \"soon\"\n").unwrap();
    let out = pserver(&["worker", "--config", config.to_str().unwrap(), "--id", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cluster.toml: consistency:"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes a logistic-regression cluster into `dir` (a slice of the shipped data, one server,
/// `workers` workers, `epochs` epochs) and returns its cluster file and the nodes' roles.
fn lr_cluster(dir: &Path, workers: usize, epochs: u32) -> (String, Vec<&'static str>) {
    lr_cluster_with(dir, workers, epochs, "", |_| {})
}

/// [`lr_cluster`], with `job` added to the `[job]` table and the training rows put in the
/// order `arrange` leaves them.
fn lr_cluster_with(
    dir: &Path,
    workers: usize,
    epochs: u32,
    job: &str,
    arrange: impl FnOnce(&mut Vec<String>),
) -> (String, Vec<&'static str>) {
    lr_cluster_of(dir, 1, workers, epochs, job, arrange)
}

#[test]
fn logistic_regression_trains_across_processes_each_worker_on_its_own_shard() {
    let dir = std::env::temp_dir().join(format!("pserver-lr-cluster-{}", std::process::id()));
    let (config, roles) = lr_cluster(&dir, 2, 3);
    let mut children = Children(Vec::new());
    for (id, role) in roles.iter().enumerate() {
        let child = pserver(&[role, "--config", &config, "--id", &id.to_string()])
            .spawn()
            .expect("start a node");
        children.0.push((format!("{role} {id}"), child));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut outputs = Vec::new();
    for (name, child) in children.0.drain(2..) {
        let mut child = child;
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{name}: {}", text_of(&out.stderr));
        outputs.push(text_of(&out.stdout));
    }
    // The first worker measured the model after every epoch; the last measurement is good.
    let first = &outputs[0];
    let aucs = fields(first, "test_auc=");
    assert_eq!(aucs.len(), 3, "{first}");
    assert!(aucs[2] >= 0.85, "{aucs:?}");
    // The other worker trained on its own rows, epoch by epoch, without a test set.
    assert_eq!(
        outputs[1].matches("train_logloss=").count(),
        3,
        "{}",
        outputs[1]
    );
    assert!(!outputs[1].contains("test_auc"));
    let rows: f64 = outputs.iter().map(|o| fields(o, "rows=")[2]).sum();
    assert_eq!(rows as usize, LR_ROWS, "every row once per epoch");
    children.interrupt();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_killed_mid_training_has_its_share_taken_over_by_a_live_worker() {
    const EPOCHS: u32 = 12;
    let dir = std::env::temp_dir().join(format!("pserver-lr-kill-{}", std::process::id()));
    let (config, roles) = lr_cluster(&dir, 3, EPOCHS);
    let mut children = Children(Vec::new());
    for (id, role) in roles.iter().enumerate() {
        let log = if *role == "worker" { "info" } else { "warn" };
        let child = pserver(&[role, "--config", &config, "--id", &id.to_string()])
            .env("RUST_LOG", log)
            .spawn()
            .expect("start a node");
        children.0.push((format!("{role} {id}"), child));
    }
    // Kill the last worker once it has finished its first epoch.
    let victim = children.0.len() - 1;
    let stdout = children.0[victim].1.stdout.take().expect("piped stdout");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let first = lines.next().expect("an epoch line").expect("utf-8");
    assert!(first.contains("iter=1 "), "{first}");
    children.0[victim].1.kill().expect("kill the worker");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut outputs = Vec::new();
    for (name, child) in children.0.drain(2..victim) {
        let mut child = child;
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().unwrap();
        let stderr = text_of(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        outputs.push((text_of(&out.stdout), stderr));
    }
    for (out, _) in &outputs {
        assert_eq!(fields(out, "rows=").len(), EPOCHS as usize, "{out}");
    }
    assert!(
        outputs
            .iter()
            .any(|(_, log)| log.contains("took over the share")),
        "nobody took the dead worker's share"
    );
    // In the last epoch the two survivors trained on all the rows, the dead worker's included.
    let last: f64 = outputs
        .iter()
        .map(|(out, _)| fields(out, "rows=")[EPOCHS as usize - 1])
        .sum();
    assert_eq!(last as usize, LR_ROWS);
    let aucs = fields(&outputs[0].0, "test_auc=");
    assert!(aucs[EPOCHS as usize - 1] >= 0.85, "{aucs:?}");
    children.interrupt();
    let _ = std::fs::remove_dir_all(&dir);
}

fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn separate_processes_over_udp_end_with_exactly_what_the_workers_pushed() {
    let dir = std::env::temp_dir().join(format!("pserver-udp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret.key"), "s3cret-for-tests\n").unwrap();
    let ports: Vec<u16> = (0..=SERVERS + WORKERS).map(|_| free_port()).collect();
    let config = write_cluster_file(&dir, &ports, "bounded:2", ITERATIONS);
    let text_of = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text_of.replacen(
            "cluster_id = \"test\"\n",
            "cluster_id = \"test\"\ntransport = \"udp\"\n",
            1,
        ),
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let mut children = Children(Vec::new());
    let dumps: Vec<PathBuf> = (1..=SERVERS)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    for id in 0..=SERVERS + WORKERS {
        let role = match id {
            0 => "coordinator",
            i if i <= SERVERS => "server",
            _ => "worker",
        };
        let id_arg = id.to_string();
        let mut args = vec![role, "--config", config_arg, "--id", &id_arg];
        let dump;
        if role == "server" {
            dump = dumps[id as usize - 1].to_str().unwrap().to_owned();
            args.extend(["--dump", &dump]);
        }
        children.0.push((
            format!("{role} {id}"),
            pserver(&args).spawn().expect("start a node"),
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let first_worker = 1 + SERVERS as usize;
    for (name, child) in &mut children.0[first_worker..] {
        wait_for(child, deadline, name);
    }
    for (name, child) in children.0.drain(first_worker..) {
        let out = finish(child);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }
    // Every worker left: the servers and the coordinator end by themselves.
    for (name, mut child) in children.0.drain(..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().expect("output");
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        if name.starts_with("server") {
            assert!(
                text(&out.stdout).contains("ended=job-finished"),
                "{name}: {}",
                text(&out.stdout)
            );
        }
    }
    let workers = (SERVERS + 1..=SERVERS + WORKERS).map(NodeId);
    assert_eq!(
        summed_dumps(&dumps),
        expected_totals(KEYS, ITERATIONS, workers)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

impl Children {
    /// Asks every node still running to stop, as Ctrl-C would.
    fn interrupt(&self) {
        for (_, child) in &self.0 {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
        }
    }
}

/// Starts every node of the cluster file `config`, in order.
fn start_all(config: &str, roles: &[&str]) -> Children {
    let mut children = Children(Vec::new());
    for (id, role) in roles.iter().enumerate() {
        let child = pserver(&[role, "--config", config, "--id", &id.to_string()])
            .env("RUST_LOG", if *role == "worker" { "info" } else { "warn" })
            .spawn()
            .expect("start a node");
        children.0.push((format!("{role} {id}"), child));
    }
    children
}

/// Waits (up to two minutes) for the workers of `children`, started by [`start_all`] after a
/// coordinator and a server, to end well; returns each one's stdout. The coordinator and the
/// server stay in `children`.
fn workers_stdout(children: &mut Children) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut outputs = Vec::new();
    for (name, mut child) in children.0.drain(2..) {
        wait_for(&mut child, deadline, &name);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{name}: {}", text_of(&out.stderr));
        outputs.push(text_of(&out.stdout));
    }
    outputs
}

#[test]
fn the_cluster_job_trains_every_row_of_a_skewed_share_and_saves_the_best_epoch() {
    const EPOCHS: u32 = 3;
    let dir = std::env::temp_dir().join(format!("pserver-lr-skewed-{}", std::process::id()));
    // The second half's values spelt out at length: cut by bytes, the first worker's share
    // holds far more rows than the second's.
    // Every row trained: none held out to choose the epoch, which the test rows choose.
    let job = "save = \"model.bin\"\nvalidation_fraction = 0\n";
    let (config, roles) = lr_cluster_with(&dir, 2, EPOCHS, job, |rows| {
        let half = rows.len() / 2;
        for row in &mut rows[half..] {
            *row = row.replace(":1", ":1.000000000000");
        }
    });
    let mut children = start_all(&config, &roles);
    let outputs = workers_stdout(&mut children);
    // Every row of the file is trained once an epoch, by the one worker whose share holds it.
    let text = std::fs::read_to_string(dir.join("train.svm")).unwrap();
    let file_rows = text.lines().filter(|l| !l.trim().is_empty()).count() as f64;
    let mut per_epoch = vec![0.0; EPOCHS as usize];
    for (w, out) in outputs.iter().enumerate() {
        let rows = fields(out, "rows=");
        assert_eq!(rows.len(), EPOCHS as usize, "worker {w}: {out}");
        assert!(rows.iter().all(|&r| r == rows[0]), "worker {w}: {out}");
        for (sum, r) in per_epoch.iter_mut().zip(&rows) {
            *sum += r;
        }
        assert_eq!(fields(out, "rows_per_sec=").len(), EPOCHS as usize, "{out}");
        assert_eq!(fields(out, "secs=").len(), EPOCHS as usize, "{out}");
    }
    assert_eq!(per_epoch, vec![file_rows; EPOCHS as usize], "{outputs:?}");
    let (big, small) = (
        fields(&outputs[0], "rows=")[0],
        fields(&outputs[1], "rows=")[0],
    );
    assert!(
        big > 1.5 * small,
        "the shares are not skewed: {big} {small}"
    );
    // The model saved is the epoch with the lowest test log loss, and predict measures it so.
    let losses = fields(&outputs[0], "test_logloss=");
    let best = losses.iter().copied().fold(f64::INFINITY, f64::min);
    let predicted = Command::new(assert_cmd::cargo::cargo_bin("pserver"))
        .args(["predict", "--model"])
        .arg(dir.join("model.bin"))
        .arg("--data")
        .arg(dir.join("test.svm"))
        .output()
        .unwrap();
    let predicted = text_of(&predicted.stdout);
    assert_eq!(fields(&predicted, "logloss="), vec![best], "{predicted}");
    // The server says what it holds for an lr job: rows and non-zero weights.
    let (_, server) = children.0.remove(1);
    let _ = Command::new("kill")
        .args(["-INT", &server.id().to_string()])
        .status();
    let summary = text_of(&server.wait_with_output().unwrap().stdout);
    let (rows, nonzero) = (fields(&summary, "rows="), fields(&summary, "nonzero="));
    assert!(
        rows[0] > 0.0 && nonzero[0] > 0.0 && nonzero[0] <= rows[0],
        "{summary}"
    );
    children.interrupt();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_metrics_survive_the_loss_of_the_worker_that_measured_them() {
    metrics_survive_the_measurer(|child| child.kill().expect("kill the worker"), "killed");
}

#[test]
fn test_metrics_survive_the_worker_that_measured_them_leaving() {
    metrics_survive_the_measurer(|child| signal(child, "-INT"), "left");
}

/// Stops the worker measuring a two-worker lr job after its first epoch as `stop` does, and
/// checks that the other one measures the last epochs.
fn metrics_survive_the_measurer(stop: impl FnOnce(&mut Child), how: &str) {
    const EPOCHS: u32 = 8;
    let dir =
        std::env::temp_dir().join(format!("pserver-lr-measurer-{how}-{}", std::process::id()));
    let (config, roles) = lr_cluster(&dir, 2, EPOCHS);
    let mut children = start_all(&config, &roles);
    // Kill the first worker, which holds the first share and measures, after one epoch.
    let stdout = children.0[2].1.stdout.take().expect("piped stdout");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let first = lines.next().expect("an epoch line").expect("utf-8");
    assert!(
        first.contains("iter=1 ") && first.contains("test_auc="),
        "{first}"
    );
    stop(&mut children.0[2].1);
    let (name, mut survivor) = children.0.remove(3);
    wait_for(
        &mut survivor,
        Instant::now() + Duration::from_secs(120),
        &name,
    );
    let out = survivor.wait_with_output().unwrap();
    let stdout = text_of(&out.stdout);
    assert!(out.status.success(), "{name}: {}", text_of(&out.stderr));
    // The survivor took over the measuring (and, from a dead worker, its share): the last
    // epochs carry test metrics.
    let last = stdout
        .lines()
        .rfind(|l| l.contains(" iter="))
        .unwrap_or_default();
    assert!(last.contains(&format!("iter={EPOCHS} ")), "{stdout}");
    assert!(last.contains("test_auc="), "{stdout}");
    assert!(fields(last, "test_auc=")[0] >= 0.85, "{stdout}");
    children.interrupt();
    let _ = std::fs::remove_dir_all(&dir);
}

/// An lr job whose cluster file gives the ring no key space still uses every server: each
/// worker tells the coordinator below which key the data's features lie, and the ring is
/// spread over them instead of the whole `u64` range, where every feature of a small
/// dimension fell into one server's segment.
#[test]
fn an_lr_cluster_job_without_a_key_space_gives_every_server_a_fair_share_of_rows() {
    for servers in [2, 3, 4] {
        let dir = std::env::temp_dir().join(format!(
            "pserver-lr-spread-{servers}-{}",
            std::process::id()
        ));
        let (config, roles) = lr_cluster_of(&dir, servers, 2, 1, "", |_| {});
        assert!(
            !std::fs::read_to_string(&config)
                .unwrap()
                .contains("key_space")
        );
        let mut children = start_all(&config, &roles);
        let deadline = Instant::now() + Duration::from_secs(120);
        for (name, mut child) in children.0.drain(1 + servers..) {
            wait_for(&mut child, deadline, &name);
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{name}: {}", text_of(&out.stderr));
        }
        // The workers left: the servers and the coordinator end by themselves.
        let ended = wait_all(&mut children, Instant::now() + Duration::from_secs(60));
        let mut rows = Vec::new();
        for (name, out) in ended.iter().filter(|(n, _)| n.starts_with("server")) {
            let said = text_of(&out.stdout);
            assert!(out.status.success(), "{name}: {}", text_of(&out.stderr));
            assert!(said.contains("ended=job-finished"), "{name}: {said}");
            let held = fields(&said, "rows=");
            assert_eq!(held.len(), 1, "{name}: {said}");
            rows.push(held[0]);
        }
        assert_eq!(rows.len(), servers, "{ended:?}");
        let _ = std::fs::remove_dir_all(&dir);
        let fair = rows.iter().sum::<f64>() / servers as f64;
        assert!(
            rows.iter().all(|&r| r >= 0.6 * fair && r <= 1.4 * fair),
            "{servers} servers hold {rows:?} rows"
        );
    }
}

/// Without RUST_LOG the coordinator says what the job does: each configuration it publishes,
/// so an operator sees the job form and its members change. The other nodes only warn.
#[test]
fn the_coordinator_reports_each_configuration_at_the_default_log_level() {
    let (dir, _, config) = script_cluster("coordinator-says", (1, 1), "sequential", 2, 0);
    let config = config.to_str().unwrap();
    let mut coordinator = pserver(&["coordinator", "--config", config, "--id", "0"])
        .env_remove("RUST_LOG")
        .spawn()
        .unwrap();
    let server = pserver(&["server", "--config", config, "--id", "1"])
        .env_remove("RUST_LOG")
        .spawn()
        .unwrap();
    let mut worker = pserver(&["worker", "--config", config, "--id", "2"])
        .env_remove("RUST_LOG")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    wait_for(&mut worker, deadline, "the worker");
    let worker = worker.wait_with_output().unwrap();
    assert!(worker.status.success(), "{}", text(&worker.stderr));
    for node in [&coordinator, &server] {
        signal(node, "-INT");
    }
    wait_for(&mut coordinator, deadline, "the coordinator");
    let said = text(&coordinator.wait_with_output().unwrap().stderr);
    let server = text(&server.wait_with_output().unwrap().stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        said.contains("published epoch 1: servers [n1], replicas 0 of 0, workers [n2]"),
        "{said}"
    );
    assert!(said.contains("worker left the job"), "{said}");
    assert!(said.contains("the job finished"), "{said}");
    // A script job's keys are spread over the whole key space, and the coordinator says
    // that is what it takes them to be.
    assert!(said.contains("over the whole 64-bit key space"), "{said}");
    assert!(!server.contains(" INFO "), "{server}");
}

/// A node may take its place among its role's nodes from the environment, as a Kubernetes
/// Indexed Job's JOB_COMPLETION_INDEX, a StatefulSet pod's host name or Slurm's SLURM_PROCID
/// give it; a place past the file's nodes is one line and status 2.
#[test]
fn nodes_take_their_ids_from_the_environment() {
    let (dir, _, config) = script_cluster("id-from-env", (1, 1), "sequential", 2, 0);
    let config = config.to_str().unwrap();
    let mut children = Children(Vec::new());
    children.0.push((
        "coordinator".into(),
        pserver(&["coordinator", "--config", config, "--id", "0"])
            .spawn()
            .unwrap(),
    ));
    children.0.push((
        "server".into(),
        pserver(&["server", "--config", config, "--id-from-env", "POD_NAME"])
            .env("POD_NAME", "pserver-server-0")
            .spawn()
            .unwrap(),
    ));
    let mut worker = pserver(&[
        "worker",
        "--config",
        config,
        "--id-from-env",
        "JOB_COMPLETION_INDEX",
    ])
    .env("JOB_COMPLETION_INDEX", "0")
    .spawn()
    .unwrap();
    wait_for(
        &mut worker,
        Instant::now() + Duration::from_secs(60),
        "the worker",
    );
    let out = worker.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The first worker of a file of one server is node 2.
    assert!(
        text(&out.stdout).starts_with("worker n2 iterations=2 "),
        "{}",
        text(&out.stdout)
    );
    children.interrupt();
    let past = pserver(&[
        "worker",
        "--config",
        config,
        "--id-from-env",
        "SLURM_PROCID",
    ])
    .env("SLURM_PROCID", "1")
    .output()
    .unwrap();
    let err = text(&past.stderr);
    assert_eq!(past.status.code(), Some(2), "{err}");
    assert!(
        err.contains("worker 1 asked, but the cluster file has 1 workers"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nodes_named_by_host_name_in_any_case_run_a_job_that_ends_by_itself() {
    for transport in ["tcp", "udp"] {
        named_nodes_run_a_job_that_ends_by_itself(transport);
    }
}

fn named_nodes_run_a_job_that_ends_by_itself(transport: &str) {
    let name = format!("names-{transport}");
    let (dir, ports, _) = script_cluster(&name, (2, 2), "bounded:1", ITERATIONS, 0);
    // Every node by name (in any case), with no ids: they follow the layout.
    let mut file = format!(
        "cluster_id = \"names\"\nconsistency = \"bounded:1\"\ntransport = \"{transport}\"\nsecret_file = \"secret.key\"\n[job]\nkeys = {KEYS}\niterations = {ITERATIONS}\n\n[[node]]\nrole = \"coordinator\"\naddress = \"localhost:{}\"\n",
        ports[0]
    );
    for (i, port) in ports[1..].iter().enumerate() {
        let role = if i < 2 { "server" } else { "worker" };
        file += &format!("\n[[node]]\nrole = \"{role}\"\naddress = \"LocalHost:{port}\"\n");
    }
    let config = dir.join("names.toml");
    std::fs::write(&config, file).unwrap();
    let dumps: Vec<PathBuf> = (1..=2)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    let log = |_: &str| "warn";
    let mut children = start_nodes(&config, (2, 2), log, |id| match id {
        1..=2 => vec![
            "--dump".into(),
            dumps[id as usize - 1].display().to_string(),
        ],
        _ => Vec::new(),
    });
    let outputs = wait_all(&mut children, Instant::now() + Duration::from_secs(120));
    for (name, out) in &outputs {
        assert!(
            out.status.success(),
            "{transport} {name}: {}",
            text(&out.stderr)
        );
    }
    assert_eq!(
        summed_dumps(&dumps),
        expected_totals(KEYS, ITERATIONS, (3..=4).map(NodeId)),
        "{transport}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_whose_coordinator_name_does_not_resolve_says_so_in_one_line_and_exits_2() {
    let (dir, ports, _) = script_cluster("unresolved", (1, 1), "sequential", 1, 0);
    let file = format!(
        "cluster_id = \"u\"\nsecret_file = \"secret.key\"\n[[node]]\nrole = \"coordinator\"\naddress = \"no-such-host.invalid:{}\"\n[[node]]\nrole = \"server\"\naddress = \"127.0.0.1:{}\"\n[[node]]\nrole = \"worker\"\naddress = \"127.0.0.1:{}\"\n",
        ports[0], ports[1], ports[2]
    );
    let config = dir.join("u.toml");
    std::fs::write(&config, file).unwrap();
    let out = pserver(&[
        "server",
        "--config",
        config.to_str().unwrap(),
        "--id",
        "1",
        "--join-timeout-secs",
        "3",
    ])
    .output()
    .expect("run a server");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: could not join the cluster")
            && last.contains("cannot resolve no-such-host.invalid"),
        "{err}"
    );
    // Said once while it retried, not on every dial.
    assert_eq!(err.matches("; retrying").count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn launch_runs_a_cluster_of_processes_to_the_end_and_ends_with_the_jobs_status() {
    let out = pserver(&[
        "launch",
        "--servers",
        "2",
        "--workers",
        "2",
        "--epochs",
        "1",
    ])
    .output()
    .expect("run pserver launch");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    for line in [
        "[worker 3] worker n3 trained epochs=1",
        "[worker 4] worker n4 trained epochs=1",
        "[coordinator 0] coordinator n0 job finished",
    ] {
        assert!(stdout.contains(line), "{line}\n{stdout}");
    }
    for server in 1..=2 {
        let held = stdout
            .lines()
            .find(|l| l.starts_with(&format!("[server {server}] server n{server} rows=")))
            .unwrap_or_else(|| panic!("server {server}:\n{stdout}"));
        assert!(held.ends_with("ended=job-finished"), "{held}");
        assert!(fields(held, "rows=")[0] > 0.0, "{held}");
    }
    assert!(
        stderr.contains("launch: the job finished, every process exited 0"),
        "{stderr}"
    );
}

/// `--standby` starts a second coordinator, after the workers: `pserver status` lists it, and
/// it ends with the job.
#[test]
fn a_launch_with_a_standby_starts_it_and_it_ends_with_the_job() {
    let dir = std::env::temp_dir().join(format!("pserver-launch-standby-{}", std::process::id()));
    let out = pserver(&[
        "launch",
        "--servers",
        "2",
        "--workers",
        "2",
        "--epochs",
        "2",
        "--standby",
        "--dir",
        dir.to_str().unwrap(),
    ])
    .output()
    .expect("run pserver launch");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("launching a coordinator and a standby, 2 servers and 2 workers"),
        "{stderr}"
    );
    for line in [
        "[coordinator 0] coordinator n0 job finished",
        "[coordinator 5] coordinator n5 job finished",
    ] {
        assert!(stdout.contains(line), "{line}\n{stdout}");
    }
    let written = std::fs::read_to_string(dir.join("cluster.toml")).unwrap();
    assert_eq!(
        written.matches("role = \"coordinator\"").count(),
        2,
        "{written}"
    );
    assert_eq!(written.matches("metrics = ").count(), 2, "{written}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_launch_whose_workers_fail_stops_the_rest_and_ends_with_their_status() {
    let out = pserver(&[
        "launch",
        "--servers",
        "1",
        "--workers",
        "2",
        "--data",
        "no/such/train.svm",
    ])
    .output()
    .expect("run pserver launch");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no/such/train.svm"), "{stderr}");
    assert!(stderr.contains("launch: worker"), "{stderr}");
}

#[test]
fn a_launch_runs_the_job_of_a_cluster_file_on_the_nodes_it_starts() {
    // The file's own nodes and secret are replaced; its job and relative paths are kept.
    let (dir, _, config) = script_cluster("launch-config", (1, 1), "bounded:1", 5, 0);
    let run = dir.join("run");
    let out = pserver(&[
        "launch",
        "--servers",
        "2",
        "--workers",
        "2",
        "--config",
        config.to_str().unwrap(),
        "--dir",
        run.to_str().unwrap(),
    ])
    .output()
    .expect("run pserver launch");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    for worker in [3, 4] {
        let line = format!("[worker {worker}] worker n{worker} iterations=5 pushes=5");
        assert!(stdout.contains(&line), "{line}\n{stdout}");
    }
    // Kept with --dir: the file it ran, with a secret of its own, readable by its owner only.
    let written = std::fs::read_to_string(run.join("cluster.toml")).unwrap();
    assert!(written.contains("iterations = 5"), "{written}");
    assert_eq!(written.matches("[[node]]").count(), 5, "{written}");
    let secret = std::fs::metadata(run.join("secret.key")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&secret.permissions()) & 0o777,
        0o600
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_launch_sent_sigterm_stops_every_node_and_ends_with_143() {
    let (dir, _, config) = script_cluster("launch-term", (1, 1), "bounded:1", 100_000, 10);
    let run = dir.join("run");
    let launch = pserver(&[
        "launch",
        "--config",
        config.to_str().unwrap(),
        "--dir",
        run.to_str().unwrap(),
    ])
    // The coordinator's own default: it says how far the job has come.
    .env_remove("RUST_LOG")
    .spawn()
    .expect("start pserver launch");
    // Killed, with what it started, however the test ends.
    let mut children = Children(vec![("launch".into(), launch)]);
    let (started, log) = watch_log(&mut children.0[0].1, "job progress");
    // The job runs: the coordinator says how far the workers are.
    assert!(
        started.recv_timeout(Duration::from_secs(60)).is_ok(),
        "the job never made progress"
    );
    // The launch gave its coordinator a status address in the file it wrote.
    let (code, status) = status_until(&run.join("cluster.toml"), "degraded no");
    assert_eq!(code, Some(0), "{status}");
    assert!(status.contains(" worker live"), "{status}");
    let (_, mut launch) = children.0.remove(0);
    signal(&launch, "-TERM");
    wait_for(
        &mut launch,
        Instant::now() + Duration::from_secs(60),
        "the launch",
    );
    let status = launch.wait().expect("the launch's status");
    let log = log.join().unwrap_or_default();
    assert_eq!(status.code(), Some(143), "{log}");
    // No node outlives it.
    let left = Command::new("pgrep")
        .args(["-f", run.join("cluster.toml").to_str().unwrap()])
        .output()
        .expect("run pgrep");
    assert!(
        left.stdout.is_empty(),
        "still running: {}\n{log}",
        text(&left.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ratings in MovieLens's u.data form (user, item, rating, timestamp, tab-separated): each user
/// rates items by a pattern of rank 5 that factors can learn.
fn write_ratings(path: &Path, users: u64, items: u64, n: u64) {
    let mut text = String::new();
    for k in 0..n {
        let h = k.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
        let (user, item) = (1 + h % users, 1 + (h >> 20) % items);
        let rating = 1 + (user * 7 + item * 3) % 5;
        text += &format!("{user}\t{item}\t{rating}\t{k}\n");
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn an_mf_cluster_job_without_a_key_space_uses_every_server_and_learns() {
    for servers in [2u32, 3] {
        let (dir, ports, _) =
            script_cluster(&format!("mf-{servers}"), (servers, 2), "bounded:2", 1, 0);
        write_ratings(&dir.join("u.data"), 300, 200, 30_000);
        let mut file = "cluster_id = \"mf\"\nconsistency = \"bounded:2\"\nsecret_file = \"secret.key\"\n[job]\napp = \"mf\"\ndata = \"u.data\"\nepochs = 4\nbatch = 200\n".to_owned();
        for (id, port) in ports.iter().enumerate() {
            let role = match id as u32 {
                0 => "coordinator",
                i if i <= servers => "server",
                _ => "worker",
            };
            file += &format!(
                "[[node]]\nid = {id}\nrole = \"{role}\"\naddress = \"127.0.0.1:{port}\"\n"
            );
        }
        assert!(!file.contains("key_space"));
        let config = dir.join("mf.toml");
        std::fs::write(&config, file).unwrap();
        let log = |_: &str| "warn";
        let mut children = start_nodes(&config, (servers, 2), log, |_| Vec::new());
        let ended = wait_all(&mut children, Instant::now() + Duration::from_secs(180));
        let mut outputs = BTreeMap::new();
        for (name, out) in ended {
            assert!(out.status.success(), "{name}: {}", text(&out.stderr));
            outputs.insert(name, text(&out.stdout));
        }
        let _ = std::fs::remove_dir_all(&dir);
        let rows: Vec<f64> = (1..=servers)
            .map(|s| fields(&outputs[&format!("server {s}")], "rows=")[0])
            .collect();
        let fair = rows.iter().sum::<f64>() / f64::from(servers);
        assert!(
            rows.iter().all(|&r| r >= 0.6 * fair && r <= 1.4 * fair),
            "{servers} servers hold {rows:?} rows"
        );
        // The worker holding the first share measured every epoch, and the model learned.
        let lead = &outputs[&format!("worker {}", servers + 1)];
        let test = fields(lead, "test_rmse=");
        let baseline = fields(lead, "baseline_rmse=");
        assert_eq!(test.len(), 4, "{lead}");
        assert!(test[3] < 0.9 * baseline[3], "{lead}");
        assert!(lead.contains("trained epochs=4"), "{lead}");
    }
}

/// Every `name=` value of the lines `[worker N]` printed in a launch's output.
fn worker_fields(stdout: &str, name: &str) -> Vec<f64> {
    let lines: String = stdout
        .lines()
        .filter(|l| l.starts_with("[worker"))
        .map(|l| format!("{l}\n"))
        .collect();
    fields(&lines, name)
}

/// With a model to save from several epochs, a cluster job holds a tenth of its training rows
/// out, drawn from the seed by their place in the file whichever worker reads them, and keeps
/// the epoch with the lowest log loss on them: the test rows never choose.
#[test]
fn the_cluster_job_saves_the_epoch_with_the_lowest_validation_logloss() {
    saves_the_epoch_with_the_lowest_validation_logloss("valid", "");
}

/// A streamed cluster job (`stream = true`) trains each worker's shares a window at a time,
/// never holding the file, and holds its validation rows out as a job reading the file whole
/// does, reading them back from the file to choose the epoch it saves. Its shares are runs of
/// rows, not of bytes: on a file whose second half spells its values at length, the workers
/// still train as many rows each.
#[test]
fn a_streamed_cluster_job_trains_every_row_but_those_held_out_a_window_at_a_time() {
    let outputs = saves_the_epoch_with_the_lowest_validation_logloss(
        "stream",
        "stream = true\nwindow = 64\n",
    );
    let first: Vec<f64> = outputs.iter().map(|o| fields(o, "rows=")[0]).collect();
    assert_eq!(first.len(), 2, "{outputs:?}");
    assert!(
        (first[0] - first[1]).abs() < 0.1 * first[0],
        "rows per worker {first:?}"
    );
}

/// Runs a two-worker job with `job` in its file (on a file whose second half spells its
/// values at length) and checks the epoch it saves; returns the workers' outputs.
fn saves_the_epoch_with_the_lowest_validation_logloss(name: &str, job: &str) -> Vec<String> {
    const EPOCHS: u32 = 4;
    let dir = std::env::temp_dir().join(format!("pserver-lr-{name}-{}", std::process::id()));
    let job = format!("save = \"model.bin\"\n{job}");
    let (config, roles) = lr_cluster_with(&dir, 2, EPOCHS, &job, |rows| {
        let half = rows.len() / 2;
        for row in &mut rows[half..] {
            *row = row.replace(":1", ":1.000000000000");
        }
    });
    let mut children = start_all(&config, &roles);
    let outputs = workers_stdout(&mut children);
    // Each epoch the workers train the same rows, about nine in ten of the file's.
    let trained: Vec<f64> = (0..EPOCHS as usize)
        .map(|e| outputs.iter().map(|o| fields(o, "rows=")[e]).sum())
        .collect();
    let all = LR_ROWS as f64;
    assert!(trained.iter().all(|&r| r == trained[0]), "{trained:?}");
    assert!(
        trained[0] > 0.85 * all && trained[0] < 0.95 * all,
        "{trained:?} of {all}"
    );
    let lead = outputs
        .iter()
        .find(|o| o.contains("valid_logloss="))
        .unwrap_or_else(|| panic!("no worker measured validation rows: {outputs:?}"));
    let (valid, test) = (
        fields(lead, "valid_logloss="),
        fields(lead, "test_logloss="),
    );
    assert_eq!(
        (valid.len(), test.len()),
        (EPOCHS as usize, EPOCHS as usize),
        "{lead}"
    );
    // The epochs of the lowest validation loss as printed (to four places, so two may tie).
    let lowest = valid.iter().copied().fold(f64::INFINITY, f64::min);
    let chosen: Vec<f64> = (0..valid.len())
        .filter(|&e| valid[e] == lowest)
        .map(|e| test[e])
        .collect();
    let predicted = Command::new(assert_cmd::cargo::cargo_bin("pserver"))
        .args(["predict", "--model"])
        .arg(dir.join("model.bin"))
        .arg("--data")
        .arg(dir.join("test.svm"))
        .output()
        .unwrap();
    let predicted = text_of(&predicted.stdout);
    let saved = fields(&predicted, "logloss=");
    assert_eq!(saved.len(), 1, "{predicted}");
    assert!(chosen.contains(&saved[0]), "{predicted} {lead}");
    children.interrupt();
    let _ = std::fs::remove_dir_all(&dir);
    outputs
}

/// A cluster job that names a saved model with `init` starts there: every server starts its
/// keys from the model, so the first epoch is as good as the model was.
#[test]
fn an_lr_cluster_job_given_a_model_to_init_from_starts_where_it_ended() {
    let dir = std::env::temp_dir().join(format!("pserver-lr-init-{}", std::process::id()));
    let launch = |config: &str| {
        let out = pserver(&[
            "launch",
            "--servers",
            "2",
            "--workers",
            "2",
            "--config",
            config,
        ])
        .output()
        .expect("run pserver launch");
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{stderr}");
        stdout
    };
    // Sequential consistency: the comparison below is of the starting points, not of the
    // order pushes happened to arrive in.
    let sequential = |config: &str| {
        let text = std::fs::read_to_string(config).unwrap();
        let text = text.replace(
            "consistency = \"bounded:2\"",
            "consistency = \"sequential\"",
        );
        std::fs::write(config, text).unwrap();
    };
    let (config, _) = lr_cluster_of(&dir, 2, 2, 4, "save = \"m.bin\"\n", |_| {});
    sequential(&config);
    let first = launch(&config);
    let losses = worker_fields(&first, "test_logloss=");
    assert_eq!(losses.len(), 4, "{first}");
    let saved = losses.iter().copied().fold(f64::INFINITY, f64::min);
    let (config, _) = lr_cluster_of(&dir, 2, 2, 1, "init = \"m.bin\"\n", |_| {});
    sequential(&config);
    let warm = launch(&config);
    let warm = worker_fields(&warm, "test_logloss=");
    assert_eq!(warm.len(), 1);
    assert!(
        warm[0] < losses[0] && warm[0] < saved + 0.005,
        "first epoch {} from the model, {} from zero; the model's {saved}",
        warm[0],
        losses[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pserver status --config FILE`, run until its output holds `needle` (or 60 s pass): the
/// last exit status and output.
fn status_until(config: &Path, needle: &str) -> (Option<i32>, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = pserver(&["status", "--config", config.to_str().unwrap()])
            .output()
            .expect("run pserver status");
        let stdout = text(&out.stdout);
        if stdout.contains(needle) || Instant::now() > deadline {
            return (out.status.code(), format!("{stdout}{}", text(&out.stderr)));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The coordinator answers `pserver status` at the metrics address the cluster file gives it:
/// a job running as set up exits 0; once a server is killed, the status names it dead, the
/// replicas fewer than asked, and exits 1.
#[test]
fn status_says_where_the_job_stands_and_fails_once_it_is_degraded() {
    let shape = (2, 2);
    let (dir, _, config) = script_cluster("status", shape, "bounded:1", 400, 25);
    let file = std::fs::read_to_string(&config).unwrap();
    let metrics = format!(
        "role = \"coordinator\"\nmetrics = \"127.0.0.1:{}\"\n",
        free_port()
    );
    std::fs::write(
        &config,
        file.replacen("role = \"coordinator\"\n", &metrics, 1),
    )
    .unwrap();
    let mut children = start_nodes(&config, shape, |_| "warn", |_| Vec::new());
    let (code, healthy) = status_until(&config, "node n4 worker live");
    assert_eq!(code, Some(0), "{healthy}");
    for line in [
        "coordinator n0 term 0",
        "replicas 1 of 1",
        "node n1 server live",
        "lost 0",
    ] {
        assert!(healthy.contains(line), "{line}\n{healthy}");
    }
    assert!(healthy.trim_end().ends_with("degraded no"), "{healthy}");
    children.0[2].1.kill().expect("kill -9 server 2");
    let (code, degraded) = status_until(&config, "node n2 server dead");
    assert_eq!(code, Some(1), "{degraded}");
    assert!(degraded.contains("replicas 0 of 1"), "{degraded}");
    assert!(degraded.trim_end().ends_with("degraded yes"), "{degraded}");
    children.interrupt();
    // No coordinator to ask: one line, status 2. A worker interrupted after the coordinator
    // waits for its leave to be confirmed, up to the drain timeout and 10 s more, and its
    // pushes to the dead server's range may take all of it: the bound here is twice that.
    let _ = wait_all(&mut children, Instant::now() + Duration::from_secs(60));
    let out = pserver(&["status", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot ask the coordinator at 127.0.0.1:"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An mf cluster job saves its model with `save` and starts from one with `init`: `pserver
/// predict` scores the test ratings as the job measured them, and a job started from the
/// model begins where it ended.
#[test]
fn an_mf_cluster_job_saves_its_model_and_another_starts_from_it() {
    let (dir, ports, _) = script_cluster("mf-save", (2, 2), "bounded:2", 1, 0);
    write_ratings(&dir.join("all.data"), 300, 200, 33_000);
    let all = std::fs::read_to_string(dir.join("all.data")).unwrap();
    let lines: Vec<&str> = all.lines().collect();
    std::fs::write(dir.join("u.data"), lines[..30_000].join("\n") + "\n").unwrap();
    std::fs::write(dir.join("test.data"), lines[30_000..].join("\n") + "\n").unwrap();
    let run = |job: &str| {
        let mut file = format!(
            "cluster_id = \"mf\"\nconsistency = \"bounded:2\"\nsecret_file = \"secret.key\"\n[job]\napp = \"mf\"\ndata = \"u.data\"\ntest = \"test.data\"\nbatch = 200\n{job}"
        );
        for (id, port) in ports.iter().enumerate() {
            let role = ["coordinator", "server", "server", "worker", "worker"][id];
            file += &format!(
                "[[node]]\nid = {id}\nrole = \"{role}\"\naddress = \"127.0.0.1:{port}\"\n"
            );
        }
        let config = dir.join("mf.toml");
        std::fs::write(&config, file).unwrap();
        let mut children = start_nodes(&config, (2, 2), |_| "warn", |_| Vec::new());
        let ended = wait_all(&mut children, Instant::now() + Duration::from_secs(180));
        for (name, out) in &ended {
            assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        }
        fields(&text(&ended["worker 3"].stdout), "test_rmse=")
    };
    let first = run("epochs = 4\nsave = \"m.mf\"\n");
    assert_eq!(first.len(), 4);
    let model = dir.join("m.mf");
    let out = pserver(&[
        "predict",
        "--model",
        model.to_str().unwrap(),
        "--data",
        dir.join("test.data").to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let predicted = fields(&text(&out.stdout), "rmse=")[0];
    assert!(
        (predicted - first[3]).abs() < 1e-3,
        "{predicted} against {first:?}"
    );
    let warm = run("epochs = 1\ninit = \"m.mf\"\n");
    assert!(
        warm[0] < first[0] && warm[0] < first[3] + 0.02,
        "first epoch {} from the model, {} from the start; the model's {}",
        warm[0],
        first[0],
        first[3]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two coordinators, the second a standby; two servers with one replica, two workers, TCP.
/// The active coordinator is killed with SIGKILL mid-job: the standby takes over within twice
/// the heartbeat timeout, the job finishes, every push is held exactly once, and a server
/// killed after the takeover is handled by the new coordinator as before.
#[test]
fn a_standby_coordinator_takes_over_from_one_killed_with_sigkill_and_the_job_finishes() {
    const LONG: u32 = 600;
    let shape = (2, 2);
    let (dir, _, config) = script_cluster("standby-kill", shape, "bounded:1", LONG, 25);
    let standby_id = 5;
    let standby_port = free_port();
    let mut file = std::fs::read_to_string(&config).unwrap();
    // Both coordinators serve /status, for `pserver status` to ask.
    let metrics = format!(
        "role = \"coordinator\"\nmetrics = \"127.0.0.1:{}\"\n",
        free_port()
    );
    file = file.replacen("role = \"coordinator\"\n", &metrics, 1);
    file += &format!(
        "\n[[node]]\nid = {standby_id}\nrole = \"coordinator\"\naddress = \"127.0.0.1:{standby_port}\"\nmetrics = \"127.0.0.1:{}\"\n",
        free_port()
    );
    std::fs::write(&config, file).unwrap();
    let dumps: Vec<PathBuf> = (1..=2)
        .map(|s| dir.join(format!("server{s}.totals")))
        .collect();
    let log = |role: &str| if role == "server" { "warn" } else { "info" };
    let mut children = start_nodes(&config, shape, log, |id| match id {
        1 | 2 => vec![
            "--dump".to_owned(),
            dumps[id as usize - 1].display().to_string(),
        ],
        _ => Vec::new(),
    });
    let id_arg = standby_id.to_string();
    let standby = pserver(&[
        "coordinator",
        "--config",
        config.to_str().unwrap(),
        "--id",
        &id_arg,
    ])
    .env("RUST_LOG", "info")
    .spawn()
    .expect("start the standby");
    children.0.push(("standby 5".into(), standby));
    let standby_at = children.0.len() - 1;
    let (standby_lines, standby_log) = log_lines(&mut children.0[standby_at].1);
    let (progress, worker_log) = watch_log(&mut children.0[3].1, "iteration done");
    for done in 0..5 {
        assert!(
            progress.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the first worker finished {done} iterations, then none for 60 s"
        );
    }
    // The standby is taken within a failure check or two of the start.
    let (code, before) = status_until(&config, "peer n5 standby term 0");
    assert_eq!(code, Some(0), "{before}");
    assert!(
        before.starts_with("coordinator n0 term 0 active\n"),
        "{before}"
    );
    children.0[0]
        .1
        .kill()
        .expect("kill -9 the active coordinator");
    let killed_at = Instant::now();
    let (_, killed) = children.0.remove(0);
    let _ = finish(killed);
    // Started again at once, as a supervisor would: it knows nothing of the job, and must
    // neither pass for the coordinator nor hold off the standby.
    let again = pserver(&[
        "coordinator",
        "--config",
        config.to_str().unwrap(),
        "--id",
        "0",
    ])
    .env("RUST_LOG", "warn")
    .spawn()
    .expect("restart the coordinator");
    children.0.push(("coordinator 0 again".into(), again));
    assert!(
        line_with(
            &standby_lines,
            "took over from coordinator",
            Duration::from_secs(30)
        ),
        "the standby takes over"
    );
    let took = killed_at.elapsed();
    let (code, after) = status_until(&config, "peer n0 standby term 1");
    assert_eq!(code, Some(0), "{after}");
    assert!(
        after.starts_with("coordinator n5 term 1 active\n"),
        "the restarted coordinator stands by\n{after}"
    );
    // A server crash after the takeover: its ranges pass to the replica.
    let at = children
        .0
        .iter()
        .position(|(n, _)| n == "server 2")
        .unwrap();
    children.0[at].1.kill().expect("kill -9 server 2");
    assert!(
        line_with(
            &standby_lines,
            "fewer replicas than asked",
            Duration::from_secs(30)
        ),
        "the new coordinator takes server 2 off the ring"
    );
    let (_, killed) = children.0.remove(at);
    let _ = finish(killed);
    let outputs = wait_all(&mut children, Instant::now() + Duration::from_secs(120));
    let standby_log = standby_log.join().expect("the standby's log");
    let worker_log = worker_log.join().expect("the worker's log");
    for (name, out) in &outputs {
        assert!(
            out.status.success(),
            "{name}: {}\n{standby_log}",
            text(&out.stderr)
        );
        if name.starts_with("worker") {
            assert!(text(&out.stdout).contains(&format!("iterations={LONG}")));
        }
    }
    assert_eq!(
        summed_dumps(&dumps[..1]),
        expected_totals(KEYS, LONG, (3..=4).map(NodeId)),
        "the surviving server holds every push exactly once\n{worker_log}"
    );
    eprintln!("takeover {} ms after kill -9", took.as_millis());
    let _ = std::fs::remove_dir_all(&dir);
}
