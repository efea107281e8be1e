//! Safe layer unpacking (interface; the implementation lands with the
//! `image-unpack` branch).

use std::io::Read;
use std::os::fd::BorrowedFd;

/// Limits over a whole image (all its layers); one budget is shared by the
/// layers of one unpack, so a bomb split across layers still stops.
#[derive(Debug, Clone)]
pub struct UnpackLimits {
    /// Total uncompressed bytes of regular-file content (default 20 GiB).
    pub max_total_bytes: u64,
    /// Total tar entries over all layers.
    pub max_entries: u64,
    /// Longest entry path accepted, in bytes.
    pub max_path_len: usize,
}

/// What is left of the limits while an image's layers are applied in order.
#[derive(Debug)]
pub struct UnpackBudget {
    pub limits: UnpackLimits,
    pub bytes_used: u64,
    pub entries_used: u64,
}

/// What one layer did.
#[derive(Debug, Default, Clone)]
pub struct LayerStats {
    pub entries: u64,
    pub bytes: u64,
    /// Entries refused-and-skipped (device nodes, FIFOs, sockets, ...), with why.
    pub skipped: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer entry {path:?}: {reason}")]
    Hostile { path: String, reason: String },
    #[error("image exceeds the unpack limit: {0}")]
    Limit(String),
    #[error("reading the layer: {0}")]
    Read(#[source] std::io::Error),
    #[error("{op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Applies one uncompressed layer tar stream onto the rootfs directory `root`
/// (an `O_DIRECTORY` fd), whiteouts against what earlier layers left there.
pub fn apply_layer<R: Read>(
    root: BorrowedFd<'_>,
    layer: R,
    budget: &mut UnpackBudget,
) -> Result<LayerStats, UnpackError> {
    let _ = (root, layer, budget);
    todo!("image-unpack branch")
}
