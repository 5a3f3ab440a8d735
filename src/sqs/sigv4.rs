//! AWS Signature Version 4, checked on every SQS request when `sqs.access_key_id` and
//! `sqs.secret_access_key_file` are set (required with `api.token_file`): the request must be
//! signed with that key, in its `Authorization` header, as every AWS SDK and the CLI sign.
//!
//! The check follows AWS's published algorithm: the canonical request (method, path, query,
//! signed headers, the body's SHA-256), the string to sign with the request's `X-Amz-Date` and
//! credential scope, and the signing key derived from the secret for that scope's date, region
//! and service. `host`, `x-amz-date`, and when the request has them `content-type` and every
//! `x-amz-*` header (`x-amz-target`, the JSON protocol's action, among them) must be signed, and
//! a declared `x-amz-content-sha256` must be the body's (the payload is always signed): otherwise a
//! captured request could be sent again as another action. The scope's region is the client's (a client configured for any region can use
//! the sidecar); its service must be `sqs`. A request dated more than 15 minutes from zkq's clock
//! is refused, as AWS refuses it. Answers, in SQS's shapes: no `Authorization` header, 403
//! `MissingAuthenticationToken`; one that cannot be read or leaves a required header unsigned,
//! 400 `IncompleteSignature`; another key
//! id, 403 `InvalidClientTokenId`; a wrong signature, 403 `SignatureDoesNotMatch`; too old or too
//! new, 400 `RequestExpired`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, Method, Uri};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::error::SqsError;
use crate::config::SqsKeyPair;

/// How far a request's date may be from zkq's clock.
const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// The parts of an `Authorization` header.
struct Authorization<'h> {
    key_id: &'h str,
    /// `date/region/service/aws4_request`.
    scope: &'h str,
    date: &'h str,
    service: &'h str,
    signed_headers: &'h str,
    signature: &'h str,
}

fn incomplete(why: &str) -> SqsError {
    SqsError::auth("IncompleteSignature", 400, format!("the request's signature cannot be read: {why}"))
}

fn mismatch() -> SqsError {
    SqsError::auth(
        "SignatureDoesNotMatch",
        403,
        "the request signature does not match the one zkq calculated with sqs.secret_access_key_file's secret; \
         check the secret and the request's signed headers",
    )
}

fn parse_authorization(value: &str) -> Result<Authorization<'_>, SqsError> {
    let rest = value
        .strip_prefix(ALGORITHM)
        .and_then(|rest| rest.strip_prefix(' '))
        .ok_or_else(|| incomplete(&format!("only {ALGORITHM} signatures are accepted")))?;
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for part in rest.split(',') {
        match part.trim().split_once('=') {
            Some(("Credential", v)) => credential = Some(v),
            Some(("SignedHeaders", v)) => signed_headers = Some(v),
            Some(("Signature", v)) => signature = Some(v),
            _ => {
                return Err(incomplete(
                    "Authorization holds a part other than Credential, SignedHeaders and Signature",
                ));
            },
        }
    }
    let (Some(credential), Some(signed_headers), Some(signature)) = (credential, signed_headers, signature) else {
        return Err(incomplete("Authorization needs Credential, SignedHeaders and Signature"));
    };
    let (key_id, scope) = credential
        .split_once('/')
        .ok_or_else(|| incomplete("Credential is not key/date/region/service/aws4_request"))?;
    let parts: Vec<&str> = scope.split('/').collect();
    let [date, region, service, "aws4_request"] = parts.as_slice() else {
        return Err(incomplete("Credential is not key/date/region/service/aws4_request"));
    };
    if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) || region.is_empty() {
        return Err(incomplete("the credential scope's date or region is malformed"));
    }
    Ok(Authorization { key_id, scope, date, service, signed_headers, signature })
}

