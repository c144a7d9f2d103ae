//! The signals that ask a command to stop. SIGTERM is what `timeout`, systemd and
//! `docker stop` send, so a command that keeps its finished work on Ctrl-C keeps it on SIGTERM
//! too.

/// Which signal asked the process to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGINT: Ctrl-C at a terminal.
    Interrupt,
    /// SIGTERM: a supervisor or `kill`.
    Terminate,
}

impl Stop {
    /// How the stop reads on a terminal.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Stop::Interrupt => "interrupted",
            Stop::Terminate => "terminated",
        }
    }
}

/// Waits until SIGINT or SIGTERM arrives, and says which. Never returns where neither can be
/// listened for.
pub(crate) async fn stop_requested() -> Stop {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            return tokio::select! {
                r = tokio::signal::ctrl_c() => match r {
                    Ok(()) => Stop::Interrupt,
                    Err(_) => {
                        term.recv().await;
                        Stop::Terminate
                    }
                },
                _ = term.recv() => Stop::Terminate,
            };
        }
    }
    match tokio::signal::ctrl_c().await {
        Ok(()) => Stop::Interrupt,
        Err(_) => std::future::pending().await,
    }
}
