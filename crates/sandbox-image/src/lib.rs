//! OCI images as sandbox root filesystems.
//!
//! * [`digest`] — sha256 digests and the hashing reader/writer every byte
//!   of an image passes through;
//! * [`store`] — the content-addressed store under `<state_dir>/images/`
//!   (locks, reference index, records, rm, gc);
//! * [`assemble`] — the store's single writer: verified blobs in, one
//!   flattened read-only rootfs per image out;
//! * [`import`] — OCI image layouts (directory or tar) and `docker save`
//!   archives;
//! * [`pull`] — an OCI distribution registry (`oci-client`), every blob
//!   verified while it streams;
//! * [`reference`] — image references, normalized;
//! * [`unpack`] — applies one uncompressed layer (a tar stream) onto a rootfs
//!   directory held by fd, treating every byte as hostile.

pub mod assemble;
pub mod digest;
pub mod import;
pub mod pull;
pub mod reference;
pub mod store;
pub mod unpack;

pub use assemble::{CommitOptions, Writer};
pub use digest::Digest;
pub use store::{ImageRecord, Store, StoreError};

/// A verification failure: the image is refused and nothing of it is kept.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("{what} {expected}: digest mismatch: the content ({bytes} bytes) hashes to {got}")]
    Digest {
        what: String,
        expected: String,
        got: String,
        bytes: u64,
    },
    #[error("{what} {digest}: size mismatch: the descriptor says {expected} bytes, got {got} (truncated or padded)")]
    Size {
        what: String,
        digest: String,
        expected: u64,
        got: u64,
    },
    #[error("layer {index} ({layer}): its uncompressed content hashes to {got}, but the config's rootfs.diff_ids[{index}] is {expected}")]
    DiffId {
        index: usize,
        layer: String,
        expected: String,
        got: String,
    },
    #[error("layer {index} ({digest}): {source}")]
    Unpack {
        index: usize,
        digest: String,
        #[source]
        source: unpack::UnpackError,
    },
    #[error("{0}")]
    Invalid(String),
}

impl VerifyError {
    /// A short label for metrics (`kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            VerifyError::Digest { .. } => "digest",
            VerifyError::Size { .. } => "size",
            VerifyError::DiffId { .. } => "diff_id",
            VerifyError::Unpack { .. } => "unpack",
            VerifyError::Invalid(_) => "invalid",
        }
    }
}

/// Checks a blob's computed digest and size against its descriptor.
pub(crate) fn verify_blob(
    what: &str,
    expected: &Digest,
    size: Option<u64>,
    got: &Digest,
    n: u64,
) -> Result<(), VerifyError> {
    if let Some(s) = size {
        if s != n {
            return Err(VerifyError::Size {
                what: what.to_string(),
                digest: expected.to_string(),
                expected: s,
                got: n,
            });
        }
    }
    if got != expected {
        return Err(VerifyError::Digest {
            what: what.to_string(),
            expected: expected.to_string(),
            got: got.to_string(),
            bytes: n,
        });
    }
    Ok(())
}

/// A path the sandbox mounts something on: made a real directory (or an
/// empty regular file) in every image rootfs, reached without symlinks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPoint {
    pub path: String,
    pub file: bool,
}

/// Progress reports of a pull or import (the CLI draws them; the daemon
/// logs).
pub trait Progress: Send + Sync {
    fn blob_start(&self, _what: &str, _digest: &Digest, _size: Option<u64>) {}
    fn blob_bytes(&self, _digest: &Digest, _bytes: u64) {}
    fn blob_done(&self, _digest: &Digest, _cached: bool) {}
    fn unpack_layer(&self, _index: usize, _count: usize, _digest: &Digest) {}
}

/// Reports nothing.
pub struct NoProgress;
impl Progress for NoProgress {}

/// The limits an image's unpack runs under, by default (the unpacker's).
pub fn default_limits() -> unpack::UnpackLimits {
    unpack::UnpackLimits::default()
}

fn failpoint_hit(name: &str) {
    use sandbox_abi::failpoint::{hit, Point};
    if let Some(p) = Point::from_name(name) {
        hit(p);
    }
}
