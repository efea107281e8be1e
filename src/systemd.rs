//! The systemd service protocol, written by hand (no libsystemd): readiness
//! and watchdog notifications over `$NOTIFY_SOCKET` (sd_notify) and socket
//! activation (`$LISTEN_PID`/`$LISTEN_FDS`/`$LISTEN_FDNAMES`).
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

/// First fd passed by socket activation (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("{name}={value:?} is not a valid value")]
    BadVar { name: &'static str, value: String },
    #[error("socket activation: fd {fd} is not open")]
    FdNotOpen { fd: i32 },
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
        let me = std::process::id();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let notify = var("NOTIFY_SOCKET");
        let wd_usec = var("WATCHDOG_USEC");
        let wd_pid = var("WATCHDOG_PID");
        let listen_pid = var("LISTEN_PID");
        let listen_fds = var("LISTEN_FDS");
        let listen_names = var("LISTEN_FDNAMES");
        for name in [
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "LISTEN_PID",
            "LISTEN_FDS",
            "LISTEN_FDNAMES",
        ] {
            std::env::remove_var(name);
        }

        let mut out = SystemdEnv {
            notifier: notify.map(Notifier::new),
            ..SystemdEnv::default()
        };
        if let Some(usec) = wd_usec {
            let usec: u64 = parse(&usec, "WATCHDOG_USEC")?;
            let for_us = match wd_pid {
                None => true,
                Some(p) => parse::<u32>(&p, "WATCHDOG_PID")? == me,
            };
            if for_us && usec > 0 {
                out.watchdog_interval = Some(Duration::from_micros(usec / 2));
            }
        }
        if let Some(n) = listen_fds {
            let for_us = match &listen_pid {
                Some(p) => parse::<u32>(p, "LISTEN_PID")? == me,
                None => false,
            };
            if !for_us {
                out.listen_pid_mismatch = true;
                return Ok(out);
            }
            let n: i32 = parse(&n, "LISTEN_FDS")?;
            let names: Vec<&str> = listen_names.as_deref().unwrap_or("").split(':').collect();
            for i in 0..n {
                let fd = LISTEN_FDS_START + i;
                if nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_err() {
                    return Err(SystemdError::FdNotOpen { fd });
                }
                // SAFETY: fd is open (checked above) and was passed to this
                // process by its parent for us alone: nothing else in the
                // process refers to it, so it gets exactly one owner here.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                // Keep it from leaking into sandboxes and launchers.
                nix::fcntl::fcntl(
                    fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
                )
                .map_err(|e| SystemdError::Convert {
                    fd,
                    source: e.into(),
                })?;
                let name = names
                    .get(i as usize)
                    .filter(|s| !s.is_empty())
                    .map(|s| s.to_string());
                out.listen_fds.push(ActivatedFd { fd: owned, name });
            }
        }
        Ok(out)
    }
}

fn parse<T: std::str::FromStr>(value: &str, name: &'static str) -> Result<T, SystemdError> {
    value.trim().parse().map_err(|_| SystemdError::BadVar {
        name,
        value: value.to_string(),
    })
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
/// by the caller, never fatal.
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

    /// Sends one notification: newline-separated `KEY=value` assignments.
    pub fn notify(&self, state: &str) -> std::io::Result<()> {
        let addr = match self.target.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
            None => SocketAddr::from_pathname(&self.target)?,
        };
        let sock = UnixDatagram::unbound()?;
        let sent = sock.send_to_addr(state.as_bytes(), &addr)?;
        if sent != state.len() {
            return Err(std::io::Error::other("short write to the notify socket"));
        }
        Ok(())
    }
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
            .notify("READY=1\nSTATUS=x")
            .unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=x");

        let name = format!("sandboxd-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        Notifier::new(format!("@{name}"))
            .notify("WATCHDOG=1")
            .unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
    }

    #[test]
    fn missing_socket_is_an_error_not_a_panic() {
        let n = Notifier::new("/nonexistent/sandboxd-notify".into());
        assert!(n.notify("READY=1").is_err());
    }
}
