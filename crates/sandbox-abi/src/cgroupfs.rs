//! The cgroup filesystems of the host, from `/proc/self/mountinfo`: the
//! one parser of their layout (v1, v2 or hybrid), used by `sandbox-cgroups`
//! (the daemon's cgroups) and by the launcher, which joins a sandbox's
//! cgroup itself ([`join`]: one write of its PID into `cgroup.procs` per
//! hierarchy) without `sandbox-cgroups`' managers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// How cgroups are mounted on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Only v1 hierarchies, one per controller (or co-mounted groups).
    V1,
    /// A single cgroup2 hierarchy at the cgroup root.
    V2,
    /// v1 controllers plus a cgroup2 hierarchy (usually `unified/`) without
    /// controllers: treated as v1.
    Hybrid,
}

impl Layout {
    /// Whether limits go through the v1 controllers.
    pub fn uses_v1(self) -> bool {
        matches!(self, Layout::V1 | Layout::Hybrid)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::V1 => "v1",
            Layout::V2 => "v2",
            Layout::Hybrid => "hybrid",
        })
    }
}

/// v1 controllers we create a directory in for every sandbox (the ones
/// libcgroups' v1 manager attaches tasks to, minus the rarely mounted ones
/// it skips when absent).
pub const V1_CONTROLLERS: [&str; 12] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// The cgroup mounts found under a cgroup root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounts {
    pub layout: Layout,
    /// v1 controller name → mount point (co-mounted controllers share one).
    pub v1: BTreeMap<String, PathBuf>,
    /// Mount point of the cgroup2 hierarchy, if any.
    pub v2: Option<PathBuf>,
}

/// Parses the text of a `mountinfo` file and classifies the cgroup mounts
/// under `fs_root`. Returns `None` when there is no cgroup mount there.
pub fn parse_layout(mountinfo: &str, fs_root: &Path) -> Option<Mounts> {
    let mut v1 = BTreeMap::new();
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split_whitespace().nth(4).map(unescape) else {
            continue;
        };
        let mount_point = PathBuf::from(mount_point);
        if !mount_point.starts_with(fs_root) {
            continue;
        }
        let mut fields = right.split_whitespace();
        let fs_type = fields.next().unwrap_or("");
        let super_opts = fields.nth(1).unwrap_or("");
        match fs_type {
            "cgroup2" => v2 = Some(mount_point),
            "cgroup" => {
                for opt in super_opts.split(',') {
                    if V1_CONTROLLERS.contains(&opt) {
                        v1.entry(opt.to_string())
                            .or_insert_with(|| mount_point.clone());
                    }
                }
            }
            _ => {}
        }
    }
    let layout = match (&v2, v1.is_empty()) {
        (Some(p), _) if p == fs_root => Layout::V2,
        (Some(_), false) => Layout::Hybrid,
        (None, false) => Layout::V1,
        (Some(_), true) => Layout::V2,
        (None, true) => return None,
    };
    Some(Mounts { layout, v1, v2 })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let oct = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where cgroup filesystems are mounted on every supported host.
pub const DEFAULT_FS_ROOT: &str = "/sys/fs/cgroup";

impl Mounts {
    /// Directories holding sandbox cgroups: the v2 mount, or each distinct
    /// v1 controller mount (co-mounted controllers share one).
    pub fn hierarchy_roots(&self) -> Vec<PathBuf> {
        if self.layout.uses_v1() {
            let set: BTreeSet<&PathBuf> = self.v1.values().collect();
            set.into_iter().cloned().collect()
        } else {
            self.v2.iter().cloned().collect()
        }
    }
}

