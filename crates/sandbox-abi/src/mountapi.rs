//! The one `mount_setattr(2)` wrapper (neither rustix nor nix wraps it)
//! and the detached-tree steps built on it, shared by the launcher (binds
//! into a new sandbox) and the daemon (a warm-pool claim binds the user's
//! directories into a running one).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::mount::{MountAttrFlags, MoveMountFlags, OpenTreeFlags};

/// Mount propagation types for [`mount_setattr`] (`MS_PRIVATE`,
/// `MS_SLAVE`, ... of `<linux/mount.h>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Unchanged,
    Private,
    Slave,
    Shared,
}

impl Propagation {
    fn bits(self) -> u64 {
        match self {
            Propagation::Unchanged => 0,
            Propagation::Private => libc::MS_PRIVATE,
            Propagation::Slave => libc::MS_SLAVE,
            Propagation::Shared => libc::MS_SHARED,
        }
    }
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH [| AT_RECURSIVE], attr)`: sets the
/// attributes `set` (with `MOUNT_ATTR_IDMAP`, `userns` names the user
/// namespace) and the propagation type of the mount `fd` refers to.
pub fn mount_setattr(
    fd: BorrowedFd<'_>,
    recursive: bool,
    set: MountAttrFlags,
    propagation: Propagation,
    userns: Option<BorrowedFd<'_>>,
) -> Result<(), std::io::Error> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
        attr_set: u64::from(set.bits()),
        attr_clr: 0,
        propagation: propagation.bits(),
        userns_fd: userns.map_or(0, |u| u.as_raw_fd() as u64),
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: mount_setattr reads `size_of::<MountAttr>()` bytes from
    // `attr` (the kernel's `struct mount_attr`, version 0 layout), which
    // lives for the call; the path is a NUL-terminated empty string.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A detached copy (`open_tree(OPEN_TREE_CLONE)`) of the mount at `src`,
/// an fd opened without following symlinks (no new path lookup of the
/// source). The copy of a shared mount joins its peer group.
pub fn clone_tree(src: BorrowedFd<'_>, recursive: bool) -> Result<OwnedFd, std::io::Error> {
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE
        | OpenTreeFlags::OPEN_TREE_CLOEXEC
        | OpenTreeFlags::AT_EMPTY_PATH;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    Ok(rustix::mount::open_tree(src, "", flags)?)
}

/// Attaches the detached tree `tree` at `target`.
pub fn attach(tree: BorrowedFd<'_>, target: &Path) -> Result<(), std::io::Error> {
    Ok(rustix::mount::move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )?)
}
