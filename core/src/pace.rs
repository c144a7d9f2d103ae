//! Stragglers and the pace of a job (ARCHITECTURE.md §9): how the coordinator tells a worker that
//! lags from the others, and what it may decide about it: let the worker skip ahead, raise the
//! staleness bound while stragglers last, or move shares of the work from slow workers to fast
//! ones. What it decides travels in the configuration ([`Pace`]), so that every server holds pulls
//! to the same bound and counts the same skipped iterations as finished. Everything is off by
//! default ([`StragglerPolicy`]).
//!
//! # Detection
//!
//! A worker reports its position ([`Position`]: its iteration and how much of it its pushes
//! covered, [`Coverage`]) with every heartbeat. At every failure check the coordinator finds the
//! workers more than [`Detection::lag`] iterations behind the lower median of the others, or (with
//! a rate check) slower than them by a factor over a window of checks, and says once
//! `crate::events::CoordinatorEvent::Straggler { worker, behind }`, then `crate::events::CoordinatorEvent::StragglerCleared` when it keeps up. The
//! runtime logs both and counts `pserver_stragglers_total`.
//!
//! # Skip-ahead (bounded delay)
//!
//! The coordinator publishes, for each straggler, the iteration the others are in as
//! [`Pace::skipped_below`] in the next configuration. Every server counts the worker as having
//! finished every iteration below it (`Server::finished_in`), so no pull waits for those iterations
//! any more; the worker enters that iteration at once (`crate::events::WorkerEvent::SkippedAhead`, answering an
//! `advance` it waited on) and counts the iterations below as finished for its own in-flight bound.
//! What it pushed of a skipped iteration still goes to the servers, exactly once, like any push;
//! what it had not pushed is never sent. The skip only rises, and is forgotten with the worker.
//!
//! A worker may push an iteration in parts (`Worker::push_part`), each saying how much of the
//! iteration it covers with those before, so that a skip loses only the part not yet pushed, and
//! the coordinator sees how far into an iteration a slow worker is.
//!
//! # Adaptive tau (bounded delay)
//!
//! Within a [`TauRange`] the coordinator raises the bound to the top of the range at a check that
//! finds a straggler and lowers it by one at each check that finds none: quick to give stragglers
//! room, slow to take it back while they come and go, publishing it as [`Pace::tau`]
//! (`crate::events::CoordinatorEvent::TauChanged`). The bound a server holds a pull to and the bound a worker's in-flight
//! count is held to are those of the configuration in force (`Cluster::consistency`).
//!
//! # Shares sized by speed (any consistency model)
//!
//! The job's work is cut into [`Balance::per_worker`] shares per worker, dealt in turn
//! (`ClusterConfig::deal`). A worker's application says how much work it does per second of its own
//! compute (`Worker::report_speed`; rows per second, waiting left out, since under a bound a fast
//! worker advances no faster than the slow ones), and the speed travels in its position. At each
//! check, once every worker said one, the coordinator takes the worker whose step takes longest
//! (shares held over speed) and gives its highest share to the worker that would be quickest with
//! one more, if that one would still be quicker by a quarter; one share a check, never below
//! [`Balance::fewest`] nor above [`Balance::most`] (`PaceWatch::rebalance`, `crate::events::CoordinatorEvent::ShareMoved`,
//! `pserver_shares_moved_total`). A move always shortens the slowest step, so none moves back; the
//! giver's own shares go before those it got by a move.
//!
//! Each move is recorded with where the giver last said it was ([`Pace::moves`], [`ShareMove`]), so
//! that an application working in rounds (an epoch over the data) hands the share over where rounds
//! meet: the giver finishes the share for the round it was in, the new holder does it from the next
//! round, and if it learns of the move only during that round it does the round's earlier steps of
//! the share at once (`ClusterConfig::shares_in_round`, [`RoundShare::from_start`]). So a move
//! leaves no row of a round untrained, and trains one twice only if the giver learns of it after
//! its round ended. A dead worker's shares still pass at once.
//!
//! # When the coordinator decides
//!
//! Nothing is decided while servers join or leave: a new epoch would make them report catching up
//! again. A new epoch that changes only the pace and the shares
//! (`ClusterConfig::differs_only_in_pace`) moves no range: replication and copies sent under the
//! epochs before it since the last change of members still hold (`Cluster::members_since`), so a
//! policy publishing often cannot starve a copy of the epoch it needs, and it is no recovery for
//! the runtime's metrics.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::consistency::Consistency;
use crate::forms::seq;
use crate::ids::{Iteration, NodeId};

