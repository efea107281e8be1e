//! One sandbox's cgroup: attach, limits, counters, kill and removal.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcgroups::common::{
    AnyCgroupManager, AnyManagerError, CgroupManager, ControllerOpt, FreezerState,
};
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use oci_spec::runtime::LinuxResources;

use super::layout::Layout;
use super::{files, oci_resources, AppliedLimits, CgroupError};
use sandbox_abi::model::Resources;

/// How long [`SandboxCgroup::kill_all`] waits for the cgroup to empty.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
const KILL_POLL: Duration = Duration::from_millis(10);

/// The cgroup of one sandbox (in every v1 controller, or one v2 directory).
pub struct SandboxCgroup {
    id: String,
    layout: Layout,
    /// Controller name → the sandbox's directory in it (on v2 every
    /// controller maps to the same directory).
    dirs: BTreeMap<String, PathBuf>,
    /// `None` only for v1 over a fake tree (see [`CgroupError::V1NeedsRealRoot`]).
    manager: Option<AnyCgroupManager>,
    fs_root: PathBuf,
}

impl std::fmt::Debug for SandboxCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCgroup")
            .field("id", &self.id)
            .field("layout", &self.layout)
            .field("dirs", &self.dirs)
            .finish()
    }
}

impl SandboxCgroup {
    pub(crate) fn new(
        id: String,
        layout: Layout,
        dirs: BTreeMap<String, PathBuf>,
        manager: Option<AnyCgroupManager>,
        fs_root: PathBuf,
    ) -> Self {
        SandboxCgroup {
            id,
            layout,
            dirs,
            manager,
            fs_root,
        }
    }

    pub fn sandbox_id(&self) -> &str {
        &self.id
    }

    /// Moves `pid` (the launcher itself, before any payload code runs) into
    /// the cgroup in every controller. Call it before unsharing the cgroup
    /// namespace: the new namespace is then rooted at the sandbox's cgroup
    /// (and v2 refuses migrations across a namespace boundary).
    pub fn add_task(&self, pid: i32) -> Result<(), CgroupError> {
        self.manager("add_task")?
            .add_task(Pid::from_raw(pid))
            .map_err(|e| CgroupError::AddTask {
                id: self.id.clone(),
                pid,
                source: Box::new(e),
            })?;
        tracing::debug!(sandbox_id = %self.id, pid, "task added to cgroup");
        Ok(())
    }

