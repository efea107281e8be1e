//! Pure builders of a sandbox's Pod and Service from a [`SandboxSpec`] and
//! the backend settings. No I/O: golden-tested in `tests/kube_golden.rs`.
//!
//! The Pod is hardened by default (see `docs/kubernetes.md`): non-root
//! 1000:1000, no privilege escalation, no capabilities, seccomp, read-only
//! root filesystem with emptyDir `/home/gem` and `/tmp`, no service-account
//! token, no service links, resource limits, a readiness probe on the
//! agent's health path.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, HTTPGetAction,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::names;
use super::prepare;
use crate::config::{Config, ConnectMode, KubeSeccomp};
use crate::model::{SandboxSpec, StorageMode};
use sandbox_abi::layout::{self, GUEST};

/// The agent's health path (a plain 200 is enough for readiness).
pub const HEALTH_PATH: &str = "/v1/sandbox";
/// Name of the sandbox container in the Pod.
pub const CONTAINER: &str = "sandbox";

/// Which seccomp profile the Pod runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seccomp {
    /// Our profile, installed on every node under the kubelet seccomp root.
    Localhost(String),
    RuntimeDefault,
}

/// Everything the builders need besides the [`SandboxSpec`].
#[derive(Debug, Clone)]
pub struct SpecConfig {
    pub namespace: String,
    pub image: String,
    pub container_port: u16,
    pub user_data_pvc: Option<String>,
    pub skills_pvc: Option<String>,
    pub seccomp: Seccomp,
    pub connect_mode: ConnectMode,
    pub home_size_mb: u64,
    pub tmp_size_mb: u64,
    /// The agent's `--exec-cap-seconds` (the exec timeout minus a margin).
    pub exec_cap_seconds: f64,
}

impl SpecConfig {
    /// The Kubernetes settings of `cfg` (already checked when it was read).
    pub fn from_config(cfg: &Config) -> SpecConfig {
        let k = &cfg.kubernetes;
        let seccomp = match k.seccomp {
            KubeSeccomp::Localhost => Seccomp::Localhost(k.seccomp_localhost_profile.clone()),
            KubeSeccomp::RuntimeDefault => Seccomp::RuntimeDefault,
        };
        SpecConfig {
            namespace: k.namespace.clone(),
            image: cfg.sandbox_image.clone(),
            container_port: cfg.container_port,
            user_data_pvc: k.user_data_pvc.clone(),
            skills_pvc: k.skills_pvc.clone(),
            seccomp,
            connect_mode: k.connect_mode,
            home_size_mb: cfg.limits.home_size_mb,
            tmp_size_mb: cfg.limits.tmp_size_mb,
            exec_cap_seconds: cfg.agent_exec_cap_seconds(),
        }
    }
}

fn mib(mb: u64) -> Quantity {
    Quantity(format!("{mb}Mi"))
}

/// CPUs as a Kubernetes quantity: whole CPUs as "2", else millicores.
fn cpu(cpus: f64) -> Quantity {
    let milli = (cpus * 1000.0).round().max(1.0) as u64;
    if milli % 1000 == 0 {
        Quantity(format!("{}", milli / 1000))
    } else {
        Quantity(format!("{milli}m"))
    }
}

