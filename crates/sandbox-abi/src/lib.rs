//! The contract between `sandboxd`'s three programs and its two backends,
//! the agent's HTTP API types ([`agent_api`]),
//! with no async runtime: what a create request is and how it is validated
//! ([`model`]) and turned into a sandbox's spec ([`request`]), what a
//! sandbox looks like from inside ([`layout`]), how a sandbox's identity is
//! written onto what a backend makes ([`labels`]), the launcher hand-off
//! between the daemon and `sandbox-init` ([`handoff`]), no-follow host paths
//! ([`paths`]), the one `/proc/<pid>/stat` parser ([`procfs`]) and
//! crash-injection points for tests ([`failpoint`], a cargo feature), and
//! the per-incarnation agent credential's names ([`credential`]), the
//! compiled seccomp filter stack the daemon hands the launcher ([`bpf`]),
//! the cgroup mounts and the launcher's cgroup join ([`cgroupfs`]), random
//! bytes from the kernel ([`random`]) and the agent's API types
//! ([`agent_api`]).
//!
//! Who may depend on whom is in `docs/architecture.md`: every other crate of
//! the workspace may use this one; this one uses none of them.

pub mod agent_api;
pub mod bpf;
pub mod cgroupfs;
pub mod claim;
pub mod credential;
pub mod failpoint;
pub mod handoff;
pub mod labels;
pub mod layout;
pub mod model;
pub mod mountapi;
pub mod paths;
pub mod procfs;
pub mod random;
pub mod request;
