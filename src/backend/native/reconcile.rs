//! Start-up reconciliation: before the API accepts requests, adopt every
//! sandbox whose PID 1 is alive with its recorded start time, and clean up
//! the remains of dead, half-created or unknown ones.

use std::sync::Arc;

use tracing::{info, warn};

use super::proc::ProcHandle;
use super::state::Phase;
use super::{record_of, Live, NativeBackend};
use crate::model::SandboxStatus;

impl NativeBackend {
    pub(super) fn reconcile(&self) {
        let mut adopted = 0usize;
        let mut cleaned = 0usize;
        for id in self.state.ids() {
            let st = match self.state.load(&id) {
                Ok(Some(st)) => st,
                Ok(None) => {
                    info!(sandbox_id = %id, "removing sandbox directory without state");
                    self.destroy(&id, None);
                    cleaned += 1;
                    continue;
                }
                Err(e) => {
                    warn!(sandbox_id = %id, error = %e, "removing sandbox with unreadable state");
                    self.destroy(&id, None);
                    cleaned += 1;
                    continue;
                }
            };
            // Only a process with the recorded PID *and* start time is
            // ours; a recycled PID belongs to someone else and is never
            // touched.
            let handle = match (st.pid, st.start_time) {
                (Some(pid), Some(t)) => ProcHandle::open(pid, Some(t)),
                _ => None,
            };
            match (st.phase, handle) {
                (Phase::Running, Some(h)) => match h.open_netns() {
                    Ok(ns) => {
                        info!(sandbox_id = %id, generation = %st.generation, pid = h.pid, "adopted running sandbox");
                        // Watched like our own: it is no longer our child,
                        // but its pidfd still reports the exit.
                        self.track(Live::new(
                            record_of(&st, SandboxStatus::Running),
                            Arc::new(h),
                            ns,
                            self.cgroups.open(&id).ok().flatten(),
                        ));
                        adopted += 1;
                    }
                    Err(e) => {
                        warn!(sandbox_id = %id, error = %e, "cannot reach adopted sandbox; removing it");
                        self.destroy(&id, Some(&h));
                        cleaned += 1;
                    }
                },
                (phase, h) => {
                    info!(sandbox_id = %id, ?phase, alive = h.is_some(), "cleaning up remains of sandbox");
                    self.destroy(&id, h.as_ref());
                    cleaned += 1;
                }
            }
        }
        info!(
            adopted,
            cleaned, "native backend reconciled its state directory"
        );
    }
}
