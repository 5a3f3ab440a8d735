//! The HTTP/1.1 server under every listener: the accept loop with its connection slots (reclaimed
//! from connections without a request in flight when all are held), and the watchdog that closes
//! idle and slow connections (hyper's own header timer cannot tell the two apart).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use prometheus::IntCounter;
use tokio::net::TcpListener;
use tokio::sync::{Notify, OwnedSemaphorePermit};
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
/// At most `max_connections` are served at once, each holding a slot. When every slot is held, the
/// next connection is accepted and a slot is reclaimed for it: a connection without a request in
/// flight is closed ([`Slots::reclaim`]) — one that never finished a request head (silent, or a
/// head begun and not ended) before one that was answered and is idle between requests, the one
/// waiting longest first. A connection whose request is being handled (a long-poll) or whose
/// response is still being written is never closed for a slot; while every slot is held by such
/// requests, the new connection waits, and further ones wait in the kernel's listen backlog. So at
/// most `max_connections + 1` sockets are open, and probes and the app get a slot at once however
/// many slow or idle connections arrive.
///
/// Each connection is also watched ([`watch_connection`]): one that sends nothing for
/// `idle_timeout` (new, or idle after its last response) or does not finish a request head within
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
    let reclaimed = Reclaimed {
        silent: metrics.http_connections_reclaimed.with_label_values(&[name, "silent"]),
        head: metrics.http_connections_reclaimed.with_label_values(&[name, "head"]),
        idle: metrics.http_connections_reclaimed.with_label_values(&[name, "idle"]),
    };
    tokio::spawn(async move {
        let slots = Arc::new(Slots::new(limits.max_connections));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let builder = hyper::server::conn::http1::Builder::new();
        loop {
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
            let Some(permit) = slots.slot_for_new_connection(&stop).await else { break };
            let _ = stream.set_nodelay(true);
            let (id, activity) = slots.register();
            let service = {
                let (router, activity) = (router.clone(), activity.clone());
                hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let handling = Handling::start(activity.clone());
                    let router = router.clone();
                    async move {
                        let response = tower::ServiceExt::oneshot(router, request).await;
                        // The request stays in flight until its whole body has been handed to hyper.
                        response.map(|response| {
                            response.map(|body| axum::body::Body::new(TrackedBody { body, _handling: handling }))
                        })
                    }
                })
            };
            let io = hyper_util::rt::TokioIo::new(WatchedIo { inner: stream, activity: activity.clone() });
            let connection = graceful.watch(builder.serve_connection(io, service));
            let (open, reclaimed, slots) = (open.clone(), reclaimed.clone(), slots.clone());
            open.inc();
            tokio::spawn(async move {
                let closed = tokio::select! {
                    _ = connection => None,
                    closed = watch_connection(&activity, limits) => Some(closed),
                };
                if let Some(Closed::Reclaimed(state)) = closed {
                    let counter = match state {
                        Waiting::Silent => &reclaimed.silent,
                        Waiting::Head => &reclaimed.head,
                        Waiting::Idle => &reclaimed.idle,
                    };
                    counter.inc();
                    tracing::debug!(listener = name, state = state.as_str(), "closed a connection to free its slot");
                }
                slots.unregister(id);
                open.dec();
                drop(permit);
            });
        }
        drop(listener);
        graceful.shutdown().await;
    })
}

#[derive(Clone)]
struct Reclaimed {
    silent: IntCounter,
    head: IntCounter,
    idle: IntCounter,
}

/// A listener's slots: one semaphore permit per connection served, and the connections holding
/// them, to reclaim one for a new connection.
struct Slots {
    permits: Arc<tokio::sync::Semaphore>,
    /// Times in [`Activity`] count from here, so connections can be compared.
    epoch: std::time::Instant,
    connections: std::sync::Mutex<HashMap<u64, Arc<Activity>>>,
    next_id: AtomicU64,
    /// A connection may have become reclaimable (its request ended, or it refused a reclaim).
    changed: Notify,
}

