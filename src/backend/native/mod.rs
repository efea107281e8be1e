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
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tracing::{info, warn};

use super::{Backend, BackendError, NetworkMetrics, Upstream};
use crate::cgroups::{CgroupRoot, SandboxCgroup};
use crate::config::Config;
use crate::model::{SandboxRecord, SandboxSpec, SandboxStatus};
use sandbox_abi::failpoint::{self, Point};

pub mod bundle;
mod bundler;
mod create;
mod error;
pub mod etc;
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
pub use error::NativeError;
use netns::NetnsDialer;
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
    /// Its PID 1 in the table's exit set (list's stamp), once tracked.
    exit_watch: Option<watch::ExitWatch>,
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
            exit_watch: None,
        }
    }
}

/// The native backend. Cheap to clone, and every clone is the same
/// backend (the settings are shared, as is the map of live sandboxes):
/// blocking work runs on a clone moved to a blocking thread.
#[derive(Clone)]
pub struct NativeBackend {
    state: StateDir,
    bundler: Arc<Bundler>,
    init_path: Arc<Path>,
    cgroups: Arc<CgroupRoot>,
    dialer: NetnsDialer,
    /// Shared with the exit watchers ([`watch`]).
    live: Arc<watch::LiveMap>,
    /// PID 1's output per sandbox ([`output`]).
    outputs: Arc<output::Outputs>,
    /// Veths, addresses and the nftables table ([`net`]).
    net: Arc<net::Network>,
    /// The host id ranges of the sandboxes' user namespaces, when
    /// `[userns]` is on ([`userns`]).
    userns: Option<Arc<userns::Pool>>,
    /// The image store and pulls ([`crate::images`]).
    images: Arc<crate::images::Images>,
    /// The warm pool ([`pool`]).
    pool: Arc<pool::Pool>,
    /// Set at shutdown: the pool no longer refills.
    closing: Arc<std::sync::atomic::AtomicBool>,
    /// How long a start may take until the agent listens.
    health_timeout: Duration,
    /// The node's default limits (what a pool member starts with).
    default_resources: crate::model::Resources,
    /// When list reads the sandboxes' OOM counters ([`oom`]).
    oom: Arc<oom::Gate>,
}

impl NativeBackend {
    /// The status of `record`'s incarnation as the live table has it.
    fn current_status(&self, record: &SandboxRecord) -> SandboxStatus {
        match self.live().get(&record.sandbox_id) {
            Some(l) if l.record.generation == record.generation => status_of(l, record),
            _ => SandboxStatus::Exited,
        }
    }

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
        let cgroups = with_device_rules(cgroups, bundler.base());
        bundler.set_device_rules_enforced(cgroups.enforces_devices());
        move_into_leaf_if_delegated(&cgroups)?;
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
        let userns = userns::decide(&cfg.userns, &init_path, &probe_paths)?.map(Arc::new);
        host::tune(Path::new(host::INOTIFY_INSTANCES));
        host::raise_nofile();
        let network = net::Network::new(&cfg.network)?;
        let images = crate::images::Images::new(cfg, bundler.base())
            .map_err(|e| NativeError::ImageStore(format!("{e:#}")))?;
        let backend = NativeBackend {
            state,
            bundler: Arc::new(bundler),
            init_path: init_path.into(),
            cgroups: Arc::new(cgroups),
            dialer: NetnsDialer::start().map_err(NativeError::NetnsHelper)?,
            live: Arc::new(watch::LiveMap::new()),
            outputs: Arc::new(output::Outputs::default()),
            net: Arc::new(network),
            userns,
            images: Arc::new(images),
            pool: Arc::new(pool::Pool::new(&cfg.pool, &cfg.state_dir)),
            closing: Arc::default(),
            health_timeout: Duration::from_secs(cfg.health_timeout_seconds),
            default_resources: crate::model::Resources {
                memory_mb: cfg.limits.memory_mb,
                cpus: cfg.limits.cpus,
                pids: cfg.limits.pids,
            },
            oom: Arc::new(oom::Gate::new()),
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
        match backend.cgroups.remove_orphans(&known) {
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
        self.images.start_default_pull();
    }

    /// Whether the daemon is shutting down.
    fn quiescing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn live(&self) -> watch::LiveRead<'_> {
        self.live.read()
    }

