//! Background tasks that survive their own bugs.
//!
//! A background task (a queue's cache refresher, lease reaper, delivery-count and idempotency
//! sweepers, a counter's watch) runs until shutdown. If it panics or ends before shutdown, nothing
//! else would ever run it again and its queue or counter would silently stop working; so it is
//! restarted, with a capped exponential backoff, logged as an error and counted in
//! `zkq_background_task_restarts_total{task}`. A task that finishes on its own (a lock watch) is
//! restarted only when it panics before it is done.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::types::Backoff;

/// First pause before a restart.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between restarts; a run that lasted longer than this resets the backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The supervised task kinds are the restart metric's label, so they live on the ground floor
/// where `metrics/` can name them without importing this module.
pub(crate) use crate::types::Task;

/// Runs the task `make` builds until `shutdown`; a run that panics, or returns while `shutdown`
/// is not cancelled, is logged, counted and started again after a backoff.
pub(crate) async fn until_shutdown<F, Fut>(
    task: Task,
    owner: String,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    make: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    supervise(task, owner, metrics, shutdown, make, false).await;
}

/// Runs a task that may finish on its own (one watch on one node) until it finishes or
/// `shutdown`: a run that panics is logged, counted and started again after a backoff, so a bug
/// in one run cannot leave its work undone. A run that returns is done.
pub(crate) async fn until_done<F, Fut>(
    task: Task,
    owner: String,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    make: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    supervise(task, owner, metrics, shutdown, make, true).await;
}

async fn supervise<F, Fut>(
    task: Task,
    owner: String,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    mut make: F,
    returning_is_done: bool,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut restarts = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF, 0.0).retries();
    loop {
        let started = Instant::now();
        let outcome = AssertUnwindSafe(make()).catch_unwind().await;
        if shutdown.is_cancelled() || (returning_is_done && outcome.is_ok()) {
            return;
        }
        let why = match &outcome {
            Ok(()) => "ended before shutdown".to_owned(),
            Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
        };
        if started.elapsed() > MAX_BACKOFF {
            restarts.reset();
        }
        let backoff = restarts.next_delay();
        metrics.background_task_restarts.with_label_values(&[task.as_str()]).inc();
        tracing::error!(task = task.as_str(), owner = %owner, why = %why,
            restart_in_ms = backoff.as_millis() as u64, "background task stopped; restarting it (this is a bug)");
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {},
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn restarts(metrics: &Metrics, task: Task) -> u64 {
        metrics.background_task_restarts.with_label_values(&[task.as_str()]).get()
    }

    #[tokio::test]
    #[expect(clippy::disallowed_methods, reason = "the test holds the task's handle")]
    async fn a_panicking_task_is_restarted_and_counted() {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let shutdown = CancellationToken::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let healthy = Arc::new(tokio::sync::Notify::new());
        let supervised =
            tokio::spawn(until_shutdown(Task::CacheRefresher, "q".into(), metrics.clone(), shutdown.clone(), {
                let (runs, healthy, shutdown) = (runs.clone(), healthy.clone(), shutdown.clone());
                move || {
                    let (runs, healthy, shutdown) = (runs.clone(), healthy.clone(), shutdown.clone());
                    async move {
                        match runs.fetch_add(1, Ordering::SeqCst) {
                            0 => panic!("first run fails"),
                            1 => {}, // ends early: also a restart
                            _ => {
                                healthy.notify_one();
                                shutdown.cancelled().await;
                            },
                        }
                    }
                }
            }));
        tokio::time::timeout(Duration::from_secs(10), healthy.notified()).await.expect("third run starts");
        assert_eq!(restarts(&metrics, Task::CacheRefresher), 2);
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), supervised).await.expect("stops on shutdown").expect("join");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "not restarted after shutdown");
        assert_eq!(restarts(&metrics, Task::LeaseReaper), 0);
    }

    #[tokio::test]
    async fn a_task_that_panics_before_it_is_done_is_restarted_until_it_is() {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let runs = Arc::new(AtomicUsize::new(0));
        let supervised = until_done(Task::LockWatcher, "q".into(), metrics.clone(), CancellationToken::new(), {
            let runs = runs.clone();
            move || {
                let runs = runs.clone();
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) < 2 {
                        panic!("watch failed");
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), supervised).await.expect("done after the third run");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "restarted after each panic, not after it was done");
        assert_eq!(restarts(&metrics, Task::LockWatcher), 2);
    }
}
