//! [`Backend::get`]: records' status and OOM flag read from the table.
//! For many records (list) the OOM flags are first brought up to date
//! without a file read per sandbox ([`oom`](super::oom)); for a few
//! (discover) their own counters are read. Then every record's status and
//! flag come from one lock of the table, PID 1's exit checked for all of
//! them in one `poll` of their pidfds (not one system call per sandbox).
//!
//! [`Backend::get`]: crate::backend::Backend::get

use std::sync::Arc;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::oom::{self, Gate};
use super::proc::ProcHandle;
use super::watch::LiveMap;
use crate::model::{SandboxRecord, SandboxStatus};

/// Pidfds per `poll` (well under any open-file limit, which bounds `nfds`).
const POLL_CHUNK: usize = 256;

pub(super) fn get(gate: &Gate, live: &LiveMap, records: &mut [SandboxRecord]) {
    if records.len() <= oom::DIRECT_MAX {
        for r in records.iter() {
            oom::check(live, &r.sandbox_id, &r.generation);
        }
    } else {
        oom::sync(gate, live);
    }
    // Running per the table: PID 1's pidfd still to be polled.
    let mut running: Vec<(usize, Arc<ProcHandle>)> = Vec::with_capacity(records.len());
    {
        let map = live.lock();
        for (i, r) in records.iter_mut().enumerate() {
            r.status = SandboxStatus::Exited;
            if let Some(l) = map.get(&r.sandbox_id) {
                if l.record.generation == r.generation {
                    if l.record.oom_killed == Some(true) {
                        r.oom_killed = Some(true);
                    }
                    if l.record.status == SandboxStatus::Running {
                        running.push((i, l.handle.clone()));
                    }
                }
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
