//! All integration tests, in one binary (one link instead of twenty; the
//! shared helpers are used, so none needs `allow(dead_code)`).
//!
//! Modules by subject: the daemon and its CLI over the memory backend
//! (`api`, `daemon_config`, `operator`, `systemd`), the Kubernetes backend
//! against a fake API server (`kube_backend`, `kube_golden`), the agent on its
//! own (`agent_http`, `agent_client`, `agent_static`, `agent_credential`), native sandboxes with
//! real processes (`native*`, `cgroups_real`), and seccomp evidence
//! (`seccomp_*`). Privileged tests need root, some a tool; they say loudly
//! when they skip (`common::privileged`, `common::require_tool`), and under
//! `CI=true` they fail instead.
//!
//! Two tiers: `cargo test` runs the fast one; the heavy tests (the soak, the
//! Debian package) are `#[ignore = "heavy tier: ..."]` and run with
//! `cargo test --test it -- --ignored`. `bash .ci/run` runs both, then the
//! VM tier (`tests/vm/run.sh`), which runs the v2-relevant part of this
//! binary again inside a pure cgroup v2 guest booted by systemd.
//!
//! Run one subject with `cargo test --test it native_` (a name filter).

// Shared helpers.
mod agent_support;
mod common;
#[cfg(feature = "kube")]
mod kube_fake;
mod pyclient;

// Tests.
mod agent_client;
mod agent_credential;
mod agent_http;
mod agent_static;
mod api;
mod api_parity;
mod cgroups_real;
mod daemon_config;
mod deps;
mod fuzz_api;
#[cfg(feature = "images")]
mod images;
#[cfg(feature = "kube")]
mod kube_backend;
#[cfg(feature = "kube")]
mod kube_golden;
mod logs_journald;
mod logs_json;
mod native;
mod native_cgroups;
mod native_client;
mod native_devices;
mod native_durability;
mod native_etc;
mod native_hibernate;
mod native_isolation;
mod native_parity;
mod native_pool;
mod native_runc;
mod native_seccomp;
mod native_userns;
mod network;
mod openapi;
mod operator;
mod package;
mod relay;
mod seccomp_cli;
mod seccomp_probe;
mod seccomp_runc;
mod seccomp_workloads;
mod soak;
mod systemd;
mod systemd_seccomp;
