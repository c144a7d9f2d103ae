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
}

/// An arena opened on this thread ([`open`]); dropped, it restores what was open before.
pub(crate) struct Arena {
    previous: Option<Option<Open>>,
}

/// Opens an arena on this thread: pairs decoded until it is closed or dropped put their keys
/// in it ([`append`]).
pub(crate) fn open() -> Arena {
    let open = Open {
        keys: Vec::new(),
        stand_in: Arc::new(Vec::new()),
    };
    Arena {
        previous: Some(ARENA.with_borrow_mut(|a| a.replace(open))),
    }
}

impl Arena {
    /// Closes the arena: the stand-in the pairs decoded into it hold, and the keys, shared.
    pub(crate) fn close(mut self) -> (Arc<Vec<Key>>, Arc<Vec<Key>>) {
        let previous = self.previous.take().flatten();
        let open = ARENA.with_borrow_mut(|a| core::mem::replace(a, previous));
        open.map_or_else(
            || (Arc::new(Vec::new()), Arc::new(Vec::new())),
            |o| (o.stand_in, Arc::new(o.keys)),
        )
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

    #[test]
    fn keys_go_to_the_arena_only_while_it_is_open_and_a_failure_leaves_none() {
        assert!(append(|_| Ok::<(), ()>(())).is_none());
        let arena = open();
        let (lo, _) = append(|k| {
            k.extend([1, 2]);
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
        assert_eq!(lo, 0);
        assert!(
            append(|k| {
                k.push(9);
                Err(())
            })
            .unwrap()
            .is_err()
        );
        let (lo, stand_in) = append(|k| {
            k.push(5);
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
        assert_eq!(lo, 2);
        let (held, keys) = arena.close();
        assert!(Arc::ptr_eq(&held, &stand_in));
        assert_eq!(*keys, [1, 2, 5]);
        assert!(append(|_| Ok::<(), ()>(())).is_none());
    }
}
