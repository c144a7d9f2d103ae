//! The authenticating handshake: hellos, then HMAC proofs over the transcript.
//!
//! The wire layout is described in the [module documentation](super).

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;

use hmac::{Hmac, Mac};
use pserver_core::NodeId;
use sha2::Sha256;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};

use super::Secret;

/// A connection whose handshake succeeded.
#[derive(Debug)]
pub(super) struct Established {
    /// The socket, right after the handshake.
    pub(super) stream: TcpStream,
    /// The authenticated peer.
    pub(super) peer: NodeId,
    /// Which end dialed: the tie-break between two connections to one peer looks at it.
    pub(super) dialer: NodeId,
    /// The peer's address.
    pub(super) addr: SocketAddr,
}

/// The first bytes of every hello: "pserver TCP transport, handshake revision 1".
pub(super) const MAGIC: [u8; 8] = *b"PSRVTCP1";
/// The longest cluster id a hello may carry.
pub(super) const MAX_CLUSTER_ID: usize = 256;
/// Size of a nonce.
pub(super) const NONCE_LEN: usize = 32;
/// Size of a proof (an HMAC-SHA256 tag).
pub(super) const PROOF_LEN: usize = 32;
/// Size of a hello before the cluster id: magic, version, node id, nonce, cluster id length.
const HELLO_FIXED: usize = 8 + 2 + 4 + NONCE_LEN + 2;
/// Domain separation for the proofs.
const PROOF_LABEL: &[u8] = b"pserver-tcp-proof-v1";

/// Which end of the connection computes a proof. Binding it into the transcript keeps a proof
/// from being reflected back to the side that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    /// The end that connected.
    Dialer,
    /// The end that accepted.
    Acceptor,
}

/// What this node checks a peer's hello against and proves itself with.
pub(super) struct Auth {
    /// This node.
    pub(super) me: NodeId,
    /// The cluster id, at most [`MAX_CLUSTER_ID`] bytes.
    pub(super) cluster: Vec<u8>,
    /// HMAC-SHA256 keyed with the shared secret, cloned for every proof.
    pub(super) key: Hmac<Sha256>,
    /// The nodes this one accepts connections from.
    pub(super) peers: BTreeSet<NodeId>,
    /// The protocol version this node speaks (a field so tests can speak another one).
    pub(super) version: u16,
}

impl Auth {
    /// Keys the proofs with `secret`.
    pub(super) fn new(
        me: NodeId,
        cluster: Vec<u8>,
        secret: &Secret,
        peers: BTreeSet<NodeId>,
        version: u16,
    ) -> Result<Auth, hmac::digest::InvalidLength> {
        Ok(Auth {
            me,
            cluster,
            key: Hmac::<Sha256>::new_from_slice(secret.bytes())?,
            peers,
            version,
        })
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("me", &self.me)
            .field("cluster", &String::from_utf8_lossy(&self.cluster))
            .field("peers", &self.peers)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Why a handshake failed. The `Display` text is what the warning logs.
#[derive(Debug, Error)]
pub(super) enum HandshakeError {
    /// The peer does not start with [`MAGIC`].
    #[error("bad magic {0:02x?}: the peer is not a pserver TCP transport")]
    BadMagic([u8; 8]),
    /// The peer speaks another protocol version.
    #[error("other protocol version {got}: this node speaks version {ours}")]
    Version {
        /// The peer's version.
        got: u16,
        /// Ours.
        ours: u16,
    },
    /// The hello announces a cluster id longer than [`MAX_CLUSTER_ID`].
    #[error("cluster id of {0} bytes exceeds the limit of {MAX_CLUSTER_ID} bytes")]
    ClusterIdTooLong(usize),
    /// The peer belongs to another cluster.
    #[error("other cluster id {got:?}: this node belongs to {ours:?}")]
    Cluster {
        /// The peer's cluster id (lossily decoded).
        got: String,
        /// Ours.
        ours: String,
    },
    /// The peer claims this node's own id.
    #[error("node id {0} claims to be this node")]
    ClaimsSelf(NodeId),
    /// The peer's id is not in the peer table.
    #[error("unknown node id {0}: it is not among this node's peers")]
    UnknownNode(NodeId),
    /// The dialed address answered with another node id.
    #[error("dialed {expected} but the acceptor says it is {got}")]
    WrongNode {
        /// The node the dialer meant to reach.
        expected: NodeId,
        /// The node that answered.
        got: NodeId,
    },
    /// The peer's proof does not verify: it does not hold our secret.
    #[error("authentication failed: wrong secret")]
    BadProof,
    /// A handshake message did not arrive within the handshake timeout.
    #[error("handshake timed out waiting for {0}")]
    Timeout(&'static str),
    /// The peer closed the connection in the middle of the handshake (a peer that refuses us
    /// does that).
    #[error(
        "the peer closed the connection during the handshake (it may have refused us: check the secret, cluster id, node ids and version)"
    )]
    Closed,
    /// Any other I/O error.
    #[error("i/o error during the handshake: {0}")]
    Io(std::io::Error),
    /// The operating system's random source failed.
    #[error("no randomness for the handshake nonce: {0}")]
    Rng(String),
}

impl HandshakeError {
    /// What kind of refusal this is, for the refusal log's summaries.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            HandshakeError::BadMagic(_) => "not a pserver peer",
            HandshakeError::Version { .. } => "other protocol version",
            HandshakeError::ClusterIdTooLong(_) | HandshakeError::Cluster { .. } => "other cluster",
            HandshakeError::ClaimsSelf(_)
            | HandshakeError::UnknownNode(_)
            | HandshakeError::WrongNode { .. } => "unknown node",
            HandshakeError::BadProof => "wrong secret",
            HandshakeError::Timeout(_) => "handshake timeout",
            HandshakeError::Closed => "closed during the handshake",
            HandshakeError::Io(_) | HandshakeError::Rng(_) => "i/o error",
        }
    }
}

