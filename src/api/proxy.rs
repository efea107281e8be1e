//! The streaming reverse proxy: `ANY /api/sandboxes/{id}/proxy[/{path}]`.
//!
//! Request and response bodies are streamed both ways (hyper frames pass
//! through, nothing is buffered whole). Upstream connections come from the
//! backend ([`Lifecycle::connect`]) and are kept alive per client connection
//! and sandbox *incarnation*, driven by the client connection's own task
//! (see [`super::upstream`]), so a new generation never reuses a connection
//! to an old one. The proxy pin travels with the response body: a delete of the
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::upstream::{self, lock, ConnUpstreams, UpstreamError};
use super::RespBody;
use crate::backend::SandboxRef;
use crate::config::{Config, ConfigError};
use crate::lifecycle::{Lifecycle, ProxyPin};

/// The header names the proxy tells apart, as [`known`] classifies them:
/// which it never forwards, never copies back, or frames itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    Authorization,
    ContentLength,
    TransferEncoding,
    Connection,
    Upgrade,
    Expect,
    Host,
    Date,
    /// `keep-alive`, `proxy-connection`, `te`, `trailer`: hop-by-hop both
    /// ways.
    HopByHop,
    ProxyAuthorization,
    ProxyAuthenticate,
    /// The agent credential's header (set by the proxy alone).
    Credential,
    Other,
}

/// Classifies a header name (ASCII case-insensitive) in one pass, instead
/// of comparing each name against each list. Only names of a known length
/// are compared at all.
pub(super) fn known(name: &str) -> Known {
    let b = name.as_bytes();
    let is = |n: &str| b.eq_ignore_ascii_case(n.as_bytes());
    match b.len() {
        2 if is("te") => Known::HopByHop,
        4 if is("host") => Known::Host,
        4 if is("date") => Known::Date,
        6 if is("expect") => Known::Expect,
        7 if is("upgrade") => Known::Upgrade,
        7 if is("trailer") => Known::HopByHop,
        10 if is("connection") => Known::Connection,
        10 if is("keep-alive") => Known::HopByHop,
        13 if is("authorization") => Known::Authorization,
        14 if is("content-length") => Known::ContentLength,
        16 if is("proxy-connection") => Known::HopByHop,
        17 if is("transfer-encoding") => Known::TransferEncoding,
        18 if is("proxy-authenticate") => Known::ProxyAuthenticate,
        19 if is("proxy-authorization") => Known::ProxyAuthorization,
        n if n == sandbox_abi::credential::HEADER.len() && is(sandbox_abi::credential::HEADER) => {
            Known::Credential
        }
        _ => Known::Other,
    }
}

impl Known {
    /// Never forwarded to a sandbox: hop-by-hop, the caller's credentials,
    /// the agent credential (set by the proxy alone), and those the proxy
    /// sets itself.
    pub(super) fn dropped_from_requests(self) -> bool {
        matches!(
            self,
            Known::Credential
                | Known::Authorization
                | Known::Connection
                | Known::HopByHop
                | Known::ProxyAuthorization
                | Known::TransferEncoding
                | Known::Upgrade
                | Known::Host
        )
    }

    /// Never copied back from a sandbox (hop-by-hop), whatever the
    /// allow-list says.
    pub(super) fn dropped_from_responses(self) -> bool {
        matches!(
            self,
            Known::Connection
                | Known::HopByHop
                | Known::ProxyAuthenticate
                | Known::TransferEncoding
                | Known::Upgrade
        )
    }
}

/// The response headers a sandbox may set on what the platform receives
/// (the replaced provisioner's allow-list); `content-length` is always
/// kept (framing) and hop-by-hop headers are always dropped.
pub const DEFAULT_PROXY_RESPONSE_HEADERS: [&str; 5] = [
    "content-type",
    "content-disposition",
    "cache-control",
    "etag",
    "last-modified",
];

/// Settings of the streaming proxy (`[proxy]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Response headers copied back from a sandbox (case-insensitive);
    /// every other one is dropped.
    pub response_headers: Vec<String>,
    /// Longest wait for a sandbox's response head once the request body
    /// is sent (default: the exec timeout + 30 s, so it never cuts an exec
    /// the agent answers in time).
    pub head_timeout_seconds: Option<u64>,
    /// Longest pause between two parts of a response body coming from a
    /// sandbox.
    pub body_idle_timeout_seconds: u64,
    /// No effect: it chose between the hand-written relay and hyper, and
    /// hyper now serves every proxied request (issue #31). Still accepted
    /// so configurations that set it load.
    pub relay: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            response_headers: DEFAULT_PROXY_RESPONSE_HEADERS
                .iter()
                .map(|h| h.to_string())
                .collect(),
            head_timeout_seconds: None,
            body_idle_timeout_seconds: 60,
            relay: true,
        }
    }
}

