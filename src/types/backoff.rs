//! Exponential backoff with jitter: the one way zkq paces its retries (ZooKeeper reconnects, push
//! deliveries, background settlements, restarts of background tasks, compare-and-set loops).

use std::time::Duration;

/// A pacing policy: the pause after the `n`th failure in a row is `initial × 2^(n−1)`, capped at
/// `max`, then shortened by up to `jitter` of itself at random (0: exact; 0.5: between half and
/// all of it; 1: anywhere below it), so that many clients retrying together spread out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    jitter: f64,
}

impl Backoff {
    pub(crate) const fn new(initial: Duration, max: Duration, jitter: f64) -> Backoff {
        Backoff { initial, max, jitter }
    }

    /// The first pause, unjittered.
    pub(crate) fn initial(&self) -> Duration {
        self.initial
    }

    /// The pause after `failures` failures in a row (1: the first), jittered.
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        self.jittered(failures, rand::random_range(0.0..1.0))
    }

    /// [`Backoff::delay`] with its random draw `random` (in [0, 1)) given.
    pub(crate) fn jittered(&self, failures: u32, random: f64) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        let base = self.initial.saturating_mul(1u32 << doublings).min(self.max);
        let keep = (1.0 - self.jitter * random.clamp(0.0, 1.0)).clamp(0.0, 1.0);
        base.mul_f64(keep)
    }

    /// A run of retries under this policy, counting its failures.
    pub(crate) fn retries(self) -> Retries {
        Retries { policy: self, failures: 0 }
    }
}

/// Failures in a row under one [`Backoff`]: each pause follows the last.
#[derive(Debug, Clone)]
pub(crate) struct Retries {
    policy: Backoff,
    failures: u32,
}

impl Retries {
    /// The pause after one more failure.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.policy.delay(self.failures)
    }

    /// Waits out the pause after one more failure.
    pub(crate) async fn sleep(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// A success: the next failure pauses as the first did.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000), 0.0);
        let pauses: Vec<u128> = (1..=6).map(|n| b.jittered(n, 0.9).as_millis()).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.jittered(0, 0.5), Duration::from_millis(100), "no failure yet: the first pause");
        assert_eq!(b.jittered(u32::MAX, 0.5), Duration::from_millis(1000), "no overflow");
    }

    #[test]
    fn jitter_shortens_a_pause_by_at_most_its_share() {
        let b = Backoff::new(Duration::from_millis(1000), Duration::from_secs(10), 0.5);
        assert_eq!(b.jittered(1, 0.0), Duration::from_millis(1000));
        assert_eq!(b.jittered(1, 1.0), Duration::from_millis(500));
        for _ in 0..100 {
            let pause = b.delay(1);
            assert!(pause > Duration::from_millis(499) && pause <= Duration::from_millis(1000), "{pause:?}");
        }
    }

    #[test]
    fn retries_grow_to_the_cap_and_reset() {
        let mut retries = Backoff::new(Duration::from_millis(100), Duration::from_secs(2), 0.0).retries();
        let pauses: Vec<Duration> = (0..10).map(|_| retries.next_delay()).collect();
        assert_eq!(pauses.first(), Some(&Duration::from_millis(100)));
        assert_eq!(pauses.last(), Some(&Duration::from_secs(2)));
        retries.reset();
        assert_eq!(retries.next_delay(), Duration::from_millis(100));
    }
}
