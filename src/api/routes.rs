//! Routing and the handlers of the provisioner contract
//! (`docs/api.md`). Each handler parses, calls the lifecycle layer and
//! shapes the JSON; errors become responses in `error.rs`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tracing::{debug, warn, Instrument};

use super::error::ApiError;
use super::openapi::{
    DeleteResponse, ErrorDetail, HealthResponse, QuiesceResponse, SandboxList, SandboxResponse,
    TouchResponse,
};
use super::upstream::ConnUpstreams;
use super::{proxy, AppState, RespBody};
use crate::lifecycle::LifecycleError;
use crate::model::{validate_sandbox_id, CreateRequest, SandboxRecord};

/// Largest accepted JSON request body.
pub const MAX_JSON_BODY: usize = 1024 * 1024;

pub(super) const PROXY_METHODS: [Method; 7] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::HEAD,
    Method::OPTIONS,
];

/// The routes of the contract.
pub(super) enum Route<'a> {
    Health,
    Metrics,
    OpenApi,
    Sandboxes,
    Quiesce,
    Sandbox(&'a str),
    Touch(&'a str),
    Logs(&'a str),
    Proxy(&'a str, &'a str),
}

impl Route<'_> {
    pub(super) fn parse(path: &str) -> Option<Route<'_>> {
        if path == "/health" {
            return Some(Route::Health);
        }
        if path == "/metrics" {
            return Some(Route::Metrics);
        }
        if path == "/openapi.json" {
            return Some(Route::OpenApi);
        }
        let rest = path.strip_prefix("/api/sandboxes")?;
        if rest.is_empty() || rest == "/" {
            return Some(Route::Sandboxes);
        }
        let rest = rest.strip_prefix('/')?;
        let (id, tail) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        match tail {
            "" if id == "quiesce" => Some(Route::Quiesce),
            "" => Some(Route::Sandbox(id)),
            "/touch" => Some(Route::Touch(id)),
            "/logs" => Some(Route::Logs(id)),
            "/proxy" => Some(Route::Proxy(id, "")),
            t => t.strip_prefix("/proxy/").map(|p| Route::Proxy(id, p)),
        }
    }

    /// The id in the path, if the route has one.
    #[cfg(test)]
    pub(super) fn id(&self) -> Option<&str> {
        match self {
            Route::Sandbox(id) | Route::Touch(id) | Route::Logs(id) | Route::Proxy(id, _) => {
                Some(id)
            }
            _ => None,
        }
    }

    /// The id of a single-sandbox route (`quiesce` is a valid id too).
    fn sandbox_id(&self) -> &str {
        match self {
            Route::Sandbox(id) | Route::Touch(id) | Route::Logs(id) | Route::Proxy(id, _) => id,
            _ => "quiesce",
        }
    }

    fn allowed(&self) -> &'static str {
        match self {
            Route::Health | Route::Metrics | Route::OpenApi => "GET",
            Route::Sandboxes => "GET, POST",
            // `quiesce` is also a valid id: GET/DELETE reach that sandbox.
            Route::Quiesce => "GET, POST, DELETE",
            Route::Sandbox(_) => "GET, DELETE",
            Route::Touch(_) => "POST",
            Route::Logs(_) => "GET",
            Route::Proxy(..) => "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS",
        }
    }
}

pub fn json_response(status: StatusCode, v: &impl serde::Serialize) -> Response<RespBody> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body))
        .expect("static response parts are valid")
}

pub fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn error_response(e: &ApiError) -> Response<RespBody> {
    let mut r = json_response(e.status(), &ErrorDetail { detail: e.detail() });
    if let ApiError::Method(allow) = e {
        if let Ok(v) = allow.parse() {
            r.headers_mut().insert(header::ALLOW, v);
        }
    }
    if let ApiError::Unauthorized = e {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("valid"));
        // An unauthenticated client keeps no connection alive.
        r.headers_mut()
            .insert(header::CONNECTION, "close".parse().expect("valid"));
    }
    r
}

pub fn record_json(state: &AppState, r: &SandboxRecord) -> SandboxResponse {
    SandboxResponse {
        sandbox_id: r.sandbox_id.clone(),
        sandbox_url: format!("{}/api/sandboxes/{}/proxy", state.public_url, r.sandbox_id),
        status: r.status,
        generation: r.generation.clone(),
        workdir_path: r.identity.workdir_path.clone(),
        oom_killed: r.oom_killed,
        network: state.lifecycle.backend().network(&r.sandbox_id),
        idle: r.idle,
    }
}

/// The body of `GET /api/sandboxes`: every tracked sandbox as the backend
/// has it now, rendered.
pub async fn list(state: &AppState) -> Bytes {
    let records = state.lifecycle.list().await;
    let sandboxes: Vec<SandboxResponse> = records.iter().map(|r| record_json(state, r)).collect();
    let body = SandboxList {
        count: sandboxes.len(),
        sandboxes,
    };
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

fn query_param<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then_some(v)
    })
}