/// How much of an iteration a push covers, in 65,536ths: a worker that pushes an iteration's
/// work in parts says with each part how far it has come, so that a part pushed before the
/// worker is told to skip ahead still counts, and the coordinator sees how far into an
/// iteration a slow worker is.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Coverage(pub u16);

impl Coverage {
    /// The whole iteration: what a push that is not cut into parts covers.
    pub const WHOLE: Coverage = Coverage(u16::MAX);

    /// `done` of `of` parts (`done` is capped at `of`; `of = 0` is the whole iteration).
    ///
    /// ```
    /// use pserver_core::pace::Coverage;
    /// assert_eq!(Coverage::parts(1, 2), Coverage(32_767));
    /// assert_eq!(Coverage::parts(4, 4), Coverage::WHOLE);
    /// ```
    pub fn parts(done: u32, of: u32) -> Coverage {
        if of == 0 || done >= of {
            return Coverage::WHOLE;
        }
        Coverage((u64::from(done) * u64::from(u16::MAX) / u64::from(of)) as u16)
    }
}

/// Where a worker is: its iteration, and how much of it its pushes covered so far; and how
/// fast it works. Ordered by where it is first, so that a worker far into an iteration is
/// ahead of one that just entered it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Position {
    /// The iteration the worker is in.
    pub iteration: Iteration,
    /// How much of it its pushes covered.
    pub covered: Coverage,
    /// The work it does per second of its own compute, as its application last said
    /// ([`crate::node::Worker::report_speed`]; rows per second, say): 0 when not said. Its
    /// iterations per second would not do: under a consistency bound a fast worker waits for
    /// the slow ones and advances no faster than they do.
    pub speed: u32,
}

impl Position {
    /// The position in 65,536ths of an iteration.
    fn fine(self) -> u64 {
        (u64::from(self.iteration) << 16) | u64::from(self.covered.0)
    }

    /// Where the worker is, its speed left out.
    fn place(self) -> (Iteration, Coverage) {
        (self.iteration, self.covered)
    }
}

/// How a job deals with stragglers. Everything is off by default: workers report nothing, the
/// coordinator decides nothing, and the consistency model alone sets the pace.
///
/// ```
/// use pserver_core::{Consistency, JobSpec};
/// use pserver_core::pace::{StragglerPolicy, TauRange};
/// let mut job = JobSpec::new(2, 4);
/// job.consistency = Consistency::BoundedDelay(2);
/// job.stragglers = StragglerPolicy::skip_ahead();
/// job.stragglers.adaptive_tau = Some(TauRange { min: 1, max: 8 });
/// assert!(job.validate::<f32>().is_ok());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct StragglerPolicy {
    /// How stragglers are told; `None`: not at all (and workers do not report their
    /// position). Skip-ahead and adaptive tau need it.
    pub detect: Option<Detection>,
    /// Under bounded delay: tell a straggler to skip to the iteration the others are in,
    /// instead of holding everybody at the bound ([`Pace::skipped_below`]).
    pub skip_ahead: bool,
    /// Under bounded delay: the staleness bound goes to the top of this range at a check
    /// that finds a straggler, and falls by one at each check that finds none, down to its
    /// bottom ([`Pace::tau`]): quick to give stragglers room, slow to take it back while they
    /// come and go.
    pub adaptive_tau: Option<TauRange>,
    /// Cut the job's work into several shares per worker, and move shares from slow workers
    /// to fast ones by the speed they report, one at a time, within bounds
    /// ([`crate::wire::ClusterConfig::shares`]). Under any consistency model.
    pub balance: Option<Balance>,
}

impl StragglerPolicy {
    /// Detection with the default bound, and skip-ahead.
    pub fn skip_ahead() -> Self {
        StragglerPolicy {
            detect: Some(Detection::default()),
            skip_ahead: true,
            ..StragglerPolicy::default()
        }
    }

