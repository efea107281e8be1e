//! How a sandbox is named and labelled in the cluster, and how its identity
//! is written to and read back from Pod annotations.
//!
//! Pure functions only: no I/O, no client. Object names must be DNS-1123
//! labels while sandbox ids may hold `_` and upper case, so the name is
//! derived (`sbx-<sanitized>-<hash>`) and the real id kept in an annotation
//! (and in the `sandbox-id` label when it is a valid label value).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use sha2::{Digest, Sha256};

use crate::model::Identity;

/// `app` label of every object we make.
pub const APP: &str = "sandboxd-sandbox";
/// `managed-by` label of every object we make.
pub const MANAGED_BY: &str = "sandboxd";
/// Label selector matching every sandbox Pod of this daemon.
pub const SELECTOR: &str = "app=sandboxd-sandbox,managed-by=sandboxd";

pub const LABEL_APP: &str = "app";
pub const LABEL_MANAGED_BY: &str = "managed-by";
pub const LABEL_SANDBOX_ID: &str = "sandbox-id";

pub use sandbox_abi::labels::{
    SANDBOX_ID as ANN_SANDBOX_ID, STORAGE as ANN_STORAGE, THREAD_ID as ANN_THREAD_ID,
    UID as ANN_UID, WORKDIR as ANN_WORKDIR,
};

/// Hex digits of sha256(id) kept in object names.
const HASH_HEX: usize = 10;

fn short_hash(id: &str) -> String {
    let digest = Sha256::digest(id.as_bytes());
    digest
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .chars()
        .take(HASH_HEX)
        .collect()
}

/// The Pod and Service name of sandbox `id`: `sbx-<sanitized>-<hash>`, a
/// DNS-1123 label (≤ 63 chars, `[a-z0-9-]`, alphanumeric at both ends).
/// The hash is of the real id, so ids differing only in case or `_`/`-`
/// get different names.
pub fn object_name(id: &str) -> String {
    let max_middle = 63 - "sbx-".len() - 1 - HASH_HEX;
    let sanitized: String = id
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' => c,
            _ => '-',
        })
        .take(max_middle)
        .collect();
    let middle = sanitized.trim_matches('-');
    if middle.is_empty() {
        format!("sbx-{}", short_hash(id))
    } else {
        format!("sbx-{middle}-{}", short_hash(id))
    }
}

/// The `sandbox-id` label value: the id itself when it is a valid label
/// value (alphanumeric at both ends), else `x.<hash>`. The dot can never
/// appear in an id, so a fallback value never equals another id's label.
pub fn sandbox_label(id: &str) -> String {
    let ok_end = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if id.len() <= 63 && ok_end(id.chars().next()) && ok_end(id.chars().last()) {
        id.to_string()
    } else {
        format!("x.{}", short_hash(id))
    }
}

/// Labels of a sandbox's Pod and Service.
pub fn labels(id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_APP.to_string(), APP.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_SANDBOX_ID.to_string(), sandbox_label(id)),
    ])
}

/// The labels a sandbox's Service and NetworkPolicy select its Pod by.
pub fn pod_selector_labels(id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_APP.to_string(), APP.to_string()),
        (LABEL_SANDBOX_ID.to_string(), sandbox_label(id)),
    ])
}

/// The owner reference that ties an object to the sandbox's Pod `name`
/// of UID `pod_uid`: the garbage collector deletes it with that Pod.
pub fn owned_by_pod(name: &str, pod_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.into(),
        uid: pod_uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The metadata of an object owned by sandbox `sandbox_id`'s Pod
/// (`pod_uid`): the Pod's name, our labels, the sandbox id annotation and
/// the owner reference that makes the garbage collector remove it with the
/// Pod.
pub fn pod_owned_metadata(sandbox_id: &str, namespace: &str, pod_uid: &str) -> ObjectMeta {
    let name = object_name(sandbox_id);
    ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace.to_string()),
        labels: Some(labels(sandbox_id)),
        annotations: Some(BTreeMap::from([(
            ANN_SANDBOX_ID.to_string(),
            sandbox_id.to_string(),
        )])),
        owner_references: Some(vec![owned_by_pod(&name, pod_uid)]),
        ..Default::default()
    }
}

/// The name the replaced Python provisioner gave sandbox `id`'s Pod and
/// Service.
pub fn legacy_name(id: &str) -> String {
    format!("sandbox-{id}")
}

/// Annotations carrying the sandbox id and its identity (the shared codec).
pub fn annotations(id: &str, identity: &Identity) -> BTreeMap<String, String> {
    sandbox_abi::labels::annotations(id, None, identity)
}

pub use sandbox_abi::labels::identity_from_annotations;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StorageMode;

    fn dns1123(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn names_are_dns1123_and_distinct() {
        let ids = [
            "3f2a9c1b7d44",
            "ABC",
            "abc",
            "a_b",
            "a-b",
            "_",
            "-_-",
            &"Z".repeat(63),
            &"_".repeat(63),
        ];
        let names: Vec<String> = ids.iter().map(|i| object_name(i)).collect();
        for n in &names {
            assert!(dns1123(n), "{n:?}");
        }
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
        assert!(object_name("3f2a9c1b7d44").starts_with("sbx-3f2a9c1b7d44-"));
    }

    #[test]
    fn label_values() {
        assert_eq!(sandbox_label("3f2a9c1b7d44"), "3f2a9c1b7d44");
        assert_eq!(sandbox_label("A_b-C"), "A_b-C");
        let f = sandbox_label("_x");
        assert!(f.starts_with("x.") && f.len() == 2 + HASH_HEX, "{f}");
        assert_ne!(sandbox_label("_x"), sandbox_label("x_"));
    }

    #[test]
    fn identity_round_trips() {
        for (w, s) in [
            (Some("projects/a".to_string()), StorageMode::Persistent),
            (None, StorageMode::Ephemeral),
        ] {
            let id = Identity {
                thread_id: "t".into(),
                uid: "u".into(),
                workdir_path: w,
                storage: s,
                image: None,
            };
            let a = annotations("sb", &id);
            assert_eq!(identity_from_annotations(&a), Some(("sb".into(), id)));
        }
        assert_eq!(identity_from_annotations(&BTreeMap::new()), None);
    }
}
