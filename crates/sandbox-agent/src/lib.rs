//! `sandbox-agent`: the in-sandbox HTTP server and PID 1 of every sandbox.
//!
//! Serves the contract in `docs/contracts/agent-api.md` (implementation
//! notes: `docs/agent.md`; shell exec, file read/write/
//! list/find/edit, streamed upload/download, context) on a loopback address,
//! reaps every orphan of the pid namespace, and on SIGTERM forwards the
//! signal to its children, waits briefly and exits cleanly.
//!
//! Layout: [`routes`] dispatch, [`envelope`] response shape and status
//! mapping, [`body`] the response body type, [`request`] body/query
//! decoding, [`exec`] + [`supervise`] + [`output`] commands, [`reaper`] the
//! single `waitpid` caller, [`shutdown`] which SIGTERMs stop the agent,
//! [`files`] read/write, [`editor`] str_replace_editor, [`listing`]
//! list/find, [`transfer`] upload/download, [`context`] `GET /v1/sandbox`,
//! [`paths`] path resolution, [`credential`] the per-incarnation
//! credential requests must carry when one is configured.
//!
//! Operator and backend-developer documentation: `docs/agent.md`.
//!
//! Must not: use tokio::process or any other `wait` (the reaper owns it),
//! log request contents (commands and files may hold secrets).

pub mod body;
pub mod claim;
pub mod context;
pub mod credential;
pub mod editor;
pub mod envelope;
pub mod exec;
pub mod files;
pub mod listing;
pub mod loglimit;
pub mod output;
pub mod paths;
pub mod reaper;
pub mod request;
pub mod routes;
pub mod shutdown;
pub mod supervise;
pub mod transfer;

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use self::editor::Editor;
use self::exec::{Exec, ExecConfig};
use self::paths::PathBase;
use self::reaper::{Reaper, ReaperError};
use self::routes::Routes;
use self::shutdown::{ShutdownError, TermSignal};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("readiness fd {fd} is not an open file descriptor")]
    ReadyFd { fd: RawFd },
    #[error("writing the readiness byte: {0}")]
    Ready(#[source] std::io::Error),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Shutdown(#[from] ShutdownError),
    #[error(transparent)]
    Reaper(#[from] ReaperError),
}

/// Everything the agent needs to run.
#[derive(Debug)]
pub struct AgentConfig {
    pub listen: SocketAddr,
    /// Written one byte and closed once listening (`SANDBOX_AGENT_READY_FD`).
    pub ready_fd: Option<OwnedFd>,
    pub exec: ExecConfig,
    pub base: PathBase,
    /// How long children get between SIGTERM and SIGKILL at shutdown.
    pub term_grace: Duration,
    /// When set, every request must carry it (`x-sandbox-agent-credential`);
    /// checked before routing, so no route answers without it.
    pub credential: Option<credential::Credential>,
    /// A warm-pool member: serve nothing but the daemon's one claim until
    /// claimed ([`claim`]).
    pub pooled: bool,
}

/// Takes ownership of the inherited readiness fd `fd` and marks it
/// close-on-exec so no command inherits it. Call before any thread that
/// might open files exists (i.e. from `main`).
pub fn adopt_ready_fd(fd: RawFd) -> Result<OwnedFd, AgentError> {
    if fd < 0 || !set_cloexec(fd) {
        return Err(AgentError::ReadyFd { fd });
    }
    // SAFETY: `fd` is open (checked above) and was handed to this process by
    // its parent for this sole purpose; nothing else in the agent refers to
    // it, so the returned OwnedFd is its only owner and closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Marks every inherited descriptor above stderr close-on-exec, so commands
/// start with exactly stdin, stdout and stderr whatever the agent was
/// started with. Call from `main` while single-threaded.
pub fn seal_inherited_fds() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    // The directory's own fd is closed by now; the rest only get a flag.
    for fd in fds {
        set_cloexec(fd);
    }
}

/// Sets `FD_CLOEXEC` on `fd`; false when `fd` is not open.
fn set_cloexec(fd: RawFd) -> bool {
    // SAFETY: fcntl(2) with F_GETFD/F_SETFD takes no pointers and only
    // changes the descriptor flag; on a number that is not an open
    // descriptor it fails with EBADF.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) == 0 }
}

/// Resets every signal the agent inherited as ignored (say, SIGINT and
/// SIGQUIT from a non-interactive `cmd &`) to its default, so commands start
/// with default dispositions: ignored dispositions survive exec. SIGPIPE
/// stays as Rust sets it (std resets it for children itself). Call from
/// `main` while single-threaded.
pub fn reset_ignored_signals() {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return;
    };
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    // The standard signals (1..=31); SIGKILL and SIGSTOP are never ignored.
    for sig in 1..32 {
        let bit = 1u64 << (sig - 1);
        if ignored & bit == 0 || sig == libc::SIGPIPE {
            continue;
        }
        // SAFETY: SIG_DFL installs no handler code; signal(2) on a number
        // that is not a signal that may be caught fails with EINVAL.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// The shell used for exec: bash when present, else sh.
pub fn find_shell() -> PathBuf {
    ["/bin/bash", "/usr/bin/bash"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| context::which("bash"))
        .unwrap_or_else(|| PathBuf::from("/bin/sh"))
}

/// The working directory and home the agent resolves paths against.
pub fn path_base() -> PathBase {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| cwd.clone());
    PathBase { cwd, home }
}

fn signal_ready(fd: OwnedFd) -> Result<(), AgentError> {
    let mut file = std::fs::File::from(fd);
    file.write_all(b"1").map_err(AgentError::Ready)
    // Dropping `file` closes the fd: the daemon sees the byte, then EOF.
}

/// Runs the agent until a SIGTERM that should stop it (see [`shutdown`]).
pub async fn serve(config: AgentConfig) -> Result<(), AgentError> {
    // The reaper first: it must see every child from the very first one.
    let reaper = Reaper::start()?;
    let mut sigterm = TermSignal::install()?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| AgentError::Bind {
            addr: config.listen,
            source,
        })?;
    let local = listener.local_addr().unwrap_or(config.listen);
    if let Some(fd) = config.ready_fd {
        signal_ready(fd)?;
    }
    tracing::info!(addr = %local, pid = std::process::id(),
                   credential = config.credential.is_some(), "sandbox-agent listening");
    let credential = config.credential.map(Arc::new);

    let gate = Arc::new(if config.pooled {
        claim::Gate::pooled(config.exec, config.base, Arc::clone(&reaper))
    } else {
        claim::Gate::open(Routes {
            exec: Exec {
                config: config.exec,
                reaper: Arc::clone(&reaper),
                base: config.base.clone(),
            },
            editor: Editor::default(),
            base: config.base,
        })
    });
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let gate = Arc::clone(&gate);
                    let credential = credential.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                            let gate = Arc::clone(&gate);
                            let refused = credential.as_ref().and_then(|c| c.check(req.headers()).err());
                            async move {
                                if let Some(resp) = refused {
                                    return Ok::<_, Infallible>(resp);
                                }
                                match gate.routes() {
                                    Some(routes) => Ok(routes.handle(req).await),
                                    None => Ok(gate.unclaimed(req).await),
                                }
                            }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service);
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = sigterm.stopping() => break,
        }
    }
    tracing::info!("SIGTERM: stopping children and exiting");
    drop(listener);
    reaper.terminate_all(config.term_grace).await;
    Ok(())
}
