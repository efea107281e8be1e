//! The native backend: sandboxes as containers this node builds and starts
//! itself. Per sandbox: a state directory with `state.json` and an OCI
//! bundle, a `sandbox-init` launch, a kept network-namespace fd through
//! which the proxy reaches the agent, and a pidfd on its PID 1 (watched
//! for exits by [`watch`], which cleans up at once what an exited sandbox
//! no longer needs).
//!
//! This module owns everything under `<state_dir>/sandboxes/` and the
//! per-user directories it creates; it never deletes user files.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tracing::{info, warn};

use super::{
    Backend, BackendError, BackendMetrics, IdleSample, NetworkMetrics, ReclaimOutcome, Running,
    SandboxNetwork, SandboxRef, SwapInfo, Upstream,
};
use crate::cgroups::{CgroupRoot, SandboxCgroup};
use crate::config::Config;
use crate::model::{IdleMark, IdleState, NetworkMode, SandboxRecord, SandboxSpec, SandboxStatus};
use sandbox_abi::failpoint::{self, Point};

pub mod bundle;
mod bundler;
mod config;
mod create;
mod error;
pub mod etc;
pub mod hibernate;
pub mod host;
pub mod launch;
mod listing;
pub mod net;
pub mod netns;
mod oom;
pub mod output;
mod pool;
pub use sandbox_abi::paths;
pub mod proc;
pub mod reconcile;
mod rootfs;
pub mod state;
pub mod userns;
mod watch;

pub use bundler::{Bundler, HostPaths, Seccomp};
pub use config::NativeConfig;
pub use error::NativeError;
use netns::NetnsDialer;
pub use pool::{PoolConfig, PoolVariant};
use proc::ProcHandle;
use state::{Phase, SandboxState, StateDir};

/// A sandbox as the daemon holds it, from its create (or adoption) until
/// it is deleted.
struct Live {
    record: SandboxRecord,
    handle: Arc<ProcHandle>,
    /// Dropped when PID 1 exits.
    netns: Option<Arc<OwnedFd>>,
    /// Taken (and the cgroup removed) when PID 1 exits.
    cgroup: Option<Arc<SandboxCgroup>>,
    /// Its veth and address (egress only).
    net: Option<net::NetState>,
    /// The name of its cgroup under the parent: its id, or the key it had
    /// as a warm-pool member ([`pool`]).
    cgroup_key: String,
    /// Held by the exit watcher while it cleans up after an exit; a delete
    /// of this incarnation takes it before anything else, so the cleanup
    /// (by id: cgroup, bundle) is over before a new incarnation can exist.
    teardown: Arc<Mutex<()>>,
    /// Its steps on the hibernation ladder and its wakes ([`hibernate`]).
    steps: Arc<hibernate::Steps>,
}

impl Live {
    fn new(
        record: SandboxRecord,
        handle: Arc<ProcHandle>,
        netns: Arc<OwnedFd>,
        cgroup: Option<SandboxCgroup>,
        net: Option<net::NetState>,
        cgroup_key: String,
    ) -> Live {
        Live {
            record,
            handle,
            netns: Some(netns),
            cgroup: cgroup.map(Arc::new),
            net,
            cgroup_key,
            teardown: Arc::default(),
            steps: Arc::default(),
        }
    }
}

/// The native backend, in three parts with one owner each: the
/// sandboxes (their table and what making, checking and tearing one down
/// needs), the network (veths, addresses, nftables: [`net`]) and the warm
/// pool ([`pool`]). Cheap to clone, and every clone is the same backend:
/// blocking work runs on a clone moved to a blocking thread.
#[derive(Clone)]
pub struct NativeBackend {
    sandboxes: Arc<Sandboxes>,
    /// Veths, addresses and the nftables table ([`net`]).
    net: Arc<net::Network>,
    /// The warm pool ([`pool`]).
    pool: Arc<pool::Pool>,
}

