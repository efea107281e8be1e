//! Crash injection for tests: `SANDBOXD_FAILPOINT=<name>` makes the daemon
//! die at the named point, as a `kill -9` would, so tests can check that a
//! restart on the same state directory leaks nothing and reports the truth.
//!
//! **Only with the `failpoints` cargo feature**, which the root package's
//! dev-dependencies turn on for `cargo test` builds. Without it every
//! function here is an empty inline no-op, so `cargo build` (debug or
//! release) contains no failpoint and ignores the variable.
//!
//! The points are the variants of [`Point`]; their names (`create:after_state`,
//! …) are what the variable holds. Daemon-side points fire through [`hit`];
//! the two `delete:*` points after the kill are in `destroy`, so they also
//! fire in a failed create's cleanup.
//!
//! Launcher-side points ([`InitPoints`], in `sandbox-init`, which gets the
//! name and the daemon's PID from the daemon in [`ENV`] and
//! [`DAEMON_PID_ENV`]): [`Point::InitAfterNamespaces`] and
//! [`Point::InitAfterMounts`] SIGKILL the daemon, wait until it is dead and
//! then let the launch go on (the daemon crashed while the launcher was at
//! that step); [`Point::InitStallBeforePid`] makes the launcher hang after its
//! fork without reporting the PID (a create that times out before any PID is
//! known). It owns nothing else and must not be used outside tests.

/// The variable naming the armed failpoint.
pub const ENV: &str = "SANDBOXD_FAILPOINT";
/// When set to a path, a daemon-side point *pauses* instead of killing: it
/// creates `<path>.paused`, then waits (at most [`PAUSE_LIMIT`]) until
/// `<path>` exists, and goes on. Tests use it to act while a create is held
/// at a known step.
pub const PAUSE_ENV: &str = "SANDBOXD_FAILPOINT_PAUSE";
/// The longest a paused point waits for its resume file.
pub const PAUSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
/// The daemon's PID, handed to `sandbox-init` with a launcher-side point.
pub const DAEMON_PID_ENV: &str = "SANDBOXD_FAILPOINT_DAEMON_PID";

/// True when this build has the failpoints compiled in (tests check it
/// rather than assume it).
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// `version` with ` (failpoints)` appended when they are compiled in, for
/// `--version` outputs: a test can tell a binary built by `cargo build`
/// (none) from one built by `cargo test` (with them).
pub const fn version_suffix() -> &'static str {
    if ENABLED {
        " (failpoints)"
    } else {
        ""
    }
}

/// Every crash-injection point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// `state.json` written (phase `creating`), nothing else made.
    CreateAfterState,
    /// The cgroup exists.
    CreateAfterCgroup,
    /// The bundle is written.
    CreateAfterBundle,
    /// PID recorded, agent not yet ready.
    CreateAfterPid,
    /// Agent ready, state not yet `running`.
    CreateAfterLaunch,
    /// The sandbox's veth, address and set element exist (egress), state
    /// not yet `running`.
    CreateAfterNetwork,
    /// State `running` written.
    CreateAfterRunning,
    /// Phase `deleting` written.
    DeleteAfterState,
    /// PID 1 killed; cgroup and directory still there.
    DeleteAfterKill,
    /// Cgroup removed; directory still there.
    DeleteAfterCgroup,
    /// Launcher: namespaces unshared (kills the daemon, goes on).
    InitAfterNamespaces,
    /// Launcher child: mounts done (kills the daemon, goes on).
    InitAfterMounts,
    /// Launcher: hangs after the fork without reporting the PID.
    InitStallBeforePid,
    /// Image pull or import: a blob verified and staged in the store's
    /// `tmp/`, the image not complete.
    ImageAfterBlob,
    /// Image pull or import: every layer unpacked into `tmp/`, nothing
    /// renamed into place yet.
    ImageBeforeCommit,
    /// The egress guard noticed its table removed or changed, before it
    /// rebuilds it (with the pause variable: holds the table missing).
    NetBeforeRebuild,
}

impl Point {
    /// Every point, for tests that walk them all.
    pub const ALL: [Point; 16] = [
        Point::CreateAfterState,
        Point::CreateAfterCgroup,
        Point::CreateAfterBundle,
        Point::CreateAfterPid,
        Point::CreateAfterLaunch,
        Point::CreateAfterNetwork,
        Point::CreateAfterRunning,
        Point::DeleteAfterState,
        Point::DeleteAfterKill,
        Point::DeleteAfterCgroup,
        Point::InitAfterNamespaces,
        Point::InitAfterMounts,
        Point::InitStallBeforePid,
        Point::ImageAfterBlob,
        Point::ImageBeforeCommit,
        Point::NetBeforeRebuild,
    ];

