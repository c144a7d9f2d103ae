use core::hash::{Hash, Hasher};

use super::ordered::LEAF_ROWS;
use super::*;
use crate::key::{Key, KeyRange};

#[test]
fn rows_start_at_zero_and_iterate_in_key_order() {
    let mut s = OrderedStore::<i64>::new(2, 1);
    s.row_mut(9).0[1] = 4;
    s.row_mut(3).0[0] = 1;
    assert_eq!(s.get(9), Some(&[0, 4][..]));
    assert_eq!(s.row_mut(3).1, &[0, 0]);
    let mut seen = Vec::new();
    s.for_each_in(KeyRange::new(0, 10).unwrap(), &mut |k, v| {
        seen.push((k, v.to_vec()))
    });
    assert_eq!(seen, vec![(3, vec![1, 0]), (9, vec![0, 4])]);
}

fn edge_key() -> impl proptest::strategy::Strategy<Value = Key> {
    use proptest::prelude::*;
    prop_oneof![
        0u64..64,
        (crate::MAX_KEY - 64)..=crate::MAX_KEY,
        any::<u64>().prop_map(|k| k % u64::MAX),
    ]
}

proptest::proptest! {
    /// Rows at the edges of the key space, up to the largest legal key, are kept and found
    /// by ranges, including ranges that end at the end of the key space.
    #[test]
    fn ranges_find_exactly_the_rows_they_hold_up_to_the_end_of_the_key_space(
        keys in proptest::collection::btree_set(edge_key(), 0..32),
        start in edge_key(),
        to_end in proptest::bool::ANY,
        end in edge_key(),
    ) {
        let mut s = OrderedStore::<i64>::new(1, 0);
        for &k in &keys {
            s.row_mut(k).0[0] = (k % 1000) as i64 + 1;
        }
        let end = if to_end { u64::MAX } else { end.max(start) };
        let range = KeyRange::new(start.min(end), end).unwrap();
        let mut seen = Vec::new();
        s.for_each_in(range, &mut |k, v| seen.push((k, v[0])));
        let want: Vec<(Key, i64)> = keys
            .iter()
            .filter(|&&k| range.contains(k))
            .map(|&k| (k, (k % 1000) as i64 + 1))
            .collect();
        proptest::prop_assert_eq!(seen, want);
        proptest::prop_assert_eq!(s.len(), keys.len());
        for &k in &keys {
            proptest::prop_assert_eq!(s.get(k), Some(&[(k % 1000) as i64 + 1][..]));
        }
    }
}

#[test]
fn equality_ignores_the_order_rows_were_created_in() {
    let mut a = OrderedStore::<f32>::new(1, 0);
    let mut b = OrderedStore::<f32>::new(1, 0);
    a.row_mut(1).0[0] = 1.0;
    a.row_mut(2).0[0] = 2.0;
    b.row_mut(2).0[0] = 2.0;
    b.row_mut(1).0[0] = 1.0;
    assert_eq!(a, b);
    b.row_mut(1).0[0] = -1.0;
    assert_ne!(a, b);
}

/// Rows wider than one value, with updater state, each keep their own values.
#[test]
fn wide_rows_with_updater_state_do_not_overlap() {
    let mut s = OrderedStore::<i64>::new(3, 2);
    for k in 0..6i64 {
        let (values, aux) = s.row_mut(k as Key * 10);
        assert_eq!((values.len(), aux.len()), (3, 6));
        values.copy_from_slice(&[k, k + 1, k + 2]);
        aux.copy_from_slice(&[-k; 6]);
    }
    assert_eq!(s.len(), 6);
    for k in 0..6i64 {
        assert_eq!(s.get(k as Key * 10), Some(&[k, k + 1, k + 2][..]));
        assert_eq!(s.row_mut(k as Key * 10).1, &[-k; 6]);
    }
}

