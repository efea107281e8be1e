//! The native backend: sandboxes as containers this node builds and starts
//! itself. Per sandbox: a state directory with `state.json` and an OCI
//! bundle, a `sandbox-init` launch, a kept network-namespace fd through
//! which the proxy reaches the agent, and a pidfd on its PID 1 (watched
//! for exits by [`watch`]).
//!
//! This module owns everything under `<state_dir>/sandboxes/` and the
//! per-user directories it creates; it never deletes user files.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use oci_spec::runtime::{LinuxSeccomp, Spec};
use tracing::{info, warn};

use super::{Backend, BackendError, Upstream};
use crate::cgroups::{CgroupRoot, SandboxCgroup};
use crate::config::Config;
use crate::model::{
    new_generation, unix_now, SandboxRecord, SandboxSpec, SandboxStatus, StorageMode,
};
use sandbox_abi::failpoint::{self, Point};

pub mod bundle;
pub mod launch;
pub mod netns;
pub use sandbox_abi::paths;
pub mod proc;
pub mod reconcile;
pub mod state;
mod watch;

use bundle::HostLayout;
use netns::NetnsDialer;
use paths::PathError;
use proc::ProcHandle;
use state::{Phase, SandboxState, StateDir};

/// The seccomp profile every bundle carries: its OCI form for the spec and
/// the verbatim JSON written into `config.json`.
#[derive(Clone)]
pub struct Seccomp {
    pub oci: LinuxSeccomp,
    pub verbatim: serde_json::Value,
}

impl Seccomp {
    /// Loads and compiles the configured (or embedded) profile; any error
    /// stops the daemon's start-up (never a sandbox without its filter).
    pub fn load(path: Option<&Path>) -> Result<Seccomp, BackendError> {
        let (profile, _raw, filters) = crate::seccomp::load_and_compile(path)
            .map_err(|e| internal(format!("seccomp profile: {e}")))?;
        info!(
            profile = %profile.source,
            instructions = ?filters.instruction_counts(),
            "seccomp profile compiled"
        );
        Ok(Seccomp {
            oci: profile.to_oci().map_err(internal)?,
            verbatim: profile.to_oci_value(),
        })
    }
}

/// A running sandbox as the daemon holds it.
struct Live {
    record: SandboxRecord,
    handle: Arc<ProcHandle>,
    netns: Arc<OwnedFd>,
    cgroup: Option<Arc<SandboxCgroup>>,
}

pub struct NativeBackend {
    state: StateDir,
    host: HostLayout,
    base: Spec,
    init_path: PathBuf,
    seccomp: Seccomp,
    cgroups: CgroupRoot,
    dialer: NetnsDialer,
    /// Shared with the exit watchers ([`watch`]).
    live: Arc<Mutex<HashMap<String, Live>>>,
}

fn internal(e: impl std::fmt::Display) -> BackendError {
    BackendError::Internal(e.to_string())
}

/// A binary shipped next to the running `sandboxd`.
fn sibling_binary(name: &str) -> Result<PathBuf, BackendError> {
    let exe = std::env::current_exe().map_err(internal)?;
    let p = exe
        .parent()
        .map(|d| d.join(name))
        .ok_or_else(|| internal("cannot locate the sandboxd binary"))?;
    if p.is_file() {
        Ok(p)
    } else {
        Err(internal(format!(
            "{name} not found at {} (set [native] {}_path)",
            p.display(),
            name.trim_start_matches("sandbox-")
        )))
    }
}

/// Creates (if needed) and canonicalizes an operator-configured root.
fn prepare_root(path: &Path, sub: Option<&str>) -> Result<PathBuf, BackendError> {
    let full = sub
        .map(|s| path.join(s))
        .unwrap_or_else(|| path.to_path_buf());
    std::fs::create_dir_all(&full)
        .map_err(|e| internal(format!("cannot create {}: {e}", full.display())))?;
    std::fs::canonicalize(path).map_err(|e| internal(format!("{}: {e}", path.display())))
}