/// The sandboxes' part of the backend: the table of live sandboxes (the
/// records it owns) and what a create, a check and a teardown use.
struct Sandboxes {
    state: StateDir,
    bundler: Bundler,
    init_path: PathBuf,
    cgroups: Arc<CgroupRoot>,
    dialer: NetnsDialer,
    /// The records, shared with the exit watchers ([`watch`]).
    live: Arc<watch::LiveMap>,
    /// PID 1's output per sandbox ([`output`]).
    outputs: output::Outputs,
    /// The host id ranges of the sandboxes' user namespaces, when
    /// `[userns]` is on ([`userns`]).
    userns: Option<userns::Pool>,
    /// The image store and pulls ([`crate::images`]).
    images: Arc<crate::images::Images>,
    /// How long a start may take until the agent listens.
    health_timeout: Duration,
    /// The node's default limits (what a pool member starts with).
    default_resources: crate::model::Resources,
    /// When list reads the sandboxes' OOM counters ([`oom`]).
    oom: oom::Gate,
}

impl NativeBackend {
    /// Builds the backend from the configuration, then reconciles the
    /// state directory (adopts live sandboxes, cleans up the rest) before
    /// returning, so the API never serves a half-known node.
    pub fn new(cfg: &Config) -> Result<NativeBackend, NativeError> {
        let mut bundler = Bundler::new(cfg, HostPaths::Prepare)?;
        let init_path = match &cfg.native.init_path {
            Some(p) => p.clone(),
            None => bundler::sibling_binary("sandbox-init", HostPaths::Prepare)?,
        };
        let cgroups = CgroupRoot::detect(&cfg.native.cgroup_parent)?;
        info!(
            layout = %cgroups.layout(),
            parent = %cfg.native.cgroup_parent,
            "cgroup layout detected"
        );
        let cgroups = cgroups.with_spec_device_rules(bundler.base());
        bundler.set_device_rules_enforced(cgroups.enforces_devices());
        if let Some(service) = crate::cgroups::move_self_to_leaf_if_delegated(&cgroups, "daemon")? {
            info!(
                ?service,
                "moved the daemon into the leaf cgroup `daemon` of its delegated subtree"
            );
        }
        let state = StateDir::new(&cfg.state_dir);
        let root = state.root().to_path_buf();
        std::fs::create_dir_all(&root).map_err(|source| NativeError::CreateStateDir {
            path: root.clone(),
            source,
        })?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
                .map_err(|source| NativeError::StateDirMode { path: root, source })?;
        }
        // Sandboxes are re-parented to us when their launcher exits, so we
        // can reap them (the host's PID 1 may not).
        nix::sys::prctl::set_child_subreaper(true).map_err(NativeError::Subreaper)?;
        // User namespaces: on when the probe mount of every path bound in
        // from the host works (or `[userns] mode` says otherwise).
        let mut probe_paths = vec![
            bundler.host().user_data_root.clone(),
            bundler.host().skills_root.clone(),
            bundler.host().agent_path.clone(),
            state.root().to_path_buf(),
        ];
        probe_paths.extend(
            bundler
                .host()
                .rootfs_binds
                .iter()
                .map(|(src, _)| src.clone()),
        );
        probe_paths.extend(bundler.prepared_etc());
        let userns = userns::decide(&cfg.userns, &init_path, &probe_paths)?;
        host::tune(Path::new(host::INOTIFY_INSTANCES));
        host::raise_nofile();
        let network = net::Network::new(&cfg.network)?;
        let images = crate::images::Images::new(cfg, bundler.base())
            .map_err(|e| NativeError::ImageStore(format!("{e:#}")))?;
        let backend = NativeBackend {
            sandboxes: Arc::new(Sandboxes {
                state,
                bundler,
                init_path,
                cgroups: Arc::new(cgroups),
                dialer: NetnsDialer::start().map_err(NativeError::NetnsHelper)?,
                live: Arc::default(),
                outputs: output::Outputs::default(),
                userns,
                images: Arc::new(images),
                health_timeout: Duration::from_secs(cfg.health_timeout_seconds),
                default_resources: crate::model::Resources {
                    memory_mb: cfg.limits.memory_mb,
                    cpus: cfg.limits.cpus,
                    pids: cfg.limits.pids,
                },
                oom: oom::Gate::new(),
            }),
            net: Arc::new(network),
            pool: Arc::new(pool::Pool::new(&cfg.pool, &cfg.state_dir)),
        };
        backend.reconcile();
        // The table from the adopted sandboxes; stale veths deleted.
        backend.net.finish_startup()?;
        // Cgroups under our parent that no known sandbox owns: kill and
        // remove them (remains of a crash, or of sandboxes removed by hand).
        let known: std::collections::HashSet<String> = backend
            .live()
            .values()
            .map(|l| l.cgroup_key.clone())
            .collect();
        backend.pool.start(&known)?;
        match backend.sandboxes.cgroups.remove_orphans(&known) {
            Ok(removed) if !removed.is_empty() => {
                info!(?removed, "removed orphan cgroups");
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot remove orphan cgroups"),
        }
        Ok(backend)
    }

