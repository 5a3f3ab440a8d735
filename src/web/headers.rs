//! zkq's headers: every `zkq-*` name, and a message's attributes and trace context as headers.
//! The native API answers a take or a lease with them and `push/` delivers a message with the
//! same ones, so an app reads a pushed message as it reads a leased one.

use std::collections::BTreeMap;

use axum::http::HeaderValue;
use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::queue::MessageAttributes;
use crate::types::Traceparent;

/// Headers a take or lease answers with.
pub(crate) const HEADER_MESSAGE_ID: &str = "zkq-message-id";
pub(crate) const HEADER_PRIORITY: &str = "zkq-priority";
pub(crate) const HEADER_DELIVER_AT: &str = "zkq-deliver-at";
pub(crate) const HEADER_ID: &str = "zkq-id";
/// The request header that makes a put idempotent, and the answer's mark of a replay.
pub(crate) const HEADER_IDEMPOTENCY_KEY: &str = "idempotency-key";
pub(crate) const HEADER_IDEMPOTENT_REPLAY: &str = "zkq-idempotent-replay";

/// Headers a lease answers with, besides a message's.
pub(crate) const HEADER_LEASE: &str = "zkq-lease";
pub(crate) const HEADER_LEASE_EXPIRES_AT: &str = "zkq-lease-expires-at";
pub(crate) const HEADER_DELIVERY_COUNT: &str = "zkq-delivery-count";
pub(crate) const HEADER_FENCING_TOKEN: &str = "zkq-fencing-token";

/// The header that carries the API token.
pub(crate) const API_TOKEN_HEADER: &str = "zkq-api-token";

/// The header naming the queue of a push delivery.
pub(crate) const HEADER_QUEUE: &str = "zkq-queue";

/// The request and answer header with a message's attributes, as a JSON object (ASCII: other
/// characters as `\u` escapes in an answer).
pub(crate) const HEADER_ATTRIBUTES: &str = "zkq-attributes";
/// The request and answer header with a message's W3C trace context.
pub(crate) const HEADER_TRACEPARENT: &str = "traceparent";

/// One attribute: its type (`String`, `Number` or `Binary`, each optionally followed by `.` and
/// a label of your own) and its value (for `Binary`, standard base64).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Attribute {
    #[serde(rename = "type")]
    #[schema(example = "String")]
    pub data_type: String,
    pub value: String,
}

/// A message's attributes by name: up to 10, names of 1 to 256 letters, digits, `_`, `-` and `.`
/// (as SQS's message attributes, which they are on the SQS-compatible API).
pub(crate) type Attributes = BTreeMap<String, Attribute>;

/// The attributes of a message as zkq's API shows them.
pub(crate) fn to_json(attributes: &MessageAttributes) -> Attributes {
    attributes
        .iter()
        .map(|(name, value)| {
            let text = match (&value.string, &value.binary) {
                (Some(text), _) => text.clone(),
                (None, Some(bytes)) => base64::engine::general_purpose::STANDARD.encode(bytes),
                (None, None) => String::new(),
            };
            (name.clone(), Attribute { data_type: value.data_type.clone(), value: text })
        })
        .collect()
}

/// The answer headers of a message's attributes (when it has any) and traceparent.
pub(crate) fn headers_of(
    attributes: &MessageAttributes,
    traceparent: Option<&Traceparent>,
) -> impl Iterator<Item = (&'static str, HeaderValue)> {
    let attributes = (!attributes.is_empty())
        .then(|| HeaderValue::from_str(&ascii_json(&to_json(attributes))).ok())
        .flatten()
        .map(|value| (HEADER_ATTRIBUTES, value));
    let traceparent =
        traceparent.and_then(|t| HeaderValue::from_str(t.as_str()).ok()).map(|value| (HEADER_TRACEPARENT, value));
    attributes.into_iter().chain(traceparent)
}

/// JSON with every character outside printable ASCII as a `\u` escape, so it fits a header.
fn ascii_json(attributes: &Attributes) -> String {
    let json = serde_json::to_string(attributes).unwrap_or_default();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() && !c.is_ascii_control() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}
