use super::*;

fn frame(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn limits() -> ReassemblyLimits {
    ReassemblyLimits {
        max_frame: 1 << 20,
        max_held: 10_000,
        max_partial: 8,
        timeout: Duration::from_millis(100),
    }
}

#[test]
fn fragments_fit_the_payload_size_and_reassemble_in_any_order() {
    for len in [0, 1, 1399, 1400, 1401, 5000] {
        let f = frame(len);
        let mut ds = fragment(NodeId(3), 7, &f, 1400).unwrap();
        assert_eq!(ds.len(), len.div_ceil(1400).max(1), "{len}");
        assert!(ds.iter().all(|d| d.len() <= HEADER_LEN + 1400));
        ds.reverse();
        let mut r = Reassembler::new(limits());
        let now = Instant::now();
        let got: Vec<_> = ds
            .into_iter()
            .filter_map(|d| r.accept(now, d).unwrap())
            .collect();
        assert_eq!(got, vec![(NodeId(3), Bytes::from(f))], "{len}");
        assert_eq!(r.held_bytes(), 0);
    }
}

#[test]
fn a_truncated_fragment_is_refused_and_the_frame_stays_incomplete() {
    let f = frame(3000);
    let ds = fragment(NodeId(1), 1, &f, 1400).unwrap();
    let mut r = Reassembler::new(limits());
    let now = Instant::now();
    assert_eq!(r.accept(now, ds[0].clone()).unwrap(), None);
    let cut = ds[1].slice(..ds[1].len() - 1);
    assert_eq!(r.accept(now, cut), Err(FragmentError::Malformed));
    assert_eq!(r.accept(now, ds[2].clone()).unwrap(), None);
    assert_eq!(r.partial_frames(), 1);
    assert!(r.accept(now, ds[1].clone()).unwrap().is_some());
}

#[test]
fn a_fragment_that_lies_about_its_frame_is_refused() {
    let f = frame(3000);
    let ds = fragment(NodeId(1), 1, &f, 1400).unwrap();
    let mut r = Reassembler::new(limits());
    let now = Instant::now();
    r.accept(now, ds[0].clone()).unwrap();
    // Another frame under the same id: other length and checksum.
    let other = fragment(NodeId(1), 1, &frame(2900), 1400).unwrap();
    assert_eq!(
        r.accept(now, other[1].clone()),
        Err(FragmentError::Inconsistent)
    );
    // A count that leaves a fragment empty.
    let mut h = FragmentHeader::read(&ds[0]).unwrap();
    h.count = 4;
    h.frame_len = 3;
    assert_eq!(h.payload_range(), None);
}

#[test]
fn a_frame_whose_fragments_were_altered_fails_its_checksum() {
    let f = frame(3000);
    let ds = fragment(NodeId(1), 1, &f, 1400).unwrap();
    let mut r = Reassembler::new(limits());
    let now = Instant::now();
    let mut bad = BytesMut::from(&ds[1][..]);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    r.accept(now, ds[0].clone()).unwrap();
    r.accept(now, bad.freeze()).unwrap();
    assert_eq!(r.accept(now, ds[2].clone()), Err(FragmentError::Corrupt));
    assert_eq!(r.held_bytes(), 0);
}

#[test]
fn incomplete_frames_expire_and_never_hold_more_than_the_bound() {
    let mut r = Reassembler::new(limits());
    let t0 = Instant::now();
    // Ten 3,000-byte frames, each missing its last fragment: at most 10,000 bytes are held.
    for id in 0..10 {
        let ds = fragment(NodeId(1), id, &frame(3000), 1400).unwrap();
        r.accept(t0, ds[0].clone()).unwrap();
        assert!(r.held_bytes() <= 10_000);
    }
    assert_eq!(r.partial_frames(), 3);
    assert_eq!(r.stats().evicted, 7);
    r.expire(t0 + Duration::from_millis(100));
    assert_eq!((r.partial_frames(), r.held_bytes()), (0, 0));
    assert_eq!(r.stats().expired, 3);
    // A frame larger than the whole bound is refused before anything is allocated.
    let big = fragment(NodeId(1), 99, &frame(20_000), 1400).unwrap();
    assert!(matches!(
        r.accept(t0, big[0].clone()),
        Err(FragmentError::TooLarge { len: 20_000, .. })
    ));
}

#[test]
fn a_duplicate_fragment_is_counted_and_changes_nothing() {
    let f = frame(3000);
    let ds = fragment(NodeId(2), 5, &f, 1400).unwrap();
    let mut r = Reassembler::new(limits());
    let now = Instant::now();
    r.accept(now, ds[0].clone()).unwrap();
    assert_eq!(r.accept(now, ds[0].clone()).unwrap(), None);
    assert_eq!(r.stats().duplicates, 1);
    r.accept(now, ds[1].clone()).unwrap();
    assert_eq!(
        r.accept(now, ds[2].clone()).unwrap(),
        Some((NodeId(2), Bytes::from(f)))
    );
}

/// The reassembler holds exactly `max_partial` incomplete frames: one more evicts the oldest,
/// whose fragments then never complete it, while the others still complete.
#[test]
fn exactly_the_bound_of_partial_frames_is_held_and_the_next_evicts_the_oldest() {
    let limits = ReassemblyLimits {
        max_held: 1 << 20,
        max_partial: 4,
        ..limits()
    };
    let mut r = Reassembler::new(limits);
    let now = Instant::now();
    let frames: Vec<Vec<Bytes>> = (0..5)
        .map(|id| fragment(NodeId(1), id, &frame(2000 + id as usize), 1400).unwrap())
        .collect();
    for (held, ds) in frames.iter().take(4).enumerate() {
        assert_eq!(r.accept(now, ds[0].clone()).unwrap(), None);
        assert_eq!(r.partial_frames(), held + 1);
    }
    assert_eq!(r.stats().evicted, 0, "the bound itself evicts nothing");
    assert_eq!(r.accept(now, frames[4][0].clone()).unwrap(), None);
    assert_eq!((r.partial_frames(), r.stats().evicted), (4, 1));
    // Frame 0 was the one dropped: its last fragment starts it again, incomplete.
    assert_eq!(r.accept(now, frames[0][1].clone()).unwrap(), None);
    // Frames 2 to 4 were kept (1 gave way to frame 0's return) and complete.
    for (id, ds) in frames.iter().enumerate().skip(2) {
        let got = r.accept(now, ds[1].clone()).unwrap();
        assert_eq!(
            got,
            Some((NodeId(1), Bytes::from(frame(2000 + id)))),
            "{id}"
        );
    }
}

/// What one step of [`reassembly_holds_its_bounds_and_yields_only_frames_sent_whole`] does.
#[derive(Clone, Debug)]
enum Op {
    Deliver(usize),
    Truncate(usize, usize),
    Rewrite(usize, u8, u32),
    Advance(u64),
    Forged(Vec<u8>),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => any::<usize>().prop_map(Op::Deliver),
        1 => (any::<usize>(), 0usize..64).prop_map(|(i, cut)| Op::Truncate(i, cut)),
        1 => (any::<usize>(), 0u8..5, any::<u32>()).prop_map(|(i, f, v)| Op::Rewrite(i, f, v)),
        1 => (0u64..128).prop_map(Op::Advance),
        1 => proptest::collection::vec(any::<u8>(), 0..80).prop_map(Op::Forged),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// The `udp_reassembly` fuzz target's invariants, bounded, in the suite: fragments of real
    /// frames delivered duplicated, reordered, truncated and with their headers rewritten, and
    /// forged datagrams, never make the reassembler hold more than its bounds or yield a frame
    /// nobody sent whole.
    #[test]
    fn reassembly_holds_its_bounds_and_yields_only_frames_sent_whole(
        max_payload in 1usize..64,
        frames in proptest::collection::vec(
            (0u32..4, 1usize..8, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)),
            0..12,
        ),
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let limits = ReassemblyLimits {
            max_frame: 4096,
            max_held: 2048,
            max_partial: 8,
            timeout: Duration::from_millis(50),
        };
        let mut r = Reassembler::new(limits);
        let mut now = Instant::now();
        let mut sent = std::collections::BTreeSet::new();
        let mut datagrams: Vec<Vec<u8>> = Vec::new();
        for (i, (from, repeat, data)) in frames.iter().enumerate() {
            let frame: Vec<u8> = data.iter().copied().cycle().take(data.len() * repeat).collect();
            if let Ok(ds) = fragment(NodeId(*from), i as u64 % 4, &frame, max_payload) {
                sent.insert(frame);
                datagrams.extend(ds.iter().map(|d| d.to_vec()));
            }
        }
        let n = datagrams.len().max(1);
        for op in ops {
            let yielded = match op {
                Op::Deliver(i) if !datagrams.is_empty() => {
                    r.accept(now, Bytes::from(datagrams[i % n].clone()))
                }
                Op::Truncate(i, cut) if !datagrams.is_empty() => {
                    let d = &mut datagrams[i % n];
                    d.truncate(d.len().saturating_sub(cut));
                    continue;
                }
                Op::Rewrite(i, field, v) if !datagrams.is_empty() => {
                    let d = &mut datagrams[i % n];
                    if let Ok(mut h) = FragmentHeader::read(d) {
                        match field {
                            0 => h.frame = u64::from(v % 4),
                            1 => h.index = v as u16,
                            2 => h.count = v as u16,
                            3 => h.frame_len = v,
                            _ => h.from = NodeId(v % 4),
                        }
                        let mut out = BytesMut::new();
                        h.write(&mut out);
                        d[..HEADER_LEN].copy_from_slice(&out);
                    }
                    continue;
                }
                Op::Advance(ms) => {
                    now += Duration::from_millis(ms);
                    r.expire(now);
                    continue;
                }
                Op::Forged(mut bytes) => {
                    // From nodes of their own, so that a forged datagram that happens to be a
                    // whole frame never lands in a real frame's reassembly.
                    if bytes.len() >= HEADER_LEN {
                        bytes[4..8].copy_from_slice(&200u32.to_le_bytes());
                    }
                    r.accept(now, Bytes::from(bytes))
                }
                _ => continue,
            };
            proptest::prop_assert!(r.held_bytes() <= limits.max_held);
            proptest::prop_assert!(r.partial_frames() <= limits.max_partial);
            if let Ok(Some((from, frame))) = yielded {
                proptest::prop_assert!(frame.len() <= limits.max_frame);
                if from.0 < 200 {
                    proptest::prop_assert!(sent.contains(frame.as_ref()), "{from} {frame:?}");
                }
            }
        }
    }
}
