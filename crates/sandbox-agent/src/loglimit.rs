//! A rate limit for the agent's own repetitive log lines (one per request,
//! per exec, per ignored SIGTERM): whatever a sandbox does, its PID 1 writes
//! at most [`PER_SECOND`] such lines a second (after a burst), and says how
//! many it left out. The daemon caps what it keeps anyway; this keeps the
//! agent from spending its time on logging.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Lines per second, per kind of message...
pub const PER_SECOND: f64 = 10.0;
/// ...after a burst of this many.
pub const BURST: f64 = 50.0;

/// One token bucket.
pub struct LogLimit {
    state: Mutex<(f64, Option<Instant>)>,
    dropped: AtomicU64,
}

impl LogLimit {
    pub const fn new() -> LogLimit {
        LogLimit {
            state: Mutex::new((BURST, None)),
            dropped: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be logged now (`n` lines were left out
    /// since the last one), `None` when it must be left out.
    pub fn admit(&self) -> Option<u64> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (tokens, last) = &mut *g;
        if let Some(l) = *last {
            *tokens = (*tokens + now.duration_since(l).as_secs_f64() * PER_SECOND).min(BURST);
        }
        *last = Some(now);
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Some(self.dropped.swap(0, Ordering::Relaxed))
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit::new()
    }
}

/// The limit of the per-request line.
pub static REQUESTS: LogLimit = LogLimit::new();
/// The limit of the per-exec line.
pub static EXECS: LogLimit = LogLimit::new();
/// The limit of the "ignoring SIGTERM from inside" warning.
pub static SIGTERMS: LogLimit = LogLimit::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_and_the_count_of_what_was_left_out() {
        let l = LogLimit::new();
        let admitted = (0..1000).filter(|_| l.admit().is_some()).count();
        assert!((50..=52).contains(&admitted), "{admitted}");
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert_eq!(l.admit(), Some(1000 - admitted as u64));
    }
}
