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
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tracing::{debug, info, warn};

use super::proc::ProcHandle;
use super::state::StateDir;
use super::Live;
use crate::cgroups::CgroupRoot;
use crate::model::SandboxStatus;

/// The table of live sandboxes, with what list needs to tell that
/// nothing changed since it last looked ([`LiveMap::stamp`]).
pub(super) struct LiveMap {
    map: Mutex<HashMap<String, Live>>,
    /// Bumped with the lock held by every [`LiveMap::write`], and when a
    /// watched PID 1 is seen to have exited.
    changes: AtomicU64,
    /// Every tracked PID 1's pidfd, one-shot: an exit is reported once.
    /// `None` when it could not be made (every list then refreshes).
    exits: Option<Arc<Epoll>>,
    /// Held while the exits are collected and counted.
    exit_check: Mutex<()>,
    /// Set when a pidfd could not be watched: stamps are off for good.
    unwatched: AtomicBool,
}

/// The table, read.
pub(super) struct LiveRead<'a>(MutexGuard<'a, HashMap<String, Live>>);

/// The table, to change (its change count was bumped).
pub(super) struct LiveWrite<'a>(MutexGuard<'a, HashMap<String, Live>>);

impl std::ops::Deref for LiveRead<'_> {
    type Target = HashMap<String, Live>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::Deref for LiveWrite<'_> {
    type Target = HashMap<String, Live>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for LiveWrite<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// A PID 1's pidfd in the [`LiveMap`]'s exit set, removed when dropped
/// (kept in its [`Live`]).
pub(super) struct ExitWatch {
    epoll: Arc<Epoll>,
    /// Our own dup of the pidfd: the set's entry is keyed on it.
    fd: OwnedFd,
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        let _ = self.epoll.delete(&self.fd);
    }
}

impl LiveMap {
    pub fn new() -> LiveMap {
        let exits = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| warn!(error = %e, "no epoll set for the pidfds: every list refreshes every sandbox"))
            .ok()
            .map(Arc::new);
        LiveMap {
            map: Mutex::default(),
            changes: AtomicU64::new(0),
            exits,
            exit_check: Mutex::new(()),
            unwatched: AtomicBool::new(false),
        }
    }

    pub fn read(&self) -> LiveRead<'_> {
        LiveRead(lock(&self.map))
    }

    /// The table to change: whatever a list rendered before is stale.
    pub fn write(&self) -> LiveWrite<'_> {
        let guard = lock(&self.map);
        self.changes.fetch_add(1, Ordering::SeqCst);
        LiveWrite(guard)
    }

    /// Adds `pidfd` to the exit set (an exit already there is reported
    /// too). On failure stamps are off for good (an exit could go
    /// unnoticed).
    pub fn watch_exit(&self, pidfd: BorrowedFd<'_>) -> Option<ExitWatch> {
        let epoll = self.exits.clone()?;
        let watched = pidfd.try_clone_to_owned().and_then(|fd| {
            let ev = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT, 0);
            epoll.add(&fd, ev)?;
            Ok(ExitWatch { epoll, fd })
        });
        match watched {
            Ok(w) => Some(w),
            Err(e) => {
                if !self.unwatched.swap(true, Ordering::SeqCst) {
                    warn!(error = %e, "cannot watch a pidfd for list: every list now refreshes every sandbox");
                }
                None
            }
        }
    }

    /// A stamp that changes with the table and with every exit of a
    /// watched PID 1 (see [`crate::backend::Backend::refresh_stamp`]):
    /// exits reported since the last look are counted first, so a PID 1
    /// that died before this call changes the stamp even when the exit
    /// watcher has not marked it yet. `None`: cannot tell.
    pub fn stamp(&self) -> Option<u64> {
        let epoll = self.exits.as_ref()?;
        if self.unwatched.load(Ordering::SeqCst) {
            return None;
        }
        let _check = lock(&self.exit_check);
        let mut events = [EpollEvent::empty(); 32];
        loop {
            match epoll.wait(&mut events, EpollTimeout::ZERO) {
                Ok(0) => break,
                Ok(n) => {
                    self.changes.fetch_add(1, Ordering::SeqCst);
                    if n < events.len() {
                        break;
                    }
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return None,
            }
        }
        Some(self.changes.load(Ordering::SeqCst))
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
    let teardown = match live.read().get(id) {
        Some(l) if l.record.generation == generation => l.teardown.clone(),
        _ => return deleted(),
    };
    let _teardown = lock(&teardown);
    let netns = {
        let mut map = live.write();
        let Some(l) = map
            .get_mut(id)
            .filter(|l| l.record.generation == generation)
        else {
            return deleted();
        };
        l.record.status = SandboxStatus::Exited;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn sleeper() -> (std::process::Child, ProcHandle) {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let h = ProcHandle::open(child.id() as i32, None).unwrap();
        (child, h)
    }

    /// Waits until `h` polls exited (a SIGKILL is delivered asynchronously).
    fn until_exited(h: &ProcHandle) {
        let end = Instant::now() + Duration::from_secs(5);
        while !h.exited() {
            assert!(Instant::now() < end, "the killed process never exited");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The stamp moves with every change of the table and with the exit of
    /// a watched PID 1 as soon as its pidfd says so (nothing marked it
    /// yet), once per exit; an unwatched pidfd no longer counts.
    #[test]
    fn the_stamp_moves_with_the_table_and_with_each_exit() {
        let live = LiveMap::new();
        let s0 = live.stamp().expect("an epoll set");
        assert_eq!(live.stamp(), Some(s0), "nothing changed");
        drop(live.read());
        assert_eq!(live.stamp(), Some(s0), "reading changes nothing");
        drop(live.write());
        let s1 = live.stamp().unwrap();
        assert_ne!(s1, s0, "a write may have changed the table");

        let (mut a, ha) = sleeper();
        let (mut b, hb) = sleeper();
        let (mut c, hc) = sleeper();
        let _wa = live.watch_exit(ha.pidfd()).unwrap();
        let wb = live.watch_exit(hb.pidfd()).unwrap();
        let _wc = live.watch_exit(hc.pidfd()).unwrap();
        assert_eq!(live.stamp(), Some(s1), "three running PID 1s");

        // An exit, not reaped (a zombie) and not marked by any watcher.
        a.kill().unwrap();
        until_exited(&ha);
        let s2 = live.stamp().unwrap();
        assert_ne!(s2, s1, "the exit changes the next stamp");
        assert_eq!(live.stamp(), Some(s2), "an exit counts once");
        let _ = a.wait();
        assert_eq!(live.stamp(), Some(s2), "nor does its reaping count again");

        // An exit already reaped.
        c.kill().unwrap();
        let _ = c.wait();
        until_exited(&hc);
        let s3 = live.stamp().unwrap();
        assert_ne!(s3, s2, "the exit of c");
        // A PID 1 that exited before it was watched counts too.
        let (mut d, hd) = sleeper();
        d.kill().unwrap();
        until_exited(&hd);
        let _wd = live.watch_exit(hd.pidfd()).unwrap();
        let s4 = live.stamp().unwrap();
        assert_ne!(s4, s3, "the exit of d");
        assert_eq!(live.stamp(), Some(s4));

        // No longer watched (its sandbox deleted): its exit is not counted.
        drop(wb);
        b.kill().unwrap();
        until_exited(&hb);
        assert_eq!(live.stamp(), Some(s4));
        let _ = b.wait();
        let _ = d.wait();
    }
}
