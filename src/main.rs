//! The `pserver` command-line tool: parses the command line and hands each subcommand to its
//! module under `commands`, whose name is the subcommand's.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
mod apps;
mod commands;
mod data;
mod seeded;

use clap::CommandFactory;
use commands::{
    bench, check, r#gen, launch, local, manual, node, predict, ring, sim, status, train,
};
use pserver_core::Role;
use tracing_subscriber::EnvFilter;

/// Frames of megabytes are allocated and freed many times a second. The system allocator hands
/// such blocks back to the kernel and faults them in again, zeroed, a few percent of a dense
/// push's time in a profile of `pserver bench`; mimalloc keeps them for reuse.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (and the processes it starts). mimalloc
/// asks for them on its arenas, and then the first write to any byte of 2 MB zeroes and holds
/// all of it. A server's rows are a span laid out up front of which it owns scattered ring
/// segments, and a streamed run reuses a few windows: both rely on the pages they never write
/// costing nothing. Measured on the 2M-row file streamed with the defaults, the peak fell from
/// 210 to 142 MB with CPU unchanged, and a 1 + 1 run on 500,000 rows from 231 to 174 MB.
/// Vowpal Wabbit, which `bench train` starts, runs as fast either way.
fn small_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        tracing::debug!("transparent huge pages left as they were: {e}");
    }
}

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

/// The subcommands, in the order `--help` lists them. Each one's help is the doc comment of
/// its arguments, except for the three node roles, which share theirs.
#[derive(Subcommand, Debug)]
enum Command {
    Ring(ring::RingArgs),
    Sim(sim::SimArgs),
    Check(check::CheckArgs),
    /// Run the coordinator of a cluster described by a cluster file, until the job finishes.
    ///
    /// The coordinator owns membership, the ring and the epoch: it waits until every server and
    /// worker of the file has registered, then starts the job. Once every worker has left, its
    /// work done, and every server has heard so, it exits 0 (unless --serve-forever); SIGINT
    /// or SIGTERM stop it sooner.
    Coordinator(node::NodeArgs),
    /// Run one server of a cluster described by a cluster file, until the job finishes.
    ///
    /// Once every worker has left, its work done, it exits 0 (unless --serve-forever). SIGTERM
    /// makes it leave the job first (its ranges move to the other servers, nothing
    /// acknowledged is lost); SIGINT stops it where it is. On exit it prints, for a script job,
    /// `server nN keys=K total=T refused=R ended=WHY` (and with --dump writes one `key_index
    /// total` line per key it holds), and for an lr or mf job `server nN rows=R nonzero=Z
    /// refused=F ended=WHY` (the model rows it holds, those not zero), WHY being job-finished,
    /// left, interrupted or terminated. A server the
    /// coordinator removed from the cluster (fenced, after a silence past the heartbeat
    /// timeout) exits at once with status 3 and says so, freeing its port: restart it with the
    /// same id to rejoin.
    Server(node::NodeArgs),
    /// Run one worker of a cluster described by a cluster file: the file's job, then exit.
    ///
    /// A script job (pull every key, compute, push, advance, for each iteration) ends with
    /// `worker nN iterations=I pushes=P pushed_sum=S`. An lr job trains the worker's share of
    /// the data file, prints a line per epoch (`worker nN iter=E rows=R train_logloss=L ...
    /// rows_per_sec=X secs=S`, with the test log loss and AUC when the file names test data)
    /// and ends with `worker nN trained epochs=E`. An mf job trains the worker's shares of the
    /// ratings and prints `worker nN iter=E rows=R ... rows_per_sec=X secs=S` per epoch, the
    /// worker holding the first share with train_rmse, test_rmse and baseline_rmse. A worker
    /// the coordinator removed from the cluster (fenced) exits with status 3 and says so.
    Worker(node::NodeArgs),
    /// Run a whole cluster on this machine, one process per node: a coordinator, --servers
    /// servers and --workers workers, started from this binary with a cluster file and a
    /// secret written for them. Each line a node prints is prefixed with its name, and the
    /// command ends with the job's exit status once every process has ended by itself.
    ///
    /// Without --config it trains logistic regression on --data (the shipped Adult data by
    /// default); with --config it runs that cluster file's job on the nodes started here.
    Launch(launch::LaunchArgs),
    Status(status::StatusArgs),
    Local(local::LocalArgs),
    Bench(bench::BenchArgs),
    Train(Box<train::TrainArgs>),
    Predict(predict::PredictArgs),
    Gen(r#gen::GenArgs),
    Completions(manual::CompletionsArgs),
    Man(manual::ManArgs),
}

fn main() -> ExitCode {
    small_pages();
    let cli = Cli::parse();
    // Warnings (a refused peer, a node declared dead) show without RUST_LOG. The coordinator
    // also says what the job does: each configuration it publishes (a membership change) and
    // a summary of the job now and then, so that an operator sees the job move.
    let default = match cli.command {
        Command::Coordinator(_) => "warn,pserver_runtime=info",
        _ => "warn",
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(asked) if !asked.trim().is_empty() => EnvFilter::builder().parse_lossy(asked),
        _ => EnvFilter::new(default),
    };
    // Colours only for a person at a terminal: a log piped to a file or a collector reads
    // `node=n2`, not escape codes around it.
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colours)
        .init();
    let result = match cli.command {
        Command::Ring(args) => ring::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Check(args) => check::run(args),
        Command::Coordinator(args) => node::run(args, Role::Coordinator),
        Command::Server(args) => node::run(args, Role::Server),
        Command::Worker(args) => node::run(args, Role::Worker),
        Command::Launch(args) => launch::run(args),
        Command::Status(args) => status::run(args),
        Command::Local(args) => local::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Train(args) => train::run(*args),
        Command::Predict(args) => predict::run(args),
        Command::Gen(args) => r#gen::run(args),
        Command::Completions(args) => manual::completions(args, Cli::command()),
        Command::Man(args) => manual::man(args, Cli::command()),
    };
    commands::exit(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::collections::BTreeMap;

    /// What a flag takes: the type its value parses to and how its value is named in help.
    type Takes = (String, Vec<String>);

    /// Every long flag of every command and subcommand, with what it takes, by command path.
    fn flags() -> Vec<(String, String, Takes)> {
        fn walk(cmd: &clap::Command, path: String, out: &mut Vec<(String, String, Takes)>) {
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else {
                    continue;
                };
                let names = arg
                    .get_value_names()
                    .map(|n| n.iter().map(ToString::to_string).collect())
                    .unwrap_or_default();
                let parser = format!("{:?}", arg.get_value_parser().type_id());
                out.push((long.to_owned(), path.clone(), (parser, names)));
            }
            for sub in cmd.get_subcommands() {
                walk(sub, format!("{path} {}", sub.get_name()), out);
            }
        }
        let mut out = Vec::new();
        walk(&Cli::command(), "pserver".into(), &mut out);
        out
    }

