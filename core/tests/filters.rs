//! Filters on the push path, driven by hand (ARCHITECTURE.md §10): what a worker's filters
//! hold back reaches the servers later, and nothing is lost once the worker flushes.

mod common;

use common::config;
use pserver_core::node::*;
use pserver_core::wire::*;
use pserver_core::*;

const S1: NodeId = NodeId(1);
const W1: NodeId = NodeId(2);

fn job(filters: Filters) -> JobSpec {
    let mut job = JobSpec::new(1, 1);
    job.ring = common::ring();
    job.filters = filters;
    job
}

/// A worker and a server of `job`, configured, and the messages between them delivered until
/// none is left.
struct Pair {
    worker: Worker<i64>,
    server: Server<i64>,
    now: Time,
}

impl Pair {
    fn new(job: &JobSpec) -> Self {
        let cfg = config(1, &[1], &[W1], Consistency::Sequential);
        let mut worker = Worker::new(job.worker_config(W1));
        let mut server = Server::new(job.server_config(S1), Updater::Sum);
        worker.start_configured(0, cfg.clone(), &mut Effects::new());
        server.start_configured(0, cfg, &mut Effects::new());
        Pair {
            worker,
            server,
            now: 0,
        }
    }

    /// Delivers `out`'s messages, and those they cause, until nothing is sent.
    fn settle(&mut self, mut out: Effects<i64>) {
        for _ in 0..1000 {
            let sends = std::mem::take(&mut out.sends);
            if sends.is_empty() {
                return;
            }
            self.now += 1;
            for env in sends {
                match env.to {
                    S1 => self.server.on_message(self.now, env, &mut out),
                    W1 => self.worker.on_message(self.now, env, &mut out),
                    _ => {}
                }
            }
        }
        panic!("the messages between worker and server never settled");
    }

    fn push(&mut self, kvs: KvPairs<i64>) {
        let mut out = Effects::new();
        self.worker.push(self.now, kvs, &mut out).unwrap();
        self.worker.advance(self.now, &mut out).unwrap();
        self.settle(out);
    }

    fn flush(&mut self) -> Option<RequestId> {
        let mut out = Effects::new();
        let request = self.worker.flush(self.now, &mut out).unwrap();
        self.settle(out);
        request
    }
}

/// Twenty iterations of pushes over 40 keys: small changes to most keys, a large one now and
/// then, from a fixed generator. Returns each push and the sum per key.
fn pushes() -> (Vec<KvPairs<i64>>, Vec<i64>) {
    let mut state = 7u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut sums = vec![0i64; 40];
    let mut all = Vec::new();
    for _ in 0..20 {
        let keys: Vec<Key> = (0..40).filter(|_| next() % 2 == 0).collect();
        let values: Vec<i64> = keys
            .iter()
            .map(|_| {
                let v = (next() % 7) as i64 - 3;
                if next() % 10 == 0 { v * 10 } else { v }
            })
            .collect();
        for (&k, &v) in keys.iter().zip(&values) {
            sums[k as usize] += v;
        }
        all.push(KvPairs::new(keys, values, 1).unwrap());
    }
    (all, sums)
}

/// The significantly-modified filter at `theta`.
fn sigmod(theta: f64) -> Filters {
    Filters::significantly_modified(Threshold::new(theta).unwrap())
}

/// A worker and a server of a job with `filters` after every push of [`pushes`], and those
/// pushes with their sum per key.
fn pushed_through(filters: Filters) -> (Pair, Vec<KvPairs<i64>>, Vec<i64>) {
    let (pushes, sums) = pushes();
    let mut pair = Pair::new(&job(filters));
    for kvs in pushes.clone() {
        pair.push(kvs);
    }
    (pair, pushes, sums)
}

fn totals(server: &Server<i64>) -> Vec<i64> {
    (0..40).map(|k| server.received_total(k)[0]).collect()
}

#[test]
fn what_the_significantly_modified_filter_holds_back_reaches_the_servers_once_the_worker_flushes() {
    let (mut pair, pushes, sums) = pushed_through(sigmod(6.0));
    // Held back: the servers lack some of what was pushed, and the filter says what it saved.
    assert_ne!(totals(&pair.server), sums);
    let [(name, saving)] = pair.worker.filter_savings()[..] else {
        panic!("one filter: {:?}", pair.worker.filter_savings());
    };
    assert_eq!(name, "sigmod");
    let rows: u64 = pushes.iter().map(|p| p.len() as u64).sum();
    assert_eq!(saving.rows_in, rows);
    assert!(saving.rows_out < rows / 2, "{saving:?} of {rows} rows");
    assert_eq!(saving.bytes_saved, (rows - saving.rows_out) * 16);
    // Flushed: every change is there, exactly once.
    assert!(pair.flush().is_some());
    assert_eq!(totals(&pair.server), sums);
    assert!(pair.flush().is_none(), "nothing left to flush");
    let flushed = pair.worker.filter_savings()[0].1;
    assert!(flushed.rows_out > saving.rows_out);
}

#[test]
fn without_filters_every_push_goes_whole_and_nothing_waits_for_a_flush() {
    let (mut pair, _, sums) = pushed_through(Filters::none());
    assert_eq!(totals(&pair.server), sums);
    assert!(pair.flush().is_none());
    assert!(pair.worker.filter_savings().is_empty());
}

#[test]
fn a_threshold_of_zero_sends_every_change_at_once() {
    let (pair, _, sums) = pushed_through(sigmod(0.0));
    // A zero change may wait (it changes nothing); every other change is there at once.
    assert_eq!(totals(&pair.server), sums);
}

#[test]
fn a_worker_whose_filters_hold_changes_is_refused_leave_until_it_flushes() {
    let (mut pair, _, _) = pushed_through(sigmod(6.0));
    let mut out = Effects::new();
    let refused = pair.worker.leave(&mut out);
    assert!(
        matches!(refused, Err(WorkerError::Unflushed { rows }) if rows > 0),
        "{refused:?}"
    );
    assert!(out.sends.is_empty(), "no Leave sent: {:?}", out.sends);
    pair.flush();
    pair.worker.leave(&mut out).unwrap();
    assert!(
        out.sends
            .iter()
            .any(|e| e.to == common::COORD && matches!(e.body, Message::Leave))
    );
}
