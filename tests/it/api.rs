//! The provisioner HTTP contract, end to end: the real `sandboxd` binary on
//! an ephemeral port with the memory backend, real HTTP, a real upstream.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{create_body, full, upstream, Daemon, TOKEN};
use http_body_util::BodyExt;
use serde_json::json;

async fn daemon_with_upstream(extra: &[(&str, &str)]) -> (Daemon, std::net::SocketAddr) {
    let up = upstream::start().await;
    let template = format!("http://{up}/{{sandbox_id}}");
    let mut env = vec![("MEMORY_SANDBOX_URL_TEMPLATE", template.as_str())];
    env.extend_from_slice(extra);
    (Daemon::start_memory(&env), up)
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

#[tokio::test]
async fn health_and_metrics_need_no_token() {
    let d = Daemon::start_memory(&[]);
    let (s, _, b) = d.call("GET", "/health", None, None).await;
    assert_eq!(s, 200);
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["backend"], "memory");
    assert_eq!(v["idle_timeout_seconds"], 600);
    assert_eq!(v["idle_check_interval_seconds"], 10);
    assert_eq!(v["tracked_sandboxes"], 0);
    let (s, _, b) = d.call("GET", "/metrics", None, None).await;
    assert_eq!(s, 200);
    let text = String::from_utf8(b.to_vec()).unwrap();
    for m in [
        "sandboxd_sandboxes{status=\"running\"}",
        "sandboxd_create_duration_seconds",
        "sandboxd_delete_duration_seconds",
        "sandboxd_proxy_duration_seconds",
        "sandboxd_reaped_total",
    ] {
        assert!(text.contains(m), "{m} missing from /metrics:\n{text}");
    }
}

