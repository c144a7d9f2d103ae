//! A worker's progress: how far it has come, reported to every server until each acknowledged it,
//! and, for a worker that joined a running job, which iteration to start in (ARCHITECTURE.md §8).
//!
//! A worker that joins a running job starts in the furthest iteration the servers name: it asks
//! them with `Progress` before it reports `Ready`, and they count it as having finished what every
//! other live worker had, so nobody waits for it to replay finished iterations.

use crate::cluster::Cluster;
use crate::effects::{Effects, Event, Refusal};
use crate::ids::{Epoch, Iteration, NodeId, Time};
use crate::value::Value;
use crate::wire::{Envelope, Message, RequestId};

use super::Worker;

/// How far a worker has come, as it reports it to a server and the server acknowledges it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct Reached {
    /// Every push of every iteration below this one is acknowledged (and the iteration left).
    pub(super) finished_below: Iteration,
    /// Every push of every iteration below this one is acknowledged or taken in at the epoch
    /// in force (and the iteration left).
    pub(super) taken_below: Iteration,
}

impl Reached {
    /// Whether a server that acknowledged `self` holds all of `now`. Finished progress the
    /// server holds covers taken progress as far as it goes.
    fn covers(self, now: Reached) -> bool {
        self.finished_below >= now.finished_below
            && self.finished_below.max(self.taken_below) >= now.taken_below
    }
}

impl<V: Value> Worker<V> {
    /// A server asks for this worker's progress.
    pub(super) fn on_progress_request(&mut self, now: Time, from: NodeId, out: &mut Effects<V>) {
        if !self.cluster.as_ref().is_some_and(|c| c.is_server(from)) {
            return out.refuse(from, Refusal::UnknownSender);
        }
        // A new process that never heard our progress, whatever its id acknowledged before:
        // tell it, and count nothing as acknowledged until it answers.
        let was_pending = self.progress_pending();
        self.progress_acked.remove(&from);
        let body = self.progress_message();
        self.send(from, body, out);
        if !was_pending {
            // The deadline of progress acknowledged long ago is in the past.
            self.progress_attempts = 0;
            self.progress_due = self.progress_deadline(now);
        }
        self.arm_retransmit(out);
    }

    /// A server acknowledges the progress it holds of this worker, at `epoch`.
    pub(super) fn on_progress_ack(
        &mut self,
        now: Time,
        from: NodeId,
        epoch: Epoch,
        acked: Reached,
        out: &mut Effects<V>,
    ) {
        let current = epoch == self.epoch();
        let known = self.progress_acked.entry(from).or_default();
        known.finished_below = known.finished_below.max(acked.finished_below);
        // Taken progress counts at one epoch: an acknowledgement from an earlier one says
        // nothing of what the server holds now. Kept only where it runs ahead of finished
        // progress.
        if current && acked.taken_below > known.finished_below {
            known.taken_below = known.taken_below.max(acked.taken_below);
        }
        if self.learning_start {
            self.start_when_learned(now, out);
        }
        if !self.progress_pending() {
            self.progress_attempts = 0;
        }
        self.arm_retransmit(out);
    }

    /// A server joining, or back on the ring, may be a new process that never heard this
    /// worker's progress, whatever an earlier process of the same id acknowledged: what it
    /// acknowledged is forgotten.
    pub(super) fn forget_progress_of_new_servers(&mut self, next: &Cluster) {
        let old_servers: Vec<NodeId> = self
            .cluster
            .as_ref()
            .map(|c| c.servers().to_vec())
            .unwrap_or_default();
        for s in next.config.servers.iter().chain(&next.config.joining) {
            if next.config.joining.contains(s) || !old_servers.contains(s) {
                self.progress_acked.remove(s);
            }
        }
    }

    /// Servers count taken progress at one epoch only: what they acknowledged at an earlier
    /// one is told again.
    pub(super) fn forget_taken_progress(&mut self) {
        for acked in self.progress_acked.values_mut() {
            acked.taken_below = 0;
        }
    }

