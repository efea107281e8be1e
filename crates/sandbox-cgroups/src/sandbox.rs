//! One sandbox's cgroup: attach, limits, counters, kill and removal.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcgroups::common::{AnyCgroupManager, AnyManagerError, CgroupManager, ControllerOpt};
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
/// How long [`SandboxCgroup::freeze`] waits for the kernel to report the
/// cgroup frozen.
pub const FREEZE_TIMEOUT: Duration = Duration::from_secs(1);

/// A sandbox's memory as its cgroup counts it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryUsage {
    /// All memory charged to it.
    pub bytes: u64,
    /// Its anonymous and shared-memory (tmpfs) part: what only swap takes.
    pub anon: u64,
    /// Its pages in swap (v2 `memory.swap.current`, v1 `total_swap`).
    pub swap: u64,
}

/// What [`SandboxCgroup::reclaim`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaim {
    pub before: MemoryUsage,
    pub after: MemoryUsage,
}

impl Reclaim {
    /// Bytes the cgroup holds less than before.
    pub fn reclaimed(&self) -> u64 {
        self.before.bytes.saturating_sub(self.after.bytes)
    }

    /// Anonymous bytes still in memory that were there before: what swap
    /// could not take (full, or none).
    pub fn anon_left(&self) -> u64 {
        self.after.anon.min(self.before.anon)
    }
}

/// Builds libcgroups' manager of one sandbox (`None`: v1 over a fake tree).
pub(crate) type MakeManager =
    Box<dyn Fn() -> Result<Option<AnyCgroupManager>, CgroupError> + Send + Sync>;