/// How much of an over-long body is read and discarded before answering
/// 413, so a well-behaved client that is still sending sees the response
/// instead of a reset connection. Bigger bodies are cut off.
const DRAIN_LIMIT: usize = 8 * 1024 * 1024;

async fn drain(mut body: Incoming) {
    let mut seen = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(d) = frame.data_ref() {
            seen += d.len();
        }
        if seen > DRAIN_LIMIT {
            break;
        }
    }
}

/// Reads a JSON body of at most [`MAX_JSON_BODY`] bytes.
async fn read_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = req.into_body();
    if let Some(len) = declared {
        if len > MAX_JSON_BODY as u64 {
            if len <= DRAIN_LIMIT as u64 {
                drain(body).await;
            }
            return Err(ApiError::TooLarge(MAX_JSON_BODY));
        }
    }
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::BadRequest(format!("cannot read request body: {e}")))?;
        if let Some(d) = frame.data_ref() {
            if buf.len() + d.len() > MAX_JSON_BODY {
                drain(body).await;
                return Err(ApiError::TooLarge(MAX_JSON_BODY));
            }
            buf.extend_from_slice(d);
        }
    }
    serde_json::from_slice(&buf)
        .map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))
}

pub(super) fn valid_id(id: &str) -> Result<(), ApiError> {
    validate_sandbox_id(id).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// The answer to a request that failed with `e`: counted, logged (a
/// server-side failure as a warning) and rendered.
pub(super) fn failure(
    state: &AppState,
    method: &Method,
    path: &str,
    e: &ApiError,
) -> Response<RespBody> {
    state.lifecycle.metrics().error(e.kind());
    if e.status().is_server_error() {
        warn!(%method, %path, status = e.status().as_u16(), error = %e, "request failed");
    } else {
        debug!(%method, %path, status = e.status().as_u16(), error = %e, "request refused");
    }
    error_response(e)
}

/// The hyper service function. Proxied requests are served where the
/// connection is (a connection worker), every other route on the daemon's
/// runtime.
pub async fn handle(
    state: Arc<AppState>,
    upstreams: Arc<ConnUpstreams>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    let started = Instant::now();
    let method = req.method().clone();
    // A clone of the URI shares its bytes (no copy of the path).
    let uri = req.uri().clone();
    let path = uri.path();
    let routed = if matches!(Route::parse(path), Some(Route::Proxy(..))) {
        route(&state, &upstreams, req).await
    } else {
        let (state, upstreams) = (state.clone(), upstreams.clone());
        let main = upstreams.main.clone();
        let handler = async move { route(&state, &upstreams, req).await }.in_current_span();
        main.spawn(handler).await.unwrap_or_else(|e| {
            let e = crate::backend::BackendError::Internal(
                format!("request handler failed: {e}").into(),
            );
            Err(ApiError::Lifecycle(e.into()))
        })
    };
    let resp = match routed {
        Ok(r) => r,
        Err(e) => failure(&state, &method, path, &e),
    };
    debug!(%method, %path, status = resp.status().as_u16(),
           elapsed_us = started.elapsed().as_micros() as u64, "request");
    Ok(resp)
}

async fn route(
    state: &Arc<AppState>,
    upstreams: &ConnUpstreams,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, ApiError> {
    let uri = req.uri().clone();
    let route = Route::parse(uri.path()).ok_or(ApiError::NoRoute)?;
    let m = req.method().clone();
    if !matches!(route, Route::Health | Route::Metrics | Route::OpenApi) {
        let header = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if !state.token.check(header) {
            return Err(ApiError::Unauthorized);
        }
    }
    let lc = &state.lifecycle;
    match (&route, &m) {
        (Route::Health, &Method::GET) => Ok(json_response(
            StatusCode::OK,
            &HealthResponse {
                status: "ok".into(),
                backend: lc.backend().name().into(),
                idle_timeout_seconds: lc.settings().idle_timeout.map(|d| d.as_secs()).unwrap_or(0),
                idle_check_interval_seconds: lc.settings().idle_check_interval.as_secs(),
                tracked_sandboxes: lc.tracked_count(),
                egress: lc.backend().egress().map(|(s, _)| s.to_string()),
            },
        )),
        (Route::OpenApi, &Method::GET) => Ok(Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(full(super::openapi::provisioner_json()))
            .expect("static response parts are valid")),
        (Route::Metrics, &Method::GET) => {
            // Per-sandbox series (their ids) only for a caller with the
            // token: /metrics itself needs none.
            let authorized = state.token.check(
                req.headers()
                    .get(header::AUTHORIZATION)
                    .map(|v| v.as_bytes()),
            );
            // Reading the nft counters runs the nft binary: off the runtime.
            let b = lc.backend().clone();
            if let Ok(mut m) = tokio::task::spawn_blocking(move || b.metrics()).await {
                if let Some(nm) = &mut m.network {
                    if !authorized {
                        nm.bytes.clear();
                    }
                    lc.metrics().set_network(nm);
                }
                if let Some(s) = &m.pool {
                    lc.metrics().set_pool(s);
                }
                if let Some(s) = &m.images {
                    lc.metrics().set_images(s);
                }
            }
            if let Some((_, rebuilds)) = lc.backend().egress() {
                lc.metrics().set_egress_rebuilds(rebuilds);
            }
            let records = lc.list().await;
            let counts = crate::lifecycle::Lifecycle::status_counts(&records);
            let text = lc.metrics().render(&counts, &lc.idle_counts(&records));
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )
                .body(full(text))
                .expect("valid response"))
        }
        (Route::Sandboxes, &Method::GET) => {
            let body = list(state).await;
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(full(body))
                .expect("static response parts are valid"))
        }
        (Route::Sandboxes, &Method::POST) => {
            let body: CreateRequest = read_json(req).await?;
            let record = lc.create(body).await?;
            Ok(json_response(StatusCode::OK, &record_json(state, &record)))
        }
        (Route::Quiesce, &Method::POST) => {
            let timeout = match query_param(&req, "timeout_seconds") {
                None => 180,
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if (1..=900).contains(&n) => n,
                    _ => {
                        return Err(ApiError::BadRequest(
                            "timeout_seconds must be an integer in 1..900".into(),
                        ))
                    }
                },
            };
            let n = lc.quiesce(Duration::from_secs(timeout)).await?;
            Ok(json_response(
                StatusCode::OK,
                &QuiesceResponse {
                    ok: true,
                    deleted: n,
                },
            ))
        }
        (Route::Sandbox(_) | Route::Quiesce, &Method::GET) => {
            let id = route.sandbox_id();
            valid_id(id)?;
            let record = lc.discover(id).await?;
            Ok(json_response(StatusCode::OK, &record_json(state, &record)))
        }
        (Route::Sandbox(_) | Route::Quiesce, &Method::DELETE) => {
            let id = route.sandbox_id();
            valid_id(id)?;
            let expected = query_param(&req, "expected_generation").filter(|g| !g.is_empty());
            lc.delete(id, expected).await?;
            Ok(json_response(
                StatusCode::OK,
                &DeleteResponse {
                    ok: true,
                    sandbox_id: id.to_string(),
                },
            ))
        }
        (Route::Touch(id), &Method::POST) => {
            valid_id(id)?;
            let record = lc.discover(id).await?;
            Ok(json_response(
                StatusCode::OK,
                &TouchResponse {
                    ok: true,
                    sandbox_id: id.to_string(),
                    status: record.status,
                },
            ))
        }
        (Route::Logs(id), &Method::GET) => {
            // The recent output of PID 1; not activity (an operator looking
            // does not keep a sandbox alive).
            valid_id(id)?;
            if !lc.is_tracked(id) {
                return Err(LifecycleError::NotFound.into());
            }
            let text = lc.backend().logs(id).ok_or_else(|| {
                ApiError::NotFoundDetail(format!(
                    "the {} backend keeps no output of its sandboxes",
                    lc.backend().name()
                ))
            })?;
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(full(text))
                .expect("static response parts are valid"))
        }
        (Route::Proxy(id, rest), m) if PROXY_METHODS.contains(m) => {
            valid_id(id)?;
            let span = tracing::debug_span!(
                "proxy",
                sandbox_id = %id,
                generation = tracing::field::Empty
            );
            proxy::forward(lc, upstreams, &state.proxy, id, rest, req)
                .instrument(span)
                .await
        }
        (r, _) => Err(ApiError::Method(r.allowed())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(Route::parse("/health"), Some(Route::Health)));
        assert!(matches!(
            Route::parse("/api/sandboxes"),
            Some(Route::Sandboxes)
        ));
        assert!(matches!(
            Route::parse("/api/sandboxes/quiesce"),
            Some(Route::Quiesce)
        ));
        assert!(matches!(
            Route::parse("/api/sandboxes/ab"),
            Some(Route::Sandbox("ab"))
        ));
        assert!(matches!(
            Route::parse("/api/sandboxes/ab/touch"),
            Some(Route::Touch("ab"))
        ));
        assert!(matches!(
            Route::parse("/api/sandboxes/ab/proxy"),
            Some(Route::Proxy("ab", ""))
        ));
        assert!(matches!(
            Route::parse("/api/sandboxes/ab/proxy/v1/x/y"),
            Some(Route::Proxy("ab", "v1/x/y"))
        ));
        assert!(Route::parse("/api/sandboxes/ab/other").is_none());
        assert!(Route::parse("/api/sandboxesX").is_none());
        assert!(Route::parse("/nope").is_none());
    }
}
