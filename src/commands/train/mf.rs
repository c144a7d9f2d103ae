//! `pserver train mf`: matrix factorization of generated ratings.

use pserver_core::Consistency;

use super::TrainArgs;
use crate::apps::mf::{MfConfig, train};
use crate::commands::CliError;

/// Trains under the first consistency model given and prints the test error after every
/// epoch.
pub(super) fn run(args: &TrainArgs) -> Result<(), CliError> {
    let cfg = MfConfig {
        servers: args.servers as usize,
        workers: args.workers as usize,
        consistency: args
            .consistency
            .first()
            .copied()
            .unwrap_or(Consistency::Sequential),
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
