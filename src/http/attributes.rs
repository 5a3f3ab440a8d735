//! Message attributes and a W3C `traceparent` as zkq's own API carries them (SQS's API has its
//! own shapes, in `sqs/`): on a put, the `zkq-attributes` and `traceparent` headers (a batch
//! message's `attributes` and `traceparent` fields); on a take, a lease and a push delivery, the
//! same headers (a `?max=` answer's fields). Both are kept beside the body in the message's node,
//! where Curator's consumers do not see them (`queue/attributes.rs`).

use std::collections::BTreeMap;

use axum::http::{HeaderMap, HeaderValue};
use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::ApiError;
use crate::queue::{AttributeValue, MessageAttributes};
use crate::types::Traceparent;

/// The request and answer header with a message's attributes, as a JSON object (ASCII: other
/// characters as `\u` escapes in an answer).
pub const HEADER_ATTRIBUTES: &str = "zkq-attributes";
/// The request and answer header with a message's W3C trace context.
pub const HEADER_TRACEPARENT: &str = "traceparent";

/// One attribute: its type (`String`, `Number` or `Binary`, each optionally followed by `.` and
/// a label of your own) and its value (for `Binary`, standard base64).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Attribute {
    #[serde(rename = "type")]
    #[schema(example = "String")]
    pub data_type: String,
    pub value: String,
}

/// A message's attributes by name: up to 10, names of 1 to 256 letters, digits, `_`, `-` and `.`
/// (as SQS's message attributes, which they are on the SQS-compatible API).
pub type Attributes = BTreeMap<String, Attribute>;

/// The attributes a client gave, as the queue keeps them; a `Binary` value that is not base64 is
/// refused here (names, types and counts are checked by the put).
pub fn from_json(given: Attributes, what: &str) -> Result<MessageAttributes, ApiError> {
    given
        .into_iter()
        .map(|(name, Attribute { data_type, value })| {
            let binary = data_type.split_once('.').map_or(data_type.as_str(), |(base, _)| base) == "Binary";
            let value = if binary {
                let bytes = base64::engine::general_purpose::STANDARD.decode(value.as_bytes()).map_err(|err| {
                    ApiError::invalid(format!("{what} {name:?} is Binary and its value is not standard base64: {err}"))
                })?;
                AttributeValue { data_type, string: None, binary: Some(bytes) }
            } else {
                AttributeValue { data_type, string: Some(value), binary: None }
            };
            Ok((name, value))
        })
        .collect()
}

/// The attributes of a message as the API shows them.
pub fn to_json(attributes: &MessageAttributes) -> Attributes {
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

/// The `zkq-attributes` header of a put: none, or one JSON object of [`Attribute`]s.
pub fn from_header(headers: &HeaderMap) -> Result<MessageAttributes, ApiError> {
    let Some(value) = single(headers, HEADER_ATTRIBUTES)? else { return Ok(MessageAttributes::new()) };
    let given: Attributes = serde_json::from_slice(value.as_bytes()).map_err(|err| {
        ApiError::invalid(format!(
            "{HEADER_ATTRIBUTES} must be a JSON object of {{\"type\": \"String\"|\"Number\"|\"Binary\", \"value\": \
             \"…\"}} by name: {err}"
        ))
    })?;
    from_json(given, "attribute")
}

/// The `traceparent` header of a put, checked as W3C Trace Context reads it.
pub fn traceparent_from_header(headers: &HeaderMap) -> Result<Option<Traceparent>, ApiError> {
    let Some(value) = single(headers, HEADER_TRACEPARENT)? else { return Ok(None) };
    let text = value.to_str().map_err(|_| ApiError::invalid("traceparent must be visible ASCII"))?;
    parse_traceparent(text).map(Some)
}

/// A `traceparent` given as text.
pub fn parse_traceparent(text: &str) -> Result<Traceparent, ApiError> {
    Traceparent::parse(text).map_err(|why| {
        ApiError::invalid(format!(
            "traceparent {why}; W3C Trace Context: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"
        ))
    })
}

fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a HeaderValue>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(ApiError::invalid(format!("send one {name} header, not several")));
    }
    Ok(first)
}

/// The answer headers of a message's attributes (when it has any) and traceparent.
pub fn headers_of(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_cross_a_header_as_ascii_and_come_back_the_same() {
        let given: Attributes = [
            ("city".to_owned(), Attribute { data_type: "String".to_owned(), value: "Zürich 🚋".to_owned() }),
            ("blob".to_owned(), Attribute { data_type: "Binary.raw".to_owned(), value: "AAEC".to_owned() }),
        ]
        .into();
        let kept = from_json(given.clone(), "attribute").expect("valid");
        assert_eq!(kept["blob"].binary.as_deref(), Some([0u8, 1, 2].as_slice()));
        let (name, value) = headers_of(&kept, None).next().expect("a header");
        assert_eq!(name, HEADER_ATTRIBUTES);
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_ATTRIBUTES, value);
        assert_eq!(from_header(&headers).expect("parses"), kept);
        let bad = [("b".to_owned(), Attribute { data_type: "Binary".to_owned(), value: "%%".to_owned() })].into();
        assert!(from_json(bad, "attribute").is_err());
    }
}
