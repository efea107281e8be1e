//! The warm pool (`[pool] size`): sandboxes started ahead of demand —
//! namespaces, rootfs, cgroup, network, agent listening — but bound to no
//! user. A create that fits (the default image and network mode) claims
//! one instead of starting a sandbox; the pool refills in the background.
//! Off by default (`[pool] size = 0`): a claimed member is not identical to
//! a cold sandbox inside (`docs/architecture.md#warm-pool`, "What differs").
//!
//! How a member becomes a user's sandbox without the daemon ever entering
//! its mount namespace (threat model in `docs/security.md#warm-pool`):
//!
//! - Each member has two *attach points* on the host,
//!   `<state_dir>/pool-mounts/<key>/{user-data,skills}`: empty directories,
//!   each bound onto itself and made `shared` (a peer group of its own),
//!   under `pool-mounts/`, itself a private bind, so nothing made there
//!   propagates anywhere else on the host.
//! - The member's bundle binds them at `/home/gem/user-data` and
//!   `/home/gem/skills` as `slave` mounts (see `sandbox-init`'s
//!   `SlaveTrees`): what is mounted on an attach point later appears there.
//! - A claim opens the user's workspace and skills without following
//!   symlinks, makes detached copies of them (`open_tree`), sets the same
//!   attributes a cold create gives them (idmapped through the member's user
//!   namespace, `nosuid`, `nodev`, skills read-only) and attaches them to the
//!   attach points. The kernel copies them into the member's namespace,
//!   where their flags arrive locked (a mount propagated into a less
//!   privileged namespace cannot be made writable there) but not the mounts
//!   themselves: the member's root may unmount them, which a cold sandbox's
//!   root cannot (hence the pool is off by default). The daemon then cuts the
//!   propagation (the attach point becomes private) and unmounts its own
//!   side: no user data stays mounted on the host.
//! - The member's agent (`--pooled`) answers nothing but one
//!   `POST /internal/claim`, which gives it the command environment and the
//!   working directory and returns the device and inode it sees at both
//!   paths; the daemon compares them with what it attached.
//! - Its state directory is renamed to the sandbox id; its cgroup keeps
//!   the member's key as its name (recorded in `state.json`).
//!
//! A member that fails a claim is destroyed and the create falls back to a
//! cold start. Members are never given back: a claimed sandbox is deleted
//! like any other. A restarted daemon destroys every member it finds.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use oci_spec::runtime::{MountBuilder, Spec};
use rustix::mount::MountAttrFlags;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::create::Started;
use super::state::Phase;
use super::{blocking, output, paths, NativeBackend, NativeError};
use crate::config::ConfigError;
use crate::images::ResolvedImage;
use crate::model::{
    new_generation, unix_now, Identity, NetworkMode, SandboxRecord, SandboxSpec, StorageMode,
    POOL_KEY_PREFIX,
};
use sandbox_abi::claim::{ClaimAnswer, ClaimRequest, FileId, CLAIM_PATH};
use sandbox_abi::layout::GUEST;
use sandbox_abi::mountapi::{self, Propagation};

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

/// The two attach points of a member, relative to its slot directory.
const ATTACH: [&str; 2] = ["user-data", "skills"];

/// A failed claim: the error, and the member unless it is already gone.
type Failed = Box<(NativeError, Option<Member>)>;

/// A started, unclaimed member.
pub(super) struct Member {
    started: Started,
    /// The manifest digest of its image (none: the host's userland).
    image: Option<String>,
    mode: NetworkMode,
    /// Which of the pool's variants it belongs to.
    variant: usize,
}

/// One kind of member: `[pool] size` (the node's default network mode and
/// image), or a `[[pool.extra]]`.
struct Variant {
    network: Option<NetworkMode>,
    image: Option<String>,
    size: usize,
    /// Members of it being started.
    starting: AtomicUsize,
}

/// The pool: its members and its attach points.
pub struct Pool {
    variants: Vec<Variant>,
    concurrency: usize,
    /// `<state_dir>/pool-mounts`.
    mounts_root: PathBuf,
    members: Mutex<VecDeque<Member>>,
    /// Consecutive failed starts (backs the refill off).
    failures: AtomicU32,
    claimed: AtomicU64,
    empty: AtomicU64,
    failed: AtomicU64,
    /// Set at shutdown: the pool no longer refills.
    closing: AtomicBool,
}

impl Pool {
    /// The pool of `cfg` (see [`start`](Self::start)).
    pub fn new(cfg: &PoolConfig, state_dir: &Path) -> Pool {
        let variant = |network, image, size| Variant {
            network,
            image,
            size,
            starting: AtomicUsize::new(0),
        };
        let mut variants = vec![variant(None, None, cfg.size)];
        for v in &cfg.extra {
            let image = v
                .image
                .as_deref()
                .map(|i| crate::images::normalize(i).unwrap_or_else(|_| i.to_string()));
            variants.push(variant(v.network, image, v.size));
        }
        Pool {
            variants,
            concurrency: cfg.refill_concurrency.max(1),
            mounts_root: state_dir.join("pool-mounts"),
            members: Mutex::default(),
            failures: AtomicU32::new(0),
            claimed: AtomicU64::new(0),
            empty: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            closing: AtomicBool::new(false),
        }
    }

