//! No-follow path handling for every host path a sandbox mounts.
//!
//! Paths under the user-data and skills roots are partly controlled by
//! sandbox users (they can create symlinks in their workspace). Every such
//! path is opened component by component with `openat2` and
//! `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH` (through rustix), and the mount
//! is then made from the opened fd (`/proc/self/fd/N`), so a symlink swapped
//! in between a check and the mount can never redirect it.
//!
//! This module only opens and creates; it never deletes anything.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::layout::GUEST;

#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("{path} is not an absolute path")]
    NotAbsolute { path: PathBuf },
    #[error("{path} has a '..' or '.' component")]
    DotComponent { path: PathBuf },
    #[error("{path} does not exist")]
    Missing { path: PathBuf },
    #[error("{path} is or passes through a symlink")]
    Symlink { path: PathBuf },
    #[error("{path} is not a directory")]
    NotDirectory { path: PathBuf },
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl PathError {
    /// True when the error is the caller's fault (HTTP 400), not the node's.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            PathError::Missing { .. }
                | PathError::Symlink { .. }
                | PathError::NotDirectory { .. }
                | PathError::DotComponent { .. }
        )
    }
}

fn classify(path: &Path, e: rustix::io::Errno) -> PathError {
    let path = path.to_path_buf();
    match e {
        rustix::io::Errno::NOENT => PathError::Missing { path },
        rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => PathError::Symlink { path },
        rustix::io::Errno::NOTDIR => PathError::NotDirectory { path },
        e => PathError::Open {
            path,
            source: e.into(),
        },
    }
}

/// No symlink anywhere (a trailing one too: O_NOFOLLOW is deliberately not
/// passed, since with O_PATH it would return the link itself), nothing
/// outside the starting directory, no magic links.
fn no_follow() -> ResolveFlags {
    ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// Checks that `rel` is a plain relative path (no `..`, `.`, root).
fn check_relative(rel: &Path) -> Result<(), PathError> {
    for c in rel.components() {
        match c {
            Component::Normal(_) => {}
            _ => {
                return Err(PathError::DotComponent {
                    path: rel.to_path_buf(),
                })
            }
        }
    }
    Ok(())
}

/// Opens the absolute `path` as an `O_PATH` directory fd, refusing any
/// symlink in any component.
pub fn open_dir_nofollow(path: &Path) -> Result<OwnedFd, PathError> {
    let rel = path.strip_prefix("/").map_err(|_| PathError::NotAbsolute {
        path: path.to_path_buf(),
    })?;
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| classify(Path::new("/"), e))?;
    if rel.as_os_str().is_empty() {
        return Ok(root);
    }
    open_beneath(&root, rel, path)
}

/// Opens `rel` beneath the directory `base` (O_PATH, directory, no symlinks
/// anywhere); `shown` is the path used in errors.
pub fn open_beneath(base: &impl AsFd, rel: &Path, shown: &Path) -> Result<OwnedFd, PathError> {
    check_relative(rel)?;
    rustix::fs::openat2(
        base,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        no_follow(),
    )
    .map_err(|e| classify(shown, e))
}

/// Opens an absolute path of any type (file or directory) as O_PATH with
/// no symlink anywhere (bind sources that are files, e.g. the agent).
pub fn open_any_nofollow(path: &Path) -> Result<OwnedFd, PathError> {
    let rel = path.strip_prefix("/").map_err(|_| PathError::NotAbsolute {
        path: path.to_path_buf(),
    })?;
    check_relative(rel)?;
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| classify(Path::new("/"), e))?;
    rustix::fs::openat2(
        &root,
        rel,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        no_follow(),
    )
    .map_err(|e| classify(path, e))
}

/// The path through which a mount can be made from an opened fd.
pub fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Ensures every component of `rel` exists beneath `root` (an absolute,
/// trusted directory). Missing components are created mode 0700 and owned
/// 1000:1000; existing ones are left untouched. No symlink is ever
/// followed. Returns the fd of the last component.
pub fn ensure_user_dirs(root: &Path, rel: &Path) -> Result<OwnedFd, PathError> {
    check_relative(rel)?;
    let mut dir = open_dir_nofollow(root)?;
    let mut shown = root.to_path_buf();
    for comp in rel.components() {
        let name = comp.as_os_str();
        shown.push(name);
        match open_beneath(&dir, Path::new(name), &shown) {
            Ok(fd) => dir = fd,
            Err(PathError::Missing { .. }) => {
                match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => {
                        return Err(PathError::Create {
                            path: shown,
                            source: e.into(),
                        })
                    }
                }
                // Open for real (not O_PATH) to fchown/fchmod what we made.
                let fd = rustix::fs::openat2(
                    &dir,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                    Mode::empty(),
                    no_follow(),
                )
                .map_err(|e| classify(&shown, e))?;
                let own = |r: rustix::io::Result<()>| {
                    r.map_err(|e| PathError::Create {
                        path: shown.clone(),
                        source: e.into(),
                    })
                };
                own(rustix::fs::fchown(
                    &fd,
                    Some(rustix::fs::Uid::from_raw(GUEST.uid)),
                    Some(rustix::fs::Gid::from_raw(GUEST.gid)),
                ))?;
                own(rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)))?;
                dir = fd;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    #[test]
    fn refuses_symlinks_anywhere() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        symlink("/", root.join("a/link")).unwrap();
        symlink(root.join("a/b"), root.join("blink")).unwrap();
        assert!(open_dir_nofollow(&root.join("a/b")).is_ok());
        assert!(matches!(
            open_dir_nofollow(&root.join("a/link")),
            Err(PathError::Symlink { .. })
        ));
        assert!(matches!(
            open_dir_nofollow(&root.join("blink")),
            Err(PathError::Symlink { .. })
        ));
        assert!(matches!(
            open_dir_nofollow(&root.join("a/nope")),
            Err(PathError::Missing { .. })
        ));
        std::fs::write(root.join("f"), b"x").unwrap();
        assert!(matches!(
            open_dir_nofollow(&root.join("f")),
            Err(PathError::NotDirectory { .. })
        ));
        let base = open_dir_nofollow(&root).unwrap();
        assert!(matches!(
            open_beneath(&base, Path::new("a/../a"), Path::new("x")),
            Err(PathError::DotComponent { .. })
        ));
    }

    #[test]
    fn creates_private_user_dirs() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        ensure_user_dirs(&root, Path::new("shared/u1/workspace")).unwrap();
        let md = std::fs::metadata(root.join("shared/u1/workspace")).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o700);
        if rustix::process::geteuid().is_root() {
            assert_eq!((md.uid(), md.gid()), (GUEST.uid, GUEST.gid));
        }
        // A symlinked user root is refused, and nothing is created through it.
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path(), root.join("shared/u2")).unwrap();
        assert!(matches!(
            ensure_user_dirs(&root, Path::new("shared/u2/workspace")),
            Err(PathError::Symlink { .. })
        ));
        assert!(!outside.path().join("workspace").exists());
    }
}
