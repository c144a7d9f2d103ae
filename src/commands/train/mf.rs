//! `pserver train mf`: matrix factorization of generated ratings.

use pserver_core::Consistency;

use super::NodesArgs;
use crate::apps::mf::{MfConfig, train};
use crate::commands::CliError;

/// Factorize a matrix of ratings into user and item factors.
///
/// The factors live on the servers; workers push the gradient of the squared error of their
/// minibatches. Prints `iter=E test_rmse=... secs=...` after every epoch.
#[derive(clap::Args, Debug)]
pub struct MfArgs {
    #[command(flatten)]
    nodes: NodesArgs,
    /// Consistency model: sequential, bounded:TAU or eventual.
    #[arg(long, default_value = "bounded:2")]
    consistency: Consistency,
    /// Passes over the training ratings.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    epochs: u32,
}

/// Trains and prints the test error after every epoch.
pub(super) fn run(args: &MfArgs) -> Result<(), CliError> {
    let cfg = MfConfig {
        servers: args.nodes.servers as usize,
        workers: args.nodes.workers as usize,
        consistency: args.consistency,
        epochs: args.epochs,
        ..MfConfig::default()
    };
    let rt = crate::commands::runtime()?;
    eprintln!(
        "mf: {} users x {} items, rank {}, {} ratings, noise {}",
        cfg.users, cfg.items, cfg.rank, cfg.ratings, cfg.noise
    );
    let reports = rt.block_on(train(&cfg)).map_err(CliError::failed)?;
    for r in reports {
        println!(
            "iter={} test_rmse={:.4} noise_floor={} secs={:.2}",
            r.epoch, r.test_rmse, cfg.noise, r.secs
        );
    }
    Ok(())
}
