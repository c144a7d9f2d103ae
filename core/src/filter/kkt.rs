//! The KKT filter (ARCHITECTURE.md §10): for an L1-regularised model, the change to a key whose
//! weight is zero waits on the worker while the optimality conditions say the weight stays zero.
//!
//! The bound a change may add up to is the regularizer's L1 strength (`Kkt::bound`;
//! `pserver train --kkt` takes FTRL's `l1`). The filter is shown every pull's answer before the
//! application sees it (`Filter::pulled`) and remembers the last few pulls' keys and zero rows.
//! With key caching and compression a held row goes as zeros rather than being left out
//! (`KktFilter::keeping_lists`). Held changes live in the table the significantly-modified filter
//! uses too (`HeldRows`, `super::held`).

use std::collections::VecDeque;

use crate::filter::held::HeldRows;
use crate::filter::{Filter, FilterSaving, Threshold};
use crate::key::Key;
use crate::kv::KvPairs;
use crate::value::Value;

/// How the KKT filter runs ([`crate::filter::Filters::kkt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kkt {
    bound: Threshold,
    every: u32,
}

impl Kkt {
    /// Holds a zero weight's change while it adds up to at most `bound` in absolute value,
    /// the L1 regularisation under which the weight stays zero (FTRL-Proximal's `l1`, say);
    /// a change held for `every` pushes or more goes with the key's next push, whatever its
    /// size: the full check that lets a feature come back. `None` if `every` is 0.
    pub fn new(bound: Threshold, every: u32) -> Option<Self> {
        (every > 0).then_some(Kkt { bound, every })
    }

    /// The bound a held change stays within.
    pub fn bound(self) -> Threshold {
        self.bound
    }

    /// After how many pushes a held change goes with its key's next push.
    pub fn every(self) -> u32 {
        self.every
    }
}

/// How many recent pulls the filter remembers: a worker that pulls its next minibatch while
/// it computes this one pushes for the pull before the last.
const PULLS_KEPT: usize = 4;

/// A pull's keys, and which of its rows were all zero.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Pulled {
    keys: Vec<Key>,
    zero: Vec<bool>,
}

/// Holds back the change to a key whose pulled weight is zero while the change adds up to no
/// more than the L1 bound ([`Kkt::bound`]): under L1 regularisation the weight stays zero
/// until its accumulated gradient passes that bound (Li et al., OSDI 2014, §5.1: most
/// features of a sparse model are zero and stay so). Unlike the paper's filter it drops
/// nothing: a held change goes with the key's first push after it passed the bound, after
/// the key's weight became non-zero, or after it waited [`Kkt::every`] pushes (the periodic
/// full check that lets a feature come back), or else at [`Filter::flush`]. The full check
/// goes key by key, with the key's own push, rather than everything at once: a push of the
/// keys the worker pulled keeps the list key caching names it by.
///
/// The filter learns which weights are zero from the worker's pulls ([`Filter::pulled`]):
/// a push is judged against the remembered pull of the same keys, and a push of keys never
/// pulled goes whole.
#[derive(Clone, Debug)]
pub struct KktFilter<V: Value> {
    kkt: Kkt,
    width: usize,
    /// The last pulls, newest last.
    pulls: VecDeque<Pulled>,
    /// The changes not sent yet, per key, each with the push that began holding it.
    held: HeldRows<V>,
    /// Pushes so far.
    pushes: u64,
    /// Whether a held row stays in the push, as zeros ([`KktFilter::keeping_lists`]).
    keep_lists: bool,
    saving: FilterSaving,
}

// By hand: a derive would ask `V: Eq + Hash`, which floats are not; the table compares
// values by their bits.
impl<V: Value> PartialEq for KktFilter<V> {
    fn eq(&self, other: &Self) -> bool {
        self.kkt == other.kkt
            && self.width == other.width
            && self.pulls == other.pulls
            && self.held == other.held
            && self.pushes == other.pushes
            && self.keep_lists == other.keep_lists
            && self.saving == other.saving
    }
}

impl<V: Value> Eq for KktFilter<V> {}

impl<V: Value> std::hash::Hash for KktFilter<V> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.kkt.hash(state);
        self.width.hash(state);
        self.pulls.hash(state);
        self.held.hash(state);
        self.pushes.hash(state);
        self.keep_lists.hash(state);
        self.saving.hash(state);
    }
}

