//! Starting a sandbox: exec `sandbox-init` on a bundle (the daemon never
//! forks itself), read its report channel, then wait for the agent's
//! "listening" byte on the ready pipe. Blocking code: call it from a
//! blocking thread.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use sandbox_abi::handoff::{
    self as report, Report, BUNDLE_ARG, READY_FD, READY_FD_ARG, REPORT_FD, REPORT_FD_ARG,
    SECCOMP_BPF_ARG,
};

/// fd numbers `sandbox-init` receives the channels on.

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot create pipe: {0}")]
    Pipe(nix::Error),
    #[error("cannot exec {path}: {source}")]
    Spawn {
        path: String,
        source: std::io::Error,
    },
    #[error("sandbox-init failed at step {step}: {error}")]
    Step { step: String, error: String },
    #[error("sandbox-init exited without reporting a PID ({0})")]
    NoPid(String),
    #[error("the agent exited before it was listening; its log: {log}")]
    AgentDied { log: String },
    #[error("the agent was not listening within {0:?}")]
    Timeout(Duration),
    #[error("reading the launcher's report: {0}")]
    Io(std::io::Error),
}

/// What a successful launch produced.
#[derive(Debug)]
pub struct Launched {
    /// Host PID of the sandbox's PID 1 (the agent).
    pub pid: i32,
}

/// Waits until `fd` is readable or `deadline` passes.
fn wait_readable(fd: &OwnedFd, deadline: Instant) -> Result<bool, LaunchError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(LaunchError::Io(e.into())),
        }
    }
}

/// Reads the report channel until EOF or the deadline, calling `on_pid`
/// as soon as the PID line arrives (before the launch is over).
fn read_reports(
    fd: &OwnedFd,
    deadline: Instant,
    on_pid: &mut dyn FnMut(i32),
) -> Result<Vec<Report>, LaunchError> {
    let mut reports = Vec::new();
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if !wait_readable(fd, deadline)? {
            return Err(LaunchError::Timeout(Duration::ZERO));
        }
        let n = match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(LaunchError::Io(e.into())),
        };
        pending.extend_from_slice(&buf[..n]);
        // Complete lines (everything at EOF).
        let cut = if n == 0 {
            pending.len()
        } else {
            pending
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1)
        };
        let lines: Vec<u8> = pending.drain(..cut).collect();
        for r in report::parse(&String::from_utf8_lossy(&lines)) {
            if let Report::Pid { pid } = r {
                on_pid(pid);
            }
            reports.push(r);
        }
        if n == 0 {
            return Ok(reports);
        }
    }
}

