//! The calls of one role, borrowed from a driver: only a worker's driver lends
//! [`WorkerCalls`], only a server's [`ServerCalls`], so a push to a server does not compile
//! (ARCHITECTURE.md §1).

use super::{DriverError, Io};
use crate::filter::FilterSaving;
use crate::ids::{Iteration, Time};
use crate::key::{Key, KeyRange};
use crate::kv::KvPairs;
use crate::pace::Coverage;
use crate::selection::KeySelection;
use crate::server::{CheckpointError, RangeRead, Server, StartFromError};
use crate::store::ParamStore;
use crate::updater::UpdateRule;
use crate::value::Value;
use crate::wire::{RequestId, ShardCopy};
use crate::worker::Worker;

/// A worker's calls, borrowed from its driver ([`super::Driver::worker`]). What each call
/// sends and says comes out of [`super::Driver::poll_output`].
///
/// A driver has no calls of its own for a role: a push goes through the worker's.
///
/// ```compile_fail
/// # use pserver_core::*;
/// # fn f(d: &mut Driver<f32>, kvs: KvPairs<f32>) {
/// d.push(0, kvs); // a worker's call: `d.worker()?.push(0, kvs)`
/// # }
/// ```
#[derive(Debug)]
pub struct WorkerCalls<'a, V: Value> {
    pub(super) worker: &'a mut Worker<V>,
    pub(super) io: &'a mut Io<V>,
}

impl<V: Value> WorkerCalls<'_, V> {
    /// Pushes `kvs` in the current iteration (see [`crate::node::Worker::push`]).
    pub fn push(&mut self, now: Time, kvs: KvPairs<V>) -> Result<RequestId, DriverError> {
        let w = &mut *self.worker;
        Ok(self.io.call(|out| w.push(now, kvs, out))?)
    }

    /// Pushes `kvs` as a part of the current iteration, covering `covers` of it with the parts
    /// before (see [`crate::node::Worker::push_part`]).
    pub fn push_part(
        &mut self,
        now: Time,
        kvs: KvPairs<V>,
        covers: Coverage,
    ) -> Result<RequestId, DriverError> {
        let w = &mut *self.worker;
        Ok(self.io.call(|out| w.push_part(now, kvs, covers, out))?)
    }

    /// Pulls `keys` for the current iteration (see [`crate::node::Worker::pull`]).
    pub fn pull(&mut self, now: Time, keys: KeySelection) -> Result<RequestId, DriverError> {
        let w = &mut *self.worker;
        Ok(self.io.call(|out| w.pull(now, keys, out))?)
    }

    /// Ends the current iteration (see [`crate::node::Worker::advance`]).
    pub fn advance(&mut self, now: Time) -> Result<(), DriverError> {
        let w = &mut *self.worker;
        Ok(self.io.call(|out| w.advance(now, out))?)
    }

    /// Pushes what the job's filters hold back (see [`crate::node::Worker::flush`]); `None`
    /// when they hold nothing.
    pub fn flush(&mut self, now: Time) -> Result<Option<RequestId>, DriverError> {
        let w = &mut *self.worker;
        Ok(self.io.call(|out| w.flush(now, out))?)
    }

    /// Says how fast the application works (see [`crate::node::Worker::report_speed`]).
    pub fn report_speed(&mut self, per_sec: u32) {
        self.worker.report_speed(per_sec);
    }

    /// What each of the job's filters saved so far, by name (see
    /// [`crate::node::Worker::filter_savings`]).
    pub fn filter_savings(&self) -> Vec<(&'static str, FilterSaving)> {
        self.worker.filter_savings()
    }

    /// Sets the job's stall limit for this worker ([`crate::Timing::stall_limit`]; 0: never).
    pub fn set_stall_limit(&mut self, limit: Time) {
        self.worker.set_stall_limit(limit);
    }

    /// True once the worker said [`crate::Event::Ready`]: it takes requests from then on.
    pub fn is_ready(&self) -> bool {
        self.worker.is_ready()
    }

    /// Takes the worker out of the job (see [`crate::node::Worker::leave`]).
    pub fn leave(&mut self) -> Result<(), DriverError> {
        let w = &mut *self.worker;
        Ok(self.io.call(|out| w.leave(out))?)
    }
}

/// A server's calls, borrowed from its driver ([`super::Driver::server`]). What each call
/// sends and says comes out of [`super::Driver::poll_output`].
#[derive(Debug)]
pub struct ServerCalls<'a, V: Value, U: UpdateRule<V>, S: ParamStore<V>> {
    pub(super) server: &'a mut Server<V, U, S>,
    pub(super) io: &'a mut Io<V>,
}

impl<V: Value, U: UpdateRule<V>, S: ParamStore<V>> ServerCalls<'_, V, U, S> {
    /// The server's rows of `range`, where it leads them (see [`crate::node::Server::read`]):
    /// what an embedder reads to inspect or save values without reaching into the node.
    pub fn read(&self, range: KeyRange) -> RangeRead<V> {
        self.server.read(range)
    }

    /// A copy of every shard the server holds, as of now, that later writes never reach (see [`crate::node::Server::snapshot`]): what a checkpoint writes, for an embedder that
    /// saves or inspects the server's state between checkpoints.
    pub fn snapshot(&self) -> Vec<ShardCopy<V>> {
        self.server.snapshot()
    }

    /// Starts the job from `rows`, a saved model (see [`crate::node::Server::start_from`]);
    /// before the driver is started.
    pub fn start_from<'r>(
        &mut self,
        rows: impl IntoIterator<Item = (Key, &'r [V])>,
    ) -> Result<(), StartFromError> {
        self.server.start_from(rows)
    }

    /// Offers the checkpoints the server holds whole, by cut, before it starts: a job whose
    /// servers all hold one resumes from the newest they share (see
    /// [`crate::node::Server::offer_checkpoints`], ARCHITECTURE.md §11).
    pub fn offer_checkpoints(&mut self, cuts: Vec<Iteration>) -> Result<(), CheckpointError> {
        self.server.offer_checkpoints(cuts)
    }

    /// Says that the shards of `cut` the server handed out
    /// ([`crate::events::ServerEvent::CheckpointDue`]) are written where they survive the process.
    pub fn checkpoint_written(&mut self, now: Time, cut: Iteration) -> Result<(), CheckpointError> {
        let s = &mut *self.server;
        self.io.call(|out| s.checkpoint_written(now, cut, out))
    }

    /// Hands the server the shards it wrote at `cut`, which the job resumes from
    /// ([`crate::events::ServerEvent::Restore`]); call before the next frame or timeout.
    pub fn restore(
        &mut self,
        now: Time,
        cut: Iteration,
        shards: Vec<ShardCopy<V>>,
    ) -> Result<(), CheckpointError> {
        let s = &mut *self.server;
        self.io.call(|out| s.restore(now, cut, shards, out))
    }

    /// Takes the server out of the job once its ranges are held elsewhere (see
    /// [`crate::node::Server::leave`]).
    pub fn leave(&mut self) {
        let s = &mut *self.server;
        self.io.call(|out| s.leave(out));
    }
}
