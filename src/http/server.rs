//! The HTTP/1.1 server under both listeners: the accept loop with its connection limit, and the
//! watchdog that closes idle and slow connections (hyper's own header timer cannot tell the two apart).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// What one listener allows.
#[derive(Debug, Clone, Copy)]
pub struct ListenerLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Serves HTTP/1.1 on `listener` until `stop`, then lets open connections finish.
///
/// At most `max_connections` are served at once: further connections are not accepted, they
/// wait in the kernel's listen backlog (and are refused by the kernel once it is full). Each
/// connection is watched ([`watch_connection`]): one that sends nothing for `idle_timeout`
/// (new, or idle after its last response) or does not finish a request head within
/// `header_read_timeout` of its first byte (slowloris) is closed. hyper's own header-read timer
/// is not used: it starts whenever hyper waits for a head, so it would also be the idle timeout.
#[expect(
    clippy::disallowed_methods,
    reason = "the accept loop's handle is returned to its owner; each connection's task is held by the loop's graceful shutdown and its connection permit"
)]
pub fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ListenerLimits,
    name: &'static str,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let open = metrics.http_connections_open.with_label_values(&[name]);
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
            let open = open.clone();
            open.inc();
            tokio::spawn(async move {
                tokio::select! {
                    _ = connection => {},
                    _ = watch_connection(&activity, limits) => {},
                }
                open.dec();
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
