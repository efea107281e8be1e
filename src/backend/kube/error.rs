//! Errors of the Kubernetes backend and how they cross into
//! [`BackendError`] (and so into HTTP status codes).

use std::time::Duration;

use crate::backend::BackendError;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// A setting that has no sensible interpretation.
    #[error("kubernetes config: {0}")]
    Config(String),
    /// No usable cluster credentials (kubeconfig or in-cluster).
    #[error("cannot load cluster credentials: {0}")]
    Credentials(String),
    #[error("cannot build the kubernetes client: {0}")]
    Client(#[source] Box<kube::Error>),
    /// An API call failed (transport, or a status the caller does not
    /// handle itself).
    #[error("{op} {kind} {name}: {source}")]
    Api {
        op: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// An API call took longer than the operation may wait.
    #[error("{op} {name}: the API server did not answer in time")]
    Timeout { op: &'static str, name: String },
    /// The Pod's UID precondition did not hold: another incarnation lives.
    #[error("pod {name} is not at generation {generation} (uid precondition failed)")]
    Fenced { name: String, generation: String },
    /// An existing Pod of that name belongs to another identity.
    #[error("sandbox {0} identity does not match existing generation")]
    IdentityMismatch(String),
    /// The init step refused the workdir.
    #[error(
        "workdir_path {workdir:?} of sandbox {id} is not an existing directory without symlinks"
    )]
    BadWorkdir { id: String, workdir: String },
    /// The init step found a symlink or non-directory on a user's path.
    #[error("a per-user directory of sandbox {0} is a symlink or not a directory")]
    UnsafeUserDir(String),
    /// The init step could not create a user directory on the PVC.
    #[error("the user-data PVC of sandbox {0} is not writable by uid/gid 1000: run the one-time ownership migration (docs/kubernetes.md)")]
    NotWritable(String),
    /// `hostUsers: false` was refused or silently dropped by the API server.
    #[error("the API server {0} spec.hostUsers=false (user namespaces need Kubernetes >= 1.30 with the UserNamespacesSupport feature gate, and node support): enable it, or set [kubernetes] user_namespaces = false")]
    HostUsersRefused(&'static str),
    /// The start-up checks found the daemon cannot work safely.
    #[error("{0}")]
    Preflight(String),
    /// The agent credential of a running sandbox cannot be read back.
    #[error("sandbox {id}: no usable agent credential: {reason}")]
    Credential { id: String, reason: String },
    /// The Pod ended (or was deleted) before it became Ready.
    #[error("pod {0} ended before it became ready")]
    Ended(String),
    #[error("sandbox {0} did not become ready within {1:?}")]
    NotReady(String, Duration),
    /// The sandbox cannot be reached (no Pod IP, no node port, refused).
    #[error("cannot reach sandbox {id}: {reason}")]
    Unreachable { id: String, reason: String },
}

impl KubeError {
    pub fn api(op: &'static str, kind: &'static str, name: &str, source: kube::Error) -> Self {
        KubeError::Api {
            op,
            kind,
            name: name.to_string(),
            source: Box::new(source),
        }
    }
}

/// The HTTP status code of an API error response, if it is one.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(r) => Some(r.code),
        _ => None,
    }
}

impl From<KubeError> for BackendError {
    fn from(e: KubeError) -> Self {
        match e {
            KubeError::Fenced { .. } => BackendError::Conflict(e.into()),
            KubeError::IdentityMismatch(_) | KubeError::BadWorkdir { .. } => {
                BackendError::Invalid(e.into())
            }
            KubeError::NotReady(_, d) => BackendError::HealthTimeout(d),
            KubeError::Unreachable { .. } | KubeError::Credential { .. } => {
                BackendError::Unreachable(e.into())
            }
            _ => BackendError::Internal(e.into()),
        }
    }
}
