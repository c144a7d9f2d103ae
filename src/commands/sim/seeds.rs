//! Many seeded runs of the simulator, on several threads, and what they add up to.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use pserver_transport::sync::{AtomicU64, Mutex, Ordering, Tickets};

use super::{MS, PaceReport, Protocol, ServerFaults, SimConfig, SimFailure};
use pserver_core::filter::FilterSaving;

/// The outcome of running a range of seeds.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Seeds run.
    pub seeds: u64,
    /// Failed runs, by seed.
    pub failures: Vec<SimFailure>,
    /// Events processed over all runs.
    pub steps: u64,
    /// Redirects workers followed over all successful runs.
    pub redirects: u64,
    /// Wall-clock seconds.
    pub secs: f64,
    /// Server faults over all successful runs, by kind.
    pub server_faults: ServerFaults,
    /// Recovery time of every server crash recovered from, over all successful runs.
    pub recoveries: Vec<pserver_core::Time>,
    /// Time of every takeover by a standby coordinator, over all successful runs.
    pub takeovers: Vec<pserver_core::Time>,
    /// Values workers sent in pushes, over all successful runs.
    pub pushed_values: u64,
    /// Values primaries sent their replicas in updates, over all successful runs.
    pub replicated_values: u64,
    /// Values one replicated sum per key and iteration would carry, over all successful runs.
    pub aggregate_values: u64,
    /// Stragglers found and what was decided about them, over all successful runs.
    pub pace: PaceReport,
    /// The largest peak receive queue of any server, over all successful runs, in bytes.
    pub peak_receive_queue_bytes: u64,
    /// Push slots granted, over all successful runs.
    pub slot_grants: u64,
    /// What each of the workers' filters saved, by name, over all successful runs.
    pub filter_savings: std::collections::BTreeMap<&'static str, FilterSaving>,
}

impl Batch {
    /// The summary line: `sim seeds=N failed=F steps=X redirects=R secs=Y`.
    pub(crate) fn summary(&self) -> String {
        format!(
            "sim seeds={} failed={} steps={} redirects={} secs={:.2}",
            self.seeds,
            self.failures.len(),
            self.steps,
            self.redirects,
            self.secs
        )
    }

    /// How long the cluster took to serve every range again after a server crash, in virtual
    /// milliseconds: `recovery_ms mean=M max=X crashes=N` (N the crashes recovered from).
    pub(crate) fn recovery_summary(&self) -> String {
        times_line("recovery_ms", &self.recoveries, "crashes")
    }

    /// How long standby coordinators took to take over, from the coordinator fault to their
    /// first configuration, in virtual milliseconds: `takeover_ms mean=M max=X takeovers=N`.
    pub(crate) fn takeover_summary(&self) -> String {
        times_line("takeover_ms", &self.takeovers, "takeovers")
    }

    /// Replication traffic against push traffic, in values sent (resends included), and the
    /// floor one replicated sum per key and iteration would reach: `replication
    /// pushed_values=P replicated_values=R ratio=R/P aggregate_ratio=A/P`.
    pub(crate) fn replication_summary(&self) -> String {
        let of_pushed = |v: u64| {
            if self.pushed_values == 0 {
                0.0
            } else {
                v as f64 / self.pushed_values as f64
            }
        };
        format!(
            "replication pushed_values={} replicated_values={} ratio={:.3} aggregate_ratio={:.3}",
            self.pushed_values,
            self.replicated_values,
            of_pushed(self.replicated_values),
            of_pushed(self.aggregate_values)
        )
    }

    /// What the coordinators found and decided about stragglers: `pace flagged=F skips=S
    /// skipped_iterations=I parts_kept=P tau_changes=T max_tau=M shares_moved=H`.
    pub(crate) fn pace_summary(&self) -> String {
        let p = &self.pace;
        format!(
            "pace flagged={} skips={} skipped_iterations={} parts_kept={} tau_changes={} max_tau={} shares_moved={}",
            p.flagged,
            p.skips,
            p.skipped_iterations,
            p.parts_kept,
            p.tau_changes,
            p.max_tau,
            p.shares_moved
        )
    }

