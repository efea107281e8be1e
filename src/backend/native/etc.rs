//! The sandbox's prepared `/etc`: one directory bound read-only at `/etc`
//! instead of one bind per host file (issue #17, cold create).
//!
//! It holds what is the same for every sandbox of a network mode: copies
//! of the host's `/etc` entries listed in `[native] rootfs_binds` (the
//! `/etc/...` ones: `/etc/ssl`, `/etc/localtime`, ...), the generated
//! `passwd` and `group`, the mode's `resolv.conf`, and empty mount points
//! for the per-sandbox files (`hosts` and `hostname`, which name the
//! sandbox and are bound over them from its bundle's `files/`).
//!
//! When it is built: at every daemon start ([`prepare`]), from the host's
//! files as they are then, into `<state_dir>/etc/<sha256 of the content>`
//! (made under a temporary name and renamed into place, so a directory of
//! that name is always complete). A change of the host's files (a CA
//! bundle update, a new time zone) reaches sandboxes created after the
//! next start of the daemon. Directories of earlier contents are kept
//! while a sandbox may use one (an adopted sandbox keeps its bind) and
//! removed at a start that finds no sandbox directory at all.
//!
//! Only what every user may read is copied (files readable by others,
//! directories readable and searchable by others): with a user namespace
//! a file owned by the host's root is owned by the sandbox's root inside,
//! so a host-private file such as a key under `/etc/ssl/private` must not
//! be there at all. Everything copied belongs to root, with the host's
//! permission bits (set-id bits dropped). Symlinks are copied as symlinks
//! (they resolve inside the sandbox, as they did through the binds).
//!
//! `sandboxd bundle` writes the same content into the bundle itself
//! (`<bundle>/etc`), so `runc` runs the bundle without a daemon.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::bundle::BundleError;

/// The generated files that are the same in every sandbox.
pub const SHARED_FILES: [&str; 3] = ["passwd", "group", "resolv.conf"];

/// The files that name the sandbox: bound per sandbox from its bundle's
/// `files/`.
pub const PER_SANDBOX_FILES: [&str; 2] = ["hosts", "hostname"];

/// One entry of the prepared directory (path relative to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        rel: PathBuf,
        mode: u32,
    },
    File {
        rel: PathBuf,
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        rel: PathBuf,
        target: PathBuf,
    },
}

impl Entry {
    fn rel(&self) -> &Path {
        match self {
            Entry::Dir { rel, .. } | Entry::File { rel, .. } | Entry::Symlink { rel, .. } => rel,
        }
    }
}

/// The content of the prepared `/etc` of one network mode: the host's
/// entries (source, path below `/etc`), then the generated files, then
/// the per-sandbox mount points. Sorted, without duplicates (a generated
/// file wins over a host entry of the same name).
pub fn content(host_entries: &[(PathBuf, PathBuf)], resolv_conf: &str) -> Vec<Entry> {
    let generated = super::bundle::shared_files(resolv_conf);
    let reserved: Vec<&str> = generated
        .iter()
        .map(|(n, _)| *n)
        .chain(PER_SANDBOX_FILES)
        .collect();
    let mut out: Vec<Entry> = Vec::new();
    for (src, rel) in host_entries {
        let top = rel.components().next().and_then(|c| c.as_os_str().to_str());
        if top.is_some_and(|t| reserved.contains(&t)) {
            continue;
        }
        // Parents of a nested entry (`/etc/a/b`): plain directories.
        let mut parent = PathBuf::new();
        for c in rel.parent().into_iter().flat_map(|p| p.components()) {
            parent.push(c);
            out.push(Entry::Dir {
                rel: parent.clone(),
                mode: 0o755,
            });
        }
        copy_tree(src, rel, &mut out);
    }
    for (name, text) in generated {
        out.push(Entry::File {
            rel: name.into(),
            mode: 0o644,
            data: text.into_bytes(),
        });
    }
    for name in PER_SANDBOX_FILES {
        out.push(Entry::File {
            rel: name.into(),
            mode: 0o644,
            data: Vec::new(),
        });
    }
    // Sorted, parents before children; the first of equal paths kept.
    out.sort_by(|a, b| a.rel().cmp(b.rel()));
    out.dedup_by(|b, a| a.rel() == b.rel());
    out
}

