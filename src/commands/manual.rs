//! `pserver completions SHELL` and `pserver man`: shell completions and man pages, generated
//! from the same definitions that parse the command line, so that they never describe a flag
//! the program does not take.

use std::io::Write;
use std::path::PathBuf;

use super::CliError;

/// Print the completion script of a shell for every command and flag of pserver.
///
/// For example `pserver completions bash > ~/.local/share/bash-completion/completions/pserver`,
/// or `pserver completions zsh > ~/.zfunc/_pserver`.
#[derive(clap::Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell: bash, elvish, fish, powershell or zsh.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Print pserver's man page (roff), or write a page for every command into a directory.
///
/// For example `pserver man | man -l -`, or `pserver man --dir target/man` for pserver.1,
/// pserver-train.1, pserver-sim-seeds.1 and the others.
#[derive(clap::Args, Debug)]
pub(crate) struct ManArgs {
    /// Write one page per command into this directory instead of printing the top page.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Runs `pserver completions`: the script for `cli` on standard output.
pub(crate) fn completions(args: CompletionsArgs, mut cli: clap::Command) -> Result<(), CliError> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cli, "pserver", &mut out);
    write_out(&out)
}

/// Runs `pserver man`: the top page on standard output, or every page into `--dir`.
pub(crate) fn man(args: ManArgs, cli: clap::Command) -> Result<(), CliError> {
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .and_then(|()| clap_mangen::generate_to(cli, &dir))
                .map_err(|e| CliError::input(format!("{}: cannot write: {e}", dir.display())))?;
            eprintln!("man: pages in {}", dir.display());
            Ok(())
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cli)
                .render(&mut out)
                .map_err(|e| CliError::input(format!("cannot render the man page: {e}")))?;
            write_out(&out)
        }
    }
}

/// Writes `bytes` to standard output; a closed pipe (`| head`) is not an error worth a line.
fn write_out(bytes: &[u8]) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::input(format!(
            "cannot write to standard output: {e}"
        ))),
        _ => Ok(()),
    }
}
