//! The image store under `<state_dir>/images/`: content-addressed blobs,
//! one flattened read-only root filesystem per image (manifest digest), a
//! record per image and the reference index.
//!
//! ```text
//! images/
//!   store.lock        flock: shared while a create checks an image and records its use,
//!                     exclusive for reference-index writes, rm and gc
//!   write.lock        flock: the one writer of new content (pull, import); its holder owns tmp/
//!   tmp/              blobs being verified, a rootfs being unpacked; emptied when write.lock is taken
//!   blobs/sha256/<hex>    verified blobs (manifest, config, layers)
//!   rootfs/<hex>/     an image's root filesystem (hex of its manifest digest)
//!   images/<hex>.json the image record, written last: an image exists iff its record does
//!   refs.json         reference (registry/repository:tag or @digest) -> manifest digest
//! ```
//!
//! Everything is made in `tmp/` and renamed into place only once verified,
//! so a half-written blob or rootfs is never used; whatever a crash left in
//! `tmp/` (and any rootfs without a record) is removed the next time the
//! write lock is taken.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::digest::{Digest, HashingWriter};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("no image {0:?} in the store")]
    NotFound(String),
    #[error("image {reference} ({digest}) is used by sandbox(es) {users}: not removed")]
    InUse {
        reference: String,
        digest: String,
        users: String,
    },
    #[error("{0}")]
    Verify(#[from] crate::VerifyError),
}

pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { op, path, source }
}

/// What the store knows of one image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The manifest digest: the image's identity.
    pub manifest: String,
    pub config: String,
    /// Layer blob digests, in order.
    pub layers: Vec<String>,
    /// The image config's `Env` (the base of a sandbox's environment).
    pub env: Vec<String>,
    /// Bytes of the blobs (manifest, config, layers as stored).
    pub size: u64,
    /// Bytes of regular-file content in the unpacked rootfs.
    pub unpacked_bytes: u64,
    /// Unix seconds.
    pub created_at: u64,
}

impl ImageRecord {
    pub fn digest(&self) -> Result<Digest, crate::digest::BadDigest> {
        Digest::parse(&self.manifest)
    }
}

/// A held flock; released on drop.
pub struct Lock {
    _file: File,
}

/// The store rooted at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// One line of [`Store::list`].
#[derive(Debug, Clone)]
pub struct Listed {
    /// `None` for an image no reference names (gc removes it).
    pub reference: Option<String>,
    pub record: ImageRecord,
}

/// What [`Store::gc`] removed.
#[derive(Debug, Default)]
pub struct GcReport {
    pub images: Vec<String>,
    pub blobs: usize,
    pub bytes: u64,
    /// Unreferenced images kept because a sandbox uses them.
    pub kept_in_use: Vec<String>,
}

