//! Daemon configuration: built-in defaults, then an optional TOML file,
//! then the environment names of the provisioner contract (env wins), then
//! command-line flags. Every value has a working default so `sandboxd serve`
//! runs in a fresh root shell with no file.
//!
//! Here: the top-level keys, the [`Config`] that composes the sections,
//! loading, the one table of environment names ([`Config::apply_env`]) and
//! the checks across sections. Each section's type, defaults and checks
//! are with the code that reads it: `[limits]`
//! `sandbox_abi::request::ResourceLimits`, `[native]`
//! [`crate::backend::native::NativeConfig`], `[network]`
//! [`crate::backend::native::net::NetworkConfig`], `[userns]`
//! [`crate::backend::native::userns::UsernsConfig`], `[pool]`
//! [`crate::backend::native::PoolConfig`], `[kubernetes]`
//! [`crate::backend::kube_config::KubeConfig`], `[proxy]`
//! [`crate::api::proxy::ProxyConfig`], `[images]`
//! [`crate::images::ImagesConfig`], `[idle]`
//! [`crate::lifecycle::IdleConfig`]; `backend` and `log_format` are
//! [`crate::backend::BackendKind`] and [`crate::cli::serve::LogFormat`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sandbox_abi::request::ResourceLimits;
use serde::de::{value::StrDeserializer, DeserializeOwned};
use serde::{Deserialize, Deserializer, Serialize};

use crate::api::proxy::ProxyConfig;
use crate::backend::kube_config::{KubeConfig, DEFAULT_SANDBOX_IMAGE};
use crate::backend::native::net::NetworkConfig;
use crate::backend::native::userns::{UsernsConfig, UsernsMode};
use crate::backend::native::{NativeConfig, PoolConfig};
use crate::backend::BackendKind;
use crate::cli::serve::LogFormat;
use crate::images::ImagesConfig;
use crate::lifecycle::IdleConfig;

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

/// `s` as a value of an enum whose serde derive spells its words (the
/// derive's names are the one table of spellings): for the environment's
/// values, and the file's keys whose errors name the key ([`KeyWord`]).
pub fn parse_word<T: DeserializeOwned>(s: &str) -> Result<T, WordError> {
    T::deserialize(StrDeserializer::<WordError>::new(s))
}

/// Why a string is not one of an enum's words.
#[derive(Debug)]
pub enum WordError {
    /// `"x" is not a, b or c`.
    Unknown {
        value: String,
        words: &'static [&'static str],
    },
    Other(String),
}

impl WordError {
    /// The valid words: `a, b or c`.
    pub fn words(&self) -> String {
        let words = match self {
            WordError::Unknown { words, .. } => *words,
            WordError::Other(_) => &[],
        };
        match words.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => words.join(""),
        }
    }
}

impl std::fmt::Display for WordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WordError::Unknown { value, .. } => write!(f, "{value:?} is not {}", self.words()),
            WordError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for WordError {}

impl serde::de::Error for WordError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        WordError::Other(msg.to_string())
    }

    fn unknown_variant(value: &str, words: &'static [&'static str]) -> Self {
        WordError::Unknown {
            value: value.to_string(),
            words,
        }
    }
}

/// An enum that is the value of one key, whose errors name the key
/// (`kubernetes.seccomp "x" is not localhost or runtime-default`), in
/// the file ([`key_word`]) as in the environment.
pub trait KeyWord: DeserializeOwned {
    /// The key, as errors name it.
    const KEY: &'static str;

    /// `s` as a value of the key.
    fn parse_at_key(s: &str) -> Result<Self, String> {
        parse_word(s).map_err(|e| format!("{} {e}", Self::KEY))
    }
}

/// `#[serde(deserialize_with = "...")]` of a [`KeyWord`] field: a string,
/// parsed by [`KeyWord::parse_at_key`] (serde's own error names neither
/// the key nor the value as written).
pub fn key_word<'de, T: KeyWord, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    let s = String::deserialize(d)?;
    T::parse_at_key(&s).map_err(serde::de::Error::custom)
}

