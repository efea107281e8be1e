//! Builds the static `sandbox-agent` and puts it next to `sandboxd`.
//!
//! The agent runs inside images that may have no glibc (or another one), so
//! it is linked with `-C target-feature=+crt-static`. Cargo cannot scope
//! rustflags to one package (`profile-rustflags` is unstable) and the daemon
//! must stay dynamically linked (glibc's NSS, which name resolution for the
//! Kubernetes API server needs, does not work in static binaries). So this
//! script runs a second cargo, for the `sandbox-agent` package only, with
//! the flag scoped to the target (`--target`, so build scripts and proc
//! macros are unaffected), in its own target directory (the outer cargo holds
//! the lock on ours), and copies the result to `target/<profile>/`, where
//! `cargo build` puts the other two binaries and where the daemon looks for
//! its siblings. Nothing else is written outside `OUT_DIR`.
//!
//! `SANDBOXD_SKIP_AGENT_BUILD=1` skips it (for tools that only check code).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=crates/sandbox-agent");
    println!("cargo:rerun-if-changed=crates/sandbox-abi");
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-env-changed=SANDBOXD_SKIP_AGENT_BUILD");
    if std::env::var_os("SANDBOXD_SKIP_AGENT_BUILD").is_some_and(|v| v == "1") {
        println!(
            "cargo:warning=SANDBOXD_SKIP_AGENT_BUILD=1: the static sandbox-agent was not built"
        );
        return;
    }
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("cargo did not set {k}"));
    let out_dir = PathBuf::from(env("OUT_DIR"));
    let target = env("TARGET");
    let profile = env("PROFILE"); // "debug" or "release"
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    // OUT_DIR is <profile dir>/build/sandboxd-<hash>/out; the binaries of
    // this build go to <profile dir>.
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .expect("OUT_DIR has the layout cargo documents")
        .to_path_buf();
    let agent_target_dir = profile_dir.join("static-agent");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());

    let mut cmd = Command::new(cargo);
    cmd.current_dir(&manifest_dir)
        .args([
            "build",
            "--package",
            "sandbox-agent",
            "--bin",
            "sandbox-agent",
        ])
        .args(["--features", "static-bin", "--target", &target])
        .arg("--target-dir")
        .arg(&agent_target_dir);
    if profile == "release" {
        cmd.arg("--release");
    }
    if std::env::var_os("CARGO_NET_OFFLINE").is_some() {
        cmd.arg("--offline");
    }
    // With --target, these flags reach only the agent and its dependencies.
    let flags = "-Ctarget-feature=+crt-static";
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags)
        // Clippy's wrapper (and whatever the outer build set for its own
        // target directory or flags) must not reach the inner build.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR");
    let status = cmd
        .status()
        .expect("cannot run cargo to build the static sandbox-agent");
    assert!(status.success(), "building the static sandbox-agent failed");

    let built = agent_target_dir
        .join(&target)
        .join(&profile)
        .join("sandbox-agent");
    install(&built, &profile_dir.join("sandbox-agent"));
}

/// Copies through a temporary name and renames, so a running test never
/// sees a half-written binary.
fn install(from: &Path, to: &Path) {
    let tmp = to.with_extension("tmp");
    std::fs::copy(from, &tmp)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), tmp.display()));
    std::fs::rename(&tmp, to)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp.display(), to.display()));
}
