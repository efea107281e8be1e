//! End-to-end tests of `sandbox-agent`: the real binary, real processes,
//! raw HTTP/1.1 over TCP. Every test starts its own agent (umask 077, cwd a
//! fresh temp dir) and checks the readiness pipe on the way.
//!
//! - `exec`: output, exit codes, timeouts, caps, truncation, reaping, SIGTERM;
//! - `files`: read/write/list/find/edit, error envelopes, upload/download;
//! - `pid1`: the agent as PID 1 of a new pid namespace (skips without one).

use crate::agent_support;
mod exec;
mod files;
mod pid1;

use agent_support::Agent;
use serde_json::json;

#[test]
fn context_and_readiness() {
    let agent = Agent::start(&[]);
    let r = agent.request("GET", "/v1/sandbox", &[], b"");
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["success"], true);
    assert_eq!(v["home_dir"], agent.root.path().display().to_string());
    assert!(v["version"].is_string());
    let sys = &v["detail"]["system"];
    for k in ["os", "os_version", "arch", "user", "home_dir", "timezone"] {
        assert!(sys[k].is_string(), "{k} missing: {v}");
    }
    let port = agent.port.to_string();
    assert!(sys["occupied_ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p == &json!(port)));
    assert!(
        v["detail"]["runtime"]["python"].is_array() && v["detail"]["runtime"]["nodejs"].is_array()
    );
    assert!(v["detail"]["utils"].is_array());
    assert!(!v["data"].is_null());
    // The readiness variable never reaches commands.
    let d = agent.exec(json!({"command": "echo ${SANDBOX_AGENT_READY_FD:-unset}"}));
    assert_eq!(d["output"], "unset\n");
}
