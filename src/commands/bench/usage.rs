//! What a process has used: CPU seconds and peak resident memory, read from `/proc`, for the
//! training benchmark's figures of pserver and of the tools it is compared with.

/// Two fields of `/proc/self/stat` summed, in seconds: `at` counts fields after the command
/// name, from 0.
fn stat_secs(at: usize) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: the fields that follow start after its `)`.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 =
        fields.get(at)?.parse::<f64>().ok()? + fields.get(at + 1)?.parse::<f64>().ok()?;
    // /proc reports in USER_HZ, 100 on every Linux.
    Some(ticks / 100.0)
}

/// CPU seconds this process has used (user and system); `None` where there is no `/proc`.
pub(super) fn cpu_secs() -> Option<f64> {
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    stat_secs(11)
}

/// CPU seconds the children this process waited for have used (user and system).
pub(super) fn cpu_secs_of_children() -> Option<f64> {
    // cutime and cstime are fields 16 and 17 of the whole line.
    stat_secs(13)
}

/// Resets this process's peak RSS to its current RSS, so that each way of training reports
/// its own peak; false where the kernel does not allow it.
pub(super) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The peak resident set of this process so far, in MB, from `/proc/self/status`.
pub(super) fn peak_rss_mb() -> Option<f64> {
    peak_rss_mb_of("self")
}

/// The peak resident set of process `pid` (or `self`) so far, in MB, from its
/// `/proc/<pid>/status`.
pub(super) fn peak_rss_mb_of(pid: impl std::fmt::Display) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
