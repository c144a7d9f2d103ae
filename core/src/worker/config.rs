//! What a worker is told at start, what that makes of its slices' sizes and timeouts, and why
//! it refuses an application's call.

use thiserror::Error;

use crate::filter::Filters;
use crate::ids::{NodeId, Standbys, Time};
use crate::key::Key;
use crate::selection::KeySelection;
use crate::sizes;
use crate::slicing::Part;
use crate::slots::PushSlots;
use crate::timing::Timing;
use crate::value::Value;
use crate::wire::{RequestId, SliceId};

/// Default for [`WorkerConfig::max_slice_bytes`]: 4 MiB, well below the default frame limit.
pub const DEFAULT_MAX_SLICE_BYTES: usize = 4 << 20;

/// What a worker is told at start. Build it with [`WorkerConfig::new`] and change the fields
/// that differ from the defaults.
///
/// ```
/// use pserver_core::NodeId;
/// use pserver_core::node::WorkerConfig;
/// let mut cfg = WorkerConfig::new(NodeId(3), NodeId(0));
/// cfg.width = 8;
/// assert!(cfg.max_slice_bytes < pserver_core::wire::DEFAULT_MAX_FRAME);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// This worker.
    pub id: NodeId,
    /// The coordinator to register with.
    pub coordinator: NodeId,
    /// Standby coordinators, registered with too until a configuration names the active one
    /// (ARCHITECTURE.md §11). Default: none.
    pub standbys: Standbys,
    /// Values per key (default 1).
    pub width: usize,
    /// Timeouts and intervals.
    pub timing: Timing,
    /// Largest slice, in bytes of keys and values, that the worker puts in one message. Requests
    /// are split by owner and then by size, so that every slice (and every pull answer to a
    /// slice of keys) fits a frame. A [`Driver`](crate::Driver) lowers it to its codec's frame
    /// limit.
    pub max_slice_bytes: usize,
    /// Push slices, and separately pull slices, that the worker has on the network at once;
    /// further slices wait for earlier ones to be answered. Pushes never wait behind pulls (a
    /// pull may be held by the consistency model, a push never is).
    pub max_slices_in_flight: usize,
    /// Bytes of push slices, and separately of pull slices (keys and values, as
    /// [`WorkerConfig::max_slice_bytes`] counts them), that the worker has on the network at
    /// once; a slice beyond it waits, but one slice of each always goes, and pushes never wait
    /// behind pulls. A transport that loses what overflows a receive buffer (UDP) needs it
    /// below that buffer. Default: unbounded.
    pub max_bytes_in_flight: u64,
    /// Seed of the retransmission jitter.
    pub seed: u64,
    /// Report the worker's position with every heartbeat, for the coordinator to tell
    /// stragglers ([`crate::pace::StragglerPolicy::detect`]). Default: off.
    pub report_position: bool,
    /// Ask the slice's server for a slot before sending a large push slice
    /// ([`crate::slots::PushSlots`]). Default: none, every slice goes at once.
    pub push_slots: Option<PushSlots>,
    /// Filters this worker runs its pushes through ([`crate::filter`]). Default: none.
    pub filters: Filters,
    /// All the keys this worker will use lie below this bound, which it tells the coordinator
    /// when it registers ([`crate::JobSpec::keys_below`]). Default: none.
    pub keys_below: Option<Key>,
}

impl WorkerConfig {
    /// A worker of width 1 with default timing, slice size and window.
    pub fn new(id: NodeId, coordinator: NodeId) -> Self {
        WorkerConfig {
            id,
            coordinator,
            standbys: Standbys::default(),
            width: 1,
            timing: Timing::default(),
            max_slice_bytes: DEFAULT_MAX_SLICE_BYTES,
            max_slices_in_flight: 64,
            max_bytes_in_flight: u64::MAX,
            seed: 0,
            report_position: false,
            push_slots: None,
            filters: Filters::none(),
            keys_below: None,
        }
    }

    /// The bytes a slice moves: its rows for a push or a pull of keys, at most a message's rows
    /// for a pull of ranges (whose answer size only the server knows).
    pub(super) fn slice_bytes<V: Value>(&self, part: &Part<V>) -> u64 {
        let row = sizes::row_bytes::<V>(self.width) as u64;
        let rows = match part {
            Part::Push(kvs) => kvs.len() as u64,
            Part::Pull(KeySelection::Keys(list)) => list.keys().len() as u64,
            Part::Pull(KeySelection::Ranges(list)) => list
                .ranges()
                .iter()
                .map(|r| r.len())
                .fold(0u64, u64::saturating_add)
                .min(self.keys_per_slice::<V>() as u64),
        };
        rows.saturating_mul(row)
    }

    /// Keys per slice: as many rows as fit `max_slice_bytes`, at least one.
    pub(super) fn keys_per_slice<V: Value>(&self) -> usize {
        sizes::rows_within::<V>(self.max_slice_bytes, self.width)
    }

    /// The largest message this worker's slices (and the answers to them) need: what the frame
    /// limit must allow.
    pub fn frame_needed<V: Value>(&self) -> usize {
        sizes::message_bytes::<V>(self.keys_per_slice::<V>(), self.width)
    }

    /// The retransmission timeout of a slice after `attempts` sends, stretched by up to a
    /// quarter by a hash of the slice, so that workers that lost messages together do not
    /// retransmit in lock-step. Deterministic: the same slice and attempt always get the same
    /// timeout.
    pub(super) fn jittered_rto(&self, request: RequestId, slice: SliceId, attempts: u8) -> Time {
        let rto = self.timing.rto(attempts);
        let words = [
            u64::from(self.id.0),
            request,
            u64::from(slice),
            u64::from(attempts),
        ];
        rto + crate::hash::hash_words(self.seed, &words) % (rto / 4 + 1)
    }
}

/// Why the worker refused an application call.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WorkerError {
    /// The coordinator no longer counts this worker as a member.
    #[error("this worker was removed from the cluster (declared dead); restart it to rejoin")]
    Fenced,
    /// The worker holds no configuration yet, or is still learning which iteration a running
    /// job lets it start in: requests wait for [`crate::Event::Ready`].
    #[error("this worker is not ready: push, pull and advance once it has said it is ready")]
    NotReady,
    /// The pushed values have another width than the job's.
    #[error("pushed rows have {got} values per key, but this job uses {expected}")]
    WidthMismatch {
        /// The job's width.
        expected: usize,
        /// The pushed width.
        got: usize,
    },
    /// The worker cannot leave with changes its filters still hold: they would be lost.
    #[error(
        "the job's filters hold {rows} rows this worker has not pushed yet: flush them before it leaves"
    )]
    Unflushed {
        /// Rows held.
        rows: usize,
    },
    /// The worker waits before a checkpoint's cut ([`crate::wire::Checkpoints`]): a push now
    /// would land in the iteration the servers are writing. Push once the advance completes.
    #[error(
        "the worker waits at checkpoint {cut} for the servers to write it: push after the advance to iteration {cut} completes"
    )]
    AtCheckpoint {
        /// The iteration it waits before.
        cut: crate::ids::Iteration,
    },
}
