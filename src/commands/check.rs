//! `pserver check`: the model checker over the protocol's stateright models.

use std::fmt::Write as _;
use std::time::Duration;

use pserver_core::Consistency;
use pserver_models::ClockModel;
use pserver_models::cluster::{
    CheckReport, ClusterModel, ClusterModelConfig, NetworkKind, Strategy, check_cluster_model,
    check_with, cluster_model,
};

use super::CliError;
use super::sim::Protocol;
use stateright::{Checker, Model};

/// Model-check the protocol: explore every state of a small cluster and check its
/// properties.
///
/// The cluster model runs the core's own coordinator, servers and workers under stateright,
/// each worker pushing, advancing and pulling for every iteration. Prints one line per
/// property (`property NAME: holds | violated | found | not found`), the steps of any
/// counterexample, and last `check states=N unique=N depth=N secs=S`. Exits 1 if an
/// `always` property is violated. Keep models tiny: every actor and iteration multiplies
/// the states.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Model: cluster (the whole protocol), replication (key ranges copied between servers,
    /// in two configurations checked one after the other: a primary and a replica per range on
    /// 3 servers, one of which may crash; and 1 server holding every range while a second
    /// joins at any point and takes a range over) or clock (the range vector clock). The shape
    /// options change the replication model's shape too; giving --servers, --crashes, --joins
    /// or --replicas checks the one configuration they describe.
    // The help above explains every model; clap's list of them would only repeat it.
    #[arg(
        long,
        value_enum,
        default_value = "cluster",
        hide_possible_values = true
    )]
    model: ModelName,
    /// Explore breadth first (the default; shortest counterexamples, most memory).
    #[arg(long, group = "strategy")]
    bfs: bool,
    /// Explore depth first (less memory).
    #[arg(long, group = "strategy")]
    dfs: bool,
    /// Random walks from this seed instead of exhaustive search (see --timeout-secs).
    #[arg(long, value_name = "SEED", group = "strategy")]
    simulation: Option<u64>,
    /// How long --simulation walks.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Servers [default: 2]. Giving any of the shape options (servers, workers, keys,
    /// iterations, crashes, joins, network, consistency, registration, ring change, backoff)
    /// checks that one shape, once per consistency model, instead of the default suite.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    servers: Option<u32>,
    /// Workers [default: 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    workers: Option<u32>,
    /// Keys each worker pushes and pulls (for --model clock: keys modelled one by one)
    /// [default: 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=8))]
    keys: Option<u64>,
    /// Iterations per worker [default: 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=4))]
    iterations: Option<u32>,
    /// Actors that may crash (adds heartbeats and failure detection) [default: 0].
    #[arg(long)]
    crashes: Option<usize>,
    /// Servers that join while the job runs (replication model only): each registers at a
    /// point the checker chooses, copies the ranges the next ring gives it and takes them
    /// over [default: 0].
    #[arg(long)]
    joins: Option<usize>,
    /// Replicas per key range (replication model only) [default: 1].
    #[arg(long)]
    replicas: Option<u32>,
    /// Network: ordered (per-pair FIFO, reliable, like TCP) or lossy (unordered, duplicating,
    /// lossy, like UDP) [default: lossy].
    #[arg(long)]
    network: Option<NetworkKind>,
    /// Consistency models to check, comma-separated [default: sequential,bounded:1].
    #[arg(long, value_delimiter = ',')]
    consistency: Vec<Consistency>,
    /// Model the registration phase instead of starting with epoch 1 in force.
    #[arg(long)]
    registration: bool,
    /// Start with the ring already changed on the coordinator and servers while the workers
    /// still hold the old one, so that requests are redirected and re-sliced.
    #[arg(long)]
    ring_change: bool,
    /// Model doubling retransmission timeouts (lossy network; each worker retransmits at most
    /// twice).
    #[arg(long)]
    backoff: bool,
    /// Check a deliberately broken protocol, e.g. no-dedupe or no-gating (needs a
    /// build with --features mutations).
    #[arg(long)]
    mutation: Option<String>,
    /// Serve stateright's Explorer for the chosen model (the first consistency model given)
    /// at this address instead.
    #[arg(long, value_name = "ADDR")]
    explore: Option<String>,
    /// Stop after about this many states: a bounded check, for models too large to exhaust
    /// (crashes, more iterations).
    #[arg(long, value_name = "N")]
    max_states: Option<usize>,
    /// Checker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

