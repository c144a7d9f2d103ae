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
