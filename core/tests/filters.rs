//! Filters on the push path, driven by hand (ARCHITECTURE.md §10): what a worker's filters
//! hold back reaches the servers later, and nothing is lost once the worker flushes.

use crate::common;
use pserver_core::events::{Refusal, WorkerEvent};

use common::config;
use pserver_core::filter::{Filters, KeyCaching, KeysDigest, Kkt, Threshold};
use pserver_core::node::*;
use pserver_core::pace::Coverage;
use pserver_core::wire::ClusterConfig;
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
    server_cfg: ServerConfig,
    now: Time,
    /// The kind of every message delivered, in order.
    kinds: Vec<String>,
    /// What pulls returned.
    pulled: Vec<KvPairs<i64>>,
}

impl Pair {
    fn new(job: &JobSpec) -> Self {
        Self::of(job.worker_config(W1), job.server_config(S1))
    }

    fn of(worker: WorkerConfig, server: ServerConfig) -> Self {
        let mut worker = Worker::new(worker);
        worker.start_configured(0, Self::cluster(), &mut Effects::new());
        let mut pair = Pair {
            worker,
            server: Server::new(server, Updater::Sum),
            server_cfg: server,
            now: 0,
            kinds: Vec::new(),
            pulled: Vec::new(),
        };
        pair.restart_server();
        pair
    }

    fn cluster() -> ClusterConfig {
        config(1, &[1], &[W1], Consistency::Sequential)
    }

    /// The server process starts again, holding nothing.
    fn restart_server(&mut self) {
        self.server = Server::new(self.server_cfg, Updater::Sum);
        self.server
            .start_configured(self.now, Self::cluster(), &mut Effects::new());
    }

    /// Delivers `out`'s messages, and those they cause, until nothing is sent.
    fn settle(&mut self, mut out: Effects<i64>) {
        for _ in 0..1000 {
            for event in out.events.drain(..) {
                if let Event::Worker(WorkerEvent::PullDone(_, kvs)) = event {
                    self.pulled.push(kvs);
                }
            }
            let sends = std::mem::take(&mut out.sends);
            if sends.is_empty() {
                return;
            }
            self.now += 1;
            for env in sends {
                let kind = format!("{:?}", env.body);
                let end = kind
                    .find(|c: char| !c.is_alphanumeric())
                    .unwrap_or(kind.len());
                self.kinds.push(kind[..end].to_string());
                match env.to {
                    S1 => self.server.on_message(self.now, env, &mut out),
                    W1 => self.worker.on_message(self.now, env, &mut out),
                    _ => {}
                }
            }
        }
        panic!("the messages between worker and server never settled");
    }

    fn pull(&mut self, keys: &[Key]) -> KvPairs<i64> {
        let mut out = Effects::new();
        let list = KeyList::new(keys.to_vec()).unwrap();
        self.worker
            .pull(self.now, KeySelection::Keys(list), &mut out)
            .unwrap();
        self.settle(out);
        self.pulled.pop().expect("the pull completed")
    }

    /// Pulls every key the server holds.
    fn pull_everything(&mut self) -> KvPairs<i64> {
        let mut out = Effects::new();
        let all = RangeList::new(vec![KeyRange::FULL]).unwrap();
        self.worker
            .pull(self.now, KeySelection::Ranges(all), &mut out)
            .unwrap();
        self.settle(out);
        self.pulled.pop().expect("the pull completed")
    }

    /// What the worker's filter `name` saved.
    fn saving(&self, name: &str) -> filter::FilterSaving {
        self.worker
            .filter_savings()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no saving of {name}"))
            .1
    }