    /// The name [`ENV`] holds to arm this point.
    pub const fn name(self) -> &'static str {
        match self {
            Point::CreateAfterState => "create:after_state",
            Point::CreateAfterCgroup => "create:after_cgroup",
            Point::CreateAfterBundle => "create:after_bundle",
            Point::CreateAfterPid => "create:after_pid",
            Point::CreateAfterLaunch => "create:after_launch",
            Point::CreateAfterNetwork => "create:after_network",
            Point::CreateAfterRunning => "create:after_running",
            Point::DeleteAfterState => "delete:after_state",
            Point::DeleteAfterKill => "delete:after_kill",
            Point::DeleteAfterCgroup => "delete:after_cgroup",
            Point::InitAfterNamespaces => "init:after_namespaces",
            Point::InitAfterMounts => "init:after_mounts",
            Point::InitStallBeforePid => "init:stall_before_pid",
            Point::ImageAfterBlob => "image:after_blob",
            Point::ImageBeforeCommit => "image:before_commit",
            Point::NetBeforeRebuild => "net:before_rebuild",
        }
    }

    /// The point named `name`, if any.
    pub fn from_name(name: &str) -> Option<Point> {
        Point::ALL.into_iter().find(|p| p.name() == name)
    }

    /// True for the points that fire in `sandbox-init`.
    pub const fn in_launcher(self) -> bool {
        matches!(
            self,
            Point::InitAfterNamespaces | Point::InitAfterMounts | Point::InitStallBeforePid
        )
    }
}

#[cfg(feature = "failpoints")]
fn armed() -> Option<Point> {
    static ARMED: std::sync::OnceLock<Option<Point>> = std::sync::OnceLock::new();
    *ARMED.get_or_init(|| {
        let name = std::env::var(ENV).ok().filter(|v| !v.is_empty())?;
        let point = Point::from_name(&name);
        if point.is_none() {
            eprintln!("{ENV}={name} names no failpoint; ignored");
        }
        point
    })
}

/// Kills this process with SIGKILL (no destructor, no flush: a crash).
#[cfg(feature = "failpoints")]
fn die(point: Point) -> ! {
    eprintln!("failpoint {}: killing this process", point.name());
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    std::process::abort()
}

