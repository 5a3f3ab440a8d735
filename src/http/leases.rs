//! `/v1/queues/{queue}/leases`: lock-path safe consumption (lease, ack, nack, extend).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody, ZookeeperErrors};
use super::extract::{ApiPath, ApiQuery, bounded_duration, parse_duration};
use super::state::AppState;
use super::wire::{NackModeParam, QueuePath, check_max, delivered, message_response, receipt_of};
use crate::queue::Purpose;
use crate::queue::{NackMode, Queue};
use crate::types::QueueName;
use crate::web::headers::{HEADER_DELIVERY_COUNT, HEADER_FENCING_TOKEN, HEADER_LEASE, HEADER_LEASE_EXPIRES_AT};

/// Path parameters: a queue and a lease receipt.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct LeasePath {
    #[param(value_type = String)]
    pub queue: QueueName,
    /// The `zkq-lease` header of the lease response.
    #[param(min_length = 1, max_length = 200)]
    pub lease: String,
}

/// Query parameters of a lease.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct LeaseQuery {
    /// How long to wait for a message (default 0; longer values are cut to `take.max_wait`).
    pub wait: Option<String>,
    /// Visibility timeout: unless acked, nacked or extended by then, the message is delivered
    /// again (default `lease.default_visibility`, cut to 1s..`lease.max_visibility`).
    pub visibility: Option<String>,
    /// Lease up to this many messages (1 to `api.max_batch`) and answer them as JSON, each with
    /// its receipt: `wait` applies to the first, the rest are whatever is there at once.
    pub max: Option<u32>,
}

/// Query parameters of a nack.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct NackQuery {
    /// `requeue` (the default; `keep` on a grouped queue), `delete` or `keep`. A grouped message
    /// refuses `requeue` (409 `parameter_not_for_kind`): it keeps its place at the head of its group.
    pub mode: Option<NackModeParam>,
    /// Postpone the next delivery by this long (requeue and keep).
    pub delay: Option<String>,
}

/// Query parameters of an extend.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ExtendQuery {
    /// New visibility from now (default `lease.default_visibility`, cut to 1s..`lease.max_visibility`).
    pub visibility: Option<String>,
}

/// Answer to an extend.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct ExtendResponse {
    pub lease: String,
    /// New expiry, epoch milliseconds.
    pub expires_at: i64,
}

fn visibility(state: &AppState, queue: &Queue, asked: Option<Duration>) -> Duration {
    let lease = &state.config.lease;
    // Unsaid, the queue's own (a dynamic queue's settings), else the configured default.
    let asked = asked
        .unwrap_or_else(|| queue.settings().visibility_seconds.map_or(lease.default_visibility, Duration::from_secs));
    asked.clamp(Duration::from_secs(1), lease.max_visibility)
}

/// A `visibility` parameter, parsed once where it enters.
fn asked_visibility(text: Option<&str>) -> Result<Option<Duration>, ApiError> {
    text.map(|text| parse_duration("visibility", text)).transpose()
}