/// Runs `pserver check` and prints its verdicts; a violated `always` property is a
/// [`CliError::Found`].
pub fn run(args: CheckArgs) -> Result<(), CliError> {
    let threads = super::threads_or_cores(args.threads);
    let strategy = match (args.dfs, args.simulation) {
        (true, _) => Strategy::Dfs,
        (_, Some(seed)) => Strategy::Simulation {
            seed,
            timeout: Duration::from_secs(args.timeout_secs),
        },
        _ => Strategy::Bfs,
    };
    let models = if args.consistency.is_empty() {
        default_models()
    } else {
        args.consistency.clone()
    };
    let shape_given = args.servers.is_some()
        || args.workers.is_some()
        || args.keys.is_some()
        || args.iterations.is_some()
        || args.crashes.is_some()
        || args.joins.is_some()
        || args.network.is_some()
        || !args.consistency.is_empty()
        || args.registration
        || args.ring_change
        || args.backoff;
    let replication = args.model == ModelName::Replication;
    if !replication && (args.joins.is_some() || args.replicas.is_some()) {
        return Err(CliError::input(
            "--joins and --replicas shape the replication model: add --model replication",
        ));
    }
    // The replication model checks fail-over and a join, each exhaustively, unless its servers
    // are shaped on the command line: then the one configuration asked for.
    let servers_given = args.servers.is_some()
        || args.crashes.is_some()
        || args.joins.is_some()
        || args.replicas.is_some();
    let bases = match (replication, servers_given) {
        (true, false) => ClusterModelConfig::replication_suite(),
        (true, true) => vec![ClusterModelConfig::replication()],
        (false, _) => vec![ClusterModelConfig::default()],
    };
    let shaped = |defaults: ClusterModelConfig| {
        let (keys, iterations, crashes) = if replication {
            (defaults.keys, defaults.iterations, defaults.crashes)
        } else {
            (1, 1, 0)
        };
        ClusterModelConfig {
            servers: args.servers.map_or(defaults.servers, |n| n as usize),
            workers: args.workers.map_or(defaults.workers, |n| n as usize),
            keys: args.keys.unwrap_or(keys),
            iterations: args.iterations.unwrap_or(iterations),
            consistency: args
                .consistency
                .first()
                .copied()
                .unwrap_or(defaults.consistency),
            network: args.network.unwrap_or(defaults.network),
            crashes: args.crashes.unwrap_or(crashes),
            registration: args.registration,
            ring_change: args.ring_change,
            replicas: args.replicas.unwrap_or(defaults.replicas),
            backoff: args.backoff,
            joins: args.joins.unwrap_or(defaults.joins),
        }
    };
    let bases: Vec<ClusterModelConfig> = bases.into_iter().map(shaped).collect();
    if bases
        .iter()
        .any(|b| b.joins > 0 && (b.registration || b.ring_change))
    {
        return Err(CliError::input(
            "a server join does not combine with --registration or --ring-change (give --joins 0 to check fail-over alone)",
        ));
    }
    let base = bases[0].clone();
    let configs: Vec<ClusterModelConfig> = if replication && args.consistency.is_empty() {
        bases
    } else if shape_given || replication {
        bases
            .iter()
            .flat_map(|b| {
                models.iter().map(|&consistency| ClusterModelConfig {
                    consistency,
                    ..b.clone()
                })
            })
            .collect()
    } else {
        default_suite()
    };
    let protocol = Protocol::from_mutation(args.mutation.as_deref()).map_err(CliError::Input)?;
    let clock_max_time = u8::try_from(base.iterations.max(1)).unwrap_or(u8::MAX);
    if let Some(address) = &args.explore {
        let first = configs.first().cloned().unwrap_or(base);
        return explore(args.model, first, protocol, clock_max_time, address)
            .map_err(CliError::Input);
    }
    let outcome = match args.model {
        ModelName::Cluster | ModelName::Replication => {
            check_cluster(&configs, protocol, strategy, threads, args.max_states)
                .map_err(CliError::Input)?
        }
        ModelName::Clock => check_clock(base.keys, clock_max_time, strategy, threads),
    };
    print!("{}", outcome.text);
    if outcome.violated {
        Err(CliError::Found)
    } else {
        Ok(())
    }
}