fn hash_of(s: &OrderedStore<f32>) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// Every difference counts: shape, keys, values and updater state; equal stores hash alike
/// and (with this hasher) different ones do not.
#[test]
fn equality_and_hashing_see_every_difference() {
    let store = |width: usize, aux_width: usize, rows: &[(Key, f32, f32)]| {
        let mut s = OrderedStore::<f32>::new(width, aux_width);
        for &(k, v, a) in rows {
            let (values, aux) = s.row_mut(k);
            values[0] = v;
            if let Some(x) = aux.first_mut() {
                *x = a;
            }
        }
        s
    };
    let base = store(1, 1, &[(1, 1.0, 5.0), (2, 2.0, 6.0)]);
    assert_eq!(base, store(1, 1, &[(2, 2.0, 6.0), (1, 1.0, 5.0)]));
    assert_eq!(
        hash_of(&base),
        hash_of(&store(1, 1, &[(2, 2.0, 6.0), (1, 1.0, 5.0)]))
    );
    let others = [
        store(2, 1, &[(1, 1.0, 5.0), (2, 2.0, 6.0)]),
        store(1, 2, &[(1, 1.0, 5.0), (2, 2.0, 6.0)]),
        store(1, 1, &[(1, 1.0, 5.0)]),
        store(1, 1, &[(1, 1.0, 5.0), (2, 2.0, 6.0), (3, 0.0, 0.0)]),
        store(1, 1, &[(1, 1.0, 5.0), (3, 2.0, 6.0)]),
        store(1, 1, &[(1, 1.0, 5.0), (2, 2.5, 6.0)]),
        store(1, 1, &[(1, 1.0, 5.0), (2, 2.0, 6.5)]),
    ];
    for other in &others {
        assert_ne!(&base, other);
        assert_ne!(hash_of(&base), hash_of(other), "{other:?}");
    }
    // Bits, not numeric equality: 0.0 and -0.0 differ, a NaN equals itself.
    assert_ne!(
        store(1, 0, &[(1, 0.0, 0.0)]),
        store(1, 0, &[(1, -0.0, 0.0)])
    );
    let nan = store(1, 0, &[(1, f32::NAN, 0.0)]);
    assert_eq!(nan, nan.clone());
    assert!(!nan.is_empty() && OrderedStore::<f32>::new(1, 0).is_empty());
}

/// One step of the model-based test below.
#[derive(Clone, Debug)]
enum Step {
    /// Adds `delta` to every key of the batch (sorted, de-duplicated before use).
    Update(Vec<Key>, i64),
    /// Adds `delta` to every key of `[from, from + n)` through `update_range`.
    UpdateRange(Key, usize, i64),
    /// Adds one to a single row through `row_mut`.
    Touch(Key),
    /// Splits at the key and keeps the low part (or the high part).
    Split(Key, bool),
    /// Reads every row in key order, as a range pull does between pushes.
    Read,
    /// Takes the rows of a range (every row when `None`) for a checkpoint, which must keep
    /// them as they are now whatever is written after.
    Share(Option<(Key, Key)>),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    // Keys from a small space, so that batches meet stored rows, and runs long enough to
    // cross several leaves.
    let key = prop_oneof![
        0u64..40,
        20_000u64..20_100,
        (crate::MAX_KEY - 3)..=crate::MAX_KEY
    ];
    let dense = (0u64..40_000, 1usize..20_000)
        .prop_map(|(from, n)| (from..from + n as u64).collect::<Vec<_>>());
    prop_oneof![
        4 => (proptest::collection::vec(key.clone(), 0..40), -5i64..5)
            .prop_map(|(k, d)| Step::Update(k, d)),
        2 => (dense, -5i64..5).prop_map(|(k, d)| Step::Update(k, d)),
        2 => (prop_oneof![0u64..40_000, (crate::MAX_KEY - 3)..=crate::MAX_KEY], 1usize..20_000, -5i64..5)
            .prop_map(|(from, n, d)| Step::UpdateRange(from, n, d)),
        1 => key.clone().prop_map(Step::Touch),
        1 => (key, proptest::bool::ANY).prop_map(|(k, high)| Step::Split(k, high)),
        1 => proptest::strategy::Just(Step::Read),
        1 => proptest::option::of((0u64..40_000, 0u64..40_000)).prop_map(Step::Share),
    ]
}

fn aux_of(delta: i64) -> i64 {
    delta * 100 + 1
}

/// Rows of the model-based test: values and updater state by key.
type Model = std::collections::BTreeMap<Key, ([i64; 2], [i64; 2])>;

