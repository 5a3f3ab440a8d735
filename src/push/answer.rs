//! What the app's answer to a delivery means. Pure: statuses are plain numbers here, because they
//! are the app's, not zkq's (zkq's own statuses live in `http/error.rs`).
//!
//! | answer | verdict |
//! | --- | --- |
//! | 2xx, body empty, not JSON, or JSON without `status`, or `{"status": "SUCCESS"}` | ack |
//! | 2xx with `{"status": "DROP"}` | drop: the message is deleted (Dapr's meaning) |
//! | 2xx with `{"status": "RETRY"}` or another status value | retry after a backoff |
//! | 429 or 503 with `Retry-After` (seconds or an HTTP date) | retry after that delay |
//! | other 4xx, 3xx, 1xx | retry after a backoff (counted toward `max_deliveries`) |
//! | 5xx | retry after a backoff |

use std::time::{Duration, SystemTime};

/// Every way a delivery ends: the fixed label set of `zkq_push_deliveries_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// 2xx (or Dapr's SUCCESS), acked.
    Success,
    /// Dapr's DROP: deleted.
    Drop,
    /// Dapr's RETRY, or a `status` zkq does not know.
    Retry,
    /// 429 or 503 with `Retry-After`.
    RetryAfter,
    /// Any other answer that is not 2xx or 5xx (a 4xx: counted toward the dead-letter queue).
    Rejected,
    /// 5xx.
    ServerError,
    /// No complete answer within `request_timeout`.
    Timeout,
    /// The connection was refused or broke before an answer.
    Unreachable,
    /// The lease was lost while the app worked (ZooKeeper session lost): delivered again elsewhere.
    LeaseLost,
    /// Shutdown ended the delivery before the app answered; released, delivered again at once.
    Released,
}

impl Outcome {
    /// Every outcome (the metric's label set is checked against it).
    #[cfg(test)]
    pub(crate) const ALL: [Outcome; 10] = [
        Outcome::Success,
        Outcome::Drop,
        Outcome::Retry,
        Outcome::RetryAfter,
        Outcome::Rejected,
        Outcome::ServerError,
        Outcome::Timeout,
        Outcome::Unreachable,
        Outcome::LeaseLost,
        Outcome::Released,
    ];

    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Drop => "drop",
            Outcome::Retry => "retry",
            Outcome::RetryAfter => "retry_after",
            Outcome::Rejected => "rejected",
            Outcome::ServerError => "server_error",
            Outcome::Timeout => "timeout",
            Outcome::Unreachable => "unreachable",
            Outcome::LeaseLost => "lease_lost",
            Outcome::Released => "released",
        }
    }
}

/// What to do with the message after the app answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Ack,
    Drop,
    /// Deliver again: after the app's `Retry-After` when it gave one, else after a backoff.
    Retry(Option<Duration>),
}

/// Dapr's answer body: `{"status": "SUCCESS" | "RETRY" | "DROP"}`.
#[derive(Debug, serde::Deserialize)]
struct DaprAnswer {
    #[serde(default)]
    status: Option<String>,
}

/// Judges an answer: its status, its `Retry-After` header, its body (`None` when it was larger
/// than zkq reads), at `now`.
pub(super) fn judge(
    status: u16,
    retry_after: Option<&str>,
    body: Option<&[u8]>,
    now: SystemTime,
) -> (Verdict, Outcome) {
    match status {
        200..=299 => judge_success_body(body),
        429 | 503 => match retry_after.and_then(|text| parse_retry_after(text, now)) {
            Some(delay) => (Verdict::Retry(Some(delay)), Outcome::RetryAfter),
            None if status == 429 => (Verdict::Retry(None), Outcome::Rejected),
            None => (Verdict::Retry(None), Outcome::ServerError),
        },
        500..=599 => (Verdict::Retry(None), Outcome::ServerError),
        _ => (Verdict::Retry(None), Outcome::Rejected),
    }
}

