//! Push slots as a server grants them (ARCHITECTURE.md §9): asks taken in turn by worker, a
//! slot freed when its slice arrives or its lease runs out.

use crate::effects::{Effects, TimerId};
use crate::ids::{NodeId, Time};
use crate::slots::{PushSlots, lease};
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{Message, RequestId, SliceRef};

use super::Server;

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> Server<V, U, S> {
    /// A member worker asks a slot for a push slice of `bytes`. A slice too small to need
    /// one, or a job without slots (a worker that thinks otherwise would wait for ever), is
    /// let in at once.
    pub(super) fn on_slot_ask(
        &mut self,
        now: Time,
        from: NodeId,
        slice: SliceRef,
        bytes: u32,
        out: &mut Effects<V>,
    ) {
        let Some(slots) = self
            .slot_policy()
            .filter(|s| s.needs_slot(u64::from(bytes)))
        else {
            return self.send(from, Message::SlotGrant(slice), out);
        };
        let lease = lease(&self.cfg.timing, bytes);
        let grants = self.slots.ask(now, &slots, from, slice, lease);
        self.send_grants(grants, out);
    }

    /// A push slice arrived from `from`: the slot it held is free for the next worker.
    pub(super) fn slot_arrived(
        &mut self,
        now: Time,
        from: NodeId,
        slice: SliceRef,
        settled_below: RequestId,
        out: &mut Effects<V>,
    ) {
        let Some(slots) = self.slot_policy() else {
            return;
        };
        let grants = self.slots.arrived(now, &slots, from, slice, settled_below);
        self.send_grants(grants, out);
    }

    /// The lease timer fired: slots whose slice never came go to the next workers.
    pub(super) fn expire_slots(&mut self, now: Time, out: &mut Effects<V>) {
        self.slots.timer = None;
        let Some(slots) = self.slot_policy() else {
            return;
        };
        let grants = self.slots.expire(now, &slots);
        self.send_grants(grants, out);
    }

    /// A new configuration: the slots and asks of workers no longer in it go.
    pub(super) fn retain_slot_workers(&mut self, now: Time, out: &mut Effects<V>) {
        let (Some(slots), Some(cluster)) = (self.slot_policy(), self.cluster.as_ref()) else {
            return;
        };
        let grants = self.slots.retain(now, &slots, |w| cluster.is_worker(w));
        self.send_grants(grants, out);
    }

    /// The job's push slots as this server grants them: one more at once under the
    /// `SlotsPastAtOnce` mutation.
    fn slot_policy(&self) -> Option<PushSlots> {
        let slots = self.cfg.push_slots?;
        if mutated!(self, SlotsPastAtOnce) {
            return Some(PushSlots {
                at_once: slots.at_once.max(1).saturating_add(1),
                ..slots
            });
        }
        Some(slots)
    }

    fn send_grants(&mut self, grants: Vec<(NodeId, SliceRef)>, out: &mut Effects<V>) {
        for (worker, slice) in grants {
            self.send(worker, Message::SlotGrant(slice), out);
        }
        let next = self.slots.next_expiry();
        if next != self.slots.timer {
            match next {
                Some(at) => out.set_timer(TimerId::SlotLease, at),
                None => out.cancel_timer(TimerId::SlotLease),
            }
            self.slots.timer = next;
        }
    }
}
