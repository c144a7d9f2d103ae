//! `pserver ring`: how a ring configuration spreads the key space, and what a membership change
//! would move.

use std::fmt::Write as _;

use pserver_core::{NodeId, Ring, RingConfig, RingError};

/// The fraction of the key space `keys` stands for.
fn fraction(keys: u64) -> f64 {
    keys as f64 / u64::MAX as f64
}

/// A membership change to preview.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A server joins.
    Add(NodeId),
    /// A server leaves.
    Remove(NodeId),
}

/// Builds the ring of servers `0..servers` and reports each server's primary share, the
/// imbalance, and (for a `change`) the share of keys that would move. Lines are
/// `name value unit`, so that scripts can read them.
pub fn report(
    servers: u32,
    config: RingConfig,
    change: Option<Change>,
) -> Result<String, RingError> {
    let ring = Ring::new((0..servers).map(NodeId), config)?;
    let mut out = String::new();
    let shares = ring.primary_shares();
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
            fraction(ring.primary_changes(&new).map(|(r, _, _)| r.len()).sum())
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
        };
        assert!(matches!(
            report(2, config, None),
            Err(RingError::TooFewServers { .. })
        ));
    }
}
