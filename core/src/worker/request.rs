//! Requests and their slices: what the application asked for, cut along the ring of the epoch
//! into slices that each go to one server in one message (ARCHITECTURE.md §3).

use std::collections::BTreeMap;

use crate::effects::Effects;
use crate::effects::Refusal;
use crate::filter::KeysDigest;
use crate::ids::{Epoch, Iteration, NodeId, Time};
use crate::kv::KvPairs;
use crate::pace::Coverage;
use crate::selection::KeySelection;
use crate::slicing::{Part, merge_parts, primary_of_all, split_by_primary};
use crate::value::Value;
use crate::wire::{
    Message, Pull, PullCached, Push, PushCached, RequestId, RowValues, SliceId, SliceRef,
};

use super::Worker;
use super::window::Kind;

/// A piece of a request for the primary of its keys, sent in one message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Slice<V: Value> {
    pub(super) server: NodeId,
    pub(super) part: Part<V>,
    /// On the network (otherwise waiting for room in the window).
    pub(super) sent: bool,
    /// Next retransmission, once sent.
    pub(super) due: Time,
    pub(super) attempts: u8,
    /// A push slice the server took in ([`Message::PushTaken`]), and the server's epoch then:
    /// it has left the window and is kept (now and then resent) until acknowledged, and it
    /// counts for its iteration while the worker is at that epoch.
    pub(super) taken: Option<Epoch>,
    /// A large push slice waiting for its server's grant ([`crate::slots::PushSlots`]): what is
    /// on the network for it (and sent again) is the ask, not the slice. It holds its place
    /// in the window meanwhile.
    pub(super) asking: bool,
    /// Its server granted it a slot: it goes, and goes again, without asking.
    pub(super) granted: bool,
    /// The transport said its last send failed, and its next resend was put off for it:
    /// once per send, however many failures are reported.
    pub(super) backed_off: bool,
}

impl<V: Value> Slice<V> {
    /// Whether the slice holds a place in its kind's window: sent, and not taken in.
    pub(super) fn in_window(&self) -> bool {
        self.sent && self.taken.is_none()
    }
}

/// A push or a pull of the application, open until every slice of it is answered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Request<V: Value> {
    pub(super) iteration: Iteration,
    /// A push: how much of its iteration it covers, its earlier parts included.
    pub(super) covers: Coverage,
    /// Pushes count towards their iteration's completion; pulls do not.
    pub(super) kind: Kind,
    /// What the application asked for, kept until the first configuration slices it.
    pub(super) whole: Option<Part<V>>,
    /// Unanswered slices.
    pub(super) open: BTreeMap<SliceId, Slice<V>>,
    /// Pull answers received so far.
    pub(super) replies: Vec<KvPairs<V>>,
    pub(super) next_slice: SliceId,
    /// A push counted as finished for its iteration (every slice taken in or acknowledged),
    /// with [`crate::events::WorkerEvent::PushDone`] emitted.
    pub(super) counted: bool,
}

impl<V: Value> Request<V> {
    fn new(iteration: Iteration, covers: Coverage, part: Part<V>) -> Self {
        let kind = match part {
            Part::Push(_) => Kind::Push,
            Part::Pull(_) => Kind::Pull,
        };
        Request {
            iteration,
            covers,
            kind,
            whole: Some(part),
            open: BTreeMap::new(),
            replies: Vec::new(),
            next_slice: 0,
            counted: false,
        }
    }

    pub(super) fn is_push(&self) -> bool {
        self.kind == Kind::Push
    }

    /// Every slice is answered: nothing is open, and nothing waits to be sliced.
    pub(super) fn is_done(&self) -> bool {
        self.open.is_empty() && self.whole.is_none()
    }

    /// Every open slice was taken in by its server at `epoch`.
    pub(super) fn all_taken_at(&self, epoch: Epoch) -> bool {
        self.open.values().all(|s| s.taken == Some(epoch))
    }

    /// Opens a slice for each part, unsent.
    fn add_slices(&mut self, parts: Vec<(NodeId, Part<V>)>) {
        for (server, part) in parts {
            let sid = self.next_slice;
            self.next_slice += 1;
            let slice = Slice {
                server,
                part,
                sent: false,
                due: 0,
                backed_off: false,
                attempts: 0,
                taken: None,
                asking: false,
                granted: false,
            };
            self.open.insert(sid, slice);
        }
    }
}

impl<V: Value> Worker<V> {
    pub(super) fn submit(
        &mut self,
        now: Time,
        part: Part<V>,
        covers: Coverage,
        out: &mut Effects<V>,
    ) -> RequestId {
        let id = self.next_request;
        self.next_request += 1;
        self.requests
            .insert(id, Request::new(self.iteration, covers, part));
        if self.cluster.is_some() {
            self.slice_request(now, id, out);
        }
        id
    }

    /// Splits a request's unsliced part over the primaries of the current ring and sends the
    /// slices.
    pub(super) fn slice_request(&mut self, now: Time, id: RequestId, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Some(request) = self.requests.get_mut(&id) else {
            return;
        };
        let Some(whole) = request.whole.take() else {
            return;
        };
        request.add_slices(split_by_primary(
            cluster,
            whole,
            self.cfg.keys_per_slice::<V>(),
        ));
        self.fill_window(now, out);
        self.complete_if_done(now, id, out);
        self.arm_retransmit(out);
    }

