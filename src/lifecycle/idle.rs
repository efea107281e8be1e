//! The idle reaper: every check interval, deletes sandboxes idle longer
//! than the idle timeout. Each delete is fenced on the generation it saw
//! and skipped when the sandbox was touched after it looked. A sandbox
//! with a proxied request in flight is not idle (a proxied response marks
//! activity again when it ends).

use std::sync::Arc;

use tracing::{info, warn, Instrument};

use super::Lifecycle;

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
            let idle: Vec<_> = lc
                .observe()
                .into_iter()
                .filter(|o| o.idle > timeout && o.inflight == 0)
                .collect();
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
                        Ok(true) => info!(idle_s = o.idle.as_secs(), "reaped idle sandbox"),
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
        }
    }))
}
