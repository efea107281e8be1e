//! Idle policy, in one place: each admitted incarnation's activity (a
//! touch counter and the time of its last activity, in atomics), the rule
//! that says whether and for how long a sandbox has been idle
//! ([`idle_for`]), and the reaper that deletes sandboxes idle longer than
//! the idle timeout, every check interval. Each delete is fenced on the
//! generation it saw and skipped when the sandbox was touched after it
//! looked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn, Instrument};

use super::Lifecycle;

/// An incarnation's activity: a touch counter plus a timestamp, so the
/// reaper can tell "touched after I looked" even within a millisecond.
/// Atomics, so a proxied request marks it without the table's lock.
#[derive(Debug)]
pub(super) struct Activity {
    touches: AtomicU64,
    /// Milliseconds since the lifecycle's epoch.
    last_active_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new(now_ms: u64) -> Self {
        Activity {
            touches: AtomicU64::new(0),
            last_active_ms: AtomicU64::new(now_ms),
        }
    }

    pub(super) fn touch(&self, now_ms: u64) {
        // Written only when it moves on (once a millisecond at most under
        // load): a read of a shared line costs less than a write to it.
        if self.last_active_ms.load(Ordering::Relaxed) < now_ms {
            self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
        self.touches.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn touches(&self) -> u64 {
        self.touches.load(Ordering::SeqCst)
    }

    /// The last activity, in milliseconds since the lifecycle's epoch.
    pub(super) fn last_active_ms(&self) -> u64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }
}

/// What the reaper observed of one sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Observation {
    pub id: String,
    pub generation: String,
    pub touches: u64,
    /// Time since its last activity.
    pub since_active: Duration,
    /// Proxy requests in flight: a sandbox serving one is not idle.
    pub inflight: usize,
}

/// How long the sandbox `o` has been idle, or `None` when it is not idle
/// at all: a sandbox serving a proxied request is not idle (the response
/// marks activity again when it ends); otherwise it is idle since its last
/// activity (a create, a reuse, a discover, a touch, a proxied request).
pub(crate) fn idle_for(o: &Observation) -> Option<Duration> {
    if o.inflight > 0 {
        return None;
    }
    Some(o.since_active)
}

pub(super) fn spawn(lc: Arc<Lifecycle>) -> Option<tokio::task::JoinHandle<()>> {
    let timeout = lc.settings.idle_timeout?;
    let interval = lc.settings.idle_check_interval;
    info!(
        idle_timeout_s = timeout.as_secs(),
        check_interval_s = interval.as_secs(),
        "idle reaper started"
    );
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let observed = lc.observe();
            let checked = observed.len();
            let idle: Vec<_> = observed
                .into_iter()
                .filter(|o| idle_for(o).is_some_and(|idle| idle > timeout))
                .collect();
            let idle_n = idle.len();
            for o in idle {
                // The reap's lines (the delete's included) carry both fields.
                let span = tracing::info_span!(
                    "reap",
                    sandbox_id = %o.id,
                    generation = %o.generation
                );
                let lc = &lc;
                let o = &o;
                async move {
                    match lc.reap(o).await {
                        Ok(true) => info!(idle_s = o.since_active.as_secs(), "reaped idle sandbox"),
                        Ok(false) => {}
                        Err(e) => {
                            lc.metrics.error(e.kind());
                            warn!(error = %e, "reaper could not delete sandbox")
                        }
                    }
                }
                .instrument(span)
                .await;
            }
            // What a test waits on to know a whole pass ran.
            debug!(checked, idle = idle_n, "idle check done");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(since_active: Duration, inflight: usize) -> Observation {
        Observation {
            id: "a".into(),
            generation: "g".into(),
            touches: 0,
            since_active,
            inflight,
        }
    }

    #[test]
    fn idle_since_the_last_activity_unless_serving_a_request() {
        let d = Duration::from_secs(90);
        assert_eq!(idle_for(&observed(d, 0)), Some(d));
        assert_eq!(idle_for(&observed(Duration::ZERO, 0)), Some(Duration::ZERO));
        assert_eq!(idle_for(&observed(d, 1)), None, "a request in flight");
    }
}
