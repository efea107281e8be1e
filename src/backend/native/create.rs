//! Creating a sandbox, daemon side (on a blocking thread): host paths,
//! `state.json`, cgroup, bundle, launch, then tracking. Whatever a failed
//! create made is destroyed by a [`CreateGuard`].

use std::sync::Arc;
use std::time::Duration;

use super::proc::{self, ProcHandle};
use super::state::{Phase, SandboxState};
use super::{launch, output, paths, record_of, Live, NativeBackend, NativeError};
use crate::images::ResolvedImage;
use crate::model::{
    new_generation, unix_now, SandboxRecord, SandboxSpec, SandboxStatus, StorageMode,
};
use sandbox_abi::failpoint::{self, Point};

/// What a create has made so far. Dropped without [`commit`](Self::commit)
/// (any error, or a panic, after the first `state.json`), it destroys all
/// of it: PID 1 through its pidfd when the launcher reported it, every
/// process of the sandbox's cgroup, the cgroup, the sandbox's directory.
struct CreateGuard<'a> {
    backend: &'a NativeBackend,
    id: &'a str,
    /// PID 1, once the launcher reported it and it was still alive.
    handle: Option<Arc<ProcHandle>>,
    committed: bool,
}

/// A started sandbox, not yet tracked (see [`NativeBackend::start`]).
pub(super) struct Started {
    pub st: SandboxState,
    pub handle: Arc<ProcHandle>,
    pub netns: Arc<std::os::fd::OwnedFd>,
    pub cgroup: crate::cgroups::SandboxCgroup,
    /// PID 1's output (for a pool member: read only once claimed).
    pub out: Arc<output::Output>,
    pub out_r: std::os::fd::OwnedFd,
}

impl<'a> CreateGuard<'a> {
    fn new(backend: &'a NativeBackend, id: &'a str) -> Self {
        CreateGuard {
            backend,
            id,
            handle: None,
            committed: false,
        }
    }

    /// The create succeeded: keep everything.
    fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for CreateGuard<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.backend.destroy(self.id, self.handle.as_deref());
        }
    }
}

impl NativeBackend {
    /// Checks and prepares the host paths of a persistent sandbox. Nothing
    /// is created unless every check passed.
    pub(super) fn prepare_user_paths(&self, spec: &SandboxSpec) -> Result<(), NativeError> {
        if spec.identity.storage == StorageMode::Ephemeral {
            return Ok(());
        }
        let uid = &spec.identity.uid;
        let host = self.sandboxes.bundler.host();
        if let Some(w) = &spec.identity.workdir_path {
            let full = host.workspace(uid).join(w);
            paths::open_dir_nofollow(&full).map_err(NativeError::Workdir)?;
        }
        let rel = sandbox_abi::layout::workspace_rel(uid);
        paths::ensure_user_dirs(&host.user_data_root, &rel).map_err(NativeError::UserDataDir)?;
        let rel = sandbox_abi::layout::native_skills_rel(uid);
        paths::ensure_user_dirs(&host.skills_root, &rel).map_err(NativeError::SkillsDir)?;
        Ok(())
    }

    /// Holds the store's shared lock while image `i` is known to be there.
    #[cfg(feature = "images")]
    fn image_in_store(&self, i: &ResolvedImage) -> Result<sandbox_image::store::Lock, NativeError> {
        let store = self.sandboxes.images.store();
        let lock = store
            .lock_shared()
            .map_err(|e| NativeError::ImageStore(e.to_string()))?;
        match store.record(&i.digest) {
            Ok(Some(_)) => Ok(lock),
            Ok(None) => Err(NativeError::ImageUnavailable(format!(
                "image {} ({}) was removed from the store",
                i.reference, i.digest
            ))),
            Err(e) => Err(NativeError::ImageStore(e.to_string())),
        }
    }

    /// No store without the feature `images` (and no image resolves).
    #[cfg(not(feature = "images"))]
    fn image_in_store(&self, i: &ResolvedImage) -> Result<(), NativeError> {
        Err(NativeError::ImageUnavailable(format!(
            "image {}: {}",
            i.reference,
            crate::NO_IMAGES
        )))
    }