/// Adds `[delta, key]` to the rows of `keys` (strictly increasing) in `store`, through
/// `update_range` when the keys are `range`, and in `model`; returns how many calls the store
/// made and whether every call had rows, state and deltas of one length.
fn add_to_both<S: ParamStore<i64>>(
    store: &mut S,
    model: &mut Model,
    keys: &[Key],
    delta: i64,
    range: Option<KeyRange>,
) -> (usize, bool) {
    let deltas: Vec<i64> = keys.iter().flat_map(|&k| [delta, k as i64]).collect();
    let (mut calls, mut shapes_agree) = (0, true);
    let f = &mut |rows: &mut [i64], aux: &mut [i64], d: &[i64]| {
        calls += 1;
        shapes_agree &= rows.len() == d.len() && aux.len() == d.len();
        for ((w, a), &x) in rows.iter_mut().zip(aux.iter_mut()).zip(d) {
            *w += x;
            *a += aux_of(x);
        }
    };
    match range {
        Some(range) => store.update_range(range, &deltas, f),
        None => store.update_rows(keys, &deltas, f),
    }
    for &k in keys {
        let (row, aux) = model.entry(k).or_default();
        for (j, x) in [delta, k as i64].into_iter().enumerate() {
            row[j] += x;
            aux[j] += aux_of(x);
        }
    }
    (calls, shapes_agree)
}

/// Runs the steps on a store from `new` and on a plain ordered map of rows, and checks that
/// the store holds exactly what the map does, and every way of reading it agrees.
fn agrees_with_an_ordered_map<S: ParamStore<i64> + PartialEq + Hash>(
    new: fn() -> S,
    steps: Vec<Step>,
    probe: Vec<Key>,
) -> Result<(), proptest::test_runner::TestCaseError> {
    let mut store = new();
    let mut model = Model::new();
    let mut shares = Vec::new();
    for step in steps {
        match step {
            Step::Update(mut keys, delta) => {
                keys.sort_unstable();
                keys.dedup();
                let (calls, shapes_agree) = add_to_both(&mut store, &mut model, &keys, delta, None);
                proptest::prop_assert!(shapes_agree);
                // A dense batch into rows stored one after another is a few calls,
                // not one per row.
                proptest::prop_assert!(calls <= keys.len());
            }
            Step::UpdateRange(from, n, delta) => {
                let range = KeyRange::new(from, from.saturating_add(n as Key)).unwrap();
                let keys: Vec<Key> = range.keys().collect();
                let (_, shapes_agree) =
                    add_to_both(&mut store, &mut model, &keys, delta, Some(range));
                proptest::prop_assert!(shapes_agree);
            }
            Step::Touch(k) => {
                let (row, aux) = store.row_mut(k);
                row[1] += 1;
                aux[0] += 7;
                let (mrow, maux) = model.entry(k).or_default();
                mrow[1] += 1;
                maux[0] += 7;
            }
            Step::Split(at, keep_high) => {
                let high = store.split_off(at);
                let model_high = model.split_off(&at);
                proptest::prop_assert_eq!(high.len(), model_high.len());
                if keep_high {
                    store = high;
                    model = model_high;
                }
            }
            Step::Read => {
                let mut keys = Vec::new();
                store.for_each_in(KeyRange::FULL, &mut |k, _| keys.push(k));
                proptest::prop_assert!(keys.iter().copied().eq(model.keys().copied()));
            }
            Step::Share(bounds) => {
                // Ends anywhere in a word of the direct part's presence bits, or past it.
                let range = bounds.map_or(KeyRange::FULL, |(a, b)| {
                    KeyRange::new(a.min(b), a.max(b) + 1).unwrap()
                });
                let then: Model = model
                    .range(range.start()..range.end())
                    .map(|(&k, &row)| (k, row))
                    .collect();
                shares.push((store.shared_rows_in(range, 2, 1), then));
            }
        }
        proptest::prop_assert_eq!(store.len(), model.len());
    }
    let mut rows = Vec::new();
    store.for_each_row_in(KeyRange::FULL, &mut |k, row, aux| {
        rows.push((k, [row[0], row[1]], [aux[0], aux[1]]));
    });
    let want: Vec<_> = model.iter().map(|(&k, &(r, a))| (k, r, a)).collect();
    proptest::prop_assert_eq!(&rows, &want);
    let mut runs = Vec::new();
    let range = KeyRange::new(10, 20_050).unwrap();
    store.for_each_run_in(range, &mut |keys, values| {
        for (&k, row) in keys.iter().zip(values.chunks_exact(2)) {
            runs.push((k, [row[0], row[1]]));
        }
        core::ops::ControlFlow::Continue(())
    });
    // A walk that breaks stops at once: the first run only.
    let (mut calls, mut first) = (0, None);
    store.for_each_run_in(range, &mut |keys, _| {
        calls += 1;
        first = keys.first().copied();
        core::ops::ControlFlow::Break(())
    });
    proptest::prop_assert!(calls <= 1);
    proptest::prop_assert_eq!(first, model.range(10..20_050).next().map(|(&k, _)| k));
    let want_runs: Vec<_> = model
        .range(10..20_050)
        .map(|(&k, &(r, _))| (k, r))
        .collect();
    proptest::prop_assert_eq!(runs, want_runs);
    let mut probe = probe;
    probe.sort_unstable();
    probe.dedup();
    let mut got = Vec::new();
    store.values_of(&probe, 2, &mut got);
    let want_values: Vec<i64> = probe
        .iter()
        .flat_map(|k| model.get(k).map_or([0, 0], |&(r, _)| r))
        .collect();
    proptest::prop_assert_eq!(got, want_values);
    for &k in &probe {
        proptest::prop_assert_eq!(store.get(k), model.get(&k).map(|(r, _)| &r[..]));
    }
    // The same rows written one by one into a fresh store: equal, and equal hashes,
    // however differently the two are cut into leaves.
    let mut fresh = new();
    for (&k, (r, a)) in model.iter().rev() {
        let (row, aux) = fresh.row_mut(k);
        row.copy_from_slice(r);
        aux.copy_from_slice(a);
    }
    proptest::prop_assert!(fresh == store);
    let hash = |s: &S| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    proptest::prop_assert_eq!(hash(&fresh), hash(&store));
    for (shared, then) in shares {
        shared_rows_hold(&shared, &then, new)?;
    }
    shared_rows_hold(&store.shared_rows_in(KeyRange::FULL, 2, 1), &model, new)?;
    Ok(())
}

