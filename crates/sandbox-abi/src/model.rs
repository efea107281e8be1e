//! Types shared by the HTTP layer, the lifecycle layer and every backend:
//! the validated create request, a sandbox's identity and its record.
//!
//! Validation lives here so that every entry point (HTTP, CLI, backends)
//! applies the same rules; nothing in this module touches the host.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Longest accepted `sandbox_id` (the contract's `[A-Za-z0-9_-]{1,63}`).
pub const MAX_SANDBOX_ID_LEN: usize = 63;
/// Longest accepted `thread_id` / `uid`.
pub const MAX_NAME_LEN: usize = 255;
/// Longest accepted `workdir_path`.
pub const MAX_WORKDIR_LEN: usize = 4096;
/// Largest total size of the environment handed to a sandbox (keys + values).
pub const MAX_ENV_BYTES: usize = 256 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValidationError {
    #[error("{field} must match [A-Za-z0-9_-]{{1,{max}}}")]
    BadName { field: &'static str, max: usize },
    #[error("workdir_path {0}")]
    BadWorkdir(&'static str),
    #[error("env key {key:?} {reason}")]
    BadEnvKey { key: String, reason: &'static str },
    #[error("env value of {key:?} contains a NUL byte")]
    BadEnvValue { key: String },
    #[error("env is {size} bytes, over the {max} byte limit")]
    EnvTooLarge { size: usize, max: usize },
    #[error("resources.{field} {reason}")]
    BadResources { field: &'static str, reason: String },
}

/// Checks `[A-Za-z0-9_-]{1,max}`.
pub fn validate_name(field: &'static str, value: &str, max: usize) -> Result<(), ValidationError> {
    let ok = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ValidationError::BadName { field, max })
    }
}

pub fn validate_sandbox_id(id: &str) -> Result<(), ValidationError> {
    validate_name("sandbox_id", id, MAX_SANDBOX_ID_LEN)
}

/// The prefix of a warm-pool member's key: the name of its cgroup and its
/// state directory until it is claimed. Never a sandbox id (ids never
/// start with a dot), so the two can never collide.
pub const POOL_KEY_PREFIX: &str = ".pool-";

/// Whether `key` is a warm-pool member's key.
pub fn is_pool_key(key: &str) -> bool {
    key.strip_prefix(POOL_KEY_PREFIX)
        .is_some_and(|rest| validate_name("pool key", rest, MAX_SANDBOX_ID_LEN).is_ok())
}

/// A name the native backend gives a sandbox's cgroup and state
/// directory: a sandbox id, or a pool member's key.
pub fn validate_node_key(key: &str) -> Result<(), ValidationError> {
    if is_pool_key(key) {
        Ok(())
    } else {
        validate_sandbox_id(key)
    }
}

/// Checks a `workdir_path`: relative POSIX path, no `\`, no `://`, no empty,
/// `.` or `..` component, no NUL. Returns the normalized form (no trailing
/// slash). Whether it exists is the backend's business.
pub fn validate_workdir(path: &str) -> Result<String, ValidationError> {
    if path.is_empty() {
        return Err(ValidationError::BadWorkdir("must not be empty"));
    }
    if path.len() > MAX_WORKDIR_LEN {
        return Err(ValidationError::BadWorkdir("is too long"));
    }
    if path.starts_with('/') {
        return Err(ValidationError::BadWorkdir("must be relative"));
    }
    if path.contains('\\') {
        return Err(ValidationError::BadWorkdir("must not contain a backslash"));
    }
    if path.contains("://") {
        return Err(ValidationError::BadWorkdir("must not be a URL"));
    }
    if path.contains('\0') {
        return Err(ValidationError::BadWorkdir("must not contain a NUL byte"));
    }
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    for comp in trimmed.split('/') {
        match comp {
            "" => {
                return Err(ValidationError::BadWorkdir(
                    "must not have empty components",
                ))
            }
            "." => return Err(ValidationError::BadWorkdir("must not have '.' components")),
            ".." => return Err(ValidationError::BadWorkdir("must not have '..' components")),
            _ => {}
        }
    }
    Ok(trimmed.to_string())
}

/// Checks the environment a sandbox will get.
pub fn validate_env(env: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    let mut size = 0usize;
    for (k, v) in env {
        if k.is_empty() {
            return Err(ValidationError::BadEnvKey {
                key: k.clone(),
                reason: "is empty",
            });
        }
        if k.contains('\0') {
            return Err(ValidationError::BadEnvKey {
                key: k.clone(),
                reason: "contains a NUL byte",
            });
        }
        if k.contains('=') {
            return Err(ValidationError::BadEnvKey {
                key: k.clone(),
                reason: "contains '='",
            });
        }
        if v.contains('\0') {
            return Err(ValidationError::BadEnvValue { key: k.clone() });
        }
        size += k.len() + v.len() + 2;
    }
    if size > MAX_ENV_BYTES {
        return Err(ValidationError::EnvTooLarge {
            size,
            max: MAX_ENV_BYTES,
        });
    }
    Ok(())
}

/// Persistent sandboxes mount the user's workspace; ephemeral ones mount
/// nothing of the host (`inherit_env=false` and no `workdir_path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageMode {
    Persistent,
    Ephemeral,
}

/// A sandbox's network: `egress` (a veth, NAT, the node's egress policy)
/// or `none` (loopback only). The daemon's `[network] mode` is the default
/// and the widest a create may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    Egress,
    None,
}

/// What a `sandbox_id` is bound to. A create with the same id and a
/// different identity is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub thread_id: String,
    pub uid: String,
    pub workdir_path: Option<String>,
    pub storage: StorageMode,
    /// The image the create named (normalized reference); `None`: the
    /// node's default (an image, or the host's userland).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Optional per-request resource limits (an extension; old clients never
