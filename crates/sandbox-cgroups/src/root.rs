//! The parent of all sandbox cgroups: layout detection, creation of one
//! sandbox's cgroup, listing and orphan removal.

use std::collections::{BTreeSet, HashSet};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use libcgroups::common::{AnyCgroupManager, AnyManagerError};
use oci_spec::runtime::LinuxDeviceCgroup;

use super::devices::DevicePolicy;
use super::layout::{assumed_mounts, parse_layout, Layout, Mounts};
use super::sandbox::SandboxCgroup;
use super::{bpf, files};
use super::{CgroupError, DEFAULT_FS_ROOT};
use sandbox_abi::model::{validate_node_key, Resources};

/// v2 controllers a sandbox needs enabled in every ancestor.
const V2_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// The configured parent of every sandbox cgroup, checked (plain
/// components only, not the root cgroup) but with no cgroup filesystem
/// looked at: what names a sandbox's cgroup in a bundle written without
/// creating anything (`sandboxd bundle`) and in one a create writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupParent {
    /// Relative to each hierarchy's root, without a leading `/`.
    parent: PathBuf,
}

impl CgroupParent {
    /// `parent` is a path relative to the hierarchy root, with or without
    /// a leading `/` (as [`CgroupRoot::detect`] takes it).
    pub fn new(parent: &str) -> Result<CgroupParent, CgroupError> {
        Ok(CgroupParent {
            parent: normalize_parent(parent)?,
        })
    }

    /// The sandbox's cgroup path as OCI `linux.cgroupsPath` wants it: the
    /// same as [`CgroupRoot::relative_path`] of a root with this parent.
    pub fn relative_path(&self, sandbox_id: &str) -> PathBuf {
        sandbox_path(&self.parent, sandbox_id)
    }
}

/// `/<parent>/<id>`: absolute from the hierarchy root.
fn sandbox_path(parent: &Path, sandbox_id: &str) -> PathBuf {
    Path::new("/").join(parent).join(sandbox_id)
}

/// The detected layout and the parent cgroup under which every sandbox
/// gets `<parent>/<id>` (in each v1 controller, or in the v2 hierarchy).
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    fs_root: PathBuf,
    mounts: Mounts,
    /// Relative to each hierarchy's root, without a leading `/`.
    parent: PathBuf,
    /// The device allow-list every sandbox's cgroup gets; `None`: the
    /// devices cgroup (v1) is left as the parent has it, and no device
    /// program is attached (v2).
    devices: Option<DeviceSetup>,
}

/// How the device allow-list reaches a new sandbox cgroup.
#[derive(Debug, Clone)]
enum DeviceSetup {
    /// v1 and hybrid: written to the `devices` controller's files.
    V1(Vec<LinuxDeviceCgroup>),
    /// v2: this loaded program (built from the rules once, at start) is
    /// attached to every sandbox's cgroup.
    Bpf(Arc<OwnedFd>),
    /// v2, rules the v1 controller would refuse: every create fails with
    /// the rule in the error, as on v1.
    Invalid(Vec<LinuxDeviceCgroup>),
    /// v2, and the kernel would not load the program (no
    /// `CONFIG_CGROUP_BPF`, say): not enforced, said loudly at start-up.
    Unenforced,
}

impl CgroupRoot {
    /// Detects the layout from `/proc/self/mountinfo` under
    /// [`DEFAULT_FS_ROOT`]. `parent` is a path relative to the hierarchy
    /// root, with or without a leading `/` (`sandboxd`, or a delegated
    /// `/system.slice/sandboxd.service/sandboxes`).
    pub fn detect(parent: &str) -> Result<CgroupRoot, CgroupError> {
        let parent_path = normalize_parent(parent)?;
        let fs_root = PathBuf::from(DEFAULT_FS_ROOT);
        let mi = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(mi).map_err(|source| CgroupError::DetectLayout {
            path: mi.to_path_buf(),
            source,
        })?;
        let mounts = parse_layout(&text, &fs_root).ok_or_else(|| CgroupError::NoCgroupFs {
            path: fs_root.clone(),
        })?;
        // Debug only: `serve` runs doctor's checks (a detect) before the
        // backend's own; the backend logs the layout once, at info.
        tracing::debug!(
            layout = %mounts.layout,
            parent = %parent_path.display(),
            "cgroup layout detected"
        );
        Ok(CgroupRoot {
            fs_root,
            mounts,
            parent: parent_path,
            devices: None,
        })
    }

