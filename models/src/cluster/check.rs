//! Running the checker on a cluster model and reporting what it found.

use core::fmt;
use std::time::{Duration, Instant};

use stateright::actor::ActorModelAction;
use stateright::{Checker, Expectation, Model, UniformChooser};

use super::liveness::{Liveness, check_livelock};
use super::{ClusterModel, ModelTimer, livelock_goal};

/// How to explore the state space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Breadth first: shortest counterexamples; holds every pending state in memory.
    Bfs,
    /// Depth first: far less memory.
    Dfs,
    /// Random walks from a seed until `timeout`: for models too large to exhaust.
    Simulation {
        /// Seed of the walks.
        seed: u64,
        /// How long to walk.
        timeout: Duration,
    },
}

/// What the checker concluded about one property.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// An `always` property held in every state explored.
    Holds,
    /// An `always` property failed; the steps that lead there.
    Violated(Vec<String>),
    /// A `sometimes` property was reached.
    Found,
    /// A `sometimes` property was never reached.
    NotFound,
    /// Not judged: the search was bounded or random, or the state space too large.
    NotChecked,
}

/// One property's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PropertyResult {
    /// Its name.
    pub name: &'static str,
    /// The verdict.
    pub verdict: Verdict,
}

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    /// Every property, in the model's order.
    pub properties: Vec<PropertyResult>,
    /// States generated (with repeats).
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// Longest path explored.
    pub depth: usize,
    /// Wall-clock seconds.
    pub secs: f64,
}

impl CheckReport {
    /// True when an `always` property was violated.
    pub fn violated(&self) -> bool {
        self.properties
            .iter()
            .any(|p| matches!(p.verdict, Verdict::Violated(_)))
    }

    /// The verdict of the named property.
    pub fn verdict(&self, name: &str) -> Option<&Verdict> {
        self.properties
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.verdict)
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.properties {
            let word = match &p.verdict {
                Verdict::Holds => "holds",
                Verdict::Violated(_) => "violated",
                Verdict::Found => "found",
                Verdict::NotFound => "not found",
                Verdict::NotChecked => "not checked",
            };
            writeln!(f, "property {}: {word}", p.name)?;
            if let Verdict::Violated(steps) = &p.verdict {
                if steps.is_empty() {
                    writeln!(f, "    (already in the initial state)")?;
                }
                for (i, step) in steps.iter().enumerate() {
                    writeln!(f, "  {:>3}. {step}", i + 1)?;
                }
            }
        }
        Ok(())
    }
}

type Action = <ClusterModel as Model>::Action;

/// One step of a cluster counterexample, for a reader.
pub fn describe(action: &Action) -> String {
    match action {
        ActorModelAction::Deliver { src, dst, msg } => {
            format!(
                "deliver n{} -> n{}: {:?}",
                usize::from(*src),
                usize::from(*dst),
                msg.body
            )
        }
        ActorModelAction::Drop(env) => format!(
            "lose n{} -> n{}: {:?}",
            usize::from(env.src),
            usize::from(env.dst),
            env.msg.body
        ),
        ActorModelAction::Timeout(id, ModelTimer::Node { timer, .. }) => {
            format!("timer {timer:?} fires at n{}", usize::from(*id))
        }
        ActorModelAction::Timeout(id, ModelTimer::Detect(server)) => {
            format!(
                "n{} finds {server} silent and declares it dead",
                usize::from(*id)
            )
        }
        ActorModelAction::Timeout(id, ModelTimer::Straggle(worker)) => {
            format!(
                "n{} finds {worker} straggling in iteration 0 and checks the pace",
                usize::from(*id)
            )
        }
        ActorModelAction::Timeout(id, ModelTimer::Calm) => {
            format!(
                "n{} finds nobody straggling and checks the pace",
                usize::from(*id)
            )
        }
        ActorModelAction::Crash(id) => format!("n{} crashes", usize::from(*id)),
    }
}

/// Checks a cluster model with `strategy` on `threads` threads. Stops early once an `always`
/// property is violated (with its counterexample).
pub fn check(model: ClusterModel, strategy: Strategy, threads: usize) -> CheckReport {
    check_cluster_model(model, strategy, threads, None)
}