fn judge_success_body(body: Option<&[u8]>) -> (Verdict, Outcome) {
    let Some(answer) = body.and_then(|body| serde_json::from_slice::<DaprAnswer>(body).ok()) else {
        return (Verdict::Ack, Outcome::Success);
    };
    match answer.status.as_deref().map(str::to_ascii_uppercase).as_deref() {
        None | Some("" | "SUCCESS") => (Verdict::Ack, Outcome::Success),
        Some("DROP") => (Verdict::Drop, Outcome::Drop),
        // RETRY, and (as Dapr does) any status it does not know.
        Some(_) => (Verdict::Retry(None), Outcome::Retry),
    }
}

/// `Retry-After`: whole seconds, or an HTTP date (a date in the past means now).
pub(super) fn parse_retry_after(text: &str, now: SystemTime) -> Option<Duration> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(status: u16, retry_after: Option<&str>, body: &str) -> (Verdict, Outcome) {
        judge(status, retry_after, Some(body.as_bytes()), SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
    }

    #[test]
    fn two_hundreds_ack_unless_dapr_says_otherwise() {
        for body in ["", "ok", "{}", "[1]", r#"{"status": "SUCCESS"}"#, r#"{"status": "success"}"#, r#"{"x": 1}"#] {
            assert_eq!(verdict(200, None, body), (Verdict::Ack, Outcome::Success), "{body:?}");
        }
        assert_eq!(verdict(204, None, ""), (Verdict::Ack, Outcome::Success));
        assert_eq!(verdict(200, None, r#"{"status":"DROP"}"#), (Verdict::Drop, Outcome::Drop));
        assert_eq!(verdict(202, None, r#"{"status":"RETRY"}"#), (Verdict::Retry(None), Outcome::Retry));
        assert_eq!(verdict(200, None, r#"{"status":"LATER"}"#), (Verdict::Retry(None), Outcome::Retry));
        assert_eq!(
            judge(200, None, None, SystemTime::UNIX_EPOCH),
            (Verdict::Ack, Outcome::Success),
            "an answer too large to read is still a 2xx"
        );
    }

    #[test]
    fn failures_retry_and_retry_after_sets_the_delay() {
        assert_eq!(verdict(429, Some("7"), ""), (Verdict::Retry(Some(Duration::from_secs(7))), Outcome::RetryAfter));
        assert_eq!(verdict(503, Some(" 2 "), ""), (Verdict::Retry(Some(Duration::from_secs(2))), Outcome::RetryAfter));
        assert_eq!(verdict(429, None, ""), (Verdict::Retry(None), Outcome::Rejected));
        assert_eq!(verdict(429, Some("soon"), ""), (Verdict::Retry(None), Outcome::Rejected));
        assert_eq!(verdict(503, None, ""), (Verdict::Retry(None), Outcome::ServerError));
        assert_eq!(verdict(500, Some("5"), ""), (Verdict::Retry(None), Outcome::ServerError), "only 429 and 503");
        assert_eq!(verdict(404, None, r#"{"status":"DROP"}"#), (Verdict::Retry(None), Outcome::Rejected));
        assert_eq!(verdict(400, None, ""), (Verdict::Retry(None), Outcome::Rejected));
        assert_eq!(verdict(302, None, ""), (Verdict::Retry(None), Outcome::Rejected));
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now), Some(Duration::from_secs(10)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(Duration::ZERO), "in the past");
        assert_eq!(parse_retry_after("99999999999999999999999", now), Some(Duration::from_secs(u64::MAX)));
        for bad in ["", "-1", "1.5", "tomorrow"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn outcome_labels_are_distinct() {
        let labels: std::collections::HashSet<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), Outcome::ALL.len());
        assert_eq!(Outcome::ALL.map(Outcome::as_str), crate::metrics::PUSH_OUTCOMES, "the metric's label set");
    }
}
