//! Key caching on the server (ARCHITECTURE.md §10): the lists workers send whole are kept, a slice
//! that names one is served as if it carried it, and one naming a list this server does not hold is
//! answered [`Message::KeysUnknown`], so that the worker sends it whole.
//!
//! A push naming a list is resolved into the push of its keys on arrival, and is from there on
//! sliced, de-duplicated and applied like any push; values for another number of rows than the list
//! holds are refused (`Refusal::RowsMismatch`).

use std::sync::Arc;

use crate::effects::{Effects, Refusal};
use crate::ids::{NodeId, Time};
use crate::key::Key;
use crate::selection::{KeyList, KeySelection};
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Message, Pull, PullCached, Push, PushCached, SliceRef};

use super::Server;

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// Keeps a list `worker` sent whole, where the job caches keys. The list is made only
    /// then.
    pub(super) fn keep_list(&mut self, worker: NodeId, keys: impl FnOnce() -> Arc<Vec<Key>>) {
        if let Some(held) = self.held_lists.as_mut() {
            held.keep(worker, keys());
        }
    }

    /// The list `worker` named `name` in slice `slice`; `None`, having asked for the list
    /// whole, when this server does not hold it.
    fn named_list(
        &mut self,
        worker: NodeId,
        slice: SliceRef,
        name: crate::filter::KeysDigest,
        out: &mut Effects<V>,
    ) -> Option<Arc<Vec<Key>>> {
        let found = self.held_lists.as_mut().and_then(|h| h.get(worker, name));
        if found.is_none() {
            self.send(worker, Message::KeysUnknown(slice), out);
        }
        found
    }

    pub(super) fn on_push_cached(
        &mut self,
        now: Time,
        from: NodeId,
        push: PushCached<V>,
        out: &mut Effects<V>,
    ) {
        let Some(keys) = self.named_list(from, push.slice, push.keys, out) else {
            return;
        };
        let Some(kvs) = push.values.with_keys(&keys, self.cfg.width) else {
            return out.refuse(from, Refusal::RowsMismatch);
        };
        let push = Push {
            slice: push.slice,
            iteration: push.iteration,
            covers: push.covers,
            settled_below: push.settled_below,
            kvs,
        };
        self.on_push(now, from, push, out);
    }

    pub(super) fn on_pull_cached(&mut self, from: NodeId, pull: PullCached, out: &mut Effects<V>) {
        let Some(keys) = self.named_list(from, pull.slice, pull.keys, out) else {
            return;
        };
        let pull = Pull {
            slice: pull.slice,
            iteration: pull.iteration,
            keys: KeySelection::Keys(KeyList::from_shared(keys)),
        };
        self.on_pull(from, pull, out);
    }
}
