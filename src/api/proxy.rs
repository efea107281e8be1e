//! The streaming reverse proxy: `ANY /api/sandboxes/{id}/proxy[/{path}]`.
//!
//! Request and response bodies are streamed both ways (hyper frames pass
//! through, nothing is buffered whole). Upstream connections come from the
//! backend through [`SandboxConnector`] and are kept alive in a pool keyed by
//! sandbox *incarnation*, so a new generation never reuses a connection to
//! an old one. The proxy pin travels with the response body: a delete of the
//! sandbox waits until the body has been sent, or until its grace runs out
//! and it cancels the request (the response then ends with an error).
//!
//! Timeouts, so a sandbox cannot hold a request (and so a delete, the
//! reaper, quiesce or shutdown) forever: the response head must arrive
//! within the head timeout once the request body is sent (504 otherwise),
//! and a response body that pauses longer than the idle-body timeout is
//! cut. Activity is marked when a request is admitted and again when its
//! response ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::error::ApiError;
use super::RespBody;
use crate::backend::BackendError;
use crate::lifecycle::{Lifecycle, ProxyPin};

/// Request headers never forwarded (hop-by-hop, the caller's credentials,
/// the agent credential (set by the proxy alone), and those hyper
/// recomputes).
const DROP_REQUEST: [&str; 11] = [
    sandbox_abi::credential::HEADER,
    "authorization",
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// Response headers never copied back (hop-by-hop), whatever the
/// allow-list says.
const DROP_RESPONSE: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// How the proxy treats responses (from `[proxy]` in the configuration).
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// The only response headers copied back from a sandbox, besides
    /// `content-length` (framing).
    pub response_headers: Vec<HeaderName>,
    /// Longest wait for the response head once the request body is sent.
    pub head_timeout: Duration,
    /// Longest pause between two frames of a response body.
    pub body_idle_timeout: Duration,
}

impl ProxySettings {
    pub fn from_config(cfg: &crate::config::Config) -> Result<Self, crate::config::ConfigError> {
        Ok(ProxySettings {
            response_headers: cfg.proxy.response_header_names()?,
            head_timeout: Duration::from_secs(cfg.proxy_head_timeout_seconds()),
            body_idle_timeout: Duration::from_secs(cfg.proxy.body_idle_timeout_seconds),
        })
    }
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self::from_config(&crate::config::Config::default()).expect("valid default")
    }
}

/// Keeps only the allowed response headers (and `content-length`): a
/// sandbox must not set `Set-Cookie`, `Location` or anything else on a
/// response the platform receives.
fn allowed_response_headers(headers: &mut HeaderMap, allowed: &[HeaderName]) {
    filter_headers(headers, &DROP_RESPONSE);
    let mut kept = HeaderMap::with_capacity(allowed.len() + 1);
    for name in allowed
        .iter()
        .chain(std::iter::once(&header::CONTENT_LENGTH))
    {
        for v in headers.get_all(name) {
            kept.append(name.clone(), v.clone());
        }
    }
    *headers = kept;
}

/// Opens upstream connections for the pool. The URI authority names the
/// incarnation: `<hex(sandbox_id)>.<generation>.sandbox` (hex because pool
/// keys compare hosts case-insensitively while ids are case-sensitive).
#[derive(Clone)]
pub struct SandboxConnector {
    lifecycle: Arc<Lifecycle>,
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if s.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The pool authority of one incarnation.
fn authority(id: &str, generation: &str) -> String {
    format!("{}.{}.sandbox", hex(id), generation)
}

fn parse_authority(host: &str) -> Option<(String, String)> {
    let mut parts = host.split('.');
    let id = unhex(parts.next()?)?;
    let generation = parts.next()?.to_string();
    (parts.next()? == "sandbox").then_some((id, generation))
}

impl tower_service::Service<Uri> for SandboxConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BackendError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let lc = self.lifecycle.clone();
        Box::pin(async move {
            let (id, generation) = uri
                .host()
                .and_then(parse_authority)
                .ok_or_else(|| BackendError::Internal(format!("bad upstream key {uri}")))?;
            let up = lc.connect(&id, &generation).await?;
            Ok(TokioIo::new(up.stream))
        })
    }
}

