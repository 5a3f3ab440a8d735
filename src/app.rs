//! Wiring: builds the session, the queues and both listeners from a validated configuration,
//! and runs the shutdown sequence.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, ConfigError, FileSecrets, Secret, read_secret_files};
use crate::counter::CounterService;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::push::PushService;
use crate::queue::QueueService;
use crate::zk::{SaslCredentials, SessionSettings, TlsMaterial, TlsSettings, ZkSession};

/// Why zkq could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file the configuration names cannot be used (exit status 64, like any configuration error).
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr} ({key}): {source}")]
    Bind { key: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("cannot create metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What zkq reads from files before it starts: the TLS certificates, the SASL password, the
/// API token. `Debug` shows no secret.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    pub tls: Option<(TlsSettings, TlsMaterial)>,
    pub sasl_password: Option<Secret>,
    pub api_token: Option<Secret>,
}

/// Reads and checks every file the configuration names. A file that is missing, unreadable or
/// invalid (not PEM, no certificate, a key that does not belong to its certificate, an empty
/// password, a token that cannot be a header value) is a configuration error.
pub fn load_secrets(config: &Config) -> Result<Secrets, ConfigError> {
    let zk = &config.zookeeper;
    let tls = match (&zk.tls.enabled, &zk.tls.ca_file) {
        (true, Some(ca_file)) => {
            let settings = TlsSettings {
                ca_file: ca_file.clone(),
                cert_file: zk.tls.cert_file.clone(),
                key_file: zk.tls.key_file.clone(),
                verify_hostname: zk.tls.verify_hostname,
                reload_interval: zk.tls.reload_interval,
            };
            let material = TlsMaterial::load(&settings).map_err(|err| ConfigError {
                key: err.key.to_owned(),
                value: format!("{:?}", err.path),
                allowed: err.reason,
            })?;
            Some((settings, material))
        },
        _ => None,
    };
    let FileSecrets { sasl_password, api_token } = read_secret_files(config)?;
    Ok(Secrets { tls, sasl_password, api_token })
}

/// A started zkq: its bound addresses and a handle to stop it.
pub struct Running {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub session: ZkSession,
    pub metrics: Arc<Metrics>,
    /// Cancel to begin a graceful shutdown (what SIGTERM does).
    pub shutdown: CancellationToken,
    done: JoinHandle<bool>,
}

impl Running {
    /// Waits for the shutdown to finish; true when it finished within `shutdown.grace`.
    pub async fn wait(self) -> bool {
        self.done.await.unwrap_or(false)
    }

    /// Begins a graceful shutdown and waits for it.
    pub async fn stop(self) -> bool {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// The session's settings: the configuration with the secrets read from their files.
pub fn session_settings(config: &Config, secrets: Secrets) -> SessionSettings {
    SessionSettings {
        connect: config.zookeeper.connect.clone(),
        session_timeout: config.zookeeper.session_timeout,
        request_timeout: config.zookeeper.request_timeout,
        auth_digest: config.zookeeper.auth_digest.clone(),
        sasl: match (&config.zookeeper.sasl.username, secrets.sasl_password) {
            (Some(username), Some(password)) => Some(SaslCredentials { username: username.clone(), password }),
            _ => None,
        },
        tls: secrets.tls,
        acl: config.node_acl(),
        reconnect_backoff_max: config.zookeeper.reconnect_backoff_max,
    }
}

/// Starts zkq: binds both listeners (failing early if it cannot), then connects in the background.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let secrets = load_secrets(&config)?;
    let config = Arc::new(config);
    let metrics = Arc::new(Metrics::new()?);
    let api_listener = TcpListener::bind(config.api.listen).await.map_err(|source| StartError::Bind {
        key: "api.listen",
        addr: config.api.listen,
        source,
    })?;
    let admin_listener = TcpListener::bind(config.admin.listen).await.map_err(|source| StartError::Bind {
        key: "admin.listen",
        addr: config.admin.listen,
        source,
    })?;
    let api_addr = api_listener.local_addr().unwrap_or(config.api.listen);
    let admin_addr = admin_listener.local_addr().unwrap_or(config.admin.listen);

    let shutdown = CancellationToken::new();
    let draining = CancellationToken::new();
    let stop_session = CancellationToken::new();
    let tasks = TaskTracker::new();
    let api_token = secrets.api_token.clone();
    let settings = session_settings(&config, secrets);
    let (session, session_task) = ZkSession::start(settings, metrics.clone(), stop_session.clone()).map_err(|err| {
        ConfigError { key: "zookeeper.tls".to_owned(), value: "(files)".to_owned(), allowed: err.to_string() }
    })?;
    let queues = QueueService::new(config.clone(), session.clone(), metrics.clone(), draining.clone(), tasks.clone());
    let push = PushService::start(&config, &queues, &metrics, draining.clone());
    let state = AppState {
        config: config.clone(),
        session: session.clone(),
        metrics: metrics.clone(),
        queues: queues.clone(),
        counters: CounterService::new(
            config.clone(),
            session.clone(),
            metrics.clone(),
            draining.clone(),
            tasks.clone(),
        ),
        draining: draining.clone(),
        api_token: api_token.map(Arc::new),
    };

    let stop_api = CancellationToken::new();
    let stop_admin = CancellationToken::new();
    let api_limits = ListenerLimits {
        max_connections: config.api.max_connections,
        header_read_timeout: config.api.header_read_timeout,
        idle_timeout: config.api.idle_timeout,
    };
    let admin_limits = ListenerLimits {
        max_connections: config.admin.max_connections,
        header_read_timeout: config.admin.header_read_timeout,
        idle_timeout: config.admin.idle_timeout,
    };
    let api = serve(api_listener, http::api_router(state.clone()), api_limits, stop_api.clone());
    let admin = serve(admin_listener, http::admin_router(state), admin_limits, stop_admin.clone());
    tracing::info!(api = %api_addr, admin = %admin_addr, zookeeper = %config.zookeeper.connect,
        root = %config.zookeeper.root, "zkq started");

    let grace = config.shutdown.grace;
    let trigger = shutdown.clone();
    let metrics_for_shutdown = metrics.clone();
    let done = tokio::spawn(async move {
        trigger.cancelled().await;
        let started = tokio::time::Instant::now();
        let deadline = started + grace;
        tracing::info!(grace = %humantime::format_duration(grace), "shutting down: not ready, draining requests");
        // 1. Not ready, no new takes; waiting long-polls are answered now; push workers lease
        //    nothing new.
        draining.cancel();
        // 2. Stop accepting; let requests in flight (puts) finish. Push deliveries in flight get
        //    the grace but a reserve; those still open then release their messages.
        stop_api.cancel();
        let deliveries_until = deadline - PushService::release_reserve(grace);
        let (api_done, pushes_done) =
            tokio::join!(tokio::time::timeout_at(deadline, api), push.drain(deliveries_until, deadline));
        let mut in_time = api_done.is_ok() && pushes_done;
        // 3. Let claims still running and the settlement of lost answers (put-backs) finish, so
        //    no message is left only in memory.
        in_time &= queues.settle(deadline).await;
        // 4. Release leases still held, so their messages are redelivered now rather than after
        //    the session timeout; then close the session.
        match tokio::time::timeout_at(deadline, queues.release_all_leases()).await {
            Ok(0) => {},
            Ok(released) => tracing::info!(released, "released leases still held"),
            Err(_) => in_time = false,
        }
        stop_session.cancel();
        tasks.close();
        in_time &= tokio::time::timeout_at(deadline, async {
            let _ = session_task.await;
            tasks.wait().await;
        })
        .await
        .is_ok();
        stop_admin.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(1), admin).await;
        metrics_for_shutdown.shutdown_duration.observe(started.elapsed().as_secs_f64());
        if in_time {
            tracing::info!(took_ms = started.elapsed().as_millis() as u64, "shutdown complete");
        } else {
            tracing::warn!(grace = %humantime::format_duration(grace), "shutdown grace period exceeded; exiting anyway");
        }
        in_time
    });

    Ok(Running { api_addr, admin_addr, session, metrics, shutdown, done })
}

/// What one listener allows.
#[derive(Debug, Clone, Copy)]
struct ListenerLimits {
    max_connections: usize,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

/// Serves HTTP/1.1 on `listener` until `stop`, then lets open connections finish.
///
/// At most `max_connections` are served at once: further connections are not accepted, they
/// wait in the kernel's listen backlog (and are refused by the kernel once it is full). Each
/// connection is watched ([`watch_connection`]): one that sends nothing for `idle_timeout`
/// (new, or idle after its last response) or does not finish a request head within
/// `header_read_timeout` of its first byte (slowloris) is closed. hyper's own header-read timer
/// is not used: it starts whenever hyper waits for a head, so it would also be the idle timeout.
fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ListenerLimits,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let builder = hyper::server::conn::http1::Builder::new();
        loop {
            let permit = tokio::select! {
                _ = stop.cancelled() => break,
                permit = permits.clone().acquire_owned() => permit,
            };
            let Ok(permit) = permit else { break };
            let stream = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        // Out of file descriptors and the like: pause instead of spinning.
                        tracing::warn!(error = %err, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    },
                },
            };
            let _ = stream.set_nodelay(true);
            let activity = Arc::new(Activity::new());
            let service = {
                let (router, activity) = (router.clone(), activity.clone());
                hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let handling = Handling::start(activity.clone());
                    let router = router.clone();
                    async move {
                        let _handling = handling;
                        tower::ServiceExt::oneshot(router, request).await
                    }
                })
            };
            let io = hyper_util::rt::TokioIo::new(WatchedIo { inner: stream, activity: activity.clone() });
            let connection = graceful.watch(builder.serve_connection(io, service));
            tokio::spawn(async move {
                tokio::select! {
                    _ = connection => {},
                    _ = watch_connection(&activity, limits) => {},
                }
                drop(permit);
            });
        }
        drop(listener);
        graceful.shutdown().await;
    })
}