/// Which model to check.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelName {
    /// The whole protocol: coordinator, servers, workers.
    Cluster,
    /// The whole protocol with key ranges copied between servers: fail-over after a server
    /// crash, and a server joining.
    Replication,
    /// The range vector clock against a per-key clock.
    Clock,
}

/// The result of a whole `pserver check` run.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Everything to print, ending with the summary line.
    pub text: String,
    /// True when an `always` property was violated.
    pub violated: bool,
}

fn summary(reports: &[CheckReport]) -> String {
    let states: usize = reports.iter().map(|r| r.states).sum();
    let unique: usize = reports.iter().map(|r| r.unique).sum();
    let depth = reports.iter().map(|r| r.depth).max().unwrap_or(0);
    let secs: f64 = reports.iter().map(|r| r.secs).sum();
    format!("check states={states} unique={unique} depth={depth} secs={secs:.2}")
}

/// Checks the cluster model once per configuration in `configs`.
pub fn check_cluster(
    configs: &[ClusterModelConfig],
    protocol: Protocol,
    strategy: Strategy,
    threads: usize,
    max_states: Option<usize>,
) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    let mut reports = Vec::new();
    for cfg in configs {
        out.text += &describe_config(cfg);
        out.text.push('\n');
        let model = model_of(cfg.clone(), protocol)?;
        let report = check_cluster_model(model, strategy, threads, max_states);
        out.violated |= report.violated();
        out.text += &report.to_string();
        let _ = writeln!(
            out.text,
            "states={} unique={} depth={} secs={:.2}",
            report.states, report.unique, report.depth, report.secs
        );
        reports.push(report);
    }
    out.text += &summary(&reports);
    out.text.push('\n');
    Ok(out)
}

/// The `model cluster ...` line that heads a configuration's verdicts.
pub fn describe_config(cfg: &ClusterModelConfig) -> String {
    let mut line = format!(
        "model cluster consistency={} network={} servers={} workers={} keys={} iterations={} crashes={}",
        cfg.consistency,
        cfg.network,
        cfg.servers,
        cfg.workers,
        cfg.keys,
        cfg.iterations,
        cfg.crashes
    );
    if cfg.copies_ranges() {
        let _ = write!(line, " replicas={}", cfg.replicas);
    }
    if cfg.joins > 0 {
        let _ = write!(line, " joins={}", cfg.joins);
    }
    for (on, flag) in [
        (cfg.registration, " registration"),
        (cfg.ring_change, " ring-change"),
        (cfg.backoff, " backoff"),
    ] {
        if on {
            line += flag;
        }
    }
    line
}

/// What `pserver check` checks when no shape is given: each configuration is there for a part
/// of the protocol the others do not reach.
///
/// - sequential on the lossy network: retransmission and de-duplication;
/// - sequential on the lossy network, one worker over 2 iterations, with backoff: doubling
///   retransmission timeouts;
/// - bounded:1 on the ordered network over 2 iterations: pulls held back under bounded delay;
/// - sequential on the lossy network with a ring change: redirects and re-slicing under loss
///   and duplication;
/// - bounded:1 on the ordered network over 2 iterations with a ring change: redirects while
///   pulls are held back.
pub fn default_suite() -> Vec<ClusterModelConfig> {
    let base = ClusterModelConfig {
        keys: 1,
        iterations: 1,
        ..ClusterModelConfig::default()
    };
    let bounded_ordered = ClusterModelConfig {
        consistency: Consistency::BoundedDelay(1),
        network: NetworkKind::Ordered,
        iterations: 2,
        ..base.clone()
    };
    vec![
        base.clone(),
        ClusterModelConfig {
            workers: 1,
            iterations: 2,
            backoff: true,
            ..base.clone()
        },
        bounded_ordered.clone(),
        ClusterModelConfig {
            ring_change: true,
            ..base
        },
        ClusterModelConfig {
            ring_change: true,
            ..bounded_ordered
        },
    ]
}

/// The cluster model of `cfg`, running `protocol`.
fn model_of(cfg: ClusterModelConfig, protocol: Protocol) -> Result<ClusterModel, String> {
    #[allow(unused_mut)]
    let mut model = cluster_model(cfg).map_err(|e| e.to_string())?;
    #[cfg(feature = "mutations")]
    if let Some(m) = protocol.mutation {
        pserver_models::cluster::mutate(&mut model, m);
    }
    let _ = protocol;
    Ok(model)
}

