//! The children cache of one queue and its waiting takers.
//!
//! One task per queue keeps one one-shot children watch armed and holds a sorted snapshot of the
//! deliverable items. Takers pop candidates from the snapshot; each pop is then confirmed in
//! ZooKeeper (versioned delete or lock), so a stale snapshot costs a failed claim, never a wrong
//! delivery. The snapshot is re-read only when a watch said it changed *and* it is needed: no
//! candidates left while someone waits, or a quarter of it consumed (so new, higher-priority
//! items are seen soon). Draining a queue therefore costs O(1) amortised child-list reads per
//! message instead of Curator's one full re-read per change.
//!
//! Waiters are served first come, first served, and a new item wakes one waiter.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::names::{self, ItemName};
use crate::config::QueueKind;
use crate::metrics::Metrics;
use crate::zk::{ConnectionState, WatchEvent, Zk, ZkError, ZkSession};

/// Milliseconds since the Unix epoch, the unit of delay-queue names.
pub fn now_epoch_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).unwrap_or(0)
}

struct Waiter {
    id: u64,
    wake: oneshot::Sender<()>,
}

#[derive(Default)]
struct State {
    /// Deliverable items, in delivery order.
    candidates: VecDeque<ItemName>,
    /// Delay-queue items not yet due, sorted by due time.
    delayed: Vec<ItemName>,
    snapshot_len: usize,
    taken_since_read: usize,
    /// A watch fired (or a snapshot was never read) since the last read.
    dirty: bool,
    /// Children counted at the last read, adjusted by this process's own puts and takes.
    child_count: i64,
    waiters: VecDeque<Waiter>,
    next_waiter_id: u64,
    /// `queue-` nodes that are not Curator envelopes: logged once, then skipped.
    undecodable: HashSet<String>,
    /// Items whose lock (held by a consumer) is being watched.
    watched_locks: HashSet<String>,
    /// A snapshot was read since the cache was made.
    read_once: bool,
    /// Eager caches only: every child name seen (read or put by this process), and those read
    /// for the first time and not yet checked.
    known: HashSet<String>,
    unchecked: Vec<String>,
}

/// Keeps `zkq_waiting_takers` and the waiter list right however a wait ends (even when the
/// waiting future is dropped because the HTTP client went away).
struct WaiterGuard<'a> {
    cache: &'a ChildrenCache,
    id: u64,
    woken: bool,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.cache.metrics.waiting_takers.with_label_values(&[&self.cache.label]).dec();
        if self.woken {
            return;
        }
        let mut state = self.cache.lock();
        let before = state.waiters.len();
        state.waiters.retain(|w| w.id != self.id);
        if before == state.waiters.len() && !state.candidates.is_empty() {
            // We were woken just as we gave up: hand the wake-up to the next waiter.
            ChildrenCache::wake(&mut state, 1);
        }
    }
}

/// Shared between the refresher task and the takers.
pub struct ChildrenCache {
    kind: QueueKind,
    path: String,
    label: String,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
    /// Asks the refresher for a new snapshot.
    refresh: Notify,
    /// Counts snapshots; takers wait on it after asking for a refresh.
    snapshots: watch::Sender<u64>,
    /// Signalled when the child count may have dropped (for puts waiting on `max_items`).
    room: Notify,
    /// Ends the lock watches (they hold the session open) when zkq shuts down.
    shutdown: CancellationToken,
    /// Owns the lock watches.
    tasks: TaskTracker,
    /// Re-read on every change and remember new names (queues with a dead-letter queue, so an
    /// undecodable node is moved there promptly).
    eager: bool,
}

