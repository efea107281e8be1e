//! Pure builders of the objects a create submits, from a [`SandboxSpec`]
//! and the backend settings: the Pod, then (owned by it, so the garbage
//! collector removes them with it) the Secret holding the agent
//! credential, the NetworkPolicy and the Service. No I/O: golden-tested in
//! `tests/it/kube_golden.rs`, and printed by `sandboxd kube render`
//! through [`build_objects`], the function a create uses.
//!
//! The Pod meets the Pod Security Standard "restricted" in every container,
//! the init step included (see `docs/kubernetes.md`): non-root 1000:1000,
//! no privilege escalation, every capability dropped, seccomp `Localhost`
//! or `RuntimeDefault`, read-only root filesystem, size-capped emptyDirs,
//! `hostUsers: false`, no service-account token, no service links.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, Secret, SecretKeySelector, SecurityContext, Service,
    ServicePort, ServiceSpec, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;

use super::names;
use super::netpol::{self, NetPolicyConfig};
use super::prepare;
use super::KubeError;
use crate::backend::kube_config::{ConnectMode, KubeSeccomp, NetworkPolicyMode};
use crate::config::Config;
use crate::model::{SandboxSpec, StorageMode};
use sandbox_abi::credential;
use sandbox_abi::layout::{self, GUEST};

/// Name of the sandbox container in the Pod.
pub const CONTAINER: &str = "sandbox";
/// The emptyDir the init step copies the agent into (read-only in the
/// sandbox container), mounted at the directory of `GUEST.agent_path`.
pub const AGENT_VOLUME: &str = "sandboxd-agent";
/// Size cap of that emptyDir (the static agent is about 10 MiB).
const AGENT_VOLUME_MB: u64 = 64;

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
    /// The sandbox container's image: any userland.
    pub image: String,
    /// The `sandboxd` image, source of the agent (init step).
    pub agent_image: String,
    pub container_port: u16,
    pub user_data_pvc: Option<String>,
    pub skills_pvc: Option<String>,
    pub seccomp: Seccomp,
    pub connect_mode: ConnectMode,
    pub user_namespaces: bool,
    /// `None`: `network_policy = "external"`.
    pub network: Option<NetPolicyConfig>,
    pub home_size_mb: u64,
    pub tmp_size_mb: u64,
    /// The agent's `--exec-cap-seconds` (the exec timeout minus a margin).
    pub exec_cap_seconds: f64,
}

impl SpecConfig {
    /// The Kubernetes settings of `cfg`; fails on a malformed network
    /// setting (named in the error).
    pub fn from_config(cfg: &Config) -> Result<SpecConfig, KubeError> {
        let k = &cfg.kubernetes;
        let seccomp = match k.seccomp {
            KubeSeccomp::Localhost => Seccomp::Localhost(k.seccomp_localhost_profile.clone()),
            KubeSeccomp::RuntimeDefault => Seccomp::RuntimeDefault,
        };
        let network = match k.network_policy {
            NetworkPolicyMode::Create => {
                Some(NetPolicyConfig::from_config(k).map_err(KubeError::Config)?)
            }
            NetworkPolicyMode::External => None,
        };
        Ok(SpecConfig {
            namespace: k.namespace.clone(),
            image: cfg.kube_sandbox_image().to_string(),
            agent_image: k.agent_image.clone(),
            container_port: cfg.container_port,
            user_data_pvc: k.user_data_pvc.clone(),
            skills_pvc: k.skills_pvc.clone(),
            seccomp,
            connect_mode: k.connect_mode,
            user_namespaces: k.user_namespaces,
            network,
            home_size_mb: cfg.limits.home_size_mb,
            tmp_size_mb: cfg.limits.tmp_size_mb,
            exec_cap_seconds: cfg.agent_exec_cap_seconds(),
        })
    }
}

/// Every object one create submits, in the order it submits them.
#[derive(Debug, Clone)]
pub struct SandboxObjects {
    pub pod: Pod,
    pub secret: Secret,
    /// `None` with `network_policy = "external"`.
    pub network_policy: Option<NetworkPolicy>,
    pub service: Service,
}

/// Builds every object of one incarnation: the Pod, and the objects owned
/// by the Pod of UID `pod_uid` holding `credential`.
pub fn build_objects(
    spec: &SandboxSpec,
    pod_uid: &str,
    credential: &str,
    c: &SpecConfig,
) -> SandboxObjects {
    let id = &spec.sandbox_id;
    SandboxObjects {
        pod: build_pod(spec, c),
        secret: build_secret(id, pod_uid, credential, c),
        network_policy: c
            .network
            .as_ref()
            .map(|n| netpol::build_network_policy(id, pod_uid, &c.namespace, c.container_port, n)),
        service: build_service(id, pod_uid, c),
    }
}

fn mib(mb: u64) -> Quantity {
    Quantity(format!("{mb}Mi"))
}

