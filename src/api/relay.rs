//! The proxy's fast path: a small HTTP/1.1 relay in front of hyper for the
//! common proxied request.
//!
//! Every client connection starts here. The relay reads a request head
//! and serves it itself only when it is a plain authenticated proxy
//! request: HTTP/1.1, `ANY /api/sandboxes/{id}/proxy[/{path}]` with one of
//! the proxy's methods, a valid id and the right token, a body framed by
//! `Content-Length` alone and at most [`MAX_BODY`] bytes, and no
//! `Transfer-Encoding`, `Upgrade` or `Expect`. At the first request that is
//! anything else (another route, a wrong or missing token, a chunked or
//! large upload, HTTP/1.0, a head the strict parser refuses, a head over
//! [`MAX_HEAD`]) it stops, before consuming a byte of that request, and
//! hyper serves the connection from there on, from the bytes already read
//! ([`Prefixed`]). So the relay never has to be lenient: what it does not
//! understand exactly, hyper answers (and refuses, where hyper refuses).
//!
//! A served request is forwarded as the hyper path forwards it (see
//! [`super::proxy`]): origin-form target under the backend's path prefix,
//! `Host: localhost`, hop-by-hop headers and the caller's credentials
//! dropped, the incarnation's agent credential added, `Content-Length`
//! always set. The response head is parsed strictly; its body framing
//! follows RFC 9112 §6.3 (no body for `HEAD`, 1xx, 204 and 304; chunked
//! when `Transfer-Encoding` ends in `chunked`; else `Content-Length`,
//! whose repeated values must agree; else until the sandbox closes) and a
//! response the relay cannot frame is a 502, never passed on. A chunked or
//! close-delimited body reaches the client re-chunked (chunk extensions
//! and trailers dropped), so the client connection's framing is always the
//! relay's own. Only the allowed response headers are copied back.
//!
//! The rest is the proxy's usual contract: the sandbox is pinned while the
//! request runs (a delete waits for the response, or cancels it when its
//! grace runs out), the head must come within the head timeout, a body
//! that pauses longer than the idle timeout is cut, activity is marked on
//! admission and when the response ends, and errors before the response
//! head are the API's JSON errors. Upstream connections are raw streams,
//! one per incarnation kept by the client connection and parked for the
//! next one when it closes, like hyper's ([`super::upstream`]).
//!
//! Why: hyper's server and client state machines around each proxied
//! request cost about twice the CPU of nginx's `proxy_pass` on the same
//! machine (`docs/performance.md`); this path reads, parses and writes
//! each side once, in one task, with buffers reused across requests.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Sleep;
use tracing::debug;

use super::error::ApiError;
use super::proxy::{known, Known};
use super::routes::{self, Route, PROXY_METHODS};
use super::upstream::{self, Reusable, Upstream, UpstreamPool};
use super::workers::Assigned;
use super::{AppState, RespBody};
use crate::lifecycle::{LifecycleError, PinCache, ProxyPin};
use crate::model::SandboxRecord;

/// Longest request head the relay reads; a longer one goes to hyper.
pub const MAX_HEAD: usize = 64 * 1024;
/// Largest request body the relay forwards (read whole first); a larger
/// one goes to hyper, which streams it.
pub const MAX_BODY: usize = 64 * 1024;
/// Longest response head accepted from a sandbox.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Most headers in a request the relay serves (more: hyper's turn).
const MAX_HEADERS: usize = 64;
/// Most headers in a response from a sandbox (more: 502), as hyper's
/// client allows.
const MAX_RESPONSE_HEADERS: usize = 100;
/// Longest line of a chunked body (size and extensions, or a trailer).
const MAX_CHUNK_LINE: usize = 4096;
/// Room made in a buffer before each read.
const READ_CHUNK: usize = 16 * 1024;
/// How long a connection may take to send a request head (and a served
/// request's body), and sit idle between requests; hyper's
/// `header_read_timeout` is the same.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Idle raw upstream connections of closed client connections.
pub type RawPool = UpstreamPool<TcpStream>;

/// How the relay left a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Closed: by the client, a timeout, an aborted response, shutdown,
    /// or `Connection: close`.
    Closed,
    /// A request the relay does not serve starts the buffer: hyper serves
    /// the connection from here.
    Handoff,
}

/// A request the relay serves (its sandbox id and target are in
/// [`Relay::id`] and [`Relay::target`]).
struct Head {
    method: Method,
    content_length: usize,
    /// The client asked to close the connection after this request.
    close: bool,
}

enum Parsed {
    Serve(Head, usize),
    Handoff,
    Partial,
}

/// How a response body is framed by the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// What became of a request the relay took.
enum Outcome {
    /// The response was sent whole.
    Done,
    /// The response was cut after its head was sent: the connection must
    /// close so the client sees it cut.
    Aborted,
}

