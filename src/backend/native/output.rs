//! What a sandbox's PID 1 writes (the launcher's and the agent's stdout and
//! stderr): never to disk, where a sandbox could fill the host's, but
//! through a FIFO the daemon drains into a bounded ring per sandbox (the
//! last [`RING_BYTES`], with timestamps, for `sandboxd logs` and the
//! `/api/sandboxes/{id}/logs` route) and into the daemon's own log, at most
//! [`LINES_PER_SECOND`] lines a second per sandbox (the rest are counted
//! and the count is logged).
//!
//! The FIFO (`<state_dir>/sandboxes/<id>/output`, mode 0600) rather than a
//! pipe so that a restarted daemon can open it again and go on reading from
//! the sandboxes it adopts. While no daemon reads it, the agent's writes
//! fail with EPIPE (it ignores SIGPIPE and its logger ignores write errors).

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tracing::{debug, info, warn};

/// Output kept per sandbox.
pub const RING_BYTES: usize = 64 * 1024;
/// Longest line kept whole; longer ones are cut into pieces of this size.
pub const MAX_LINE: usize = 4096;
/// Lines per second per sandbox copied into the daemon's log...
pub const LINES_PER_SECOND: f64 = 20.0;
/// ...after a burst of this many.
pub const BURST: f64 = 200.0;
/// How often the count of lines left out of the daemon's log is reported.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// The FIFO of sandbox `dir`.
pub fn fifo_path(sandbox_dir: &Path) -> PathBuf {
    sandbox_dir.join("output")
}

/// Makes the FIFO (if missing) and opens its read end (non-blocking, so
/// opening never waits for a writer).
pub fn open_read(fifo: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    match rustix::fs::mknodat(
        rustix::fs::CWD,
        fifo,
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    ) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let fd = rustix::fs::open(
        fifo,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    // Someone may have replaced the node: only a FIFO is ours.
    if rustix::fs::fstat(&fd)?.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return Err(std::io::Error::other(format!(
            "{} is not a FIFO",
            fifo.display()
        )));
    }
    Ok(fd)
}

/// Opens the write end (a reader exists, so this does not block): the
/// launcher's stdout and stderr.
pub fn open_write(fifo: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        fifo,
        OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?)
}

/// One sandbox's output: the ring and the rate limit of its copy into the
/// daemon's log.
pub struct Output {
    sandbox_id: String,
    generation: String,
    state: Mutex<State>,
}

struct State {
    lines: VecDeque<(SystemTime, String)>,
    bytes: usize,
    partial: Vec<u8>,
    tokens: f64,
    refilled: Instant,
    suppressed: u64,
    reported: Instant,
}

impl Output {
    pub fn new(sandbox_id: &str, generation: &str) -> Output {
        let now = Instant::now();
        Output {
            sandbox_id: sandbox_id.to_string(),
            generation: generation.to_string(),
            state: Mutex::new(State {
                lines: VecDeque::new(),
                bytes: 0,
                partial: Vec::new(),
                tokens: BURST,
                refilled: now,
                suppressed: 0,
                reported: now,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes bytes as read from the FIFO; complete lines go to the ring and
    /// (rate-limited) to the daemon's log.
    pub fn push(&self, bytes: &[u8]) {
        let mut st = self.lock();
        st.partial.extend_from_slice(bytes);
        loop {
            let cut = match st.partial.iter().position(|b| *b == b'\n') {
                Some(i) if i <= MAX_LINE => Some((i, 1)),
                _ if st.partial.len() > MAX_LINE => Some((MAX_LINE, 0)),
                _ => None,
            };
            let Some((end, skip)) = cut else { break };
            let line: Vec<u8> = st.partial.drain(..end + skip).take(end).collect();
            let line = String::from_utf8_lossy(&line).into_owned();
            self.line(&mut st, line);
        }
    }

    /// Whatever is left without a newline (at EOF).
    pub fn flush(&self) {
        let mut st = self.lock();
        if !st.partial.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut st.partial)).into_owned();
            self.line(&mut st, line);
        }
    }

    fn line(&self, st: &mut State, line: String) {
        // The daemon's log: a token bucket per sandbox.
        let now = Instant::now();
        let elapsed = now.duration_since(st.refilled).as_secs_f64();
        st.tokens = (st.tokens + elapsed * LINES_PER_SECOND).min(BURST);
        st.refilled = now;
        if st.tokens >= 1.0 {
            st.tokens -= 1.0;
            info!(target: "sandbox_output", sandbox_id = %self.sandbox_id,
                  generation = %self.generation, "{line}");
        } else {
            st.suppressed += 1;
        }
        if st.suppressed > 0 && now.duration_since(st.reported) >= REPORT_EVERY {
            warn!(sandbox_id = %self.sandbox_id, generation = %self.generation,
                  suppressed = st.suppressed,
                  "sandbox output over {LINES_PER_SECOND} lines/s: lines left out of the daemon log (the last {RING_BYTES} bytes are kept for `sandboxd logs`)");
            st.suppressed = 0;
            st.reported = now;
        }
        // The ring: drop the oldest lines beyond its size.
        st.bytes += line.len() + 1;
        st.lines.push_back((SystemTime::now(), line));
        while st.bytes > RING_BYTES {
            match st.lines.pop_front() {
                Some((_, l)) => st.bytes -= l.len() + 1,
                None => break,
            }
        }
    }

    /// The ring as text: one line each, prefixed with its time (UTC,
    /// seconds since the epoch with milliseconds).
    pub fn render(&self) -> String {
        let st = self.lock();
        let mut out = String::with_capacity(st.bytes + st.lines.len() * 16);
        for (t, l) in &st.lines {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            out.push_str(&format!("{}.{:03} {l}\n", d.as_secs(), d.subsec_millis()));
        }
        out
    }

    /// The last `max` bytes of the ring, without timestamps (for errors).
    pub fn tail(&self, max: usize) -> String {
        let st = self.lock();
        let mut text = String::new();
        for (_, l) in st.lines.iter().rev() {
            if text.len() + l.len() + 1 > max {
                break;
            }
            text.insert_str(0, &format!("{l}\n"));
        }
        text
    }

    /// Reads what the FIFO holds now without waiting (a launch that
    /// failed: everything its processes wrote before they died is there).
    pub fn read_available(&self, fd: &OwnedFd) {
        let mut f = std::fs::File::from(fd.try_clone().expect("dup the FIFO"));
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            self.push(&buf[..n]);
        }
        self.flush();
    }
}

