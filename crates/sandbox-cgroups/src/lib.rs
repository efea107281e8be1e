//! Per-sandbox cgroups: resource limits, OOM reporting and whole-sandbox kill.
//!
//! Owns one cgroup per sandbox under a configured parent (`/sandboxd/<id>` by
//! default, or a subtree delegated by systemd) on cgroup v1, v2 and the hybrid
//! layout (v1 controllers plus an empty cgroup2 mount: handled exactly like v1).
//!
//! `libcgroups` does the heavy lifting (applying limits, attaching tasks,
//! removal, pid listing). This module adds what it lacks: layout
//! detection that also works on a fake tree, creating the cgroup before any
//! task joins it, `memory.swap.max = 0` on v2, `cgroup.kill`, OOM counters,
//! reading limits back, listing/removing orphans, and the device allow-list
//! ([`devices`]: the v1 devices controller, or on v2 a BPF device program
//! of our own, [`bpf`]; libcgroups' own v1 devices code always adds runc's
//! defaults, such as `mknod` of any device and `/dev/net/tun`, and its v2
//! one is behind a feature that links libbpf).
//!
//! It must not touch anything outside the parent cgroup, except enabling
//! controllers in the ancestors' `cgroup.subtree_control` (v2) and moving the
//! daemon itself into a leaf ([`move_self_to_leaf`]).

pub mod bpf;
pub mod devices;
mod files;
mod layout;
mod leaf;
mod root;
mod sandbox;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use layout::{parse_layout, Layout, Mounts};
pub use leaf::{move_self_to_leaf, move_self_to_leaf_if_delegated};
pub use root::{CgroupParent, CgroupRoot};
pub use sandbox::{MemoryUsage, Reclaim, SandboxCgroup, FREEZE_TIMEOUT};

use oci_spec::runtime::{LinuxCpuBuilder, LinuxMemoryBuilder, LinuxPidsBuilder, LinuxResources};
use sandbox_abi::model::Resources;

/// Where cgroup filesystems are mounted on every supported host.
pub const DEFAULT_FS_ROOT: &str = "/sys/fs/cgroup";
/// CFS period used for the CPU quota (100 ms, the kernel default).
pub const CPU_PERIOD_USEC: u64 = 100_000;
/// Smallest quota the kernel accepts (1 ms).
const MIN_CPU_QUOTA_USEC: u64 = 1_000;

