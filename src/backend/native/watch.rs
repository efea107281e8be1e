//! The exit watcher: one task per tracked sandbox, woken by the pidfd of
//! its PID 1, so an exit is noticed whether or not the daemon is the
//! parent (adopted sandboxes were re-parented to the host's init when the
//! previous daemon died). On exit it reaps the process when it is our
//! child, logs `sandbox exited` and marks the record `exited`; the next
//! create of the id then replaces it. It never kills or removes anything:
//! that is `destroy`'s business.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tracing::{debug, info, warn};

use super::proc::ProcHandle;
use super::Live;
use crate::model::SandboxStatus;

pub(super) type LiveMap = Mutex<HashMap<String, Live>>;

/// Starts watching `handle` (PID 1 of `id` at `generation`). Uses the
/// tokio runtime when there is one (an `AsyncFd` on a dup of the pidfd),
/// a plain thread otherwise.
pub(super) fn watch(live: &Arc<LiveMap>, id: &str, generation: &str, handle: Arc<ProcHandle>) {
    let live = Arc::downgrade(live);
    let (id, generation) = (id.to_string(), generation.to_string());
    let fd = handle.pidfd().try_clone_to_owned();
    match (tokio::runtime::Handle::try_current(), fd) {
        (Ok(rt), Ok(fd)) => {
            rt.spawn(async move {
                // SAFETY: `fd` is an open pidfd owned by the AsyncFd for its
                // whole life (OwnedFd: nothing else closes or reuses it).
                let afd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
                match afd {
                    Ok(afd) => {
                        let _ = afd.readable().await;
                    }
                    Err(e) => {
                        let e = e.to_string();
                        warn!(sandbox_id = %id, error = %e, "cannot poll the pidfd; waiting on a thread");
                        let h = handle.clone();
                        let _ = tokio::task::spawn_blocking(move || wait_forever(&h)).await;
                    }
                }
                exited(&live, &id, &generation, &handle);
            });
        }
        (_, fd) => {
            if let Err(e) = fd {
                warn!(sandbox_id = %id, error = %e, "cannot dup the pidfd; waiting on a thread");
            }
            std::thread::spawn(move || {
                wait_forever(&handle);
                exited(&live, &id, &generation, &handle);
            });
        }
    }
}

fn wait_forever(handle: &ProcHandle) {
    while !handle.wait_exit(Duration::from_secs(3600)) {}
}

fn exited(live: &Weak<LiveMap>, id: &str, generation: &str, handle: &ProcHandle) {
    let status = handle.reap();
    let Some(live) = live.upgrade() else {
        return;
    };
    let mut map = live.lock().unwrap_or_else(|e| e.into_inner());
    match map.get_mut(id) {
        Some(l) if l.record.generation == generation => {
            l.record.status = SandboxStatus::Exited;
            info!(sandbox_id = %id, generation = %generation, pid = handle.pid, ?status, "sandbox exited");
        }
        // Deleted (or replaced) before it exited: the usual end.
        _ => {
            debug!(sandbox_id = %id, generation = %generation, pid = handle.pid, "deleted sandbox exited")
        }
    }
}
