//! One error shape for every HTTP error, and the one table from error kind to status.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::queue::{QueueError, StoreFailure};
use crate::web::{Answer, Dialect, Refusal, RefusalKind, closes_connection};

/// The body of every error response.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// Stable, machine-readable error code (see docs/reference/errors.md).
    #[schema(example = "invalid_queue_name")]
    pub code: String,
    /// What went wrong and what to do about it.
    pub message: String,
}

/// The answers of every endpoint that talks to ZooKeeper, besides its own.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code, reason = "a response table for the OpenAPI document, never built")]
pub(crate) enum ZookeeperErrors {
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

/// Declares [`ErrorCode`] from one table: each code's doc comment says when it is answered (the
/// error reference, `zkq reference errors`, prints it), then its variant, HTTP status and code.
macro_rules! error_codes {
    ($($(#[doc = $when:literal])+ $variant:ident => $status:ident, $code:literal;)+) => {
        /// Every kind of error the HTTP API reports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum ErrorCode {
            $($(#[doc = $when])+ $variant,)+
        }

        impl ErrorCode {
            /// Every code, in the order of the table.
            pub(crate) const ALL: &[ErrorCode] = &[$(ErrorCode::$variant),+];

            /// The table: error kind → HTTP status and stable code string.
            pub(crate) fn status_and_code(self) -> (StatusCode, &'static str) {
                match self {
                    $(ErrorCode::$variant => (StatusCode::$status, $code),)+
                }
            }

            /// When the code is answered: its doc comment, one line.
            pub(crate) fn when(self) -> String {
                let lines: &[&str] = match self {
                    $(ErrorCode::$variant => &[$($when),+],)+
                };
                lines.iter().map(|line| line.trim()).collect::<Vec<_>>().join(" ")
            }
        }
    };
}

error_codes! {
    /// A malformed request the other 400 codes do not name: a bad path segment, a body that
    /// cannot be read, a body that is not the JSON the endpoint takes.
    BadRequest => BAD_REQUEST, "bad_request";
    /// A queue name that is not 1–200 characters of `A-Z a-z 0-9 . _ -`, or is `.` or `..`.
    InvalidQueueName => BAD_REQUEST, "invalid_queue_name";
    /// A counter name that breaks the same rules as a queue name.
    InvalidName => BAD_REQUEST, "invalid_name";
    /// A malformed parameter: a bad duration or number, a delay beyond `api.max_delay`, an id or
    /// message id with a character ZooKeeper refuses in node names (U+0000–U+001F, U+007F–U+009F,
    /// U+D800–U+F8FF, U+FFF0 and above), an `Idempotency-Key` that is not 1–200 bytes of visible
    /// ASCII or is sent twice, a `format=curator-multi` batch whose messages differ in priority or
    /// delivery time or carry an `idempotency_key`.
    InvalidParameter => BAD_REQUEST, "invalid_parameter";
    /// zkq has an API token (`api.token_file`) and the request's `zkq-api-token` header is missing
    /// or wrong (every API-listener path but `/openapi.json` and `/docs`).
    Unauthorized => UNAUTHORIZED, "unauthorized";
    /// A web browser sent the request for a page of another origin (`Origin`, `Sec-Fetch-Site`),
    /// or to a host name that is not an address or `localhost` (DNS rebinding); see
    /// `api.refuse_cross_origin`.
    CrossOriginRefused => FORBIDDEN, "cross_origin_refused";
    /// An unknown route.
    NotFound => NOT_FOUND, "not_found";
    /// An undeclared queue with `queues_dynamic = false`, or a new dynamic queue beyond
    /// `max_dynamic_queues`; a read (info, peek, remove) of a dynamic queue whose node does not
    /// exist; a lease step on a queue this zkq does not have open.
    QueueNotFound => NOT_FOUND, "queue_not_found";
    /// No such message (remove by message id).
    MessageNotFound => NOT_FOUND, "message_not_found";
    /// A lease receipt that is malformed or that this zkq process never issued (forged, from
    /// another zkq, or from before a restart).
    LeaseNotFound => NOT_FOUND, "lease_not_found";
    /// No running message move task has the handle (or runs for the queue).
    MoveTaskNotFound => NOT_FOUND, "move_task_not_found";
    /// An undeclared counter with `counters_dynamic = false`; a read of a dynamic counter whose
    /// node does not exist.
    CounterNotFound => NOT_FOUND, "counter_not_found";
    /// The wrong method for the route.
    MethodNotAllowed => METHOD_NOT_ALLOWED, "method_not_allowed";
    /// A parameter that does not fit the queue's kind: `priority` on a fifo queue, an id queue
    /// without `id`, a lease on a queue without a lock path, `format=curator-multi` on an id or
    /// simple queue.
    ParameterNotForKind => CONFLICT, "parameter_not_for_kind";
    /// A put's `Idempotency-Key` (or a batch message's `idempotency_key`) was used within the
    /// queue's idempotency window for a different body, `priority` or `id`; nothing was stored
    /// (for a batch: none of its messages; the message names which).
    IdempotencyKeyReused => CONFLICT, "idempotency_key_reused";
    /// The lease is no longer held: it expired or its session was lost (nothing changed; the
    /// message is, or will be, delivered again), or another step already ended it (an ack or a
    /// nack; retrying the step that ended it answers as that step did).
    LeaseLost => CONFLICT, "lease_lost";
    /// A message move task is already running for the queue (on this zkq or another).
    MoveTaskRunning => CONFLICT, "move_task_running";
    /// A delete of a queue declared in the configuration (remove it there; purge empties it).
    QueueDeclared => CONFLICT, "queue_declared";
    /// The counter node is not a 4-byte int; it is left untouched.
    CounterNotAnInt => CONFLICT, "counter_not_an_int";
    /// A compare-and-set against version -1, which ZooKeeper reads as "any version"; refused, as
    /// Curator does.
    VersionOverflow => CONFLICT, "version_overflow";
    /// An add or unconditional set that lost every retry to concurrent writers.
    Contention => CONFLICT, "contention";
    /// An add whose sum does not fit a 32-bit int; nothing written.
    CounterOverflow => CONFLICT, "counter_overflow";
    /// `If-Match` names a stale version; the body carries the current `value` and `version`.
    VersionMismatch => PRECONDITION_FAILED, "version_mismatch";
    /// A body over `api.max_message_bytes` (answered before the upload when `Content-Length` says
    /// so, also to `Expect: 100-continue`); a batch put whose bodies pass `api.max_batch_bytes`
    /// together, or whose JSON passes that limit in base64 plus 1 KiB per message; a batch, or a
    /// put with an `Idempotency-Key`, whose messages with their idempotency records would make a
    /// transaction over ZooKeeper's request limit, `zookeeper.jute_maxbuffer` less 4 KiB encoded
    /// (every create carries the node ACL, so a long `zookeeper.acl` counts too; for one put, with
    /// `api.max_message_bytes` within its bound, only with a very long ACL or root). Nothing is sent.
    PayloadTooLarge => PAYLOAD_TOO_LARGE, "payload_too_large";
    /// The request body did not arrive within `api.body_read_timeout` of the request's headers
    /// (a client that stalls or trickles its upload); nothing was done, and the connection is
    /// closed.
    RequestTimeout => REQUEST_TIMEOUT, "request_timeout";
    /// A counter body that is not `application/json`.
    UnsupportedMediaType => UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type";
    /// The queue stayed at `max_items` for longer than the put's `?wait=`; with `Retry-After`.
    QueueFull => TOO_MANY_REQUESTS, "queue_full";
    /// A lease on a queue that has `lease.max_per_queue` leases out; with `Retry-After`.
    TooManyLeases => TOO_MANY_REQUESTS, "too_many_leases";
    /// A bug: please report it.
    Internal => INTERNAL_SERVER_ERROR, "internal";
    /// ZooKeeper refused the request: the node's ACL does not allow zkq's session (configure the
    /// credentials it allows: `zookeeper.auth_digest` or `zookeeper.sasl`), or a quota. A take or
    /// lease on a queue zkq may not read answers it at once, not after its wait.
    ZookeeperRefused => BAD_GATEWAY, "zookeeper_refused";
    /// No connected ZooKeeper session before the request's deadline; with `Retry-After`. A take
    /// or lease answers this, never 204, when zkq cannot know the queue is empty.
    ZookeeperUnavailable => SERVICE_UNAVAILABLE, "zookeeper_unavailable";
    /// zkq is draining after SIGTERM or SIGINT; with `Retry-After`.
    ShuttingDown => SERVICE_UNAVAILABLE, "shutting_down";
    /// `/readyz` while not ready; its message ends with why the last attempt to open a session
    /// failed (a TLS handshake, refused credentials, no answer).
    NotReady => SERVICE_UNAVAILABLE, "not_ready";
    /// More than `api.max_concurrent_requests` requests at once; with `Retry-After`.
    Overloaded => SERVICE_UNAVAILABLE, "overloaded";
    /// The connection dropped after a write was sent and ZooKeeper could not be asked in time
    /// whether it applied; for a put with an `Idempotency-Key`, also when its message was stored
    /// but its name could not be written into the key's record in time. Never for a read that
    /// was lost: that is 503. See the guarantees before retrying a put.
    OutcomeUnknown => GATEWAY_TIMEOUT, "outcome_unknown";
}

/// The error reference page (`docs/reference/errors.md`), as `zkq reference errors` prints it.
pub(crate) fn errors_markdown() -> String {
    let mut page = String::from(
        "# Error codes\n\n\
         <!-- Generated by `zkq reference errors` from src/http/error.rs; do not edit. -->\n\n\
         Every error zkq answers is JSON `{\"code\": \"...\", \"message\": \"...\"}`; the `code` is stable, the \
         `message` says what went wrong and what to do. 429 and 503 carry `Retry-After`. The exceptions are \
         answered by the HTTP/1 parser before zkq sees a request, with an empty body: a malformed request line \
         or header (400), headers too large (431), and connections closed without an answer (a request head \
         not complete `header_read_timeout` after its first byte, or nothing sent for `idle_timeout`).\n\n\
         | status | code | when |\n| --- | --- | --- |\n",
    );
    for code in ErrorCode::ALL {
        let (status, name) = code.status_and_code();
        let when = code.when().replace('|', "\\|");
        page.push_str(&format!("| {} | `{name}` | {when} |\n", status.as_u16()));
    }
    page
}

/// An error on its way to becoming a response.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
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

    pub(crate) fn invalid(message: impl Into<String>) -> ApiError {
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
        // A body too large or too slow is left unread: see `closes_connection`.
        if matches!(self.code, ErrorCode::PayloadTooLarge | ErrorCode::RequestTimeout) {
            closes_connection(&mut response);
        }
        response
    }
}

/// zkq's own shape of a refusal: its error code, and the message as the guard wrote it.
impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        let code = match refusal.kind {
            RefusalKind::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            RefusalKind::Overloaded => ErrorCode::Overloaded,
            RefusalKind::TimedOut => ErrorCode::RequestTimeout,
            RefusalKind::Unauthorized => ErrorCode::Unauthorized,
            RefusalKind::CrossOrigin => ErrorCode::CrossOriginRefused,
            RefusalKind::Panic => ErrorCode::Internal,
        };
        ApiError::new(code, refusal.message)
    }
}

/// The dialect of the API and the admin listener: the guard's refusals as [`ApiError`]s.
pub(super) struct Native;

impl Dialect for Native {
    fn asked(&self, _headers: &axum::http::HeaderMap, _uri: &axum::http::Uri) -> Box<dyn Answer> {
        Box::new(Native)
    }
}

impl Answer for Native {
    fn refused(&self, _request_id: &str, refusal: Refusal) -> Response {
        ApiError::from(refusal).into_response()
    }
}

/// A ZooKeeper failure, in the API's codes.
fn store_error(failure: StoreFailure, err: &QueueError) -> ApiError {
    match failure {
        StoreFailure::Unavailable => ApiError::new(
            ErrorCode::ZookeeperUnavailable,
            format!("{err}; retry after the Retry-After delay (check /readyz)"),
        ),
        StoreFailure::OutcomeUnknown => ApiError::new(
            ErrorCode::OutcomeUnknown,
            "the connection to ZooKeeper dropped before the result was known; the operation may or may not \
             have been applied",
        ),
        StoreFailure::NotAuthorized => ApiError::new(
            ErrorCode::ZookeeperRefused,
            "ZooKeeper refused access to this path: its ACL does not allow zkq's session; configure \
             the credentials it allows (zookeeper.auth_digest or zookeeper.sasl, from a Secret) or fix \
             the node's ACL",
        ),
        StoreFailure::Rejected => ApiError::new(ErrorCode::ZookeeperRefused, err.to_string()),
        // The request is too large once it is a ZooKeeper transaction (the node ACL counts too).
        StoreFailure::TooLarge => ApiError::new(ErrorCode::PayloadTooLarge, err.to_string()),
        StoreFailure::Unexpected => ApiError::new(ErrorCode::Internal, format!("unexpected ZooKeeper answer: {err}")),
    }
}

impl From<QueueError> for ApiError {
    fn from(err: QueueError) -> Self {
        let code = match &err {
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
            QueueError::Declared(_) => ErrorCode::QueueDeclared,
            QueueError::ShuttingDown => ErrorCode::ShuttingDown,
            QueueError::Zk(_) => return store_error(err.store_failure().unwrap_or(StoreFailure::Unexpected), &err),
        };
        ApiError::new(code, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_has_its_own_code_and_keeps_the_guards_message() {
        let table = [
            (RefusalKind::TooLarge { limit: 10 }, ErrorCode::PayloadTooLarge, 413),
            (RefusalKind::Overloaded, ErrorCode::Overloaded, 503),
            (RefusalKind::TimedOut, ErrorCode::RequestTimeout, 408),
            (RefusalKind::Unauthorized, ErrorCode::Unauthorized, 401),
            (RefusalKind::CrossOrigin, ErrorCode::CrossOriginRefused, 403),
            (RefusalKind::Panic, ErrorCode::Internal, 500),
        ];
        for (kind, code, status) in table {
            let own = ApiError::from(Refusal::new(kind, "why"));
            assert_eq!((own.code, own.message.as_str()), (code, "why"), "{kind:?}");
            let answer = Native.refused("id", Refusal::new(kind, "why"));
            assert_eq!(answer.status().as_u16(), status, "{kind:?}");
        }
    }

    #[test]
    fn each_zookeeper_failure_has_its_code() {
        let table = [
            (StoreFailure::Unavailable, ErrorCode::ZookeeperUnavailable),
            (StoreFailure::OutcomeUnknown, ErrorCode::OutcomeUnknown),
            (StoreFailure::NotAuthorized, ErrorCode::ZookeeperRefused),
            (StoreFailure::Rejected, ErrorCode::ZookeeperRefused),
            (StoreFailure::TooLarge, ErrorCode::PayloadTooLarge),
            (StoreFailure::Unexpected, ErrorCode::Internal),
        ];
        for (failure, code) in table {
            assert_eq!(store_error(failure, &QueueError::ShuttingDown).code, code, "{failure:?}");
        }
    }

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