    /// The daemon is shutting down: no more refills.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Whether the daemon is shutting down.
    pub fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// After the start-up reconciliation: removes the attach points of
    /// every member of an earlier run (destroyed by the reconciliation)
    /// but those of the adopted sandboxes `keep` (claimed members, by
    /// their cgroup key), then makes the root a private bind of itself.
    pub fn start(&self, keep: &std::collections::HashSet<String>) -> Result<(), NativeError> {
        if let Ok(rd) = std::fs::read_dir(&self.mounts_root) {
            for e in rd.flatten() {
                if let Some(name) = e.file_name().to_str() {
                    if !keep.contains(name) {
                        warn!(
                            key = name,
                            "removing the attach points of a pool member of an earlier run"
                        );
                        self.remove_slot(name);
                    }
                }
            }
        }
        if self.size() > 0 {
            self.prepare_root()
                .map_err(|source| NativeError::PoolMounts {
                    path: self.mounts_root.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    fn members(&self) -> std::sync::MutexGuard<'_, VecDeque<Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Members ready to be claimed.
    pub fn ready(&self) -> usize {
        self.members().len()
    }

    /// Members being started.
    pub fn starting(&self) -> usize {
        self.variants
            .iter()
            .map(|v| v.starting.load(Ordering::SeqCst))
            .sum()
    }

    /// Members kept in all.
    pub fn size(&self) -> usize {
        self.variants.iter().map(|v| v.size).sum()
    }

    /// The counters for `/metrics`.
    pub fn stats(&self) -> crate::backend::PoolStats {
        crate::backend::PoolStats {
            ready: self.ready() as u64,
            claimed: self.claimed.load(Ordering::Relaxed),
            empty: self.empty.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    fn prepare_root(&self) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.mounts_root)?;
        unmount_all(&self.mounts_root);
        let root = self.mounts_root.as_path();
        mount(
            Some(root),
            root,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )?;
        mount(
            None::<&str>,
            root,
            None::<&str>,
            MsFlags::MS_PRIVATE,
            None::<&str>,
        )?;
        Ok(())
    }

    fn slot_dir(&self, key: &str) -> PathBuf {
        self.mounts_root.join(key)
    }

    /// Makes the attach points of member `key`; returns its slot directory.
    pub(super) fn make_slot(&self, key: &str) -> std::io::Result<PathBuf> {
        let slot = self.slot_dir(key);
        std::fs::create_dir(&slot)?;
        for name in ATTACH {
            let p = slot.join(name);
            std::fs::create_dir(&p)?;
            mount(Some(&p), &p, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
            mount(
                None::<&str>,
                &p,
                None::<&str>,
                MsFlags::MS_SHARED,
                None::<&str>,
            )?;
        }
        Ok(slot)
    }

    /// Unmounts and removes the attach points of member `key` (never a
    /// recursive delete: `rmdir` only, so nothing mounted is ever removed
    /// through them).
    pub fn remove_slot(&self, key: &str) {
        let slot = self.slot_dir(key);
        for name in ATTACH {
            let p = slot.join(name);
            unmount_all(&p);
            if let Err(e) = std::fs::remove_dir(&p) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(key, path = %p.display(), error = %e, "cannot remove a pool attach point");
                }
            }
        }
        if let Err(e) = std::fs::remove_dir(&slot) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(key, path = %slot.display(), error = %e, "cannot remove a pool slot");
            }
        }
    }

    /// A member for a sandbox of network `mode` and image `image`, if one
    /// is ready.
    fn take(&self, mode: NetworkMode, image: Option<&str>) -> Option<Member> {
        let mut members = self.members();
        let i = pick(
            members.iter().map(|m| (m.mode, m.image.as_deref())),
            mode,
            image,
        )?;
        members.remove(i)
    }

    /// The variants to start a member of now (one entry per member).
    fn wanted(&self) -> Vec<usize> {
        let members = self.members();
        let (sizes, starting): (Vec<usize>, Vec<usize>) = self
            .variants
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let ready = members.iter().filter(|m| m.variant == i).count();
                (v.size, ready + v.starting.load(Ordering::SeqCst))
            })
            .unzip();
        refill_plan(self.concurrency, self.starting(), &sizes, &starting)
    }
}

/// Which ready member a create of network `mode` and image digest `image`
/// (none: the host's userland) takes: the first of `members` (network
/// mode, image digest) with both its own. Limits are not part of the match
/// (a claim rewrites the member's cgroup). None: the create starts cold.
fn pick<'a>(
    members: impl IntoIterator<Item = (NetworkMode, Option<&'a str>)>,
    mode: NetworkMode,
    image: Option<&str>,
) -> Option<usize> {
    members
        .into_iter()
        .position(|(m, i)| m == mode && i == image)
}