/// Checks the range clock model on `keys` keys and timestamps up to `max_time`.
pub fn check_clock(keys: u64, max_time: u8, strategy: Strategy, threads: usize) -> Outcome {
    let model = ClockModel { keys, max_time };
    let report = check_with(model, strategy, threads, None, |a| format!("{a:?}"));
    let mut out = Outcome {
        violated: report.violated(),
        ..Outcome::default()
    };
    let _ = writeln!(out.text, "model clock keys={keys} max_time={max_time}");
    out.text += &report.to_string();
    out.text += &summary(std::slice::from_ref(&report));
    out.text.push('\n');
    out
}

/// Serves stateright's Explorer for the chosen model on `address` until the process ends.
pub fn explore(
    name: ModelName,
    cfg: ClusterModelConfig,
    protocol: Protocol,
    max_time: u8,
    address: &str,
) -> Result<(), String> {
    match name {
        ModelName::Cluster | ModelName::Replication => serve(model_of(cfg, protocol)?, address),
        ModelName::Clock => serve(
            ClockModel {
                keys: cfg.keys,
                max_time,
            },
            address,
        ),
    }
}

fn serve<M>(model: M, address: &str) -> Result<(), String>
where
    M: Model + Send + Sync + 'static,
    M::Action: std::fmt::Debug + Send + Sync,
    M::State: std::fmt::Debug + std::hash::Hash + Send + Sync,
{
    let checker = model.checker().serve(address);
    eprintln!("explorer serving http://{address} (Ctrl-C to stop)");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
        if checker.is_done() {
            return Ok(());
        }
    }
}

/// The default consistency models `pserver check` runs: sequential and bounded:1.
pub fn default_models() -> Vec<Consistency> {
    vec![Consistency::Sequential, Consistency::BoundedDelay(1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_ends_with_the_summary_line() {
        let configs: Vec<ClusterModelConfig> = default_models()
            .into_iter()
            .map(|consistency| ClusterModelConfig {
                keys: 1,
                iterations: 1,
                network: NetworkKind::Ordered,
                consistency,
                ..ClusterModelConfig::default()
            })
            .collect();
        let out = check_cluster(&configs, Protocol::default(), Strategy::Bfs, 2, None).unwrap();
        assert!(!out.violated, "{}", out.text);
        let last = out.text.lines().last().unwrap();
        assert!(last.starts_with("check states="), "{}", out.text);
        for property in [
            "staleness",
            "pull complete",
            "in-flight bound",
            "livelock-free",
        ] {
            let line = format!("property {property}: holds");
            assert_eq!(out.text.lines().filter(|l| *l == line).count(), 2, "{line}");
        }
    }

    /// What each configuration of the default suite is there for; the model's tests show
    /// that these shapes reach it.
    #[test]
    fn the_default_suite_holds_back_pulls_under_bounded_delay_changes_the_ring_and_backs_off() {
        let suite = default_suite();
        assert!(
            suite
                .iter()
                .any(|c| c.consistency == Consistency::BoundedDelay(1)
                    && c.iterations >= 2
                    && !c.ring_change)
        );
        assert!(
            suite
                .iter()
                .any(|c| c.ring_change && c.network == NetworkKind::Lossy)
        );
        assert!(suite.iter().any(|c| c.ring_change
            && c.consistency == Consistency::BoundedDelay(1)
            && c.iterations >= 2));
        assert!(
            suite
                .iter()
                .any(|c| c.backoff && c.network == NetworkKind::Lossy)
        );
        let out = check_cluster(&suite[3..4], Protocol::default(), Strategy::Bfs, 2, None).unwrap();
        assert!(out.text.contains("ring-change"), "{}", out.text);
        assert!(
            out.text.contains("property redirect followed: found"),
            "{}",
            out.text
        );
    }

    #[test]
    fn the_clock_model_holds() {
        let out = check_clock(3, 2, Strategy::Bfs, 1);
        assert!(!out.violated);
        assert!(
            out.text
                .contains("property clock agrees with per-key clock: holds")
        );
        assert!(out.text.contains("unique=81 "));
    }
}
