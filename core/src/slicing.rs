//! Cutting requests along the ring and putting pull answers back together.
//!
//! A request is cut into one part per primary server of the epoch's ring, then into parts of at
//! most `WorkerConfig::max_slice_bytes` worth of rows, as `crate::sizes` reckons them, so that
//! every slice, and every answer to a slice of keys, fits a frame. How many keys a range holds is
//! known only to its server, but never more than its width: a range pull up to 4,096 slices wide is
//! cut into pieces a slice wide, whose answers travel side by side; a wider one goes whole, and its
//! server answers it a part at a time (`crate::server`'s pulls).

use std::collections::BTreeMap;

use crate::cluster::Cluster;
use crate::ids::NodeId;
use crate::key::{Key, KeyRange};
use crate::kv::KvPairs;
use crate::selection::{KeyList, KeySelection, RangeList};
use crate::value::Value;

/// What one slice of a request carries: rows to push, or keys to pull.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Part<V: Value> {
    Push(KvPairs<V>),
    Pull(KeySelection),
}

/// Most slices a range pull is cut into up front; a pull of a wider key space is sent whole
/// and its server answers it a part at a time.
const MAX_RANGE_PIECES: u64 = 4096;

/// Parts of at most `max_keys` keys each, grouped by the primary server of their keys, in server
/// order. How many keys a range holds is known only to its server, but never more than its
/// width: range pulls up to [`MAX_RANGE_PIECES`] times `max_keys` wide are cut into pieces
/// `max_keys` wide, so that their answers travel side by side rather than one after another.
pub(crate) fn split_by_primary<V: Value>(
    cluster: &Cluster,
    part: Part<V>,
    max_keys: usize,
) -> Vec<(NodeId, Part<V>)> {
    let max_keys = max_keys.max(1);
    let mut out = Vec::new();
    for (server, part) in split_by_owner(cluster, part) {
        match part {
            Part::Push(kvs) if kvs.len() > max_keys => {
                for from in (0..kvs.len()).step_by(max_keys) {
                    out.push((server, Part::Push(kvs.rows(from, from + max_keys))));
                }
            }
            Part::Pull(KeySelection::Keys(list)) if list.keys().len() > max_keys => {
                for chunk in list.keys().chunks(max_keys) {
                    let keys = KeyList::from_validated(chunk.to_vec());
                    out.push((server, Part::Pull(KeySelection::Keys(keys))));
                }
            }
            Part::Pull(KeySelection::Ranges(list)) => {
                for piece in cut_ranges(&list, max_keys as u64) {
                    out.push((server, Part::Pull(KeySelection::Ranges(piece))));
                }
            }
            part => out.push((server, part)),
        }
    }
    out
}

/// `list` cut into lists at most `width` keys wide, in key order; `list` itself when it is
/// no wider, or too wide to cut into at most [`MAX_RANGE_PIECES`].
fn cut_ranges(list: &RangeList, width: u64) -> Vec<RangeList> {
    let total = list
        .ranges()
        .iter()
        .map(|r| r.len())
        .fold(0u64, u64::saturating_add);
    if total <= width || total.div_ceil(width) > MAX_RANGE_PIECES {
        return vec![list.clone()];
    }
    let mut pieces = Vec::new();
    let mut current = Vec::new();
    let mut room = width;
    for &range in list.ranges() {
        let mut rest = range;
        while !rest.is_empty() {
            let take = rest.len().min(room);
            let (head, tail) = rest.split_at(rest.start() + take);
            current.push(head);
            room -= take;
            rest = tail;
            if room == 0 {
                pieces.extend(RangeList::new(core::mem::take(&mut current)).ok());
                room = width;
            }
        }
    }
    if !current.is_empty() {
        pieces.extend(RangeList::new(current).ok());
    }
    pieces
}

