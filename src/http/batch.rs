//! Many messages per HTTP request: batch put, `?max=` answers of take and lease, batch ack.
//!
//! Bodies travel as JSON: `text` (UTF-8, easy from curl) or `body` (standard base64, any bytes)
//! on the way in, always `body` (base64) on the way out.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody, ErrorCode, ZookeeperErrors};
use super::extract::{ApiJson, ApiPath, ApiQuery, bounded_duration, not_null};
use super::state::AppState;
use super::wire::{KindFields, NackModeParam, QueuePath, put_options_at, receipt_of};
use crate::queue::Purpose;
use crate::queue::{NackMode, PutOptions, QueueError};
use crate::web::headers::HEADER_IDEMPOTENT_REPLAY;

/// The route of a batch put (its body limit is larger than a single put's).
pub(crate) const BATCH_PUT_ROUTE: &str = "/v1/queues/{queue}/batch";

/// A batch message's `body` as [`put_batch`] decodes it, as an ECMA-262 pattern (for the OpenAPI
/// document): standard base64 with its padding (no stray bits in the
/// last character).
pub(super) const BODY_PATTERN: &str =
    r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";

/// One message of a batch put.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchMessage {
    /// The body as UTF-8 text. Exactly one of `text` and `body`.
    #[serde(default, deserialize_with = "not_null")]
    pub text: Option<String>,
    /// The body as standard base64 (any bytes). Exactly one of `text` and `body`.
    #[serde(default, deserialize_with = "not_null")]
    pub body: Option<String>,
    /// Priority queues only: lower is delivered first (int32, default 0).
    #[serde(default)]
    pub priority: Option<i32>,
    /// Delay queues and plain fifo queues: deliver no earlier than this long from now (`30s`, `5m`, or seconds).
    #[serde(default)]
    pub delay: Option<String>,
    /// Delay queues and plain fifo queues: deliver no earlier than this time, epoch milliseconds.
    #[serde(default)]
    pub deliver_at: Option<i64>,
    /// Id queues only (required there): the message's id.
    #[serde(default)]
    pub id: Option<String>,
    /// Grouped queues only: the message's group. Messages of one group are delivered one at a
    /// time, in put order; on an id queue the id is the group. 1 to 200 bytes, as an `id`.
    #[serde(default)]
    pub group: Option<String>,
    /// Store this message at most once per key within the queue's idempotency window, as the
    /// `Idempotency-Key` header does for a single put: 1–200 bytes of visible ASCII, each key once
    /// per batch. A key used within the window with the same body, priority and id stores nothing:
    /// the message's id is the earlier one and `replayed` says so.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// The message's attributes, as the `zkq-attributes` header of a single put: by name, each
    /// `{"type": "String"|"Number"|"Binary" (optionally `.label`), "value": "…"}` (Binary: base64).
    /// Not with `format=curator-multi`, not on simple queues.
    #[serde(default)]
    pub attributes: Option<crate::web::headers::Attributes>,
    /// The message's W3C trace context, as the `traceparent` header of a single put.
    #[serde(default)]
    pub traceparent: Option<String>,
}

/// A batch put: 1 to `api.max_batch` messages, stored all or none.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchPutRequest {
    /// 1 to `api.max_batch` messages (the handler refuses an empty batch).
    pub messages: Vec<BatchMessage>,
}

/// Query parameters of a batch put.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct BatchPutQuery {
    /// How long to wait for room for every message when the queue has `max_items` (default 0;
    /// longer values are cut to `take.max_wait`).
    pub wait: Option<String>,
    /// `nodes` (default): one node per message. `curator-multi`: all messages in ONE node, as
    /// Curator's `putMulti` writes them (fifo, priority and delay queues; every message with the
    /// same kind fields).
    pub format: Option<BatchFormat>,
}

/// How a batch put stores its messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BatchFormat {
    /// One node per message, each with its own sequence number and message id.
    #[default]
    Nodes,
    /// One node holding every message in Curator's multi-item envelope (`putMulti`): Curator
    /// consumers receive them together, in order; the answer holds the one node's id.
    CuratorMulti,
}

/// Answer to a batch put: the message ids, in the order of the request; with
/// `format=curator-multi`, the id of the one node that holds them all.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct BatchPutResponse {
    pub queue: String,
    /// Node names, e.g. `queue-0000000042`. `null` only for a message with an `idempotency_key`
    /// (or in a batch with one) whose name zkq could not tell after a lost answer or a crash (it
    /// was stored; see the single put's `message_id`).
    pub message_ids: Vec<Option<String>>,
    /// Per message, in the same order: `true` when an earlier put with the same idempotency key
    /// stored it and this batch stored nothing for it.
    pub replayed: Vec<bool>,
}

