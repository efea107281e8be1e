//! Behaviours the platform's client relies on since the Python provisioner
//! (the "[parity]" issue), end to end with the memory backend: the real
//! `sandboxd` binary, real HTTP, a real upstream standing in for sandboxes.
//! The native counterparts are in `native_parity.rs`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{create_body, full, upstream, Daemon, BARRIER_LOG, DELETE_WAITS, IDLE_CHECK, TOKEN};
use http_body_util::BodyExt;
use serde_json::json;

async fn daemon_with_upstream(extra: &[(&str, &str)]) -> Daemon {
    let up = upstream::start().await;
    let template = format!("http://{up}/{{sandbox_id}}");
    let mut env = vec![("MEMORY_SANDBOX_URL_TEMPLATE", template.as_str())];
    env.extend_from_slice(extra);
    Daemon::start_memory(&env)
}

/// Starts an authenticated GET through the proxy; returns the response
/// without reading its (streamed) body.
async fn proxied_get(d: &Daemon, path: &str) -> http::Response<hyper::body::Incoming> {
    let req = http::Request::builder()
        .uri(d.url(path))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(full(Bytes::new()))
        .unwrap();
    d.client.request(req).await.unwrap()
}

/// Quiesce closes the gate, then waits for a create that passed it (held
/// here by the memory backend's create delay) before deleting: the answer
/// counts it and no sandbox exists afterwards.
#[tokio::test]
async fn quiesce_waits_for_a_create_in_flight() {
    let d = Arc::new(Daemon::start_memory(&[("MEMORY_CREATE_DELAY_MS", "1500")]));
    let d2 = d.clone();
    let create = tokio::spawn(async move {
        d2.json(
            "POST",
            "/api/sandboxes",
            Some(create_body("late", "t", "u")),
        )
        .await
    });
    // Past the quiesce gate: held in the backend.
    assert!(
        d.until_log("create held for its delay", 1, Duration::from_secs(10))
            .await,
        "the create never reached the backend"
    );
    let (s, v) = d
        .json("POST", "/api/sandboxes/quiesce?timeout_seconds=30", None)
        .await;
    assert_eq!((s, v), (200, json!({"ok": true, "deleted": 1})));
    let (s, v) = create.await.unwrap();
    assert_eq!(s, 200, "the create passed the gate before quiesce: {v}");
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 0, "a sandbox exists after quiesce: {v}");
    let (s, _) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("later", "t", "u")),
        )
        .await;
    assert_eq!(s, 503);
}

/// A response that streams for longer than the idle timeout marks activity
/// when it ends: the sandbox is not reaped right after it.
#[tokio::test]
async fn a_long_response_counts_as_activity_when_it_ends() {
    let d = daemon_with_upstream(&[
        ("SANDBOX_IDLE_TIMEOUT_SECONDS", "2"),
        ("SANDBOX_EXEC_TIMEOUT_SECONDS", "1"),
        ("SANDBOX_IDLE_CHECK_INTERVAL_SECONDS", "1"),
        ("RUST_LOG", BARRIER_LOG),
    ])
    .await;
    let (s, _) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("long", "t", "u")),
        )
        .await;
    assert_eq!(s, 200);
    // 9 chunks 500 ms apart: 4 s, twice the idle timeout.
    let resp = proxied_get(&d, "/api/sandboxes/long/proxy/slow?chunks=9&ms=500").await;
    assert_eq!(resp.status(), 200);
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(String::from_utf8_lossy(&text).lines().count(), 9);
    // One more pass of the reaper (a pass takes microseconds: it began
    // after the response ended, within a check interval, so well inside
    // the idle timeout of the end), which finds the sandbox idle since its
    // admission 4 s ago unless the end counted as activity.
    let passes = d.log_count(IDLE_CHECK);
    assert!(
        d.until_log(IDLE_CHECK, passes + 1, Duration::from_secs(10))
            .await,
        "the reaper did not run"
    );
    let (s, v) = d.json("GET", "/api/sandboxes/long", None).await;
    assert_eq!(s, 200, "reaped right after its response ended: {v}");
}

