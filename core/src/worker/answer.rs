//! What servers answer to slices: an acknowledgement, a push taken in, a pull's values whole
//! or a part at a time; and the requests they complete.

use crate::effects::{Effects, Event, Refusal, WorkerEvent};
use crate::ids::{Epoch, Iteration, NodeId, Time};
use crate::key::Key;
use crate::kv::KvPairs;
use crate::selection::KeySelection;
use crate::slicing::{Part, answers, assemble};
use crate::value::Value;
use crate::wire::{RequestId, SliceRef};

use super::Worker;

impl<V: Value> Worker<V> {
    /// The key list an open pull slice asked for: what a [`crate::wire::PullValues`]
    /// answering it holds the values of.
    pub(super) fn asked_keys(&self, sref: SliceRef) -> Option<std::sync::Arc<Vec<Key>>> {
        let slice = self.requests.get(&sref.request)?.open.get(&sref.slice)?;
        match &slice.part {
            Part::Pull(KeySelection::Keys(list)) => Some(std::sync::Arc::clone(list.shared())),
            _ => None,
        }
    }

    /// A slice is answered: a push acknowledged (`reply` is `None`), or a pull answered whole.
    pub(super) fn on_answer(
        &mut self,
        now: Time,
        from: NodeId,
        sref: SliceRef,
        reply: Option<KvPairs<V>>,
        out: &mut Effects<V>,
    ) {
        let width = self.cfg.width;
        let Some(request) = self.requests.get_mut(&sref.request) else {
            return;
        };
        let Some(slice) = request.open.get(&sref.slice) else {
            return;
        };
        if !slice.sent || slice.asking || from != slice.server {
            // Not sent, or not to this server: an answer to something else, or a forgery.
            return out.refuse(from, Refusal::BadAnswer);
        }
        match (&slice.part, reply) {
            (Part::Push(_), None) => {}
            (part @ Part::Pull(_), Some(kvs)) if answers(part, &kvs, width) => {
                request.replies.push(kvs);
            }
            // An answer of the wrong kind or shape: leave the slice open.
            _ => return out.refuse(from, Refusal::BadAnswer),
        }
        if let Some(slice) = request.open.remove(&sref.slice) {
            if slice.in_window() {
                self.windows[request.kind].close(self.cfg.slice_bytes(&slice.part));
            }
        }
        self.fill_window(now, out);
        if self.count_if_taken(sref.request, out) {
            self.on_progress(now, out);
        }
        self.complete_if_done(now, sref.request, out);
        self.arm_retransmit(out);
    }

    /// A server took a push slice in without its replicas holding it yet: the slice leaves
    /// the window and counts for its iteration, and is resent only at the longest
    /// retransmission timeout (a lost acknowledgement, or a server that died with it) until
    /// it is acknowledged.
    pub(super) fn on_taken(
        &mut self,
        now: Time,
        from: NodeId,
        epoch: Epoch,
        sref: SliceRef,
        out: &mut Effects<V>,
    ) {
        let timing = self.cfg.timing;
        let Some(request) = self.requests.get_mut(&sref.request) else {
            return;
        };
        let Some(slice) = request.open.get_mut(&sref.slice) else {
            return;
        };
        if !slice.sent
            || slice.asking
            || from != slice.server
            || !matches!(slice.part, Part::Push(_))
        {
            return out.refuse(from, Refusal::BadAnswer);
        }
        if slice.taken >= Some(epoch) {
            return;
        }
        if slice.in_window() {
            self.windows.push.close(self.cfg.slice_bytes(&slice.part));
        }
        slice.taken = Some(epoch);
        slice.attempts = timing.max_doublings;
        slice.due = now
            + self
                .cfg
                .jittered_rto(sref.request, sref.slice, slice.attempts);
        self.fill_window(now, out);
        if self.count_if_taken(sref.request, out) {
            self.on_progress(now, out);
        }
        self.arm_retransmit(out);
    }

    /// A server granted a push slice a slot ([`crate::slots::PushSlots`]): the slice goes now, on
    /// a fresh retransmission timer. A grant for a slice not waiting for one (a duplicate, or
    /// one for a slice acknowledged since) changes nothing.
    pub(super) fn on_grant(
        &mut self,
        now: Time,
        from: NodeId,
        sref: SliceRef,
        out: &mut Effects<V>,
    ) {
        let Some(slice) = self
            .requests
            .get_mut(&sref.request)
            .and_then(|r| r.open.get_mut(&sref.slice))
        else {
            return;
        };
        if from != slice.server {
            return out.refuse(from, Refusal::BadAnswer);
        }
        if !slice.asking {
            return;
        }
        slice.asking = false;
        slice.granted = true;
        self.send_afresh(now, sref, out);
        self.arm_retransmit(out);
    }

