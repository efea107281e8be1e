//! The route table: method + path → handler, one log line per request.
//!
//! Owns: dispatch and the success messages. Handlers live in their own
//! modules; blocking filesystem work runs on tokio's blocking pool.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::time::Instant;
use tracing::Instrument;

use super::body::AgentBody;
use super::context::context;
use super::editor::Editor;
use super::envelope::{finish, json_response, ok, ApiError, RouteResult};
use super::exec::Exec;
use super::paths::PathBase;
use super::request::{json_body, query_param};
use super::{editor, files, listing, transfer};

/// Shared state of all routes.
#[derive(Debug)]
pub struct Routes {
    pub exec: Exec,
    pub editor: Editor,
    pub base: PathBase,
}

/// Runs blocking filesystem work off the async workers.
async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(Into::into),
        Err(e) => Err(ApiError::internal(format!("worker failed: {e}"))),
    }
}

const KNOWN: &[&str] = &[
    "/v1/sandbox",
    "/v1/shell/exec",
    "/v1/file/read",
    "/v1/file/write",
    "/v1/file/list",
    "/v1/file/find",
    "/v1/file/str_replace_editor",
    "/v1/file/upload",
    "/v1/file/download",
];

impl Routes {
    /// Handles one request; never fails (errors become envelopes).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<AgentBody> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let span = tracing::info_span!("request", %method, path);
        let start = Instant::now();
        let resp = finish(self.route(req).instrument(span.clone()).await);
        if let Some(left_out) = crate::loglimit::REQUESTS.admit() {
            span.in_scope(|| {
                tracing::info!(
                    status = resp.status().as_u16(),
                    elapsed_ms = start.elapsed().as_millis() as u64,
                    left_out,
                    "handled"
                )
            });
        }
        resp
    }

    async fn route(self: Arc<Self>, req: Request<Incoming>) -> RouteResult {
        let path = req.uri().path();
        let path = if path.len() > 1 {
            path.trim_end_matches('/')
        } else {
            path
        }
        .to_owned();
        let base = self.base.clone();
        match (req.method().clone(), path.as_str()) {
            (Method::GET | Method::HEAD, "/v1/sandbox") => {
                let mut v = context(&base.home, &base.cwd);
                let data = v.clone();
                v["success"] = true.into();
                v["message"] = "Sandbox is running".into();
                v["data"] = data;
                Ok(json_response(StatusCode::OK, &v))
            }
            (Method::GET | Method::HEAD, "/" | "/health" | "/healthz") => {
                Ok(ok("ok", &serde_json::json!({"status": "ok"})))
            }
            (Method::POST, "/v1/shell/exec") => {
                let body = json_body(req.into_body()).await?;
                let result = self.exec.run(body).await?;
                Ok(ok("Command executed", &result))
            }
            (Method::POST, "/v1/file/read") => {
                let body: files::ReadRequest = json_body(req.into_body()).await?;
                Ok(ok(
                    "File read successfully",
                    &blocking(move || files::read(&base, body)).await?,
                ))
            }
            (Method::POST, "/v1/file/write") => {
                let body: files::WriteRequest = json_body(req.into_body()).await?;
                Ok(ok(
                    "File written successfully",
                    &blocking(move || files::write(&base, body)).await?,
                ))
            }
            (Method::POST, "/v1/file/list") => {
                let body: listing::ListRequest = json_body(req.into_body()).await?;
                Ok(ok(
                    "Directory listed successfully",
                    &blocking(move || listing::list(&base, body)).await?,
                ))
            }
            (Method::POST, "/v1/file/find") => {
                let body: listing::FindRequest = json_body(req.into_body()).await?;
                Ok(ok(
                    "Search completed",
                    &blocking(move || listing::find(&base, body)).await?,
                ))
            }
            (Method::POST, "/v1/file/str_replace_editor") => {
                let body: editor::EditorRequest = json_body(req.into_body()).await?;
                let me = Arc::clone(&self);
                Ok(ok(
                    "Edit completed",
                    &blocking(move || me.editor.run(&base, body)).await?,
                ))
            }
            (Method::POST | Method::PUT, "/v1/file/upload") => {
                let query_path = query_param(req.uri().query(), "path")?;
                let result = transfer::upload(&base, query_path, req).await?;
                Ok(ok("File uploaded successfully", &result))
            }
            (Method::GET | Method::HEAD, "/v1/file/download") => {
                let raw = query_param(req.uri().query(), "path")?
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| ApiError::bad_request("missing query parameter `path`"))?;
                Ok(transfer::download(&base, &raw).await?)
            }
            (_, p) if KNOWN.contains(&p) => Err(ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                message: format!("method not allowed on {p}"),
            }),
            (_, p) => Err(ApiError::not_found(format!("no such route: {p}"))),
        }
    }
}