    /// Detection with the default bound, and tau moving within `range`.
    pub fn adaptive(range: TauRange) -> Self {
        StragglerPolicy {
            detect: Some(Detection::default()),
            adaptive_tau: Some(range),
            ..StragglerPolicy::default()
        }
    }

    /// Detection with the default bound, and shares sized by speed as `balance` says.
    pub fn balanced(balance: Balance) -> Self {
        StragglerPolicy {
            detect: Some(Detection::default()),
            balance: Some(balance),
            ..StragglerPolicy::default()
        }
    }

    /// Shares each worker starts with: [`Balance::per_worker`] where shares are sized by
    /// speed, one otherwise.
    pub fn shares_per_worker(&self) -> usize {
        self.balance.map_or(1, |b| usize::from(b.per_worker.max(1)))
    }

    /// Whether the coordinator may decide anything for a job of `consistency`: skip-ahead and
    /// adaptive tau are for bounded delay only (sequential mode applies an iteration's pushes
    /// together, and eventual consistency never holds anybody).
    pub(crate) fn decides(&self, consistency: Consistency) -> bool {
        matches!(consistency, Consistency::BoundedDelay(_))
            && (self.skip_ahead || self.adaptive_tau.is_some())
    }
}

/// When a worker counts as a straggler. The coordinator checks at every failure check
/// ([`crate::Timing::heartbeat_interval`]), from the positions workers report with their
/// heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Detection {
    /// A worker more than this many iterations behind the median of the others is a
    /// straggler. Under bounded delay the others wait once they are `tau + 1` ahead, so a
    /// bound above `tau` is never reached by a slow worker alone.
    pub lag: Iteration,
    /// A worker whose progress over the last `window` checks, times this factor in percent,
    /// is below the median progress of the others is a straggler too (0: no rate check).
    pub slower_by_percent: u32,
    /// Checks the rate is measured over (at least 1 when `slower_by_percent` is set).
    pub window: u32,
}

impl Detection {
    /// A worker more than `lag` iterations behind the median of the others is a straggler;
    /// no rate check.
    pub fn lagging(lag: Iteration) -> Self {
        Detection {
            lag,
            ..Detection::default()
        }
    }

    /// Also a worker whose progress over `window` checks, times `percent` / 100, is below the
    /// others' median progress.
    pub fn slower_by(self, percent: u32, window: u32) -> Self {
        Detection {
            slower_by_percent: percent,
            window,
            ..self
        }
    }
}

impl Default for Detection {
    fn default() -> Self {
        Detection {
            lag: 1,
            slower_by_percent: 0,
            window: 0,
        }
    }
}

/// The range adaptive tau moves within.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TauRange {
    /// The lowest bound, where it starts and returns once stragglers clear.
    pub min: Iteration,
    /// The highest bound.
    pub max: Iteration,
}

/// How the job's work is cut and moved by speed ([`StragglerPolicy::balance`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Balance {
    /// Shares each worker starts with: the job is cut into this many times the workers.
    /// More shares size the work more finely, and make each step of a worker smaller.
    pub per_worker: u16,
    /// The fewest shares a worker is left with, however slow (at least 1: a worker with no
    /// share would report no speed to be given one back by).
    pub fewest: u16,
    /// The most shares a worker is given, however fast.
    pub most: u16,
}

impl Balance {
    /// `per_worker` shares each, never fewer than 1 nor more than twice as many.
    pub fn shares(per_worker: u16) -> Self {
        Balance {
            per_worker,
            fewest: 1,
            most: per_worker.saturating_mul(2),
        }
    }
}

/// What the coordinator decided about stragglers, in force with the configuration that
/// carries it ([`crate::wire::ClusterConfig::pace`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pace {
    /// Under bounded delay with adaptive tau: the bound in force (`None`: the job's own).
    pub tau: Option<Iteration>,
    /// Per worker, sorted by node: every iteration below this one counts as finished, pushed
    /// or not. A worker told so drops the iterations it had not finished and goes on from
    /// here; servers stop waiting for them. Only ever rises.
    #[serde(with = "seq")]
    pub skipped_below: Vec<(NodeId, Iteration)>,
    /// The last move of each share moved by speed ([`StragglerPolicy::balance`]), sorted by
    /// share: so that an application can hand a share over where its rounds meet, the
    /// worker it came from finishing the round it was in ([`ShareMove`]).
    #[serde(with = "seq")]
    pub moves: Vec<ShareMove>,
}

