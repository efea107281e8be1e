//! [`Backend::status`]: records read from the table. For many records
//! (list) the OOM flags are first brought up to date without a file read
//! per sandbox ([`oom`](super::oom)); for a few (discover) their own
//! counters are read. Then every record comes from one lock
//! of the table, PID 1's exit checked for all of them in one `poll` of
//! their pidfds (not one system call per sandbox): running while the table
//! says so and PID 1 has not exited (an exit the watcher has not marked
//! yet is seen too).
//!
//! A proxied request's [`Backend::running`] copies no record and reads no
//! file: one lookup in the table (which also says whether the sandbox is
//! asleep on the hibernation ladder) and a `poll` of PID 1's pidfd.
//!
//! [`Backend::status`]: crate::backend::Backend::status
//! [`Backend::running`]: crate::backend::Backend::running

use std::sync::Arc;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::oom::{self, Gate};
use super::proc::ProcHandle;
use super::watch::LiveMap;
use crate::backend::{Running, SandboxRef};
use crate::model::{SandboxRecord, SandboxStatus};

/// Pidfds per `poll` (well under any open-file limit, which bounds `nfds`).
const POLL_CHUNK: usize = 256;

pub(super) fn status(
    gate: &Gate,
    live: &LiveMap,
    sandboxes: &[SandboxRef],
) -> Vec<Option<SandboxRecord>> {
    if sandboxes.len() <= oom::DIRECT_MAX {
        for s in sandboxes {
            oom::check(live, &s.sandbox_id, &s.generation);
        }
    } else {
        oom::sync(gate, live);
    }
    let mut out: Vec<Option<SandboxRecord>> = Vec::with_capacity(sandboxes.len());
    // Running per the table: PID 1's pidfd still to be polled (and its
    // idle state, which only a running sandbox has).
    let mut running: Vec<(usize, Arc<ProcHandle>)> = Vec::new();
    let mut idle = Vec::new();
    {
        let map = live.lock();
        for (i, s) in sandboxes.iter().enumerate() {
            let l = map
                .get(&s.sandbox_id)
                .filter(|l| l.record.generation == s.generation);
            out.push(l.map(|l| {
                if l.record.status == SandboxStatus::Running {
                    running.push((i, l.handle.clone()));
                    idle.push(l.record.idle);
                }
                SandboxRecord {
                    status: SandboxStatus::Exited,
                    idle: None,
                    ..l.record.clone()
                }
            }));
        }
    }
    let mut idle = idle.into_iter();
    for chunk in running.chunks(POLL_CHUNK) {
        for (i, alive) in chunk.iter().map(|(i, _)| *i).zip(alive(chunk)) {
            let mark = idle.next().flatten();
            if let (true, Some(r)) = (alive, out[i].as_mut()) {
                r.status = SandboxStatus::Running;
                r.idle = mark;
            }
        }
    }
    out
}

/// Whether the table has `sandbox`'s incarnation running and its PID 1 has
/// not exited, and whether it is asleep (frozen or reclaimed).
pub(super) fn running(live: &LiveMap, sandbox: &SandboxRef) -> Running {
    let (handle, asleep) = match live.lock().get(&sandbox.sandbox_id) {
        Some(l)
            if l.record.generation == sandbox.generation
                && l.record.status == SandboxStatus::Running =>
        {
            let asleep = l.record.idle.is_some_and(|m| m.state.asleep());
            (l.handle.clone(), asleep)
        }
        _ => return Running::No,
    };
    match (handle.exited(), asleep) {
        (true, _) => Running::No,
        (false, true) => Running::Asleep,
        (false, false) => Running::Yes,
    }
}

/// Whether each process has not exited (no event on its pidfd), as
/// [`ProcHandle::exited`] answers, in one `poll`.
fn alive(handles: &[(usize, Arc<ProcHandle>)]) -> Vec<bool> {
    let mut fds: Vec<PollFd> = handles
        .iter()
        .map(|(_, h)| PollFd::new(h.pidfd(), PollFlags::POLLIN))
        .collect();
    loop {
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            // As `exited` answers when it cannot poll: not exited.
            Err(_) => return vec![true; handles.len()],
        }
    }
    fds.iter()
        .map(|fd| fd.revents().is_some_and(|r| r.is_empty()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn one_poll_tells_the_exited_from_the_running() {
        let mut procs: Vec<(std::process::Child, Arc<ProcHandle>)> = (0..4)
            .map(|_| {
                let child = std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap();
                let h = ProcHandle::open(child.id() as i32, None).unwrap();
                (child, Arc::new(h))
            })
            .collect();
        let handles: Vec<(usize, Arc<ProcHandle>)> = procs
            .iter()
            .enumerate()
            .map(|(i, (_, h))| (i, h.clone()))
            .collect();
        assert_eq!(alive(&handles), [true; 4]);
        // One exits and is reaped; another exits and is left a zombie.
        procs[1].0.kill().unwrap();
        procs[1].0.wait().unwrap();
        procs[3].0.kill().unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while alive(&handles)[3] {
            assert!(
                Instant::now() < end,
                "the killed process never polled exited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(alive(&handles), [true, false, true, false]);
        assert_eq!(
            alive(&handles),
            handles.iter().map(|(_, h)| !h.exited()).collect::<Vec<_>>(),
            "the same answers as one by one"
        );
        for (mut c, _) in procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
