//! `pserver train sketch`: a count-min sketch of a generated stream.

use super::NodesArgs;
use crate::apps::sketch::{SketchConfig, run as count};
use crate::commands::CliError;
use crate::commands::values::Fraction;

/// Count a generated stream in a count-min sketch held by the servers, and check every
/// estimate against its exact count.
///
/// Prints `sketch items=N width=W depth=D queried=Q over_bound=O max_overcount=M bound=B
/// under_counted=U`: over_bound estimates break the error bound (expected about delta of
/// them), and under_counted ones are below the true count (never, for a correct sketch).
#[derive(clap::Args, Debug)]
pub(crate) struct SketchArgs {
    #[command(flatten)]
    nodes: NodesArgs,
    /// Items in the stream.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    items: u64,
    /// Additive error bound, as a fraction of the stream's length.
    #[arg(long, default_value = "0.001", allow_negative_numbers = true)]
    eps: Fraction,
    /// Probability that an estimate breaks the bound.
    #[arg(long, default_value = "0.01", allow_negative_numbers = true)]
    delta: Fraction,
}

/// Counts the stream and prints how the estimates compare with the exact counts.
pub(super) fn run(args: &SketchArgs) -> Result<(), CliError> {
    let cfg = SketchConfig {
        servers: args.nodes.servers as usize,
        workers: args.nodes.workers as usize,
        items: args.items,
        eps: args.eps.get(),
        delta: args.delta.get(),
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
