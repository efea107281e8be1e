//! Crash injection for tests: `SANDBOXD_FAILPOINT=<name>` makes the daemon
//! die at the named point, as a `kill -9` would, so tests can check that a
//! restart on the same state directory leaks nothing and reports the truth.
//!
//! **Debug builds only.** Every function here is an empty inline no-op
//! unless `debug_assertions` is on, so release builds contain no failpoint
//! and ignore the variable.
//!
//! Daemon-side points ([`hit`]): `create:after_state`, `create:after_cgroup`,
//! `create:after_bundle`, `create:after_pid` (PID recorded, agent not yet
//! ready), `create:after_launch` (agent ready, state not yet `running`),
//! `create:after_running`, `delete:after_state` (phase `deleting` written),
//! `delete:after_kill` (PID 1 killed, cgroup and directory still there),
//! `delete:after_cgroup` (cgroup removed, directory still there). The two
//! last are in `destroy`, so they also fire in a failed create's cleanup.
//!
//! Launcher-side points ([`InitPoints`], in `sandbox-init`, which gets the
//! name and the daemon's PID from the daemon in `SANDBOXD_FAILPOINT` and
//! `SANDBOXD_FAILPOINT_DAEMON_PID`): `init:after_namespaces` and
//! `init:after_mounts` SIGKILL the daemon, wait until it is dead and then
//! let the launch go on (the daemon crashed while the launcher was at that
//! step); `init:stall_before_pid` makes the launcher hang after its fork
//! without reporting the PID (a create that times out before any PID is
//! known). It owns nothing else and must not be used outside tests.

/// The variable naming the armed failpoint.
pub const ENV: &str = "SANDBOXD_FAILPOINT";
/// The daemon's PID, handed to `sandbox-init` with a launcher-side point.
pub const DAEMON_PID_ENV: &str = "SANDBOXD_FAILPOINT_DAEMON_PID";

#[cfg(debug_assertions)]
fn armed() -> Option<&'static str> {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Kills this process with SIGKILL (no destructor, no flush: a crash).
#[cfg(debug_assertions)]
fn die(name: &str) -> ! {
    eprintln!("failpoint {name}: killing this process");
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    std::process::abort()
}

/// Daemon side: dies right here when `name` is the armed point.
#[inline]
pub fn hit(name: &str) {
    #[cfg(debug_assertions)]
    if armed() == Some(name) {
        die(name);
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// The variables to hand to `sandbox-init` (its environment is cleared)
/// when a launcher-side point is armed; empty otherwise.
pub fn launcher_env() -> Vec<(&'static str, String)> {
    #[cfg(debug_assertions)]
    if let Some(name) = armed().filter(|n| n.starts_with("init:")) {
        return vec![
            (ENV, name.to_string()),
            (DAEMON_PID_ENV, std::process::id().to_string()),
        ];
    }
    Vec::new()
}

/// Launcher side. A point after the fork runs in the new PID namespace,
/// where the daemon cannot be signalled, so the child asks its parent (still
/// in the host's namespace) over a socketpair made before the fork.
#[derive(Default)]
pub struct InitPoints {
    #[cfg(debug_assertions)]
    armed: Option<(String, i32)>,
    /// The parent's and the child's end of the relay; after the fork each
    /// side drops the other's, so a dead peer reads as EOF.
    #[cfg(debug_assertions)]
    relay_parent: Option<std::os::unix::net::UnixStream>,
    #[cfg(debug_assertions)]
    relay_child: Option<std::os::unix::net::UnixStream>,
    #[cfg(debug_assertions)]
    in_child: bool,
}

/// Points that run in the launcher's child (after the fork).
#[cfg(debug_assertions)]
const CHILD_POINTS: [&str; 1] = ["init:after_mounts"];

#[cfg(debug_assertions)]
fn kill_daemon(pid: i32, name: &str) {
    use nix::sys::signal::{kill, Signal};
    eprintln!("failpoint {name}: killing the daemon (pid {pid})");
    let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
    // Wait until it is dead (gone or a zombie) before going on.
    for _ in 0..500 {
        match crate::backend::native::proc::state(pid) {
            None | Some('Z') | Some('X') => return,
            _ => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

impl InitPoints {
    /// Reads the armed point (launcher-side names only) from the env.
    pub fn from_env() -> InitPoints {
        #[cfg(debug_assertions)]
        {
            let name = std::env::var(ENV).ok().filter(|n| n.starts_with("init:"));
            let pid = std::env::var(DAEMON_PID_ENV)
                .ok()
                .and_then(|p| p.parse().ok());
            let armed = name.zip(pid);
            let relay = armed
                .as_ref()
                .filter(|(n, _)| CHILD_POINTS.contains(&n.as_str()))
                .and_then(|_| std::os::unix::net::UnixStream::pair().ok());
            let (relay_parent, relay_child) = relay.unzip();
            InitPoints {
                armed,
                relay_parent,
                relay_child,
                in_child: false,
            }
        }
        #[cfg(not(debug_assertions))]
        InitPoints::default()
    }

    /// At step `name` of the launch: kills the daemon (directly, or through
    /// the parent when in the child) when `name` is armed.
    #[inline]
    pub fn hit(&mut self, name: &str) {
        #[cfg(debug_assertions)]
        {
            let Some((armed, pid)) = &self.armed else {
                return;
            };
            if armed != name {
                return;
            }
            if !self.in_child {
                kill_daemon(*pid, name);
                return;
            }
            if let Some(child) = &mut self.relay_child {
                use std::io::{Read, Write};
                let mut b = [0u8; 1];
                let _ = child.write_all(b"k").and_then(|_| child.read(&mut b));
            }
        }
        #[cfg(not(debug_assertions))]
        let _ = name;
    }

    /// In the launcher's parent, right after the fork, before the PID
    /// report: hangs for ever for `init:stall_before_pid`.
    pub fn before_pid_report(&mut self) {
        #[cfg(debug_assertions)]
        {
            self.relay_child = None;
            if let Some((armed, _)) = &self.armed {
                if armed == "init:stall_before_pid" {
                    eprintln!("failpoint {armed}: stalling before the PID report");
                    loop {
                        std::thread::sleep(std::time::Duration::from_secs(3600));
                    }
                }
            }
        }
    }

    /// In the launcher's parent, after the PID report: serves the child's
    /// request to kill the daemon (a point armed after the fork).
    pub fn after_pid_report(&mut self) {
        #[cfg(debug_assertions)]
        {
            let Some((armed, pid)) = &self.armed else {
                return;
            };
            if let Some(parent) = &mut self.relay_parent {
                use std::io::{Read, Write};
                let mut b = [0u8; 1];
                if matches!(parent.read(&mut b), Ok(1)) {
                    kill_daemon(*pid, armed);
                    let _ = parent.write_all(b"k");
                }
            }
        }
    }

    /// In the launcher's child, right after the fork.
    pub fn after_fork_child(&mut self) {
        #[cfg(debug_assertions)]
        {
            self.in_child = true;
            self.relay_parent = None;
        }
    }
}
