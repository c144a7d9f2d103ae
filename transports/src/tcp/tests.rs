//! Loopback tests of the TCP transport. Every test runs on a single-threaded runtime (so that a
//! thread-local tracing subscriber sees the logs of every task) and within [`LIMIT`].

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use std::future::Future;

use bytes::Bytes;
use pserver_core::wire::PROTOCOL_VERSION;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::handshake::{self, Auth, Hello};
use super::transport::authenticate;
use super::*;
use crate::test_logs::capture;
use crate::{Transport, TransportError};

/// The bound on every test.
const LIMIT: Duration = Duration::from_secs(10);
const CLUSTER: &str = "test-cluster";
const SECRET: &[u8] = b"a secret shared by the test nodes";

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("test did not finish in time")
}

/// Waits until `ready` holds (polling the transport's counters, say); [`bounded`] bounds it.
async fn until(mut ready: impl FnMut() -> bool) {
    while !ready() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `n` distinct loopback addresses, free when handed out, that tests may bind, release and
/// bind again.
///
/// A port found by binding port 0 comes from the kernel's ephemeral range, which outgoing
/// connections also draw from: one of them could take it before a test binds it (again).
/// These ports come from below that range (32768 and up on Linux), from a counter that no two
/// tests of this process share.
fn free_addrs(n: usize) -> Vec<SocketAddr> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id().wrapping_mul(7919) % SPAN;
    let mut addrs = Vec::new();
    for _ in 0..SPAN {
        if addrs.len() == n {
            break;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let addr = SocketAddr::from(([127, 0, 0, 1], (LOW + (base + n) % SPAN) as u16));
        if std::net::TcpListener::bind(addr).is_ok() {
            addrs.push(addr);
        }
    }
    assert_eq!(addrs.len(), n, "free loopback ports below {}", LOW + SPAN);
    addrs
}

fn cfg(id: u32, listen: SocketAddr, peers: &[(u32, SocketAddr)]) -> TcpConfig {
    let peers: Vec<(NodeId, SocketAddr)> = peers.iter().map(|&(p, a)| (NodeId(p), a)).collect();
    let mut c = TcpConfig::new(
        NodeId(id),
        listen,
        peers,
        CLUSTER,
        Secret::new(SECRET.to_vec()),
    );
    c.reconnect_min = Duration::from_millis(5);
    c.reconnect_max = Duration::from_millis(100);
    c
}

async fn bind(c: TcpConfig) -> TcpTransport {
    TcpTransport::bind(c).await.unwrap()
}

/// Nodes n1 and n2, each knowing the other, started on listeners bound beforehand on port 0.
async fn pair() -> (TcpTransport, TcpTransport) {
    let listeners = [(); 2].map(|()| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let addrs = listeners.each_ref().map(|l| l.local_addr().unwrap());
    let [la, lb] = listeners;
    let a = TcpTransport::with_listener(cfg(1, addrs[0], &[(2, addrs[1])]), la);
    let b = TcpTransport::with_listener(cfg(2, addrs[1], &[(1, addrs[0])]), lb);
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!((a.local_addr(), b.local_addr()), (addrs[0], addrs[1]));
    (a, b)
}

fn frame(s: impl Into<String>) -> Bytes {
    Bytes::from(s.into())
}

async fn expect(t: &TcpTransport, from: u32, what: &Bytes) {
    let (peer, got) = t.recv().await.unwrap();
    assert_eq!((peer, &got), (NodeId(from), what));
}

/// Connects to `to` as node `me` and passes the handshake with `auth`'s settings.
async fn raw_dial(
    to: SocketAddr,
    auth: &Auth,
    expected: NodeId,
) -> (TcpStream, Result<(), String>) {
    let mut s = TcpStream::connect(to).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    let r = handshake::dial(&mut s, auth, expected, deadline).await;
    (s, r.map_err(|e| e.to_string()))
}

fn auth(me: u32, peers: &[u32], version: u16) -> Auth {
    Auth::new(
        NodeId(me),
        CLUSTER.as_bytes().to_vec(),
        &Secret::new(SECRET.to_vec()),
        peers.iter().map(|&p| NodeId(p)).collect(),
        version,
    )
    .unwrap()
}

#[tokio::test]
async fn frames_flow_both_ways_whole_unaltered_and_in_order() {
    bounded(async {
        let (a, b) = pair().await;
        // A burst of small frames (queued before the connection even exists), and a few large
        // ones with every byte value, in one ordered stream.
        let mut frames: Vec<Bytes> = (0..1000).map(|i| frame(format!("small {i}"))).collect();
        let mut rng = SmallRng::seed_from_u64(7);
        for n in [20_000, 1 << 20, 3 << 20] {
            let mut big = vec![0u8; n];
            rng.fill_bytes(&mut big);
            frames.insert(500, Bytes::from(big));
        }
        for f in &frames {
            a.send(NodeId(2), f.clone()).await.unwrap();
        }
        for f in &frames {
            expect(&b, 1, f).await;
        }
        for i in 0..1000 {
            b.send(NodeId(1), frame(format!("reply {i}")))
                .await
                .unwrap();
        }
        for i in 0..1000 {
            expect(&a, 2, &frame(format!("reply {i}"))).await;
        }
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!((sa.frames_received, sb.frames_received), (1000, 1003));
        // One connection, dialed by n1, carried both directions.
        assert_eq!(sa.connections_established, 1);
        assert_eq!(
            (sb.connections_accepted, sb.connections_established),
            (1, 1)
        );
        assert_eq!((sa.connections_open, sb.connections_open), (1, 1));
        // The burst shared syscalls.
        assert!(
            sa.batches_written < sa.frames_sent / 10,
            "{} batches for {} frames",
            sa.batches_written,
            sa.frames_sent
        );
        assert_eq!(sa.frames_dropped + sb.frames_dropped, 0);
        // Every byte of every frame a sent, counted once, without the length prefixes.
        let sent: usize = frames.iter().map(Bytes::len).sum();
        assert_eq!(sa.bytes_sent, sent as u64);
    })
    .await;
}

#[tokio::test]
async fn simultaneous_dials_settle_on_one_connection_and_lose_nothing() {
    bounded(async {
        let (a, b) = pair().await;
        for i in 0..300 {
            a.send(NodeId(2), frame(format!("from a {i}")))
                .await
                .unwrap();
            b.send(NodeId(1), frame(format!("from b {i}")))
                .await
                .unwrap();
        }
        let (mut at_a, mut at_b) = (Vec::new(), Vec::new());
        for _ in 0..300 {
            let (p, f) = b.recv().await.unwrap();
            assert_eq!(p, NodeId(1));
            at_b.push(f);
            let (p, f) = a.recv().await.unwrap();
            assert_eq!(p, NodeId(2));
            at_a.push(f);
        }
        at_a.sort();
        at_b.sort();
        let mut want_a: Vec<Bytes> = (0..300).map(|i| frame(format!("from b {i}"))).collect();
        let mut want_b: Vec<Bytes> = (0..300).map(|i| frame(format!("from a {i}"))).collect();
        want_a.sort();
        want_b.sort();
        assert_eq!((at_a, at_b), (want_a, want_b));

        // Both dialed, and both retired a connection (the one dialed by n2).
        until(|| a.stats().connections_open == 1 && b.stats().connections_open == 1).await;
        let (sa, sb) = (a.stats(), b.stats());
        assert!(
            sa.connections_established >= 2 && sb.connections_established >= 2,
            "both nodes should have dialed: {sa:?} {sb:?}"
        );
        assert!(sa.connections_superseded >= 1 && sb.connections_superseded >= 1);

        // The survivor carries both directions; no new connection is made.
        a.send(NodeId(2), frame("after a")).await.unwrap();
        b.send(NodeId(1), frame("after b")).await.unwrap();
        expect(&b, 1, &frame("after a")).await;
        expect(&a, 2, &frame("after b")).await;
        assert_eq!(
            a.stats().connections_established,
            sa.connections_established
        );
        assert_eq!(
            b.stats().connections_established,
            sb.connections_established
        );
        assert_eq!(
            (a.stats().connections_open, b.stats().connections_open),
            (1, 1)
        );
    })
    .await;
}

#[tokio::test]
async fn a_restarted_peer_is_reconnected_and_frames_queued_meanwhile_arrive() {
    bounded(async {
        let addrs = free_addrs(2);
        let a = bind(cfg(1, addrs[0], &[(2, addrs[1])])).await;
        let b = bind(cfg(2, addrs[1], &[(1, addrs[0])])).await;
        a.send(NodeId(2), frame("before")).await.unwrap();
        expect(&b, 1, &frame("before")).await;

        b.shutdown().await;
        drop(b);
        until(|| a.stats().connections_open == 0).await;
        // Queued while n2 is down: n1 keeps redialing with backoff.
        a.send(NodeId(2), frame("while down")).await.unwrap();

        let b = bind(cfg(2, addrs[1], &[(1, addrs[0])])).await;
        expect(&b, 1, &frame("while down")).await;
        b.send(NodeId(1), frame("back")).await.unwrap();
        expect(&a, 2, &frame("back")).await;
        assert!(a.stats().connections_established >= 2);
    })
    .await;
}

#[tokio::test]
async fn dropping_a_transport_closes_its_connections() {
    bounded(async {
        let (a, b) = pair().await;
        a.send(NodeId(2), frame("x")).await.unwrap();
        expect(&b, 1, &frame("x")).await;
        drop(b);
        until(|| a.stats().connections_open == 0).await;
    })
    .await;
}

/// Binds n1 (whose peers are n2 and n3), lets an impostor built from `impostor` send it a
/// frame, checks that n1 refuses it and logs `reason`, and that a legitimate n3 still gets
/// through.
async fn refused(reason: &str, impostor: impl FnOnce(&mut TcpConfig)) {
    let (logs, _guard) = capture();
    let addrs = free_addrs(3);
    let s = bind(cfg(1, addrs[0], &[(2, addrs[1]), (3, addrs[2])])).await;
    let mut bad = cfg(2, addrs[1], &[(1, addrs[0])]);
    impostor(&mut bad);
    // The impostor dials n1's address under whatever name its own table gives it.
    let target = *bad.peers.keys().next().unwrap();
    let bad = bind(bad).await;
    bad.send(target, frame("evil")).await.unwrap();
    until(|| s.stats().handshakes_refused >= 1).await;
    let st = s.stats();
    assert_eq!((st.connections_established, st.frames_received), (0, 0));
    logs.assert_warned("refused a connection from 127.0.0.1:");
    logs.assert_warned(reason);

    // Nothing from the impostor is waiting in recv: the first frame is the legitimate one.
    let good = bind(cfg(3, addrs[2], &[(1, addrs[0])])).await;
    good.send(NodeId(1), frame("good")).await.unwrap();
    expect(&s, 3, &frame("good")).await;
    assert_eq!(s.stats().frames_received, 1);
}

#[tokio::test]
async fn a_wrong_secret_is_refused_and_logged() {
    bounded(refused("authentication failed: wrong secret", |c| {
        c.secret = Secret::new(b"not the secret".to_vec());
    }))
    .await;
}

#[tokio::test]
async fn an_unknown_node_id_is_refused_and_logged() {
    bounded(refused(
        "unknown node id n9: it is not among this node's peers",
        |c| c.id = NodeId(9),
    ))
    .await;
}

#[tokio::test]
async fn a_node_claiming_our_id_is_refused_and_logged() {
    bounded(refused("node id n1 claims to be this node", |c| {
        c.id = NodeId(1);
        // A node ignores itself in its peer table, so it knows n1's address as n7's.
        let addr = c.peers[&NodeId(1)].clone();
        c.peers = [(NodeId(7), addr)].into();
    }))
    .await;
}

#[tokio::test]
async fn another_cluster_is_refused_and_logged() {
    bounded(refused(
        "other cluster id \"other-cluster\": this node belongs to \"test-cluster\"",
        |c| c.cluster_id = "other-cluster".into(),
    ))
    .await;
}

#[tokio::test]
async fn another_protocol_version_is_refused_and_logged() {
    bounded(async {
        let (logs, _guard) = capture();
        let s = bind(cfg(
            1,
            "127.0.0.1:0".parse().unwrap(),
            &[(2, free_addrs(1)[0])],
        ))
        .await;
        let (mut stream, r) = raw_dial(
            s.local_addr(),
            &auth(2, &[1], PROTOCOL_VERSION + 1),
            NodeId(1),
        )
        .await;
        assert!(r.is_err(), "the server must not answer");
        // Whatever follows is not read as a frame.
        let _ = stream.write_all(&[3, 0, 0, 0, b'b', b'a', b'd']).await;
        until(|| s.stats().handshakes_refused == 1).await;
        logs.assert_warned(&format!(
            "other protocol version {}: this node speaks version {PROTOCOL_VERSION}",
            PROTOCOL_VERSION + 1
        ));
        let st = s.stats();
        assert_eq!((st.connections_established, st.frames_received), (0, 0));
    })
    .await;
}

#[tokio::test]
async fn a_dialer_refuses_an_acceptor_that_is_not_the_node_it_meant() {
    bounded(async {
        let (logs, _guard) = capture();
        let addrs = free_addrs(2);
        // n1 believes n2 listens where n3 does.
        let a = bind(cfg(1, addrs[0], &[(2, addrs[1])])).await;
        let c = bind(cfg(3, addrs[1], &[(1, addrs[0])])).await;
        a.send(NodeId(2), frame("for n2")).await.unwrap();
        until(|| a.stats().handshakes_refused >= 1).await;
        logs.assert_warned("dialed n2 but the acceptor says it is n3");
        assert_eq!(a.stats().connections_established, 0);
        assert_eq!(c.stats().frames_received, 0);
    })
    .await;
}

#[tokio::test]
async fn hostile_clients_cost_only_their_own_connection() {
    bounded(async {
        let (logs, _guard) = capture();
        let addrs = free_addrs(3);
        let mut sc = cfg(1, addrs[0], &[(2, addrs[1]), (3, addrs[2])]);
        sc.handshake_timeout = Duration::from_millis(300);
        sc.frame_timeout = Duration::from_millis(300);
        sc.max_frame = 1 << 20;
        let s = bind(sc).await;
        let l = bind(cfg(2, addrs[1], &[(1, addrs[0])])).await;
        let mut round = 0u32;
        let mut ping = async || {
            round += 1;
            l.send(NodeId(1), frame(format!("ping {round}")))
                .await
                .unwrap();
            expect(&s, 2, &frame(format!("ping {round}"))).await;
            s.send(NodeId(2), frame(format!("pong {round}")))
                .await
                .unwrap();
            expect(&l, 1, &frame(format!("pong {round}"))).await;
        };
        ping().await;
        let server = &s;
        let refusals = |n| move || server.stats().handshakes_refused >= n;
        let bad_framing = |n| move || server.stats().bad_framing_closes >= n;

        // Garbage instead of a hello.
        let mut noise = vec![0u8; 64 << 10];
        SmallRng::seed_from_u64(1).fill_bytes(&mut noise);
        let mut c = TcpStream::connect(s.local_addr()).await.unwrap();
        let _ = c.write_all(&noise).await;
        until(refusals(1)).await;
        logs.assert_warned("bad magic");
        ping().await;

        // A 4 GiB length prefix instead of a hello.
        let mut c = TcpStream::connect(s.local_addr()).await.unwrap();
        let _ = c.write_all(&[0xff; 4]).await;
        let _ = c.write_all(&[0; 60]).await;
        until(refusals(2)).await;
        ping().await;

        // Half a hello, then hang up.
        let hello = Hello {
            version: PROTOCOL_VERSION,
            node: NodeId(3),
            nonce: [5; 32],
            cluster: CLUSTER.as_bytes().to_vec(),
        };
        let mut c = TcpStream::connect(s.local_addr()).await.unwrap();
        c.write_all(&hello.encode()[..20]).await.unwrap();
        drop(c);
        until(refusals(3)).await;
        logs.assert_logged("closed the connection during the handshake");
        ping().await;

        // Connect and say nothing: the handshake timeout frees the connection.
        let mut silent = TcpStream::connect(s.local_addr()).await.unwrap();
        ping().await;
        until(refusals(4)).await;
        logs.assert_logged("handshake timed out waiting for the peer's hello");
        let mut buf = [0u8; 16];
        assert!(matches!(silent.read(&mut buf).await, Ok(0) | Err(_)));
        ping().await;

        // An authenticated peer sending a 4 GiB length prefix.
        let me = auth(3, &[1], PROTOCOL_VERSION);
        let (mut c, r) = raw_dial(s.local_addr(), &me, NodeId(1)).await;
        r.unwrap();
        c.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
        until(bad_framing(1)).await;
        logs.assert_warned("length prefix of 4294967295 bytes exceeds the frame limit");
        assert!(matches!(c.read(&mut buf).await, Ok(0) | Err(_)));
        ping().await;

        // An authenticated peer sending a frame, then half of one, then hanging up.
        let (mut c, r) = raw_dial(s.local_addr(), &me, NodeId(1)).await;
        r.unwrap();
        let mut wire = Vec::from(9u32.to_le_bytes());
        wire.extend_from_slice(b"ok from 3");
        wire.extend_from_slice(&100u32.to_le_bytes());
        wire.extend_from_slice(b"only ten b");
        c.write_all(&wire).await.unwrap();
        drop(c);
        expect(&s, 3, &frame("ok from 3")).await;
        until(bad_framing(2)).await;
        logs.assert_warned("truncated frame");
        ping().await;

        // An authenticated peer that starts a frame and stalls (slow loris).
        let (mut c, r) = raw_dial(s.local_addr(), &me, NodeId(1)).await;
        r.unwrap();
        c.write_all(&100u32.to_le_bytes()).await.unwrap();
        c.write_all(b"slow").await.unwrap();
        ping().await;
        until(bad_framing(3)).await;
        logs.assert_warned("a frame did not complete within");
        assert!(matches!(c.read(&mut buf).await, Ok(0) | Err(_)));
        ping().await;

        let st = s.stats();
        assert_eq!(st.handshakes_refused, 4);
        assert_eq!(st.bad_framing_closes, 3);
        // The pings and the one whole frame from n3, nothing else.
        assert_eq!(st.frames_received, u64::from(round) + 1);
        assert_eq!(st.connections_accepted, 8);
    })
    .await;
}

#[tokio::test]
async fn every_socket_has_nodelay_on_both_ends() {
    bounded(async {
        let (a, b) = pair().await;
        // n1 dials a listener of the test's, which hands the socket to n2's acceptor code.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = listener.local_addr().unwrap();
        let (dialed, accepted) = tokio::join!(peer::dial(&a.shared, NodeId(2), to), async {
            let (stream, from) = listener.accept().await.unwrap();
            authenticate(stream, from, &b.shared).await
        });
        let (dialed, accepted) = (dialed.unwrap(), accepted.unwrap());
        assert_eq!((dialed.peer, accepted.peer), (NodeId(2), NodeId(1)));
        assert!(dialed.stream.nodelay().unwrap());
        assert!(accepted.stream.nodelay().unwrap());
    })
    .await;
}

#[tokio::test]
async fn send_refuses_oversized_frames_and_unknown_peers() {
    bounded(async {
        let addrs = free_addrs(2);
        let mut ac = cfg(1, addrs[0], &[(2, addrs[1])]);
        ac.max_frame = 1000;
        let a = bind(ac).await;
        let b = bind(cfg(2, addrs[1], &[(1, addrs[0])])).await;
        let e = a.send(NodeId(2), Bytes::from(vec![1; 1001])).await;
        assert!(matches!(
            e,
            Err(TransportError::FrameTooLarge {
                len: 1001,
                limit: 1000
            })
        ));
        let e = a.send(NodeId(5), frame("x")).await;
        assert!(matches!(e, Err(TransportError::UnknownPeer(NodeId(5)))));
        // Exactly the limit is fine.
        let at_limit = Bytes::from(vec![2; 1000]);
        a.send(NodeId(2), at_limit.clone()).await.unwrap();
        expect(&b, 1, &at_limit).await;
    })
    .await;
}

#[tokio::test]
async fn frames_beyond_the_send_queue_are_dropped_counted_and_logged_once_a_window() {
    bounded(async {
        let (logs, _guard) = capture();
        // The peer's port accepts TCP connections but never answers the handshake.
        let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = cfg(
            1,
            "127.0.0.1:0".parse().unwrap(),
            &[(2, mute.local_addr().unwrap())],
        );
        c.send_queue = 4;
        let a = bind(c).await;
        for i in 0..10 {
            // Never waits for the peer.
            a.send(NodeId(2), frame(format!("{i}"))).await.unwrap();
        }
        assert_eq!(a.stats().frames_dropped, 6);
        assert_eq!(a.stats().frames_sent, 0);
        let drops: Vec<String> = logs
            .warnings()
            .into_iter()
            .filter(|l| l.contains("dropped a frame"))
            .collect();
        assert_eq!(drops.len(), 1, "{drops:#?}");
        assert!(
            drops[0].contains("for n2: its send queue is full"),
            "{drops:#?}"
        );
    })
    .await;
}

#[tokio::test]
async fn recv_is_cancel_safe() {
    bounded(async {
        let (a, b) = pair().await;
        for i in 0..500 {
            a.send(NodeId(2), frame(format!("{i}"))).await.unwrap();
        }
        let mut got = Vec::new();
        let mut cancelled = 0;
        while got.len() < 500 {
            tokio::select! {
                r = b.recv() => got.push(r.unwrap().1),
                () = tokio::task::yield_now() => cancelled += 1,
            }
        }
        assert!(cancelled > 0, "no recv was cancelled");
        let want: Vec<Bytes> = (0..500).map(|i| frame(format!("{i}"))).collect();
        assert_eq!(got, want);
    })
    .await;
}

#[tokio::test]
async fn shutdown_ends_recv_and_send_and_frees_the_port() {
    bounded(async {
        let (a, b) = pair().await;
        a.send(NodeId(2), frame("x")).await.unwrap();
        expect(&b, 1, &frame("x")).await;
        let addr = b.local_addr();
        let (r, ()) = tokio::join!(b.recv(), b.shutdown());
        assert!(matches!(r, Err(TransportError::Closed)));
        assert!(matches!(b.recv().await, Err(TransportError::Closed)));
        assert!(matches!(
            b.send(NodeId(1), frame("y")).await,
            Err(TransportError::Closed)
        ));
        assert_eq!(b.stats().connections_open, 0);
        drop(b);
        let again = TcpTransport::bind(cfg(2, addr, &[(1, a.local_addr())])).await;
        assert!(again.is_ok());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_first_writes_every_frame_queued_before_it() {
    bounded(async {
        let (a, b) = pair().await;
        // Queued before any connection exists: shutdown must wait for the dial and the writes.
        let frames: Vec<Bytes> = (0..200).map(|i| frame(format!("last words {i}"))).collect();
        for f in &frames {
            a.send(NodeId(2), f.clone()).await.unwrap();
        }
        a.shutdown().await;
        for f in &frames {
            expect(&b, 1, f).await;
        }
    })
    .await;
}

/// A node holding a connection that its peer dials again keeps its own and sends a keepalive
/// on it. The keepalive is counted like any frame, so that a frame queued after it still holds
/// shutdown until it is written (uncounted, it let shutdown stop with a node's last frame
/// queued: a server's last heartbeat was lost now and then).
#[tokio::test]
async fn a_keepalive_for_a_retired_dial_leaves_shutdown_waiting_for_the_last_frame() {
    bounded(async {
        let (a, b) = pair().await;
        a.send(NodeId(2), frame("first")).await.unwrap();
        expect(&b, 1, &frame("first")).await;
        let sent = a.stats().frames_sent;
        // n2 dials n1 again while n1's own connection stands: n1 keeps its own.
        let (_s, r) = raw_dial(a.local_addr(), &auth(2, &[1], PROTOCOL_VERSION), NodeId(1)).await;
        r.unwrap();
        until(|| a.stats().connections_superseded >= 1).await;
        until(|| a.stats().frames_sent > sent).await;
        assert_eq!(a.unwritten(), 0, "the keepalive was counted in and out");
        a.send(NodeId(2), frame("last")).await.unwrap();
        a.shutdown().await;
        expect(&b, 1, &frame("last")).await;
    })
    .await;
}

#[tokio::test]
async fn binding_a_port_in_use_names_the_address() {
    bounded(async {
        let a = bind(cfg(1, "127.0.0.1:0".parse().unwrap(), &[])).await;
        let addr = a.local_addr();
        match TcpTransport::bind(cfg(2, addr, &[])).await {
            Err(TransportError::Io { context, .. }) => {
                assert!(context.contains(&addr.to_string()), "{context}")
            }
            other => panic!("expected an I/O error, got {other:?}"),
        }
    })
    .await;
}

#[test]
fn config_defaults_and_a_secret_that_never_prints() {
    let s = Secret::new(b"hunter2".to_vec());
    let c = TcpConfig::new(
        NodeId(1),
        "127.0.0.1:0".parse().unwrap(),
        BTreeMap::<NodeId, SocketAddr>::new(),
        "c",
        s,
    );
    let shown = format!("{c:?}");
    assert!(
        shown.contains("Secret(..)") && !shown.contains("hunter2"),
        "{shown}"
    );
    assert_eq!(c.max_frame, DEFAULT_MAX_FRAME + 64);
    assert_eq!(
        (c.reconnect_min, c.reconnect_max),
        (Duration::from_millis(50), Duration::from_secs(2))
    );
    assert_eq!(c.send_queue, 1024);
}

#[tokio::test]
async fn a_flood_of_refused_connections_is_counted_each_and_logged_once_a_window() {
    let (logs, _guard) = capture();
    let addrs = free_addrs(2);
    let s = bind(cfg(1, addrs[0], &[(2, addrs[1])])).await;
    for _ in 0..40 {
        let mut c = TcpStream::connect(s.local_addr()).await.unwrap();
        let _ = c.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
    }
    until(|| s.stats().handshakes_refused >= 40).await;
    let lines = logs.refusal_warnings();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("refused a connection from 127.0.0.1:"),
        "{lines:#?}"
    );
}