/// The relay side of one client connection.
pub struct Relay {
    state: Arc<AppState>,
    conn_id: u64,
    /// The connection worker serving it (its upstream connections are
    /// registered with that worker's driver and parked in its pool).
    worker: Assigned,
    authenticated: bool,
    /// Idle upstream connections this client connection keeps.
    ups: Vec<Upstream<TcpStream>>,
    /// The forwarded headers of the request being served.
    hdrs: Vec<u8>,
    /// The sandbox id of the request being served.
    id: String,
    /// Its path after `/proxy/`, with `?query` when there is one.
    target: String,
    /// What is written next (upstream request, then client response).
    out: Vec<u8>,
    /// Bytes read from the upstream connection.
    ubuf: BytesMut,
    /// The deadline of the request being read (head and body).
    read_deadline: Deadline,
    /// The deadline of the response head of the request being served
    /// (taken out while it runs).
    head_deadline: Option<Deadline>,
    /// The `Date` header's value, made once a second.
    date: (u64, String),
    /// What admits the next request to the sandbox of the last one
    /// without a lock shared by all requests.
    pins: Option<PinCache>,
    /// What the forwarded requests of the last request's incarnation
    /// carry (read once per incarnation).
    incarnation: Option<Incarnation>,
}

/// What every request forwarded to one incarnation carries: the backend's
/// path prefix and the agent credential (both fixed for an incarnation).
struct Incarnation {
    /// The record it was read for (the same `Arc` while the connection's
    /// pin cache holds that incarnation).
    record: Arc<SandboxRecord>,
    prefix: String,
    credential: Option<String>,
}

impl Incarnation {
    async fn of(
        lc: &crate::lifecycle::Lifecycle,
        record: &Arc<SandboxRecord>,
    ) -> Result<Self, ApiError> {
        let credential = lc
            .backend()
            .agent_credential(record)
            .await
            .map_err(LifecycleError::from)?;
        if let Some(c) = &credential {
            if http::HeaderValue::from_str(&c.0).is_err() {
                return Err(ApiError::BadGateway(format!(
                    "sandbox {}: unusable agent credential",
                    record.sandbox_id
                )));
            }
        }
        Ok(Incarnation {
            record: record.clone(),
            prefix: lc.backend().path_prefix(record),
            credential: credential.map(|c| c.0),
        })
    }
}

/// A deadline that moves later at no cost: its timer stays armed at the
/// earlier instant and, when that comes, re-arms itself for the latest
/// deadline set (resetting a timer for every request costs a trip through
/// the runtime's timer wheel).
struct Deadline {
    sleep: Pin<Box<Sleep>>,
    armed: tokio::time::Instant,
    at: tokio::time::Instant,
}

impl Deadline {
    fn new(at: tokio::time::Instant) -> Self {
        Deadline {
            sleep: Box::pin(tokio::time::sleep_until(at)),
            armed: at,
            at,
        }
    }

    fn set(&mut self, at: tokio::time::Instant) {
        self.at = at;
        if at < self.armed {
            self.sleep.as_mut().reset(at);
            self.armed = at;
        }
    }

    /// Resolves when the deadline last set has passed.
    async fn passed(&mut self) {
        loop {
            (&mut self.sleep).await;
            if self.at <= self.armed {
                return;
            }
            self.armed = self.at;
            self.sleep.as_mut().reset(self.at);
        }
    }
}

fn eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// The comma-separated tokens of a header value, trimmed.
fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',')
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// Whether `b` may appear in a request target the relay forwards: the
/// characters RFC 3986 allows in a path and a query (`pchar`, `/`, `?`,
/// and `%` of percent-encoding). A target with anything else (a fragment,
/// a space, quotes, braces, non-ASCII) is left to hyper's URI parser.
fn plain_target_byte(b: u8) -> bool {
    PLAIN_TARGET[b as usize]
}

/// [`plain_target_byte`] as a table (it runs on every byte of every
/// relayed target).
static PLAIN_TARGET: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let extra = b"-._~!$&'()*+,;=:@/?%";
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    t
};