/// The variants to start a member of now, one entry per member: each
/// variant `i` lacks `size[i] - have[i]` (ready or starting), filled in
/// order within the `concurrency` starts not already taken by `starting`.
fn refill_plan(concurrency: usize, starting: usize, size: &[usize], have: &[usize]) -> Vec<usize> {
    let mut slots = concurrency.saturating_sub(starting);
    let mut out = Vec::new();
    for (i, (size, have)) in size.iter().zip(have).enumerate() {
        let n = size.saturating_sub(*have).min(slots);
        slots -= n;
        out.extend(std::iter::repeat_n(i, n));
    }
    out
}

/// How long the refill waits after its `failures`-th consecutive failed
/// start (0 for the first): 1 s doubling to 64 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.min(6))
}

/// A member's key from 64 random bits: `.pool-<16 hex>`, never a sandbox
/// id (see [`POOL_KEY_PREFIX`]).
fn member_key(bits: u64) -> String {
    format!("{POOL_KEY_PREFIX}{bits:016x}")
}

/// The limits a claim writes to member cgroup: the request's when they
/// differ from the member's (the node's defaults), else none.
fn limits_to_apply(
    member: &crate::model::Resources,
    requested: &crate::model::Resources,
) -> Option<crate::model::Resources> {
    (member != requested).then_some(*requested)
}

/// Unmounts everything mounted at `path` (lazily), top first.
fn unmount_all(path: &Path) {
    for _ in 0..16 {
        if umount2(path, MntFlags::MNT_DETACH).is_err() {
            return;
        }
    }
}

