//! Daemon configuration: built-in defaults, then an optional TOML file,
//! then the environment names of the provisioner contract (env wins), then
//! command-line flags. Every value has a working default so `sandboxd serve`
//! runs in a fresh root shell with no file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sandbox_abi::request::ResourceLimits;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {name}: {message}")]
    Env { name: &'static str, message: String },
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Native,
    Kubernetes,
    Memory,
}

impl BackendKind {
    /// Parses a `PROVISIONER_BACKEND` value; `docker` and `local` are
    /// accepted aliases of `native` (the second element says so).
    pub fn parse(s: &str) -> Result<(BackendKind, bool), String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "native" => Ok((BackendKind::Native, false)),
            "docker" | "local" => Ok((BackendKind::Native, true)),
            "kubernetes" | "k8s" => Ok((BackendKind::Kubernetes, false)),
            "memory" => Ok((BackendKind::Memory, false)),
            other => Err(format!(
                "unknown backend {other:?} (expected native, kubernetes or memory)"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// journald's native protocol when stderr is the journal stream systemd
    /// connected it to (`JOURNAL_STREAM` names stderr's device and inode),
    /// else JSON when stderr is not a terminal, text on a terminal.
    Auto,
    Text,
    Json,
    /// journald's native protocol (span and event fields become journal
    /// fields: `SANDBOX_ID`, `GENERATION`), JSON on stderr when the journal
    /// socket cannot be reached.
    Journald,
}

impl LogFormat {
    /// What `Auto` means for a process whose stderr is (not) a terminal and
    /// is (not) the journal stream named by `JOURNAL_STREAM`.
    pub fn resolve(self, stderr_is_tty: bool, stderr_is_journal: bool) -> LogFormat {
        match self {
            LogFormat::Auto if stderr_is_journal => LogFormat::Journald,
            LogFormat::Auto if !stderr_is_tty => LogFormat::Json,
            LogFormat::Auto => LogFormat::Text,
            other => other,
        }
    }
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    /// Parses a `SANDBOXD_LOG_FORMAT` value (exact spelling).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(LogFormat::Json),
            "text" => Ok(LogFormat::Text),
            "auto" => Ok(LogFormat::Auto),
            "journald" => Ok(LogFormat::Journald),
            _ => Err(format!("{s:?} is not auto, text, json or journald")),
        }
    }
}

/// How the daemon reaches a sandbox of the Kubernetes backend
/// (`[kubernetes] connect_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum ConnectMode {
    /// `pod-ip` (default; the daemon runs in the cluster):
    /// `<podIP>:<container port>`, the Service is `ClusterIP`.
    PodIp,
    /// `service`: the `ClusterIP` of the sandbox's Service.
    Service,
    /// `nodeport`: `NODE_HOST:<nodePort>` of a `NodePort` Service, for a
    /// daemon outside the cluster. Every node then forwards the port to the
    /// sandbox: only safe because the agent refuses requests without the
    /// per-incarnation credential (always on), see `docs/kubernetes.md`.
    NodePort,
}

impl ConnectMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectMode::PodIp => "pod-ip",
            ConnectMode::Service => "service",
            ConnectMode::NodePort => "nodeport",
        }
    }
}

impl TryFrom<String> for ConnectMode {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "pod-ip" => Ok(ConnectMode::PodIp),
            "service" => Ok(ConnectMode::Service),
            "nodeport" => Ok(ConnectMode::NodePort),
            other => Err(format!(
                "kubernetes.connect_mode {other:?} is not pod-ip, service or nodeport"
            )),
        }
    }
}

/// Written as its configuration spelling (for `sandboxd config default`).
impl Serialize for ConnectMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for ConnectMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who makes the NetworkPolicy of sandbox Pods (`[kubernetes]
/// network_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum NetworkPolicyMode {
    /// `create` (default): one per sandbox, owned by its Pod; the daemon
    /// refuses to start when it may not create NetworkPolicies.
    Create,
    /// `external`: the operator manages the policies of sandbox Pods.
    External,
}

impl NetworkPolicyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkPolicyMode::Create => "create",
            NetworkPolicyMode::External => "external",
        }
    }
}

impl TryFrom<String> for NetworkPolicyMode {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "create" => Ok(NetworkPolicyMode::Create),
            "external" => Ok(NetworkPolicyMode::External),
            other => Err(format!(
                "kubernetes.network_policy {other:?} is not create or external"
            )),
        }
    }
}

/// Written as its configuration spelling (for `sandboxd config default`).
impl Serialize for NetworkPolicyMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for NetworkPolicyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which seccomp profile the Pods of the Kubernetes backend run under
/// (`[kubernetes] seccomp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum KubeSeccomp {
    /// `localhost`: our profile, installed on every node under the kubelet
    /// seccomp root (`seccomp_localhost_profile`).
    Localhost,
    /// `runtime-default`: the container runtime's default profile.
    RuntimeDefault,
}

impl KubeSeccomp {
    pub fn as_str(self) -> &'static str {
        match self {
            KubeSeccomp::Localhost => "localhost",
            KubeSeccomp::RuntimeDefault => "runtime-default",
        }
    }
}

impl TryFrom<String> for KubeSeccomp {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "localhost" => Ok(KubeSeccomp::Localhost),
            "runtime-default" => Ok(KubeSeccomp::RuntimeDefault),
            other => Err(format!(
                "kubernetes.seccomp {other:?} is not localhost or runtime-default"
            )),
        }
    }
}

/// Written as its configuration spelling (for `sandboxd config default`).
impl Serialize for KubeSeccomp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for KubeSeccomp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Node defaults and maxima for sandbox resources.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
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