impl From<std::io::Error> for HandshakeError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            HandshakeError::Closed
        } else {
            HandshakeError::Io(e)
        }
    }
}

/// A decoded hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) version: u16,
    pub(super) node: NodeId,
    pub(super) nonce: [u8; NONCE_LEN],
    pub(super) cluster: Vec<u8>,
}

impl Hello {
    /// This node's hello with a fresh nonce.
    fn fresh(auth: &Auth) -> Result<Hello, HandshakeError> {
        let mut nonce = [0; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| HandshakeError::Rng(e.to_string()))?;
        Ok(Hello {
            version: auth.version,
            node: auth.me,
            nonce,
            cluster: auth.cluster.clone(),
        })
    }

    /// The wire form.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_FIXED + self.cluster.len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.node.0.to_le_bytes());
        b.extend_from_slice(&self.nonce);
        // `bind` refuses longer cluster ids; the cut only keeps the length field honest.
        let cluster = &self.cluster[..self.cluster.len().min(MAX_CLUSTER_ID)];
        b.extend_from_slice(&(cluster.len() as u16).to_le_bytes());
        b.extend_from_slice(cluster);
        b
    }

    /// Reads a hello, checking the magic, the version and the cluster id's length before
    /// reading (or allocating for) the cluster id.
    async fn read<R: AsyncRead + Unpin>(r: &mut R, ours: u16) -> Result<Hello, HandshakeError> {
        let mut fixed = [0u8; HELLO_FIXED];
        r.read_exact(&mut fixed).await?;
        let (magic, rest) = fixed.split_at(8);
        if magic != MAGIC {
            let mut m = [0; 8];
            m.copy_from_slice(magic);
            return Err(HandshakeError::BadMagic(m));
        }
        let version = u16::from_le_bytes([rest[0], rest[1]]);
        if version != ours {
            return Err(HandshakeError::Version { got: version, ours });
        }
        let node = NodeId(u32::from_le_bytes([rest[2], rest[3], rest[4], rest[5]]));
        let mut nonce = [0; NONCE_LEN];
        nonce.copy_from_slice(&rest[6..6 + NONCE_LEN]);
        let len = usize::from(u16::from_le_bytes([
            rest[6 + NONCE_LEN],
            rest[7 + NONCE_LEN],
        ]));
        if len > MAX_CLUSTER_ID {
            return Err(HandshakeError::ClusterIdTooLong(len));
        }
        let mut cluster = vec![0; len];
        r.read_exact(&mut cluster).await?;
        Ok(Hello {
            version,
            node,
            nonce,
            cluster,
        })
    }

    /// Checks the hello of a peer against this node's cluster and peer table.
    fn check(&self, auth: &Auth) -> Result<(), HandshakeError> {
        if self.cluster != auth.cluster {
            return Err(HandshakeError::Cluster {
                got: String::from_utf8_lossy(&self.cluster).into_owned(),
                ours: String::from_utf8_lossy(&auth.cluster).into_owned(),
            });
        }
        if self.node == auth.me {
            return Err(HandshakeError::ClaimsSelf(self.node));
        }
        if !auth.peers.contains(&self.node) {
            return Err(HandshakeError::UnknownNode(self.node));
        }
        Ok(())
    }
}