/// send it). Capped by the node maxima.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResourceRequest {
    /// Memory limit in MiB (default and maximum: the node's `[limits]`).
    pub memory_mb: Option<u64>,
    /// CPUs (fractions allowed).
    pub cpus: Option<f64>,
    /// Maximum number of processes.
    pub pids: Option<u64>,
}

/// The JSON body of `POST /api/sandboxes`, as sent. Unknown fields are
/// ignored (old and new clients alike); `null` is accepted for every
/// optional field.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateRequest {
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9_-]{1,63}$", example = "3f2a9c1b7d44")
    )]
    pub sandbox_id: String,
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9_-]{1,255}$", example = "t1")
    )]
    pub thread_id: String,
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9_-]{1,255}$", example = "u1")
    )]
    pub uid: String,
    /// Relative to the user's workspace; no `.`, `..` or empty component.
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 4096, example = "projects/abc")
    )]
    pub workdir_path: Option<String>,
    /// Variables for the sandbox's commands (`null` values become "").
    #[serde(default)]
    pub env: Option<BTreeMap<String, Option<String>>>,
    /// Default `true`; `false` without `workdir_path` makes an ephemeral
    /// sandbox.
    #[serde(default)]
    pub inherit_env: Option<bool>,
    #[serde(default)]
    pub resources: Option<ResourceRequest>,
    /// `"none"` narrows this sandbox to loopback; absent: the daemon's mode.
    #[serde(default)]
    pub network: Option<NetworkMode>,
    /// An image reference from the node's `[images] allowed` list; absent:
    /// the node's default. Part of the sandbox's identity.
    #[serde(default)]
    pub image: Option<String>,
}

/// A validated create request, with the environment already merged
/// (node global env under the user env, fixed base env on top).
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub sandbox_id: String,
    pub identity: Identity,
    pub env: BTreeMap<String, String>,
    /// Effective limits: the request's values or the node defaults.
    pub resources: Resources,
    /// The network the request asked for (`None`: the daemon's default).
    pub network: Option<NetworkMode>,
}

/// Effective resource limits of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SandboxStatus {
    /// Up and answering (as far as a cheap check can tell).
    Running,
    /// Being created (not yet answering).
    Creating,
    /// Its process is gone.
    Exited,
}

impl SandboxStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Running => "running",
            SandboxStatus::Creating => "creating",
            SandboxStatus::Exited => "exited",
        }
    }
}

/// Where a running sandbox is on the hibernation ladder (the native
/// backend's; the daemon's idle rule decides the steps, the backend takes
/// them). `status` stays `running` on every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum IdleState {
    /// Running as usual.
    Active,
    /// Its cgroup is frozen: no CPU, memory kept.
    Frozen,
    /// Frozen, and its memory pushed to swap.
    Reclaimed,
}

impl IdleState {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleState::Active => "active",
            IdleState::Frozen => "frozen",
            IdleState::Reclaimed => "reclaimed",
        }
    }

    /// Frozen or reclaimed: a request must wake it first.
    pub fn asleep(self) -> bool {
        self != IdleState::Active
    }
}

/// An idle state and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IdleMark {
    pub state: IdleState,
    /// Unix seconds.
    pub since: u64,
}

impl IdleMark {
    /// `state` from now on.
    pub fn now(state: IdleState) -> IdleMark {
        IdleMark {
            state,
            since: unix_now(),
        }
    }
}

/// One incarnation of a sandbox as a backend describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub sandbox_id: String,
    /// Opaque, fresh for every incarnation (128-bit hex, or the Pod UID).
    pub generation: String,
    pub identity: Identity,
    pub status: SandboxStatus,
    /// Unix seconds.
    pub created_at: u64,
    /// Set when a process of the sandbox was killed by the OOM killer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_killed: Option<bool>,
    /// Where it is on the hibernation ladder, while it runs on a backend
    /// that has one (native); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleMark>,
}

/// A fresh random generation: 128 bits, lowercase hex.
pub fn new_generation() -> String {
    let v = crate::random::u128();
    format!("{v:032x}")
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_sandbox_id("3f2a9c1b7d44").is_ok());
        assert!(validate_sandbox_id("a_b-C").is_ok());
        assert!(validate_sandbox_id("").is_err());
        assert!(validate_sandbox_id("a/b").is_err());
        assert!(validate_sandbox_id("a.b").is_err());
        assert!(validate_sandbox_id(&"a".repeat(63)).is_ok());
        assert!(validate_sandbox_id(&"a".repeat(64)).is_err());
        assert!(validate_sandbox_id("é").is_err());
    }

    #[test]
    fn workdirs() {
        assert_eq!(validate_workdir("projects/abc").unwrap(), "projects/abc");
        assert_eq!(validate_workdir("projects/abc/").unwrap(), "projects/abc");
        for bad in [
            "", "/abs", "a/../b", "..", ".", "a//b", "a\\b", "http://x", "a/./b", "a\0b",
        ] {
            assert!(validate_workdir(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn env_rules() {
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "b".to_string());
        assert!(validate_env(&env).is_ok());
        env.insert("A=B".to_string(), String::new());
        assert!(validate_env(&env).is_err());
        let mut env = BTreeMap::new();
        env.insert("A\0".to_string(), String::new());
        assert!(validate_env(&env).is_err());
        let mut env = BTreeMap::new();
        env.insert("BIG".to_string(), "x".repeat(MAX_ENV_BYTES));
        assert!(matches!(
            validate_env(&env),
            Err(ValidationError::EnvTooLarge { .. })
        ));
    }

    #[test]
    fn generations_differ() {
        let a = new_generation();
        assert_eq!(a.len(), 32);
        assert_ne!(a, new_generation());
    }
}