/// Whether a `Connection` header among `headers` names `name`.
fn listed_in_connection(headers: &[httparse::Header<'_>], name: &str) -> bool {
    headers
        .iter()
        .filter(|h| eq(h.name, "connection"))
        .flat_map(|h| tokens(h.value))
        .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
}

/// Most names of `Connection` headers gathered (more: each header is
/// looked up in them instead).
const MAX_LISTED: usize = 8;

/// The names a message's `Connection` headers list: hop-by-hop by the
/// sender's word, never passed on. Gathered once per message, so each
/// header is checked against a few names, not against every header.
struct ConnectionListed<'h> {
    names: [&'h [u8]; MAX_LISTED],
    len: usize,
    more: bool,
}

impl<'h> ConnectionListed<'h> {
    fn new() -> Self {
        ConnectionListed {
            names: [&[]; MAX_LISTED],
            len: 0,
            more: false,
        }
    }

    /// Takes in the value of one `Connection` header.
    fn add(&mut self, value: &'h [u8]) {
        for t in tokens(value) {
            if self.len == MAX_LISTED {
                self.more = true;
                return;
            }
            self.names[self.len] = t;
            self.len += 1;
        }
    }

    /// Whether the message's `Connection` headers (among `headers`) list
    /// `name`.
    fn lists(&self, headers: &[httparse::Header<'_>], name: &str) -> bool {
        if self.more {
            return listed_in_connection(headers, name);
        }
        self.names[..self.len]
            .iter()
            .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
    }
}

/// A decimal `Content-Length` (a list of equal values is one value).
fn content_length(v: &[u8]) -> Option<u64> {
    // The usual value: digits alone.
    if !v.is_empty() && v.len() <= 19 && v.iter().all(u8::is_ascii_digit) {
        return Some(v.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')));
    }
    let mut n = None;
    for t in tokens(v) {
        if t.is_empty() || t.len() > 19 || !t.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let v: u64 = std::str::from_utf8(t).ok()?.parse().ok()?;
        if n.is_some_and(|n| n != v) {
            return None;
        }
        n = Some(v);
    }
    n
}

fn push_length(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `name: value` with the name in lower case (as hyper writes
/// names).
fn push_header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    let at = out.len();
    out.extend_from_slice(name.as_bytes());
    out[at..].make_ascii_lowercase();
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Starts a response: status line and `Date` (as hyper's server sends it,
/// made at most once a second).
fn push_status(out: &mut Vec<u8>, date: &mut (u64, String), status: StatusCode, reason: &str) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or(reason).as_bytes());
    out.extend_from_slice(b"\r\n");
    // The coarse clock (no time-stamp counter read): a `Date` has whole
    // seconds, and the coarse clock is at most a tick behind.
    let secs = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE)
        .map_or(0, |t| t.tv_sec().max(0) as u64);
    if date.0 != secs || date.1.is_empty() {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(secs);
        *date = (secs, httpdate::fmt_http_date(at));
    }
    push_header(out, "date", date.1.as_bytes());
}

/// Reads more into `buf`; `Ok(0)` at end of stream.
async fn read_more<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> io::Result<usize> {
    buf.reserve(READ_CHUNK);
    r.read_buf(buf).await
}

/// Reads more of a request into `buf` before `deadline`; `false` when the
/// connection is over: closed, timed out, or `stop` came first.
async fn read_request<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    deadline: &mut Deadline,
    stop: impl Future<Output = ()>,
) -> bool {
    tokio::select! {
        biased;
        r = read_more(io, buf) => matches!(r, Ok(n) if n > 0),
        () = deadline.passed() => false,
        () = stop => false,
    }
}

/// What the client's response head says of the response the relay
/// passes on.
struct ResponseHead {
    status: StatusCode,
    framing: Framing,
    /// The sandbox's connection may serve another request afterwards.
    keep_alive: bool,
}

/// Writes the client's response head for a sandbox's (`resp`) into `out`
/// (after what it holds): its status, `Date`, the allowed headers and the
/// relay's own framing.
fn client_head(
    out: &mut Vec<u8>,
    date: &mut (u64, String),
    allowed: &[http::HeaderName],
    resp: &httparse::Response<'_, '_>,
    head_request: bool,
) -> Result<ResponseHead, &'static str> {
    let status = resp
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or("invalid status")?;
    let headers = &*resp.headers;
    let mut roles = [Known::Other; MAX_RESPONSE_HEADERS];
    let mut chunked = None;
    let mut length = None;
    let mut keep_alive = resp.version == Some(1);
    let mut listed = ConnectionListed::new();
    for (h, role) in headers.iter().zip(roles.iter_mut()) {
        *role = known(h.name);
        match *role {
            Known::TransferEncoding => {
                // The last coding listed decides.
                if let Some(last) = tokens(h.value).last() {
                    chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
                }
            }
            Known::ContentLength => match content_length(h.value) {
                Some(v) if length.is_none_or(|l| l == v) => length = Some(v),
                _ => return Err("invalid content-length"),
            },
            Known::Connection => {
                listed.add(h.value);
                for t in tokens(h.value) {
                    if t.eq_ignore_ascii_case(b"close") {
                        keep_alive = false;
                    } else if t.eq_ignore_ascii_case(b"keep-alive") && resp.version == Some(0) {
                        keep_alive = true;
                    }
                }
            }
            _ => {}
        }
    }
    let framing = if head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::None
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::UntilClose,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::UntilClose,
        }
    };
    if framing == Framing::UntilClose {
        keep_alive = false;
    }
    out.clear();
    push_status(out, date, status, resp.reason.unwrap_or(""));
    let mut length_written = false;
    for (h, role) in headers.iter().zip(&roles) {
        if role.dropped_from_responses() || listed.lists(headers, h.name) {
            continue;
        }
        match role {
            Known::ContentLength => {
                // Framing: kept when it frames the body (or describes the
                // body a HEAD or 304 would have), once.
                if matches!(framing, Framing::Chunked | Framing::UntilClose) || length_written {
                    continue;
                }
                length_written = true;
                if let Some(n) = length {
                    push_length(out, n);
                }
            }
            // `Date` is the daemon's (written with the status line).
            Known::Date => {}
            _ => {
                if allowed.iter().any(|a| eq(a.as_str(), h.name)) {
                    push_header(out, h.name, h.value);
                }
            }
        }
    }
    if matches!(framing, Framing::Chunked | Framing::UntilClose) {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(ResponseHead {
        status,
        framing,
        keep_alive,
    })
}

