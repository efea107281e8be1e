//! Turns a [`CreateRequest`] into a validated [`SandboxSpec`]: field rules,
//! storage mode, the environment merge and resource capping.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::layout::GUEST;
use crate::model::{
    validate_env, validate_name, validate_sandbox_id, validate_workdir, CreateRequest, Identity,
    ResourceRequest, Resources, SandboxSpec, StorageMode, ValidationError, MAX_NAME_LEN,
};

/// The node's defaults and maxima for sandbox resources: the daemon's
/// `[limits]` section (its defaults are this type's), what a create
/// request is checked against, and the tmpfs sizes of a native sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceLimits {
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    pub max_memory_mb: u64,
    pub max_cpus: f64,
    pub max_pids: u64,
    /// Size cap of `/tmp` inside a sandbox.
    pub tmp_size_mb: u64,
    /// Size cap of `/home/gem` (and of an ephemeral user-data tmpfs).
    pub home_size_mb: u64,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            memory_mb: 2048,
            cpus: 1.0,
            pids: 512,
            max_memory_mb: 8192,
            max_cpus: 4.0,
            max_pids: 4096,
            tmp_size_mb: 512,
            home_size_mb: 512,
        }
    }
}

impl ResourceLimits {
    /// Refuses defaults above their maxima, or not positive (the message
    /// names the daemon's `[limits]`).
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.memory_mb > self.max_memory_mb
            || self.cpus > self.max_cpus
            || self.pids > self.max_pids
        {
            return Err("limits: a node default is above its maximum");
        }
        if self.cpus <= 0.0 || self.memory_mb == 0 || self.pids == 0 {
            return Err("limits: defaults must be positive");
        }
        Ok(())
    }
}

