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

use super::tls::{TlsMaterial, TlsSettings, diagnose};
use super::{Zk, ZkError};
use crate::config::{NodeAcl, Secret, acl_perms};
use crate::metrics::Metrics;
use crate::types::Backoff;

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

/// Settings the supervisor needs; taken from the validated configuration. `Debug` shows no secret.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    pub connect: String,
    pub session_timeout: Duration,
    pub request_timeout: Duration,
    /// `digest` credentials `user:password`, sent on every (re)connection.
    pub auth_digest: Option<Secret>,
    /// SASL DIGEST-MD5 credentials.
    pub sasl: Option<SaslCredentials>,
    /// TLS to every server, with the files already read and checked.
    pub tls: Option<(TlsSettings, TlsMaterial)>,
    /// The ACL of every node zkq creates.
    pub acl: NodeAcl,
    pub reconnect_backoff_max: Duration,
    /// The servers' `jute.maxbuffer`: the largest request they read (`zookeeper.jute_maxbuffer`).
    pub jute_maxbuffer: usize,
}

/// A SASL user and its password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslCredentials {
    pub username: String,
    pub password: Secret,
}

/// The TLS state of the session: the certificates every new connection uses, replaced when the
/// files change.
struct TlsState {
    settings: TlsSettings,
    certs: zkc::TlsDynamicCerts,
    material: RwLock<TlsMaterial>,
}

struct Inner {
    settings: SessionSettings,
    metrics: Arc<Metrics>,
    status: watch::Sender<SessionStatus>,
    current: RwLock<Option<Zk>>,
    acl: Arc<[zkc::Acl]>,
    tls: Option<TlsState>,
    /// Why the last attempt to open a session failed, in words; `None` once one succeeded.
    last_error: RwLock<Option<String>>,
}

/// A session setup that cannot work; found before anything connects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SessionSetupError(String);

