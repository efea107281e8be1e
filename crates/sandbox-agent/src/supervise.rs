//! Running one spawned exec child to its end: reading the combined output,
//! enforcing the kill deadline, and cleaning up after it.
//!
//! - The whole process group is killed (SIGKILL) at the deadline, and also
//!   when the request is abandoned (client gone) before the shell exited.
//! - After the answer, a pipe still held by background jobs (`cmd &`) keeps
//!   being drained in the background, so their writes never fail.
//! - A long command's script file is removed once the shell is gone.
//!
//! Owns: the life of one child after spawn. Must not reap (see `reaper`).

use std::path::PathBuf;
use std::time::Duration;

use rustix::process::Signal;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe::Receiver;
use tokio::time::Instant;

use super::output::OutputBuf;
use super::reaper::{kill_group, ChildExit, ExitReceiver};

const READ_BUF: usize = 64 * 1024;

/// A script file holding a command too long for `bash -c`; removed on drop.
#[derive(Debug)]
pub struct ScriptFile(pub PathBuf);

impl Drop for ScriptFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A spawned exec child: its group leader, exit, output pipe and script.
#[derive(Debug)]
pub struct Child {
    pub pid: i32,
    pub exit_rx: ExitReceiver,
    pub reader: Receiver,
    pub script: Option<ScriptFile>,
}

/// Kills the group when dropped while armed.
struct KillOnDrop(Option<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = kill_group(pgid, Signal::KILL);
        }
    }
}

/// Reads output until the shell exits (→ its status) or `kill_at` passes
/// (→ the group is killed, `None`). Always returns by `respond_by`.
pub async fn wait_or_kill(
    child: Child,
    out: &mut OutputBuf,
    kill_at: Instant,
    respond_by: Instant,
) -> Option<ChildExit> {
    let Child {
        pid,
        mut exit_rx,
        mut reader,
        script,
    } = child;
    let mut armed = KillOnDrop(Some(pid));
    let mut buf = vec![0u8; READ_BUF];
    let mut eof = false;
    let exited = loop {
        tokio::select! {
            read = reader.read(&mut buf), if !eof => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(n) => out.push(&buf[..n]),
            },
            exit = &mut exit_rx => break exit.ok(),
            _ = tokio::time::sleep_until(kill_at) => break None,
        }
    };
    armed.0 = None;
    let result = match exited {
        Some(exit) => {
            // Output written before the exit is in the pipe already;
            // background jobs may keep it open, so stop when it goes quiet.
            let until = respond_by.min(Instant::now() + Duration::from_millis(500));
            eof = drain(&mut reader, out, &mut buf, until, eof).await;
            Some(exit)
        }
        None => {
            let _ = kill_group(pid, Signal::KILL);
            let mid = kill_at + (respond_by - kill_at) / 2;
            let _ = tokio::time::timeout_at(mid, exit_rx).await;
            eof = drain(&mut reader, out, &mut buf, respond_by, eof).await;
            None
        }
    };
    drop(script);
    if !eof {
        tokio::spawn(discard_rest(reader));
    }
    result
}

/// Reads until EOF (→ true), 50 ms without data, or `until`.
async fn drain(
    reader: &mut Receiver,
    out: &mut OutputBuf,
    buf: &mut [u8],
    until: Instant,
    eof: bool,
) -> bool {
    if eof {
        return true;
    }
    loop {
        let quiet = Instant::now() + Duration::from_millis(50);
        match tokio::time::timeout_at(until.min(quiet), reader.read(buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(n)) => out.push(&buf[..n]),
            Err(_) => return false,
        }
    }
}

/// Keeps a pipe drained until every writer is gone.
async fn discard_rest(mut reader: Receiver) {
    let mut buf = vec![0u8; READ_BUF];
    while matches!(reader.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Background half of `async_mode`: discards output, enforces `hard`.
pub async fn watch_async(child: Child, hard: Option<Duration>) {
    let Child {
        pid,
        mut exit_rx,
        mut reader,
        script,
    } = child;
    let deadline = hard.map(|h| Instant::now() + h);
    let mut buf = vec![0u8; READ_BUF];
    let mut eof = false;
    loop {
        tokio::select! {
            read = reader.read(&mut buf), if !eof => eof = matches!(read, Ok(0) | Err(_)),
            exit = &mut exit_rx => {
                tracing::info!(pid, exit_code = exit.ok().map(ChildExit::code), "async exec finished");
                break;
            }
            _ = sleep_until_opt(deadline) => {
                let _ = kill_group(pid, Signal::KILL);
                tracing::info!(pid, "async exec killed at its hard_timeout");
                let _ = exit_rx.await;
                break;
            }
        }
    }
    drop(script);
    if !eof {
        discard_rest(reader).await;
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