impl Slots {
    fn new(max_connections: usize) -> Slots {
        Slots {
            permits: Arc::new(tokio::sync::Semaphore::new(max_connections)),
            epoch: std::time::Instant::now(),
            connections: std::sync::Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    fn connections(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn register(self: &Arc<Self>) -> (u64, Arc<Activity>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new(self.clone()));
        self.connections().insert(id, activity.clone());
        (id, activity)
    }

    fn unregister(&self, id: u64) {
        self.connections().remove(&id);
    }

    /// A slot for a connection just accepted: a free one, else one reclaimed from a connection
    /// without a request in flight (waiting as long as every slot has a request in flight).
    /// None when the listener stops.
    async fn slot_for_new_connection(&self, stop: &CancellationToken) -> Option<OwnedSemaphorePermit> {
        loop {
            // Made before looking, so a change while looking is not missed (`notify_one` keeps it).
            let changed = self.changed.notified();
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => return Some(permit),
                Err(tokio::sync::TryAcquireError::Closed) => return None,
                Err(tokio::sync::TryAcquireError::NoPermits) => {},
            }
            self.reclaim();
            tokio::select! {
                _ = stop.cancelled() => return None,
                permit = self.permits.clone().acquire_owned() => return permit.ok(),
                _ = changed => {},
            }
        }
    }

    /// Asks one connection without a request in flight to close, unless one was asked already and
    /// has not answered: connections that never finished a request head first, then idle ones,
    /// each the one waiting longest first. The connection itself decides, between its own polls,
    /// so a request that arrives meanwhile is served (and the connection refuses).
    fn reclaim(&self) {
        let connections = self.connections();
        if connections.values().any(|c| c.reclaim_asked.load(Ordering::SeqCst)) {
            return;
        }
        let victim = connections
            .values()
            .filter(|c| c.reclaimable())
            .min_by_key(|c| (c.served.load(Ordering::SeqCst), c.waiting_since_ms.load(Ordering::SeqCst)));
        if let Some(victim) = victim {
            victim.reclaim_asked.store(true, Ordering::SeqCst);
            victim.reclaim.notify_one();
        }
    }
}

/// What a connection is doing, for its watchdog and its listener's slots. Times are
/// milliseconds since the listener's epoch.
struct Activity {
    slots: Arc<Slots>,
    /// Requests in flight: handled, or their answer's body not yet all handed to hyper.
    handling: AtomicUsize,
    /// Last byte read or written.
    last_io_ms: AtomicU64,
    /// First byte of a request head not yet handed to a handler (0: none).
    head_started_ms: AtomicU64,
    /// Since when no request has been in flight (accepted, or the last one ended).
    waiting_since_ms: AtomicU64,
    /// Whether a request was ever answered on it.
    served: AtomicBool,
    /// hyper's last write did not go through: part of an answer is still buffered.
    write_blocked: AtomicBool,
    /// Its listener asked it to close for a slot ([`Slots::reclaim`]); `reclaim` wakes it.
    reclaim_asked: AtomicBool,
    reclaim: Notify,
}

impl Activity {
    fn new(slots: Arc<Slots>) -> Activity {
        let activity = Activity {
            slots,
            handling: AtomicUsize::new(0),
            last_io_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
            waiting_since_ms: AtomicU64::new(0),
            served: AtomicBool::new(false),
            write_blocked: AtomicBool::new(false),
            reclaim_asked: AtomicBool::new(false),
            reclaim: Notify::new(),
        };
        let now = activity.now_ms();
        activity.last_io_ms.store(now, Ordering::SeqCst);
        activity.waiting_since_ms.store(now, Ordering::SeqCst);
        activity
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.slots.epoch.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// No request in flight and nothing of an answer left to write.
    fn reclaimable(&self) -> bool {
        self.handling.load(Ordering::SeqCst) == 0 && !self.write_blocked.load(Ordering::SeqCst)
    }

    fn waiting(&self) -> Waiting {
        if self.head_started_ms.load(Ordering::SeqCst) != 0 {
            Waiting::Head
        } else if self.served.load(Ordering::SeqCst) {
            Waiting::Idle
        } else {
            Waiting::Silent
        }
    }
}

/// What a connection without a request in flight is waiting for.
#[derive(Debug, Clone, Copy)]
enum Waiting {
    /// Its first byte.
    Silent,
    /// The rest of a request head.
    Head,
    /// A next request, after an answer.
    Idle,
}

impl Waiting {
    fn as_str(self) -> &'static str {
        match self {
            Waiting::Silent => "silent",
            Waiting::Head => "head",
            Waiting::Idle => "idle",
        }
    }
}

/// A request in flight, from its head until its answer's body is all handed to hyper (or dropped).
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
        let now = self.0.now_ms();
        self.0.last_io_ms.store(now, Ordering::SeqCst);
        self.0.waiting_since_ms.store(now, Ordering::SeqCst);
        self.0.served.store(true, Ordering::SeqCst);
        if self.0.handling.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.slots.changed.notify_one();
        }
    }
}

