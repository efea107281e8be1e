//! The response envelope `{"success", "message", "data"}` and the one place
//! where errors crossing the HTTP boundary become status codes.
//!
//! Owns: [`ApiError`] (status + message) and the `From` impls that map every
//! module's error enum to a status. Must not know about routes or request
//! shapes.

use bytes::Bytes;
use hyper::{header, Response, StatusCode};
use serde::Serialize;
use serde_json::{json, Value};

use super::body::{full, AgentBody};
use super::exec::ExecError;
use super::files::FileError;
use super::listing::ListingError;
use super::request::RequestError;
use super::transfer::TransferError;

/// An error on its way to the client: a non-2xx status and a message.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
        }
    }

    /// An I/O failure, with the status [`io_status`] gives it.
    pub fn io(source: &std::io::Error, message: String) -> Self {
        Self {
            status: io_status(source),
            message,
        }
    }

    /// The error response: non-2xx, `success:false`, `data:null`.
    pub fn into_response(self) -> Response<AgentBody> {
        let body = json!({"success": false, "message": self.message, "data": Value::Null});
        json_response(self.status, &body)
    }
}

/// 404 for a missing path, 400 for a (not-)directory mismatch or invalid
/// input, 500 for everything else (permission denied included).
pub fn io_status(err: &std::io::Error) -> StatusCode {
    match (err.kind(), err.raw_os_error()) {
        (std::io::ErrorKind::NotFound, _) => StatusCode::NOT_FOUND,
        (_, Some(libc::ENOTDIR | libc::EISDIR)) | (std::io::ErrorKind::InvalidInput, _) => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<RequestError> for ApiError {
    fn from(err: RequestError) -> Self {
        match err {
            RequestError::ReadBody(_) => Self::bad_request(err.to_string()),
            RequestError::TooLarge { .. } => Self {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: err.to_string(),
            },
            RequestError::Json(_) | RequestError::Query(_) => Self::bad_request(err.to_string()),
        }
    }
}

impl From<FileError> for ApiError {
    fn from(err: FileError) -> Self {
        match &err {
            FileError::Io { source, .. } => Self::io(source, err.to_string()),
            FileError::NotFound { .. } => Self::not_found(err.to_string()),
            FileError::NotUtf8 { .. }
            | FileError::IsDirectory { .. }
            | FileError::NotRegular { .. }
            | FileError::Base64(_)
            | FileError::OldStrNotFound { .. }
            | FileError::OldStrNotUnique { .. }
            | FileError::MissingField { .. }
            | FileError::UnsupportedCommand { .. }
            | FileError::InvalidLine { .. }
            | FileError::NoHistory { .. } => Self::bad_request(err.to_string()),
        }
    }
}

impl From<ListingError> for ApiError {
    fn from(err: ListingError) -> Self {
        match &err {
            ListingError::Io { source, .. } => Self::io(source, err.to_string()),
            ListingError::NotFound { .. } => Self::not_found(err.to_string()),
            ListingError::NotADirectory { .. } | ListingError::Pattern(_) => {
                Self::bad_request(err.to_string())
            }
        }
    }
}

impl From<TransferError> for ApiError {
    fn from(err: TransferError) -> Self {
        match &err {
            TransferError::Io { source, .. } => Self::io(source, err.to_string()),
            TransferError::NotFound { .. } => Self::not_found(err.to_string()),
            TransferError::IsDirectory { .. }
            | TransferError::NotRegular { .. }
            | TransferError::MissingPath
            | TransferError::MissingFile
            | TransferError::Multipart(_) => Self::bad_request(err.to_string()),
        }
    }
}

impl From<ExecError> for ApiError {
    fn from(err: ExecError) -> Self {
        match &err {
            ExecError::NoSuchDir { .. } => Self::bad_request(err.to_string()),
            ExecError::Pipe(_) | ExecError::Spawn(_) | ExecError::Script { .. } => {
                Self::internal(err.to_string())
            }
        }
    }
}

/// A 200 envelope carrying `data`.
pub fn ok<T: Serialize>(message: &str, data: &T) -> Response<AgentBody> {
    let body = json!({"success": true, "message": message, "data": data});
    json_response(StatusCode::OK, &body)
}

/// Serializes `body` as the JSON response with `status`.
pub fn json_response(status: StatusCode, body: &Value) -> Response<AgentBody> {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = Response::new(full(Bytes::from(bytes)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Result of a route handler: a response, or an error to wrap.
pub type RouteResult = Result<Response<AgentBody>, ApiError>;

/// Unwraps a handler result into the response to send.
pub fn finish(result: RouteResult) -> Response<AgentBody> {
    result.unwrap_or_else(ApiError::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_json(resp: Response<AgentBody>) -> Value {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn errors_are_non_2xx_with_null_data() {
        let resp = ApiError::not_found("gone").into_response();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let v = body_json(resp).await;
        assert_eq!(
            v,
            json!({"success": false, "message": "gone", "data": null})
        );
    }

    #[test]
    fn io_errors_map_to_status() {
        let nf = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(io_status(&nf), StatusCode::NOT_FOUND);
        let dir = std::io::Error::from_raw_os_error(libc::EISDIR);
        assert_eq!(io_status(&dir), StatusCode::BAD_REQUEST);
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(io_status(&denied), StatusCode::INTERNAL_SERVER_ERROR);
        let api = ApiError::io(&nf, "read /x: gone".into());
        assert_eq!(
            (api.status, api.message.as_str()),
            (StatusCode::NOT_FOUND, "read /x: gone")
        );
    }
}
