//! Work a client may not cut short, run on the client's own task while the client waits.
//!
//! A client may give up on any request: hyper then drops the handler's future, and a step run
//! inside it would stop between its transaction and its bookkeeping (a lease step applied but
//! forgotten, a claim made for nobody). Such work used to be spawned on the queue's background
//! tracker at once, and the request waited for its answer: two hand-offs between tasks (and
//! often between threads) on every request, paid by every client that did not give up.
//!
//! [`finish`] keeps the guarantee without the hand-offs: the work is polled by the request's own
//! task while the request waits, and only if the request is dropped before the work ended is the
//! work moved, as it stands, onto the tracker, which runs it to its end (and which shutdown waits
//! for). The work learns that its caller left as before: the answer's receiver is closed before
//! the work moves, so `Sender::is_closed` and `Sender::closed` tell it, and a `send` hands the
//! value back.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs the work `make` builds (given the sender of its answer) to its end, whether or not the
/// caller still waits; resolves to the answer, or `None` when the work ended without one (it
/// dropped its sender). The work's log lines carry the caller's span.
pub(crate) fn finish<T, F, Fut>(tasks: &TaskTracker, make: F) -> Finishing<T>
where
    F: FnOnce(oneshot::Sender<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (answer, answered) = oneshot::channel();
    let work = tracing::Instrument::instrument(make(answer), tracing::Span::current());
    Finishing { work: Some(Box::pin(work)), answered, tasks: tasks.clone() }
}

/// The future [`finish`] answers: polls the work while it is awaited, hands it to the tracker
/// when dropped before the work ended.
#[must_use = "the work runs only while this is awaited, or once it is dropped"]
pub(crate) struct Finishing<T> {
    work: Option<Work>,
    answered: oneshot::Receiver<T>,
    tasks: TaskTracker,
}

impl<T> Future for Finishing<T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = &mut *self;
        if let Some(work) = this.work.as_mut() {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(cx))) {
                Ok(Poll::Ready(())) => this.work = None,
                Ok(Poll::Pending) => {},
                Err(panic) => {
                    // A future that panicked must never be polled again: dropped here, never
                    // handed to the tracker (which would resume it). The caller's panic goes on.
                    this.work = None;
                    tracing::error!("work a client may not cut short panicked; it was dropped");
                    std::panic::resume_unwind(panic);
                },
            }
        }
        // Ready once the work answered (the work may go on: it finishes when this is dropped),
        // or ended without answering.
        Pin::new(&mut this.answered).poll(cx).map(Result::ok)
    }
}

impl<T> Drop for Finishing<T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else { return };
        // First tell the work its caller left: it may run on another thread at once.
        self.answered.close();
        // Outside a runtime (it is being dropped itself) there is nothing left to run it on.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.tasks.spawn(work);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn work_answers_the_waiting_caller_on_its_own_task() {
        let tasks = TaskTracker::new();
        let answer = finish(&tasks, |tx| async move {
            let _ = tx.send(7);
        })
        .await;
        assert_eq!(answer, Some(7));
        assert!(tasks.is_empty(), "nothing was handed to the tracker");
    }

    #[tokio::test]
    async fn work_whose_caller_left_runs_to_its_end_and_learns_the_caller_left() {
        let tasks = TaskTracker::new();
        let (go, gate) = oneshot::channel::<()>();
        let (seen_tx, seen) = oneshot::channel::<bool>();
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        let mut waiting = Box::pin(finish(&tasks, move |tx: oneshot::Sender<u32>| async move {
            let _ = gate.await;
            flag.store(true, Ordering::SeqCst);
            let _ = seen_tx.send(tx.is_closed());
            assert!(tx.send(1).is_err(), "nobody to answer");
        }));
        // The work starts on the caller's task and waits at its gate.
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(waiting);
        assert!(!ended.load(Ordering::SeqCst));
        let _ = go.send(());
        tasks.close();
        tasks.wait().await;
        assert!(ended.load(Ordering::SeqCst), "the work ran to its end on the tracker");
        assert_eq!(seen.await.ok(), Some(true), "the work saw that its caller left");
    }

    #[tokio::test]
    async fn work_whose_poll_panicked_is_dropped_never_polled_again() {
        use std::sync::atomic::AtomicUsize;
        let tasks = TaskTracker::new();
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        let callers = TaskTracker::new();
        let caller = callers.spawn({
            let tasks = tasks.clone();
            async move {
                finish(&tasks, move |tx: oneshot::Sender<u8>| {
                    futures::future::poll_fn(move |_| {
                        let _answer = &tx;
                        assert!(counted.fetch_add(1, Ordering::SeqCst) > 0, "the first poll panics");
                        Poll::Ready(())
                    })
                })
                .await
            }
        });
        assert!(caller.await.is_err_and(|err| err.is_panic()), "the caller's panic goes on");
        tasks.close();
        tasks.wait().await;
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the panicked work was not resumed on the tracker");
    }

    #[tokio::test]
    async fn work_that_ends_without_answering_answers_none() {
        let tasks = TaskTracker::new();
        let answer: Option<u8> = finish(&tasks, |tx| async move { drop(tx) }).await;
        assert_eq!(answer, None);
    }
}
