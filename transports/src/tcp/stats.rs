//! The transport's counters: atomics shared by every task of a node, read as a [`TcpStats`]
//! snapshot.

use crate::sync::{AtomicU64, Ordering};

/// A snapshot of a [`TcpTransport`](super::TcpTransport)'s counters since it was bound.
///
/// Each field is read atomically, but the snapshot as a whole is not: fields may come from
/// slightly different instants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpStats {
    /// TCP connections accepted by the listener, before any handshake.
    pub connections_accepted: u64,
    /// Connections (dialed or accepted) whose handshake succeeded.
    pub connections_established: u64,
    /// Authenticated connections open right now, in use or winding down.
    pub connections_open: u64,
    /// Authenticated connections retired because another connection to the same peer won the
    /// tie-break or replaced them.
    pub connections_superseded: u64,
    /// Handshakes that failed on this side, for any reason (wrong secret, unknown node, other
    /// cluster or version, bad magic, timeout, the peer hanging up...), dialed or accepted.
    pub handshakes_refused: u64,
    /// Frames received from authenticated peers and handed to `recv`'s queue.
    pub frames_received: u64,
    /// Frames written to a connection.
    pub frames_sent: u64,
    /// Frames that `send` dropped because the peer's queue was full.
    pub frames_dropped: u64,
    /// Batched writes: each drains every frame queued for a peer into one vectored write.
    pub batches_written: u64,
    /// Bytes of the frames written (without their length prefixes).
    pub bytes_sent: u64,
    /// Connections closed because the peer broke the framing: an oversized length prefix, a
    /// truncated frame, or a frame that did not complete within the frame timeout.
    pub bad_framing_closes: u64,
}

/// The live counters behind [`TcpStats`]. (Under loom, only their tests use them.)
#[cfg_attr(loom, allow(dead_code))]
#[derive(Debug, Default)]
pub(super) struct Counters {
    accepted: AtomicU64,
    established: AtomicU64,
    open: AtomicU64,
    superseded: AtomicU64,
    refused: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
    dropped: AtomicU64,
    batches: AtomicU64,
    bad_framing: AtomicU64,
    bytes: AtomicU64,
}

/// Which counter to bump.
#[cfg_attr(loom, allow(dead_code))]
#[derive(Clone, Copy, Debug)]
pub(super) enum Count {
    Accepted,
    Established,
    Superseded,
    Refused,
    Received,
    Dropped,
    BadFraming,
}

#[cfg_attr(loom, allow(dead_code))]
impl Counters {
    fn cell(&self, c: Count) -> &AtomicU64 {
        match c {
            Count::Accepted => &self.accepted,
            Count::Established => &self.established,
            Count::Superseded => &self.superseded,
            Count::Refused => &self.refused,
            Count::Received => &self.received,
            Count::Dropped => &self.dropped,
            Count::BadFraming => &self.bad_framing,
        }
    }

    /// Adds one to a counter.
    pub(super) fn bump(&self, c: Count) {
        // Relaxed: each counter is an independent tally, and fetch_add never loses an increment
        // whatever the ordering.
        self.cell(c).fetch_add(1, Ordering::Relaxed);
    }

    /// Records one batched write of `frames` frames holding `bytes` bytes.
    pub(super) fn wrote_batch(&self, frames: u64, bytes: u64) {
        self.sent.fetch_add(frames, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an authenticated connection as open until the guard is dropped.
    pub(super) fn open(&self) -> OpenGuard<'_> {
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(self)
    }

    /// Reads every counter.
    pub(super) fn snapshot(&self) -> TcpStats {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TcpStats {
            connections_accepted: r(&self.accepted),
            connections_established: r(&self.established),
            connections_open: r(&self.open),
            connections_superseded: r(&self.superseded),
            handshakes_refused: r(&self.refused),
            frames_received: r(&self.received),
            frames_sent: r(&self.sent),
            frames_dropped: r(&self.dropped),
            batches_written: r(&self.batches),
            bad_framing_closes: r(&self.bad_framing),
            bytes_sent: r(&self.bytes),
        }
    }
}

/// Keeps one connection counted in `connections_open`; the count goes down when it drops, on
/// every path out of a connection task (including cancellation at shutdown).
#[derive(Debug)]
pub(super) struct OpenGuard<'a>(&'a Counters);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        // The guard was counted in by `open`, so this never goes below zero.
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::{Arc, thread};

    /// Every interleaving of two connection threads with up to 5 preemptions, in seconds
    /// (`LOOM_MAX_PREEMPTIONS` sets another bound; without one, the search takes a minute
    /// and a half of release build): each thread touches a dozen atomics, and a lost update
    /// among them needs one preemption to show.
    #[test]
    fn counters_lose_no_event_and_the_open_gauge_never_underflows() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound.get_or_insert(5);
        model.check(|| {
            let c = Arc::new(Counters::default());
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let c = Arc::clone(&c);
                    thread::spawn(move || {
                        let guard = c.open();
                        c.bump(Count::Received);
                        // While this thread holds a connection open the gauge counts it, and
                        // never more connections than there are threads.
                        let open = c.open.load(Ordering::Relaxed);
                        assert!((1..=2).contains(&open), "open = {open}");
                        c.wrote_batch(3, 30);
                        drop(guard);
                    })
                })
                .collect();
            // An observer concurrent with both threads never sees a wrapped-around gauge.
            assert!(c.open.load(Ordering::Relaxed) <= 2);
            for h in handles {
                h.join().unwrap();
            }
            let end = c.snapshot();
            assert_eq!(end.connections_open, 0);
            assert_eq!(end.frames_received, 2);
            assert_eq!((end.frames_sent, end.batches_written), (6, 2));
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_open_gauge_follows_its_guards() {
        let c = Counters::default();
        let a = c.open();
        let b = c.open();
        assert_eq!(c.snapshot().connections_open, 2);
        drop(a);
        drop(b);
        c.bump(Count::Dropped);
        let s = c.snapshot();
        assert_eq!((s.connections_open, s.frames_dropped), (0, 1));
    }
}
