//! The wall clock, in the unit Curator writes into delay-queue names and zkq into its deadlines.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a clock set before 1970), the unit of delay-queue
/// names, lease expiries and `deliver_at`.
pub fn now_epoch_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_reads_epoch_milliseconds() {
        // 2020-09-13 and 2100-01-01: a reading in seconds or microseconds falls outside.
        let now = now_epoch_ms();
        assert!((1_600_000_000_000..4_102_444_800_000).contains(&now), "{now}");
    }
}
