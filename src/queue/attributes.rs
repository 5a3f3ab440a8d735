//! Message attributes (SQS's `MessageAttributes`): kept in the message's own node, after the end of
//! Curator's envelope, where Curator's `ItemSerializer` stops reading (bytes after its EOF opcode
//! are ignored). So they are written in the put's transaction, removed with the message, carried
//! by every step that moves its bytes (requeue, dead letter, put-back), and a Curator consumer
//! sees the body alone.
//!
//! A message's W3C `traceparent` travels the same way. The trailer is `ZKQA`, a format byte, then
//! JSON: format 1 is the attributes alone (an object by name), format 2 an object with the
//! attributes (`a`), the traceparent (`tp`) and the deduplication id of a keyed put (`dd`, SQS's
//! `MessageDeduplicationId`), written when there is a traceparent or a key. Data read from
//! ZooKeeper is untrusted: a trailer that does not parse is nothing, never an error, and a `dd`
//! that is not 1 to 128 visible ASCII characters is none.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::types::Traceparent;

const MAGIC: &[u8] = b"ZKQA\x01";
const MAGIC_WITH_TRACE: &[u8] = b"ZKQA\x02";

/// The most attributes one message may carry (as in SQS).
pub(crate) const MAX_ATTRIBUTES: usize = 10;
/// The longest attribute name, and the longest data type (with its label), in bytes.
pub(crate) const MAX_ATTRIBUTE_NAME_LEN: usize = 256;

/// One attribute's value: its data type (`String`, `Number` or `Binary`, each optionally followed
/// by `.` and a custom label) and its value, text or bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AttributeValue {
    #[serde(rename = "t")]
    pub data_type: String,
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none", with = "base64_bytes")]
    pub binary: Option<Vec<u8>>,
}

/// A message's attributes, by name.
pub(crate) type MessageAttributes = BTreeMap<String, AttributeValue>;

/// Why attributes are refused (each front words it its own way; this is zkq's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidAttributes {
    #[error("a message carries at most {MAX_ATTRIBUTES} attributes, not {0}")]
    TooMany(usize),
    #[error(
        "attribute name {0:?} must be 1 to 256 letters, digits, '_', '-' and '.' (not at either end, not twice in a \
         row), not starting with AWS. or Amazon."
    )]
    Name(String),
    #[error("attribute {name}: data type {data_type:?} is not String, Number or Binary")]
    DataType { name: String, data_type: String },
    /// The value is not what the type needs (`base`: String, Number or Binary).
    #[error("attribute {name}: a {base} attribute carries {} and nothing else", if base == "Binary" { "a BinaryValue" } else { "a StringValue" })]
    Value { name: String, base: String },
}

/// The attribute names [`check`] accepts, as an ECMA-262 pattern (for the OpenAPI document, which
/// states [`MAX_ATTRIBUTE_NAME_LEN`] as their `maxLength`).
pub(crate) const NAME_PATTERN: &str =
    r"^(?![Aa][Ww][Ss]\.|[Aa][Mm][Aa][Zz][Oo][Nn]\.)[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$";

/// The data types [`check`] accepts, as an ECMA-262 pattern (for the OpenAPI document, with
/// [`MAX_ATTRIBUTE_NAME_LEN`] as their `maxLength`); a label of visible ASCII and spaces only, so
/// that the bound in characters is the one in bytes.
pub(crate) const TYPE_PATTERN: &str = r"^(?:String|Number|Binary)(?:\.[\x20-\x7e]*)?$";