    /// A flag name two commands share means one thing: the same value type (and so the same
    /// values accepted and refused), named the same in their help.
    #[test]
    fn a_flag_shared_by_commands_takes_one_type_of_value_everywhere() {
        let mut by_name: BTreeMap<String, BTreeMap<Takes, Vec<String>>> = BTreeMap::new();
        for (long, path, takes) in flags() {
            by_name
                .entry(long)
                .or_default()
                .entry(takes)
                .or_default()
                .push(path);
        }
        let clashes: Vec<String> = by_name
            .iter()
            .filter(|(_, meanings)| meanings.len() > 1)
            .map(|(long, meanings)| format!("--{long}: {meanings:?}"))
            .collect();
        assert!(clashes.is_empty(), "{}", clashes.join("\n"));
        // The walk sees the commands that share flags, down to the modes of sim and bench.
        let paths: Vec<String> = flags().into_iter().map(|(_, path, _)| path).collect();
        for expected in [
            "pserver sim seeds",
            "pserver bench filters",
            "pserver train lr",
            "pserver check",
        ] {
            assert!(paths.iter().any(|p| p == expected), "{expected}");
        }
    }

    #[test]
    fn the_check_of_flags_tells_two_value_types_apart() {
        let takes = |cmd: clap::Command, long: &str| {
            let mut all = Vec::new();
            let root = clap::Command::new("t").subcommand(cmd);
            for sub in root.get_subcommands() {
                for arg in sub.get_arguments().filter(|a| a.get_long() == Some(long)) {
                    all.push(format!("{:?}", arg.get_value_parser().type_id()));
                }
            }
            all
        };
        // `--slow-worker` once took a factor in sim and W:F in train.
        let factor = clap::Command::new("a").arg(
            clap::Arg::new("slow-worker")
                .long("slow-worker")
                .value_parser(clap::value_parser!(f64)),
        );
        let worker = clap::Command::new("b").arg(
            clap::Arg::new("slow-worker")
                .long("slow-worker")
                .value_parser(clap::value_parser!(commands::values::SlowWorker)),
        );
        assert_ne!(takes(factor, "slow-worker"), takes(worker, "slow-worker"));
    }