/// Errors of the cgroup module: one variant per failing step.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path} to detect the cgroup layout: {source}")]
    DetectLayout {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no cgroup filesystem is mounted under {path}")]
    NoCgroupFs { path: PathBuf },
    #[error("invalid sandbox id {id:?} for a cgroup name")]
    BadId { id: String },
    #[error("invalid cgroup parent {parent:?}: {reason}")]
    BadParent {
        parent: String,
        reason: &'static str,
    },
    #[error("cannot create cgroup {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot enable controllers {controllers} in {path} (v2 forbids processes in a cgroup with enabled controllers: is the daemon in a leaf?): {source}")]
    EnableControllers {
        path: PathBuf,
        controllers: String,
        source: std::io::Error,
    },
    #[error("controller {controller} is not available in {path} (not delegated, or bound to another hierarchy)")]
    MissingController { controller: String, path: PathBuf },
    #[error("cgroup of sandbox {id} already exists at {path} and holds processes")]
    Busy { id: String, path: PathBuf },
    #[error("cannot build the resource spec of sandbox {id}: {source}")]
    BuildSpec {
        id: String,
        source: oci_spec::OciSpecError,
    },
    #[error("cannot set up the cgroup manager of sandbox {id}: {source}")]
    Manager {
        id: String,
        source: Box<libcgroups::common::AnyManagerError>,
    },
    #[error("cannot apply limits to the cgroup of sandbox {id}: {source}")]
    Apply {
        id: String,
        source: Box<libcgroups::common::AnyManagerError>,
    },
    #[error("cannot move pid {pid} into the cgroup of sandbox {id}: {source}")]
    AddTask {
        id: String,
        pid: i32,
        source: Box<libcgroups::common::AnyManagerError>,
    },
    #[error("cannot list the pids of sandbox {id}: {source}")]
    ListPids {
        id: String,
        source: Box<libcgroups::common::AnyManagerError>,
    },
    #[error("cannot kill pid {pid} of sandbox {id}: {source}")]
    Kill {
        id: String,
        pid: i32,
        source: nix::errno::Errno,
    },
    #[error("{remaining} process(es) of sandbox {id} still alive after the kill")]
    KillTimeout { id: String, remaining: usize },
    #[error("cannot remove the cgroup of sandbox {id}: {source}")]
    Remove {
        id: String,
        source: Box<libcgroups::common::AnyManagerError>,
    },
    #[error("cgroup {path} still exists after removal")]
    StillPresent { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot remove cgroup {path}: {source}")]
    RemoveDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {value:?} to {path}: {source}")]
    WriteFile {
        path: PathBuf,
        value: String,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: unexpected content {content:?}")]
    Parse { path: PathBuf, content: String },
    #[error(
        "{op} needs libcgroups' v1 manager, which only works on {DEFAULT_FS_ROOT} (root is {root})"
    )]
    V1NeedsRealRoot { op: &'static str, root: PathBuf },
    #[error("invalid device rule {rule:?} in linux.resources.devices: {reason}")]
    BadDeviceRule { rule: String, reason: &'static str },
    #[error("device allow-list: {0}")]
    DeviceProgram(Box<bpf::BpfError>),
    #[error(
        "the cgroup parent {parent} lies inside {service}, the cgroup systemd started this service in: \
         once a sandbox lives there, systemd cannot start the daemon in {service} again (a restart fails with \
         status=219/CGROUP, \"Failed to attach to cgroup ...: Device or resource busy\"). Use a parent outside \
         the unit (the default, sandboxd), or with systemd 254 or later add DelegateSubgroup=daemon to the unit \
         (a drop-in), so systemd starts the daemon in the leaf {service}/daemon (docs/operations.md)"
    )]
    DelegatedWithoutSubgroup { service: PathBuf, parent: PathBuf },
    #[error("cannot move the daemon into leaf cgroup {path}: {source}")]
    MoveSelf {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Limits as read back from the cgroup files (`None` = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppliedLimits {
    /// v2 `memory.max`, v1 `memory.limit_in_bytes`.
    pub memory_max_bytes: Option<u64>,
    /// v2 `memory.swap.max`; v1 `memory.memsw.limit_in_bytes` minus the
    /// memory limit. `None` when unlimited or swap is not accounted.
    pub swap_max_bytes: Option<u64>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// v2 `cpu.max` quota, v1 `cpu.cfs_quota_us`.
    pub cpu_quota_usec: Option<u64>,
    /// v2 `cpu.max` period, v1 `cpu.cfs_period_us`.
    pub cpu_period_usec: u64,
}

/// CPU quota in microseconds per [`CPU_PERIOD_USEC`] for `cpus` CPUs, or
/// `None` (no quota) when `cpus` is not a positive finite number.
pub fn cpu_quota_usec(cpus: f64) -> Option<u64> {
    if !cpus.is_finite() || cpus <= 0.0 {
        return None;
    }
    let quota = (cpus * CPU_PERIOD_USEC as f64).round() as u64;
    Some(quota.max(MIN_CPU_QUOTA_USEC))
}

/// The OCI `linux.resources` of a sandbox: `base` with its memory, pids and
/// CPU sections replaced by the sandbox's limits (anything else in `base`,
/// e.g. a bundle's device allow-list, is kept). Memory: the limit, and
/// memory+swap equal to it when `swap_limit` is set (i.e. no swap). Pids:
/// the limit. CPU: the quota per [`CPU_PERIOD_USEC`] ([`cpu_quota_usec`]).
/// A zero value means "no limit" and leaves its section out.
///
/// The one builder of these limits: the daemon applies them to the
/// sandbox's cgroup with it (on an empty base), and the bundle builder
/// writes its result into every `config.json` (`swap_limit` set).
pub fn oci_resources(
    mut base: LinuxResources,
    res: &Resources,
    swap_limit: bool,
) -> Result<LinuxResources, oci_spec::OciSpecError> {
    let memory = if res.memory_mb > 0 {
        let bytes = i64::try_from(res.memory_mb.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
        let mut mem = LinuxMemoryBuilder::default().limit(bytes);
        if swap_limit {
            mem = mem.swap(bytes);
        }
        Some(mem.build()?)
    } else {
        None
    };
    let pids = if res.pids > 0 {
        let pids = i64::try_from(res.pids).unwrap_or(i64::MAX);
        Some(LinuxPidsBuilder::default().limit(pids).build()?)
    } else {
        None
    };
    let cpu = match cpu_quota_usec(res.cpus) {
        Some(quota) => Some(
            LinuxCpuBuilder::default()
                .quota(i64::try_from(quota).unwrap_or(i64::MAX))
                .period(CPU_PERIOD_USEC)
                .build()?,
        ),
        None => None,
    };
    base.set_memory(memory).set_pids(pids).set_cpu(cpu);
    Ok(base)
}