impl ChildrenCache {
    pub fn new(
        kind: QueueKind,
        path: String,
        label: String,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
        eager: bool,
    ) -> Arc<ChildrenCache> {
        let state = State { dirty: true, ..State::default() };
        Arc::new(ChildrenCache {
            kind,
            path,
            label,
            metrics,
            state: Mutex::new(state),
            refresh: Notify::new(),
            snapshots: watch::channel(0).0,
            room: Notify::new(),
            shutdown,
            tasks,
            eager,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-updated in a way that
        // matters (every candidate is re-confirmed in ZooKeeper), so recover from poisoning.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next candidate to claim, if the snapshot has one.
    pub fn pop(&self) -> Option<ItemName> {
        let mut state = self.lock();
        self.promote_due(&mut state);
        let item = state.candidates.pop_front();
        if item.is_some() {
            state.taken_since_read += 1;
        }
        if state.dirty && (item.is_none() || state.taken_since_read * 4 >= state.snapshot_len.max(1)) {
            self.refresh.notify_one();
        }
        item
    }

    /// Whether the snapshot may be missing items (a watch fired or nothing was read yet).
    pub fn is_dirty(&self) -> bool {
        self.lock().dirty
    }

    /// Puts a candidate back at the head (its claim failed for a transient reason).
    pub fn push_front(&self, item: ItemName) {
        let mut state = self.lock();
        state.candidates.push_front(item);
        Self::wake(&mut state, 1);
    }

    /// Adds an item this process just created, so local takers see it without a re-read.
    pub fn insert_local(&self, item: ItemName) {
        let mut state = self.lock();
        state.child_count += 1;
        if self.eager {
            state.known.insert(item.name.clone());
        }
        if !state.read_once {
            // Before the first snapshot the candidates would hold only this item, and a take
            // would hand it out ahead of older ones; the first read (or the watch it arms) has it.
            return;
        }
        if names::due_time(&item) > now_epoch_ms() {
            let pos = state.delayed.partition_point(|d| names::compare(self.kind, d, &item).is_lt());
            state.delayed.insert(pos, item);
            self.refresh.notify_one(); // the refresher re-arms its timer
            return;
        }
        let pos = state.candidates.partition_point(|c| names::compare(self.kind, c, &item).is_lt());
        state.candidates.insert(pos, item);
        Self::wake(&mut state, 1);
    }

    /// Offers an existing item again (its lock was released), in its place in the order.
    pub fn reoffer(&self, item: ItemName) {
        let mut state = self.lock();
        if state.candidates.iter().any(|c| c.name == item.name) {
            return;
        }
        let pos = state.candidates.partition_point(|c| names::compare(self.kind, c, &item).is_lt());
        state.candidates.insert(pos, item);
        Self::wake(&mut state, 1);
    }

    /// Watches the lock a consumer holds on `item` and offers the item again once the lock is
    /// gone (released, or its session ended). One watch per locked item, however many takers.
    pub fn watch_lock(self: &Arc<Self>, zk: &Zk, item: ItemName, lock_dir: Option<&str>) {
        let Some(lock_dir) = lock_dir else { return };
        if !self.lock().watched_locks.insert(item.name.clone()) {
            return;
        }
        let lock = format!("{lock_dir}/{}", item.name);
        let owner = format!("queue {}", self.label);
        let (cache, zk) = (self.clone(), zk.clone());
        self.tasks.spawn(crate::supervise::until_done(
            crate::supervise::Task::LockWatcher,
            owner,
            self.metrics.clone(),
            self.shutdown.clone(),
            move || cache.clone().await_lock_release(zk.clone(), lock.clone(), item.clone()),
        ));
    }

    /// One run of a lock watch: waits until `lock` is gone, then offers `item` again. A restart
    /// after a panic starts over with a fresh read, so no release is missed.
    async fn await_lock_release(self: Arc<Self>, zk: Zk, lock: String, item: ItemName) {
        let released = async {
            loop {
                let zk = zk.with_deadline(Instant::now() + Duration::from_secs(10));
                match zk.watch_exists(&lock).await {
                    Ok((Some(_), watch)) => {
                        if watch.changed().await == WatchEvent::SessionEnded {
                            return;
                        }
                    },
                    Ok((None, _)) | Err(_) => return,
                }
            }
        };
        tokio::select! {
            _ = self.shutdown.cancelled() => return,
            _ = released => {},
        }
        self.lock().watched_locks.remove(&item.name);
        self.reoffer(item);
    }

    /// The snapshot may be missing a node this process created without learning its name:
    /// re-read it when it is needed (now, if someone waits).
    pub fn mark_stale(&self) {
        if self.mark_dirty() {
            self.refresh.notify_one();
        }
    }

    /// Records that this process removed a child.
    pub fn removed_local(&self) {
        self.lock().child_count -= 1;
        self.room.notify_waiters();
    }

    /// Records an undecodable node; true the first time (log it then).
    pub fn mark_undecodable(&self, name: &str) -> bool {
        let first = self.lock().undecodable.insert(name.to_owned());
        if first {
            self.metrics.undecodable_messages.with_label_values(&[&self.label]).inc();
        }
        first
    }

    pub fn child_count(&self) -> i64 {
        self.lock().child_count
    }

    pub fn waiting(&self) -> usize {
        self.lock().waiters.len()
    }

    /// The first candidates without removing them (for introspection).
    pub fn head_candidate(&self) -> Option<ItemName> {
        self.lock().candidates.front().cloned()
    }

    /// Asks for a fresh snapshot and waits for it (until `deadline`). Used when the snapshot
    /// is empty but dirty, so that a take without `wait` still sees items that exist.
    pub async fn refreshed(&self, deadline: Instant) -> bool {
        let mut rx = self.snapshots.subscribe();
        rx.borrow_and_update();
        self.refresh.notify_one();
        matches!(tokio::time::timeout_at(deadline, rx.changed()).await, Ok(Ok(())))
    }

    /// Waits until `max_items` leaves room, or `deadline`. Returns whether there is room.
    pub async fn room_for(&self, max_items: u32, deadline: Instant) -> bool {
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
    pub async fn wait_for_item(&self, deadline: Instant, cancel: &CancellationToken, first: bool) -> bool {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut state = self.lock();
            self.promote_due(&mut state);
            if !state.candidates.is_empty() {
                return true;
            }
            let id = state.next_waiter_id;
            state.next_waiter_id += 1;
            let waiter = Waiter { id, wake: tx };
            // A waiter that was woken but lost the race keeps its place at the front.
            if first {
                state.waiters.push_back(waiter)
            } else {
                state.waiters.push_front(waiter)
            }
            id
        };
        self.metrics.waiting_takers.with_label_values(&[&self.label]).inc();
        let mut guard = WaiterGuard { cache: self, id, woken: false };
        guard.woken = tokio::select! {
            r = rx => r.is_ok(),
            _ = tokio::time::sleep_until(deadline) => false,
            _ = cancel.cancelled() => false,
        };
        guard.woken
    }

    fn wake(state: &mut State, mut n: usize) {
        while n > 0 {
            let Some(waiter) = state.waiters.pop_front() else { return };
            if waiter.wake.send(()).is_ok() {
                n -= 1;
            }
        }
    }

    /// Moves delay-queue items whose time has come to the candidates.
    fn promote_due(&self, state: &mut State) {
        if state.delayed.is_empty() {
            return;
        }
        let now = now_epoch_ms();
        let due = state.delayed.partition_point(|d| names::due_time(d) <= now);
        if due == 0 {
            return;
        }
        for item in state.delayed.drain(..due).collect::<Vec<_>>() {
            let pos = state.candidates.partition_point(|c| names::compare(self.kind, c, &item).is_lt());
            state.candidates.insert(pos, item);
        }
        let n = state.candidates.len();
        Self::wake(state, n);
    }

    fn next_due(&self) -> Option<Instant> {
        let state = self.lock();
        let first = state.delayed.first()?;
        let wait_ms = (names::due_time(first) - now_epoch_ms()).max(0);
        Some(Instant::now() + Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)))
    }

    fn apply_snapshot(&self, children: Vec<String>, num_children: i32) {
        let now = now_epoch_ms();
        let mut items: Vec<ItemName> = Vec::with_capacity(children.len());
        {
            let state = self.lock();
            for child in &children {
                if state.undecodable.contains(child) {
                    continue;
                }
                if let Some(item) = names::parse(self.kind, child) {
                    items.push(item);
                }
            }
        }
        items.sort_by(|a, b| names::compare(self.kind, a, b));
        let split = if self.kind == QueueKind::Delay {
            items.partition_point(|i| names::due_time(i) <= now)
        } else {
            items.len()
        };
        let mut delayed = items.split_off(split);
        delayed.sort_by_key(names::due_time);
        let mut state = self.lock();
        state.snapshot_len = items.len();
        state.candidates = items.into();
        state.delayed = delayed;
        state.taken_since_read = 0;
        state.dirty = false;
        state.read_once = true;
        state.child_count = i64::from(num_children);
        let present: HashSet<&String> = children.iter().collect();
        state.undecodable.retain(|name| present.contains(name));
        if self.eager {
            let new: Vec<String> = children.iter().filter(|c| !state.known.contains(*c)).cloned().collect();
            state.unchecked.extend(new);
            state.known = children.iter().cloned().collect();
        }
        let n = state.candidates.len();
        Self::wake(&mut state, n);
        drop(state);
        self.metrics.queue_children.with_label_values(&[&self.label]).set(i64::from(num_children));
        self.metrics.children_reads.with_label_values(&[&self.label]).inc();
        self.room.notify_waiters();
        self.snapshots.send_modify(|n| *n += 1);
    }

    fn mark_dirty(&self) -> bool {
        let mut state = self.lock();
        state.dirty = true;
        // Re-read at once when it is needed now (or the cache is eager); otherwise wait until a
        // taker asks.
        self.eager || (state.candidates.is_empty() && !state.waiters.is_empty())
    }

    /// Names read for the first time since the last call (eager caches only).
    pub fn take_unchecked(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().unchecked)
    }

