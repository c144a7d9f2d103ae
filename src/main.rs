//! The `pserver` command-line tool.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pserver::core::{NodeId, RingConfig};
use pserver::ring_report::{self, Change};
use tracing_subscriber::EnvFilter;

/// pserver: a parameter server for sparse machine learning, after Li et al. (OSDI 2014).
///
/// Servers hold the parameters of a model sharded by key range on a consistent-hashing ring;
/// workers push updates and pull parameters under a chosen consistency model. Set RUST_LOG
/// (e.g. RUST_LOG=debug) for logs.
#[derive(Parser, Debug)]
#[command(name = "pserver", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show how a ring spreads the key space over servers, and what joining or leaving moves.
    ///
    /// Prints one `name value unit` line per measure: each server's primary share of the key
    /// space, the number of segments, the imbalance (largest share over the mean), and with
    /// --add or --remove the share of keys that would change primary.
    Ring(RingArgs),
}

#[derive(Args, Debug)]
struct RingArgs {
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
    /// Preview adding a server with this id.
    #[arg(long, value_name = "ID", conflicts_with = "remove")]
    add: Option<u32>,
    /// Preview removing the server with this id.
    #[arg(long, value_name = "ID")]
    remove: Option<u32>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Ring(args) => {
            let config = RingConfig {
                vnodes: args.vnodes,
                replicas: args.replicas,
                seed: args.seed,
            };
            let change = match (args.add, args.remove) {
                (Some(id), _) => Some(Change::Add(NodeId(id))),
                (_, Some(id)) => Some(Change::Remove(NodeId(id))),
                _ => None,
            };
            match ring_report::report(args.servers, config, change) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