    /// A new epoch: what servers took in under earlier ones counts no more (a server may have
    /// crashed with it, and a process restarted under the same id, and at the same place on
    /// the ring, does not hold it). Every such slice goes back to the window and is sent
    /// again; a server that still holds it says so at once.
    pub(super) fn untake_before(&mut self, epoch: Epoch) {
        for request in self.requests.values_mut() {
            for slice in request.open.values_mut() {
                if slice.taken.is_some_and(|e| e < epoch) {
                    slice.taken = None;
                    slice.sent = false;
                    slice.attempts = 0;
                }
            }
        }
    }

    /// Takes back the open slices whose server is no longer the primary of all their keys, so
    /// that they are sliced again under the new ring.
    pub(super) fn reslice_moved(&mut self, id: RequestId) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Some(request) = self.requests.get_mut(&id) else {
            return;
        };
        let moved: Vec<SliceId> = request
            .open
            .iter()
            .filter(|(_, s)| !primary_of_all(cluster, s.server, &s.part))
            .map(|(&sid, _)| sid)
            .collect();
        if moved.is_empty() {
            return;
        }
        let window = &mut self.windows[request.kind];
        let parts: Vec<Part<V>> = moved
            .iter()
            .filter_map(|sid| request.open.remove(sid))
            .map(|s| {
                if s.in_window() {
                    window.close(self.cfg.slice_bytes(&s.part));
                }
                s.part
            })
            .collect();
        request.whole = merge_parts(parts, self.cfg.width);
    }

    pub(super) fn send_slice(&mut self, id: RequestId, sid: SliceId, out: &mut Effects<V>) {
        let Some(request) = self.requests.get(&id) else {
            return;
        };
        // Read before the key cache is borrowed, and only for a push: it walks the requests.
        let settled_below = if request.is_push() {
            self.settled_below()
        } else {
            0
        };
        let Some(slice) = request.open.get(&sid) else {
            return;
        };
        let sref = SliceRef {
            request: id,
            slice: sid,
        };
        // Key caching names a list the server was sent before (ARCHITECTURE.md §10).
        let stale = mutated!(self, StaleKeyCache);
        let mut named = |keys: &[crate::key::Key]| {
            self.sent_lists
                .as_mut()
                .and_then(|sent| sent.name_for(slice.server, keys, stale))
        };
        let compress = self.cfg.filters.compression;
        let body = match &slice.part {
            Part::Push(_) if slice.asking => Message::SlotAsk {
                slice: sref,
                bytes: u32::try_from(self.cfg.slice_bytes(&slice.part)).unwrap_or(u32::MAX),
            },
            Part::Push(kvs) => match named(kvs.keys()) {
                Some(keys) => Message::PushCached(PushCached {
                    slice: sref,
                    iteration: request.iteration,
                    covers: request.covers,
                    settled_below,
                    keys,
                    values: if compress {
                        RowValues::packed(kvs)
                    } else {
                        RowValues::of(kvs)
                    },
                }),
                None => Message::Push(Push {
                    slice: sref,
                    iteration: request.iteration,
                    covers: request.covers,
                    settled_below,
                    kvs: kvs.clone(),
                }),
            },
            Part::Pull(KeySelection::Keys(list)) => match named(list.keys()) {
                Some(keys) => Message::PullCached(PullCached {
                    slice: sref,
                    iteration: request.iteration,
                    keys,
                }),
                None => Message::Pull(Pull {
                    slice: sref,
                    iteration: request.iteration,
                    keys: KeySelection::Keys(list.clone()),
                }),
            },
            Part::Pull(keys) => Message::Pull(Pull {
                slice: sref,
                iteration: request.iteration,
                keys: keys.clone(),
            }),
        };
        let server = slice.server;
        if let Message::PushCached(push) = &body {
            self.count_compressed(&push.values);
        }
        self.send(server, body, out);
    }

    /// A server does not hold the key list slice `sref` named: the slice goes again, whole,
    /// and the worker no longer counts on the server holding the list.
    pub(super) fn on_keys_unknown(
        &mut self,
        now: Time,
        from: NodeId,
        sref: SliceRef,
        out: &mut Effects<V>,
    ) {
        let keys = self
            .requests
            .get(&sref.request)
            .and_then(|r| r.open.get(&sref.slice))
            .filter(|s| s.sent && !s.asking && s.server == from)
            .and_then(|s| match &s.part {
                Part::Push(kvs) => Some(KeysDigest::of(kvs.keys())),
                Part::Pull(KeySelection::Keys(list)) => Some(KeysDigest::of(list.keys())),
                Part::Pull(KeySelection::Ranges(_)) => None,
            });
        let (Some(name), Some(sent)) = (keys, self.sent_lists.as_mut()) else {
            return out.refuse(from, Refusal::BadAnswer);
        };
        sent.forget(from, name);
        self.send_afresh(now, sref, out);
    }

    /// Every push request below this id is complete.
    fn settled_below(&self) -> RequestId {
        self.requests
            .iter()
            .find(|(_, r)| r.is_push())
            .map_or(self.next_request, |(&id, _)| id)
    }
}
