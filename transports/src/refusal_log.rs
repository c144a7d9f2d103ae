//! Refused input and dropped frames, logged so that whoever causes them cannot fill the log
//! (the transports here and the runtime's node loop share it):
//! the first of a window is logged in full, the others are counted by reason and summed up in
//! one line once the window is over. Every one is also counted in the transport's stats.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::sync::Mutex;

/// How long a window lasts: under a steady attack, two lines per window.
pub const WINDOW: Duration = Duration::from_secs(10);

/// The refusals of one kind of input (`"connection"`, `"datagram"`), logged at a bounded rate.
#[derive(Debug)]
pub struct RefusalLog {
    what: &'static str,
    /// What happened to each: "refused", "dropped".
    verb: &'static str,
    window: Duration,
    state: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// When the refusal logged in full opened the window.
    opened: Option<Instant>,
    /// The refusals since, by reason.
    counted: BTreeMap<&'static str, u64>,
}

impl RefusalLog {
    /// A log for refused `what`s with windows of `window`.
    pub fn new(what: &'static str, window: Duration) -> Self {
        Self::with_verb(what, "refused", window)
    }

    /// A log for `what`s dropped (not refused: nothing was wrong with them, but they could not
    /// be kept), with windows of `window`.
    pub fn drops(what: &'static str, window: Duration) -> Self {
        Self::with_verb(what, "dropped", window)
    }

    fn with_verb(what: &'static str, verb: &'static str, window: Duration) -> Self {
        RefusalLog {
            what,
            verb,
            window,
            state: Mutex::new(Window::default()),
        }
    }

    /// Records one refusal: logged with `detail` when it opens a window, counted under
    /// `reason` otherwise.
    pub fn refused(&self, reason: &'static str, detail: impl FnOnce() -> String) {
        self.refused_at(Instant::now(), reason, detail);
    }

    /// Records one drop, as [`RefusalLog::refused`] records a refusal.
    pub fn dropped(&self, reason: &'static str, detail: impl FnOnce() -> String) {
        self.dropped_many(reason, 1, detail);
    }

    /// Records `n` drops of one reason and detail at once, under one lock.
    pub fn dropped_many(&self, reason: &'static str, n: u64, detail: impl FnOnce() -> String) {
        if n > 0 {
            self.record(Instant::now(), reason, n, detail);
        }
    }

    fn refused_at(&self, now: Instant, reason: &'static str, detail: impl FnOnce() -> String) {
        self.record(now, reason, 1, detail);
    }

    /// Records `n` (at least one): the first opens a window if none is open, the rest are
    /// counted for its summary.
    fn record(&self, now: Instant, reason: &'static str, n: u64, detail: impl FnOnce() -> String) {
        let opens = {
            let mut w = self.lock();
            self.close_if_over(&mut w, now);
            let opens = w.opened.is_none();
            if opens {
                w.opened = Some(now);
            }
            let counted = n - u64::from(opens);
            if counted > 0 {
                *w.counted.entry(reason).or_default() += counted;
            }
            opens
        };
        if opens {
            warn!(
                reason,
                "{} a {} {} (more in the next {} s are summed up)",
                self.verb,
                self.what,
                detail(),
                self.window.as_secs()
            );
        } else {
            // Each one still, for whoever turns debug logging on.
            debug!(reason, "{} a {} {}", self.verb, self.what, detail());
        }
    }

    /// Sums up the window if it is over; call it now and then, so that the last refusals of
    /// an attack that stopped are reported too.
    pub fn tick(&self) {
        self.tick_at(Instant::now());
    }

    fn tick_at(&self, now: Instant) {
        let mut w = self.lock();
        self.close_if_over(&mut w, now);
    }

    fn close_if_over(&self, w: &mut Window, now: Instant) {
        let Some(opened) = w.opened else {
            return;
        };
        if now.duration_since(opened) < self.window {
            return;
        }
        w.opened = None;
        let counted = core::mem::take(&mut w.counted);
        let secs = now.duration_since(opened).as_secs();
        if let Some(line) = summary(self.verb, self.what, secs, &counted) {
            warn!(count = counted.values().sum::<u64>(), "{line}");
        }
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Window> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The line that sums up a window's refusals after its first, if there were any.
fn summary(
    verb: &str,
    what: &str,
    secs: u64,
    counted: &BTreeMap<&'static str, u64>,
) -> Option<String> {
    let total: u64 = counted.values().sum();
    let reasons: Vec<String> = counted.iter().map(|(r, n)| format!("{r}: {n}")).collect();
    (total > 0).then(|| {
        format!(
            "{verb} {total} more {what}s in the last {secs} s ({})",
            reasons.join(", ")
        )
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_window_logs_its_first_refusal_and_sums_up_the_rest() {
        let log = RefusalLog::new("connection", Duration::from_millis(50));
        let start = Instant::now();
        for _ in 0..1000 {
            log.refused_at(start, "wrong secret", || {
                "from 127.0.0.1:9: wrong secret".into()
            });
        }
        // The first opened the window; the others are counted for its summary.
        let counted = log.lock().counted.get("wrong secret").copied();
        assert_eq!(counted, Some(999));
        assert!(log.lock().opened.is_some());
        log.refused_at(start, "unknown address", || "from 127.0.0.1:10".into());
        let line = summary("refused", "connection", 10, &log.lock().counted);
        assert_eq!(
            line.as_deref(),
            Some(
                "refused 1000 more connections in the last 10 s (unknown address: 1, wrong secret: 999)"
            )
        );
        log.tick_at(start + Duration::from_millis(60));
        let w = log.lock();
        assert!(w.opened.is_none() && w.counted.is_empty(), "{w:?}");
        assert_eq!(summary("refused", "datagram", 10, &BTreeMap::new()), None);
    }
}