pub type ProxyClient = Client<SandboxConnector, UpstreamBody>;

pub fn client(lifecycle: Arc<Lifecycle>) -> ProxyClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(32)
        .set_host(false)
        .build(SandboxConnector { lifecycle })
}

/// The request body sent to a sandbox: the client's, plus a signal when
/// hyper is done with it (sent, failed or dropped): the head timeout runs
/// from then, so a slow upload is not cut by it.
pub struct UpstreamBody {
    inner: Incoming,
    sent: Option<tokio::sync::oneshot::Sender<()>>,
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            // Dropping the sender wakes the receiver.
            self.sent.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why a proxied response body ended early (the status line is out by
/// then: the client sees an aborted response).
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("sandbox {0}: response cut: the sandbox is being deleted")]
    Cancelled(String),
    #[error("sandbox {id}: response cut: no data for {secs} s")]
    Idle { id: String, secs: u64 },
    #[error(transparent)]
    Upstream(#[from] hyper::Error),
}

/// A response body that keeps the sandbox pinned until it is finished (or
/// dropped because the client went away), ends with an error when a
/// delete cancels it or when it stalls, and marks activity when it ends.
struct PinnedBody {
    inner: Incoming,
    /// Taken when the response is over.
    pin: Option<ProxyPin>,
    lifecycle: Arc<Lifecycle>,
    cancelled: Pin<Box<dyn Future<Output = ()> + Send>>,
    idle: Duration,
    idle_timer: Pin<Box<tokio::time::Sleep>>,
}

impl PinnedBody {
    fn new(inner: Incoming, pin: ProxyPin, lifecycle: Arc<Lifecycle>, idle: Duration) -> Self {
        PinnedBody {
            inner,
            cancelled: Box::pin(pin.cancellation()),
            pin: Some(pin),
            lifecycle,
            idle,
            idle_timer: Box::pin(tokio::time::sleep(idle)),
        }
    }

    fn id(&self) -> String {
        self.pin
            .as_ref()
            .map(|p| p.record.sandbox_id.clone())
            .unwrap_or_default()
    }

