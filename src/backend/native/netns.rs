//! Reaching a sandbox's agent without any address plumbing: a dedicated
//! helper thread enters the sandbox's network namespace (`setns`), creates
//! a TCP socket there, and returns to the daemon's namespace. The connect
//! then happens from the tokio runtime; the socket stays in the sandbox's
//! namespace, where only loopback exists.

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc;
use std::sync::Arc;

use nix::sched::{setns, CloneFlags};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open the daemon's network namespace: {0}")]
    OpenSelf(std::io::Error),
    #[error("cannot enter the sandbox's network namespace: {0}")]
    Enter(nix::Error),
    #[error("cannot return to the daemon's network namespace: {0}")]
    Return(nix::Error),
    #[error("cannot create a socket in the sandbox's namespace: {0}")]
    Socket(std::io::Error),
    #[error("the netns helper thread is gone")]
    HelperGone,
    #[error("connect {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

type Job = (
    Arc<OwnedFd>,
    oneshot::Sender<Result<std::net::TcpStream, NetnsError>>,
);

/// Handle on the helper thread.
#[derive(Clone)]
pub struct NetnsDialer {
    tx: mpsc::Sender<Job>,
}

/// Opens `/proc/<pid>/ns/net` (kept by the backend for the sandbox's life).
pub fn open_netns(pid: i32) -> std::io::Result<OwnedFd> {
    Ok(std::fs::File::open(format!("/proc/{pid}/ns/net"))?.into())
}

fn make_socket(target: &OwnedFd, home: &OwnedFd) -> Result<std::net::TcpStream, NetnsError> {
    setns(target.as_fd(), CloneFlags::CLONE_NEWNET).map_err(NetnsError::Enter)?;
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(NetnsError::Socket);
    // Always go back, even when the socket failed.
    if let Err(e) = setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
        // The thread is now stuck in a sandbox namespace: never use it
        // again (the caller sees the error and the thread exits).
        return Err(NetnsError::Return(e));
    }
    let sock = sock?;
    sock.set_nonblocking(true).map_err(NetnsError::Socket)?;
    sock.set_tcp_nodelay(true).map_err(NetnsError::Socket)?;
    Ok(sock.into())
}

impl NetnsDialer {
    /// Starts the helper thread.
    pub fn start() -> Result<NetnsDialer, NetnsError> {
        let home: OwnedFd = std::fs::File::open("/proc/thread-self/ns/net")
            .map_err(NetnsError::OpenSelf)?
            .into();
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("sandboxd-netns".into())
            .spawn(move || {
                while let Ok((target, reply)) = rx.recv() {
                    let r = make_socket(&target, &home);
                    let fatal = matches!(r, Err(NetnsError::Return(_)));
                    let _ = reply.send(r);
                    if fatal {
                        tracing::error!(
                            "netns helper could not return to its namespace; stopping it"
                        );
                        return;
                    }
                }
            })
            .map_err(NetnsError::Socket)?;
        Ok(NetnsDialer { tx })
    }

    /// Connects to `addr` inside the namespace `netns`.
    pub async fn connect(
        &self,
        netns: Arc<OwnedFd>,
        addr: SocketAddr,
    ) -> Result<TcpStream, NetnsError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((netns, reply))
            .map_err(|_| NetnsError::HelperGone)?;
        let std_sock = rx.await.map_err(|_| NetnsError::HelperGone)??;
        let sock = TcpSocket::from_std_stream(std_sock);
        sock.connect(addr)
            .await
            .map_err(|source| NetnsError::Connect { addr, source })
    }
}