/// A sandbox's output and the task draining it.
type Drained = (Arc<Output>, Option<tokio::task::JoinHandle<()>>);

/// Every sandbox's output, by id, kept until the sandbox is destroyed.
#[derive(Default)]
pub struct Outputs {
    map: Mutex<HashMap<String, Drained>>,
}

impl Outputs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Drained>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts draining `fd` (the FIFO's read end) into `output` for `id`,
    /// replacing (and stopping) any earlier drain of the id.
    pub fn start(&self, id: &str, output: Arc<Output>, fd: OwnedFd) {
        let task = match tokio::runtime::Handle::try_current() {
            Ok(rt) => Some(rt.spawn(drain(output.clone(), fd))),
            Err(_) => {
                debug!(sandbox_id = %id, "no runtime: the sandbox's output is not drained");
                None
            }
        };
        if let Some((_, Some(old))) = self.lock().insert(id.to_string(), (output, task)) {
            old.abort();
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Output>> {
        self.lock().get(id).map(|(o, _)| o.clone())
    }

    /// Forgets `id` and stops its drain.
    pub fn remove(&self, id: &str) {
        if let Some((_, Some(task))) = self.lock().remove(id) {
            task.abort();
        }
    }
}

/// Reads the FIFO until every writer closed it (the sandbox is gone).
async fn drain(output: Arc<Output>, fd: OwnedFd) {
    // SAFETY: `fd` is the FIFO's read end, owned by the AsyncFd for its
    // whole life (OwnedFd: nothing else closes or reuses it).
    let afd = match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
        Ok(a) => a,
        Err(e) => {
            warn!(sandbox_id = %output.sandbox_id, error = %e, "cannot poll the sandbox's output FIFO");
            return;
        }
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let mut guard = match afd.readable().await {
            Ok(g) => g,
            Err(_) => break,
        };
        match guard
            .try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf[..]).map_err(std::io::Error::from))
        {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => output.push(&buf[..n]),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => {
                debug!(sandbox_id = %output.sandbox_id, error = %e, "reading the output FIFO");
                break;
            }
            Err(_would_block) => {}
        }
    }
    output.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_bytes_in_lines() {
        let o = Output::new("t", "g");
        for i in 0..20_000 {
            o.push(format!("line {i}\n").as_bytes());
        }
        assert!(o.tail(usize::MAX).len() <= RING_BYTES);
        assert!(o.tail(usize::MAX).len() > RING_BYTES - 64);
        let text = o.render();
        assert!(
            text.trim_end().ends_with("line 19999"),
            "{}",
            &text[text.len() - 40..]
        );
        assert!(!text.contains("line 1 \n") && !text.contains(" line 0\n"));
        // A long line without a newline is cut, and a partial one waits.
        o.push(&vec![b'x'; MAX_LINE + 10]);
        assert!(o.tail(MAX_LINE + 2).starts_with(&"x".repeat(MAX_LINE)));
        o.flush();
        assert!(o.tail(64).ends_with(&format!("{}\n", "x".repeat(10))));
    }

    #[test]
    fn a_fifo_is_made_private_and_read_without_blocking() {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = fifo_path(d.path());
        let r = open_read(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let mut w = std::fs::File::from(open_write(&p).unwrap());
        w.write_all(b"hello\nwor").unwrap();
        drop(w);
        let o = Output::new("t", "g");
        o.read_available(&r);
        assert_eq!(o.tail(100), "hello\nwor\n");
        // Not a FIFO: refused.
        let f = d.path().join("file");
        std::fs::write(&f, "").unwrap();
        assert!(open_read(&f).is_err());
    }
}