/// Checks attributes as SQS does: at most [`MAX_ATTRIBUTES`], names of 1 to 256 letters, digits,
/// `_`, `-` and `.` (not starting with `AWS.` or `Amazon.`, no `..`, not starting or ending with
/// `.`), a data type of String, Number or Binary (with an optional `.label`), and the value its
/// type needs.
pub(crate) fn check(attributes: &MessageAttributes) -> Result<(), InvalidAttributes> {
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(InvalidAttributes::TooMany(attributes.len()));
    }
    for (name, value) in attributes {
        let lower = name.to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= MAX_ATTRIBUTE_NAME_LEN
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
            && !name.starts_with('.')
            && !name.ends_with('.')
            && !name.contains("..")
            && !lower.starts_with("aws.")
            && !lower.starts_with("amazon.");
        if !valid {
            return Err(InvalidAttributes::Name(name.clone()));
        }
        let base = value.data_type.split_once('.').map_or(value.data_type.as_str(), |(base, _)| base);
        let value_ok = match base {
            "String" | "Number" => value.string.is_some() && value.binary.is_none(),
            "Binary" => value.binary.is_some() && value.string.is_none(),
            _ => {
                return Err(InvalidAttributes::DataType { name: name.clone(), data_type: value.data_type.clone() });
            },
        };
        if !value_ok || value.data_type.len() > MAX_ATTRIBUTE_NAME_LEN {
            return Err(InvalidAttributes::Value { name: name.clone(), base: base.to_owned() });
        }
    }
    Ok(())
}

/// Format 2 of the trailer.
#[derive(Serialize, Deserialize)]
struct Annex {
    #[serde(rename = "a", default)]
    attributes: MessageAttributes,
    #[serde(rename = "tp", default, skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    #[serde(rename = "dd", default, skip_serializing_if = "Option::is_none")]
    deduplication_id: Option<String>,
}

/// What a message carries besides its body, in the trailer after Curator's envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Trailer {
    pub attributes: MessageAttributes,
    pub traceparent: Option<Traceparent>,
    /// The key of the put that stored it (SQS's `MessageDeduplicationId`), if it had one.
    pub deduplication_id: Option<String>,
}

/// The longest deduplication id a trailer keeps (SQS's `MessageDeduplicationId` limit).
pub(crate) const MAX_DEDUPLICATION_ID_LEN: usize = 128;