/// The crate's ACL list for the configured node ACL.
fn client_acl(acl: &NodeAcl) -> Arc<[zkc::Acl]> {
    match acl {
        NodeAcl::Open => zkc::Acls::anyone_all().to_vec().into(),
        NodeAcl::CreatorAll => zkc::Acls::creator_all().to_vec().into(),
        NodeAcl::List(entries) => entries
            .iter()
            .map(|entry| {
                let permission = [
                    (acl_perms::READ, zkc::Permission::READ),
                    (acl_perms::WRITE, zkc::Permission::WRITE),
                    (acl_perms::CREATE, zkc::Permission::CREATE),
                    (acl_perms::DELETE, zkc::Permission::DELETE),
                    (acl_perms::ADMIN, zkc::Permission::ADMIN),
                ]
                .into_iter()
                .filter(|(bit, _)| entry.perms & bit != 0)
                .fold(zkc::Permission::NONE, |all, (_, permission)| all | permission);
                zkc::Acl::new(permission, zkc::AuthId::new(&entry.scheme, &entry.id))
            })
            .collect(),
    }
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
    /// Starts the supervisor (and, with TLS, the watch on the certificate files). It runs until
    /// `shutdown` is cancelled, then closes the session.
    pub fn start(
        settings: SessionSettings,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Result<(ZkSession, tokio::task::JoinHandle<()>), SessionSetupError> {
        let initial = SessionStatus { state: ConnectionState::Connecting, session_id: 0, generation: 0, epoch: 0 };
        let (status, _) = watch::channel(initial);
        let tls = match &settings.tls {
            Some((tls_settings, material)) => {
                let certs = material
                    .certs()
                    .map_err(|err| SessionSetupError(format!("the TLS certificates cannot be used: {err}")))?;
                Some(TlsState {
                    settings: tls_settings.clone(),
                    certs: zkc::TlsDynamicCerts::new(certs),
                    material: RwLock::new(material.clone()),
                })
            },
            None => None,
        };
        let acl = client_acl(&settings.acl);
        let session = ZkSession {
            inner: Arc::new(Inner {
                settings,
                metrics,
                status,
                current: RwLock::new(None),
                acl,
                tls,
                last_error: RwLock::new(None),
            }),
        };
        let (supervisor, reloader) = (session.clone(), session.clone());
        let task = tokio::spawn(async move {
            tokio::join!(supervisor.supervise(shutdown.clone()), reloader.reload_tls_files(shutdown));
        });
        Ok((session, task))
    }

    /// Why the last attempt to open a session failed (TLS, credentials, unreachable servers);
    /// `None` while a session is open or before the first attempt ended.
    pub fn last_error(&self) -> Option<String> {
        self.inner.last_error.read().ok().and_then(|e| e.clone())
    }

    fn set_last_error(&self, error: Option<String>) {
        if let Ok(mut slot) = self.inner.last_error.write() {
            *slot = error;
        }
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

    /// Runs `call` with a connected session until it answers, again after every transient
    /// failure (a dropped connection, a lost session), until `deadline`. Only for calls that write
    /// nothing (reads, `sync`) or whose repetition is harmless (creating a directory that may
    /// exist): their lost answer left nothing to settle, so giving up at the deadline is
    /// `Unavailable` (nothing was written), never `OutcomeUnknown`.
    pub async fn retrying<T, F, Fut>(&self, deadline: Instant, mut call: F) -> Result<T, ZkError>
    where
        F: FnMut(Zk) -> Fut,
        Fut: std::future::Future<Output = Result<T, ZkError>>,
    {
        let mut pause = Duration::from_millis(10);
        loop {
            let zk = self.connected(deadline).await?;
            match call(zk).await {
                Err(err) if err.is_transient() => {
                    if Instant::now() >= deadline {
                        return Err(ZkError::Unavailable);
                    }
                    // A dropped connection fails the call before the session's state says so:
                    // a short pause, then `connected` waits for the reconnection itself.
                    tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                },
                other => return other,
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
            connector = connector.with_auth("digest", auth.expose().as_bytes());
        }
        if let Some(sasl) = &settings.sasl {
            connector = connector
                .with_sasl(zkc::SaslOptions::digest_md5(sasl.username.clone(), sasl.password.expose().to_owned()));
        }
        match &self.inner.tls {
            Some(tls) => {
                let mut options = zkc::TlsOptions::new().with_certs(tls.certs.clone());
                if !tls.settings.verify_hostname {
                    // SAFETY: not a memory-safety matter: the crate marks turning off hostname
                    // verification `unsafe` because it is a security choice, made here by the
                    // operator (zookeeper.tls.verify_hostname = false).
                    #[allow(unsafe_code)]
                    {
                        options = unsafe { options.with_no_hostname_verification() };
                    }
                }
                // Every server of the connect string is reached over TLS.
                connector.with_tls(options).secure_connect(&settings.connect).await
            },
            None => connector.connect(&settings.connect).await,
        }
    }

    /// Why a connection attempt failed, in words an operator can act on; and whether it is a
    /// misconfiguration (refused credentials, a failed TLS handshake) rather than an outage.
    async fn describe_connect_error(&self, err: &zkc::Error) -> (String, bool) {
        let settings = &self.inner.settings;
        if *err == zkc::Error::AuthFailed {
            let configured = match (&settings.sasl, &settings.auth_digest) {
                (Some(sasl), _) => format!("SASL DIGEST-MD5 as user `{}`", sasl.username),
                (None, Some(_)) => "digest credentials (zookeeper.auth_digest) and no SASL".to_owned(),
                (None, None) => "no credentials".to_owned(),
            };
            let why = format!(
                "ZooKeeper refused the session's authentication (zkq sent {configured}): check \
                 zookeeper.sasl.username and its password; a server with sessionRequireClientSASLAuth=true \
                 also refuses sessions without SASL"
            );
            return (why, true);
        }
        if let Some(tls) = &self.inner.tls {
            let material = tls.material.read().ok().map(|m| m.clone());
            if let Some(material) = material
                && let Some(why) = diagnose(&settings.connect, &material).await
            {
                let handshake_failed = why.starts_with("TLS");
                return (why, handshake_failed);
            }
        }
        let why = format!(
            "no session with {} within {} ({err})",
            settings.connect,
            humantime::format_duration(settings.session_timeout)
        );
        (why, false)
    }

    /// Reads the TLS files again every `reload_interval`; changed, valid certificates are used by
    /// every connection made from then on. Invalid ones are logged and the previous ones kept.
    async fn reload_tls_files(self, shutdown: CancellationToken) {
        let Some(tls) = &self.inner.tls else { return };
        let mut refused: Option<String> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(tls.settings.reload_interval) => {},
            }
            let settings = tls.settings.clone();
            let loaded = match tokio::task::spawn_blocking(move || TlsMaterial::load(&settings)).await {
                Ok(loaded) => loaded,
                Err(_) => continue,
            };
            let material = match loaded {
                Ok(material) => material,
                Err(err) => {
                    let why = err.to_string();
                    if refused.as_ref() != Some(&why) {
                        tracing::error!(error = %why, "the TLS files changed but cannot be used; keeping the previous certificates");
                        refused = Some(why);
                    }
                    continue;
                },
            };
            refused = None;
            let unchanged = tls.material.read().is_ok_and(|current| current.same_contents(&material));
            if unchanged {
                continue;
            }
            match material.certs() {
                Ok(certs) => {
                    tls.certs.update(certs);
                    if let Ok(mut current) = tls.material.write() {
                        *current = material;
                    }
                    tracing::info!("TLS files changed: new connections use the new certificates");
                },
                Err(err) => {
                    tracing::error!(error = %err, "the changed TLS files cannot be used; keeping the previous certificates")
                },
            }
        }
    }

    async fn supervise(self, shutdown: CancellationToken) {
        // From 100 ms to the cap, jittered so that many sidecars restarting together do not
        // reconnect in lockstep.
        let mut backoff =
            Backoff::new(Duration::from_millis(100), self.inner.settings.reconnect_backoff_max, 0.5).retries();
        let mut logged: Option<String> = None;
        loop {
            let client = tokio::select! {
                _ = shutdown.cancelled() => break,
                result = self.connect_once() => result,
            };
            let client = match client {
                Ok(client) => client,
                Err(err) => {
                    let (why, misconfigured) = tokio::select! {
                        _ = shutdown.cancelled() => break,
                        described = self.describe_connect_error(&err) => described,
                    };
                    // Each distinct reason is logged once, not at every retry.
                    if logged.as_ref() != Some(&why) {
                        let connect = &self.inner.settings.connect;
                        if misconfigured {
                            tracing::error!(%connect, error = %why, "cannot open a ZooKeeper session; retrying with backoff");
                        } else {
                            tracing::warn!(%connect, error = %why, "cannot reach ZooKeeper; retrying with backoff");
                        }
                        logged = Some(why.clone());
                    }
                    self.set_last_error(Some(why));
                    let pause = backoff.next_delay();
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(pause) => continue,
                    }
                },
            };
            backoff.reset();
            logged = None;
            self.set_last_error(None);
            let session_id = client.session_id().0;
            let mut states = client.state_watcher();
            self.set_current(Some(Zk::new(
                client,
                self.status().generation + 1,
                self.inner.settings.request_timeout,
                self.inner.metrics.clone(),
                self.inner.acl.clone(),
                super::wire::max_request_bytes(self.inner.settings.jute_maxbuffer),
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
                        let (why, _) = self.describe_connect_error(&zkc::Error::AuthFailed).await;
                        tracing::error!(session = %format!("{session_id:#x}"), error = %why,
                            "ZooKeeper authentication failed");
                        self.set_last_error(Some(why));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_curator_states_have_metric_labels() {
        assert_eq!(ConnectionState::Connecting.label(), None);
        assert_eq!(ConnectionState::ReadOnly.label(), Some("read_only"));
        assert!(ConnectionState::Reconnected.is_connected());
        assert!(!ConnectionState::Suspended.is_connected());
    }
}