/// Put many messages in one request: one ZooKeeper transaction, all or none.
///
/// A message may carry an `idempotency_key`. Messages whose key was used within the queue's
/// idempotency window (with the same body, priority and id) are not stored again: their ids are
/// the earlier messages', flagged in `replayed`, and the rest are stored all or none, each new
/// key's record in the same transaction. A key used with another body refuses the whole batch
/// (409 `idempotency_key_reused`, nothing stored). When every message was a replay the answer also
/// carries `zkq-idempotent-replay: true`.
/// With `format=curator-multi`, one node holding them all, as Curator's `putMulti` writes it
/// (no idempotency keys then: a key stands for one message).
#[utoipa::path(
    post, path = "/v1/queues/{queue}/batch", tag = "queues",
    params(QueuePath, BatchPutQuery),
    request_body(content = BatchPutRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Every message stored in ZooKeeper, in one transaction (or, with an idempotency_key seen within the window, stored by an earlier put: see `replayed`); with `format=curator-multi`, in one node: `message_ids` holds its id alone", body = BatchPutResponse,
            headers(("zkq-idempotent-replay" = String, description = "`true` when every message was a replay and this batch stored nothing"))),
        (status = 400, description = "Bad queue name, body or parameter (no messages, more than api.max_batch, a message with neither or both of text and body, bad base64, a bad idempotency_key or one given twice, an unknown `format`; with `format=curator-multi`, messages whose kind fields differ or an idempotency_key)", body = ErrorBody),
        (status = 404, description = "Unknown queue (dynamic queues disabled)", body = ErrorBody),
        (status = 409, description = "A field that does not fit the queue's kind, an id queue message without `id`, or `format=curator-multi` on an id or simple queue, where Curator has no putMulti (`parameter_not_for_kind`); an idempotency_key used within the window with another body, priority or id (`idempotency_key_reused`; nothing stored)", body = ErrorBody),
        (status = 408, description = "The body did not arrive within api.body_read_timeout of the headers (`request_timeout`); nothing was done", body = ErrorBody),
        (status = 413, description = "A message larger than api.max_message_bytes, or bodies larger than api.max_batch_bytes together, or messages (with their idempotency records and the node ACL of each create) that would make the transaction larger than ZooKeeper's request limit (zookeeper.jute_maxbuffer less 4 KiB, encoded); nothing stored", body = ErrorBody),
        (status = 415, description = "The body is not sent as JSON (`Content-Type: application/json`)", body = ErrorBody),
        (status = 429, description = "No room for every message under max_items", body = ErrorBody, headers(("Retry-After" = u32, description = "Seconds"))),
        ZookeeperErrors,
    )
)]
pub(crate) async fn put_batch(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
    ApiQuery(query): ApiQuery<BatchPutQuery>,
    ApiJson(request): ApiJson<BatchPutRequest>,
) -> Result<Response, ApiError> {
    let api = &state.config.api;
    if request.messages.is_empty() || request.messages.len() > api.max_batch {
        return Err(ApiError::invalid(format!(
            "a batch holds 1 to api.max_batch = {} messages, not {}",
            api.max_batch,
            request.messages.len()
        )));
    }
    let wait = bounded_duration("wait", query.wait.as_deref(), state.config.take.max_wait)?;
    // One "now" for every message: the same `delay` gives the same delivery time.
    let now = crate::types::now_epoch_ms();
    let mut bodies = Vec::with_capacity(request.messages.len());
    let mut options = Vec::with_capacity(request.messages.len());
    let mut total = 0usize;
    for (index, message) in request.messages.into_iter().enumerate() {
        let body = match (message.text, message.body) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .map_err(|err| ApiError::invalid(format!("messages[{index}].body is not standard base64: {err}")))?,
            _ => return Err(ApiError::invalid(format!("messages[{index}] needs exactly one of `text` and `body`"))),
        };
        total = total.saturating_add(body.len());
        if total > api.max_batch_bytes {
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the messages' bodies are larger than api.max_batch_bytes = {} together", api.max_batch_bytes),
            ));
        }
        if let Some(key) = &message.idempotency_key
            && !crate::queue::is_valid_idempotency_key(key.as_bytes())
        {
            return Err(ApiError::invalid(format!(
                "messages[{index}].idempotency_key must be 1 to {} bytes of visible ASCII (! to ~), without spaces \
                 or control characters; this one has {} bytes",
                crate::queue::MAX_IDEMPOTENCY_KEY_LEN,
                key.len()
            )));
        }
        let fields = KindFields {
            priority: message.priority,
            delay: message.delay,
            deliver_at: message.deliver_at,
            id: message.id,
            group: message.group,
        };
        let kind_options = put_options_at(&state, fields, wait, now)
            .map_err(|err| ApiError { message: format!("messages[{index}]: {}", err.message), ..err })?;
        let in_message = |err: ApiError| ApiError { message: format!("messages[{index}]: {}", err.message), ..err };
        let attributes = match message.attributes {
            Some(given) => super::attributes::from_json(given, "attribute").map_err(in_message)?,
            None => crate::queue::MessageAttributes::new(),
        };
        let traceparent =
            message.traceparent.as_deref().map(super::attributes::parse_traceparent).transpose().map_err(in_message)?;
        options.push(PutOptions { idempotency_key: message.idempotency_key, attributes, traceparent, ..kind_options });
        bodies.push(body);
    }
    let queue = state.door.queues().queue(&path.queue, Purpose::Put).await?;
    let messages = bodies.iter().map(Vec::as_slice).zip(options).collect();
    let receipts = match query.format.unwrap_or_default() {
        BatchFormat::Nodes => queue.put_many(messages, wait).await?,
        BatchFormat::CuratorMulti => vec![queue.put_multi(messages, wait).await?],
    };
    let every_one_replayed = receipts.iter().all(|r| r.replay);
    let replayed = receipts.iter().map(|r| r.replay).collect();
    let message_ids = receipts.into_iter().map(|r| r.message_id).collect();
    let body = BatchPutResponse { queue: queue.name().to_string(), message_ids, replayed };
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    if every_one_replayed {
        response.headers_mut().insert(HEADER_IDEMPOTENT_REPLAY, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// What a batch ack does with its leases: ack (default), or nack like
/// `POST …/leases/{lease}/nack`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchNack {
    #[serde(default)]
    pub mode: Option<NackModeParam>,
    /// Requeue: deliver again no earlier than this (`30s`; cut to `lease.max_visibility`).
    #[serde(default)]
    pub delay: Option<String>,
}

/// A batch ack: 1 to `api.max_batch` receipts of one queue.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchAckRequest {
    /// 1 to `api.max_batch` receipts (the handler refuses an empty batch).
    pub leases: Vec<String>,
    /// Nack them instead of acking.
    #[serde(default)]
    pub nack: Option<BatchNack>,
}