impl Limits {
    /// What a create request is checked against: the node defaults and
    /// maxima, without the tmpfs sizes.
    pub fn resources(&self) -> ResourceLimits {
        ResourceLimits {
            memory_mb: self.memory_mb,
            cpus: self.cpus,
            pids: self.pids,
            max_memory_mb: self.max_memory_mb,
            max_cpus: self.max_cpus,
            max_pids: self.max_pids,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
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

/// The response headers a sandbox may set on what the platform receives
/// (the replaced provisioner's allow-list); `content-length` is always
/// kept (framing) and hop-by-hop headers are always dropped.
pub const DEFAULT_PROXY_RESPONSE_HEADERS: [&str; 5] = [
    "content-type",
    "content-disposition",
    "cache-control",
    "etag",
    "last-modified",
];

/// OCI images as native sandbox root filesystems (`[images]`, see
/// `docs/images.md`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImagesConfig {
    /// The image every native sandbox runs (`SANDBOX_IMAGE`); unset: the
    /// host's `/usr` (`[native] rootfs_binds`). The Kubernetes backend uses
    /// it as the Pod image when set (else the top-level `sandbox_image`).
    pub default: Option<String>,
    /// References a create may name in its `"image"` field (400 otherwise).
    pub allowed: Vec<String>,
    /// A Docker-style `config.json` (`auths`) with registry credentials
    /// (`SANDBOXD_IMAGES_AUTH_FILE`).
    pub auth_file: Option<PathBuf>,
    /// `host:port` of registries spoken to over plain HTTP
    /// (`SANDBOXD_INSECURE_REGISTRIES`, comma-separated).
    pub insecure_registries: Vec<String>,
    /// Largest total of regular-file bytes one image may unpack to.
    pub max_unpacked_mb: u64,
}

impl Default for ImagesConfig {
    fn default() -> Self {
        ImagesConfig {
            default: None,
            allowed: Vec::new(),
            auth_file: None,
            insecure_registries: Vec::new(),
            max_unpacked_mb: 20 * 1024,
        }
    }
}

/// Settings of the streaming proxy (`[proxy]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Response headers copied back from a sandbox (case-insensitive);
    /// every other one is dropped.
    pub response_headers: Vec<String>,
    /// Longest wait for a sandbox's response head once the request body
    /// is sent (default: the exec timeout + 30 s, so it never cuts an exec
    /// the agent answers in time).
    pub head_timeout_seconds: Option<u64>,
    /// Longest pause between two parts of a response body coming from a
    /// sandbox.
    pub body_idle_timeout_seconds: u64,
    /// No effect: it chose between the hand-written relay and hyper, and
    /// hyper now serves every proxied request (issue #31). Still accepted
    /// so configurations that set it load.
    pub relay: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            response_headers: DEFAULT_PROXY_RESPONSE_HEADERS
                .iter()
                .map(|h| h.to_string())
                .collect(),
            head_timeout_seconds: None,
            body_idle_timeout_seconds: 60,
            relay: true,
        }
    }
}

impl ProxyConfig {
    /// The allowed response headers as header names (lower-cased).
    pub fn response_header_names(&self) -> Result<Vec<http::HeaderName>, ConfigError> {
        self.response_headers
            .iter()
            .map(|h| {
                http::HeaderName::from_bytes(h.trim().to_ascii_lowercase().as_bytes()).map_err(
                    |_| {
                        ConfigError::Invalid(format!(
                            "proxy.response_headers: {h:?} is not a header name"
                        ))
                    },
                )
            })
            .collect()
    }
}

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
    pub connect_mode: ConnectMode,
    /// `localhost` (our profile installed on nodes) or `runtime-default`.
    pub seccomp: KubeSeccomp,
    /// Path of the Localhost profile relative to the kubelet seccomp root.
    pub seccomp_localhost_profile: String,
    /// The `sandboxd` image (it holds the static agent that an init
    /// container copies into every sandbox Pod).
    pub agent_image: String,
    /// `hostUsers: false` (a user namespace per Pod).
    pub user_namespaces: bool,
    /// `create` (default) or `external`.
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

/// What the network of a sandbox is (`[network] mode`, `SANDBOXD_NETWORK`).
pub use sandbox_abi::model::NetworkMode;

/// Sandbox networking (`[network]`, see `docs/network.md`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkConfig {
    /// `egress` (default): a veth, NAT and the egress policy; `none`:
    /// loopback only.
    pub mode: NetworkMode,
    /// The pool every sandbox's address comes from (a /31 each).
    pub subnet: String,
    /// Holes in the deny list: `CIDR` or `CIDR:port` (TCP and UDP).
    pub allow: Vec<String>,
    /// More denied destinations (CIDRs), on top of the built-in list.
    pub deny: Vec<String>,
    /// Concurrent connections one sandbox may have (`ct count`).
    pub max_connections: u32,
    /// The host's resolver configuration the sandboxes' resolvers come
    /// from (a loopback stub sends us to systemd-resolved's upstream list).
    pub resolv_conf: PathBuf,
    /// The nftables table (family `inet`) the daemon owns.
    pub table: String,
    /// The prefix of the host ends of the sandboxes' veths. Two daemons on
    /// one host (tests) need their own table, prefix and subnet.
    pub link_prefix: String,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            mode: NetworkMode::Egress,
            subnet: "10.243.0.0/16".to_string(),
            allow: Vec::new(),
            deny: Vec::new(),
            max_connections: 512,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            table: "sandboxd".to_string(),
            link_prefix: "sbx-".to_string(),
        }
    }
}

/// Whether native sandboxes get a user namespace (`[userns] mode`,
/// `SANDBOXD_USERNS`; see `docs/security.md#user-namespaces`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", rename_all = "lowercase")]
pub enum UsernsMode {
    /// `auto` (default): on when the kernel and the filesystems of the
    /// user-data and skills roots (and the other bound paths) support
    /// idmapped mounts, checked at start with a probe mount; off
    /// otherwise, said in the log.
    Auto,
    /// `on`: the daemon refuses to start without that support.
    On,
    /// `off`: every sandbox runs as host uid 1000 (the behaviour before
    /// user namespaces).
    Off,
}

impl std::str::FromStr for UsernsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(UsernsMode::Auto),
            "on" => Ok(UsernsMode::On),
            "off" => Ok(UsernsMode::Off),
            other => Err(format!("userns.mode {other:?} is not auto, on or off")),
        }
    }
}

impl TryFrom<String> for UsernsMode {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// Host ids of one sandbox's user namespace: container ids `0..65536`.
pub const USERNS_SLOT: u32 = 65536;

/// The warm pool of native sandboxes (`[pool]`; see
/// `docs/architecture.md#warm-pool` and `docs/security.md#warm-pool`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Sandboxes kept started but bound to no user, for the default image
    /// and network mode (`SANDBOXD_POOL_SIZE`). Default 0: the pool is off,
    /// and every sandbox is started cold; a claimed member differs from a
    /// cold sandbox inside (`docs/architecture.md#warm-pool`, "What differs").
    pub size: usize,
    /// How many pool members are started at once while refilling.
    pub refill_concurrency: usize,
    /// More pools, each for one network mode and image (`[[pool.extra]]`).
    pub extra: Vec<PoolVariant>,
}

/// A pool for creates that ask for another network mode or image than the
/// node's defaults (`[[pool.extra]]`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolVariant {
    /// The network mode of its members (default: the daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// The image of its members, one of `[images] allowed` (default: the
    /// node's default image, or the host's userland).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub size: usize,
}

