//! Turning verified blobs into an image: the write side of the store.
//!
//! A [`Writer`] holds the store's write lock. Blobs are staged in `tmp/`
//! (each verified against its digest while it is written); [`Writer::commit`]
//! then parses the manifest and config, unpacks the layers in order into a
//! rootfs in `tmp/` (checking each layer's uncompressed digest against the
//! config's `rootfs.diff_ids`), prepares the sandbox's mount points, and only
//! then renames blobs and rootfs into place and writes the image record.
//! Any error before that leaves nothing: the staged files are removed when
//! the writer is dropped.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use oci_spec::image::{ImageConfiguration, ImageManifest};
use rustix::fs::{Mode, OFlags};
use tracing::{info, warn};

use crate::digest::{Digest, HashingReader};
use crate::store::{io_err, remove_any, sync_dir, ImageRecord, Lock, Store, StoreError};
use crate::unpack::{self, UnpackBudget, UnpackLimits};
use crate::{MountPoint, Progress, VerifyError};

/// The store's single writer (see the module docs).
pub struct Writer {
    store: Store,
    _lock: Lock,
    /// Verified blobs in `tmp/`, not yet in `blobs/`.
    staged: Vec<(Digest, PathBuf)>,
    /// Every temp name this writer made (removed on drop unless moved).
    temps: Vec<PathBuf>,
    seq: u32,
}

