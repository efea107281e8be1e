//! A small real HTTP upstream for proxy tests (stands in for a sandbox's
//! server behind the memory backend).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};

use super::Body;

fn query(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

/// Deterministic content for downloads.
pub fn pattern_chunk(i: u64, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|j| ((i as usize * 31 + j) % 251) as u8)
            .collect::<Vec<u8>>(),
    )
}

async fn handle(req: Request<Incoming>, peer: SocketAddr) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let resp = if path.ends_with("/echo") || path == "/echo" {
        let headers: serde_json::Map<String, serde_json::Value> = req
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    serde_json::Value::String(v.to_str().unwrap_or("").to_string()),
                )
            })
            .collect();
        let v = serde_json::json!({
            "method": req.method().as_str(),
            "path": path,
            "query": req.uri().query(),
            "headers": headers,
            "peer": peer.to_string(),
        });
        Response::builder()
            .header("content-type", "application/json")
            .header("etag", "\"v1\"")
            .header("cache-control", "no-store")
            .header("content-disposition", "inline")
            .header("last-modified", "Sun, 29 Nov 2026 00:00:00 GMT")
            .header("x-custom", "from-the-sandbox")
            .header("set-cookie", "session=planted; Path=/")
            .header("location", "http://evil.example/")
            .header("keep-alive", "timeout=5")
            .body(super::full(serde_json::to_vec(&v).unwrap()))
            .unwrap()
    } else if path.ends_with("/slow") {
        let chunks = query(&req, "chunks").unwrap_or(10);
        let ms = query(&req, "ms").unwrap_or(100);
        let stream = futures_util::stream::unfold(0u64, move |i| async move {
            if i >= chunks {
                return None;
            }
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            Some((
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(Bytes::from(
                    format!("chunk{i}\n"),
                ))),
                i + 1,
            ))
        });
        Response::builder()
            .header("content-type", "text/plain")
            .body(StreamBody::new(stream).boxed())
            .unwrap()
    } else if path.ends_with("/hang") {
        // Never answers (a sandbox that accepted the request and stalls).
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Response::new(super::full(""))
    } else if path.ends_with("/upload") {
        let mut body = req.into_body();
        let mut n = 0u64;
        let mut h = Sha256::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                n += data.len() as u64;
                h.update(&data);
            }
        }
        let v = serde_json::json!({"bytes": n, "sha256": super::hex(&h.finalize())});
        Response::builder()
            .header("content-type", "application/json")
            .body(super::full(serde_json::to_vec(&v).unwrap()))
            .unwrap()
    } else if path.ends_with("/download") {
        let total = query(&req, "bytes").unwrap_or(1024);
        const CH: u64 = 64 * 1024;
        let stream = futures_util::stream::unfold(0u64, move |i| async move {
            let sent = i * CH;
            if sent >= total {
                return None;
            }
            let len = CH.min(total - sent) as usize;
            Some((
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(pattern_chunk(
                    i, len,
                ))),
                i + 1,
            ))
        });
        Response::builder()
            .header("content-type", "application/octet-stream")
            .header("content-length", total.to_string())
            .body(StreamBody::new(stream).boxed())
            .unwrap()
    } else {
        Response::builder()
            .status(404)
            .body(super::full("no such upstream path"))
            .unwrap()
    };
    Ok(resp)
}

/// Starts the upstream on an ephemeral loopback port.
pub async fn start() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, peer)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(s), service_fn(move |r| handle(r, peer)))
                    .await;
            });
        }
    });
    addr
}