impl NativeBackend {
    /// Builds the backend from the configuration, then reconciles the
    /// state directory (adopts live sandboxes, cleans up the rest) before
    /// returning, so the API never serves a half-known node.
    pub fn new(cfg: &Config) -> Result<NativeBackend, BackendError> {
        let seccomp = Seccomp::load(cfg.native.seccomp_profile.as_deref())?;
        let agent_path = match &cfg.native.agent_path {
            Some(p) => p.clone(),
            None => sibling_binary("sandbox-agent")?,
        };
        let init_path = match &cfg.native.init_path {
            Some(p) => p.clone(),
            None => sibling_binary("sandbox-init")?,
        };
        let host = HostLayout {
            user_data_root: prepare_root(&cfg.user_data_root, Some("shared"))?,
            skills_root: prepare_root(&cfg.skills_root, None)?,
            agent_path: std::fs::canonicalize(&agent_path)
                .map_err(|e| internal(format!("{}: {e}", agent_path.display())))?,
            rootfs_binds: HostLayout::resolve_binds(&cfg.native),
            container_port: cfg.container_port,
            limits: cfg.limits.clone(),
        };
        let base = bundle::load_base(cfg.native.base_spec.as_deref()).map_err(internal)?;
        let cgroups = CgroupRoot::detect(&cfg.native.cgroup_parent).map_err(internal)?;
        let cgroups = with_device_rules(cgroups, &base);
        move_into_leaf_if_delegated(&cgroups)?;
        let state = StateDir::new(&cfg.state_dir);
        std::fs::create_dir_all(state.root()).map_err(internal)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(state.root(), std::fs::Permissions::from_mode(0o700))
                .map_err(internal)?;
        }
        // Sandboxes are re-parented to us when their launcher exits, so we
        // can reap them (the host's PID 1 may not).
        nix::sys::prctl::set_child_subreaper(true).map_err(internal)?;
        let backend = NativeBackend {
            state,
            host,
            base,
            init_path,
            seccomp,
            cgroups,
            dialer: NetnsDialer::start().map_err(internal)?,
            live: Arc::new(Mutex::new(HashMap::new())),
        };
        backend.reconcile();
        // Cgroups under our parent that no known sandbox owns: kill and
        // remove them (remains of a crash, or of sandboxes removed by hand).
        let known: std::collections::HashSet<String> = backend.live().keys().cloned().collect();
        match backend.cgroups.remove_orphans(&known) {
            Ok(removed) if !removed.is_empty() => {
                info!(?removed, "removed orphan cgroups");
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot remove orphan cgroups"),
        }
        Ok(backend)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tracks a running sandbox and starts watching its PID 1 for an exit.
    fn track(&self, l: Live) {
        let id = l.record.sandbox_id.clone();
        watch::watch(&self.live, &id, &l.record.generation, l.handle.clone());
        self.live().insert(id, l);
    }

    /// Checks and prepares the host paths of a persistent sandbox. Nothing
    /// is created unless every check passed.
    fn prepare_user_paths(&self, spec: &SandboxSpec) -> Result<(), BackendError> {
        if spec.identity.storage == StorageMode::Ephemeral {
            return Ok(());
        }
        let uid = &spec.identity.uid;
        let user_err = |what: &str, e: PathError| {
            if e.is_user_error() {
                BackendError::Invalid(format!("{what}: {e}"))
            } else {
                internal(format!("{what}: {e}"))
            }
        };
        if let Some(w) = &spec.identity.workdir_path {
            let full = self.host.workspace(uid).join(w);
            paths::open_dir_nofollow(&full).map_err(|e| user_err("workdir_path", e))?;
        }
        let rel = sandbox_abi::layout::workspace_rel(uid);
        paths::ensure_user_dirs(&self.host.user_data_root, &rel)
            .map_err(|e| user_err("user data root", e))?;
        paths::ensure_user_dirs(
            &self.host.skills_root,
            &sandbox_abi::layout::native_skills_rel(uid),
        )
        .map_err(|e| user_err("skills root", e))?;
        Ok(())
    }

    /// Writes the bundle a create of `spec` would use into `dir`.
    pub fn write_bundle_to(
        &self,
        spec: &SandboxSpec,
        generation: &str,
        dir: &Path,
    ) -> Result<Spec, BackendError> {
        let cgroup_path = self.cgroups.relative_path(&spec.sandbox_id);
        let oci = bundle::build_spec(
            &self.base,
            spec,
            generation,
            &self.host,
            &dir.join("files"),
            Some(&cgroup_path),
            Some(&self.seccomp.oci),
        )
        .map_err(internal)?;
        bundle::write_bundle(dir, &oci, Some(&self.seccomp.verbatim)).map_err(internal)?;
        Ok(oci)
    }

    /// Kills what a failed or deleted incarnation left (its PID 1, then
    /// every process of its cgroup, which also catches a process whose PID
    /// was never reported), removes the cgroup and the sandbox's
    /// directory, in that order, so a crash part-way leaves the directory
    /// and a restart finishes the job. Never touches user files.
    fn destroy(&self, id: &str, handle: Option<&ProcHandle>) {
        if let Some(h) = handle {
            h.kill();
            if !h.wait_exit(Duration::from_secs(10)) {
                warn!(sandbox_id = %id, pid = h.pid, "sandbox PID 1 did not exit after SIGKILL");
            }
        }
        failpoint::hit(Point::DeleteAfterKill);
        match self.cgroups.open(id) {
            Ok(Some(cg)) => {
                // A PID 1 whose PID was never reported (launch timed out,
                // launcher killed) was re-parented to us: reap it after the
                // kill, or it stays a zombie child of the daemon.
                let me = std::process::id() as i32;
                let ours: Vec<ProcHandle> = cg
                    .pids()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|p| proc::parent(*p) == Some(me))
                    .filter_map(|p| ProcHandle::open(p, None))
                    .collect();
                if let Err(e) = cg.kill_all() {
                    warn!(sandbox_id = %id, error = %e, "cannot kill the sandbox's cgroup");
                }
                for h in &ours {
                    h.wait_exit(Duration::from_secs(1));
                }
                if let Err(e) = cg.remove() {
                    warn!(sandbox_id = %id, error = %e, "cannot remove the sandbox's cgroup");
                }
            }
            Ok(None) => {}
            Err(e) => warn!(sandbox_id = %id, error = %e, "cannot open the sandbox's cgroup"),
        }
        failpoint::hit(Point::DeleteAfterCgroup);
        if let Err(e) = self.state.remove(id) {
            warn!(sandbox_id = %id, error = %e, "cannot remove sandbox directory");
        }
    }

