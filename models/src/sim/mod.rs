//! A deterministic simulator: a whole cluster — coordinator, servers and workers running a
//! scripted workload — on virtual time, with faults drawn from one seed.
//!
//! The simulator drives the very structs a deployment runs ([`pserver_core::node::Coordinator`],
//! [`pserver_core::node::Server`], [`pserver_core::node::Worker`]), each through the [`pserver_core::Driver`] every deployment
//! uses, passes every message through the wire codec, and checks the protocol's invariants after
//! every step:
//!
//! - **staleness**: a pull issued in iteration `c` sees every push of every live worker for the
//!   iterations below `c - tau`, on every key it asked for (a key a range answer leaves out
//!   reads as 0);
//! - **pull complete**: a pull is answered exactly the keys of its key list, or only keys of
//!   its ranges, and completes once;
//! - **exactly-once**: every key's total on its primary in the ring in force (the coordinator's
//!   current configuration, which changes when a crashed server is removed) lies between the
//!   sum of the acknowledged pushes and the sum of the issued ones, and at the end equals
//!   exactly the sum of the pushes of the workers that did not crash;
//! - **durability** (with replicas): for every key some acknowledged push wrote, some live
//!   server (one whose process has not crashed) holds a shard containing the key, and with
//!   [`SimUpdater::Sum`] the largest `received_total` among those live holders is at least the
//!   sum of the acknowledged pushes of the key: no acknowledged push is lost while at most
//!   `k` servers crashed;
//! - **single-owner**: live servers are grouped by the epoch they are on, and within one epoch
//!   at most one of them holds a primary shard containing a key; at quiescence (see below)
//!   exactly one live server does, the primary the coordinator's ring names;
//! - **replica-convergence** (with replicas, at quiescence): every live replica of every key
//!   holds, bit for bit, its primary's value and `received_total`;
//! - **in-flight bound**: no worker has more than `tau + 1` iterations in flight;
//! - **completion**: at the end every request of every surviving worker has completed;
//! - **oracle**: every server's stored value of every key equals, bit for bit, what a one-node
//!   replica computes by replaying the pushes that server acknowledged through the same
//!   [`pserver_core::Updater`];
//! - **slot-limit**, **tau-range**, **share-bounds** and **share-move**: the straggler and
//!   slot policies judged directly, since servers and workers follow whatever a policy decides
//!   and a wrong decision keeps every invariant above: no server holds more push slots granted
//!   than `at_once`, every configuration's adaptive tau lies within its range, shares moved by
//!   speed stay within their bounds and go only to a worker that would be quicker with them
//!   (the module `world::policies` says exactly what is promised).
//!
//! # Update rules and the oracle
//!
//! A run picks its update rule from the seed ([`SimUpdater`]), unless [`SimConfig::updater`]
//! fixes one. Values are `f64` and every pushed delta is a small integer, so that sums stay
//! exact (an `f64` holds every integer below 2^53 exactly): the ledger of what the workers
//! pushed keeps integer totals, and with [`SimUpdater::Sum`] the servers' totals are compared
//! with it exactly. With the other rules a stored value is no longer a sum, so the ledger's
//! checks are judged against the oracle instead:
//!
//! - The oracle learns what a server took in from what the server *said*, not from its
//!   internals: the first `PushAck` a server sends for a push slice `(worker, request, slice)`
//!   is the moment it accepted that slice, and the slice's content is the push frame the
//!   worker sent it. A duplicate is acknowledged again but never applied again, so later acks
//!   of the same slice are ignored; a server that applies a duplicate, loses an acknowledged
//!   push or applies one it never acknowledged disagrees with the oracle.
//! - Under [`Consistency::Sequential`] a server buffers the pushes of an iteration and applies
//!   one key-wise sum over them once every live worker finished it. The oracle buffers the
//!   accepted pushes per iteration in the order they were acknowledged, and when the server's
//!   [`pserver_core::node::Server::applied_below`] moves past an iteration it sums them key by key in that
//!   order (the order in which the server's `sum_by_key` adds them) and applies each sum once.
//!   Other models apply every accepted push at once, in acknowledgement order.
//! - Exactly-once totals are then the oracle's sums of accepted deltas, and a pulled value
//!   must be one the key's server held while the sum applied to it met the staleness bound
//!   (a value the server never held is an oracle failure).
//!
//! # Ring changes
//!
//! In some runs (or always, with [`SimConfig::ring_change`]) the job starts with its ring
//! already changed: one server's ranges were moved away with
//! [`pserver_core::wire::ClusterConfig::without_server`] (epoch 2), the coordinator and every server start
//! on epoch 2, and each worker starts on epoch 1 or 2 (at least one on epoch 1), with no
//! registration. Workers on epoch 1 send to the old owners, are answered `Redirect`, fetch the
//! configuration and re-slice; every invariant is judged against the ring of epoch 2, and
//! [`SimReport::redirects`] counts the redirects the workers followed.
//!
//! # Replicas and server faults
//!
//! With `ring.replicas = k > 0` every key range has a primary and `k` replicas
//! (ARCHITECTURE.md §8), and with [`SimConfig::crash_servers`] up to `k` servers crash. The
//! fault model is **at most `k` server crashes, not faster than recovery**: the first crash
//! comes at a seeded time, each later one only once the cluster has recovered from the one
//! before and refilled its replicas (every range served, every member on the epoch in force
//! with no push waiting for its replicas, every owner holding its ranges, every replica equal
//! to its primary). The exceptions are deliberate, and kept where durability does not depend
//! on the spacing: a later crash may be planned to hit the server a range copy (`Transfer`)
//! was just sent to, while the copy is in flight (that server holds nothing an
//! acknowledgement depends on yet); and with two replicas or more, the server that sent a copy
//! right after a replica installed it (every acknowledged push is still on the replicas that
//! held the range before, and the pushes waiting for the copy are not acknowledged yet: their
//! resends meet a copy's de-duplication state). A crashed server stops receiving, sending
//! and firing timers, and what it sent that is still on the network is lost with it. The seed
//! picks each crash's kind (counted in [`SimReport::server_faults`]):
//!
//! - a crash for good;
//! - (with [`SimConfig::join_servers`] and [`SimConfig::leave_servers`]) servers joining and
//!   leaving the running job at seeded times, through the coordinator's two-step change;
//! - a crash and a restart: once the coordinator declared the server dead, a fresh
//!   [`pserver_core::node::Server`] with a new incarnation starts and registers, and joins the job again
//!   (it copies the ranges the ring gives it, then the ring switches). With
//!   [`SimConfig::quick_restart`] it restarts within the heartbeat timeout instead, still a
//!   member: its registration under a new incarnation takes it off the ring first;
//! - (second crash onwards) a crash of the server a copy was just sent to;
//! - (second crash onwards, two replicas or more) a crash of a copy's sender as soon as the
//!   copy is installed.
//!
//! With replicas, `--partition` also (by the seed) cuts one server off from every other server
//! for up to 1.5 s while it still reaches the coordinator and the workers (a primary cut off
//! from its replicas; half the time the first crash then hits it while it is cut off), makes
//! one server flap (isolated and healed three to six times, briefly each time), or both. The
//! server faults draw from a stream of their own, so runs without replicas draw exactly what
//! they drew before.
//!
//! A run with replicas or server crashes does not end when its workers finish but once the
//! cluster is quiescent: every crash recovered from, every restart carried out, every replica
//! equal to its primary. Replica convergence and single ownership are then checked in full;
//! a cluster that never gets there fails on the time limit (as `replica-convergence` when only
//! the replicas disagree). [`SimReport::recoveries`] holds, per crash, the virtual time until
//! every range was served again: no crashed server left in the coordinator's ring, and every
//! range's primary there on the new epoch and holding the range as primary.
//!
//! ## Membership under stress
//!
//! With [`SimConfig::membership_stress`] the membership changes of a run pile up, as on a bad
//! day of a real cluster:
//!
//! - the planned joins, leaves and the first crash all come within a quarter of a fault-free
//!   run's length of one seeded moment, and a server asks to leave whether or not a change is
//!   under way: a server joins while another leaves, or while a crash is still being
//!   recovered from;
//! - every membership message (`Register`, `Config`, `ConfigRequest`, `CaughtUp`, `Leave`,
//!   `Transfer`, `TransferAck`, `Lost`) takes up to 800 ms more and may overtake the ones
//!   sent before it, so that acknowledgements of an earlier plan arrive after a later one
//!   started and configurations arrive out of order;
//! - what a crashed server sent that is still on the network is not lost with it but
//!   arrives up to 3 s late, after a restart, and what was sent to it may reach its next
//!   process: an earlier incarnation's messages and the configurations addressed to it
//!   arrive late.
//!
//! Every invariant is checked as in any other run.
//!
//! ## Coordinator faults
//!
//! With [`SimConfig::coordinator_faults`] the job has a standby coordinator, which the active
//! one takes as its standby soon after the start (ARCHITECTURE.md §11). A crash kills the
//! active coordinator's process at a seeded time once the standby holds its state, and
//! starts it again three seconds later as a fresh standby, which the coordinator that took
//! over takes in turn; a partition cuts the active coordinator off from every node for 0.5 to
//! 5 s, so that the standby takes over in some runs and not in others, and a coordinator taken
//! over from comes back to find a newer term. Both mix with every other fault. After every
//! step `single-coordinator` is checked: no two configurations of the same epoch, held by any
//! node or sent by any coordinator, and no coordinator's term and no member's epoch going
//! back. [`SimReport::takeovers`] lists how long each takeover took, from the fault to the
//! new coordinator's first configuration.
//!
//! ## What the oracle can still judge
//!
//! The oracle follows one server's acknowledgements, in order. With replicas a primary
//! acknowledges a push only once its replicas have it, so acknowledgement order is no longer
//! the order pushes were applied in across shards, and after a fail-over a range's values move
//! to another server: the oracle cannot follow. So:
//!
//! - without replicas every check is as before, the oracle included;
//! - with replicas and [`SimUpdater::Sum`] stored values are sums, and exactly-once,
//!   durability and staleness are judged exactly against the ledger;
//! - with replicas and another rule the oracle is left out, and exactly-once and staleness
//!   (which need to know which sum a value stands for) are not judged; the rule is checked by
//!   replica convergence (replicas reproduce the primary's update rule and state bit for bit,
//!   across copies and promotions), and durability checks that some live server still holds
//!   every key an acknowledged push wrote. Pull completeness, the in-flight bound, completion
//!   and single ownership hold for every rule.
//!
//! # Receive queues
//!
//! With [`SimConfig::receive_rate`] every server works through the bytes that reach it at
//! that rate, one message after another in the order they arrived: a message is handled once
//! the server has worked through it and everything that arrived before it. What has arrived
//! and is not handled yet is the server's receive queue, and [`SimReport::peak_receive_queue_bytes`]
//! is the largest any server's grew. Workers that finish an iteration together push
//! together, and their pushes queue up at the servers; round-robin push slots
//! ([`SimConfig::push_slots`]) let the servers take them in turn.
//!
//! A run is a pure function of its [`SimConfig`]: a failing seed replays exactly, and the
//! failure says how ([`SimConfig::replay_command`]).