    /// Every process in the cgroup (and its children cgroups).
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let pids = self
            .manager("pids")?
            .get_all_pids()
            .map_err(|e| self.boxed(e, |id, source| CgroupError::ListPids { id, source }))?;
        Ok(pids.into_iter().map(Pid::as_raw).collect())
    }

    /// Kills every process of the sandbox and waits (bounded) until the
    /// cgroup is empty. v2 with `cgroup.kill`: one write. Otherwise freeze
    /// (so nothing forks while we kill), SIGKILL each process, thaw.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        let kill_file = self.dirs.get("memory").map(|d| d.join("cgroup.kill"));
        let kill_file = kill_file.filter(|f| self.layout == Layout::V2 && f.exists());
        if let Some(f) = kill_file {
            files::write(&f, "1")?;
        } else {
            let frozen = match self.freeze(FreezerState::Frozen) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(sandbox_id = %self.id, error = %e, "cannot freeze; killing unfrozen");
                    false
                }
            };
            let killed = self.signal_all();
            if frozen {
                self.freeze(FreezerState::Thawed)?;
            }
            killed?;
        }
        let start = Instant::now();
        loop {
            let left = self.pids()?;
            if left.is_empty() {
                tracing::info!(sandbox_id = %self.id, "all processes of the sandbox killed");
                return Ok(());
            }
            if start.elapsed() > KILL_TIMEOUT {
                return Err(CgroupError::KillTimeout {
                    id: self.id.clone(),
                    remaining: left.len(),
                });
            }
            // Without a freezer a process may have forked meanwhile.
            self.signal_all()?;
            std::thread::sleep(KILL_POLL);
        }
    }

    /// Removes the cgroup from every controller. Call after
    /// [`kill_all`](Self::kill_all); succeeds if it is already gone.
    pub fn remove(self) -> Result<(), CgroupError> {
        let dirs: BTreeSet<&PathBuf> = self.dirs.values().collect();
        for dir in &dirs {
            files::remove_children(dir)?;
        }
        self.manager("remove")?
            .remove()
            .map_err(|e| self.boxed(e, |id, source| CgroupError::Remove { id, source }))?;
        if let Some(dir) = dirs.iter().find(|d| d.exists()) {
            return Err(CgroupError::StillPresent {
                path: dir.to_path_buf(),
            });
        }
        tracing::info!(sandbox_id = %self.id, "cgroup removed");
        Ok(())
    }

    /// Processes killed by the OOM killer in this cgroup: v2
    /// `memory.events` `oom_kill`, v1 `memory.oom_control` `oom_kill`.
    /// 0 when unreadable (logged).
    pub fn oom_kills(&self) -> u64 {
        let name = match self.layout {
            Layout::V2 => "memory.events",
            Layout::V1 | Layout::Hybrid => "memory.oom_control",
        };
        let read = self.file("memory", name).and_then(|p| files::read(&p));
        match read {
            Ok(text) => files::flat_keyed(&text, "oom_kill").unwrap_or(0),
            Err(e) => {
                tracing::warn!(sandbox_id = %self.id, error = %e, "cannot read oom counter");
                0
            }
        }
    }

    /// The limits as the kernel holds them.
    pub fn limits(&self) -> Result<AppliedLimits, CgroupError> {
        if self.layout == Layout::V2 {
            let swap = self.file("memory", "memory.swap.max")?;
            let cpu_max = self.file("cpu", "cpu.max")?;
            let (cpu_quota_usec, cpu_period_usec) =
                files::parse_cpu_max(&cpu_max, &files::read(&cpu_max)?)?;
            return Ok(AppliedLimits {
                memory_max_bytes: files::read_limit(&self.file("memory", "memory.max")?)?,
                swap_max_bytes: if swap.exists() {
                    files::read_limit(&swap)?
                } else {
                    None
                },
                pids_max: files::read_limit(&self.file("pids", "pids.max")?)?,
                cpu_quota_usec,
                cpu_period_usec,
            });
        }
        let memory = files::read_limit(&self.file("memory", "memory.limit_in_bytes")?)?;
        let memsw = self.file("memory", "memory.memsw.limit_in_bytes")?;
        let memsw = if memsw.exists() {
            files::read_limit(&memsw)?
        } else {
            None
        };
        Ok(AppliedLimits {
            memory_max_bytes: memory,
            swap_max_bytes: memory.zip(memsw).map(|(m, ms)| ms.saturating_sub(m)),
            pids_max: files::read_limit(&self.file("pids", "pids.max")?)?,
            cpu_quota_usec: files::read_limit(&self.file("cpu", "cpu.cfs_quota_us")?)?,
            cpu_period_usec: files::read_u64(&self.file("cpu", "cpu.cfs_period_us")?)?,
        })
    }

    /// CPU time used by the sandbox: v2 `cpu.stat` `usage_usec`, v1
    /// `cpuacct.usage` (ns) / 1000.
    pub fn cpu_usage_usec(&self) -> Result<u64, CgroupError> {
        if self.layout == Layout::V2 {
            let path = self.file("cpu", "cpu.stat")?;
            let text = files::read(&path)?;
            return files::flat_keyed(&text, "usage_usec").ok_or(CgroupError::Parse {
                path,
                content: text,
            });
        }
        Ok(files::read_u64(&self.file("cpuacct", "cpuacct.usage")?)? / 1000)
    }

    /// Applies `res` through libcgroups, plus `memory.swap.max = 0` on v2
    /// (libcgroups treats a zero swap as "leave unset").
    pub(crate) fn apply(&self, res: &Resources) -> Result<(), CgroupError> {
        let v1_memsw = self.layout.uses_v1()
            && self
                .file("memory", "memory.memsw.limit_in_bytes")
                .is_ok_and(|p| p.exists());
        if self.layout.uses_v1() && !v1_memsw {
            tracing::warn!(sandbox_id = %self.id, "no swap accounting (memsw): swap cannot be disabled");
        }
        let base = LinuxResources::default();
        let resources =
            oci_resources(base, res, v1_memsw).map_err(|source| CgroupError::BuildSpec {
                id: self.id.clone(),
                source,
            })?;
        let opt = ControllerOpt {
            resources: &resources,
            // OOM kills must happen inside the sandbox.
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        };
        self.manager("apply")?
            .apply(&opt)
            .map_err(|e| self.boxed(e, |id, source| CgroupError::Apply { id, source }))?;
        if self.layout == Layout::V2 && res.memory_mb > 0 {
            let swap = self.file("memory", "memory.swap.max")?;
            if swap.exists() {
                files::write(&swap, "0")?;
            } else {
                tracing::warn!(sandbox_id = %self.id, "no memory.swap.max: swap not accounted");
            }
        }
        Ok(())
    }

    /// Makes the v1 devices cgroup allow exactly `rules` (see
    /// [`devices`](super::devices)). Runs after libcgroups' `apply`, whose
    /// v1 devices code adds runc's default allowances: the leading deny-all
    /// drops them. Call before any process joins.
    pub(crate) fn apply_devices(
        &self,
        rules: &[oci_spec::runtime::LinuxDeviceCgroup],
    ) -> Result<(), CgroupError> {
        let dir = self
            .dirs
            .get("devices")
            .ok_or_else(|| CgroupError::MissingController {
                controller: "devices".into(),
                path: self.fs_root.clone(),
            })?;
        super::devices::apply_v1(dir, rules)
    }

    fn freeze(&self, state: FreezerState) -> Result<(), CgroupError> {
        self.manager("freeze")?
            .freeze(state)
            .map_err(|e| self.boxed(e, |id, source| CgroupError::Freeze { id, source }))
    }

    /// SIGKILLs every listed process; ESRCH (already gone) is fine.
    fn signal_all(&self) -> Result<(), CgroupError> {
        for pid in self.pids()? {
            match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(source) => {
                    return Err(CgroupError::Kill {
                        id: self.id.clone(),
                        pid,
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    fn manager(&self, op: &'static str) -> Result<&AnyCgroupManager, CgroupError> {
        self.manager
            .as_ref()
            .ok_or_else(|| CgroupError::V1NeedsRealRoot {
                op,
                root: self.fs_root.clone(),
            })
    }

    fn boxed(
        &self,
        e: AnyManagerError,
        make: impl FnOnce(String, Box<AnyManagerError>) -> CgroupError,
    ) -> CgroupError {
        make(self.id.clone(), Box::new(e))
    }

    /// Path of `name` in the sandbox's directory of `controller`.
    fn file(&self, controller: &str, name: &str) -> Result<PathBuf, CgroupError> {
        match self.dirs.get(controller) {
            Some(dir) => Ok(dir.join(name)),
            None => Err(CgroupError::ReadFile {
                path: Path::new(controller).join(name),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("controller {controller} is not mounted"),
                ),
            }),
        }
    }
}