    /// Tracks a running sandbox and starts watching its PID 1 for an exit
    /// (tracked first, so an exit that is already there is noticed).
    fn track(&self, mut l: Live) {
        let id = l.record.sandbox_id.clone();
        let (generation, handle) = (l.record.generation.clone(), l.handle.clone());
        l.exit_watch = self.live.watch_exit(handle.pidfd());
        self.live.write().insert(id.clone(), l);
        oom::tracked(&self.live, &id, &generation);
        let cleanup = watch::Cleanup {
            cgroups: self.cgroups.clone(),
            state: self.state.clone(),
        };
        watch::watch(&self.live, cleanup, &id, &generation, handle);
    }

    /// Kills what a failed or deleted incarnation left (its PID 1, then
    /// every process of its cgroup, which also catches a process whose PID
    /// was never reported), removes the cgroup and the sandbox's
    /// directory, in that order, so a crash part-way leaves the directory
    /// and a restart finishes the job. Never touches user files.
    fn destroy(&self, id: &str, handle: Option<&ProcHandle>) {
        self.outputs.remove(id);
        if let Some(h) = handle {
            h.kill();
            if !h.wait_exit(Duration::from_secs(10)) {
                warn!(sandbox_id = %id, pid = h.pid, "sandbox PID 1 did not exit after SIGKILL");
            }
        }
        failpoint::hit(Point::DeleteAfterKill);
        let cgroup_key = self.cgroup_key(id);
        kill_and_remove_cgroup(&self.cgroups, &cgroup_key);
        failpoint::hit(Point::DeleteAfterCgroup);
        // Its set element and veth (a crash before this point leaves them
        // to the next start-up's rebuild and sweep).
        self.net.detach(id);
        // A pool member's attach points (also once claimed: they hold the
        // user's mounts inside until nothing of the sandbox runs).
        if crate::model::is_pool_key(&cgroup_key) {
            self.pool.remove_slot(&cgroup_key);
        }
        if let Err(e) = self.state.remove(id) {
            warn!(sandbox_id = %id, error = %e, "cannot remove sandbox directory");
        }
        // Its host ids: nothing of it runs any more.
        if let Some(range) = self.userns.as_ref().and_then(|pool| {
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
        self.state
            .load(id)
            .ok()
            .flatten()
            .and_then(|st| st.cgroup_key())
            .unwrap_or_else(|| id.to_string())
    }

    fn blocking_delete(&self, id: &str, generation: &str) -> Result<(), NativeError> {
        let live = self.live.write().remove(id);
        match live {
            Some(l) if l.record.generation != generation => {
                self.live.write().insert(id.to_string(), l);
                Err(NativeError::OtherGeneration { id: id.to_string() })
            }
            Some(l) => {
                // An exit cleanup of this incarnation still running ends
                // first (it no longer finds the record and stops).
                let _teardown = l.teardown.lock().unwrap_or_else(|e| e.into_inner());
                if let Ok(Some(mut st)) = self.state.load(id) {
                    st.phase = Phase::Deleting;
                    let _ = self.state.update(&st);
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

/// The base spec's device allow-list (`linux.resources.devices`) for every
/// sandbox's cgroup. Enforced on v1 and hybrid hosts; on pure v2 (no BPF
/// device program yet) and without a list, said loudly at start-up.
fn with_device_rules(cgroups: CgroupRoot, base: &oci_spec::runtime::Spec) -> CgroupRoot {
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
            "device allow-list NOT enforced: cgroup v2 needs a BPF device program, which sandboxd does not attach; bundles carry no device rules (see docs/security.md)"
        );
    }
    cgroups.with_device_rules(rules)
}

/// cgroup v2 forbids processes in a cgroup whose controllers are enabled
/// for its children. When the sandboxes' parent lies inside the daemon's
/// own cgroup (systemd `Delegate=yes` with `cgroup_parent` under the
/// service's cgroup), the daemon first moves itself into a `daemon` leaf.
fn move_into_leaf_if_delegated(cgroups: &CgroupRoot) -> Result<(), NativeError> {
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
        let service = crate::cgroups::move_self_to_leaf(cgroups, "daemon")?;
        info!(
            ?service,
            "moved the daemon into the leaf cgroup `daemon` of its delegated subtree"
        );
    }
    Ok(())
}

/// The status of `record` when `l` is its incarnation: running while
/// the table says so and PID 1 has not exited (its pidfd, polled now).
fn status_of(l: &Live, record: &SandboxRecord) -> SandboxStatus {
    if record.generation == l.record.generation
        && l.record.status == SandboxStatus::Running
        && !l.handle.exited()
    {
        SandboxStatus::Running
    } else {
        SandboxStatus::Exited
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
        self.outputs.get(sandbox_id).map(|o| o.render())
    }

    fn network(&self, sandbox_id: &str) -> Option<serde_json::Value> {
        let live = self.live();
        let l = live.get(sandbox_id)?;
        Some(match &l.net {
            Some(n) => serde_json::json!({
                "mode": "egress",
                "address": n.address.to_string(),
                "gateway": n.gateway.to_string(),
                "link": n.link,
            }),
            None => serde_json::json!({ "mode": "none" }),
        })
    }

    fn image_stats(&self) -> Option<crate::images::ImageStats> {
        Some(self.images.stats())
    }

    fn pool_stats(&self) -> Option<super::PoolStats> {
        Some(self.pool.stats())
    }

    fn egress(&self) -> Option<(&'static str, u64)> {
        self.net.egress_health().map(|(h, n)| (h.as_str(), n))
    }

    fn network_metrics(&self) -> Option<NetworkMetrics> {
        if self.net.mode() == crate::config::NetworkMode::None {
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

    async fn create(
        &self,
        spec: &SandboxSpec,
        health_timeout: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        // The sandbox's image first (pulled if missing; waited for at most
        // the health timeout), then everything else on a blocking thread.
        let image = self
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
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Members being started destroy themselves once started (they see
        // `closing`); wait for them, at most a start's timeout.
        let deadline = tokio::time::Instant::now() + self.health_timeout;
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

    async fn status(&self, record: &SandboxRecord) -> SandboxStatus {
        self.current_status(record)
    }

    fn status_now(&self, record: &SandboxRecord) -> Option<SandboxStatus> {
        Some(self.current_status(record))
    }

    async fn refresh(&self, record: &SandboxRecord) -> SandboxRecord {
        let mut r = record.clone();
        r.status = self.status(record).await;
        // Read at exit, before the cgroup went; else the live count (read
        // after the table's lock is released: it is a file read).
        let (recorded, cgroup) = match self.live().get(&record.sandbox_id) {
            Some(l) if l.record.generation == record.generation => {
                (l.record.oom_killed == Some(true), l.cgroup.clone())
            }
            _ => return r,
        };
        if recorded || cgroup.is_some_and(|cg| cg.oom_kills() > 0) {
            r.oom_killed = Some(true);
        }
        r
    }

    async fn refresh_all(&self, records: &mut [SandboxRecord]) {
        listing::refresh_all(&self.oom, &self.live, records)
    }

    async fn refresh_stamp(&self) -> Option<u64> {
        listing::stamp(&self.oom, &self.live)
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

    async fn connect(&self, record: &SandboxRecord) -> Result<Upstream, BackendError> {
        let netns = match self.live().get(&record.sandbox_id) {
            Some(Live {
                record: r,
                netns: Some(netns),
                ..
            }) if r.generation == record.generation => netns.clone(),
            _ => {
                let id = record.sandbox_id.clone();
                return Err(NativeError::NotRunning { id }.into());
            }
        };
        let addr = SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::LOCALHOST,
            self.bundler.host().container_port,
        ));
        let dial = |source| NativeError::Dial {
            id: record.sandbox_id.clone(),
            source,
        };
        let stream = self.dialer.connect(netns, addr).await.map_err(dial)?;
        // Small requests and responses go out at once (no Nagle delay).
        let _ = stream.set_nodelay(true);
        Ok(Upstream { stream })
    }
}