    /// Once every server answered a late joiner's progress, enters the furthest iteration they
    /// named (each server counts the joiner as having finished what every other worker had)
    /// and tells the application it is ready.
    pub(super) fn start_when_learned(&mut self, now: Time, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let answers: Option<Vec<Iteration>> = cluster
            .servers()
            .iter()
            .map(|s| self.progress_acked.get(s).map(|a| a.finished_below))
            .collect();
        let Some(start) = answers.and_then(|a| a.into_iter().max()) else {
            return;
        };
        // The others wait before a cut whose checkpoint is being written: starting in it would
        // push into it. The configuration that records it starts this worker.
        if cluster.config.checkpoints.waits_before(start) {
            return;
        }
        self.learning_start = false;
        if self.requests.is_empty() && self.unfinished.is_empty() {
            self.iteration = self.iteration.max(start);
        }
        out.emit(Event::Ready {
            epoch: self.epoch(),
        });
        if self.progress_pending() {
            self.progress_attempts = 0;
            self.send_progress(now, out);
            self.arm_retransmit(out);
        }
    }

    /// Progress moved: the servers hear it, and the worker may enter iterations it waited for.
    pub(super) fn on_progress(&mut self, now: Time, out: &mut Effects<V>) {
        if self.progress_pending() {
            self.progress_attempts = 0;
            self.send_progress(now, out);
        }
        self.try_advance(now, out);
    }

    /// Some server has not acknowledged this worker's progress.
    pub(super) fn progress_pending(&self) -> bool {
        let Some(cluster) = &self.cluster else {
            return false;
        };
        let reached = self.reached();
        cluster
            .servers()
            .iter()
            .any(|&s| self.progress_owed(s, reached))
    }

    /// How far this worker has come.
    fn reached(&self) -> Reached {
        Reached {
            finished_below: self.durable_below(),
            taken_below: self.taken_below(),
        }
    }

    /// Every push of every iteration below this one is acknowledged (and it was left).
    fn durable_below(&self) -> Iteration {
        let left = self.left_below();
        self.requests
            .values()
            .filter(|r| r.is_push())
            .map(|r| r.iteration)
            .min()
            .map_or(left, |i| i.min(left))
    }

    /// Every push of every iteration below this one is acknowledged or taken in, at this
    /// epoch, by the server its slices are addressed to, the primary of their keys (and it
    /// was left).
    fn taken_below(&self) -> Iteration {
        let epoch = self.epoch();
        let left = self.left_below();
        self.requests
            .values()
            .filter(|r| r.is_push() && (r.whole.is_some() || !r.all_taken_at(epoch)))
            .map(|r| r.iteration)
            .min()
            .map_or(left, |i| i.min(left))
    }

    fn progress_message(&self) -> Message<V> {
        let reached = self.reached();
        Message::Progress {
            finished_below: reached.finished_below,
            taken_below: reached.taken_below,
        }
    }

    /// Whether `server` has not acknowledged this worker's progress yet: it is ahead of what
    /// the server acknowledged, or, while learning where to start, anything at all.
    fn progress_owed(&self, server: NodeId, reached: Reached) -> bool {
        match self.progress_acked.get(&server) {
            None if self.learning_start => true,
            acked => !acked.copied().unwrap_or_default().covers(reached),
        }
    }

    /// When progress sent now is next retransmitted.
    fn progress_deadline(&self, now: Time) -> Time {
        let attempts = self.progress_attempts;
        let below = self.finished_below_at(self.iteration);
        now + self.cfg.jittered_rto(RequestId::MAX, below, attempts)
    }

    /// Tells every server that has not acknowledged it how far this worker has come.
    pub(super) fn send_progress(&mut self, now: Time, out: &mut Effects<V>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let reached = self.reached();
        for &server in cluster.servers() {
            if self.progress_owed(server, reached) {
                let body = self.progress_message();
                out.send(Envelope::new(self.cfg.id, server, cluster.epoch(), body));
            }
        }
        self.progress_due = self.progress_deadline(now);
    }
}
