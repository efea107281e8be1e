//! The store, pulls and the default image (feature `images`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oci_spec::runtime::Spec;
use sandbox_image::pull::{PullOptions, RegistryOptions};
use sandbox_image::unpack::UnpackLimits;
use sandbox_image::{CommitOptions, Digest, ImageRecord, MountPoint, NoProgress, Progress, Store};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::{ImageStats, ResolvedImage};
use crate::config::Config;

#[derive(Clone)]
enum PullState {
    Running,
    Done(Result<(), String>),
}

/// The node's image settings and store.
pub struct Images {
    store: Store,
    registry: RegistryOptions,
    limits: UnpackLimits,
    mount_points: Vec<MountPoint>,
    default: Option<String>,
    pulls: Mutex<HashMap<String, watch::Receiver<PullState>>>,
    stats: Mutex<ImageStats>,
}

/// The mount points every image rootfs gets ready-made (see
/// `sandbox_image::MountPoint`): the base spec's mount destinations, the
/// generated `/etc` files, the agent and its command-env file.
pub fn mount_points(base: &Spec) -> Vec<MountPoint> {
    use sandbox_abi::layout::GUEST;
    let mut out: Vec<MountPoint> = base
        .mounts()
        .iter()
        .flatten()
        .map(|m| MountPoint {
            path: m.destination().to_string_lossy().to_string(),
            file: false,
        })
        .collect();
    for d in [GUEST.home, GUEST.tmp, "/.sandboxd"] {
        out.push(MountPoint {
            path: d.to_string(),
            file: false,
        });
    }
    for f in ["passwd", "group", "hosts", "resolv.conf", "hostname"] {
        out.push(MountPoint {
            path: format!("/etc/{f}"),
            file: true,
        });
    }
    for f in [GUEST.agent_path, GUEST.command_env_path] {
        out.push(MountPoint {
            path: f.to_string(),
            file: true,
        });
    }
    out
}

