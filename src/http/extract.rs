//! Extractors whose rejections use the API's JSON error shape.

use std::time::Duration;

use axum::Json;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorCode};
use crate::web::body;

/// `Query<T>` with JSON errors.
pub(crate) struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(|e: QueryRejection| ApiError::invalid(format!("bad query string: {}", e.body_text())))
    }
}

/// `Path<T>` with JSON errors. A `{queue}` segment that is not a queue name answers 400
/// `invalid_queue_name`, a counter's `{name}` that is not a counter name 400 `invalid_name`
/// (`QueueName` and `CounterName` refuse it as they are read, so axum says which segment);
/// any other bad segment 400 `bad_request`.
pub(crate) struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state).await.map(|Path(v)| ApiPath(v)).map_err(path_rejection)
    }
}

fn path_rejection(rejection: PathRejection) -> ApiError {
    if let PathRejection::FailedToDeserializePathParams(failed) = &rejection
        && let ErrorKind::DeserializeError { key, message, .. } = failed.kind()
    {
        // The routes' names for a queue and a counter: `/v1/queues/{queue}`, `/v1/counters/{name}`.
        match key.as_str() {
            "queue" => return ApiError::new(ErrorCode::InvalidQueueName, message.clone()),
            "name" => return ApiError::new(ErrorCode::InvalidName, message.clone()),
            _ => {},
        }
    }
    ApiError::new(ErrorCode::BadRequest, format!("bad path: {}", rejection.body_text()))
}

/// The raw request body, with JSON errors (413 when over the limit).
pub(crate) struct ApiBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(req, state).await.map(ApiBody).map_err(|e: BytesRejection| {
            if body::timed_out(&e) {
                body_timed_out()
            } else if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorCode::PayloadTooLarge, "message body is larger than api.max_message_bytes")
            } else {
                ApiError::new(ErrorCode::BadRequest, format!("cannot read the body: {}", e.body_text()))
            }
        })
    }
}

/// A JSON object body as `T`, with JSON errors: 415 without a JSON content type, 400 for bad
/// JSON and for anything but an object (serde would read `[1]` as a struct's fields in order).
pub(crate) struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<serde_json::Value>::from_request(req, state).await.map_err(json_rejection)?;
        if !value.is_object() {
            return Err(ApiError::new(ErrorCode::BadRequest, "bad JSON body: expected a JSON object"));
        }
        serde_json::from_value(value)
            .map(ApiJson)
            .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("bad JSON body: {e}")))
    }
}

fn json_rejection(e: JsonRejection) -> ApiError {
    match e {
        JsonRejection::MissingJsonContentType(_) => {
            ApiError::new(ErrorCode::UnsupportedMediaType, "send the body as JSON with Content-Type: application/json")
        },
        other if body::timed_out(&other) => body_timed_out(),
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::new(ErrorCode::PayloadTooLarge, "body is larger than api.max_message_bytes")
        },
        other => ApiError::new(ErrorCode::BadRequest, format!("bad JSON body: {}", other.body_text())),
    }
}

fn body_timed_out() -> ApiError {
    ApiError::new(
        ErrorCode::RequestTimeout,
        "the request body did not arrive within api.body_read_timeout of its headers; nothing was done",
    )
}

/// A body field that may be left out but is not `null` when given (`#[serde(default,
/// deserialize_with = "not_null")]`): the document states it as its type alone, and `null` answers
/// 400 as any other value of the wrong type.
pub(super) fn not_null<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// The durations [`parse_duration`] accepts, as an ECMA-262 pattern (for the OpenAPI document).
pub(super) const DURATION_PATTERN: &str = r"^([0-9]+|([0-9]+(ms|s|m|h))+)$";

/// An optional duration parameter (absent = zero), cut to `max` (documented in the spec).
pub(super) fn bounded_duration(name: &str, text: Option<&str>, max: Duration) -> Result<Duration, ApiError> {
    let Some(text) = text else { return Ok(Duration::ZERO) };
    Ok(parse_duration(name, text)?.min(max))
}