fn split_by_owner<V: Value>(cluster: &Cluster, part: Part<V>) -> Vec<(NodeId, Part<V>)> {
    match part {
        Part::Push(kvs) => {
            let Some(span) = kvs.span() else {
                return Vec::new();
            };
            let mut pieces: BTreeMap<NodeId, Vec<KvPairs<V>>> = BTreeMap::new();
            for (range, owners) in cluster.ring.segments_in(span) {
                let piece = kvs.slice(range);
                if !piece.is_empty() {
                    pieces.entry(owners[0]).or_default().push(piece);
                }
            }
            pieces
                .into_iter()
                .map(|(server, ps)| (server, Part::Push(KvPairs::concat(ps, kvs.width()))))
                .collect()
        }
        Part::Pull(KeySelection::Keys(list)) => {
            // A look per ring segment, not per key.
            let all = list.keys();
            let (Some(&first), Some(&last)) = (all.first(), all.last()) else {
                return Vec::new();
            };
            let Ok(span) = KeyRange::new(first, last + 1) else {
                return Vec::new();
            };
            let mut chunks: Vec<(NodeId, &[Key])> = Vec::new();
            let mut rest = all;
            for (range, owners) in cluster.ring.segments_in(span) {
                let n = rest.partition_point(|&k| k < range.end());
                if n > 0 {
                    chunks.push((owners[0], &rest[..n]));
                    rest = &rest[n..];
                }
            }
            if let [(only, _), more @ ..] = &chunks[..] {
                if more.iter().all(|(s, _)| s == only) {
                    // One server holds them all: the list goes as it is.
                    return vec![(*only, Part::Pull(KeySelection::Keys(list)))];
                }
            }
            let mut keys: BTreeMap<NodeId, Vec<Key>> = BTreeMap::new();
            for (server, chunk) in chunks {
                keys.entry(server).or_default().extend_from_slice(chunk);
            }
            keys.into_iter()
                .map(|(server, ks)| {
                    let list = KeyList::from_validated(ks);
                    (server, Part::Pull(KeySelection::Keys(list)))
                })
                .collect()
        }
        Part::Pull(KeySelection::Ranges(list)) => {
            let mut ranges: BTreeMap<NodeId, Vec<KeyRange>> = BTreeMap::new();
            for &r in list.ranges() {
                for (piece, owners) in cluster.ring.segments_in(r) {
                    let mine = ranges.entry(owners[0]).or_default();
                    match mine.last_mut() {
                        Some(last) if last.end() == piece.start() => {
                            *last = KeyRange::new(last.start(), piece.end()).unwrap_or(*last);
                        }
                        _ => mine.push(piece),
                    }
                }
            }
            ranges
                .into_iter()
                .filter_map(|(server, rs)| {
                    let list = RangeList::new(rs).ok()?;
                    Some((server, Part::Pull(KeySelection::Ranges(list))))
                })
                .collect()
        }
    }
}

/// True when `server` is the primary of every key of `part` under `cluster`'s ring.
pub(crate) fn primary_of_all<V: Value>(cluster: &Cluster, server: NodeId, part: &Part<V>) -> bool {
    let range_owned = |r: KeyRange| {
        cluster
            .ring
            .segments_in(r)
            .all(|(_, owners)| owners[0] == server)
    };
    match part {
        Part::Push(kvs) => primary_of_pairs(cluster, server, kvs),
        Part::Pull(KeySelection::Keys(list)) => primary_of_keys(cluster, server, list.keys()),
        Part::Pull(KeySelection::Ranges(list)) => list.ranges().iter().all(|&r| range_owned(r)),
    }
}

/// True when `server` is the primary of every key of `kvs`; consecutive keys are checked as
/// their range, without listing them.
pub(crate) fn primary_of_pairs<V: Value>(
    cluster: &Cluster,
    server: NodeId,
    kvs: &KvPairs<V>,
) -> bool {
    match kvs.key_range() {
        Some(range) => cluster
            .ring
            .segments_in(range)
            .all(|(_, owners)| owners[0] == server),
        None => primary_of_keys(cluster, server, kvs.keys()),
    }
}