    /// The first part of an answer to a range pull too large for one message: keep it, and ask
    /// for the rest (the keys from `next` on) under the same slice.
    pub(super) fn on_partial_answer(
        &mut self,
        now: Time,
        from: NodeId,
        sref: SliceRef,
        kvs: KvPairs<V>,
        next: Key,
        out: &mut Effects<V>,
    ) {
        let width = self.cfg.width;
        let Some(request) = self.requests.get_mut(&sref.request) else {
            return;
        };
        let Some(slice) = request.open.get_mut(&sref.slice) else {
            return;
        };
        let Part::Pull(KeySelection::Ranges(ranges)) = &slice.part else {
            return out.refuse(from, Refusal::BadAnswer);
        };
        let start = ranges.ranges().first().map_or(0, |r| r.start());
        // The part must answer the slice as it stands, stop short of `next`, and move forward:
        // anything else (a stale copy of an earlier part, say) could repeat keys or loop.
        let fits = slice.sent
            && from == slice.server
            && next > start
            && answers(&slice.part, &kvs, width)
            && kvs.span().is_none_or(|s| s.end() <= next);
        if !fits {
            return out.refuse(from, Refusal::BadAnswer);
        }
        request.replies.push(kvs);
        let rest = ranges.from_key(next);
        // What the slice still asks for moves another number of bytes.
        self.windows.pull.close(self.cfg.slice_bytes(&slice.part));
        if rest.ranges().is_empty() {
            request.open.remove(&sref.slice);
            self.fill_window(now, out);
            self.complete_if_done(now, sref.request, out);
        } else {
            slice.part = Part::Pull(KeySelection::Ranges(rest));
            self.windows.pull.open(self.cfg.slice_bytes(&slice.part));
            self.send_afresh(now, sref, out);
        }
        self.arm_retransmit(out);
    }

    /// Counts a push for its iteration once every slice of it was taken in or acknowledged.
    /// Returns whether the worker's taken progress may have moved (the caller tells the
    /// servers).
    pub(super) fn count_if_taken(&mut self, id: RequestId, out: &mut Effects<V>) -> bool {
        let epoch = self.epoch();
        let Some(request) = self.requests.get_mut(&id) else {
            return false;
        };
        // With no slice open the push is acknowledged: `complete_if_done` counts it.
        let taken = request.is_push()
            && request.whole.is_none()
            && !request.open.is_empty()
            && request.all_taken_at(epoch);
        if !taken {
            return false;
        }
        // Already counted: taken in again at a new epoch.
        if !request.counted {
            request.counted = true;
            let iteration = request.iteration;
            self.count_push(id, iteration, out);
        }
        true
    }

    /// A push is done for its iteration: the iteration may finish (the caller tells the
    /// servers), and the application hears [`crate::events::WorkerEvent::PushDone`].
    fn count_push(&mut self, id: RequestId, iteration: Iteration, out: &mut Effects<V>) {
        if let Some(n) = self.unfinished.get_mut(&iteration) {
            *n -= 1;
            if *n == 0 {
                self.unfinished.remove(&iteration);
            }
        }
        out.emit(Event::Worker(WorkerEvent::PushDone(id)));
    }

    pub(super) fn complete_if_done(&mut self, now: Time, id: RequestId, out: &mut Effects<V>) {
        if !self.requests.get(&id).is_some_and(|r| r.is_done()) {
            return;
        }
        let Some(request) = self.requests.remove(&id) else {
            return;
        };
        if request.is_push() {
            if !request.counted {
                self.count_push(id, request.iteration, out);
            }
            // Durable progress moved, and maybe finished progress: servers hear it.
            self.on_progress(now, out);
            out.emit(Event::Worker(WorkerEvent::PushDurable(id)));
        } else {
            #[allow(unused_mut)]
            let mut kvs = assemble(request.replies, self.cfg.width);
            if mutated!(self, ShortPull) && !kvs.is_empty() {
                kvs = kvs.rows(0, kvs.len() - 1);
            }
            self.filters.pulled(&kvs);
            out.emit(Event::Worker(WorkerEvent::PullDone(id, kvs)));
        }
    }
}
