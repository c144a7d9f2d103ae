//! Logs captured in tests, to check what a node says.

use std::sync::{Arc as StdArc, Mutex as StdMutex};

use tracing_subscriber::fmt::MakeWriter;

/// Logs written by the current thread's tasks.
#[derive(Clone, Default)]
pub(crate) struct Logs(StdArc<StdMutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The warnings, one per line.
    pub(crate) fn warnings(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains("WARN"))
            .map(str::to_owned)
            .collect()
    }

    /// A line at any level contains `needle`: refusals after the first of a window are
    /// logged one by one at debug level only.
    pub(crate) fn assert_logged(&self, needle: &str) {
        let text = self.text();
        assert!(
            text.contains(needle),
            "no line contains {needle:?}:\n{text}"
        );
    }

    /// The warnings that say something was refused.
    pub(crate) fn refusal_warnings(&self) -> Vec<String> {
        let mut w = self.warnings();
        w.retain(|l| l.contains("refused"));
        w
    }

    pub(crate) fn assert_warned(&self, needle: &str) {
        let w = self.warnings();
        assert!(
            w.iter().any(|l| l.contains(needle)),
            "no warning contains {needle:?}; warnings:\n{}",
            w.join("\n")
        );
    }
}

pub(crate) fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    (logs, tracing::subscriber::set_default(sub))
}