/// The cgroup of one sandbox (in every v1 controller, or one v2 directory).
///
/// The hot paths (joining, listing and killing its processes, removal,
/// v1 limits and freezing) read and write the cgroup files directly, in
/// the directories resolved once from the mount table at start: libcgroups'
/// v1 manager re-reads `/proc/self/mountinfo` and `/proc/self/cgroup` for
/// every controller it looks up and warns about each controller this host
/// lacks, on every construction. It is built only for what still goes
/// through it (v2 limits), on first use.
pub struct SandboxCgroup {
    id: String,
    layout: Layout,
    /// Controller name → the sandbox's directory in it (on v2 every
    /// controller maps to the same directory).
    dirs: BTreeMap<String, PathBuf>,
    manager: std::sync::OnceLock<Option<AnyCgroupManager>>,
    make_manager: MakeManager,
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
        make_manager: MakeManager,
        fs_root: PathBuf,
    ) -> Self {
        SandboxCgroup {
            id,
            layout,
            dirs,
            manager: std::sync::OnceLock::new(),
            make_manager,
            fs_root,
        }
    }

    /// The sandbox's distinct directories (one on v2).
    fn distinct_dirs(&self) -> BTreeSet<&PathBuf> {
        self.dirs.values().collect()
    }

    pub fn sandbox_id(&self) -> &str {
        &self.id
    }

    /// Moves `pid` (the launcher itself, before any payload code runs) into
    /// the cgroup in every controller. Call it before unsharing the cgroup
    /// namespace: the new namespace is then rooted at the sandbox's cgroup
    /// (and v2 refuses migrations across a namespace boundary).
    pub fn add_task(&self, pid: i32) -> Result<(), CgroupError> {
        for dir in self.distinct_dirs() {
            files::write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        tracing::debug!(sandbox_id = %self.id, pid, "task added to cgroup");
        Ok(())
    }

    /// Every process in the cgroup (and its children cgroups), in any
    /// controller: a sandbox's processes are in all of them, but a cgroup
    /// someone else made (an orphan being removed) may hold a process in
    /// only some (v1), which must be killed too or its directory stays
    /// busy.
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut out = Vec::new();
        for dir in self.distinct_dirs() {
            collect_pids(dir, &mut out)?;
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
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
            let frozen = match self.set_frozen(true) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(sandbox_id = %self.id, error = %e, "cannot freeze; killing unfrozen");
                    false
                }
            };
            let killed = self.signal_all();
            if frozen {
                self.set_frozen(false)?;
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
        let dirs = self.distinct_dirs();
        for dir in &dirs {
            files::remove_children(dir)?;
            remove_dir(dir)?;
        }
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
    pub fn apply(&self, res: &Resources) -> Result<(), CgroupError> {
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
        if self.layout.uses_v1() {
            return self.apply_v1(&resources);
        }
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

    /// v1 limits, written directly: memory (then memory+swap, which must
    /// not be below it), pids, CPU period then quota.
    fn apply_v1(&self, r: &LinuxResources) -> Result<(), CgroupError> {
        if let Some(m) = r.memory() {
            if let Some(l) = m.limit() {
                files::write(
                    &self.file("memory", "memory.limit_in_bytes")?,
                    &l.to_string(),
                )?;
            }
            if let Some(s) = m.swap() {
                files::write(
                    &self.file("memory", "memory.memsw.limit_in_bytes")?,
                    &s.to_string(),
                )?;
            }
        }
        if let Some(p) = r.pids() {
            let v = if p.limit() > 0 {
                p.limit().to_string()
            } else {
                "max".to_string()
            };
            files::write(&self.file("pids", "pids.max")?, &v)?;
        }
        if let Some(c) = r.cpu() {
            if let Some(period) = c.period() {
                files::write(&self.file("cpu", "cpu.cfs_period_us")?, &period.to_string())?;
            }
            if let Some(quota) = c.quota() {
                files::write(&self.file("cpu", "cpu.cfs_quota_us")?, &quota.to_string())?;
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

    /// Attaches the loaded device program (v2, see [`bpf`](super::bpf))
    /// to the sandbox's cgroup. Call before any process joins.
    pub(crate) fn attach_device_program(
        &self,
        program: &std::os::fd::OwnedFd,
    ) -> Result<(), CgroupError> {
        let dir = self.v2_dir()?;
        super::devices::apply_v2(dir, program)
    }

    /// The sandbox's v2 directory (the one directory every controller
    /// maps to); an error on v1 and hybrid hosts.
    pub fn v2_dir(&self) -> Result<&Path, CgroupError> {
        match (self.layout, self.dirs.get("memory")) {
            (Layout::V2, Some(d)) => Ok(d),
            _ => Err(CgroupError::MissingController {
                controller: "cgroup2".into(),
                path: self.fs_root.clone(),
            }),
        }
    }

    /// Freezes every process of the sandbox (v1 `freezer.state`, v2
    /// `cgroup.freeze`) and returns once the kernel reports the cgroup
    /// frozen: no task of it runs until [`thaw`](Self::thaw); its memory
    /// stays. A freeze that does not complete within [`FREEZE_TIMEOUT`]
    /// (a task stuck in an uninterruptible sleep) is undone and an error.
    pub fn freeze(&self) -> Result<(), CgroupError> {
        self.set_frozen(true)
    }

    /// Thaws the sandbox (see [`freeze`](Self::freeze)); thawing one that is
    /// not frozen is fine.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        self.set_frozen(false)
    }

    /// Whether the sandbox is frozen, or being frozen: v1 `freezer.state`
    /// other than `THAWED`, v2 `cgroup.freeze` 1.
    pub fn is_frozen(&self) -> Result<bool, CgroupError> {
        if self.layout.uses_v1() {
            let f = self.file("freezer", "freezer.state")?;
            return Ok(files::read(&f)?.trim() != "THAWED");
        }
        let f = self.file("memory", "cgroup.freeze")?;
        Ok(files::read(&f)?.trim() == "1")
    }

    /// v1 `freezer.state`: a freeze is over once it reads `FROZEN` (a task
    /// in an uninterruptible sleep can keep it `FREEZING` a while; the
    /// write is repeated then, as runc does). v2 `cgroup.freeze`: once
    /// `cgroup.events` says `frozen 1` (the kernel freezes each task when
    /// it next leaves the kernel). A thaw is one write either way.
    fn set_frozen(&self, frozen: bool) -> Result<(), CgroupError> {
        let v1 = self.layout.uses_v1();
        let (f, on, off) = if v1 {
            (self.file("freezer", "freezer.state")?, "FROZEN", "THAWED")
        } else {
            (self.file("memory", "cgroup.freeze")?, "1", "0")
        };
        if !frozen {
            return files::write(&f, off);
        }
        let events = match v1 {
            true => None,
            false => Some(self.file("memory", "cgroup.events")?),
        };
        let start = Instant::now();
        files::write(&f, on)?;
        loop {
            let done = match &events {
                None => files::read(&f)?.trim() == "FROZEN",
                Some(e) => files::flat_keyed(&files::read(e)?, "frozen") == Some(1),
            };
            if done {
                return Ok(());
            }
            if start.elapsed() > FREEZE_TIMEOUT {
                let _ = files::write(&f, off);
                return Err(CgroupError::WriteFile {
                    path: f,
                    value: on.into(),
                    source: std::io::Error::other(format!("not frozen after {FREEZE_TIMEOUT:?}")),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
            if v1 {
                files::write(&f, on)?;
            }
        }
    }

    /// The memory charged to the sandbox and how much of it is anonymous
    /// (what only swap can take): v2 `memory.current` and `memory.stat`
    /// `anon` + `shmem`; v1 `memory.usage_in_bytes` and `memory.stat`
    /// `total_rss` + `total_shmem`.
    pub fn memory_usage(&self) -> Result<MemoryUsage, CgroupError> {
        let (current, keys) = match self.layout {
            Layout::V2 => ("memory.current", ["anon", "shmem"]),
            Layout::V1 | Layout::Hybrid => ("memory.usage_in_bytes", ["total_rss", "total_shmem"]),
        };
        let bytes = files::read_u64(&self.file("memory", current)?)?;
        let stat = files::read(&self.file("memory", "memory.stat")?)?;
        let anon = keys
            .iter()
            .map(|k| files::flat_keyed(&stat, k).unwrap_or(0))
            .sum();
        let swap = match self.layout {
            Layout::V2 => self
                .file("memory", "memory.swap.current")
                .and_then(|p| files::read_u64(&p))
                .unwrap_or(0),
            Layout::V1 | Layout::Hybrid => files::flat_keyed(&stat, "total_swap").unwrap_or(0),
        };
        Ok(MemoryUsage { bytes, anon, swap })
    }

    /// Pushes the sandbox's memory out (call it frozen): anonymous pages to
    /// swap, file pages dropped. v2: `memory.reclaim` of all it holds, with
    /// `memory.swap.max` opened for the write and put back right after
    /// (sandboxes run without swap: the limit stays in force for them; the
    /// pages already out come back on demand). v1: `memory.force_empty`,
    /// which reclaims with swap whatever `memory.memsw.limit_in_bytes` says
    /// (a swapped-out page keeps its memory+swap charge) and, like
    /// `memory.reclaim`, never OOM-kills: what cannot go (swap full) stays.
    /// Both run in the caller, which waits until the kernel is done.
    pub fn reclaim(&self) -> Result<Reclaim, CgroupError> {
        let before = self.memory_usage()?;
        if self.layout == Layout::V2 {
            let swap_max = self.file("memory", "memory.swap.max")?;
            let saved = if swap_max.exists() {
                let v = files::read(&swap_max)?.trim().to_string();
                files::write(&swap_max, "max")?;
                Some(v)
            } else {
                None
            };
            let reclaim = self.file("memory", "memory.reclaim")?;
            // EAGAIN: less than asked for could go (kernel memory never
            // does): what went is read below.
            let r = match files::write(&reclaim, &before.bytes.max(1).to_string()) {
                Err(CgroupError::WriteFile { source, .. })
                    if source.raw_os_error() == Some(Errno::EAGAIN as i32) =>
                {
                    Ok(())
                }
                other => other,
            };
            if let Some(v) = saved {
                let restored = files::write(&swap_max, if v.is_empty() { "0" } else { &v });
                r.and(restored)?;
            } else {
                r?;
            }
        } else {
            files::write(&self.file("memory", "memory.force_empty")?, "0")?;
        }
        let after = self.memory_usage()?;
        Ok(Reclaim { before, after })
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
        let m = match self.manager.get() {
            Some(m) => m,
            None => {
                let made = (self.make_manager)()?;
                self.manager.get_or_init(|| made)
            }
        };
        m.as_ref().ok_or_else(|| CgroupError::V1NeedsRealRoot {
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

/// Appends the PIDs in `dir`'s `cgroup.procs` and its child cgroups'.
fn collect_pids(dir: &Path, out: &mut Vec<i32>) -> Result<(), CgroupError> {
    let procs = dir.join("cgroup.procs");
    let text = match std::fs::read_to_string(&procs) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::ReadFile {
                path: procs,
                source,
            })
        }
    };
    out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&e.path(), out)?;
        }
    }
    Ok(())
}

/// Removes an (empty) cgroup directory; gone already is fine. The kernel
/// may report it busy for a moment after its last task exited: retried
/// briefly.
fn remove_dir(dir: &Path) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e)
                if e.raw_os_error() == Some(libc_ebusy())
                    && start.elapsed() < Duration::from_secs(1) =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(source) => {
                return Err(CgroupError::RemoveDir {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        }
    }
}

fn libc_ebusy() -> i32 {
    Errno::EBUSY as i32
}
