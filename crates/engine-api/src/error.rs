//! Errors of the HTTP boundary: every failure becomes `{"message": "..."}` with Docker's status codes
//! (400 bad parameter, 404 not found, 409 conflict, 503 not leader / unavailable, 500 bugs only).
//! Must not depend on the store or Raft.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use shoal_manager::controlapi::ControlError;

use crate::json::{ConvertError, ErrorResponse};

/// Why a request failed, as the client sees it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, a bad query parameter, or a value the API refuses.
    #[error("{0}")]
    BadRequest(String),
    /// No such object or endpoint.
    #[error("{0}")]
    NotFound(String),
    /// Name taken or stale version.
    #[error("{0}")]
    Conflict(String),
    /// A credential was refused (a wrong unlock key).
    #[error("{0}")]
    Unauthorized(String),
    /// Not the leader, or the outcome is unknown.
    #[error("{0}")]
    Unavailable(String),
    /// The endpoint exists in Docker but Shoal does not implement it.
    #[error("{0}")]
    NotImplemented(String),
    /// A bug.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> ApiError {
        let msg = e.to_string();
        match e {
            ControlError::NotFound { .. } => ApiError::NotFound(msg),
            ControlError::InvalidArgument(_) | ControlError::FailedPrecondition(_) => ApiError::BadRequest(msg),
            ControlError::Conflict(_) | ControlError::AlreadyExists(_) => ApiError::Conflict(msg),
            ControlError::NotLeader | ControlError::Unavailable(_) => ApiError::Unavailable(msg),
            ControlError::Internal(_) => ApiError::Internal(msg),
        }
    }
}

impl From<ConvertError> for ApiError {
    fn from(e: ConvertError) -> ApiError {
        ApiError::BadRequest(e.0)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %self, "engine API internal error");
        }
        (status, axum::Json(ErrorResponse { message: self.to_string() })).into_response()
    }
}