impl Store {
    /// Opens (creating if needed, mode 0700) the store at `root`, and
    /// removes what a crashed writer left when no writer is active.
    pub fn open(root: &Path) -> Result<Store, StoreError> {
        let store = Store {
            root: root.to_path_buf(),
        };
        for d in [
            root.to_path_buf(),
            store.tmp_dir(),
            root.join("blobs/sha256"),
            root.join("rootfs"),
            root.join("images"),
        ] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
                .map_err(io_err("create", &d))?;
        }
        // The rootfs directory must be traversable to reach a root beneath
        // it by path (the launcher runs as root, but keep it plain).
        if let Some(lock) = store.try_lock_file("write.lock")? {
            store.clean(&lock)?;
        }
        Ok(store)
    }

    /// The store at `root` for reading only: nothing is created or
    /// cleaned (`sandboxd bundle`).
    pub fn at(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    /// The root filesystem of image `d` (exists once its record does).
    pub fn rootfs_path(&self, d: &Digest) -> PathBuf {
        self.root.join("rootfs").join(d.hex())
    }

    fn record_path(&self, d: &Digest) -> PathBuf {
        self.root.join("images").join(format!("{}.json", d.hex()))
    }

    fn refs_path(&self) -> PathBuf {
        self.root.join("refs.json")
    }

    fn open_lock_file(&self, name: &str) -> Result<File, StoreError> {
        let p = self.root.join(name);
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&p)
            .map_err(io_err("open lock", &p))
    }

    fn lock_file(&self, name: &str, op: FlockOperation) -> Result<Lock, StoreError> {
        let f = self.open_lock_file(name)?;
        flock(&f, op).map_err(|e| StoreError::Io {
            op: "flock",
            path: self.root.join(name),
            source: e.into(),
        })?;
        Ok(Lock { _file: f })
    }

    fn try_lock_file(&self, name: &str) -> Result<Option<Lock>, StoreError> {
        let f = self.open_lock_file(name)?;
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(Lock { _file: f })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(StoreError::Io {
                op: "flock",
                path: self.root.join(name),
                source: e.into(),
            }),
        }
    }

    /// Shared store lock: held by a create while it checks that its image
    /// is present and records its use (rm and gc wait for it).
    pub fn lock_shared(&self) -> Result<Lock, StoreError> {
        self.lock_file("store.lock", FlockOperation::LockShared)
    }

    /// Exclusive store lock: reference-index writes, rm, gc.
    pub fn lock_exclusive(&self) -> Result<Lock, StoreError> {
        self.lock_file("store.lock", FlockOperation::LockExclusive)
    }

    /// Becomes the one writer of new content (blocks while another pull or
    /// import runs, in this process or another), after removing whatever an
    /// earlier writer left behind.
    pub fn begin_write(&self) -> Result<crate::assemble::Writer, StoreError> {
        let lock = self.lock_file("write.lock", FlockOperation::LockExclusive)?;
        self.clean(&lock)?;
        Ok(crate::assemble::Writer::new(self.clone(), lock))
    }

    /// Removes `tmp/*` and every rootfs without a record. Only with the
    /// write lock held (nobody else is making anything).
    fn clean(&self, _write_lock: &Lock) -> Result<(), StoreError> {
        let tmp = self.tmp_dir();
        for e in fs::read_dir(&tmp).map_err(io_err("read", &tmp))? {
            let p = e.map_err(io_err("read", &tmp))?.path();
            warn!(path = %p.display(), "image store: removing what an interrupted pull or import left");
            remove_any(&p)?;
        }
        let rootfs = self.root.join("rootfs");
        for e in fs::read_dir(&rootfs).map_err(io_err("read", &rootfs))? {
            let e = e.map_err(io_err("read", &rootfs))?;
            let name = e.file_name().to_string_lossy().to_string();
            let keep = Digest::parse(&format!("sha256:{name}"))
                .map(|d| self.record_path(&d).exists())
                .unwrap_or(false);
            if !keep {
                warn!(path = %e.path().display(), "image store: removing a root filesystem without an image record");
                remove_any(&e.path())?;
            }
        }
        Ok(())
    }

    /// The record of image `d`, if the store has it.
    pub fn record(&self, d: &Digest) -> Result<Option<ImageRecord>, StoreError> {
        let p = self.record_path(d);
        match fs::read(&p) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| StoreError::Corrupt {
                        path: p,
                        message: e.to_string(),
                    })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read", &p)(e)),
        }
    }

    /// The reference index.
    pub fn refs(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let p = self.refs_path();
        match fs::read(&p) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
                path: p,
                message: e.to_string(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(io_err("read", &p)(e)),
        }
    }

    fn write_refs(&self, refs: &BTreeMap<String, String>, _lock: &Lock) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(refs).expect("refs serialize");
        write_atomic(&self.refs_path(), &bytes)
    }

    /// The image a normalized reference names, if present: through the
    /// index, or directly for a `@sha256:` reference to a manifest the
    /// store holds.
    pub fn lookup(&self, reference: &str) -> Result<Option<ImageRecord>, StoreError> {
        if let Some(d) = self.refs()?.get(reference) {
            let d = Digest::parse(d).map_err(|e| StoreError::Corrupt {
                path: self.refs_path(),
                message: e.to_string(),
            })?;
            return self.record(&d);
        }
        if let Some((_, d)) = reference.rsplit_once('@') {
            if let Ok(d) = Digest::parse(d) {
                return self.record(&d);
            }
        }
        Ok(None)
    }

    /// Points `references` at image `d` (exclusive store lock taken here).
    pub fn tag(&self, d: &Digest, references: &[String]) -> Result<(), StoreError> {
        let lock = self.lock_exclusive()?;
        let mut refs = self.refs()?;
        for r in references {
            refs.insert(r.clone(), d.to_string());
        }
        self.write_refs(&refs, &lock)
    }

    /// Every image with the references naming it (an image no reference
    /// names is listed once with `reference: None`).
    pub fn list(&self) -> Result<Vec<Listed>, StoreError> {
        let refs = self.refs()?;
        let mut named = BTreeSet::new();
        let mut out = Vec::new();
        for (r, d) in &refs {
            let Ok(d) = Digest::parse(d) else { continue };
            if let Some(record) = self.record(&d)? {
                named.insert(d);
                out.push(Listed {
                    reference: Some(r.clone()),
                    record,
                });
            }
        }
        for d in self.all_images()? {
            if !named.contains(&d) {
                if let Some(record) = self.record(&d)? {
                    out.push(Listed {
                        reference: None,
                        record,
                    });
                }
            }
        }
        Ok(out)
    }

    fn all_images(&self) -> Result<Vec<Digest>, StoreError> {
        let dir = self.root.join("images");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).map_err(io_err("read", &dir))? {
            let name = e.map_err(io_err("read", &dir))?.file_name();
            let name = name.to_string_lossy();
            if let Some(hex) = name.strip_suffix(".json") {
                if let Ok(d) = Digest::parse(&format!("sha256:{hex}")) {
                    out.push(d);
                }
            }
        }
        Ok(out)
    }

    /// Removes `reference` and, when no other reference names its image,
    /// the image (record, rootfs; blobs are left to [`gc`](Self::gc)).
    /// Refused, changing nothing, when `users(digest)` names a sandbox
    /// using the image. `users` is called with the store lock held, so no
    /// create can start using the image meanwhile.
    pub fn remove(
        &self,
        reference: &str,
        users: &dyn Fn(&Digest) -> Vec<String>,
    ) -> Result<Option<Digest>, StoreError> {
        let lock = self.lock_exclusive()?;
        let mut refs = self.refs()?;
        let by_digest = match reference.rsplit_once('@').map(|(_, d)| Digest::parse(d)) {
            Some(Ok(d)) if self.record(&d)?.is_some() => Some(d.to_string()),
            _ => None,
        };
        let Some(digest) = refs.get(reference).cloned().or(by_digest) else {
            return Err(StoreError::NotFound(reference.to_string()));
        };
        let d = Digest::parse(&digest).map_err(|e| StoreError::Corrupt {
            path: self.refs_path(),
            message: e.to_string(),
        })?;
        let u = users(&d);
        if !u.is_empty() {
            return Err(StoreError::InUse {
                reference: reference.to_string(),
                digest,
                users: u.join(", "),
            });
        }
        refs.remove(reference);
        let still_named = refs.values().any(|v| *v == digest);
        self.write_refs(&refs, &lock)?;
        if still_named {
            info!(reference, %d, "image reference removed; the image stays (another reference names it)");
            return Ok(None);
        }
        // Other references by digest to the same image go with it.
        self.delete_image(&d, &lock)?;
        info!(reference, %d, "image removed");
        Ok(Some(d))
    }

    /// Record first (the image stops existing), then the rootfs.
    fn delete_image(&self, d: &Digest, _lock: &Lock) -> Result<(), StoreError> {
        let rec = self.record_path(d);
        match fs::remove_file(&rec) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &rec)(e)),
        }
        sync_dir(&self.root.join("images"));
        let rootfs = self.rootfs_path(d);
        if rootfs.exists() {
            // Out of the way first (atomic), then removed; a crash in
            // between leaves a name `clean` removes.
            let trash = self
                .tmp_dir()
                .join(format!("trash-{}-{}", d.hex(), std::process::id()));
            fs::rename(&rootfs, &trash).map_err(io_err("rename", &rootfs))?;
            remove_any(&trash)?;
        }
        Ok(())
    }

    /// Removes every image no reference names and no sandbox uses, then
    /// every blob no remaining image needs.
    /// Waits for a running pull or import first (one may be about to use
    /// a stored blob no record names yet), and removes its leftovers.
    pub fn gc(&self, users: &dyn Fn(&Digest) -> Vec<String>) -> Result<GcReport, StoreError> {
        let write = self.lock_file("write.lock", FlockOperation::LockExclusive)?;
        self.clean(&write)?;
        let lock = self.lock_exclusive()?;
        let mut report = GcReport::default();
        let refs = self.refs()?;
        let named: BTreeSet<String> = refs.values().cloned().collect();
        let mut keep_blobs = BTreeSet::new();
        for d in self.all_images()? {
            let Some(rec) = self.record(&d)? else {
                continue;
            };
            if !named.contains(d.as_str()) {
                if users(&d).is_empty() {
                    self.delete_image(&d, &lock)?;
                    report.images.push(d.to_string());
                    continue;
                }
                report.kept_in_use.push(d.to_string());
            }
            keep_blobs.insert(rec.manifest.clone());
            keep_blobs.insert(rec.config.clone());
            keep_blobs.extend(rec.layers.iter().cloned());
        }
        let dir = self.root.join("blobs/sha256");
        for e in fs::read_dir(&dir).map_err(io_err("read", &dir))? {
            let e = e.map_err(io_err("read", &dir))?;
            let name = format!("sha256:{}", e.file_name().to_string_lossy());
            if !keep_blobs.contains(&name) {
                report.bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
                remove_any(&e.path())?;
                report.blobs += 1;
            }
        }
        drop(lock);
        drop(write);
        Ok(report)
    }

    pub(crate) fn write_record(&self, rec: &ImageRecord) -> Result<(), StoreError> {
        let d = rec.digest().map_err(|e| StoreError::Corrupt {
            path: self.root.clone(),
            message: e.to_string(),
        })?;
        let bytes = serde_json::to_vec_pretty(rec).expect("record serializes");
        write_atomic(&self.record_path(&d), &bytes)
    }
}

