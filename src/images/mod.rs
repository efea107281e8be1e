//! The daemon's and the CLI's side of images (`[images]`, `docs/images.md`):
//! the store under `<state_dir>/images/`, resolving a sandbox's image
//! (present, or pulled once however many creates wait for it), the
//! background pull of the default image at start-up, and the pull
//! counters for `/metrics`. The store and the registry protocol are
//! `sandbox-image`'s.
//!
//! Without the cargo feature `images` (a node build) only the types the
//! native backend names are here, and [`Images`] is the refusal of every
//! image: the configuration may name none (checked at start), a create
//! naming one is refused, and sandboxes run the host's userland.

use std::collections::BTreeMap;
use std::path::PathBuf;

#[cfg(feature = "images")]
mod store;
#[cfg(feature = "images")]
pub use store::{image_users, mount_points, resolve_stored, Images};

#[cfg(not(feature = "images"))]
mod none;
#[cfg(not(feature = "images"))]
pub use none::{resolve_stored, Digest, Images};
#[cfg(feature = "images")]
pub use sandbox_image::Digest;

/// An image a sandbox runs: where its root is and what env it brings.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// The normalized reference it was asked for.
    pub reference: String,
    /// The manifest digest: what `state.json` records as in use.
    pub digest: Digest,
    pub rootfs: PathBuf,
    /// The image config's `Env`.
    pub env: Vec<String>,
}

/// Pull counters (`/metrics`).
#[derive(Debug, Clone, Default)]
pub struct ImageStats {
    pub pulls_ok: u64,
    pub pulls_failed: u64,
    /// Bytes of blobs fetched (cached blobs not counted).
    pub bytes: u64,
    /// Seconds spent in pulls, in all.
    pub seconds: f64,
    /// Verification failures by kind (`digest`, `size`, `diff_id`, ...).
    pub verification_failures: BTreeMap<String, u64>,
}

/// The normalized spelling of image reference `r` (`busybox` is
/// `docker.io/library/busybox:latest`); without the feature `images`, the
/// refusal of any.
pub fn normalize(r: &str) -> Result<String, String> {
    #[cfg(feature = "images")]
    return sandbox_image::reference::normalize(r);
    #[cfg(not(feature = "images"))]
    return Err(format!("{r:?}: {}", crate::NO_IMAGES));
}
