//! The systemd service protocol (no libsystemd): readiness and watchdog
//! notifications over `$NOTIFY_SOCKET` (sd_notify) and socket activation
//! (`$LISTEN_PID`/`$LISTEN_FDS`/`$LISTEN_FDNAMES`).
//!
//! The `sd-notify` crate reads the watchdog and socket-activation variables
//! (and sets the passed fds close-on-exec) and spells the notification
//! states ([`NotifyState`]). What it does not cover stays here: keeping the
//! notify socket's address after `$NOTIFY_SOCKET` is unset (its `notify`
//! reads the variable at every call, and we unset it so sandboxes never
//! inherit it), abstract notify sockets (`@name`: it connects by pathname
//! only), and checking and converting the passed fds into listeners.
//!
//! [`SystemdEnv::take`] reads these variables *and removes them from our
//! environment* so sandboxes and launchers never inherit them; it must run
//! before any other thread exists (before the tokio runtime starts). What to
//! notify and when is decided by `cli::serve`; this module only speaks the
//! protocol.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use nix::sys::socket::{
    getsockopt, sockopt, AddressFamily, SockType, SockaddrLike, SockaddrStorage,
};
pub use sd_notify::NotifyState;

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// Malformed `LISTEN_*`, or a passed fd that is not open (sd-notify's
    /// reading of them).
    #[error("socket activation: {0}")]
    Activation(std::io::Error),
    #[error("socket activation: fd {fd}: {message}")]
    NotAListener { fd: i32, message: String },
    #[error("socket activation: fd {fd}: {source}")]
    Convert { fd: i32, source: std::io::Error },
}

/// What systemd told us through the environment.
#[derive(Debug, Default)]
pub struct SystemdEnv {
    /// Where to send notifications (`$NOTIFY_SOCKET`).
    pub notifier: Option<Notifier>,
    /// How often to send `WATCHDOG=1` (half of `$WATCHDOG_USEC`), when the
    /// watchdog is enabled for this process.
    pub watchdog_interval: Option<Duration>,
    /// Listening sockets passed by socket activation, with their names.
    pub listen_fds: Vec<ActivatedFd>,
    /// `LISTEN_*` was present but addressed to another process.
    pub listen_pid_mismatch: bool,
}

impl SystemdEnv {
    /// Reads and unsets `NOTIFY_SOCKET`, `WATCHDOG_*` and `LISTEN_*`, and
    /// takes ownership of the activated fds.
    ///
    /// Call it once, while the process is still single-threaded (environment
    /// mutation is not thread-safe), and before anything else could claim
    /// fds 3 and up.
    pub fn take() -> Result<SystemdEnv, SystemdError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let notify = var("NOTIFY_SOCKET");
        let listen_pid = var("LISTEN_PID");
        let has_listen_fds = var("LISTEN_FDS").is_some();
        let has_names = var("LISTEN_FDNAMES").is_some();
        // SAFETY: `take`'s contract: the process is still single-threaded,
        // so nothing reads the environment while these unset it.
        let watchdog = unsafe { sd_notify::watchdog_enabled_and_unset_env() };
        // SAFETY: as above.
        let passed = unsafe { sd_notify::listen_fds_with_names_and_unset_env() };
        std::env::remove_var("NOTIFY_SOCKET");

        let mut out = SystemdEnv {
            notifier: notify.map(Notifier::new),
            watchdog_interval: watchdog.filter(|d| !d.is_zero()).map(|d| d / 2),
            ..SystemdEnv::default()
        };
        if has_listen_fds
            && listen_pid.as_deref().map(str::trim) != Some(&std::process::id().to_string())
        {
            out.listen_pid_mismatch = true;
            return Ok(out);
        }
        for (fd, name) in passed.map_err(SystemdError::Activation)? {
            // SAFETY: sd-notify set FD_CLOEXEC on fd (F_GETFD/F_SETFD
            // succeeded), so it is open, and it was passed to this process
            // by its parent for us alone: nothing else in the process refers
            // to it, so it gets exactly one owner here.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            // Without $LISTEN_FDNAMES sd-notify names every fd "unknown".
            let name = Some(name).filter(|n| has_names && !n.is_empty());
            out.listen_fds.push(ActivatedFd { fd: owned, name });
        }
        Ok(out)
    }
}

/// A socket passed by systemd.
#[derive(Debug)]
pub struct ActivatedFd {
    pub fd: OwnedFd,
    /// Its `FileDescriptorName=` (from `$LISTEN_FDNAMES`).
    pub name: Option<String>,
}