impl SandboxSpec {
    /// Validates `req` and builds the spec a backend receives.
    ///
    /// Environment, lowest to highest precedence: the node-global env (only
    /// when `inherit_env` is true), the user's env (`null` values become ""),
    /// then the fixed base env. An ephemeral sandbox gets only the fixed base
    /// env.
    pub fn from_request(
        req: CreateRequest,
        global_env: &BTreeMap<String, String>,
        limits: &ResourceLimits,
    ) -> Result<SandboxSpec, ValidationError> {
        validate_sandbox_id(&req.sandbox_id)?;
        validate_name("thread_id", &req.thread_id, MAX_NAME_LEN)?;
        validate_name("uid", &req.uid, MAX_NAME_LEN)?;
        let workdir_path = match req.workdir_path.as_deref() {
            None => None,
            Some(p) => Some(validate_workdir(p)?),
        };
        let inherit_env = req.inherit_env.unwrap_or(true);
        let storage = if !inherit_env && workdir_path.is_none() {
            StorageMode::Ephemeral
        } else {
            StorageMode::Persistent
        };

        let mut env = BTreeMap::new();
        if storage == StorageMode::Persistent {
            if inherit_env {
                env.extend(global_env.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            for (k, v) in req.env.unwrap_or_default() {
                env.insert(k, v.unwrap_or_default());
            }
        }
        for (k, v) in GUEST.fixed_env() {
            env.insert(k.to_string(), v.to_string());
        }
        validate_env(&env)?;

        let resources = resolve_resources(req.resources.unwrap_or_default(), limits)?;

        Ok(SandboxSpec {
            sandbox_id: req.sandbox_id,
            identity: Identity {
                thread_id: req.thread_id,
                uid: req.uid,
                workdir_path,
                storage,
                image: req.image,
            },
            env,
            resources,
            network: req.network,
        })
    }
}

/// Applies node defaults to missing values and refuses values over the node
/// maxima (never silently lowered: the caller asked for something explicit).
pub fn resolve_resources(
    req: ResourceRequest,
    limits: &ResourceLimits,
) -> Result<Resources, ValidationError> {
    let bad = |field: &'static str, reason: String| ValidationError::BadResources { field, reason };
    let memory_mb = req.memory_mb.unwrap_or(limits.memory_mb);
    if memory_mb < 16 {
        return Err(bad("memory_mb", "must be at least 16".into()));
    }
    if memory_mb > limits.max_memory_mb {
        return Err(bad(
            "memory_mb",
            format!(
                "{memory_mb} is over the node maximum {}",
                limits.max_memory_mb
            ),
        ));
    }
    let cpus = req.cpus.unwrap_or(limits.cpus);
    if !cpus.is_finite() || cpus < 0.01 {
        return Err(bad("cpus", "must be at least 0.01".into()));
    }
    if cpus > limits.max_cpus {
        return Err(bad(
            "cpus",
            format!("{cpus} is over the node maximum {}", limits.max_cpus),
        ));
    }
    let pids = req.pids.unwrap_or(limits.pids);
    if pids < 8 {
        return Err(bad("pids", "must be at least 8".into()));
    }
    if pids > limits.max_pids {
        return Err(bad(
            "pids",
            format!("{pids} is over the node maximum {}", limits.max_pids),
        ));
    }
    Ok(Resources {
        memory_mb,
        cpus,
        pids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's default `[limits]`.
    fn limits() -> ResourceLimits {
        ResourceLimits::default()
    }

    fn req(json: &str) -> CreateRequest {
        serde_json::from_str(json).unwrap()
    }

    fn global() -> BTreeMap<String, String> {
        [
            ("G".to_string(), "g".to_string()),
            ("X".into(), "global".into()),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn env_merge_order() {
        let s = SandboxSpec::from_request(
            req(r#"{"sandbox_id":"a","thread_id":"t","uid":"u","env":{"X":"user","N":null,"HOME":"/evil"}}"#),
            &global(),
            &limits(),
        )
        .unwrap();
        assert_eq!(s.env["G"], "g");
        assert_eq!(s.env["X"], "user");
        assert_eq!(s.env["N"], "");
        assert_eq!(s.env["HOME"], "/home/gem");
        assert_eq!(s.identity.storage, StorageMode::Persistent);
    }

    #[test]
    fn ephemeral_gets_only_fixed_env() {
        let s = SandboxSpec::from_request(
            req(r#"{"sandbox_id":"a","thread_id":"t","uid":"u","inherit_env":false,"env":{"X":"1"}}"#),
            &global(),
            &limits(),
        )
        .unwrap();
        assert_eq!(s.identity.storage, StorageMode::Ephemeral);
        assert_eq!(s.env.len(), GUEST.fixed_env().len());
    }

    #[test]
    fn inherit_false_with_workdir_is_persistent_without_global() {
        let s = SandboxSpec::from_request(
            req(r#"{"sandbox_id":"a","thread_id":"t","uid":"u","inherit_env":false,"workdir_path":"p/q","env":{"X":"1"}}"#),
            &global(),
            &limits(),
        )
        .unwrap();
        assert_eq!(s.identity.storage, StorageMode::Persistent);
        assert!(!s.env.contains_key("G"));
        assert_eq!(s.env["X"], "1");
    }

    #[test]
    fn resources_capped() {
        let l = limits();
        let r = resolve_resources(ResourceRequest::default(), &l).unwrap();
        assert_eq!(r.memory_mb, l.memory_mb);
        let over = ResourceRequest {
            memory_mb: Some(l.max_memory_mb + 1),
            ..Default::default()
        };
        assert!(resolve_resources(over, &l).is_err());
        let over = ResourceRequest {
            pids: Some(l.max_pids + 1),
            ..Default::default()
        };
        assert!(resolve_resources(over, &l).is_err());
        let ok = ResourceRequest {
            cpus: Some(0.5),
            ..Default::default()
        };
        assert_eq!(resolve_resources(ok, &l).unwrap().cpus, 0.5);
    }

    #[test]
    fn bad_fields() {
        for body in [
            r#"{"sandbox_id":"a b","thread_id":"t","uid":"u"}"#,
            r#"{"sandbox_id":"a","thread_id":"t/","uid":"u"}"#,
            r#"{"sandbox_id":"a","thread_id":"t","uid":"../u"}"#,
            r#"{"sandbox_id":"a","thread_id":"t","uid":"u","workdir_path":"/etc"}"#,
            r#"{"sandbox_id":"a","thread_id":"t","uid":"u","env":{"A=B":"x"}}"#,
        ] {
            assert!(
                SandboxSpec::from_request(req(body), &global(), &limits()).is_err(),
                "{body}"
            );
        }
    }
}
