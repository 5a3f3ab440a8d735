//! Wiring: builds the session, the queues and both listeners from a validated configuration,
//! and runs the shutdown sequence.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, ConfigError};
use crate::counter::CounterService;
use crate::door::Door;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::push::PushService;
use crate::queue::QueueService;
use crate::queue::tags::QueueTags;
use crate::sqs::SqsState;
use crate::types::Layout;
use crate::web::server::{ListenerLimits, serve};
use crate::zk::{ZkSession, load_secrets, session_settings};

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

/// A started zkq: its bound addresses and a handle to stop it.
pub struct Running {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The SQS-compatible listener's address, when `sqs.listen` is set.
    pub sqs_addr: Option<SocketAddr>,
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
    let sqs_listener = match config.sqs.listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|source| StartError::Bind {
            key: "sqs.listen",
            addr,
            source,
        })?),
        None => None,
    };
    let api_addr = api_listener.local_addr().unwrap_or(config.api.listen);
    let sqs_addr = sqs_listener.as_ref().and_then(|l| l.local_addr().ok());
    let admin_addr = admin_listener.local_addr().unwrap_or(config.admin.listen);

    let shutdown = CancellationToken::new();
    let draining = CancellationToken::new();
    let stop_session = CancellationToken::new();
    let tasks = TaskTracker::new();
    let api_token = secrets.api_token.clone();
    let sqs_key_pair = secrets.sqs_key_pair.clone().map(Arc::new);
    let settings = session_settings(&config, secrets);
    let (session, session_task) = ZkSession::start(settings, metrics.clone(), stop_session.clone()).map_err(|err| {
        ConfigError { key: "zookeeper.tls".to_owned(), value: "(files)".to_owned(), allowed: err.to_string() }
    })?;
    let queues = QueueService::new(config.clone(), session.clone(), metrics.clone(), draining.clone(), tasks.clone());
    let door = Door::new(
        config.clone(),
        queues.clone(),
        CounterService::new(config.clone(), session.clone(), metrics.clone(), draining.clone(), tasks.clone()),
        crate::redrive::Redrives::new(
            config.clone(),
            queues.clone(),
            session.clone(),
            metrics.clone(),
            tasks.clone(),
            draining.clone(),
        ),
        Arc::new(QueueTags::new(Layout::new(&config.zookeeper.root), session.clone(), metrics.clone())),
        session.clone(),
    );
    let push = PushService::start(&config, &door, &metrics, draining.clone());
    let state = AppState {
        config: config.clone(),
        metrics: metrics.clone(),
        door: door.clone(),
        draining: draining.clone(),
        api_token: api_token.map(Arc::new),
    };
    let sqs_state = SqsState { config: config.clone(), metrics: metrics.clone(), door, key_pair: sqs_key_pair };

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
    let api = serve(
        api_listener,
        http::api_router(state.clone(), admin_addr),
        api_limits,
        "api",
        metrics.clone(),
        stop_api.clone(),
    );
    let sqs = sqs_listener.map(|listener| {
        serve(listener, crate::sqs::sqs_router(sqs_state), api_limits, "sqs", metrics.clone(), stop_api.clone())
    });
    let admin =
        serve(admin_listener, http::admin_router(state), admin_limits, "admin", metrics.clone(), stop_admin.clone());
    if let Some(sqs) = sqs_addr {
        tracing::info!(sqs = %sqs, "serving the SQS-compatible API");
    }
    tracing::info!(api = %api_addr, admin = %admin_addr, zookeeper = %config.zookeeper.connect,
        root = %config.zookeeper.root, "zkq started");

    let grace = config.shutdown.grace;
    let trigger = shutdown.clone();
    let metrics_for_shutdown = metrics.clone();
    #[expect(clippy::disallowed_methods, reason = "the shutdown sequence's handle is `Running::done`, awaited by main")]
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
        let sqs_done = async {
            match sqs {
                Some(sqs) => tokio::time::timeout_at(deadline, sqs).await.is_ok(),
                None => true,
            }
        };
        let (api_done, sqs_done, pushes_done) =
            tokio::join!(tokio::time::timeout_at(deadline, api), sqs_done, push.drain(deliveries_until, deadline));
        let mut in_time = api_done.is_ok() && sqs_done && pushes_done;
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

    Ok(Running { api_addr, admin_addr, sqs_addr, session, metrics, shutdown, done })
}
