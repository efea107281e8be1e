//! The one-time ownership migration, `sandboxd kube migrate-ownership`:
//! what the replaced provisioner's Kubernetes init step did, once per
//! volume instead of as root on every create.
//!
//! Data that older deployments wrote (as root, or as another uid) into the
//! user-data PVC is given to 1000:1000, so the non-root sandbox (and the
//! non-root init step, [`super::prepare`]) can write it. The walk is
//! fd-relative and never follows a symlink: every directory is opened with
//! `O_NOFOLLOW | O_DIRECTORY` below its parent's fd, every entry is changed
//! with `fchownat(AT_SYMLINK_NOFOLLOW)` (a symlink itself, never its
//! target), and nothing on another filesystem (a mount below the root) is
//! touched. When it finished, it makes the marker directory [`MARKER`] at
//! the root; a root that has it is left alone, so running it again (or
//! from every replica) does nothing.
//!
//! It needs root with `CHOWN` and `DAC_OVERRIDE`, so it runs as a Job (see
//! `deploy/kubernetes/migrate-ownership-job.yaml`), never in sandbox Pods.

use std::ffi::{CStr, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Gid, Mode, OFlags, Uid};
use sandbox_abi::layout::GUEST;
use sandbox_abi::paths;

/// The marker directory made at a migrated root.
pub const MARKER: &str = ".sandboxd-ownership-1000";

/// Arguments of `sandboxd kube migrate-ownership`.
#[derive(Debug, Clone, clap::Args)]
pub struct MigrateArgs {
    /// A volume root to migrate (the user-data PVC's mount point); repeat
    /// for more.
    #[arg(long = "root", required = true)]
    pub roots: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{0}")]
    Path(#[from] paths::PathError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What one root's migration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// False when the marker was already there.
    pub ran: bool,
    /// Entries whose owner was changed (the root included).
    pub changed: u64,
    /// Entries skipped because they are on another filesystem.
    pub other_fs: u64,
}

fn io(path: &Path) -> impl Fn(rustix::io::Errno) -> MigrateError + '_ {
    move |e| MigrateError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

fn open_dir(dir: &OwnedFd, name: &CStr, shown: &Path) -> Result<OwnedFd, MigrateError> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io(shown))
}

fn owner() -> (Option<Uid>, Option<Gid>) {
    (
        Some(Uid::from_raw(GUEST.uid)),
        Some(Gid::from_raw(GUEST.gid)),
    )
}

/// Migrates one root (see the module documentation).
pub fn migrate_root(root: &Path) -> Result<Outcome, MigrateError> {
    // The root itself is the operator's path: resolved once, then refused
    // if it is (or passes through) a symlink.
    let root_path = std::fs::canonicalize(root).map_err(|source| MigrateError::Io {
        path: root.to_path_buf(),
        source,
    })?;
    let path_fd = paths::open_dir_nofollow(&root_path)?;
    let top = open_dir(&path_fd, c".", &root_path)?;
    match rustix::fs::statat(&top, MARKER, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => return Ok(Outcome::default()),
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io(&root_path)(e)),
    }
    let dev = rustix::fs::fstat(&top).map_err(io(&root_path))?.st_dev;
    let (uid, gid) = owner();
    let mut out = Outcome {
        ran: true,
        ..Outcome::default()
    };
    rustix::fs::fchown(&top, uid, gid).map_err(io(&root_path))?;
    out.changed += 1;
    // Depth first; one open directory per level.
    let mut stack: Vec<(Dir, PathBuf)> = vec![(
        Dir::read_from(&top).map_err(io(&root_path))?,
        root_path.clone(),
    )];
    while let Some((dir, shown)) = stack.last_mut() {
        let Some(entry) = dir.next() else {
            stack.pop();
            continue;
        };
        let entry = entry.map_err(io(shown))?;
        let name = entry.file_name().to_owned();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let child = shown.join(OsStr::from_bytes(name.to_bytes()));
        let dir_fd = dir.fd().map_err(io(shown))?;
        let st =
            rustix::fs::statat(dir_fd, &name, AtFlags::SYMLINK_NOFOLLOW).map_err(io(&child))?;
        if st.st_dev != dev {
            out.other_fs += 1;
            continue;
        }
        rustix::fs::chownat(dir_fd, &name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(io(&child))?;
        out.changed += 1;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let fd = rustix::fs::openat(
                dir_fd,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(io(&child))?;
            let sub = Dir::read_from(&fd).map_err(io(&child))?;
            stack.push((sub, child));
        }
    }
    match rustix::fs::mkdirat(&top, MARKER, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(out),
        Err(e) => Err(io(&root_path.join(MARKER))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn gives_everything_to_1000_once_and_follows_no_symlink() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIPPED: the ownership migration test needs root (chown)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("pvc");
        let ws = root.join("shared/alice/workspace/p");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("old.txt"), b"x").unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, b"not yours").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        let before = std::fs::metadata(&outside).unwrap();

        let o = migrate_root(&root).unwrap();
        assert!(o.ran);
        // root, shared, alice, workspace, p, old.txt, link
        assert_eq!(o.changed, 7, "{o:?}");
        for p in [&root, &ws, &ws.join("old.txt")] {
            let m = std::fs::metadata(p).unwrap();
            assert_eq!((m.uid(), m.gid()), (1000, 1000), "{}", p.display());
        }
        let l = std::fs::symlink_metadata(ws.join("link")).unwrap();
        assert_eq!((l.uid(), l.gid()), (1000, 1000));
        let after = std::fs::metadata(&outside).unwrap();
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        assert!(root.join(MARKER).is_dir());

        // Marked: a second run changes nothing.
        std::fs::write(ws.join("new-root-file"), b"y").unwrap();
        let o = migrate_root(&root).unwrap();
        assert!(!o.ran);
        assert_eq!(
            std::fs::metadata(ws.join("new-root-file")).unwrap().uid(),
            0
        );
        assert!(migrate_root(&d.path().join("nope")).is_err());
    }
}
