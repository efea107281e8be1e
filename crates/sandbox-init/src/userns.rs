//! The sandbox's user namespace and its idmapped mounts.
//!
//! Everything here runs in the launcher while it is still root in the
//! host's user namespace (the kernel requires `CAP_SYS_ADMIN` in the user
//! namespace of a filesystem's superblock to idmap a mount of it, and
//! `CAP_SETUID`/`CAP_SETGID` in the parent namespace to write a map).
//!
//! - [`create`] makes the sandbox's user namespace: a short-lived holder
//!   child unshares it, the launcher writes `setgroups` (`deny`),
//!   `uid_map` and `gid_map` directly (as host root, no `newuidmap`),
//!   opens `/proc/<holder>/ns/user` and lets the holder go. The launcher
//!   later joins it with `setns` and creates the sandbox's other
//!   namespaces from inside, so the sandbox's root owns them.
//! - [`bind_idmapped`] binds one host directory or file, already opened
//!   without following symlinks, at a target: `open_tree(OPEN_TREE_CLONE)`
//!   of that fd (a detached copy: no new path lookup of the source),
//!   `mount_setattr(MOUNT_ATTR_IDMAP | flags)` with the sandbox's user
//!   namespace, then `move_mount` onto the target. Through such a mount an
//!   on-disk id `n` appears as the sandbox's id `n` (host id `base + n`),
//!   so the sandbox's uid 1000 owns what the platform wrote as 1000:1000
//!   and what it writes lands as 1000:1000 on disk.
//! - [`probe`] checks that all of this works for some host paths (the
//!   daemon runs `sandbox-init --probe-idmap PATH ...` at start-up).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::unistd::ForkResult;
use rustix::mount::{MountAttrFlags, MoveMountFlags, OpenTreeFlags};
use sandbox_abi::mountapi::{self, Propagation};

/// One line of a `uid_map`/`gid_map`: `size` ids from `container` inside
/// map to `host` outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub container: u32,
    pub host: u32,
    pub size: u32,
}

impl IdMap {
    /// The host id of `id` inside, when this line maps it.
    pub fn to_host(&self, id: u32) -> Option<u32> {
        let off = id.checked_sub(self.container)?;
        (off < self.size).then(|| self.host + off)
    }
}

/// The host id of `id` inside under `maps`.
pub fn to_host(maps: &[IdMap], id: u32) -> Option<u32> {
    maps.iter().find_map(|m| m.to_host(id))
}

/// The text written to `uid_map`/`gid_map`.
pub fn render(maps: &[IdMap]) -> String {
    maps.iter()
        .map(|m| format!("{} {} {}\n", m.container, m.host, m.size))
        .collect()
}

fn os(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The holder child of [`create`], already told to exit; dropping it reaps
/// it (kept until then so the launcher does not wait for its exit on the
/// critical path).
pub struct Holder(nix::unistd::Pid);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = nix::sys::wait::waitpid(self.0, None);
    }
}

