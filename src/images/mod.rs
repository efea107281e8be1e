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

use serde::{Deserialize, Serialize};

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

/// OCI images as native sandbox root filesystems (`[images]`, see
/// `docs/images.md`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImagesConfig {
    /// The image every native sandbox runs (`SANDBOX_IMAGE`); unset: the
    /// host's `/usr` (`[native] rootfs_binds`). The Kubernetes backend uses
    /// it as the Pod image when set (else the top-level `sandbox_image`).
    pub default: Option<String>,
    /// References a create may name in its `"image"` field (400 otherwise).
    pub allowed: Vec<String>,
    /// A Docker-style `config.json` (`auths`) with registry credentials
    /// (`SANDBOXD_IMAGES_AUTH_FILE`).
    pub auth_file: Option<PathBuf>,
    /// `host:port` of registries spoken to over plain HTTP
    /// (`SANDBOXD_INSECURE_REGISTRIES`, comma-separated).
    pub insecure_registries: Vec<String>,
    /// Largest total of regular-file bytes one image may unpack to.
    pub max_unpacked_mb: u64,
}

impl Default for ImagesConfig {
    fn default() -> Self {
        ImagesConfig {
            default: None,
            allowed: Vec::new(),
            auth_file: None,
            insecure_registries: Vec::new(),
            max_unpacked_mb: 20 * 1024,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use crate::config::test_env;
    use crate::config::Config;

    #[test]
    fn images_settings() {
        let c = Config::load(
            None,
            &test_env(&[
                ("SANDBOX_IMAGE", "127.0.0.1:5000/tools:1"),
                (
                    "SANDBOXD_INSECURE_REGISTRIES",
                    "127.0.0.1:5000, localhost:5001",
                ),
            ]),
        )
        .unwrap();
        assert_eq!(c.images.default.as_deref(), Some("127.0.0.1:5000/tools:1"));
        assert_eq!(c.kube_sandbox_image(), "127.0.0.1:5000/tools:1");
        assert_eq!(
            c.images.insecure_registries,
            vec!["127.0.0.1:5000", "localhost:5001"]
        );
        // The top-level key stays the Kubernetes backend's only.
        let c: Config =
            toml::from_str("sandbox_image = \"x:1\"\n[images]\nallowed = [\"a:1\"]\n").unwrap();
        assert_eq!(c.kube_sandbox_image(), "x:1");
        assert_eq!(c.images.default, None);
        assert_eq!(c.images.allowed, vec!["a:1"]);
    }
}
