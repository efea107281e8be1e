//! The [`Backend`] trait: how one sandbox is made, found, reached and
//! destroyed. Backends know nothing of HTTP routes, generations fencing
//! policy, pins, the reaper or quiesce: that is [`crate::lifecycle`].
//!
//! Implementations: [`memory`] (tests only), `native` (this node) and
//! `kube` (Pods through kube-rs).

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use crate::config::parse_word;
use crate::model::{IdleState, SandboxRecord, SandboxSpec};

#[cfg(feature = "kube")]
pub mod kube;
pub mod kube_config;
pub mod memory;
pub mod native;

/// Which backend the daemon runs (`backend`, `PROVISIONER_BACKEND`,
/// `--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Native,
    Kubernetes,
    Memory,
}

impl BackendKind {
    /// Parses a `PROVISIONER_BACKEND` (or `--backend`) value, in any case:
    /// `docker` and `local` are accepted aliases of `native` (the second
    /// element says so), `k8s` of `kubernetes`. The file takes only the
    /// names.
    pub fn parse(s: &str) -> Result<(BackendKind, bool), String> {
        let s = s.trim().to_ascii_lowercase();
        let (name, alias) = match s.as_str() {
            "docker" | "local" => ("native", true),
            "k8s" => ("kubernetes", false),
            other => (other, false),
        };
        let kind = parse_word(name)
            .map_err(|e| format!("unknown backend {name:?} (expected {})", e.words()))?;
        Ok((kind, alias))
    }
}

/// The error a [`BackendError`] carries: the backend's own (its chain of
/// causes kept), or a message.
pub type ErrorSource = Box<dyn std::error::Error + Send + Sync>;

/// Why a backend operation failed. The HTTP layer maps these to status
/// codes in one place (`api::error`); the message is the cause's.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The request is well-formed but cannot be served as asked
    /// (e.g. `workdir_path` does not exist): HTTP 400.
    #[error(transparent)]
    Invalid(ErrorSource),
    /// The backend refused because the generation it holds differs (the
    /// API server's UID precondition, for example): HTTP 409.
    #[error("generation conflict: {0}")]
    Conflict(#[source] ErrorSource),
    /// The sandbox did not become healthy in time (everything made was
    /// cleaned up): HTTP 500.
    #[error("sandbox did not become healthy within {0:?}")]
    HealthTimeout(Duration),
    /// Something the sandbox needs is not there yet or could not be had
    /// (its image is still being pulled, or the pull failed): HTTP 503.
    #[error(transparent)]
    Unavailable(ErrorSource),
    /// The sandbox cannot be reached: HTTP 502 on the proxy path.
    #[error("cannot reach sandbox: {0}")]
    Unreachable(#[source] ErrorSource),
    /// Anything else: HTTP 500.
    #[error(transparent)]
    Internal(ErrorSource),
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

/// What a backend counts for `/metrics` ([`Backend::metrics`]): each part
/// only when the backend has it.
#[derive(Debug, Clone, Default)]
pub struct BackendMetrics {
    /// Image pulls, when the backend pulls images.
    pub images: Option<crate::images::ImageStats>,
    /// The warm pool, when the backend has one.
    pub pool: Option<PoolStats>,
    /// Egress drops and bytes, when the backend manages a network.
    pub network: Option<NetworkMetrics>,
}

/// A sandbox's network as the create/discover answer and `sandboxd
/// inspect` show it (`network`): its mode, and with egress its address,
/// gateway and host-side link. Fields in the order they have always been
/// sent (alphabetical).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SandboxNetwork {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::Ipv4Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<std::net::Ipv4Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    pub mode: crate::model::NetworkMode,
}

/// One incarnation of a sandbox, by name: its id and generation. What the
/// lifecycle keeps of a sandbox it admitted (the generation fence) and asks
/// the backend about; the record itself is the backend's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRef {
    pub sandbox_id: String,
    pub generation: String,
}

impl SandboxRef {
    /// The incarnation `record` is of.
    pub fn of(record: &SandboxRecord) -> SandboxRef {
        SandboxRef {
            sandbox_id: record.sandbox_id.clone(),
            generation: record.generation.clone(),
        }
    }
}