/// CPUs as a Kubernetes quantity: whole CPUs as "2", else millicores.
fn cpu(cpus: f64) -> Quantity {
    let milli = (cpus * 1000.0).round().max(1.0) as u64;
    if milli.is_multiple_of(1000) {
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

pub(super) fn mount(
    name: &str,
    path: &str,
    sub_path: Option<String>,
    read_only: bool,
) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        sub_path,
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// The container security context of every container of the Pod (PSS
/// "restricted"): uid/gid 1000, non-root, nothing to escalate to.
pub(super) fn restricted() -> SecurityContext {
    SecurityContext {
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
    }
}

/// The directory the agent volume is mounted at (`/.sandboxd`).
pub fn agent_dir() -> &'static str {
    GUEST
        .agent_path
        .rsplit_once('/')
        .map(|(d, _)| d)
        .unwrap_or("/")
}

/// The Pod of one sandbox incarnation.
pub fn build_pod(spec: &SandboxSpec, c: &SpecConfig) -> Pod {
    let id = &spec.sandbox_id;
    let ident = &spec.identity;
    let persistent = ident.storage == StorageMode::Persistent;
    let user_pvc = c.user_data_pvc.as_deref().filter(|_| persistent);
    let skills_pvc = c.skills_pvc.as_deref().filter(|_| persistent);

    let mut volumes = vec![
        empty_dir(AGENT_VOLUME, AGENT_VOLUME_MB),
        empty_dir("home", c.home_size_mb),
        empty_dir("tmp", c.tmp_size_mb),
    ];
    let mut mounts = vec![
        mount(AGENT_VOLUME, agent_dir(), None, true),
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
            // Ephemeral (or an operator's explicit opt-in to no PVC):
            // scratch space only.
            volumes.push(empty_dir("user-data", c.home_size_mb));
            mounts.push(mount("user-data", GUEST.user_data, None, false));
        }
    }
    if let Some(claim) = skills_pvc {
        volumes.push(pvc("skills", claim));
        let sub = layout::kube_skills_rel(&ident.uid).display().to_string();
        mounts.push(mount("skills", GUEST.skills, Some(sub), true));
    }
    let init = prepare::init_container(
        &c.agent_image,
        user_pvc.map(|_| prepare::UserDirs {
            uid: &ident.uid,
            workdir: ident.workdir_path.as_deref(),
            skills: skills_pvc.is_some(),
        }),
    );

    let working_dir = GUEST.cwd(ident.workdir_path.as_deref());
    // The credential variable comes from the Secret, never from the request.
    let mut env: Vec<EnvVar> = spec
        .env
        .iter()
        .filter(|(k, _)| k.as_str() != credential::ENV)
        .map(|(k, v)| EnvVar {
            name: k.clone(),
            value: Some(v.clone()),
            value_from: None,
        })
        .collect();
    env.push(EnvVar {
        name: credential::ENV.into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: names::object_name(id),
                key: credential::SECRET_KEY.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
    });
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
        // The create's image (`[images] allowed`), else the node's.
        image: Some(
            spec.identity
                .image
                .clone()
                .unwrap_or_else(|| c.image.clone()),
        ),
        image_pull_policy: Some("IfNotPresent".into()),
        // The agent is PID 1 whatever the image's entrypoint is.
        command: Some(vec![
            GUEST.agent_path.into(),
            "--listen".into(),
            format!("0.0.0.0:{}", c.container_port),
            "--require-credential".into(),
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
        // A TCP probe: the agent answers no HTTP request without the
        // credential, and it listens only once it is ready.
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(port),
                host: None,
            }),
            period_seconds: Some(1),
            timeout_seconds: Some(2),
            failure_threshold: Some(3),
            success_threshold: Some(1),
            ..Default::default()
        }),
        security_context: Some(restricted()),
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
            host_users: c.user_namespaces.then_some(false),
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
            init_containers: Some(vec![init]),
            containers: vec![container],
            volumes: Some(volumes),
            ..Default::default()
        }),
        status: None,
    }
}

/// The Secret holding the agent credential of one incarnation, owned by
/// its Pod (`pod_uid`). Only the sandbox container's environment refers to
/// it (`secretKeyRef`); the agent removes the variable at start.
pub fn build_secret(sandbox_id: &str, pod_uid: &str, credential: &str, c: &SpecConfig) -> Secret {
    Secret {
        metadata: names::pod_owned_metadata(sandbox_id, &c.namespace, pod_uid),
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(
            credential::SECRET_KEY.to_string(),
            ByteString(credential.as_bytes().to_vec()),
        )])),
        string_data: None,
    }
}

/// The Service of one sandbox incarnation, owned by its Pod (`pod_uid`) so
/// the garbage collector removes it with the Pod if the daemon cannot.
pub fn build_service(sandbox_id: &str, pod_uid: &str, c: &SpecConfig) -> Service {
    let port = i32::from(c.container_port);
    Service {
        metadata: names::pod_owned_metadata(sandbox_id, &c.namespace, pod_uid),
        spec: Some(ServiceSpec {
            type_: Some(
                match c.connect_mode {
                    ConnectMode::NodePort => "NodePort",
                    ConnectMode::PodIp | ConnectMode::Service => "ClusterIP",
                }
                .into(),
            ),
            selector: Some(names::pod_selector_labels(sandbox_id)),
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
        assert_eq!(agent_dir(), "/.sandboxd");
    }

    #[test]
    fn spec_config_of_the_defaults() {
        let mut cfg = Config::default();
        let s = SpecConfig::from_config(&cfg).unwrap();
        assert_eq!(s.connect_mode, ConnectMode::PodIp);
        assert!(s.user_namespaces && s.network.is_some());
        assert_eq!(s.exec_cap_seconds, 170.0);
        cfg.exec_timeout_seconds = 600;
        assert_eq!(
            SpecConfig::from_config(&cfg).unwrap().exec_cap_seconds,
            590.0
        );
        assert_eq!(
            s.seccomp,
            Seccomp::Localhost("sandboxd/default.json".into())
        );
    }
}
