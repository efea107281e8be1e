//! Shared by the tests that run the published Python client
//! (`tests/py/agent_client_check.py`, `agent-sandbox==0.0.30`).

use std::path::PathBuf;
use std::process::Output;

/// The venv's python (`tests/py/setup-venv.sh` makes it at
/// `${SANDBOXD_TEST_VENV:-<repo>/target/test-venv}`). When it is missing:
/// a failure under `CI`, a loud skip (None) otherwise.
pub fn python_or_skip(test: &str) -> Option<PathBuf> {
    let venv = std::env::var_os("SANDBOXD_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-venv"));
    let python = venv.join("bin/python");
    if python.exists() {
        return Some(python);
    }
    crate::common::cannot_run(&format!(
        "{test}: the agent-sandbox venv is missing; run tests/py/setup-venv.sh"
    ));
    None
}

/// The check script.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/agent_client_check.py")
}

/// Asserts the script passed every check (at least 20 of them).
pub fn assert_passed(out: &Output, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 20,
        "{stdout}"
    );
}