impl Writer {
    pub(crate) fn new(store: Store, lock: Lock) -> Writer {
        Writer {
            store,
            _lock: lock,
            staged: Vec::new(),
            temps: Vec::new(),
            seq: 0,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// A fresh temp path in the store's `tmp/`, removed when the writer is
    /// dropped (unless renamed away).
    pub fn temp_path(&mut self, what: &str) -> PathBuf {
        self.seq += 1;
        let p = self
            .store
            .tmp_dir()
            .join(format!("{what}-{}-{}", std::process::id(), self.seq));
        self.temps.push(p.clone());
        p
    }

    /// Where blob `d` can be read: staged by this writer, or in the store.
    pub fn blob(&self, d: &Digest) -> Option<PathBuf> {
        if let Some((_, p)) = self.staged.iter().find(|(s, _)| s == d) {
            return Some(p.clone());
        }
        let p = self.store.blob_path(d);
        p.exists().then_some(p)
    }

    /// Stages a blob read from `r`, verified against `d` (and `size`).
    pub fn stage(
        &mut self,
        r: impl Read,
        d: &Digest,
        size: Option<u64>,
        what: &str,
    ) -> Result<PathBuf, StoreError> {
        if let Some(p) = self.blob(d) {
            return Ok(p);
        }
        let tmp = self.temp_path("blob");
        crate::store::copy_verified(r, &tmp, d, size, what)?;
        self.staged.push((d.clone(), tmp.clone()));
        Ok(tmp)
    }

    /// Registers a temp file (from [`temp_path`](Self::temp_path)) the
    /// caller already wrote and verified as blob `d`.
    pub fn stage_verified(&mut self, d: &Digest, tmp: PathBuf) {
        self.staged.push((d.clone(), tmp));
    }

    /// Builds the image whose manifest is `manifest` (digest `digest`,
    /// already verified by the caller), names it `references`, and returns
    /// its record. Every blob the manifest names must be staged or stored.
    pub fn commit(
        mut self,
        manifest: &[u8],
        digest: &Digest,
        references: &[String],
        opts: &CommitOptions<'_>,
    ) -> Result<ImageRecord, StoreError> {
        if let Some(rec) = self.store.record(digest)? {
            self.store.tag(digest, references)?;
            return Ok(rec);
        }
        let m: ImageManifest = serde_json::from_slice(manifest)
            .map_err(|e| VerifyError::Invalid(format!("manifest {digest}: {e}")))?;
        let config_d = Digest::parse(m.config().digest().as_ref())
            .map_err(|e| VerifyError::Invalid(format!("manifest {digest}: config: {e}")))?;
        let config_path = self
            .blob(&config_d)
            .ok_or_else(|| VerifyError::Invalid(format!("config blob {config_d} is missing")))?;
        let config_bytes = fs::read(&config_path).map_err(io_err("read", &config_path))?;
        let config: ImageConfiguration = serde_json::from_slice(&config_bytes)
            .map_err(|e| VerifyError::Invalid(format!("image config {config_d}: {e}")))?;
        check_platform(&config)?;
        let diff_ids = config.rootfs().diff_ids();
        if diff_ids.len() != m.layers().len() {
            return Err(VerifyError::Invalid(format!(
                "the manifest has {} layers but the config's rootfs.diff_ids has {} entries",
                m.layers().len(),
                diff_ids.len()
            ))
            .into());
        }

        // Unpack into a temp rootfs.
        let rootfs_tmp = self.temp_path("rootfs");
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&rootfs_tmp)
            .map_err(io_err("mkdir", &rootfs_tmp))?;
        let root_fd: OwnedFd = rustix::fs::open(
            &rootfs_tmp,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| io_err("open", &rootfs_tmp)(e.into()))?;
        let mut budget = UnpackBudget {
            limits: opts.limits.clone(),
            bytes_used: 0,
            entries_used: 0,
        };
        let mut layers = Vec::new();
        let mut size = manifest.len() as u64 + config_bytes.len() as u64;
        let count = m.layers().len();
        for (i, (desc, diff_id)) in m.layers().iter().zip(diff_ids).enumerate() {
            let ld = Digest::parse(desc.digest().as_ref())
                .map_err(|e| VerifyError::Invalid(format!("layer {i}: {e}")))?;
            let want = Digest::parse(diff_id)
                .map_err(|e| VerifyError::Invalid(format!("rootfs.diff_ids[{i}]: {e}")))?;
            let path = self
                .blob(&ld)
                .ok_or_else(|| VerifyError::Invalid(format!("layer blob {ld} is missing")))?;
            opts.progress.unpack_layer(i, count, &ld);
            let file = File::open(&path).map_err(io_err("open", &path))?;
            size += file.metadata().map(|m| m.len()).unwrap_or(0);
            let media = desc.media_type().to_string();
            let reader = decompressor(&media, BufReader::with_capacity(1 << 20, file))
                .map_err(|e| VerifyError::Invalid(format!("layer {i} ({ld}): {e}")))?;
            let mut hashing = HashingReader::new(reader);
            let stats =
                unpack::apply_layer(root_fd.as_fd(), &mut hashing, &mut budget).map_err(|e| {
                    VerifyError::Unpack {
                        index: i,
                        digest: ld.to_string(),
                        source: e,
                    }
                })?;
            let (got, _) = hashing
                .finish()
                .map_err(|e| VerifyError::Invalid(format!("layer {i} ({ld}): reading: {e}")))?;
            if got != want {
                return Err(VerifyError::DiffId {
                    index: i,
                    layer: ld.to_string(),
                    expected: want.to_string(),
                    got: got.to_string(),
                }
                .into());
            }
            if stats.skipped_total > 0 {
                info!(layer = %ld, skipped = stats.skipped_total, "layer applied; entries skipped (logged by the unpacker)");
            }
            layers.push(ld.to_string());
        }
        // The sandbox's mount points: real directories and files reached
        // without a symlink (the unpacker's rules).
        let dirs: Vec<&str> = opts
            .mount_points
            .iter()
            .filter(|m| !m.file)
            .map(|m| m.path.as_str())
            .collect();
        let files: Vec<&str> = opts
            .mount_points
            .iter()
            .filter(|m| m.file)
            .map(|m| m.path.as_str())
            .collect();
        unpack::ensure_mount_points(root_fd.as_fd(), &dirs, &files).map_err(|e| {
            VerifyError::Invalid(format!("preparing the sandbox's mount points: {e}"))
        })?;
        rustix::fs::syncfs(&root_fd).map_err(|e| io_err("syncfs", &rootfs_tmp)(e.into()))?;
        drop(root_fd);
        crate::failpoint_hit("image:before_commit");

        // Into place: blobs, rootfs, then the record (the image exists).
        for (d, tmp) in std::mem::take(&mut self.staged) {
            let dest = self.store.blob_path(&d);
            if dest.exists() {
                let _ = fs::remove_file(&tmp);
            } else {
                fs::rename(&tmp, &dest).map_err(io_err("rename", &dest))?;
            }
        }
        sync_dir(&self.store.root().join("blobs/sha256"));
        let rootfs = self.store.rootfs_path(digest);
        remove_any(&rootfs)?;
        fs::rename(&rootfs_tmp, &rootfs).map_err(io_err("rename", &rootfs))?;
        sync_dir(&self.store.root().join("rootfs"));
        let record = ImageRecord {
            manifest: digest.to_string(),
            config: config_d.to_string(),
            layers,
            env: config
                .config()
                .as_ref()
                .and_then(|c| c.env().clone())
                .unwrap_or_default(),
            size,
            unpacked_bytes: budget.bytes_used,
            created_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        self.store.write_record(&record)?;
        self.store.tag(digest, references)?;
        info!(image = %digest, references = ?references, layers = count, bytes = size, "image stored");
        Ok(record)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        for p in &self.temps {
            if let Err(e) = remove_any(p) {
                warn!(error = %e, "image store: cannot remove a temp name (removed at the next pull)");
            }
        }
    }
}

/// What [`Writer::commit`] needs besides the manifest.
pub struct CommitOptions<'a> {
    pub limits: UnpackLimits,
    pub mount_points: &'a [MountPoint],
    pub progress: &'a dyn Progress,
}

/// `config.architecture`/`os` must be this node's.
fn check_platform(config: &ImageConfiguration) -> Result<(), VerifyError> {
    let want = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let arch = config.architecture().to_string();
    let os = config.os().to_string();
    if os != "linux" || arch != want {
        return Err(VerifyError::Invalid(format!(
            "the image is for {os}/{arch}, this node runs linux/{want}"
        )));
    }
    Ok(())
}

/// The decompressing reader for a layer media type.
fn decompressor<'r>(media: &str, r: impl Read + 'r) -> io::Result<Box<dyn Read + 'r>> {
    if media.ends_with("+gzip") || media.ends_with(".gzip") {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(r)))
    } else if media.ends_with("+zstd") || media.ends_with(".zstd") {
        Ok(Box::new(zstd::stream::read::Decoder::with_buffer(
            io::BufReader::new(r),
        )?))
    } else if media.ends_with(".tar") || media.ends_with("layer.v1.tar") {
        Ok(Box::new(r))
    } else {
        Err(io::Error::other(format!(
            "unsupported layer media type {media:?} (tar, tar+gzip and tar+zstd are)"
        )))
    }
}
