//! Round-robin push slots (ARCHITECTURE.md §9): a server lets a few large push slices in at a time
//! and the workers take turns, so that pushes that finish together do not all arrive together. What
//! a job asks for is [`PushSlots`]; what a server keeps to grant slots is a `SlotQueue`, inside the
//! crate.
//!
//! # The exchange
//!
//! A worker does not send a push slice of at least [`PushSlots::min_bytes`] (smaller ones are not
//! worth a round trip): it sends `SlotAsk`, resent on its retransmission timer like a slice,
//! holding the slice's place in its window, and sends the slice when `SlotGrant` arrives (a grant
//! it does not wait for is ignored). A server grants [`PushSlots::at_once`] slots at a time, the
//! next to the waiting worker served longest ago, so workers take turns however many slices each
//! asked for.
//!
//! A slot is freed when any push of its slice arrives, when its lease runs out (four first
//! retransmission timeouts plus the slice's transfer allowance, on `TimerId::SlotLease`: a dead
//! worker holds nobody up for long, and a lost grant is asked for again within it), or when a
//! configuration drops the worker. A repeated ask is granted again; one for a slice that arrived,
//! or of a settled request, is granted at once without a slot; an ask from a non-member is refused
//! (`UnknownSender`). Pushes themselves, their acknowledgement and de-duplication do not change.
//!
//! # What it saves, and what it costs
//!
//! In the simulator, with servers that work through their bytes at a fixed rate
//! (`SimConfig::receive_rate`), `pserver sim slots-sweep` compares four workers pushing together
//! with and without slots: one slot per server cuts the servers' peak receive queue about threefold
//! for some 5% more time, the round trip between one slice's arrival and the next grant.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::ids::{NodeId, Time};
use crate::timing::Timing;
use crate::wire::{RequestId, SliceRef};

/// Push slots for a job ([`crate::JobSpec::push_slots`]). Workers that finish an iteration
/// together push together: without slots every server receives every worker's slice at once
/// and must hold them all before it gets through them, a peak of memory and of delay for
/// everything queued behind (a pull, a heartbeat). With slots a worker asks before it sends a
/// large slice ([`crate::wire::Message::SlotAsk`]) and sends it once its server grants a slot
/// ([`crate::wire::Message::SlotGrant`]); a server grants `at_once` slots at a time, to the
/// workers in turn. The same bytes arrive, one turn after another.
///
/// ```
/// use pserver_core::JobSpec;
/// use pserver_core::slots::PushSlots;
/// let mut job = JobSpec::new(2, 4);
/// job.push_slots = Some(PushSlots { min_bytes: 64 << 10, at_once: 1 });
/// assert!(job.validate::<f32>().is_ok());
/// job.push_slots = Some(PushSlots { min_bytes: 64 << 10, at_once: 0 });
/// assert!(job.validate::<f32>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PushSlots {
    /// A push slice of at least this many bytes (keys and values, as
    /// [`crate::node::WorkerConfig::max_slice_bytes`] counts them) waits for a slot; a smaller
    /// one goes at once, since a slot costs a round trip that a small slice does not repay.
    pub min_bytes: usize,
    /// Slices a server lets in at once. One spaces pushes out most; more hide the round trip
    /// between one slice's arrival and the next grant, at a higher peak.
    pub at_once: u16,
}

impl PushSlots {
    /// Whether a push slice of `bytes` needs a slot.
    pub(crate) fn needs_slot(&self, bytes: u64) -> bool {
        bytes >= self.min_bytes as u64
    }
}

/// How long a slot granted for a slice of `bytes` stays held without the slice arriving: a
/// few first retransmission timeouts, and the time the slice takes to move as the worker
/// reckons it ([`Timing::rto_per_mib`]). A worker whose grant was lost asks again within
/// that; one that died lets its slot go when it runs out.
pub(crate) fn lease(timing: &Timing, bytes: u32) -> Time {
    let moving = u64::from(bytes >> 20).saturating_mul(timing.rto_per_mib);
    timing.rto_initial.saturating_mul(4).saturating_add(moving)
}

