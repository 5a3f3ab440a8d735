//! A W3C Trace Context `traceparent` (https://www.w3.org/TR/trace-context/#traceparent-header),
//! checked once where it enters (a put's header, a batch message's field) and kept with the
//! message, so a consumer or push delivery continues the producer's trace.

use std::fmt;

/// A valid `traceparent`: `{version}-{trace id}-{parent id}-{flags}`, lower-case hex, the ids not
/// all zeros, the version not `ff`. A version after `00` may carry more fields after the four
/// (as the specification asks a reader to accept); it is kept as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traceparent(String);

/// The longest `traceparent` kept (a future version's extra fields included).
pub const MAX_TRACEPARENT_LEN: usize = 512;

impl Traceparent {
    /// What [`Traceparent::parse`] accepts (once trimmed), as an ECMA-262 pattern (for the OpenAPI
    /// document; its length bound is [`MAX_TRACEPARENT_LEN`]): a version of 2 lower-case hex
    /// digits but `ff`, a trace id of 32 and a parent id of 16 that are not all zeros, 2 of flags;
    /// after a version other than `00`, optionally `-` and visible ASCII.
    pub fn pattern() -> String {
        let ids = r"(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}";
        format!(r"^(?:00-{ids}|(?:0[1-9a-f]|[1-9a-e][0-9a-f]|f[0-9a-e])-{ids}(?:-[\x21-\x7e]*)?)$")
    }

    /// Parses a `traceparent` as the specification reads one; `Err` says what is wrong.
    pub fn parse(text: &str) -> Result<Traceparent, &'static str> {
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

    pub fn as_str(&self) -> &str {
        &self.0
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
}