/// A share a worker does in one round of an application that works in rounds
/// ([`crate::node::Worker::shares_in_round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RoundShare {
    /// The share ([`crate::wire::ClusterConfig::shares`]).
    pub share: usize,
    /// Moved to the worker by speed for this round
    /// ([`crate::wire::ClusterConfig::handed_over_in`]): it does the share's work of the round from
    /// the beginning, wherever it is in the round when it learns.
    pub from_start: bool,
    /// Last moved by speed ([`Pace::moves`]), rather than dealt at the start or handed on
    /// from a worker that died.
    pub moved: bool,
}

/// A share moved by speed from one worker to another ([`Pace::moves`]): the giver was in
/// iteration `at` when the coordinator decided. An application that works in rounds (an
/// epoch over the data, say) lets the giver finish the share for the round `at` is in, and
/// the new holder take it from the next ([`crate::wire::ClusterConfig::shares_in_round`]), so that
/// no part of a round's work is done twice or not at all, wherever each worker is when it
/// learns of the move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShareMove {
    /// The share ([`crate::wire::ClusterConfig::shares`]).
    pub share: u32,
    /// The worker that held it.
    pub from: NodeId,
    /// Where the worker that held it was, as it last reported.
    pub at: Iteration,
}

impl Pace {
    /// The iterations of `worker` counted as finished whatever it pushed: all below this.
    ///
    /// ```
    /// use pserver_core::NodeId;
    /// use pserver_core::pace::Pace;
    /// let pace = Pace { skipped_below: vec![(NodeId(5), 7)], ..Pace::default() };
    /// assert_eq!(pace.skipped_below(NodeId(5)), 7);
    /// assert_eq!(pace.skipped_below(NodeId(6)), 0);
    /// ```
    pub fn skipped_below(&self, worker: NodeId) -> Iteration {
        self.skipped_below
            .binary_search_by_key(&worker, |&(w, _)| w)
            .map_or(0, |i| self.skipped_below[i].1)
    }

    /// The consistency model in force: the job's, with adaptive tau's bound where one is set.
    pub fn consistency(&self, job: Consistency) -> Consistency {
        match (job, self.tau) {
            (Consistency::BoundedDelay(_), Some(tau)) => Consistency::BoundedDelay(tau),
            _ => job,
        }
    }

    /// Keeps only what concerns `workers` (the members of the next configuration).
    pub(crate) fn retain_workers(&mut self, workers: &[NodeId]) {
        self.skipped_below.retain(|(w, _)| workers.contains(w));
        // A giver that is gone finishes nothing: the new holder takes the share at once.
        self.moves.retain(|m| workers.contains(&m.from));
    }

    /// The last move of `share`, if it was moved by speed.
    pub fn moved(&self, share: usize) -> Option<&ShareMove> {
        self.moves
            .binary_search_by_key(&share, |m| m.share as usize)
            .ok()
            .map(|i| &self.moves[i])
    }

    /// Records that `share` moved from `from`, which was in iteration `at`.
    pub(crate) fn record_move(&mut self, share: usize, from: NodeId, at: Iteration) {
        let m = ShareMove {
            share: share as u32,
            from,
            at,
        };
        match self.moves.binary_search_by_key(&m.share, |m| m.share) {
            Ok(i) => self.moves[i] = m,
            Err(i) => self.moves.insert(i, m),
        }
    }

    fn skip(&mut self, worker: NodeId, below: Iteration) {
        match self
            .skipped_below
            .binary_search_by_key(&worker, |&(w, _)| w)
        {
            Ok(i) => self.skipped_below[i].1 = self.skipped_below[i].1.max(below),
            Err(i) => self.skipped_below.insert(i, (worker, below)),
        }
    }
}

/// A worker found lagging at a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Lagging {
    /// How far behind the median of the others, in whole iterations.
    pub(crate) behind: Iteration,
    /// The iteration the median of the others is in.
    pub(crate) others_in: Iteration,
}

/// What the coordinator keeps to tell stragglers: the furthest position each worker reported,
/// and with a rate check, its positions at the last `window + 1` checks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct PaceWatch {
    reported: BTreeMap<NodeId, Position>,
    history: BTreeMap<NodeId, Vec<u64>>,
}