/// True when `server` is the primary of every one of `keys` (strictly increasing): a look per
/// ring segment the keys span, not per key.
pub(crate) fn primary_of_keys(cluster: &Cluster, server: NodeId, keys: &[Key]) -> bool {
    let (Some(&first), Some(&last)) = (keys.first(), keys.last()) else {
        return true;
    };
    // last <= MAX_KEY, so the range is valid.
    let Ok(span) = KeyRange::new(first, last + 1) else {
        return false;
    };
    cluster.ring.segments_in(span).all(|(range, owners)| {
        owners[0] == server || {
            let from = keys.partition_point(|&k| k < range.start());
            keys.get(from).is_none_or(|&k| k >= range.end())
        }
    })
}

/// Joins parts taken back from moved slices into one part to slice again.
pub(crate) fn merge_parts<V: Value>(parts: Vec<Part<V>>, width: usize) -> Option<Part<V>> {
    let mut pushes = Vec::new();
    let mut keys = Vec::new();
    let mut ranges = Vec::new();
    for part in parts {
        match part {
            Part::Push(kvs) => pushes.push(kvs),
            Part::Pull(KeySelection::Keys(list)) => keys.extend_from_slice(list.keys()),
            Part::Pull(KeySelection::Ranges(list)) => ranges.extend_from_slice(list.ranges()),
        }
    }
    if !pushes.is_empty() {
        // One server's slice may hold keys on both sides of another's: merge row by row.
        return Some(Part::Push(assemble(pushes, width)));
    }
    if !ranges.is_empty() {
        ranges.sort();
        return RangeList::new(ranges)
            .ok()
            .map(|l| Part::Pull(KeySelection::Ranges(l)));
    }
    keys.sort_unstable();
    Some(Part::Pull(KeySelection::Keys(KeyList::from_validated(
        keys,
    ))))
}

/// True when `kvs` is a well-formed answer to a pull of `part`: right width, and exactly the
/// keys asked for (sparse) or only keys inside the ranges asked for (dense).
pub(crate) fn answers<V: Value>(part: &Part<V>, kvs: &KvPairs<V>, width: usize) -> bool {
    kvs.width() == width
        && match part {
            Part::Pull(KeySelection::Keys(list)) => kvs.keys() == list.keys(),
            Part::Pull(KeySelection::Ranges(list)) => {
                // The ranges are disjoint: every key lies in one exactly when the keys the
                // ranges hold add up to all of them.
                if let Some(run) = kvs.key_range() {
                    let held: u64 = list
                        .ranges()
                        .iter()
                        .filter_map(|r| r.intersect(run))
                        .map(KeyRange::len)
                        .sum();
                    return held == run.len();
                }
                let keys = kvs.keys();
                let held: usize = list
                    .ranges()
                    .iter()
                    .map(|r| {
                        keys.partition_point(|&k| k < r.end())
                            - keys.partition_point(|&k| k < r.start())
                    })
                    .sum();
                held == keys.len()
            }
            Part::Push(_) => false,
        }
}