    /// How many messages of `kind` were delivered.
    fn count(&self, kind: &str) -> usize {
        self.kinds.iter().filter(|k| *k == kind).count()
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

/// Key caching keeping `lists` lists per peer.
fn caching(lists: u32) -> Filters {
    Filters::key_caching(KeyCaching::new(lists).unwrap())
}

/// Pushes of [`pushes`]' first three key lists, in an order that comes back to each, and
/// their sum per key.
fn returning_pushes() -> (Vec<KvPairs<i64>>, Vec<i64>) {
    let (pushes, _) = pushes();
    let order = [0, 1, 0, 1, 2, 0, 2, 1, 1, 0, 2, 2];
    let mut sums = vec![0i64; 40];
    let mut all = Vec::new();
    for (round, &i) in order.iter().enumerate() {
        let p: &KvPairs<i64> = &pushes[i];
        let values: Vec<i64> = p.values().iter().map(|v| v * (round as i64 + 1)).collect();
        for (&k, &v) in p.keys().iter().zip(&values) {
            sums[k as usize] += v;
        }
        all.push(KvPairs::new(p.keys().to_vec(), values, 1).unwrap());
    }
    (all, sums)
}

#[test]
fn key_caching_names_a_list_sent_before_and_a_pull_is_answered_without_its_keys() {
    let mut pair = Pair::new(&job(caching(8)));
    let keys: Vec<Key> = vec![3, 9, 12, 30];
    pair.push(KvPairs::new(keys.clone(), vec![1, 2, 3, 4], 1).unwrap());
    assert_eq!((pair.count("Push"), pair.count("PushCached")), (1, 0));
    pair.push(KvPairs::new(keys.clone(), vec![10, 20, 30, 40], 1).unwrap());
    assert_eq!((pair.count("Push"), pair.count("PushCached")), (1, 1));
    // The pull asks for the list the pushes went over: by name, answered without keys.
    let pulled = pair.pull(&keys);
    assert_eq!((pair.count("PullCached"), pair.count("PullValues")), (1, 1));
    assert_eq!((pair.count("Pull"), pair.count("PullReply")), (0, 0));
    assert_eq!(pulled.keys(), &keys[..]);
    assert_eq!(pulled.values(), &[11, 22, 33, 44]);
    // A list the server was never sent goes whole; its answer still comes without keys.
    let other = pair.pull(&[3, 4]);
    assert_eq!((other.keys(), other.values()), (&[3, 4][..], &[11, 0][..]));
    assert_eq!((pair.count("Pull"), pair.count("PullValues")), (1, 2));
    let [(name, saving)] = pair.worker.filter_savings()[..] else {
        panic!("one filter: {:?}", pair.worker.filter_savings());
    };
    assert_eq!(name, "keycache");
    // Four pushes and pulls of 4, 4, 4 and 2 keys; the first and last went whole.
    assert_eq!((saving.rows_in, saving.rows_out), (14, 6));
    assert!(saving.bytes_saved > 0, "{saving:?}");
}

#[test]
fn key_caching_delivers_every_push_exactly_when_the_server_evicted_the_list_named() {
    // The worker counts on the server holding four lists; the server keeps one.
    let job = job(caching(4));
    let mut server = job.server_config(S1);
    server.key_caching = KeyCaching::new(1);
    let mut pair = Pair::of(job.worker_config(W1), server);
    let (pushes, sums) = returning_pushes();
    for kvs in pushes {
        pair.push(kvs);
    }
    assert!(pair.count("KeysUnknown") > 0, "{:?}", pair.kinds);
    assert!(pair.count("PushCached") > pair.count("KeysUnknown"));
    assert_eq!(totals(&pair.server), sums);
}

#[test]
fn key_caching_delivers_every_push_exactly_to_a_server_that_restarted() {
    let mut pair = Pair::new(&job(caching(8)));
    let (pushes, _) = returning_pushes();
    let (before, after) = pushes.split_at(4);
    for kvs in before {
        pair.push(kvs.clone());
    }
    let named = pair.count("PushCached");
    assert!(named > 0);
    pair.restart_server();
    let mut sums = vec![0i64; 40];
    for kvs in after {
        for (k, v) in kvs.iter() {
            sums[k as usize] += v[0];
        }
        pair.push(kvs.clone());
    }
    // The new process holds no list: each the worker named once misses, and goes whole.
    assert!(pair.count("KeysUnknown") >= 1, "{:?}", pair.kinds);
    assert!(pair.count("PushCached") > named);
    assert_eq!(totals(&pair.server), sums);
}

#[test]
fn a_server_refuses_values_for_another_number_of_rows_than_the_list_named() {
    let mut pair = Pair::new(&job(caching(8)));
    let keys: Vec<Key> = vec![1, 5, 7];
    pair.push(KvPairs::new(keys.clone(), vec![1, 1, 1], 1).unwrap());
    let short = KvPairs::new(vec![0, 1], vec![5, 5], 1).unwrap();
    let push = PushCached {
        slice: SliceRef {
            request: 99,
            slice: 0,
        },
        iteration: 1,
        covers: Coverage::WHOLE,
        settled_below: 0,
        keys: KeysDigest::of(&keys),
        values: RowValues::of(&short),
    };
    let mut out = Effects::new();
    let env = Envelope::new(W1, S1, 1, Message::PushCached(push));
    pair.server.on_message(pair.now, env, &mut out);
    assert!(
        out.events.iter().any(|e| matches!(
            e,
            Event::Refused {
                reason: Refusal::RowsMismatch,
                ..
            }
        )),
        "{:?}",
        out.events
    );
    assert!(out.sends.is_empty());
    assert_eq!(totals(&pair.server)[1], 1);
}

/// The KKT filter, holding a change to a zero weight while it adds up to at most `bound`.
fn kkt(bound: f64, every: u32) -> Kkt {
    Kkt::new(Threshold::new(bound).unwrap(), every).unwrap()
}

/// Each of [`pushes`] after a pull of its keys, as a trainer pushes its gradient: the pulls
/// answer zero for a key until a push of it reached the server.
fn pulled_and_pushed(pair: &mut Pair) -> Vec<i64> {
    let (pushes, sums) = pushes();
    for kvs in pushes {
        pair.pull(kvs.keys());
        pair.push(kvs);
    }
    sums
}

#[test]
fn what_the_kkt_filter_holds_back_reaches_the_servers_once_the_worker_flushes() {
    let mut cached = caching_compressed(16);
    cached.kkt = Some(kkt(20.0, 100));
    for filters in [Filters::kkt(kkt(20.0, 100)), cached] {
        let mut pair = Pair::new(&job(filters));
        let sums = pulled_and_pushed(&mut pair);
        // Every change to a key held within the bound since its first push: none reached the
        // server, whose weights stay zero, and so it goes on.
        assert_ne!(totals(&pair.server), sums, "{filters:?}");
        let saving = pair.saving("kkt");
        assert!(saving.rows_out < saving.rows_in, "{saving:?}");
        assert!(pair.flush().is_some());
        assert_eq!(totals(&pair.server), sums, "{filters:?}");
        if filters.key_caching.is_some() {
            // A held row goes as zeros in the pulled list, which key caching names.
            assert!(pair.count("PushCached") > 0, "{:?}", pair.kinds);
        }
    }
}

/// Key caching with compression, keeping `lists` lists per peer.
fn caching_compressed(lists: u32) -> Filters {
    Filters::key_caching_compressed(KeyCaching::new(lists).unwrap())
}

/// An embedder's filter: it holds every other push, and sends it summed with the next.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct EveryOther {
    held: Option<Vec<(Key, i64)>>,
    saving: filter::FilterSaving,
}

impl filter::Filter<i64> for EveryOther {
    fn name(&self) -> &'static str {
        "every_other"
    }

