//! Node-wide kernel settings the native backend needs, checked (and where
//! the kernel default is known to be too small, raised) once at start-up,
//! each change logged.
//!
//! Without user namespaces (`[userns] mode = "off"`, or `auto` on a node
//! without idmapped mounts) every native sandbox runs as host uid 1000, so
//! per-user kernel limits are shared by all tenants. The one whose kernel
//! default breaks normal use at a few dozen sandboxes is
//! `fs.inotify.max_user_instances` (128): editors, language servers and
//! `npm`/`vite` watchers take several each, and past 128 every tenant's
//! `inotify_init` fails. With user namespaces the kernel counts it per
//! sandbox (per owner of its user namespace), and the raised value is then
//! each sandbox's own budget. The remaining shared limits are documented
//! in `docs/security.md`.

use std::path::Path;

use tracing::{info, warn};

/// `fs.inotify.max_user_instances`.
pub const INOTIFY_INSTANCES: &str = "/proc/sys/fs/inotify/max_user_instances";
/// The kernel's default, raised when found.
pub const INOTIFY_INSTANCES_DEFAULT: u64 = 128;
/// What the daemon raises it to.
pub const INOTIFY_INSTANCES_RAISED: u64 = 8192;

/// Raises `fs.inotify.max_user_instances` from the kernel default (an
/// operator's own value is left alone). Returns the value in force.
pub fn tune(sysctl: &Path) -> Option<u64> {
    let current: u64 = std::fs::read_to_string(sysctl).ok()?.trim().parse().ok()?;
    if current != INOTIFY_INSTANCES_DEFAULT {
        return Some(current);
    }
    match std::fs::write(sysctl, INOTIFY_INSTANCES_RAISED.to_string()) {
        Ok(()) => {
            info!(
                sysctl = %sysctl.display(),
                from = current,
                to = INOTIFY_INSTANCES_RAISED,
                "raised the kernel default (without user namespaces every sandbox shares host uid 1000's inotify instances; with them it is each sandbox's budget)"
            );
            Some(INOTIFY_INSTANCES_RAISED)
        }
        Err(e) => {
            warn!(sysctl = %sysctl.display(), error = %e,
                  "cannot raise the inotify instance limit: sandboxes share 128 instances");
            Some(current)
        }
    }
}

/// Raises the daemon's soft open-file limit to its hard limit: it keeps a
/// few descriptors per live sandbox (pidfd, network namespace, output
/// FIFO, proxy connections), so the common soft default of 1024 runs out
/// at a few hundred sandboxes. Returns (before, after).
pub fn raise_nofile() -> Option<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return Some((soft, soft));
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            info!(from = soft, to = hard, "raised the open-file limit (RLIMIT_NOFILE) to its hard limit: a few descriptors per live sandbox");
            Some((soft, hard))
        }
        Err(e) => {
            warn!(soft, hard, error = %e, "cannot raise the open-file limit");
            Some((soft, soft))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_only_the_kernel_default() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("max_user_instances");
        std::fs::write(&f, "128\n").unwrap();
        assert_eq!(tune(&f), Some(INOTIFY_INSTANCES_RAISED));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "8192");
        std::fs::write(&f, "512\n").unwrap();
        assert_eq!(tune(&f), Some(512));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "512\n");
        assert_eq!(tune(&d.path().join("missing")), None);
    }
}
