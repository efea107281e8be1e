//! The Kubernetes backend's section (`[kubernetes]`, see
//! `docs/kubernetes.md`). Outside the `kube` module: a build without the
//! cargo feature `kube` still loads a configuration that has one (and
//! refuses `backend = "kubernetes"` at start).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{display_as_word, key_word, KeyWord};

/// How the daemon reaches a sandbox of the Kubernetes backend
/// (`[kubernetes] connect_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectMode {
    /// `pod-ip` (default; the daemon runs in the cluster):
    /// `<podIP>:<container port>`, the Service is `ClusterIP`.
    #[serde(rename = "pod-ip")]
    PodIp,
    /// `service`: the `ClusterIP` of the sandbox's Service.
    Service,
    /// `nodeport`: `NODE_HOST:<nodePort>` of a `NodePort` Service, for a
    /// daemon outside the cluster. Every node then forwards the port to the
    /// sandbox: only safe because the agent refuses requests without the
    /// per-incarnation credential (always on), see `docs/kubernetes.md`.
    NodePort,
}

impl KeyWord for ConnectMode {
    const KEY: &'static str = "kubernetes.connect_mode";
}

/// Who makes the NetworkPolicy of sandbox Pods (`[kubernetes]
/// network_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkPolicyMode {
    /// `create` (default): one per sandbox, owned by its Pod; the daemon
    /// refuses to start when it may not create NetworkPolicies.
    Create,
    /// `external`: the operator manages the policies of sandbox Pods.
    External,
}

impl KeyWord for NetworkPolicyMode {
    const KEY: &'static str = "kubernetes.network_policy";
}

/// Which seccomp profile the Pods of the Kubernetes backend run under
/// (`[kubernetes] seccomp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubeSeccomp {
    /// `localhost`: our profile, installed on every node under the kubelet
    /// seccomp root (`seccomp_localhost_profile`).
    Localhost,
    /// `runtime-default`: the container runtime's default profile.
    RuntimeDefault,
}

impl KeyWord for KubeSeccomp {
    const KEY: &'static str = "kubernetes.seccomp";
}

display_as_word!(ConnectMode, KubeSeccomp);