impl PaceWatch {
    /// A worker reported its position (heartbeats may arrive out of order: the furthest
    /// counts).
    pub(crate) fn report(&mut self, worker: NodeId, at: Position) {
        let known = self.reported.entry(worker).or_default();
        if at.place() >= known.place() {
            *known = at;
        }
    }

    /// The speed each of `workers` last reported, if every one of them did.
    fn speeds(&self, workers: &[NodeId]) -> Option<Vec<u32>> {
        workers
            .iter()
            .map(|w| self.reported.get(w).map(|p| p.speed).filter(|&s| s > 0))
            .collect()
    }

    /// Whether `worker` reported its position at all.
    pub(crate) fn has_reported(&self, worker: NodeId) -> bool {
        self.reported.contains_key(&worker)
    }

    /// The iteration `worker` last reported being in (0 before it reported).
    pub(crate) fn iteration_of(&self, worker: NodeId) -> Iteration {
        self.reported.get(&worker).map_or(0, |p| p.iteration)
    }

    /// The share to move, and to whom, for the work of `workers` to follow their speeds
    /// better ([`Balance`]); `None` when no move would, or not every worker said its speed.
    ///
    /// A worker's time for a step is the shares it holds over its speed, and the slowest
    /// sets the pace. The slowest gives its highest share (of those it did not get by a
    /// move, if it has one) to the worker that would be quickest with one more, when that
    /// one would then still be quicker by a quarter: so a move always shortens the slowest
    /// time, and no share moves back and forth between workers whose speeds wobble.
    pub(crate) fn rebalance(
        &self,
        shares: &[NodeId],
        workers: &[NodeId],
        pace: &Pace,
        balance: &Balance,
    ) -> Option<(usize, NodeId)> {
        let speeds = self.speeds(workers)?;
        let counts: Vec<u128> = workers
            .iter()
            .map(|w| shares.iter().filter(|&s| s == w).count() as u128)
            .collect();
        let held = |i: usize| counts[i];
        // a/b < c/d, exactly, for positive speeds.
        let quicker = |a: u128, b: u32, c: u128, d: u32| a * u128::from(d) < c * u128::from(b);
        let giver = (0..workers.len()).reduce(|slowest, i| {
            if quicker(held(slowest), speeds[slowest], held(i), speeds[i]) {
                i
            } else {
                slowest
            }
        })?;
        let (fewest, most) = (u128::from(balance.fewest.max(1)), u128::from(balance.most));
        // The mutation widens the bounds by one each way: a giver may end below `fewest`, a
        // taker above `most`.
        let (fewest, most) = if driven_mutated!(SharesPastBounds) {
            (fewest - 1, most + 1)
        } else {
            (fewest, most)
        };
        if held(giver) <= fewest {
            return None;
        }
        let taker = (0..workers.len())
            .filter(|&i| i != giver && held(i) < most)
            .reduce(|quickest, i| {
                if quicker(held(i) + 1, speeds[i], held(quickest) + 1, speeds[quickest]) {
                    i
                } else {
                    quickest
                }
            })?;
        // Speeds measured on shared machines wobble by tens of percent.
        let after = (held(taker) + 1) * 5;
        if !quicker(after, speeds[taker], held(giver) * 4, speeds[giver])
            && !driven_mutated!(MoveWithoutGain)
        {
            return None;
        }
        // A share that came by a move may not have reached the giver yet (it takes it where
        // rounds meet), and moving it on would take it from its first holder mid-round: the
        // giver's own shares go first.
        let mine = |i: &usize| shares[*i] == workers[giver];
        let share = (0..shares.len())
            .rev()
            .filter(mine)
            .find(|&i| pace.moved(i).is_none())
            .or_else(|| (0..shares.len()).rev().find(mine))?;
        Some((share, workers[taker]))
    }

    /// Forgets workers no longer in the job.
    pub(crate) fn retain(&mut self, workers: &[NodeId]) {
        self.reported.retain(|w, _| workers.contains(w));
        self.history.retain(|w, _| workers.contains(w));
    }

