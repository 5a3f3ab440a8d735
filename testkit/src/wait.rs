//! Waiting for an observable condition, never for a fixed time.

use std::future::Future;
use std::time::{Duration, Instant};

/// Awaits `condition` until it holds, polling every 50 ms; panics with `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
