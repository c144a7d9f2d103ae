//! What a worker has on the network: a window of push slices and one of pull slices, each bounded
//! in slices and in bytes, and when the slices in them are sent again (ARCHITECTURE.md §3).
//!
//! At most `WorkerConfig::max_slices_in_flight` push slices, and separately as many pull slices,
//! are on the network, and at most `WorkerConfig::max_bytes_in_flight` bytes of each (unbounded by
//! default; one slice of each kind always goes); the rest wait in order. Pushes never wait behind
//! pulls: a pull may be held by the consistency model, a push never is, so keeping their windows
//! apart means a full window of held pulls can never stop the pushes those pulls are waiting for.
//!
//! An unanswered slice is retransmitted with capped exponential backoff (`crate::timing`), each
//! timeout stretched by up to a quarter by a hash of (seed, worker, request, slice, attempt), so
//! that workers that lost messages together do not retransmit in lock-step, and a run still replays
//! exactly. Every whole MiB of requests the worker has on the network when it sends adds
//! `Timing::rto_per_mib` to the deadline: a large message, or one queued behind large ones, is not
//! resent only because it takes long to move. Below a MiB in all nothing is added, so the models
//! and the simulator see plain backoff.

use core::ops::{Index, IndexMut};

use crate::effects::{Effects, TimerId};
use crate::ids::{NodeId, Time};
use crate::value::Value;
use crate::wire::{RequestId, SliceId, SliceRef};

use super::Worker;

/// What a request does. Pushes and pulls travel in windows of their own: a pull may be held by
/// the consistency model, a push never is, so a full window of held pulls must never stop the
/// pushes those pulls are waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    Push,
    Pull,
}

/// One `T` for each [`Kind`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct PerKind<T> {
    pub(super) push: T,
    pub(super) pull: T,
}

impl<T> Index<Kind> for PerKind<T> {
    type Output = T;

    fn index(&self, kind: Kind) -> &T {
        match kind {
            Kind::Push => &self.push,
            Kind::Pull => &self.pull,
        }
    }
}

impl<T> IndexMut<Kind> for PerKind<T> {
    fn index_mut(&mut self, kind: Kind) -> &mut T {
        match kind {
            Kind::Push => &mut self.push,
            Kind::Pull => &mut self.pull,
        }
    }
}

/// The slices of one kind on the network (sent, and neither answered nor taken in) and the
/// bytes they move ([`super::WorkerConfig::slice_bytes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct Window {
    slices: usize,
    /// Wide enough never to overflow, so that closing a slice takes back exactly what opening
    /// it added; read through [`Window::bytes`].
    bytes: u128,
}

impl Window {
    /// A slice of `size` bytes went out.
    pub(super) fn open(&mut self, size: u64) {
        self.slices += 1;
        self.bytes += u128::from(size);
    }

    /// A slice of `size` bytes left the network: answered, taken in, or taken back.
    pub(super) fn close(&mut self, size: u64) {
        self.slices -= 1;
        self.bytes -= u128::from(size);
    }

    #[cfg(feature = "testing")]
    pub(super) fn slices(&self) -> usize {
        self.slices
    }

    /// The bytes on the network, saturated.
    pub(super) fn bytes(&self) -> u64 {
        u64::try_from(self.bytes).unwrap_or(u64::MAX)
    }

    fn is_full(&self, max_slices: usize) -> bool {
        self.slices >= max_slices
    }

    /// Whether a slice of `size` bytes fits within `budget`; with nothing on the network,
    /// any slice does, so that a slice larger than the budget still goes.
    fn admits(&self, size: u64, budget: u64) -> bool {
        self.bytes() == 0 || self.bytes().saturating_add(size) <= budget
    }
}

impl<V: Value> Worker<V> {
    /// Sends waiting slices, oldest request first, while the window of their kind has room.
    pub(super) fn fill_window(&mut self, now: Time, out: &mut Effects<V>) {
        let max = self.cfg.max_slices_in_flight.max(1);
        if self.windows.push.is_full(max) && self.windows.pull.is_full(max) {
            return;
        }
        debug_assert_eq!(self.windows, self.windows_of_open_slices());
        let budget = self.cfg.max_bytes_in_flight;
        let mut to_send = Vec::new();
        // A kind whose next slice did not fit sends no later one either, so that a large
        // slice is not overtaken for ever by small ones.
        let mut blocked = PerKind::<bool>::default();
        for (&id, request) in &mut self.requests {
            let window = &mut self.windows[request.kind];
            if window.is_full(max) || blocked[request.kind] {
                continue;
            }
            for (&sid, slice) in &mut request.open {
                if window.is_full(max) {
                    break;
                }
                if slice.sent {
                    continue;
                }
                let size = self.cfg.slice_bytes(&slice.part);
                if !window.admits(size, budget) {
                    blocked[request.kind] = true;
                    break;
                }
                window.open(size);
                slice.sent = true;
                slice.asking = request.kind == Kind::Push
                    && !slice.granted
                    && self.cfg.push_slots.is_some_and(|s| s.needs_slot(size));
                slice.due = now + self.cfg.jittered_rto(id, sid, 0);
                slice.backed_off = false;
                to_send.push((id, sid));
            }
        }
        let allowance = self.transfer_allowance();
        for (id, sid) in to_send {
            self.delay_due(id, sid, allowance);
            self.send_slice(id, sid, out);
        }
    }

