//! Cross-check against the reference client: the published Python client
//! `agent-sandbox==0.0.30` drives a real `sandbox-agent` through
//! `tests/py/agent_client_check.py` (the same script later runs against a
//! sandbox behind the daemon's proxy).
//!
//! Needs the venv made by `tests/py/setup-venv.sh` at
//! `${SANDBOXD_TEST_VENV:-<repo>/target/test-venv}`. Without it the test
//! fails when `CI` is set and is skipped (loudly) otherwise.

#[path = "agent_support/mod.rs"]
mod agent_support;

use std::path::PathBuf;
use std::process::Command;

use agent_support::Agent;

fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("SANDBOXD_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-venv"));
    let python = venv.join("bin/python");
    python.exists().then_some(python)
}

#[test]
fn published_python_client_round_trip() {
    let Some(python) = venv_python() else {
        let msg = "the agent-sandbox venv is missing; run tests/py/setup-venv.sh";
        if std::env::var_os("CI").is_some() {
            panic!("{msg} (CI is set, so this is a failure)");
        }
        eprintln!("\n*** SKIPPED published_python_client_round_trip: {msg} ***\n");
        return;
    };
    let agent = Agent::start(&[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/agent_client_check.py");
    let root = agent.path("client-check");
    let out = Command::new(python)
        .arg(script)
        .arg(agent.base_url())
        .arg(&root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run the python client check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client check failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 20,
        "{stdout}"
    );
}