mod ledger;
#[cfg(feature = "mutations")]
mod mutation;
mod network;
mod oracle;
mod rng;
mod rule;
mod world;

#[cfg(feature = "mutations")]
pub use mutation::SimMutation;
pub use network::Faults;
pub use rng::SimRng;
pub use world::run;
#[cfg(feature = "mutations")]
pub use world::run_mutated;

use core::fmt;

use pserver_core::Consistency;
use pserver_core::Updater;
use pserver_core::filter::Filters;
use pserver_core::node::NodeLayout;
use pserver_core::pace::StragglerPolicy;
use pserver_core::ring::RingConfig;
use pserver_core::slots::PushSlots;
use pserver_core::{JobSpec, NodeId, Time};

/// One millisecond of virtual time.
pub const MS: Time = 1_000_000;

/// The standby coordinator's id in runs with coordinator faults.
const STANDBY_ID: u32 = 1_000_000;

/// Everything a simulation run depends on.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Seed of every random choice: faults, keys, values, timings.
    pub seed: u64,
    /// Number of servers.
    pub servers: usize,
    /// Number of workers.
    pub workers: usize,
    /// Size of the key space (keys are spread evenly over the ring).
    pub keys: u64,
    /// Iterations each worker runs.
    pub iterations: u32,
    /// The job's consistency model.
    pub consistency: Consistency,
    /// Faults to inject.
    pub faults: Faults,
    /// Each iteration one worker, chosen at random, computes this many times slower (1 = none).
    pub straggler: f64,
    /// The slow worker ([`SimConfig::slow_index`]) always computes this many times slower (a
    /// slow machine; 1 = none).
    pub slow_worker: f64,
    /// The slow worker computes this many times slower from the middle of the run on (a
    /// machine that slows down mid-job; 1 = none).
    pub slows_down: f64,
    /// Which worker is slow ([`SimConfig::slow_worker`], [`SimConfig::slows_down`]), from 0 in
    /// node order.
    pub slow_index: usize,
    /// How the job deals with stragglers (ARCHITECTURE.md §9). With detection on, nodes beat
    /// every `compute` (at least 1 ms), so that the coordinator checks at the pace of
    /// iterations.
    pub stragglers: StragglerPolicy,
    /// Each iteration's compute is cut into this many parts, each pushed as it is done with
    /// how much of the iteration it covers (`Worker::push_part`); 1: one push per iteration.
    pub parts: u32,
    /// One-way network latency.
    pub latency: Time,
    /// Compute time of one iteration on a worker that is not straggling.
    pub compute: Time,
    /// Pass every message through the wire codec.
    pub wire: bool,
    /// Virtual time after which an unfinished run fails.
    pub time_limit: Time,
    /// Ring shape.
    pub ring: RingConfig,
    /// The servers' update rule; `None` lets the seed pick one.
    pub updater: Option<SimUpdater>,
    /// Start with the ring already changed (see the module docs); `None` lets the seed decide.
    pub ring_change: Option<bool>,
    /// Servers that crash during the run, one after another, each once the cluster has
    /// recovered from the previous one (see "Server faults" in the module docs). At most
    /// `ring.replicas`, and the servers left must still hold a primary and every replica.
    pub crash_servers: usize,
    /// Servers that join the job while it runs (new processes with ids after the workers'),
    /// each at a seeded time.
    pub join_servers: usize,
    /// Servers of the job that ask to leave it while it runs, each at a seeded time.
    pub leave_servers: usize,
    /// Restart crashed servers (those the seed picks to restart) within the heartbeat timeout,
    /// before the coordinator declares them dead, instead of after: the new process, still a
    /// member, registers under a new incarnation, is taken off the ring and joins again.
    pub quick_restart: bool,
    /// Membership under stress (see "Membership under stress" in the module docs): joins,
    /// leaves and the first crash come close together, so that changes overlap; membership
    /// messages are delayed and reordered; and a crashed server's messages still on the
    /// network arrive late, after its restart.
    pub membership_stress: bool,
    /// Round-robin push slots for the job (ARCHITECTURE.md §9); `None`: every push slice
    /// goes at once.
    pub push_slots: Option<PushSlots>,
    /// The filters every worker runs its pushes through (ARCHITECTURE.md §10). Each worker
    /// flushes what they hold with its last iteration, and at the end of a run what each
    /// surviving worker's requests carried must sum to what its application computed.
    pub filters: Filters,
    /// How fast each server works through the bytes that reach it, in bytes per millisecond
    /// of virtual time (see "Receive queues" in the module docs); `None`: a message is handled
    /// the moment it arrives, as in every run before receive queues, and
    /// [`SimReport::peak_receive_queue_bytes`] stays 0.
    pub receive_rate: Option<u64>,
    /// How the keys are laid out; `None` lets the seed pick.
    pub key_layout: Option<KeyLayout>,
    /// Coordinator faults (see "Coordinator faults" in the module docs); any of them gives the
    /// job a standby coordinator.
    pub coordinator_faults: CoordinatorFaults,
}

