//! Errors of the native backend and how they cross into
//! [`BackendError`] (and so into HTTP status codes).

use std::path::PathBuf;

use super::bundle::BundleError;
use super::launch::LaunchError;
use super::net::NetError;
use super::netns::NetnsError;
use super::paths::PathError;
use super::state::StateError;
use crate::backend::BackendError;
use crate::cgroups::CgroupError;
use crate::seccomp::SeccompError;

/// One variant per failing step (start-up, create, delete, connect).
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// The seccomp profile does not load or compile (start-up, and
    /// `sandboxd bundle`): no sandbox is ever made without its filter.
    #[error("seccomp profile: {0}")]
    Seccomp(#[from] SeccompError),
    #[error("cannot locate the sandboxd binary: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// `sandbox-init` or `sandbox-agent` is neither next to `sandboxd` nor
    /// in `/usr/libexec/sandboxd/`, and its path is not configured.
    #[error(
        "{name} not found at {} nor in /usr/libexec/sandboxd/ (set [native] {}_path)",
        path.display(),
        name.trim_start_matches("sandbox-")
    )]
    MissingBinary { name: &'static str, path: PathBuf },
    /// An operator-configured root (user data, skills) cannot be created.
    #[error("cannot create {}: {source}", path.display())]
    CreateRoot {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A configured path does not resolve (`canonicalize`).
    #[error("cannot resolve {}: {source}", path.display())]
    Resolve {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create state directory {}: {source}", path.display())]
    CreateStateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make state directory {} private: {source}", path.display())]
    StateDirMode {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make the daemon a child subreaper: {0}")]
    Subreaper(#[source] nix::Error),
    #[error("cannot start the netns helper thread: {0}")]
    NetnsHelper(#[source] NetnsError),
    /// The base spec cannot be read, or the bundle not built or written.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Userns(#[from] super::userns::UsernsError),
    #[error("cannot set up the output FIFO {path}: {source}")]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Layout detection, the daemon's leaf, or the sandbox's cgroup.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// `state.json` or the sandbox directory cannot be written or removed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The requested workdir is missing, not a directory or a symlink.
    #[error("workdir_path: {0}")]
    Workdir(#[source] PathError),
    /// The user's workspace cannot be made safely below the user-data root.
    #[error("user data root: {0}")]
    UserDataDir(#[source] PathError),
    /// The user's skills directory cannot be made safely.
    #[error("skills root: {0}")]
    SkillsDir(#[source] PathError),
    #[error("cannot create sandbox directory {}: {source}", path.display())]
    CreateSandboxDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `sandbox-init` failed (the message names its step), timed out, or
    /// the agent died before it listened.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("sandbox {id} exited right after it started")]
    ExitedAtStart { id: String },
    #[error("cannot open the network namespace of sandbox {id} (pid {pid}): {source}")]
    OpenNetns {
        id: String,
        pid: i32,
        source: std::io::Error,
    },
    /// A blocking worker thread panicked or was cancelled.
    #[error("worker failed: {0}")]
    Worker(#[from] tokio::task::JoinError),
    /// A delete of a generation that is not the live one.
    #[error("sandbox {id} is at another generation")]
    OtherGeneration { id: String },
    #[error("sandbox {id} is not running")]
    NotRunning { id: String },
    /// A reclaim of a sandbox that is not frozen (the ladder reclaims only
    /// a frozen one).
    #[error("sandbox {id} is not frozen")]
    NotFrozen { id: String },
    /// The network of the node (start-up) or of one sandbox (create).
    #[error(transparent)]
    Network(#[from] NetError),
    /// The sandbox's image is not available (still being pulled, or the
    /// pull failed): HTTP 503.
    #[error("{0}")]
    ImageUnavailable(String),
    /// The image store cannot be opened or read.
    #[error("image store: {0}")]
    ImageStore(String),
    /// No connection to the sandbox's agent.
    #[error("sandbox {id}: {source}")]
    Dial { id: String, source: NetnsError },
    /// The warm pool's attach points (see `pool`).
    #[error("pool attach points {}: {source}", path.display())]
    PoolMounts {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A warm-pool claim failed (the create falls back to a cold start).
    #[error("pool claim: {0}")]
    Claim(String),
}

impl NativeError {
    /// An error of the request, not of the node: a workdir or per-user
    /// directory that is missing, not a directory or a symlink.
    fn is_user_error(&self) -> bool {
        match self {
            NativeError::Workdir(e) | NativeError::UserDataDir(e) | NativeError::SkillsDir(e) => {
                e.is_user_error()
            }
            NativeError::Network(e) => e.is_user_error(),
            _ => false,
        }
    }
}

impl From<NativeError> for BackendError {
    fn from(e: NativeError) -> Self {
        match e {
            _ if e.is_user_error() => BackendError::Invalid(e.into()),
            NativeError::Launch(LaunchError::Timeout(t)) => BackendError::HealthTimeout(t),
            NativeError::OtherGeneration { .. } => BackendError::Conflict(e.into()),
            NativeError::ImageUnavailable(m) => BackendError::Unavailable(m.into()),
            NativeError::Network(NetError::Unavailable(_)) => BackendError::Unavailable(e.into()),
            NativeError::NotRunning { .. } | NativeError::Dial { .. } => {
                BackendError::Unreachable(e.into())
            }
            _ => BackendError::Internal(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn user_errors_are_invalid_the_rest_internal() {
        let path = PathBuf::from("/u/shared/u1/workspace/link");
        let e = NativeError::Workdir(PathError::Symlink { path: path.clone() });
        let b = BackendError::from(e);
        assert!(matches!(b, BackendError::Invalid(_)), "{b:?}");
        assert_eq!(
            b.to_string(),
            "workdir_path: /u/shared/u1/workspace/link is or passes through a symlink"
        );
        let e = NativeError::UserDataDir(PathError::Create {
            path,
            source: std::io::Error::other("disk full"),
        });
        assert!(matches!(BackendError::from(e), BackendError::Internal(_)));
        let e = NativeError::Launch(LaunchError::Step {
            step: "mount".into(),
            error: "/mnt/bogus: ENODEV".into(),
        });
        let b = BackendError::from(e);
        assert!(matches!(b, BackendError::Internal(_)), "{b:?}");
        assert_eq!(
            b.to_string(),
            "sandbox-init failed at step mount: /mnt/bogus: ENODEV"
        );
        let t = Duration::from_secs(3);
        let b = BackendError::from(NativeError::Launch(LaunchError::Timeout(t)));
        assert!(
            matches!(b, BackendError::HealthTimeout(d) if d == t),
            "{b:?}"
        );
        let b = BackendError::from(NativeError::OtherGeneration { id: "a".into() });
        assert_eq!(
            b.to_string(),
            "generation conflict: sandbox a is at another generation"
        );
        let b = BackendError::from(NativeError::NotRunning { id: "a".into() });
        assert!(matches!(b, BackendError::Unreachable(_)), "{b:?}");
    }
}