/// `shared` holds exactly the rows of `model` with their state, loads into a store from
/// `new` as them, reads back from its encoding as them, and gives them up as flat vectors.
fn shared_rows_hold<S: ParamStore<i64>>(
    shared: &SharedRows<i64>,
    model: &Model,
    new: fn() -> S,
) -> Result<(), proptest::test_runner::TestCaseError> {
    let want: Vec<_> = model.iter().map(|(&k, &(r, a))| (k, r, a)).collect();
    let rows_of = |shared: &SharedRows<i64>| {
        let mut rows = Vec::new();
        shared.for_each_run(&mut |keys, values, aux| {
            for (i, &k) in keys.iter().enumerate() {
                let (r, a) = (&values[2 * i..2 * i + 2], &aux[2 * i..2 * i + 2]);
                rows.push((k, [r[0], r[1]], [a[0], a[1]]));
            }
        });
        rows
    };
    proptest::prop_assert_eq!(&rows_of(shared), &want);
    proptest::prop_assert_eq!(shared.len(), model.len());
    let mut loaded = new();
    loaded.load_rows(shared);
    let mut back = Vec::new();
    loaded.for_each_row_in(KeyRange::FULL, &mut |k, row, aux| {
        back.push((k, [row[0], row[1]], [aux[0], aux[1]]));
    });
    proptest::prop_assert_eq!(&back, &want);
    let bytes = postcard::to_allocvec(shared).unwrap();
    let decoded: SharedRows<i64> = postcard::from_bytes(&bytes).unwrap();
    proptest::prop_assert_eq!(&rows_of(&decoded), &want);
    proptest::prop_assert!(&decoded == shared);
    let (keys, values, aux) = shared.clone().into_parts();
    proptest::prop_assert!(keys.iter().eq(model.keys()));
    proptest::prop_assert!(values.iter().eq(model.values().flat_map(|(r, _)| r)));
    proptest::prop_assert!(aux.iter().eq(model.values().flat_map(|(_, a)| a)));
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever the batches, single-row writes and splits, the store holds exactly what
    /// a plain ordered map of rows would, and every way of reading it agrees.
    #[test]
    fn the_store_agrees_with_an_ordered_map_under_batches_touches_and_splits(
        steps in proptest::collection::vec(step(), 1..12),
        probe in proptest::collection::vec(0u64..40_100, 0..64),
    ) {
        agrees_with_an_ordered_map(|| OrderedStore::<i64>::new(2, 1), steps, probe)?;
    }

    /// The same for the hashed layout, whose rows are not kept in key order.
    #[test]
    fn the_hashed_store_agrees_with_an_ordered_map_under_batches_touches_and_splits(
        steps in proptest::collection::vec(step(), 1..12),
        probe in proptest::collection::vec(0u64..40_100, 0..64),
    ) {
        agrees_with_an_ordered_map(|| HashedStore::<i64>::new(2, 1), steps, probe)?;
    }

    /// Either layout behind [`Store`] reads back what the ordered map holds.
    #[test]
    fn the_store_of_either_layout_agrees_with_an_ordered_map(
        steps in proptest::collection::vec(step(), 1..6),
        probe in proptest::collection::vec(0u64..40_100, 0..16),
        hashed in proptest::bool::ANY,
    ) {
        if hashed {
            agrees_with_an_ordered_map(|| Store::<i64>::new(StoreLayout::Hashed, 2, 1), steps, probe)?;
        } else {
            agrees_with_an_ordered_map(|| Store::<i64>::new(StoreLayout::Ordered, 2, 1), steps, probe)?;
        }
    }
}