    /// One check: the workers of `workers` that lag, each counted where `pace` lets it be
    /// (a skipped worker is at least at its skip).
    pub(crate) fn check(
        &mut self,
        workers: &[NodeId],
        pace: &Pace,
        detect: &Detection,
    ) -> BTreeMap<NodeId, Lagging> {
        let at: BTreeMap<NodeId, u64> = workers
            .iter()
            .filter_map(|&w| {
                let skipped = (u64::from(pace.skipped_below(w))) << 16;
                self.reported.get(&w).map(|&p| (w, p.fine().max(skipped)))
            })
            .collect();
        let rate = detect.slower_by_percent > 0 && detect.window > 0;
        if rate {
            let keep = detect.window as usize + 1;
            for (&w, &p) in &at {
                let h = self.history.entry(w).or_default();
                h.push(p);
                if h.len() > keep {
                    h.remove(0);
                }
            }
        }
        let mut lagging = BTreeMap::new();
        if at.len() < 2 {
            return lagging;
        }
        for (&w, &p) in &at {
            let others = lower_median(at.iter().filter(|&(&o, _)| o != w).map(|(_, &q)| q));
            let behind = others.saturating_sub(p);
            let lags = behind > u64::from(detect.lag) << 16;
            let slow = rate && self.slower(w, detect);
            if lags || slow {
                lagging.insert(
                    w,
                    Lagging {
                        behind: (behind >> 16) as Iteration,
                        others_in: (others >> 16) as Iteration,
                    },
                );
            }
        }
        lagging
    }

    /// Whether `worker` progressed over the window less than the others' median by the
    /// factor; only once every worker has a full window.
    fn slower(&self, worker: NodeId, detect: &Detection) -> bool {
        let full = detect.window as usize + 1;
        let progress = |h: &Vec<u64>| (h.len() == full).then(|| h[full - 1] - h[0]);
        let Some(mine) = self.history.get(&worker).and_then(progress) else {
            return false;
        };
        let others: Option<Vec<u64>> = self
            .history
            .iter()
            .filter(|&(&o, _)| o != worker)
            .map(|(_, h)| progress(h))
            .collect();
        let Some(others) = others.filter(|o| !o.is_empty()) else {
            return false;
        };
        let median = lower_median(others.into_iter());
        u128::from(mine) * u128::from(detect.slower_by_percent) < u128::from(median) * 100
    }
}

