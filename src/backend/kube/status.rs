//! Reading a sandbox back from its Pod: identity, generation (the Pod
//! UID), readiness, terminal states, OOM kills and a failed init step.
//! Pure functions over k8s-openapi types.

use k8s_openapi::api::core::v1::Pod;

use super::names;
use super::prepare;
use crate::model::{unix_now, SandboxRecord, SandboxStatus};

/// What a Pod tells about its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Ready condition True and not being deleted.
    Ready,
    /// Scheduled, pulling, initializing or not (yet) passing its probe.
    Starting,
    /// Terminal phase, being deleted, or a container ended.
    Ended,
    /// The init step refused the workdir (missing, or a symlink on the way).
    BadWorkdir,
    /// The init step refused a symlinked or non-directory user directory.
    UnsafeUserDir,
    /// The init step could not create a user directory (permissions).
    NotWritable,
}

pub fn uid(pod: &Pod) -> Option<&str> {
    pod.metadata.uid.as_deref()
}

/// Classifies `pod`.
pub fn pod_state(pod: &Pod) -> PodState {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Ended;
    }
    let Some(status) = &pod.status else {
        return PodState::Starting;
    };
    for cs in status.init_container_statuses.iter().flatten() {
        if let Some(t) = cs.state.as_ref().and_then(|s| s.terminated.as_ref()) {
            match t.exit_code {
                0 => {}
                prepare::EXIT_BAD_WORKDIR => return PodState::BadWorkdir,
                prepare::EXIT_UNSAFE_PATH => return PodState::UnsafeUserDir,
                prepare::EXIT_NOT_WRITABLE => return PodState::NotWritable,
                _ => return PodState::Ended,
            }
        }
    }
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return PodState::Ended;
    }
    let container_ended = status
        .container_statuses
        .iter()
        .flatten()
        .any(|cs| cs.state.as_ref().is_some_and(|s| s.terminated.is_some()));
    if container_ended {
        return PodState::Ended;
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready {
        PodState::Ready
    } else {
        PodState::Starting
    }
}

pub fn sandbox_status(state: PodState) -> SandboxStatus {
    match state {
        PodState::Ready => SandboxStatus::Running,
        PodState::Starting => SandboxStatus::Creating,
        PodState::Ended
        | PodState::BadWorkdir
        | PodState::UnsafeUserDir
        | PodState::NotWritable => SandboxStatus::Exited,
    }
}

/// Whether a container of the Pod was OOM-killed.
pub fn oom_killed(pod: &Pod) -> bool {
    let reason_oom = |t: Option<&k8s_openapi::api::core::v1::ContainerStateTerminated>| {
        t.and_then(|t| t.reason.as_deref()) == Some("OOMKilled")
    };
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .any(|cs| {
            reason_oom(cs.state.as_ref().and_then(|s| s.terminated.as_ref()))
                || reason_oom(cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()))
        })
}

pub fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.pod_ip.as_deref()
}

/// The record of the sandbox `pod` runs; `None` when its annotations are
/// missing or malformed, or it has no UID.
pub fn record_from_pod(pod: &Pod) -> Option<SandboxRecord> {
    let annotations = pod.metadata.annotations.as_ref()?;
    let (sandbox_id, identity) = names::identity_from_annotations(annotations)?;
    let created_at = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| u64::try_from(t.0.timestamp()).ok())
        .unwrap_or_else(unix_now);
    let oom = oom_killed(pod);
    Some(SandboxRecord {
        sandbox_id,
        generation: uid(pod)?.to_string(),
        identity,
        status: sandbox_status(pod_state(pod)),
        created_at,
        oom_killed: oom.then_some(true),
        idle: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn states() {
        assert_eq!(pod_state(&pod(serde_json::json!({}))), PodState::Starting);
        let ready = pod(serde_json::json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}}));
        assert_eq!(pod_state(&ready), PodState::Ready);
        let deleting = pod(
            serde_json::json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        assert_eq!(pod_state(&deleting), PodState::Ended);
        let failed = pod(serde_json::json!({"status": {"phase": "Failed"}}));
        assert_eq!(pod_state(&failed), PodState::Ended);
        let bad = pod(
            serde_json::json!({"status": {"phase": "Pending", "initContainerStatuses": [
            {"name": "sandboxd-prepare", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 42}}}]}}),
        );
        assert_eq!(pod_state(&bad), PodState::BadWorkdir);
        let oom = pod(
            serde_json::json!({"status": {"phase": "Failed", "containerStatuses": [
            {"name": "sandbox", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}),
        );
        assert!(oom_killed(&oom));
        assert!(!oom_killed(&ready));
    }
}
