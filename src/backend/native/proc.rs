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

    /// The network namespace of exactly this process, never of a process
    /// that took over its PID: through the pidfd (`PIDFD_GET_NET_NAMESPACE`,
    /// Linux 6.11) where the kernel has it; otherwise `/proc/<pid>/ns/net`,
    /// accepted only if the pidfd still reports the process alive *after*
    /// the open (so the namespace was opened while the PID was still ours)
    /// and the start time still matches.
    pub fn open_netns(&self) -> std::io::Result<OwnedFd> {
        self.open_ns("net", PIDFD_GET_NET_NAMESPACE)
    }

    /// Its user namespace ([`open_netns`](Self::open_netns)'s guarantees).
    pub fn open_userns(&self) -> std::io::Result<OwnedFd> {
        self.open_ns("user", PIDFD_GET_USER_NAMESPACE)
    }

    /// Its UTS namespace ([`open_netns`](Self::open_netns)'s guarantees).
    pub fn open_utsns(&self) -> std::io::Result<OwnedFd> {
        self.open_ns("uts", PIDFD_GET_UTS_NAMESPACE)
    }

    fn open_ns(&self, name: &str, ioctl: libc::c_ulong) -> std::io::Result<OwnedFd> {
        match pidfd_namespace(self.pidfd.as_fd(), ioctl) {
            Ok(fd) => return Ok(fd),
            // Older kernels (ENOTTY/EINVAL): fall back to /proc below.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {}
            Err(e) => return Err(e),
        }
        let ns: OwnedFd = std::fs::File::open(format!("/proc/{}/ns/{name}", self.pid))?.into();
        if self.exited() || start_time(self.pid) != Some(self.start_time) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("process {} exited while its namespace was opened", self.pid),
            ));
        }
        Ok(ns)
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

/// `ioctl(pidfd, PIDFD_GET_NET_NAMESPACE)`: an fd of the network namespace
/// of the process the pidfd refers to (ESRCH once it has exited).
/// `_IO(PIDFS_IOCTL_MAGIC = 0xFF, n)` from `<linux/pidfd.h>`.
const PIDFD_GET_NET_NAMESPACE: libc::c_ulong = 0xFF04;
const PIDFD_GET_USER_NAMESPACE: libc::c_ulong = 0xFF09;
const PIDFD_GET_UTS_NAMESPACE: libc::c_ulong = 0xFF0A;

fn pidfd_namespace(pidfd: BorrowedFd<'_>, ioctl: libc::c_ulong) -> std::io::Result<OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: these ioctls take no argument and return a new fd or -1; the
    // pidfd is borrowed for the duration of the call.
    let fd = unsafe { libc::ioctl(pidfd.as_raw_fd(), ioctl) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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

    fn netns_inode(fd: &OwnedFd) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(fd)
        ))
        .unwrap()
        .ino()
    }

    /// Starts `/bin/sleep 30` with exactly `pid` (clone3 with `set_tid`,
    /// root only) in the daemon's own network namespace.
    fn spawn_with_pid(pid: i32) -> std::io::Result<i32> {
        #[repr(C)]
        #[derive(Default)]
        struct CloneArgs {
            flags: u64,
            pidfd: u64,
            child_tid: u64,
            parent_tid: u64,
            exit_signal: u64,
            stack: u64,
            stack_size: u64,
            tls: u64,
            set_tid: u64,
            set_tid_size: u64,
            cgroup: u64,
        }
        let tids = [pid as libc::pid_t];
        let args = CloneArgs {
            exit_signal: libc::SIGCHLD as u64,
            set_tid: tids.as_ptr() as u64,
            set_tid_size: 1,
            ..Default::default()
        };
        let path = c"/bin/sleep";
        let argv = [c"sleep".as_ptr(), c"30".as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        // SAFETY: clone3 forks this (multi-threaded) process; the child only
        // calls execve and _exit, both async-signal-safe, on memory that was
        // prepared before the clone.
        let r = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if r == 0 {
            // SAFETY: see above; in the child, exec or exit at once.
            unsafe {
                libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
                libc::_exit(127);
            }
        }
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(r as i32)
    }

    /// Hardening: a handle whose process died and whose PID was taken by
    /// another process (in another network namespace) never yields that
    /// process's namespace; opening by PID would.
    #[test]
    fn a_recycled_pid_never_yields_a_foreign_netns() {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var_os("CI").is_none(), "CI runs as root");
            eprintln!(
                "\n*** SKIPPED a_recycled_pid_never_yields_a_foreign_netns: needs root ***\n"
            );
            return;
        }
        // The original: PID 1 of a sandbox, in a network namespace of its own.
        let mut first = std::process::Command::new("unshare")
            .args(["--net", "sleep", "30"])
            .spawn()
            .unwrap();
        let pid = first.id() as i32;
        let own = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/net")).ok();
        let deadline = Instant::now() + Duration::from_secs(5);
        while own(pid) == own(std::process::id() as i32) {
            assert!(
                Instant::now() < deadline,
                "unshare never entered a new netns"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let h = ProcHandle::open(pid, None).unwrap();
        let sandbox_ns = netns_inode(&h.open_netns().unwrap());
        // It dies and its PID is taken by a process in our namespace.
        first.kill().unwrap();
        first.wait().unwrap();
        let second = spawn_with_pid(pid).expect("clone3 with set_tid (root)");
        assert_eq!(second, pid);
        let host_ns: OwnedFd = std::fs::File::open("/proc/self/ns/net").unwrap().into();
        // By PID, the foreign (host) namespace comes back...
        let by_pid: OwnedFd = std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .unwrap()
            .into();
        assert_eq!(netns_inode(&by_pid), netns_inode(&host_ns));
        assert_ne!(netns_inode(&by_pid), sandbox_ns);
        // ...through the handle, nothing does.
        assert!(
            h.open_netns().is_err(),
            "the handle yielded a recycled PID's netns"
        );
        let _ = kill(Pid::from_raw(second), Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(Pid::from_raw(second), None);
    }
}
