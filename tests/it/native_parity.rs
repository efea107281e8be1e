//! Behaviours the platform's client relies on since the Python provisioner
//! (the "[parity]" issue), on native sandboxes with real processes
//! (privileged; each test skips loudly when not root). The memory-backend
//! counterparts are in `api_parity.rs`.

use crate::common;

use std::time::{Duration, Instant};

use common::{privileged, Daemon, NativeDirs};
use serde_json::json;

fn ephemeral(id: &str) -> serde_json::Value {
    json!({"sandbox_id": id, "thread_id": "t", "uid": "u1", "inherit_env": false})
}

async fn create(d: &Daemon, body: serde_json::Value) -> serde_json::Value {
    let (s, v) = d.create(body).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// The agent's cap on a command follows `SANDBOX_EXEC_TIMEOUT_SECONDS`
/// (minus the margin), lower or above the agent's old fixed 170 s.
#[tokio::test]
async fn the_exec_cap_follows_the_exec_timeout() {
    if !privileged("the_exec_cap_follows_the_exec_timeout") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[("SANDBOX_EXEC_TIMEOUT_SECONDS", "6")]);
    create(&d, ephemeral("capped")).await;
    let started = Instant::now();
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes/capped/proxy/v1/shell/exec",
            Some(json!({"command": "echo before; sleep 20"})),
        )
        .await;
    let took = started.elapsed();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["data"]["status"], "hard_timeout", "{v}");
    assert_eq!(v["data"]["exit_code"], 124);
    assert!(took < Duration::from_secs(6), "answered after {took:?}");
    assert!(took > Duration::from_secs(4), "answered after {took:?}");
    drop(d);

    let d = Daemon::start_native(&dirs, &[("SANDBOX_EXEC_TIMEOUT_SECONDS", "260")]);
    create(&d, ephemeral("long")).await;
    let config = d.state_dir.path().join("sandboxes/long/bundle/config.json");
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap();
    let args: Vec<&str> = spec["process"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--exec-cap-seconds")
        .unwrap_or_else(|| panic!("no --exec-cap-seconds in {args:?}"));
    assert_eq!(args[at + 1], "250", "{args:?}");
    let (out, _) = d.exec("long", "echo ok").await;
    assert_eq!(out, "ok\n");
}