/// The lower of the two middle values (the middle one of an odd count): of two workers, the
/// slower, so that a worker is flagged only when more than half the others are ahead.
fn lower_median(values: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = values.collect();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

/// The next pace after a check found `lagging`: stragglers skipped ahead to the others'
/// iteration where skip-ahead is on; tau to the top of its range while anybody lags and one
/// down once nobody does. Stepping up instead (by one, or doubling) lost a run of seconds
/// most of its gain: transient stragglers want the top of the range at once, and each calm
/// check between them took back part of the climb.
pub(crate) fn decide(
    policy: &StragglerPolicy,
    consistency: Consistency,
    current: &Pace,
    lagging: &BTreeMap<NodeId, Lagging>,
) -> Pace {
    let mut next = current.clone();
    let Consistency::BoundedDelay(job_tau) = consistency else {
        return next;
    };
    if policy.skip_ahead {
        for (&w, lag) in lagging {
            if lag.others_in > current.skipped_below(w) {
                next.skip(w, lag.others_in);
            }
        }
    }
    if let Some(range) = policy.adaptive_tau {
        let tau = current.tau.unwrap_or(job_tau).clamp(range.min, range.max);
        let tau = if lagging.is_empty() {
            tau.saturating_sub(1).max(range.min)
        } else if driven_mutated!(TauPastRange) {
            range.max.saturating_add(1)
        } else {
            range.max
        };
        next.tau = Some(tau);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(iteration: Iteration) -> Position {
        Position {
            iteration,
            ..Position::default()
        }
    }

    const W: [NodeId; 4] = [NodeId(3), NodeId(4), NodeId(5), NodeId(6)];

    #[test]
    fn a_worker_behind_the_median_of_the_others_by_more_than_the_bound_is_flagged() {
        let mut watch = PaceWatch::default();
        for (w, i) in W.iter().zip([10, 9, 10, 7]) {
            watch.report(*w, at(i));
        }
        let detect = Detection {
            lag: 2,
            ..Detection::default()
        };
        let lagging = watch.check(&W, &Pace::default(), &detect);
        assert_eq!(
            lagging,
            BTreeMap::from([(
                NodeId(6),
                Lagging {
                    behind: 3,
                    others_in: 10
                }
            )])
        );
        // Exactly at the bound is not behind by more than it.
        watch.report(NodeId(6), at(8));
        assert!(watch.check(&W, &Pace::default(), &detect).is_empty());
    }

    #[test]
    fn part_of_an_iteration_covered_counts_and_a_skip_counts_as_reached() {
        let mut watch = PaceWatch::default();
        watch.report(W[0], at(5));
        watch.report(W[1], at(4));
        let detect = Detection {
            lag: 1,
            ..Detection::default()
        };
        // One iteration behind is not more than the bound of one...
        assert!(watch.check(&W[..2], &Pace::default(), &detect).is_empty());
        // ...but half-way through the next is.
        watch.report(
            W[0],
            Position {
                iteration: 5,
                covered: Coverage::parts(1, 2),
                speed: 0,
            },
        );
        assert!(
            watch
                .check(&W[..2], &Pace::default(), &detect)
                .contains_key(&W[1])
        );
        let pace = Pace {
            skipped_below: vec![(W[1], 5)],
            ..Pace::default()
        };
        assert!(watch.check(&W[..2], &pace, &detect).is_empty());
        // An older heartbeat arriving late moves nobody back.
        watch.report(W[0], at(1));
        assert!(watch.check(&W[..2], &pace, &detect).is_empty());
    }

    #[test]
    fn a_worker_slower_than_the_others_over_the_window_is_flagged_before_it_lags() {
        let mut watch = PaceWatch::default();
        let detect = Detection {
            lag: 100,
            slower_by_percent: 300,
            window: 2,
        };
        let mut flagged = Vec::new();
        for check in 0..4u32 {
            watch.report(W[0], at(check * 8));
            watch.report(W[1], at(check * 8));
            watch.report(W[2], at(check * 2));
            flagged.push(watch.check(&W[..3], &Pace::default(), &detect));
        }
        // The window fills at the third check.
        assert!(flagged[0].is_empty() && flagged[1].is_empty());
        assert_eq!(flagged[2].keys().collect::<Vec<_>>(), [&W[2]]);
        assert_eq!(flagged[3].keys().collect::<Vec<_>>(), [&W[2]]);
    }

    #[test]
    fn skip_ahead_moves_a_straggler_to_the_others_iteration_and_never_back() {
        let policy = StragglerPolicy::skip_ahead();
        let lagging = BTreeMap::from([(
            W[3],
            Lagging {
                behind: 3,
                others_in: 9,
            },
        )]);
        let pace = decide(
            &policy,
            Consistency::BoundedDelay(2),
            &Pace::default(),
            &lagging,
        );
        assert_eq!(pace.skipped_below(W[3]), 9);
        let back = BTreeMap::from([(
            W[3],
            Lagging {
                behind: 1,
                others_in: 7,
            },
        )]);
        let again = decide(&policy, Consistency::BoundedDelay(2), &pace, &back);
        assert_eq!(again.skipped_below(W[3]), 9);
        // Not under sequential consistency.
        let seq = decide(&policy, Consistency::Sequential, &Pace::default(), &lagging);
        assert_eq!(seq.skipped_below(W[3]), 0);
    }

    #[test]
    fn adaptive_tau_rises_while_stragglers_last_and_falls_once_they_clear_within_its_range() {
        let policy = StragglerPolicy::adaptive(TauRange { min: 1, max: 3 });
        let job = Consistency::BoundedDelay(1);
        let lagging = BTreeMap::from([(
            W[0],
            Lagging {
                behind: 2,
                others_in: 4,
            },
        )]);
        let mut pace = Pace::default();
        let mut taus = Vec::new();
        for straggling in [true, true, true, true, false, false, false] {
            let found = if straggling {
                lagging.clone()
            } else {
                BTreeMap::new()
            };
            pace = decide(&policy, job, &pace, &found);
            taus.push(pace.tau.unwrap_or(0));
        }
        assert_eq!(taus, [3, 3, 3, 3, 2, 1, 1]);
        assert_eq!(pace.consistency(job), Consistency::BoundedDelay(1));
        assert_eq!(
            pace.consistency(Consistency::Sequential),
            Consistency::Sequential
        );
    }
}