/// Writes `path` atomically: a temp file beside it, fsync, rename, fsync
/// of the directory.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().expect("a file in a directory");
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().expect("a file name").to_string_lossy(),
        std::process::id()
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    f.write_all(bytes).map_err(io_err("write", &tmp))?;
    f.sync_all().map_err(io_err("fsync", &tmp))?;
    fs::rename(&tmp, path).map_err(io_err("rename", path))?;
    sync_dir(dir);
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Removes a file or a whole tree, whatever its modes (hostile images may
/// carry directories without permissions).
pub(crate) fn remove_any(p: &Path) -> Result<(), StoreError> {
    let md = match fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("stat", p)(e)),
    };
    if md.is_dir() {
        fs::remove_dir_all(p).map_err(io_err("remove", p))
    } else {
        fs::remove_file(p).map_err(io_err("remove", p))
    }
}

/// Copies `from` into a new temp file `to`, hashing on the way; fails
/// (removing `to`) unless the content has digest `expected` (and `size`
/// bytes, when given).
pub(crate) fn copy_verified(
    mut from: impl Read,
    to: &Path,
    expected: &Digest,
    size: Option<u64>,
    what: &str,
) -> Result<u64, StoreError> {
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)
        .map_err(io_err("create", to))?;
    let mut w = HashingWriter::new(io::BufWriter::with_capacity(1 << 20, f));
    let copied = io::copy(&mut from, &mut w);
    let result = (|| {
        copied.map_err(io_err("copy", to))?;
        let (buf, got, n) = w.finish();
        let f = buf
            .into_inner()
            .map_err(|e| io_err("write", to)(e.into_error()))?;
        crate::verify_blob(what, expected, size, &got, n)?;
        f.sync_all().map_err(io_err("fsync", to))?;
        Ok(n)
    })();
    if result.is_err() {
        let _ = fs::remove_file(to);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(s: &Store, content: &[u8]) -> Digest {
        let d = Digest::of(content);
        std::fs::write(s.blob_path(&d), content).unwrap();
        std::fs::create_dir_all(s.rootfs_path(&d).join("etc")).unwrap();
        s.write_record(&ImageRecord {
            manifest: d.to_string(),
            config: d.to_string(),
            layers: vec![],
            env: vec![],
            size: content.len() as u64,
            unpacked_bytes: 0,
            created_at: 0,
        })
        .unwrap();
        d
    }

    #[test]
    fn open_cleans_what_a_crash_left_and_rm_gc_respect_users() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let a = record(&s, b"image a");
        s.tag(&a, &["r/a:1".to_string(), "r/a:2".to_string()])
            .unwrap();
        // A crash mid-pull: a temp blob, and a rootfs without a record.
        std::fs::write(s.tmp_dir().join("blob-1-1"), b"half").unwrap();
        let orphan = Digest::of(b"orphan");
        std::fs::create_dir_all(s.rootfs_path(&orphan)).unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(std::fs::read_dir(s.tmp_dir()).unwrap().count(), 0);
        assert!(!s.rootfs_path(&orphan).exists());
        assert!(s.rootfs_path(&a).exists());
        assert_eq!(s.lookup("r/a:1").unwrap().unwrap().manifest, a.to_string());
        assert_eq!(
            s.lookup(&format!("r/a@{a}")).unwrap().unwrap().manifest,
            a.to_string()
        );

        // In use: refused, nothing changed.
        let users = |d: &Digest| {
            if *d == a {
                vec!["sb1".to_string()]
            } else {
                vec![]
            }
        };
        let e = s.remove("r/a:1", &users).unwrap_err().to_string();
        assert!(e.contains("used by sandbox(es) sb1"), "{e}");
        assert_eq!(s.refs().unwrap().len(), 2);
        // Not in use: the first reference goes, the image stays for the
        // second; then the image goes with the last.
        let nobody = |_: &Digest| Vec::new();
        assert_eq!(s.remove("r/a:1", &nobody).unwrap(), None);
        assert!(s.rootfs_path(&a).exists());
        assert_eq!(s.remove("r/a:2", &nobody).unwrap(), Some(a.clone()));
        assert!(!s.rootfs_path(&a).exists());
        assert!(s.lookup("r/a:2").unwrap().is_none());
        assert!(matches!(
            s.remove("r/a:2", &nobody),
            Err(StoreError::NotFound(_))
        ));

        // gc: an unnamed image a sandbox uses stays; its blob too; the rest goes.
        let b = record(&s, b"image b");
        let c = record(&s, b"image c");
        let uses_b = |d: &Digest| {
            if *d == b {
                vec!["sb2".to_string()]
            } else {
                vec![]
            }
        };
        let rep = s.gc(&uses_b).unwrap();
        assert_eq!(rep.images, vec![c.to_string()]);
        assert_eq!(rep.kept_in_use, vec![b.to_string()]);
        assert!(s.blob_path(&b).exists() && !s.blob_path(&c).exists());
        assert!(!s.blob_path(&a).exists(), "a's blob outlived its image");
    }
}
