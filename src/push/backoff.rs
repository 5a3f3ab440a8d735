//! A subscription's pacing: its `backoff_*` keys as a [`Backoff`], and how far an app's
//! `Retry-After` is honoured.

use std::time::Duration;

use crate::config::PushConfig;
use crate::types::Backoff;

/// The longest `Retry-After` honoured: the message stays leased (invisible) for the whole pause,
/// so an app's date years ahead must not hide it for years.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The pacing of a subscription's retries, from its `backoff_*` keys.
pub(super) fn policy(config: &PushConfig) -> Backoff {
    Backoff::new(config.backoff_initial, config.backoff_max, config.backoff_jitter)
}

/// An app's `Retry-After`, as asked: longer than `backoff_max` if the app says so (it knows when it
/// can take the message), up to [`MAX_RETRY_AFTER`]; at least `backoff_initial`, so that an app
/// answering `0` (or a date in the past) cannot make zkq spin.
pub(super) fn retry_after(policy: &Backoff, asked: Duration) -> Duration {
    asked.min(MAX_RETRY_AFTER).max(policy.initial())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(initial_ms: u64, max_ms: u64, jitter: f64) -> Backoff {
        Backoff::new(Duration::from_millis(initial_ms), Duration::from_millis(max_ms), jitter)
    }

    #[test]
    fn retry_after_is_honoured_beyond_backoff_max_up_to_an_hour() {
        let b = backoff(100, 1000, 0.2);
        assert_eq!(retry_after(&b, Duration::ZERO), Duration::from_millis(100), "no spinning on 0");
        assert_eq!(retry_after(&b, Duration::from_millis(500)), Duration::from_millis(500));
        assert_eq!(retry_after(&b, Duration::from_secs(120)), Duration::from_secs(120), "not cut to backoff_max");
        assert_eq!(retry_after(&b, Duration::from_secs(3600)), MAX_RETRY_AFTER);
        assert_eq!(retry_after(&b, Duration::from_secs(86_400 * 365)), MAX_RETRY_AFTER, "capped at an hour");
        let slow = backoff(3_600_000, 3_600_000, 0.0);
        assert_eq!(retry_after(&slow, Duration::ZERO), MAX_RETRY_AFTER, "backoff_initial is at most an hour");
    }
}
