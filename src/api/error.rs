//! The one place where errors become HTTP status codes and
//! `{"detail": ...}` bodies.

use hyper::StatusCode;

use crate::backend::BackendError;
use crate::lifecycle::LifecycleError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("not found")]
    NoRoute,
    #[error("method not allowed")]
    Method(&'static str),
    #[error("missing or invalid bearer token")]
    Unauthorized,
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("{0}")]
    BadGateway(String),
    /// A 404 with its own explanation (the route exists).
    #[error("{0}")]
    NotFoundDetail(String),
    /// The sandbox did not send a response head within the proxy's head
    /// timeout.
    #[error("{0}")]
    GatewayTimeout(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NoRoute => StatusCode::NOT_FOUND,
            ApiError::Method(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::NotFoundDetail(_) => StatusCode::NOT_FOUND,
            ApiError::GatewayTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Lifecycle(e) => match e {
                LifecycleError::Validation(_)
                | LifecycleError::IdentityMismatch(_)
                | LifecycleError::ImageNotAllowed(_) => StatusCode::BAD_REQUEST,
                LifecycleError::NotFound => StatusCode::NOT_FOUND,
                LifecycleError::GenerationMismatch { .. } => StatusCode::CONFLICT,
                LifecycleError::Quiescing => StatusCode::SERVICE_UNAVAILABLE,
                LifecycleError::QuiesceTimeout(..) => StatusCode::GATEWAY_TIMEOUT,
                LifecycleError::Backend(b) => match b {
                    BackendError::Invalid(_) => StatusCode::BAD_REQUEST,
                    BackendError::Conflict(_) => StatusCode::CONFLICT,
                    BackendError::Unreachable(_) => StatusCode::BAD_GATEWAY,
                    BackendError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                    BackendError::HealthTimeout(_) | BackendError::Internal(_) => {
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                },
            },
        }
    }

    /// The label counted in `sandboxd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::NoRoute => "no_route",
            ApiError::Method(_) => "method",
            ApiError::Unauthorized => "unauthorized",
            ApiError::TooLarge(_) => "too_large",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::BadGateway(_) => "bad_gateway",
            ApiError::NotFoundDetail(_) => "not_found",
            ApiError::GatewayTimeout(_) => "gateway_timeout",
            ApiError::Lifecycle(e) => e.kind(),
        }
    }

    /// The `detail` string clients log.
    pub fn detail(&self) -> String {
        match self {
            ApiError::Lifecycle(LifecycleError::NotFound) => "sandbox not found".to_string(),
            other => other.to_string(),
        }
    }
}
