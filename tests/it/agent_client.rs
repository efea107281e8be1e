//! Cross-check against the reference client: the published Python client
//! `agent-sandbox==0.0.30` drives a real `sandbox-agent` through
//! `tests/py/agent_client_check.py` (the same script later runs against a
//! sandbox behind the daemon's proxy).
//!
//! Needs the venv made by `tests/py/setup-venv.sh` at
//! `${SANDBOXD_TEST_VENV:-<repo>/target/test-venv}`. Without it the test
//! fails when `CI` is set and is skipped (loudly) otherwise.

use crate::agent_support;
use crate::pyclient;

use std::process::Command;

use agent_support::Agent;

#[test]
fn published_python_client_round_trip() {
    let Some(python) = pyclient::python_or_skip("published_python_client_round_trip") else {
        return;
    };
    let agent = Agent::start(&[]);
    let script = pyclient::script();
    let root = agent.path("client-check");
    let out = Command::new(python)
        .arg(script)
        .arg(agent.base_url())
        .arg(&root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run the python client check");
    pyclient::assert_passed(&out, "client check");
}
