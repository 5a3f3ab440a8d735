//! Whether the app may be called now, shared by the workers of one subscription: its readiness
//! (when a `readiness_url` is set), whether it could be reached, and a pause (the backoff while it
//! cannot be reached, or its own `Retry-After`). Workers wait on it instead of trying in a loop.

use prometheus::IntGauge;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::types::Backoff;

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
    /// While the app is known to be unreachable, one worker at a time tries it.
    probing: bool,
}

impl GateState {
    fn open_at(&self, now: Instant) -> bool {
        self.ready && self.paused_until.is_none_or(|until| until <= now)
    }
}

/// Leave to start a delivery. While the app is known to be unreachable it is the one probe of
/// the app; dropping it lets another worker try.
pub(super) struct Pass<'a> {
    probing: Option<&'a AppGate>,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.probing {
            gate.state.send_modify(|state| state.probing = false);
        }
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
        let initial =
            GateState { ready: !gated_by_readiness, reachable: false, paused_until: None, failures: 0, probing: false };
        available.set(0);
        AppGate { state: watch::Sender::new(initial), backoff, available }
    }

    fn update(&self, change: impl FnOnce(&mut GateState)) {
        self.state.send_modify(|state| {
            change(state);
            self.available.set(i64::from(state.ready && state.reachable));
        });
    }

    /// Waits until a delivery may start; `None` if `stop` came first. While the app is known to
    /// be unreachable, only one worker at a time gets a pass (its connection attempt is the
    /// probe); the others wait for its outcome.
    pub(super) async fn wait_open(&self, stop: &CancellationToken) -> Option<Pass<'_>> {
        let mut changes = self.state.subscribe();
        loop {
            let state = *changes.borrow_and_update();
            let now = Instant::now();
            if state.open_at(now) {
                if state.failures == 0 {
                    return Some(Pass { probing: None });
                }
                let mut granted = false;
                self.state.send_if_modified(|state| {
                    granted = !state.probing && state.failures > 0;
                    state.probing |= granted;
                    granted
                });
                if granted {
                    return Some(Pass { probing: Some(self) });
                }
            }
            // A pause that has ended is no reason to look again (another worker holds the probe:
            // its outcome is a change); waking on it would spin.
            let pause_ends = state.paused_until.filter(|until| state.ready && *until > now);
            tokio::select! {
                _ = stop.cancelled() => return None,
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
            ..PushConfig::to(crate::types::AppUrl::parse("http://127.0.0.1/").expect("a URL"))
        };
        AppGate::new(readiness, super::super::backoff::policy(&config), IntGauge::new("g", "g").expect("gauge"))
    }

    async fn opens_within(gate: &AppGate, limit: Duration) -> bool {
        tokio::time::timeout(limit, gate.wait_open(&CancellationToken::new())).await.is_ok_and(|pass| pass.is_some())
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
        assert!(gate.wait_open(&stop).await.is_none(), "stop ends the wait");
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_app_is_unreachable_one_worker_at_a_time_tries_it() {
        let gate = gate(false);
        let never = CancellationToken::new();
        let (first, second) = (gate.wait_open(&never).await, gate.wait_open(&never).await);
        assert!(first.is_some() && second.is_some(), "not known to be down yet: everyone tries");
        drop((first, second));
        gate.unreachable();
        let probe =
            tokio::time::timeout(Duration::from_secs(5), gate.wait_open(&never)).await.expect("after the pause");
        assert!(probe.is_some());
        assert!(
            tokio::time::timeout(Duration::from_secs(30), gate.wait_open(&never)).await.is_err(),
            "a second worker waits while the first one probes"
        );
        gate.unreachable(); // the probe failed
        drop(probe);
        let before = Instant::now();
        let probe = gate.wait_open(&never).await.expect("the next probe");
        assert_eq!(Instant::now() - before, Duration::from_secs(2), "after the next, longer pause");
        gate.reached();
        drop(probe);
        let everyone = [gate.wait_open(&never).await, gate.wait_open(&never).await];
        assert!(everyone.iter().all(Option::is_some), "reachable again: everyone delivers");
    }
}
