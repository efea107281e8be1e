//! The OpenAPI 3.1 description of the provisioner API, generated from the
//! Rust types with `utoipa`: the request model (`sandbox-abi`, feature
//! `openapi`), the response bodies below (which the handlers in
//! `routes.rs` serialize, so the schema and the wire format are one type),
//! and one `#[utoipa::path]` stub per route of the hand-written router.
//!
//! Served at `GET /openapi.json` (no token) and committed as
//! `docs/openapi/provisioner.json`; `sandboxd openapi provisioner` prints
//! it (`tests/it/openapi.rs` fails when the committed file differs).

use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::model::{CreateRequest, NetworkMode, ResourceRequest, SandboxStatus};

/// Every error body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Why the request failed.
    #[schema(example = "sandbox not found")]
    pub detail: String,
}

/// A sandbox's network (native backend only).
#[derive(Debug, Serialize, ToSchema)]
pub struct NetworkInfo {
    pub mode: NetworkMode,
    /// The sandbox's address (egress only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "10.243.0.1")]
    pub address: Option<String>,
    /// Its gateway on the host side of the veth (egress only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The host side of the veth (egress only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// One sandbox incarnation (create, discover, list). Fields in the order
/// the daemon has always sent them (alphabetical).
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxResponse {
    /// 32 lowercase hex characters (the Pod UID on Kubernetes), new for
    /// every incarnation.
    #[schema(example = "f5890592f8d2b643493c124f7e09de5d")]
    pub generation: String,
    /// Where the sandbox is on the hibernation ladder and since when (unix
    /// seconds): `active`, `frozen` or `reclaimed` (native backend; absent
    /// on the others). `status` stays `running` throughout; any request,
    /// discover or touch wakes it first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<crate::model::IdleMark>,
    /// The sandbox's network (native backend; absent on the others).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<NetworkInfo>)]
    pub network: Option<crate::backend::SandboxNetwork>,
    /// Present once a process of the sandbox was killed by the OOM killer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_killed: Option<bool>,
    #[schema(example = "3f2a9c1b7d44")]
    pub sandbox_id: String,
    /// `{PROVISIONER_PUBLIC_URL}/api/sandboxes/{id}/proxy`.
    pub sandbox_url: String,
    pub status: SandboxStatus,
    /// The normalized `workdir_path`, `null` when none was given.
    #[schema(required = true)]
    pub workdir_path: Option<String>,
}

/// `GET /api/sandboxes`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxList {
    pub count: usize,
    /// Sorted by `sandbox_id`; exited sandboxes included.
    pub sandboxes: Vec<SandboxResponse>,
}

/// `DELETE /api/sandboxes/{id}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeleteResponse {
    pub ok: bool,
    pub sandbox_id: String,
}

/// `POST /api/sandboxes/{id}/touch`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TouchResponse {
    pub ok: bool,
    pub sandbox_id: String,
    pub status: SandboxStatus,
}

/// `POST /api/sandboxes/quiesce`.
#[derive(Debug, Serialize, ToSchema)]
pub struct QuiesceResponse {
    /// How many sandboxes this call deleted.
    pub deleted: usize,
    pub ok: bool,
}

/// `GET /health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthResponse {
    /// `native`, `kubernetes` or `memory`.
    pub backend: String,
    pub idle_check_interval_seconds: u64,
    /// The effective idle timeout; 0 when the reaper is disabled.
    pub idle_timeout_seconds: u64,
    #[schema(example = "ok")]
    pub status: String,
    pub tracked_sandboxes: usize,
    /// The node's egress policy (native backend, network mode `egress`):
    /// `enforced`; `rebuilding` (its nftables table was removed or changed,
    /// by a firewall reload say, and is being restored: creates that need
    /// egress wait, then 503); `failed` (it cannot be restored: such creates
    /// answer 503). Sandboxes stay closed in every state. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "enforced")]
    pub egress: Option<String>,
}

/// The route stubs: documentation only (the router is `routes::route`).
#[allow(dead_code)]
mod paths {
    use super::*;