    /// The windows as the open slices make them up, which is what the worker keeps in
    /// `windows` as slices come and go.
    fn windows_of_open_slices(&self) -> PerKind<Window> {
        let mut windows = PerKind::<Window>::default();
        for request in self.requests.values() {
            for slice in request.open.values().filter(|s| s.in_window()) {
                windows[request.kind].open(self.cfg.slice_bytes(&slice.part));
            }
        }
        windows
    }

    /// What [`crate::Timing::rto_per_mib`] adds to a deadline for what is on the network now.
    pub(super) fn transfer_allowance(&self) -> Time {
        let bytes = self
            .windows
            .push
            .bytes()
            .saturating_add(self.windows.pull.bytes());
        (bytes >> 20).saturating_mul(self.cfg.timing.rto_per_mib)
    }

    /// Sends slice `sref` as if for the first time: a fresh retransmission timeout, lengthened
    /// by the time what is on the network takes to move.
    pub(super) fn send_afresh(&mut self, now: Time, sref: SliceRef, out: &mut Effects<V>) {
        if let Some(slice) = self
            .requests
            .get_mut(&sref.request)
            .and_then(|r| r.open.get_mut(&sref.slice))
        {
            slice.attempts = 0;
            slice.due = now + self.cfg.jittered_rto(sref.request, sref.slice, 0);
            slice.backed_off = false;
        }
        let allowance = self.transfer_allowance();
        self.delay_due(sref.request, sref.slice, allowance);
        self.send_slice(sref.request, sref.slice, out);
    }

    pub(super) fn delay_due(&mut self, id: RequestId, sid: SliceId, by: Time) {
        if by == 0 {
            return;
        }
        if let Some(slice) = self
            .requests
            .get_mut(&id)
            .and_then(|r| r.open.get_mut(&sid))
        {
            slice.due = slice.due.saturating_add(by);
        }
    }

    /// Sends again every slice, and the progress report, whose deadline has passed.
    pub(super) fn retransmit_due(&mut self, now: Time, out: &mut Effects<V>) {
        let timing = self.cfg.timing;
        let mut due = Vec::new();
        for (&id, request) in &mut self.requests {
            for (&sid, slice) in &mut request.open {
                if slice.sent && slice.due <= now {
                    slice.attempts = timing.next_attempt(slice.attempts);
                    slice.due = now + self.cfg.jittered_rto(id, sid, slice.attempts);
                    slice.backed_off = false;
                    due.push((id, sid));
                }
            }
        }
        let allowance = self.transfer_allowance();
        out.retransmitted += due.len() as u64;
        for (id, sid) in due {
            self.delay_due(id, sid, allowance);
            self.send_slice(id, sid, out);
        }
        if self.progress_pending() && self.progress_due <= now {
            self.progress_attempts = timing.next_attempt(self.progress_attempts);
            // One report to each server still owed one.
            let before = out.sends.len();
            self.send_progress(now, out);
            out.retransmitted += (out.sends.len() - before) as u64;
        }
    }

    /// The transport could not send to `to`: each slice sent there counts the failure as an
    /// attempt and waits a longer timeout before it goes again, instead of being resent on
    /// the timeout of a send that never left; once per send, however many failures a burst
    /// reports, and never sooner than it was due. Slices are still resent (the peer may be
    /// back, or the coordinator may move its ranges); they are resent less often meanwhile.
    pub fn send_failed(&mut self, now: Time, to: NodeId, out: &mut Effects<V>) {
        let timing = self.cfg.timing;
        for (&id, request) in &mut self.requests {
            for (&sid, slice) in &mut request.open {
                if slice.sent && slice.server == to && !slice.backed_off {
                    slice.backed_off = true;
                    slice.attempts = timing.next_attempt(slice.attempts);
                    let later = now + self.cfg.jittered_rto(id, sid, slice.attempts);
                    slice.due = slice.due.max(later);
                }
            }
        }
        self.arm_retransmit(out);
    }

    /// Sets the retransmission timer to the earliest deadline, or cancels it.
    pub(super) fn arm_retransmit(&mut self, out: &mut Effects<V>) {
        let slices = self
            .requests
            .values()
            .flat_map(|r| r.open.values().filter(|s| s.sent).map(|s| s.due));
        let progress = self.progress_pending().then_some(self.progress_due);
        let next = slices
            .chain(progress)
            .min()
            .filter(|_| !mutated!(self, NoRetransmit));
        if next != self.retransmit_at {
            match next {
                Some(at) => out.set_timer(TimerId::Retransmit, at),
                None => out.cancel_timer(TimerId::Retransmit),
            }
            self.retransmit_at = next;
        }
    }
}
