//! One authenticated connection: a reader that cuts the byte stream into frames, and a writer
//! that batches every frame queued for the peer into vectored writes.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use pserver_core::NodeId;
use pserver_core::wire::FrameParts;
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Mutex as TokioMutex, mpsc, oneshot};
use tokio::time::timeout;
use tracing::{debug, warn};

use super::handshake::Established;
use super::shared::{Shared, Taken};
use super::stats::Count;

/// Read buffer per connection: many small frames are cut out of one read.
const READ_BUF: usize = 64 << 10;
/// A frame body up to this size gets its whole buffer at once: no copy as it grows. Beyond it
/// the buffer doubles as bytes arrive, so that a peer that announces a large frame and stalls
/// holds at most this much, or twice what it sent.
const READ_UPFRONT: usize = 8 << 20;
/// Frames up to this size are copied into the batch buffer; larger ones are written from their
/// own buffer in the same vectored write.
const COPY_MAX: usize = 16 << 10;
/// A batch stops taking frames from the queue once it holds this many bytes.
const BATCH_BYTES: usize = 1 << 20;
/// Buffers per vectored write.
const MAX_IOV: usize = 64;

/// Why a frame could not be read.
#[derive(Debug, Error)]
pub(super) enum FrameError {
    /// The length prefix exceeds the limit; nothing was allocated for it.
    #[error("length prefix of {len} bytes exceeds the frame limit of {limit} bytes")]
    TooLarge {
        /// The announced length.
        len: u64,
        /// This node's limit.
        limit: usize,
    },
    /// The stream ended inside a frame.
    #[error("truncated frame: the connection ended in the middle of a {0}")]
    Truncated(&'static str),
    /// Another I/O error (a reset, say): not the peer's framing.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame: a little-endian u32 length, checked against `max` before anything is
/// allocated, then that many bytes. An empty frame is a keepalive.
pub(super) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Bytes, FrameError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => FrameError::Truncated("length prefix"),
            _ => FrameError::Io(e),
        })?;
    let len = u32::from_le_bytes(prefix);
    let len = match usize::try_from(len) {
        Ok(l) if l <= max => l,
        _ => {
            return Err(FrameError::TooLarge {
                len: u64::from(len),
                limit: max,
            });
        }
    };
    let mut buf = BytesMut::with_capacity(len.min(READ_UPFRONT));
    while buf.len() < len {
        if buf.len() == buf.capacity() {
            buf.reserve((len - buf.len()).min(buf.len()));
        }
        let room = (len - buf.len()) as u64;
        if (&mut *r).take(room).read_buf(&mut buf).await? == 0 {
            return Err(FrameError::Truncated("frame body"));
        }
    }
    Ok(buf.freeze())
}

/// Frames drained from a peer's queue, laid out for one vectored write.
#[derive(Debug, Default)]
pub(super) struct Batch {
    chunks: VecDeque<Bytes>,
    small: BytesMut,
    bytes: usize,
    frames: u64,
}

impl Batch {
    /// Appends a frame (its length is at most the transport's limit, which fits a u32). Its
    /// large parts are written from where they are; small ones are gathered with the length
    /// prefixes into one buffer.
    pub(super) fn push(&mut self, frame: FrameParts) {
        self.bytes += 4 + frame.len();
        self.frames += 1;
        self.small
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        for part in frame.parts() {
            if part.len() <= COPY_MAX {
                self.small.extend_from_slice(part);
            } else {
                if !self.small.is_empty() {
                    self.chunks.push_back(self.small.split().freeze());
                }
                self.chunks.push_back(part.clone());
            }
        }
    }

    /// Writes the whole batch, as few syscalls as the socket allows.
    pub(super) async fn write_to<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
    ) -> std::io::Result<()> {
        if !self.small.is_empty() {
            self.chunks.push_back(self.small.split().freeze());
        }
        while !self.chunks.is_empty() {
            let n = {
                let mut slices = [IoSlice::new(&[]); MAX_IOV];
                let k = self.chunks.len().min(MAX_IOV);
                for (s, c) in slices.iter_mut().zip(&self.chunks) {
                    *s = IoSlice::new(c);
                }
                w.write_vectored(&slices[..k]).await?
            };
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            let mut left = n;
            while left > 0 {
                let Some(front) = self.chunks.front_mut() else {
                    break;
                };
                if front.len() <= left {
                    left -= front.len();
                    self.chunks.pop_front();
                } else {
                    let _ = front.split_to(left);
                    left = 0;
                }
            }
        }
        Ok(())
    }
}

