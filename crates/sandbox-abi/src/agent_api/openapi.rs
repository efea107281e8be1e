//! The OpenAPI 3.1 description of the agent API (feature `openapi`, never
//! in the static binary): generated with `utoipa` from the request and
//! result types of [`super`], wrapped in the agent's envelope
//! (`crates/sandbox-agent/src/envelope.rs`). `sandboxd openapi agent` prints it; it is committed
//! as `docs/openapi/agent.json`.

use serde::Serialize;
use utoipa::{OpenApi, ToSchema};

use super::{
    EditorRequest, EditorResult, ExecRequest, ExecResult, FileInfo, FindRequest, FindResult,
    ListRequest, ListResult, ReadRequest, ReadResult, UploadResult, WriteRequest, WriteResult,
};

/// Every JSON answer: `{"success", "message", "data"}`.
#[derive(Serialize, ToSchema)]
pub struct Envelope<T> {
    /// `true` on success.
    pub success: bool,
    pub message: String,
    pub data: T,
}

/// A failure: non-2xx, `success: false`, `data: null`.
#[derive(Serialize, ToSchema)]
pub struct ErrorEnvelope {
    /// Always `false`.
    pub success: bool,
    /// What went wrong (a missing path ends in `<path> does not exist`).
    pub message: String,
    /// Always `null`.
    #[schema(value_type = Option<Object>, required = true)]
    pub data: Option<serde_json::Value>,
}

/// `GET /v1/sandbox`, also inside `data`: the client's `get_context()`
/// reads these at the top level.
#[derive(Serialize, ToSchema)]
pub struct SandboxContext {
    pub success: bool,
    pub message: String,
    pub home_dir: String,
    pub version: String,
    /// `system` (`os`, `os_version`, `arch`, `user`, `home_dir`,
    /// `workspace`, `timezone`, `occupied_ports`), `runtime` (`python`,
    /// `nodejs`), `utils`.
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

/// `GET /health`.
#[derive(Serialize, ToSchema)]
pub struct HealthData {
    #[schema(example = "ok")]
    pub status: String,
}

/// The multipart form of an upload.
#[derive(Serialize, ToSchema)]
pub struct UploadForm {
    /// The destination file's full path (or the `path` query parameter).
    pub path: Option<String>,
    /// The content.
    #[schema(value_type = String, format = Binary)]
    pub file: Vec<u8>,
}

#[allow(dead_code)]
mod paths {
    use super::*;