    pub(super) fn blocking_create(
        &self,
        spec: &SandboxSpec,
        timeout: Duration,
        image: Option<&ResolvedImage>,
    ) -> Result<SandboxRecord, NativeError> {
        self.prepare_user_paths(spec)?;
        let started = self.start(spec, timeout, image, None)?;
        let key = spec.sandbox_id.clone();
        Ok(self.go_live(started, key))
    }

    /// A started sandbox (`started.st` already under its id) becomes live:
    /// its output is read, its record is `running` and it is tracked, its
    /// cgroup under `cgroup_key` (the id, or a claimed pool member's key).
    pub(super) fn go_live(&self, started: Started, cgroup_key: String) -> SandboxRecord {
        let Started {
            st,
            handle,
            netns,
            cgroup,
            out,
            out_r,
        } = started;
        self.sandboxes.outputs.start(&st.sandbox_id, out, out_r);
        let record = record_of(&st, SandboxStatus::Running);
        self.track(Live::new(
            record.clone(),
            handle,
            netns,
            Some(cgroup),
            st.network.clone(),
            cgroup_key,
        ));
        record
    }

    /// Starts the sandbox of `spec`: everything of a create but the
    /// tracking. With `pool_slot`, a warm-pool member with its attach
    /// points there (recorded as [`Phase::Pooled`]; see [`super::pool`]).
    pub(super) fn start(
        &self,
        spec: &SandboxSpec,
        timeout: Duration,
        image: Option<&ResolvedImage>,
        pool_slot: Option<&std::path::Path>,
    ) -> Result<Started, NativeError> {
        let id = spec.sandbox_id.as_str();
        let mode = self.net.effective(spec.network)?;
        let generation = new_generation();
        let dir = self.sandboxes.state.sandbox_dir(id);
        // A leftover directory of a dead incarnation (nothing live owns
        // it: the lifecycle deleted any live one first).
        self.sandboxes.state.remove(id)?;
        std::fs::create_dir_all(&dir)
            .map_err(|source| NativeError::CreateSandboxDir { path: dir, source })?;
        let mut st = SandboxState {
            sandbox_id: id.to_string(),
            generation: generation.clone(),
            identity: spec.identity.clone(),
            phase: Phase::Creating,
            pid: None,
            start_time: None,
            // Known before it exists: recorded in the one durable write.
            cgroup: Some(
                self.sandboxes
                    .cgroups
                    .relative_path(id)
                    .display()
                    .to_string(),
            ),
            resources: spec.resources,
            created_at: unix_now(),
            network: None,
            userns: None,
            image: image.map(|i| i.digest.to_string()),
            idle: None,
        };
        // The create span (lifecycle) carries it from here on.
        tracing::Span::current().record("generation", generation.as_str());
        let mut made = CreateGuard::new(self, id);
        // Its own host ids, recorded with the first state.json (the guard
        // gives them back if the create fails).
        if let Some(pool) = &self.sandboxes.userns {
            let range = pool.allocate(id)?;
            tracing::info!(sandbox_id = %id, generation = %generation, host_ids = %format!("{}-{}", range.host, range.host + (range.size - 1)), "user namespace range taken");
            st.userns = Some(range);
        }
        // The first record, before anything is made: whatever a crash
        // leaves from here on is found through it (the cgroup by id). It
        // is the one made durable, by a thread of its own while the
        // cgroup, the bundle and the launcher are made; the PID's record
        // below waits for it before replacing it, and so does the answer.
        // Later updates are not fsync'd: after a daemon crash the page
        // cache has them; after a host crash no sandbox process is left
        // and this record is enough to clean up.
        let durable = {
            // Under the store's shared lock: the image is still there, and
            // the record naming it is written before `image rm`/`gc` (which
            // take the lock exclusively) can look.
            let _store = match image {
                Some(i) => Some(self.image_in_store(i)?),
                None => None,
            };
            self.sandboxes.state.save_in_background(&st)?
        };
        let mut durable = Some(durable);
        failpoint::hit(Point::CreateAfterState);
        let cgroup = self.sandboxes.cgroups.create(id, &spec.resources)?;
        failpoint::hit(Point::CreateAfterCgroup);
        let bundle_dir = self.sandboxes.state.bundle_dir(id);
        self.sandboxes.bundler.write_bundle_with(
            spec,
            &generation,
            &bundle_dir,
            image,
            st.userns.as_ref(),
            pool_slot,
        )?;
        failpoint::hit(Point::CreateAfterBundle);
        // PID 1's stdout and stderr: a FIFO the daemon drains (never a
        // file a sandbox could grow without bound).
        let fifo = output::fifo_path(&self.sandboxes.state.sandbox_dir(id));
        let out_r = output::open_read(&fifo).map_err(|source| NativeError::Output {
            path: fifo.clone(),
            source,
        })?;
        let out_w = output::open_write(&fifo).map_err(|source| NativeError::Output {
            path: fifo.clone(),
            source,
        })?;
        let out = Arc::new(output::Output::new(id, &generation));
        let tail = || {
            out.read_available(&out_r);
            out.tail(4096)
        };
        let mut save_err = None;
        // With egress, the sandbox's network is made while PID 1 sets up
        // its mounts and starts the agent: its network namespace exists
        // from the moment its PID is reported (the launcher unshared it
        // before the fork).
        let egress = mode == crate::model::NetworkMode::Egress;
        let mut early_netns: Option<Arc<std::os::fd::OwnedFd>> = None;
        let (launched, attached) = std::thread::scope(|scope| {
            let mut attaching = None;
            let launched = launch::launch(
                &self.sandboxes.init_path,
                &bundle_dir,
                self.sandboxes.bundler.seccomp_bpf(),
                out_w,
                timeout,
                &mut |pid| {
                    // Record the PID (and its start time) at once, before
                    // waiting for readiness: a crash from here on leaves a
                    // state.json naming the live process.
                    made.handle = ProcHandle::open(pid, None).map(Arc::new);
                    if let Some(h) = &made.handle {
                        st.pid = Some(pid);
                        st.start_time = Some(h.start_time);
                        let first = durable.take().map_or(Ok(()), |d| d.wait());
                        if let Err(e) = first.and_then(|()| self.sandboxes.state.update(&st)) {
                            save_err = Some(e);
                        }
                        if let (true, Ok(ns)) = (egress, h.open_netns()) {
                            let ns = Arc::new(ns);
                            early_netns = Some(ns.clone());
                            attaching = Some(scope.spawn(move || self.net.attach(id, &ns)));
                        }
                        failpoint::hit(Point::CreateAfterPid);
                    } else {
                        // It already exited: collect it, or it stays a zombie.
                        proc::reap_if_zombie(pid);
                    }
                },
                &tail,
            );
            let attached =
                attaching.map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            (launched, attached)
        });
        if let Some(e) = save_err {
            return Err(e.into());
        }
        let pid = launched?.pid;
        // (Normally waited for when the PID came.)
        if let Some(d) = durable.take() {
            d.wait()?;
        }
        let Some(handle) = made.handle.clone() else {
            return Err(NativeError::ExitedAtStart { id: id.to_string() });
        };
        let netns = match early_netns {
            Some(ns) => ns,
            None => Arc::new(
                handle
                    .open_netns()
                    .map_err(|source| NativeError::OpenNetns {
                        id: id.to_string(),
                        pid,
                        source,
                    })?,
            ),
        };
        failpoint::hit(Point::CreateAfterLaunch);
        // The sandbox's veth, address, route and set element, before the
        // create answers (the agent still listens on loopback only).
        if egress {
            st.network = match attached {
                Some(r) => r?,
                None => self.net.attach(id, &netns)?,
            };
        }
        failpoint::hit(Point::CreateAfterNetwork);
        st.phase = if pool_slot.is_some() {
            Phase::Pooled
        } else {
            Phase::Running
        };
        st.pid = Some(pid);
        st.start_time = Some(handle.start_time);
        self.sandboxes.state.update(&st)?;
        failpoint::hit(Point::CreateAfterRunning);
        made.commit();
        Ok(Started {
            st,
            handle,
            netns,
            cgroup,
            out,
            out_r,
        })
    }
}
