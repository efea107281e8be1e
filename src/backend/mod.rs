//! The [`Backend`] trait: how one sandbox is made, found, reached and
//! destroyed. Backends know nothing of HTTP routes, generations fencing
//! policy, pins, the reaper or quiesce: that is [`crate::lifecycle`].
//!
//! Implementations: [`memory`] (tests only), `native` (this node) and
//! `kube` (Pods through kube-rs).

use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpStream;

use crate::model::{SandboxRecord, SandboxSpec, SandboxStatus};

#[cfg(feature = "kube")]
pub mod kube;
pub mod memory;
pub mod native;

/// Why a backend operation failed. The HTTP layer maps these to status
/// codes in one place (`api::error`).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The request is well-formed but cannot be served as asked
    /// (e.g. `workdir_path` does not exist): HTTP 400.
    #[error("{0}")]
    Invalid(String),
    /// The backend refused because the generation it holds differs (the
    /// API server's UID precondition, for example): HTTP 409.
    #[error("generation conflict: {0}")]
    Conflict(String),
    /// The sandbox did not become healthy in time (everything made was
    /// cleaned up): HTTP 500.
    #[error("sandbox did not become healthy within {0:?}")]
    HealthTimeout(Duration),
    /// Something the sandbox needs is not there yet or could not be had
    /// (its image is still being pulled, or the pull failed): HTTP 503.
    #[error("{0}")]
    Unavailable(String),
    /// The sandbox cannot be reached: HTTP 502 on the proxy path.
    #[error("cannot reach sandbox: {0}")]
    Unreachable(String),
    /// Anything else: HTTP 500.
    #[error("{0}")]
    Internal(String),
}

impl BackendError {
    /// A short, stable label for metrics (`errors_total{kind=...}`).
    pub fn kind(&self) -> &'static str {
        match self {
            BackendError::Invalid(_) => "invalid",
            BackendError::Conflict(_) => "conflict",
            BackendError::HealthTimeout(_) => "health_timeout",
            BackendError::Unreachable(_) => "unreachable",
            BackendError::Unavailable(_) => "unavailable",
            BackendError::Internal(_) => "internal",
        }
    }
}

/// The per-incarnation credential the sandbox's agent requires on every
/// request (`x-sandbox-agent-credential`). Never printed: its `Debug` is
/// redacted, and it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentCredential(pub String);

impl std::fmt::Debug for AgentCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentCredential(<redacted>)")
    }
}

/// A connection to the sandbox's HTTP server.
pub struct Upstream {
    pub stream: TcpStream,
}

/// Warm-pool counters of a backend (see `docs/architecture.md#warm-pool`).
#[derive(Debug, Clone, Default)]
pub struct PoolStats {
    /// Members ready to be claimed.
    pub ready: u64,
    /// Creates served by a member.
    pub claimed: u64,
    /// Creates that found no member ready.
    pub empty: u64,
    /// Claims that failed (the create started the sandbox cold).
    pub failed: u64,
}