    /// Filters, a line each: `filter NAME rows_in=I rows_out=O bytes_saved=B`.
    pub(crate) fn filters_summary(&self) -> String {
        let lines: Vec<String> = self
            .filter_savings
            .iter()
            .map(|(name, f)| {
                format!(
                    "filter {name} rows_in={} rows_out={} bytes_saved={}",
                    f.rows_in, f.rows_out, f.bytes_saved
                )
            })
            .collect();
        lines.join("\n")
    }

    /// Receive queues and push slots: `slots peak_receive_queue_bytes=B grants=G`.
    pub(crate) fn slots_summary(&self) -> String {
        format!(
            "slots peak_receive_queue_bytes={} grants={}",
            self.peak_receive_queue_bytes, self.slot_grants
        )
    }

    /// The server faults injected, by kind: `server_faults crashes=C restarts=R
    /// crashes_during_copy=D crashes_after_copy=A cut_offs=X flaps=F joins=J leaves=L`.
    pub(crate) fn server_fault_summary(&self) -> String {
        let f = &self.server_faults;
        format!(
            "server_faults crashes={} restarts={} crashes_during_copy={} crashes_after_copy={} cut_offs={} flaps={} joins={} leaves={} overlapping={} late_from_earlier_process={} late_to_later_process={}",
            f.crashes,
            f.restarts,
            f.crashes_during_copy,
            f.crashes_after_copy,
            f.cut_offs,
            f.flaps,
            f.joins,
            f.leaves,
            f.overlapping,
            f.late_from_earlier_process,
            f.late_to_later_process
        )
    }
}

/// Runs seeds `first..first + seeds` of `base` on `threads` threads, showing progress on stderr
/// when `progress` is set. Failures come back sorted by seed.
pub(crate) fn run_seeds(
    base: &SimConfig,
    protocol: Protocol,
    first: u64,
    seeds: u64,
    threads: usize,
    progress: bool,
) -> Batch {
    let start = Instant::now();
    let tickets = Tickets::new(first, first.saturating_add(seeds));
    let steps = AtomicU64::new(0);
    let redirects = AtomicU64::new(0);
    let pushed = AtomicU64::new(0);
    let replicated = AtomicU64::new(0);
    let aggregate = AtomicU64::new(0);
    let peak = AtomicU64::new(0);
    let grants = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    let faults = Mutex::new((
        ServerFaults::default(),
        Vec::new(),
        PaceReport::default(),
        std::collections::BTreeMap::<&'static str, FilterSaving>::new(),
        Vec::new(),
    ));
    let bar = if progress {
        let bar = ProgressBar::new(seeds);
        let style =
            ProgressStyle::with_template("{bar:40} {pos}/{len} seeds {elapsed} ({eta} left) {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar
    } else {
        ProgressBar::hidden()
    };
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                while let Some(seed) = tickets.claim() {
                    match protocol.run(&SimConfig {
                        seed,
                        ..base.clone()
                    }) {
                        Ok(report) => {
                            steps.fetch_add(report.steps, Ordering::Relaxed);
                            redirects.fetch_add(report.redirects, Ordering::Relaxed);
                            pushed.fetch_add(report.pushed_values, Ordering::Relaxed);
                            replicated.fetch_add(report.replicated_values, Ordering::Relaxed);
                            aggregate.fetch_add(report.aggregate_values, Ordering::Relaxed);
                            peak.fetch_max(report.peak_receive_queue_bytes, Ordering::Relaxed);
                            grants.fetch_add(report.slot_grants, Ordering::Relaxed);
                            if let Ok(mut f) = faults.lock() {
                                f.0.add(&report.server_faults);
                                f.1.extend_from_slice(&report.recoveries);
                                f.4.extend_from_slice(&report.takeovers);
                                f.2.add(&report.pace);
                                for (name, saving) in &report.filter_savings {
                                    f.3.entry(*name).or_default().add(*saving);
                                }
                            }
                        }
                        Err(failure) => {
                            bar.suspend(|| eprintln!("{failure}"));
                            steps.fetch_add(failure.step, Ordering::Relaxed);
                            if let Ok(mut f) = failures.lock() {
                                f.push(failure);
                                bar.set_message(format!("{} failed", f.len()));
                            }
                        }
                    }
                    bar.inc(1);
                }
            });
        }
    });
    bar.finish_and_clear();
    let mut failures = failures.into_inner().unwrap_or_default();
    failures.sort_by_key(|f| f.seed);
    let (server_faults, recoveries, pace, filter_savings, takeovers) =
        faults.into_inner().unwrap_or_default();
    Batch {
        server_faults,
        recoveries,
        takeovers,
        seeds,
        failures,
        steps: steps.into_inner(),
        redirects: redirects.into_inner(),
        pushed_values: pushed.into_inner(),
        replicated_values: replicated.into_inner(),
        aggregate_values: aggregate.into_inner(),
        pace,
        peak_receive_queue_bytes: peak.into_inner(),
        slot_grants: grants.into_inner(),
        filter_savings,
        secs: start.elapsed().as_secs_f64(),
    }
}

