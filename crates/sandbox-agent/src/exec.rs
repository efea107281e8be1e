//! `POST /v1/shell/exec`: one command, `bash -c`, one combined output pipe.
//!
//! The child runs in its own process group with stdin `/dev/null` and
//! stdout+stderr on the same pipe (so the output interleaves exactly as
//! written). It is spawned through the [`Reaper`], never tokio::process, and
//! its exit arrives from the reaper. With a timeout N the whole group is
//! killed at N minus a small margin so the answer leaves strictly before N
//! (the caller's HTTP timeout is also N): status `hard_timeout`, exit code
//! 124, the output so far. Without one, the node cap applies the same way.
//! `async_mode` returns `running` at once and lets the command run (output
//! discarded, `hard_timeout` still enforced).
//!
//! Owns: spawning and timing exec children. Must not reap (see `reaper`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustix::pipe::{pipe_with, PipeFlags};
use tokio::net::unix::pipe::Receiver;
use tokio::time::Instant;

use super::output::OutputBuf;
use super::paths::PathBase;
use super::reaper::Reaper;
use super::supervise::{wait_or_kill, watch_async, Child, ScriptFile};

pub use sandbox_abi::agent_api::{ExecRequest, ExecResult};

/// Environment variable never passed on to commands.
pub use sandbox_abi::handoff::READY_FD_ENV;

/// Exit code reported when the agent killed a command for its time limit.
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// Commands longer than this run from a script file (one argv string is
/// limited to 128 KiB by the kernel).
pub const INLINE_COMMAND_MAX: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("exec_dir does not exist or is not a usable directory: {path}")]
    NoSuchDir { path: PathBuf },
    #[error("creating the output pipe: {0}")]
    Pipe(#[source] std::io::Error),
    #[error("starting the shell: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("writing the command's script file {path}: {source}")]
    Script {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Node-level settings for exec.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// `bash`, or `sh` when there is no bash.
    pub shell: PathBuf,
    /// Longest a synchronous command may run without a timeout (< 180 s).
    pub cap: Duration,
    /// Output kept when `truncate` is true.
    pub output_limit: usize,
    /// Output kept when `truncate` is false (protects PID 1 from OOM).
    pub output_hard_limit: usize,
    /// The environment of every command, when the agent was given one
    /// (`--command-env`): then the agent's own environment, which is fixed
    /// by whoever started it, never reaches commands and the request's
    /// environment never reaches the agent. `None`: commands inherit the
    /// agent's environment.
    pub command_env: Option<Vec<(std::ffi::OsString, std::ffi::OsString)>>,
}

/// Reads a command environment file: `KEY=VALUE` entries, each ended by a
/// NUL byte (values may hold newlines). Entries without `=` are an error.
pub fn read_command_env(
    path: &std::path::Path,
) -> std::io::Result<Vec<(std::ffi::OsString, std::ffi::OsString)>> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = std::fs::read(path)?;
    let mut out = Vec::new();
    for entry in bytes.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let eq = entry.iter().position(|b| *b == b'=').ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: an entry has no '='", path.display()),
            )
        })?;
        out.push((
            std::ffi::OsStr::from_bytes(&entry[..eq]).to_owned(),
            std::ffi::OsStr::from_bytes(&entry[eq + 1..]).to_owned(),
        ));
    }
    Ok(out)
}

/// Everything exec needs from the server.
#[derive(Debug)]
pub struct Exec {
    pub config: ExecConfig,
    pub reaper: Arc<Reaper>,
    pub base: PathBase,
}

/// When to kill and when the answer must be out, from the start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadlines {
    pub kill_after: Duration,
    pub respond_by: Duration,
    pub by_cap: bool,
}

/// Kill at N − margin and answer by N − margin/2, margin = 10 % of N
/// clamped to [50 ms, 1 s] and never more than half of N.
pub fn deadlines(timeout: Option<f64>, hard_timeout: Option<f64>, cap: Duration) -> Deadlines {
    let requested = [timeout, hard_timeout]
        .into_iter()
        .flatten()
        .filter(|t| *t > 0.0)
        .filter_map(|t| Duration::try_from_secs_f64(t).ok())
        .min();
    let (limit, by_cap) = match requested {
        Some(t) if t < cap => (t, false),
        _ => (cap, true),
    };
    let margin = limit
        .mul_f64(0.1)
        .clamp(Duration::from_millis(50), Duration::from_secs(1))
        .min(limit / 2);
    Deadlines {
        kill_after: limit - margin,
        respond_by: limit - margin / 2,
        by_cap,
    }
}