#[tokio::test]
async fn every_protected_route_needs_the_token() {
    let d = Daemon::start_memory(&[]);
    let (s, _) = d
        .json("POST", "/api/sandboxes", Some(create_body("s1", "t", "u")))
        .await;
    assert_eq!(s, 200);
    let routes = [
        ("GET", "/api/sandboxes"),
        ("POST", "/api/sandboxes"),
        ("GET", "/api/sandboxes/s1"),
        ("DELETE", "/api/sandboxes/s1"),
        ("POST", "/api/sandboxes/s1/touch"),
        ("POST", "/api/sandboxes/quiesce"),
        ("GET", "/api/sandboxes/s1/proxy"),
        ("GET", "/api/sandboxes/s1/proxy/x/y"),
        ("POST", "/api/sandboxes/s1/proxy/x"),
        ("PUT", "/api/sandboxes/s1/proxy/x"),
        ("PATCH", "/api/sandboxes/s1/proxy/x"),
        ("DELETE", "/api/sandboxes/s1/proxy/x"),
        ("HEAD", "/api/sandboxes/s1/proxy/x"),
        ("OPTIONS", "/api/sandboxes/s1/proxy/x"),
    ];
    let wrong = "w".repeat(TOKEN.len());
    for (m, p) in routes {
        for tok in [None, Some(wrong.as_str()), Some(&TOKEN[..TOKEN.len() - 1])] {
            let (s, h, b) = d.call(m, p, None, tok).await;
            assert_eq!(s, 401, "{m} {p} with {tok:?}");
            if m != "HEAD" {
                let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
                assert!(v["detail"].is_string(), "{m} {p}: {v}");
            }
            assert_eq!(h["www-authenticate"], "Bearer");
        }
    }
    // Nothing changed: the sandbox is still there, quiesce did not run.
    let (s, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!((s, v["count"].as_i64()), (200, Some(1)));
    // A raw "Bearer" prefix variant is refused too.
    let (s, _, _) = d
        .call("GET", "/api/sandboxes", None, Some(&format!(" {TOKEN}")))
        .await;
    assert_eq!(s, 401);
}

#[tokio::test]
async fn create_reuse_identity_discover_touch_list() {
    let d = Daemon::start_memory(&[("PROVISIONER_PUBLIC_URL", "http://prov.example:8002/")]);
    let (s, a) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(json!({"sandbox_id":"3f2a9c1b7d44","thread_id":"t1","uid":"u1","workdir_path":"projects/abc","env":{"A":"1","B":null}})),
        )
        .await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(a["sandbox_id"], "3f2a9c1b7d44");
    assert_eq!(
        a["sandbox_url"],
        "http://prov.example:8002/api/sandboxes/3f2a9c1b7d44/proxy"
    );
    assert_eq!(a["status"], "running");
    assert_eq!(a["workdir_path"], "projects/abc");
    assert_eq!(a["generation"].as_str().unwrap().len(), 32);
    // Reuse: same generation.
    let (s, b) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(json!({"sandbox_id":"3f2a9c1b7d44","thread_id":"t1","uid":"u1","workdir_path":"projects/abc"})),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(a["generation"], b["generation"]);
    // Identity mismatch: thread, uid, workdir, storage mode.
    for body in [
        json!({"sandbox_id":"3f2a9c1b7d44","thread_id":"t2","uid":"u1","workdir_path":"projects/abc"}),
        json!({"sandbox_id":"3f2a9c1b7d44","thread_id":"t1","uid":"u2","workdir_path":"projects/abc"}),
        json!({"sandbox_id":"3f2a9c1b7d44","thread_id":"t1","uid":"u1","workdir_path":"projects/other"}),
        json!({"sandbox_id":"3f2a9c1b7d44","thread_id":"t1","uid":"u1"}),
    ] {
        let (s, v) = d.json("POST", "/api/sandboxes", Some(body)).await;
        assert_eq!(s, 400, "{v}");
        assert!(
            v["detail"]
                .as_str()
                .unwrap()
                .contains("identity does not match existing generation"),
            "{v}"
        );
    }
    let (s, v) = d.json("GET", "/api/sandboxes/3f2a9c1b7d44", None).await;
    assert_eq!(s, 200);
    assert_eq!(v["generation"], a["generation"]);
    let (s, v) = d
        .json("POST", "/api/sandboxes/3f2a9c1b7d44/touch", None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        v,
        json!({"ok":true,"sandbox_id":"3f2a9c1b7d44","status":"running"})
    );
    let (s, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(s, 200);
    assert_eq!(v["count"], 1);
    assert_eq!(v["sandboxes"][0]["generation"], a["generation"]);
    let (s, v) = d.json("GET", "/api/sandboxes/nope", None).await;
    assert_eq!((s, v), (404, json!({"detail":"sandbox not found"})));
    let (s, _) = d.json("POST", "/api/sandboxes/nope/touch", None).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let d = Daemon::start_memory(&[]);
    let cases: Vec<(&str, Bytes, u16, &str)> = vec![
        ("malformed", Bytes::from_static(b"{\"sandbox_id\": "), 400, "invalid request body"),
        ("not json", Bytes::from_static(b"hello"), 400, "invalid request body"),
        ("wrong type", Bytes::from(json!({"sandbox_id":5,"thread_id":"t","uid":"u"}).to_string()), 400, "invalid type"),
        ("missing field", Bytes::from(json!({"sandbox_id":"a","uid":"u"}).to_string()), 400, "thread_id"),
        ("bad id chars", Bytes::from(json!({"sandbox_id":"a/b","thread_id":"t","uid":"u"}).to_string()), 400, "sandbox_id"),
        ("bad id dot", Bytes::from(json!({"sandbox_id":"a.b","thread_id":"t","uid":"u"}).to_string()), 400, "sandbox_id"),
        ("empty id", Bytes::from(json!({"sandbox_id":"","thread_id":"t","uid":"u"}).to_string()), 400, "sandbox_id"),
        ("long id", Bytes::from(json!({"sandbox_id":"a".repeat(64),"thread_id":"t","uid":"u"}).to_string()), 400, "sandbox_id"),
        ("bad uid", Bytes::from(json!({"sandbox_id":"a","thread_id":"t","uid":"../x"}).to_string()), 400, "uid"),
        ("absolute workdir", Bytes::from(json!({"sandbox_id":"a","thread_id":"t","uid":"u","workdir_path":"/etc"}).to_string()), 400, "workdir_path"),
        ("dotdot workdir", Bytes::from(json!({"sandbox_id":"a","thread_id":"t","uid":"u","workdir_path":"p/../../x"}).to_string()), 400, "workdir_path"),
        ("backslash workdir", Bytes::from(json!({"sandbox_id":"a","thread_id":"t","uid":"u","workdir_path":"p\\x"}).to_string()), 400, "workdir_path"),
        ("url workdir", Bytes::from(json!({"sandbox_id":"a","thread_id":"t","uid":"u","workdir_path":"s3://b/x"}).to_string()), 400, "workdir_path"),
        ("env key =", Bytes::from(json!({"sandbox_id":"a","thread_id":"t","uid":"u","env":{"A=B":"1"}}).to_string()), 400, "env key"),
        ("env huge", Bytes::from(json!({"sandbox_id":"a","thread_id":"t","uid":"u","env":{"A":"x".repeat(300_000)}}).to_string()), 400, "env is"),
        ("over max resources", Bytes::from(json!({"sandbox_id":"a","thread_id":"t","uid":"u","resources":{"memory_mb":1_000_000}}).to_string()), 400, "resources.memory_mb"),
        ("too large", Bytes::from(vec![b' '; 1024 * 1024 + 1]), 413, "larger than"),
    ];
    for (name, body, want, needle) in cases {
        let (s, _, b) = d
            .call("POST", "/api/sandboxes", Some(full(body)), Some(TOKEN))
            .await;
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(s, want, "{name}: {v}");
        let detail = v["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(needle),
            "{name}: {detail:?} lacks {needle:?}"
        );
    }
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 0, "a bad request created something");

    // Bad ids on the id routes, unknown routes, wrong methods.
    let (s, v) = d.json("GET", "/api/sandboxes/a.b", None).await;
    assert_eq!(s, 400, "{v}");
    let (s, _) = d
        .json(
            "DELETE",
            &format!("/api/sandboxes/{}", "a".repeat(64)),
            None,
        )
        .await;
    assert_eq!(s, 400);
    for p in [
        "/",
        "/api",
        "/api/sandboxes/a/b",
        "/api/sandboxesx",
        "/healthz",
    ] {
        let (s, v) = d.json("GET", p, None).await;
        assert_eq!(s, 404, "{p}");
        assert!(v["detail"].is_string());
    }
    for (m, p) in [
        ("PUT", "/api/sandboxes"),
        ("DELETE", "/api/sandboxes"),
        ("POST", "/api/sandboxes/a"),
        ("GET", "/api/sandboxes/a/touch"),
        ("POST", "/health"),
        ("TRACE", "/api/sandboxes/a/proxy/x"),
    ] {
        let (s, h, _) = d.call(m, p, None, Some(TOKEN)).await;
        assert_eq!(s, 405, "{m} {p}");
        assert!(h.contains_key("allow"));
    }
    let (s, _) = d
        .json("POST", "/api/sandboxes/quiesce?timeout_seconds=0", None)
        .await;
    assert_eq!(s, 400);
    let (s, _) = d
        .json("POST", "/api/sandboxes/quiesce?timeout_seconds=901", None)
        .await;
    assert_eq!(s, 400);
    // The bad quiesce did not close the gate.
    let (s, _) = d
        .json("POST", "/api/sandboxes", Some(create_body("ok1", "t", "u")))
        .await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn stale_generation_delete_is_refused_and_absent_delete_is_ok() {
    let d = Daemon::start_memory(&[]);
    let (_, a) = d
        .json("POST", "/api/sandboxes", Some(create_body("s1", "t", "u")))
        .await;
    let g = a["generation"].as_str().unwrap().to_string();
    let (s, v) = d
        .json(
            "DELETE",
            "/api/sandboxes/s1?expected_generation=0123456789abcdef0123456789abcdef",
            None,
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert!(v["detail"].is_string());
    let (s, v) = d.json("GET", "/api/sandboxes/s1", None).await;
    assert_eq!((s, v["generation"].as_str()), (200, Some(g.as_str())));
    let (s, v) = d
        .json(
            "DELETE",
            &format!("/api/sandboxes/s1?expected_generation={g}"),
            None,
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok":true,"sandbox_id":"s1"})));
    let (s, v) = d.json("DELETE", "/api/sandboxes/s1", None).await;
    assert_eq!((s, v), (200, json!({"ok":true,"sandbox_id":"s1"})));
    // A new incarnation gets a new generation.
    let (_, b) = d
        .json("POST", "/api/sandboxes", Some(create_body("s1", "t", "u")))
        .await;
    assert_ne!(b["generation"].as_str(), Some(g.as_str()));
}

#[tokio::test]
async fn concurrent_creates_of_one_id_yield_one_generation() {
    let d = Daemon::start_memory(&[("MEMORY_CREATE_DELAY_MS", "200")]);
    let d = std::sync::Arc::new(d);
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            d.json(
                "POST",
                "/api/sandboxes",
                Some(create_body("same", "t", "u")),
            )
            .await
        }));
    }
    let mut gens = std::collections::HashSet::new();
    for t in tasks {
        let (s, v) = t.await.unwrap();
        assert_eq!(s, 200);
        gens.insert(v["generation"].as_str().unwrap().to_string());
    }
    assert_eq!(gens.len(), 1, "{gens:?}");
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 1);
}