/// Distinct states beyond which `livelock-free` is not judged (its search keeps every state's
/// fingerprint and every edge in memory).
pub const LIVELOCK_MAX_STATES: usize = 8_000_000;

/// Checks a cluster model like [`check_with`], then, when the search was exhaustive and no
/// `always` property failed, judges `livelock-free` (see [`super::liveness`]) on the same
/// model.
pub fn check_cluster_model(
    model: ClusterModel,
    strategy: Strategy,
    threads: usize,
    max_states: Option<usize>,
) -> CheckReport {
    let copy = model.clone();
    let mut report = check_with(model, strategy, threads, max_states, describe);
    let exhaustive = matches!(strategy, Strategy::Bfs | Strategy::Dfs) && max_states.is_none();
    let verdict = if exhaustive && !report.violated() {
        let start = Instant::now();
        let found = check_livelock(&copy, livelock_goal, LIVELOCK_MAX_STATES, describe);
        report.secs += start.elapsed().as_secs_f64();
        match found {
            Liveness::Holds => Verdict::Holds,
            Liveness::Trapped(steps) => Verdict::Violated(steps),
            Liveness::TooLarge => Verdict::NotChecked,
        }
    } else {
        Verdict::NotChecked
    };
    let at = report
        .properties
        .iter()
        .position(|p| p.name == "completion")
        .map_or(report.properties.len(), |i| i + 1);
    report.properties.insert(
        at,
        PropertyResult {
            name: "livelock-free",
            verdict,
        },
    );
    report
}

/// Checks any model, stopping after about `max_states` states if given (a bounded check),
/// describing counterexample steps with `describe`.
pub fn check_with<M>(
    model: M,
    strategy: Strategy,
    threads: usize,
    max_states: Option<usize>,
    describe: fn(&M::Action) -> String,
) -> CheckReport
where
    M: Model + Send + Sync + 'static,
    M::State: core::hash::Hash + Send + Sync + 'static,
{
    let start = Instant::now();
    let expectations: Vec<(&'static str, Expectation)> = model
        .properties()
        .iter()
        .map(|p| (p.name, p.expectation.clone()))
        .collect();
    let mut builder = model
        .checker()
        .threads(threads.max(1))
        .finish_when(stateright::HasDiscoveries::AnyFailures);
    if let Some(limit) = max_states {
        builder = builder.target_state_count(limit);
    }
    let (discoveries, states, unique, depth) = match strategy {
        Strategy::Bfs => summarize(builder.spawn_bfs().join(), &expectations, describe),
        Strategy::Dfs => summarize(builder.spawn_dfs().join(), &expectations, describe),
        Strategy::Simulation { seed, timeout } => summarize(
            builder
                .timeout(timeout)
                .spawn_simulation(seed, UniformChooser)
                .join(),
            &expectations,
            describe,
        ),
    };
    let properties = expectations
        .iter()
        .zip(discoveries)
        .map(|((name, expectation), found)| {
            let verdict = match (expectation, found) {
                (Expectation::Sometimes, Some(_)) => Verdict::Found,
                (Expectation::Sometimes, None) => Verdict::NotFound,
                (_, Some(steps)) => Verdict::Violated(steps),
                (_, None) => Verdict::Holds,
            };
            PropertyResult { name, verdict }
        })
        .collect();
    CheckReport {
        properties,
        states,
        unique,
        depth,
        secs: start.elapsed().as_secs_f64(),
    }
}

type Found = Vec<Option<Vec<String>>>;

fn summarize<M: Model>(
    checker: impl Checker<M>,
    expectations: &[(&'static str, Expectation)],
    describe: fn(&M::Action) -> String,
) -> (Found, usize, usize, usize) {
    let found = expectations
        .iter()
        .map(|(name, _)| {
            // Stateright rebuilds a discovery's path by replaying fingerprints; when that fails
            // it panics. The discovery itself stands, so report it without its path.
            let rebuilt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                checker
                    .discovery(name)
                    .map(|path| path.into_actions().iter().map(describe).collect())
            }));
            rebuilt.unwrap_or_else(|_| {
                Some(vec![
                    "(the checker could not rebuild the path to this state)".into(),
                ])
            })
        })
        .collect();
    (
        found,
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
    )
}