/// Checks the request's signature against `credentials` at `now`.
pub(super) fn verify(
    credentials: &SqsKeyPair,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), SqsError> {
    let Some(value) = headers.get("authorization") else {
        return Err(SqsError::auth(
            "MissingAuthenticationToken",
            403,
            "the request is not signed: zkq's SQS listener requires AWS Signature Version 4 with sqs.access_key_id",
        ));
    };
    let value = value.to_str().map_err(|_| incomplete("Authorization is not ASCII"))?;
    let auth = parse_authorization(value)?;
    if !bool::from(subtle::ConstantTimeEq::ct_eq(auth.key_id.as_bytes(), credentials.access_key_id.as_bytes())) {
        return Err(SqsError::auth(
            "InvalidClientTokenId",
            403,
            "the access key id the request is signed with is not sqs.access_key_id",
        ));
    }
    if auth.service != "sqs" {
        return Err(incomplete("the credential scope's service must be sqs"));
    }
    let amz_date = headers
        .get("x-amz-date")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| incomplete("the request has no X-Amz-Date header"))?;
    let signed_at = parse_amz_date(amz_date).ok_or_else(|| incomplete("X-Amz-Date is not YYYYMMDDTHHMMSSZ"))?;
    if !amz_date.starts_with(auth.date) {
        return Err(incomplete("the credential scope's date is not X-Amz-Date's"));
    }
    let skew = now.duration_since(signed_at).unwrap_or_else(|early| early.duration());
    if skew > MAX_SKEW {
        return Err(SqsError::auth(
            "RequestExpired",
            400,
            format!("the request is dated {amz_date}, more than 15 minutes from zkq's clock"),
        ));
    }
    let signed: Vec<&str> = auth.signed_headers.split(';').collect();
    if let Some(unsigned) = unsigned_required_header(headers, &signed) {
        return Err(incomplete(&format!(
            "SignedHeaders must include {unsigned}: zkq requires host, content-type, x-amz-date, x-amz-target \
             and every other x-amz-* header the request has to be signed, so that none can be changed"
        )));
    }
    if let Some(declared) = headers.get("x-amz-content-sha256")
        && !declared.as_bytes().eq_ignore_ascii_case(hex::encode(Sha256::digest(body)).as_bytes())
    {
        return Err(incomplete(
            "X-Amz-Content-SHA256 is not the SHA-256 of the body: zkq requires the payload to be signed",
        ));
    }
    let canonical = canonical_request(method, uri, headers, &signed, auth.signed_headers, body).ok_or_else(mismatch)?;
    let to_sign = format!("{ALGORITHM}\n{amz_date}\n{}\n{}", auth.scope, hex::encode(Sha256::digest(canonical)));
    let mut key = hmac(format!("AWS4{}", credentials.secret.expose()).as_bytes(), auth.date.as_bytes());
    for part in auth.scope.split('/').skip(1) {
        key = hmac(&key, part.as_bytes());
    }
    let expected = hex::encode(hmac(&key, to_sign.as_bytes()));
    if bool::from(subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), auth.signature.as_bytes())) {
        Ok(())
    } else {
        Err(mismatch())
    }
}

/// The first header that must be signed and is not: `host` and `x-amz-date` always;
/// `content-type` and every `x-amz-*` header (`x-amz-target`, which names the JSON protocol's
/// action, among them) when the request has it. Every AWS SDK and the CLI sign all of these, and
/// unsigned, they could be changed in a captured request: its `X-Amz-Target` turned from
/// `SendMessage` into `PurgeQueue`.
fn unsigned_required_header<'h>(headers: &'h HeaderMap, signed: &[&str]) -> Option<&'h str> {
    const ALWAYS: [&str; 2] = ["host", "x-amz-date"];
    if let Some(missing) = ALWAYS.iter().find(|name| !signed.contains(name)) {
        return Some(missing);
    }
    headers
        .keys()
        .map(axum::http::HeaderName::as_str)
        .filter(|name| *name == "content-type" || name.starts_with("x-amz-"))
        .find(|name| !signed.contains(name))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else { return Vec::new() };
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// `YYYYMMDDTHHMMSSZ` as a time.
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    if bytes.len() != 16 || bytes.get(8) != Some(&b'T') || bytes.get(15) != Some(&b'Z') {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u64> { text.get(range)?.parse().ok() };
    let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
    let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let (y, m) = if month <= 2 { (year.checked_sub(1)?, month + 9) } else { (year, month - 3) };
    let era = y / 400;
    let yoe = y % 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(UNIX_EPOCH + Duration::from_secs(days * 86_400 + hour * 3600 + minute * 60 + second))
}

