//! Which configurations of the cluster model a check covers: a default suite, or the shape
//! the arguments give.

use pserver_models::cluster::{ClusterModelConfig, NetworkKind, PaceModel};

use super::{CheckArgs, CliError, Consistency, ModelName};

/// The configurations to check, and the first of them as the arguments shape it (before the
/// consistency models are multiplied in), whose keys and iterations size the clock model.
pub(super) fn from_args(
    args: &CheckArgs,
) -> Result<(Vec<ClusterModelConfig>, ClusterModelConfig), CliError> {
    let replication = args.model == ModelName::Replication;
    if !replication && (args.joins.is_some() || args.replicas.is_some()) {
        return Err(CliError::input(
            "--joins and --replicas shape the replication model: check replication",
        ));
    }
    let pace = pace(args);
    if replication && args.key_cache.is_some() {
        return Err(CliError::input(
            "--key-cache shapes the cluster model, not the replication model",
        ));
    }
    if replication && pace.is_some() {
        return Err(CliError::input(
            "--skip-ahead and --adaptive-tau shape the cluster model, not the replication model",
        ));
    }
    if pace.is_some()
        && args
            .consistency
            .iter()
            .any(|c| !matches!(c, Consistency::BoundedDelay(_)))
    {
        return Err(CliError::input(
            "--skip-ahead and --adaptive-tau need bounded delay: give --consistency bounded:TAU",
        ));
    }
    // The replication model checks fail-over and a join, each exhaustively, unless its servers
    // are shaped on the command line: then the one configuration asked for.
    let servers_given = args.servers.is_some()
        || args.crashes.is_some()
        || args.joins.is_some()
        || args.replicas.is_some();
    let bases = match (replication, servers_given, pace) {
        (true, false, _) => ClusterModelConfig::replication_suite(),
        (true, true, _) => vec![ClusterModelConfig::replication()],
        (false, _, Some(pace)) => vec![paced(pace)],
        (false, _, None) if args.key_cache.is_some() => {
            vec![ClusterModelConfig::key_caching(NetworkKind::Lossy)]
        }
        (false, _, None) => vec![ClusterModelConfig::default()],
    };
    // Like the replication model's, the shapes of straggler decisions have defaults of their
    // own, which the options given change.
    let own_defaults = replication || pace.is_some() || args.key_cache.is_some();
    let bases: Vec<ClusterModelConfig> = bases
        .into_iter()
        .map(|defaults| shaped(args, defaults, own_defaults))
        .collect();
    if bases
        .iter()
        .any(|b| b.joins > 0 && (b.registration || b.ring_change))
    {
        return Err(CliError::input(
            "a server join does not combine with --registration or --ring-change (give --joins 0 to check fail-over alone)",
        ));
    }
    let base = bases[0].clone();
    let models = if args.consistency.is_empty() {
        default_models()
    } else {
        args.consistency.clone()
    };
    let configs = if own_defaults && args.consistency.is_empty() {
        bases
    } else if shape_given(args) || replication {
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
    Ok((configs, base))
}

/// Whether any option that shapes the model was given.
fn shape_given(args: &CheckArgs) -> bool {
    args.servers.is_some()
        || args.workers.is_some()
        || args.keys.is_some()
        || args.iterations.is_some()
        || args.crashes.is_some()
        || args.joins.is_some()
        || args.network.is_some()
        || !args.consistency.is_empty()
        || args.registration
        || args.ring_change
        || args.backoff
        || args.skip_ahead
        || args.adaptive_tau.is_some()
        || args.key_cache.is_some()
}

/// The straggler decisions the arguments turn on.
fn pace(args: &CheckArgs) -> Option<PaceModel> {
    (args.skip_ahead || args.adaptive_tau.is_some()).then_some(PaceModel {
        skip_ahead: args.skip_ahead,
        adaptive_tau: args.adaptive_tau,
    })
}

/// The model's own shape for `pace`: skip-ahead's when it is on, else adaptive tau's.
fn paced(pace: PaceModel) -> ClusterModelConfig {
    let shape = if pace.skip_ahead {
        ClusterModelConfig::skip_ahead()
    } else {
        ClusterModelConfig::adaptive_tau()
    };
    ClusterModelConfig {
        pace: Some(pace),
        ..shape
    }
}

/// `defaults` with what the arguments say in its place. Keys, iterations and crashes not given
/// are the defaults of a model that has its own (the replication model, straggler decisions),
/// or for the other models the smallest shape: one key, one iteration, no crash.
fn shaped(
    args: &CheckArgs,
    defaults: ClusterModelConfig,
    own_defaults: bool,
) -> ClusterModelConfig {
    let (keys, iterations, crashes) = if own_defaults {
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
        pace: defaults.pace,
        key_caching: args.key_cache,
    }
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
///   pulls are held back;
/// - skip-ahead ([`ClusterModelConfig::skip_ahead`]): a straggler skipped ahead, and pulls
///   that no longer wait for what it skipped;
/// - adaptive tau ([`ClusterModelConfig::adaptive_tau`]): the staleness bound raised or
///   lowered while workers run;
/// - key caching ([`ClusterModelConfig::key_caching`]) on the lossy network, one iteration:
///   a push sent again by name that overtakes the push carrying its list, and the server
///   asking for the list.
pub(crate) fn default_suite() -> Vec<ClusterModelConfig> {
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
        ClusterModelConfig::skip_ahead(),
        ClusterModelConfig::adaptive_tau(),
        ClusterModelConfig {
            iterations: 1,
            ..ClusterModelConfig::key_caching(NetworkKind::Lossy)
        },
    ]
}

/// The default consistency models `pserver check` runs: sequential and bounded:1.
pub(crate) fn default_models() -> Vec<Consistency> {
    vec![Consistency::Sequential, Consistency::BoundedDelay(1)]
}

#[cfg(test)]
mod tests {
    use pserver_models::cluster::Strategy;

    use super::super::{Protocol, check_cluster};
    use super::*;

    #[test]
    fn the_default_suite_holds_pulls_back_changes_the_ring_backs_off_and_decides_the_pace() {
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
        for pace in [PaceModel::SKIP_AHEAD, PaceModel::ADAPTIVE_TAU] {
            assert!(suite.iter().any(|c| c.pace == Some(pace)), "{pace:?}");
        }
        let out = check_cluster(&suite[3..4], Protocol::default(), Strategy::Bfs, 2, None).unwrap();
        assert!(out.text.contains("ring-change"), "{}", out.text);
        assert!(
            out.text.contains("property redirect followed: found"),
            "{}",
            out.text
        );
    }
}
