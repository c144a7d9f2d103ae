use super::*;

const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const C: NodeId = NodeId(3);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Binds one transport per (node, secret), all peers of each other.
async fn cluster(nodes: &[(NodeId, Option<&[u8]>)]) -> Vec<UdpTransport> {
    // Every socket is bound before the peer tables exist, and handed over as it is.
    let mut addrs = BTreeMap::new();
    let mut sockets = Vec::new();
    for &(id, _) in nodes {
        let s = std::net::UdpSocket::bind(loopback()).unwrap();
        addrs.insert(id, s.local_addr().unwrap());
        sockets.push(s);
    }
    let mut out = Vec::new();
    for (&(id, secret), socket) in nodes.iter().zip(sockets) {
        let mut cfg = UdpConfig::new(id, addrs[&id], addrs.clone());
        cfg.secret = secret.map(|s| Secret::new(s.to_vec()));
        let t = UdpTransport::with_socket(cfg, socket).await.unwrap();
        assert_eq!(t.local_addr(), addrs[&id]);
        out.push(t);
    }
    out
}

#[tokio::test]
async fn small_and_fragmented_frames_arrive_whole_from_their_sender() {
    let t = cluster(&[(A, None), (B, None)]).await;
    let big: Bytes = (0..100_000u32).map(|i| i as u8).collect::<Vec<u8>>().into();
    t[0].send(B, Bytes::from_static(b"hello")).await.unwrap();
    t[0].send(B, big.clone()).await.unwrap();
    assert_eq!(
        t[1].recv().await.unwrap(),
        (A, Bytes::from_static(b"hello"))
    );
    assert_eq!(t[1].recv().await.unwrap(), (A, big));
    let datagrams = 1 + 100_000u64.div_ceil(1400);
    assert_eq!(t[0].stats().sent, datagrams);
    // Every byte of both frames went out once, each datagram with its header.
    let header = super::super::fragment::HEADER_LEN as u64;
    assert_eq!(t[0].stats().bytes_sent, 5 + 100_000 + datagrams * header);
    assert_eq!(t[1].stats().frames, 2);
    assert!(matches!(
        t[0].send(C, Bytes::from_static(b"x")).await,
        Err(TransportError::UnknownPeer(C))
    ));
}

#[tokio::test]
async fn datagrams_from_outside_the_peer_table_are_dropped() {
    let t = cluster(&[(A, None), (B, None)]).await;
    let stranger = UdpSocket::bind(loopback()).await.unwrap();
    let forged = fragment(A, 0, b"not from a", 1400).unwrap();
    stranger
        .send_to(&forged[0], t[1].local_addr())
        .await
        .unwrap();
    // Loopback delivers in send order: once the peer's frame is in, the forged one was seen.
    t[0].send(B, Bytes::from_static(b"from a")).await.unwrap();
    assert_eq!(
        t[1].recv().await.unwrap(),
        (A, Bytes::from_static(b"from a"))
    );
    assert_eq!(t[1].stats().unknown_source, 1);
    assert_eq!(t[1].stats().frames, 1);
}

#[tokio::test]
async fn with_a_secret_a_datagram_without_a_valid_mac_is_dropped_before_reassembly() {
    let t = cluster(&[(A, Some(b"s1")), (B, Some(b"s2")), (C, Some(b"s1"))]).await;
    t[1].send(A, Bytes::from_static(b"wrong key"))
        .await
        .unwrap();
    t[2].send(A, Bytes::from_static(b"right key"))
        .await
        .unwrap();
    assert_eq!(
        t[0].recv().await.unwrap(),
        (C, Bytes::from_static(b"right key"))
    );
    let stats = t[0].stats();
    assert_eq!((stats.bad_mac, stats.refused, stats.frames), (1, 0, 1));
}

#[tokio::test]
async fn the_fault_injector_drops_outgoing_datagrams() {
    let mut addrs: BTreeMap<NodeId, SocketAddr> = BTreeMap::new();
    addrs.insert(B, "127.0.0.1:9".parse().unwrap());
    let mut cfg = UdpConfig::new(A, loopback(), addrs);
    cfg.drop_outgoing = 1.0;
    let t = UdpTransport::bind(cfg).await.unwrap();
    t.send(B, Bytes::from(vec![0u8; 5000])).await.unwrap();
    assert_eq!((t.stats().sent, t.stats().injected_drops), (0, 4));
}