/// Settings of the Kubernetes backend.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubeConfig {
    pub namespace: String,
    pub kubeconfig_path: Option<PathBuf>,
    pub node_host: String,
    pub user_data_pvc: Option<String>,
    pub skills_pvc: Option<String>,
    /// Start without `user_data_pvc`/`skills_pvc`: persistent sandboxes
    /// then get scratch space that vanishes with their Pod.
    pub allow_ephemeral_user_data: bool,
    /// `pod-ip` (default), `service` or `nodeport`.
    #[serde(deserialize_with = "key_word")]
    pub connect_mode: ConnectMode,
    /// `localhost` (our profile installed on nodes) or `runtime-default`.
    #[serde(deserialize_with = "key_word")]
    pub seccomp: KubeSeccomp,
    /// Path of the Localhost profile relative to the kubelet seccomp root.
    pub seccomp_localhost_profile: String,
    /// The `sandboxd` image (it holds the static agent that an init
    /// container copies into every sandbox Pod).
    pub agent_image: String,
    /// `hostUsers: false` (a user namespace per Pod).
    pub user_namespaces: bool,
    /// `create` (default) or `external`.
    #[serde(deserialize_with = "key_word")]
    pub network_policy: NetworkPolicyMode,
    /// Ingress to sandbox Pods is admitted only from Pods matching these
    /// labels in namespaces matching `ingress_namespace_labels`.
    pub ingress_pod_labels: BTreeMap<String, String>,
    pub ingress_namespace_labels: BTreeMap<String, String>,
    /// Extra sources admitted (CIDRs; e.g. the node addresses with
    /// `connect_mode = "nodeport"`).
    pub ingress_cidrs: Vec<String>,
    /// `CIDR[:port[/tcp|udp]]` holes in the egress deny list.
    pub egress_allow: Vec<String>,
    /// CIDRs denied on top of the built-in private ranges.
    pub egress_deny: Vec<String>,
    /// The cluster's Pod and Service CIDRs (denied; add them when they are
    /// not inside the private ranges denied anyway).
    pub cluster_cidrs: Vec<String>,
    /// DNS is allowed to Pods matching these labels in namespaces matching
    /// `dns_namespace_labels` (TCP and UDP 53), and nowhere else.
    pub dns_pod_labels: BTreeMap<String, String>,
    pub dns_namespace_labels: BTreeMap<String, String>,
    /// The kubelets' `podPidsLimit`, when the operator set one (only
    /// documented: Kubernetes has no per-Pod pids field); unset, the daemon
    /// warns at start that `pids` is not enforced.
    pub pod_pids_limit: Option<u64>,
    /// Label selector of the replaced Python provisioner's Pods and
    /// Services (`sandbox-<id>`), adopted read-only; empty: none.
    pub legacy_selector: String,
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            namespace: "default".to_string(),
            kubeconfig_path: None,
            node_host: "127.0.0.1".to_string(),
            user_data_pvc: None,
            skills_pvc: None,
            allow_ephemeral_user_data: false,
            connect_mode: ConnectMode::PodIp,
            seccomp: KubeSeccomp::Localhost,
            seccomp_localhost_profile: "sandboxd/default.json".to_string(),
            agent_image: DEFAULT_AGENT_IMAGE.to_string(),
            user_namespaces: true,
            network_policy: NetworkPolicyMode::Create,
            ingress_pod_labels: labels(&[("app.kubernetes.io/name", "sandboxd")]),
            ingress_namespace_labels: labels(&[("kubernetes.io/metadata.name", "sandboxd")]),
            ingress_cidrs: Vec::new(),
            egress_allow: Vec::new(),
            egress_deny: Vec::new(),
            cluster_cidrs: Vec::new(),
            dns_pod_labels: labels(&[("k8s-app", "kube-dns")]),
            dns_namespace_labels: labels(&[("kubernetes.io/metadata.name", "kube-system")]),
            pod_pids_limit: None,
            legacy_selector: "app=yuxi-sandbox".to_string(),
        }
    }
}

/// The `sandboxd` image built by the repository's `Dockerfile`, tagged with
/// this version.
pub const DEFAULT_AGENT_IMAGE: &str = concat!("sandboxd:", env!("CARGO_PKG_VERSION"));
/// The default sandbox image of the Kubernetes backend: a public Debian
/// userland with Python (the agent is copied in; see `docs/kubernetes.md`).
pub const DEFAULT_SANDBOX_IMAGE: &str = "python:3.12-slim-bookworm";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{assert_load_errors, load_toml, Config};

    #[test]
    fn kube_modes_from_file() {
        let toml = "[kubernetes]\nconnect_mode = \"pod-ip\"\nseccomp = \"runtime-default\"\n";
        let c = load_toml(toml, &[]).unwrap();
        assert_eq!(c.kubernetes.connect_mode, ConnectMode::PodIp);
        assert_eq!(c.kubernetes.seccomp, KubeSeccomp::RuntimeDefault);
        assert_eq!(c.kubernetes.connect_mode.to_string(), "pod-ip");
        assert_eq!(c.kubernetes.seccomp.to_string(), "runtime-default");
        let c = Config::default();
        assert_eq!(c.kubernetes.connect_mode, ConnectMode::PodIp);
        assert_eq!(c.kubernetes.seccomp, KubeSeccomp::Localhost);
    }

    #[test]
    fn bad_modes_are_config_errors_naming_the_key() {
        assert_load_errors(&[
            (
                "[kubernetes]\nseccomp = \"unconfined\"\n",
                "kubernetes.seccomp \"unconfined\" is not localhost or runtime-default",
            ),
            (
                "[kubernetes]\nconnect_mode = \"hostport\"\n",
                "kubernetes.connect_mode \"hostport\" is not pod-ip, service or nodeport",
            ),
            (
                "[kubernetes]\nnetwork_policy = \"none\"\n",
                "kubernetes.network_policy \"none\" is not create or external",
            ),
            (
                "[kubernetes]\nconnect_mode = 3\n",
                "invalid type: integer `3`, expected a string",
            ),
        ]);
    }
}