/// `Display` of enums as the configuration spells them (their serde
/// names), for log lines and messages.
macro_rules! display_as_word {
    ($($t:ty),+ $(,)?) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                serde::Serialize::serialize(self, f)
            }
        }
    )+};
}
pub(crate) use display_as_word;

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
    /// `[limits]`: the node defaults and maxima of sandbox resources.
    pub limits: ResourceLimits,
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
    /// `[idle]`: the hibernation ladder (freeze, reclaim) before the idle
    /// timeout's delete.
    pub idle: IdleConfig,
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
            limits: ResourceLimits::default(),
            backend_alias: None,
            native: NativeConfig::default(),
            kubernetes: KubeConfig::default(),
            network: NetworkConfig::default(),
            proxy: ProxyConfig::default(),
            userns: UsernsConfig::default(),
            images: ImagesConfig::default(),
            pool: PoolConfig::default(),
            idle: IdleConfig::default(),
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
    ("SANDBOXD_IDLE_FREEZE_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.idle.freeze_after_seconds, v))),
    ("SANDBOXD_IDLE_RECLAIM_SECONDS", Setter::Parsed(|c, v| parse_into(&mut c.idle.reclaim_after_seconds, v))),
    ("SANDBOXD_IDLE_BUSY_CPU_PERCENT", Setter::Parsed(|c, v| parse_into(&mut c.idle.busy_cpu_percent, v))),
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
    ("SANDBOXD_NETWORK", Setter::Parsed(|c, v| { c.network.mode = parse_word(v.trim()).map_err(|e| format!("network mode {e}"))?; Ok(()) })),
    ("SANDBOXD_POOL_SIZE", Setter::Parsed(|c, v| parse_into(&mut c.pool.size, v))),
    ("SANDBOXD_USERNS", Setter::Parsed(|c, v| { c.userns.mode = UsernsMode::parse_at_key(v.trim())?; Ok(()) })),
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
        c.log_format = parse_word(v).map_err(|e| e.to_string())?;
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
        self.proxy.validate(self.exec_timeout_seconds)?;
        if self.stop_timeout_seconds == 0 {
            return Err(ConfigError::Invalid(
                "stop_timeout_seconds must be at least 1".into(),
            ));
        }
        self.userns.validate()?;
        self.idle.validate()?;
        let allowed: Vec<String> = self
            .images
            .allowed
            .iter()
            .filter_map(|i| crate::images::normalize(i).ok())
            .collect();
        self.pool.validate(&allowed)?;
        self.limits
            .validate()
            .map_err(|m| ConfigError::Invalid(m.into()))
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

/// An environment of `pairs` (the tests of every section).
#[cfg(test)]
pub(crate) fn test_env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `toml` loaded as the configuration file, under the environment `env`
/// (the tests of every section).
#[cfg(test)]
pub(crate) fn load_toml(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, toml).unwrap();
    Config::load(Some(&p), &test_env(env))
}

