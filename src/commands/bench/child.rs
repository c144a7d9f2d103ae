//! Another program run to its end and measured from outside (wall clock, its CPU time and its
//! peak RSS): Vowpal Wabbit, and `pserver train` itself as a user runs it, so that both are
//! measured the same way, parsing and startup included.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::BenchError;
use super::usage::{cpu_secs_of_children, peak_rss_mb_of};

/// What a child used: wall-clock seconds, CPU seconds, peak RSS in MB, and its stdout.
pub(super) type Used = (f64, Option<f64>, Option<f64>, String);

/// Runs `command` (the program, then its first arguments) with `args` to its end; its stderr
/// goes to `log`. The peak is read while it runs (the last reading before it exits: a few
/// milliseconds of growth may be missed).
pub(super) fn run(command: &[OsString], args: &[OsString], log: &Path) -> Result<Used, BenchError> {
    let (program, first) = command
        .split_first()
        .ok_or_else(|| BenchError::Inexact("no command to run".into()))?;
    let out = log.with_extension("out");
    let cpu0 = cpu_secs_of_children();
    let began = Instant::now();
    let mut child = Command::new(program)
        .args(first)
        .args(args)
        // Both read only once it ends: a pipe it filled would stall it.
        .stdout(Stdio::from(std::fs::File::create(&out)?))
        .stderr(Stdio::from(std::fs::File::create(log)?))
        .spawn()?;
    let mut peak = None;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        peak = peak_rss_mb_of(child.id()).or(peak);
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = began.elapsed().as_secs_f64();
    if !status.success() {
        let said = std::fs::read_to_string(log).unwrap_or_default();
        let last = said.lines().last().unwrap_or("").to_owned();
        return Err(BenchError::Inexact(format!(
            "{} exited with {status}: {last}",
            Path::new(program).display()
        )));
    }
    let cpu = cpu_secs_of_children().zip(cpu0).map(|(b, a)| b - a);
    Ok((secs, cpu, peak, std::fs::read_to_string(&out)?))
}

/// A scratch directory under the system's temporary one, removed when dropped.
pub(super) struct Scratch(pub(super) PathBuf);

impl Scratch {
    /// A new directory named for `what` and this process.
    pub(super) fn new(what: &str) -> Result<Self, BenchError> {
        let dir = std::env::temp_dir().join(format!("pserver-bench-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