    /// Every sandbox cgroup [`create`](Self::create) makes from now on
    /// allows exactly the devices `rules` allow (OCI
    /// `linux.resources.devices`, applied in order over an empty list): on
    /// v1 and hybrid hosts in the `devices` controller, on v2 through a BPF
    /// device program built from them and loaded here, once (see
    /// [`enforces_devices`](Self::enforces_devices)).
    pub fn with_device_rules(mut self, rules: Vec<LinuxDeviceCgroup>) -> Self {
        if self.mounts.layout.uses_v1() {
            tracing::info!(
                rules = rules.len(),
                "device allow-list enforced by the devices cgroup"
            );
            self.devices = Some(DeviceSetup::V1(rules));
            return self;
        }
        let policy = match DevicePolicy::from_rules(&rules) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "the device allow-list has a rule the devices cgroup refuses: every create will fail");
                self.devices = Some(DeviceSetup::Invalid(rules));
                return self;
            }
        };
        self.devices = Some(match bpf::load(&bpf::device_program(&policy)) {
            Ok(fd) => {
                tracing::info!(
                    rules = rules.len(),
                    exceptions = policy.exceptions.len(),
                    "device allow-list enforced by a BPF device program on every sandbox's cgroup"
                );
                DeviceSetup::Bpf(Arc::new(fd))
            }
            Err(e) => {
                tracing::warn!(
                    layout = %self.layout(),
                    error = %e,
                    "device allow-list NOT enforced: the kernel refused the BPF device program; bundles carry no device rules (see docs/security.md)"
                );
                DeviceSetup::Unenforced
            }
        });
        self
    }

    /// [`with_device_rules`](Self::with_device_rules) with the base spec's
    /// device allow-list (`linux.resources.devices`) for every sandbox's
    /// cgroup. Without a list, said loudly at start-up.
    pub fn with_spec_device_rules(self, base: &oci_spec::runtime::Spec) -> Self {
        let rules = base
            .linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.devices().clone());
        let Some(rules) = rules else {
            tracing::warn!("the base spec has no linux.resources.devices: sandboxes keep the device access of the cgroup parent");
            return self;
        };
        self.with_device_rules(rules)
    }

    /// Whether device rules are enforced on this host: v1 and hybrid (the
    /// `devices` controller); v2 once [`with_device_rules`](Self::with_device_rules)
    /// has loaded the BPF device program.
    pub fn enforces_devices(&self) -> bool {
        self.mounts.layout.uses_v1()
            || matches!(
                self.devices,
                Some(DeviceSetup::Bpf(_) | DeviceSetup::Invalid(_))
            )
    }

    /// A root over a (fake) tree at `fs_root`: v2 files directly in it, v1
    /// controllers in `<fs_root>/<controller>`. For tests. An invalid
    /// `parent` keeps only its plain components.
    pub fn with_root(fs_root: &Path, layout: Layout, parent: &str) -> Self {
        let parent = Path::new(parent)
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .collect();
        CgroupRoot {
            fs_root: fs_root.to_path_buf(),
            mounts: assumed_mounts(fs_root, layout),
            parent,
            devices: None,
        }
    }

    pub fn layout(&self) -> Layout {
        self.mounts.layout
    }

    /// Whether `controller` (`memory`, `pids`, `cpu`, …) is available to
    /// sandbox cgroups: a v1 hierarchy of it (v1, hybrid), or listed in the
    /// v2 root's `cgroup.controllers` (pure v2).
    pub fn has_controller(&self, controller: &str) -> bool {
        if self.mounts.layout.uses_v1() {
            return self.mounts.v1.contains_key(controller);
        }
        self.mounts
            .v2
            .as_ref()
            .and_then(|m| std::fs::read_to_string(m.join("cgroup.controllers")).ok())
            .is_some_and(|t| t.split_whitespace().any(|c| c == controller))
    }

    /// The sandbox's cgroup path as OCI `linux.cgroupsPath` wants it:
    /// absolute from the hierarchy root, e.g. `/sandboxd/<id>`.
    pub fn relative_path(&self, sandbox_id: &str) -> PathBuf {
        sandbox_path(&self.parent, sandbox_id)
    }

    /// Creates the sandbox's cgroup (reusing an empty leftover) and applies
    /// the limits. No process is moved in: the launcher does that itself.
    pub fn create(&self, sandbox_id: &str, res: &Resources) -> Result<SandboxCgroup, CgroupError> {
        check_id(sandbox_id)?;
        let rel = self.parent.join(sandbox_id);
        if let Some(existing) = self.open(sandbox_id)? {
            if !existing.pids().unwrap_or_default().is_empty() {
                return Err(CgroupError::Busy {
                    id: sandbox_id.to_string(),
                    path: self.relative_path(sandbox_id),
                });
            }
            tracing::warn!(sandbox_id, "reusing an empty leftover cgroup");
        }
        match self.mounts.layout {
            Layout::V2 => self.create_v2(&rel, res)?,
            Layout::V1 | Layout::Hybrid => self.create_v1(&rel)?,
        }
        let cg = self.sandbox(sandbox_id)?;
        let applied = cg.apply(res).and_then(|()| match &self.devices {
            Some(DeviceSetup::V1(rules)) => cg.apply_devices(rules),
            Some(DeviceSetup::Bpf(program)) => cg.attach_device_program(program),
            Some(DeviceSetup::Invalid(rules)) => DevicePolicy::from_rules(rules).map(drop),
            Some(DeviceSetup::Unenforced) | None => Ok(()),
        });
        if let Err(e) = applied {
            // Nothing runs in it yet: do not leave a half-made cgroup.
            let cleanup = self.sandbox(sandbox_id).and_then(SandboxCgroup::remove);
            if let Err(c) = cleanup {
                tracing::warn!(sandbox_id, error = %c, "cannot remove half-made cgroup");
            }
            return Err(e);
        }
        tracing::info!(
            sandbox_id,
            memory_mb = res.memory_mb,
            cpus = res.cpus,
            pids = res.pids,
            path = %self.relative_path(sandbox_id).display(),
            "cgroup created"
        );
        Ok(cg)
    }

    /// The sandbox's existing cgroup (after a daemon restart), if any.
    pub fn open(&self, sandbox_id: &str) -> Result<Option<SandboxCgroup>, CgroupError> {
        check_id(sandbox_id)?;
        let rel = self.parent.join(sandbox_id);
        if self.hierarchy_roots().iter().any(|m| m.join(&rel).is_dir()) {
            Ok(Some(self.sandbox(sandbox_id)?))
        } else {
            Ok(None)
        }
    }

    /// Ids of the sandboxes that have a cgroup under the parent (in any
    /// controller, so that half-made ones are found too), sorted.
    pub fn list(&self) -> Result<Vec<String>, CgroupError> {
        let mut ids = BTreeSet::new();
        for root in self.hierarchy_roots() {
            ids.extend(files::child_ids(&root.join(&self.parent))?);
        }
        Ok(ids.into_iter().collect())
    }

    /// Kills and removes the cgroup of every sandbox not in `known`.
    /// Returns the removed ids; tries them all, then reports the first failure.
    pub fn remove_orphans(&self, known: &HashSet<String>) -> Result<Vec<String>, CgroupError> {
        let mut removed = Vec::new();
        let mut first_err = None;
        for id in self.list()? {
            if known.contains(&id) {
                continue;
            }
            let result = match self.open(&id) {
                Ok(Some(cg)) => cg.kill_all().and_then(|()| cg.remove()),
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {
                    tracing::warn!(sandbox_id = %id, "removed orphan cgroup");
                    removed.push(id);
                }
                Err(e) => {
                    tracing::error!(sandbox_id = %id, error = %e, "cannot remove orphan cgroup");
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// Directories holding sandbox cgroups: the v2 mount, or each distinct
    /// v1 controller mount.
    fn hierarchy_roots(&self) -> Vec<PathBuf> {
        if self.mounts.layout.uses_v1() {
            let set: BTreeSet<&PathBuf> = self.mounts.v1.values().collect();
            set.into_iter().cloned().collect()
        } else {
            self.mounts.v2.iter().cloned().collect()
        }
    }

    pub(crate) fn v2_root(&self) -> &Path {
        self.mounts.v2.as_deref().unwrap_or(&self.fs_root)
    }

    /// v2: creates the parent chain and enables cpu/memory/pids in the
    /// `cgroup.subtree_control` of every ancestor of the sandbox, then the
    /// sandbox's own directory (a leaf: nothing enabled in it). A
    /// controller `res` needs but an ancestor lacks is an error.
    fn create_v2(&self, rel: &Path, res: &Resources) -> Result<(), CgroupError> {
        let mut needed = Vec::new();
        if res.memory_mb > 0 {
            needed.push("memory");
        }
        if res.pids > 0 {
            needed.push("pids");
        }
        if super::cpu_quota_usec(res.cpus).is_some() {
            needed.push("cpu");
        }
        let root = self.v2_root().to_path_buf();
        files::create_dirs(&root, &self.parent, |_| Ok(()))?;
        let mut level = root.clone();
        enable_v2_controllers(&level, &needed)?;
        for comp in self.parent.components() {
            level.push(comp);
            enable_v2_controllers(&level, &needed)?;
        }
        files::create_dirs(&root, rel, |_| Ok(()))
    }

    /// v1: creates `<parent>/<id>` in every mounted controller. New
    /// directories get `memory.use_hierarchy = 1` (so the parent's limits
    /// cover its children on old kernels) and the parent's cpuset (an empty
    /// cpuset refuses tasks).
    fn create_v1(&self, rel: &Path) -> Result<(), CgroupError> {
        for (ctrl, mount) in &self.mounts.v1 {
            files::create_dirs(mount, rel, |dir| match ctrl.as_str() {
                "memory" => {
                    let f = dir.join("memory.use_hierarchy");
                    if let Err(e) = files::write(&f, "1") {
                        tracing::debug!(error = %e, "memory.use_hierarchy not settable");
                    }
                    Ok(())
                }
                "cpuset" => copy_cpuset(dir),
                _ => Ok(()),
            })?;
        }
        Ok(())
    }

    fn sandbox(&self, sandbox_id: &str) -> Result<SandboxCgroup, CgroupError> {
        let rel = self.relative_path(sandbox_id);
        let dirs = if self.mounts.layout.uses_v1() {
            self.mounts
                .v1
                .iter()
                .map(|(c, m)| (c.clone(), m.join(rel.strip_prefix("/").unwrap_or(&rel))))
                .collect()
        } else {
            let dir = self.v2_root().join(rel.strip_prefix("/").unwrap_or(&rel));
            V2_ALL_FILES
                .iter()
                .map(|c| (c.to_string(), dir.clone()))
                .collect()
        };
        let (layout, fs_root, v2_root, id) = (
            self.mounts.layout,
            self.fs_root.clone(),
            self.v2_root().to_path_buf(),
            sandbox_id.to_string(),
        );
        let make = move || manager(layout, &fs_root, &v2_root, &id, &rel);
        Ok(SandboxCgroup::new(
            sandbox_id.to_string(),
            self.mounts.layout,
            dirs,
            Box::new(make),
            self.fs_root.clone(),
        ))
    }
}

/// libcgroups' manager for the sandbox. v1's reads the real mountinfo, so
/// over a fake tree there is none.
fn manager(
    layout: Layout,
    fs_root: &Path,
    v2_root: &Path,
    id: &str,
    rel: &Path,
) -> Result<Option<AnyCgroupManager>, CgroupError> {
    let err = |e: AnyManagerError| CgroupError::Manager {
        id: id.to_string(),
        source: Box::new(e),
    };
    if layout.uses_v1() {
        if fs_root != Path::new(DEFAULT_FS_ROOT) {
            return Ok(None);
        }
        let m = libcgroups::v1::Manager::new(rel).map_err(|e| err(e.into()))?;
        Ok(Some(m.any()))
    } else {
        let m = libcgroups::v2::manager::Manager::new(v2_root.to_path_buf(), rel.into())
            .map_err(|e| err(e.into()))?;
        Ok(Some(m.any()))
    }
}

/// On v2 every "controller" lives in the one directory.
const V2_ALL_FILES: [&str; 5] = ["cpu", "cpuacct", "memory", "pids", "freezer"];

pub(crate) fn check_id(id: &str) -> Result<(), CgroupError> {
    validate_node_key(id).map_err(|_| CgroupError::BadId { id: id.to_string() })
}

pub(crate) fn normalize_parent(parent: &str) -> Result<PathBuf, CgroupError> {
    let bad = |reason| CgroupError::BadParent {
        parent: parent.to_string(),
        reason,
    };
    let mut out = PathBuf::new();
    for comp in Path::new(parent).components() {
        match comp {
            Component::RootDir => {}
            Component::Normal(c) => out.push(c),
            _ => return Err(bad("only plain components are allowed")),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(bad(
            "must not be empty (sandboxes never go in the root cgroup)",
        ));
    }
    Ok(out)
}

/// Enables the available sandbox controllers in `dir/cgroup.subtree_control`
/// with one write (those already enabled are left alone, so systemd's
/// settings stand; nothing is written when all are enabled). Fails if one
/// of `needed` is not available in `dir`.
fn enable_v2_controllers(dir: &Path, needed: &[&str]) -> Result<(), CgroupError> {
    let available = files::read(&dir.join("cgroup.controllers"))?;
    let control = dir.join("cgroup.subtree_control");
    let enabled = files::read(&control)?;
    let has = |s: &str, ctrl: &str| {
        s.split_whitespace()
            .any(|c| c.trim_start_matches('+') == ctrl)
    };
    if let Some(c) = needed.iter().find(|c| !has(&available, c)) {
        return Err(CgroupError::MissingController {
            controller: c.to_string(),
            path: dir.join("cgroup.controllers"),
        });
    }
    let missing: Vec<String> = V2_CONTROLLERS
        .iter()
        .filter(|c| has(&available, c) && !has(&enabled, c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let value = missing.join(" ");
    files::write(&control, &value).map_err(|e| match e {
        CgroupError::WriteFile { source, .. } => CgroupError::EnableControllers {
            path: control.clone(),
            controllers: value.clone(),
            source,
        },
        other => other,
    })
}

/// Copies `cpuset.cpus` and `cpuset.mems` from the parent into a new v1
/// cpuset directory. A parent whose own are still empty (made a moment ago
/// by a concurrent create that has not copied them yet: `mkdir` told this
/// one it existed) is filled from above first, or this directory would stay
/// empty and refuse every task (`ENOSPC` on `cgroup.procs`).
pub(crate) fn copy_cpuset(dir: &Path) -> Result<(), CgroupError> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    for name in ["cpuset.cpus", "cpuset.mems"] {
        let mut value = files::read(&parent.join(name))?;
        if value.trim().is_empty() && parent.parent().is_some_and(|g| g.join(name).exists()) {
            copy_cpuset(parent)?;
            value = files::read(&parent.join(name))?;
        }
        if !value.trim().is_empty() {
            files::write(&dir.join(name), value.trim())?;
        }
    }
    Ok(())
}
