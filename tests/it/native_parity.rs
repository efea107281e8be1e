//! Behaviours the platform's client relies on since the Python provisioner
//! (the "[parity]" issue), on native sandboxes with real processes
//! (privileged; each test skips loudly when not root). The memory-backend
//! counterparts are in `api_parity.rs`.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{full, privileged, Daemon, NativeDirs, TOKEN};
use http_body_util::BodyExt;
use serde_json::json;

fn ephemeral(id: &str) -> serde_json::Value {
    json!({"sandbox_id": id, "thread_id": "t", "uid": "u1", "inherit_env": false})
}

async fn create(d: &Daemon, body: serde_json::Value) -> serde_json::Value {
    let (s, v) = d.create(body).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// Starts an authenticated request through the proxy; returns the response
/// without reading its (streamed) body.
async fn proxied(
    d: &Daemon,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> http::Response<hyper::body::Incoming> {
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let req = http::Request::builder()
        .method(method)
        .uri(d.url(path))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(full(body))
        .unwrap();
    d.client.request(req).await.unwrap()
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

/// A sandbox that plants `out.csv -> /dev/zero` or a FIFO gets a prompt 400
/// through the proxy instead of a download that never ends; a missing
/// file says so; a regular download keeps its headers.
#[tokio::test]
async fn special_files_are_refused_and_missing_ones_say_so() {
    if !privileged("special_files_are_refused_and_missing_ones_say_so") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    create(&d, ephemeral("files")).await;
    let (_, code) = d
        .exec(
            "files",
            "cd /home/gem && ln -s /dev/zero out.csv && mkfifo pipe && printf hi > ok.txt",
        )
        .await;
    assert_eq!(code, 0);
    for name in ["out.csv", "pipe"] {
        let path = format!("/api/sandboxes/files/proxy/v1/file/download?path=/home/gem/{name}");
        let resp = tokio::time::timeout(Duration::from_secs(10), proxied(&d, "GET", &path, None))
            .await
            .unwrap_or_else(|_| panic!("download of {name}: no answer within 10 s"));
        assert_eq!(resp.status(), 400, "download of {name}");
        let v: serde_json::Value =
            serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("is not a regular file"),
            "{v}"
        );
        let resp = tokio::time::timeout(
            Duration::from_secs(10),
            proxied(
                &d,
                "POST",
                "/api/sandboxes/files/proxy/v1/file/read",
                Some(json!({"file": format!("/home/gem/{name}")})),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("read of {name}: no answer within 10 s"));
        assert_eq!(resp.status(), 400, "read of {name}");
    }
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes/files/proxy/v1/file/read",
            Some(json!({"file": "/home/gem/nope.txt"})),
        )
        .await;
    assert_eq!(s, 404, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("/home/gem/nope.txt does not exist"),
        "{v}"
    );
    let resp = proxied(
        &d,
        "GET",
        "/api/sandboxes/files/proxy/v1/file/download?path=/home/gem/ok.txt",
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(h["content-type"], "application/octet-stream");
    assert_eq!(h["content-length"], "2");
    assert!(h["content-disposition"]
        .to_str()
        .unwrap()
        .contains("ok.txt"));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hi");
}