/// How the reader ended.
enum ReadEnd {
    /// The peer closed its side cleanly, between frames.
    Eof,
    /// An error, bad framing or shutdown: drop the connection.
    Broken,
}

/// How the writer ended.
enum WriteEnd {
    /// Told to stop: it finished its batch, released the queue and sent FIN.
    Finished,
    /// A write failed or timed out.
    Broken,
}

/// Runs one connection until it ends. `demote` fires when the peer task retires it (another
/// connection won); the writer then stops, and the reader keeps delivering what the peer had
/// already sent until the peer closes too (bounded by the frame timeout), so that the switch
/// loses no frame.
pub(super) async fn run(
    est: Established,
    shared: &Shared,
    queue: &TokioMutex<mpsc::Receiver<FrameParts>>,
    demote: oneshot::Receiver<()>,
) {
    let _open = shared.counters.open();
    let Established {
        stream, peer, addr, ..
    } = est;
    let (rd, wr) = stream.into_split();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let reader = read_loop(rd, peer, addr, shared);
    let writer = write_loop(wr, peer, addr, shared, queue, demote, stop_rx);
    tokio::pin!(reader, writer);
    enum First {
        Read(ReadEnd),
        Wrote(WriteEnd),
    }
    let first = tokio::select! {
        r = &mut reader => First::Read(r),
        w = &mut writer => First::Wrote(w),
    };
    match first {
        First::Read(ReadEnd::Eof) => {
            // The peer is done sending (it retired this connection, or is going away): let
            // the writer finish its batch so nothing it took from the queue is lost.
            drop(stop_tx);
            let _ = timeout(shared.frame_timeout, writer).await;
        }
        First::Wrote(WriteEnd::Finished) => {
            let _ = timeout(shared.frame_timeout, reader).await;
        }
        First::Read(ReadEnd::Broken) | First::Wrote(WriteEnd::Broken) => {}
    }
    debug!(%peer, remote = %addr, "connection closed");
}

