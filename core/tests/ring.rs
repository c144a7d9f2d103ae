//! Properties of the consistent-hashing ring (ARCHITECTURE.md §2).

use proptest::prelude::*;
use pserver_core::ring::{Ring, RingConfig, RingError};
use pserver_core::{Key, KeyRange, MAX_KEY, NodeId};

fn servers(n: u32) -> impl Iterator<Item = NodeId> {
    (0..n).map(NodeId)
}

fn config(vnodes: u32, replicas: u32, seed: u64) -> RingConfig {
    RingConfig {
        vnodes,
        replicas,
        seed,
        ..RingConfig::default()
    }
}

fn moved(old: &Ring, new: &Ring) -> Vec<(KeyRange, NodeId, NodeId)> {
    old.primary_changes(new).collect()
}

fn fraction(keys: u64) -> f64 {
    keys as f64 / u64::MAX as f64
}

#[test]
fn no_server_holds_more_than_1_35_times_the_mean_share() {
    for seed in 0..20 {
        let ring = Ring::new(servers(8), config(64, 1, seed)).unwrap();
        let shares = ring.primary_shares();
        let total: u64 = shares.iter().map(|s| s.1).sum();
        assert_eq!(total, u64::MAX, "shares cover the key space exactly");
        let mean = total as f64 / 8.0;
        let max = shares.iter().map(|s| s.1).max().unwrap() as f64;
        assert!(
            max <= 1.35 * mean,
            "seed {seed}: max share {:.3} x mean",
            max / mean
        );
    }
}

#[test]
fn adding_a_ninth_server_moves_at_most_1_5_ninths_all_to_it() {
    for seed in 0..20 {
        let old = Ring::new(servers(8), config(64, 1, seed)).unwrap();
        let new = old.with_server(NodeId(8)).unwrap();
        let moves = moved(&old, &new);
        assert!(
            moves.iter().all(|&(_, _, to)| to == NodeId(8)),
            "seed {seed}"
        );
        let total: u64 = moves.iter().map(|m| m.0.len()).sum();
        assert!(
            fraction(total) <= 1.5 / 9.0,
            "seed {seed}: moved {:.4}",
            fraction(total)
        );
        assert!(total > 0, "the new server takes some keys");
    }
}

#[test]
fn removing_a_server_moves_only_its_ranges() {
    for seed in 0..20 {
        let old = Ring::new(servers(8), config(64, 1, seed)).unwrap();
        let gone = NodeId((seed % 8) as u32);
        let new = old.without_server(gone).unwrap();
        let moves = moved(&old, &new);
        assert!(
            moves.iter().all(|&(_, from, _)| from == gone),
            "seed {seed}"
        );
        let share = old.primary_shares().iter().find(|s| s.0 == gone).unwrap().1;
        assert_eq!(moves.iter().map(|m| m.0.len()).sum::<u64>(), share);
        // A dead primary's ranges pass to its first replica, which already holds the data.
        for (range, owners) in old.segments().filter(|(_, o)| o[0] == gone) {
            for (_, new_owners) in new.segments_in(range) {
                assert_eq!(new_owners[0], owners[1]);
            }
        }
    }
}

#[test]
fn the_ring_is_deterministic_from_its_seed() {
    let a = Ring::new(servers(5), config(32, 2, 99)).unwrap();
    let b = Ring::new([4, 2, 0, 3, 1].map(NodeId), config(32, 2, 99)).unwrap();
    assert_eq!(a, b);
    let c = Ring::new(servers(5), config(32, 2, 100)).unwrap();
    assert_ne!(a, c);
}

#[test]
fn bad_configurations_are_refused_with_a_reason() {
    assert_eq!(
        Ring::new(servers(0), config(8, 0, 0)),
        Err(RingError::NoServers)
    );
    assert_eq!(
        Ring::new(servers(2), config(8, 2, 0)),
        Err(RingError::TooFewServers {
            replicas: 2,
            servers: 2
        })
    );
    let most = Ring::new(servers(2), config(8, u32::MAX, 0)).unwrap_err();
    assert_eq!(
        most.to_string(),
        "4294967295 replicas need at least 4294967296 servers, but the ring has 2"
    );
    assert_eq!(
        Ring::new(servers(2), config(0, 1, 0)),
        Err(RingError::BadVnodes(0))
    );
    assert_eq!(
        Ring::new(servers(2), config(1 << 20, 1, 0)),
        Err(RingError::BadVnodes(1 << 20))
    );
    assert_eq!(
        Ring::new([1, 1].map(NodeId), config(8, 0, 0)),
        Err(RingError::DuplicateServer(NodeId(1)))
    );
    let ring = Ring::new(servers(2), config(8, 1, 0)).unwrap();
    assert_eq!(
        ring.without_server(NodeId(7)),
        Err(RingError::UnknownServer(NodeId(7)))
    );
    assert!(
        ring.without_server(NodeId(0)).is_err(),
        "one server cannot keep one replica"
    );
    let msg = RingError::TooFewServers {
        replicas: 2,
        servers: 2,
    }
    .to_string();
    assert_eq!(
        msg,
        "2 replicas need at least 3 servers, but the ring has 2"
    );
}