    /// The response is over (ended, failed, cut or dropped): marks activity
    /// unless a delete cancelled it, and releases the pin.
    fn finish(&mut self) {
        if let Some(pin) = self.pin.take() {
            if !pin.is_cancelled() {
                let r = &pin.record;
                self.lifecycle
                    .touch_generation(&r.sandbox_id, &r.generation);
            }
        }
    }
}

impl HttpBody for PinnedBody {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        let this = &mut *self;
        if this.pin.is_none() {
            return Poll::Ready(None);
        }
        if this.cancelled.as_mut().poll(cx).is_ready() {
            let id = this.id();
            this.finish();
            return Poll::Ready(Some(Err(StreamError::Cancelled(id))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + this.idle;
                this.idle_timer.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.idle_timer.as_mut().poll(cx).is_ready() {
                    let id = this.id();
                    this.finish();
                    return Poll::Ready(Some(Err(StreamError::Idle {
                        id,
                        secs: this.idle.as_secs(),
                    })));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pin.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PinnedBody {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Names listed in a `Connection` header are hop-by-hop too.
fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

fn filter_headers(headers: &mut HeaderMap, drop: &[&str]) {
    for name in connection_listed(headers) {
        headers.remove(name);
    }
    for name in drop {
        headers.remove(*name);
    }
}

/// Proxies `req` to sandbox `id` at `/{rest}?{query}`.
pub async fn forward(
    lifecycle: &Arc<Lifecycle>,
    client: &ProxyClient,
    settings: &ProxySettings,
    id: &str,
    rest: &str,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, ApiError> {
    let pin = lifecycle.pin(id).await?;
    let record = &pin.record;
    tracing::Span::current().record("generation", record.generation.as_str());
    let prefix = lifecycle.backend().path_prefix(record);
    let mut path_and_query = format!("{prefix}/{rest}");
    if let Some(q) = req.uri().query() {
        path_and_query.push('?');
        path_and_query.push_str(q);
    }
    let uri: Uri = format!(
        "http://{}{}",
        authority(&record.sandbox_id, &record.generation),
        path_and_query
    )
    .parse()
    .map_err(|e| ApiError::BadRequest(format!("cannot proxy to this path: {e}")))?;

    let (mut parts, body) = req.into_parts();
    filter_headers(&mut parts.headers, &DROP_REQUEST);
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some(n) = body.size_hint().exact() {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    parts
        .headers
        .insert(header::HOST, HeaderValue::from_static("localhost"));
    // The incarnation's agent credential, for backends that have one.
    if let Some(c) = lifecycle
        .backend()
        .agent_credential(record)
        .await
        .map_err(crate::lifecycle::LifecycleError::from)?
    {
        let mut v = HeaderValue::from_str(&c.0).map_err(|_| {
            ApiError::BadGateway(format!("sandbox {id}: unusable agent credential"))
        })?;
        v.set_sensitive(true);
        parts.headers.insert(sandbox_abi::credential::HEADER, v);
    }
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
    let body = UpstreamBody {
        inner: body,
        sent: Some(sent_tx),
    };
    let upstream_req = Request::from_parts(parts, body);

    let started = Instant::now();
    let head_timeout = settings.head_timeout;
    let head_deadline = async move {
        // Resolves (with an error) when the request body is dropped.
        let _ = sent_rx.await;
        tokio::time::sleep(head_timeout).await;
    };
    let resp = tokio::select! {
        r = client.request(upstream_req) => r.map_err(|e| {
            let mut msg = e.to_string();
            let mut src: Option<&dyn std::error::Error> = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            ApiError::BadGateway(format!("sandbox {id} unreachable: {msg}"))
        })?,
        _ = head_deadline => {
            return Err(ApiError::GatewayTimeout(format!(
                "sandbox {id} did not answer within {} s",
                head_timeout.as_secs()
            )));
        }
        _ = pin.cancellation() => {
            return Err(ApiError::BadGateway(format!(
                "sandbox {id} unreachable: deleted while the request was in flight"
            )));
        }
    };
    lifecycle
        .metrics()
        .proxy_seconds
        .observe(started.elapsed().as_secs_f64());

    let (mut parts, body) = resp.into_parts();
    allowed_response_headers(&mut parts.headers, &settings.response_headers);
    let body = PinnedBody::new(body, pin, lifecycle.clone(), settings.body_idle_timeout)
        .map_err(|e| Box::new(e) as super::BoxError)
        .boxed_unsync();
    Ok(Response::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_round_trip() {
        let a = authority("AbC_-9", "00ff");
        assert_eq!(a, "4162435f2d39.00ff.sandbox");
        assert_eq!(
            parse_authority(&a),
            Some(("AbC_-9".to_string(), "00ff".to_string()))
        );
        assert_eq!(parse_authority("zz.x.sandbox"), None);
        assert_eq!(parse_authority("41.x.other"), None);
    }

    #[test]
    fn hop_by_hop_dropped() {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer x".parse().unwrap());
        h.insert("connection", "close, x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("content-type", "text/plain".parse().unwrap());
        h.insert(sandbox_abi::credential::HEADER, "forged".parse().unwrap());
        filter_headers(&mut h, &DROP_REQUEST);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("content-type"));
    }

    #[test]
    fn only_allowed_response_headers_are_kept() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "text/plain"),
            ("content-length", "3"),
            ("etag", "\"1\""),
            ("set-cookie", "a=1"),
            ("location", "http://x/"),
            ("x-custom", "1"),
            ("connection", "keep-alive"),
        ] {
            h.append(k, v.parse().unwrap());
        }
        h.append("set-cookie", "b=2".parse().unwrap());
        allowed_response_headers(&mut h, &ProxySettings::default().response_headers);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["content-length", "content-type", "etag"]);
        // Hop-by-hop headers go even when listed.
        let mut h = HeaderMap::new();
        h.insert("connection", "close".parse().unwrap());
        h.insert("x-a", "1".parse().unwrap());
        allowed_response_headers(
            &mut h,
            &["connection".parse().unwrap(), "x-a".parse().unwrap()],
        );
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-a"));
    }
}