/// What befalls the coordinators ([`SimConfig::coordinator_faults`]). Any of them gives the job
/// a standby coordinator ([`SimConfig::standby_id`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CoordinatorFaults {
    /// The active coordinator's process dies at a seeded time once the standby holds its
    /// state, and starts again a few seconds later as a fresh standby.
    pub crash: bool,
    /// The active coordinator is cut off from every node for a seeded while (0.5 to 5 s,
    /// around the heartbeat timeout), then healed: a standby may take over, or not.
    pub partition: bool,
}

impl CoordinatorFaults {
    /// True when any is on.
    pub fn any(&self) -> bool {
        self.crash || self.partition
    }
}

/// Where a run's keys sit in the key space ([`SimConfig::key_layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyLayout {
    /// Spread evenly over the key space: every gap between keys takes a long varint.
    Even,
    /// At the key space's edges, from 0 up and from the largest legal key down, with gaps
    /// that cross varint lengths (127, 128, 16383, 16384): short key lists.
    Edges,
    /// On both sides of the ring's segment boundaries, the rest spread evenly.
    Boundaries,
}

impl fmt::Display for KeyLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyLayout::Even => "even",
            KeyLayout::Edges => "edges",
            KeyLayout::Boundaries => "boundaries",
        })
    }
}