impl Images {
    /// Opens the store (removing what a crashed pull left when no pull is
    /// running) with the configuration's settings.
    pub fn new(cfg: &Config, base: &Spec) -> anyhow::Result<Images> {
        let store = Store::open(&cfg.state_dir.join("images"))?;
        let default = cfg
            .images
            .default
            .as_deref()
            .map(sandbox_image::reference::normalize)
            .transpose()
            .map_err(|e| anyhow::anyhow!("[images] default / SANDBOX_IMAGE: {e}"))?;
        let mut limits = sandbox_image::default_limits();
        limits.max_total_bytes = cfg.images.max_unpacked_mb.saturating_mul(1 << 20);
        Ok(Images {
            store,
            registry: RegistryOptions {
                insecure: cfg.images.insecure_registries.clone(),
                auth_file: cfg.images.auth_file.clone(),
            },
            limits,
            mount_points: mount_points(base),
            default,
            pulls: Mutex::new(HashMap::new()),
            stats: Mutex::new(ImageStats::default()),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn registry(&self) -> &RegistryOptions {
        &self.registry
    }

    /// The normalized default image, if one is configured.
    pub fn default_reference(&self) -> Option<&str> {
        self.default.as_deref()
    }

    pub fn stats(&self) -> ImageStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What a commit needs (limits, mount points, progress).
    pub fn commit_options<'a>(&'a self, progress: &'a dyn Progress) -> CommitOptions<'a> {
        CommitOptions {
            limits: self.limits.clone(),
            mount_points: &self.mount_points,
            progress,
        }
    }

    /// Starts pulling the default image in the background when the store
    /// lacks it (the daemon serves meanwhile; creates wait for it).
    pub fn start_default_pull(self: &Arc<Self>) {
        let Some(r) = self.default.clone() else {
            info!("no default image: native sandboxes run the host's userland");
            return;
        };
        match self.store.lookup(&r) {
            Ok(Some(rec)) => info!(image = %r, digest = %rec.manifest, "default image present"),
            _ => {
                info!(image = %r, "default image missing: pulling it in the background");
                let _ = self.pull_shared(&r);
            }
        }
    }

    fn resolved(&self, reference: &str, rec: ImageRecord) -> Result<ResolvedImage, String> {
        let digest = rec.digest().map_err(|e| e.to_string())?;
        Ok(ResolvedImage {
            reference: reference.to_string(),
            rootfs: self.store.rootfs_path(&digest),
            digest,
            env: rec.env,
        })
    }

    /// The image of a sandbox: `requested` (already normalized and
    /// allowed) or the default; `None` for the host's userland. A missing
    /// image is pulled (once, however many creates ask); the create waits
    /// for it at most `wait`.
    pub async fn resolve(
        self: &Arc<Self>,
        requested: Option<&str>,
        wait: Duration,
    ) -> Result<Option<ResolvedImage>, String> {
        let Some(r) = requested.or(self.default.as_deref()) else {
            return Ok(None);
        };
        if let Some(rec) = self.lookup(r)? {
            return self.resolved(r, rec).map(Some);
        }
        let mut rx = self.pull_shared(r);
        let done = tokio::time::timeout(wait, async {
            loop {
                if let PullState::Done(res) = rx.borrow_and_update().clone() {
                    return res;
                }
                if rx.changed().await.is_err() {
                    return Err("the pull task ended without a result".to_string());
                }
            }
        })
        .await;
        match done {
            Err(_) => Err(format!(
                "image {r} is still being pulled (waited {}s); retry later",
                wait.as_secs()
            )),
            Ok(Err(e)) => Err(format!("image {r} is not available: {e}")),
            Ok(Ok(())) => match self.lookup(r)? {
                Some(rec) => self.resolved(r, rec).map(Some),
                None => Err(format!("image {r} was pulled but is gone from the store")),
            },
        }
    }

    fn lookup(&self, r: &str) -> Result<Option<ImageRecord>, String> {
        self.store
            .lookup(r)
            .map_err(|e| format!("image store: {e}"))
    }

    /// The running pull of `r`, or a new one (a finished one is not
    /// reused: a failure is retried by the next create).
    fn pull_shared(self: &Arc<Self>, r: &str) -> watch::Receiver<PullState> {
        let mut pulls = self.pulls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = pulls.get(r) {
            if matches!(*rx.borrow(), PullState::Running) {
                return rx.clone();
            }
        }
        let (tx, rx) = watch::channel(PullState::Running);
        pulls.insert(r.to_string(), rx.clone());
        let me = self.clone();
        let r = r.to_string();
        tokio::spawn(async move {
            let res = me.pull_now(&r, &NoProgress).await.map(|_| ());
            let _ = tx.send(PullState::Done(res));
        });
        rx
    }

    /// Pulls `r` now (the store's write lock makes concurrent pulls, here
    /// or in the CLI, run one after the other; the second finds the image).
    pub async fn pull_now(&self, r: &str, progress: &dyn Progress) -> Result<ImageRecord, String> {
        let started = Instant::now();
        let opts = PullOptions {
            registry: &self.registry,
            commit: self.commit_options(progress),
        };
        let res = sandbox_image::pull::pull(&self.store, r, &opts).await;
        let secs = started.elapsed().as_secs_f64();
        let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        st.seconds += secs;
        match res {
            Ok((rec, _)) => {
                st.pulls_ok += 1;
                st.bytes += rec.size;
                info!(image = %r, digest = %rec.manifest, seconds = secs, bytes = rec.size, "image ready");
                Ok(rec)
            }
            Err(e) => {
                st.pulls_failed += 1;
                if let Some(v) = e.verification() {
                    *st.verification_failures
                        .entry(v.kind().to_string())
                        .or_default() += 1;
                    error!(image = %r, error = %e, "image verification failed: the pull was aborted and nothing of it kept");
                } else {
                    warn!(image = %r, error = %e, "image pull failed");
                }
                Err(e.to_string())
            }
        }
    }
}

/// Image `reference` as the store of `cfg` holds it, never pulled
/// (`sandboxd bundle`): nothing is created or cleaned.
pub fn resolve_stored(cfg: &Config, reference: &str) -> anyhow::Result<ResolvedImage> {
    let r = sandbox_image::reference::normalize(reference).map_err(anyhow::Error::msg)?;
    let store = Store::at(&cfg.state_dir.join("images"));
    let rec = store.lookup(&r)?.ok_or_else(|| {
        anyhow::anyhow!(
            "image {r} is not in the store at {}: `sandboxd image pull` or `import` it first",
            store.root().display()
        )
    })?;
    let digest = rec.digest()?;
    Ok(ResolvedImage {
        reference: r,
        rootfs: store.rootfs_path(&digest),
        digest,
        env: rec.env,
    })
}

/// The sandboxes (ids) whose `state.json` under `state_dir` records image
/// `digest`: the native backend's records of live (or not yet cleaned up)
/// sandboxes. Read by `rm` and `gc`, in the daemon and the CLI alike.
pub fn image_users(state_dir: &Path, digest: &Digest) -> Vec<String> {
    let dir = state_dir.join("sandboxes");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut users = Vec::new();
    for e in rd.flatten() {
        let p = e.path().join("state.json");
        let Ok(bytes) = std::fs::read(&p) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        if v.get("image").and_then(|i| i.as_str()) == Some(digest.as_str()) {
            users.push(e.file_name().to_string_lossy().to_string());
        }
    }
    users.sort();
    users
}