/// The largest pool accepted.
pub const MAX_POOL_SIZE: usize = 256;

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 0,
            refill_concurrency: 1,
            extra: Vec::new(),
        }
    }
}

impl PoolConfig {
    /// Checks the sizes, and that every extra pool's image is one a create
    /// may name (`allowed`: the normalized `[images] allowed` list).
    pub fn validate(&self, allowed: &[String]) -> Result<(), ConfigError> {
        let total: usize = self.size + self.extra.iter().map(|v| v.size).sum::<usize>();
        if total > MAX_POOL_SIZE {
            return Err(ConfigError::Invalid(format!(
                "pool: {total} members in all is above the maximum {MAX_POOL_SIZE}"
            )));
        }
        for v in &self.extra {
            if let Some(image) = &v.image {
                let norm = crate::images::normalize(image).map_err(|e| {
                    ConfigError::Invalid(format!("pool.extra: image {image:?}: {e}"))
                })?;
                if !allowed.contains(&norm) {
                    return Err(ConfigError::Invalid(format!(
                        "pool.extra: image {image:?} is not in [images] allowed"
                    )));
                }
            }
        }
        if self.refill_concurrency == 0 || self.refill_concurrency > 16 {
            return Err(ConfigError::Invalid(
                "pool.refill_concurrency must be between 1 and 16".into(),
            ));
        }
        Ok(())
    }
}

/// User namespaces of native sandboxes (`[userns]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UsernsConfig {
    pub mode: UsernsMode,
    /// The first host uid/gid of the pool the sandboxes' ranges come from
    /// (default 2^31, far above any real user or the usual
    /// `/etc/subuid` ranges). A multiple of 65536.
    pub range_start: u32,
    /// How many host ids the pool holds (a multiple of 65536: one slot of
    /// 65536 per sandbox; default 2^30, 16384 sandboxes).
    pub range_count: u32,
}

impl Default for UsernsConfig {
    fn default() -> Self {
        UsernsConfig {
            mode: UsernsMode::Auto,
            range_start: 1 << 31,
            range_count: 1 << 30,
        }
    }
}

impl UsernsConfig {
    /// Number of sandbox slots in the pool.
    pub fn slots(&self) -> u32 {
        self.range_count / USERNS_SLOT
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("userns: {m}")));
        if self.range_start < USERNS_SLOT || !self.range_start.is_multiple_of(USERNS_SLOT) {
            return bad(format!(
                "range_start {} must be a multiple of 65536 and at least 65536 (host ids below belong to real users)",
                self.range_start
            ));
        }
        if self.range_count < USERNS_SLOT || !self.range_count.is_multiple_of(USERNS_SLOT) {
            return bad(format!(
                "range_count {} must be a positive multiple of 65536 (one slot per sandbox)",
                self.range_count
            ));
        }
        // The last id must stay below 2^32 - 1 ((uid_t)-1 means "no id").
        if u64::from(self.range_start) + u64::from(self.range_count) > u64::from(u32::MAX) {
            return bad(format!(
                "range_start + range_count = {} exceeds the largest host id {}",
                u64::from(self.range_start) + u64::from(self.range_count),
                u32::MAX - 1
            ));
        }
        Ok(())
    }
}

/// The whole daemon configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub backend: BackendKind,
    pub listen: String,
    /// Must be set to listen on anything but loopback.
    pub allow_non_loopback: bool,
    pub unix_socket: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    /// The config file `token` was read from (None when it came from the
    /// environment or is unset): a file holding the token must be root's
    /// and unreadable by others, which `serve` checks.
    #[serde(skip)]
    pub token_origin: Option<PathBuf>,
    pub public_url: Option<String>,
    pub sandbox_image: String,
    pub container_port: u16,
    pub health_timeout_seconds: u64,
    pub idle_timeout_seconds: i64,
    pub idle_check_interval_seconds: u64,
    pub exec_timeout_seconds: u64,
    pub user_data_root: PathBuf,
    pub skills_root: PathBuf,
    /// dotenv file merged under every sandbox's user env.
    pub sandbox_env_file: Option<PathBuf>,
    pub memory_url_template: String,
    /// Stop every sandbox when the daemon exits (default: leave them running).
    pub stop_sandboxes_on_exit: bool,
    pub shutdown_grace_seconds: u64,
    /// How long a delete waits for in-flight proxied requests of its
    /// sandbox before it cancels them.
    pub delete_grace_seconds: u64,
    /// How long stopping every sandbox at shutdown may take in all
    /// (`stop_sandboxes_on_exit`).
    pub stop_timeout_seconds: u64,
    pub log_format: LogFormat,
    /// Tokio worker threads of the daemon (`SANDBOXD_WORKER_THREADS`; none:
    /// one per CPU). Environment only.
    #[serde(skip)]
    pub worker_threads: Option<usize>,
    /// Artificial create latency of the memory backend
    /// (`MEMORY_CREATE_DELAY_MS`, tests). Environment only.
    #[serde(skip)]
    pub memory_create_delay_ms: u64,
    pub limits: Limits,
    /// Set when `PROVISIONER_BACKEND` used an alias (`docker`, `local`): the
    /// value, for the daemon to log once logging is set up (the config is
    /// read before the log format is known).
    #[serde(skip)]
    pub backend_alias: Option<String>,
    pub native: NativeConfig,
    pub kubernetes: KubeConfig,
    pub network: NetworkConfig,
    pub proxy: ProxyConfig,
    pub userns: UsernsConfig,
    pub images: ImagesConfig,
    pub pool: PoolConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Native,
            listen: "127.0.0.1:8002".to_string(),
            allow_non_loopback: false,
            unix_socket: None,
            state_dir: PathBuf::from("/var/lib/sandboxd"),
            token: None,
            token_file: None,
            token_origin: None,
            public_url: None,
            sandbox_image: DEFAULT_SANDBOX_IMAGE.to_string(),
            container_port: 8080,
            health_timeout_seconds: 60,
            idle_timeout_seconds: 600,
            idle_check_interval_seconds: 10,
            exec_timeout_seconds: 180,
            user_data_root: PathBuf::from("/var/lib/sandboxd/user-data"),
            skills_root: PathBuf::from("/var/lib/sandboxd/skills"),
            sandbox_env_file: None,
            memory_url_template: "http://127.0.0.1:8080".to_string(),
            stop_sandboxes_on_exit: false,
            shutdown_grace_seconds: 20,
            delete_grace_seconds: 10,
            stop_timeout_seconds: 60,
            log_format: LogFormat::Auto,
            worker_threads: None,
            memory_create_delay_ms: 0,
            limits: Limits::default(),
            backend_alias: None,
            native: NativeConfig::default(),
            kubernetes: KubeConfig::default(),
            network: NetworkConfig::default(),
            proxy: ProxyConfig::default(),
            userns: UsernsConfig::default(),
            images: ImagesConfig::default(),
            pool: PoolConfig::default(),
        }
    }
}

