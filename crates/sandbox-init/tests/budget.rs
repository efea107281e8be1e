//! The launcher's dependency budget (docs/architecture.md, "Crate map"):
//! `cargo tree -p sandbox-init -e normal` lists at most [`BUDGET`] crates,
//! counted as distinct `name version` lines of
//! `cargo tree -p sandbox-init -e normal --prefix none` (sandbox-init
//! itself and proc macros included). Runs cargo offline, on the lockfile.

use std::collections::BTreeSet;
use std::process::Command;

const BUDGET: usize = 30;

fn tree(features: &[&str]) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "--locked", "-p", "sandbox-init"])
        .args(["-e", "normal", "--prefix", "none"])
        .args(features)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            // `name vX.Y.Z (path or marker) (*)`: the name and version.
            let mut w = l.split_whitespace();
            format!("{} {}", w.next().unwrap(), w.next().unwrap_or(""))
        })
        .collect()
}

#[test]
fn the_shipped_launcher_stays_within_its_crate_budget() {
    let crates = tree(&[]);
    let names: Vec<&str> = crates.iter().map(|c| c.as_str()).collect();
    assert!(
        crates.len() <= BUDGET,
        "sandbox-init links {} crates, the budget is {BUDGET}:\n{}",
        crates.len(),
        names.join("\n")
    );
    // What the budget keeps out: the launcher neither parses with oci-spec,
    // nor joins cgroups through libcgroups, nor compiles seccomp profiles.
    for banned in [
        "oci-spec",
        "libcgroups",
        "seccompiler",
        "sandbox-seccomp",
        "sandbox-cgroups",
        "rand",
    ] {
        assert!(
            !crates.iter().any(|c| c.split(' ').next() == Some(banned)),
            "{banned} is in sandbox-init's tree:\n{}",
            names.join("\n")
        );
    }
    assert!(
        crates.iter().any(|c| c.starts_with("sandbox-init ")),
        "{names:?}"
    );
}

#[test]
fn the_compile_feature_brings_the_compiler() {
    let crates = tree(&["--features", "compile"]);
    for wanted in ["sandbox-seccomp", "seccompiler"] {
        assert!(
            crates.iter().any(|c| c.split(' ').next() == Some(wanted)),
            "{wanted} missing with --features compile: {crates:?}"
        );
    }
}
