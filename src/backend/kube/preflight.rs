//! Start-up checks of the Kubernetes backend: the daemon refuses to start
//! rather than run sandboxes less safely than configured.
//!
//! - Without `user_data_pvc`/`skills_pvc`, persistent sandboxes would get
//!   scratch space that vanishes with their Pod: refused unless
//!   `allow_ephemeral_user_data` says the operator wants exactly that.
//! - The network settings must parse ([`super::netpol`]).
//! - The daemon's ServiceAccount must be allowed what a create and a delete
//!   need beyond Pods and Services: Secrets (the agent credential, always
//!   on) and, unless `network_policy = "external"`, NetworkPolicies. Asked
//!   with SelfSubjectAccessReviews (allowed to every authenticated user).
//! - `pids` cannot be limited per Pod: a warning unless the operator
//!   declared the kubelets' `podPidsLimit` (`pod_pids_limit`).
//! - `connect_mode = "nodeport"` exposes every sandbox's agent on every
//!   node: accepted (the agent refuses requests without its credential),
//!   with a warning.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tracing::{info, warn};

use super::{KubeError, SpecConfig};
use crate::backend::kube_config::{ConnectMode, NetworkPolicyMode};
use crate::config::Config;

/// Checks that need no cluster.
pub fn check_config(cfg: &Config) -> Result<(), KubeError> {
    let k = &cfg.kubernetes;
    if !k.allow_ephemeral_user_data {
        let missing: Vec<&str> = [
            ("USER_DATA_PVC", k.user_data_pvc.is_none()),
            ("SKILLS_PVC", k.skills_pvc.is_none()),
        ]
        .iter()
        .filter(|(_, m)| *m)
        .map(|(n, _)| *n)
        .collect();
        if !missing.is_empty() {
            return Err(KubeError::Preflight(format!(
                "{} not set: persistent sandboxes would keep user files in an emptyDir that \
                 vanishes with their Pod. Set them ([kubernetes] user_data_pvc / skills_pvc), or \
                 opt into ephemeral storage with [kubernetes] allow_ephemeral_user_data = true \
                 (SANDBOXD_KUBE_ALLOW_EPHEMERAL_USER_DATA=true)",
                missing.join(" and ")
            )));
        }
    } else if k.user_data_pvc.is_none() {
        warn!("allow_ephemeral_user_data: persistent sandboxes get scratch space that vanishes with their Pod");
    }
    SpecConfig::from_config(cfg)?;
    match k.pod_pids_limit {
        Some(n) => info!(
            pod_pids_limit = n,
            "pids per sandbox are capped node-wide by the kubelets' podPidsLimit"
        ),
        None => warn!(
            "pids limits are NOT enforced per sandbox: Kubernetes has no per-Pod pids field; set \
             podPidsLimit in the kubelet configuration of sandbox nodes and declare it as \
             [kubernetes] pod_pids_limit"
        ),
    }
    if k.connect_mode == ConnectMode::NodePort {
        warn!(
            "connect_mode = nodeport: every sandbox's agent is reachable on every node's port \
             range; only the per-sandbox agent credential protects it (restrict the range to the \
             daemon with a firewall)"
        );
    }
    Ok(())
}

/// The API calls beyond Pods and Services the daemon must be allowed,
/// as (verb, group, resource).
pub fn required(cfg: &Config) -> Vec<(&'static str, &'static str, &'static str)> {
    let mut out = vec![
        ("create", "", "secrets"),
        ("get", "", "secrets"),
        ("delete", "", "secrets"),
    ];
    if cfg.kubernetes.network_policy == NetworkPolicyMode::Create {
        out.extend([
            ("create", "networking.k8s.io", "networkpolicies"),
            ("get", "networking.k8s.io", "networkpolicies"),
            ("delete", "networking.k8s.io", "networkpolicies"),
        ]);
    }
    out
}

/// Asks the API server whether the daemon may make what a create makes.
pub async fn check_permissions(client: &kube::Client, cfg: &Config) -> Result<(), KubeError> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let ns = &cfg.kubernetes.namespace;
    let mut denied = Vec::new();
    for (verb, group, resource) in required(cfg) {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(ns.clone()),
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                KubeError::Preflight(format!(
                    "cannot check the daemon's permissions (selfsubjectaccessreviews): {e}"
                ))
            })?;
        if !answer.status.is_some_and(|s| s.allowed) {
            denied.push(format!("{verb} {resource}"));
        }
    }
    if denied.is_empty() {
        return Ok(());
    }
    let np = denied.iter().any(|d| d.ends_with("networkpolicies"));
    Err(KubeError::Preflight(format!(
        "the daemon may not {} in namespace {ns}: grant them (deploy/kubernetes/rbac.yaml){}",
        denied.join(", "),
        if np {
            ", or set [kubernetes] network_policy = \"external\" if you manage the \
             NetworkPolicies of sandbox Pods yourself"
        } else {
            ""
        }
    )))
}