/// An answer's body, holding its request's [`Handling`] until hyper has taken all of it.
struct TrackedBody {
    body: axum::body::Body,
    _handling: Handling,
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Why a connection's watchdog closed it.
enum Closed {
    /// Idle for `idle_timeout`, or its head not finished within `header_read_timeout`.
    TimedOut,
    /// Its slot was given to a new connection; what it was waiting for then.
    Reclaimed(Waiting),
}

/// Resolves when the connection should be closed: idle for `idle_timeout` with no request being
/// handled, a request head begun `header_read_timeout` ago and still not complete, or its slot
/// asked for while no request is in flight. It runs in the connection's own task, between polls
/// of the connection, so no request can begin between its last look and the close.
async fn watch_connection(activity: &Activity, limits: ListenerLimits) -> Closed {
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
            Some(deadline) if deadline <= now => return Closed::TimedOut,
            Some(deadline) => deadline - now,
            // A request is being handled (a long-poll): look again later.
            None => ms(limits.idle_timeout),
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait)) => {},
            _ = activity.reclaim.notified() => {
                if activity.reclaim_asked.load(Ordering::SeqCst) {
                    if activity.reclaimable() {
                        return Closed::Reclaimed(activity.waiting());
                    }
                    // A request began since: the listener reclaims another slot.
                    activity.reclaim_asked.store(false, Ordering::SeqCst);
                    activity.slots.changed.notify_one();
                }
            },
        }
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
        let activity = &self.activity;
        let was_blocked = activity.write_blocked.swap(polled.is_pending(), Ordering::SeqCst);
        if was_blocked && polled.is_ready() && activity.handling.load(Ordering::SeqCst) == 0 {
            activity.slots.changed.notify_one();
        }
        if let std::task::Poll::Ready(Ok(written)) = &polled
            && *written > 0
        {
            activity.last_io_ms.store(activity.now_ms(), Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(activity: &Activity) -> bool {
        activity.reclaim_asked.load(Ordering::SeqCst)
    }

    /// Connections that never finished a head go first, the one waiting longest first; then idle
    /// ones; one with a request in flight or an answer half written never.
    #[test]
    fn the_slot_reclaimed_is_the_longest_waiting_without_a_request_in_flight() {
        let slots = Arc::new(Slots::new(4));
        let (_, idle) = slots.register();
        idle.served.store(true, Ordering::SeqCst);
        idle.waiting_since_ms.store(1, Ordering::SeqCst);
        let (_, in_flight) = slots.register();
        in_flight.handling.store(1, Ordering::SeqCst);
        in_flight.waiting_since_ms.store(1, Ordering::SeqCst);
        let (_, writing) = slots.register();
        writing.write_blocked.store(true, Ordering::SeqCst);
        writing.waiting_since_ms.store(1, Ordering::SeqCst);
        let (older_id, older) = slots.register();
        older.waiting_since_ms.store(5, Ordering::SeqCst);
        let (_, newer) = slots.register();
        newer.waiting_since_ms.store(9, Ordering::SeqCst);

        slots.reclaim();
        assert!(asked(&older) && !asked(&newer) && !asked(&idle));
        slots.reclaim();
        assert!(!asked(&newer), "one reclaim at a time");

        slots.unregister(older_id);
        slots.reclaim();
        assert!(asked(&newer));
        newer.reclaim_asked.store(false, Ordering::SeqCst);
        newer.handling.store(1, Ordering::SeqCst);
        slots.reclaim();
        assert!(asked(&idle), "an idle connection once no other is left");
        assert!(!asked(&in_flight) && !asked(&writing));
    }

    /// A connection asked for its slot just before a request began on it refuses, and says so
    /// (the listener then asks another).
    #[tokio::test(start_paused = true)]
    async fn a_connection_with_a_request_in_flight_refuses_a_reclaim() {
        let limits = ListenerLimits {
            max_connections: 1,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        };
        let slots = Arc::new(Slots::new(1));
        let (_, activity) = slots.register();
        let changed = slots.changed.notified();
        slots.reclaim();
        assert!(asked(&activity));
        let handling = Handling::start(activity.clone());
        let watching = watch_connection(&activity, limits);
        tokio::pin!(watching);
        tokio::select! {
            biased;
            _ = &mut watching => panic!("closed with a request in flight"),
            () = changed => {},
        }
        assert!(!asked(&activity), "the refusal clears the ask");
        drop(handling);
        slots.reclaim();
        assert!(matches!(watching.await, Closed::Reclaimed(Waiting::Idle)));
    }
}
