//! Filters on the push path (ARCHITECTURE.md §10): fewer bytes per iteration, nothing lost.
//!
//! A job chooses its filters in [`JobSpec::filters`](crate::JobSpec::filters) ([`Filters`]); every
//! worker then runs each push through them before cutting it into slices, so that what a filter
//! passes is sliced, retransmitted and de-duplicated like any push. A filter may hold part of a
//! push back, to send later; it never drops anything for good: what it holds goes with a later push
//! of the same key or when the worker flushes ([`crate::node::Worker::flush`], which pushes
//! everything held, in the current iteration). A worker whose filters hold changes is refused leave
//! ([`crate::WorkerError::Unflushed`]), and the runtime's leave flushes and waits for that push
//! first.
//!
//! [`Filter`] is the interface every filter on a push's content implements: the built-in
//! [`SignificantlyModified`] and [`KktFilter`], and any an embedder writes and gives a worker
//! ([`crate::node::Worker::with_filter`]), which runs after the job's. Such a filter sits behind an
//! object-safe bridge, so that a worker holding one is still `Clone + Eq + Hash`. Key caching and
//! value compression work on messages instead: they change how a message names its keys and packs
//! its values, and need to know what a peer holds, so they live in the worker's and the server's
//! message handling and are chosen in [`Filters`] only.
//!
//! # Savings
//!
//! Each filter counts what it saved ([`FilterSaving`]: rows in, rows out, bytes not sent), and
//! [`Worker::filter_savings`](crate::node::Worker::filter_savings) reports them by name (`sigmod`,
//! `kkt`, `keycache`, `compress`, and an embedder's filter under its own). With key caching and
//! compression, the KKT filter's held rows are counted by both: by `kkt` as rows it held, and by
//! `compress` as the zero rows it packed away. Savings that count every send (`Tally`) are left out
//! of node equality: they say what a node did, not what it will do, and would make every
//! retransmission a new state for the checker.

mod held;
pub(crate) mod keycache;
mod kkt;
mod sigmod;

pub use keycache::{KeyCaching, KeysDigest};
pub use kkt::{Kkt, KktFilter};
pub use sigmod::{SignificantlyModified, Threshold};

use std::any::Any;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};

use crate::kv::KvPairs;
use crate::value::Value;

/// What a filter saved so far, on one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FilterSaving {
    /// Rows (a key and its values) the filter was given.
    pub rows_in: u64,
    /// Rows it passed on to be sent (a row it held back and sent later counts then).
    pub rows_out: u64,
    /// Bytes of keys and values not sent: the rows held back, at 8 bytes a key and
    /// [`Value::SIZE`] a value, less the rows sent later.
    pub bytes_saved: u64,
}

impl FilterSaving {
    /// Adds `other`'s counts to these (another worker's, say).
    pub fn add(&mut self, other: FilterSaving) {
        self.rows_in += other.rows_in;
        self.rows_out += other.rows_out;
        self.bytes_saved += other.bytes_saved;
    }

    /// Counts `rows_in` rows given and `rows_out` sent, of `row_bytes` each.
    fn count(&mut self, rows_in: usize, rows_out: usize, row_bytes: usize) {
        self.rows_in += rows_in as u64;
        self.rows_out += rows_out as u64;
        // Every row sent was given first, so the difference is what is held or merged away.
        self.bytes_saved = (self.rows_in - self.rows_out).saturating_mul(row_bytes as u64);
    }
}

/// A filter on a worker's pushes. It sees every push before it is cut into slices and
/// returns what to send now; what it keeps it must hand back, in full, when the worker
/// flushes. A filter is part of the worker's state, so it is `Clone + Eq + Hash` like the
/// rest: the model checker and the simulator copy and compare workers.
pub trait Filter<V: Value>: Clone + Debug + PartialEq + Eq + Hash {
    /// The name the filter's saving is reported under (`sigmod`, say).
    fn name(&self) -> &'static str;

    /// Sees what a pull of the worker's returned, before the application does. Most filters
    /// judge a push by its own values and need not look.
    fn pulled(&mut self, _kvs: &KvPairs<V>) {}

    /// Takes a push and returns what to send now. Whatever is not sent now (a row, or part of
    /// a row's value) the filter keeps, to send later.
    fn push(&mut self, kvs: KvPairs<V>) -> KvPairs<V>;

    /// Everything the filter keeps, to send now; `None` if it keeps nothing.
    fn flush(&mut self) -> Option<KvPairs<V>>;

    /// Rows the filter keeps now, not sent yet.
    fn holds(&self) -> usize;

    /// What the filter saved so far.
    fn saving(&self) -> FilterSaving;
}

