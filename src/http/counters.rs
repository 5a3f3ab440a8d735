//! `/v1/counters`: shared counters compatible with Curator's `SharedCount`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody, ErrorCode, ZookeeperErrors};
use super::extract::{ApiJson, ApiPath, ApiQuery, bounded_duration};
use super::state::AppState;
use crate::counter::{CounterError, Versioned};
use crate::types::CounterName;

/// Path parameter: a counter name.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct CounterPath {
    /// 1–200 characters of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    #[param(value_type = String)]
    pub name: CounterName,
}

/// Query parameters of a read.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReadQuery {
    /// Long-poll: wait up to this long (cut to `take.max_wait`) for a version newer than
    /// `after_version`. A waiting long-poll answers 503 `shutting_down` when zkq starts to drain.
    pub wait: Option<String>,
    /// The version the client already has (its ETag). An older version (from a ZooKeeper server
    /// that lags) is answered only once a `sync` confirms it; otherwise 503.
    pub after_version: Option<i32>,
}

/// A counter's value.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct CounterValue {
    pub name: String,
    pub value: i32,
    /// The node's data version (also the ETag).
    pub version: i32,
}

/// A compare-and-set that lost: the current value and version.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct CounterConflict {
    /// `version_mismatch`.
    pub code: String,
    pub message: String,
    pub value: i32,
    pub version: i32,
}

/// Body of a set.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SetRequest {
    #[serde(deserialize_with = "json_int32")]
    pub value: i32,
}

/// Body of an add.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddRequest {
    #[serde(deserialize_with = "json_int32")]
    pub delta: i32,
}

/// An int32 as JSON Schema sees integers: `3` and `3.0` both, nothing fractional or out of range.
fn json_int32<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    let whole =
        number.as_i64().or_else(|| number.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e18).map(|f| f as i64));
    whole
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| serde::de::Error::custom(format!("{number} is not a 32-bit integer")))
}

fn counter_response(state: &AppState, name: &str, current: Versioned) -> Response {
    let mut headers = HeaderMap::new();
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", current.version)) {
        headers.insert(header::ETAG, etag);
    }
    let _ = state;
    (headers, Json(CounterValue { name: name.to_owned(), value: current.value, version: current.version }))
        .into_response()
}

fn counter_error(err: CounterError) -> Response {
    match err {
        CounterError::VersionMismatch(current) => {
            let body = CounterConflict {
                code: "version_mismatch".to_owned(),
                message: "the counter changed since that version; retry with the current ETag".to_owned(),
                value: current.value,
                version: current.version,
            };
            let mut response = (StatusCode::PRECONDITION_FAILED, Json(body)).into_response();
            if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", current.version)) {
                response.headers_mut().insert(header::ETAG, etag);
            }
            response
        },
        other => ApiError::from(other).into_response(),
    }
}

impl From<CounterError> for ApiError {
    fn from(err: CounterError) -> Self {
        let code = match &err {
            CounterError::UnknownCounter(_) | CounterError::NoSuchCounter(_) | CounterError::TooManyCounters(_) => {
                ErrorCode::CounterNotFound
            },
            CounterError::NotAnInt { .. } => ErrorCode::CounterNotAnInt,
            CounterError::VersionMismatch(_) => ErrorCode::VersionMismatch,
            CounterError::VersionOverflow => ErrorCode::VersionOverflow,
            CounterError::Contention => ErrorCode::Contention,
            CounterError::Overflow { .. } => ErrorCode::CounterOverflow,
            CounterError::ShuttingDown => ErrorCode::ShuttingDown,
            CounterError::Zk(zk) => return crate::queue::QueueError::Zk(zk.clone()).into(),
        };
        ApiError::new(code, err.to_string())
    }
}