/// The canonical request; none when a signed header is missing.
fn canonical_request(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    signed: &[&str],
    signed_headers: &str,
    body: &[u8],
) -> Option<String> {
    let path = match uri.path() {
        "" => "/",
        path => path,
    };
    let mut out = format!("{method}\n{}\n{}\n", encode(path, false), canonical_query(uri.query().unwrap_or("")));
    for name in signed {
        let mut values = headers.get_all(*name).iter().peekable();
        values.peek()?;
        let joined: Vec<String> = values
            .map(|value| String::from_utf8_lossy(value.as_bytes()).split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        out.push_str(&format!("{name}:{}\n", joined.join(",")));
    }
    out.push_str(&format!("\n{signed_headers}\n{}", hex::encode(Sha256::digest(body))));
    Some(out)
}

/// The query's parameters decoded, encoded again as SigV4 encodes them, sorted.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (encode(&decode(key), true), encode(&decode(value), true))
        })
        .collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// Percent-decoding of a query component (a `%` not followed by two hex digits stays as it is).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (byte, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                at += 3;
            },
            _ => {
                out.push(byte);
                at += 1;
            },
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// SigV4's URI encoding: every byte but `A-Z a-z 0-9 - _ . ~` as `%XX` (upper case); `/` too
/// unless it is a path's.
fn encode(text: &str, slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(char::from(byte)),
            b'/' if !slash => out.push('/'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Secret;

    /// AWS's own example of a signed request (the SigV4 documentation's IAM `ListUsers` GET, with
    /// its published signature), re-scoped to no service check: the algorithm is the same.
    #[test]
    fn the_canonical_request_and_signature_follow_the_published_example() {
        let uri: Uri = "/?Action=ListUsers&Version=2010-05-08".parse().expect("uri");
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "application/x-www-form-urlencoded; charset=utf-8".parse().expect("value"));
        headers.insert("host", "iam.amazonaws.com".parse().expect("value"));
        headers.insert("x-amz-date", "20150830T123600Z".parse().expect("value"));
        let signed = ["content-type", "host", "x-amz-date"];
        let canonical = canonical_request(&Method::GET, &uri, &headers, &signed, "content-type;host;x-amz-date", b"")
            .expect("canonical");
        assert_eq!(
            hex::encode(Sha256::digest(&canonical)),
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59",
            "{canonical}"
        );
        let to_sign = format!(
            "{ALGORITHM}\n20150830T123600Z\n20150830/us-east-1/iam/aws4_request\n{}",
            hex::encode(Sha256::digest(&canonical))
        );
        let mut key = hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20150830");
        for part in ["us-east-1", "iam", "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        assert_eq!(
            hex::encode(hmac(&key, to_sign.as_bytes())),
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn amz_dates_are_read_as_utc() {
        let at = parse_amz_date("20150830T123600Z").expect("date");
        assert_eq!(at.duration_since(UNIX_EPOCH).expect("after 1970").as_secs(), 1_440_938_160);
        for bad in ["20150830T1236Z", "2015083OT123600Z", "20151330T123600Z", "20150830 123600Z"] {
            assert!(parse_amz_date(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn each_refusal_has_its_code() {
        let credentials = SqsKeyPair { access_key_id: "AKIDEXAMPLE".to_owned(), secret: Secret::new("secret") };
        let uri: Uri = "/".parse().expect("uri");
        let now = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        let code =
            |headers: &HeaderMap| verify(&credentials, &Method::POST, &uri, headers, b"", now).err().map(|e| e.code);
        let mut headers = HeaderMap::new();
        assert_eq!(code(&headers), Some("MissingAuthenticationToken"));
        headers.insert("authorization", "Basic abc".parse().expect("value"));
        assert_eq!(code(&headers), Some("IncompleteSignature"));
        let auth = |key: &str, date: &str| {
            format!(
                "AWS4-HMAC-SHA256 Credential={key}/{date}/us-east-1/sqs/aws4_request, SignedHeaders=host;x-amz-date, Signature=00"
            )
        };
        headers.insert("authorization", auth("OTHER", "20150830").parse().expect("value"));
        assert_eq!(code(&headers), Some("InvalidClientTokenId"));
        headers.insert("authorization", auth("AKIDEXAMPLE", "20150830").parse().expect("value"));
        headers.insert("host", "localhost".parse().expect("value"));
        headers.insert("x-amz-date", "20150830T123600Z".parse().expect("value"));
        assert_eq!(code(&headers), Some("SignatureDoesNotMatch"));
        headers.insert("x-amz-date", "20150830T125600Z".parse().expect("value"));
        assert_eq!(code(&headers), Some("RequestExpired"));
    }

    #[test]
    fn the_action_the_content_type_and_every_amz_header_must_be_signed() {
        let credentials = SqsKeyPair { access_key_id: "AKIDEXAMPLE".to_owned(), secret: Secret::new("secret") };
        let uri: Uri = "/".parse().expect("uri");
        let now = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        let refusal = |signed: &str, extra: &[(&'static str, &str)]| {
            let mut headers = HeaderMap::new();
            let auth = format!(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/sqs/aws4_request, \
                 SignedHeaders={signed}, Signature=00"
            );
            headers.insert("authorization", auth.parse().expect("value"));
            headers.insert("host", "localhost".parse().expect("value"));
            headers.insert("x-amz-date", "20150830T123600Z".parse().expect("value"));
            for (name, value) in extra {
                headers.insert(axum::http::HeaderName::from_static(name), value.parse().expect("value"));
            }
            verify(&credentials, &Method::POST, &uri, &headers, b"{}", now).err().map(|e| (e.code, e.message))
        };
        let target = [("x-amz-target", "AmazonSQS.PurgeQueue")];
        for (signed, extra, missing) in [
            ("host", &[][..], "x-amz-date"),
            ("x-amz-date", &[][..], "host"),
            ("host;x-amz-date", &target[..], "x-amz-target"),
            ("host;x-amz-date;x-amz-target", &[("content-type", "application/x-amz-json-1.0")][..], "content-type"),
            ("host;x-amz-date", &[("x-amz-security-token", "t")][..], "x-amz-security-token"),
        ] {
            let (code, message) = refusal(signed, extra).expect("refused");
            assert_eq!(code, "IncompleteSignature", "{signed}");
            assert!(message.contains(&format!("include {missing}")), "{signed}: {message}");
        }
        // Signed as required, the signature is what is checked.
        assert_eq!(refusal("host;x-amz-date;x-amz-target", &target).map(|r| r.0), Some("SignatureDoesNotMatch"));
        // The payload must be signed: a declared hash must be the body's.
        let unsigned = [("x-amz-content-sha256", "UNSIGNED-PAYLOAD")];
        let (code, message) = refusal("host;x-amz-content-sha256;x-amz-date", &unsigned).expect("refused");
        assert_eq!(code, "IncompleteSignature");
        assert!(message.contains("payload"), "{message}");
    }
}