/// [`Filter`] made object-safe, so that a worker can run a filter whose type it does not
/// know: an embedder's own ([`crate::node::Worker::with_filter`]). Comparing and hashing go
/// through `Any` and `&mut dyn Hasher`, so that a worker holding one stays `Eq + Hash`.
trait DynFilter<V: Value>: Debug + Send + Sync {
    fn name(&self) -> &'static str;
    fn pulled(&mut self, kvs: &KvPairs<V>);
    fn push(&mut self, kvs: KvPairs<V>) -> KvPairs<V>;
    fn flush(&mut self) -> Option<KvPairs<V>>;
    fn holds(&self) -> usize;
    fn saving(&self) -> FilterSaving;
    fn clone_box(&self) -> Box<dyn DynFilter<V>>;
    fn as_any(&self) -> &dyn Any;
    fn eq_dyn(&self, other: &dyn Any) -> bool;
    fn hash_dyn(&self, state: &mut dyn Hasher);
}

impl<V: Value, F: Filter<V> + Send + Sync + 'static> DynFilter<V> for F {
    fn name(&self) -> &'static str {
        Filter::name(self)
    }
    fn pulled(&mut self, kvs: &KvPairs<V>) {
        Filter::pulled(self, kvs);
    }
    fn push(&mut self, kvs: KvPairs<V>) -> KvPairs<V> {
        Filter::push(self, kvs)
    }
    fn flush(&mut self) -> Option<KvPairs<V>> {
        Filter::flush(self)
    }
    fn holds(&self) -> usize {
        Filter::holds(self)
    }
    fn saving(&self) -> FilterSaving {
        Filter::saving(self)
    }
    fn clone_box(&self) -> Box<dyn DynFilter<V>> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn eq_dyn(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<F>() == Some(self)
    }
    fn hash_dyn(&self, mut state: &mut dyn Hasher) {
        Hash::hash(self, &mut state);
    }
}

/// An embedder's filter, behind a box.
#[derive(Debug)]
struct Custom<V: Value>(Box<dyn DynFilter<V>>);

impl<V: Value> Clone for Custom<V> {
    fn clone(&self) -> Self {
        Custom(self.0.clone_box())
    }
}

impl<V: Value> PartialEq for Custom<V> {
    fn eq(&self, other: &Self) -> bool {
        self.0.eq_dyn(other.0.as_any())
    }
}

impl<V: Value> Eq for Custom<V> {}

impl<V: Value> Hash for Custom<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name().hash(state);
        self.0.hash_dyn(state);
    }
}

/// A saving counted as it happens, which says what a node did, not what it will do: two
/// nodes that differ only in it behave alike, so it is left out of their equality and hash.
/// Counted into node state, it would make every retransmission a new state for the model
/// checker, and its search endless.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally(pub(crate) FilterSaving);

impl PartialEq for Tally {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Tally {}

impl Hash for Tally {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// The filters a job runs ([`crate::JobSpec::filters`]); the default runs none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Filters {
    /// Send a key's accumulated change only once it exceeds this threshold
    /// ([`SignificantlyModified`]).
    pub significantly_modified: Option<Threshold>,
    /// Send a key list a server was sent before as its digest, and answer a pull without the
    /// keys the worker asked for ([`KeyCaching`]).
    pub key_caching: Option<KeyCaching>,
    /// Pack the values key caching sends without keys in the smallest exact form: without
    /// their zero rows, or as an LZ4 block, where either saves bytes
    /// ([`crate::wire::RowValues`]).
    pub compression: bool,
    /// Hold the change to a zero weight while L1 regularisation keeps it zero ([`KktFilter`]).
    pub kkt: Option<Kkt>,
}

impl Filters {
    /// No filters.
    pub fn none() -> Self {
        Filters::default()
    }

    /// The significantly-modified filter at `threshold`.
    pub fn significantly_modified(threshold: Threshold) -> Self {
        Filters {
            significantly_modified: Some(threshold),
            ..Filters::default()
        }
    }

    /// The KKT filter as `kkt` says.
    pub fn kkt(kkt: Kkt) -> Self {
        Filters {
            kkt: Some(kkt),
            ..Filters::default()
        }
    }

    /// Key caching, keeping as many lists as `caching` says, with values compressed.
    pub fn key_caching_compressed(caching: KeyCaching) -> Self {
        Filters {
            key_caching: Some(caching),
            compression: true,
            ..Filters::default()
        }
    }

    /// Key caching, keeping as many lists as `caching` says.
    pub fn key_caching(caching: KeyCaching) -> Self {
        Filters {
            key_caching: Some(caching),
            ..Filters::default()
        }
    }
}

/// A worker's running filters, in the order they apply: the KKT filter first, as it judges a
/// push by the pull of the same keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FilterChain<V: Value> {
    kkt: Option<KktFilter<V>>,
    sigmod: Option<SignificantlyModified<V>>,
    /// The embedder's filters, after the built-in ones, in the order they were added.
    custom: Vec<Custom<V>>,
}

impl<V: Value> FilterChain<V> {
    /// The filters `spec` asks for, on pushes of `width` values per key.
    pub(crate) fn new(spec: &Filters, width: usize) -> Self {
        FilterChain {
            kkt: spec.kkt.map(|k| {
                let f = KktFilter::new(k, width);
                // A list the server holds costs its digest, and a zero row a bit.
                if spec.key_caching.is_some() && spec.compression {
                    f.keeping_lists()
                } else {
                    f
                }
            }),
            sigmod: spec
                .significantly_modified
                .map(|t| SignificantlyModified::new(t, width)),
            custom: Vec::new(),
        }
    }

