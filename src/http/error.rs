//! One error shape for every HTTP error, and the one table from error kind to status.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::queue::QueueError;
use crate::zk::ZkError;

/// The body of every error response.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Stable, machine-readable error code (see the README's error table).
    #[schema(example = "invalid_queue_name")]
    pub code: String,
    /// What went wrong and what to do about it.
    pub message: String,
}

/// The answers of every endpoint that talks to ZooKeeper, besides its own.
#[derive(utoipa::IntoResponses)]
pub enum ZookeeperErrors {
    /// ZooKeeper unavailable (no connected session before the request's deadline), zkq shutting down, or
    /// more than `api.max_concurrent_requests` requests at once (`overloaded`)
    #[response(status = 503, headers(("Retry-After" = u32, description = "Seconds to wait before retrying")))]
    Unavailable(ErrorBody),
    /// ZooKeeper refused the request (`zookeeper_refused`): an ACL that does not allow zkq, a quota
    #[response(status = 502)]
    Refused(ErrorBody),
    /// ZooKeeper did not answer in time: for a write, the outcome is unknown (`outcome_unknown`); for
    /// a put with an `Idempotency-Key`, also a stored message whose name could not be written into
    /// the key's record in time. Retry a put with the same key, a lease step with the same receipt
    #[response(status = 504)]
    OutcomeUnknown(ErrorBody),
}

/// Every kind of error the HTTP API reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    InvalidQueueName,
    InvalidParameter,
    ParameterNotForKind,
    NotFound,
    QueueNotFound,
    MessageNotFound,
    LeaseNotFound,
    LeaseLost,
    InvalidName,
    CounterNotFound,
    CounterNotAnInt,
    VersionMismatch,
    VersionOverflow,
    Contention,
    CounterOverflow,
    IdempotencyKeyReused,
    UnsupportedMediaType,
    MethodNotAllowed,
    PayloadTooLarge,
    QueueFull,
    TooManyLeases,
    Overloaded,
    ZookeeperUnavailable,
    ZookeeperRefused,
    OutcomeUnknown,
    ShuttingDown,
    NotReady,
    Unauthorized,
    CrossOriginRefused,
    Internal,
}

impl ErrorCode {
    /// The table: error kind → HTTP status and stable code string.
    pub fn status_and_code(self) -> (StatusCode, &'static str) {
        use ErrorCode::*;
        match self {
            BadRequest => (StatusCode::BAD_REQUEST, "bad_request"),
            InvalidQueueName => (StatusCode::BAD_REQUEST, "invalid_queue_name"),
            InvalidParameter => (StatusCode::BAD_REQUEST, "invalid_parameter"),
            ParameterNotForKind => (StatusCode::CONFLICT, "parameter_not_for_kind"),
            NotFound => (StatusCode::NOT_FOUND, "not_found"),
            QueueNotFound => (StatusCode::NOT_FOUND, "queue_not_found"),
            MessageNotFound => (StatusCode::NOT_FOUND, "message_not_found"),
            LeaseNotFound => (StatusCode::NOT_FOUND, "lease_not_found"),
            LeaseLost => (StatusCode::CONFLICT, "lease_lost"),
            InvalidName => (StatusCode::BAD_REQUEST, "invalid_name"),
            CounterNotFound => (StatusCode::NOT_FOUND, "counter_not_found"),
            CounterNotAnInt => (StatusCode::CONFLICT, "counter_not_an_int"),
            VersionMismatch => (StatusCode::PRECONDITION_FAILED, "version_mismatch"),
            VersionOverflow => (StatusCode::CONFLICT, "version_overflow"),
            Contention => (StatusCode::CONFLICT, "contention"),
            CounterOverflow => (StatusCode::CONFLICT, "counter_overflow"),
            IdempotencyKeyReused => (StatusCode::CONFLICT, "idempotency_key_reused"),
            UnsupportedMediaType => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            QueueFull => (StatusCode::TOO_MANY_REQUESTS, "queue_full"),
            TooManyLeases => (StatusCode::TOO_MANY_REQUESTS, "too_many_leases"),
            Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            ZookeeperUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "zookeeper_unavailable"),
            ZookeeperRefused => (StatusCode::BAD_GATEWAY, "zookeeper_refused"),
            OutcomeUnknown => (StatusCode::GATEWAY_TIMEOUT, "outcome_unknown"),
            ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            NotReady => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            CrossOriginRefused => (StatusCode::FORBIDDEN, "cross_origin_refused"),
            Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// An error on its way to becoming a response.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        let retry_after = match code {
            ErrorCode::QueueFull
            | ErrorCode::TooManyLeases
            | ErrorCode::Overloaded
            | ErrorCode::ZookeeperUnavailable
            | ErrorCode::ShuttingDown
            | ErrorCode::NotReady => Some(Duration::from_secs(1)),
            _ => None,
        };
        ApiError { code, message: message.into(), retry_after }
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::InvalidParameter, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.code.status_and_code();
        let mut response = (status, Json(ErrorBody { code: code.to_owned(), message: self.message })).into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs().max(1);
            if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

impl From<ZkError> for ApiError {
    fn from(err: ZkError) -> Self {
        match err {
            ZkError::Unavailable | ZkError::SessionLost => ApiError::new(
                ErrorCode::ZookeeperUnavailable,
                format!("{err}; retry after the Retry-After delay (check /readyz)"),
            ),
            ZkError::OutcomeUnknown => ApiError::new(
                ErrorCode::OutcomeUnknown,
                "the connection to ZooKeeper dropped before the result was known; the operation may or may not \
                 have been applied",
            ),
            ZkError::NotAuthorized => ApiError::new(
                ErrorCode::ZookeeperRefused,
                "ZooKeeper refused access to this path: its ACL does not allow zkq's session; configure \
                 the credentials it allows (zookeeper.auth_digest or zookeeper.sasl, from a Secret) or fix \
                 the node's ACL",
            ),
            ZkError::Rejected(why) => {
                ApiError::new(ErrorCode::ZookeeperRefused, format!("ZooKeeper refused the request: {why}"))
            },
            other => ApiError::new(ErrorCode::Internal, format!("unexpected ZooKeeper answer: {other}")),
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(err: QueueError) -> Self {
        let code = match &err {
            QueueError::InvalidName(_) => ErrorCode::InvalidQueueName,
            QueueError::UnknownQueue(_) | QueueError::NoSuchQueue(_) | QueueError::TooManyQueues(_) => {
                ErrorCode::QueueNotFound
            },
            QueueError::InvalidParameter(_) => ErrorCode::InvalidParameter,
            QueueError::NotForKind(_) => ErrorCode::ParameterNotForKind,
            QueueError::TooLarge { .. } | QueueError::TransactionTooLarge { .. } => ErrorCode::PayloadTooLarge,
            QueueError::Full { .. } => ErrorCode::QueueFull,
            QueueError::MessageNotFound(_) => ErrorCode::MessageNotFound,
            QueueError::LeaseLost(_) => ErrorCode::LeaseLost,
            QueueError::LeaseNotFound(_) => ErrorCode::LeaseNotFound,
            QueueError::TooManyLeases(_) => ErrorCode::TooManyLeases,
            QueueError::IdempotencyKeyReused(_) => ErrorCode::IdempotencyKeyReused,
            QueueError::ShuttingDown => ErrorCode::ShuttingDown,
            QueueError::Zk(zk) => return zk.clone().into(),
        };
        ApiError::new(code, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_errors_carry_retry_after_and_json() {
        let response = ApiError::new(ErrorCode::ZookeeperUnavailable, "down").into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let response = ApiError::invalid("nope").into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }
}
