//! What travels over the API: the request and answer types that more than one handler file uses,
//! and their conversions to and from the queue's types (the header names are in `web/headers.rs`).
//!
//! Handler files import from here, never from each other.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::ApiError;
use super::extract::parse_duration;
use super::state::AppState;
use crate::queue::{ItemMeta, LeaseGrant, MalformedReceipt, Message, NackMode, PutOptions, QueueError, Receipt};
use crate::types::QueueName;
use crate::web::headers::{
    Attributes, HEADER_DELIVER_AT, HEADER_ID, HEADER_MESSAGE_ID, HEADER_PRIORITY, headers_of, to_json,
};

/// Path parameter: a queue name.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct QueuePath {
    /// 1–200 characters of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    #[param(value_type = String)]
    pub queue: QueueName,
}

/// A message's kind fields as a client gives them (query parameters of a put, or one message
/// of a batch put).
#[derive(Debug, Default, Deserialize, ToSchema)]
pub(crate) struct KindFields {
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
    /// Grouped queues only: the message's group (on an id queue, its id).
    #[serde(default)]
    pub group: Option<String>,
}

/// Checks a message's kind fields against the API's bounds. Both `delay` and `deliver_at` are
/// "not before" bounds: given together, the later one applies.
pub(crate) fn put_options(state: &AppState, fields: KindFields, wait: Duration) -> Result<PutOptions, ApiError> {
    put_options_at(state, fields, wait, crate::types::now_epoch_ms())
}

/// [`put_options`] with `delay` counted from `now` (epoch ms).
pub(crate) fn put_options_at(
    state: &AppState,
    fields: KindFields,
    wait: Duration,
    now: i64,
) -> Result<PutOptions, ApiError> {
    let max_delay = state.config.api.max_delay;
    let max_delay_ms = i64::try_from(max_delay.as_millis()).unwrap_or(i64::MAX);
    let after_delay = match &fields.delay {
        Some(delay) => {
            let delay = parse_duration("delay", delay)?;
            if delay > max_delay {
                return Err(ApiError::invalid(format!(
                    "`delay` is longer than api.max_delay = {}",
                    humantime::format_duration(max_delay)
                )));
            }
            let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
            Some(now.saturating_add(delay_ms))
        },
        None => None,
    };
    if fields.deliver_at.is_some_and(|at| at <= 0) {
        return Err(ApiError::invalid("`deliver_at` must be a positive epoch-ms time"));
    }
    if fields.deliver_at.is_some_and(|at| at > now.saturating_add(max_delay_ms)) {
        return Err(ApiError::invalid(format!(
            "`deliver_at` is further away than api.max_delay = {}",
            humantime::format_duration(max_delay)
        )));
    }
    let deliver_at = after_delay.max(fields.deliver_at);
    Ok(PutOptions {
        attributes: crate::queue::MessageAttributes::new(),
        priority: fields.priority,
        deliver_at,
        id: fields.id,
        group: fields.group,
        wait,
        idempotency_key: None,
        key_alone: false,
        key_scope: None,
        traceparent: None,
    })
}

/// What a nack does.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NackModeParam {
    /// Re-create the message at the tail with the same bytes, priority, delivery time and id.
    #[default]
    Requeue,
    /// Remove the message.
    Delete,
    /// Release the lock; the message keeps its place.
    Keep,
}

impl From<NackModeParam> for NackMode {
    fn from(mode: NackModeParam) -> NackMode {
        match mode {
            NackModeParam::Requeue => NackMode::Requeue,
            NackModeParam::Delete => NackMode::Delete,
            NackModeParam::Keep => NackMode::Keep,
        }
    }
}

/// A message as a raw body with its `zkq-*` headers.
pub(crate) fn message_response(message: Message) -> Response {
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    };
    set(HEADER_MESSAGE_ID, message.message_id);
    match message.meta {
        ItemMeta::Priority(p) => set(HEADER_PRIORITY, p.to_string()),
        ItemMeta::DeliverAt(at) => set(HEADER_DELIVER_AT, at.to_string()),
        ItemMeta::Id(id) => set(HEADER_ID, id),
        ItemMeta::Plain => {},
    }
    for (name, value) in headers_of(&message.attributes, message.traceparent.as_ref()) {
        headers.insert(name, value);
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    (StatusCode::OK, headers, message.body).into_response()
}

/// One message of a `?max=` answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct DeliveredMessage {
    /// Node name of the message.
    pub message_id: String,
    /// The body, standard base64.
    pub body: String,
    /// Priority queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Delay queues: epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<i64>,
    /// Id queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Its attributes, when it has any.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub attributes: Attributes,
    /// Its producer's W3C trace context, when the put carried one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Leases: the receipt for ack, nack and extend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Leases: expiry, epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// Leases: how many times this message was leased, this time included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_count: Option<u32>,
    /// Leases: the fencing token, a decimal integer below 2^63 as a string (JSON numbers lose
    /// precision past 2^53): every later lease of any message carries a larger one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<String>,
}

/// A `?max=` answer: 1 to `max` messages, in delivery order while this zkq is the queue's only consumer
/// (with other consumers at work it picks among the first candidates, so the order may differ).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct DeliveredMessages {
    pub messages: Vec<DeliveredMessage>,
}

/// Checks `?max=` against `api.max_batch`.
pub(crate) fn check_max(state: &AppState, max: u32) -> Result<usize, ApiError> {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    if max == 0 || max > state.config.api.max_batch {
        return Err(ApiError::invalid(format!(
            "`max` must be between 1 and api.max_batch = {}",
            state.config.api.max_batch
        )));
    }
    Ok(max)
}

/// The JSON answer of a `?max=` take or lease; 204 when nothing was delivered.
pub(crate) fn delivered(messages: Vec<(Message, Option<LeaseGrant>)>) -> Response {
    if messages.is_empty() {
        return StatusCode::NO_CONTENT.into_response();
    }
    let messages = messages
        .into_iter()
        .map(|(message, grant)| {
            let (mut priority, mut deliver_at, mut id) = (None, None, None);
            match message.meta {
                ItemMeta::Priority(p) => priority = Some(p),
                ItemMeta::DeliverAt(at) => deliver_at = Some(at),
                ItemMeta::Id(i) => id = Some(i),
                ItemMeta::Plain => {},
            }
            DeliveredMessage {
                message_id: message.message_id,
                body: base64::engine::general_purpose::STANDARD.encode(&message.body),
                priority,
                deliver_at,
                id,
                attributes: to_json(&message.attributes),
                traceparent: message.traceparent.map(|t| t.to_string()),
                expires_at: grant.as_ref().map(|g| g.expires_at_ms),
                delivery_count: grant.as_ref().map(|g| g.delivery_count),
                fencing_token: grant.as_ref().map(|g| g.fencing_token.to_string()),
                lease: grant.map(|g| g.receipt.to_string()),
            }
        })
        .collect();
    (StatusCode::OK, Json(DeliveredMessages { messages })).into_response()
}

/// A lease receipt from a request (a path, a batch ack's entry), parsed once: one that is not of a
/// receipt's shape is answered as an unknown one, 404 `lease_not_found`.
pub(crate) fn receipt_of(text: &str) -> Result<Receipt, QueueError> {
    text.parse().map_err(|_: MalformedReceipt| QueueError::LeaseNotFound(text.to_owned()))
}