impl Exec {
    pub async fn run(&self, req: ExecRequest) -> Result<ExecResult, ExecError> {
        let session_id = match &req.id {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
            Some(v @ serde_json::Value::Number(_)) => v.to_string(),
            _ => fresh_session_id(),
        };
        let dir = self.work_dir(&req)?;
        let start = Instant::now();
        let child = self.spawn(&req.command, dir)?;
        let pid = child.pid;
        let keep = if req.truncate.unwrap_or(true) {
            self.config.output_limit
        } else {
            self.config.output_hard_limit
        };

        if req.async_mode.unwrap_or(false) {
            let hard = req
                .hard_timeout
                .filter(|t| *t > 0.0)
                .and_then(|t| Duration::try_from_secs_f64(t).ok());
            tokio::spawn(watch_async(child, hard));
            return Ok(ExecResult {
                session_id,
                command: req.command,
                status: "running",
                output: String::new(),
                exit_code: None,
            });
        }

        let dl = deadlines(req.timeout, req.hard_timeout, self.config.cap);
        let mut out = OutputBuf::new(keep);
        let (kill_at, respond_by) = (start + dl.kill_after, start + dl.respond_by);
        let waited = wait_or_kill(child, &mut out, kill_at, respond_by).await;
        let why = if keep == self.config.output_limit {
            format!("limit {} bytes, pass truncate:false for more", keep)
        } else {
            format!("hard limit {} bytes", keep)
        };
        let mut output = out.into_text(&why);
        let (status, exit_code) = match waited {
            Some(exit) => ("completed", exit.code()),
            None => {
                if dl.by_cap {
                    output.push_str(&format!(
                        "[sandbox-agent: killed after {:.1} s, the node's limit for commands]\n",
                        dl.kill_after.as_secs_f64()
                    ));
                }
                ("hard_timeout", TIMEOUT_EXIT_CODE)
            }
        };
        if let Some(left_out) = crate::loglimit::EXECS.admit() {
            tracing::info!(
                session_id,
                pid,
                status,
                exit_code,
                elapsed_ms = start.elapsed().as_millis() as u64,
                left_out,
                "exec finished"
            );
        }
        Ok(ExecResult {
            session_id,
            command: req.command,
            status,
            output,
            exit_code: Some(exit_code),
        })
    }

    fn work_dir(&self, req: &ExecRequest) -> Result<PathBuf, ExecError> {
        let Some(raw) = req.exec_dir.as_deref().filter(|d| !d.is_empty()) else {
            return Ok(self.base.cwd.clone());
        };
        let dir = self.base.resolve(raw);
        // Searchable too: a chdir failing inside spawn is a 500, not a fallback.
        let usable = dir.is_dir() && rustix::fs::access(&dir, rustix::fs::Access::EXEC_OK).is_ok();
        if usable {
            Ok(dir)
        } else if req.strict.unwrap_or(false) {
            Err(ExecError::NoSuchDir { path: dir })
        } else {
            Ok(self.base.cwd.clone())
        }
    }

    fn spawn(&self, command: &str, dir: PathBuf) -> Result<Child, ExecError> {
        let (read_end, write_end) =
            pipe_with(PipeFlags::CLOEXEC).map_err(|e| ExecError::Pipe(e.into()))?;
        let write_dup = write_end.try_clone().map_err(ExecError::Pipe)?;
        let mut cmd = Command::new(&self.config.shell);
        let script = if command.len() > INLINE_COMMAND_MAX {
            let script = write_script(command)?;
            cmd.arg(&script.0);
            Some(script)
        } else {
            cmd.arg("-c").arg(command);
            None
        };
        cmd.current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::from(write_dup))
            .env_remove(READY_FD_ENV)
            .process_group(0);
        if let Some(env) = &self.config.command_env {
            cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
        }
        let score = command_oom_score();
        // SAFETY: the hook only calls prctl/open/write/close
        // (async-signal-safe) on a static path and a copied buffer, and
        // allocates nothing.
        unsafe { cmd.pre_exec(move || set_oom_score(score)) };
        let (pid, exit_rx) = self.reaper.spawn(&mut cmd).map_err(ExecError::Spawn)?;
        // Dropping the Command closes our copies of the write end, so EOF
        // arrives once every process holding the pipe is gone.
        drop(cmd);
        let reader = Receiver::from_owned_fd(read_end).map_err(ExecError::Pipe)?;
        Ok(Child {
            pid,
            exit_rx,
            reader,
            script,
        })
    }
}

/// How far above the agent's own `oom_score_adj` its commands run.
const COMMAND_OOM_SCORE_ABOVE_AGENT: i32 = 500;

/// The `oom_score_adj` of every command, as the bytes to write: the agent's
/// own score plus 500, within 0..=1000. So the OOM killer prefers a command
/// over the agent (PID 1: its death ends the sandbox). The agent inherits
/// its score (0 unless a base spec sets `process.oomScoreAdj`, e.g. -500 on
/// hosts that grant CAP_SYS_RESOURCE, which puts commands back at 0).
/// Raising a score needs no privilege. Read once, before any fork.
fn command_oom_score() -> ([u8; 8], usize) {
    static SCORE: std::sync::OnceLock<([u8; 8], usize)> = std::sync::OnceLock::new();
    *SCORE.get_or_init(|| {
        let own: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let text = command_score(own).to_string();
        let mut buf = [0u8; 8];
        buf[..text.len()].copy_from_slice(text.as_bytes());
        (buf, text.len())
    })
}

