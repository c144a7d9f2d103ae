//! `pserver check`: the model checker over the protocol's stateright models.

use std::fmt::Write as _;
use std::time::Duration;

use pserver_core::Consistency;
use pserver_models::ClockModel;
use pserver_models::cluster::{
    CheckReport, ClusterModel, ClusterModelConfig, NetworkKind, Strategy, check_with,
    cluster_model, describe,
};

use super::sim::Protocol;
use stateright::{Checker, Model};

/// Which model to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelName {
    /// The whole protocol: coordinator, servers, workers.
    Cluster,
    /// The range vector clock against a per-key clock.
    Clock,
}

impl std::str::FromStr for ModelName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cluster" => Ok(ModelName::Cluster),
            "clock" => Ok(ModelName::Clock),
            _ => Err(format!("unknown model `{s}`: expected cluster or clock")),
        }
    }
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

/// Checks the cluster model once per consistency model in `models`.
pub fn check_cluster(
    base: &ClusterModelConfig,
    protocol: Protocol,
    models: &[Consistency],
    strategy: Strategy,
    threads: usize,
    max_states: Option<usize>,
) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    let mut reports = Vec::new();
    for &consistency in models {
        let cfg = ClusterModelConfig {
            consistency,
            ..base.clone()
        };
        let _ = writeln!(
            out.text,
            "model cluster consistency={} network={} servers={} workers={} keys={} iterations={} crashes={}",
            cfg.consistency,
            cfg.network,
            cfg.servers,
            cfg.workers,
            cfg.keys,
            cfg.iterations,
            cfg.crashes
        );
        let model = model_of(cfg, protocol)?;
        let report = check_with(model, strategy, threads, max_states, describe);
        out.violated |= report.violated();
        out.text += &report.to_string();
        reports.push(report);
    }
    out.text += &summary(&reports);
    out.text.push('\n');
    Ok(out)
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
        ModelName::Cluster => serve(model_of(cfg, protocol)?, address),
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

/// Parses `ordered` or `lossy`.
pub fn network(s: &str) -> Result<NetworkKind, String> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_ends_with_the_summary_line() {
        let base = ClusterModelConfig {
            keys: 1,
            iterations: 1,
            network: NetworkKind::Ordered,
            ..ClusterModelConfig::default()
        };
        let out = check_cluster(
            &base,
            Protocol::default(),
            &default_models(),
            Strategy::Bfs,
            2,
            None,
        )
        .unwrap();
        assert!(!out.violated);
        let last = out.text.lines().last().unwrap();
        assert!(last.starts_with("check states="), "{}", out.text);
        assert!(last.contains(" unique=1451 "), "{last}");
        assert_eq!(
            out.text
                .lines()
                .filter(|l| *l == "property staleness: holds")
                .count(),
            2
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