/// Moves the process `pid` into the cgroup `path` (OCI
/// `linux.cgroupsPath`: `/<parent>/<sandbox id>`, relative to each
/// hierarchy's root; made and limited by the daemon) in every hierarchy
/// of `mounts`: one write of the PID into `cgroup.procs` each. `path`
/// must be plain components ending in a valid sandbox id, and the cgroup
/// must exist in at least one hierarchy. Errors are in plain words, for
/// the launcher's report.
pub fn join(mounts: &Mounts, path: &Path, pid: u32) -> Result<(), String> {
    use std::io::Write;
    use std::path::Component;
    let id = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("no sandbox id in the path")?;
    crate::model::validate_node_key(id)
        .map_err(|_| format!("invalid sandbox id {id:?} for a cgroup name"))?;
    let mut rel = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => rel.push(n),
            _ => return Err("the path must be plain components".into()),
        }
    }
    let dirs: Vec<PathBuf> = mounts
        .hierarchy_roots()
        .iter()
        .map(|r| r.join(&rel))
        .collect();
    if !dirs.iter().any(|d| d.is_dir()) {
        return Err("the cgroup does not exist".into());
    }
    let value = pid.to_string();
    for dir in dirs {
        let file = dir.join("cgroup.procs");
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&file)
            .and_then(|mut f| f.write_all(value.as_bytes()))
            .map_err(|e| format!("cannot write {value:?} to {}: {e}", file.display()))?;
    }
    Ok(())
}

/// [`join`] with the host's mounts (`/proc/self/mountinfo`, under
/// [`DEFAULT_FS_ROOT`]).
pub fn join_host(path: &Path, pid: u32) -> Result<(), String> {
    let mi = Path::new("/proc/self/mountinfo");
    let text = std::fs::read_to_string(mi).map_err(|e| {
        format!(
            "cannot read {} to detect the cgroup layout: {e}",
            mi.display()
        )
    })?;
    let mounts = parse_layout(&text, Path::new(DEFAULT_FS_ROOT))
        .ok_or_else(|| format!("no cgroup filesystem is mounted under {DEFAULT_FS_ROOT}"))?;
    join(&mounts, path, pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(layout: Layout, root: &Path) -> Mounts {
        let mut v1 = BTreeMap::new();
        if layout.uses_v1() {
            for c in V1_CONTROLLERS {
                // cpu and cpuacct co-mounted, as on most v1 hosts.
                let dir = if c == "cpuacct" { "cpu" } else { c };
                v1.insert(c.to_string(), root.join(dir));
            }
        }
        let v2 = match layout {
            Layout::V2 => Some(root.to_path_buf()),
            Layout::Hybrid => Some(root.join("unified")),
            Layout::V1 => None,
        };
        Mounts { layout, v1, v2 }
    }

    #[test]
    fn join_writes_the_pid_into_every_hierarchy_once() {
        for layout in [Layout::V1, Layout::Hybrid, Layout::V2] {
            let t = tempfile::tempdir().unwrap();
            let m = fake(layout, t.path());
            let roots = m.hierarchy_roots();
            for r in &roots {
                std::fs::create_dir_all(r.join("sandboxd/abc")).unwrap();
                std::fs::write(r.join("sandboxd/abc/cgroup.procs"), "").unwrap();
            }
            join(&m, Path::new("/sandboxd/abc"), 42).unwrap();
            for r in &roots {
                let got = std::fs::read_to_string(r.join("sandboxd/abc/cgroup.procs")).unwrap();
                assert_eq!(got, "42", "{layout} {}", r.display());
            }
            let expected = if layout.uses_v1() {
                V1_CONTROLLERS.len() - 1
            } else {
                1
            };
            assert_eq!(roots.len(), expected, "{layout}");
            if layout == Layout::Hybrid {
                assert!(!t.path().join("unified/sandboxd/abc").exists());
            }
        }
    }

    #[test]
    fn join_refuses_a_missing_cgroup_and_bad_paths() {
        let t = tempfile::tempdir().unwrap();
        let m = fake(Layout::V2, t.path());
        let e = join(&m, Path::new("/sandboxd/abc"), 1).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        std::fs::create_dir_all(t.path().join("x/abc")).unwrap();
        for bad in ["/sandboxd/../x/abc", "/", "/sandboxd/a b"] {
            assert!(join(&m, Path::new(bad), 1).is_err(), "{bad}");
        }
    }
}