/// Parses a duration parameter exactly as the spec's pattern `^([0-9]+|([0-9]+(ms|s|m|h))+)$`
/// allows: bare seconds, or number-unit pairs such as `20s`, `500ms`, `1m30s`. Saturates
/// instead of overflowing, so every value the spec allows is accepted.
pub(super) fn parse_duration(name: &str, text: &str) -> Result<Duration, ApiError> {
    let bad = || ApiError::invalid(format!("`{name}` = {text:?} is not a duration; write it like 20s, 500ms or 2m"));
    if text.is_empty() {
        return Err(bad());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let value: u64 = rest[..digits].parse().unwrap_or(u64::MAX);
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total = total.saturating_add(Duration::from_millis(value.saturating_mul(unit_ms)));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::test_support::proptest_config())]

        #[test]
        fn parsing_any_text_never_panics(text in proptest::prelude::any::<String>(), units in "[0-9msh]{0,24}") {
            let _ = parse_duration("d", &text);
            let _ = parse_duration("d", &units);
        }

        #[test]
        fn durations_round_trip(h in 0u64..1000, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let expected = Duration::from_millis(((h * 60 + m) * 60 + s) * 1000 + ms);
            proptest::prop_assert_eq!(parse_duration("d", &text).ok(), Some(expected));
            proptest::prop_assert_eq!(parse_duration("d", &expected.as_secs().to_string()).ok(), Some(Duration::from_secs(expected.as_secs())));
        }
    }

    #[test]
    fn durations_follow_the_documented_pattern() {
        assert_eq!(parse_duration("w", "20").ok(), Some(Duration::from_secs(20)));
        assert_eq!(parse_duration("w", "500ms").ok(), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("w", "1m30s").ok(), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("w", "2h").ok(), Some(Duration::from_secs(7200)));
        assert!(parse_duration("w", "99999999999999999999999h").is_ok(), "saturates");
        for bad in ["", "s", "1d", "1 s", "-1s", "1.5s", "soon"] {
            assert!(parse_duration("w", bad).is_err(), "{bad:?} must be refused");
        }
    }

    /// The status, code and message a router with the API's path types answers to `uri`.
    async fn path_answer(method: &str, uri: &str) -> (StatusCode, String, String) {
        use axum::routing::{get, post};
        use http_body_util::BodyExt;

        use crate::http::counters::CounterPath;
        use crate::http::leases::LeasePath;
        use crate::http::wire::QueuePath;

        let router = axum::Router::new()
            .route("/v1/queues/{queue}", get(|ApiPath(path): ApiPath<QueuePath>| async move { path.queue.to_string() }))
            .route(
                "/v1/queues/{queue}/leases/{lease}",
                post(|ApiPath(path): ApiPath<LeasePath>| async move { format!("{} {}", path.queue, path.lease) }),
            )
            .route(
                "/v1/counters/{name}",
                get(|ApiPath(path): ApiPath<CounterPath>| async move { path.name.to_string() }),
            );
        let request = Request::builder().method(method).uri(uri).body(axum::body::Body::empty()).expect("a request");
        let response = tower::ServiceExt::oneshot(router, request).await.expect("infallible");
        let status = response.status();
        let body = response.into_body().collect().await.expect("a body").to_bytes();
        let Ok(error) = serde_json::from_slice::<super::super::error::ErrorBody>(&body) else {
            return (status, String::new(), String::from_utf8_lossy(&body).into_owned());
        };
        (status, error.code, error.message)
    }

    #[tokio::test]
    async fn a_bad_name_in_the_path_answers_as_a_refused_name() {
        let refused = |code: &str, message: &str| (StatusCode::BAD_REQUEST, code.to_owned(), message.to_owned());
        assert_eq!(
            path_answer("GET", "/v1/queues/a%20b").await,
            refused("invalid_queue_name", r#"queue name "a b" may contain only A-Z a-z 0-9 . _ -"#)
        );
        assert_eq!(
            path_answer("POST", "/v1/queues/%2E%2E/leases/r1").await,
            refused("invalid_queue_name", r#"queue name ".." must not be . or .."#)
        );
        assert_eq!(
            path_answer("GET", &format!("/v1/counters/{}", "x".repeat(201))).await,
            refused("invalid_name", &format!("counter name {:?} must be 1 to 200 characters", "x".repeat(201)))
        );
        // Valid names pass, typed.
        assert_eq!(
            path_answer("GET", "/v1/queues/orders.v2").await,
            (StatusCode::OK, String::new(), "orders.v2".into())
        );
        assert_eq!(path_answer("POST", "/v1/queues/q/leases/r1").await, (StatusCode::OK, String::new(), "q r1".into()));
        assert_eq!(path_answer("GET", "/v1/counters/hits").await, (StatusCode::OK, String::new(), "hits".into()));
        // A segment that is not UTF-8 is no name at all: a malformed path.
        let (status, code, _) = path_answer("GET", "/v1/queues/%FF").await;
        assert_eq!((status, code.as_str()), (StatusCode::BAD_REQUEST, "bad_request"));
    }
}
