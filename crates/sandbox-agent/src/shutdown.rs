//! Which SIGTERMs stop the agent.
//!
//! As PID 1 the agent must stop when the runtime asks (a SIGTERM sent from
//! outside the sandbox's pid namespace, where the sender is invisible and
//! `si_pid` is 0) but never because a user command ran `kill 1`. tokio's
//! signal streams do not expose the sender, so SIGTERM gets its own
//! `SA_SIGINFO` handler that writes one byte to a self-pipe: `T` (stop) or
//! `I` (ignored, sent from inside). Nothing is blocked, so commands inherit
//! a normal signal mask, and exec resets the handler for them.
//!
//! Outside PID 1 (tests, or under another init) every SIGTERM stops it.
//!
//! Owns: the SIGTERM disposition and its pipe. Must not signal anyone.

use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use rustix::pipe::{pipe_with, PipeFlags};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe::Receiver;

#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    #[error("creating the SIGTERM pipe: {0}")]
    Pipe(#[source] std::io::Error),
    #[error("installing the SIGTERM handler: {0}")]
    Handler(#[source] std::io::Error),
}

/// Write end of the self-pipe (-1 until installed); never closed.
static TERM_PIPE: AtomicI32 = AtomicI32::new(-1);
/// Whether the agent is PID 1 of its namespace.
static WE_ARE_INIT: AtomicBool = AtomicBool::new(false);

/// Whether a SIGTERM from `sender_pid` (as seen in our pid namespace)
/// should stop the agent.
pub fn should_stop(we_are_init: bool, sender_pid: i32) -> bool {
    !we_are_init || sender_pid == 0
}

extern "C" fn on_sigterm(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for
    // the thread's life; it is saved here and restored below so the
    // interrupted code never sees the handler's errno.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above, a valid, aligned pointer.
    let saved = unsafe { *errno };
    let sender = if info.is_null() {
        0
    } else {
        // SAFETY: for an SA_SIGINFO handler the kernel passes a valid
        // siginfo_t; for SIGTERM sent by kill(2) its pid field is set.
        unsafe { (*info).si_pid() }
    };
    let byte: u8 = if should_stop(WE_ARE_INIT.load(Ordering::Relaxed), sender) {
        b'T'
    } else {
        b'I'
    };
    let fd = TERM_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; `fd` is the non-blocking
        // write end of the self-pipe, open for the life of the process, and
        // the buffer is one valid byte. A full pipe just drops the byte.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
    // SAFETY: as above.
    unsafe { *errno = saved };
}

/// SIGTERMs as they arrive, already classified by sender.
pub struct TermSignal {
    reader: Receiver,
}

impl TermSignal {
    /// Installs the handler. Call once, inside the runtime.
    pub fn install() -> Result<Self, ShutdownError> {
        let (read_end, write_end) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)
            .map_err(|e| ShutdownError::Pipe(e.into()))?;
        WE_ARE_INIT.store(std::process::id() == 1, Ordering::Relaxed);
        TERM_PIPE.store(write_end.into_raw_fd(), Ordering::Relaxed);
        let reader = Receiver::from_owned_fd(read_end).map_err(ShutdownError::Pipe)?;
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sigterm;
        // SAFETY: an all-zero sigaction is valid (empty mask, no flags).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = handler as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // SAFETY: the handler only calls async-signal-safe functions (an
        // atomic load, write(2), errno save/restore) and touches no locks;
        // `action` is a valid sigaction for the call's duration and the old
        // action is not asked for.
        let rc = unsafe { libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(ShutdownError::Handler(std::io::Error::last_os_error()));
        }
        Ok(Self { reader })
    }

    /// Returns when a SIGTERM that should stop the agent arrives; logs and
    /// ignores the ones sent from inside the sandbox while PID 1.
    pub async fn stopping(&mut self) {
        let mut byte = [0u8; 1];
        loop {
            match self.reader.read(&mut byte).await {
                Ok(1) if byte[0] == b'I' => {
                    if let Some(left_out) = crate::loglimit::SIGTERMS.admit() {
                        tracing::warn!(left_out, "ignoring SIGTERM sent from inside the sandbox");
                    }
                }
                Ok(_) => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!(error = %e, "reading the SIGTERM pipe");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outside_senders_stop_init() {
        assert!(should_stop(true, 0));
        assert!(!should_stop(true, 42));
        assert!(should_stop(false, 42));
        assert!(should_stop(false, 0));
    }
}
