//! The push-slots comparison: four workers pushing together, with and without round-robin
//! push slots, measured by the servers' peak receive queue and the time the job takes
//! (ARCHITECTURE.md §9).

use pserver_core::slots::PushSlots;

use super::{CliError, MS, Protocol, SimConfig, SimFailure, SimOptions};

/// The slots a comparison uses unless `--push-slots` says otherwise: a slice of a quarter of
/// a push to one server or more waits, one slot per server.
pub(super) const DEFAULT_SLOTS: PushSlots = PushSlots {
    min_bytes: 8 << 10,
    at_once: 1,
};

/// The workload of [`SimConfig::pushing_together`] with and without push slots, averaged
/// over seeds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SlotsComparison {
    /// Mean over seeds of the largest receive queue of any server without slots, in bytes.
    pub peak_without: f64,
    /// The same with slots.
    pub peak_with: f64,
    /// Mean virtual time to finish the workload without slots, in milliseconds.
    pub finish_without_ms: f64,
    /// The same with slots.
    pub finish_with_ms: f64,
}

/// Runs [`SimConfig::pushing_together`] for seeds `first..first + seeds`, without slots and
/// with `slots`. Fails on the first broken invariant.
pub(crate) fn slots_sweep(
    slots: PushSlots,
    protocol: Protocol,
    first: u64,
    seeds: u64,
) -> Result<SlotsComparison, SimFailure> {
    let mut sums = [0.0; 4];
    for seed in first..first + seeds.max(1) {
        let without = SimConfig::pushing_together(seed);
        let with = SimConfig {
            push_slots: Some(slots),
            ..without.clone()
        };
        let (without, with) = (protocol.run(&without)?, protocol.run(&with)?);
        sums[0] += without.peak_receive_queue_bytes as f64;
        sums[1] += with.peak_receive_queue_bytes as f64;
        sums[2] += without.finish as f64 / MS as f64;
        sums[3] += with.finish as f64 / MS as f64;
    }
    let n = seeds.max(1) as f64;
    Ok(SlotsComparison {
        peak_without: sums[0] / n,
        peak_with: sums[1] / n,
        finish_without_ms: sums[2] / n,
        finish_with_ms: sums[3] / n,
    })
}

/// Prints the comparison as `name value unit` lines, after a `#` line saying what ran.
pub(super) fn print(args: &SimOptions, protocol: Protocol) -> Result<(), CliError> {
    let slots = args.push_slots.unwrap_or(DEFAULT_SLOTS);
    let seeds = args.seeds.min(10);
    let shape = SimConfig::pushing_together(args.first_seed);
    println!(
        "# push slots {}:{}: {} workers pushing together to {} servers, {} keys, compute {} ms, receive {} bytes/ms, seeds {}..{}",
        slots.min_bytes,
        slots.at_once,
        shape.workers,
        shape.servers,
        shape.keys,
        shape.compute / MS,
        shape.receive_rate.unwrap_or(0),
        args.first_seed,
        args.first_seed + seeds
    );
    let c = match slots_sweep(slots, protocol, args.first_seed, seeds) {
        Ok(c) => c,
        Err(failure) => {
            eprintln!("{failure}");
            return Err(CliError::Found);
        }
    };
    println!(
        "peak_receive_queue_without_slots {:.0} bytes",
        c.peak_without
    );
    println!("peak_receive_queue_with_slots {:.0} bytes", c.peak_with);
    println!(
        "peak_receive_queue_reduction {:.2} x",
        c.peak_without / c.peak_with.max(1.0)
    );
    println!("finish_without_slots {:.1} ms", c.finish_without_ms);
    println!("finish_with_slots {:.1} ms", c.finish_with_ms);
    println!(
        "finish_with_over_without {:.3} x",
        c.finish_with_ms / c.finish_without_ms.max(f64::MIN_POSITIVE)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimOptions,
    }

    /// A failing run of the comparison prints a command that runs that very run again.
    #[test]
    fn the_replay_command_of_a_run_with_slots_runs_the_same_configuration() {
        let cfg = SimConfig {
            push_slots: Some(DEFAULT_SLOTS),
            ..SimConfig::pushing_together(3)
        };
        let replay = cfg.replay_command();
        // `pserver sim seeds` and then the options.
        let words = replay.split_whitespace().skip(3);
        let args = Cli::try_parse_from(std::iter::once("sim").chain(words))
            .unwrap_or_else(|e| panic!("{replay}: {e}"))
            .sim;
        let again = SimConfig {
            seed: args.first_seed,
            ..super::super::config(&args)
        };
        assert_eq!(again, cfg, "{replay}");
    }
}
