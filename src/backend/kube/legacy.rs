//! Read-only adoption of the replaced Python provisioner's sandboxes: Pods
//! and Services labelled `app=yuxi-sandbox` (`[kubernetes]
//! legacy_selector`), named `sandbox-<id>`.
//!
//! They are listed (so `GET /api/sandboxes` shows them and quiesce deletes
//! them) with status `exited`, since this daemon cannot reach their agent,
//! and a create of the same id deletes them first: a switch-over never
//! leaves two Pods for one id. They are never changed otherwise.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::names;
use crate::model::{
    unix_now, validate_sandbox_id, Identity, SandboxRecord, SandboxStatus, StorageMode,
};

/// Whether `labels` match the equality selector `selector` (`k=v,k2=v2`).
pub fn matches(selector: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
    !selector.is_empty()
        && selector.split(',').all(|term| {
            term.split_once('=').is_some_and(|(k, v)| {
                labels.and_then(|l| l.get(k.trim())).map(String::as_str) == Some(v.trim())
            })
        })
}

/// The first of `keys` found in the Pod's labels or annotations.
fn field(pod: &Pod, keys: &[&str]) -> Option<String> {
    let m = &pod.metadata;
    keys.iter().find_map(|k| {
        m.labels
            .as_ref()
            .and_then(|l| l.get(*k))
            .or_else(|| m.annotations.as_ref().and_then(|a| a.get(*k)))
            .filter(|v| !v.is_empty())
            .cloned()
    })
}

/// The record of a legacy Pod: the id from a `sandbox-id` label or the
/// name, the identity from whatever labels or annotations it has
/// (`unknown` otherwise), the Pod UID as the generation, status `exited`.
pub fn record(pod: &Pod) -> Option<SandboxRecord> {
    let name = pod.metadata.name.as_deref()?;
    let id = field(pod, &["sandbox-id", "sandbox_id"])
        .or_else(|| name.strip_prefix("sandbox-").map(str::to_string))?;
    validate_sandbox_id(&id).ok()?;
    if names::legacy_name(&id) != name {
        return None;
    }
    let unknown = || "unknown".to_string();
    Some(SandboxRecord {
        sandbox_id: id,
        generation: pod.metadata.uid.clone()?,
        identity: Identity {
            thread_id: field(pod, &["thread-id", "thread_id"]).unwrap_or_else(unknown),
            uid: field(pod, &["uid", "user-id", "user_id"]).unwrap_or_else(unknown),
            workdir_path: field(pod, &["workdir-path", "workdir_path"]),
            storage: StorageMode::Persistent,
            image: None,
        },
        status: SandboxStatus::Exited,
        created_at: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| u64::try_from(t.0.timestamp()).ok())
            .unwrap_or_else(unix_now),
        oom_killed: None,
        idle: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_and_records() {
        let l = BTreeMap::from([("app".to_string(), "yuxi-sandbox".to_string())]);
        assert!(matches("app=yuxi-sandbox", Some(&l)));
        assert!(!matches("app=other", Some(&l)));
        assert!(!matches("", Some(&l)));
        assert!(!matches("app=yuxi-sandbox", None));
        let pod: Pod = serde_json::from_value(serde_json::json!({"metadata": {
            "name": "sandbox-abc", "uid": "u-1", "labels": {"app": "yuxi-sandbox", "thread-id": "t9"}}}))
        .unwrap();
        let r = record(&pod).unwrap();
        assert_eq!(
            (r.sandbox_id.as_str(), r.generation.as_str()),
            ("abc", "u-1")
        );
        assert_eq!(r.identity.thread_id, "t9");
        assert_eq!(r.identity.uid, "unknown");
        assert_eq!(r.status, SandboxStatus::Exited);
        let other: Pod = serde_json::from_value(serde_json::json!({"metadata": {
            "name": "web-1", "uid": "u-2"}}))
        .unwrap();
        assert!(record(&other).is_none());
    }
}
