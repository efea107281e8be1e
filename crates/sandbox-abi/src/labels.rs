//! The one codec of a sandbox's identity as key/value metadata: the native
//! backend writes it into the bundle's OCI annotations, the Kubernetes
//! backend onto its Pods and Services, and reads it back to adopt them.

use std::collections::BTreeMap;

use crate::model::{Identity, StorageMode};

/// The prefix of every key.
pub const PREFIX: &str = "sandboxd.io/";
pub const SANDBOX_ID: &str = "sandboxd.io/sandbox-id";
pub const GENERATION: &str = "sandboxd.io/generation";
pub const THREAD_ID: &str = "sandboxd.io/thread-id";
pub const UID: &str = "sandboxd.io/uid";
pub const WORKDIR: &str = "sandboxd.io/workdir-path";
pub const STORAGE: &str = "sandboxd.io/storage";
pub const IMAGE: &str = "sandboxd.io/image";

/// The text of a storage mode.
pub fn storage_str(s: StorageMode) -> &'static str {
    match s {
        StorageMode::Persistent => "persistent",
        StorageMode::Ephemeral => "ephemeral",
    }
}

/// The annotations carrying the sandbox id, its identity and (when the
/// backend records it there) its generation.
pub fn annotations(
    id: &str,
    generation: Option<&str>,
    identity: &Identity,
) -> BTreeMap<String, String> {
    let mut a = BTreeMap::from([
        (SANDBOX_ID.to_string(), id.to_string()),
        (THREAD_ID.to_string(), identity.thread_id.clone()),
        (UID.to_string(), identity.uid.clone()),
        (
            STORAGE.to_string(),
            storage_str(identity.storage).to_string(),
        ),
    ]);
    if let Some(g) = generation {
        a.insert(GENERATION.to_string(), g.to_string());
    }
    if let Some(w) = &identity.workdir_path {
        a.insert(WORKDIR.to_string(), w.clone());
    }
    if let Some(i) = &identity.image {
        a.insert(IMAGE.to_string(), i.clone());
    }
    a
}

/// Reads `(sandbox_id, identity)` back; `None` when any required key is
/// missing or malformed (not one of ours, or tampered with).
pub fn identity_from_annotations(a: &BTreeMap<String, String>) -> Option<(String, Identity)> {
    let storage = match a.get(STORAGE)?.as_str() {
        "persistent" => StorageMode::Persistent,
        "ephemeral" => StorageMode::Ephemeral,
        _ => return None,
    };
    Some((
        a.get(SANDBOX_ID)?.clone(),
        Identity {
            thread_id: a.get(THREAD_ID)?.clone(),
            uid: a.get(UID)?.clone(),
            workdir_path: a.get(WORKDIR).cloned(),
            storage,
            image: a.get(IMAGE).cloned(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_round_trips() {
        let ident = Identity {
            thread_id: "t".into(),
            uid: "u".into(),
            workdir_path: Some("p/q".into()),
            storage: StorageMode::Persistent,
            image: Some("127.0.0.1:5000/tools:1".into()),
        };
        let a = annotations("sb", Some("g1"), &ident);
        assert_eq!(a[GENERATION], "g1");
        assert_eq!(identity_from_annotations(&a), Some(("sb".into(), ident)));
        let mut bad = a.clone();
        bad.insert(STORAGE.into(), "weird".into());
        assert_eq!(identity_from_annotations(&bad), None);
    }
}