/// A server's push slots: the slots granted and when their leases end, and the asks waiting
/// for one. The next free slot goes to the waiting worker served longest ago (one never
/// served first, in the order they asked), and a worker's own asks in the order they came:
/// workers take turns, however many slices each asked for at once.
///
/// Invariant: at most `at_once` slots are granted, and a slot is granted only while fewer
/// are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct SlotQueue {
    /// Granted slots, each with the end of its lease.
    granted: BTreeMap<(NodeId, SliceRef), Time>,
    /// Per worker, its waiting asks in the order they came, each with its lease's length and
    /// its place among all asks.
    waiting: BTreeMap<NodeId, VecDeque<(SliceRef, Time, u64)>>,
    /// Asks taken in so far, to place the next.
    asks: u64,
    /// Per worker, the turn it was last granted a slot in.
    served: BTreeMap<NodeId, u64>,
    /// Slots granted so far, to number the turns.
    turns: u64,
    /// Per worker, slices that arrived after they asked: an ask for one of them that comes
    /// late (duplicated, or resent before its grant came) is granted without a slot.
    arrived: BTreeMap<NodeId, BTreeSet<SliceRef>>,
    /// Per worker, the highest `settled_below` its pushes carried: its requests below it
    /// are done and never sent again, so what is kept of them can go.
    settled: BTreeMap<NodeId, RequestId>,
    /// The lease deadline the server's timer is set for.
    pub(crate) timer: Option<Time>,
}

impl SlotQueue {
    /// `worker` asks a slot for `slice`, whose lease would last `lease`. Returns the grants
    /// to send now: to the asker at once if its slice holds a slot already (the grant was
    /// lost) or needs none any more, and to whoever gets a slot that was free.
    pub(crate) fn ask(
        &mut self,
        now: Time,
        slots: &PushSlots,
        worker: NodeId,
        slice: SliceRef,
        lease: Time,
    ) -> Vec<(NodeId, SliceRef)> {
        let settled = self.settled.get(&worker).copied().unwrap_or(0);
        let arrived = self
            .arrived
            .get(&worker)
            .is_some_and(|a| a.contains(&slice));
        if slice.request < settled || arrived {
            return vec![(worker, slice)];
        }
        if let Some(until) = self.granted.get_mut(&(worker, slice)) {
            // The asker is alive and the grant went astray: it keeps its slot a lease longer.
            *until = now.saturating_add(lease);
            return vec![(worker, slice)];
        }
        let asks = self.waiting.entry(worker).or_default();
        if asks.iter().any(|&(s, ..)| s == slice) {
            // A resent ask keeps its place.
            return Vec::new();
        }
        self.asks += 1;
        asks.push_back((slice, lease, self.asks));
        self.grant_free(now, slots)
    }

    /// A push of `slice` from `worker` arrived: the slot it held (or its waiting ask) is
    /// freed. Returns the grants the freed slot lets go out.
    pub(crate) fn arrived(
        &mut self,
        now: Time,
        slots: &PushSlots,
        worker: NodeId,
        slice: SliceRef,
        settled_below: RequestId,
    ) -> Vec<(NodeId, SliceRef)> {
        let settled = self.settled.entry(worker).or_default();
        *settled = (*settled).max(settled_below);
        let settled = *settled;
        if let Some(arrived) = self.arrived.get_mut(&worker) {
            arrived.retain(|s| s.request >= settled);
        }
        let held = self.granted.remove(&(worker, slice)).is_some();
        let asked = self.forget_ask(worker, slice);
        if held || asked {
            self.arrived.entry(worker).or_default().insert(slice);
        }
        self.arrived.retain(|_, a| !a.is_empty());
        self.grant_free(now, slots)
    }

    /// Takes back every slot whose lease ran out by `now`. Returns the grants the freed
    /// slots let go out.
    pub(crate) fn expire(&mut self, now: Time, slots: &PushSlots) -> Vec<(NodeId, SliceRef)> {
        self.granted.retain(|_, &mut until| until > now);
        self.grant_free(now, slots)
    }

    /// Forgets the workers that are not in `workers` (the members of a new configuration):
    /// their slots and asks. Returns the grants the freed slots let go out.
    pub(crate) fn retain(
        &mut self,
        now: Time,
        slots: &PushSlots,
        is_worker: impl Fn(NodeId) -> bool,
    ) -> Vec<(NodeId, SliceRef)> {
        self.granted.retain(|&(w, _), _| is_worker(w));
        self.waiting.retain(|&w, _| is_worker(w));
        self.served.retain(|&w, _| is_worker(w));
        self.arrived.retain(|&w, _| is_worker(w));
        self.settled.retain(|&w, _| is_worker(w));
        self.grant_free(now, slots)
    }

