//! One push subscription and its workers: lease, POST, settle; and its readiness probe.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::answer::{self, Outcome, Verdict};
use super::backoff;
use super::client::{AppClient, AppConnection, CallError, content_type, header_text};
use super::gate::AppGate;
use crate::config::PushConfig;
use crate::door::Door;
use crate::metrics::{GaugeGuard, Metrics, PushMetrics};
use crate::queue::{ItemMeta, LeaseGrant, Message, NackMode, QueueError, QueueRef, Receipt};
use crate::types::{Backoff, QueueName, now_epoch_ms};
use crate::web::headers::{
    HEADER_DELIVER_AT, HEADER_DELIVERY_COUNT, HEADER_FENCING_TOKEN, HEADER_ID, HEADER_LEASE_EXPIRES_AT,
    HEADER_MESSAGE_ID, HEADER_PRIORITY, HEADER_QUEUE,
};

/// How long one lease call waits for a message; the worker simply asks again.
const LEASE_WAIT: Duration = Duration::from_secs(30);

/// One queue's push subscription, shared by its workers.
pub(super) struct Subscription {
    name: QueueName,
    queue: QueueRef,
    config: PushConfig,
    client: AppClient,
    readiness: Option<AppClient>,
    gate: AppGate,
    backoff: Backoff,
    metrics: PushMetrics,
    /// Headers that are the same for every delivery.
    fixed_headers: Vec<(HeaderName, HeaderValue)>,
}

/// How the exchange with the app ended.
enum Exchange {
    Answer(super::client::Answer),
    Timeout,
    Unreachable(CallError),
    /// An extension found the lease gone (its session ended).
    LeaseLost,
    /// Shutdown's deadline came first.
    Aborted,
}

impl Subscription {
    pub(super) fn new(
        name: &QueueName,
        config: &PushConfig,
        door: &Door,
        metrics: &Arc<Metrics>,
        tasks: &TaskTracker,
        abort: &CancellationToken,
    ) -> Result<Subscription, String> {
        let url = config.url.clone();
        let readiness = config.readiness_url.clone();
        let queue = door.queues().declared(name).map_err(|err| err.to_string())?;
        let connect_timeout = config.request_timeout;
        let metrics = metrics.push(name);
        let backoff = backoff::policy(config);
        let fixed_headers = vec![
            content_type(&config.content_type),
            (HeaderName::from_static(HEADER_QUEUE), header_text(name)),
            (HeaderName::from_static("ce-specversion"), HeaderValue::from_static("1.0")),
            (HeaderName::from_static("ce-source"), header_text(queue.path())),
            (HeaderName::from_static("ce-type"), header_text(&config.event_type)),
        ];
        Ok(Subscription {
            name: name.clone(),
            queue,
            client: AppClient::new(url, connect_timeout, tasks.clone(), abort.clone()),
            readiness: readiness.map(|url| AppClient::new(url, connect_timeout, tasks.clone(), abort.clone())),
            gate: AppGate::new(config.readiness_url.is_some(), backoff, metrics.app_available.clone()),
            backoff,
            metrics,
            config: config.clone(),
            fixed_headers,
        })
    }

    pub(super) fn has_readiness(&self) -> bool {
        self.readiness.is_some()
    }