/// What a proxied request's admission finds of an incarnation
/// ([`Backend::running`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Running {
    /// Not running (exited, deleted or replaced): the request is refused.
    No,
    /// Running: the request is forwarded.
    Yes,
    /// Running, but frozen or reclaimed by the hibernation ladder: woken
    /// ([`Backend::wake`]) before anything is forwarded.
    Asleep,
}

impl From<bool> for Running {
    /// Runs or not, for a backend without a ladder.
    fn from(running: bool) -> Running {
        if running {
            Running::Yes
        } else {
            Running::No
        }
    }
}

/// What the idle reaper reads of a running incarnation ([`Backend::idle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleSample {
    /// Where it is on the hibernation ladder.
    pub state: IdleState,
    /// CPU time its processes used so far, in microseconds (the idle
    /// rule's busy check compares two samples); `None` when unknown.
    pub cpu_usec: Option<u64>,
}

/// What one reclaim did ([`Backend::reclaim`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReclaimOutcome {
    /// Bytes the sandbox's cgroup holds less than before.
    pub bytes: u64,
    /// Why it could not push all of its anonymous memory out (`swap_full`,
    /// `no_swap`, `incomplete`), with the sandbox left frozen; `None`: done.
    pub failure: Option<&'static str>,
    /// Words for the log line of a failure.
    pub detail: String,
}

/// The node's swap, as `/proc/swaps` and `/proc/meminfo` say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwapInfo {
    /// Each device: (name, kind: `zram`, `partition` or `file`).
    pub devices: Vec<(String, String)>,
    pub total_bytes: u64,
    pub free_bytes: u64,
}

impl SwapInfo {
    /// `zram`, `disk` (partitions and files), `zram+disk` or `none`.
    pub fn kind(&self) -> &'static str {
        let zram = self.devices.iter().any(|(_, k)| k == "zram");
        let disk = self.devices.iter().any(|(_, k)| k != "zram");
        match (zram, disk) {
            (true, true) => "zram+disk",
            (true, false) => "zram",
            (false, true) => "disk",
            (false, false) => "none",
        }
    }
}