impl core::str::FromStr for KeyLayout {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [KeyLayout::Even, KeyLayout::Edges, KeyLayout::Boundaries]
            .into_iter()
            .find(|l| l.to_string() == s)
            .ok_or_else(|| format!("unknown key layout `{s}`: expected even, edges or boundaries"))
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0,
            servers: 2,
            workers: 3,
            keys: 16,
            iterations: 4,
            consistency: Consistency::Sequential,
            faults: Faults::default(),
            straggler: 1.0,
            slow_worker: 1.0,
            slow_index: 0,
            slows_down: 1.0,
            stragglers: StragglerPolicy::default(),
            parts: 1,
            latency: MS,
            compute: 10 * MS,
            wire: true,
            time_limit: 600_000 * MS,
            ring: RingConfig {
                vnodes: 16,
                replicas: 0,
                seed: 0,
                ..RingConfig::default()
            },
            updater: None,
            ring_change: None,
            crash_servers: 0,
            join_servers: 0,
            leave_servers: 0,
            quick_restart: false,
            membership_stress: false,
            push_slots: None,
            filters: Filters::none(),
            receive_rate: None,
            key_layout: None,
            coordinator_faults: CoordinatorFaults::default(),
        }
    }
}

impl SimConfig {
    /// Four workers that push large pushes together, the workload round-robin push slots
    /// are for (ARCHITECTURE.md §9): sequential consistency, so that every iteration ends
    /// with every worker pushing at once; 8,000 keys at the key space's edges, so that each
    /// push carries some 2,000 rows to each of two servers while a pull's key list is a
    /// fraction of that; servers that take 10 MB a second, so that one worker's push takes
    /// each server about a fifth of an iteration's compute (20 ms) and four of them queue up;
    /// and 100 µs between nodes. No slots: set [`SimConfig::push_slots`] to compare.
    pub fn pushing_together(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            servers: 2,
            workers: 4,
            keys: 8_000,
            iterations: 6,
            consistency: Consistency::Sequential,
            compute: 20 * MS,
            latency: MS / 10,
            receive_rate: Some(10_000),
            key_layout: Some(KeyLayout::Edges),
            ring_change: Some(false),
            ..SimConfig::default()
        }
    }

    /// The `pserver sim` command that runs exactly this configuration.
    pub fn replay_command(&self) -> String {
        let mut cmd = format!(
            "pserver sim seeds --seeds 1 --first-seed {} --servers {} --workers {} --keys {} --iterations {} --consistency {}",
            self.seed, self.servers, self.workers, self.keys, self.iterations, self.consistency
        );
        let f = &self.faults;
        if f.drop > 0.0 {
            cmd += &format!(" --drop {}", f.drop);
        }
        if f.dup > 0.0 {
            cmd += &format!(" --dup {}", f.dup);
        }
        if f.reorder {
            cmd += " --reorder";
        }
        if f.partition {
            cmd += " --partition";
        }
        if f.crash {
            cmd += " --crash";
        }
        if self.straggler != 1.0 {
            cmd += &format!(" --straggler {}", self.straggler);
        }
        if self.slow_worker != 1.0 {
            cmd += &format!(" --slow-worker {}:{}", self.slow_index, self.slow_worker);
        } else if self.slow_index != 0 && self.slows_down != 1.0 {
            cmd += &format!(" --slow-worker {}:1", self.slow_index);
        }
        if self.slows_down != 1.0 {
            cmd += &format!(" --slows-down {}", self.slows_down);
        }
        if let Some(detect) = self.stragglers.detect {
            cmd += &format!(" --detect-lag {}", detect.lag);
        }
        if self.stragglers.skip_ahead {
            cmd += " --skip-ahead";
        }
        if let Some(range) = self.stragglers.adaptive_tau {
            cmd += &format!(" --adaptive-tau {}:{}", range.min, range.max);
        }
        if let Some(balance) = self.stragglers.balance {
            cmd += &format!(" --shares {}", balance.per_worker);
        }
        if self.parts != 1 {
            cmd += &format!(" --parts {}", self.parts);
        }
        if !self.wire {
            cmd += " --no-wire";
        }
        if self.time_limit != SimConfig::default().time_limit {
            cmd += &format!(" --time-limit-ms {}", self.time_limit / MS);
        }
        if let Some(updater) = self.updater {
            cmd += &format!(" --updater {updater}");
        }
        match self.ring_change {
            Some(true) => cmd += " --ring-change",
            Some(false) => cmd += " --no-ring-change",
            None => {}
        }
        if self.ring.replicas > 0 {
            cmd += &format!(" --replicas {}", self.ring.replicas);
        }
        if self.join_servers > 0 {
            cmd += &format!(" --join-servers {}", self.join_servers);
        }
        if self.leave_servers > 0 {
            cmd += &format!(" --leave-servers {}", self.leave_servers);
        }
        if self.crash_servers > 0 {
            cmd += &format!(" --crash-servers {}", self.crash_servers);
        }
        if self.quick_restart {
            cmd += " --quick-restart";
        }
        if self.membership_stress {
            cmd += " --membership-stress";
        }
        if self.coordinator_faults.crash {
            cmd += " --crash-coordinator";
        }
        if self.coordinator_faults.partition {
            cmd += " --partition-coordinator";
        }
        if let Some(slots) = self.push_slots {
            cmd += &format!(" --push-slots {}:{}", slots.min_bytes, slots.at_once);
        }
        if let Some(theta) = self.filters.significantly_modified {
            cmd += &format!(" --sigmod {}", theta.get());
        }
        if let Some(caching) = self.filters.key_caching {
            cmd += &format!(" --key-cache {}", caching.lists());
        }
        if self.filters.compression {
            cmd += " --compress";
        }
        if let Some(kkt) = self.filters.kkt {
            cmd += &format!(" --kkt {} --kkt-bound {}", kkt.every(), kkt.bound().get());
        }
        if let Some(rate) = self.receive_rate {
            cmd += &format!(" --receive-rate {rate}");
        }
        if let Some(layout) = self.key_layout {
            cmd += &format!(" --key-layout {layout}");
        }
        if self.compute != SimConfig::default().compute {
            cmd += &format!(" --compute-ms {}", self.compute / MS);
        }
        if self.latency != SimConfig::default().latency {
            cmd += &format!(" --latency-us {}", self.latency / (MS / 1000));
        }
        cmd
    }

    /// Checks that the run's shape is one the fault model covers: fewer replicas than
    /// servers and at most `replicas` server crashes (which may leave too few servers for the
    /// replicas: the job goes on with fewer), and, where servers leave or the ring changes,
    /// enough servers left after all of it to hold a primary and every replica of each range.
    ///
    /// ```
    /// use pserver_models::sim::SimConfig;
    /// let mut cfg = SimConfig { servers: 3, crash_servers: 1, ..SimConfig::default() };
    /// assert!(cfg.validate().is_err(), "no replica to fail over to");
    /// cfg.ring.replicas = 1;
    /// assert!(cfg.validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        let replicas = self.ring.replicas as usize;
        if self.servers == 0 {
            return Err("a run needs at least one server".into());
        }
        if self.slow_index >= self.workers {
            return Err(format!(
                "--slow-worker {}:F names a worker past the last of --workers {} (they count from 0)",
                self.slow_index, self.workers
            ));
        }
        if replicas >= self.servers {
            return Err(format!(
                "--replicas {replicas} needs more than {replicas} servers (--servers {}): every range has a primary and {replicas} replicas on distinct servers",
                self.servers
            ));
        }
        if self.crash_servers > replicas {
            return Err(format!(
                "--crash-servers {} exceeds --replicas {replicas}: acknowledged pushes survive at most as many crashed servers as there are replicas",
                self.crash_servers
            ));
        }
        let taken_off = usize::from(self.ring_change == Some(true));
        // Crashed servers may leave fewer than the replicas, and the job goes on with as many
        // as the servers left hold (`Ring::surviving`); leaving servers and a ring change are
        // only run where the ring holds every replica after them.
        let kept = if self.leave_servers + taken_off > 0 {
            replicas + 1 + self.crash_servers + self.leave_servers + taken_off
        } else {
            1 + self.crash_servers
        };
        if self.servers < kept {
            return Err(format!(
                "--servers {} is too few for --replicas {replicas} with {} server crashes and {} leaving{}: the servers left must hold a primary and {replicas} replicas of every range",
                self.servers,
                self.crash_servers,
                self.leave_servers,
                if taken_off > 0 {
                    " after a ring change"
                } else {
                    ""
                }
            ));
        }
        // The job's own checks last: the ones above name the simulator's options.
        self.job().validate::<f64>().map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The server whose ranges this run moved away before it started (see the module docs),
    /// picked by the seed; `None` without a ring change.
    pub fn server_taken_off(&self) -> Option<NodeId> {
        if !self.resolved_ring_change() {
            return None;
        }
        let pick = pserver_core::testing::hash_words(self.seed, &[0x4d4f_5645])
            % self.servers.max(1) as u64;
        self.server_ids().nth(pick as usize)
    }

    /// The ring in force while the run goes on: every server's, or, after a ring change, that
    /// of the servers left. Every invariant is judged against it, and the keys are laid out
    /// around its segment boundaries.
    pub fn ring_in_force(&self) -> Result<pserver_core::ring::Ring, pserver_core::ring::RingError> {
        let gone = self.server_taken_off();
        pserver_core::ring::Ring::new(self.server_ids().filter(|&s| Some(s) != gone), self.ring)
    }

    /// The update rule of this run: [`SimConfig::updater`], or one picked by the seed.
    pub fn resolved_updater(&self) -> SimUpdater {
        self.updater.unwrap_or_else(|| {
            let pick = pserver_core::testing::hash_words(self.seed, &[0x5550_4441]) % 4;
            SimUpdater::ALL[pick as usize]
        })
    }

    /// Whether this run starts with its ring changed: [`SimConfig::ring_change`], or, in one
    /// run of four with a server to spare (at least two servers, and with replicas or server
    /// crashes enough left after taking one off), by the seed.
    pub fn resolved_ring_change(&self) -> bool {
        self.ring_change.unwrap_or_else(|| {
            let spare = self.ring.replicas as usize + self.crash_servers + self.leave_servers + 1;
            self.servers > spare
                && pserver_core::testing::hash_words(self.seed, &[0x5249_4e47]) % 4 == 0
        })
    }

    /// How the run numbers its nodes.
    pub fn layout(&self) -> NodeLayout {
        NodeLayout {
            servers: self.servers,
            workers: self.workers,
        }
    }

    /// Node id of the coordinator.
    pub fn coordinator_id(&self) -> NodeId {
        self.layout().coordinator()
    }

    /// The job every node of the run is built from. Its message sizes come from the seed:
    /// some runs cut requests and range answers into small parts and keep only one or three
    /// slices on the network, so that splitting, resumed answers and waiting for room in the
    /// window are all exercised.
    pub fn job(&self) -> JobSpec {
        let mut job = JobSpec::new(self.servers, self.workers);
        job.consistency = self.consistency;
        job.ring = self.ring;
        job.updater = self.resolved_updater().rule();
        job.seed = self.seed;
        // Slices of a fixed share of the keys, so that a request is cut into a handful of
        // parts whatever the key count (finer cuts only slow the run down).
        let rows = |share: u64, least: u64| 128 + 18 * (self.keys / share).max(least) as usize;
        let (slice_bytes, window) =
            match pserver_core::testing::hash_words(self.seed, &[0x51ce]) % 3 {
                0 => (pserver_core::node::DEFAULT_MAX_SLICE_BYTES, 64),
                1 => (rows(8, 2), 1),
                _ => (rows(3, 5), 3),
            };
        job.max_slice_bytes = slice_bytes;
        job.max_reply_bytes = slice_bytes;
        job.max_slices_in_flight = window;
        job.stragglers = self.stragglers;
        if let Some(standby) = self.standby_id() {
            job.standbys = pserver_core::node::Standbys::new(&[standby]).unwrap_or_default();
        }
        job.push_slots = self.push_slots;
        job.filters = self.filters;
        if self.stragglers.detect.is_some() {
            job.timing.heartbeat_interval = self.compute.max(MS);
        }
        job
    }

    /// The standby coordinator, where the run has one: an id far past every node's (servers
    /// that join take the ids after the workers').
    pub fn standby_id(&self) -> Option<NodeId> {
        self.coordinator_faults.any().then_some(NodeId(STANDBY_ID))
    }

    /// Node ids of the servers.
    pub fn server_ids(&self) -> impl Iterator<Item = NodeId> {
        self.layout().servers()
    }

    /// Node ids of the workers.
    pub fn worker_ids(&self) -> impl Iterator<Item = NodeId> {
        self.layout().workers()
    }

    /// How this run lays out its keys: [`SimConfig::key_layout`], or one picked by the seed.
    pub fn resolved_key_layout(&self) -> KeyLayout {
        self.key_layout.unwrap_or_else(|| {
            match pserver_core::testing::hash_words(self.seed, &[0x4b45_5953]) % 3 {
                0 => KeyLayout::Even,
                1 => KeyLayout::Edges,
                _ => KeyLayout::Boundaries,
            }
        })
    }

    /// The keys of a run, `keys` of them in increasing order, laid out as
    /// [`SimConfig::resolved_key_layout`] says (see [`KeyLayout`]).
    pub fn key_layout(&self, ring: &pserver_core::ring::Ring) -> Vec<u64> {
        use std::collections::BTreeSet;
        let n = self.keys as usize;
        let stride = (u64::MAX - 1) / self.keys.max(1);
        let even = (0..self.keys).map(|i| i * stride);
        let mut keys: BTreeSet<u64> = BTreeSet::new();
        match self.resolved_key_layout() {
            KeyLayout::Even => {}
            KeyLayout::Edges => {
                const GAPS: [u64; 5] = [127, 128, 16_383, 16_384, 1];
                let (mut low, mut high) = (0u64, pserver_core::MAX_KEY);
                for i in 0..n {
                    let gap = GAPS[(i / 2) % GAPS.len()];
                    if i % 2 == 0 {
                        keys.insert(low);
                        low += gap;
                    } else {
                        keys.insert(high);
                        high -= gap;
                    }
                }
            }
            KeyLayout::Boundaries => {
                for (range, _) in ring.segments() {
                    if keys.len() >= n {
                        break;
                    }
                    let start = range.start();
                    if start > 0 {
                        keys.insert(start - 1);
                    }
                    keys.insert(start);
                }
            }
        }
        for k in even {
            if keys.len() >= n {
                break;
            }
            keys.insert(k);
        }
        // Where the layouts overlapped, fill up with small odd keys.
        let mut k = 1;
        while keys.len() < n {
            keys.insert(k);
            k += 2;
        }
        keys.into_iter().take(n).collect()
    }
}

