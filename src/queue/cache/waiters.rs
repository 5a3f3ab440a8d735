//! Waiting on the cache: takers waiting for an item, puts waiting for room, callers waiting for
//! a fresh snapshot or a barrier.
//!
//! A wait must cost nothing once its caller is gone (an HTTP client that left drops the future),
//! so every registration is undone by a guard, and a wake-up that found nobody is passed on.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::futures::Notified;
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ChildrenCache;
use crate::zk::ZkError;

/// Keeps `zkq_waiting_takers` and the waiter list right however a wait ends (even when the
/// waiting future is dropped because the HTTP client went away).
struct WaiterGuard<'a> {
    cache: &'a ChildrenCache,
    id: u64,
    woken: bool,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.cache.qm.waiting_takers.dec();
        if self.woken {
            return;
        }
        self.cache.lock().waiter_left(self.id);
    }
}

/// Barriers ([`ChildrenCache::barrier`]): the highest one asked for, the highest one the
/// refresher started, and the highest one finished.
pub(super) struct Barriers {
    wanted: AtomicU64,
    started: AtomicU64,
    done: watch::Sender<u64>,
    /// Asks the refresher to run the barriers asked for.
    asked: Notify,
}

impl Barriers {
    pub(super) fn new() -> Barriers {
        Barriers {
            wanted: AtomicU64::new(0),
            started: AtomicU64::new(0),
            done: watch::channel(0).0,
            asked: Notify::new(),
        }
    }

    /// Asks the refresher to run the barriers asked for (kept until it listens).
    pub(super) fn ask(&self) {
        self.asked.notify_one();
    }

    /// Resolves when a caller asked for a barrier (the refresher's side).
    pub(super) fn asked(&self) -> Notified<'_> {
        self.asked.notified()
    }

    /// Starts the barriers asked for so far as one: the number to [`Barriers::finish`], or
    /// `None` when every barrier asked for has started already.
    pub(super) fn start(&self) -> Option<u64> {
        let want = self.wanted.load(Ordering::SeqCst);
        if want <= self.started.load(Ordering::SeqCst) {
            return None;
        }
        self.started.store(want, Ordering::SeqCst);
        Some(want)
    }

    /// Releases the callers of the barriers up to `want`.
    pub(super) fn finish(&self, want: u64) {
        self.done.send_modify(|done| *done = (*done).max(want));
    }

    /// The barrier started last did not finish (its `sync` failed, or the connection was lost
    /// before its events were applied): it counts as not started, so the next
    /// [`Barriers::start`] runs it again. Its callers keep waiting, until their deadline.
    pub(super) fn failed(&self) {
        self.started.store(*self.done.borrow(), Ordering::SeqCst);
    }

    /// Whether a barrier was asked for, has not started (or failed), and someone still waits
    /// for it (a barrier nobody waits for runs when the next caller asks).
    pub(super) fn pending(&self) -> bool {
        self.wanted.load(Ordering::SeqCst) > self.started.load(Ordering::SeqCst) && self.done.receiver_count() > 0
    }
}

impl ChildrenCache {
    /// Asks for a fresh snapshot and waits for it (until `deadline`). Used when the snapshot
    /// is empty but dirty, so that a take without `wait` still sees items that exist. Fails
    /// with ZooKeeper's refusal when the next attempt is refused (an ACL that does not allow
    /// zkq's session): waiting longer would not help.
    pub(crate) async fn refreshed(&self, deadline: Instant) -> Result<bool, ZkError> {
        let _demand = self.demand();
        let mut snapshots = self.snapshots.subscribe();
        snapshots.borrow_and_update();
        let mut refusals = self.refusals.subscribe();
        refusals.borrow_and_update();
        self.refresh.notify_one();
        tokio::select! {
            changed = snapshots.changed() => Ok(changed.is_ok()),
            changed = refusals.changed() => match (changed, self.lock().refusal()) {
                (Ok(()), Some(refusal)) => Err(refusal),
                _ => Ok(false),
            },
            _ = tokio::time::sleep_until(deadline) => Ok(false),
        }
    }