/// How one sandbox is made, found, reached and destroyed. The backend owns
/// the records of its sandboxes (its table: the native backend's, persisted
/// in each `state.json`; the Kubernetes backend's records with its cache of
/// Pods; the memory backend's map): the lifecycle keeps only which
/// incarnation it admitted ([`SandboxRef`]), and every record, status
/// included, is read from the backend with [`Backend::status`].
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

    /// Destroys exactly this incarnation (`generation`). Succeeds when it is
    /// already gone. Never touches user files.
    async fn delete(&self, sandbox_id: &str, generation: &str) -> Result<(), BackendError>;

    /// The incarnations `sandboxes` names, as the backend's table has them
    /// now, in the same order: each its record with the status and
    /// `oom_killed` brought up to date (and its place on the hibernation
    /// ladder, `idle`, when the backend has one and it runs), or `None`
    /// when the table has no such incarnation (deleted, or replaced by
    /// another generation). One call
    /// for all of them: discover and a create's reuse ask for one, list and
    /// `/metrics` for every admitted one.
    async fn status(&self, sandboxes: &[SandboxRef]) -> Vec<Option<SandboxRecord>>;

    /// Whether this incarnation runs, for a proxied request (asked on every
    /// one): from the backend's table, no record copied, no file read, no
    /// network round trip where avoidable. A frozen or reclaimed one is
    /// [`Running::Asleep`]: the caller wakes it before it forwards anything.
    async fn running(&self, sandbox: &SandboxRef) -> Running;

    /// Every sandbox this backend manages right now (start-up adoption,
    /// quiesce). Must include sandboxes made by an earlier daemon process.
    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError>;

    /// Opens a connection to the sandbox's HTTP server.
    async fn connect(&self, sandbox: &SandboxRef) -> Result<Upstream, BackendError>;

    /// The credential the proxy must add to every request to this
    /// incarnation's agent; `None` for backends whose agent is reachable by
    /// nothing but the daemon (native: the netns connector; memory).
    async fn agent_credential(
        &self,
        _sandbox: &SandboxRef,
    ) -> Result<Option<AgentCredential>, BackendError> {
        Ok(None)
    }

    /// A path prefix prepended to every proxied path ("" for real sandboxes).
    fn path_prefix(&self, _sandbox: &SandboxRef) -> String {
        String::new()
    }

    /// True for a sandbox adopted read-only from another system (the
    /// Kubernetes backend's Pods of the replaced provisioner): a create of
    /// its id replaces it whatever identity it was recorded with.
    fn rebindable(&self, _sandbox: &SandboxRef) -> bool {
        false
    }

    /// The recent output of the sandbox's PID 1 (bounded, with timestamps),
    /// when the backend keeps it; `None` otherwise.
    fn logs(&self, _sandbox_id: &str) -> Option<String> {
        None
    }

    /// The sandbox's network for the create/discover answer and `sandboxd
    /// inspect`, when the backend manages one.
    fn network(&self, _sandbox_id: &str) -> Option<SandboxNetwork> {
        None
    }

    /// Counters for `/metrics` (may read files: called off the runtime).
    fn metrics(&self) -> BackendMetrics {
        BackendMetrics::default()
    }

    /// The daemon is shutting down: release what only this daemon uses
    /// (the native backend destroys its warm pool; sandboxes stay).
    async fn shutdown(&self) {}

    /// Waits until the background cleanups of deleted sandboxes (if the
    /// backend defers any) are over: daemon shutdown, after the deletes.
    async fn settle(&self) {}

    /// Whether this backend can freeze its sandboxes (the native one):
    /// the hibernation ladder's freeze and reclaim steps run only then.
    fn can_freeze(&self) -> bool {
        false
    }

    /// The node's swap (the ladder's reclaim step needs some), when the
    /// backend can reclaim.
    fn swap(&self) -> Option<SwapInfo> {
        None
    }

    /// What the idle reaper reads of the incarnations `sandboxes` names,
    /// in the same order: for each that runs, its place on the ladder and
    /// its CPU time (the busy check); `None` for one that does not run or
    /// is unknown (only the delete at the idle timeout applies to it).
    /// May read a file per sandbox: for the reaper, not the request path.
    async fn idle(&self, sandboxes: &[SandboxRef]) -> Vec<Option<IdleSample>> {
        vec![None; sandboxes.len()]
    }

    /// Freezes this incarnation (its record says frozen before its cgroup
    /// is, so no sandbox is ever frozen without a record of it, and an
    /// admission meanwhile finds it asleep). The caller holds requests to
    /// it off meanwhile.
    async fn freeze(&self, sandbox: &SandboxRef) -> Result<(), BackendError> {
        Err(self.no_ladder("freeze", sandbox))
    }

    /// Pushes the memory of this (frozen) incarnation to swap. A reclaim
    /// that cannot finish leaves it frozen and says why.
    async fn reclaim(&self, sandbox: &SandboxRef) -> Result<ReclaimOutcome, BackendError> {
        Err(self.no_ladder("reclaim", sandbox))
    }

    /// Wakes this incarnation if it is frozen or reclaimed (thawed; its
    /// pages come back as they are touched) and returns the state it woke
    /// from; `None` when it was not asleep (another request woke it:
    /// concurrent wakes wait for one thaw). Refuses another generation.
    async fn wake(&self, _sandbox: &SandboxRef) -> Result<Option<IdleState>, BackendError> {
        Ok(None)
    }

    /// The refusal of a ladder step by a backend that has no ladder.
    fn no_ladder(&self, step: &str, sandbox: &SandboxRef) -> BackendError {
        let (name, id) = (self.name(), &sandbox.sandbox_id);
        BackendError::Invalid(format!("the {name} backend cannot {step} {id}").into())
    }

    /// The state of the node's egress policy (`enforced`, `rebuilding`,
    /// `failed`) and how many times it was rebuilt after a loss, when the
    /// backend enforces one (see `docs/network.md`): `/health` asks it, so
    /// it reads memory only.
    fn egress(&self) -> Option<(&'static str, u64)> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{test_env, Config};

    #[test]
    fn backend_aliases() {
        for (v, k) in [
            ("docker", BackendKind::Native),
            ("local", BackendKind::Native),
            ("kubernetes", BackendKind::Kubernetes),
        ] {
            let c = Config::load(None, &test_env(&[("PROVISIONER_BACKEND", v)])).unwrap();
            assert_eq!(c.backend, k);
            assert_eq!(c.backend_alias.is_some(), v != "kubernetes");
        }
        assert!(Config::load(None, &test_env(&[("PROVISIONER_BACKEND", "podman")])).is_err());
    }
}
