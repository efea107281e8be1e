//! The native backend's own section (`[native]`); its others are
//! `[network]` ([`super::net`]), `[userns]` ([`super::userns`]) and
//! `[pool]` (`pool.rs`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Settings of the node-local backend.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NativeConfig {
    /// Host paths bind-mounted read-only into the "host" rootfs profile.
    pub rootfs_binds: Vec<String>,
    /// The `sandbox-agent` binary (default: next to `sandboxd`).
    pub agent_path: Option<PathBuf>,
    /// The `sandbox-init` binary (default: next to `sandboxd`).
    pub init_path: Option<PathBuf>,
    /// Base OCI spec overriding the embedded `oci/base.json`.
    pub base_spec: Option<PathBuf>,
    /// Seccomp profile overriding the embedded `seccomp/default.json`.
    pub seccomp_profile: Option<PathBuf>,
    /// Parent cgroup of all sandboxes (relative to the cgroup root).
    pub cgroup_parent: String,
    /// Show the host's `/usr/local` inside sandboxes when `/usr` is bound
    /// (default false: an empty read-only tmpfs hides it, since what an
    /// operator installs there by hand is not part of the sandbox image).
    pub expose_usr_local: bool,
}

impl Default for NativeConfig {
    fn default() -> Self {
        NativeConfig {
            rootfs_binds: [
                "/usr",
                "/etc/alternatives",
                "/etc/ssl",
                "/etc/ca-certificates",
                "/etc/localtime",
                "/etc/nsswitch.conf",
                "/etc/ld.so.cache",
                "/etc/ld.so.conf",
                "/etc/ld.so.conf.d",
                "/etc/python3",
                "/etc/python3.11",
                "/etc/gitconfig",
                "/etc/bash.bashrc",
                "/etc/profile",
                "/etc/mime.types",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            agent_path: None,
            init_path: None,
            base_spec: None,
            seccomp_profile: None,
            cgroup_parent: "sandboxd".to_string(),
            expose_usr_local: false,
        }
    }
}