fn empty_dir(name: &str, size_mb: u64) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(mib(size_mb)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pvc(name: &str, claim: &str) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: None,
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, sub_path: Option<String>, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        sub_path,
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// The Pod of one sandbox incarnation.
pub fn build_pod(spec: &SandboxSpec, c: &SpecConfig) -> Pod {
    let id = &spec.sandbox_id;
    let ident = &spec.identity;
    let persistent = ident.storage == StorageMode::Persistent;
    let user_pvc = c.user_data_pvc.as_deref().filter(|_| persistent);
    let skills_pvc = c.skills_pvc.as_deref().filter(|_| persistent);

    let mut volumes = vec![
        empty_dir("home", c.home_size_mb),
        empty_dir("tmp", c.tmp_size_mb),
    ];
    let mut mounts = vec![
        mount("home", GUEST.home, None, false),
        mount("tmp", GUEST.tmp, None, false),
    ];
    match user_pvc {
        Some(claim) => {
            volumes.push(pvc("user-data", claim));
            let sub = layout::workspace_rel(&ident.uid).display().to_string();
            mounts.push(mount("user-data", GUEST.user_data, Some(sub), false));
        }
        None => {
            // Ephemeral (or no PVC configured): scratch space only.
            volumes.push(empty_dir("user-data", c.home_size_mb));
            mounts.push(mount("user-data", GUEST.user_data, None, false));
        }
    }
    if let Some(claim) = skills_pvc {
        volumes.push(pvc("skills", claim));
        let sub = layout::kube_skills_rel(&ident.uid).display().to_string();
        mounts.push(mount("skills", GUEST.skills, Some(sub), true));
    }
    let init_containers = user_pvc.map(|_| {
        vec![prepare::init_container(
            &c.image,
            &ident.uid,
            ident.workdir_path.as_deref(),
            skills_pvc.is_some(),
        )]
    });

    let working_dir = GUEST.cwd(ident.workdir_path.as_deref());
    let env = spec
        .env
        .iter()
        .map(|(k, v)| EnvVar {
            name: k.clone(),
            value: Some(v.clone()),
            value_from: None,
        })
        .collect();
    let amounts = BTreeMap::from([
        ("cpu".to_string(), cpu(spec.resources.cpus)),
        ("memory".to_string(), mib(spec.resources.memory_mb)),
    ]);
    let seccomp_profile = match &c.seccomp {
        Seccomp::Localhost(p) => SeccompProfile {
            type_: "Localhost".into(),
            localhost_profile: Some(p.clone()),
        },
        Seccomp::RuntimeDefault => SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        },
    };
    let port = i32::from(c.container_port);

    let container = Container {
        name: CONTAINER.into(),
        image: Some(c.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        // The image's entrypoint is the agent: only its cap is passed.
        args: Some(vec![
            "--exec-cap-seconds".into(),
            c.exec_cap_seconds.to_string(),
        ]),
        working_dir: Some(working_dir),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(amounts.clone()),
            limits: Some(amounts),
            ..Default::default()
        }),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some(HEALTH_PATH.into()),
                port: IntOrString::Int(port),
                scheme: Some("HTTP".into()),
                ..Default::default()
            }),
            period_seconds: Some(1),
            timeout_seconds: Some(2),
            failure_threshold: Some(3),
            success_threshold: Some(1),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_user: Some(i64::from(GUEST.uid)),
            run_as_group: Some(i64::from(GUEST.gid)),
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    };

    Pod {
        metadata: ObjectMeta {
            name: Some(names::object_name(id)),
            namespace: Some(c.namespace.clone()),
            labels: Some(names::labels(id)),
            annotations: Some(names::annotations(id, ident)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(10),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(i64::from(GUEST.uid)),
                run_as_group: Some(i64::from(GUEST.gid)),
                run_as_non_root: Some(true),
                fs_group: Some(i64::from(GUEST.gid)),
                fs_group_change_policy: Some("OnRootMismatch".into()),
                seccomp_profile: Some(seccomp_profile),
                ..Default::default()
            }),
            init_containers,
            containers: vec![container],
            volumes: Some(volumes),
            ..Default::default()
        }),
        status: None,
    }
}

/// The Service of one sandbox incarnation, owned by its Pod (`pod_uid`) so
/// the garbage collector removes it with the Pod if the daemon cannot.
pub fn build_service(sandbox_id: &str, pod_uid: &str, c: &SpecConfig) -> Service {
    let name = names::object_name(sandbox_id);
    let selector = BTreeMap::from([
        (names::LABEL_APP.to_string(), names::APP.to_string()),
        (
            names::LABEL_SANDBOX_ID.to_string(),
            names::sandbox_label(sandbox_id),
        ),
    ]);
    let port = i32::from(c.container_port);
    Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(c.namespace.clone()),
            labels: Some(names::labels(sandbox_id)),
            annotations: Some(BTreeMap::from([(
                names::ANN_SANDBOX_ID.to_string(),
                sandbox_id.to_string(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name,
                uid: pod_uid.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(
                match c.connect_mode {
                    ConnectMode::NodePort => "NodePort",
                    ConnectMode::PodIp => "ClusterIP",
                }
                .into(),
            ),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port,
                target_port: Some(IntOrString::Int(port)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(cpu(1.0).0, "1");
        assert_eq!(cpu(0.5).0, "500m");
        assert_eq!(cpu(2.25).0, "2250m");
        assert_eq!(cpu(0.0001).0, "1m");
        assert_eq!(mib(2048).0, "2048Mi");
    }

    #[test]
    fn bad_modes_are_config_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        for (toml, message) in [
            (
                "[kubernetes]\nseccomp = \"unconfined\"\n",
                "kubernetes.seccomp \"unconfined\" is not localhost or runtime-default",
            ),
            (
                "[kubernetes]\nconnect_mode = \"hostport\"\n",
                "kubernetes.connect_mode \"hostport\" is not nodeport or pod-ip",
            ),
        ] {
            std::fs::write(&p, toml).unwrap();
            let e = Config::load(Some(&p), &BTreeMap::new())
                .unwrap_err()
                .to_string();
            assert!(e.contains(message), "{e}");
        }
        let mut cfg = Config::default();
        let s = SpecConfig::from_config(&cfg);
        assert_eq!(s.connect_mode, ConnectMode::NodePort);
        assert_eq!(s.exec_cap_seconds, 170.0);
        cfg.exec_timeout_seconds = 600;
        assert_eq!(SpecConfig::from_config(&cfg).exec_cap_seconds, 590.0);
        assert_eq!(
            s.seccomp,
            Seccomp::Localhost("sandboxd/default.json".into())
        );
    }
}