/// Creates a user namespace with these maps, owned by host uid `owner`
/// (the kernel charges the per-user limits of everything inside it, such
/// as inotify instances, to its owner at the host level: one owner per
/// sandbox keeps sandboxes from sharing those limits), and returns an fd
/// of it and its holder process (exiting; reaped when dropped).
/// `setgroups` is denied in it. Must run single-threaded and as host root.
pub fn create(uid: &[IdMap], gid: &[IdMap], owner: u32) -> Result<(OwnedFd, Holder), String> {
    let (ready_r, ready_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| os("pipe", e))?;
    let (release_r, release_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| os("pipe", e))?;
    // SAFETY: the launcher is single-threaded, so the child may run any
    // code; it only makes syscalls and exits with _exit.
    match unsafe { nix::unistd::fork() }.map_err(|e| os("fork the user namespace holder", e))? {
        ForkResult::Child => {
            drop(ready_r);
            drop(release_w);
            let code = match holder(owner) {
                Ok(()) => {
                    let _ = nix::unistd::write(&ready_w, b"1");
                    // Stay until the launcher has what it needs (EOF).
                    let mut b = [0u8; 1];
                    let _ = nix::unistd::read(release_r.as_raw_fd(), &mut b);
                    0
                }
                Err(e) => {
                    let msg = format!("{e}\n");
                    let _ = nix::unistd::write(&ready_w, msg.as_bytes());
                    1
                }
            };
            // SAFETY: _exit ends the child without running the parent's
            // atexit handlers or destructors twice.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(ready_w);
            drop(release_r);
            let result = (|| {
                let mut buf = [0u8; 512];
                let n = nix::unistd::read(ready_r.as_raw_fd(), &mut buf)
                    .map_err(|e| os("wait for the user namespace holder", e))?;
                if n != 1 || buf[0] != b'1' {
                    let said = String::from_utf8_lossy(&buf[..n]).trim().to_string();
                    return Err(if said.is_empty() {
                        "the user namespace holder exited".to_string()
                    } else {
                        said
                    });
                }
                let proc = PathBuf::from(format!("/proc/{}", child.as_raw()));
                let write = |name: &str, text: &str| {
                    std::fs::write(proc.join(name), text)
                        .map_err(|e| os(&format!("write {name} {:?}", text.trim()), e))
                };
                write("setgroups", "deny")?;
                write("uid_map", &render(uid))?;
                write("gid_map", &render(gid))?;
                std::fs::File::open(proc.join("ns/user"))
                    .map(OwnedFd::from)
                    .map_err(|e| os("open the user namespace", e))
            })();
            drop(release_w);
            let holder = Holder(child);
            result.map(|fd| (fd, holder))
        }
    }
}

/// The holder child: owned by `owner`, keeping its capabilities so that a
/// host restricting unprivileged user namespaces still lets it.
fn holder(owner: u32) -> Result<(), String> {
    let none = nix::unistd::Uid::from_raw(u32::MAX);
    nix::unistd::setresuid(none, nix::unistd::Uid::from_raw(owner), none)
        .map_err(|e| os("seteuid", e))?;
    // Leaving euid 0 cleared the effective set; the permitted set is
    // intact (real and saved uid are still 0).
    let permitted = caps::read(None, caps::CapSet::Permitted).map_err(|e| os("capget", e))?;
    caps::set(None, caps::CapSet::Effective, &permitted).map_err(|e| os("capset", e))?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)
        .map_err(|e| os("unshare(CLONE_NEWUSER)", e))
}

/// A detached, idmapped copy of the mount tree at `src` (an fd opened
/// without following symlinks): `open_tree(OPEN_TREE_CLONE)` on the fd
/// itself, then `mount_setattr(MOUNT_ATTR_IDMAP | attrs)` with `userns`.
/// `recursive` copies and idmaps the mounts below it too.
pub fn idmapped_tree(
    src: BorrowedFd<'_>,
    recursive: bool,
    attrs: MountAttrFlags,
    userns: BorrowedFd<'_>,
) -> Result<OwnedFd, String> {
    let tree = mountapi::clone_tree(src, recursive).map_err(|e| os("open_tree", e))?;
    mountapi::mount_setattr(
        tree.as_fd(),
        recursive,
        attrs | MountAttrFlags::MOUNT_ATTR_IDMAP,
        Propagation::Unchanged,
        Some(userns),
    )
    .map_err(|e| os("mount_setattr(MOUNT_ATTR_IDMAP)", e))?;
    Ok(tree)
}

/// Binds `src` (a directory or file opened without following symlinks)
/// at `target`, idmapped through `userns`, with the mount attributes
/// `attrs` (`MOUNT_ATTR_RDONLY`, `NOSUID`, ...). The one function every
/// host directory or file bound into a sandbox with a user namespace goes
/// through (user data, skills, host `/usr`, the agent, an image rootfs).
pub fn bind_idmapped(
    src: BorrowedFd<'_>,
    target: &Path,
    recursive: bool,
    attrs: MountAttrFlags,
    userns: BorrowedFd<'_>,
) -> Result<(), String> {
    let tree = idmapped_tree(src, recursive, attrs, userns)?;
    rustix::mount::move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| os("move_mount", e))
}