impl ProxyConfig {
    /// The allowed response headers as header names (lower-cased).
    pub fn response_header_names(&self) -> Result<Vec<HeaderName>, ConfigError> {
        self.response_headers
            .iter()
            .map(|h| {
                HeaderName::from_bytes(h.trim().to_ascii_lowercase().as_bytes()).map_err(|_| {
                    ConfigError::Invalid(format!(
                        "proxy.response_headers: {h:?} is not a header name"
                    ))
                })
            })
            .collect()
    }

    /// The response-head timeout: `head_timeout_seconds`, by default the
    /// exec timeout + 30 s (the agent answers an exec by the exec timeout
    /// minus its margin, so a legitimate exec is never cut).
    pub fn effective_head_timeout_seconds(&self, exec_timeout_seconds: u64) -> u64 {
        self.head_timeout_seconds
            .unwrap_or(exec_timeout_seconds + 30)
    }

    /// Checks the header names and that neither timeout is 0.
    pub fn validate(&self, exec_timeout_seconds: u64) -> Result<(), ConfigError> {
        self.response_header_names()?;
        if self.effective_head_timeout_seconds(exec_timeout_seconds) == 0
            || self.body_idle_timeout_seconds == 0
        {
            return Err(ConfigError::Invalid(
                "proxy.head_timeout_seconds and proxy.body_idle_timeout_seconds must be at least 1"
                    .into(),
            ));
        }
        Ok(())
    }
}

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
    /// The connection workers ([`super::workers`]): as many as the daemon
    /// has tokio workers.
    pub workers: usize,
}

impl ProxySettings {
    pub fn from_config(cfg: &Config) -> Result<Self, ConfigError> {
        Ok(ProxySettings {
            response_headers: cfg.proxy.response_header_names()?,
            head_timeout: Duration::from_secs(
                cfg.proxy
                    .effective_head_timeout_seconds(cfg.exec_timeout_seconds),
            ),
            body_idle_timeout: Duration::from_secs(cfg.proxy.body_idle_timeout_seconds),
            workers: cfg
                .worker_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        })
    }
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self::from_config(&Config::default()).expect("valid default")
    }
}

/// Keeps only the allowed response headers (and `content-length`): a
/// sandbox must not set `Set-Cookie`, `Location` or anything else on a
/// response the platform receives.
fn allowed_response_headers(headers: &mut HeaderMap, allowed: &[HeaderName]) {
    filter_headers(headers, |name| {
        !Known::dropped_from_responses(known(name.as_str()))
            && (name == header::CONTENT_LENGTH || allowed.contains(name))
    });
}