    fn blocking_create(
        &self,
        spec: &SandboxSpec,
        timeout: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        let id = spec.sandbox_id.clone();
        self.prepare_user_paths(spec)?;
        let generation = new_generation();
        let dir = self.state.sandbox_dir(&id);
        // A leftover directory of a dead incarnation (nothing live owns
        // it: the lifecycle deleted any live one first).
        self.state.remove(&id).map_err(internal)?;
        std::fs::create_dir_all(&dir).map_err(internal)?;
        let mut st = SandboxState {
            sandbox_id: id.clone(),
            generation: generation.clone(),
            identity: spec.identity.clone(),
            phase: Phase::Creating,
            pid: None,
            start_time: None,
            cgroup: None,
            resources: spec.resources,
            created_at: unix_now(),
        };
        let fail = |e: BackendError, handle: Option<&ProcHandle>| {
            self.destroy(&id, handle);
            e
        };
        if let Err(e) = self.state.save(&st) {
            return Err(fail(internal(e), None));
        }
        failpoint::hit(Point::CreateAfterState);
        let cgroup = match self.cgroups.create(&id, &spec.resources) {
            Ok(cg) => cg,
            Err(e) => return Err(fail(internal(e), None)),
        };
        st.cgroup = Some(self.cgroups.relative_path(&id).display().to_string());
        if let Err(e) = self.state.save(&st) {
            return Err(fail(internal(e), None));
        }
        failpoint::hit(Point::CreateAfterCgroup);
        let bundle_dir = self.state.bundle_dir(&id);
        if let Err(e) = self.write_bundle_to(spec, &generation, &bundle_dir) {
            return Err(fail(e, None));
        }
        failpoint::hit(Point::CreateAfterBundle);
        let mut handle = None;
        let mut save_err = None;
        let r = launch::launch(
            &self.init_path,
            &bundle_dir,
            &self.state.log_path(&id),
            timeout,
            &mut |pid| {
                // Record the PID (and its start time) at once, before
                // waiting for readiness: a crash from here on leaves a
                // state.json naming the live process.
                handle = ProcHandle::open(pid, None);
                if let Some(h) = &handle {
                    st.pid = Some(pid);
                    st.start_time = Some(h.start_time);
                    if let Err(e) = self.state.save(&st) {
                        save_err = Some(e);
                    }
                    failpoint::hit(Point::CreateAfterPid);
                } else {
                    // It already exited: collect it, or it stays a zombie.
                    proc::reap_if_zombie(pid);
                }
            },
        );
        if let Some(e) = save_err {
            return Err(fail(internal(e), handle.as_ref()));
        }
        let pid = match r {
            Ok(l) => l.pid,
            Err(e) => {
                let err = match e {
                    launch::LaunchError::Timeout(t) => BackendError::HealthTimeout(t),
                    e => internal(e),
                };
                return Err(fail(err, handle.as_ref()));
            }
        };
        let Some(handle) = handle else {
            return Err(fail(
                internal("sandbox exited right after it started"),
                None,
            ));
        };
        let netns = match netns::open_netns(pid) {
            Ok(fd) => Arc::new(fd),
            Err(e) => return Err(fail(internal(format!("open netns: {e}")), Some(&handle))),
        };
        failpoint::hit(Point::CreateAfterLaunch);
        st.phase = Phase::Running;
        st.pid = Some(pid);
        st.start_time = Some(handle.start_time);
        if let Err(e) = self.state.save(&st) {
            return Err(fail(internal(e), Some(&handle)));
        }
        failpoint::hit(Point::CreateAfterRunning);
        let record = record_of(&st, SandboxStatus::Running);
        self.track(Live {
            record: record.clone(),
            handle: Arc::new(handle),
            netns,
            cgroup: Some(Arc::new(cgroup)),
        });
        Ok(record)
    }

