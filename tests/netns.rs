//! Real hosts: each node in a network namespace of its own, with its own address on a bridge and
//! its own `/etc/hosts`, started as the Kubernetes manifests start it (by name, its id from the
//! environment, no address in the cluster file). Needs Linux, root and `ip`; elsewhere each test
//! says why it did not run and passes.
//!
//! The namespaces, the bridge's namespace and the hosts files are removed when a test ends,
//! however it ends; nothing is created in the machine's own network namespace but the veth pairs,
//! which move out of it at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pserver_core::NodeId;

mod common;

use common::{Children, expected_totals, fields, summed_dumps, wait_all, watch_log};

/// Network namespaces for the nodes of one test, joined by a bridge in a namespace of its own.
struct Hosts {
    /// The namespace of each host name.
    namespaces: BTreeMap<String, String>,
    /// The address of each host name.
    addresses: BTreeMap<String, String>,
    /// The first three octets of every address.
    subnet: String,
    bridge: String,
}

/// Why this machine cannot run the test, if it cannot.
fn unable() -> Option<String> {
    if !cfg!(target_os = "linux") {
        return Some("network namespaces are Linux's".into());
    }
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("creating network namespaces needs root".into());
    }
    // Root in a container may still lack the right to make namespaces: try one.
    let probe = format!("psprobe{}", std::process::id());
    let made = Command::new("ip").args(["netns", "add", &probe]).output();
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    match made {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns add` fails here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("`ip` cannot run here: {e}")),
    }
}

/// Runs `ip ARGS`, panicking with its error if it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Hosts {
    /// A namespace per name, each at its own address on one bridge, each knowing every other by
    /// name. `tag` keeps tests of one run apart.
    fn new(tag: &str, names: &[&str]) -> Hosts {
        let run = std::process::id() % 100_000;
        let bridge = format!("psb{tag}{run}");
        let subnet = format!("10.213.{}", run % 250);
        let mut hosts = Hosts {
            namespaces: BTreeMap::new(),
            addresses: BTreeMap::new(),
            subnet: subnet.clone(),
            bridge: bridge.clone(),
        };
        ip(&["netns", "add", &bridge]);
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &bridge, "link", "set", "br0", "up"]);
        // 10.213.T.0/24, T from the run, so that two runs at once do not meet: the bridge is
        // reachable from nowhere else anyway.
        let addresses: Vec<String> = (0..names.len())
            .map(|k| format!("{subnet}.{}", 10 + k))
            .collect();
        for (k, (name, address)) in names.iter().zip(&addresses).enumerate() {
            let ns = format!("ps{tag}{k}x{run}");
            hosts.namespaces.insert((*name).to_owned(), ns.clone());
            hosts.addresses.insert((*name).to_owned(), address.clone());
            ip(&["netns", "add", &ns]);
            let (inside, outside) = (format!("pv{tag}{k}x{run}"), format!("pb{tag}{k}x{run}"));
            ip(&[
                "link", "add", &inside, "type", "veth", "peer", "name", &outside,
            ]);
            ip(&["link", "set", &inside, "netns", &ns]);
            ip(&["link", "set", &outside, "netns", &bridge]);
            ip(&["-n", &ns, "link", "set", &inside, "name", "eth0"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["-n", &bridge, "link", "set", &outside, "master", "br0"]);
            ip(&["-n", &bridge, "link", "set", &outside, "up"]);
        }
        hosts.write_hosts_files();
        hosts
    }

    /// Every namespace's /etc/hosts, naming every host at its address now: what `ip netns
    /// exec` mounts over /etc/hosts for the processes it starts. Written in place, so that
    /// running processes read the change at their next lookup.
    fn write_hosts_files(&self) {
        let table: String = self
            .addresses
            .iter()
            .map(|(n, a)| format!("{a} {n}\n"))
            .collect();
        for ns in self.namespaces.values() {
            let etc = Path::new("/etc/netns").join(ns);
            std::fs::create_dir_all(&etc).expect("create /etc/netns/NAME");
            std::fs::write(etc.join("hosts"), format!("127.0.0.1 localhost\n{table}"))
                .expect("write the namespace's hosts file");
        }
    }

    /// Moves host `name` to another address, as a pod that comes back is given another IP, and
    /// tells every host's /etc/hosts.
    fn readdress(&mut self, name: &str, last_octet: u8) {
        let ns = &self.namespaces[name];
        let address = format!("{}.{last_octet}", self.subnet);
        ip(&["-n", ns, "addr", "flush", "dev", "eth0"]);
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{address}/24"),
            "dev",
            "eth0",
        ]);
        self.addresses.insert(name.to_owned(), address);
        self.write_hosts_files();
    }

    /// `pserver ARGS` on host `name`, with `env` set.
    fn pserver(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.namespaces[name]])
            .arg(assert_cmd::cargo::cargo_bin("pserver"))
            .args(args)
            .env("PSERVER_SECRET", "the-cluster-secret")
            // The nodes a test watches log what it waits for; the others only warn, so that
            // no unread pipe fills up and blocks them.
            .env(
                "RUST_LOG",
                if matches!(name, "coordinator" | "coordinator-1" | "worker-0") {
                    "info"
                } else {
                    "warn"
                },
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().expect("start a node in its namespace")
    }

    /// Takes host `name`'s only link down (`up = false`) or up again.
    fn link(&self, name: &str, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.namespaces[name], "link", "set", "eth0", state]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in self.namespaces.values().chain([&self.bridge]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
            let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(ns));
        }
    }
}