/// Turns a member's spec into a pool member's: the user-data and skills
/// mounts become slave binds of its attach points, the agent waits for a
/// claim, and works from the home directory until then.
pub(super) fn member_spec(oci: &mut Spec, slot: &Path) -> Result<(), String> {
    let mut mounts = oci.mounts().clone().unwrap_or_default();
    for (dest, name) in [(GUEST.user_data, ATTACH[0]), (GUEST.skills, ATTACH[1])] {
        let m = MountBuilder::default()
            .destination(dest)
            .typ("bind")
            .source(slot.join(name))
            .options(
                ["bind", "slave", "ro", "nosuid", "nodev"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>(),
            )
            .build()
            .map_err(|e| e.to_string())?;
        match mounts
            .iter_mut()
            .find(|x| x.destination() == Path::new(dest))
        {
            Some(x) => *x = m,
            None => mounts.push(m),
        }
    }
    oci.set_mounts(Some(mounts));
    let mut process = oci.process().clone().ok_or("the spec has no process")?;
    let mut args = process.args().clone().unwrap_or_default();
    args.push("--pooled".to_string());
    process.set_args(Some(args));
    process.set_cwd(PathBuf::from(GUEST.home));
    oci.set_process(Some(process));
    Ok(())
}

/// The spec a member is started from: bound to no user.
fn member_sandbox_spec(key: &str, resources: crate::model::Resources) -> SandboxSpec {
    SandboxSpec {
        sandbox_id: key.to_string(),
        identity: Identity {
            thread_id: "pool".to_string(),
            uid: "pool".to_string(),
            workdir_path: None,
            storage: StorageMode::Persistent,
            image: None,
        },
        env: Default::default(),
        resources,
        network: None,
    }
}

/// Attaches a detached tree to attach point `point`, then cuts the
/// propagation and unmounts the host's side. Returns the device and inode
/// of the tree's root, as the member must see them.
fn attach_and_cut(
    point: &Path,
    attach: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<FileId> {
    use rustix::fs::{Mode, OFlags};
    // The attach point's own mount, before anything covers it.
    let point_fd = rustix::fs::open(
        point,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    attach(point)?;
    let st = rustix::fs::stat(point)?;
    let id = FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    };
    // Private: the unmounts below stay on the host's side.
    mountapi::mount_setattr(
        point_fd.as_fd(),
        false,
        MountAttrFlags::empty(),
        Propagation::Private,
        None,
    )?;
    unmount_all(point);
    Ok(id)
}

/// What a claim attached: the ids the member's agent must report.
struct Attached {
    user_data: Option<FileId>,
    skills: Option<FileId>,
}

impl NativeBackend {
    /// Starts the pool's refill (at start-up, after a claim, after a
    /// failed start).
    pub fn refill_pool(&self) {
        let pool = &self.pool;
        if pool.size() == 0 || self.quiescing() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for variant in pool.wanted() {
            pool.variants[variant]
                .starting
                .fetch_add(1, Ordering::SeqCst);
            let b = self.clone();
            rt.spawn(async move {
                let ok = b.start_member(variant).await;
                b.pool.variants[variant]
                    .starting
                    .fetch_sub(1, Ordering::SeqCst);
                if !ok {
                    // Backed off: 1 s doubling to 64 s.
                    let n = b.pool.failures.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(backoff(n)).await;
                } else {
                    b.pool.failures.store(0, Ordering::SeqCst);
                }
                b.refill_pool();
            });
        }
    }

    /// Starts one member of `variant`; false when that failed (logged).
    async fn start_member(&self, variant: usize) -> bool {
        let timeout = self.sandboxes.health_timeout;
        let (network, requested) = {
            let v = &self.pool.variants[variant];
            (v.network, v.image.clone())
        };
        let image = match self
            .sandboxes
            .images
            .resolve(requested.as_deref(), timeout)
            .await
        {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "pool: the default image is not available; retrying");
                return false;
            }
        };
        let b = self.clone();
        let started = tokio::task::spawn_blocking(move || {
            let key = member_key(sandbox_abi::random::u64());
            let mut spec = member_sandbox_spec(&key, b.sandboxes.default_resources);
            spec.network = network;
            spec.identity.image = requested;
            let slot = b
                .pool
                .make_slot(&key)
                .map_err(|source| NativeError::PoolMounts {
                    path: b.pool.slot_dir(&key),
                    source,
                });
            let slot = match slot {
                Ok(s) => s,
                Err(e) => {
                    b.pool.remove_slot(&key);
                    return Err(e);
                }
            };
            let mode = b.net.effective(network)?;
            let r = b.start(&spec, timeout, image.as_ref(), Some(&slot));
            if r.is_err() {
                b.pool.remove_slot(&key);
            }
            r.map(|started| Member {
                started,
                image: image.map(|i| i.digest.to_string()),
                mode,
                variant,
            })
        })
        .await;
        match started {
            Ok(Ok(m)) => {
                if self.quiescing() {
                    self.destroy_member(m);
                    return true;
                }
                info!(key = %m.started.st.sandbox_id, pid = m.started.handle.pid, "pool member ready");
                self.pool.members().push_back(m);
                true
            }
            Ok(Err(e)) => {
                warn!(error = %e, "pool: cannot start a member");
                false
            }
            Err(e) => {
                warn!(error = %e, "pool: the member start panicked");
                false
            }
        }
    }

    fn destroy_member(&self, m: Member) {
        let key = m.started.st.sandbox_id.clone();
        self.destroy(&key, Some(&m.started.handle));
        info!(key = %key, "pool member destroyed");
    }

    /// Destroys every ready member (daemon shutdown).
    pub fn drain_pool(&self) {
        let members: Vec<Member> = self.pool.members().drain(..).collect();
        for m in members {
            self.destroy_member(m);
        }
        // Nothing is mounted on the host side any more (claimed members'
        // attach points were cut off at their claim).
        unmount_all(&self.pool.mounts_root);
    }

    /// Claims a member for `spec` if one fits. `None`: none fits or the
    /// claim failed (the member is destroyed, the caller starts the
    /// sandbox cold).
    pub(super) async fn claim(
        &self,
        spec: &SandboxSpec,
        image: Option<&ResolvedImage>,
    ) -> Result<Option<SandboxRecord>, NativeError> {
        if self.pool.size() == 0 {
            return Ok(None);
        }
        let mode = self.net.effective(spec.network)?;
        let digest = image.map(|i| i.digest.to_string());
        // The user's paths are checked first: an error there is the
        // request's, and leaves the member in the pool.
        {
            let (b, s) = (self.clone(), spec.clone());
            blocking(move || b.prepare_user_paths(&s)).await?;
        }
        if mode == NetworkMode::Egress && !self.net.egress_enforced() {
            // Its egress table is being rebuilt: a member is not handed
            // out; the cold create waits for the table (or answers 503).
            info!("pool: the egress table is not in force; starting the sandbox cold");
            return Ok(None);
        }
        let Some(m) = self.pool.take(mode, digest.as_deref()) else {
            info!("pool: no member ready; starting the sandbox cold");
            self.pool.empty.fetch_add(1, Ordering::Relaxed);
            self.refill_pool();
            return Ok(None);
        };
        let key = m.started.st.sandbox_id.clone();
        // The refill starts once the claim is over: a member starting
        // meanwhile would compete with it for the CPU.
        let claimed = self.claim_member(m, spec, image).await;
        self.refill_pool();
        match claimed {
            Ok(r) => {
                self.pool.claimed.fetch_add(1, Ordering::Relaxed);
                Ok(Some(r))
            }
            Err(failed) => {
                let (e, m) = *failed;
                self.pool.failed.fetch_add(1, Ordering::Relaxed);
                warn!(key = %key, error = %e, "pool: claim failed; destroying the member and starting the sandbox cold");
                if let Some(m) = m {
                    let b = self.clone();
                    let _ = blocking(move || {
                        b.destroy_member(m);
                        Ok(())
                    })
                    .await;
                }
                Ok(None)
            }
        }
    }

    async fn claim_member(
        &self,
        m: Member,
        spec: &SandboxSpec,
        image: Option<&ResolvedImage>,
    ) -> Result<SandboxRecord, Failed> {
        let (b, s) = (self.clone(), spec.clone());
        let (m, attached) = blocking(move || {
            let r = b.attach_user(&m, &s);
            Ok((m, r))
        })
        .await
        .map_err(|e| Box::new((e, None)))?;
        let attached = match attached {
            Ok(a) => a,
            Err(e) => return Err(Box::new((e, Some(m)))),
        };
        let env = match self.sandboxes.bundler.command_env(spec, image) {
            Ok(env) => env,
            Err(e) => return Err(Box::new((e, Some(m)))),
        };
        let req = ClaimRequest {
            env,
            cwd: match &spec.identity.workdir_path {
                Some(w) => format!("{}/{w}", GUEST.user_data),
                None => GUEST.home.to_string(),
            },
        };
        let answer = match self.call_claim(&m, &req).await {
            Ok(a) => a,
            Err(e) => return Err(Box::new((e, Some(m)))),
        };
        if answer.user_data != attached.user_data || answer.skills != attached.skills {
            let e = NativeError::Claim(format!(
                "the member does not see what was attached (attached {:?}/{:?}, it sees {:?}/{:?})",
                attached.user_data, attached.skills, answer.user_data, answer.skills
            ));
            return Err(Box::new((e, Some(m))));
        }
        let (b, s) = (self.clone(), spec.clone());
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(|| b.commit_claim(m, &s)))
            .await
            .map_err(|e| Box::new((NativeError::Worker(e), None)))?
    }

    /// Binds the user's directories into member `m` (see the module
    /// documentation), sets its limits and hostname.
    fn attach_user(&self, m: &Member, spec: &SandboxSpec) -> Result<Attached, NativeError> {
        let key = &m.started.st.sandbox_id;
        let handle = &m.started.handle;
        if handle.exited() {
            return Err(NativeError::Claim(format!("pool member {key} exited")));
        }
        // The request's limits first: a cgroup that refuses them fails the
        // claim (the create starts cold) before anything of the user's is
        // attached.
        if let Some(limits) = limits_to_apply(&m.started.st.resources, &spec.resources) {
            m.started.cgroup.apply(&limits)?;
        }
        let userns = match m.started.st.userns {
            Some(_) => Some(handle.open_userns().map_err(|e| {
                NativeError::Claim(format!("cannot open the member's user namespace: {e}"))
            })?),
            None => None,
        };
        let slot = self.pool.slot_dir(key);
        let host = self.sandboxes.bundler.host();
        let claim_err = |what: &str, e: std::io::Error| NativeError::Claim(format!("{what}: {e}"));
        let mut attrs = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
        if userns.is_some() {
            attrs |= MountAttrFlags::MOUNT_ATTR_IDMAP;
        }
        let bind = |src: &Path, extra: MountAttrFlags| -> Result<OwnedFd, NativeError> {
            let fd =
                paths::open_dir_nofollow(src).map_err(|e| NativeError::Claim(e.to_string()))?;
            let tree =
                mountapi::clone_tree(fd.as_fd(), false).map_err(|e| claim_err("open_tree", e))?;
            mountapi::mount_setattr(
                tree.as_fd(),
                false,
                attrs | extra,
                Propagation::Private,
                userns.as_ref().map(|u| u.as_fd()),
            )
            .map_err(|e| claim_err("mount_setattr", e))?;
            Ok(tree)
        };
        let (user_data, skills) = match spec.identity.storage {
            StorageMode::Persistent => {
                let ws = bind(&host.workspace(&spec.identity.uid), MountAttrFlags::empty())?;
                let sk = bind(
                    &host.skills(&spec.identity.uid),
                    MountAttrFlags::MOUNT_ATTR_RDONLY,
                )?;
                let u = attach_and_cut(&slot.join(ATTACH[0]), |p| mountapi::attach(ws.as_fd(), p))
                    .map_err(|e| claim_err("attaching the workspace", e))?;
                let s = attach_and_cut(&slot.join(ATTACH[1]), |p| mountapi::attach(sk.as_fd(), p))
                    .map_err(|e| claim_err("attaching the skills", e))?;
                (Some(u), Some(s))
            }
            StorageMode::Ephemeral => {
                // A fresh tmpfs, as a cold ephemeral create mounts (owned by
                // the sandbox's uid 1000, on the host the id it maps to).
                let owner = m.started.st.userns.as_ref().map_or(1000, |r| r.host + 1000);
                let data = format!(
                    "mode=700,uid={owner},gid={owner},size={}m",
                    host.limits.home_size_mb
                );
                let u = attach_and_cut(&slot.join(ATTACH[0]), |p| {
                    mount(
                        Some("tmpfs"),
                        p,
                        Some("tmpfs"),
                        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                        Some(data.as_str()),
                    )
                    .map_err(std::io::Error::from)
                })
                .map_err(|e| claim_err("mounting the ephemeral user data", e))?;
                // The skills attach point stays empty.
                let s = attach_and_cut(&slot.join(ATTACH[1]), |_| Ok(()))
                    .map_err(|e| claim_err("closing the skills attach point", e))?;
                (Some(u), Some(s))
            }
        };
        // The attach-point directories stay until the sandbox is destroyed:
        // removing a directory detaches every mount on it, in every
        // namespace, and the user's directories are mounted on them inside.
        self.set_hostname(m, &super::bundle::hostname_for(&spec.sandbox_id))?;
        Ok(Attached { user_data, skills })
    }

    /// Sets the member's hostname (its UTS namespace, from a thread that
    /// joins it and ends) and its `/etc/hostname` and `/etc/hosts` (the
    /// bound files, rewritten in place).
    fn set_hostname(&self, m: &Member, hostname: &str) -> Result<(), NativeError> {
        let uts = m.started.handle.open_utsns().map_err(|e| {
            NativeError::Claim(format!("cannot open the member's UTS namespace: {e}"))
        })?;
        let name = hostname.to_string();
        std::thread::spawn(move || -> Result<(), String> {
            nix::sched::setns(uts, nix::sched::CloneFlags::CLONE_NEWUTS)
                .map_err(|e| format!("setns(uts): {e}"))?;
            nix::unistd::sethostname(&name).map_err(|e| format!("sethostname: {e}"))
        })
        .join()
        .map_err(|_| NativeError::Claim("the hostname thread panicked".into()))?
        .map_err(NativeError::Claim)?;
        let files = self
            .sandboxes
            .state
            .bundle_dir(&m.started.st.sandbox_id)
            .join("files");
        for (name, content) in super::bundle::sandbox_files(hostname) {
            let path = files.join(name);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| NativeError::Claim(format!("{}: {e}", path.display())))?;
            std::io::Write::write_all(&mut f, content.as_bytes())
                .map_err(|e| NativeError::Claim(format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }

    /// `POST /internal/claim` to the member's agent, through its netns.
    async fn call_claim(&self, m: &Member, req: &ClaimRequest) -> Result<ClaimAnswer, NativeError> {
        use http_body_util::{BodyExt, Full};
        let addr = std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::LOCALHOST,
            self.sandboxes.bundler.host().container_port,
        ));
        let err =
            |what: &str, e: &dyn std::fmt::Display| NativeError::Claim(format!("{what}: {e}"));
        let stream = self
            .sandboxes
            .dialer
            .connect(m.started.netns.clone(), addr)
            .await
            .map_err(|e| err("dialing the member's agent", &e))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| err("handshake", &e))?;
        tokio::spawn(conn);
        let body = serde_json::to_vec(req).map_err(|e| err("encoding", &e))?;
        let request = hyper::Request::post(CLAIM_PATH)
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes::Bytes::from(body)))
            .map_err(|e| err("request", &e))?;
        let resp = tokio::time::timeout(self.sandboxes.health_timeout, send.send_request(request))
            .await
            .map_err(|_| NativeError::Claim("the member's agent did not answer the claim".into()))?
            .map_err(|e| err("claim", &e))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| err("reading the claim's answer", &e))?
            .to_bytes();
        if !status.is_success() {
            return Err(NativeError::Claim(format!(
                "the member's agent refused the claim ({status}): {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        #[derive(serde::Deserialize)]
        struct Envelope {
            data: ClaimAnswer,
        }
        serde_json::from_slice::<Envelope>(&bytes)
            .map(|e| e.data)
            .map_err(|e| err("decoding the claim's answer", &e))
    }

    /// Makes the claimed member sandbox `spec.sandbox_id`: its directory
    /// renamed, its `state.json` rewritten, then tracked.
    fn commit_claim(&self, m: Member, spec: &SandboxSpec) -> Result<SandboxRecord, Failed> {
        let key = m.started.st.sandbox_id.clone();
        let id = spec.sandbox_id.as_str();
        let fail = |e: NativeError, m: Member| Err(Box::new((e, Some(m))));
        // A leftover directory of a dead incarnation (the lifecycle deleted
        // any live one first).
        if let Err(e) = self.sandboxes.state.remove(id) {
            return fail(e.into(), m);
        }
        if let Err(e) = std::fs::rename(
            self.sandboxes.state.sandbox_dir(&key),
            self.sandboxes.state.sandbox_dir(id),
        ) {
            return fail(
                NativeError::Claim(format!("renaming the member's directory: {e}")),
                m,
            );
        }
        let Member { mut started, .. } = m;
        let st = &mut started.st;
        st.sandbox_id = id.to_string();
        st.generation = new_generation();
        st.identity = spec.identity.clone();
        st.resources = spec.resources;
        st.phase = Phase::Running;
        st.created_at = unix_now();
        tracing::Span::current().record("generation", st.generation.as_str());
        // In memory, the member's key becomes the id.
        if let Some(u) = &self.sandboxes.userns {
            u.rename(&key, id);
        }
        self.net.rename(&key, id);
        // Not fsync'd: the member's first record was (see create.rs); after
        // a daemon crash the page cache has this one, after a host crash
        // nothing of the sandbox runs and either record gets it cleaned up.
        if let Err(e) = self.sandboxes.state.update(st) {
            // Destroyed under its new id (the directory moved).
            self.destroy(id, Some(&started.handle));
            return Err(Box::new((e.into(), None)));
        }
        info!(sandbox_id = %id, generation = %st.generation, key = %key, pid = started.handle.pid, "claimed a pool member");
        // Its output is read from here on under its id and generation.
        started.out = Arc::new(output::Output::new(id, &st.generation));
        Ok(self.go_live(started, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{load_toml, test_env, Config};
    use crate::model::{is_pool_key, validate_node_key, validate_sandbox_id, Resources};

    const E: NetworkMode = NetworkMode::Egress;
    const N: NetworkMode = NetworkMode::None;

    #[test]
    fn a_create_takes_the_first_member_of_its_network_mode_and_image() {
        let members = [
            (E, Some("sha256:aa")),
            (N, None),
            (E, None),
            (E, None),
            (N, Some("sha256:aa")),
        ];
        assert_eq!(pick(members, E, None), Some(2));
        assert_eq!(pick(members, N, None), Some(1));
        assert_eq!(pick(members, E, Some("sha256:aa")), Some(0));
        assert_eq!(pick(members, N, Some("sha256:aa")), Some(4));
    }

    #[test]
    fn a_create_that_no_member_matches_starts_cold() {
        let members = [(E, Some("sha256:aa")), (N, None)];
        // Another image's digest, the host's userland in another mode, an
        // image where the members have none: no member.
        assert_eq!(pick(members, E, Some("sha256:bb")), None);
        assert_eq!(pick(members, E, None), None);
        assert_eq!(pick(members, N, Some("sha256:aa")), None);
        assert_eq!(pick([], E, None), None);
    }

    #[test]
    fn limits_are_rewritten_only_when_the_request_differs() {
        let node = Resources {
            memory_mb: 512,
            cpus: 1.0,
            pids: 256,
        };
        assert_eq!(limits_to_apply(&node, &node), None);
        for other in [
            Resources {
                memory_mb: 256,
                ..node
            },
            Resources { cpus: 0.5, ..node },
            Resources { pids: 64, ..node },
        ] {
            assert_eq!(limits_to_apply(&node, &other), Some(other));
        }
    }

    #[test]
    fn the_refill_backs_off_from_one_second_doubling_to_64() {
        let secs: Vec<u64> = (0..10).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 64, 64, 64]);
        assert_eq!(backoff(u32::MAX), Duration::from_secs(64));
    }

    #[test]
    fn the_refill_starts_what_is_missing_within_its_concurrency() {
        // Two variants missing 2 and 1, 4 starts allowed: all of them, in
        // variant order.
        assert_eq!(refill_plan(4, 0, &[2, 1], &[0, 0]), [0, 0, 1]);
        // One start at a time: the first variant's first.
        assert_eq!(refill_plan(1, 0, &[2, 1], &[0, 0]), [0]);
        // Starts already running take from the concurrency.
        assert_eq!(refill_plan(2, 1, &[2, 1], &[1, 0]), [0]);
        assert_eq!(refill_plan(1, 1, &[2, 1], &[1, 0]), Vec::<usize>::new());
        // A full variant (or one above its size) starts nothing.
        assert_eq!(refill_plan(4, 0, &[2, 1], &[2, 0]), [1]);
        assert_eq!(refill_plan(4, 0, &[1, 1], &[3, 1]), Vec::<usize>::new());
        // Size 0: nothing.
        assert_eq!(refill_plan(16, 0, &[0], &[0]), Vec::<usize>::new());
    }

    #[test]
    fn a_member_key_is_never_a_sandbox_id() {
        for bits in [0, 1, 0xdead_beef, u64::MAX, sandbox_abi::random::u64()] {
            let key = member_key(bits);
            assert_eq!(key.len(), ".pool-".len() + 16, "{key}");
            assert_eq!(
                u64::from_str_radix(key.strip_prefix(".pool-").unwrap(), 16),
                Ok(bits)
            );
            assert!(is_pool_key(&key), "{key}");
            assert!(validate_node_key(&key).is_ok(), "{key}");
            assert!(validate_sandbox_id(&key).is_err(), "{key}");
        }
    }

    fn config(size: usize, extra: Vec<PoolVariant>) -> PoolConfig {
        PoolConfig {
            size,
            refill_concurrency: 0,
            extra,
        }
    }

    #[test]
    fn the_default_pool_is_empty_and_starts_nothing() {
        let p = Pool::new(&PoolConfig::default(), Path::new("/nonexistent"));
        assert_eq!((p.size(), p.ready(), p.starting()), (0, 0, 0));
        assert!(p.wanted().is_empty());
        assert!(p.take(E, None).is_none());
    }

    #[test]
    fn a_pool_has_one_variant_per_extra_with_its_image_normalized() {
        let p = Pool::new(
            &config(
                2,
                vec![
                    PoolVariant {
                        network: Some(N),
                        image: None,
                        size: 1,
                    },
                    PoolVariant {
                        network: None,
                        image: Some("registry.example.com/tools:1".into()),
                        size: 3,
                    },
                ],
            ),
            Path::new("/srv/state"),
        );
        assert_eq!(p.size(), 6);
        // A concurrency of 0 is taken as 1.
        assert_eq!(p.concurrency, 1);
        assert_eq!(p.wanted(), [0]);
        assert_eq!(p.mounts_root, Path::new("/srv/state/pool-mounts"));
        let v: Vec<_> = p
            .variants
            .iter()
            .map(|v| (v.network, v.image.as_deref(), v.size))
            .collect();
        let tools = crate::images::normalize("registry.example.com/tools:1")
            .unwrap_or_else(|_| "registry.example.com/tools:1".into());
        assert_eq!(
            v,
            [
                (None, None, 2),
                (Some(N), None, 1),
                (None, Some(tools.as_str()), 3)
            ]
        );
    }

    #[test]
    fn a_member_spec_binds_the_attach_points_as_read_only_slaves() {
        let mut oci = Spec::default();
        let before = oci.mounts().clone().unwrap().len();
        member_spec(&mut oci, Path::new("/s/pool-mounts/.pool-0")).unwrap();
        let mounts = oci.mounts().clone().unwrap();
        assert_eq!(mounts.len(), before + 2);
        for (dest, src) in [
            (GUEST.user_data, "/s/pool-mounts/.pool-0/user-data"),
            (GUEST.skills, "/s/pool-mounts/.pool-0/skills"),
        ] {
            let m: Vec<_> = mounts
                .iter()
                .filter(|m| m.destination() == Path::new(dest))
                .collect();
            assert_eq!(m.len(), 1, "{dest}");
            assert_eq!(m[0].source().as_deref(), Some(Path::new(src)));
            assert_eq!(
                m[0].options().clone().unwrap(),
                ["bind", "slave", "ro", "nosuid", "nodev"]
            );
        }
        let process = oci.process().clone().unwrap();
        assert_eq!(process.args().clone().unwrap().last().unwrap(), "--pooled");
        assert_eq!(process.cwd(), Path::new(GUEST.home));
        // Run again on its own output: the binds are replaced, not added.
        member_spec(&mut oci, Path::new("/s/pool-mounts/.pool-1")).unwrap();
        assert_eq!(oci.mounts().as_ref().unwrap().len(), before + 2);
    }

    #[test]
    fn a_member_is_bound_to_no_user() {
        let r = Resources {
            memory_mb: 512,
            cpus: 1.0,
            pids: 256,
        };
        let s = member_sandbox_spec(".pool-00000000000000ff", r);
        assert_eq!(s.sandbox_id, ".pool-00000000000000ff");
        assert_eq!(
            (s.identity.uid.as_str(), s.identity.thread_id.as_str()),
            ("pool", "pool")
        );
        assert_eq!(s.identity.workdir_path, None);
        assert_eq!(s.identity.image, None);
        assert!(s.env.is_empty());
        assert_eq!(s.resources, r);
        assert_eq!(s.network, None);
    }

    #[test]
    fn pool_section_env_and_extra_pools() {
        let toml = "[images]\nallowed = [\"registry.example.com/tools:1\"]\n\
             [pool]\nsize = 3\n\
             [[pool.extra]]\nnetwork = \"none\"\nsize = 1\n\
             [[pool.extra]]\nimage = \"registry.example.com/tools:1\"\nsize = 2\n";
        let c = load_toml(toml, &[]).unwrap();
        assert_eq!((c.pool.size, c.pool.extra.len()), (3, 2));
        assert_eq!(c.pool.extra[0].network, Some(NetworkMode::None));
        c.validate().unwrap();
        let c = load_toml(toml, &[("SANDBOXD_POOL_SIZE", "0")]).unwrap();
        assert_eq!(c.pool.size, 0);
        // Off unless asked for: a claimed member is not a cold sandbox.
        let d = Config::load(None, &test_env(&[])).unwrap();
        assert_eq!((d.pool.size, d.pool.extra.len()), (0, 0));
        let c = Config::load(None, &test_env(&[("SANDBOXD_POOL_SIZE", "2")])).unwrap();
        assert_eq!(c.pool.size, 2);
        // An extra pool's image must be one a create may name.
        let toml = "[[pool.extra]]\nimage = \"registry.example.com/other:2\"\nsize = 1\n";
        let e = load_toml(toml, &[])
            .and_then(|c| c.validate().map(|_| c))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in [images] allowed"), "{e}");
        // Too many members in all, and no refill.
        let toml = "[pool]\nsize = 200\n[[pool.extra]]\nsize = 100\n";
        let c = load_toml(toml, &[]).unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("maximum"));
        let toml = "[pool]\nrefill_concurrency = 0\n";
        let c = load_toml(toml, &[]).unwrap();
        assert!(c.validate().is_err());
    }
}
