//! Message attributes and a W3C `traceparent` as zkq's own API carries them (SQS's API has its
//! own shapes, in `sqs/`): on a put, the `zkq-attributes` and `traceparent` headers (a batch
//! message's `attributes` and `traceparent` fields); on a take, a lease and a push delivery, the
//! same headers (a `?max=` answer's fields). Both are kept beside the body in the message's node,
//! where Curator's consumers do not see them (`queue/attributes.rs`). Their header names and the
//! answer's rendering are in `web/headers.rs`, which `push/` shares.

use axum::http::{HeaderMap, HeaderValue};
use base64::Engine;

use super::error::ApiError;
use crate::queue::{AttributeValue, MessageAttributes};
use crate::types::Traceparent;
use crate::web::headers::{Attribute, Attributes, HEADER_ATTRIBUTES, HEADER_TRACEPARENT};

/// The attributes a client gave, as the queue keeps them; a `Binary` value that is not base64 is
/// refused here (names, types and counts are checked by the put).
pub(crate) fn from_json(given: Attributes, what: &str) -> Result<MessageAttributes, ApiError> {
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

/// The `zkq-attributes` header of a put: none, or one JSON object of [`Attribute`]s.
pub(crate) fn from_header(headers: &HeaderMap) -> Result<MessageAttributes, ApiError> {
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
pub(crate) fn traceparent_from_header(headers: &HeaderMap) -> Result<Option<Traceparent>, ApiError> {
    let Some(value) = single(headers, HEADER_TRACEPARENT)? else { return Ok(None) };
    let text = value.to_str().map_err(|_| ApiError::invalid("traceparent must be visible ASCII"))?;
    parse_traceparent(text).map(Some)
}

/// A `traceparent` given as text.
pub(crate) fn parse_traceparent(text: &str) -> Result<Traceparent, ApiError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::headers::headers_of;

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