/// The HMAC over the transcript that `side` sends.
fn proof_mac(auth: &Auth, side: Side, (dialer, acceptor): (&Hello, &Hello)) -> Hmac<Sha256> {
    let mut mac = auth.key.clone();
    mac.update(PROOF_LABEL);
    mac.update(match side {
        Side::Dialer => b"D",
        Side::Acceptor => b"A",
    });
    mac.update(&auth.version.to_le_bytes());
    // Every variable-length field is length-prefixed, so transcripts cannot be confused.
    mac.update(&(auth.cluster.len() as u64).to_le_bytes());
    mac.update(&auth.cluster);
    mac.update(&dialer.node.0.to_le_bytes());
    mac.update(&acceptor.node.0.to_le_bytes());
    mac.update(&dialer.nonce);
    mac.update(&acceptor.nonce);
    mac
}

fn proof_bytes(auth: &Auth, side: Side, hellos: (&Hello, &Hello)) -> [u8; PROOF_LEN] {
    proof_mac(auth, side, hellos).finalize().into_bytes().into()
}

/// Reads the peer's proof and checks it in constant time.
async fn read_proof<R: AsyncRead + Unpin>(
    r: &mut R,
    deadline: Instant,
    auth: &Auth,
    side: Side,
    hellos: (&Hello, &Hello),
) -> Result<(), HandshakeError> {
    let mut got = [0u8; PROOF_LEN];
    timeout_at(deadline, r.read_exact(&mut got))
        .await
        .map_err(|_| HandshakeError::Timeout("the peer's proof"))??;
    proof_mac(auth, side, hellos)
        .verify_slice(&got)
        .map_err(|_| HandshakeError::BadProof)
}

async fn write<W: AsyncWrite + Unpin>(
    w: &mut W,
    deadline: Instant,
    bytes: &[u8],
    what: &'static str,
) -> Result<(), HandshakeError> {
    timeout_at(deadline, w.write_all(bytes))
        .await
        .map_err(|_| HandshakeError::Timeout(what))?
        .map_err(HandshakeError::from)
}

/// The dialer's side: hello, read the acceptor's hello, prove, check the acceptor's proof.
/// Succeeds only if the acceptor is `expected` and holds the secret.
pub(super) async fn dial<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    auth: &Auth,
    expected: NodeId,
    deadline: Instant,
) -> Result<(), HandshakeError> {
    let mine = Hello::fresh(auth)?;
    write(s, deadline, &mine.encode(), "the peer to read our hello").await?;
    let theirs = timeout_at(deadline, Hello::read(s, auth.version))
        .await
        .map_err(|_| HandshakeError::Timeout("the peer's hello"))??;
    if theirs.node != expected {
        return Err(HandshakeError::WrongNode {
            expected,
            got: theirs.node,
        });
    }
    theirs.check(auth)?;
    let hellos = (&mine, &theirs);
    let proof = proof_bytes(auth, Side::Dialer, hellos);
    write(s, deadline, &proof, "the peer to read our proof").await?;
    read_proof(s, deadline, auth, Side::Acceptor, hellos).await
}

