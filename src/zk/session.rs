//! The supervised ZooKeeper session: one per process, shared by everything.
//!
//! A supervisor task owns the client. It connects with capped, jittered backoff (no busy loop
//! while ZooKeeper is down), follows the client's state stream and publishes Curator's
//! connection states on a `watch` channel. `Expired` is terminal for a client, so after LOST
//! the supervisor builds a new client and a new session on its own.
//!
//! Modules that keep watches or caches subscribe to [`SessionStatus`] and re-read whenever
//! [`SessionStatus::epoch`] changes: it moves on every (re)connection, because one-shot watches
//! may have missed events while the connection was down and a new session has none at all.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zkc;

use super::{Zk, ZkError};
use crate::metrics::Metrics;

/// Curator's connection states, plus the time before the first session exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// No session has been established yet (startup).
    Connecting,
    /// A new session is established.
    Connected,
    /// The connection is lost; the session (and its ephemeral nodes) may survive.
    Suspended,
    /// The connection came back to the same session.
    Reconnected,
    /// The session expired: its ephemeral nodes are gone. A new session follows.
    Lost,
    /// Connected to a server that only serves reads.
    ReadOnly,
    /// zkq closed the session (shutdown).
    Closed,
}

impl ConnectionState {
    /// The `state` label of `zkq_zookeeper_connection_state`, if this state has one.
    pub fn label(self) -> Option<&'static str> {
        match self {
            ConnectionState::Connected => Some("connected"),
            ConnectionState::Suspended => Some("suspended"),
            ConnectionState::Reconnected => Some("reconnected"),
            ConnectionState::Lost => Some("lost"),
            ConnectionState::ReadOnly => Some("read_only"),
            ConnectionState::Connecting | ConnectionState::Closed => None,
        }
    }

    /// Whether requests can be served (reads and writes).
    pub fn is_connected(self) -> bool {
        matches!(self, ConnectionState::Connected | ConnectionState::Reconnected)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionState::Connecting => "connecting",
            ConnectionState::Closed => "closed",
            other => other.label().unwrap_or("unknown"),
        }
    }
}

/// What the rest of zkq can observe about the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStatus {
    pub state: ConnectionState,
    /// The id of the current (or last) session, 0 before the first one.
    pub session_id: i64,
    /// Increments with every new session; receipts and locks of an older generation are void.
    pub generation: u64,
    /// Increments on every (re)connection; caches re-read when it changes.
    pub epoch: u64,
}

/// Settings the supervisor needs; taken from the validated configuration.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    pub connect: String,
    pub session_timeout: Duration,
    pub request_timeout: Duration,
    pub auth_digest: Option<String>,
    pub reconnect_backoff_max: Duration,
}

struct Inner {
    settings: SessionSettings,
    metrics: Arc<Metrics>,
    status: watch::Sender<SessionStatus>,
    current: RwLock<Option<Zk>>,
}

/// Handle on the process's supervised session. Cheap to clone.
#[derive(Clone)]
pub struct ZkSession {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkSession").field("status", &self.status()).finish()
    }
}