/// Only the headers the replaced provisioner allowed come back from a
/// sandbox (plus framing); the list is configurable.
#[tokio::test]
async fn only_allowed_response_headers_come_back() {
    let d = daemon_with_upstream(&[]).await;
    d.json("POST", "/api/sandboxes", Some(create_body("hd", "t", "u")))
        .await;
    let resp = proxied_get(&d, "/api/sandboxes/hd/proxy/echo").await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    for k in [
        "content-type",
        "content-disposition",
        "cache-control",
        "etag",
        "last-modified",
        "content-length",
    ] {
        assert!(h.contains_key(k), "{k} not copied back: {h:?}");
    }
    for k in ["set-cookie", "location", "x-custom", "keep-alive"] {
        assert!(
            !h.contains_key(k),
            "{k} copied back from the sandbox: {h:?}"
        );
    }
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(h["content-length"], body.len().to_string().as_str());

    let d = daemon_with_upstream(&[("SANDBOXD_PROXY_RESPONSE_HEADERS", "Content-Type, x-custom")])
        .await;
    d.json("POST", "/api/sandboxes", Some(create_body("hd", "t", "u")))
        .await;
    let resp = proxied_get(&d, "/api/sandboxes/hd/proxy/echo").await;
    let h = resp.headers().clone();
    assert_eq!(h["x-custom"], "from-the-sandbox");
    assert!(h.contains_key("content-type"));
    assert!(!h.contains_key("etag"), "{h:?}");
    assert!(!h.contains_key("set-cookie"), "{h:?}");
}

/// A sandbox that never sends a response head gets the request answered
/// 504 at the head timeout.
#[tokio::test]
async fn a_response_head_that_never_comes_is_a_504() {
    let d = daemon_with_upstream(&[("SANDBOXD_PROXY_HEAD_TIMEOUT_SECONDS", "1")]).await;
    d.json("POST", "/api/sandboxes", Some(create_body("hg", "t", "u")))
        .await;
    let started = Instant::now();
    let (s, v) = tokio::time::timeout(
        Duration::from_secs(10),
        d.json("GET", "/api/sandboxes/hg/proxy/hang", None),
    )
    .await
    .expect("no answer within 10 s");
    assert_eq!(s, 504, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("did not answer"),
        "{v}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // The sandbox is fine and its delete does not wait.
    let (s, _) = d.json("GET", "/api/sandboxes/hg/proxy/echo", None).await;
    assert_eq!(s, 200);
    let (s, _) = tokio::time::timeout(
        Duration::from_secs(5),
        d.json("DELETE", "/api/sandboxes/hg", None),
    )
    .await
    .unwrap();
    assert_eq!(s, 200);
}

/// A response body that stops flowing is cut at the idle-body timeout.
#[tokio::test]
async fn a_stalled_response_body_is_cut() {
    let d = daemon_with_upstream(&[("SANDBOXD_PROXY_BODY_IDLE_TIMEOUT_SECONDS", "1")]).await;
    d.json("POST", "/api/sandboxes", Some(create_body("st", "t", "u")))
        .await;
    // One chunk, then 60 s of silence.
    let resp = proxied_get(&d, "/api/sandboxes/st/proxy/slow?chunks=2&ms=60000").await;
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"chunk0\n");
    let started = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the stalled body was not cut within 10 s");
    assert!(
        !matches!(next, Some(Ok(ref f)) if f.is_data()),
        "got data after the stall: {next:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // Ended without a stall: nothing pinned any more.
    let (s, _) = tokio::time::timeout(
        Duration::from_secs(5),
        d.json("DELETE", "/api/sandboxes/st", None),
    )
    .await
    .unwrap();
    assert_eq!(s, 200);
}

/// A delete waits for in-flight requests at most the grace period, then
/// cancels their bodies, even one the client is not reading; requests for
/// other sandboxes are served meanwhile.
#[tokio::test]
async fn delete_cancels_stuck_streams_after_the_grace() {
    let d = Arc::new(daemon_with_upstream(&[("SANDBOXD_DELETE_GRACE_SECONDS", "1")]).await);
    for id in ["stuck", "other"] {
        let (s, _) = d
            .json("POST", "/api/sandboxes", Some(create_body(id, "t", "u")))
            .await;
        assert_eq!(s, 200);
    }
    // A stream being read (a chunk every 200 ms for 200 s) ...
    let resp = proxied_get(&d, "/api/sandboxes/stuck/proxy/slow?chunks=1000&ms=200").await;
    let mut reading = resp.into_body();
    reading.frame().await.unwrap().unwrap();
    // ... and a 10 GB download nobody reads (back-pressure all the way).
    let unread = proxied_get(&d, "/api/sandboxes/stuck/proxy/download?bytes=10000000000").await;
    assert_eq!(unread.status(), 200);

    let d2 = d.clone();
    let started = Instant::now();
    let del = tokio::spawn(async move { d2.json("DELETE", "/api/sandboxes/stuck", None).await });
    // While that delete waits, another sandbox is served: its answer comes
    // before the delete's (which waits for the streams, then the grace).
    assert!(
        d.until_log(DELETE_WAITS, 1, Duration::from_secs(10)).await,
        "the delete did not wait for the streams"
    );
    let (s, _) = d.json("GET", "/api/sandboxes/other/proxy/echo", None).await;
    assert_eq!(s, 200);
    assert!(
        !del.is_finished(),
        "the delete did not wait for the streams"
    );
    let (s, v) = tokio::time::timeout(Duration::from_secs(15), del)
        .await
        .expect("the delete still waits for the streams after 15 s")
        .unwrap();
    assert_eq!((s, v), (200, json!({"ok": true, "sandbox_id": "stuck"})));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The stream that was being read ends in an error (cut, not completed).
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match reading.frame().await {
                Some(Ok(_)) => continue,
                Some(Err(_)) => return true,
                None => return false,
            }
        }
    })
    .await
    .expect("the cancelled stream did not end");
    assert!(end, "the cancelled stream ended as if complete");
    drop(unread);
    let (s, _) = d.json("GET", "/api/sandboxes/stuck/proxy/echo", None).await;
    assert_eq!(s, 404);
    let (s, _) = d.json("GET", "/api/sandboxes/other", None).await;
    assert_eq!(s, 200);
}