    /// When the first lease runs out.
    pub(crate) fn next_expiry(&self) -> Option<Time> {
        self.granted.values().copied().min()
    }

    /// Slots granted now.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn granted(&self) -> usize {
        self.granted.len()
    }

    /// Asks waiting for a slot.
    #[cfg(feature = "testing")]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.values().map(VecDeque::len).sum()
    }

    /// Removes `worker`'s waiting ask for `slice`; whether there was one.
    fn forget_ask(&mut self, worker: NodeId, slice: SliceRef) -> bool {
        let Some(asks) = self.waiting.get_mut(&worker) else {
            return false;
        };
        let before = asks.len();
        asks.retain(|&(s, ..)| s != slice);
        let removed = asks.len() < before;
        if asks.is_empty() {
            self.waiting.remove(&worker);
        }
        removed
    }

    /// Grants free slots to the waiting asks, each to the worker whose turn it is.
    fn grant_free(&mut self, now: Time, slots: &PushSlots) -> Vec<(NodeId, SliceRef)> {
        let mut grants = Vec::new();
        while self.granted.len() < usize::from(slots.at_once.max(1)) {
            let next = self
                .waiting
                .iter()
                .filter_map(|(&w, asks)| {
                    let &(_, _, place) = asks.front()?;
                    Some((self.served.get(&w).copied().unwrap_or(0), place, w))
                })
                .min();
            let Some((_, _, worker)) = next else {
                break;
            };
            let Some(asks) = self.waiting.get_mut(&worker) else {
                break;
            };
            let Some((slice, lease, _)) = asks.pop_front() else {
                break;
            };
            if asks.is_empty() {
                self.waiting.remove(&worker);
            }
            self.turns += 1;
            self.served.insert(worker, self.turns);
            self.granted
                .insert((worker, slice), now.saturating_add(lease));
            grants.push((worker, slice));
        }
        grants
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: PushSlots = PushSlots {
        min_bytes: 0,
        at_once: 1,
    };

    fn s(request: RequestId, slice: u32) -> SliceRef {
        SliceRef { request, slice }
    }

    #[test]
    fn workers_take_turns_even_when_one_asked_for_several_slices_first() {
        let (a, b) = (NodeId(5), NodeId(6));
        let mut q = SlotQueue::default();
        assert_eq!(q.ask(0, &ONE, a, s(1, 0), 10), [(a, s(1, 0))]);
        assert!(q.ask(0, &ONE, a, s(1, 1), 10).is_empty());
        assert!(q.ask(0, &ONE, a, s(1, 2), 10).is_empty());
        assert!(q.ask(0, &ONE, b, s(1, 0), 10).is_empty());
        // `b` asked after `a`'s later slices, but its turn comes before them.
        assert_eq!(q.arrived(1, &ONE, a, s(1, 0), 1), [(b, s(1, 0))]);
        assert_eq!(q.arrived(2, &ONE, b, s(1, 0), 1), [(a, s(1, 1))]);
        assert_eq!(q.arrived(3, &ONE, a, s(1, 1), 1), [(a, s(1, 2))]);
    }

    #[test]
    fn a_late_ask_for_a_slice_that_arrived_or_was_settled_takes_no_slot() {
        let (a, b) = (NodeId(5), NodeId(6));
        let mut q = SlotQueue::default();
        q.ask(0, &ONE, a, s(1, 0), 10);
        q.arrived(1, &ONE, a, s(1, 0), 1);
        assert_eq!(q.ask(2, &ONE, a, s(1, 0), 10), [(a, s(1, 0))]);
        assert_eq!(q.granted(), 0);
        // Settled requests are forgotten, and asked about, granted at once.
        q.arrived(3, &ONE, a, s(2, 0), 2);
        assert!(!q.arrived.contains_key(&a));
        assert_eq!(q.ask(4, &ONE, a, s(1, 0), 10), [(a, s(1, 0))]);
        assert_eq!(q.ask(4, &ONE, b, s(1, 0), 10), [(b, s(1, 0))]);
    }
}