    /// Adds `filter` after the others.
    pub(crate) fn add<F: Filter<V> + Send + Sync + 'static>(&mut self, filter: F) {
        self.custom.push(Custom(Box::new(filter)));
    }

    /// Shows every filter a pull's answer.
    pub(crate) fn pulled(&mut self, kvs: &KvPairs<V>) {
        if let Some(f) = &mut self.kkt {
            Filter::pulled(f, kvs);
        }
        if let Some(f) = &mut self.sigmod {
            Filter::pulled(f, kvs);
        }
        for f in &mut self.custom {
            f.0.pulled(kvs);
        }
    }

    /// Runs `kvs` through every filter.
    pub(crate) fn push(&mut self, mut kvs: KvPairs<V>) -> KvPairs<V> {
        if let Some(f) = &mut self.kkt {
            kvs = Filter::push(f, kvs);
        }
        if let Some(f) = &mut self.sigmod {
            kvs = Filter::push(f, kvs);
        }
        for f in &mut self.custom {
            kvs = f.0.push(kvs);
        }
        kvs
    }

    /// What the filters keep, to send now: each filter's rows, summed where they share a key.
    pub(crate) fn flush(&mut self) -> Option<KvPairs<V>> {
        let kkt = self.kkt.as_mut().and_then(Filter::flush);
        let sigmod = self.sigmod.as_mut().and_then(Filter::flush);
        let custom: Vec<_> = self.custom.iter_mut().map(|f| f.0.flush()).collect();
        [kkt, sigmod]
            .into_iter()
            .chain(custom)
            .flatten()
            .reduce(|a, b| sum_rows(&a, &b))
    }

    /// Rows the filters keep now.
    pub(crate) fn holds(&self) -> usize {
        self.kkt.as_ref().map_or(0, Filter::holds)
            + self.sigmod.as_ref().map_or(0, Filter::holds)
            + self.custom.iter().map(|f| f.0.holds()).sum::<usize>()
    }

    /// Each filter's name and saving.
    pub(crate) fn savings(&self) -> Vec<(&'static str, FilterSaving)> {
        let kkt = self
            .kkt
            .iter()
            .map(|f| (Filter::<V>::name(f), Filter::<V>::saving(f)));
        let sigmod = self
            .sigmod
            .iter()
            .map(|f| (Filter::<V>::name(f), Filter::<V>::saving(f)));
        let custom = self.custom.iter().map(|f| (f.0.name(), f.0.saving()));
        kkt.chain(sigmod).chain(custom).collect()
    }
}

/// The rows of `a` and `b`, of one width, in key order; a key both hold gets their sum.
fn sum_rows<V: Value>(a: &KvPairs<V>, b: &KvPairs<V>) -> KvPairs<V> {
    let width = a.width();
    let mut keys = Vec::with_capacity(a.len() + b.len());
    let mut values = Vec::with_capacity(keys.capacity() * width);
    let (mut a, mut b) = (a.iter().peekable(), b.iter().peekable());
    loop {
        match (a.peek(), b.peek()) {
            (Some(&(ka, ra)), Some(&(kb, rb))) if ka == kb => {
                keys.push(ka);
                values.extend(ra.iter().zip(rb).map(|(&x, &y)| x.add(y)));
                a.next();
                b.next();
            }
            (Some(&(ka, ra)), Some(&(kb, _))) if ka < kb => {
                keys.push(ka);
                values.extend_from_slice(ra);
                a.next();
            }
            (_, Some(&(kb, rb))) => {
                keys.push(kb);
                values.extend_from_slice(rb);
                b.next();
            }
            (Some(&(ka, ra)), None) => {
                keys.push(ka);
                values.extend_from_slice(ra);
                a.next();
            }
            (None, None) => break,
        }
    }
    // Two valid key lists merged: in order, each key once.
    KvPairs::from_validated(keys, values, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn savings_add_up_count_by_count() {
        let mut total = FilterSaving {
            rows_in: 10,
            rows_out: 4,
            bytes_saved: 72,
        };
        total.add(FilterSaving {
            rows_in: 3,
            rows_out: 2,
            bytes_saved: 12,
        });
        assert_eq!(
            total,
            FilterSaving {
                rows_in: 13,
                rows_out: 6,
                bytes_saved: 84,
            }
        );
    }

    #[test]
    fn flushed_rows_of_two_filters_are_summed_where_they_share_a_key() {
        let a = KvPairs::new(vec![1, 4, 9], vec![1i64, 2, 3], 1).unwrap();
        let b = KvPairs::new(vec![0, 4, 12], vec![10i64, 20, 30], 1).unwrap();
        let sum = sum_rows(&a, &b);
        assert_eq!(sum.keys(), [0, 1, 4, 9, 12]);
        assert_eq!(sum.values(), [10, 1, 22, 3, 30]);
    }
}