/// On SIGTERM with `stop_sandboxes_on_exit`, the sandboxes are deleted
/// concurrently (each within its grace period) and the daemon exits well
/// within the unit's stop timeout; with a stop deadline shorter than the
/// grace, the deadline wins.
#[tokio::test]
async fn sigterm_stops_sandboxes_concurrently_within_the_deadline() {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "shutdown_grace_seconds = 1\n").unwrap();
    let cfg = config.path().to_str().unwrap();
    for (grace, stop_timeout, within) in [("2", "60", 7), ("30", "2", 6)] {
        let mut d = daemon_with_upstream(&[
            ("SANDBOXD_CONFIG", cfg),
            ("SANDBOXD_STOP_SANDBOXES_ON_EXIT", "true"),
            ("SANDBOXD_DELETE_GRACE_SECONDS", grace),
            ("SANDBOXD_STOP_TIMEOUT_SECONDS", stop_timeout),
        ])
        .await;
        // Eight sandboxes, each with a download nobody reads.
        let mut held = Vec::new();
        for i in 0..8 {
            let id = format!("s{i}");
            let (s, _) = d
                .json("POST", "/api/sandboxes", Some(create_body(&id, "t", "u")))
                .await;
            assert_eq!(s, 200);
            let r = proxied_get(
                &d,
                &format!("/api/sandboxes/{id}/proxy/download?bytes=10000000000"),
            )
            .await;
            assert_eq!(r.status(), 200);
            held.push(r);
        }
        let started = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(d.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = d.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < end,
                "grace {grace}, stop timeout {stop_timeout}: the daemon did not exit within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let took = started.elapsed();
        assert!(status.success(), "{status:?}");
        assert!(
            took < Duration::from_secs(within),
            "grace {grace}, stop timeout {stop_timeout}: exit took {took:?}"
        );
        drop(held);
    }
}
