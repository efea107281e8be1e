//! `sandboxd`: a privileged, node-local sandbox runtime for AI-agent platforms.
//!
//! The tree follows the architecture in `docs/architecture.md`:
//! - [`api`]: HTTP only (routes, auth, streaming proxy, metrics);
//! - [`lifecycle`]: the semantics every backend shares (identity, generations,
//!   operation pins, idle reaper, quiesce gate);
//! - [`backend`]: the [`backend::Backend`] trait and its implementations;
//! - [`cgroups`]: per-sandbox cgroups (limits, OOM counters, kill);
//! - [`seccomp`]: the profile, its compiler and the auditor CLI;
//! - [`agent`]: the in-sandbox HTTP server (`sandbox-agent`);
//! - [`init`]: the single-threaded launcher (`sandbox-init`);
//! - [`systemd`]: sd_notify and socket activation.
//! - [`failpoint`]: test-only crash injection (debug builds only).

pub mod agent;
pub mod api;
pub mod backend;
pub mod cgroups;
pub mod cli;
pub mod config;
pub mod failpoint;
pub mod init;
pub mod lifecycle;
pub mod metrics;
pub mod model;
pub mod seccomp;
pub mod systemd;