#[tokio::test]
async fn proxy_forwards_path_query_and_filters_headers() {
    let (d, _) = daemon_with_upstream(&[]).await;
    d.json("POST", "/api/sandboxes", Some(create_body("px", "t", "u")))
        .await;
    let req = http::Request::builder()
        .method("POST")
        .uri(d.url("/api/sandboxes/px/proxy/v1/echo?a=1&b=two%20words"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("x-forwarded-thing", "yes")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "secret")
        .header("proxy-authorization", "Basic Zm9v")
        .body(full("{}"))
        .unwrap();
    let resp = d.client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    for k in [
        "content-type",
        "etag",
        "cache-control",
        "content-disposition",
        "last-modified",
    ] {
        assert!(h.contains_key(k), "{k} not copied back");
    }
    // Only the allow-list comes back: not hop-by-hop headers, nor any
    // other header the sandbox sets.
    for k in ["keep-alive", "x-custom", "set-cookie", "location"] {
        assert!(!h.contains_key(k), "{k} copied back");
    }
    let v: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["method"], "POST");
    assert_eq!(v["path"], "/px/v1/echo");
    assert_eq!(v["query"], "a=1&b=two%20words");
    let hdrs = v["headers"].as_object().unwrap();
    assert!(!hdrs.contains_key("authorization"), "token leaked: {v}");
    assert!(!hdrs.contains_key("proxy-authorization"));
    assert!(!hdrs.contains_key("x-hop"));
    assert_eq!(hdrs["x-forwarded-thing"], "yes");
    assert_eq!(hdrs["content-length"], "2");
    for val in hdrs.values() {
        assert!(!val.as_str().unwrap().contains(TOKEN), "token leaked: {v}");
    }
    // Unknown sandbox: 404; unreachable upstream: 502.
    let (s, v) = d.json("GET", "/api/sandboxes/nobody/proxy/x", None).await;
    assert_eq!((s, v), (404, json!({"detail":"sandbox not found"})));
    let d2 = Daemon::start_memory(&[("MEMORY_SANDBOX_URL_TEMPLATE", "http://127.0.0.1:1")]);
    d2.json("POST", "/api/sandboxes", Some(create_body("px", "t", "u")))
        .await;
    let (s, v) = d2.json("GET", "/api/sandboxes/px/proxy/x", None).await;
    assert_eq!(s, 502, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("unreachable"));
}