/// Starts `init` on `bundle` and waits until the agent listens. On error
/// the caller cleans up (it may have got a PID before the failure: see
/// the `on_pid` callback, called as soon as the launcher reports it, before
/// readiness, so the caller can record it at once). On a timeout before
/// the report ends the launcher itself is killed; what it may have forked
/// already is in the sandbox's cgroup, which the caller kills.
///
/// `output` becomes the launcher's (and so the agent's) stdout and stderr;
/// `tail` renders what was written to it so far, for error messages.
/// `seccomp_bpf` is the filter stack the daemon compiled at start (else
/// the launcher compiles the bundle's `linux.seccomp`).
pub fn launch(
    init: &Path,
    bundle: &Path,
    seccomp_bpf: Option<&Path>,
    output: OwnedFd,
    timeout: Duration,
    on_pid: &mut dyn FnMut(i32),
    tail: &dyn Fn() -> String,
) -> Result<Launched, LaunchError> {
    let deadline = Instant::now() + timeout;
    let (report_r, report_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(LaunchError::Pipe)?;
    let (ready_r, ready_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(LaunchError::Pipe)?;
    let logf = std::fs::File::from(output);
    let (rw, yw) = (report_w.as_raw_fd(), ready_w.as_raw_fd());
    let mut cmd = Command::new(init);
    cmd.arg(BUNDLE_ARG)
        .arg(bundle)
        .arg(REPORT_FD_ARG)
        .arg(REPORT_FD.to_string())
        .arg(READY_FD_ARG)
        .arg(READY_FD.to_string());
    if let Some(bpf) = seccomp_bpf {
        cmd.arg(SECCOMP_BPF_ARG).arg(bpf);
    }
    cmd.env_clear()
        .envs(sandbox_abi::failpoint::launcher_env())
        .stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(LaunchError::Io)?)
        .stderr(logf);
    // SAFETY: the closure runs between fork and exec in the child and only
    // calls fcntl and dup2, which are async-signal-safe. Duplicating both
    // fds above 10 first means neither dup2 can clobber the other's source.
    unsafe {
        cmd.pre_exec(move || {
            let a = libc::fcntl(rw, libc::F_DUPFD_CLOEXEC, 10);
            let b = libc::fcntl(yw, libc::F_DUPFD_CLOEXEC, 10);
            if a < 0 || b < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::dup2(a, REPORT_FD) < 0 || libc::dup2(b, READY_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        path: init.display().to_string(),
        source,
    })?;
    // Our copies of the write ends must go, or EOF never comes.
    drop(report_w);
    drop(ready_w);

    let reports = read_reports(&report_r, deadline, on_pid);
    if reports.is_err() {
        // A launcher that hangs must not outlive the create (nor block the
        // wait below).
        let _ = child.kill();
    }
    let _ = child.wait();
    let reports = reports.map_err(|e| match e {
        LaunchError::Timeout(_) => LaunchError::Timeout(timeout),
        e => e,
    })?;
    let pid = reports.iter().find_map(|r| match r {
        Report::Pid { pid } => Some(*pid),
        _ => None,
    });
    if let Some(Report::Failed { step, error }) =
        reports.iter().find(|r| matches!(r, Report::Failed { .. }))
    {
        return Err(LaunchError::Step {
            step: step.clone(),
            error: error.clone(),
        });
    }
    let pid = pid.ok_or_else(|| LaunchError::NoPid(tail()))?;

    // The agent writes one byte once it listens; EOF means it died first.
    if !wait_readable(&ready_r, deadline)? {
        return Err(LaunchError::Timeout(timeout));
    }
    let mut b = [0u8; 1];
    let n = std::fs::File::from(ready_r)
        .read(&mut b)
        .map_err(LaunchError::Io)?;
    if n == 0 {
        return Err(LaunchError::AgentDied { log: tail() });
    }
    Ok(Launched { pid })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_is_handed_over_before_the_report_ends() {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let writer = std::thread::spawn(move || {
            let mut f = std::fs::File::from(w);
            std::io::Write::write_all(&mut f, b"{\"pid\":42}\n").unwrap();
            // The launcher goes on (mounts, exec) long after the report.
            std::thread::sleep(Duration::from_millis(500));
            std::io::Write::write_all(&mut f, b"{\"step\":\"mount\",\"error\":\"x\"}").unwrap();
        });
        let start = Instant::now();
        let mut seen = None;
        let reports = read_reports(&r, start + Duration::from_secs(10), &mut |pid| {
            seen = Some((pid, start.elapsed()));
        })
        .unwrap();
        writer.join().unwrap();
        let (pid, at) = seen.expect("on_pid not called");
        assert_eq!(pid, 42);
        assert!(
            at < Duration::from_millis(400),
            "PID handed over late: {at:?}"
        );
        // A last line without a newline is read at EOF.
        assert_eq!(reports.len(), 2, "{reports:?}");
    }

    #[test]
    fn a_silent_launcher_times_out() {
        let (r, _w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let mut called = false;
        let e = read_reports(&r, Instant::now() + Duration::from_millis(100), &mut |_| {
            called = true;
        });
        assert!(matches!(e, Err(LaunchError::Timeout(_))), "{e:?}");
        assert!(!called);
    }
}