    fn blocking_delete(&self, id: &str, generation: &str) -> Result<(), BackendError> {
        let live = self.live().remove(id);
        match live {
            Some(l) if l.record.generation != generation => {
                self.live().insert(id.to_string(), l);
                Err(BackendError::Conflict(format!(
                    "sandbox {id} is at another generation"
                )))
            }
            Some(l) => {
                if let Ok(Some(mut st)) = self.state.load(id) {
                    st.phase = Phase::Deleting;
                    let _ = self.state.save(&st);
                }
                failpoint::hit(Point::DeleteAfterState);
                self.destroy(id, Some(&l.handle));
                info!(sandbox_id = %id, pid = l.handle.pid, "sandbox destroyed");
                Ok(())
            }
            None => {
                // Not live: remove remains of this generation, if any.
                match self.state.load(id) {
                    Ok(Some(st)) if st.generation != generation => Ok(()),
                    _ => {
                        self.destroy(id, None);
                        Ok(())
                    }
                }
            }
        }
    }
}

/// The base spec's device allow-list (`linux.resources.devices`) for every
/// sandbox's cgroup. Enforced on v1 and hybrid hosts; on pure v2 (no BPF
/// device program yet) and without a list, said loudly at start-up.
fn with_device_rules(cgroups: CgroupRoot, base: &Spec) -> CgroupRoot {
    let rules = base
        .linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.devices().clone());
    let Some(rules) = rules else {
        warn!("the base spec has no linux.resources.devices: sandboxes keep the device access of the cgroup parent");
        return cgroups;
    };
    if cgroups.enforces_devices() {
        info!(
            rules = rules.len(),
            "device allow-list enforced by the devices cgroup"
        );
    } else {
        warn!(
            layout = %cgroups.layout(),
            "device allow-list NOT enforced: cgroup v2 needs a BPF device program, which sandboxd does not attach (see docs/security.md)"
        );
    }
    cgroups.with_device_rules(rules)
}

