//! The hand-off between the daemon, `sandbox-init` and the agent, defined
//! once for all three.
//!
//! The daemon spawns `sandbox-init --bundle DIR --report-fd 3 --ready-fd 4`
//! ([`BUNDLE_ARG`], [`REPORT_FD_ARG`], [`READY_FD_ARG`], [`REPORT_FD`],
//! [`READY_FD`]) with an empty environment.
//!
//! **Report channel** (fd 3): one-way, JSON lines over a CLOEXEC pipe from
//! `sandbox-init` to the daemon. `{"pid":N}` once the container's init exists
//! (its host PID), then either `{"step":"...","error":"..."}` when a step
//! failed, or EOF without an error when `exec` succeeded (the pipe is
//! CLOEXEC, so exec closes it).
//!
//! **Ready channel** (fd 4): the launcher hands its number to the agent in
//! [`READY_FD_ENV`]; the agent removes the variable (commands never see it),
//! writes one byte once it listens and closes it. EOF without a byte means
//! the agent died.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};

/// The fd number of the report channel in `sandbox-init`.
pub const REPORT_FD: i32 = 3;
/// The fd number of the ready channel in `sandbox-init` and the agent.
pub const READY_FD: i32 = 4;
/// `sandbox-init`'s arguments.
pub const BUNDLE_ARG: &str = "--bundle";
pub const REPORT_FD_ARG: &str = "--report-fd";
pub const READY_FD_ARG: &str = "--ready-fd";
/// The seccomp filters the daemon compiled at start ([`bpf`](crate::bpf)
/// format, `<state_dir>/seccomp.bpf`): installed instead of compiling the
/// bundle's `linux.seccomp` (which the launcher can only do with its
/// `compile` feature).
pub const SECCOMP_BPF_ARG: &str = "--seccomp-bpf";
/// The variable that gives the agent the ready channel's fd number.
pub const READY_FD_ENV: &str = "SANDBOX_AGENT_READY_FD";

/// One message on the report channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Report {
    Pid { pid: i32 },
    Failed { step: String, error: String },
}

/// The writing end, owned by the launcher.
pub struct Reporter {
    fd: Option<OwnedFd>,
}

impl Reporter {
    /// Takes ownership of `fd` (inherited from the daemon).
    ///
    /// # Safety
    /// `fd` must be an open file descriptor that nothing else owns.
    pub unsafe fn from_raw(fd: RawFd) -> Reporter {
        // SAFETY: the caller guarantees `fd` is open and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Reporter { fd: Some(fd) }
    }

    /// A reporter that discards everything (used when run by hand).
    pub fn none() -> Reporter {
        Reporter { fd: None }
    }

    pub fn send(&self, r: &Report) {
        if let Some(fd) = &self.fd {
            let mut line = serde_json::to_vec(r).unwrap_or_default();
            line.push(b'\n');
            // One write of a short line to a pipe is atomic (< PIPE_BUF).
            let _ = std::fs::File::from(fd.try_clone().expect("dup report fd")).write_all(&line);
        }
        if let Report::Failed { step, error } = r {
            eprintln!("sandbox-init: {step}: {error}");
        }
    }
}

/// Parses everything the daemon read from the channel.
pub fn parse(text: &str) -> Vec<Report> {
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let lines = format!(
            "{}\n{}\n",
            serde_json::to_string(&Report::Pid { pid: 42 }).unwrap(),
            serde_json::to_string(&Report::Failed {
                step: "pivot_root".into(),
                error: "EINVAL".into()
            })
            .unwrap()
        );
        assert_eq!(
            parse(&lines),
            vec![
                Report::Pid { pid: 42 },
                Report::Failed {
                    step: "pivot_root".into(),
                    error: "EINVAL".into()
                }
            ]
        );
    }
}

/// The `config.json` annotation by which the daemon asks `sandbox-init` to
/// make the sandbox's root a small tmpfs of its own over the bundle's
/// (empty) `rootfs/`, with these directories and symlinks in it, instead
/// of the bundle carrying that skeleton on disk. The tmpfs is mounted in
/// the launcher's private mount namespace only, so nothing of it is ever
/// visible on the host, and it goes with the sandbox. A bundle without
/// the annotation (`sandboxd bundle`, for `runc`) has the skeleton on disk.
pub const ROOT_SKELETON_ANNOTATION: &str = "sandboxd.io/root-skeleton";

/// The value of [`ROOT_SKELETON_ANNOTATION`] (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootSkeleton {
    /// Directories relative to the root, parents before children.
    pub dirs: Vec<String>,
    /// `(name, target)`: symlinks at the top of the root.
    pub links: Vec<(String, String)>,
}