/// The mount attributes of OCI mount flags.
pub fn attrs_of(flags: nix::mount::MsFlags) -> MountAttrFlags {
    use nix::mount::MsFlags as M;
    let mut a = MountAttrFlags::empty();
    for (f, attr) in [
        (M::MS_RDONLY, MountAttrFlags::MOUNT_ATTR_RDONLY),
        (M::MS_NOSUID, MountAttrFlags::MOUNT_ATTR_NOSUID),
        (M::MS_NODEV, MountAttrFlags::MOUNT_ATTR_NODEV),
        (M::MS_NOEXEC, MountAttrFlags::MOUNT_ATTR_NOEXEC),
    ] {
        if flags.contains(f) {
            a |= attr;
        }
    }
    a
}

/// Re-attaches a copy of the mount tree at the current directory on top
/// of it and enters the copy. After the sandbox's mount namespace was
/// copied from the launcher's, every mount below its root is locked (the
/// sandbox's root may neither unmount nor loosen it), and `pivot_root`
/// refuses a locked new root; the copy's top is not locked, the mounts
/// below it stay locked. Works from the current directory because the
/// sandbox's root may not search the daemon's state directory.
pub fn reattach_cwd() -> Result<(), String> {
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        ".",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_RECURSIVE,
    )
    .map_err(|e| os("open_tree .", e))?;
    rustix::mount::move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        ".",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| os("move_mount onto .", e))?;
    rustix::process::fchdir(&tree).map_err(|e| os("fchdir", e))
}

/// Joins the user namespace `ns`, drops the host's supplementary groups
/// first (setgroups is denied inside), and becomes its root (uid and gid
/// 0 inside, which are mapped; the capabilities the join gave stay).
pub fn enter(ns: &OwnedFd) -> Result<(), String> {
    nix::unistd::setgroups(&[]).map_err(|e| os("setgroups([])", e))?;
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWUSER)
        .map_err(|e| os("setns(CLONE_NEWUSER)", e))?;
    let root_g = nix::unistd::Gid::from_raw(0);
    nix::unistd::setresgid(root_g, root_g, root_g).map_err(|e| os("setresgid(0)", e))?;
    let root = nix::unistd::Uid::from_raw(0);
    nix::unistd::setresuid(root, root, root).map_err(|e| os("setresuid(0)", e))
}

/// The sandbox-side maps: ids `0..size` inside to `base..base+size`.
pub fn shifted(base: u32, size: u32) -> Vec<IdMap> {
    vec![IdMap {
        container: 0,
        host: base,
        size,
    }]
}

/// Checks that idmapped mounts work for each of `paths` with a user
/// namespace mapping `0..65536` to `base..`: creates that namespace, then
/// for each path opens it without following symlinks, makes a detached
/// idmapped copy and checks through the copy that the owner appears
/// shifted by `base`. Returns the first failure, naming the path.
pub fn probe(paths: &[PathBuf], base: u32) -> Result<(), String> {
    let maps = shifted(base, 65536);
    let (ns, _holder) = create(&maps, &maps, base).map_err(|e| format!("user namespace: {e}"))?;
    for p in paths {
        let fd = sandbox_abi::paths::open_any_nofollow(p)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        let disk = rustix::fs::fstat(&fd).map_err(|e| format!("{}: fstat: {e}", p.display()))?;
        let tree = idmapped_tree(
            fd.as_fd(),
            false,
            MountAttrFlags::MOUNT_ATTR_RDONLY,
            ns.as_fd(),
        )
        .map_err(|e| format!("{}: {e}", p.display()))?;
        let seen = rustix::fs::fstat(&tree).map_err(|e| format!("{}: fstat: {e}", p.display()))?;
        if disk.st_uid < 65536 && seen.st_uid != base + disk.st_uid {
            return Err(format!(
                "{}: owner {} on disk appears as {} through the idmapped mount, expected {}",
                p.display(),
                disk.st_uid,
                seen.st_uid,
                base + disk.st_uid
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps() {
        let m = shifted(1 << 31, 65536);
        assert_eq!(render(&m), "0 2147483648 65536\n");
        assert_eq!(to_host(&m, 1000), Some((1 << 31) + 1000));
        assert_eq!(to_host(&m, 65536), None);
    }
}