    /// Changes with every snapshot read.
    pub fn subscribe_snapshots(&self) -> watch::Receiver<u64> {
        self.snapshots.subscribe()
    }

    fn invalidate(&self) {
        let mut state = self.lock();
        state.dirty = true;
        state.candidates.clear();
        state.delayed.clear();
    }

    /// The refresher: keeps the snapshot and the watch alive across reconnects and new sessions.
    ///
    /// On every new session it first ensures the queue node and `dirs` (the lock directory, the
    /// claim-marker directory), so the first claim of a queue does not pay a failed transaction.
    pub async fn run(self: Arc<Self>, session: ZkSession, dirs: Vec<String>, shutdown: CancellationToken) {
        let mut status_rx = session.subscribe();
        let mut ensured_generation = 0;
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let far = Instant::now() + Duration::from_secs(3600);
            let zk = tokio::select! {
                _ = shutdown.cancelled() => return,
                zk = session.connected(far) => zk,
            };
            let Ok(zk) = zk else {
                if session.status().state == ConnectionState::Closed {
                    return;
                }
                continue;
            };
            let epoch = session.status().epoch;
            if ensured_generation != zk.generation() {
                let mut ensured = zk.ensure_path(&self.path).await;
                for dir in &dirs {
                    if ensured.is_ok() {
                        ensured = zk.ensure_path(dir).await;
                    }
                }
                match ensured {
                    Ok(()) => ensured_generation = zk.generation(),
                    Err(err) => {
                        tracing::warn!(queue = %self.label, error = %err, "cannot create queue path; will retry");
                        self.pause_until_status_change(&mut status_rx, &shutdown, Duration::from_secs(1)).await;
                        continue;
                    },
                }
            }
            let watch = match zk.get_and_watch_children(&self.path).await {
                Ok((children, stat, watch)) => {
                    self.apply_snapshot(children, stat.num_children);
                    watch
                },
                Err(ZkError::NoNode) => {
                    ensured_generation = 0;
                    continue;
                },
                Err(err) => {
                    tracing::debug!(queue = %self.label, error = %err, "children read failed");
                    self.pause_until_status_change(&mut status_rx, &shutdown, Duration::from_millis(200)).await;
                    continue;
                },
            };
            // Wait for a reason to re-read.
            let mut watch = Some(Box::pin(watch.changed()));
            loop {
                let due = self.next_due();
                let status_changed = async {
                    loop {
                        if status_rx.changed().await.is_err() {
                            return;
                        }
                        let status = *status_rx.borrow_and_update();
                        if status.epoch != epoch || !status.state.is_connected() {
                            return;
                        }
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    event = async { match watch.as_mut() { Some(w) => w.await, None => std::future::pending().await } } => {
                        watch = None;
                        if event == WatchEvent::SessionEnded || self.mark_dirty() {
                            break;
                        }
                    },
                    _ = self.refresh.notified() => {
                        if watch.is_none() || self.is_dirty() {
                            break;
                        }
                        // Not dirty: the snapshot is current; count it as one anyway so the asker goes on.
                        self.snapshots.send_modify(|n| *n += 1);
                    },
                    _ = async { match due { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                        let mut state = self.lock();
                        self.promote_due(&mut state);
                    },
                    _ = status_changed => {
                        if !session.status().state.is_connected() {
                            self.invalidate();
                        }
                        break;
                    },
                }
            }
        }
    }

    async fn pause_until_status_change(
        &self,
        status_rx: &mut watch::Receiver<crate::zk::SessionStatus>,
        shutdown: &CancellationToken,
        at_most: Duration,
    ) {
        tokio::select! {
            _ = shutdown.cancelled() => {},
            _ = status_rx.changed() => {},
            _ = tokio::time::sleep(at_most) => {},
        }
    }
}