/// An activated listener, converted to the std type of its family.
#[derive(Debug)]
pub enum ActivatedListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl ActivatedFd {
    /// Checks that the fd is a listening stream socket, detects TCP vs Unix
    /// with getsockname and makes it non-blocking (for tokio).
    pub fn into_listener(self) -> Result<ActivatedListener, SystemdError> {
        use std::os::fd::AsRawFd;
        let fd = self.fd.as_raw_fd();
        let bad = |message: String| SystemdError::NotAListener { fd, message };
        let ty = getsockopt(&self.fd.as_fd(), sockopt::SockType)
            .map_err(|e| bad(format!("not a socket: {e}")))?;
        if ty != SockType::Stream {
            return Err(bad(format!("socket type {ty:?}, expected a stream socket")));
        }
        let listening = getsockopt(&self.fd.as_fd(), sockopt::AcceptConn)
            .map_err(|e| bad(format!("SO_ACCEPTCONN: {e}")))?;
        if !listening {
            return Err(bad("socket is not listening".into()));
        }
        let addr: SockaddrStorage =
            nix::sys::socket::getsockname(fd).map_err(|e| bad(format!("getsockname: {e}")))?;
        let l = match addr.family() {
            Some(AddressFamily::Inet | AddressFamily::Inet6) => {
                ActivatedListener::Tcp(std::net::TcpListener::from(self.fd))
            }
            Some(AddressFamily::Unix) => {
                ActivatedListener::Unix(std::os::unix::net::UnixListener::from(self.fd))
            }
            other => return Err(bad(format!("unsupported address family {other:?}"))),
        };
        let nb = match &l {
            ActivatedListener::Tcp(t) => t.set_nonblocking(true),
            ActivatedListener::Unix(u) => u.set_nonblocking(true),
        };
        nb.map_err(|source| SystemdError::Convert { fd, source })?;
        Ok(l)
    }
}

/// Sends sd_notify datagrams to `$NOTIFY_SOCKET` (a path, or `@name` for an
/// abstract socket). Sending is best effort: a lost notification is logged
/// by the caller, never fatal. Ours, not `sd_notify::notify`: that one reads
/// `$NOTIFY_SOCKET` at every call (we unset it at start) and cannot reach an
/// abstract socket.
#[derive(Debug, Clone)]
pub struct Notifier {
    target: String,
}

impl Notifier {
    pub fn new(target: String) -> Notifier {
        Notifier { target }
    }

    /// Where notifications go (a socket path, not a secret).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Sends one notification: the states as newline-separated
    /// `KEY=value` assignments, in order.
    pub fn notify(&self, states: &[NotifyState<'_>]) -> std::io::Result<()> {
        let msg = message(states);
        let addr = match self.target.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
            None => SocketAddr::from_pathname(&self.target)?,
        };
        let sock = UnixDatagram::unbound()?;
        let sent = sock.send_to_addr(msg.as_bytes(), &addr)?;
        if sent != msg.len() {
            return Err(std::io::Error::other("short write to the notify socket"));
        }
        Ok(())
    }
}

/// The datagram of `states` (sd-notify spells each one).
fn message(states: &[NotifyState<'_>]) -> String {
    states
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifies_path_and_abstract_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        Notifier::new(path.to_string_lossy().into_owned())
            .notify(&[NotifyState::Ready, NotifyState::Status("x")])
            .unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=x");

        let name = format!("sandboxd-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        Notifier::new(format!("@{name}"))
            .notify(&[NotifyState::Watchdog])
            .unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
    }

    #[test]
    fn missing_socket_is_an_error_not_a_panic() {
        let n = Notifier::new("/nonexistent/sandboxd-notify".into());
        assert!(n.notify(&[NotifyState::Ready]).is_err());
    }

    #[test]
    fn messages_as_systemd_reads_them() {
        assert_eq!(
            message(&[
                NotifyState::Ready,
                NotifyState::Status("serving (2 sandboxes adopted at start)"),
                NotifyState::MainPid(42),
            ]),
            "READY=1\nSTATUS=serving (2 sandboxes adopted at start)\nMAINPID=42"
        );
        assert_eq!(
            message(&[NotifyState::Stopping, NotifyState::Status("stopping")]),
            "STOPPING=1\nSTATUS=stopping"
        );
        assert_eq!(message(&[NotifyState::Watchdog]), "WATCHDOG=1");
    }
}