/// Which invariant a run broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invariant {
    /// A pull missed a push it had to include.
    Staleness,
    /// A push was lost or applied twice.
    ExactlyOnce,
    /// A worker ran more than `tau + 1` iterations ahead of its acknowledged pushes.
    InFlight,
    /// A request never completed.
    Completion,
    /// A pull answered keys it did not ask for, or not the keys it asked for.
    PullComplete,
    /// A message failed to survive the wire codec.
    Codec,
    /// The cluster could not be set up.
    Setup,
    /// A server's stored value differs from the one-node oracle's replay of the pushes it
    /// acknowledged, or a server answered a value it never held.
    Oracle,
    /// An acknowledged push is held by no live server any more.
    Durability,
    /// Two live servers on the same epoch are both primary of a key, or at quiescence a key's
    /// primary is not the one the coordinator's ring names.
    SingleOwner,
    /// At quiescence a live replica of a range holds other values than its primary.
    ReplicaConvergence,
    /// A share of the work is left with a worker that is no longer a member while live
    /// workers remain, or a worker does a share the coordinator gave another.
    WorkCoverage,
    /// Two configurations of the same epoch exist, or a coordinator's term or a member's
    /// epoch went back.
    SingleCoordinator,
    /// A server held more push slots granted at once than the job's `PushSlots::at_once`.
    SlotLimit,
    /// A configuration's adaptive tau lies outside the job's `TauRange`, or is set without one.
    TauRange,
    /// A share moved by speed left its giver below `Balance::fewest` or its taker above
    /// `Balance::most`, or a configuration holds a worker there that no hand-over of a dead
    /// worker's shares or join explains.
    ShareBounds,
    /// A share moved by speed to a worker that, by the speeds the coordinator held, would not
    /// be quicker with it than the giver was by a quarter, or more than one share moved at one
    /// check.
    ShareMove,
    /// A server or worker said a node died that no coordinator declared dead, or said it
    /// twice.
    HeardDead,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::Staleness => "staleness",
            Invariant::ExactlyOnce => "exactly-once",
            Invariant::InFlight => "in-flight bound",
            Invariant::Completion => "completion",
            Invariant::PullComplete => "pull complete",
            Invariant::Codec => "codec",
            Invariant::Setup => "setup",
            Invariant::Oracle => "oracle",
            Invariant::Durability => "durability",
            Invariant::SingleOwner => "single-owner",
            Invariant::ReplicaConvergence => "replica-convergence",
            Invariant::WorkCoverage => "work-coverage",
            Invariant::SingleCoordinator => "single-coordinator",
            Invariant::SlotLimit => "slot-limit",
            Invariant::TauRange => "tau-range",
            Invariant::ShareBounds => "share-bounds",
            Invariant::ShareMove => "share-move",
            Invariant::HeardDead => "heard-dead",
        })
    }
}