    fn push(&mut self, kvs: KvPairs<i64>) -> KvPairs<i64> {
        self.saving.rows_in += kvs.len() as u64;
        let rows: Vec<(Key, i64)> = kvs.iter().map(|(k, v)| (k, v[0])).collect();
        match self.held.take() {
            None => {
                self.held = Some(rows);
                KvPairs::empty(1).unwrap()
            }
            Some(held) => self.merged(held.into_iter().chain(rows)),
        }
    }

    fn flush(&mut self) -> Option<KvPairs<i64>> {
        let held = self.held.take()?;
        Some(self.merged(held.into_iter()))
    }

    fn holds(&self) -> usize {
        self.held.as_ref().map_or(0, Vec::len)
    }

    fn saving(&self) -> filter::FilterSaving {
        self.saving
    }
}

impl EveryOther {
    fn merged(&mut self, rows: impl Iterator<Item = (Key, i64)>) -> KvPairs<i64> {
        let mut sums = std::collections::BTreeMap::new();
        for (k, v) in rows {
            *sums.entry(k).or_insert(0) += v;
        }
        self.saving.rows_out += sums.len() as u64;
        let (keys, values) = sums.into_iter().unzip();
        KvPairs::new(keys, values, 1).unwrap()
    }
}

#[test]
fn a_worker_runs_an_embedders_filter_after_the_jobs_and_reports_its_saving() {
    let (pushes, sums) = pushes();
    let mut pair = Pair::new(&job(sigmod(0.0)));
    let before = pair.worker.clone();
    pair.worker = pair.worker.clone().with_filter(EveryOther::default());
    // A worker is compared by its filter's state too: the model checker and the simulator
    // tell states apart by it.
    assert_ne!(pair.worker, before);
    assert_eq!(pair.worker, pair.worker.clone());
    for kvs in pushes.iter().take(3).cloned() {
        pair.push(kvs);
    }
    // The third push waits; another worker with the same filter holding nothing differs.
    let mut emptied = pair.worker.clone();
    assert_eq!(emptied, pair.worker);
    emptied.flush(pair.now, &mut Effects::new()).unwrap();
    assert_ne!(emptied, pair.worker);
    let mut out = Effects::new();
    assert!(matches!(
        pair.worker.leave(&mut out),
        Err(WorkerError::Unflushed { .. })
    ));
    for kvs in pushes.iter().skip(3).cloned() {
        pair.push(kvs);
    }
    pair.flush();
    assert_eq!(totals(&pair.server), sums);
    let names: Vec<&str> = pair.worker.filter_savings().iter().map(|s| s.0).collect();
    assert_eq!(names, ["sigmod", "every_other"]);
    let saving = pair.worker.filter_savings()[1].1;
    assert!(saving.rows_out < saving.rows_in, "{saving:?}");
}