    /// Waits (until `deadline`) until every change ZooKeeper made before this call is in the
    /// snapshot: the refresher `sync`s the queue path, then applies the events that arrived
    /// before the answer (ZooKeeper sends a session's watch events in order with its replies).
    /// One barrier serves every caller that asked before it started, so many takers about to
    /// answer "empty" share one `sync`. Returns false if it did not finish in time (ZooKeeper
    /// unreachable): the caller does not know that the queue is empty.
    pub(crate) async fn barrier(&self, deadline: Instant) -> bool {
        let _demand = self.demand();
        let barriers = &self.barriers;
        let mut done = barriers.done.subscribe();
        // A barrier already running may have started before this call: wait for the next one.
        let want = barriers.started.load(Ordering::SeqCst) + 1;
        barriers.wanted.fetch_max(want, Ordering::SeqCst);
        barriers.ask();
        loop {
            if *done.borrow_and_update() >= want {
                return true;
            }
            match tokio::time::timeout_at(deadline, done.changed()).await {
                Ok(Ok(())) => {},
                _ => return false,
            }
        }
    }

    /// Waits until `max_items` leaves room, or `deadline`. Returns whether there is room.
    pub(crate) async fn room_for(&self, max_items: u32, deadline: Instant) -> bool {
        loop {
            let notified = self.room.notified();
            if self.child_count() < i64::from(max_items) {
                return true;
            }
            self.refresh.notify_one();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.child_count() < i64::from(max_items);
            }
        }
    }

    /// Waits as a taker until an item may be available, `deadline`, or `cancel`.
    /// Returns false on deadline/cancel. A waiter that is dropped or gives up is removed and
    /// costs nothing; one that was woken but leaves without popping passes its wake-up on.
    pub(crate) async fn wait_for_item(&self, deadline: Instant, cancel: &CancellationToken, first: bool) -> bool {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut state = self.lock();
            state.promote_due();
            if state.has_candidates_for(deadline) {
                return true;
            }
            state.add_waiter(tx, first)
        };
        self.qm.waiting_takers.inc();
        let mut guard = WaiterGuard { cache: self, id, woken: false };
        guard.woken = tokio::select! {
            r = rx => r.is_ok(),
            _ = tokio::time::sleep_until(deadline) => false,
            _ = cancel.cancelled() => false,
        };
        guard.woken
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::test_cache;
    use super::*;
    use crate::config::QueueKind;
    use crate::queue::names;

    #[tokio::test(start_paused = true)]
    #[expect(clippy::disallowed_methods, reason = "the test holds the waiters' handles")]
    async fn a_new_item_wakes_the_longest_waiting_taker_and_only_one() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(Vec::new(), 0, Some(Vec::new()));
        let never = CancellationToken::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let (waiter, never) = (cache.clone(), never.clone());
            waiters.push(tokio::spawn(async move { waiter.wait_for_item(deadline, &never, true).await }));
            // Let it register before the next one (first come, first served).
            while cache.waiting() < waiters.len() {
                tokio::task::yield_now().await;
            }
        }
        cache.insert_local(names::parse(QueueKind::Fifo, "queue-0000000001").expect("item"));
        cache.settle_local();
        let first = waiters.remove(0);
        assert!(first.await.expect("join"), "the first waiter is woken");
        tokio::task::yield_now().await;
        assert_eq!(cache.waiting(), 2, "one item wakes one waiter");
        assert!(waiters.iter().all(|w| !w.is_finished()));
        cache.insert_local(names::parse(QueueKind::Fifo, "queue-0000000002").expect("item"));
        cache.settle_local();
        assert!(waiters.remove(0).await.expect("join"), "then the second");
        // The last one gives up at its deadline.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(!waiters.remove(0).await.expect("join"), "no item: it ends at its deadline");
        assert_eq!(cache.waiting(), 0);
    }
}