/// A run that broke an invariant: what, where, and how to replay it.
#[derive(Clone, Debug, PartialEq)]
pub struct SimFailure {
    /// The invariant broken.
    pub invariant: Invariant,
    /// The seed of the run.
    pub seed: u64,
    /// Step (events processed) at which it was detected.
    pub step: u64,
    /// Virtual time at which it was detected.
    pub at: Time,
    /// What exactly went wrong.
    pub detail: String,
    /// The command that replays the run.
    pub replay: String,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} broke {} at step {} (t={}ms): {}\n  replay: {}",
            self.seed,
            self.invariant,
            self.step,
            self.at / MS,
            self.detail,
            self.replay
        )
    }
}

impl std::error::Error for SimFailure {}

/// What a successful run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Events processed.
    pub steps: u64,
    /// Virtual time when the last worker finished.
    pub finish: Time,
    /// Mean over workers of the fraction of their time spent waiting rather than computing.
    pub idle_fraction: f64,
    /// Messages sent.
    pub messages: u64,
    /// Messages lost (dropped or cut off by a partition).
    pub dropped: u64,
    /// Workers that crashed or were removed.
    pub crashed: usize,
    /// Redirects the workers followed: answers from a server on a newer epoch that sent a
    /// worker to fetch the configuration and re-slice.
    pub redirects: u64,
    /// The update rule the servers ran.
    pub updater: SimUpdater,
    /// Whether the run started with its ring changed.
    pub ring_change: bool,
    /// The server faults that happened, by kind.
    pub server_faults: ServerFaults,
    /// For each server crash the cluster recovered from: virtual time from the crash until
    /// every range was served again (its primary in the coordinator's ring live, on the new
    /// epoch and holding the range as primary).
    pub recoveries: Vec<Time>,
    /// Values sent in pushes, by workers to servers (resends included).
    pub pushed_values: u64,
    /// Values sent in replication updates, by primaries to replicas (resends included; whole
    /// copies not).
    pub replicated_values: u64,
    /// Values a replication carrying one sum per key and iteration would send (the distinct
    /// keys pushed per iteration, times the width): what `replicated_values` comes down to in
    /// sequential mode when every iteration's pushes reach the replicas as one aggregate.
    pub aggregate_values: u64,
    /// What the coordinator found and decided about stragglers (ARCHITECTURE.md §9).
    pub pace: PaceReport,
    /// The most bytes any server held at once that had reached it and that it had not
    /// worked through yet ([`SimConfig::receive_rate`]; 0 without receive queues).
    pub peak_receive_queue_bytes: u64,
    /// Push slots servers granted (resent grants included; ARCHITECTURE.md §9).
    pub slot_grants: u64,
    /// What each of the workers' filters saved, by name, summed over every worker.
    pub filter_savings:
        std::collections::BTreeMap<&'static str, pserver_core::filter::FilterSaving>,
    /// A digest of the final state of every node, to compare replays.
    pub fingerprint: u64,
    /// Per takeover by a standby coordinator, the virtual time from the coordinator fault to
    /// the new coordinator's first configuration.
    pub takeovers: Vec<Time>,
}

