//! Host-side process handling of sandboxes: pidfds, start times (to defeat
//! PID reuse), liveness, killing and reaping.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

pub use sandbox_abi::procfs::{parent, start_time, state};

/// Reaps `pid` if it is an exited (zombie) child of ours: a sandbox PID 1
/// that died before [`ProcHandle::open`] could take it (it is re-parented to
/// the daemon, a subreaper, once the launcher exits). Without a handle
/// nothing else would ever collect it. Harmless for a live process or one
/// that is not our child.
pub fn reap_if_zombie(pid: i32) {
    if state(pid) == Some('Z') {
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
    }
}

/// A handle on a sandbox's PID 1 that survives PID reuse.
#[derive(Debug)]
pub struct ProcHandle {
    pub pid: i32,
    pub start_time: u64,
    pidfd: OwnedFd,
}

impl ProcHandle {
    /// Opens `pid` if it is alive with `expected_start` (when given).
    pub fn open(pid: i32, expected_start: Option<u64>) -> Option<ProcHandle> {
        let p = rustix::process::Pid::from_raw(pid)?;
        let pidfd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()?;
        // Read the start time after opening the pidfd: if it matches, the
        // pidfd refers to that very process.
        let st = start_time(pid)?;
        if expected_start.is_some_and(|e| e != st) || state(pid) == Some('Z') {
            return None;
        }
        Some(ProcHandle {
            pid,
            start_time: st,
            pidfd,
        })
    }

    /// True once the process has exited (the pidfd polls readable).
    pub fn exited(&self) -> bool {
        self.wait_exit(Duration::ZERO)
    }

    /// Waits up to `timeout` for the exit.
    pub fn wait_exit(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
            match poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            ) {
                Ok(0) => return false,
                Ok(_) => {
                    let _ = self.reap();
                    return true;
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return false,
            }
        }
    }

    /// Collects the exit status when the daemon is the parent (as a
    /// subreaper); harmless otherwise (ECHILD). Waits on the pidfd, not the
    /// PID, so a recycled PID of another child is never reaped by mistake.
    /// Returns the exit status when it reaped the process.
    pub fn reap(&self) -> Option<WaitStatus> {
        waitid(
            Id::PIDFd(self.pidfd.as_fd()),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG,
        )
        .ok()
        .filter(|s| *s != WaitStatus::StillAlive)
    }

    /// The pidfd (readable once the process has exited).
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// SIGKILLs the sandbox's PID 1 (which takes its whole PID namespace
    /// down) through the pidfd, so a recycled PID is never signalled.
    pub fn kill(&self) {
        let r = rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL);
        if r.is_err() && !self.exited() {
            // Fallback for kernels without pidfd_send_signal.
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_and_kill() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let st = start_time(pid).unwrap();
        assert!(
            ProcHandle::open(pid, Some(st + 1)).is_none(),
            "start time not checked"
        );
        let h = ProcHandle::open(pid, Some(st)).unwrap();
        assert!(!h.exited());
        h.kill();
        let _ = child.wait();
        assert!(h.wait_exit(Duration::from_secs(5)));
    }
}