/// The request body sent to a sandbox: the client's, plus a signal when
/// hyper is done with it (sent, failed or dropped): the head timeout runs
/// from then, so a slow upload is not cut by it.
pub struct UpstreamBody {
    inner: Incoming,
    sent: Option<tokio::sync::oneshot::Sender<()>>,
    /// Set when the client's body failed (malformed chunked framing, a
    /// connection cut mid-body): the request failed through the client's
    /// fault, not the sandbox's.
    failed: Arc<AtomicBool>,
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            // Dropping the sender wakes the receiver.
            Poll::Ready(None) => drop(self.sent.take()),
            Poll::Ready(Some(Err(_))) => self.failed.store(true, Ordering::Relaxed),
            _ => {}
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
    /// The frame that came with the head, passed on first.
    first: Option<Frame<Bytes>>,
    /// Taken when the response is over.
    pin: Option<ProxyPin>,
    cancelled: Pin<Box<dyn Future<Output = ()> + Send>>,
    idle: Duration,
    /// When the body is cut unless a frame comes; made the first time the
    /// body has to wait (a small response is there at once and needs no
    /// timer).
    idle_deadline: tokio::time::Instant,
    idle_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl PinnedBody {
    fn new(inner: Incoming, first: Option<Frame<Bytes>>, pin: ProxyPin, idle: Duration) -> Self {
        PinnedBody {
            inner,
            first,
            cancelled: Box::pin(pin.cancellation()),
            pin: Some(pin),
            idle,
            idle_deadline: tokio::time::Instant::now() + idle,
            idle_timer: None,
        }
    }

    fn id(&self) -> String {
        self.pin
            .as_ref()
            .map(|p| p.sandbox.sandbox_id.clone())
            .unwrap_or_default()
    }

    /// The response is over (ended, failed, cut or dropped): marks activity
    /// unless a delete cancelled it, and releases the pin.
    fn finish(&mut self) {
        if let Some(pin) = self.pin.take() {
            if !pin.is_cancelled() {
                pin.touch();
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
        if let Some(f) = this.first.take() {
            return Poll::Ready(Some(Ok(f)));
        }
        if this.cancelled.as_mut().poll(cx).is_ready() {
            let id = this.id();
            this.finish();
            return Poll::Ready(Some(Err(StreamError::Cancelled(id))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.idle_deadline = tokio::time::Instant::now() + this.idle;
                if let Some(t) = this.idle_timer.as_mut() {
                    t.as_mut().reset(this.idle_deadline);
                }
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
                let deadline = this.idle_deadline;
                let timer = this
                    .idle_timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.as_mut().poll(cx).is_ready() {
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
        self.pin.is_none() || (self.first.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let Some(n) = self
            .first
            .as_ref()
            .and_then(|f| f.data_ref())
            .map(|d| d.len() as u64)
        else {
            return inner;
        };
        // The frame taken out first counts too.
        let mut hint = SizeHint::new();
        if let Some(u) = inner.upper() {
            hint.set_upper(u + n);
        }
        hint.set_lower(inner.lower() + n);
        hint
    }
}

impl Drop for PinnedBody {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Keeps the headers `keep` accepts, except those named in `Connection`
/// (hop-by-hop too). The names to drop are gathered a few at a time on the
/// stack in one scan, then removed (no allocation unless `Connection`
/// names some).
fn filter_headers(headers: &mut HeaderMap, keep: impl Fn(&HeaderName) -> bool) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    loop {
        let mut doomed: [Option<HeaderName>; 8] = Default::default();
        let mut n = 0;
        for name in headers.keys() {
            if !keep(name) || listed.contains(name) {
                doomed[n] = Some(name.clone());
                n += 1;
                if n == doomed.len() {
                    break;
                }
            }
        }
        for name in doomed.into_iter().flatten() {
            headers.remove(name);
        }
        if n < 8 {
            return;
        }
    }
}

/// Whether a request header goes on to the sandbox.
fn forwarded_request_header(name: &HeaderName) -> bool {
    !Known::dropped_from_requests(known(name.as_str()))
}

/// What every request forwarded to one incarnation carries: the backend's
/// path prefix and the agent credential (both fixed for an incarnation;
/// read once per incarnation and client connection).
pub struct Incarnation {
    /// The incarnation it was read for (the same `Arc` while the
    /// connection's pin cache holds it).
    sandbox: Arc<SandboxRef>,
    prefix: String,
    credential: Option<HeaderValue>,
}

impl Incarnation {
    async fn of(lc: &Lifecycle, sandbox: &Arc<SandboxRef>) -> Result<Self, ApiError> {
        let credential = match lc
            .backend()
            .agent_credential(sandbox)
            .await
            .map_err(crate::lifecycle::LifecycleError::from)?
        {
            Some(c) => {
                let mut v = HeaderValue::from_str(&c.0).map_err(|_| {
                    ApiError::BadGateway(format!(
                        "sandbox {}: unusable agent credential",
                        sandbox.sandbox_id
                    ))
                })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        Ok(Incarnation {
            sandbox: sandbox.clone(),
            prefix: lc.backend().path_prefix(sandbox),
            credential,
        })
    }
}

/// Whether a request asks to switch protocols: an `Upgrade` header that
/// its `Connection` header names (RFC 9110 §7.8).
fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
}

/// Response headers of a `101` passed back besides the allowed ones: what
/// the client needs to finish the switch (a WebSocket handshake's).
const UPGRADE_RESPONSE_HEADERS: [&str; 4] = [
    "upgrade",
    "sec-websocket-accept",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
];

/// Admits a proxied request for `id` with the client connection's pin
/// cache.
async fn admit(lc: &Lifecycle, conn: &ConnUpstreams, id: &str) -> Result<ProxyPin, ApiError> {
    let mut cache = lock(&conn.pins).take();
    let pinned = lc.pin_cached(id, &mut cache).await;
    *lock(&conn.pins) = cache;
    Ok(pinned?)
}

/// The first frame of a response body when it is there at once (it came
/// with the head): `None` when the body has to be waited for.
///
/// The upstream connection decodes what it read with the head when it is
/// polled again, so this looks up to twice more, each time after one more
/// round of the connection's task ([`upstream::Driven`]: waking it while
/// it polls only makes it go round once more; `yield_now` would go through
/// the scheduler and its I/O driver instead).
async fn ready_frame(body: &mut Incoming) -> Option<Option<Result<Frame<Bytes>, hyper::Error>>> {
    let mut rounds = 2;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(f) = Pin::new(&mut *body).poll_frame(cx) {
            return Poll::Ready(Some(f));
        }
        if rounds == 0 {
            return Poll::Ready(None);
        }
        rounds -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Proxies `req` to sandbox `id` at `/{rest}?{query}`, on an upstream
/// connection of the client connection's `conn`.
pub async fn forward(
    lifecycle: &Arc<Lifecycle>,
    conn: &ConnUpstreams,
    settings: &ProxySettings,
    id: &str,
    rest: &str,
    mut req: Request<Incoming>,
) -> Result<Response<RespBody>, ApiError> {
    lifecycle.metrics().proxy_requests.inc();
    let pin = admit(lifecycle, conn, id).await?;
    let sandbox = &pin.sandbox;
    tracing::Span::current().record("generation", sandbox.generation.as_str());
    let cached = lock(&conn.incarnation)
        .clone()
        .filter(|i| Arc::ptr_eq(&i.sandbox, sandbox));
    let inc = match cached {
        Some(i) => i,
        None => {
            let i = Arc::new(Incarnation::of(lifecycle, sandbox).await?);
            *lock(&conn.incarnation) = Some(i.clone());
            i
        }
    };
    let query = req.uri().query();
    let mut path_and_query =
        String::with_capacity(inc.prefix.len() + 1 + rest.len() + query.map_or(0, |q| q.len() + 1));
    path_and_query.push_str(&inc.prefix);
    path_and_query.push('/');
    path_and_query.push_str(rest);
    if let Some(q) = query {
        path_and_query.push('?');
        path_and_query.push_str(q);
    }
    // Origin-form: the connection already is the sandbox's.
    let uri = Uri::try_from(path_and_query)
        .map_err(|e| ApiError::BadRequest(format!("cannot proxy to this path: {e}")))?;

    // An upgrade (a WebSocket, say) is forwarded as one: the sandbox sees
    // `Upgrade` and `Connection: upgrade`, and after its `101` both
    // connections are joined.
    let upgrade = wants_upgrade(req.headers()).then(|| {
        let protocol = req.headers().get(header::UPGRADE).cloned();
        (hyper::upgrade::on(&mut req), protocol)
    });
    let (mut parts, body) = req.into_parts();
    filter_headers(&mut parts.headers, forwarded_request_header);
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some(n) = body.size_hint().exact() {
        let n = match n {
            0 => HeaderValue::from_static("0"),
            n => HeaderValue::from(n),
        };
        parts.headers.insert(header::CONTENT_LENGTH, n);
    }
    if let Some((_, Some(protocol))) = &upgrade {
        parts.headers.insert(header::UPGRADE, protocol.clone());
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    parts
        .headers
        .insert(header::HOST, HeaderValue::from_static("localhost"));
    // The incarnation's agent credential, for backends that have one.
    if let Some(c) = &inc.credential {
        parts
            .headers
            .insert(sandbox_abi::credential::HEADER, c.clone());
    }
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
    let client_failed = Arc::new(AtomicBool::new(false));
    let body = UpstreamBody {
        inner: body,
        sent: Some(sent_tx),
        failed: client_failed.clone(),
    };
    let upstream_req = Request::from_parts(parts, body);

    let started = pin.admitted();
    let head_timeout = settings.head_timeout;
    let head_deadline = async move {
        // Resolves (with an error) when the request body is dropped.
        let _ = sent_rx.await;
        tokio::time::sleep(head_timeout).await;
    };
    let send = async {
        if upgrade.is_some() {
            upstream::send_upgrade(
                lifecycle,
                &sandbox.sandbox_id,
                &sandbox.generation,
                upstream_req,
            )
            .await
        } else {
            conn.send(
                lifecycle,
                &sandbox.sandbox_id,
                &sandbox.generation,
                upstream_req,
            )
            .await
        }
    };
    let resp = tokio::select! {
        biased;
        r = send => r.map_err(|e| {
            let msg = match e {
                UpstreamError::Connect(e) => e.to_string(),
                UpstreamError::Http(m) => m,
            };
            // The client's body broke (a malformed chunk, say): its fault.
            if client_failed.load(Ordering::Relaxed) {
                ApiError::BadRequest(format!("cannot read the request body: {msg}"))
            } else {
                ApiError::BadGateway(format!("sandbox {id} unreachable: {msg}"))
            }
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

    if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        let Some((client, _)) = upgrade else {
            // The forwarded request asked for no upgrade: a `101` would
            // switch the client's connection to a protocol nobody agreed
            // on.
            return Err(ApiError::BadGateway(format!(
                "sandbox {id} unreachable: an upgrade nobody asked for"
            )));
        };
        return Ok(tunnel(resp, client, pin, &settings.response_headers));
    }
    let (mut parts, mut body) = resp.into_parts();
    // A body that breaks in what came with the head is a 502 before the
    // head, not a cut response.
    let first = match ready_frame(&mut body).await {
        Some(Some(Err(e))) => {
            return Err(ApiError::BadGateway(format!(
                "sandbox {id} unreachable: broken response body: {}",
                upstream::describe(&e)
            )))
        }
        Some(Some(Ok(f))) => Some(f),
        Some(None) | None => None,
    };
    allowed_response_headers(&mut parts.headers, &settings.response_headers);
    let body = PinnedBody::new(body, first, pin, settings.body_idle_timeout)
        .map_err(|e| Box::new(e) as super::BoxError)
        .boxed_unsync();
    Ok(Response::from_parts(parts, body))
}

/// The client's answer to a sandbox's `101` to an upgrade request: the
/// switch, with the allowed headers and those the switch needs; both
/// connections are then joined, in a task that holds the pin: a delete
/// waits for it like for any request, and cancels it when its grace runs
/// out.
fn tunnel(
    mut resp: Response<Incoming>,
    client: hyper::upgrade::OnUpgrade,
    pin: ProxyPin,
    allowed: &[HeaderName],
) -> Response<RespBody> {
    let sandbox = hyper::upgrade::on(&mut resp);
    let upgrade_headers: Vec<(HeaderName, HeaderValue)> = resp
        .headers()
        .iter()
        .filter(|(n, _)| UPGRADE_RESPONSE_HEADERS.contains(&n.as_str()))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    let (mut parts, _) = resp.into_parts();
    allowed_response_headers(&mut parts.headers, allowed);
    parts.headers.remove(header::CONTENT_LENGTH);
    for (n, v) in upgrade_headers {
        parts.headers.append(n, v);
    }
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    let id = pin.sandbox.sandbox_id.clone();
    tokio::spawn(async move {
        let cancelled = pin.cancellation();
        let joined = async {
            let (client, sandbox) = match tokio::try_join!(client, sandbox) {
                Ok(both) => both,
                Err(e) => {
                    tracing::debug!(sandbox_id = %id, error = %e, "upgrade not completed");
                    return;
                }
            };
            join(TokioIo::new(client), TokioIo::new(sandbox)).await;
        };
        tokio::select! {
            () = joined => {}
            () = cancelled => {
                tracing::debug!(sandbox_id = %id, "upgraded connection cut: the sandbox is being deleted");
            }
        }
        if !pin.is_cancelled() {
            pin.touch();
        }
    });
    Response::from_parts(parts, super::routes::full(Bytes::new()))
}

/// Copies both ways between two upgraded connections until either side
/// closes (or fails); then both are closed.
async fn join<A, B>(a: A, b: B)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    tokio::select! {
        _ = tokio::io::copy(&mut ar, &mut bw) => {
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut bw).await;
        }
        _ = tokio::io::copy(&mut br, &mut aw) => {
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut aw).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{load_toml, test_env};

    #[test]
    fn hop_by_hop_dropped() {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer x".parse().unwrap());
        h.insert("connection", "close, x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("content-type", "text/plain".parse().unwrap());
        h.insert(sandbox_abi::credential::HEADER, "forged".parse().unwrap());
        filter_headers(&mut h, forwarded_request_header);
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

    /// Headers never forwarded to a sandbox, and never copied back.
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

    /// The classifier drops exactly these lists, whatever the case of the
    /// name.
    #[test]
    fn the_classifier_drops_exactly_the_listed_headers() {
        let listed = |list: &[&str], n: &str| list.contains(&n);
        let mut names: Vec<String> = DROP_REQUEST
            .iter()
            .chain(&DROP_RESPONSE)
            .map(|h| h.to_string())
            .collect();
        names.extend(
            [
                "content-length",
                "content-type",
                "expect",
                "date",
                "etag",
                "x-sandbox-agent-credentials",
                "x-sandbox-agent-credentia",
                "tee",
                "t",
                "",
                "a-very-long-header-name-longer-than-any-known-one",
            ]
            .map(String::from),
        );
        for n in &names {
            for form in [n.clone(), n.to_ascii_uppercase(), capitalized(n)] {
                let k = known(&form);
                assert_eq!(
                    k.dropped_from_requests(),
                    listed(&DROP_REQUEST, n),
                    "{form}"
                );
                assert_eq!(
                    k.dropped_from_responses(),
                    listed(&DROP_RESPONSE, n),
                    "{form}"
                );
            }
        }
        assert_eq!(known("Content-Length"), Known::ContentLength);
        assert_eq!(known("TRANSFER-ENCODING"), Known::TransferEncoding);
        assert_eq!(known("Expect"), Known::Expect);
        assert_eq!(known("dAtE"), Known::Date);
        assert_eq!(known("Content-Type"), Known::Other);
    }

    fn capitalized(n: &str) -> String {
        n.split('-')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("-")
    }

    #[test]
    fn proxy_response_headers_default_file_and_env() {
        let c = Config::default();
        let names: Vec<String> = c
            .proxy
            .response_header_names()
            .unwrap()
            .iter()
            .map(|h| h.to_string())
            .collect();
        assert_eq!(names, DEFAULT_PROXY_RESPONSE_HEADERS);
        let toml = "[proxy]\nresponse_headers = [\"Content-Type\", \"X-Trace\"]\n";
        let c = load_toml(toml, &[]).unwrap();
        let names = c.proxy.response_header_names().unwrap();
        assert_eq!(names, ["content-type", "x-trace"]);
        let c = load_toml(toml, &[("SANDBOXD_PROXY_RESPONSE_HEADERS", " etag ,, x-a")]).unwrap();
        assert_eq!(c.proxy.response_headers, ["etag", "x-a"]);
        let c = Config::load(
            None,
            &test_env(&[("SANDBOXD_PROXY_RESPONSE_HEADERS", "bad header")]),
        )
        .unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("bad header"));
    }

    #[test]
    fn proxy_timeouts_default_file_and_env() {
        let c = Config::default();
        assert_eq!(
            c.proxy
                .effective_head_timeout_seconds(c.exec_timeout_seconds),
            210
        );
        assert_eq!(c.proxy.body_idle_timeout_seconds, 60);
        assert!(c.proxy.relay);
        let c = Config::load(None, &test_env(&[("SANDBOXD_PROXY_RELAY", "false")])).unwrap();
        assert!(!c.proxy.relay);
        assert!(Config::load(None, &test_env(&[("SANDBOXD_PROXY_RELAY", "sometimes")])).is_err());
        let c = Config::load(None, &test_env(&[("SANDBOX_EXEC_TIMEOUT_SECONDS", "600")])).unwrap();
        assert_eq!(
            c.proxy
                .effective_head_timeout_seconds(c.exec_timeout_seconds),
            630
        );
        let toml = "[proxy]\nhead_timeout_seconds = 100\nbody_idle_timeout_seconds = 20\n";
        let c = load_toml(toml, &[]).unwrap();
        assert_eq!(
            c.proxy
                .effective_head_timeout_seconds(c.exec_timeout_seconds),
            100
        );
        assert_eq!(c.proxy.body_idle_timeout_seconds, 20);
        let c = load_toml(
            toml,
            &[
                ("SANDBOXD_PROXY_HEAD_TIMEOUT_SECONDS", "7"),
                ("SANDBOXD_PROXY_BODY_IDLE_TIMEOUT_SECONDS", "8"),
            ],
        )
        .unwrap();
        assert_eq!(
            c.proxy
                .effective_head_timeout_seconds(c.exec_timeout_seconds),
            7
        );
        assert_eq!(c.proxy.body_idle_timeout_seconds, 8);
        c.validate().unwrap();
        for name in [
            "SANDBOXD_PROXY_HEAD_TIMEOUT_SECONDS",
            "SANDBOXD_PROXY_BODY_IDLE_TIMEOUT_SECONDS",
        ] {
            let c = Config::load(None, &test_env(&[(name, "0")])).unwrap();
            assert!(c.validate().is_err(), "{name}=0");
        }
    }
}