#[tokio::test]
async fn delete_waits_for_a_slow_streaming_response() {
    let (d, _) = daemon_with_upstream(&[]).await;
    let d = std::sync::Arc::new(d);
    let (_, a) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("slow", "t", "u")),
        )
        .await;
    let resp = proxied_get(&d, "/api/sandboxes/slow/proxy/slow?chunks=10&ms=150").await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // First chunk arrived: the stream is in flight.
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"chunk0\n");
    let d2 = d.clone();
    let g = a["generation"].as_str().unwrap().to_string();
    let del = tokio::spawn(async move {
        let (s, _) = d2
            .json(
                "DELETE",
                &format!("/api/sandboxes/slow?expected_generation={g}"),
                None,
            )
            .await;
        (s, Instant::now())
    });
    // A new proxy request during the delete waits behind it, then 404s:
    // requests one after the other, answered 200 until the delete has
    // closed admission; the first not answered 200 must have been sent
    // while the stream was still in flight, and answered 404 after it.
    let d3 = d.clone();
    let late = tokio::spawn(async move {
        loop {
            let sent = Instant::now();
            let (s, _) = d3.json("GET", "/api/sandboxes/slow/proxy/echo", None).await;
            if s != 200 {
                return (s, sent, Instant::now());
            }
        }
    });
    // Chunks arrive every 150 ms; the delete was asked for right after the
    // first. When the second-to-last chunk arrives the stream is still in
    // flight, so the delete must not have answered yet. (The very last
    // chunk races with the delete's answer on another connection.)
    let mut rest = Vec::new();
    let mut arrivals = Vec::new();
    while let Some(f) = body.frame().await {
        rest.extend_from_slice(&f.unwrap().into_data().unwrap());
        arrivals.push(Instant::now());
    }
    assert_eq!(
        String::from_utf8(rest).unwrap().lines().count(),
        9,
        "stream cut short"
    );
    let still_streaming = arrivals[arrivals.len() - 2];
    let (s, deleted_at) = del.await.unwrap();
    assert_eq!(s, 200);
    assert!(
        deleted_at > still_streaming,
        "delete finished while the stream was in flight"
    );
    let (s, late_sent, late_at) = late.await.unwrap();
    assert_eq!(
        s, 404,
        "request admitted during the delete reached a deleted sandbox"
    );
    assert!(
        late_sent < still_streaming,
        "every request sent while the stream was in flight was served: the delete did not \
         hold new ones back"
    );
    assert!(late_at > still_streaming);
}

