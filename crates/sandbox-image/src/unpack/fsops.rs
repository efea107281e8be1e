//! Filesystem operations relative to directory fds.
//!
//! Nothing here takes a host path. Paths inside the rootfs are resolved by
//! the kernel with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` from the rootfs fd — `..` and absolute symlinks are
//! clamped at the rootfs, `/proc` magic links and mount crossings refused —
//! and final components are only ever touched with `*at` calls on a single
//! name that never follow it (`O_NOFOLLOW`, `O_EXCL`, `AT_SYMLINK_NOFOLLOW`,
//! `unlinkat`, `mkdirat`, `symlinkat`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{
    fstat, openat, openat2, statat, unlinkat, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags,
    Stat,
};
use rustix::io::Errno;

pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Opens `path` (relative, already normalized) inside `root`, the kernel
/// keeping every step of the resolution inside it. `flags` decides whether
/// the final component may be a symlink (`O_NOFOLLOW` or not).
pub(crate) fn open_in_root(
    root: BorrowedFd<'_>,
    path: &[u8],
    flags: OFlags,
) -> io::Result<OwnedFd> {
    let path: &[u8] = if path.is_empty() { b"." } else { path };
    let mut tries = 0;
    loop {
        // EAGAIN: a concurrent rename/mount raced the resolution; the
        // kernel asks to retry.
        match openat2(root, path, flags | OFlags::CLOEXEC, Mode::empty(), RESOLVE) {
            Err(Errno::AGAIN) if tries < 16 => tries += 1,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `None` when absent.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<Stat>> {
    match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn is_dir(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}

/// Opens the directory `name` in `dir` for reading, never following a
/// symlink there.
pub(crate) fn open_subdir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    Ok(openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Identifies an entry as "created by the layer being applied": the device
/// and inode of its directory plus its name.
pub(crate) type EntryKey = (u64, u64, Box<[u8]>);

pub(crate) fn key(dir: &Stat, name: &[u8]) -> EntryKey {
    let (dev, ino) = dev_ino(dir);
    (dev, ino, name.into())
}

/// Device and inode (their C types differ between architectures).
#[allow(clippy::unnecessary_cast)]
pub(crate) fn dev_ino(st: &Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// Removes `name` from `dir` whatever it is; a directory with everything
/// below it. Symlinks are unlinked, never followed.
pub(crate) fn remove_entry(dir: BorrowedFd<'_>, name: &CStr, st: &Stat) -> io::Result<()> {
    if is_dir(st) {
        let sub = open_subdir(dir, name)?;
        prune(sub, &|_| false)?;
        unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(())
}

struct Level {
    /// Name of this directory in its parent (unused for the start level).
    name: CString,
    /// Device/inode of the parent, to check `..` when climbing back.
    parent: (u64, u64),
    /// Subdirectories still to visit: (name, remove it whole?).
    pending: Vec<(CString, bool)>,
    /// Remove this directory once emptied.
    remove_self: bool,
}

/// Removes every entry below the directory `start` that `keep` does not
/// protect. A protected directory is descended into (its unprotected
/// entries go); an unprotected one is removed whole; a protected
/// non-directory stays. `start` itself stays.
///
/// Never follows a symlink (entries are inspected with `d_type`/`lstat` and
/// unlinked), never leaves the device of `start`, and holds O(1) fds however
/// deep the tree: it climbs back with `..`, checking the parent's inode. The
/// tree must not be modified concurrently (the rootfs being built is private
/// to the unpacker).
pub(crate) fn prune(start: OwnedFd, keep: &dyn Fn(&EntryKey) -> bool) -> io::Result<()> {
    let st = fstat(&start)?;
    let dev = dev_ino(&st).0;
    let mut cur = start;
    let mut stack = vec![Level {
        name: CString::default(),
        parent: (0, 0),
        pending: scan(cur.as_fd(), &st, false, keep)?,
        remove_self: false,
    }];
    loop {
        let top = stack.last_mut().expect("stack never empty in the loop");
        if let Some((name, whole)) = top.pending.pop() {
            let here = fstat(&cur)?;
            let child = open_subdir(cur.as_fd(), &name)?;
            let cst = fstat(&child)?;
            if dev_ino(&cst).0 != dev {
                return Err(Errno::XDEV.into());
            }
            let pending = scan(child.as_fd(), &cst, whole, keep)?;
            stack.push(Level {
                name,
                parent: dev_ino(&here),
                pending,
                remove_self: whole,
            });
            cur = child;
        } else {
            let done = stack.pop().expect("stack never empty in the loop");
            if stack.is_empty() {
                return Ok(());
            }
            let up = open_subdir(cur.as_fd(), c"..")?;
            let ust = fstat(&up)?;
            if dev_ino(&ust) != done.parent {
                return Err(io::Error::other(
                    "directory moved while being removed (rootfs modified concurrently)",
                ));
            }
            if done.remove_self {
                unlinkat(&up, &done.name, AtFlags::REMOVEDIR)?;
            }
            cur = up;
        }
    }
}

/// One directory of [`prune`]: unlinks its unprotected non-directories and
/// returns the subdirectories to visit.
fn scan(
    dir: BorrowedFd<'_>,
    st: &Stat,
    whole: bool,
    keep: &dyn Fn(&EntryKey) -> bool,
) -> io::Result<Vec<(CString, bool)>> {
    let mut names = Vec::new();
    for e in Dir::read_from(dir)? {
        let e = e?;
        let name = e.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        names.push((name.to_owned(), e.file_type()));
    }
    let mut subdirs = Vec::new();
    for (name, mut ft) in names {
        if ft == FileType::Unknown {
            match lstat_at(dir, &name)? {
                Some(s) => ft = FileType::from_raw_mode(s.st_mode),
                None => continue,
            }
        }
        let protected = !whole && keep(&key(st, name.as_bytes()));
        if ft == FileType::Directory {
            subdirs.push((name, !protected));
        } else if !protected {
            unlinkat(dir, &name, AtFlags::empty())?;
        }
    }
    Ok(subdirs)
}