    /// Starts the background pull of the default image when it is missing
    /// (the daemon serves meanwhile; see [`crate::images`]).
    pub fn start_image_pull(&self) {
        self.sandboxes.images.start_default_pull();
    }

    /// Whether the daemon is shutting down.
    fn quiescing(&self) -> bool {
        self.pool.closing()
    }

    fn live(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Live>> {
        self.sandboxes.live.lock()
    }

    /// Tracks a running sandbox and starts watching its PID 1 for an exit
    /// (tracked first, so an exit that is already there is noticed).
    fn track(&self, l: Live) {
        let id = l.record.sandbox_id.clone();
        let (generation, handle) = (l.record.generation.clone(), l.handle.clone());
        self.sandboxes.live.lock().insert(id.clone(), l);
        oom::check(&self.sandboxes.live, &id, &generation);
        let cleanup = watch::Cleanup {
            cgroups: self.sandboxes.cgroups.clone(),
            state: self.sandboxes.state.clone(),
        };
        watch::watch(&self.sandboxes.live, cleanup, &id, &generation, handle);
    }

    /// Kills what a failed or deleted incarnation left (its PID 1, then
    /// every process of its cgroup, which also catches a process whose PID
    /// was never reported), removes the cgroup and the sandbox's
    /// directory, in that order, so a crash part-way leaves the directory
    /// and a restart finishes the job. Never touches user files.
    fn destroy(&self, id: &str, handle: Option<&ProcHandle>) {
        self.sandboxes.outputs.remove(id);
        let cgroup_key = self.cgroup_key(id);
        // A frozen sandbox (hibernation) takes no signal until it is
        // thawed (v1), and thawed first it would run again: every process
        // of it is killed while frozen, then thawed (v2: `cgroup.kill`),
        // so its delete takes no longer than an active one's.
        if let Ok(Some(cg)) = self.sandboxes.cgroups.open(&cgroup_key) {
            if cg.is_frozen().unwrap_or(false) {
                if let Err(e) = cg.kill_all() {
                    warn!(sandbox_id = %id, error = %e, "cannot kill the frozen sandbox's cgroup");
                }
                let _ = cg.thaw();
            }
        }
        if let Some(h) = handle {
            h.kill();
            if !h.wait_exit(Duration::from_secs(10)) {
                warn!(sandbox_id = %id, pid = h.pid, "sandbox PID 1 did not exit after SIGKILL");
            }
        }
        failpoint::hit(Point::DeleteAfterKill);
        kill_and_remove_cgroup(&self.sandboxes.cgroups, &cgroup_key);
        failpoint::hit(Point::DeleteAfterCgroup);
        // Its set element and veth (a crash before this point leaves them
        // to the next start-up's rebuild and sweep).
        self.net.detach(id);
        // A pool member's attach points (also once claimed: they hold the
        // user's mounts inside until nothing of the sandbox runs).
        if crate::model::is_pool_key(&cgroup_key) {
            self.pool.remove_slot(&cgroup_key);
        }
        if let Err(e) = self.sandboxes.state.remove(id) {
            warn!(sandbox_id = %id, error = %e, "cannot remove sandbox directory");
        }
        // Its host ids: nothing of it runs any more.
        if let Some(range) = self.sandboxes.userns.as_ref().and_then(|pool| {
            let r = pool.get(id);
            pool.release(id);
            r
        }) {
            info!(sandbox_id = %id, host = range.host, "user namespace range released");
        }
    }

    /// The name of the cgroup of `id`: recorded in its `state.json` (a
    /// claimed pool member keeps the cgroup it had as a member), else its id.
    fn cgroup_key(&self, id: &str) -> String {
        self.sandboxes
            .state
            .load(id)
            .ok()
            .flatten()
            .and_then(|st| st.cgroup_key())
            .unwrap_or_else(|| id.to_string())
    }

    /// Egress drops and bytes per sandbox, when egress is on.
    fn network_metrics(&self) -> Option<NetworkMetrics> {
        if self.net.mode() == NetworkMode::None {
            return None;
        }
        let links: Vec<(String, String)> = self
            .live()
            .iter()
            .filter_map(|(id, l)| Some((id.clone(), l.net.as_ref()?.link.clone())))
            .collect();
        let bytes = links
            .into_iter()
            .filter_map(|(id, link)| {
                let (sent, received) = self.net.bytes(&link)?;
                Some((id, sent, received))
            })
            .collect();
        Some(NetworkMetrics {
            dropped: self.net.drop_counters(),
            bytes,
        })
    }

    fn blocking_delete(&self, id: &str, generation: &str) -> Result<(), NativeError> {
        let live = self.sandboxes.live.lock().remove(id);
        match live {
            Some(l) if l.record.generation != generation => {
                self.sandboxes.live.lock().insert(id.to_string(), l);
                Err(NativeError::OtherGeneration { id: id.to_string() })
            }
            Some(l) => {
                // An exit cleanup of this incarnation still running ends
                // first (it no longer finds the record and stops).
                let _teardown = l.teardown.lock().unwrap_or_else(|e| e.into_inner());
                // After (and instead of) a pending record of a wake.
                l.steps.record.write_latest(|| {
                    if let Ok(Some(mut st)) = self.sandboxes.state.load(id) {
                        st.phase = Phase::Deleting;
                        let _ = self.sandboxes.state.update(&st);
                    }
                });
                failpoint::hit(Point::DeleteAfterState);
                self.destroy(id, Some(&l.handle));
                info!(sandbox_id = %id, pid = l.handle.pid, "sandbox destroyed");
                Ok(())
            }
            None => {
                // Not live: remove remains of this generation, if any.
                match self.sandboxes.state.load(id) {
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

/// Kills whatever is left in the cgroup of `id` and removes it. A PID 1
/// whose PID was never reported (launch timed out, launcher killed) was
/// re-parented to us: it is reaped after the kill, or it would stay a
/// zombie child of the daemon.
fn kill_and_remove_cgroup(cgroups: &CgroupRoot, id: &str) {
    match cgroups.open(id) {
        Ok(Some(cg)) => {
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
}

fn record_of(st: &SandboxState, status: SandboxStatus) -> SandboxRecord {
    SandboxRecord {
        sandbox_id: st.sandbox_id.clone(),
        generation: st.generation.clone(),
        identity: st.identity.clone(),
        status,
        created_at: st.created_at,
        oom_killed: None,
        // Active from now on, unless recorded asleep (an adopted one).
        idle: Some(st.idle.unwrap_or_else(|| IdleMark::now(IdleState::Active))),
    }
}

/// Runs blocking backend work off the async runtime, inside the caller's
/// span (a create's or delete's `sandbox_id` and `generation`).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, NativeError> + Send + 'static,
) -> Result<T, NativeError> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f)).await?
}

#[async_trait]
impl Backend for NativeBackend {
    fn name(&self) -> &'static str {
        "native"
    }

    fn logs(&self, sandbox_id: &str) -> Option<String> {
        self.sandboxes.outputs.get(sandbox_id).map(|o| o.render())
    }

    fn network(&self, sandbox_id: &str) -> Option<SandboxNetwork> {
        let live = self.live();
        let l = live.get(sandbox_id)?;
        Some(match &l.net {
            Some(n) => SandboxNetwork {
                mode: NetworkMode::Egress,
                address: Some(n.address),
                gateway: Some(n.gateway),
                link: Some(n.link.clone()),
            },
            None => SandboxNetwork {
                mode: NetworkMode::None,
                address: None,
                gateway: None,
                link: None,
            },
        })
    }

    fn metrics(&self) -> BackendMetrics {
        BackendMetrics {
            #[cfg(feature = "images")]
            images: Some(self.sandboxes.images.stats()),
            #[cfg(not(feature = "images"))]
            images: None,
            pool: Some(self.pool.stats()),
            network: self.network_metrics(),
        }
    }

    fn egress(&self) -> Option<(&'static str, u64)> {
        self.net.egress_health().map(|(h, n)| (h.as_str(), n))
    }

    fn can_freeze(&self) -> bool {
        true
    }

    fn swap(&self) -> Option<SwapInfo> {
        Some(hibernate::swap_info())
    }

    async fn idle(&self, sandboxes: &[SandboxRef]) -> Vec<Option<IdleSample>> {
        let (b, sandboxes) = (self.clone(), sandboxes.to_vec());
        let n = sandboxes.len();
        blocking(move || Ok(b.idle_samples(&sandboxes)))
            .await
            .unwrap_or_else(|_| vec![None; n])
    }

    async fn freeze(&self, sandbox: &SandboxRef) -> Result<(), BackendError> {
        Ok(self.freeze_sandbox(sandbox).await?)
    }

    async fn reclaim(&self, sandbox: &SandboxRef) -> Result<ReclaimOutcome, BackendError> {
        Ok(self.reclaim_sandbox(sandbox).await?)
    }

    async fn wake(&self, sandbox: &SandboxRef) -> Result<Option<IdleState>, BackendError> {
        Ok(self.wake_sandbox(sandbox).await?)
    }

    async fn create(
        &self,
        spec: &SandboxSpec,
        health_timeout: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        // The sandbox's image first (pulled if missing; waited for at most
        // the health timeout), then everything else on a blocking thread.
        let image = self
            .sandboxes
            .images
            .resolve(spec.identity.image.as_deref(), health_timeout)
            .await
            .map_err(NativeError::ImageUnavailable)?;
        // A warm-pool member when one fits, else a cold start.
        if let Some(record) = self.claim(spec, image.as_ref()).await? {
            return Ok(record);
        }
        let b = self.clone();
        let spec = spec.clone();
        Ok(blocking(move || b.blocking_create(&spec, health_timeout, image.as_ref())).await?)
    }

    async fn shutdown(&self) {
        self.pool.close();
        // Members being started destroy themselves once started (they see
        // `closing`); wait for them, at most a start's timeout.
        let deadline = tokio::time::Instant::now() + self.sandboxes.health_timeout;
        while self.pool.starting() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let b = self.clone();
        let _ = blocking(move || {
            b.drain_pool();
            Ok(())
        })
        .await;
    }

    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError> {
        Ok(self
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

    async fn status(&self, sandboxes: &[SandboxRef]) -> Vec<Option<SandboxRecord>> {
        listing::status(&self.sandboxes.oom, &self.sandboxes.live, sandboxes)
    }

    async fn running(&self, sandbox: &SandboxRef) -> Running {
        listing::running(&self.sandboxes.live, sandbox)
    }

    async fn delete(&self, sandbox_id: &str, generation: &str) -> Result<(), BackendError> {
        let b = self.clone();
        let (id, g) = (sandbox_id.to_string(), generation.to_string());
        Ok(blocking(move || b.blocking_delete(&id, &g)).await?)
    }

    async fn settle(&self) {
        let net = self.net.clone();
        let _ = tokio::task::spawn_blocking(move || net.flush()).await;
    }

    async fn connect(&self, sandbox: &SandboxRef) -> Result<Upstream, BackendError> {
        let netns = match self.live().get(&sandbox.sandbox_id) {
            Some(Live {
                record: r,
                netns: Some(netns),
                ..
            }) if r.generation == sandbox.generation => netns.clone(),
            _ => {
                let id = sandbox.sandbox_id.clone();
                return Err(NativeError::NotRunning { id }.into());
            }
        };
        let addr = SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::LOCALHOST,
            self.sandboxes.bundler.host().container_port,
        ));
        let dial = |source| NativeError::Dial {
            id: sandbox.sandbox_id.clone(),
            source,
        };
        let stream = self
            .sandboxes
            .dialer
            .connect(netns, addr)
            .await
            .map_err(dial)?;
        // Small requests and responses go out at once (no Nagle delay).
        let _ = stream.set_nodelay(true);
        Ok(Upstream { stream })
    }
}