/// The acceptor's side: read and check the dialer's hello, answer, check the dialer's proof,
/// then prove. Returns the authenticated dialer. A dialer that fails never sees our proof.
pub(super) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    auth: &Auth,
    deadline: Instant,
) -> Result<NodeId, HandshakeError> {
    let theirs = timeout_at(deadline, Hello::read(s, auth.version))
        .await
        .map_err(|_| HandshakeError::Timeout("the peer's hello"))??;
    theirs.check(auth)?;
    let mine = Hello::fresh(auth)?;
    write(s, deadline, &mine.encode(), "the peer to read our hello").await?;
    let hellos = (&theirs, &mine);
    read_proof(s, deadline, auth, Side::Dialer, hellos).await?;
    let proof = proof_bytes(auth, Side::Acceptor, hellos);
    write(s, deadline, &proof, "the peer to read our proof").await?;
    Ok(theirs.node)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use pserver_core::wire::PROTOCOL_VERSION;

    fn auth(me: u32, peers: &[u32], secret: &[u8]) -> Auth {
        Auth::new(
            NodeId(me),
            b"c".to_vec(),
            &Secret::new(secret.to_vec()),
            peers.iter().map(|&p| NodeId(p)).collect(),
            PROTOCOL_VERSION,
        )
        .unwrap()
    }

    fn hello(node: u32, nonce: u8) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            node: NodeId(node),
            nonce: [nonce; NONCE_LEN],
            cluster: b"c".to_vec(),
        }
    }

    #[test]
    fn proofs_bind_the_direction_ids_and_nonces() {
        let a = auth(1, &[2], b"k");
        let (d, acc) = (hello(1, 7), hello(2, 9));
        let base = proof_bytes(&a, Side::Dialer, (&d, &acc));
        // A dialer's proof is no acceptor's proof: it cannot be reflected back.
        assert_ne!(base, proof_bytes(&a, Side::Acceptor, (&d, &acc)));
        // Swapping roles, ids or nonces changes the proof.
        assert_ne!(base, proof_bytes(&a, Side::Dialer, (&acc, &d)));
        assert_ne!(base, proof_bytes(&a, Side::Dialer, (&hello(3, 7), &acc)));
        assert_ne!(base, proof_bytes(&a, Side::Dialer, (&hello(1, 8), &acc)));
        // And so do the secret, the cluster and the version.
        assert_ne!(
            base,
            proof_bytes(&auth(1, &[2], b"j"), Side::Dialer, (&d, &acc))
        );
        let mut other = auth(1, &[2], b"k");
        other.cluster = b"d".to_vec();
        assert_ne!(base, proof_bytes(&other, Side::Dialer, (&d, &acc)));
        other = auth(1, &[2], b"k");
        other.version += 1;
        assert_ne!(base, proof_bytes(&other, Side::Dialer, (&d, &acc)));
    }

    #[tokio::test]
    async fn hellos_round_trip_and_bad_ones_are_refused_before_allocating() {
        let h = hello(4, 1);
        let mut wire = &h.encode()[..];
        assert_eq!(Hello::read(&mut wire, PROTOCOL_VERSION).await.unwrap(), h);

        let mut long = h.encode();
        long.truncate(HELLO_FIXED);
        long[HELLO_FIXED - 2..].copy_from_slice(&u16::MAX.to_le_bytes());
        // No cluster bytes follow: the length alone gets it refused, nothing is read for it.
        let e = Hello::read(&mut &long[..], PROTOCOL_VERSION).await;
        assert!(matches!(e, Err(HandshakeError::ClusterIdTooLong(65535))));

        let mut bad = h.encode();
        bad[0] = b'X';
        let e = Hello::read(&mut &bad[..], PROTOCOL_VERSION).await;
        assert!(matches!(e, Err(HandshakeError::BadMagic(_))));

        let e = Hello::read(&mut &h.encode()[..10], PROTOCOL_VERSION).await;
        assert!(matches!(e, Err(HandshakeError::Closed)));
    }

    #[test]
    fn hello_checks_name_the_reason() {
        let a = auth(1, &[2], b"k");
        assert!(hello(2, 0).check(&a).is_ok());
        assert!(matches!(
            hello(1, 0).check(&a),
            Err(HandshakeError::ClaimsSelf(_))
        ));
        assert!(matches!(
            hello(3, 0).check(&a),
            Err(HandshakeError::UnknownNode(_))
        ));
        let mut h = hello(2, 0);
        h.cluster = b"other".to_vec();
        let e = h.check(&a).unwrap_err().to_string();
        assert!(e.contains("other cluster id \"other\""), "{e}");
    }

    #[tokio::test]
    async fn both_sides_authenticate_over_a_pipe() {
        let (mut x, mut y) = tokio::io::duplex(1024);
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let (da, aa) = (auth(1, &[2], b"k"), auth(2, &[1], b"k"));
        let (d, a) = tokio::join!(dial(&mut x, &da, NodeId(2), deadline), async {
            accept(&mut y, &aa, deadline).await
        });
        assert!(d.is_ok());
        assert_eq!(a.unwrap(), NodeId(1));

        // With another secret the acceptor refuses and the dialer sees it hang up.
        let (mut x, y) = tokio::io::duplex(1024);
        let wrong = auth(2, &[1], b"not k");
        let (d, a) = tokio::join!(dial(&mut x, &da, NodeId(2), deadline), async move {
            let mut y = y;
            let r = accept(&mut y, &wrong, deadline).await;
            drop(y);
            r
        });
        assert!(matches!(a, Err(HandshakeError::BadProof)));
        assert!(matches!(d, Err(HandshakeError::Closed)), "{d:?}");
    }
}
