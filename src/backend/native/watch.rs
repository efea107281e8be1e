//! The exit watcher: one task per tracked sandbox, woken by the pidfd of
//! its PID 1, so an exit is noticed whether or not the daemon is the
//! parent (adopted sandboxes were re-parented to the host's init when the
//! previous daemon died). On exit it reaps the process when it is our
//! child, logs `sandbox exited`, marks the record `exited` (with its OOM
//! flag, read before the cgroup goes) and cleans up at once what the
//! sandbox no longer needs: it drops the netns fd, kills whatever is left
//! in the cgroup and removes it, and removes the bundle. The record (and
//! `state.json`, `agent.log`) stay until the sandbox is deleted or replaced
//! by the next create.
//!
//! Fencing: the record is checked and changed under the live-map lock, on
//! the generation the watcher was started for, and the cleanup (by id:
//! cgroup, bundle) runs under that incarnation's teardown lock, which a
//! delete takes before anything else; a new incarnation of the id is only
//! created after that delete, so the cleanup never touches it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tracing::{debug, info, warn};

use super::proc::ProcHandle;
use super::state::StateDir;
use super::Live;
use crate::cgroups::CgroupRoot;
use crate::model::SandboxStatus;

/// The table of live sandboxes: the records the backend owns, each with
/// what it holds of its sandbox. Status is read from here.
#[derive(Default)]
pub(super) struct LiveMap(Mutex<HashMap<String, Live>>);

impl LiveMap {
    pub fn lock(&self) -> MutexGuard<'_, HashMap<String, Live>> {
        lock(&self.0)
    }
}

/// What the cleanup after an exit needs from the backend.
pub(super) struct Cleanup {
    pub cgroups: Arc<CgroupRoot>,
    pub state: StateDir,
}

/// Starts watching `handle` (PID 1 of `id` at `generation`). Uses the
/// tokio runtime when there is one (an `AsyncFd` on a dup of the pidfd;
/// the cleanup then runs on a blocking thread), a plain thread otherwise.
pub(super) fn watch(
    live: &Arc<LiveMap>,
    cleanup: Cleanup,
    id: &str,
    generation: &str,
    handle: Arc<ProcHandle>,
) {
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
                let _ = tokio::task::spawn_blocking(move || {
                    exited(&live, &cleanup, &id, &generation, &handle)
                })
                .await;
            });
        }
        (_, fd) => {
            if let Err(e) = fd {
                warn!(sandbox_id = %id, error = %e, "cannot dup the pidfd; waiting on a thread");
            }
            std::thread::spawn(move || {
                wait_forever(&handle);
                exited(&live, &cleanup, &id, &generation, &handle);
            });
        }
    }
}

fn wait_forever(handle: &ProcHandle) {
    while !handle.wait_exit(Duration::from_secs(3600)) {}
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn exited(
    live: &Weak<LiveMap>,
    cleanup: &Cleanup,
    id: &str,
    generation: &str,
    handle: &ProcHandle,
) {
    let status = handle.reap();
    let Some(live) = live.upgrade() else {
        return;
    };
    let deleted = || debug!(sandbox_id = %id, generation = %generation, pid = handle.pid, "deleted sandbox exited");
    // This incarnation's teardown lock, then (under the live-map lock,
    // fenced on the generation) the record: a delete that removed it
    // meanwhile means there is nothing left to do.
    let teardown = match live.lock().get(id) {
        Some(l) if l.record.generation == generation => l.teardown.clone(),
        _ => return deleted(),
    };
    let _teardown = lock(&teardown);
    let netns = {
        let mut map = live.lock();
        let Some(l) = map
            .get_mut(id)
            .filter(|l| l.record.generation == generation)
        else {
            return deleted();
        };
        l.record.status = SandboxStatus::Exited;
        // No longer on the hibernation ladder (its cgroup goes below).
        l.record.idle = None;
        // Read before the cgroup goes, so the listing keeps `oom_killed`.
        if l.cgroup.as_ref().is_some_and(|cg| cg.oom_kills() > 0) {
            l.record.oom_killed = Some(true);
        }
        l.cgroup = None;
        info!(sandbox_id = %id, generation = %generation, pid = handle.pid, ?status,
              oom_killed = l.record.oom_killed == Some(true), "sandbox exited");
        (l.netns.take(), l.cgroup_key.clone())
    };
    let (netns, cgroup_key) = netns;
    // The namespace goes with its last user: its fd is no longer needed.
    drop(netns);
    super::kill_and_remove_cgroup(&cleanup.cgroups, &cgroup_key);
    if let Err(e) = cleanup.state.remove_bundle(id) {
        warn!(sandbox_id = %id, error = %e, "cannot remove the bundle of an exited sandbox");
    }
    info!(sandbox_id = %id, generation = %generation, "exited sandbox cleaned up: netns fd, cgroup, bundle");
}