#[tokio::test]
async fn a_bad_configuration_is_an_error_naming_the_field() {
    let mut cfg = UdpConfig::new(A, loopback(), BTreeMap::<NodeId, SocketAddr>::new());
    cfg.drop_outgoing = 1.5;
    let err = UdpTransport::bind(cfg).await.unwrap_err().to_string();
    assert!(err.contains("drop_outgoing"), "{err}");
    let mut cfg = UdpConfig::new(A, loopback(), BTreeMap::<NodeId, SocketAddr>::new());
    cfg.max_payload = 0;
    let err = UdpTransport::bind(cfg).await.unwrap_err().to_string();
    assert!(err.contains("max_payload"), "{err}");
    let mut cfg = UdpConfig::new(A, loopback(), BTreeMap::<NodeId, SocketAddr>::new());
    cfg.max_payload = 0;
    let socket = std::net::UdpSocket::bind(loopback()).unwrap();
    let err = UdpTransport::with_socket(cfg, socket)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_payload"), "{err}");
}

#[tokio::test]
async fn a_flood_of_refused_datagrams_is_counted_each_and_logged_once_a_window() {
    let (logs, _guard) = crate::test_logs::capture();
    let t = cluster(&[(A, None), (B, None)]).await;
    let stranger = UdpSocket::bind(loopback()).await.unwrap();
    for _ in 0..30 {
        stranger.send_to(b"noise", t[1].local_addr()).await.unwrap();
    }
    // Loopback delivers in send order: once the peer's frame is in, the noise was seen.
    t[0].send(B, Bytes::from_static(b"from a")).await.unwrap();
    assert_eq!(t[1].recv().await.unwrap().1, Bytes::from_static(b"from a"));
    assert_eq!(t[1].stats().unknown_source, 30);
    let lines = logs.refusal_warnings();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("refused a datagram from 127.0.0.1:"),
        "{lines:#?}"
    );
    logs.assert_logged("not an address of this cluster");
}

#[tokio::test]
async fn frames_left_incomplete_are_counted_each_and_logged_once_a_window() {
    let (logs, _guard) = crate::test_logs::capture();
    let a = std::net::UdpSocket::bind(loopback()).unwrap();
    let b = std::net::UdpSocket::bind(loopback()).unwrap();
    let addrs: BTreeMap<NodeId, SocketAddr> =
        [(A, a.local_addr().unwrap()), (B, b.local_addr().unwrap())].into();
    // A loses a third of its datagrams: most frames of five arrive with a piece missing.
    let mut ac = UdpConfig::new(A, addrs[&A], addrs.clone());
    ac.drop_outgoing = 0.3;
    let mut bc = UdpConfig::new(B, addrs[&B], addrs.clone());
    bc.limits.timeout = Duration::from_millis(50);
    let a = UdpTransport::with_socket(ac, a).await.unwrap();
    let b = UdpTransport::with_socket(bc, b).await.unwrap();
    for _ in 0..30 {
        a.send(B, Bytes::from(vec![7u8; 6_000])).await.unwrap();
    }
    assert!(a.stats().injected_drops > 1);
    // Every partial frame expires together, a reassembly timeout after its last piece.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while b.stats().incomplete_dropped < 2 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", b.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines: Vec<String> = logs
        .warnings()
        .into_iter()
        .filter(|l| l.contains("dropped a partial frame"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("reassembly timeout"), "{lines:#?}");
}

/// A datagram whose MAC differs from the right one in any single byte, by any bit, is refused,
/// as is one cut short by a byte; the right one is accepted. A check of part of the tag would
/// let half of these through.
#[test]
fn a_mac_differing_from_the_right_one_in_any_byte_is_refused() {
    let key = Hmac::<Sha256>::new_from_slice(b"the job's secret").unwrap();
    let body = b"a fragment of a frame";
    let datagram = with_mac(&key, body);
    assert_eq!(datagram.len(), body.len() + MAC_LEN);
    assert_eq!(verified(&key, &datagram), Some(&body[..]));
    for at in 0..datagram.len() {
        for bit in 0..8 {
            let mut altered = datagram.to_vec();
            altered[at] ^= 1 << bit;
            assert_eq!(verified(&key, &altered), None, "byte {at}, bit {bit}");
        }
    }
    assert_eq!(verified(&key, &datagram[..datagram.len() - 1]), None);
    assert_eq!(verified(&key, &datagram[..MAC_LEN - 1]), None);
    let other = Hmac::<Sha256>::new_from_slice(b"another secret").unwrap();
    assert_eq!(verified(&other, &datagram), None);
}
