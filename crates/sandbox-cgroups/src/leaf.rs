//! The daemon's own place in a delegated v2 subtree.

use std::path::{Path, PathBuf};

use super::layout::Layout;
use super::root::{check_id, normalize_parent, CgroupRoot};
use super::{files, CgroupError};

/// v2 "no internal processes" rule: a cgroup with controllers enabled for
/// its children cannot hold processes itself. Under systemd (`Delegate=yes`)
/// the daemon starts in its service cgroup, so it must first move into a
/// leaf (`<service>/<leaf>`, e.g. `daemon`) before sandboxes can be created
/// in `<service>/sandboxes/<id>`. Moves the whole process and returns the
/// service cgroup (relative to the hierarchy root, e.g.
/// `/system.slice/sandboxd.service`; `/` when the daemon runs in the root
/// cgroup, which is exempt and stays put). On v1/hybrid there is no such
/// rule (limits live in the v1 controllers): a no-op returning `None`.
pub fn move_self_to_leaf(root: &CgroupRoot, leaf: &str) -> Result<Option<PathBuf>, CgroupError> {
    if root.layout() != Layout::V2 {
        return Ok(None);
    }
    let path = Path::new("/proc/self/cgroup");
    let text = files::read(path)?;
    move_to_leaf(root.v2_root(), &text, std::process::id(), leaf).map(Some)
}

/// [`move_self_to_leaf`] when the sandboxes' parent lies inside the
/// daemon's own v2 cgroup (systemd `Delegate=yes` with `cgroup_parent`
/// under the service's cgroup): the daemon must leave that cgroup first.
/// Returns the service cgroup when it moved; `None` when it had no need
/// to (v1 or hybrid, the root cgroup, a parent elsewhere).
pub fn move_self_to_leaf_if_delegated(
    root: &CgroupRoot,
    leaf: &str,
) -> Result<Option<PathBuf>, CgroupError> {
    if root.layout() != Layout::V2 {
        return Ok(None);
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(own) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Ok(None);
    };
    let parent = root.relative_path("x");
    let parent = parent.parent().unwrap_or(Path::new("/"));
    if own != "/" && parent.starts_with(own) {
        let by_systemd = std::env::var_os("INVOCATION_ID").is_some();
        if let Some(e) = started_in_unit_root(own, parent, by_systemd) {
            return Err(e);
        }
        return move_self_to_leaf(root, leaf);
    }
    Ok(None)
}

/// The sandboxes' `parent` lies inside `own`, the daemon's cgroup: when
/// systemd started the daemon (`by_systemd`: `$INVOCATION_ID` is set) and
/// `own` is a unit's cgroup itself (`….service`), the layout cannot
/// survive a restart. Once a sandbox lives below `own`, `own` has
/// controllers enabled for its children, the kernel refuses to put a
/// process into it (EBUSY), and systemd, which always starts a service's
/// main process in the unit's own cgroup (before v254's
/// `DelegateSubgroup=`), fails every start: status=219/CGROUP, "Failed to
/// attach to cgroup …: Device or resource busy" (seen on Debian 12's
/// systemd 252, tests/vm/run.sh). The daemon moving itself into a leaf
/// does not help the next start. So it is refused up front. With
/// `DelegateSubgroup=daemon` systemd starts the daemon in
/// `<unit>/daemon`, `own` is that leaf, and `parent` is not inside it.
pub(crate) fn started_in_unit_root(
    own: &str,
    parent: &Path,
    by_systemd: bool,
) -> Option<CgroupError> {
    let unit = Path::new(own).file_name()?.to_str()?;
    if !by_systemd || !unit.ends_with(".service") {
        return None;
    }
    Some(CgroupError::DelegatedWithoutSubgroup {
        service: PathBuf::from(own),
        parent: parent.to_path_buf(),
    })
}

/// The testable part of [`move_self_to_leaf`].
pub(crate) fn move_to_leaf(
    v2_root: &Path,
    proc_cgroup: &str,
    pid: u32,
    leaf: &str,
) -> Result<PathBuf, CgroupError> {
    check_id(leaf)?;
    let current = proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| CgroupError::Parse {
            path: PathBuf::from("/proc/self/cgroup"),
            content: proc_cgroup.to_string(),
        })?;
    let current = normalize_parent(current).unwrap_or_default();
    if current.as_os_str().is_empty() {
        // The root cgroup is exempt from the rule: nothing to do.
        return Ok(PathBuf::from("/"));
    }
    if current.file_name().is_some_and(|n| n == leaf) {
        let service = current.parent().unwrap_or(Path::new(""));
        return Ok(Path::new("/").join(service));
    }
    let target = v2_root.join(&current).join(leaf);
    files::create_dirs(v2_root, &current.join(leaf), |_| Ok(()))?;
    let procs = target.join("cgroup.procs");
    files::write(&procs, &pid.to_string()).map_err(|e| match e {
        CgroupError::WriteFile { source, .. } => CgroupError::MoveSelf {
            path: target.clone(),
            source,
        },
        other => other,
    })?;
    tracing::info!(leaf = %target.display(), "daemon moved into its leaf cgroup");
    Ok(Path::new("/").join(current))
}