/// What a connection is doing, for its watchdog. Times are milliseconds since it was accepted.
struct Activity {
    accepted: std::time::Instant,
    /// Requests being handled (their handler has not answered yet).
    handling: AtomicUsize,
    /// Last byte read or written.
    last_io_ms: AtomicU64,
    /// First byte of a request head not yet handed to a handler (0: none).
    head_started_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            accepted: std::time::Instant::now(),
            handling: AtomicUsize::new(0),
            last_io_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.accepted.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
    }
}

/// A request being handled, for as long as its handler runs (also when it is dropped).
struct Handling(Arc<Activity>);

impl Handling {
    fn start(activity: Arc<Activity>) -> Handling {
        activity.handling.fetch_add(1, Ordering::SeqCst);
        activity.head_started_ms.store(0, Ordering::SeqCst);
        Handling(activity)
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.last_io_ms.store(self.0.now_ms(), Ordering::SeqCst);
        self.0.handling.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves when the connection should be closed: idle for `idle_timeout` with no request being
/// handled, or a request head begun `header_read_timeout` ago and still not complete.
async fn watch_connection(activity: &Activity, limits: ListenerLimits) {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    loop {
        let now = activity.now_ms();
        let head_started = activity.head_started_ms.load(Ordering::SeqCst);
        let deadline = if activity.handling.load(Ordering::SeqCst) > 0 {
            None
        } else if head_started != 0 {
            Some(head_started.saturating_add(ms(limits.header_read_timeout)))
        } else {
            Some(activity.last_io_ms.load(Ordering::SeqCst).saturating_add(ms(limits.idle_timeout)))
        };
        let wait = match deadline {
            Some(deadline) if deadline <= now => return,
            Some(deadline) => deadline - now,
            // A request is being handled (a long-poll): look again later.
            None => ms(limits.idle_timeout),
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

/// The connection's socket, noting every byte read or written in its [`Activity`].
struct WatchedIo {
    inner: tokio::net::TcpStream,
    activity: Arc<Activity>,
}

impl tokio::io::AsyncRead for WatchedIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let activity = &self.activity;
            let now = activity.now_ms();
            activity.last_io_ms.store(now, Ordering::SeqCst);
            if activity.handling.load(Ordering::SeqCst) == 0 {
                let _ = activity.head_started_ms.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
        polled
    }
}

impl tokio::io::AsyncWrite for WatchedIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(written)) = &polled
            && *written > 0
        {
            self.activity.last_io_ms.store(self.activity.now_ms(), Ordering::SeqCst);
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
