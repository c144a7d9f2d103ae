//! `pserver train sketch`: a count-min sketch of a generated stream.

use super::TrainArgs;
use crate::apps::sketch::{SketchConfig, run as count};
use crate::commands::CliError;

/// Counts the stream and prints how the estimates compare with the exact counts.
pub(super) fn run(args: &TrainArgs) -> Result<(), CliError> {
    let cfg = SketchConfig {
        servers: args.servers as usize,
        workers: args.workers as usize,
        items: args.items,
        eps: args.eps,
        delta: args.delta,
        ..SketchConfig::default()
    };
    let r = crate::commands::runtime()?
        .block_on(count(&cfg))
        .map_err(CliError::failed)?;
    println!(
        "sketch items={} width={} depth={} queried={} over_bound={} max_overcount={} bound={:.1} under_counted={}",
        cfg.items,
        r.width,
        r.depth,
        r.queried,
        r.over_bound,
        r.max_overcount,
        r.bound,
        r.under_counted
    );
    Ok(())
}