#[test]
fn a_range_pull_is_answered_with_its_values_packed_and_comes_back_exactly() {
    // 300 keys, most of them summing to zero on the server, the rest to few distinct values:
    // a model under L1 regularization, as a worker measuring it pulls it whole.
    let keys: Vec<Key> = (0..300).map(|k| k * 7 + 2).collect();
    let first: Vec<i64> = (0..300).map(|i| i % 5).collect();
    let second: Vec<i64> = (0..300)
        .map(|i| if i % 9 == 0 { 0 } else { -(i % 5) })
        .collect();
    let pulled = |filters: Filters| {
        let mut pair = Pair::new(&job(filters));
        pair.push(KvPairs::new(keys.clone(), first.clone(), 1).unwrap());
        pair.push(KvPairs::new(keys.clone(), second.clone(), 1).unwrap());
        let everything = pair.pull_everything();
        (pair, everything)
    };
    let (plain, expected) = pulled(caching(8));
    assert_eq!((plain.count("PullReply"), plain.count("PullRows")), (1, 0));
    assert_eq!(expected.keys(), &keys[..]);
    let (mut packed, got) = pulled(caching_compressed(8));
    assert_eq!(
        (packed.count("PullReply"), packed.count("PullRows")),
        (0, 1)
    );
    assert_eq!(got, expected);
    let compress = packed.saving("compress");
    // 300 values of 8 bytes, of which 27 are not zero, of 4 distinct values: a bitmap of
    // 38 bytes, a table of 4 and two bits a row kept.
    assert!(
        compress.bytes_saved >= 300 * 8 - (38 + 4 * 8 + 1 + 9),
        "{compress:?}"
    );
    assert!(packed.flush().is_none());
}
