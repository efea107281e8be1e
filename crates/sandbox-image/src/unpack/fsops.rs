//! Filesystem operations relative to directory fds.
//!
//! Nothing here takes a host path. Paths inside the rootfs are resolved by
//! the kernel with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` from the rootfs fd — `..` and absolute symlinks are
//! clamped at the rootfs, `/proc` magic links and mount crossings refused —
//! and final components are only ever touched with `*at` calls on a single
//! name that never follow it (`O_NOFOLLOW`, `O_EXCL`, `AT_SYMLINK_NOFOLLOW`,
//! `unlinkat`, `mkdirat`, `symlinkat`).

use std::collections::HashSet;
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
        prune(sub, None)?;
        unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(())
}

/// What a whiteout spares: the entries the layer being applied wrote.
pub(crate) struct Keep<'a> {
    /// Entries written by the layer (directory dev/inode + name).
    pub created: &'a HashSet<EntryKey>,
    /// Directories already pruned in this layer: nothing of a lower layer is
    /// left below them (only the layer writes while it is applied), so they
    /// are not walked again — whiteouts cost O(tree) per layer, not per
    /// marker.
    pub clean: &'a mut HashSet<(u64, u64)>,
}

struct Level {
    /// Name of this directory in its parent (unused for the start level).
    name: CString,
    id: (u64, u64),
    /// Device/inode of the parent, to check `..` when climbing back.
    parent: (u64, u64),
    /// Subdirectories still to visit: (name, written by the layer?).
    pending: Vec<(CString, bool)>,
    /// Written by the layer: stays even when empty.
    protected: bool,
    /// Entries that stay in it.
    kept: u64,
}

/// Removes what lies below the directory `start`: everything with `keep`
/// `None`; otherwise everything the layer did not write — a directory stays
/// if the layer wrote it or wrote something below it (a layer listing
/// `d/sub/f` has `d/sub` even if it omits its entry), losing the rest.
/// `start` itself stays; returns whether anything is left in it.
///
/// Never follows a symlink (entries are inspected with `d_type`/`lstat` and
/// unlinked), never leaves the device of `start`, and holds O(1) fds however
/// deep the tree: it climbs back with `..`, checking the parent's inode. The
/// tree must not be modified concurrently (the rootfs being built is private
/// to the unpacker).
pub(crate) fn prune(start: OwnedFd, mut keep: Option<&mut Keep<'_>>) -> io::Result<bool> {
    let st = fstat(&start)?;
    let (dev, _) = dev_ino(&st);
    if let Some(k) = &keep {
        if k.clean.contains(&dev_ino(&st)) {
            return Ok(true);
        }
    }
    let created = keep.as_ref().map(|k| k.created);
    let (pending, kept) = scan(start.as_fd(), &st, created)?;
    let mut cur = start;
    let mut stack = vec![Level {
        name: CString::default(),
        id: dev_ino(&st),
        parent: (0, 0),
        pending,
        protected: true,
        kept,
    }];
    loop {
        let top = stack.last_mut().expect("stack never empty in the loop");
        if let Some((name, protected)) = top.pending.pop() {
            let child = open_subdir(cur.as_fd(), &name)?;
            let cst = fstat(&child)?;
            let id = dev_ino(&cst);
            if id.0 != dev {
                return Err(Errno::XDEV.into());
            }
            if keep.as_ref().is_some_and(|k| k.clean.contains(&id)) {
                top.kept += 1;
                continue;
            }
            let here = top.id;
            let (pending, kept) = scan(child.as_fd(), &cst, created)?;
            stack.push(Level {
                name,
                id,
                parent: here,
                pending,
                protected,
                kept,
            });
            cur = child;
        } else {
            let done = stack.pop().expect("stack never empty in the loop");
            let stays = done.protected || done.kept > 0;
            if stays {
                if let Some(k) = keep.as_mut() {
                    k.clean.insert(done.id);
                }
            }
            let Some(parent) = stack.last_mut() else {
                return Ok(done.kept > 0);
            };
            let up = open_subdir(cur.as_fd(), c"..")?;
            if dev_ino(&fstat(&up)?) != done.parent {
                return Err(io::Error::other(
                    "directory moved while being removed (rootfs modified concurrently)",
                ));
            }
            if stays {
                parent.kept += 1;
            } else {
                unlinkat(&up, &done.name, AtFlags::REMOVEDIR)?;
            }
            cur = up;
        }
    }
}

/// One directory of [`prune`]: unlinks the non-directories the layer did
/// not write; returns the subdirectories to visit and how many entries stay.
fn scan(
    dir: BorrowedFd<'_>,
    st: &Stat,
    created: Option<&HashSet<EntryKey>>,
) -> io::Result<(Vec<(CString, bool)>, u64)> {
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
    let mut kept = 0;
    for (name, mut ft) in names {
        if ft == FileType::Unknown {
            match lstat_at(dir, &name)? {
                Some(s) => ft = FileType::from_raw_mode(s.st_mode),
                None => continue,
            }
        }
        let protected = created.is_some_and(|c| c.contains(&key(st, name.as_bytes())));
        if ft == FileType::Directory {
            subdirs.push((name, protected));
        } else if protected {
            kept += 1;
        } else {
            unlinkat(dir, &name, AtFlags::empty())?;
        }
    }
    Ok((subdirs, kept))
}
