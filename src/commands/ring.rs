//! `pserver ring`: how a ring configuration spreads the key space, and what a membership change
//! would move.

use std::fmt::Write as _;

use pserver_core::ring::{Ring, RingConfig, RingError};
use pserver_core::{KeyRange, NodeId};

use super::CliError;

/// Show how a ring spreads the key space over servers, and what joining or leaving moves.
///
/// Prints one `name value unit` line per measure: each server's primary share of the key
/// space (of the keys 0..K with --key-space K), the number of segments, the imbalance (largest
/// share over the mean), and with --add or --remove the share of keys that would change
/// primary.
#[derive(clap::Args, Debug)]
pub(crate) struct RingArgs {
    /// Number of servers (ids 0..N).
    #[arg(long, default_value_t = 8)]
    servers: u32,
    /// Virtual nodes per server: more even out the shares, at the cost of more segments.
    #[arg(long, default_value_t = 64)]
    vnodes: u32,
    /// Replicas per key range besides the primary; must be smaller than --servers.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// Seed of the point placement (every node of a cluster uses the same one).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The job's key space: its keys are 0..K (the data's features, say), and the ring places
    /// its points there. Default: the whole 64-bit key space.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    key_space: Option<u64>,
    /// Preview adding a server with this id.
    #[arg(long, value_name = "ID", conflicts_with = "remove")]
    add: Option<u32>,
    /// Preview removing the server with this id.
    #[arg(long, value_name = "ID")]
    remove: Option<u32>,
}

/// Runs `pserver ring`: prints the [`report`] of the ring the arguments describe.
pub(crate) fn run(args: RingArgs) -> Result<(), CliError> {
    let config = RingConfig {
        vnodes: args.vnodes,
        replicas: args.replicas,
        seed: args.seed,
        key_space: args.key_space.unwrap_or(u64::MAX),
    };
    let change = match (args.add, args.remove) {
        (Some(id), _) => Some(Change::Add(NodeId(id))),
        (_, Some(id)) => Some(Change::Remove(NodeId(id))),
        _ => None,
    };
    let text = report(args.servers, config, change).map_err(CliError::input)?;
    print!("{text}");
    Ok(())
}

/// A membership change to preview.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// A server joins.
    Add(NodeId),
    /// A server leaves.
    Remove(NodeId),
}

/// Builds the ring of servers `0..servers` and reports each server's primary share, the
/// imbalance, and (for a `change`) the share of keys that would move. Lines are
/// `name value unit`, so that scripts can read them.
pub(crate) fn report(
    servers: u32,
    config: RingConfig,
    change: Option<Change>,
) -> Result<String, RingError> {
    let ring = Ring::new((0..servers).map(NodeId), config)?;
    let space = KeyRange::new(0, config.key_space).map_err(|_| RingError::EmptyKeySpace)?;
    let fraction = |keys: u64| keys as f64 / config.key_space as f64;
    let mut out = String::new();
    let mut shares: Vec<(NodeId, u64)> = ring.servers().iter().map(|&s| (s, 0)).collect();
    for (part, owners) in ring.segments_in(space) {
        if let Some(held) = shares.iter_mut().find(|(s, _)| *s == owners[0]) {
            held.1 += part.len();
        }
    }
    let mean = 1.0 / shares.len() as f64;
    let mut max = 0.0f64;
    for (server, keys) in &shares {
        let share = fraction(*keys);
        max = max.max(share);
        let _ = writeln!(out, "share.{server} {:.4} fraction", share);
    }
    let _ = writeln!(out, "segments {} count", ring.segments().count());
    let _ = writeln!(out, "imbalance {:.3} max/mean", max / mean);
    if let Some(change) = change {
        let (name, new) = match change {
            Change::Add(s) => ("add", ring.with_server(s)?),
            Change::Remove(s) => ("remove", ring.without_server(s)?),
        };
        let _ = writeln!(
            out,
            "{name}.moved {:.4} fraction",
            fraction(
                ring.primary_changes(&new)
                    .filter_map(|(r, _, _)| r.intersect(space))
                    .map(KeyRange::len)
                    .sum()
            )
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lists_every_server_and_the_moved_share() {
        let config = RingConfig {
            vnodes: 64,
            replicas: 1,
            seed: 0,
            ..RingConfig::default()
        };
        let text = report(8, config, Some(Change::Add(NodeId(8)))).unwrap();
        assert_eq!(text.lines().filter(|l| l.starts_with("share.")).count(), 8);
        let moved: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("add.moved "))
            .and_then(|v| v.split(' ').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(moved > 0.0 && moved <= 1.5 / 9.0);
    }

    #[test]
    fn an_impossible_configuration_is_an_error() {
        let config = RingConfig {
            vnodes: 64,
            replicas: 3,
            seed: 0,
            ..RingConfig::default()
        };
        assert!(matches!(
            report(2, config, None),
            Err(RingError::TooFewServers { .. })
        ));
    }
}
