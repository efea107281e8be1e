//! PID-1 duties: the one place that calls `waitpid`.
//!
//! The agent is PID 1 of its pid namespace, so every orphan in the sandbox is
//! re-parented to it and must be reaped. A global `waitpid(-1)` loop would
//! steal exit statuses from anything else that waits on its own children
//! (tokio::process, `Child::wait`), so nothing else in the agent waits: exec
//! children are spawned through [`Reaper::spawn`], which registers a waiter
//! for the pid while holding the waiter map's lock, and the reaper task
//! (driven by SIGCHLD, plus a slow safety tick while a child is waited
//! for) reaps every exited child and
//! hands registered pids their status. Orphans' statuses are dropped.
//!
//! When the agent is not PID 1 (tests, or a runtime that runs it under an
//! init), it makes itself a child subreaper so orphans still come to it.
//!
//! Owns: the waiter map, SIGCHLD handling, forwarding termination to
//! children. Must not read or write child output.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{kill_process_group, wait, Pid, Signal, WaitOptions};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    #[error("becoming a child subreaper: {0}")]
    Subreaper(#[source] Errno),
    #[error("installing the SIGCHLD handler: {0}")]
    SignalHandler(#[source] std::io::Error),
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    Exited(i32),
    Signaled(i32),
}

impl ChildExit {
    /// The shell convention: the exit code, or 128 + signal number.
    pub fn code(self) -> i32 {
        match self {
            ChildExit::Exited(code) => code,
            ChildExit::Signaled(sig) => 128 + sig,
        }
    }
}

/// Receives the exit of one spawned child.
pub type ExitReceiver = oneshot::Receiver<ChildExit>;

/// How often the reaper also looks for exited children while it waits for
/// one (in case a SIGCHLD was missed).
const SAFETY_TICK: Duration = Duration::from_secs(2);

/// The central reaper. Cheap to share (`Arc`).
#[derive(Debug, Default)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<ChildExit>>>,
}

impl Reaper {
    /// Becomes a subreaper when not PID 1, installs the SIGCHLD handler and
    /// starts the reaping task. Must be called inside the tokio runtime and
    /// before any child is spawned.
    pub fn start() -> Result<Arc<Self>, ReaperError> {
        if std::process::id() != 1 {
            // Not fatal: without it orphans go to the real init, which reaps.
            if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
                tracing::warn!(error = %ReaperError::Subreaper(e), "orphans will not be reaped here");
            }
        }
        let mut sigchld = signal(SignalKind::child()).map_err(ReaperError::SignalHandler)?;
        let reaper = Arc::new(Self::default());
        let task_reaper = Arc::clone(&reaper);
        tokio::spawn(async move {
            loop {
                // The safety tick runs only while a child we wait for
                // exists: an idle sandbox's agent sleeps until a signal or
                // a request (no timer wakes it; orphans re-parented to it
                // send SIGCHLD like any child).
                let idle = task_reaper.lock().is_empty();
                if idle {
                    if sigchld.recv().await.is_none() {
                        // No more signals (runtime shutting down): fall
                        // back on the tick alone.
                        tokio::time::sleep(SAFETY_TICK).await;
                    }
                } else {
                    tokio::select! {
                        _ = sigchld.recv() => {}
                        _ = tokio::time::sleep(SAFETY_TICK) => {}
                    }
                }
                task_reaper.reap_all();
            }
        });
        Ok(reaper)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i32, oneshot::Sender<ChildExit>>> {
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Spawns `cmd` and registers a waiter for it before the reaper can see
    /// its exit: the map lock is held across the spawn, and the reaper takes
    /// it before dispatching a status. The `Child` handle is dropped without
    /// waiting (dropping never waits or kills).
    pub fn spawn(&self, cmd: &mut Command) -> std::io::Result<(i32, ExitReceiver)> {
        let mut waiters = self.lock();
        let child = cmd.spawn()?;
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        let (tx, rx) = oneshot::channel();
        waiters.insert(pid, tx);
        drop(waiters);
        drop(child);
        Ok((pid, rx))
    }

    /// Reaps every exited child without blocking.
    pub fn reap_all(&self) {
        loop {
            let (pid, exit) = match wait(WaitOptions::NOHANG) {
                Ok(None) => return, // children, none exited
                Ok(Some((pid, status))) => {
                    if let Some(code) = status.exit_status() {
                        (pid, ChildExit::Exited(code))
                    } else if let Some(sig) = status.terminating_signal() {
                        (pid, ChildExit::Signaled(sig))
                    } else {
                        continue; // stopped or continued (not asked for)
                    }
                }
                Err(Errno::INTR) => continue,
                Err(_) => return, // ECHILD: no children at all
            };
            let pid = pid.as_raw_nonzero().get();
            match self.lock().remove(&pid) {
                Some(tx) => {
                    let _ = tx.send(exit);
                }
                None => tracing::debug!(pid, "reaped orphan"),
            }
        }
    }

    /// Pids of spawned children that have not exited yet.
    pub fn live_children(&self) -> Vec<i32> {
        self.lock().keys().copied().collect()
    }

    /// Forwards `SIGTERM` to every child's process group (and, as PID 1, to
    /// every process in the namespace), waits up to `grace` for the spawned
    /// children to exit, then `SIGKILL`s what is left.
    pub async fn terminate_all(&self, grace: Duration) {
        self.signal_everyone(Signal::TERM);
        let deadline = Instant::now() + grace;
        while !self.live_children().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.reap_all();
        }
        self.signal_everyone(Signal::KILL);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.reap_all();
    }

    fn signal_everyone(&self, sig: Signal) {
        for pid in self.live_children() {
            let _ = kill_group(pid, sig);
        }
        if std::process::id() == 1 {
            // As init, -1 reaches every process of the pid namespace (never
            // init itself). Outside PID 1 this would reach the whole host's
            // processes of this uid, so it is guarded.
            // SAFETY: kill(2) takes no pointers; -1 is "every process we
            // may signal".
            unsafe { libc::kill(-1, sig.as_raw()) };
        }
    }
}

/// Sends `sig` to the process group led by `pgid`.
pub fn kill_group(pgid: i32, sig: Signal) -> Result<(), Errno> {
    if pgid <= 1 {
        return Err(Errno::INVAL);
    }
    match Pid::from_raw(pgid) {
        Some(pid) => kill_process_group(pid, sig),
        None => Err(Errno::INVAL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(ChildExit::Exited(3).code(), 3);
        assert_eq!(ChildExit::Signaled(9).code(), 137);
        assert_eq!(ChildExit::Signaled(15).code(), 143);
    }

    #[test]
    fn refuses_to_signal_init_or_everyone() {
        assert_eq!(kill_group(1, Signal::TERM), Err(Errno::INVAL));
        assert_eq!(kill_group(0, Signal::TERM), Err(Errno::INVAL));
        assert_eq!(kill_group(-1, Signal::TERM), Err(Errno::INVAL));
    }
}