/// Loading each `(toml, want)` fails with an error that says `want`
/// (tests).
#[cfg(test)]
pub(crate) fn assert_load_errors(cases: &[(&str, &str)]) {
    for (toml, want) in cases {
        let e = load_toml(toml, &[]).unwrap_err().to_string();
        assert!(e.contains(want), "{toml}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_work_without_file() {
        let c = Config::load(None, &test_env(&[])).unwrap();
        assert_eq!(c.backend, BackendKind::Native);
        assert_eq!(c.listen_addr().unwrap().to_string(), "127.0.0.1:8002");
        c.validate().unwrap();
    }

    #[test]
    fn env_wins_over_file() {
        let toml = "backend = \"memory\"\nidle_timeout_seconds = 900\n[limits]\npids = 100\n";
        let c = load_toml(toml, &[("SANDBOX_IDLE_TIMEOUT_SECONDS", "1000")]).unwrap();
        assert_eq!(c.backend, BackendKind::Memory);
        assert_eq!(c.idle_timeout_seconds, 1000);
        assert_eq!(c.limits.pids, 100);
    }

    #[test]
    fn log_format_from_file_env_wins() {
        let toml = "log_format = \"json\"\n";
        let c = load_toml(toml, &[]).unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
        let c = load_toml(toml, &[("SANDBOXD_LOG_FORMAT", "text")]).unwrap();
        assert_eq!(c.log_format, LogFormat::Text);
        let c = load_toml(toml, &[("SANDBOXD_LOG_FORMAT", "journald")]).unwrap();
        assert_eq!(c.log_format, LogFormat::Journald);
        let toml = "log_format = \"journald\"\n";
        let c = load_toml(toml, &[]).unwrap();
        assert_eq!(c.log_format, LogFormat::Journald);
    }

    #[test]
    fn unknown_keys_and_bad_env_are_errors() {
        let toml = "listne = \"x\"\n";
        let e = load_toml(toml, &[]).unwrap_err().to_string();
        assert!(e.contains("listne"), "{e}");
        let e = Config::load(None, &test_env(&[("SANDBOX_IDLE_TIMEOUT_SECONDS", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SANDBOX_IDLE_TIMEOUT_SECONDS"), "{e}");
    }

    #[test]
    fn empty_and_blank_env_values() {
        // Empty counts as unset, except for the token and the booleans.
        let c = Config::load(
            None,
            &test_env(&[
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
            let e = Config::load(None, &test_env(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("environment variable {name}: ")),
                "{e}"
            );
        }
        let c = Config::load(
            None,
            &test_env(&[
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
            &test_env(&[
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
    fn delete_grace_default_file_and_env() {
        assert_eq!(Config::default().delete_grace_seconds, 10);
        let toml = "delete_grace_seconds = 3\n";
        let c = load_toml(toml, &[]).unwrap();
        assert_eq!(c.delete_grace_seconds, 3);
        let c = load_toml(toml, &[("SANDBOXD_DELETE_GRACE_SECONDS", "0")]).unwrap();
        assert_eq!(c.delete_grace_seconds, 0);
        c.validate().unwrap();
        let e = Config::load(
            None,
            &test_env(&[("SANDBOXD_DELETE_GRACE_SECONDS", "soon")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("SANDBOXD_DELETE_GRACE_SECONDS"), "{e}");
    }

    #[test]
    fn stop_timeout_default_file_and_env() {
        assert_eq!(Config::default().stop_timeout_seconds, 60);
        let toml = "stop_timeout_seconds = 40\n";
        let c = load_toml(toml, &[]).unwrap();
        assert_eq!(c.stop_timeout_seconds, 40);
        let c = load_toml(toml, &[("SANDBOXD_STOP_TIMEOUT_SECONDS", "5")]).unwrap();
        assert_eq!(c.stop_timeout_seconds, 5);
        let c = Config::load(None, &test_env(&[("SANDBOXD_STOP_TIMEOUT_SECONDS", "0")])).unwrap();
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

    /// The messages of a bad word: the environment's name the variable,
    /// the value and every valid word; the file's are serde's, but for a
    /// [`KeyWord`] (`userns.rs`, `kube_config.rs`).
    #[test]
    fn bad_words_name_the_key_and_the_words() {
        for (name, value, want) in [
            (
                "PROVISIONER_BACKEND",
                " Podman",
                "unknown backend \"podman\" (expected native, kubernetes or memory)",
            ),
            (
                "SANDBOXD_LOG_FORMAT",
                "JSON",
                "\"JSON\" is not auto, text, json or journald",
            ),
            (
                "SANDBOXD_NETWORK",
                " bridge ",
                "network mode \"bridge\" is not egress or none",
            ),
            (
                "SANDBOXD_USERNS",
                "maybe",
                "userns.mode \"maybe\" is not auto, on or off",
            ),
        ] {
            let e = Config::load(None, &test_env(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert_eq!(e, format!("environment variable {name}: {want}"));
        }
        assert_load_errors(&[
            (
                "backend = \"docker\"\n",
                "unknown variant `docker`, expected one of `native`, `kubernetes`, `memory`",
            ),
            (
                "log_format = \"JSON\"\n",
                "unknown variant `JSON`, expected one of `auto`, `text`, `json`, `journald`",
            ),
            (
                "[network]\nmode = \"bridge\"\n",
                "unknown variant `bridge`, expected `egress` or `none`",
            ),
            (
                "[[pool.extra]]\nnetwork = \"bridge\"\nsize = 1\n",
                "unknown variant `bridge`, expected `egress` or `none`",
            ),
        ]);
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