impl Relay {
    pub fn new(state: Arc<AppState>, conn_id: u64, worker: Assigned) -> Self {
        Relay {
            state,
            conn_id,
            worker,
            authenticated: false,
            ups: Vec::new(),
            hdrs: Vec::with_capacity(1024),
            id: String::new(),
            target: String::new(),
            out: Vec::with_capacity(4096),
            ubuf: BytesMut::with_capacity(READ_CHUNK),
            read_deadline: Deadline::new(tokio::time::Instant::now() + HEADER_READ_TIMEOUT),
            head_deadline: None,
            date: (0, String::new()),
            pins: None,
            incarnation: None,
        }
    }

    /// Whether the connection made an authenticated request.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Serves the requests of a connection until it closes or a request
    /// the relay does not serve comes (left at the start of `buf`).
    pub async fn serve<S>(
        &mut self,
        io: &mut S,
        buf: &mut BytesMut,
        shutdown: &mut watch::Receiver<bool>,
    ) -> End
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        if *shutdown.borrow_and_update() && buf.is_empty() {
            return End::Closed;
        }
        // One wait for the shutdown signal for the whole connection (a
        // new one per request would take a lock shared by connections).
        let signalled = shutdown.changed();
        tokio::pin!(signalled);
        // When the last response ended (the idle time counts from there).
        let mut ended = tokio::time::Instant::now();
        loop {
            self.read_deadline.set(ended + HEADER_READ_TIMEOUT);
            let (head, n) = loop {
                if !buf.is_empty() {
                    match self.parse(buf) {
                        Parsed::Serve(h, n) => break (h, n),
                        Parsed::Handoff => return End::Handoff,
                        Parsed::Partial => {}
                    }
                }
                // Between requests, a shutdown closes the connection.
                let idle = buf.is_empty();
                let stop = async {
                    if idle {
                        let _ = signalled.as_mut().await;
                    } else {
                        std::future::pending::<()>().await;
                    }
                };
                if !read_request(io, buf, &mut self.read_deadline, stop).await {
                    return End::Closed;
                }
            };
            if !self.authenticated {
                self.authenticated = true;
                self.state.unauth.forget(self.conn_id);
            }
            buf.advance(n);
            while buf.len() < head.content_length {
                let stop = std::future::pending();
                if !read_request(io, buf, &mut self.read_deadline, stop).await {
                    return End::Closed;
                }
            }
            let body = match head.content_length {
                0 => Bytes::new(),
                n => buf.split_to(n).freeze(),
            };
            let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
            // Out of `self` while the request runs (given back after it:
            // their buffers serve the next request).
            let (id, target) = (
                std::mem::take(&mut self.id),
                std::mem::take(&mut self.target),
            );
            let status = match self.exchange(io, buf, &head, &id, &target, &body).await {
                Ok((status, Outcome::Done, at)) => {
                    ended = at;
                    status
                }
                Ok((_, Outcome::Aborted, _)) => return End::Closed,
                Err(e) => {
                    let status = e.status();
                    let path = || format!("/api/sandboxes/{id}/proxy/{target}");
                    let resp = routes::failure(&self.state, &head.method, &path(), &e);
                    match self.write_full(io, resp, head.method == Method::HEAD).await {
                        Ok(false) => {
                            ended = tokio::time::Instant::now();
                            status
                        }
                        _ => return End::Closed,
                    }
                }
            };
            if let Some(started) = started {
                debug!(method = %head.method, path = %format!("/api/sandboxes/{id}/proxy/{target}"),
                       status = status.as_u16(), elapsed_us = started.elapsed().as_micros() as u64,
                       "request");
            }
            (self.id, self.target) = (id, target);
            if head.close {
                let _ = io.shutdown().await;
                return End::Closed;
            }
        }
    }

    /// Parses the request head at the start of `buf` and decides whether
    /// the relay serves it; fills `self.hdrs` with the headers to forward.
    fn parse(&mut self, buf: &[u8]) -> Parsed {
        let mut headers = [std::mem::MaybeUninit::uninit(); MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let n = match req.parse_with_uninit_headers(buf, &mut headers) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Parsed::Partial,
            _ => return Parsed::Handoff,
        };
        if req.version != Some(1) {
            return Parsed::Handoff;
        }
        let (Some(method), Some(target)) = (req.method, req.path) else {
            return Parsed::Handoff;
        };
        let Some(method) = PROXY_METHODS.iter().find(|m| m.as_str() == method) else {
            return Parsed::Handoff;
        };
        if !target.starts_with('/') || !target.bytes().all(plain_target_byte) {
            return Parsed::Handoff;
        }
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        };
        let Some(Route::Proxy(id, rest)) = Route::parse(path) else {
            return Parsed::Handoff;
        };
        if routes::valid_id(id).is_err() {
            return Parsed::Handoff;
        }
        let headers = &*req.headers;
        // Each name classified once; what is forwarded decided from that.
        let mut roles = [Known::Other; MAX_HEADERS];
        let mut auth = None;
        let mut length: Option<u64> = None;
        let mut close = false;
        let mut listed = ConnectionListed::new();
        for (h, role) in headers.iter().zip(roles.iter_mut()) {
            *role = known(h.name);
            match *role {
                Known::Authorization => {
                    auth.get_or_insert(h.value);
                }
                Known::ContentLength => match content_length(h.value) {
                    Some(v) if length.is_none_or(|l| l == v) => length = Some(v),
                    _ => return Parsed::Handoff,
                },
                Known::TransferEncoding | Known::Upgrade | Known::Expect => return Parsed::Handoff,
                Known::Connection => {
                    listed.add(h.value);
                    close |= tokens(h.value).any(|t| t.eq_ignore_ascii_case(b"close"));
                }
                _ => {}
            }
        }
        let length = length.unwrap_or(0);
        if length > MAX_BODY as u64 || !self.state.token.check(auth) {
            return Parsed::Handoff;
        }
        self.hdrs.clear();
        for (h, role) in headers.iter().zip(&roles) {
            if *role == Known::ContentLength
                || role.dropped_from_requests()
                || listed.lists(headers, h.name)
            {
                continue;
            }
            push_header(&mut self.hdrs, h.name, h.value);
        }
        self.id.clear();
        self.id.push_str(id);
        self.target.clear();
        self.target.push_str(rest);
        if let Some(q) = query {
            self.target.push('?');
            self.target.push_str(q);
        }
        Parsed::Serve(
            Head {
                method: method.clone(),
                content_length: length as usize,
                close,
            },
            n,
        )
    }

    /// A ready connection to the incarnation: kept, parked or new (and
    /// whether it is new).
    async fn checkout(
        &mut self,
        id: &str,
        generation: &str,
    ) -> Result<(Upstream<TcpStream>, bool), crate::backend::BackendError> {
        if let Some(i) = self.ups.iter().position(|u| u.is(id, generation)) {
            let u = self.ups.swap_remove(i);
            if u.conn.reusable() {
                return Ok((u, false));
            }
        }
        // The pool hands out reusable connections only.
        if let Some(u) = self.worker.take_parked(id, generation) {
            return Ok((u, false));
        }
        let stream = self.state.lifecycle.connect(id, generation).await?.stream;
        let _ = stream.set_nodelay(true);
        Ok((Upstream::new(id, generation, stream), true))
    }

    /// Sends the request (in `self.out`) to the incarnation, reads the
    /// response head into `self.ubuf` (consumed from it) and writes the
    /// client's head into `self.out`; a kept connection the request could
    /// not be written to is replaced once by a new one.
    async fn send(
        &mut self,
        id: &str,
        generation: &str,
        head_request: bool,
    ) -> Result<(Upstream<TcpStream>, ResponseHead), ApiError> {
        let unreachable =
            |msg: String| ApiError::BadGateway(format!("sandbox {id} unreachable: {msg}"));
        let mut retried = false;
        let mut up = loop {
            let (mut up, fresh) = self
                .checkout(id, generation)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            match up.conn.write_all(&self.out).await {
                Ok(()) => break up,
                Err(e) if fresh || retried => return Err(unreachable(e.to_string())),
                Err(_) => retried = true,
            }
        };
        self.ubuf.clear();
        loop {
            match read_more(&mut up.conn, &mut self.ubuf).await {
                Ok(0) => {
                    return Err(unreachable(
                        "connection closed before a response came".into(),
                    ))
                }
                Ok(_) => {}
                Err(e) => return Err(unreachable(e.to_string())),
            }
            // What has come: informational responses (not passed on), then
            // the response head, or a part of one.
            loop {
                let mut headers = [std::mem::MaybeUninit::uninit(); MAX_RESPONSE_HEADERS];
                let mut resp = httparse::Response::new(&mut []);
                match httparse::ParserConfig::default().parse_response_with_uninit_headers(
                    &mut resp,
                    &self.ubuf,
                    &mut headers,
                ) {
                    Ok(httparse::Status::Complete(n)) => match resp.code {
                        Some(101) => {
                            return Err(unreachable("an upgrade nobody asked for".into()));
                        }
                        Some(100..=199) => self.ubuf.advance(n),
                        _ => {
                            let head = client_head(
                                &mut self.out,
                                &mut self.date,
                                &self.state.proxy.response_headers,
                                &resp,
                                head_request,
                            )
                            .map_err(|msg| unreachable(msg.into()))?;
                            self.ubuf.advance(n);
                            return Ok((up, head));
                        }
                    },
                    Ok(httparse::Status::Partial) if self.ubuf.len() < MAX_RESPONSE_HEAD => break,
                    Ok(httparse::Status::Partial) => {
                        return Err(unreachable("response head too large".into()));
                    }
                    Err(e) => return Err(unreachable(format!("invalid response head: {e}"))),
                }
            }
        }
    }

    /// Forwards one request and its response. An error before the
    /// response head reached the client is returned (the caller answers
    /// it); after that a failure aborts the response.
    async fn exchange<S>(
        &mut self,
        io: &mut S,
        buf: &mut BytesMut,
        head: &Head,
        id: &str,
        target: &str,
        body: &Bytes,
    ) -> Result<(StatusCode, Outcome, tokio::time::Instant), ApiError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let lc = self.state.lifecycle.clone();
        lc.metrics().proxy_relayed.inc();
        let pin = lc.pin_cached(id, &mut self.pins).await?;
        let record = &pin.record;
        let id = record.sandbox_id.as_str();
        if !self
            .incarnation
            .as_ref()
            .is_some_and(|i| Arc::ptr_eq(&i.record, &pin.record))
        {
            self.incarnation = Some(Incarnation::of(&lc, &pin.record).await?);
        }
        let inc = self.incarnation.as_ref().expect("just made");

        let out = &mut self.out;
        out.clear();
        out.extend_from_slice(head.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(inc.prefix.as_bytes());
        out.push(b'/');
        out.extend_from_slice(target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\nhost: localhost\r\n");
        if let Some(c) = &inc.credential {
            push_header(out, sandbox_abi::credential::HEADER, c.as_bytes());
        }
        push_length(out, body.len() as u64);
        out.extend_from_slice(&self.hdrs);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);

        // The head timeout and the latency metric count from admission.
        let started = tokio::time::Instant::from_std(pin.admitted());
        let head_timeout = self.state.proxy.head_timeout;
        let mut deadline = match self.head_deadline.take() {
            Some(mut d) => {
                d.set(started + head_timeout);
                d
            }
            None => Deadline::new(started + head_timeout),
        };
        let cancelled = pin.cancellation();
        tokio::pin!(cancelled);
        // While the sandbox has not answered, the client is watched: a
        // client that goes away (or half-closes, as hyper's server takes
        // it) abandons the request, and the sandbox's connection is closed.
        // What it sends meanwhile (a pipelined request) is kept in `buf`,
        // up to a bound.
        let watch_limit = buf.len() + MAX_HEAD + MAX_BODY;
        let mut watching = true;
        // `None`: the client went away.
        let sent = {
            let send = self.send(id, &record.generation, head.method == Method::HEAD);
            tokio::pin!(send);
            loop {
                tokio::select! {
                    biased;
                    () = &mut cancelled => break Some(Err(ApiError::BadGateway(format!(
                        "sandbox {id} unreachable: deleted while the request was in flight"
                    )))),
                    r = &mut send => break Some(r),
                    () = deadline.passed() => break Some(Err(ApiError::GatewayTimeout(format!(
                        "sandbox {id} did not answer within {} s",
                        head_timeout.as_secs()
                    )))),
                    r = read_more(io, buf), if watching => match r {
                        Ok(0) | Err(_) => break None,
                        Ok(_) => watching = buf.len() < watch_limit,
                    },
                }
            }
        };
        self.head_deadline = Some(deadline);
        let Some(sent) = sent else {
            debug!(sandbox_id = %id, "the client went away before the response head");
            return Ok((
                StatusCode::BAD_GATEWAY,
                Outcome::Aborted,
                tokio::time::Instant::now(),
            ));
        };
        let (mut up, rh) = sent?;
        let head_at = tokio::time::Instant::now();
        lc.metrics()
            .proxy_seconds
            .observe((head_at - started).as_secs_f64());

        let done = self
            .relay_body(io, &mut up, rh.framing, &pin, cancelled)
            .await;
        // When the response ended: as the head came, when the whole of it
        // was written at once (the common small response; no clock read).
        let ended = match done {
            Ok(false) => head_at,
            _ => tokio::time::Instant::now(),
        };
        let outcome = match done {
            Ok(_) => {
                if rh.keep_alive && self.ubuf.is_empty() {
                    // Connections to sandboxes deleted meanwhile go now,
                    // not when this client connection closes.
                    self.ups.retain(|o| o.conn.reusable());
                    upstream::keep(&mut self.ups, up);
                }
                Outcome::Done
            }
            Err(e) => {
                debug!(sandbox_id = %id, error = %e, "proxied response cut");
                Outcome::Aborted
            }
        };
        // The response is over: activity, unless a delete cut it.
        if !pin.is_cancelled() {
            pin.touch_at(ended.into_std());
        }
        drop(pin);
        Ok((rh.status, outcome, ended))
    }

    /// Writes the response head (in `self.out`) and the body to the
    /// client. Stops at a delete, a pause longer than the idle timeout, or
    /// a sandbox that breaks the framing. `Ok(true)` when it had to wait
    /// (for the sandbox or the client) on the way.
    async fn relay_body<S, C>(
        &mut self,
        io: &mut S,
        up: &mut Upstream<TcpStream>,
        framing: Framing,
        pin: &ProxyPin,
        mut cancelled: Pin<&mut C>,
    ) -> Result<bool, String>
    where
        S: AsyncWrite + Unpin,
        C: Future<Output = ()>,
    {
        let id = &pin.record.sandbox_id;
        let idle = self.state.proxy.body_idle_timeout;
        let mut remaining = match framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        let mut chunks = Chunked::default();
        let mut eof = false;
        let mut waited = false;
        loop {
            // What has come so far goes into `out` (after the head, the
            // first time round).
            let finished = match framing {
                Framing::None => true,
                Framing::Length(_) => {
                    let take = remaining.min(self.ubuf.len() as u64) as usize;
                    self.out.extend_from_slice(&self.ubuf[..take]);
                    self.ubuf.advance(take);
                    remaining -= take as u64;
                    remaining == 0
                }
                Framing::Chunked => chunks
                    .decode(&mut self.ubuf, &mut self.out)
                    .map_err(|e| format!("sandbox {id}: {e}"))?,
                Framing::UntilClose => {
                    if !self.ubuf.is_empty() {
                        chunk(&mut self.out, &self.ubuf);
                        self.ubuf.clear();
                    }
                    if eof {
                        self.out.extend_from_slice(b"0\r\n\r\n");
                    }
                    eof
                }
            };
            if !self.out.is_empty() {
                let write = io.write_all(&self.out);
                tokio::pin!(write);
                let written = match futures_util::poll!(write.as_mut()) {
                    Poll::Ready(r) => r,
                    Poll::Pending => {
                        waited = true;
                        write.await
                    }
                };
                written.map_err(|e| format!("client: {e}"))?;
                self.out.clear();
            }
            if finished {
                return Ok(waited);
            }
            waited = true;
            if eof {
                return Err(format!("sandbox {id}: connection closed mid-body"));
            }
            tokio::select! {
                biased;
                () = &mut cancelled => {
                    return Err(format!("sandbox {id}: response cut: the sandbox is being deleted"));
                }
                r = read_more(&mut up.conn, &mut self.ubuf) => match r {
                    Ok(0) => eof = true,
                    Ok(_) => {}
                    Err(e) => return Err(format!("sandbox {id}: {e}")),
                },
                () = tokio::time::sleep(idle) => {
                    return Err(format!("sandbox {id}: response cut: no data for {} s", idle.as_secs()));
                }
            }
        }
    }

    /// Writes a whole response (an error of the API); `Ok(true)` when it
    /// asks for the connection to close.
    async fn write_full<S>(
        &mut self,
        io: &mut S,
        resp: Response<RespBody>,
        head_only: bool,
    ) -> io::Result<bool>
    where
        S: AsyncWrite + Unpin,
    {
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let out = &mut self.out;
        out.clear();
        push_status(out, &mut self.date, parts.status, "");
        let mut close = false;
        for (name, value) in &parts.headers {
            if name == http::header::CONTENT_LENGTH {
                continue;
            }
            if name == http::header::CONNECTION {
                close |= tokens(value.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"close"));
            }
            push_header(out, name.as_str(), value.as_bytes());
        }
        push_length(out, body.len() as u64);
        out.extend_from_slice(b"\r\n");
        if !head_only {
            out.extend_from_slice(&body);
        }
        io.write_all(out).await?;
        out.clear();
        Ok(close)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The kept connections are idle: the next client connection may
        // use them.
        self.worker.park(self.ups.drain(..));
    }
}