#[tokio::test]
async fn different_ids_do_not_wait_for_each_other() {
    let (d, _) = daemon_with_upstream(&[]).await;
    let d = std::sync::Arc::new(d);
    d.json("POST", "/api/sandboxes", Some(create_body("a1", "t", "u")))
        .await;
    d.json("POST", "/api/sandboxes", Some(create_body("b1", "t", "u")))
        .await;
    let resp = proxied_get(&d, "/api/sandboxes/a1/proxy/slow?chunks=20&ms=100").await;
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    let d2 = d.clone();
    let del_a = tokio::spawn(async move { d2.json("DELETE", "/api/sandboxes/a1", None).await.0 });
    // While a1's delete waits for its stream, b1 is fully served and deleted.
    let (s, _) = d.json("GET", "/api/sandboxes/b1/proxy/echo", None).await;
    assert_eq!(s, 200);
    let (s, _) = d.json("DELETE", "/api/sandboxes/b1", None).await;
    assert_eq!(s, 200);
    assert!(
        !del_a.is_finished(),
        "a1's delete did not wait for its stream"
    );
    while body.frame().await.is_some() {}
    assert_eq!(del_a.await.unwrap(), 200);
}

#[tokio::test]
async fn reaper_deletes_idle_and_spares_touched() {
    let d = Daemon::start_memory(&[
        ("SANDBOX_IDLE_TIMEOUT_SECONDS", "2"),
        ("SANDBOX_EXEC_TIMEOUT_SECONDS", "1"),
        ("SANDBOX_IDLE_CHECK_INTERVAL_SECONDS", "1"),
    ]);
    let (_, h) = d.json("GET", "/health", None).await;
    assert_eq!(h["idle_timeout_seconds"], 2);
    d.json(
        "POST",
        "/api/sandboxes",
        Some(create_body("idle", "t", "u")),
    )
    .await;
    d.json(
        "POST",
        "/api/sandboxes",
        Some(create_body("busy", "t", "u")),
    )
    .await;
    // Keep "busy" active (every 300 ms, well inside the 2 s idle timeout)
    // until the reaper has taken "idle" (its counter is the barrier), then
    // through two more check intervals.
    let reaped = |m: &str| m.contains("sandboxd_reaped_total 1");
    let mut after = 0;
    for i in 0.. {
        // Alternate the two kinds of activity.
        let (s, _) = match i % 2 {
            0 => d.json("POST", "/api/sandboxes/busy/touch", None).await,
            _ => d.json("GET", "/api/sandboxes/busy", None).await,
        };
        assert_eq!(s, 200, "busy sandbox reaped although touched");
        let (_, _, m) = d.call("GET", "/metrics", None, None).await;
        if reaped(&String::from_utf8_lossy(&m)) {
            after += 1;
            if after == 8 {
                break;
            }
        }
        assert!(i < 200, "idle sandbox not reaped within a minute");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (s, _) = d.json("GET", "/api/sandboxes/idle", None).await;
    assert_eq!(s, 404, "idle sandbox not reaped");
    let (_, _, m) = d.call("GET", "/metrics", None, None).await;
    let m = String::from_utf8(m.to_vec()).unwrap();
    assert!(m.contains("sandboxd_reaped_total 1"), "{m}");
}

#[tokio::test]
async fn idle_timeout_below_exec_timeout_is_raised() {
    let d = Daemon::start_memory(&[
        ("SANDBOX_IDLE_TIMEOUT_SECONDS", "60"),
        ("SANDBOX_EXEC_TIMEOUT_SECONDS", "180"),
    ]);
    let (_, h) = d.json("GET", "/health", None).await;
    assert_eq!(h["idle_timeout_seconds"], 210);
    assert!(d.log_contains("raised to exec timeout + 30"));
    let d = Daemon::start_memory(&[("SANDBOX_IDLE_TIMEOUT_SECONDS", "0")]);
    let (_, h) = d.json("GET", "/health", None).await;
    assert_eq!(h["idle_timeout_seconds"], 0);
}

#[tokio::test]
async fn quiesce_deletes_all_and_closes_the_gate() {
    let d = Daemon::start_memory(&[]);
    for id in ["q1", "q2", "q3"] {
        d.json("POST", "/api/sandboxes", Some(create_body(id, "t", "u")))
            .await;
    }
    let (s, v) = d
        .json("POST", "/api/sandboxes/quiesce?timeout_seconds=30", None)
        .await;
    assert_eq!((s, v), (200, json!({"ok":true,"deleted":3})));
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("q4", "t", "u")))
        .await;
    assert_eq!(s, 503, "{v}");
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 0);
}