/// Appends `src` (never followed if it is a symlink below the top) as
/// `rel` and, for a directory, what is below it.
fn copy_tree(src: &Path, rel: &Path, out: &mut Vec<Entry>) {
    let meta = match std::fs::symlink_metadata(src) {
        Ok(m) => m,
        Err(e) => {
            warn!(path = %src.display(), error = %e, "prepared /etc: skipped");
            return;
        }
    };
    let perm = meta.mode() & 0o777;
    let kind = meta.file_type();
    if kind.is_symlink() {
        match std::fs::read_link(src) {
            Ok(target) => out.push(Entry::Symlink {
                rel: rel.to_path_buf(),
                target,
            }),
            Err(e) => warn!(path = %src.display(), error = %e, "prepared /etc: skipped"),
        }
    } else if kind.is_dir() {
        if perm & 0o005 != 0o005 {
            return;
        }
        out.push(Entry::Dir {
            rel: rel.to_path_buf(),
            mode: perm,
        });
        let mut names: Vec<_> = match std::fs::read_dir(src) {
            Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect(),
            Err(e) => {
                warn!(path = %src.display(), error = %e, "prepared /etc: not listed");
                return;
            }
        };
        names.sort();
        for n in names {
            copy_tree(&src.join(&n), &rel.join(&n), out);
        }
    } else if kind.is_file() {
        if perm & 0o004 == 0 {
            return;
        }
        match std::fs::read(src) {
            Ok(data) => out.push(Entry::File {
                rel: rel.to_path_buf(),
                mode: perm,
                data,
            }),
            Err(e) => warn!(path = %src.display(), error = %e, "prepared /etc: skipped"),
        }
    }
    // Sockets, fifos and device nodes have no place in /etc: left out.
}

/// The name of a content: the hex SHA-256 of every entry (format
/// versioned, so a change of what an entry means changes every name).
pub fn digest(entries: &[Entry]) -> String {
    let mut h = Sha256::new();
    h.update(b"sandboxd-etc-v1\0");
    for e in entries {
        let (tag, rel): (&[u8], &Path) = match e {
            Entry::Dir { rel, .. } => (b"d", rel),
            Entry::File { rel, .. } => (b"f", rel),
            Entry::Symlink { rel, .. } => (b"l", rel),
        };
        h.update(tag);
        let r = rel.as_os_str().as_encoded_bytes();
        h.update((r.len() as u64).to_le_bytes());
        h.update(r);
        match e {
            Entry::Dir { mode, .. } => h.update(mode.to_le_bytes()),
            Entry::File { mode, data, .. } => {
                h.update(mode.to_le_bytes());
                h.update((data.len() as u64).to_le_bytes());
                h.update(data);
            }
            Entry::Symlink { target, .. } => {
                let t = target.as_os_str().as_encoded_bytes();
                h.update((t.len() as u64).to_le_bytes());
                h.update(t);
            }
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `entries` below the directory `root` (shown as `shown`), which
/// must be new and empty: every entry is made relative to its parent's fd
/// with `O_EXCL | O_NOFOLLOW` (no symlink followed), owned by root.
pub fn write_entries(root: &OwnedFd, shown: &Path, entries: &[Entry]) -> Result<(), BundleError> {
    use super::bundle::{make_dir_mode, open_dir, write_new_file};
    let mut dirs: Vec<(PathBuf, OwnedFd)> = Vec::new();
    let parent_fd =
        |dirs: &Vec<(PathBuf, OwnedFd)>, rel: &Path| -> Result<Option<usize>, BundleError> {
            match rel.parent() {
                Some(p) if !p.as_os_str().is_empty() => dirs
                    .iter()
                    .position(|(d, _)| d == p)
                    .map(Some)
                    .ok_or_else(|| {
                        BundleError::Build(format!("prepared /etc: no parent of {}", rel.display()))
                    }),
                _ => Ok(None),
            }
        };
    for e in entries {
        let rel = e.rel();
        let name = rel
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                BundleError::Build(format!("prepared /etc: bad name {}", rel.display()))
            })?
            .to_string();
        let p = parent_fd(&dirs, rel)?;
        let (pfd, pshown) = match p {
            Some(i) => (&dirs[i].1, shown.join(&dirs[i].0)),
            None => (root, shown.to_path_buf()),
        };
        match e {
            Entry::Dir { mode, .. } => {
                make_dir_mode(pfd, &pshown, &name, *mode)?;
                let fd = open_dir(pfd, &pshown, &name)?;
                dirs.push((rel.to_path_buf(), fd));
            }
            Entry::File { mode, data, .. } => write_new_file(pfd, &pshown, &name, data, *mode)?,
            Entry::Symlink { target, .. } => rustix::fs::symlinkat(target, pfd, name.as_str())
                .map_err(|e| BundleError::Write {
                    path: pshown.join(&name),
                    source: e.into(),
                })?,
        }
    }
    Ok(())
}

/// Makes (or finds, when its content is unchanged) the prepared `/etc` of
/// `entries` under `base` (`<state_dir>/etc`); returns its path.
pub fn prepare(base: &Path, entries: &[Entry]) -> Result<PathBuf, BundleError> {
    let werr = |path: &Path, source: std::io::Error| BundleError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(base).map_err(|e| werr(base, e))?;
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| werr(base, e))?;
    let name = digest(entries);
    let dir = base.join(&name);
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Ok(dir);
    }
    let tmp = base.join(format!(".tmp-{name}-{}", std::process::id()));
    if tmp.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(&tmp).map_err(|e| werr(&tmp, e))?;
    }
    let fd = super::bundle::create_exclusive_dir(&tmp)?;
    let written = write_entries(&fd, &tmp, entries).and_then(|()| {
        // Read and searched by everyone inside (the sandbox's user).
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o755)).map_err(|e| {
            BundleError::Write {
                path: tmp.clone(),
                source: e.into(),
            }
        })
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // No fsync: it is rebuilt from the host at every start.
    std::fs::rename(&tmp, &dir).map_err(|e| werr(&dir, e))?;
    info!(path = %dir.display(), entries = entries.len(), "prepared /etc built");
    Ok(dir)
}