/// Appends `data` to `out` as one chunk.
fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    use std::io::Write;
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Where a chunked body's decoder is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    Trailers,
    Done,
}

/// Decodes a chunked body from a sandbox and re-chunks its data for the
/// client (extensions and trailers dropped).
#[derive(Debug, Default)]
struct Chunked {
    state: ChunkState,
}

impl Chunked {
    /// One line (without CRLF) at the start of `input`, if it is whole.
    fn line(input: &BytesMut) -> Result<Option<usize>, &'static str> {
        match input.iter().position(|&b| b == b'\n') {
            Some(i) if i > 0 && input[i - 1] == b'\r' && i <= MAX_CHUNK_LINE => Ok(Some(i)),
            Some(_) => Err("malformed chunked body: bad line"),
            None if input.len() > MAX_CHUNK_LINE => Err("malformed chunked body: line too long"),
            None => Ok(None),
        }
    }

    /// Consumes what `input` holds, appending the data to `out` as
    /// chunks; `Ok(true)` once the body is complete (its last chunk
    /// appended).
    fn decode(&mut self, input: &mut BytesMut, out: &mut Vec<u8>) -> Result<bool, &'static str> {
        loop {
            match self.state {
                ChunkState::Size => {
                    let Some(i) = Self::line(input)? else {
                        return Ok(false);
                    };
                    let line = &input[..i - 1];
                    let end = line
                        .iter()
                        .position(|b| !b.is_ascii_hexdigit())
                        .unwrap_or(line.len());
                    let (digits, ext) = line.split_at(end);
                    let ext = ext.trim_ascii_start();
                    if digits.is_empty() || digits.len() > 15 || !(ext.is_empty() || ext[0] == b';')
                    {
                        return Err("malformed chunked body: bad chunk size");
                    }
                    let size = u64::from_str_radix(
                        std::str::from_utf8(digits).map_err(|_| "malformed chunked body")?,
                        16,
                    )
                    .map_err(|_| "malformed chunked body: bad chunk size")?;
                    input.advance(i + 1);
                    self.state = if size == 0 {
                        ChunkState::Trailers
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(n) => {
                    if input.is_empty() {
                        return Ok(false);
                    }
                    let take = n.min(input.len() as u64) as usize;
                    chunk(out, &input[..take]);
                    input.advance(take);
                    self.state = if take as u64 == n {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(n - take as u64)
                    };
                }
                ChunkState::DataEnd => {
                    if input.len() < 2 {
                        return Ok(false);
                    }
                    if &input[..2] != b"\r\n" {
                        return Err("malformed chunked body: no CRLF after a chunk");
                    }
                    input.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    let Some(i) = Self::line(input)? else {
                        return Ok(false);
                    };
                    input.advance(i + 1);
                    if i == 1 {
                        out.extend_from_slice(b"0\r\n\r\n");
                        self.state = ChunkState::Done;
                        return Ok(true);
                    }
                }
                ChunkState::Done => return Ok(true),
            }
        }
    }
}

