//! Running the model checker over the models and writing its verdicts.

use std::fmt::Write as _;
use std::time::Duration;

use pserver_models::cluster::{
    CheckReport, ClusterModel, ClusterModelConfig, Strategy, check_cluster_model, check_with,
    cluster_model,
};
use pserver_models::{ClockModel, StandbyModel};
use stateright::{Checker, Model};

use super::{ModelName, Protocol};

/// The result of a whole `pserver check` run.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
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
pub(crate) fn check_cluster(
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
pub(crate) fn describe_config(cfg: &ClusterModelConfig) -> String {
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
    let pace = cfg.pace.unwrap_or_default();
    for (on, flag) in [
        (cfg.registration, " registration"),
        (cfg.ring_change, " ring-change"),
        (cfg.backoff, " backoff"),
        (pace.skip_ahead, " skip-ahead"),
        (pace.adaptive_tau.is_some(), " adaptive-tau"),
        (cfg.key_caching.is_some(), " key-cache"),
    ] {
        if on {
            line += flag;
        }
    }
    line
}

/// The cluster model of `cfg`, running `protocol`.
fn model_of(cfg: ClusterModelConfig, protocol: Protocol) -> Result<ClusterModel, String> {
    #[allow(unused_mut)]
    let mut model = cluster_model(cfg).map_err(|e| e.to_string())?;
    #[cfg(feature = "mutations")]
    if let Some(pserver_models::sim::SimMutation::Protocol(m)) = protocol.mutation {
        pserver_models::cluster::mutate(&mut model, m);
    }
    let _ = protocol;
    Ok(model)
}

/// Checks the range clock model on `keys` keys and timestamps up to `max_time`.
pub(crate) fn check_clock(keys: u64, max_time: u8, strategy: Strategy, threads: usize) -> Outcome {
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

/// Checks the standby model: the active coordinator crashing if `crash`, `fires` timer
/// firings.
pub(crate) fn check_standby(
    crash: bool,
    fires: Option<u32>,
    protocol: Protocol,
    strategy: Strategy,
    threads: usize,
) -> Outcome {
    let model = standby_model(crash, fires, protocol);
    let fires = model.max_fires;
    let report = check_with(model, strategy, threads, None, |a| format!("{a:?}"));
    let mut out = Outcome {
        violated: report.violated(),
        ..Outcome::default()
    };
    let _ = writeln!(out.text, "model standby crash={crash} fires={fires}");
    out.text += &report.to_string();
    out.text += &summary(std::slice::from_ref(&report));
    out.text.push('\n');
    out
}

fn standby_model(crash: bool, fires: Option<u32>, protocol: Protocol) -> StandbyModel {
    #[allow(unused_mut)]
    let mut model = StandbyModel::new(crash, fires.unwrap_or(StandbyModel::default().max_fires));
    #[cfg(feature = "mutations")]
    if let Some(pserver_models::sim::SimMutation::Protocol(m)) = protocol.mutation {
        model.mutate(m);
    }
    let _ = protocol;
    model
}

/// Serves stateright's Explorer for the chosen model on `address` until the process ends.
pub(crate) fn explore(
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
        ModelName::Standby => serve(standby_model(true, None, protocol), address),
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

#[cfg(test)]
mod tests {
    use pserver_models::cluster::NetworkKind;

    use super::super::configs::default_models;
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
