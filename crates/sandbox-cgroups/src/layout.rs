//! Cgroup layout detection from `/proc/self/mountinfo`: the parser is
//! `sandbox-abi`'s [`cgroupfs`](sandbox_abi::cgroupfs), shared with the
//! launcher, which joins a sandbox's cgroup itself.

use std::collections::BTreeMap;
use std::path::Path;

pub use sandbox_abi::cgroupfs::{parse_layout, Layout, Mounts, V1_CONTROLLERS};

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
