//! What the tests that start whole clusters of `pserver` processes share: starting and
//! stopping the processes, scraping their metrics, and writing a logistic-regression cluster.

// A test crate need not use all of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pserver_core::NodeId;

/// Children killed when the test ends, however it ends.
pub(crate) struct Children(pub(crate) Vec<(String, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A loopback port for a child to listen on, free for both TCP and UDP when handed out.
///
/// A port found by binding port 0 comes from the kernel's ephemeral range, which every
/// outgoing connection of the children also draws from: one of them may take it before the
/// child that was given it binds it. Ports are therefore taken from below that range (32768
/// and up on Linux), from a counter that no two tests of this process share.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::AtomicU32;
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id().wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (base + n) % SPAN) as u16;
        let free = TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free {
            return port;
        }
    }
    panic!("no free loopback port between {LOW} and {}", LOW + SPAN);
}

pub(crate) fn pserver(args: &[&str]) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("pserver"));
    cmd.args(args)
        .env_remove("PSERVER_SECRET")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Sends `signal` (`-STOP`, `-CONT`, `-INT`) to `child`.
pub(crate) fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal}");
}

/// The whole answer, head and body, of an HTTP/1.1 `GET path` at `addr`.
pub(crate) fn http_get(addr: &str, path: &str) -> String {
    use std::io::Read;
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read the answer");
    answer
}

/// Writes a logistic-regression cluster into `dir` (a slice of the shipped data, `servers`
/// servers, `workers` workers, `epochs` epochs), with `job` added to the `[job]` table and the
/// training rows put in the order `arrange` leaves them, and returns its cluster file and the
/// nodes' roles.
pub(crate) fn lr_cluster_of(
    dir: &Path,
    servers: usize,
    workers: usize,
    epochs: u32,
    job: &str,
    arrange: impl FnOnce(&mut Vec<String>),
) -> (String, Vec<&'static str>) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("secret.key"), "lr-secret\n").unwrap();
    let adult = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/adult");
    let lines = |name: &str, n: usize| -> Vec<String> {
        let gz = std::fs::read(adult.join(name)).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(&gz[..]), &mut text)
            .unwrap();
        text.lines().take(n).map(|l| format!("{l}\n")).collect()
    };
    let mut train = lines("adult.train.svm.gz", LR_ROWS);
    arrange(&mut train);
    std::fs::write(dir.join("train.svm"), train.concat()).unwrap();
    std::fs::write(
        dir.join("test.svm"),
        lines("adult.test.svm.gz", 1_500).concat(),
    )
    .unwrap();
    let mut roles = vec!["coordinator"];
    roles.extend(std::iter::repeat_n("server", servers));
    roles.extend(std::iter::repeat_n("worker", workers));
    let ports: Vec<u16> = roles.iter().map(|_| free_port()).collect();
    let mut text = format!(
        "cluster_id = \"lr\"\nconsistency = \"bounded:2\"\nsecret_file = \"secret.key\"\n\n[job]\napp = \"lr\"\ndata = \"train.svm\"\ntest = \"test.svm\"\nepochs = {epochs}\n{job}"
    );
    for (id, (port, role)) in ports.iter().zip(&roles).enumerate() {
        text +=
            &format!("\n[[node]]\nid = {id}\nrole = \"{role}\"\naddress = \"127.0.0.1:{port}\"\n");
    }
    let config = dir.join("cluster.toml");
    std::fs::write(&config, text).unwrap();
    (config.to_str().unwrap().to_owned(), roles)
}

/// Training rows in the logistic-regression clusters.
pub(crate) const LR_ROWS: usize = 6_000;

/// The `key=value` fields named `key` in a worker's epoch lines, in order.
pub(crate) fn fields(out: &str, key: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix(key)))
        .map(|v| v.parse().unwrap())
        .collect()
}

/// Per key index, the sum of the `key_index total` lines of the servers' dumps.
pub(crate) fn summed_dumps(dumps: &[PathBuf]) -> BTreeMap<u64, i64> {
    let mut totals: BTreeMap<u64, i64> = BTreeMap::new();
    for dump in dumps {
        for line in std::fs::read_to_string(dump)
            .expect("a server dump")
            .lines()
        {
            let (k, v) = line.split_once(' ').expect("key total");
            *totals.entry(k.parse().unwrap()).or_default() += v.parse::<i64>().unwrap();
        }
    }
    totals
}

/// Per key index, what `workers` running the script job for `iterations` push in all: the
/// script's documented workload pushes `1 + (7 w + 13 i + k) mod 10` to key index `k` from
/// worker `nw` in iteration `i`, so the test states the totals on its own.
pub(crate) fn expected_totals(
    keys: u64,
    iterations: u32,
    workers: impl Iterator<Item = NodeId>,
) -> BTreeMap<u64, i64> {
    let mut totals = BTreeMap::new();
    for w in workers {
        for i in 0..iterations {
            for k in 0..keys {
                let value = 1 + ((u64::from(w.0) * 7 + u64::from(i) * 13 + k) % 10) as i64;
                *totals.entry(k).or_default() += value;
            }
        }
    }
    totals
}

/// A thread reading `child`'s stderr: it sends one `()` per line containing `needle`, and
/// returns the whole log once the stream closes.
pub(crate) fn watch_log(
    child: &mut Child,
    needle: &'static str,
) -> (
    std::sync::mpsc::Receiver<()>,
    std::thread::JoinHandle<String>,
) {
    read_log(child, move |line| line.contains(needle).then_some(()))
}

/// A thread reading `child`'s stderr: it sends every line, and returns the whole log once the
/// stream closes.
pub(crate) fn log_lines(
    child: &mut Child,
) -> (
    std::sync::mpsc::Receiver<String>,
    std::thread::JoinHandle<String>,
) {
    read_log(child, |line| Some(line.to_owned()))
}

/// A thread reading `child`'s stderr: it sends what `pick` makes of each line, and returns the
/// whole log once the stream closes.
fn read_log<T: Send + 'static>(
    child: &mut Child,
    pick: impl Fn(&str) -> Option<T> + Send + 'static,
) -> (
    std::sync::mpsc::Receiver<T>,
    std::thread::JoinHandle<String>,
) {
    let stderr = child.stderr.take().expect("piped stderr");
    let (sender, picked) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut log = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(item) = pick(&line) {
                let _ = sender.send(item);
            }
            log += &line;
            log.push('\n');
        }
        log
    });
    (picked, reader)
}

/// Waits up to `within` for a line of `lines` containing `needle`; false if none came (or
/// the stream closed first).
pub(crate) fn line_with(
    lines: &std::sync::mpsc::Receiver<String>,
    needle: &str,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Waits for every child to end by itself, by `deadline`; their outputs by name. One that
/// does not fails the test, and every child still running is killed with `children`.
pub(crate) fn wait_all(children: &mut Children, deadline: Instant) -> BTreeMap<String, Output> {
    let mut outputs = BTreeMap::new();
    while let Some((name, child)) = children.0.first_mut() {
        if child.try_wait().expect("poll a child").is_none() {
            assert!(Instant::now() < deadline, "{name} did not end by itself");
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let (name, child) = children.0.remove(0);
        outputs.insert(name, child.wait_with_output().expect("output"));
    }
    outputs
}