/// A cluster file naming every node by host name and pattern, as the manifests' does.
fn named_cluster(dir: &Path, servers: usize, workers: usize, job: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let text = format!(
        "cluster_id = \"netns\"\n{job}\n\n[[node]]\nrole = \"coordinator\"\naddress = \"coordinator:7400\"\n\n[[node]]\nrole = \"server\"\ncount = {servers}\naddress = \"server-{{i}}:7400\"\n\n[[node]]\nrole = \"worker\"\ncount = {workers}\naddress = \"worker-{{i}}:7400\"\n"
    );
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The host names of a cluster of `servers` servers and `workers` workers.
fn names(servers: usize, workers: usize) -> Vec<String> {
    std::iter::once("coordinator".to_owned())
        .chain((0..servers).map(|i| format!("server-{i}")))
        .chain((0..workers).map(|i| format!("worker-{i}")))
        .collect()
}

/// Starts every node on its host: the coordinator by id, servers by the ordinal in a
/// StatefulSet pod's host name, workers by an Indexed Job's completion index.
fn start(
    hosts: &Hosts,
    config: &Path,
    names: &[String],
    extra: impl Fn(&str) -> Vec<String>,
) -> Children {
    let config = config.to_str().unwrap();
    let mut children = Children(Vec::new());
    for name in names {
        let more = extra(name);
        let more: Vec<&str> = more.iter().map(String::as_str).collect();
        let child = if name == "coordinator" {
            let mut args = vec!["coordinator", "--config", config, "--id", "0"];
            args.extend(&more);
            hosts.pserver(name, &args, &[])
        } else if name == "coordinator-1" {
            // The standby: its id follows the workers'.
            let members = names
                .iter()
                .filter(|n| !n.starts_with("coordinator"))
                .count();
            let id = (members + 1).to_string();
            let mut args = vec!["coordinator", "--config", config, "--id", &id];
            args.extend(&more);
            hosts.pserver(name, &args, &[])
        } else if let Some(i) = name.strip_prefix("server-") {
            let pod = format!("pserver-server-{i}");
            let mut args = vec!["server", "--config", config, "--id-from-env", "HOSTNAME"];
            args.extend(&more);
            hosts.pserver(name, &args, &[("HOSTNAME", &pod)])
        } else {
            let i = name.trim_start_matches("worker-");
            let mut args = vec!["worker", "--config", config];
            args.extend(["--id-from-env", "JOB_COMPLETION_INDEX"]);
            args.extend(&more);
            hosts.pserver(name, &args, &[("JOB_COMPLETION_INDEX", i)])
        };
        children.0.push((name.clone(), child));
    }
    children
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn an_lr_job_on_named_hosts_ends_by_itself_every_server_used_as_well_as_one_process() {
    if let Some(why) = unable() {
        eprintln!("skipped: {why}");
        return;
    }
    const EPOCHS: u32 = 3;
    let dir = std::env::temp_dir().join(format!("pserver-netns-lr-{}", std::process::id()));
    let adult = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/adult");
    let job = format!(
        "consistency = \"sequential\"\n\n[job]\napp = \"lr\"\ndata = \"{}\"\ntest = \"{}\"\nepochs = {EPOCHS}",
        adult.join("adult.train.svm.gz").display(),
        adult.join("adult.test.svm.gz").display()
    );
    let config = named_cluster(&dir, 2, 2, &job);
    let names = names(2, 2);
    let hosts = Hosts::new("l", &names.iter().map(String::as_str).collect::<Vec<_>>());
    let mut children = start(&hosts, &config, &names, |_| Vec::new());
    let outputs = wait_all(&mut children, Instant::now() + Duration::from_secs(300));
    for (name, out) in &outputs {
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    }
    for server in ["server-0", "server-1"] {
        let last = text(&outputs[server].stdout);
        let rows = fields(&last, "rows=");
        assert!(rows.len() == 1 && rows[0] > 0.0, "{server}: {last}");
        assert!(last.contains("ended=job-finished"), "{server}: {last}");
    }
    let measured: Vec<f64> = ["worker-0", "worker-1"]
        .iter()
        .flat_map(|w| fields(&text(&outputs[*w].stdout), "test_auc="))
        .collect();
    assert_eq!(measured.len(), EPOCHS as usize, "{measured:?}");
    let cluster_auc = measured[EPOCHS as usize - 1];
    let alone = Command::new(assert_cmd::cargo::cargo_bin("pserver"))
        .args(["train", "--servers", "2", "--workers", "2"])
        .args([
            "--epochs",
            &EPOCHS.to_string(),
            "--consistency",
            "sequential",
        ])
        .arg("--data")
        .arg(adult.join("adult.train.svm.gz"))
        .arg("--test")
        .arg(adult.join("adult.test.svm.gz"))
        .output()
        .expect("run pserver train");
    let alone_auc = *fields(&text(&alone.stdout), "test_auc=")
        .last()
        .expect("pserver train's AUC");
    assert!(
        (cluster_auc - alone_auc).abs() <= 0.005,
        "the cluster reached {cluster_auc:.4}, one process {alone_auc:.4}"
    );
    drop(hosts);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The scripted job of the fault tests: its keys and iterations.
const KEYS: u64 = 1000;
const ITERATIONS: u32 = 400;

/// Hosts for a coordinator, 3 servers and 2 workers (tagged `tag`), and the cluster file of
/// a scripted job long enough for a fault in its middle, in `dir`.
fn script_hosts(tag: &str, dir: &Path) -> (Hosts, PathBuf) {
    let job = format!(
        "consistency = \"bounded:1\"\n\n[job]\nkeys = {KEYS}\niterations = {ITERATIONS}\ncompute_ms = 20"
    );
    let config = named_cluster(dir, 3, 2, &job);
    let names = names(3, 2);
    let hosts = Hosts::new(tag, &names.iter().map(String::as_str).collect::<Vec<_>>());
    (hosts, config)
}

/// A scripted job running, watched.
struct Watched {
    children: Children,
    /// One `()` per node the coordinator declared dead.
    declared: std::sync::mpsc::Receiver<()>,
    coordinator_log: std::thread::JoinHandle<String>,
    worker_log: std::thread::JoinHandle<String>,
}

impl Watched {
    /// The coordinator's and worker-0's logs, once they ended.
    fn logs(self) -> (String, String) {
        (
            self.coordinator_log.join().unwrap_or_default(),
            self.worker_log.join().unwrap_or_default(),
        )
    }
}

/// Starts the scripted job of `script_hosts` (every server dumping its totals where `dump`
/// says) and returns once worker-0 has done 5 iterations.
fn start_script(hosts: &Hosts, config: &Path, dump: impl Fn(&str) -> PathBuf) -> Watched {
    let names = names(3, 2);
    let mut children = start(hosts, config, &names, |name| {
        if name.starts_with("server-") {
            vec!["--dump".into(), dump(name).display().to_string()]
        } else {
            Vec::new()
        }
    });
    let at =
        |children: &Children, name: &str| children.0.iter().position(|(n, _)| n == name).unwrap();
    let coordinator = at(&children, "coordinator");
    let (declared, coordinator_log) =
        watch_log(&mut children.0[coordinator].1, "node declared dead");
    let first_worker = at(&children, "worker-0");
    let (progress, worker_log) = watch_log(&mut children.0[first_worker].1, "iteration done");
    for done in 0..5 {
        assert!(
            progress.recv_timeout(Duration::from_secs(60)).is_ok(),
            "worker-0 did {done} iterations, then none for 60 s"
        );
    }
    Watched {
        children,
        declared,
        coordinator_log,
        worker_log,
    }
}

#[test]
fn a_server_whose_link_is_cut_is_replaced_nothing_is_lost_and_it_exits_3_once_it_hears() {
    if let Some(why) = unable() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pserver-netns-cut-{}", std::process::id()));
    let dump = |name: &str| dir.join(format!("{name}.totals"));
    let (hosts, config) = script_hosts("c", &dir);
    let mut run = start_script(&hosts, &config, |name| dump(name));
    hosts.link("server-0", false);
    assert!(
        run.declared.recv_timeout(Duration::from_secs(30)).is_ok(),
        "the coordinator did not declare the cut server dead"
    );
    hosts.link("server-0", true);
    let outputs = wait_all(&mut run.children, Instant::now() + Duration::from_secs(300));
    let (coordinator_log, worker_log) = run.logs();
    let cut = &outputs["server-0"];
    assert_eq!(cut.status.code(), Some(3), "{}", text(&cut.stderr));
    assert!(
        text(&cut.stderr).contains("removed from the cluster"),
        "{}",
        text(&cut.stderr)
    );
    for (name, out) in outputs.iter().filter(|(n, _)| *n != "server-0") {
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    }
    assert!(
        coordinator_log.contains("the job finished"),
        "{coordinator_log}"
    );
    let survivors = [dump("server-1"), dump("server-2")];
    assert_eq!(
        summed_dumps(&survivors),
        expected_totals(KEYS, ITERATIONS, (4..=5).map(NodeId)),
        "{worker_log}"
    );
    drop(hosts);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_server_that_comes_back_under_its_name_at_another_address_rejoins_and_nothing_is_lost() {
    if let Some(why) = unable() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pserver-netns-move-{}", std::process::id()));
    let dump = |name: &str, run: u32| dir.join(format!("{name}.{run}.totals"));
    let (mut hosts, config) = script_hosts("m", &dir);
    let mut run = start_script(&hosts, &config, |name| dump(name, 0));
    let children = &mut run.children;
    let killed = children
        .0
        .iter()
        .position(|(n, _)| n == "server-0")
        .unwrap();
    let (_, mut victim) = children.0.remove(killed);
    victim.kill().expect("kill server-0");
    let _ = victim.wait();
    assert!(
        run.declared.recv_timeout(Duration::from_secs(30)).is_ok(),
        "the coordinator did not declare the killed server dead"
    );
    // It comes back as a pod would: the same name, another address.
    hosts.readdress("server-0", 200);
    let config_arg = config.to_str().unwrap();
    let dump_again = dump("server-0", 1).display().to_string();
    let args = [
        "server",
        "--config",
        config_arg,
        "--id-from-env",
        "HOSTNAME",
        "--dump",
        &dump_again,
    ];
    let back = hosts.pserver("server-0", &args, &[("HOSTNAME", "pserver-server-0")]);
    run.children.0.push(("server-0 again".into(), back));
    let outputs = wait_all(&mut run.children, Instant::now() + Duration::from_secs(300));
    let (coordinator_log, worker_log) = run.logs();
    for (name, out) in &outputs {
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    }
    // The ring grew back: the returned server held ranges again by the end.
    let again = text(&outputs["server-0 again"].stdout);
    assert!(
        fields(&again, "keys=").first().is_some_and(|&k| k > 0.0),
        "{again}\n{coordinator_log}"
    );
    let held = [
        dump("server-0", 1),
        dump("server-1", 0),
        dump("server-2", 0),
    ];
    assert_eq!(
        summed_dumps(&held),
        expected_totals(KEYS, ITERATIONS, (4..=5).map(NodeId)),
        "{worker_log}"
    );
    drop(hosts);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_active_coordinator_whose_link_is_cut_is_replaced_by_the_standby_and_nothing_is_lost() {
    if let Some(why) = unable() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pserver-netns-coord-{}", std::process::id()));
    let dump = |name: &str| dir.join(format!("{name}.totals"));
    let job = format!(
        "consistency = \"bounded:1\"\n\n[job]\nkeys = {KEYS}\niterations = {ITERATIONS}\ncompute_ms = 20"
    );
    let config = named_cluster(&dir, 3, 2, &job);
    let mut file = std::fs::read_to_string(&config).unwrap();
    file += "\n[[node]]\nrole = \"coordinator\"\naddress = \"coordinator-1:7400\"\n";
    std::fs::write(&config, file).unwrap();
    let mut names = names(3, 2);
    names.push("coordinator-1".to_owned());
    let hosts = Hosts::new("k", &names.iter().map(String::as_str).collect::<Vec<_>>());
    let mut children = start(&hosts, &config, &names, |name| {
        if name.starts_with("server-") {
            vec!["--dump".into(), dump(name).display().to_string()]
        } else {
            Vec::new()
        }
    });
    let at = |name: &str| names.iter().position(|n| n == name).unwrap();
    let (_, old_log) = watch_log(&mut children.0[at("coordinator")].1, "stepped down");
    let (took_over, standby_log) = watch_log(
        &mut children.0[at("coordinator-1")].1,
        "took over from coordinator",
    );
    let (progress, worker_log) = watch_log(&mut children.0[at("worker-0")].1, "iteration done");
    for done in 0..5 {
        assert!(
            progress.recv_timeout(Duration::from_secs(60)).is_ok(),
            "worker-0 did {done} iterations, then none for 60 s"
        );
    }
    // The standby is taken within a failure check or two of the start.
    std::thread::sleep(Duration::from_secs(1));
    hosts.link("coordinator", false);
    assert!(
        took_over.recv_timeout(Duration::from_secs(30)).is_ok(),
        "the standby did not take over from the coordinator cut off"
    );
    hosts.link("coordinator", true);
    let outputs = wait_all(&mut children, Instant::now() + Duration::from_secs(300));
    let old_log = old_log.join().unwrap_or_default();
    let standby_log = standby_log.join().unwrap_or_default();
    let worker_log = worker_log.join().unwrap_or_default();
    for (name, out) in &outputs {
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    }
    // Back on the network, the old coordinator heard of the newer term and stood by; it had
    // declared nobody dead while it was the one cut off.
    assert!(old_log.contains("stepped down"), "{old_log}");
    assert!(!old_log.contains("node declared dead"), "{old_log}");
    assert!(standby_log.contains("the job finished"), "{standby_log}");
    let held = [dump("server-0"), dump("server-1"), dump("server-2")];
    assert_eq!(
        summed_dumps(&held),
        expected_totals(KEYS, ITERATIONS, (4..=5).map(NodeId)),
        "{worker_log}"
    );
    drop(hosts);
    let _ = std::fs::remove_dir_all(&dir);
}
