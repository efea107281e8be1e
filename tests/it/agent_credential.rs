//! The agent as a process with a per-incarnation credential (what the
//! Kubernetes backend starts): every request without it is refused (401),
//! with another incarnation's it is refused (403), with it served; and a
//! command the agent runs cannot find it: not in its environment, not in
//! the agent's `/proc/<pid>/environ` or `cmdline` (even to root), not on
//! disk. A `--require-credential` agent without one does not start.

use crate::agent_support::Agent;

use std::process::Command;

use sandbox_abi::credential::{ENV, HEADER};

const CRED: &str = "3c1d0e5a9b7f4c2e8a6d1b0f9e7c5a3b2d4f6e8a0c1b3d5f7e9a2c4b6d8f0e1a";
const OTHER: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[test]
fn requests_need_this_incarnations_credential_and_commands_never_see_it() {
    let agent = Agent::start(&[(ENV, CRED)]);
    // Without it: 401 on every route, the health paths included.
    for (method, path) in [
        ("GET", "/v1/sandbox"),
        ("GET", "/health"),
        ("POST", "/v1/shell/exec"),
        ("POST", "/v1/file/read"),
        ("GET", "/v1/file/download?path=/etc/hostname"),
        ("GET", "/no/such/route"),
    ] {
        let r = agent.request(method, path, &[], b"{}");
        assert_eq!(
            r.status,
            401,
            "{method} {path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        // With another incarnation's: 403.
        let r = agent.request(method, path, &[(HEADER, OTHER)], b"{}");
        assert_eq!(r.status, 403, "{method} {path}");
    }
    let body = br#"{"command":"echo hi"}"#;
    let r = agent.request("POST", "/v1/shell/exec", &[(HEADER, &CRED[..63])], body);
    assert_eq!(r.status, 403, "a prefix is not the credential");
    let r = agent.request("GET", "/v1/sandbox", &[(HEADER, CRED)], b"");
    assert_eq!(r.status, 200);

    // A command looks everywhere it could be.
    let marker = agent.path("");
    let probe = format!(
        "env; echo; cat /proc/$PPID/environ | tr '\\0' '\\n'; echo; \
         cat /proc/$PPID/cmdline | tr '\\0' ' '; echo; \
         grep -rl {cred} {dir} 2>/dev/null; echo done",
        cred = CRED,
        dir = marker.display()
    );
    let body = serde_json::to_vec(&serde_json::json!({"command": probe})).unwrap();
    let r = agent.request(
        "POST",
        "/v1/shell/exec",
        &[(HEADER, CRED), ("Content-Type", "application/json")],
        &body,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let out = r.json()["data"]["output"].as_str().unwrap().to_string();
    assert!(out.contains("done"), "{out}");
    assert!(
        !out.contains(CRED),
        "the credential leaked to a command:\n{out}"
    );
    // (The agent's environ keeps the name with a wiped value; the
    // command's own environment has not even the name.)
    let env_only = out.split("\n\n").next().unwrap();
    assert!(!env_only.contains(ENV), "{env_only}");
    // The agent's parent-visible environ (what /proc/1/environ is in a Pod)
    // has the variable's value wiped, as read by root from outside.
    let environ = std::fs::read(format!("/proc/{}/environ", agent.pid())).unwrap();
    assert!(
        !environ.windows(CRED.len()).any(|w| w == CRED.as_bytes()),
        "the credential is still in the agent's environment block"
    );
}

#[test]
fn require_credential_refuses_to_start_without_one_and_short_ones() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_sandboxd")).with_file_name("sandbox-agent");
    let out = Command::new(&bin)
        .args(["--listen", "127.0.0.1:0", "--require-credential"])
        .env_remove(ENV)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(ENV), "{err}");
    let out = Command::new(&bin)
        .args(["--listen", "127.0.0.1:0"])
        .env(ENV, "short")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("shorter"));
}