/// A command's `oom_score_adj` for an agent at `own`.
fn command_score(own: i32) -> i32 {
    (own + COMMAND_OOM_SCORE_ABOVE_AGENT).clamp(0, 1000)
}

/// Writes `score` (from [`command_oom_score`]) to the child's
/// `/proc/self/oom_score_adj`, between fork and exec: only
/// async-signal-safe calls. Best effort: a failure leaves the inherited
/// score and must not fail the command.
fn set_oom_score((buf, len): ([u8; 8], usize)) -> std::io::Result<()> {
    const PATH: &std::ffi::CStr = c"/proc/self/oom_score_adj";
    // The agent is not dumpable (see main), and a forked child inherits
    // that: its /proc/self files belong to root until its exec makes it
    // dumpable again, so the write below would fail. Become dumpable now;
    // for the few instructions until exec this copy of the agent is
    // readable by the sandbox's own processes, which run the command that
    // is about to replace it anyway.
    // SAFETY: prctl is a plain syscall (async-signal-safe) on this process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    // SAFETY: `PATH` is a NUL-terminated static string; the fd returned is
    // checked before use.
    let fd = unsafe { libc::open(PATH.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: writes `len` (<= 8) bytes of `buf`, which lives on this
        // stack frame, to the fd opened above, which is closed exactly once.
        unsafe {
            libc::write(fd, buf.as_ptr().cast(), len);
            libc::close(fd);
        }
    }
    Ok(())
}

/// Writes a long command to a private file in the temp dir for the shell.
fn write_script(command: &str) -> Result<ScriptFile, ExecError> {
    let tag = sandbox_abi::random::u64();
    let path = std::env::temp_dir().join(format!(".sandbox-agent-cmd-{tag:016x}.sh"));
    let err = |source| ExecError::Script {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(err)?;
    let script = ScriptFile(path.clone());
    file.write_all(command.as_bytes()).map_err(err)?;
    Ok(script)
}

/// A random UUID-v4-shaped id.
pub fn fresh_session_id() -> String {
    let b: [u8; 16] = sandbox_abi::random::bytes();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_secs(170);

    #[test]
    fn commands_run_above_the_agents_oom_score() {
        assert_eq!(command_score(-500), 0);
        assert_eq!(command_score(0), 500);
        assert_eq!(command_score(-1000), 0);
        assert_eq!(command_score(700), 1000);
        let (buf, len) = command_oom_score();
        let text = std::str::from_utf8(&buf[..len]).unwrap();
        let own: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(text, command_score(own).to_string());
    }

    #[test]
    fn timeout_is_answered_before_n() {
        let d = deadlines(Some(3.0), None, CAP);
        assert!(!d.by_cap);
        assert!(d.kill_after < d.respond_by && d.respond_by < Duration::from_secs(3));
        assert_eq!(d.kill_after, Duration::from_millis(2700));
        let d = deadlines(Some(60.0), Some(30.0), CAP);
        assert_eq!(d.kill_after, Duration::from_secs(29));
        assert_eq!(d.respond_by, Duration::from_millis(29_500));
        let d = deadlines(None, Some(0.06), CAP);
        assert!(d.respond_by < Duration::from_millis(60) && d.kill_after > Duration::ZERO);
    }

    #[test]
    fn no_or_silly_timeout_uses_the_cap() {
        for (t, h) in [
            (None, None),
            (Some(0.0), None),
            (Some(-1.0), Some(f64::NAN)),
            (Some(500.0), None),
            (Some(1e300), Some(f64::INFINITY)),
        ] {
            let d = deadlines(t, h, CAP);
            assert!(d.by_cap);
            assert_eq!(d.kill_after, Duration::from_secs(169));
        }
    }

    #[test]
    fn exec_request_tolerates_nulls_ints_and_unknown_fields() {
        let r: ExecRequest = serde_json::from_str(
            r#"{"command":"ls","timeout":5,"hard_timeout":null,"truncate":null,"id":null,
                "exec_dir":null,"async_mode":false,"no_change_timeout":3,"whatever":[1]}"#,
        )
        .unwrap();
        assert_eq!(r.timeout, Some(5.0));
        assert_eq!((r.hard_timeout, r.truncate, r.exec_dir), (None, None, None));
    }

    #[test]
    fn session_ids_look_like_uuids() {
        let a = fresh_session_id();
        assert_eq!(a.len(), 36);
        assert_ne!(a, fresh_session_id());
    }
}