    #[utoipa::path(method(get, head), path = "/v1/sandbox",
        description = "Health and context.",
        responses((status = 200, description = "Running", body = SandboxContext)))]
    fn sandbox() {}

    #[utoipa::path(method(get, head), path = "/health",
        description = "Plain readiness check (also `/` and `/healthz`).",
        responses((status = 200, description = "Running", body = Envelope<HealthData>)))]
    fn health() {}

    #[utoipa::path(post, path = "/v1/shell/exec",
        description = "Run `bash -c <command>` (sh where there is no bash) as the leader of \
            a new process group; with `timeout`/`hard_timeout` N the answer comes before N \
            seconds (status `hard_timeout`, exit code 124).",
        request_body(content = ExecRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "Executed (or started, `async_mode`)", body = Envelope<ExecResult>),
            (status = 400, description = "Bad request", body = ErrorEnvelope),
            (status = 404, description = "`exec_dir` does not exist", body = ErrorEnvelope),
            (status = 413, description = "Body too large", body = ErrorEnvelope),
            (status = 500, description = "The command could not be run", body = ErrorEnvelope),
        ))]
    fn exec() {}

    #[utoipa::path(post, path = "/v1/file/read",
        request_body(content = ReadRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "The content (base64 with `encoding` when not UTF-8)", body = Envelope<ReadResult>),
            (status = 400, description = "Not a regular file, bad line range", body = ErrorEnvelope),
            (status = 404, description = "The file does not exist", body = ErrorEnvelope),
            (status = 413, description = "Body too large", body = ErrorEnvelope),
            (status = 500, description = "Anything else (permission denied included)", body = ErrorEnvelope),
        ))]
    fn read() {}

    #[utoipa::path(post, path = "/v1/file/write",
        request_body(content = WriteRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "Written", body = Envelope<WriteResult>),
            (status = 400, description = "A directory, bad base64", body = ErrorEnvelope),
            (status = 404, description = "The parent directory does not exist", body = ErrorEnvelope),
            (status = 413, description = "Body too large", body = ErrorEnvelope),
            (status = 500, description = "Anything else (permission denied included)", body = ErrorEnvelope),
        ))]
    fn write() {}

    #[utoipa::path(post, path = "/v1/file/list",
        request_body(content = ListRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "The entries", body = Envelope<ListResult>),
            (status = 400, description = "Not a directory", body = ErrorEnvelope),
            (status = 404, description = "The path does not exist", body = ErrorEnvelope),
            (status = 413, description = "Body too large", body = ErrorEnvelope),
            (status = 500, description = "Anything else (permission denied included)", body = ErrorEnvelope),
        ))]
    fn list() {}

    #[utoipa::path(post, path = "/v1/file/find",
        request_body(content = FindRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "The matching absolute paths", body = Envelope<FindResult>),
            (status = 400, description = "Not a directory, bad glob", body = ErrorEnvelope),
            (status = 404, description = "The path does not exist", body = ErrorEnvelope),
            (status = 413, description = "Body too large", body = ErrorEnvelope),
            (status = 500, description = "Anything else (permission denied included)", body = ErrorEnvelope),
        ))]
    fn find() {}

    #[utoipa::path(post, path = "/v1/file/str_replace_editor",
        request_body(content = EditorRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "Edited (or viewed)", body = Envelope<EditorResult>),
            (status = 400, description = "`old_str` not found or not unique, unknown command, bad line", body = ErrorEnvelope),
            (status = 404, description = "The file does not exist", body = ErrorEnvelope),
            (status = 413, description = "Body too large", body = ErrorEnvelope),
            (status = 500, description = "Anything else (permission denied included)", body = ErrorEnvelope),
        ))]
    fn editor() {}

    #[utoipa::path(method(post, put), path = "/v1/file/upload",
        description = "Streamed to a temporary file beside the destination, then renamed; \
            missing parent directories are created.",
        params(("path" = Option<String>, Query, description = "The destination (else the form's `path` field)")),
        request_body(content = UploadForm, content_type = "multipart/form-data"),
        responses(
            (status = 200, description = "Uploaded", body = Envelope<UploadResult>),
            (status = 400, description = "Not multipart, no `file` part, no path, a directory", body = ErrorEnvelope),
            (status = 500, description = "Anything else (permission denied included)", body = ErrorEnvelope),
        ))]
    fn upload() {}

    #[utoipa::path(method(get, head), path = "/v1/file/download",
        description = "Not enveloped: the raw bytes of the file.",
        params(("path" = String, Query, description = "Absolute path of the file")),
        responses(
            (status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
            (status = 400, description = "No path, a directory or another non-regular file", body = ErrorEnvelope),
            (status = 404, description = "The file does not exist", body = ErrorEnvelope),
            (status = 500, description = "Anything else (permission denied included)", body = ErrorEnvelope),
        ))]
    fn download() {}
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandbox-agent API",
        description = "The HTTP API of the agent in every sandbox (docs/agent.md, \
            docs/contracts/agent-api.md), on 127.0.0.1:8080 in the sandbox, reached through \
            the provisioner's `/api/sandboxes/{id}/proxy/{path}`. No authentication of its \
            own (the proxy checked the caller's token). Unknown routes are 404, known routes \
            with another method 405, both as an error envelope.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        paths::sandbox,
        paths::health,
        paths::exec,
        paths::read,
        paths::write,
        paths::list,
        paths::find,
        paths::editor,
        paths::upload,
        paths::download
    ),
    components(schemas(FileInfo))
)]
struct AgentApi;

/// A route stub that serves several methods gives each the stub's name as
/// its `operationId`; OpenAPI wants them unique: `<name>_<method>`.
pub fn unique_operation_ids(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let mut ops = [
            ("get", &mut item.get),
            ("put", &mut item.put),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
            ("options", &mut item.options),
            ("head", &mut item.head),
            ("patch", &mut item.patch),
            ("trace", &mut item.trace),
        ];
        let ids: Vec<Option<String>> = ops
            .iter()
            .filter_map(|(_, op)| op.as_ref().map(|o| o.operation_id.clone()))
            .collect();
        for (method, op) in ops.iter_mut() {
            if let Some(op) = op.as_mut() {
                let shared = ids.iter().filter(|i| **i == op.operation_id).count() > 1;
                if let (true, Some(id)) = (shared, op.operation_id.as_mut()) {
                    *id = format!("{id}_{method}");
                }
            }
        }
    }
}

/// The document as pretty JSON with a trailing newline (the committed form).
pub fn agent_json() -> String {
    let mut doc = AgentApi::openapi();
    unique_operation_ids(&mut doc);
    let mut s = doc
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    s.push('\n');
    s
}