/// The outcome for one receipt of a batch ack.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct LeaseOutcome {
    pub lease: String,
    /// The status the single ack (or nack) would have answered: 204, 404, 409, 503, 504.
    pub status: u16,
    /// The error code when it failed (see the error table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Answer to a batch ack: one outcome per receipt, in the order of the request.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct BatchAckResponse {
    pub results: Vec<LeaseOutcome>,
}

/// Ack (or nack) many leases in one request; each receipt gets its own outcome, so one stale
/// receipt does not fail the others. Acks in flight together share ZooKeeper transactions.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/acks", tag = "leases",
    params(QueuePath),
    request_body(content = BatchAckRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "One outcome per receipt (each with the status its single ack would have had)", body = BatchAckResponse),
        (status = 400, description = "Bad queue name or body (no receipts, more than api.max_batch)", body = ErrorBody),
        (status = 404, description = "A queue this zkq does not have open (`queue_not_found`)", body = ErrorBody),
        (status = 408, description = "The body did not arrive within api.body_read_timeout of the headers (`request_timeout`); nothing was done", body = ErrorBody),
        (status = 415, description = "The body is not sent as JSON (`Content-Type: application/json`)", body = ErrorBody),
    )
)]
pub(crate) async fn ack_batch(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
    ApiJson(request): ApiJson<BatchAckRequest>,
) -> Result<Response, ApiError> {
    let max = state.config.api.max_batch;
    if request.leases.is_empty() || request.leases.len() > max {
        return Err(ApiError::invalid(format!(
            "a batch ack holds 1 to api.max_batch = {max} receipts, not {}",
            request.leases.len()
        )));
    }
    let delay = match &request.nack {
        Some(nack) => Some(bounded_duration("delay", nack.delay.as_deref(), state.config.lease.max_visibility)?),
        None => None,
    };
    let queue = state.door.queues().queue(&path.queue, Purpose::Step).await?;
    let nack = match (&request.nack, delay) {
        (Some(nack), Some(delay)) => Some((nack.mode.map_or_else(|| queue.default_nack_mode(), NackMode::from), delay)),
        _ => None,
    };
    let steps = request.leases.iter().map(|lease| {
        let queue = &queue;
        async move {
            // A malformed receipt fails only its own entry.
            let receipt = receipt_of(lease)?;
            match nack {
                Some((mode, delay)) => queue.nack(receipt, mode, delay).await,
                None => queue.ack(receipt).await,
            }
        }
    });
    let outcomes = futures::future::join_all(steps).await;
    let results = request
        .leases
        .into_iter()
        .zip(outcomes)
        .map(|(lease, outcome): (String, Result<(), QueueError>)| match outcome {
            Ok(()) => LeaseOutcome { lease, status: 204, code: None, message: None },
            Err(err) => {
                let err = ApiError::from(err);
                let (status, code) = err.code.status_and_code();
                LeaseOutcome { lease, status: status.as_u16(), code: Some(code.to_owned()), message: Some(err.message) }
            },
        })
        .collect();
    Ok((StatusCode::OK, Json(BatchAckResponse { results })).into_response())
}
