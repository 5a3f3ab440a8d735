//! A W3C Trace Context `traceparent` (https://www.w3.org/TR/trace-context/#traceparent-header),
//! checked once where it enters (a put's header, a batch message's field) and kept with the
//! message, so a consumer or push delivery continues the producer's trace.

use std::fmt;

/// A valid `traceparent`: `{version}-{trace id}-{parent id}-{flags}`, lower-case hex, the ids not
/// all zeros, the version not `ff`. A version after `00` may carry more fields after the four
/// (as the specification asks a reader to accept); it is kept as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Traceparent(String);

/// The longest `traceparent` kept (a future version's extra fields included).
pub(crate) const MAX_TRACEPARENT_LEN: usize = 512;

impl Traceparent {
    /// What [`Traceparent::parse`] accepts (once trimmed), as an ECMA-262 pattern (for the OpenAPI
    /// document; its length bound is [`MAX_TRACEPARENT_LEN`]): a version of 2 lower-case hex
    /// digits but `ff`, a trace id of 32 and a parent id of 16 that are not all zeros, 2 of flags;
    /// after a version other than `00`, optionally `-` and visible ASCII.
    pub(crate) fn pattern() -> String {
        let ids = r"(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}";
        format!(r"^(?:00-{ids}|(?:0[1-9a-f]|[1-9a-e][0-9a-f]|f[0-9a-e])-{ids}(?:-[\x21-\x7e]*)?)$")
    }

    /// Parses a `traceparent` as the specification reads one; `Err` says what is wrong.
    pub(crate) fn parse(text: &str) -> Result<Traceparent, &'static str> {
        let text = text.trim_matches([' ', '\t']);
        let hex =
            |part: &str, len: usize| part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let zeros = |part: &str| part.bytes().all(|b| b == b'0');
        if text.len() > MAX_TRACEPARENT_LEN {
            return Err("is longer than 512 characters");
        }
        let mut parts = text.splitn(5, '-');
        let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("is not version-traceid-parentid-flags");
        };
        let extra = parts.next();
        if !hex(version, 2) || version == "ff" {
            return Err("has a version that is not 2 lower-case hex digits (ff is invalid)");
        }
        if !hex(trace_id, 32) || zeros(trace_id) {
            return Err("has a trace id that is not 32 lower-case hex digits, not all zeros");
        }
        if !hex(parent_id, 16) || zeros(parent_id) {
            return Err("has a parent id that is not 16 lower-case hex digits, not all zeros");
        }
        if !hex(flags, 2) {
            return Err("has flags that are not 2 lower-case hex digits");
        }
        if version == "00" && extra.is_some() {
            return Err("has fields after the flags, which version 00 does not");
        }
        if extra.is_some_and(|rest| !rest.bytes().all(|b| b.is_ascii_graphic())) {
            return Err("has fields after the flags that are not visible ASCII");
        }
        Ok(Traceparent(text.to_owned()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The trace context of an AWS X-Ray trace header (SQS's `AWSTraceHeader`):
    /// `Root=1-{8 hex}-{24 hex};Parent={16 hex};Sampled={0|1}`, its fields in any order (others,
    /// such as `Lineage`, are left out). The trace id is the root's 32 hex digits, the parent id
    /// the parent's, and `Sampled=1` the sampled flag (01), as X-Ray's own W3C mapping has it.
    pub(crate) fn from_xray(header: &str) -> Result<Traceparent, &'static str> {
        let field = |key: &str| {
            header.split(';').map(|f| f.trim()).find_map(|f| f.split_once('=').filter(|(k, _)| *k == key)).map(|f| f.1)
        };
        let root = field("Root").ok_or("has no Root=1-{8 hex}-{24 hex}")?;
        let mut parts = root.split('-');
        let (Some("1"), Some(time), Some(random), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("has a Root that is not 1-{8 hex}-{24 hex}");
        };
        if time.len() != 8 || random.len() != 24 {
            return Err("has a Root that is not 1-{8 hex}-{24 hex}");
        }
        let parent = field("Parent").ok_or("has no Parent={16 hex}")?;
        let flags = if field("Sampled") == Some("1") { "01" } else { "00" };
        Traceparent::parse(&format!("00-{}{}-{}-{flags}", time, random, parent).to_ascii_lowercase())
            .map_err(|_| "has a Root or Parent that is not hex digits (or is all zeros)")
    }

    /// This trace context as an AWS X-Ray trace header (the inverse of [`Traceparent::from_xray`]).
    pub(crate) fn to_xray(&self) -> String {
        let mut parts = self.0.split('-').skip(1);
        let (trace, parent, flags) =
            (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (time, random) = trace.split_at_checked(8).unwrap_or((trace, ""));
        let sampled = u8::from_str_radix(flags, 16).map_or(0, |flags| flags & 1);
        format!("Root=1-{time}-{random};Parent={parent};Sampled={sampled}")
    }
}

impl fmt::Display for Traceparent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specifications_example_parses_and_bad_ones_say_why() {
        assert_eq!(Traceparent::parse(VALID).map(|t| t.to_string()), Ok(VALID.to_owned()));
        assert!(Traceparent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later").is_ok());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert!(Traceparent::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_xray_header_maps_to_a_traceparent_and_back() {
        let xray = "Root=1-3152b799-8954dae64eda91bc9a23a7e8;Parent=7fa8c0f79203be72;Sampled=1";
        let trace = Traceparent::from_xray(xray).expect("valid");
        assert_eq!(trace.as_str(), "00-3152b7998954dae64eda91bc9a23a7e8-7fa8c0f79203be72-01");
        assert_eq!(trace.to_xray(), xray);
        let unsampled =
            Traceparent::from_xray("Parent=7FA8C0F79203BE72; Root=1-3152B799-8954DAE64EDA91BC9A23A7E8; Lineage=a:1")
                .expect("any order, any case, other fields");
        assert_eq!(unsampled.as_str(), "00-3152b7998954dae64eda91bc9a23a7e8-7fa8c0f79203be72-00");
        assert_eq!(
            Traceparent::parse(VALID).expect("valid").to_xray(),
            "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1"
        );
        for bad in [
            "",
            "Root=1-3152b799-8954dae64eda91bc9a23a7e8",
            "Parent=7fa8c0f79203be72",
            "Root=2-3152b799-8954dae64eda91bc9a23a7e8;Parent=7fa8c0f79203be72",
            "Root=1-3152b79-98954dae64eda91bc9a23a7e8;Parent=7fa8c0f79203be72",
            "Root=1-3152b799-8954dae64eda91bc9a23a7e8;Parent=xyz8c0f79203be72",
            "Root=1-00000000-000000000000000000000000;Parent=7fa8c0f79203be72",
        ] {
            assert!(Traceparent::from_xray(bad).is_err(), "{bad:?}");
        }
    }
}
