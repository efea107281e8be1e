//! Cgroup layout detection from `/proc/self/mountinfo`.

use std::collections::BTreeMap;
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
pub(crate) const V1_CONTROLLERS: [&str; 12] = [
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

/// The mounts a [`with_root`](super::CgroupRoot::with_root) tree is assumed
/// to have: v2 at the root, v1 controllers in `<root>/<controller>`.
pub(crate) fn assumed_mounts(fs_root: &Path, layout: Layout) -> Mounts {
    let v1 = if layout.uses_v1() {
        V1_CONTROLLERS
            .iter()
            .map(|c| (c.to_string(), fs_root.join(c)))
            .collect()
    } else {
        BTreeMap::new()
    };
    let v2 = match layout {
        Layout::V2 => Some(fs_root.to_path_buf()),
        Layout::Hybrid => Some(fs_root.join("unified")),
        Layout::V1 => None,
    };
    Mounts { layout, v1, v2 }
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
