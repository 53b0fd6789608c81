//! Every error the API answers, always as `{"error": "..."}` with the status that says what
//! kind it is, so scripts can branch on the code and humans can read the message.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::control::ControlError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Fields answered beside `error` (a refused switchover's `lag_bytes` and `replica`).
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), fields: serde_json::Map::new() }
    }

    /// The same error, answering `key` beside `error`.
    pub fn with(mut self, key: &str, value: serde_json::Value) -> Self {
        self.fields.insert(key.to_string(), value);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    pub fn unknown_master(name: &str) -> Self {
        Self::not_found(format!("no master named {name:?}"))
    }

    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }
}

/// What the Sentinel side's refusal means to an HTTP client.
impl From<ControlError> for ApiError {
    fn from(error: ControlError) -> Self {
        let status = match error {
            ControlError::UnknownMaster(_) => StatusCode::NOT_FOUND,
            ControlError::Refused { .. } => StatusCode::CONFLICT,
            ControlError::Unreachable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = self.fields;
        body.insert("error".into(), json!(self.message));
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            let challenge = HeaderValue::from_static("Bearer");
            response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
        }
        response
    }
}