/// Reads environment variables; injectable for tests.
pub trait EnvSource {
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl EnvSource for BTreeMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        BTreeMap::get(self, name).cloned()
    }
}

/// How one environment variable is read and what it sets.
#[derive(Clone, Copy)]
enum Setter {
    /// An empty value counts as unset; any other is taken verbatim.
    Text(fn(&mut Config, String)),
    /// A blank value (empty or white space) counts as unset; any other must
    /// parse.
    Parsed(fn(&mut Config, &str) -> Result<(), String>),
    /// Every value counts, an empty one included.
    Any(fn(&mut Config, &str) -> Result<(), String>),
}

/// The environment names of the provisioner contract and what each one
/// sets, applied in this order: where two names set the same value (the
/// Docker-era and the neutral name of a root), the later one wins.
#[rustfmt::skip]
const ENV_OVERRIDES: &[(&str, Setter)] = &[
    ("PROVISIONER_BACKEND", Setter::Parsed(set_backend)),
    ("SANDBOX_PROVISIONER_TOKEN", Setter::Any(|c, v| { c.token = Some(v.into()); c.token_origin = None; Ok(()) })),
    ("SANDBOXD_TOKEN_FILE", Setter::Text(|c, v| c.token_file = Some(v.into()))),
    ("PROVISIONER_PUBLIC_URL", Setter::Text(|c, v| c.public_url = Some(v))),
    ("SANDBOX_IMAGE", Setter::Text(|c, v| c.images.default = Some(v))),
    ("SANDBOXD_INSECURE_REGISTRIES", Setter::Any(|c, v| { c.images.insecure_registries = split_commas(v); Ok(()) })),
    ("SANDBOXD_IMAGES_AUTH_FILE", Setter::Text(|c, v| c.images.auth_file = Some(v.into()))),
    ("SANDBOX_CONTAINER_PORT", Setter::Parsed(|c, v| parse_into(&mut c.container_port, v))),
    ("SANDBOX_HEALTH_TIMEOUT_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.health_timeout_seconds, v))),
    ("SANDBOX_IDLE_TIMEOUT_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.idle_timeout_seconds, v))),
    ("SANDBOX_IDLE_CHECK_INTERVAL_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.idle_check_interval_seconds, v))),
    ("SANDBOX_EXEC_TIMEOUT_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.exec_timeout_seconds, v))),
    ("K8S_NAMESPACE", Setter::Text(|c, v| c.kubernetes.namespace = v)),
    ("KUBECONFIG_PATH", Setter::Text(|c, v| c.kubernetes.kubeconfig_path = Some(v.into()))),
    ("NODE_HOST", Setter::Text(|c, v| c.kubernetes.node_host = v)),
    ("USER_DATA_PVC", Setter::Text(|c, v| c.kubernetes.user_data_pvc = Some(v))),
    ("SKILLS_PVC", Setter::Text(|c, v| c.kubernetes.skills_pvc = Some(v))),
    ("SANDBOXD_IMAGE", Setter::Text(|c, v| c.kubernetes.agent_image = v)),
    ("SANDBOXD_KUBE_ALLOW_EPHEMERAL_USER_DATA", Setter::Any(|c, v| parse_bool_into(&mut c.kubernetes.allow_ephemeral_user_data, v))),
    ("DOCKER_USER_DATA_HOST_PATH", Setter::Text(|c, v| c.user_data_root = v.into())),
    ("SANDBOXD_USER_DATA_ROOT", Setter::Text(|c, v| c.user_data_root = v.into())),
    ("DOCKER_SKILL_PROJECTIONS_HOST_PATH", Setter::Text(|c, v| c.skills_root = v.into())),
    ("SANDBOXD_SKILLS_ROOT", Setter::Text(|c, v| c.skills_root = v.into())),
    ("SANDBOXD_LISTEN", Setter::Text(|c, v| c.listen = v)),
    ("SANDBOXD_UNIX_SOCKET", Setter::Text(|c, v| c.unix_socket = Some(v.into()))),
    ("SANDBOXD_STATE_DIR", Setter::Text(|c, v| c.state_dir = v.into())),
    ("SANDBOXD_CGROUP_PARENT", Setter::Text(|c, v| c.native.cgroup_parent = v)),
    ("SANDBOXD_EXPOSE_USR_LOCAL", Setter::Any(|c, v| parse_bool_into(&mut c.native.expose_usr_local, v))),
    ("SANDBOXD_SANDBOX_ENV_FILE", Setter::Text(|c, v| c.sandbox_env_file = Some(v.into()))),
    ("MEMORY_SANDBOX_URL_TEMPLATE", Setter::Text(|c, v| c.memory_url_template = v)),
    ("SANDBOXD_ALLOW_NON_LOOPBACK", Setter::Any(|c, v| parse_bool_into(&mut c.allow_non_loopback, v))),
    ("SANDBOXD_STOP_SANDBOXES_ON_EXIT", Setter::Any(|c, v| parse_bool_into(&mut c.stop_sandboxes_on_exit, v))),
    ("SANDBOXD_LOG_FORMAT", Setter::Any(set_log_format)),
    ("SANDBOXD_WORKER_THREADS", Setter::Parsed(set_worker_threads)),
    ("MEMORY_CREATE_DELAY_MS", Setter::Parsed(|c, v| parse_into(&mut c.memory_create_delay_ms, v))),
    ("SANDBOXD_NETWORK", Setter::Parsed(|c, v| { c.network.mode = v.trim().parse()?; Ok(()) })),
    ("SANDBOXD_POOL_SIZE", Setter::Parsed(|c, v| parse_into(&mut c.pool.size, v))),
    ("SANDBOXD_USERNS", Setter::Parsed(|c, v| { c.userns.mode = v.trim().parse()?; Ok(()) })),
    ("SANDBOXD_USERNS_RANGE_START", Setter::Parsed(|c, v| parse_into(&mut c.userns.range_start, v))),
    ("SANDBOXD_USERNS_RANGE_COUNT", Setter::Parsed(|c, v| parse_into(&mut c.userns.range_count, v))),
    ("SANDBOXD_NETWORK_SUBNET", Setter::Text(|c, v| c.network.subnet = v)),
    ("SANDBOXD_NETWORK_ALLOW", Setter::Any(|c, v| { c.network.allow = split_list(v); Ok(()) })),
    ("SANDBOXD_NETWORK_DENY", Setter::Any(|c, v| { c.network.deny = split_list(v); Ok(()) })),
    ("SANDBOXD_NETWORK_MAX_CONNECTIONS", Setter::Parsed(|c, v| parse_into(&mut c.network.max_connections, v))),
    ("SANDBOXD_NETWORK_RESOLV_CONF", Setter::Text(|c, v| c.network.resolv_conf = v.into())),
    ("SANDBOXD_NETWORK_TABLE", Setter::Text(|c, v| c.network.table = v)),
    ("SANDBOXD_NETWORK_LINK_PREFIX", Setter::Text(|c, v| c.network.link_prefix = v)),
    ("SANDBOXD_PROXY_RESPONSE_HEADERS", Setter::Text(|c, v| c.proxy.response_headers = split_commas(&v))),
    ("SANDBOXD_PROXY_HEAD_TIMEOUT_SECONDS", Setter::Parsed(|c, v| parse_into(c.proxy.head_timeout_seconds.get_or_insert(0), v))),
    ("SANDBOXD_PROXY_BODY_IDLE_TIMEOUT_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.proxy.body_idle_timeout_seconds, v))),
    ("SANDBOXD_PROXY_RELAY", Setter::Parsed(|c, v| parse_bool_into(&mut c.proxy.relay, v))),
    ("SANDBOXD_DELETE_GRACE_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.delete_grace_seconds, v))),
    ("SANDBOXD_STOP_TIMEOUT_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.stop_timeout_seconds, v))),
];

/// A comma-separated list, items trimmed, blank items dropped (a header
/// name with a space stays one, invalid, item).
fn split_commas(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// A comma- or white-space-separated list (empty entries dropped).
fn split_list(v: &str) -> Vec<String> {
    v.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `PROVISIONER_BACKEND`: `docker` and `local` are remembered as aliases
/// (logged once logging is set up).
fn set_backend(c: &mut Config, v: &str) -> Result<(), String> {
    let (kind, alias) = BackendKind::parse(v)?;
    c.backend_alias = alias.then(|| v.to_string());
    c.backend = kind;
    Ok(())
}

/// `SANDBOXD_LOG_FORMAT`: empty counts as unset; `auto`, `text`, `json` or
/// `journald` exactly.
fn set_log_format(c: &mut Config, v: &str) -> Result<(), String> {
    if !v.is_empty() {
        c.log_format = v.parse()?;
    }
    Ok(())
}

/// `SANDBOXD_WORKER_THREADS`: a positive number.
fn set_worker_threads(c: &mut Config, v: &str) -> Result<(), String> {
    let mut n = 0usize;
    parse_into(&mut n, v)?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    c.worker_threads = Some(n);
    Ok(())
}

/// Sets `field` from `v` (white space around it ignored).
fn parse_into<T: std::str::FromStr>(field: &mut T, v: &str) -> Result<(), String>
where
    T::Err: std::fmt::Display,
{
    *field = v.trim().parse::<T>().map_err(|e| e.to_string())?;
    Ok(())
}

/// Sets `field` from `1/true/yes/on` or `0/false/no/off`.
fn parse_bool_into(field: &mut bool, v: &str) -> Result<(), String> {
    *field = match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => true,
        "0" | "false" | "no" | "off" => false,
        _ => return Err(format!("{v:?} is not a boolean")),
    };
    Ok(())
}

impl Config {
    /// Loads the TOML file (if any) and applies the environment over it.
    pub fn load(file: Option<&Path>, env: &dyn EnvSource) -> Result<Config, ConfigError> {
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| env.get("SANDBOXD_CONFIG").map(PathBuf::from));
        let mut cfg = match file {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                let mut c = toml::from_str::<Config>(&text).map_err(|e| ConfigError::Parse {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                if c.token.is_some() {
                    c.token_origin = Some(path.clone());
                }
                c
            }
            None => Config::default(),
        };
        cfg.apply_env(env)?;
        Ok(cfg)
    }

    /// Applies the contract's environment names (env wins over the file).
    pub fn apply_env(&mut self, env: &dyn EnvSource) -> Result<(), ConfigError> {
        for &(name, setter) in ENV_OVERRIDES {
            let Some(v) = env.get(name) else { continue };
            let result = match setter {
                Setter::Text(set) => {
                    if !v.is_empty() {
                        set(self, v);
                    }
                    Ok(())
                }
                Setter::Parsed(_) if v.trim().is_empty() => Ok(()),
                Setter::Parsed(set) | Setter::Any(set) => set(self, &v),
            };
            result.map_err(|message| ConfigError::Env { name, message })?;
        }
        Ok(())
    }

    /// The listen address, refusing a non-loopback one unless
    /// `allow_non_loopback` is set.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        let addr: SocketAddr = self
            .listen
            .parse()
            .map_err(|e| ConfigError::Invalid(format!("listen address {:?}: {e}", self.listen)))?;
        if !addr.ip().is_loopback() && !self.allow_non_loopback {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on non-loopback address {addr}: set allow_non_loopback = true \
                 in the config file (or SANDBOXD_ALLOW_NON_LOOPBACK=true) to expose the API"
            )));
        }
        Ok(addr)
    }

    /// The Kubernetes backend's Pod image: `[images] default`
    /// (`SANDBOX_IMAGE`) when set, else the top-level `sandbox_image`.
    pub fn kube_sandbox_image(&self) -> &str {
        self.images
            .default
            .as_deref()
            .unwrap_or(&self.sandbox_image)
    }

    /// The longest a command may run in a sandbox, passed to its agent
    /// (`--exec-cap-seconds`): the exec timeout minus a margin of 10 % (at
    /// most 10 s; 180 gives 170), so the agent kills a command and answers
    /// before a client waiting the exec timeout gives up. Millisecond
    /// precision.
    pub fn agent_exec_cap_seconds(&self) -> f64 {
        let t = self.exec_timeout_seconds as f64;
        let cap = t - (t * 0.1).min(10.0);
        (cap * 1000.0).round() / 1000.0
    }

    /// The proxy's response-head timeout: `[proxy] head_timeout_seconds`,
    /// by default the exec timeout + 30 s (the agent answers an exec by the
    /// exec timeout minus its margin, so a legitimate exec is never cut).
    pub fn proxy_head_timeout_seconds(&self) -> u64 {
        self.proxy
            .head_timeout_seconds
            .unwrap_or(self.exec_timeout_seconds + 30)
    }

    /// The idle timeout after the contract's rule: `<= 0` disables the
    /// reaper; a timeout `<=` the exec timeout is raised to exec + 30.
    /// The second element is true when it was raised (the caller warns).
    pub fn effective_idle_timeout(&self) -> (Option<u64>, bool) {
        if self.idle_timeout_seconds <= 0 {
            return (None, false);
        }
        let t = self.idle_timeout_seconds as u64;
        if t <= self.exec_timeout_seconds {
            (Some(self.exec_timeout_seconds + 30), true)
        } else {
            (Some(t), false)
        }
    }

    /// `PROVISIONER_PUBLIC_URL` without a trailing slash, defaulting to the
    /// listen address.
    pub fn public_url(&self) -> String {
        let url = self
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.listen));
        url.trim_end_matches('/').to_string()
    }

    /// Checks values that have no sensible interpretation.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.health_timeout_seconds == 0 {
            return Err(ConfigError::Invalid(
                "health_timeout_seconds must be at least 1".into(),
            ));
        }
        if self.exec_timeout_seconds == 0 || self.exec_timeout_seconds > 86_400 {
            return Err(ConfigError::Invalid(
                "exec_timeout_seconds must be in 1..=86400 (it bounds every command in a sandbox)"
                    .into(),
            ));
        }
        if self.idle_check_interval_seconds == 0 {
            return Err(ConfigError::Invalid(
                "idle_check_interval_seconds must be at least 1".into(),
            ));
        }
        self.proxy.response_header_names()?;
        if self.proxy_head_timeout_seconds() == 0 || self.proxy.body_idle_timeout_seconds == 0 {
            return Err(ConfigError::Invalid(
                "proxy.head_timeout_seconds and proxy.body_idle_timeout_seconds must be at least 1"
                    .into(),
            ));
        }
        if self.stop_timeout_seconds == 0 {
            return Err(ConfigError::Invalid(
                "stop_timeout_seconds must be at least 1".into(),
            ));
        }
        self.userns.validate()?;
        let allowed: Vec<String> = self
            .images
            .allowed
            .iter()
            .filter_map(|i| crate::images::normalize(i).ok())
            .collect();
        self.pool.validate(&allowed)?;
        let l = &self.limits;
        if l.memory_mb > l.max_memory_mb || l.cpus > l.max_cpus || l.pids > l.max_pids {
            return Err(ConfigError::Invalid(
                "limits: a node default is above its maximum".into(),
            ));
        }
        if l.cpus <= 0.0 || l.memory_mb == 0 || l.pids == 0 {
            return Err(ConfigError::Invalid(
                "limits: defaults must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Parses a dotenv file: `KEY=value` lines, `#` comments, optional
/// `export ` prefix, single or double quotes around the value.
pub fn parse_dotenv(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: expected KEY=value", n + 1));
        };
        let k = k.trim();
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("line {}: bad key {k:?}", n + 1));
        }
        let v = v.trim();
        let v = if v.len() >= 2
            && ((v.starts_with('"') && v.ends_with('"'))
                || (v.starts_with('\'') && v.ends_with('\'')))
        {
            &v[1..v.len() - 1]
        } else {
            v
        };
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_work_without_file() {
        let c = Config::load(None, &env(&[])).unwrap();
        assert_eq!(c.backend, BackendKind::Native);
        assert_eq!(c.listen_addr().unwrap().to_string(), "127.0.0.1:8002");
        c.validate().unwrap();
    }

    #[test]
    fn pool_section_env_and_extra_pools() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[images]\nallowed = [\"registry.example.com/tools:1\"]\n\
             [pool]\nsize = 3\n\
             [[pool.extra]]\nnetwork = \"none\"\nsize = 1\n\
             [[pool.extra]]\nimage = \"registry.example.com/tools:1\"\nsize = 2\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert_eq!((c.pool.size, c.pool.extra.len()), (3, 2));
        assert_eq!(c.pool.extra[0].network, Some(NetworkMode::None));
        c.validate().unwrap();
        let c = Config::load(Some(&p), &env(&[("SANDBOXD_POOL_SIZE", "0")])).unwrap();
        assert_eq!(c.pool.size, 0);
        // Off unless asked for: a claimed member is not a cold sandbox.
        let d = Config::load(None, &env(&[])).unwrap();
        assert_eq!((d.pool.size, d.pool.extra.len()), (0, 0));
        let c = Config::load(None, &env(&[("SANDBOXD_POOL_SIZE", "2")])).unwrap();
        assert_eq!(c.pool.size, 2);
        // An extra pool's image must be one a create may name.
        std::fs::write(
            &p,
            "[[pool.extra]]\nimage = \"registry.example.com/other:2\"\nsize = 1\n",
        )
        .unwrap();
        let e = Config::load(Some(&p), &env(&[]))
            .and_then(|c| c.validate().map(|_| c))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in [images] allowed"), "{e}");
        // Too many members in all, and no refill.
        std::fs::write(&p, "[pool]\nsize = 200\n[[pool.extra]]\nsize = 100\n").unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("maximum"));
        std::fs::write(&p, "[pool]\nrefill_concurrency = 0\n").unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert!(c.validate().is_err());
    }

    #[test]
    fn userns_section_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[userns]\nmode = \"on\"\nrange_start = 131072\nrange_count = 196608\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert_eq!(c.userns.mode, UsernsMode::On);
        assert_eq!(c.userns.slots(), 3);
        c.validate().unwrap();
        let c = Config::load(
            Some(&p),
            &env(&[
                ("SANDBOXD_USERNS", "off"),
                ("SANDBOXD_USERNS_RANGE_START", "262144"),
                ("SANDBOXD_USERNS_RANGE_COUNT", "65536"),
            ]),
        )
        .unwrap();
        assert_eq!(c.userns.mode, UsernsMode::Off);
        assert_eq!((c.userns.range_start, c.userns.slots()), (262144, 1));
        assert!(Config::load(Some(&p), &env(&[("SANDBOXD_USERNS", "maybe")])).is_err());
        let d = Config::default();
        assert_eq!(d.userns.mode, UsernsMode::Auto);
        assert_eq!((d.userns.range_start, d.userns.slots()), (1 << 31, 16384));
        for (start, count) in [
            (1000, 65536),
            (0, 65536),
            (131072, 1000),
            (131072, 0),
            (u32::MAX - 65535, 65536),
        ] {
            let mut c = Config::default();
            c.userns.range_start = start;
            c.userns.range_count = count;
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("userns"), "{e}");
        }
    }

    #[test]
    fn env_wins_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "backend = \"memory\"\nidle_timeout_seconds = 900\n[limits]\npids = 100\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), &env(&[("SANDBOX_IDLE_TIMEOUT_SECONDS", "1000")])).unwrap();
        assert_eq!(c.backend, BackendKind::Memory);
        assert_eq!(c.idle_timeout_seconds, 1000);
        assert_eq!(c.limits.pids, 100);
    }

    #[test]
    fn log_format_from_file_env_wins() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "log_format = \"json\"\n").unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
        let c = Config::load(Some(&p), &env(&[("SANDBOXD_LOG_FORMAT", "text")])).unwrap();
        assert_eq!(c.log_format, LogFormat::Text);
        let c = Config::load(Some(&p), &env(&[("SANDBOXD_LOG_FORMAT", "journald")])).unwrap();
        assert_eq!(c.log_format, LogFormat::Journald);
        std::fs::write(&p, "log_format = \"journald\"\n").unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert_eq!(c.log_format, LogFormat::Journald);
    }

    #[test]
    fn auto_log_format_is_journald_only_on_the_journal_stream() {
        use LogFormat::*;
        // (stderr is a tty, stderr is the journal stream) -> format
        for (tty, journal, want) in [
            (false, true, Journald),
            (true, true, Journald),
            (false, false, Json),
            (true, false, Text),
        ] {
            assert_eq!(
                Auto.resolve(tty, journal),
                want,
                "tty={tty} journal={journal}"
            );
        }
        for f in [Text, Json, Journald] {
            assert_eq!(f.resolve(false, true), f);
            assert_eq!(f.resolve(true, false), f);
        }
    }

    #[test]
    fn unknown_keys_and_bad_env_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "listne = \"x\"\n").unwrap();
        let e = Config::load(Some(&p), &env(&[])).unwrap_err().to_string();
        assert!(e.contains("listne"), "{e}");
        let e = Config::load(None, &env(&[("SANDBOX_IDLE_TIMEOUT_SECONDS", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SANDBOX_IDLE_TIMEOUT_SECONDS"), "{e}");
    }

    #[test]
    fn backend_aliases() {
        for (v, k) in [
            ("docker", BackendKind::Native),
            ("local", BackendKind::Native),
            ("kubernetes", BackendKind::Kubernetes),
        ] {
            let c = Config::load(None, &env(&[("PROVISIONER_BACKEND", v)])).unwrap();
            assert_eq!(c.backend, k);
            assert_eq!(c.backend_alias.is_some(), v != "kubernetes");
        }
        assert!(Config::load(None, &env(&[("PROVISIONER_BACKEND", "podman")])).is_err());
    }

    #[test]
    fn kube_modes_from_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[kubernetes]\nconnect_mode = \"pod-ip\"\nseccomp = \"runtime-default\"\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert_eq!(c.kubernetes.connect_mode, ConnectMode::PodIp);
        assert_eq!(c.kubernetes.seccomp, KubeSeccomp::RuntimeDefault);
        assert_eq!(c.kubernetes.connect_mode.to_string(), "pod-ip");
        assert_eq!(c.kubernetes.seccomp.to_string(), "runtime-default");
        let c = Config::default();
        assert_eq!(c.kubernetes.connect_mode, ConnectMode::PodIp);
        assert_eq!(c.kubernetes.seccomp, KubeSeccomp::Localhost);
    }

    #[test]
    fn images_settings() {
        let c = Config::load(
            None,
            &env(&[
                ("SANDBOX_IMAGE", "127.0.0.1:5000/tools:1"),
                (
                    "SANDBOXD_INSECURE_REGISTRIES",
                    "127.0.0.1:5000, localhost:5001",
                ),
            ]),
        )
        .unwrap();
        assert_eq!(c.images.default.as_deref(), Some("127.0.0.1:5000/tools:1"));
        assert_eq!(c.kube_sandbox_image(), "127.0.0.1:5000/tools:1");
        assert_eq!(
            c.images.insecure_registries,
            vec!["127.0.0.1:5000", "localhost:5001"]
        );
        // The top-level key stays the Kubernetes backend's only.
        let c: Config =
            toml::from_str("sandbox_image = \"x:1\"\n[images]\nallowed = [\"a:1\"]\n").unwrap();
        assert_eq!(c.kube_sandbox_image(), "x:1");
        assert_eq!(c.images.default, None);
        assert_eq!(c.images.allowed, vec!["a:1"]);
    }

    #[test]
    fn empty_and_blank_env_values() {
        // Empty counts as unset, except for the token and the booleans.
        let c = Config::load(
            None,
            &env(&[
                ("SANDBOX_IMAGE", ""),
                ("SANDBOX_CONTAINER_PORT", " "),
                ("PROVISIONER_BACKEND", " "),
                ("SANDBOXD_LOG_FORMAT", ""),
                ("SANDBOXD_WORKER_THREADS", ""),
                ("SANDBOX_PROVISIONER_TOKEN", ""),
            ]),
        )
        .unwrap();
        assert_eq!(c.kube_sandbox_image(), DEFAULT_SANDBOX_IMAGE);
        assert_eq!(c.images.default, None);
        assert_eq!(c.container_port, 8080);
        assert_eq!(c.backend, BackendKind::Native);
        assert_eq!(c.log_format, LogFormat::Auto);
        assert_eq!(c.worker_threads, None);
        assert_eq!(c.token.as_deref(), Some(""));
        for (name, value) in [
            ("SANDBOXD_ALLOW_NON_LOOPBACK", ""),
            ("SANDBOXD_LOG_FORMAT", "JSON"),
            ("SANDBOXD_WORKER_THREADS", "0"),
            ("SANDBOXD_WORKER_THREADS", "many"),
            ("MEMORY_CREATE_DELAY_MS", "soon"),
        ] {
            let e = Config::load(None, &env(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("environment variable {name}: ")),
                "{e}"
            );
        }
        let c = Config::load(
            None,
            &env(&[
                ("SANDBOXD_ALLOW_NON_LOOPBACK", " Yes"),
                ("SANDBOXD_WORKER_THREADS", " 3 "),
                ("MEMORY_CREATE_DELAY_MS", "200"),
            ]),
        )
        .unwrap();
        assert!(c.allow_non_loopback);
        assert_eq!(c.worker_threads, Some(3));
        assert_eq!(c.memory_create_delay_ms, 200);
    }

    #[test]
    fn neutral_root_names_win() {
        let c = Config::load(
            None,
            &env(&[
                ("DOCKER_USER_DATA_HOST_PATH", "/a"),
                ("SANDBOXD_USER_DATA_ROOT", "/b"),
                ("DOCKER_SKILL_PROJECTIONS_HOST_PATH", "/s"),
            ]),
        )
        .unwrap();
        assert_eq!(c.user_data_root, PathBuf::from("/b"));
        assert_eq!(c.skills_root, PathBuf::from("/s"));
    }

    #[test]
    fn non_loopback_needs_opt_in() {
        let mut c = Config {
            listen: "0.0.0.0:8002".into(),
            ..Config::default()
        };
        assert!(c.listen_addr().is_err());
        c.allow_non_loopback = true;
        assert!(c.listen_addr().is_ok());
        c.listen = "[::1]:9".into();
        c.allow_non_loopback = false;
        assert!(c.listen_addr().is_ok());
    }

    #[test]
    fn idle_timeout_rules() {
        let mut c = Config::default();
        assert_eq!(c.effective_idle_timeout(), (Some(600), false));
        c.idle_timeout_seconds = 100;
        assert_eq!(c.effective_idle_timeout(), (Some(210), true));
        c.idle_timeout_seconds = 0;
        assert_eq!(c.effective_idle_timeout(), (None, false));
        c.idle_timeout_seconds = -5;
        assert_eq!(c.effective_idle_timeout(), (None, false));
    }

    #[test]
    fn proxy_response_headers_default_file_and_env() {
        let c = Config::default();
        let names: Vec<String> = c
            .proxy
            .response_header_names()
            .unwrap()
            .iter()
            .map(|h| h.to_string())
            .collect();
        assert_eq!(names, DEFAULT_PROXY_RESPONSE_HEADERS);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[proxy]\nresponse_headers = [\"Content-Type\", \"X-Trace\"]\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        let names = c.proxy.response_header_names().unwrap();
        assert_eq!(names, ["content-type", "x-trace"]);
        let c = Config::load(
            Some(&p),
            &env(&[("SANDBOXD_PROXY_RESPONSE_HEADERS", " etag ,, x-a")]),
        )
        .unwrap();
        assert_eq!(c.proxy.response_headers, ["etag", "x-a"]);
        let c = Config::load(
            None,
            &env(&[("SANDBOXD_PROXY_RESPONSE_HEADERS", "bad header")]),
        )
        .unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("bad header"));
    }

    #[test]
    fn delete_grace_default_file_and_env() {
        assert_eq!(Config::default().delete_grace_seconds, 10);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "delete_grace_seconds = 3\n").unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert_eq!(c.delete_grace_seconds, 3);
        let c = Config::load(Some(&p), &env(&[("SANDBOXD_DELETE_GRACE_SECONDS", "0")])).unwrap();
        assert_eq!(c.delete_grace_seconds, 0);
        c.validate().unwrap();
        let e = Config::load(None, &env(&[("SANDBOXD_DELETE_GRACE_SECONDS", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SANDBOXD_DELETE_GRACE_SECONDS"), "{e}");
    }

    #[test]
    fn proxy_timeouts_default_file_and_env() {
        let c = Config::default();
        assert_eq!(c.proxy_head_timeout_seconds(), 210);
        assert_eq!(c.proxy.body_idle_timeout_seconds, 60);
        assert!(c.proxy.relay);
        let c = Config::load(None, &env(&[("SANDBOXD_PROXY_RELAY", "false")])).unwrap();
        assert!(!c.proxy.relay);
        assert!(Config::load(None, &env(&[("SANDBOXD_PROXY_RELAY", "sometimes")])).is_err());
        let c = Config::load(None, &env(&[("SANDBOX_EXEC_TIMEOUT_SECONDS", "600")])).unwrap();
        assert_eq!(c.proxy_head_timeout_seconds(), 630);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[proxy]\nhead_timeout_seconds = 100\nbody_idle_timeout_seconds = 20\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert_eq!(c.proxy_head_timeout_seconds(), 100);
        assert_eq!(c.proxy.body_idle_timeout_seconds, 20);
        let c = Config::load(
            Some(&p),
            &env(&[
                ("SANDBOXD_PROXY_HEAD_TIMEOUT_SECONDS", "7"),
                ("SANDBOXD_PROXY_BODY_IDLE_TIMEOUT_SECONDS", "8"),
            ]),
        )
        .unwrap();
        assert_eq!(c.proxy_head_timeout_seconds(), 7);
        assert_eq!(c.proxy.body_idle_timeout_seconds, 8);
        c.validate().unwrap();
        for name in [
            "SANDBOXD_PROXY_HEAD_TIMEOUT_SECONDS",
            "SANDBOXD_PROXY_BODY_IDLE_TIMEOUT_SECONDS",
        ] {
            let c = Config::load(None, &env(&[(name, "0")])).unwrap();
            assert!(c.validate().is_err(), "{name}=0");
        }
    }

    #[test]
    fn stop_timeout_default_file_and_env() {
        assert_eq!(Config::default().stop_timeout_seconds, 60);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "stop_timeout_seconds = 40\n").unwrap();
        let c = Config::load(Some(&p), &env(&[])).unwrap();
        assert_eq!(c.stop_timeout_seconds, 40);
        let c = Config::load(Some(&p), &env(&[("SANDBOXD_STOP_TIMEOUT_SECONDS", "5")])).unwrap();
        assert_eq!(c.stop_timeout_seconds, 5);
        let c = Config::load(None, &env(&[("SANDBOXD_STOP_TIMEOUT_SECONDS", "0")])).unwrap();
        assert!(c.validate().is_err());
    }

    #[test]
    fn the_agent_exec_cap_follows_the_exec_timeout() {
        let mut c = Config::default();
        assert_eq!(c.agent_exec_cap_seconds(), 170.0);
        for (timeout, cap) in [(6, 5.4), (1, 0.9), (60, 54.0), (260, 250.0), (3600, 3590.0)] {
            c.exec_timeout_seconds = timeout;
            assert_eq!(c.agent_exec_cap_seconds(), cap, "{timeout}");
        }
        c.exec_timeout_seconds = 0;
        assert!(c.validate().is_err());
        c.exec_timeout_seconds = 86_401;
        assert!(c.validate().is_err());
    }

    #[test]
    fn dotenv() {
        let m = parse_dotenv("# c\nA=1\nexport B=\"two words\"\nC='x=y'\n\n").unwrap();
        assert_eq!(m["A"], "1");
        assert_eq!(m["B"], "two words");
        assert_eq!(m["C"], "x=y");
        assert!(parse_dotenv("novalue").is_err());
    }
}
