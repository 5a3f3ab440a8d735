//! Exponential backoff with jitter, from a subscription's `backoff_*` keys.

use std::time::Duration;

use crate::config::PushConfig;

/// The longest `Retry-After` honoured: the message stays leased (invisible) for the whole pause,
/// so an app's date years ahead must not hide it for years.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// How long to pause after failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Backoff {
    initial: Duration,
    max: Duration,
    jitter: f64,
}

impl Backoff {
    pub(super) fn new(config: &PushConfig) -> Backoff {
        Backoff { initial: config.backoff_initial, max: config.backoff_max, jitter: config.backoff_jitter }
    }

    /// The pause after `failures` failures in a row (1: the first), jittered.
    pub(super) fn delay(&self, failures: u32) -> Duration {
        self.jittered(failures, rand::random_range(0.0..1.0))
    }

    /// `initial × 2^(failures−1)`, capped at `max`, shortened by `jitter × random` (`random` in [0, 1)).
    fn jittered(&self, failures: u32, random: f64) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        let base = self.initial.saturating_mul(1u32 << doublings).min(self.max);
        let keep = (1.0 - self.jitter * random.clamp(0.0, 1.0)).clamp(0.0, 1.0);
        base.mul_f64(keep)
    }

    /// An app's `Retry-After`, as asked: longer than `max` if the app says so (it knows when it
    /// can take the message), up to [`MAX_RETRY_AFTER`]; at least `initial`, so that an app
    /// answering `0` (or a date in the past) cannot make zkq spin.
    pub(super) fn bounded(&self, asked: Duration) -> Duration {
        asked.min(MAX_RETRY_AFTER).max(self.initial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(initial_ms: u64, max_ms: u64, jitter: f64) -> Backoff {
        Backoff { initial: Duration::from_millis(initial_ms), max: Duration::from_millis(max_ms), jitter }
    }

    #[test]
    fn pauses_double_up_to_the_cap() {
        let b = backoff(100, 1000, 0.0);
        let pauses: Vec<u64> = (1..=6).map(|n| b.jittered(n, 0.9).as_millis() as u64).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.jittered(0, 0.5), Duration::from_millis(100), "no failure yet: the first pause");
        assert_eq!(b.jittered(u32::MAX, 0.5), Duration::from_millis(1000), "no overflow");
    }

    #[test]
    fn jitter_shortens_by_at_most_its_fraction() {
        let b = backoff(1000, 60_000, 0.2);
        assert_eq!(b.jittered(1, 0.0), Duration::from_millis(1000));
        assert_eq!(b.jittered(1, 0.5), Duration::from_millis(900));
        assert!(b.jittered(1, 0.999_999) >= Duration::from_millis(800));
        let full = backoff(1000, 60_000, 1.0);
        assert!(full.jittered(3, 0.75) == Duration::from_millis(1000));
        for _ in 0..1000 {
            let d = b.delay(2);
            assert!(d > Duration::from_millis(1600) && d <= Duration::from_millis(2000), "{d:?}");
        }
    }

    #[test]
    fn retry_after_is_honoured_beyond_backoff_max_up_to_an_hour() {
        let b = backoff(100, 1000, 0.2);
        assert_eq!(b.bounded(Duration::ZERO), Duration::from_millis(100), "no spinning on 0");
        assert_eq!(b.bounded(Duration::from_millis(500)), Duration::from_millis(500));
        assert_eq!(b.bounded(Duration::from_secs(120)), Duration::from_secs(120), "not cut to backoff_max");
        assert_eq!(b.bounded(Duration::from_secs(3600)), MAX_RETRY_AFTER);
        assert_eq!(b.bounded(Duration::from_secs(86_400 * 365)), MAX_RETRY_AFTER, "capped at an hour");
        let slow = backoff(3_600_000, 3_600_000, 0.0);
        assert_eq!(slow.bounded(Duration::ZERO), MAX_RETRY_AFTER, "backoff_initial is at most an hour");
    }
}