/// Lease the head message: it stays in ZooKeeper, locked, until acked, nacked or expired.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/leases", tag = "leases",
    params(QueuePath, LeaseQuery),
    responses(
        (status = 200, description = "The message body, raw, under a lease; with `max`, JSON with up to `max` leased messages (base64 bodies, each with its receipt)",
            content((Vec<u8> = "application/octet-stream"), (super::wire::DeliveredMessages = "application/json")),
            headers(
                ("zkq-message-id" = String, description = "Node name of the message"),
                ("zkq-lease" = String, description = "Receipt for ack, nack and extend"),
                ("zkq-lease-expires-at" = i64, description = "Expiry, epoch ms"),
                ("zkq-delivery-count" = u32, description = "How many times this message was leased, this time included"),
                ("zkq-fencing-token" = u64, description = "Fencing token: every later lease of any message carries a larger one (pass it to your own store)"),
                ("zkq-priority" = i32, description = "Priority queues"),
                ("zkq-deliver-at" = i64, description = "Delay queues: epoch ms"),
                ("zkq-id" = String, description = "Id queues"),
                ("zkq-attributes" = String, description = "The message's attributes, when it has any: a JSON object by name of {type, value} (ASCII, other characters as \\u escapes)"),
                ("traceparent" = String, description = "The W3C trace context its put carried, if any"),
            )),
        (status = 204, description = "No message arrived within `wait` (also for a dynamic queue whose node does not exist yet: nothing is created)"),
        (status = 400, description = "Bad queue name or parameter", body = ErrorBody),
        (status = 404, description = "Undeclared queue with dynamic queues disabled", body = ErrorBody),
        (status = 409, description = "The queue has no lock path (simple queues)", body = ErrorBody),
        (status = 429, description = "The queue has `lease.max_per_queue` leases out (`too_many_leases`)", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait before retrying"))),
        ZookeeperErrors,
    )
)]
pub(crate) async fn lease_message(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
    ApiQuery(query): ApiQuery<LeaseQuery>,
) -> Result<Response, ApiError> {
    let wait = bounded_duration("wait", query.wait.as_deref(), state.config.take.max_wait)?;
    let asked = asked_visibility(query.visibility.as_deref())?;
    let max = query.max.map(|max| check_max(&state, max)).transpose()?;
    let wait_until = Instant::now() + wait;
    // As a take: a dynamic queue that does not exist yet is empty; nothing is created.
    let Some(queue) = state.door.queues().queue_to_take(&path.queue, wait).await? else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let visibility = visibility(&state, &queue, asked);
    let wait = wait_until.saturating_duration_since(Instant::now());
    if let Some(max) = max {
        let leased = queue
            .lease_many(wait, visibility, (max, state.config.api.max_batch_bytes), crate::queue::PerGroup::One)
            .await?;
        return Ok(delivered(leased.into_iter().map(|(m, grant)| (m, Some(grant))).collect()));
    }
    match queue.lease(wait, visibility).await? {
        Some((message, grant)) => {
            let mut response = message_response(message);
            let headers = response.headers_mut();
            for (name, value) in [
                (HEADER_LEASE, grant.receipt.to_string()),
                (HEADER_LEASE_EXPIRES_AT, grant.expires_at_ms.to_string()),
                (HEADER_DELIVERY_COUNT, grant.delivery_count.to_string()),
                (HEADER_FENCING_TOKEN, grant.fencing_token.to_string()),
            ] {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(name, value);
                }
            }
            Ok(response)
        },
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// Ack: the message is done; it is removed with its lock.
#[utoipa::path(
    delete, path = "/v1/queues/{queue}/leases/{lease}", tag = "leases",
    params(LeasePath),
    responses(
        (status = 204, description = "Acknowledged and removed; also the answer to a repeated ack of a lease this ack ended (a retry after a lost answer)"),
        (status = 400, description = "Bad queue name", body = ErrorBody),
        (status = 404, description = "Malformed or unknown receipt, or a queue this zkq does not have open (`queue_not_found`)", body = ErrorBody),
        (status = 409, description = "The lease is no longer held (lease_lost); nothing changed", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn ack(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<LeasePath>,
) -> Result<StatusCode, ApiError> {
    let queue = state.door.queues().queue(&path.queue, Purpose::Step).await?;
    queue.ack(receipt_of(&path.lease)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Nack: the consumer failed; requeue (default), delete or keep the message.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/leases/{lease}/nack", tag = "leases",
    params(LeasePath, NackQuery),
    responses(
        (status = 204, description = "Done; also the answer to a repeated identical nack of a lease it ended"),
        (status = 400, description = "Bad queue name or parameter", body = ErrorBody),
        (status = 404, description = "Malformed or unknown receipt, or a queue this zkq does not have open (`queue_not_found`)", body = ErrorBody),
        (status = 409, description = "The lease is no longer held (lease_lost); nothing changed", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn nack(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<LeasePath>,
    ApiQuery(query): ApiQuery<NackQuery>,
) -> Result<StatusCode, ApiError> {
    let queue = state.door.queues().queue(&path.queue, Purpose::Step).await?;
    let mode = query.mode.map_or_else(|| queue.default_nack_mode(), NackMode::from);
    let delay = bounded_duration("delay", query.delay.as_deref(), state.config.lease.max_visibility)?;
    queue.nack(receipt_of(&path.lease)?, mode, delay).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Extend: a heartbeat that moves the lease's expiry.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/leases/{lease}/extend", tag = "leases",
    params(LeasePath, ExtendQuery),
    responses(
        (status = 200, description = "The new expiry", body = ExtendResponse),
        (status = 400, description = "Bad queue name or parameter", body = ErrorBody),
        (status = 404, description = "Malformed or unknown receipt, or a queue this zkq does not have open (`queue_not_found`)", body = ErrorBody),
        (status = 409, description = "The lease is no longer held (lease_lost)", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn extend(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<LeasePath>,
    ApiQuery(query): ApiQuery<ExtendQuery>,
) -> Result<Json<ExtendResponse>, ApiError> {
    let asked = asked_visibility(query.visibility.as_deref())?;
    let queue = state.door.queues().queue(&path.queue, Purpose::Step).await?;
    let visibility = visibility(&state, &queue, asked);
    let expires_at = queue.extend(receipt_of(&path.lease)?, visibility).await?;
    Ok(Json(ExtendResponse { lease: path.lease, expires_at }))
}