/// Rows pushed as one run of consecutive keys are updated in one call per leaf.
#[test]
fn a_dense_batch_over_stored_rows_is_one_call_per_leaf() {
    let mut s = OrderedStore::<f32>::new(1, 0);
    let keys: Vec<Key> = (1000..1000 + 3 * 8192).collect();
    let ones = vec![1.0f32; keys.len()];
    s.update_rows(&keys, &ones, &mut |_, _, _| {});
    let mut calls = 0;
    s.update_rows(&keys, &ones, &mut |rows, _, d| {
        calls += 1;
        for (w, x) in rows.iter_mut().zip(d) {
            *w += x;
        }
    });
    assert!(calls <= 3, "{calls} calls");
    assert_eq!(s.get(1000 + 3 * 8192 - 1), Some(&[1.0f32][..]));
    assert_eq!(s.len(), keys.len());
}

/// A dense range over stored rows is one call per leaf and lists no keys.
#[test]
fn a_dense_range_over_stored_rows_is_one_call_per_leaf() {
    let mut s = OrderedStore::<f32>::new(1, 0);
    let range = KeyRange::new(1000, 1000 + 3 * 8192).unwrap();
    let ones = vec![1.0f32; 3 * 8192];
    s.update_range(range, &ones, &mut |_, _, _| {});
    assert_eq!(s.len(), 3 * 8192);
    let mut calls = 0;
    s.update_range(range, &ones, &mut |rows, _, d| {
        calls += 1;
        for (w, x) in rows.iter_mut().zip(d) {
            *w += x;
        }
    });
    assert!(calls <= 3, "{calls} calls");
    assert_eq!(s.get(1000 + 3 * 8192 - 1), Some(&[1.0f32][..]));
    // Deltas that do not match the range are not applied.
    s.update_range(range, &ones[1..], &mut |_, _, _| {
        panic!("applied a short batch")
    });
}

/// Pulls of one-value rows read each key's own value, zero for a key never written, from
/// either layout.
#[test]
fn one_value_rows_are_pulled_each_from_its_own_key() {
    for layout in [StoreLayout::Hashed, StoreLayout::Ordered] {
        let mut s = Store::<f32>::new(layout, 1, 2);
        s.update_rows(&[3, 7, 1 << 40], &[0.0; 3], &mut |_, _, _| {});
        for (k, w) in [(3, 1.5), (7, -2.0), (1 << 40, 4.0)] {
            let (row, aux) = s.row_mut(k);
            row[0] = w;
            aux.fill(9.0);
        }
        let mut out = vec![8.0];
        s.values_of(&[2, 3, 7, 1 << 40], 1, &mut out);
        assert_eq!(out, [8.0, 0.0, 1.5, -2.0, 4.0], "{layout:?}");
    }
}