/// Sparse vectors with disjoint keys merged into one in key order: the answers of a pull's
/// slices, or the parts of moved push slices.
pub(crate) fn assemble<V: Value>(mut replies: Vec<KvPairs<V>>, width: usize) -> KvPairs<V> {
    // Slices hold disjoint keys; a server's slice may interleave with another's, so sort rows
    // unless the replies, in order of their first keys, follow one another.
    replies.retain(|r| !r.is_empty());
    replies.sort_by_key(|r| r.span().map(KeyRange::start));
    let in_order = replies.windows(2).all(|pair| {
        pair[0]
            .span()
            .zip(pair[1].span())
            .is_some_and(|(a, b)| a.end() <= b.start())
    });
    if in_order {
        return KvPairs::concat(replies, width);
    }
    // Each reply is sorted: merge them a run at a time (a run per ring segment, not a sort
    // of every row). The run taken is the reply with the smallest next key, up to the next
    // key of any other reply.
    let mut next = vec![0usize; replies.len()];
    let mut runs = Vec::new();
    loop {
        let mut least: Option<(Key, usize)> = None;
        let mut bound = Key::MAX;
        for (i, reply) in replies.iter().enumerate() {
            if next[i] >= reply.len() {
                continue;
            }
            let key = reply.key_at(next[i]);
            match least {
                Some((k, _)) if k < key => bound = bound.min(key),
                Some((k, _)) => {
                    bound = bound.min(k);
                    least = Some((key, i));
                }
                None => least = Some((key, i)),
            }
        }
        let Some((key, i)) = least else {
            break;
        };
        let rest = replies[i].rows(next[i], replies[i].len());
        let run = match KeyRange::new(key, bound) {
            Ok(range) => rest.slice(range),
            Err(_) => rest.rows(0, 1),
        };
        // At least one row, so that the merge always moves on.
        let run = if run.is_empty() { rest.rows(0, 1) } else { run };
        next[i] += run.len();
        runs.push(run);
    }
    KvPairs::concat(runs, width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consistency::Consistency;
    use crate::ring::RingConfig;
    use crate::wire::ClusterConfig;
    use proptest::prelude::*;

    fn cluster(servers: u32, vnodes: u32) -> Cluster {
        let servers: Vec<NodeId> = (1..=servers).map(NodeId).collect();
        Cluster::new(ClusterConfig {
            epoch: 1,
            coordinator: NodeId(0),
            standbys: Vec::new(),
            term: 0,
            servers,
            workers: vec![NodeId(9)],
            ring: RingConfig {
                vnodes,
                replicas: 0,
                seed: 7,
                ..RingConfig::default()
            },
            consistency: Consistency::Eventual,
            joining: vec![],
            leaving: vec![],
            shares: vec![NodeId(9)],
            left: vec![],
            lost: vec![],
            incarnations: vec![],
            pace: Default::default(),
            checkpoints: Default::default(),
        })
        .unwrap()
    }

    fn keys() -> impl Strategy<Value = Vec<Key>> {
        prop_oneof![
            proptest::collection::btree_set(any::<u64>().prop_map(|k| k % crate::MAX_KEY), 0..60)
                .prop_map(|s| s.into_iter().collect()),
            (any::<u64>(), 0usize..60).prop_map(|(first, n)| {
                let first = first % crate::MAX_KEY;
                (first..=crate::MAX_KEY).take(n).collect()
            }),
        ]
    }

    proptest! {
        /// Every key of a push or a pull goes to its primary, exactly once, in order, and a
        /// server's part of a push carries the key's own values.
        #[test]
        fn parts_go_to_the_primary_of_each_key(
            keys in keys(),
            servers in 1u32..4,
            max_keys in 1usize..80,
        ) {
            let c = cluster(servers, 16);
            let values: Vec<i64> = keys.iter().map(|&k| (k % 1000) as i64).collect();
            let kvs = KvPairs::new(keys.clone(), values, 1).unwrap();
            let mut pushed = Vec::new();
            for (server, part) in split_by_primary(&c, Part::Push(kvs), max_keys) {
                let Part::Push(kv) = part else { panic!("a push splits into pushes") };
                prop_assert!(kv.len() <= max_keys && !kv.is_empty());
                for (k, v) in kv.iter() {
                    prop_assert_eq!(c.ring.primary(k), server);
                    prop_assert_eq!(v, &[(k % 1000) as i64][..]);
                    pushed.push(k);
                }
            }
            pushed.sort_unstable();
            prop_assert_eq!(&pushed, &keys);
            let list = KeyList::new(keys.clone()).unwrap();
            let mut pulled = Vec::new();
            for (server, part) in split_by_primary::<i64>(&c, Part::Pull(KeySelection::Keys(list)), max_keys) {
                let Part::Pull(KeySelection::Keys(l)) = part else { panic!("a key pull splits into key pulls") };
                prop_assert!(l.keys().len() <= max_keys && !l.keys().is_empty());
                prop_assert!(l.keys().windows(2).all(|p| p[0] < p[1]));
                for &k in l.keys() {
                    prop_assert_eq!(c.ring.primary(k), server);
                    pulled.push(k);
                }
            }
            pulled.sort_unstable();
            prop_assert_eq!(&pulled, &keys);
        }

        /// A range pull is cut into pieces owned by one server each, no wider than a slice
        /// when there are not too many, that together cover exactly the ranges asked for.
        #[test]
        fn range_pulls_are_cut_into_slices_that_cover_the_ranges_exactly(
            bounds in proptest::collection::btree_set(0u64..5_000, 0..8),
            wide in proptest::bool::weighted(0.2),
            servers in 1u32..4,
            max_keys in 1usize..400,
        ) {
            let c = cluster(servers, 16);
            let mut bounds: Vec<Key> = bounds.into_iter().collect();
            if wide {
                bounds.push(u64::MAX);
            }
            let ranges: Vec<KeyRange> = bounds
                .chunks_exact(2)
                .filter_map(|p| KeyRange::new(p[0], p[1]).ok())
                .collect();
            let Ok(list) = RangeList::new(ranges.clone()) else {
                return Ok(());
            };
            let mut covered: Vec<KeyRange> = Vec::new();
            for (server, part) in split_by_primary::<i64>(&c, Part::Pull(KeySelection::Ranges(list)), max_keys) {
                let Part::Pull(KeySelection::Ranges(l)) = part else { panic!("a range pull splits into range pulls") };
                let width: u64 = l.ranges().iter().map(|r| r.len()).fold(0, u64::saturating_add);
                // Cut to a slice's width, unless too wide to cut at all.
                let max = max_keys as u64;
                prop_assert!(
                    width <= max || width > MAX_RANGE_PIECES * max,
                    "a piece {} wide for slices of {}", width, max
                );
                for &r in l.ranges() {
                    for (_, owners) in c.ring.segments_in(r) {
                        prop_assert_eq!(owners[0], server);
                    }
                    covered.push(r);
                }
            }
            covered.sort();
            // Joined where they touch, the pieces are the ranges asked for.
            let mut joined: Vec<KeyRange> = Vec::new();
            for r in covered {
                match joined.last_mut() {
                    Some(last) if last.end() == r.start() => {
                        *last = KeyRange::new(last.start(), r.end()).unwrap();
                    }
                    Some(last) => prop_assert!(last.end() < r.start(), "overlap"),
                    None => {}
                }
                if joined.last().is_none_or(|l| l.end() < r.start()) {
                    joined.push(r);
                }
            }
            prop_assert_eq!(joined, ranges);
        }

        /// Replies with disjoint keys, interleaved in any way, come back as one sorted vector
        /// with every row's own values.
        #[test]
        fn assembled_replies_hold_every_row_once_in_key_order(
            keys in prop::collection::btree_set(0u64..5_000, 0..400),
            owners in prop::collection::vec(0usize..4, 400),
            dense_from in 0u64..5_000,
        ) {
            let mut parts: Vec<(Vec<u64>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); 5];
            for (i, &k) in keys.iter().enumerate() {
                let part = &mut parts[owners[i % owners.len()]];
                part.0.push(k);
                part.1.push(k as f32);
            }
            // And a dense reply of keys no other reply holds.
            let dense: Vec<u64> = (5_000 + dense_from..5_100 + dense_from).collect();
            parts[4] = (dense.clone(), dense.iter().map(|&k| k as f32).collect());
            let replies: Vec<KvPairs<f32>> = parts
                .into_iter()
                .map(|(k, v)| KvPairs::new(k, v, 1).unwrap())
                .collect();
            let merged = assemble(replies, 1);
            let expected: Vec<u64> = keys.iter().copied().chain(dense).collect();
            prop_assert_eq!(merged.keys(), &expected[..]);
            prop_assert!(merged.iter().all(|(k, v)| v[0] == k as f32));
        }
    }
}