/// Parses `If-Match: "7"` (or `7`); `*` means no condition.
fn if_match(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else { return Ok(None) };
    let text = value.to_str().map_err(|_| ApiError::invalid("If-Match must be an ETag such as \"7\""))?.trim();
    if text == "*" {
        return Ok(None);
    }
    let bare = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(text);
    bare.parse::<i64>()
        .map(Some)
        .map_err(|_| ApiError::invalid(format!("If-Match {text:?} is not a counter ETag such as \"7\"")))
}

/// Read a counter (optionally long-polling for a change).
#[utoipa::path(
    get, path = "/v1/counters/{name}", tag = "counters",
    params(CounterPath, ReadQuery),
    responses(
        (status = 200, description = "The value and version", body = CounterValue, headers(("ETag" = String, description = "The version, quoted"))),
        (status = 400, description = "Bad name or parameter", body = ErrorBody),
        (status = 404, description = "Unknown counter: not declared and no such node (reads create nothing), or dynamic counters disabled", body = ErrorBody),
        (status = 409, description = "The node is not a 4-byte int", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn get_counter(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CounterPath>,
    ApiQuery(query): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let counter = state.door.counters().existing(&path.name).await?;
    let wait = bounded_duration("wait", query.wait.as_deref(), state.config.take.max_wait)?;
    let current = counter.fetch(query.after_version, wait).await?;
    Ok(counter_response(&state, &counter.name, current))
}

/// Set a counter; with `If-Match` it is a compare-and-set.
#[utoipa::path(
    put, path = "/v1/counters/{name}", tag = "counters",
    params(CounterPath, ("If-Match" = Option<String>, Header, nullable = false, pattern = r#"^(\*|"-?[0-9]{1,10}"|-?[0-9]{1,10})$"#, description = "Expected version (an ETag such as \"7\"): compare-and-set")),
    request_body = SetRequest,
    responses(
        (status = 200, description = "The new value and version", body = CounterValue, headers(("ETag" = String, description = "The version, quoted"))),
        (status = 400, description = "Bad name, body or If-Match", body = ErrorBody),
        (status = 404, description = "Unknown counter", body = ErrorBody),
        (status = 409, description = "Version overflowed to -1, the node is not a 4-byte int, or (without If-Match) concurrent writers won every retry", body = ErrorBody),
        (status = 412, description = "Someone changed it first: the current value and version", body = CounterConflict),
        (status = 408, description = "The body did not arrive within api.body_read_timeout of the headers (`request_timeout`); nothing was done", body = ErrorBody),
        (status = 415, description = "The body is not JSON", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn set_counter(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CounterPath>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<SetRequest>,
) -> Result<Response, ApiError> {
    let counter = state.door.counters().open(&path.name)?;
    let expected = if_match(&headers)?;
    Ok(match counter.write(expected, body.value).await {
        Ok(current) => counter_response(&state, &counter.name, current),
        Err(err) => counter_error(err),
    })
}

/// Add to a counter atomically.
#[utoipa::path(
    post, path = "/v1/counters/{name}/add", tag = "counters",
    params(CounterPath),
    request_body = AddRequest,
    responses(
        (status = 200, description = "The new value and version", body = CounterValue, headers(("ETag" = String, description = "The version, quoted"))),
        (status = 400, description = "Bad name or body", body = ErrorBody),
        (status = 404, description = "Unknown counter", body = ErrorBody),
        (status = 409, description = "Contention exhausted the retries, the sum does not fit a 32-bit int (`counter_overflow`), version overflow, or not a 4-byte int", body = ErrorBody),
        (status = 408, description = "The body did not arrive within api.body_read_timeout of the headers (`request_timeout`); nothing was done", body = ErrorBody),
        (status = 415, description = "The body is not JSON", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn add_to_counter(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CounterPath>,
    ApiJson(body): ApiJson<AddRequest>,
) -> Result<Response, ApiError> {
    let counter = state.door.counters().open(&path.name)?;
    let current = counter.add(body.delta).await?;
    Ok(counter_response(&state, &counter.name, current))
}