/// Keys that fill a span at least a quarter full are held at their offset in it, the span
/// growing up or down as keys arrive; a few large or scattered keys never make the store
/// allocate a span they do not fill.
#[test]
fn the_direct_part_grows_only_while_a_quarter_full() {
    let mut s = HashedStore::<f32>::new(1, 2);
    s.row_mut(1 << 20).0[0] = 1.0;
    s.row_mut(crate::MAX_KEY).0[0] = 2.0;
    assert!(s.direct_keys() <= 4 * s.len());
    // Keys arriving in decreasing order, below the first one: the span reaches down to them.
    for k in (0..(1u64 << 19)).rev() {
        s.update_rows(&[k], &[0.5], &mut |row, _, d| row[0] += d[0]);
        assert!(
            s.direct_keys() <= 4 * s.len(),
            "{} for {}",
            s.direct_keys(),
            s.len()
        );
    }
    assert!(s.direct_keys() >= 1 << 20, "{}", s.direct_keys());
    assert_eq!(s.get(1 << 20), Some(&[1.0f32][..]));
    assert_eq!(s.get(crate::MAX_KEY), Some(&[2.0f32][..]));
    assert_eq!(s.get(0), Some(&[0.5f32][..]));
    assert_eq!(s.len(), (1 << 19) + 2);
    let mut keys = Vec::new();
    s.for_each_in(KeyRange::FULL, &mut |k, _| keys.push(k));
    assert!(keys.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(keys.len(), s.len());
}

/// A store made for a range the job's keys fill holds the range's keys at their offsets
/// from the start, and still hashes any key outside it.
#[test]
fn a_store_made_for_a_declared_range_lays_it_out_up_front() {
    let range = KeyRange::new(1000, 5000).unwrap();
    let mut s = HashedStore::<f32>::new(1, 2).empty_for(range);
    assert_eq!(s.direct_keys(), 4000);
    assert_eq!(s.len(), 0);
    for k in [4999, 1000, 2500, 7, 9000] {
        s.row_mut(k).0[0] = k as f32;
    }
    assert_eq!(s.direct_keys(), 4000);
    let mut seen = Vec::new();
    s.for_each_in(KeyRange::FULL, &mut |k, v| seen.push((k, v[0])));
    assert_eq!(
        seen,
        [
            (7, 7.0),
            (1000, 1000.0),
            (2500, 2500.0),
            (4999, 4999.0),
            (9000, 9000.0)
        ]
    );
    // Too wide a range is not laid out at all.
    let huge = HashedStore::<f32>::new(1, 2).empty_for(KeyRange::new(0, 1 << 40).unwrap());
    assert_eq!(huge.direct_keys(), 0);
}

/// A checkpoint takes an ordered store's rows where they lie: no leaf is copied to take them,
/// one written to while they are held is copied then (the taken rows keep their values), and
/// none once they are dropped.
#[test]
fn rows_taken_for_a_checkpoint_are_the_stores_own_until_it_writes_to_them() {
    let mut s = OrderedStore::<f32>::new(1, 2);
    let keys: Vec<Key> = (0..3 * LEAF_ROWS as Key).collect();
    s.update_rows(&keys, &vec![1.0; keys.len()], &mut |rows, aux, d| {
        rows.copy_from_slice(d);
        aux.fill(0.5);
    });
    let first_run = |shared: &SharedRows<f32>| {
        let mut at = None;
        shared.for_each_run(&mut |keys, values, _| {
            at.get_or_insert((keys[0], values.as_ptr()));
        });
        at.unwrap()
    };
    let where_is = |s: &OrderedStore<f32>, k: Key| s.get(k).unwrap().as_ptr();
    let taken = s.shared_rows_in(KeyRange::FULL, 1, 2);
    let (key, at) = first_run(&taken);
    assert_eq!(where_is(&s, key), at, "taking the rows copied them");
    s.row_mut(key).0[0] = 2.0;
    assert_ne!(where_is(&s, key), at, "a shared leaf was written in place");
    assert_eq!(first_run(&taken).1, at);
    let mut first = None;
    taken.for_each_run(&mut |_, values, _| {
        first.get_or_insert(values[0]);
    });
    assert_eq!(first, Some(1.0), "the taken rows changed with the store");
    drop(taken);
    let before = where_is(&s, key);
    s.row_mut(key).0[0] = 3.0;
    assert_eq!(
        where_is(&s, key),
        before,
        "a leaf held nowhere else was copied"
    );
}

/// Rows taken from a hashed store come as one run; an ordered store loading them cuts them into
/// leaves of its own size, as it would have grown them.
#[test]
fn an_ordered_store_loading_one_long_run_cuts_it_into_leaves() {
    let mut hashed = HashedStore::<f32>::new(1, 1);
    let keys: Vec<Key> = (0..5 * LEAF_ROWS as Key).collect();
    hashed.update_rows(&keys, &vec![2.0; keys.len()], &mut |rows, _, d| {
        rows.copy_from_slice(d)
    });
    let rows = hashed.shared_rows_in(KeyRange::FULL, 1, 1);
    let mut runs_taken = 0;
    rows.for_each_run(&mut |_, _, _| runs_taken += 1);
    assert_eq!(runs_taken, 1);
    let mut ordered = OrderedStore::<f32>::new(1, 1);
    ordered.load_rows(&rows);
    assert_eq!(ordered.len(), keys.len());
    let mut leaves = 0;
    ordered.for_each_run_in(KeyRange::FULL, &mut |keys, values| {
        leaves += 1;
        assert!(keys.len() <= 2 * LEAF_ROWS && values.iter().all(|&v| v == 2.0));
        core::ops::ControlFlow::Continue(())
    });
    assert!(leaves >= 3, "{leaves} leaves");
}