impl<V: Value> KktFilter<V> {
    /// The filter as `kkt` says, on pushes of `width` values per key.
    pub fn new(kkt: Kkt, width: usize) -> Self {
        KktFilter {
            kkt,
            width,
            pulls: VecDeque::new(),
            held: HeldRows::new(width),
            pushes: 0,
            keep_lists: false,
            saving: FilterSaving::default(),
        }
    }

    /// The filter, holding a row back by pushing zeros for it rather than leaving its key
    /// out: a zero changes no weight under any [`crate::Updater`], the push's key list stays
    /// the one the worker pulled, so key caching still names it, and compression sends the
    /// zero row as one bit ([`crate::filter::Filters::compression`]).
    pub fn keeping_lists(mut self) -> Self {
        self.keep_lists = true;
        self
    }

    /// Bytes of a row on the wire, as [`FilterSaving::bytes_saved`] counts them.
    fn row_bytes(&self) -> usize {
        8 + self.width * V::SIZE
    }
}

impl<V: Value> Filter<V> for KktFilter<V> {
    fn name(&self) -> &'static str {
        "kkt"
    }

    fn pulled(&mut self, kvs: &KvPairs<V>) {
        let zero = kvs
            .iter()
            .map(|(_, row)| row.iter().all(|v| v.to_f64() == 0.0))
            .collect();
        if self.pulls.len() == PULLS_KEPT {
            self.pulls.pop_front();
        }
        self.pulls.push_back(Pulled {
            keys: kvs.keys().to_vec(),
            zero,
        });
    }

    fn push(&mut self, kvs: KvPairs<V>) -> KvPairs<V> {
        self.pushes += 1;
        let (width, bound, every) = (self.width, self.kkt.bound.get(), u64::from(self.kkt.every));
        // NaN is never within the bound: a filter must not hide it.
        let within = |v: V| v.to_f64().abs() <= bound;
        let pulled = self.pulls.iter().rposition(|p| p.keys == kvs.keys());
        let mut keys = Vec::with_capacity(kvs.len());
        let mut values = Vec::with_capacity(kvs.len() * width);
        let mut held_in_list = 0;
        for (i, (key, row)) in kvs.iter().enumerate() {
            let zero = pulled.is_some_and(|p| self.pulls[p].zero[i]);
            let keep = self
                .held
                .add(key, row)
                .map(|sum| zero && self.pushes - sum.since < every && sum.values().all(within));
            let hold = match keep {
                Some(true) => true,
                Some(false) => {
                    keys.push(key);
                    self.held.release(key, &mut values);
                    false
                }
                None if zero && row.iter().all(|&v| within(v)) => {
                    self.held.hold(key, row, self.pushes);
                    true
                }
                None => {
                    keys.push(key);
                    values.extend_from_slice(row);
                    false
                }
            };
            if hold && self.keep_lists {
                keys.push(key);
                values.extend(std::iter::repeat_n(V::from_f64(0.0), width));
                held_in_list += 1;
            }
        }
        let row_bytes = self.row_bytes();
        self.saving
            .count(kvs.len(), keys.len() - held_in_list, row_bytes);
        // The push's keys, or a subset of them, in its order.
        KvPairs::from_validated(keys, values, width)
    }

    fn flush(&mut self) -> Option<KvPairs<V>> {
        if self.held.is_empty() {
            return None;
        }
        let (keys, values) = self.held.drain();
        let row_bytes = self.row_bytes();
        self.saving.count(0, keys.len(), row_bytes);
        // Sorted keys of a map, each once.
        Some(KvPairs::from_validated(keys, values, self.width))
    }

    fn holds(&self) -> usize {
        self.held.len()
    }

    fn saving(&self) -> FilterSaving {
        self.saving
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{Hash, Hasher};

    fn kvs(keys: &[Key], values: &[f64]) -> KvPairs<f64> {
        KvPairs::new(keys.to_vec(), values.to_vec(), 1).unwrap()
    }

    fn rows(kvs: &KvPairs<f64>) -> Vec<(Key, f64)> {
        kvs.iter().map(|(k, v)| (k, v[0])).collect()
    }

    fn filter(bound: f64, every: u32) -> KktFilter<f64> {
        KktFilter::new(Kkt::new(Threshold::new(bound).unwrap(), every).unwrap(), 1)
    }

    #[test]
    fn a_zero_weights_change_waits_within_the_bound_and_a_non_zero_weights_goes() {
        let mut f = filter(0.1, 100);
        f.pulled(&kvs(&[1, 2, 3, 4], &[0.0, 0.5, 0.0, 0.0]));
        // Key 2's weight is not zero; key 4's change is past the bound; NaN never waits.
        let sent = f.push(kvs(&[1, 2, 3, 4], &[0.05, 0.01, f64::NAN, -0.2]));
        assert_eq!(sent.keys(), [2, 3, 4]);
        assert_eq!(sent.get(2), Some(&[0.01][..]));
        assert!(sent.get(3).is_some_and(|v| v[0].is_nan()));
        assert_eq!(f.holds(), 1);
        // Key 1 adds up past the bound and goes with its sum.
        f.pulled(&kvs(&[1, 4], &[0.0, 0.0]));
        let sent = f.push(kvs(&[1, 4], &[0.07, 0.01]));
        assert_eq!(rows(&sent), [(1, 0.05 + 0.07)]);
        assert_eq!(rows(&f.flush().unwrap()), [(4, 0.01)]);
        assert!(f.flush().is_none());
        let saving = f.saving();
        assert_eq!((saving.rows_in, saving.rows_out), (6, 5));
        assert_eq!(saving.bytes_saved, 16);
    }

    #[test]
    fn a_held_change_goes_once_its_weight_is_no_longer_zero() {
        let mut f = filter(1.0, 100);
        f.pulled(&kvs(&[7], &[0.0]));
        assert!(f.push(kvs(&[7], &[0.25])).is_empty());
        f.pulled(&kvs(&[7], &[0.3]));
        assert_eq!(rows(&f.push(kvs(&[7], &[0.25]))), [(7, 0.5)]);
        assert_eq!(f.holds(), 0);
    }

    #[test]
    fn a_change_held_for_every_pushes_goes_with_the_next_push_of_its_key() {
        let mut f = filter(1.0, 3);
        f.pulled(&kvs(&[2, 5], &[0.0, 0.0]));
        assert!(f.push(kvs(&[2, 5], &[0.1, 0.2])).is_empty());
        f.pulled(&kvs(&[5], &[0.0]));
        assert!(f.push(kvs(&[5], &[0.2])).is_empty());
        f.pulled(&kvs(&[9], &[0.0]));
        assert!(f.push(kvs(&[9], &[0.4])).is_empty());
        // Key 5 was first held three pushes ago: the full check sends its sum, with this
        // push's change. Key 2, not pushed, waits for its next push or a flush.
        f.pulled(&kvs(&[5, 9], &[0.0, 0.0]));
        let sent = f.push(kvs(&[5, 9], &[0.5, 0.1]));
        assert_eq!(rows(&sent), [(5, 0.2 + 0.2 + 0.5)]);
        assert_eq!(f.holds(), 2);
        // Key 5 starts again.
        f.pulled(&kvs(&[5], &[0.0]));
        assert!(f.push(kvs(&[5], &[0.1])).is_empty());
        assert_eq!(rows(&f.flush().unwrap()), [(2, 0.1), (5, 0.1), (9, 0.5)]);
    }

    #[test]
    fn keeping_lists_pushes_zeros_for_what_it_holds() {
        let mut f = filter(1.0, 100).keeping_lists();
        f.pulled(&kvs(&[1, 2, 3], &[0.0, 0.7, 0.0]));
        let sent = f.push(kvs(&[1, 2, 3], &[0.5, 0.5, 0.5]));
        assert_eq!(rows(&sent), [(1, 0.0), (2, 0.5), (3, 0.0)]);
        let saving = f.saving();
        assert_eq!((saving.rows_in, saving.rows_out), (3, 1));
        assert_eq!(rows(&f.flush().unwrap()), [(1, 0.5), (3, 0.5)]);
    }

    #[test]
    fn a_push_of_keys_not_pulled_goes_whole_and_only_the_last_pulls_are_remembered() {
        let mut f = filter(1.0, 100);
        f.pulled(&kvs(&[1, 2], &[0.0, 0.0]));
        assert_eq!(f.push(kvs(&[1], &[0.5])).keys(), [1]);
        for k in 10..10 + PULLS_KEPT as u64 {
            f.pulled(&kvs(&[k], &[0.0]));
        }
        // The pull of 1 and 2 is forgotten; the latest ones are not.
        assert_eq!(f.push(kvs(&[1, 2], &[0.5, 0.5])).keys(), [1, 2]);
        assert!(f.push(kvs(&[10], &[0.5])).is_empty());
    }

    /// Two filters holding the same changes are equal and hash alike, whatever slots hold
    /// them: the model checker and the simulator compare workers by their state.
    #[test]
    fn filters_holding_the_same_changes_are_equal_whatever_their_order() {
        let hash = |f: &KktFilter<f64>| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            f.hash(&mut h);
            h.finish()
        };
        // Rows of two values: `x` holds 2 before 3, `y` the other way round (the table's own
        // test shows their slots do not count either).
        let wide =
            |keys: &[Key], values: &[f64]| KvPairs::new(keys.to_vec(), values.to_vec(), 2).unwrap();
        let kkt = Kkt::new(Threshold::new(1.0).unwrap(), 100).unwrap();
        let (mut x, mut y) = (KktFilter::new(kkt, 2), KktFilter::new(kkt, 2));
        x.pulled(&wide(&[2, 3], &[0.0; 4]));
        y.pulled(&wide(&[2, 3], &[0.0; 4]));
        assert!(x.push(wide(&[2, 3], &[0.5, 0.25, 0.75, 0.125])).is_empty());
        y.pushes = 1;
        y.held.hold(3, &[0.75, 0.125], 1);
        y.held.hold(2, &[0.5, 0.25], 1);
        y.saving = x.saving;
        assert_eq!(x, y);
        assert_eq!(hash(&x), hash(&y));
        let mut z = y.clone();
        z.held.add(2, &[0.0, 0.05]);
        assert_ne!(x, z);
        // And what they flush is the same rows.
        let rows = |f: &mut KktFilter<f64>| f.flush().unwrap().values().to_vec();
        assert_eq!(rows(&mut x), [0.5, 0.25, 0.75, 0.125]);
        assert_eq!(rows(&mut y), [0.5, 0.25, 0.75, 0.125]);
    }

    #[test]
    fn a_row_of_several_values_is_held_and_sent_whole() {
        let wide =
            |keys: &[Key], values: &[f64]| KvPairs::new(keys.to_vec(), values.to_vec(), 3).unwrap();
        let kkt = Kkt::new(Threshold::new(1.0).unwrap(), 100).unwrap();
        let mut f = KktFilter::new(kkt, 3);
        f.pulled(&wide(&[1, 2], &[0.0; 6]));
        // Key 2 has a value past the bound: its row goes whole.
        let sent = f.push(wide(&[1, 2], &[0.5, -0.5, 0.25, 0.5, 2.0, 0.0]));
        assert_eq!(sent.keys(), [2]);
        f.pulled(&wide(&[1, 4], &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]));
        assert!(
            f.push(wide(&[1, 4], &[0.25, 0.25, 0.25, 0.5, 0.5, 0.5]))
                .is_empty()
        );
        // Key 1's weight is no longer zero: its sum goes, every value of it.
        f.pulled(&wide(&[1], &[0.1, 0.0, 0.0]));
        let sent = f.push(wide(&[1], &[0.125, 0.125, 0.125]));
        assert_eq!(sent.values(), [0.875, -0.125, 0.625]);
        // Key 4 goes at the flush, in a slot key 1's row freed or its own.
        f.pulled(&wide(&[6], &[0.0; 3]));
        assert!(f.push(wide(&[6], &[0.0, 0.0, 0.75])).is_empty());
        let flushed = f.flush().unwrap();
        assert_eq!(flushed.keys(), [4, 6]);
        assert_eq!(flushed.values(), [0.5, 0.5, 0.5, 0.0, 0.0, 0.75]);
    }

    /// What goes, summed per key, is what was pushed once the filter flushes.
    #[test]
    fn everything_pushed_goes_once_the_filter_flushes() {
        let mut f = filter(0.3, 5);
        let mut pushed = std::collections::BTreeMap::<Key, f64>::new();
        let mut sent = std::collections::BTreeMap::<Key, f64>::new();
        let add = |to: &mut std::collections::BTreeMap<Key, f64>, kvs: &KvPairs<f64>| {
            for (k, v) in kvs.iter() {
                *to.entry(k).or_default() += v[0];
            }
        };
        for step in 0u64..42 {
            let keys: Vec<Key> = (0..6)
                .map(|i| (step * 7 + i * 3) % 11)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let weights: Vec<f64> = keys
                .iter()
                .map(|k| if (k + step) % 3 == 0 { 0.4 } else { 0.0 })
                .collect();
            let grads: Vec<f64> = keys
                .iter()
                .map(|k| ((k * 31 + step * 17) % 13) as f64 / 40.0 - 0.15)
                .collect();
            f.pulled(&kvs(&keys, &weights));
            let push = kvs(&keys, &grads);
            add(&mut pushed, &push);
            let out = f.push(push);
            add(&mut sent, &out);
        }
        assert!(f.holds() > 0);
        add(&mut sent, &f.flush().unwrap());
        assert_eq!(pushed.len(), sent.len());
        for (k, v) in pushed {
            assert!((sent[&k] - v).abs() < 1e-9, "key {k}");
        }
    }

    /// The setting reads back as given: the simulator and the CLI report it.
    #[test]
    fn kkt_says_its_bound_and_period() {
        let kkt = Kkt::new(Threshold::new(0.25).unwrap(), 3).unwrap();
        assert_eq!((kkt.bound().get(), kkt.every()), (0.25, 3));
        assert!(Kkt::new(Threshold::new(0.25).unwrap(), 0).is_none());
    }

    /// Filters with another bound, or other pulls remembered, judge pushes differently: unequal,
    /// and hashed apart, for the model checker.
    #[test]
    fn filters_with_another_bound_or_other_pulls_are_not_equal_and_hash_apart() {
        let hash = |f: &KktFilter<f64>| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            f.hash(&mut h);
            h.finish()
        };
        let a = filter(1.0, 100);
        let other_bound = filter(2.0, 100);
        assert_ne!(a, other_bound);
        assert_ne!(hash(&a), hash(&other_bound));
        let mut pulled = a.clone();
        pulled.pulled(&kvs(&[1], &[0.0]));
        assert_ne!(a, pulled);
        assert_ne!(hash(&a), hash(&pulled));
    }

    /// The full check counts the pushes since a change began to be held: one held at push 2
    /// waited 3 pushes at push 5.
    #[test]
    fn the_full_check_counts_pushes_since_the_change_was_first_held() {
        let mut f = filter(1.0, 3);
        // Push 1: keys never pulled go whole.
        assert_eq!(rows(&f.push(kvs(&[9], &[0.1]))), [(9, 0.1)]);
        // Push 2: key 5 begins to be held.
        f.pulled(&kvs(&[5], &[0.0]));
        assert!(f.push(kvs(&[5], &[0.1])).is_empty());
        // Pushes 3 and 4.
        for _ in 0..2 {
            assert_eq!(f.push(kvs(&[9], &[0.1])).keys(), [9]);
        }
        // Push 5: key 5 was held three pushes ago, and goes.
        f.pulled(&kvs(&[5], &[0.0]));
        assert_eq!(rows(&f.push(kvs(&[5], &[0.1]))), [(5, 0.2)]);
        assert_eq!(f.holds(), 0);
    }

    /// With lists kept, a push's rows out are its rows less those held, one held or none (the
    /// other test holds 2 of 3, too few to tell a difference from a ratio).
    #[test]
    fn keeping_lists_counts_the_rows_sent_less_those_held() {
        let mut f = filter(1.0, 100).keeping_lists();
        f.pulled(&kvs(&[1, 2, 3, 4], &[0.0, 0.7, 0.7, 0.7]));
        let sent = f.push(kvs(&[1, 2, 3, 4], &[0.5; 4]));
        assert_eq!(rows(&sent), [(1, 0.0), (2, 0.5), (3, 0.5), (4, 0.5)]);
        let saving = f.saving();
        assert_eq!((saving.rows_in, saving.rows_out), (4, 3));
        f.pulled(&kvs(&[2], &[0.7]));
        assert_eq!(rows(&f.push(kvs(&[2], &[0.5]))), [(2, 0.5)]);
        let saving = f.saving();
        assert_eq!((saving.rows_in, saving.rows_out), (5, 4));
    }
}