impl ZkSession {
    /// Starts the supervisor. It runs until `shutdown` is cancelled, then closes the session.
    pub fn start(
        settings: SessionSettings,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> (ZkSession, tokio::task::JoinHandle<()>) {
        let initial = SessionStatus { state: ConnectionState::Connecting, session_id: 0, generation: 0, epoch: 0 };
        let (status, _) = watch::channel(initial);
        let session = ZkSession { inner: Arc::new(Inner { settings, metrics, status, current: RwLock::new(None) }) };
        let task = tokio::spawn(session.clone().supervise(shutdown));
        (session, task)
    }

    /// The latest status.
    pub fn status(&self) -> SessionStatus {
        *self.inner.status.borrow()
    }

    /// A receiver that sees every status change (latest value semantics).
    pub fn subscribe(&self) -> watch::Receiver<SessionStatus> {
        self.inner.status.subscribe()
    }

    /// The deadline a request gets by default.
    pub fn request_timeout(&self) -> Duration {
        self.inner.settings.request_timeout
    }

    /// The session timeout asked for (the server may have negotiated another).
    pub fn session_timeout(&self) -> Duration {
        self.inner.settings.session_timeout
    }

    /// The connected session now, if there is one.
    pub fn current(&self) -> Option<Zk> {
        if !self.status().state.is_connected() {
            return None;
        }
        self.inner.current.read().ok().and_then(|c| c.clone())
    }

    /// Waits until a session is connected, or fails with `Unavailable` at `deadline`.
    pub async fn connected(&self, deadline: Instant) -> Result<Zk, ZkError> {
        let mut rx = self.subscribe();
        loop {
            if let Some(zk) = self.current() {
                return Ok(zk.with_deadline(deadline));
            }
            if rx.borrow_and_update().state == ConnectionState::Closed {
                return Err(ZkError::Unavailable);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => return Err(ZkError::Unavailable),
            }
        }
    }

    /// Runs `work` with a connected session (bounded by the request timeout) at once and then
    /// every `period`, until `shutdown`. For sweeps that tidy ZooKeeper in the background.
    pub async fn periodically<F, Fut>(&self, period: Duration, shutdown: &CancellationToken, mut work: F)
    where
        F: FnMut(Zk) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            let zk = tokio::select! {
                _ = shutdown.cancelled() => return,
                zk = self.connected(far) => zk,
            };
            if let Ok(zk) = zk {
                work(zk.with_deadline(Instant::now() + self.request_timeout())).await;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(period) => {},
            }
        }
    }

    fn publish(&self, state: ConnectionState, session_id: i64, new_generation: bool, new_epoch: bool) {
        let before = self.status();
        let status = SessionStatus {
            state,
            session_id,
            generation: before.generation + u64::from(new_generation),
            epoch: before.epoch + u64::from(new_epoch),
        };
        if status == before {
            return;
        }
        if state != before.state {
            let session = format!("{session_id:#x}");
            match state {
                ConnectionState::Lost => {
                    tracing::warn!(state = state.as_str(), session = %session, "ZooKeeper session lost; its locks are gone")
                },
                ConnectionState::Suspended => {
                    tracing::warn!(state = state.as_str(), session = %session, "ZooKeeper connection suspended")
                },
                _ => tracing::info!(state = state.as_str(), session = %session, "ZooKeeper connection state changed"),
            }
        }
        match state {
            ConnectionState::Lost => self.inner.metrics.zk_session_expirations.inc(),
            ConnectionState::Reconnected if before.state != ConnectionState::Reconnected => {
                self.inner.metrics.zk_reconnects.inc()
            },
            _ => {},
        }
        self.inner.metrics.set_connection_state(state.label());
        self.inner.status.send_replace(status);
    }

    fn set_current(&self, zk: Option<Zk>) {
        if let Ok(mut current) = self.inner.current.write() {
            *current = zk;
        }
    }

    async fn connect_once(&self) -> Result<zkc::Client, zkc::Error> {
        let settings = &self.inner.settings;
        let mut connector = zkc::Client::connector()
            .with_session_timeout(settings.session_timeout)
            .with_connection_timeout(settings.session_timeout.min(Duration::from_secs(5)));
        if let Some(auth) = &settings.auth_digest {
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        connector.connect(&settings.connect).await
    }

    async fn supervise(self, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(self.inner.settings.reconnect_backoff_max);
        let mut failures_logged = false;
        loop {
            let client = tokio::select! {
                _ = shutdown.cancelled() => break,
                result = self.connect_once() => result,
            };
            let client = match client {
                Ok(client) => client,
                Err(err) => {
                    if !failures_logged {
                        tracing::warn!(connect = %self.inner.settings.connect, error = %err,
                            "cannot reach ZooKeeper; retrying with backoff");
                        failures_logged = true;
                    }
                    let pause = backoff.next_delay();
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(pause) => continue,
                    }
                },
            };
            backoff.reset();
            failures_logged = false;
            let session_id = client.session_id().0;
            let mut states = client.state_watcher();
            self.set_current(Some(Zk::new(
                client,
                self.status().generation + 1,
                self.inner.settings.request_timeout,
                self.inner.metrics.clone(),
            )));
            self.publish(ConnectionState::Connected, session_id, true, true);

            let mut last = zkc::SessionState::SyncConnected;
            let ended = loop {
                let state = tokio::select! {
                    _ = shutdown.cancelled() => break SessionEnd::Shutdown(states),
                    state = states.changed() => state,
                };
                use zkc::SessionState as S;
                match state {
                    S::Disconnected => self.publish(ConnectionState::Suspended, session_id, false, false),
                    S::SyncConnected => {
                        // The stream is latest-value: SyncConnected after SyncConnected is a flap we
                        // did not see. Either way the connection was down, so caches re-read.
                        if last == S::SyncConnected {
                            self.publish(ConnectionState::Suspended, session_id, false, false);
                        }
                        self.publish(ConnectionState::Reconnected, session_id, false, true);
                    },
                    S::ConnectedReadOnly => self.publish(ConnectionState::ReadOnly, session_id, false, false),
                    S::Expired => break SessionEnd::Expired,
                    S::AuthFailed => {
                        tracing::error!(session = %format!("{session_id:#x}"),
                            "ZooKeeper authentication failed; check zookeeper.auth_digest");
                        break SessionEnd::Expired;
                    },
                    S::Closed => break SessionEnd::Expired,
                }
                last = state;
            };
            self.set_current(None);
            match ended {
                SessionEnd::Expired => {
                    self.publish(ConnectionState::Lost, session_id, false, false);
                    // A short pause so that an ensemble refusing sessions does not make us spin.
                    let pause = backoff.next_delay();
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(pause) => {},
                    }
                },
                SessionEnd::Shutdown(states) => {
                    self.close_client(states).await;
                    break;
                },
            }
        }
        self.set_current(None);
        let status = self.status();
        self.publish(ConnectionState::Closed, status.session_id, false, false);
    }

    /// Dropping the last client handle sends CloseSession; wait a moment for it to be confirmed
    /// so the server removes our ephemeral nodes now rather than after the session timeout.
    async fn close_client(&self, mut states: zkc::StateWatcher) {
        let wait = async {
            loop {
                if states.state().is_terminated() {
                    return;
                }
                states.changed().await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(2), wait).await.is_err() {
            tracing::warn!("ZooKeeper session close was not confirmed within 2s");
        }
    }
}

enum SessionEnd {
    Expired,
    Shutdown(zkc::StateWatcher),
}

/// Exponential backoff from 100 ms to a cap, with jitter so that many sidecars restarting
/// together do not reconnect in lockstep.
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const START: Duration = Duration::from_millis(100);

    fn new(max: Duration) -> Backoff {
        Backoff { next: Self::START, max }
    }

    fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let jitter = rand::random_range(0.5..1.0);
        base.mul_f64(jitter)
    }

    fn reset(&mut self) {
        self.next = Self::START;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_secs(2));
        let delays: Vec<Duration> = (0..10).map(|_| backoff.next_delay()).collect();
        assert!(delays[0] <= Duration::from_millis(100));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(2)));
        assert!(delays[9] >= Duration::from_secs(1), "capped delay keeps at least half the cap: {delays:?}");
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn only_curator_states_have_metric_labels() {
        assert_eq!(ConnectionState::Connecting.label(), None);
        assert_eq!(ConnectionState::ReadOnly.label(), Some("read_only"));
        assert!(ConnectionState::Reconnected.is_connected());
        assert!(!ConnectionState::Suspended.is_connected());
    }
}