    /// One worker: until `draining`, wait for the gate, connect, lease, deliver, settle.
    pub(super) async fn run(self: Arc<Self>, draining: CancellationToken, abort: CancellationToken) {
        let mut connection: Option<AppConnection> = None;
        let mut lease_failures = 0u32;
        loop {
            let Some(pass) = self.gate.wait_open(&draining).await else { return };
            if !connection.as_ref().is_some_and(AppConnection::is_usable) {
                connection = None;
                match self.connect().await {
                    Some(opened) => connection = Some(opened),
                    None => continue, // the gate now holds a pause
                }
            }
            drop(pass);
            let leased = tokio::select! {
                leased = self.queue.lease(LEASE_WAIT, self.config.visibility) => leased,
                _ = draining.cancelled() => return,
                // Readiness lost or a pause begun while waiting: a message claimed meanwhile is
                // released by the lease call itself (its caller left).
                _ = self.gate.closed() => continue,
            };
            match leased {
                Ok(Some((message, grant))) => {
                    lease_failures = 0;
                    self.deliver(&mut connection, message, grant, &draining, &abort).await;
                },
                Ok(None) => {},
                Err(QueueError::ShuttingDown) => return,
                Err(err) => {
                    // ZooKeeper unavailable, or the queue has lease.max_per_queue leases out.
                    lease_failures = lease_failures.saturating_add(1);
                    let pause = self.backoff.delay(lease_failures);
                    tracing::warn!(queue = %self.name, error = %err, pause_ms = pause.as_millis() as u64,
                        "push: cannot lease a message; trying again after a pause");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {},
                        _ = draining.cancelled() => return,
                    }
                },
            }
        }
    }

    /// Opens a connection to the app; on failure the gate pauses every worker.
    async fn connect(&self) -> Option<AppConnection> {
        match self.client.connect().await {
            Ok(connection) => {
                self.metrics.probes_up.inc();
                if self.gate.reached() {
                    tracing::info!(queue = %self.name, url = %self.config.url, "push: the app can be reached again");
                }
                Some(connection)
            },
            Err(err) => {
                self.metrics.probes_down.inc();
                if self.gate.unreachable() == 1 {
                    tracing::warn!(queue = %self.name, url = %self.config.url, error = %err,
                        "push: cannot reach the app; waiting for it with a growing pause");
                }
                None
            },
        }
    }

    /// Delivers one leased message and settles its lease.
    async fn deliver(
        &self,
        connection: &mut Option<AppConnection>,
        message: Message,
        grant: LeaseGrant,
        draining: &CancellationToken,
        abort: &CancellationToken,
    ) {
        let _in_flight = GaugeGuard::new(self.metrics.in_flight.clone());
        let headers = self.headers(&message, &grant);
        let body = Bytes::from(message.body);
        let mut expires = Instant::now() + until_epoch_ms(grant.expires_at_ms);
        let sent = Instant::now();
        let exchange = self.exchange(connection, headers, body, grant.receipt, &mut expires, abort).await;
        let (verdict, outcome) = match exchange {
            Exchange::Answer(answer) => {
                self.metrics.delivery_duration.observe(sent.elapsed().as_secs_f64());
                answer::judge(answer.status, answer.retry_after.as_deref(), answer.body.as_deref(), SystemTime::now())
            },
            Exchange::Timeout => {
                *connection = None;
                (Verdict::Retry(None), Outcome::Timeout)
            },
            Exchange::Unreachable(err) => {
                *connection = None;
                tracing::debug!(queue = %self.name, message = %message.message_id, error = %err, "push: delivery failed");
                self.metrics.probes_down.inc();
                self.gate.unreachable();
                (Verdict::Retry(None), Outcome::Unreachable)
            },
            Exchange::LeaseLost => {
                *connection = None;
                self.count(Outcome::LeaseLost);
                return;
            },
            Exchange::Aborted => {
                *connection = None;
                let _ = self.queue.nack(grant.receipt, NackMode::Keep, Duration::ZERO).await;
                self.count(Outcome::Released);
                return;
            },
        };
        let settled = match verdict {
            Verdict::Ack => self.settle(abort, || self.queue.ack(grant.receipt)).await,
            Verdict::Drop => {
                tracing::warn!(queue = %self.name, message = %message.message_id, "push: the app dropped a message");
                self.settle(abort, || self.queue.nack(grant.receipt, NackMode::Delete, Duration::ZERO)).await
            },
            Verdict::Retry(asked) => {
                let pause = match asked {
                    Some(asked) => {
                        let pause = backoff::retry_after(&self.backoff, asked);
                        self.gate.pause(pause);
                        pause
                    },
                    None => self.backoff.delay(grant.delivery_count),
                };
                tracing::debug!(queue = %self.name, message = %message.message_id, outcome = outcome.as_str(),
                    pause_ms = pause.as_millis() as u64, "push: delivery failed; retrying after a pause");
                self.hold_then_release(grant.receipt, pause, expires, draining, abort).await
            },
        };
        match settled {
            Ok(()) => self.count(outcome),
            Err(QueueError::LeaseLost(_) | QueueError::LeaseNotFound(_)) => self.count(Outcome::LeaseLost),
            // ZooKeeper did not confirm before shutdown: the lease is released with the rest.
            Err(_) => self.count(Outcome::Released),
        }
    }

    /// Sends the delivery and waits for the answer, extending the lease every half visibility
    /// while the request is open.
    async fn exchange(
        &self,
        connection: &mut Option<AppConnection>,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Bytes,
        receipt: Receipt,
        expires: &mut Instant,
        abort: &CancellationToken,
    ) -> Exchange {
        let deadline = Instant::now() + self.config.request_timeout;
        let visibility = self.config.visibility;
        let mut next_extend = expires.checked_sub(visibility / 2).unwrap_or_else(Instant::now);
        let call = async {
            // A keep-alive connection the app closed just before the request went out: nothing
            // reached the app, so it is sent again once on a new connection.
            let mut resent = false;
            loop {
                let open = match connection.as_mut().filter(|c| c.is_usable()) {
                    Some(open) => open,
                    None => connection.insert(self.client.connect().await?),
                };
                match open.call(self.client.post(headers.clone(), body.clone())).await {
                    Err(CallError::NotSent) if !resent => {
                        *connection = None;
                        resent = true;
                    },
                    other => return other,
                }
            }
        };
        tokio::pin!(call);
        loop {
            tokio::select! {
                answer = &mut call => return match answer {
                    Ok(answer) => Exchange::Answer(answer),
                    Err(err) => Exchange::Unreachable(err),
                },
                _ = tokio::time::sleep_until(deadline) => return Exchange::Timeout,
                _ = abort.cancelled() => return Exchange::Aborted,
                _ = tokio::time::sleep_until(next_extend) => match self.queue.extend(receipt, visibility).await {
                    Ok(_) => {
                        *expires = Instant::now() + visibility;
                        next_extend = Instant::now() + visibility / 2;
                    },
                    Err(QueueError::LeaseLost(_) | QueueError::LeaseNotFound(_)) => return Exchange::LeaseLost,
                    Err(err) => {
                        // ZooKeeper did not answer: try again while the lease still has time.
                        tracing::debug!(queue = %self.name, error = %err, "push: cannot extend a delivery's lease yet");
                        next_extend = Instant::now() + (visibility / 8).max(Duration::from_millis(100));
                    },
                },
            }
        }
    }

    /// A failed delivery: the message stays leased (invisible) for `pause`, then is released in
    /// its place, so it is delivered again before any later message. Shutdown releases it at once.
    async fn hold_then_release(
        &self,
        receipt: Receipt,
        pause: Duration,
        expires: Instant,
        draining: &CancellationToken,
        abort: &CancellationToken,
    ) -> Result<(), QueueError> {
        let release_at = Instant::now() + pause;
        // The lease must outlive the pause (with room for the release itself). Should ZooKeeper
        // not answer, its expiry releases it in place all the same, only sooner.
        if expires < release_at + self.config.visibility / 2 {
            match self.queue.extend(receipt, pause + self.config.visibility).await {
                Err(err @ (QueueError::LeaseLost(_) | QueueError::LeaseNotFound(_))) => return Err(err),
                Err(err) => tracing::debug!(queue = %self.name, error = %err, "push: cannot extend a held delivery"),
                Ok(_) => {},
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(release_at) => {},
            _ = draining.cancelled() => {},
        }
        self.settle(abort, || self.queue.nack(receipt, NackMode::Keep, Duration::ZERO)).await
    }

    /// Runs a lease step until it is confirmed: when ZooKeeper does not answer, the lease stays
    /// held and the same step is retried (a lost answer is resolved by the lock's evidence).
    /// Gives up at `abort` (shutdown then releases the lease).
    async fn settle<F, Fut>(&self, abort: &CancellationToken, step: F) -> Result<(), QueueError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), QueueError>>,
    {
        let mut pause = Duration::from_millis(100);
        loop {
            match step().await {
                Ok(()) => return Ok(()),
                Err(err @ (QueueError::LeaseLost(_) | QueueError::LeaseNotFound(_))) => return Err(err),
                Err(err) => {
                    tracing::warn!(queue = %self.name, error = %err, "push: cannot settle a delivery yet; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {},
                        _ = abort.cancelled() => return Err(err),
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                },
            }
        }
    }

    fn count(&self, outcome: Outcome) {
        self.metrics.delivered(outcome.as_str()).inc();
    }

    /// The headers of one delivery: ids, count, expiry, kind fields, attributes, `traceparent`
    /// and CloudEvents' binary mode.
    fn headers(&self, message: &Message, grant: &LeaseGrant) -> Vec<(HeaderName, HeaderValue)> {
        let mut headers = self.fixed_headers.clone();
        let number = |n: i64| HeaderValue::from(n);
        headers.extend([
            (HeaderName::from_static(HEADER_MESSAGE_ID), header_text(&message.message_id)),
            (HeaderName::from_static(HEADER_DELIVERY_COUNT), HeaderValue::from(grant.delivery_count)),
            (HeaderName::from_static(HEADER_FENCING_TOKEN), HeaderValue::from(grant.fencing_token.get())),
            // The same as a CloudEvents extension attribute (lower-case letters and digits only).
            (HeaderName::from_static("ce-zkqfencingtoken"), HeaderValue::from(grant.fencing_token.get())),
            (HeaderName::from_static(HEADER_LEASE_EXPIRES_AT), number(grant.expires_at_ms)),
            (HeaderName::from_static("ce-id"), header_text(&message.message_id)),
            (HeaderName::from_static("ce-time"), header_text(&rfc3339_millis(grant.created_at_ms))),
        ]);
        match &message.meta {
            ItemMeta::Priority(priority) => {
                headers.push((HeaderName::from_static(HEADER_PRIORITY), HeaderValue::from(*priority)));
            },
            ItemMeta::DeliverAt(at) => headers.push((HeaderName::from_static(HEADER_DELIVER_AT), number(*at))),
            ItemMeta::Id(id) => headers.push((HeaderName::from_static(HEADER_ID), header_text(id))),
            ItemMeta::Plain => {},
        }
        // The message's attributes, and its producer's trace context so the app's tracer
        // continues the producer's trace.
        let annex = crate::web::headers::headers_of(&message.attributes, message.traceparent.as_ref());
        headers.extend(annex.map(|(name, value)| (HeaderName::from_static(name), value)));
        headers
    }

    /// The readiness probe: asks `readiness_url` every `readiness_interval` until `draining`.
    pub(super) async fn probe_readiness(self: Arc<Self>, draining: CancellationToken) {
        let Some(readiness) = &self.readiness else { return };
        loop {
            let ready = tokio::select! {
                ready = readiness.probe() => ready,
                _ = draining.cancelled() => return,
            };
            if ready {
                self.metrics.probes_up.inc();
            } else {
                self.metrics.probes_down.inc();
            }
            if self.gate.set_ready(ready) {
                tracing::info!(queue = %self.name, url = %readiness.url().authority, ready,
                    "push: the app's readiness changed");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.readiness_interval) => {},
                _ = draining.cancelled() => return,
            }
        }
    }
}

/// `epoch_ms` as RFC 3339 in UTC with milliseconds (CloudEvents' `time`); a time before 1970 (a
/// node's ctime is never one) as 1970.
fn rfc3339_millis(epoch_ms: i64) -> String {
    let since_epoch = Duration::from_millis(u64::try_from(epoch_ms).unwrap_or(0));
    humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + since_epoch).to_string()
}

/// Time from now until `epoch_ms` (zero if it has passed).
fn until_epoch_ms(epoch_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(epoch_ms.saturating_sub(now_epoch_ms())).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ce_time_is_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339_millis(1_732_370_000_123), "2024-11-23T13:53:20.123Z");
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(-5), "1970-01-01T00:00:00.000Z");
    }
}