#[test]
fn segments_tile_the_key_space_in_order() {
    let ring = Ring::new(servers(6), config(16, 2, 3)).unwrap();
    let segs: Vec<_> = ring.segments().collect();
    assert_eq!(segs[0].0.start(), 0);
    assert_eq!(segs.last().unwrap().0.end(), u64::MAX);
    for w in segs.windows(2) {
        assert_eq!(w[0].0.end(), w[1].0.start());
        assert_ne!(
            w[0].1, w[1].1,
            "neighbouring segments with the same owners are merged"
        );
    }
    let r = KeyRange::new(1 << 60, (1 << 60) + (1 << 58)).unwrap();
    let inside: Vec<_> = ring.segments_in(r).collect();
    assert_eq!(inside.first().unwrap().0.start(), r.start());
    assert_eq!(inside.last().unwrap().0.end(), r.end());
    assert_eq!(inside.iter().map(|s| s.0.len()).sum::<u64>(), r.len());
    assert_eq!(ring.segments_in(KeyRange::new(5, 5).unwrap()).count(), 0);
}

proptest! {
    #[test]
    fn every_key_has_one_primary_and_k_distinct_replicas(
        n in 1u32..10, k in 0u32..4, vnodes in 1u32..40, seed in any::<u64>(),
        keys in proptest::collection::vec(any::<Key>().prop_map(|k| k % u64::MAX), 1..20),
    ) {
        prop_assume!(k < n);
        let ring = Ring::new(servers(n), config(vnodes, k, seed)).unwrap();
        for key in keys {
            let owners = ring.owners(key);
            prop_assert_eq!(owners.len(), k as usize + 1);
            prop_assert_eq!(ring.primary(key), owners[0]);
            prop_assert_eq!(ring.replicas(key), &owners[1..]);
            let mut distinct = owners.to_vec();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), owners.len());
            prop_assert!(owners.iter().all(|o| ring.servers().contains(o)));
            let seg = ring.segments().find(|(r, _)| r.contains(key)).unwrap();
            prop_assert_eq!(seg.1, owners);
        }
    }
}

/// The primary share of each server over the keys `[0, k)`.
fn shares_below(ring: &Ring, k: Key) -> Vec<f64> {
    let range = KeyRange::new(0, k).unwrap();
    let mut held = std::collections::BTreeMap::new();
    for (part, owners) in ring.segments_in(range) {
        *held.entry(owners[0]).or_insert(0u64) += part.len();
    }
    ring.servers()
        .iter()
        .map(|s| held.get(s).copied().unwrap_or(0) as f64 / k as f64)
        .collect()
}

#[test]
fn a_declared_key_space_spreads_a_dense_key_range_over_every_server() {
    for k in [1u64 << 20, 1 << 22, 10_000] {
        for n in 2..=4 {
            let ring = Ring::new(
                servers(n),
                RingConfig {
                    key_space: k,
                    ..config(64, 0, 0)
                },
            )
            .unwrap();
            let fair = 1.0 / n as f64;
            for share in shares_below(&ring, k) {
                assert!(
                    (0.6 * fair..1.4 * fair).contains(&share),
                    "{n} servers, K = {k}: {:?}",
                    shares_below(&ring, k)
                );
            }
            // Keys past the declared space still have an owner.
            assert_eq!(ring.owners(MAX_KEY).len(), 1);
        }
    }
    // Without it, the features of a small data set all fall to one server.
    let whole = Ring::new(servers(4), config(64, 0, 0)).unwrap();
    assert!(shares_below(&whole, 1 << 22).contains(&1.0));
    let empty = RingConfig {
        key_space: 0,
        ..config(64, 0, 0)
    };
    assert_eq!(Ring::new(servers(2), empty), Err(RingError::EmptyKeySpace));
}

#[test]
fn servers_too_few_for_the_replicas_hold_as_many_as_they_can_and_the_primaries_stay() {
    let cfg = config(16, 2, 5);
    let full = Ring::new(servers(3), cfg).unwrap();
    assert_eq!(
        Ring::surviving(servers(3), cfg).unwrap(),
        full,
        "with servers enough, the same ring"
    );
    for (left, held) in [(2, 1), (1, 0)] {
        let ring = Ring::surviving(servers(left), cfg).unwrap();
        assert_eq!(ring.replicas_held(), held);
        assert_eq!(ring.config().replicas, 2, "the ring still asks for two");
        for (range, owners) in ring.segments() {
            assert_eq!(owners.len(), held as usize + 1, "{range}");
            let distinct: std::collections::BTreeSet<_> = owners.iter().collect();
            assert_eq!(distinct.len(), owners.len());
        }
    }
    // A key keeps its primary where its primary survived, and passes to its first replica
    // where it did not, as on a ring that holds every replica.
    let two = Ring::surviving(servers(2), cfg).unwrap();
    for (range, owners) in full.segments() {
        let key = range.start();
        let expected = owners.iter().copied().find(|&s| s != NodeId(2)).unwrap();
        assert_eq!(two.primary(key), expected, "key {key}");
    }
    assert_eq!(Ring::surviving(servers(0), cfg), Err(RingError::NoServers));
}
