//! How a command fails, and the one place that turns a failure into a message and an exit
//! status.

use std::fmt::Display;
use std::process::ExitCode;

use thiserror::Error;

/// Why a command did not succeed. The variant fixes the exit status, so that a script can tell
/// a command that could not run from a run that went wrong.
#[derive(Debug, Error)]
pub(crate) enum CliError {
    /// The command cannot run as asked: arguments that do not fit together, a file that cannot
    /// be read, parsed or written, a node that cannot start or join its cluster. Exit status 2.
    #[error("{0}")]
    Input(String),
    /// The run started but failed. Exit status 1.
    #[error("{0}")]
    Failed(String),
    /// The run finished and found a failure that its output already reports (a violated
    /// property, failed seeds, wrong totals). Exit status 1, with nothing more printed.
    #[error("the run found a failure")]
    Found,
    /// Ctrl-C ended the run, after what was finished had been kept. Exit status 130, the
    /// shell's convention for a process ended by SIGINT.
    #[error("interrupted")]
    Interrupted,
    /// SIGTERM ended the run, after what was finished had been kept. Exit status 143, the
    /// shell's convention for a process ended by SIGTERM.
    #[error("terminated")]
    Terminated,
    /// The coordinator removed this node from the cluster, and the cluster went on without
    /// it. Exit status 3: restarting the node with the same id rejoins.
    #[error("{0}")]
    Fenced(String),
    /// A process this command ran ended with this exit status and said why itself
    /// (`pserver launch`): the same status, with nothing more printed.
    #[error("a process ended with exit status {0}")]
    Exited(u8),
}

impl CliError {
    /// A [`CliError::Input`] saying `e`.
    pub(crate) fn input(e: impl Display) -> Self {
        CliError::Input(e.to_string())
    }

    /// A [`CliError::Failed`] saying `e`.
    pub(crate) fn failed(e: impl Display) -> Self {
        CliError::Failed(e.to_string())
    }

    /// The process's exit status for this error.
    pub(crate) fn exit_status(&self) -> u8 {
        match self {
            CliError::Input(_) => 2,
            CliError::Failed(_) | CliError::Found => 1,
            CliError::Fenced(_) => 3,
            CliError::Interrupted => 130,
            CliError::Terminated => 143,
            CliError::Exited(status) => *status,
        }
    }
}

/// The exit status of a command's `result`; an error with something to say is printed to
/// stderr first, as `error: ...`.
pub(crate) fn exit(result: Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let CliError::Input(message)
            | CliError::Failed(message)
            | CliError::Fenced(message) = &e
            {
                eprintln!("error: {message}");
            }
            ExitCode::from(e.exit_status())
        }
    }
}