/// Removes the prepared directories under `base` other than `keep` (and
/// leftovers of an interrupted build). Only called when no sandbox can
/// use one (see the module's documentation).
pub fn remove_others(base: &Path, keep: &[&Path]) {
    let Ok(rd) = std::fs::read_dir(base) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if keep.iter().any(|k| *k == p) {
            continue;
        }
        if let Err(err) = std::fs::remove_dir_all(&p) {
            warn!(path = %p.display(), error = %err, "cannot remove an old prepared /etc");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn host_etc() -> (tempfile::TempDir, Vec<(PathBuf, PathBuf)>) {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("ssl/certs")).unwrap();
        std::fs::write(r.join("ssl/certs/ca.pem"), "CA").unwrap();
        symlink("ca.pem", r.join("ssl/certs/abcd.0")).unwrap();
        std::fs::create_dir(r.join("ssl/private")).unwrap();
        std::fs::set_permissions(r.join("ssl/private"), PermissionsExt::from_mode(0o700)).unwrap();
        std::fs::write(r.join("ssl/private/key"), "SECRET").unwrap();
        std::fs::write(r.join("ssl/shadowish"), "S").unwrap();
        std::fs::set_permissions(r.join("ssl/shadowish"), PermissionsExt::from_mode(0o640))
            .unwrap();
        std::fs::write(r.join("localtime"), "TZ").unwrap();
        std::fs::write(r.join("passwd"), "host passwd").unwrap();
        let entries = vec![
            (r.join("ssl"), PathBuf::from("ssl")),
            (r.join("localtime"), PathBuf::from("localtime")),
            (r.join("passwd"), PathBuf::from("passwd")),
            (r.join("missing"), PathBuf::from("missing")),
        ];
        (t, entries)
    }

    #[test]
    fn content_copies_what_everyone_may_read_and_the_generated_files() {
        let (_t, host) = host_etc();
        let c = content(&host, "nameserver 10.0.0.1\n");
        let rels: Vec<String> = c.iter().map(|e| e.rel().display().to_string()).collect();
        assert_eq!(
            rels,
            [
                "group",
                "hostname",
                "hosts",
                "localtime",
                "passwd",
                "resolv.conf",
                "ssl",
                "ssl/certs",
                "ssl/certs/abcd.0",
                "ssl/certs/ca.pem"
            ]
        );
        let passwd = c.iter().find(|e| e.rel() == Path::new("passwd")).unwrap();
        assert!(
            matches!(passwd, Entry::File { data, .. } if data.starts_with(b"root:x:0:0:")),
            "the generated passwd replaces the host's: {passwd:?}"
        );
        assert!(c.contains(&Entry::Symlink {
            rel: "ssl/certs/abcd.0".into(),
            target: "ca.pem".into()
        }));
        // Another resolv.conf is another content.
        assert_ne!(digest(&c), digest(&content(&host, "# none\n")));
        assert_eq!(digest(&c), digest(&content(&host, "nameserver 10.0.0.1\n")));
    }

    #[test]
    fn prepare_writes_once_and_reuses() {
        let (_t, host) = host_etc();
        let state = tempfile::tempdir().unwrap();
        let base = state.path().join("etc");
        let c = content(&host, "nameserver 10.0.0.1\n");
        let dir = prepare(&base, &c).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("ssl/certs/ca.pem")).unwrap(),
            "CA"
        );
        assert_eq!(
            std::fs::read_link(dir.join("ssl/certs/abcd.0")).unwrap(),
            Path::new("ca.pem")
        );
        assert_eq!(std::fs::read(dir.join("hosts")).unwrap(), b"");
        assert!(!dir.join("ssl/private").exists());
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o755
        );
        // Unchanged content: the same directory, untouched.
        std::fs::write(dir.join("marker"), "").unwrap();
        assert_eq!(prepare(&base, &c).unwrap(), dir);
        assert!(dir.join("marker").exists());
        // Changed content: a new one; the old one removed on request.
        let other = prepare(&base, &content(&host, "# none\n")).unwrap();
        assert_ne!(other, dir);
        remove_others(&base, &[&other]);
        assert!(!dir.exists() && other.exists());
    }
}