/// Network counters of a backend (see `docs/network.md`).
#[derive(Debug, Clone, Default)]
pub struct NetworkMetrics {
    /// Packets dropped by the egress policy, by reason.
    pub dropped: Vec<(String, u64)>,
    /// Per sandbox: (id, bytes sent, bytes received).
    pub bytes: Vec<(String, u64, u64)>,
}

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// `native`, `kubernetes` or `memory` (reported by `/health`).
    fn name(&self) -> &'static str;

    /// Makes a new incarnation of `spec` and returns once it answers its
    /// health endpoint, or fails within `health_timeout` after removing
    /// everything it made. The caller guarantees no other incarnation of
    /// this id exists (it deletes a stale one first) and that no other
    /// operation on this id runs concurrently.
    async fn create(
        &self,
        spec: &SandboxSpec,
        health_timeout: Duration,
    ) -> Result<SandboxRecord, BackendError>;

    /// Every sandbox this backend manages right now (start-up adoption,
    /// quiesce). Must include sandboxes made by an earlier daemon process.
    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError>;

    /// A cheap status check of one incarnation (no network round trip
    /// where avoidable): called on discover, on reuse and by the reaper.
    async fn status(&self, record: &SandboxRecord) -> SandboxStatus;

    /// [`status`](Backend::status) when the backend knows it without
    /// waiting for anything (its own table): the proxy asks this first on
    /// every request. `None` (the default): ask `status`.
    fn status_now(&self, _record: &SandboxRecord) -> Option<SandboxStatus> {
        None
    }

    /// Returns the record with the latest status/OOM fields refreshed.
    /// The default only refreshes `status`.
    async fn refresh(&self, record: &SandboxRecord) -> SandboxRecord {
        let mut r = record.clone();
        r.status = self.status(record).await;
        r
    }

    /// [`refresh`](Backend::refresh) of every record (list), in place:
    /// the same answers. Only `status` and `oom_killed` change. The
    /// default refreshes one by one.
    async fn refresh_all(&self, records: &mut [SandboxRecord]) {
        let fresh = futures_util::future::join_all(records.iter().map(|r| self.refresh(r))).await;
        for (r, f) in records.iter_mut().zip(fresh) {
            r.status = f.status;
            r.oom_killed = f.oom_killed;
        }
    }

    /// A stamp of what [`refresh_all`](Backend::refresh_all) answers from
    /// besides the records it is given: while two stamps are equal,
    /// `refresh_all` of the same records gives the same answers, and
    /// [`network`](Backend::network) too (list serves the body it rendered
    /// before). Taken before a refresh it stamps that refresh, so anything
    /// the backend notices later (an exit, an OOM kill, a change of its
    /// table) must change the next stamp. `None` (the default): the backend
    /// cannot tell, and every list refreshes every record.
    async fn refresh_stamp(&self) -> Option<u64> {
        None
    }

    /// Destroys exactly this incarnation (`generation`). Succeeds when it is
    /// already gone. Never touches user files.
    async fn delete(&self, sandbox_id: &str, generation: &str) -> Result<(), BackendError>;

    /// Waits until the background cleanups of deleted sandboxes (if the
    /// backend defers any) are over: daemon shutdown.
    async fn settle(&self) {}

    /// The daemon is shutting down: release what only this daemon uses
    /// (the native backend destroys its warm pool; sandboxes stay).
    async fn shutdown(&self) {}

    /// Opens a connection to the sandbox's HTTP server.
    async fn connect(&self, record: &SandboxRecord) -> Result<Upstream, BackendError>;

    /// The credential the proxy must add to every request to this
    /// incarnation's agent; `None` for backends whose agent is reachable by
    /// nothing but the daemon (native: the netns connector; memory).
    async fn agent_credential(
        &self,
        _record: &SandboxRecord,
    ) -> Result<Option<AgentCredential>, BackendError> {
        Ok(None)
    }

    /// True for a sandbox adopted read-only from another system (the
    /// Kubernetes backend's Pods of the replaced provisioner): a create of
    /// its id replaces it whatever identity it was recorded with.
    fn rebindable(&self, _record: &SandboxRecord) -> bool {
        false
    }

    /// A path prefix prepended to every proxied path ("" for real sandboxes).
    fn path_prefix(&self, _record: &SandboxRecord) -> String {
        String::new()
    }

    /// The recent output of the sandbox's PID 1 (bounded, with timestamps),
    /// when the backend keeps it; `None` otherwise.
    fn logs(&self, _sandbox_id: &str) -> Option<String> {
        None
    }

    /// The sandbox's network (`mode`, and `address` with egress) for the
    /// create/discover answer and `sandboxd inspect`, when the backend
    /// manages one.
    fn network(&self, _sandbox_id: &str) -> Option<serde_json::Value> {
        None
    }

    /// Image pull counters for `/metrics`, when the backend pulls images.
    fn image_stats(&self) -> Option<crate::images::ImageStats> {
        None
    }

    /// Warm-pool counters for `/metrics`, when the backend has a pool.
    fn pool_stats(&self) -> Option<PoolStats> {
        None
    }

    /// Network counters for `/metrics`, when the backend has them.
    fn network_metrics(&self) -> Option<NetworkMetrics> {
        None
    }
}