async fn read_loop(rd: OwnedReadHalf, peer: NodeId, addr: SocketAddr, shared: &Shared) -> ReadEnd {
    let mut rd = BufReader::with_capacity(READ_BUF, rd);
    loop {
        // A connection may idle between frames; a frame, once started, must complete in time.
        match rd.fill_buf().await {
            Ok([]) => return ReadEnd::Eof,
            Ok(_) => {}
            Err(e) => {
                debug!(%peer, remote = %addr, "connection lost: {e}");
                return ReadEnd::Broken;
            }
        }
        let frame = match timeout(shared.frame_timeout, read_frame(&mut rd, shared.max_frame)).await
        {
            Ok(Ok(frame)) => frame,
            Ok(Err(FrameError::Io(e))) => {
                debug!(%peer, remote = %addr, "connection lost: {e}");
                return ReadEnd::Broken;
            }
            Ok(Err(e)) => {
                warn!(%peer, remote = %addr, "closing the connection from {peer} at {addr}: {e}");
                shared.counters.bump(Count::BadFraming);
                return ReadEnd::Broken;
            }
            Err(_) => {
                warn!(
                    %peer,
                    remote = %addr,
                    "closing the connection from {peer} at {addr}: a frame did not complete within {:?}",
                    shared.frame_timeout
                );
                shared.counters.bump(Count::BadFraming);
                return ReadEnd::Broken;
            }
        };
        if frame.is_empty() {
            continue; // keepalive
        }
        shared.counters.bump(Count::Received);
        if shared.inbound.send((peer, frame)).await.is_err() {
            return ReadEnd::Broken;
        }
    }
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    peer: NodeId,
    addr: SocketAddr,
    shared: &Shared,
    queue: &TokioMutex<mpsc::Receiver<FrameParts>>,
    mut demote: oneshot::Receiver<()>,
    mut stop: oneshot::Receiver<()>,
) -> WriteEnd {
    // Each oneshot is polled until it fires, never after: the loop ends when one does.
    let guard = tokio::select! {
        biased;
        _ = &mut demote => None,
        _ = &mut stop => None,
        g = queue.lock() => Some(g),
    };
    if let Some(mut rx) = guard {
        loop {
            let first = tokio::select! {
                biased;
                _ = &mut demote => break,
                _ = &mut stop => break,
                f = rx.recv() => f,
            };
            let Some(first) = first else { break };
            let mut taken = Taken::new(shared);
            let mut batch = Batch::default();
            batch.push(first);
            taken.frames += 1;
            while batch.bytes < BATCH_BYTES {
                match rx.try_recv() {
                    Ok(f) => {
                        batch.push(f);
                        taken.frames += 1;
                    }
                    Err(_) => break,
                }
            }
            match timeout(shared.frame_timeout, batch.write_to(&mut wr)).await {
                Ok(Ok(())) => {
                    let payload = (batch.bytes as u64).saturating_sub(4 * batch.frames);
                    shared.counters.wrote_batch(batch.frames, payload);
                }
                Ok(Err(e)) => {
                    debug!(%peer, remote = %addr, "connection lost while writing: {e}");
                    return WriteEnd::Broken;
                }
                Err(_) => {
                    warn!(
                        %peer,
                        remote = %addr,
                        "closing the connection to {peer} at {addr}: it did not take {} bytes within {:?}",
                        batch.bytes,
                        shared.frame_timeout
                    );
                    return WriteEnd::Broken;
                }
            }
        }
    }
    // The queue is released (the next connection's writer takes it); tell the peer we are done.
    let _ = timeout(shared.frame_timeout, wr.shutdown()).await;
    WriteEnd::Finished
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn batches_frame_small_and_large_frames_alike() {
        let frames: Vec<Bytes> = [0usize, 1, 7, COPY_MAX, COPY_MAX + 1, 200_000, 3]
            .iter()
            .enumerate()
            .map(|(i, &n)| Bytes::from(vec![i as u8; n]))
            .collect();
        let mut batch = Batch::default();
        for f in &frames {
            batch.push(f.clone().into());
        }
        // Frames in parts, small and large mixed, arrive as their concatenations.
        let parted: Vec<FrameParts> = [vec![3, COPY_MAX + 5], vec![1, 2], vec![70_000, 9, 80_000]]
            .into_iter()
            .map(|lens| {
                let parts = lens
                    .iter()
                    .map(|&n| Bytes::from(vec![n as u8; n]))
                    .collect();
                FrameParts::new(parts)
            })
            .collect();
        for f in &parted {
            batch.push(f.clone());
        }
        let (mut w, mut r) = tokio::io::duplex(1 << 20);
        batch.write_to(&mut w).await.unwrap();
        drop(w);
        for f in &frames {
            assert_eq!(&read_frame(&mut r, 1 << 20).await.unwrap(), f);
        }
        for f in parted {
            assert_eq!(read_frame(&mut r, 1 << 20).await.unwrap(), f.into_bytes());
        }
        assert!(matches!(
            read_frame(&mut r, 1 << 20).await,
            Err(FrameError::Truncated("length prefix"))
        ));
    }

    #[tokio::test]
    async fn an_oversized_prefix_is_refused_before_allocating() {
        let mut wire = &u32::MAX.to_le_bytes()[..];
        let e = read_frame(&mut wire, 1000).await.unwrap_err();
        assert!(
            matches!(e, FrameError::TooLarge { len, limit: 1000 } if len == u64::from(u32::MAX))
        );
        let mut half = Vec::from(10u32.to_le_bytes());
        half.extend_from_slice(b"abc");
        let e = read_frame(&mut &half[..], 1000).await.unwrap_err();
        assert!(matches!(e, FrameError::Truncated("frame body")));
    }
}