/// What a run's coordinator found and decided about stragglers, and what workers did with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PaceReport {
    /// Times a worker was flagged as a straggler.
    pub flagged: u64,
    /// Times a worker was told to skip ahead.
    pub skips: u64,
    /// Iterations skipped, over every worker.
    pub skipped_iterations: u64,
    /// Times the staleness bound changed.
    pub tau_changes: u64,
    /// The highest bound in force during the run.
    pub max_tau: u32,
    /// Partial pushes of skipped iterations that still went to the servers.
    pub parts_kept: u64,
    /// Shares moved from slower workers to faster ones.
    pub shares_moved: u64,
}

impl PaceReport {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &PaceReport) {
        self.flagged += other.flagged;
        self.skips += other.skips;
        self.skipped_iterations += other.skipped_iterations;
        self.tau_changes += other.tau_changes;
        self.max_tau = self.max_tau.max(other.max_tau);
        self.parts_kept += other.parts_kept;
        self.shares_moved += other.shares_moved;
    }
}

/// How many server faults of each kind a run went through (see "Server faults" in the module
/// docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServerFaults {
    /// Servers that crashed for good.
    pub crashes: usize,
    /// Servers that crashed and were restarted as fresh processes (they register again and
    /// join the job anew).
    pub restarts: usize,
    /// Servers that crashed right after a copy of a range was sent to them.
    pub crashes_during_copy: usize,
    /// Servers that crashed right after a replica installed a copy of a range they sent.
    pub crashes_after_copy: usize,
    /// Servers cut off from every other server (not from the coordinator or the workers) for
    /// a while, then healed.
    pub cut_offs: usize,
    /// Servers isolated and healed several times in a row, briefly each time.
    pub flaps: usize,
    /// Servers that joined the job while it ran.
    pub joins: usize,
    /// Servers that asked to leave the job while it ran.
    pub leaves: usize,
    /// Joins, leaves and crashes that came while another change was under way: a
    /// configuration still changing its ring, or a crash not yet recovered from.
    pub overlapping: usize,
    /// Messages of a server's earlier process delivered while a later one of it ran.
    pub late_from_earlier_process: usize,
    /// Messages sent to a server's earlier process that reached a later one.
    pub late_to_later_process: usize,
}

