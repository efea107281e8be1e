//! Start-up reconciliation: before the API accepts requests, adopt every
//! sandbox whose PID 1 is alive with its recorded start time, and clean up
//! the remains of dead, half-created or unknown ones.

use std::sync::Arc;

use tracing::{info, warn};

use super::proc::ProcHandle;
use super::state::Phase;
use super::{output, record_of, Live, NativeBackend};
use crate::model::SandboxStatus;

impl NativeBackend {
    pub(super) fn reconcile(&self) {
        let mut adopted = 0usize;
        let mut cleaned = 0usize;
        for id in self.sandboxes.state.ids() {
            // Every line about this sandbox, `destroy`'s included, carries
            // its id and (once read from its state) its generation.
            let span = tracing::info_span!(
                "reconcile",
                sandbox_id = %id,
                generation = tracing::field::Empty
            );
            let _in_span = span.enter();
            let mut st = match self.sandboxes.state.load(&id) {
                Ok(Some(st)) => {
                    span.record("generation", st.generation.as_str());
                    st
                }
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
            let cgroup_key = st.cgroup_key().unwrap_or_else(|| id.clone());
            match (st.phase, handle) {
                (Phase::Running, Some(h)) => match h.open_netns() {
                    Ok(ns) => {
                        info!(sandbox_id = %id, generation = %st.generation, pid = h.pid, "adopted running sandbox");
                        // Go on reading its output where the old daemon stopped.
                        let fifo = output::fifo_path(&self.sandboxes.state.sandbox_dir(&id));
                        match output::open_read(&fifo) {
                            Ok(fd) => self.sandboxes.outputs.start(
                                &id,
                                Arc::new(output::Output::new(&id, &st.generation)),
                                fd,
                            ),
                            Err(e) => {
                                warn!(sandbox_id = %id, error = %e, "cannot reopen the sandbox's output FIFO")
                            }
                        }
                        // Its network is kept: the slot stays taken (the
                        // veth and element are checked by finish_startup).
                        let net = st.network.clone().filter(|n| {
                            let ok = self.net.adopt(&id, n);
                            if !ok {
                                warn!(sandbox_id = %id, link = %n.link, "the adopted sandbox's network does not fit this daemon's [network]; its veth goes");
                            }
                            ok
                        });
                        // Its host ids stay taken while it runs.
                        match (&self.sandboxes.userns, &st.userns) {
                            (Some(pool), Some(range)) => pool.adopt(&id, range),
                            (None, Some(range)) => {
                                info!(sandbox_id = %id, host = range.host, "adopted sandbox keeps its user namespace (user namespaces are off for new sandboxes)")
                            }
                            _ => {}
                        }
                        // Frozen or reclaimed as recorded (the next
                        // request wakes it).
                        let cgroup = self.sandboxes.cgroups.open(&cgroup_key).ok().flatten();
                        self.adopted_idle(&mut st, cgroup.as_ref());
                        if let Some(idle) = st.idle {
                            info!(sandbox_id = %id, idle_state = idle.state.as_str(), "adopted sandbox is asleep");
                        }
                        // Watched like our own: it is no longer our child,
                        // but its pidfd still reports the exit.
                        self.track(Live::new(
                            record_of(&st, SandboxStatus::Running),
                            Arc::new(h),
                            Arc::new(ns),
                            cgroup,
                            net,
                            cgroup_key,
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