/// Waits until the resume file exists (see [`PAUSE_ENV`]).
#[cfg(feature = "failpoints")]
fn pause(point: Point, resume: &std::path::Path) {
    eprintln!(
        "failpoint {}: paused until {} exists",
        point.name(),
        resume.display()
    );
    let mut marker = resume.as_os_str().to_owned();
    marker.push(".paused");
    let _ = std::fs::write(&marker, point.name());
    let deadline = std::time::Instant::now() + PAUSE_LIMIT;
    while !resume.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Daemon side: dies (or pauses, see [`PAUSE_ENV`]) right here when
/// `point` is the armed point. Called from blocking threads only.
#[inline]
pub fn hit(point: Point) {
    #[cfg(feature = "failpoints")]
    if armed() == Some(point) {
        match std::env::var_os(PAUSE_ENV) {
            Some(resume) => pause(point, std::path::Path::new(&resume)),
            None => die(point),
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = point;
}

/// The variables to hand to `sandbox-init` (its environment is cleared)
/// when a launcher-side point is armed; empty otherwise.
pub fn launcher_env() -> Vec<(&'static str, String)> {
    #[cfg(feature = "failpoints")]
    if let Some(point) = armed().filter(|p| p.in_launcher()) {
        return vec![
            (ENV, point.name().to_string()),
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
    #[cfg(feature = "failpoints")]
    armed: Option<(Point, i32)>,
    /// The parent's and the child's end of the relay; after the fork each
    /// side drops the other's, so a dead peer reads as EOF.
    #[cfg(feature = "failpoints")]
    relay_parent: Option<std::os::unix::net::UnixStream>,
    #[cfg(feature = "failpoints")]
    relay_child: Option<std::os::unix::net::UnixStream>,
    #[cfg(feature = "failpoints")]
    in_child: bool,
    /// With a user namespace: a helper keeping the host's credentials
    /// (see [`keep_a_killer`](Self::keep_a_killer)).
    #[cfg(feature = "failpoints")]
    killer: Option<std::os::unix::net::UnixStream>,
}

#[cfg(feature = "failpoints")]
fn kill_daemon(pid: i32, point: Point) {
    use nix::sys::signal::{kill, Signal};
    eprintln!("failpoint {}: killing the daemon (pid {pid})", point.name());
    let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
    // Wait until it is dead (gone or a zombie) before going on.
    for _ in 0..500 {
        match crate::procfs::state(pid) {
            None | Some('Z') | Some('X') => return,
            _ => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

impl InitPoints {
    /// Reads the armed point (launcher-side points only) from the env.
    pub fn from_env() -> InitPoints {
        #[cfg(feature = "failpoints")]
        {
            let point = std::env::var(ENV)
                .ok()
                .and_then(|n| Point::from_name(&n))
                .filter(|p| p.in_launcher());
            let pid = std::env::var(DAEMON_PID_ENV)
                .ok()
                .and_then(|p| p.parse().ok());
            let armed = point.zip(pid);
            // Only a point after the fork needs the relay.
            let relay = armed
                .filter(|(p, _)| *p == Point::InitAfterMounts)
                .and_then(|_| std::os::unix::net::UnixStream::pair().ok());
            let (relay_parent, relay_child) = relay.unzip();
            InitPoints {
                armed,
                relay_parent,
                relay_child,
                in_child: false,
                killer: None,
            }
        }
        #[cfg(not(feature = "failpoints"))]
        InitPoints::default()
    }

    /// At `point` of the launch: kills the daemon (directly, or through
    /// the parent when in the child) when `point` is armed.
    #[inline]
    pub fn hit(&mut self, point: Point) {
        #[cfg(feature = "failpoints")]
        {
            let Some((armed, pid)) = self.armed else {
                return;
            };
            if armed != point {
                return;
            }
            if let Some(k) = &mut self.killer {
                use std::io::{Read, Write};
                let mut b = [0u8; 1];
                let _ = k.write_all(b"k").and_then(|_| k.read(&mut b));
                return;
            }
            if !self.in_child {
                kill_daemon(pid, point);
                return;
            }
            if let Some(child) = &mut self.relay_child {
                use std::io::{Read, Write};
                let mut b = [0u8; 1];
                let _ = child.write_all(b"k").and_then(|_| child.read(&mut b));
            }
        }
        #[cfg(not(feature = "failpoints"))]
        let _ = point;
    }

    /// Before the launcher joins the sandbox's user namespace, where it may
    /// no longer signal the daemon: an armed point gets a helper process
    /// that keeps the host's credentials and kills the daemon when asked
    /// (by the launcher or, after the fork, by PID 1), replacing the
    /// parent relay. Must run single-threaded.
    pub fn keep_a_killer(&mut self) {
        #[cfg(feature = "failpoints")]
        {
            use std::io::{Read, Write};
            // Only the points that kill the daemon need it.
            let Some((point @ (Point::InitAfterNamespaces | Point::InitAfterMounts), pid)) =
                self.armed
            else {
                return;
            };
            let Ok((mine, mut theirs)) = std::os::unix::net::UnixStream::pair() else {
                return;
            };
            // SAFETY: the launcher is single-threaded when it calls this.
            match unsafe { nix::unistd::fork() } {
                Ok(nix::unistd::ForkResult::Child) => {
                    drop(mine);
                    let mut b = [0u8; 1];
                    if matches!(theirs.read(&mut b), Ok(1)) {
                        kill_daemon(pid, point);
                        let _ = theirs.write_all(b"k");
                    }
                    std::process::exit(0);
                }
                Ok(nix::unistd::ForkResult::Parent { .. }) => {
                    self.killer = Some(mine);
                    self.relay_parent = None;
                    self.relay_child = None;
                }
                Err(_) => {}
            }
        }
    }

    /// In the launcher's parent, right after the fork, before the PID
    /// report: hangs for ever for [`Point::InitStallBeforePid`].
    pub fn before_pid_report(&mut self) {
        #[cfg(feature = "failpoints")]
        {
            self.relay_child = None;
            if let Some((Point::InitStallBeforePid, _)) = self.armed {
                eprintln!("failpoint init:stall_before_pid: stalling before the PID report");
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
    }

    /// In the launcher's parent, after the PID report: serves the child's
    /// request to kill the daemon (a point armed after the fork).
    pub fn after_pid_report(&mut self) {
        #[cfg(feature = "failpoints")]
        {
            let Some((armed, pid)) = self.armed else {
                return;
            };
            if let Some(parent) = &mut self.relay_parent {
                use std::io::{Read, Write};
                let mut b = [0u8; 1];
                if matches!(parent.read(&mut b), Ok(1)) {
                    kill_daemon(pid, armed);
                    let _ = parent.write_all(b"k");
                }
            }
        }
    }

    /// In the launcher's child, right after the fork.
    pub fn after_fork_child(&mut self) {
        #[cfg(feature = "failpoints")]
        {
            self.in_child = true;
            self.relay_parent = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Point;

    #[test]
    fn names_round_trip() {
        for p in Point::ALL {
            assert_eq!(Point::from_name(p.name()), Some(p));
        }
        assert_eq!(Point::from_name("create:nowhere"), None);
    }
}