/// A connection's stream with the bytes the relay read ahead in front,
/// for hyper when it takes the connection over.
pub struct Prefixed<S> {
    pre: Bytes,
    io: S,
}

impl<S> Prefixed<S> {
    pub fn new(pre: Bytes, io: S) -> Self {
        Prefixed { pre, io }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(pieces: &[&[u8]]) -> Result<(bool, Vec<u8>), &'static str> {
        let mut d = Chunked::default();
        let mut input = BytesMut::new();
        let mut out = Vec::new();
        let mut done = false;
        for p in pieces {
            input.extend_from_slice(p);
            done = d.decode(&mut input, &mut out)?;
        }
        Ok((done, out))
    }

    /// The data of a chunked body as the relay writes it (no extensions,
    /// no trailers), checking its framing on the way.
    fn payload(mut framed: &[u8]) -> Vec<u8> {
        let mut data = Vec::new();
        loop {
            let eol = framed.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&framed[..eol]).unwrap(), 16).unwrap();
            framed = &framed[eol + 2..];
            if size == 0 {
                assert_eq!(framed, b"\r\n");
                return data;
            }
            assert!(size > 0);
            data.extend_from_slice(&framed[..size]);
            assert_eq!(&framed[size..size + 2], b"\r\n");
            framed = &framed[size + 2..];
        }
    }

    #[test]
    fn chunked_bodies_are_rechunked_across_any_split() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for split in 0..body.len() {
            let (a, b) = body.split_at(split);
            let (done, out) = decode_all(&[a, b]).unwrap();
            assert!(done, "split at {split}");
            // The re-chunked output carries the same data, well framed,
            // with the extension and the trailers gone.
            assert_eq!(payload(&out), b"hello world", "split at {split}");
            let text = String::from_utf8(out).unwrap();
            assert!(!text.contains("x-trailer") && !text.contains("ext"));
        }
    }

    #[test]
    fn malformed_chunked_bodies_are_refused() {
        for bad in [
            &b"zz\r\n"[..],
            b"5\r\nhelloXX",
            b"5\nhello\r\n",
            b" 5\r\nhello\r\n",
            b"ffffffffffffffffff\r\n",
            b"5 x\r\nhello\r\n",
        ] {
            assert!(
                decode_all(&[bad]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 2];
        assert!(decode_all(&[&long]).is_err());
        // Incomplete is not an error: more may come.
        assert!(!decode_all(&[b"5\r\nhel"]).unwrap().0);
    }

    #[test]
    fn the_target_table_is_rfc_3986_path_and_query() {
        for b in 0..=255u8 {
            let want = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b);
            assert_eq!(plain_target_byte(b), want, "byte {b}");
        }
    }

    #[test]
    fn only_plain_targets_are_relayed() {
        for ok in ["/a/b?c=d&e=%20f", "/x:y@z/~_-.!$'()*+,;="] {
            assert!(ok.bytes().all(plain_target_byte), "{ok}");
        }
        for bad in [
            "/a#b", "/a b", "/a\"b", "/{x}", "/a|b", "/a\\b", "/é", "/a^b", "/a`b", "/<a>",
        ] {
            assert!(!bad.bytes().all(plain_target_byte), "{bad}");
        }
    }

    #[test]
    fn content_length_values_must_agree() {
        assert_eq!(content_length(b"42"), Some(42));
        assert_eq!(content_length(b"42, 42"), Some(42));
        assert_eq!(content_length(b"42, 43"), None);
        assert_eq!(content_length(b"+42"), None);
        assert_eq!(content_length(b"-1"), None);
        assert_eq!(content_length(b""), None);
        assert_eq!(content_length(b"99999999999999999999"), None);
    }
}
