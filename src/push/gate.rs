//! Whether the app may be called now, shared by the workers of one subscription: its readiness
//! (when a `readiness_url` is set), whether it could be reached, and a pause (the backoff while it
//! cannot be reached, or its own `Retry-After`). Workers wait on it instead of trying in a loop.

use prometheus::IntGauge;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;

#[derive(Debug, Clone, Copy)]
struct GateState {
    /// The readiness probe's last answer (always true without a readiness URL).
    ready: bool,
    /// The last connection attempt succeeded.
    reachable: bool,
    /// No new delivery starts before this.
    paused_until: Option<Instant>,
    /// Connection attempts that failed in a row.
    failures: u32,
}

impl GateState {
    fn open_at(&self, now: Instant) -> bool {
        self.ready && self.paused_until.is_none_or(|until| until <= now)
    }
}

/// The gate of one subscription.
pub(super) struct AppGate {
    state: watch::Sender<GateState>,
    backoff: Backoff,
    available: IntGauge,
}

impl AppGate {
    pub(super) fn new(gated_by_readiness: bool, backoff: Backoff, available: IntGauge) -> AppGate {
        let initial = GateState { ready: !gated_by_readiness, reachable: false, paused_until: None, failures: 0 };
        available.set(0);
        AppGate { state: watch::Sender::new(initial), backoff, available }
    }

    fn update(&self, change: impl FnOnce(&mut GateState)) {
        self.state.send_modify(|state| {
            change(state);
            self.available.set(i64::from(state.ready && state.reachable));
        });
    }

    /// Waits until deliveries may start; false if `stop` came first.
    pub(super) async fn wait_open(&self, stop: &CancellationToken) -> bool {
        let mut changes = self.state.subscribe();
        loop {
            let state = *changes.borrow_and_update();
            if state.open_at(Instant::now()) {
                return true;
            }
            let pause_ends = state.paused_until.filter(|_| state.ready);
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = changes.changed() => {},
                _ = sleep_until(pause_ends) => {},
            }
        }
    }

    /// Resolves once the gate is closed (readiness lost, or a pause begun).
    pub(super) async fn closed(&self) {
        let mut changes = self.state.subscribe();
        loop {
            if !changes.borrow_and_update().open_at(Instant::now()) {
                return;
            }
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// The readiness probe answered; true when that changed the app's readiness.
    pub(super) fn set_ready(&self, ready: bool) -> bool {
        let changed = self.state.borrow().ready != ready;
        if changed {
            self.update(|state| state.ready = ready);
        }
        changed
    }

    /// A connection to the app was made; true when attempts had failed before it.
    pub(super) fn reached(&self) -> bool {
        let state = *self.state.borrow();
        if !state.reachable || state.failures != 0 {
            self.update(|state| {
                state.reachable = true;
                state.failures = 0;
            });
        }
        state.failures != 0
    }

    /// A connection to the app failed: pause everyone for the next backoff, unless a pause is
    /// already running (several workers failing together count as one failure). Returns the
    /// failures in a row so far.
    pub(super) fn unreachable(&self) -> u32 {
        let now = Instant::now();
        let mut failures = 0;
        self.update(|state| {
            state.reachable = false;
            if state.paused_until.is_none_or(|until| until <= now) {
                state.failures = state.failures.saturating_add(1);
                state.paused_until = Some(now + self.backoff.delay(state.failures));
            }
            failures = state.failures;
        });
        failures
    }

    /// The app asked for a pause (`Retry-After`): no delivery starts before it ends.
    pub(super) fn pause(&self, delay: std::time::Duration) {
        let until = Instant::now() + delay;
        self.update(|state| state.paused_until = Some(state.paused_until.map_or(until, |u| u.max(until))));
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::PushConfig;

    fn gate(readiness: bool) -> AppGate {
        let config = PushConfig {
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(8),
            backoff_jitter: 0.0,
            ..PushConfig::default()
        };
        AppGate::new(readiness, Backoff::new(&config), IntGauge::new("g", "g").expect("gauge"))
    }

    async fn opens_within(gate: &AppGate, limit: Duration) -> bool {
        tokio::time::timeout(limit, gate.wait_open(&CancellationToken::new())).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_app_is_tried_again_after_a_doubling_pause() {
        let gate = gate(false);
        assert!(opens_within(&gate, Duration::ZERO).await);
        let started = Instant::now();
        for expected in [1, 2, 4, 8, 8] {
            gate.unreachable();
            gate.unreachable(); // a second worker failing in the same pause does not double it again
            let before = Instant::now();
            assert!(opens_within(&gate, Duration::from_secs(60)).await);
            assert_eq!(Instant::now() - before, Duration::from_secs(expected));
        }
        assert_eq!(gate.available.get(), 0);
        gate.reached();
        assert_eq!(gate.available.get(), 1);
        gate.unreachable();
        let before = Instant::now();
        assert!(opens_within(&gate, Duration::from_secs(60)).await);
        assert_eq!(Instant::now() - before, Duration::from_secs(1), "reset by a connection");
        assert!(started.elapsed() >= Duration::from_secs(23));
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_and_retry_after_close_the_gate() {
        let gate = gate(true);
        assert!(!opens_within(&gate, Duration::from_secs(30)).await, "not ready before the first probe");
        gate.set_ready(true);
        gate.reached();
        assert_eq!(gate.available.get(), 1);
        assert!(opens_within(&gate, Duration::ZERO).await);
        let closed = gate.closed();
        tokio::pin!(closed);
        assert!(futures::FutureExt::now_or_never(&mut closed).is_none());
        gate.pause(Duration::from_secs(5));
        assert!(futures::FutureExt::now_or_never(&mut closed).is_some(), "a pause closes the gate at once");
        let before = Instant::now();
        assert!(opens_within(&gate, Duration::from_secs(60)).await);
        assert_eq!(Instant::now() - before, Duration::from_secs(5));
        gate.set_ready(false);
        assert_eq!(gate.available.get(), 0);
        assert!(!opens_within(&gate, Duration::from_secs(30)).await);
        let stop = CancellationToken::new();
        stop.cancel();
        assert!(!gate.wait_open(&stop).await, "stop ends the wait");
    }
}