impl ServerFaults {
    /// Every crash of any kind.
    pub fn crashed(&self) -> usize {
        self.crashes + self.restarts + self.crashes_during_copy + self.crashes_after_copy
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &ServerFaults) {
        self.crashes += other.crashes;
        self.restarts += other.restarts;
        self.crashes_during_copy += other.crashes_during_copy;
        self.crashes_after_copy += other.crashes_after_copy;
        self.cut_offs += other.cut_offs;
        self.flaps += other.flaps;
        self.joins += other.joins;
        self.leaves += other.leaves;
        self.overlapping += other.overlapping;
        self.late_from_earlier_process += other.late_from_earlier_process;
        self.late_to_later_process += other.late_to_later_process;
    }
}

/// The update rules a simulation can run, each with fixed parameters suited to the simulated
/// pushes (small positive integers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimUpdater {
    /// [`Updater::Sum`]: stored values are exact totals.
    Sum,
    /// [`Updater::Sgd`] with learning rate 0.05.
    Sgd,
    /// [`Updater::AdaGrad`] with learning rate 0.5 and epsilon 1e-6.
    AdaGrad,
    /// [`Updater::FtrlProximal`] with alpha 0.5, beta 1, l1 30 (so that the first pushes to a
    /// key often stay in the L1 dead zone) and l2 0.5.
    Ftrl,
}

impl SimUpdater {
    /// Every choice, in the order the seed picks from.
    pub const ALL: [SimUpdater; 4] = [
        SimUpdater::Sum,
        SimUpdater::Sgd,
        SimUpdater::AdaGrad,
        SimUpdater::Ftrl,
    ];

    /// The rule the servers run.
    pub fn rule(self) -> Updater {
        match self {
            SimUpdater::Sum => Updater::Sum,
            SimUpdater::Sgd => Updater::Sgd { lr: 0.05 },
            SimUpdater::AdaGrad => Updater::AdaGrad { lr: 0.5, eps: 1e-6 },
            SimUpdater::Ftrl => Updater::FtrlProximal {
                alpha: 0.5,
                beta: 1.0,
                l1: 30.0,
                l2: 0.5,
            },
        }
    }
}

impl fmt::Display for SimUpdater {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimUpdater::Sum => "sum",
            SimUpdater::Sgd => "sgd",
            SimUpdater::AdaGrad => "adagrad",
            SimUpdater::Ftrl => "ftrl",
        })
    }
}

impl core::str::FromStr for SimUpdater {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SimUpdater::ALL
            .into_iter()
            .find(|u| u.to_string() == s)
            .ok_or_else(|| format!("unknown update rule `{s}`: expected sum, sgd, adagrad or ftrl"))
    }
}
