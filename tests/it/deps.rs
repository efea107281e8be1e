//! Dependency budgets (issue #31 §4; `docs/architecture.md`, "Crate
//! budget"): the crates each program links, counted the way the docs say,
//! so a new dependency or feature cannot raise them unnoticed.
//!
//! Counted: the distinct `name version` lines of
//! `cargo tree -p <package> -e normal --prefix none --offline --locked`,
//! the package itself and proc macros included, build scripts' and tests'
//! dependencies not. Offline and locked: the lockfile decides, nothing is
//! fetched.

use std::collections::BTreeSet;
use std::process::Command;

/// The most crates each package may pull in.
const BUDGETS: &[(&str, usize)] = &[("sandbox-agent", 60)];

/// The distinct `name version` entries of the package's normal tree.
fn crates_of(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--offline", "--locked"])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            // "name vX.Y.Z (path or proc-macro) (*)" -> "name vX.Y.Z"
            let mut words = l.split_whitespace();
            let name = words.next().unwrap_or_default();
            let version = words.next().unwrap_or_default();
            format!("{name} {version}")
        })
        .collect()
}

#[test]
fn the_privileged_binaries_stay_within_their_crate_budgets() {
    for &(package, budget) in BUDGETS {
        let crates = crates_of(package);
        assert!(
            crates.iter().any(|c| c.starts_with(&format!("{package} "))),
            "{package} is not in its own tree: {crates:?}"
        );
        assert!(
            crates.len() <= budget,
            "{package} pulls in {} crates, its budget is {budget} \
             (docs/architecture.md, Crate budget):\n{}",
            crates.len(),
            crates.iter().cloned().collect::<Vec<_>>().join("\n")
        );
    }
}

#[test]
fn the_agent_links_neither_a_regex_engine_nor_nix_nor_the_daemons_stack() {
    let crates = crates_of("sandbox-agent");
    for banned in [
        "regex-automata", // tracing-subscriber's env-filter
        "nix",            // the agent and sandbox-abi use rustix
        "parking_lot",    // tokio's `full`
        "kube",
        "k8s-openapi",
        "libcgroups",
        "seccompiler",
        "utoipa",
        "clap",
    ] {
        assert!(
            !crates.iter().any(|c| c.starts_with(&format!("{banned} "))),
            "sandbox-agent links {banned}: {crates:?}"
        );
    }
}
