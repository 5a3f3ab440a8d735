//! Push delivery: zkq calls the app, so the app needs no consumer loop.
//!
//! A declared queue with `[queues.NAME.push]` gets `concurrency` workers. Each one waits until
//! the app may be called ([`gate`]: readiness, reachability, pauses), opens (or keeps) a
//! connection to it, leases the head message through the queue's ordinary lease machinery,
//! POSTs it ([`client`]) and settles the lease by the answer ([`answer`]): ack, delete (Dapr's
//! DROP), or hold it for a backoff and release it in its place, so it is delivered again
//! (counted toward `max_deliveries`, so poison reaches the dead-letter queue).
//!
//! Invariants:
//! - A push delivery is a lease like any other: the same receipts, steps and fencing as the HTTP
//!   lease endpoints; nothing here touches ZooKeeper directly.
//! - At most `concurrency` deliveries of a subscription are in flight: one per worker.
//! - A connection to the app is made before a message is leased, so an app that is down costs no
//!   delivery; while it stays down, workers wait on a doubling, jittered pause (no busy loop).
//! - A failed delivery keeps its lease during its backoff and is then released in place: with
//!   concurrency 1 no later message overtakes it.
//! - Shutdown: `draining` stops new leases; deliveries in flight get until a deadline to be
//!   answered and settled; `abort` then ends the rest, which release their messages at once.
//! - This is the only code that makes outbound HTTP requests; it reads the app's statuses as
//!   numbers (`answer.rs`), `http/` keeps the statuses zkq itself answers.

mod answer;
mod backoff;
mod client;
mod gate;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::door::Door;
use crate::metrics::Metrics;
use crate::supervise::{self, Task};

/// The push subscriptions of this process and their tasks.
pub(crate) struct PushService {
    tasks: TaskTracker,
    abort: CancellationToken,
}

impl PushService {
    /// Starts a worker per unit of `concurrency` for every queue with a `push` table (and its
    /// readiness probe). Workers stop leasing when `draining` is cancelled.
    pub(crate) fn start(
        config: &Config,
        door: &Door,
        metrics: &Arc<Metrics>,
        draining: CancellationToken,
    ) -> PushService {
        let tasks = TaskTracker::new();
        let abort = CancellationToken::new();
        for (name, queue_config) in &config.queues {
            let Some(push) = &queue_config.push else { continue };
            let subscription = match worker::Subscription::new(name, push, door, metrics, &tasks, &abort) {
                Ok(subscription) => Arc::new(subscription),
                Err(err) => {
                    tracing::error!(queue = %name, error = %err, "cannot start push delivery");
                    continue;
                },
            };
            for number in 0..push.concurrency {
                let owner = format!("push {name} worker {number}");
                tasks.spawn(supervise::until_shutdown(Task::PushWorker, owner, metrics.clone(), draining.clone(), {
                    let (subscription, draining, abort) = (subscription.clone(), draining.clone(), abort.clone());
                    move || subscription.clone().run(draining.clone(), abort.clone())
                }));
            }
            if subscription.has_readiness() {
                let owner = format!("push {name} readiness");
                tasks.spawn(supervise::until_shutdown(
                    Task::PushReadiness,
                    owner,
                    metrics.clone(),
                    draining.clone(),
                    {
                        let (subscription, draining) = (subscription.clone(), draining.clone());
                        move || subscription.clone().probe_readiness(draining.clone())
                    },
                ));
            }
            tracing::info!(queue = %name, url = %push.url, concurrency = push.concurrency, "push delivery started");
        }
        PushService { tasks, abort }
    }

    /// Shutdown, once `draining` is cancelled (no delivery starts any more): deliveries in flight
    /// get until `deliveries_until` to be answered and settled; then the rest are ended and their
    /// messages released, to be delivered again at once. True if everything ended by `deadline`.
    pub(crate) async fn drain(&self, deliveries_until: Instant, deadline: Instant) -> bool {
        self.tasks.close();
        if tokio::time::timeout_at(deliveries_until, self.tasks.wait()).await.is_ok() {
            return true;
        }
        tracing::info!("push deliveries still in flight at the end of their grace: releasing them");
        self.abort.cancel();
        tokio::time::timeout_at(deadline, self.tasks.wait()).await.is_ok()
    }

    /// The part of `grace` kept at the end of a shutdown to release deliveries that did not finish.
    pub(crate) fn release_reserve(grace: Duration) -> Duration {
        (grace / 4).min(Duration::from_secs(2))
    }
}
