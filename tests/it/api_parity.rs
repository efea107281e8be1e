//! Behaviours the platform's client relies on since the Python provisioner
//! (the "[parity]" issue), end to end with the memory backend: the real
//! `sandboxd` binary, real HTTP, a real upstream standing in for sandboxes.
//! The native counterparts are in `native_parity.rs`.

use crate::common;

use bytes::Bytes;
use common::{create_body, full, upstream, Daemon, TOKEN};
use http_body_util::BodyExt;

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