#[tokio::test]
async fn quiesce_times_out_with_504_behind_a_stream() {
    let (d, _) = daemon_with_upstream(&[]).await;
    d.json(
        "POST",
        "/api/sandboxes",
        Some(create_body("held", "t", "u")),
    )
    .await;
    let resp = proxied_get(&d, "/api/sandboxes/held/proxy/slow?chunks=40&ms=100").await;
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    let started = Instant::now();
    let (s, v) = d
        .json("POST", "/api/sandboxes/quiesce?timeout_seconds=1", None)
        .await;
    assert_eq!(s, 504, "{v}");
    assert!(started.elapsed() < Duration::from_secs(3));
    while body.frame().await.is_some() {}
}

#[tokio::test]
async fn large_transfers_stream_without_buffering() {
    let (d, _) = daemon_with_upstream(&[]).await;
    d.json("POST", "/api/sandboxes", Some(create_body("big", "t", "u")))
        .await;
    // Warm up the proxy path, then take the baseline.
    let (s, _) = d.json("GET", "/api/sandboxes/big/proxy/echo", None).await;
    assert_eq!(s, 200);
    let pid = d.pid();
    let base = common::proc_status_kib(pid, "VmRSS");
    const TOTAL: u64 = 200 * 1024 * 1024;

    // Upload 200 MiB as a stream (no content-length: chunked).
    let chunks = futures_util::stream::unfold(0u64, |i| async move {
        (i < TOTAL / (64 * 1024)).then(|| {
            (
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(hyper::body::Frame::data(
                    upstream::pattern_chunk(i, 64 * 1024),
                )),
                i + 1,
            )
        })
    });
    let req = http::Request::builder()
        .method("PUT")
        .uri(d.url("/api/sandboxes/big/proxy/upload"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(http_body_util::StreamBody::new(chunks).boxed())
        .unwrap();
    let resp = d.client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["bytes"], TOTAL);

    // Download 200 MiB, consumed as it arrives.
    let resp = proxied_get(
        &d,
        &format!("/api/sandboxes/big/proxy/download?bytes={TOTAL}"),
    )
    .await;
    assert_eq!(resp.headers()["content-length"], TOTAL.to_string().as_str());
    let mut body = resp.into_body();
    let mut got = 0u64;
    while let Some(f) = body.frame().await {
        if let Ok(data) = f.unwrap().into_data() {
            got += data.len() as u64;
        }
    }
    assert_eq!(got, TOTAL);
    let peak = common::proc_status_kib(pid, "VmHWM");
    let growth_mib = peak.saturating_sub(base) as f64 / 1024.0;
    eprintln!("daemon RSS baseline {base} KiB, peak {peak} KiB, growth {growth_mib:.1} MiB");
    assert!(growth_mib < 32.0, "daemon RSS grew {growth_mib:.1} MiB");
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish() {
    let (mut d, _) = daemon_with_upstream(&[]).await;
    d.json(
        "POST",
        "/api/sandboxes",
        Some(create_body("inflight", "t", "u")),
    )
    .await;
    let resp = proxied_get(&d, "/api/sandboxes/inflight/proxy/slow?chunks=8&ms=100").await;
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut n = 1;
    while let Some(f) = body.frame().await {
        f.expect("stream cut by the shutdown");
        n += 1;
    }
    assert_eq!(n, 8, "the in-flight response did not complete");
    let status = d.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    // New connections are refused once the daemon stopped accepting.
    assert!(std::net::TcpStream::connect(d.addr).is_err());
}

#[tokio::test]
async fn upstream_connections_are_kept_alive() {
    let (d, _) = daemon_with_upstream(&[]).await;
    d.json("POST", "/api/sandboxes", Some(create_body("ka", "t", "u")))
        .await;
    let mut peers = std::collections::HashSet::new();
    for _ in 0..5 {
        let (s, v) = d.json("GET", "/api/sandboxes/ka/proxy/echo", None).await;
        assert_eq!(s, 200);
        peers.insert(v["peer"].as_str().unwrap().to_string());
    }
    assert_eq!(
        peers.len(),
        1,
        "sequential requests used new upstream connections: {peers:?}"
    );
    // A new incarnation never reuses a connection made for the old one.
    d.json("DELETE", "/api/sandboxes/ka", None).await;
    d.json("POST", "/api/sandboxes", Some(create_body("ka", "t", "u")))
        .await;
    let (_, v) = d.json("GET", "/api/sandboxes/ka/proxy/echo", None).await;
    assert!(!peers.contains(v["peer"].as_str().unwrap()));
}

/// One request per client connection (`Connection: close`): the upstream
/// connection is still kept (parked when its client connection closes and
/// taken by the next), and never given to a new incarnation.
#[tokio::test]
async fn upstream_connections_outlive_client_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // One connection worker: a parked connection serves only the worker
    // that made it, and which worker the next client connection lands on
    // depends on when the last one's end was counted.
    let (d, _) = daemon_with_upstream(&[
        ("RUST_LOG", common::BARRIER_LOG),
        ("SANDBOXD_WORKER_THREADS", "1"),
    ])
    .await;
    let once = |addr: std::net::SocketAddr| async move {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "GET /api/sandboxes/kc/proxy/echo HTTP/1.1\r\nhost: x\r\n\
             authorization: Bearer {TOKEN}\r\nconnection: close\r\n\r\n"
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out))
            .await
            .expect("no answer within 10 s")
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        let body = &text[text.find("\r\n\r\n").expect("a head") + 4..];
        let v: serde_json::Value = serde_json::from_str(body).expect("the echo's JSON");
        v["peer"].as_str().unwrap().to_string()
    };
    d.json("POST", "/api/sandboxes", Some(create_body("kc", "t", "u")))
        .await;
    let mut peers = std::collections::HashSet::new();
    for i in 1..=4 {
        peers.insert(once(d.addr).await);
        // The closed connection's task parks its upstream connection as it
        // ends, just after the client saw the end of the response.
        assert!(
            d.until_log(common::PARKED, i, Duration::from_secs(10))
                .await,
            "client connection {i} parked no upstream connection"
        );
    }
    assert_eq!(
        peers.len(),
        1,
        "each client connection made a new upstream connection: {peers:?}"
    );
    d.json("DELETE", "/api/sandboxes/kc", None).await;
    d.json("POST", "/api/sandboxes", Some(create_body("kc", "t", "u")))
        .await;
    let p = once(d.addr).await;
    assert!(
        !peers.contains(&p),
        "a new incarnation got an old connection"
    );
}

/// Hardening: connections that never authenticate are capped (the oldest is
/// closed to make room, so the platform's own new connection always gets
/// in), and a `401` closes its connection.
#[tokio::test]
async fn unauthenticated_connections_are_capped_and_a_401_closes() {
    use std::io::{Read, Write};
    let d = Daemon::start_memory(&[]);
    let addr = d.addr;
    let idle: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    // The platform's request still gets through, on a new connection.
    let (s, _) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(s, 200);
    // The oldest idle connections were closed by the daemon.
    let mut closed = 0;
    for mut c in idle.into_iter().take(40) {
        c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 1];
        if matches!(c.read(&mut b), Ok(0)) {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 40,
        "the oldest unauthenticated connections stayed open"
    );
    // A 401 answers `Connection: close` and the daemon closes the socket.
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    c.write_all(b"GET /api/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text)
        .expect("the daemon closes after a 401");
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
}
