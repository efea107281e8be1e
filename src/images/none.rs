//! A build without the cargo feature `images`: no store, no pulls. The
//! configuration may name no image (refused at start) and a create naming
//! one is refused; sandboxes run the host's userland.

use std::sync::Arc;
use std::time::Duration;

use oci_spec::runtime::Spec;

use super::ResolvedImage;
use crate::config::Config;
use crate::NO_IMAGES;

/// A manifest digest (`sha256:<hex>`): only ever written, never computed.
pub type Digest = String;

/// The refusal of every image.
pub struct Images;

impl Images {
    /// Fails when the configuration names an image: `[images] default`
    /// (`SANDBOX_IMAGE`), `[images] allowed`, a pool variant's image.
    pub fn new(cfg: &Config, _base: &Spec) -> anyhow::Result<Images> {
        let named = cfg
            .images
            .default
            .iter()
            .map(|r| ("[images] default / SANDBOX_IMAGE", r))
            .chain(cfg.images.allowed.iter().map(|r| ("[images] allowed", r)))
            .chain(
                cfg.pool
                    .extra
                    .iter()
                    .filter_map(|v| v.image.as_ref())
                    .map(|r| ("[[pool.extra]] image", r)),
            )
            .next();
        match named {
            Some((key, r)) => anyhow::bail!("{key} names {r:?}: {NO_IMAGES}"),
            None => Ok(Images),
        }
    }

    /// Nothing to pull.
    pub fn start_default_pull(self: &Arc<Self>) {}

    /// `None` (the host's userland) unless an image is asked for, which is
    /// refused.
    pub async fn resolve(
        self: &Arc<Self>,
        requested: Option<&str>,
        _wait: Duration,
    ) -> Result<Option<ResolvedImage>, String> {
        match requested {
            None => Ok(None),
            Some(r) => Err(format!("image {r:?}: {NO_IMAGES}")),
        }
    }
}

/// `sandboxd bundle` and `doctor` with an image: refused.
pub fn resolve_stored(_cfg: &Config, reference: &str) -> anyhow::Result<ResolvedImage> {
    anyhow::bail!("image {reference:?}: {NO_IMAGES}")
}