    /// The words of a shell line, quotes removed, up to the first unquoted pipe, redirect,
    /// list operator or comment.
    fn shell_words(line: &str) -> Vec<String> {
        let (mut words, mut word, mut quote, mut started) =
            (Vec::new(), String::new(), None, false);
        for ch in line.chars() {
            match (quote, ch) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => {
                    quote = Some(ch);
                    started = true;
                }
                (None, '|' | '>' | '<' | ';' | '&' | '#') => break,
                (None, c) if c.is_whitespace() => {
                    if started || !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    started = false;
                }
                (None, c) => word.push(c),
            }
        }
        if started || !word.is_empty() {
            words.push(word);
        }
        words
    }

    /// The arguments a documented command line gives `pserver`, if it runs pserver: a line
    /// that starts with `pserver` or with `cargo run --release` (its arguments are those after
    /// `--`).
    fn pserver_args(line: &str) -> Option<Vec<String>> {
        let words = shell_words(line.trim());
        match words.first().map(String::as_str) {
            Some("pserver") => Some(words),
            Some("cargo") if words.get(1..3) == Some(&["run".into(), "--release".into()]) => {
                let at = words.iter().position(|w| w == "--")?;
                Some(
                    std::iter::once("pserver".to_owned())
                        .chain(words[at + 1..].iter().cloned())
                        .collect(),
                )
            }
            _ => None,
        }
    }

    /// Whether the command line accepts `args`; `--help` and `--version` count as accepted.
    fn accepted(args: &[String]) -> Result<(), String> {
        match Cli::try_parse_from(args) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e.to_string().lines().next().unwrap_or_default().to_owned()),
        }
    }

    /// Every line of a fenced code block in the front page and the guides that runs
    /// pserver, with the file and line it is on.
    fn documented_commands() -> Vec<(String, Vec<String>)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![root.join("README.md")];
        let mut guides: Vec<_> = std::fs::read_dir(root.join("docs"))
            .expect("the docs folder")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        guides.sort();
        files.extend(guides);
        let mut found = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a readable guide");
            let mut in_code = false;
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("```") {
                    in_code = !in_code;
                    continue;
                }
                if let Some(args) = in_code.then(|| pserver_args(line)).flatten() {
                    let at = format!("{}:{}", file.display(), n + 1);
                    found.push((at, args));
                }
            }
        }
        found
    }

    /// A renamed or removed flag, or a command that no longer exists, fails here while the
    /// guides still show it.
    #[test]
    fn every_command_in_the_readme_and_the_guides_is_one_pserver_accepts() {
        let commands = documented_commands();
        let refused: Vec<String> = commands
            .iter()
            .filter_map(|(at, args)| accepted(args).err().map(|e| format!("{at}: {e}")))
            .collect();
        assert!(refused.is_empty(), "{}", refused.join("\n"));
        // The guides are read: the front page's first command and many more are found.
        assert!(
            commands.len() >= 40,
            "only {} commands found",
            commands.len()
        );
        let first = commands.iter().find(|(at, _)| at.contains("README.md"));
        assert_eq!(
            first.map(|(_, args)| args.join(" ")),
            Some("pserver train".to_owned()),
            "the quick start's `cargo run --release -- train`"
        );
    }

    #[test]
    fn the_check_of_documented_commands_refuses_what_the_command_line_refuses() {
        let args = |line: &str| pserver_args(line).expect("a pserver line");
        assert!(accepted(&args("pserver train --epochs 3")).is_ok());
        assert!(accepted(&args("cargo run --release -- sim seeds --seeds 5")).is_ok());
        assert!(accepted(&args("pserver man | man -l -")).is_ok());
        assert!(accepted(&args("pserver train --help")).is_ok());
        assert!(accepted(&args("pserver train --epoch 3")).is_err());
        assert!(accepted(&args("pserver sim --tau-sweep")).is_err());
        assert!(accepted(&args("pserver sim seeds --kkt 50:4")).is_err());
        assert_eq!(
            args("pserver train --data 'my data.svm' # comment"),
            ["pserver", "train", "--data", "my data.svm"]
        );
        assert_eq!(pserver_args("cargo test --workspace"), None);
        assert_eq!(pserver_args("/usr/bin/time pserver train"), None);
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