/// cgroup v2 forbids processes in a cgroup whose controllers are enabled
/// for its children. When the sandboxes' parent lies inside the daemon's
/// own cgroup (systemd `Delegate=yes` with `cgroup_parent` under the
/// service's cgroup), the daemon first moves itself into a `daemon` leaf.
fn move_into_leaf_if_delegated(cgroups: &CgroupRoot) -> Result<(), BackendError> {
    if cgroups.layout() != crate::cgroups::Layout::V2 {
        return Ok(());
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(own) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Ok(());
    };
    let parent = cgroups.relative_path("x");
    let parent = parent.parent().unwrap_or(Path::new("/"));
    if own != "/" && parent.starts_with(own) {
        let service = crate::cgroups::move_self_to_leaf(cgroups, "daemon").map_err(internal)?;
        info!(
            ?service,
            "moved the daemon into the leaf cgroup `daemon` of its delegated subtree"
        );
    }
    Ok(())
}

fn record_of(st: &SandboxState, status: SandboxStatus) -> SandboxRecord {
    SandboxRecord {
        sandbox_id: st.sandbox_id.clone(),
        generation: st.generation.clone(),
        identity: st.identity.clone(),
        status,
        created_at: st.created_at,
        oom_killed: None,
    }
}

/// Runs blocking backend work off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| internal(format!("worker failed: {e}")))?
}

/// The backend is shared as `Arc<NativeBackend>`; the trait is implemented
/// on a thin wrapper so blocking work can own a reference.
pub struct Native(pub Arc<NativeBackend>);

#[async_trait]
impl Backend for Native {
    fn name(&self) -> &'static str {
        "native"
    }

    async fn create(
        &self,
        spec: &SandboxSpec,
        health_timeout: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        let b = self.0.clone();
        let spec = spec.clone();
        blocking(move || b.blocking_create(&spec, health_timeout)).await
    }

    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError> {
        Ok(self
            .0
            .live()
            .values()
            .map(|l| {
                let mut r = l.record.clone();
                if l.handle.exited() {
                    r.status = SandboxStatus::Exited;
                }
                r
            })
            .collect())
    }

    async fn status(&self, record: &SandboxRecord) -> SandboxStatus {
        match self.0.live().get(&record.sandbox_id) {
            Some(l) if l.record.generation == record.generation && !l.handle.exited() => {
                SandboxStatus::Running
            }
            _ => SandboxStatus::Exited,
        }
    }

    async fn refresh(&self, record: &SandboxRecord) -> SandboxRecord {
        let mut r = record.clone();
        r.status = self.status(record).await;
        if let Some(l) = self.0.live().get(&record.sandbox_id) {
            if l.record.generation == record.generation {
                if let Some(cg) = &l.cgroup {
                    if cg.oom_kills() > 0 {
                        r.oom_killed = Some(true);
                    }
                }
            }
        }
        r
    }

    async fn delete(&self, sandbox_id: &str, generation: &str) -> Result<(), BackendError> {
        let b = self.0.clone();
        let (id, g) = (sandbox_id.to_string(), generation.to_string());
        blocking(move || b.blocking_delete(&id, &g)).await
    }

    async fn connect(&self, record: &SandboxRecord) -> Result<Upstream, BackendError> {
        let netns = match self.0.live().get(&record.sandbox_id) {
            Some(l) if l.record.generation == record.generation => l.netns.clone(),
            _ => {
                return Err(BackendError::Unreachable(format!(
                    "sandbox {} is not running",
                    record.sandbox_id
                )))
            }
        };
        let addr = SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::LOCALHOST,
            self.0.host.container_port,
        ));
        let stream = self
            .0
            .dialer
            .connect(netns, addr)
            .await
            .map_err(|e| BackendError::Unreachable(e.to_string()))?;
        Ok(Upstream { stream })
    }
}