    #[utoipa::path(get, path = "/health", tag = "daemon", security(()),
        description = "Liveness and the daemon's settings. No token.",
        responses((status = 200, description = "The daemon is up", body = HealthResponse)))]
    fn health() {}

    #[utoipa::path(get, path = "/metrics", tag = "daemon", security(()),
        description = "Prometheus metrics (OpenMetrics text, ends in `# EOF`). No token.",
        responses((status = 200, description = "The metrics",
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
    fn metrics() {}

    #[utoipa::path(get, path = "/openapi.json", tag = "daemon", security(()),
        description = "This document. No token.",
        responses((status = 200, description = "The OpenAPI 3.1 description of this API",
            content_type = "application/json", body = Object)))]
    fn openapi() {}

    #[utoipa::path(post, path = "/api/sandboxes", tag = "sandboxes",
        description = "Create a sandbox, or return the running one of the same identity \
            (same generation). `inherit_env: false` without `workdir_path` makes an \
            ephemeral sandbox. Returns once the agent in the sandbox listens.",
        request_body(content = CreateRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "The sandbox (new, or the running one)", body = SandboxResponse),
            (status = 400, description = "Invalid JSON or field, identity mismatch, bad host path", body = ErrorDetail),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 409, description = "The backend refused the replacement of a stale incarnation", body = ErrorDetail),
            (status = 413, description = "Body over 1 MiB", body = ErrorDetail),
            (status = 500, description = "Health timeout, launcher failure (everything the attempt made is removed)", body = ErrorDetail),
            (status = 502, description = "The backend is unreachable (Kubernetes API server)", body = ErrorDetail),
            (status = 503, description = "Quiescing: no new sandboxes", body = ErrorDetail),
        ))]
    fn create() {}

    #[utoipa::path(get, path = "/api/sandboxes", tag = "sandboxes",
        description = "Every tracked sandbox, exited ones included. Not activity.",
        responses(
            (status = 200, description = "The sandboxes", body = SandboxList),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
        ))]
    fn list() {}

    #[utoipa::path(get, path = "/api/sandboxes/{id}", tag = "sandboxes",
        description = "Discover a running sandbox. Counts as activity.",
        params(("id" = String, Path, pattern = "^[A-Za-z0-9_-]{1,63}$", example = "3f2a9c1b7d44", description = "The sandbox id")),
        responses(
            (status = 200, description = "The sandbox", body = SandboxResponse),
            (status = 400, description = "Bad id", body = ErrorDetail),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 404, description = "Unknown sandbox, or not running", body = ErrorDetail),
        ))]
    fn discover() {}

    #[utoipa::path(delete, path = "/api/sandboxes/{id}", tag = "sandboxes",
        description = "Delete a sandbox (its user files stay). Absent: also 200. Waits for \
            in-flight proxied requests at most the delete grace.",
        params(
            ("id" = String, Path, pattern = "^[A-Za-z0-9_-]{1,63}$", example = "3f2a9c1b7d44", description = "The sandbox id"),
            ("expected_generation" = Option<String>, Query,
                description = "Delete only this incarnation (409 otherwise); empty counts as absent"),
        ),
        responses(
            (status = 200, description = "Deleted, or was absent", body = DeleteResponse),
            (status = 400, description = "Bad id", body = ErrorDetail),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 409, description = "`expected_generation` is not the live generation", body = ErrorDetail),
            (status = 500, description = "The backend failed to remove it", body = ErrorDetail),
            (status = 502, description = "The backend is unreachable (Kubernetes API server)", body = ErrorDetail),
        ))]
    fn delete() {}

    #[utoipa::path(post, path = "/api/sandboxes/{id}/touch", tag = "sandboxes",
        description = "Mark activity. Any request body is ignored.",
        params(("id" = String, Path, pattern = "^[A-Za-z0-9_-]{1,63}$", example = "3f2a9c1b7d44", description = "The sandbox id")),
        responses(
            (status = 200, description = "Marked", body = TouchResponse),
            (status = 400, description = "Bad id", body = ErrorDetail),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 404, description = "Unknown sandbox, or not running", body = ErrorDetail),
        ))]
    fn touch() {}

    #[utoipa::path(get, path = "/api/sandboxes/{id}/logs", tag = "sandboxes",
        description = "The recent output (last 64 KiB) of the sandbox's PID 1, each line \
            prefixed with `<unix seconds>.<milliseconds>`. Not activity.",
        params(("id" = String, Path, pattern = "^[A-Za-z0-9_-]{1,63}$", example = "3f2a9c1b7d44", description = "The sandbox id")),
        responses(
            (status = 200, description = "The output", content_type = "text/plain; charset=utf-8", body = String),
            (status = 400, description = "Bad id", body = ErrorDetail),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 404, description = "Not tracked, or the backend keeps no output", body = ErrorDetail),
        ))]
    fn logs() {}

    #[utoipa::path(post, path = "/api/sandboxes/quiesce", tag = "sandboxes",
        description = "Close the create gate until the daemon restarts, wait for creates in \
            flight, delete every sandbox. (`GET`/`DELETE` on this path address the sandbox \
            whose id is `quiesce`.)",
        params(("timeout_seconds" = Option<u64>, Query, minimum = 1, maximum = 900,
            description = "Deadline of the whole call (default 180)")),
        responses(
            (status = 200, description = "Every sandbox deleted", body = QuiesceResponse),
            (status = 400, description = "Bad `timeout_seconds` (the gate stays open)", body = ErrorDetail),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 504, description = "The deadline passed (the gate stays closed)", body = ErrorDetail),
        ))]
    fn quiesce() {}

    #[utoipa::path(get, path = "/api/sandboxes/quiesce", tag = "sandboxes",
        description = "Discover the sandbox whose id is `quiesce` (as `GET /api/sandboxes/{id}`).",
        responses(
            (status = 200, description = "The sandbox", body = SandboxResponse),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 404, description = "Unknown sandbox, or not running", body = ErrorDetail),
        ))]
    fn discover_quiesce() {}

    #[utoipa::path(delete, path = "/api/sandboxes/quiesce", tag = "sandboxes",
        description = "Delete the sandbox whose id is `quiesce` (as `DELETE /api/sandboxes/{id}`).",
        params(("expected_generation" = Option<String>, Query,
            description = "Delete only this incarnation (409 otherwise); empty counts as absent")),
        responses(
            (status = 200, description = "Deleted, or was absent", body = DeleteResponse),
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 409, description = "`expected_generation` is not the live generation", body = ErrorDetail),
            (status = 500, description = "The backend failed to remove it", body = ErrorDetail),
            (status = 502, description = "The backend is unreachable (Kubernetes API server)", body = ErrorDetail),
        ))]
    fn delete_quiesce() {}

    /// The proxy answers whatever the agent answers (see the agent API,
    /// `docs/openapi/agent.json`) plus its own errors.
    #[utoipa::path(method(get, post, put, patch, delete, head, options),
        path = "/api/sandboxes/{id}/proxy/{path}", tag = "proxy",
        description = "Forwarded to the sandbox's agent at `/{path}?{query}` (the path may \
            contain `/`; `/api/sandboxes/{id}/proxy` alone reaches `/`), bodies streamed both \
            ways. The token and hop-by-hop headers are not forwarded; only allow-listed \
            response headers come back. The agent's answers (any status, see the agent API) \
            pass through unchanged.",
        params(
            ("id" = String, Path, pattern = "^[A-Za-z0-9_-]{1,63}$", example = "3f2a9c1b7d44", description = "The sandbox id"),
            ("path" = String, Path, example = "v1/sandbox", description = "The agent's path, e.g. `v1/shell/exec`"),
        ),
        responses(
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 502, description = "The sandbox is unreachable, or was deleted while the request waited", body = ErrorDetail),
            (status = 504, description = "No response head within the head timeout", body = ErrorDetail),
            (status = "default", description = "The agent's answer, passed through (any status \
                and content type); or the daemon's own `{\"detail\"}` errors: 400 for a bad id or a \
                path that cannot be forwarded, 404 for an unknown sandbox or one that is not running"),
        ))]
    fn proxy() {}

    #[utoipa::path(method(get, post, put, patch, delete, head, options),
        path = "/api/sandboxes/{id}/proxy", tag = "proxy",
        description = "Forwarded to the agent's `/` (as `/api/sandboxes/{id}/proxy/`).",
        params(("id" = String, Path, pattern = "^[A-Za-z0-9_-]{1,63}$", example = "3f2a9c1b7d44", description = "The sandbox id")),
        responses(
            (status = 401, description = "Token missing or wrong", body = ErrorDetail),
            (status = 502, description = "The sandbox is unreachable, or was deleted while the request waited", body = ErrorDetail),
            (status = 504, description = "No response head within the head timeout", body = ErrorDetail),
            (status = "default", description = "The agent's answer, passed through (any status \
                and content type); or the daemon's own `{\"detail\"}` errors: 400 for a bad id or a \
                path that cannot be forwarded, 404 for an unknown sandbox or one that is not running"),
        ))]
    fn proxy_root() {}
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "`Authorization: Bearer <token>`: the scheme is matched exactly \
                         (case-sensitive, one space); the token is `SANDBOX_PROVISIONER_TOKEN` \
                         or the daemon's token file",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandboxd provisioner API",
        description = "The node-local provisioner API of sandboxd (docs/api.md, \
            docs/contracts/provisioner-api.md). Every route except /health, /metrics and \
            /openapi.json needs the bearer token. An unknown path is 404 before auth is \
            checked; a method a route does not serve is 405 with an `Allow` header.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(paths::health, paths::metrics, paths::openapi, paths::create, paths::list,
          paths::discover, paths::delete, paths::touch, paths::logs, paths::quiesce, paths::discover_quiesce, paths::delete_quiesce, paths::proxy,
          paths::proxy_root),
    components(schemas(ResourceRequest)),
    security(("bearer" = [])),
    modifiers(&BearerAuth),
    tags(
        (name = "sandboxes", description = "Sandbox lifecycle"),
        (name = "proxy", description = "Requests forwarded to the agent in a sandbox"),
        (name = "daemon", description = "Unauthenticated daemon routes"),
    ),
)]
struct ProvisionerApi;

/// The document as pretty JSON with a trailing newline (the committed form).
pub fn provisioner_json() -> String {
    let mut doc = ProvisionerApi::openapi();
    sandbox_abi::agent_api::openapi::unique_operation_ids(&mut doc);
    let mut s = doc
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    s.push('\n');
    s
}