/// `NAME mean=M max=X COUNTED=N` over `times`, in virtual milliseconds.
fn times_line(name: &str, times: &[pserver_core::Time], counted: &str) -> String {
    let ms = |t: pserver_core::Time| t as f64 / MS as f64;
    let n = times.len();
    let mean = if n == 0 {
        0.0
    } else {
        times.iter().map(|&t| ms(t)).sum::<f64>() / n as f64
    };
    let max = times.iter().copied().max().map_or(0.0, ms);
    format!("{name} mean={mean:.1} max={max:.1} {counted}={n}")
}

#[cfg(test)]
mod tests {
    use super::super::Faults;
    use super::*;

    #[test]
    fn the_summary_counts_every_seed_and_failure() {
        let base = SimConfig {
            faults: Faults {
                drop: 0.1,
                ..Faults::default()
            },
            ..SimConfig::default()
        };
        let batch = run_seeds(&base, Protocol::default(), 5, 8, 2, false);
        assert_eq!(batch.seeds, 8);
        assert!(batch.failures.is_empty());
        assert!(batch.steps > 0);
        assert!(batch.summary().starts_with("sim seeds=8 failed=0 steps="));
        assert!(batch.summary().contains(" redirects="));

        let changed = SimConfig {
            ring_change: Some(true),
            servers: 3,
            ..base.clone()
        };
        let batch = run_seeds(&changed, Protocol::default(), 0, 8, 2, false);
        assert!(batch.failures.is_empty());
        assert!(batch.redirects > 0, "{}", batch.summary());

        let hopeless = SimConfig {
            time_limit: MS,
            ..base
        };
        let batch = run_seeds(&hopeless, Protocol::default(), 0, 3, 2, false);
        let seeds: Vec<u64> = batch.failures.iter().map(|f| f.seed).collect();
        assert_eq!(seeds, vec![0, 1, 2]);
    }

    #[test]
    fn the_batch_sums_server_faults_and_recovery_times() {
        let mut base = SimConfig {
            servers: 3,
            crash_servers: 1,
            ..SimConfig::default()
        };
        base.ring.replicas = 1;
        let batch = run_seeds(&base, Protocol::default(), 0, 6, 2, false);
        assert!(batch.failures.is_empty(), "{:?}", batch.failures);
        assert_eq!(batch.recoveries.len(), batch.server_faults.crashed());
        assert!(!batch.recoveries.is_empty());
        let line = batch.recovery_summary();
        assert!(line.starts_with("recovery_ms mean="), "{line}");
        assert!(
            line.ends_with(&format!(" crashes={}", batch.recoveries.len())),
            "{line}"
        );
        assert!(
            batch
                .server_fault_summary()
                .starts_with("server_faults crashes=")
        );
    }
}
