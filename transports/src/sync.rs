//! Shared-memory primitives, in one place so that loom can replace them.
//!
//! Everything in pserver that shares memory between threads takes its `Arc`, `Mutex`, atomics
//! and `thread` from here. Under `--cfg loom` they are loom's, which explores every
//! interleaving of the threads in a test:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test -p pserver-transport --release --lib sync
//! ```

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(loom)]
pub use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(loom)]
pub use loom::thread;

#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::thread;

/// Hands out the numbers of a range to several threads, each number exactly once.
///
/// ```
/// use pserver_transport::sync::Tickets;
/// let t = Tickets::new(5, 7);
/// assert_eq!((t.claim(), t.claim(), t.claim()), (Some(5), Some(6), None));
/// ```
#[derive(Debug)]
pub struct Tickets {
    next: AtomicU64,
    end: u64,
}

impl Tickets {
    /// The numbers `start..end`.
    pub fn new(start: u64, end: u64) -> Self {
        Tickets {
            next: AtomicU64::new(start),
            end,
        }
    }

    /// The next unclaimed number, or `None` once all are taken.
    pub fn claim(&self) -> Option<u64> {
        // Relaxed suffices: the counter is the only shared datum, and fetch_add is atomic
        // whatever the ordering, so no number is handed out twice.
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        (n < self.end).then_some(n)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    #[test]
    fn every_ticket_is_claimed_exactly_once_under_every_interleaving() {
        loom::model(|| {
            let tickets = Arc::new(Tickets::new(0, 3));
            let claimed = Arc::new(Mutex::new(Vec::new()));
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let (t, c) = (Arc::clone(&tickets), Arc::clone(&claimed));
                    thread::spawn(move || {
                        while let Some(n) = t.claim() {
                            c.lock().unwrap().push(n);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let mut all = claimed.lock().unwrap().clone();
            all.sort_unstable();
            assert_eq!(all, vec![0, 1, 2]);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn threads_share_the_range_without_overlap() {
        let tickets = Arc::new(Tickets::new(10, 1010));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let t = Arc::clone(&tickets);
                thread::spawn(move || std::iter::from_fn(|| t.claim()).collect::<Vec<_>>())
            })
            .collect();
        let mut all: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (10..1010).collect::<Vec<_>>());
    }
}
