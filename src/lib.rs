//! `sandboxd`: a privileged, node-local sandbox runtime for AI-agent platforms.
//!
//! This crate is the root daemon; the rest of the workspace is split along
//! the trust boundaries (see `docs/architecture.md`):
//! - [`api`]: HTTP only (routes, auth, streaming proxy, metrics);
//! - [`lifecycle`]: the semantics every backend shares (identity, generations,
//!   proxy guards, idle reaper, quiesce gate);
//! - [`backend`]: the [`backend::Backend`] trait and its implementations;
//! - [`images`]: OCI images as native sandbox roots (store, pulls; the
//!   crate `sandbox-image` does the work; cargo feature `images`, on by
//!   default);
//! - [`cli`], [`config`], [`metrics`], [`systemd`] (sd_notify and socket
//!   activation).
//!
//! From the other workspace crates, re-exported under their old names:
//! [`model`] and [`failpoint`] (`sandbox-abi`), [`cgroups`]
//! (`sandbox-cgroups`), [`seccomp`] (`sandbox-seccomp`). The launcher
//! (`sandbox-init`) and the agent (`sandbox-agent`) are separate programs
//! and are not linked into the daemon.

pub mod api;
pub mod backend;
pub mod cli;
pub mod config;
pub mod images;
pub mod lifecycle;
pub mod metrics;
pub mod systemd;

pub use sandbox_abi::{failpoint, model};

/// The error of a build without the cargo feature `kube` (a node build)
/// when the configuration asks for the Kubernetes backend.
#[cfg(not(feature = "kube"))]
pub const NO_KUBE: &str = "this build has no Kubernetes support (feature `kube`): \
     use `backend = \"native\"`, or a build with default features";
/// The error of a build without the cargo feature `images` (a node build)
/// when a create or the configuration names an image.
#[cfg(not(feature = "images"))]
pub const NO_IMAGES: &str = "this build has no image support (feature `images`): \
     sandboxes run the host's userland; use a build with default features for images";
pub use sandbox_cgroups as cgroups;
pub use sandbox_seccomp as seccomp;
