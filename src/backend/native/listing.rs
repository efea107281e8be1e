//! List's refresh of every record at once ([`Backend::refresh_all`]):
//! the OOM flags brought up to date without a file read per sandbox
//! ([`oom`](super::oom)), then every record's status and flag from one
//! lock of the table, PID 1's exit checked for all of them in one `poll`
//! of their pidfds (not one system call per sandbox). The answers are the
//! ones [`Backend::refresh`] gives record by record.
//!
//! [`Backend::refresh_all`]: crate::backend::Backend::refresh_all
//! [`Backend::refresh`]: crate::backend::Backend::refresh

use std::sync::Arc;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::oom::{self, Gate};
use super::proc::ProcHandle;
use super::watch::LiveMap;
use crate::model::{SandboxRecord, SandboxStatus};

/// Pidfds per `poll` (well under any open-file limit, which bounds `nfds`).
const POLL_CHUNK: usize = 256;

pub(super) fn refresh_all(gate: &Gate, live: &LiveMap, records: &mut [SandboxRecord]) {
    oom::sync(gate, live);
    // Running per the table: PID 1's pidfd still to be polled.
    let mut running: Vec<(usize, Arc<ProcHandle>)> = Vec::with_capacity(records.len());
    {
        let map = live.read();
        for (i, r) in records.iter_mut().enumerate() {
            match map.get(&r.sandbox_id) {
                Some(l) if l.record.generation == r.generation => {
                    if l.record.oom_killed == Some(true) {
                        r.oom_killed = Some(true);
                    }
                    if l.record.status == SandboxStatus::Running {
                        running.push((i, l.handle.clone()));
                    }
                    r.status = SandboxStatus::Exited;
                }
                _ => r.status = SandboxStatus::Exited,
            }
        }
    }
    for chunk in running.chunks(POLL_CHUNK) {
        for (i, alive) in chunk.iter().map(|(i, _)| *i).zip(alive(chunk)) {
            if alive {
                records[i].status = SandboxStatus::Running;
            }
        }
    }
}

/// [`Backend::refresh_stamp`](crate::backend::Backend::refresh_stamp):
/// the OOM flags brought up to date as [`refresh_all`] does first (a flag
/// set changes the table), then the table's stamp, which counts the exits
/// of PID 1s not yet seen (one `epoll_wait`, whatever the number of
/// sandboxes). No file read per sandbox and no system call per sandbox.
pub(super) fn stamp(gate: &Gate, live: &LiveMap) -> Option<u64> {
    oom::sync(gate, live);
    live.stamp()
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