/// Whether `id` is a deduplication id a trailer keeps: 1 to 128 visible ASCII characters.
fn keepable(id: &str) -> bool {
    (1..=MAX_DEDUPLICATION_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// The trailer that carries `trailer` after Curator's envelope; empty when it carries nothing. A
/// deduplication id that is not [`keepable`] is left out.
pub(crate) fn trailer(trailer: &Trailer) -> Vec<u8> {
    let deduplication_id = trailer.deduplication_id.clone().filter(|id| keepable(id));
    // Serializing plain strings and bytes cannot fail.
    match (&trailer.traceparent, deduplication_id) {
        (None, None) if trailer.attributes.is_empty() => Vec::new(),
        (None, None) => [MAGIC, &serde_json::to_vec(&trailer.attributes).unwrap_or_default()].concat(),
        (traceparent, deduplication_id) => {
            let annex = Annex {
                attributes: trailer.attributes.clone(),
                traceparent: traceparent.as_ref().map(ToString::to_string),
                deduplication_id,
            };
            [MAGIC_WITH_TRACE, &serde_json::to_vec(&annex).unwrap_or_default()].concat()
        },
    }
}

/// What the bytes after a node's envelope carry (see `envelope::after_end`); nothing when there is
/// no trailer of ours or it does not parse (a traceparent that is not valid is none too, and so is
/// a deduplication id that is not [`keepable`]).
pub(crate) fn from_trailer(bytes: &[u8]) -> Trailer {
    if let Some(json) = bytes.strip_prefix(MAGIC) {
        return Trailer { attributes: serde_json::from_slice(json).unwrap_or_default(), ..Trailer::default() };
    }
    match bytes.strip_prefix(MAGIC_WITH_TRACE).and_then(|json| serde_json::from_slice::<Annex>(json).ok()) {
        Some(annex) => Trailer {
            attributes: annex.attributes,
            traceparent: annex.traceparent.and_then(|text| Traceparent::parse(&text).ok()),
            deduplication_id: annex.deduplication_id.filter(|id| keepable(id)),
        },
        None => Trailer::default(),
    }
}

/// SQS's `MD5OfMessageAttributes`: for each attribute in name order, its name, its data type and
/// its value (the byte 1 and its text, or 2 and its bytes), each length-prefixed (4 bytes,
/// big-endian).
pub(crate) fn md5_hex(attributes: &MessageAttributes) -> String {
    fn put(bytes: &mut Vec<u8>, data: &[u8]) {
        bytes.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
        bytes.extend_from_slice(data);
    }
    let mut bytes = Vec::new();
    for (name, value) in attributes {
        put(&mut bytes, name.as_bytes());
        put(&mut bytes, value.data_type.as_bytes());
        if let Some(text) = &value.string {
            bytes.push(1);
            put(&mut bytes, text.as_bytes());
        } else if let Some(data) = &value.binary {
            bytes.push(2);
            put(&mut bytes, data);
        }
    }
    format!("{:x}", md5::compute(&bytes))
}

mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Option<Vec<u8>>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => serializer.serialize_some(&base64::engine::general_purpose::STANDARD.encode(bytes)),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        text.map(|t| base64::engine::general_purpose::STANDARD.decode(t).map_err(serde::de::Error::custom)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(data_type: &str, value: &str) -> AttributeValue {
        AttributeValue { data_type: data_type.to_owned(), string: Some(value.to_owned()), binary: None }
    }

    #[test]
    fn the_md5_of_attributes_is_sqss() {
        // Vectors computed with the algorithm of the SQS Developer Guide (as the Java SDK checks it).
        let one: MessageAttributes = [("a1".to_owned(), text("String", "v"))].into();
        assert_eq!(md5_hex(&one), "66f1690233e41b10dc47cf3dfa4538be");
        let binary = AttributeValue { data_type: "Binary".to_owned(), string: None, binary: Some(vec![0, 1]) };
        let two: MessageAttributes = [("b".to_owned(), text("Number", "1")), ("a".to_owned(), binary)].into();
        assert_eq!(md5_hex(&two), "eb841ba5088ac48a23559ffac27ea7da");
    }

    #[test]
    fn attributes_survive_their_trailer_and_a_foreign_one_is_none() {
        let attributes: MessageAttributes = [("k".to_owned(), text("String.json", "{}"))].into();
        let carrying = |attributes: &MessageAttributes, traceparent: Option<&Traceparent>, dd: Option<&str>| Trailer {
            attributes: attributes.clone(),
            traceparent: traceparent.cloned(),
            deduplication_id: dd.map(str::to_owned),
        };
        let plain = carrying(&attributes, None, None);
        assert_eq!(from_trailer(&trailer(&plain)), plain);
        assert!(trailer(&Trailer::default()).is_empty());
        let trace = Traceparent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").ok();
        for kept in [
            carrying(&attributes, trace.as_ref(), None),
            carrying(&MessageAttributes::new(), trace.as_ref(), None),
            carrying(&attributes, trace.as_ref(), Some("d-1")),
            carrying(&MessageAttributes::new(), None, Some(&"x".repeat(128))),
        ] {
            assert_eq!(from_trailer(&trailer(&kept)), kept);
        }
        // A deduplication id no SQS client could have sent is not kept, nor read.
        for bad in ["", "a b", "é", &"x".repeat(129)] {
            let given = carrying(&attributes, None, Some(bad));
            assert_eq!(from_trailer(&trailer(&given)), carrying(&attributes, None, None), "{bad:?}");
            let foreign = format!("ZKQA\x02{}", serde_json::json!({ "a": {}, "dd": bad }));
            assert_eq!(from_trailer(foreign.as_bytes()).deduplication_id, None, "{bad:?}");
        }
        for foreign in [b"anything else".as_slice(), b"ZKQA\x01not json", b"ZKQA\x02{\"tp\":\"not a trace\"}"] {
            assert_eq!(from_trailer(foreign), Trailer::default(), "{foreign:?}");
        }
    }

    #[test]
    fn attributes_are_checked_as_sqs_checks_them() {
        assert!(check(&[("ok.name-1_x".to_owned(), text("Number", "1"))].into()).is_ok());
        for bad in ["", ".a", "a.", "a..b", "AWS.x", "amazon.y", "a b", &"x".repeat(257)] {
            assert!(check(&[(bad.to_owned(), text("String", "v"))].into()).is_err(), "{bad:?}");
        }
        assert!(check(&[("a".to_owned(), text("Date", "v"))].into()).is_err());
        let no_value = AttributeValue { data_type: "String".to_owned(), string: None, binary: None };
        assert!(check(&[("a".to_owned(), no_value)].into()).is_err());
        let many: MessageAttributes = (0..11).map(|i| (format!("a{i}"), text("String", "v"))).collect();
        assert!(check(&many).is_err());
    }
}
