//! The keys of a replication batch, decoded into one list for all of its steps
//! (ARCHITECTURE.md §5).
//!
//! A batch carries a step per shard, each with its own key-value pairs: decoded one by one,
//! every step would cost a key list and its shared handle, which is most of what a replica
//! allocates per frame. While a batch decodes, the pairs' keys go into this thread's arena
//! instead, each step's pairs holding a stand-in for the list; once every step is decoded,
//! the arena becomes one shared list and each step's pairs are pointed at their window of it
//! ([`crate::kv::KvPairs::rebase_keys`]). Only the batch decoder opens the arena, and it
//! swaps every stand-in before any step leaves it.

use core::cell::RefCell;
use std::sync::Arc;

use crate::key::Key;

/// Where pairs' keys went in the open arena: their first position, and the stand-in the
/// pairs hold until it closes.
pub(crate) type Placed = (usize, Arc<Vec<Key>>);

/// An open arena: the keys so far, and the stand-in list the pairs decoded into it hold.
struct Open {
    keys: Vec<Key>,
    stand_in: Arc<Vec<Key>>,
}

thread_local! {
    static ARENA: RefCell<Option<Open>> = const { RefCell::new(None) };
    /// The last arena closed, kept for the next batch so that decoding one allocates neither
    /// the keys' room nor a stand-in.
    static SPARE: RefCell<Option<Open>> = const { RefCell::new(None) };
}

/// Past this many keys' room, an arena is let go once closed rather than kept.
const KEPT: usize = 1 << 17;

/// An arena opened on this thread ([`open`]); dropped, it restores what was open before.
pub(crate) struct Arena {
    previous: Option<Option<Open>>,
}

/// Opens an arena on this thread: pairs decoded until it is closed or dropped put their keys
/// in it ([`append`]).
pub(crate) fn open() -> Arena {
    let open = SPARE.with_borrow_mut(Option::take).map_or_else(
        || Open {
            keys: Vec::new(),
            stand_in: Arc::new(Vec::new()),
        },
        |mut spare| {
            spare.keys.clear();
            spare
        },
    );
    Arena {
        previous: Some(ARENA.with_borrow_mut(|a| a.replace(open))),
    }
}

impl Arena {
    /// Closes the arena and hands `rebase` the stand-in the pairs decoded into it hold and
    /// the keys, shared, to point them at. False when a pair still holds the stand-in after.
    pub(crate) fn close(mut self, rebase: impl FnOnce(&Arc<Vec<Key>>, &Arc<Vec<Key>>)) -> bool {
        let previous = self.previous.take().flatten();
        let Some(open) = ARENA.with_borrow_mut(|a| core::mem::replace(a, previous)) else {
            // Nothing was rebased: whatever was decoded cannot be vouched for.
            return false;
        };
        // A copy the size of the keys: the arena's room stays for the next batch.
        let keys = Arc::new(open.keys.clone());
        rebase(&open.stand_in, &keys);
        let whole = Arc::strong_count(&open.stand_in) == 1;
        if whole && open.keys.capacity() <= KEPT {
            SPARE.with_borrow_mut(|spare| *spare = Some(open));
        }
        whole
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            ARENA.with_borrow_mut(|a| *a = previous);
        }
    }
}

/// Where `decode` put its keys in the open arena: their first position and the stand-in to
/// hold until the arena closes. `None` when no arena is open on this thread. A failed decode
/// leaves the arena as it found it.
pub(crate) fn append<E>(
    decode: impl FnOnce(&mut Vec<Key>) -> Result<(), E>,
) -> Option<Result<Placed, E>> {
    ARENA.with_borrow_mut(|a| {
        let open = a.as_mut()?;
        let lo = open.keys.len();
        Some(match decode(&mut open.keys) {
            Ok(()) => Ok((lo, open.stand_in.clone())),
            Err(e) => {
                open.keys.truncate(lo);
                Err(e)
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Puts `keys` in the open arena: where they went, and the stand-in.
    fn put(keys: &[Key]) -> Placed {
        append(|k| {
            k.extend_from_slice(keys);
            Ok::<(), ()>(())
        })
        .expect("an arena is open")
        .expect("nothing fails")
    }

    #[test]
    fn keys_go_to_the_arena_only_while_it_is_open_and_a_failure_leaves_none() {
        assert!(append(|_| Ok::<(), ()>(())).is_none());
        let arena = open();
        assert_eq!(put(&[1, 2]).0, 0);
        assert!(
            append(|k| {
                k.push(9);
                Err(())
            })
            .unwrap()
            .is_err()
        );
        let (lo, stand_in) = put(&[5]);
        assert_eq!(lo, 2);
        let mut kept = None;
        // Still held here: the arena says so.
        assert!(!arena.close(|held, keys| {
            assert!(Arc::ptr_eq(held, &stand_in));
            kept = Some(keys.clone());
        }));
        assert_eq!(*kept.unwrap(), [1, 2, 5]);
        assert!(append(|_| Ok::<(), ()>(())).is_none());
        drop(stand_in);
        // The next arena starts empty.
        let arena = open();
        assert_eq!(put(&[7]).0, 0);
        assert!(arena.close(|_, keys| assert_eq!(**keys, [7])));
    }
}
