//! The children cache of one queue and its waiting takers.
//!
//! One task per queue holds a sorted snapshot of the deliverable items and keeps it current from
//! ZooKeeper events: a persistent recursive watch on the queue node reports every created and
//! deleted child (and one on the lock directory every lock taken or released), so the child list
//! is read once per connection, not once per change. Takers pop candidates from the snapshot; each
//! pop is then confirmed in ZooKeeper (versioned delete or lock), so a stale snapshot costs a
//! failed claim, never a wrong delivery. Candidates another consumer removed or locked are pruned
//! by those events before anyone tries them, so many sidecars on one queue do not all try every
//! item. The client crate does not re-register persistent watches after a reconnect: the
//! refresher adds them again on every (re)connection and re-reads once.
//!
//! Ordering: a single consumer gets the head, in Curator's order. Once this process has seen
//! another consumer take or lock one of its candidates (within the last few seconds), takers pick
//! at random among the first [`SPREAD_WINDOW`] candidates instead, so that several sidecars do not
//! all propose the same head; with several consumers Curator promises no global order either.
//!
//! Waiters are served first come, first served, and a new item wakes one waiter.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::names::{self, ItemName};
use crate::config::QueueKind;
use crate::metrics::{Metrics, QueueMetrics};
use crate::zk::{ConnectionState, TreeEvent, WatchEvent, Zk, ZkError, ZkSession, ZkTreeWatch};

/// How many of the first candidates a contended queue picks from at random.
pub const SPREAD_WINDOW: usize = 64;

/// How long one sign of another consumer (a candidate it took or locked first) keeps the
/// random pick on.
const CONTENTION_MEMORY: Duration = Duration::from_secs(5);

/// Java's default `jute.maxbuffer`: a getChildren reply larger than this fails in Curator.
const JUTE_MAXBUFFER: i64 = crate::config::JUTE_MAXBUFFER_BYTES as i64;

/// Bytes a child name costs in a getChildren reply.
fn reply_bytes(name: &str) -> i64 {
    4 + i64::try_from(name.len()).unwrap_or(i64::MAX / 2)
}

/// How often a live cache re-reads its child list anyway, in case an event was ever missed.
const RESYNC_EVERY: Duration = Duration::from_secs(60);

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
    /// Events keep the snapshot current (the tree watches are live).
    live: bool,
    /// Every child of the queue node, while live.
    present: HashSet<String>,
    /// Items whose Curator lock exists, while live: not candidates until it is released.
    locked: HashSet<String>,
    /// The child list's size as a getChildren reply.
    children_bytes: i64,
    /// Whether the `jute.maxbuffer` warning was logged (re-armed below 90% of the limit).
    over_limit_warned: bool,
    /// When another consumer last took or locked a candidate first.
    contended_at: Option<Instant>,
    /// The last [`RECENTLY_DELETED`] children deleted while live (sequential names never return).
    recently_deleted: HashSet<String>,
    recently_deleted_order: VecDeque<String>,
    /// Candidates popped by this process's takers whose claim has not ended: a snapshot or an
    /// event does not offer them again meanwhile.
    claiming: HashSet<String>,
    /// A snapshot was read since the cache was made.
    read_once: bool,
    /// Eager caches only: every child name seen (read or put by this process), and those read
    /// for the first time and not yet checked.
    known: HashSet<String>,
    unchecked: Vec<String>,
    /// ZooKeeper refused the refresher's last attempt for a reason waiting will not fix (the
    /// queue's ACL does not allow zkq's session): takers answer with it instead of waiting.
    refused: Option<ZkError>,
}

/// How many deleted names the cache remembers, so that a late local insert does not revive one.
const RECENTLY_DELETED: usize = 4096;

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
    /// This queue's series, resolved once.
    qm: QueueMetrics,
    state: Mutex<State>,
    /// Asks the refresher for a new snapshot.
    refresh: Notify,
    /// Counts snapshots; takers wait on it after asking for a refresh.
    snapshots: watch::Sender<u64>,
    /// Counts refused refresh attempts (see `State::refused`).
    refusals: watch::Sender<u64>,
    /// Signalled when the child count may have dropped (for puts waiting on `max_items`).
    room: Notify,
    /// Ends the lock watches (they hold the session open) when zkq shuts down.
    shutdown: CancellationToken,
    /// Owns the lock watches.
    tasks: TaskTracker,
    /// Re-read on every change and remember new names (queues with a dead-letter queue, so an
    /// undecodable node is moved there promptly).
    eager: bool,
    /// Full reads of the child list made for peeks while not live: one at a time.
    full_reads: tokio::sync::Semaphore,
    /// Barriers ([`ChildrenCache::barrier`]): the highest one asked for, the highest one the
    /// refresher started, and the highest one finished.
    barrier_wanted: AtomicU64,
    barrier_started: AtomicU64,
    barrier_done: watch::Sender<u64>,
    /// Asks the refresher to run the barriers asked for.
    barrier: Notify,
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
        let qm = metrics.queue(&label);
        Arc::new(ChildrenCache {
            qm,
            kind,
            path,
            label,
            metrics,
            state: Mutex::new(state),
            refresh: Notify::new(),
            snapshots: watch::channel(0).0,
            refusals: watch::channel(0).0,
            room: Notify::new(),
            shutdown,
            tasks,
            eager,
            full_reads: tokio::sync::Semaphore::new(1),
            barrier_wanted: AtomicU64::new(0),
            barrier_started: AtomicU64::new(0),
            barrier_done: watch::channel(0).0,
            barrier: Notify::new(),
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
        let contended = state.contended_at.is_some_and(|at| at.elapsed() < CONTENTION_MEMORY);
        let item = if contended && state.candidates.len() > 1 {
            let window = state.candidates.len().min(SPREAD_WINDOW);
            state.candidates.remove(rand::random_range(0..window))
        } else {
            state.candidates.pop_front()
        };
        if let Some(item) = &item {
            state.taken_since_read += 1;
            state.claiming.insert(item.name.clone());
        }
        if state.dirty && (item.is_none() || state.taken_since_read * 4 >= state.snapshot_len.max(1)) {
            self.refresh.notify_one();
        }
        item
    }

    /// Records that the claim of a popped candidate ended (whatever its outcome).
    pub fn claim_ended(&self, name: &str) {
        self.lock().claiming.remove(name);
    }

    /// Records that another consumer took or locked a candidate before this process could.
    pub fn contended(&self) {
        self.lock().contended_at = Some(Instant::now());
    }

    /// Whether the snapshot may be missing items (a watch fired or nothing was read yet).
    pub fn is_dirty(&self) -> bool {
        self.lock().dirty
    }

    /// Puts a candidate back at the head (its claim failed for a transient reason).
    pub fn push_front(&self, item: ItemName) {
        let mut state = self.lock();
        state.claiming.remove(&item.name);
        // In its place in the order (with a random pick it need not have been the head).
        let kind = self.kind;
        if let Err(pos) = state.candidates.binary_search_by(|c| names::compare(kind, c, &item)) {
            state.candidates.insert(pos, item);
        }
        Self::wake(&mut state, 1);
    }

    /// Adds an item this process just created, so local takers see it without a re-read.
    pub fn insert_local(&self, item: ItemName) {
        let mut state = self.lock();
        if state.live {
            // Now, so that this process's next take sees it (its creation event may not have been
            // handled yet; the name is counted once either way). A name already deleted by the
            // time its creator gets here is not brought back.
            if state.recently_deleted.contains(&item.name) {
                return;
            }
            if state.present.insert(item.name.clone()) {
                state.child_count += 1;
                state.children_bytes += reply_bytes(&item.name);
                self.publish_size(&mut state);
            }
            if self.eager {
                state.known.insert(item.name.clone());
            }
            self.add_candidate(&mut state, &item.name);
            return;
        }
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
        // While live, events say whether it still exists and whether someone else locked it.
        if state.live && (!state.present.contains(&item.name) || state.locked.contains(&item.name)) {
            return;
        }
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
        if self.lock().live {
            return; // its creation event adds it
        }
        if self.mark_dirty() {
            self.refresh.notify_one();
        }
    }

    /// Records that this process removed a child.
    pub fn removed_local(&self) {
        {
            let mut state = self.lock();
            // While live, the deletion event counts it.
            if !state.live {
                state.child_count -= 1;
            }
        }
        self.room.notify_waiters();
    }

    /// Records an undecodable node; true the first time (log it then).
    pub fn mark_undecodable(&self, name: &str) -> bool {
        let first = self.lock().undecodable.insert(name.to_owned());
        if first {
            self.qm.undecodable_messages.inc();
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

    /// Whether a snapshot has been read since the cache was made.
    pub fn has_snapshot(&self) -> bool {
        self.lock().read_once
    }

    /// The first `n` children of the queue in delivery order (locked and not-yet-due ones
    /// included, as a peek shows them), from the live cache; `None` when the cache is not live
    /// (no session yet, or reconnecting): then only a full read knows them.
    pub fn peek_order(&self, n: usize) -> Option<Vec<ItemName>> {
        let state = self.lock();
        if !state.live {
            return None;
        }
        let kind = self.kind;
        // A bounded insertion sort: memory stays O(n) however deep the queue is.
        let mut first: Vec<ItemName> = Vec::with_capacity(n.min(state.present.len()));
        for name in &state.present {
            // Kinds ordered by the name itself are filtered without parsing (no allocation).
            let by_name = matches!(kind, QueueKind::Fifo | QueueKind::Priority | QueueKind::Simple);
            if by_name && first.len() >= n && first.last().is_some_and(|last| name.as_str() >= last.name.as_str()) {
                continue;
            }
            let Some(item) = names::parse(kind, name) else { continue };
            let pos = first.partition_point(|c| names::compare(kind, c, &item).is_lt());
            if pos < n {
                first.insert(pos, item);
                first.truncate(n);
            }
        }
        Some(first)
    }

    /// One full read of the child list at a time per queue (peeks while the cache is not live):
    /// the others wait for the permit instead of all reading a deep queue at once.
    pub async fn full_read_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.full_reads.acquire().await.ok()
    }

    /// Asks for a fresh snapshot and waits for it (until `deadline`). Used when the snapshot
    /// is empty but dirty, so that a take without `wait` still sees items that exist. Fails
    /// with ZooKeeper's refusal when the next attempt is refused (an ACL that does not allow
    /// zkq's session): waiting longer would not help.
    pub async fn refreshed(&self, deadline: Instant) -> Result<bool, ZkError> {
        let mut snapshots = self.snapshots.subscribe();
        snapshots.borrow_and_update();
        let mut refusals = self.refusals.subscribe();
        refusals.borrow_and_update();
        self.refresh.notify_one();
        tokio::select! {
            changed = snapshots.changed() => Ok(changed.is_ok()),
            changed = refusals.changed() => match (changed, self.lock().refused.clone()) {
                (Ok(()), Some(refusal)) => Err(refusal),
                _ => Ok(false),
            },
            _ = tokio::time::sleep_until(deadline) => Ok(false),
        }
    }

    /// Notes a refresh attempt that ZooKeeper refused for good (not a connection problem).
    fn refused(&self, err: &ZkError) {
        if err.is_transient() || *err == ZkError::NoNode {
            return;
        }
        self.lock().refused = Some(err.clone());
        self.refusals.send_modify(|n| *n += 1);
    }

    /// Waits (until `deadline`) until every change ZooKeeper made before this call is in the
    /// snapshot: the refresher `sync`s the queue path, then applies the events that arrived
    /// before the answer (ZooKeeper sends a session's watch events in order with its replies).
    /// One barrier serves every caller that asked before it started, so many takers about to
    /// answer "empty" share one `sync`. Returns false if it did not finish in time (ZooKeeper
    /// unreachable): the caller does not know that the queue is empty.
    pub async fn barrier(&self, deadline: Instant) -> bool {
        let mut done = self.barrier_done.subscribe();
        // A barrier already running may have started before this call: wait for the next one.
        let want = self.barrier_started.load(Ordering::SeqCst) + 1;
        self.barrier_wanted.fetch_max(want, Ordering::SeqCst);
        self.barrier.notify_one();
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

    /// Runs the barriers asked for so far as one: `sync`, then the events queued before its
    /// answer. A failed `sync` finishes nothing; its callers answer 503 at their deadline.
    async fn run_barrier(&self, zk: &Zk, queue_watch: &mut ZkTreeWatch, locks: Option<(&str, &mut ZkTreeWatch)>) {
        let want = self.barrier_wanted.load(Ordering::SeqCst);
        if want <= self.barrier_started.load(Ordering::SeqCst) {
            return;
        }
        self.barrier_started.store(want, Ordering::SeqCst);
        if let Err(err) = zk.sync(&self.path).await {
            tracing::debug!(queue = %self.label, error = %err, "barrier sync failed");
            return;
        }
        while let Some(event) = queue_watch.ready() {
            if event == TreeEvent::ConnectionLost {
                self.invalidate();
                return;
            }
            self.on_queue_event(&event);
        }
        if let Some((dir, watch)) = locks {
            while let Some(event) = watch.ready() {
                if event == TreeEvent::ConnectionLost {
                    self.invalidate();
                    return;
                }
                self.on_lock_event(dir, &event);
            }
        }
        self.barrier_done.send_modify(|done| *done = (*done).max(want));
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
        self.qm.waiting_takers.inc();
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

    /// Replaces the snapshot with a full read. `locks` (the lock directory's children) is given
    /// when the tree watches are live: from then on events keep the snapshot current.
    fn apply_snapshot(&self, children: Vec<String>, num_children: i32, locks: Option<Vec<String>>) {
        let now = now_epoch_ms();
        let live = locks.is_some();
        let locked: HashSet<String> = locks.unwrap_or_default().into_iter().collect();
        let mut items: Vec<ItemName> = Vec::with_capacity(children.len());
        {
            let state = self.lock();
            for child in &children {
                if state.undecodable.contains(child) || locked.contains(child) || state.claiming.contains(child) {
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
        let bytes: i64 = children.iter().map(|c| reply_bytes(c)).sum();
        let mut state = self.lock();
        state.snapshot_len = items.len();
        state.candidates = items.into();
        state.delayed = delayed;
        state.taken_since_read = 0;
        state.dirty = false;
        state.read_once = true;
        state.refused = None;
        state.child_count = i64::from(num_children);
        state.children_bytes = bytes;
        state.live = live;
        state.locked = locked;
        let present: HashSet<String> = children.into_iter().collect();
        state.undecodable.retain(|name| present.contains(name));
        if self.eager {
            let new: Vec<String> = present.iter().filter(|c| !state.known.contains(*c)).cloned().collect();
            state.unchecked.extend(new);
            state.known = present.clone();
        }
        state.present = if live { present } else { HashSet::new() };
        let n = state.candidates.len();
        Self::wake(&mut state, n);
        self.publish_size(&mut state);
        drop(state);
        self.qm.children_reads.inc();
        self.room.notify_waiters();
        self.snapshots.send_modify(|n| *n += 1);
    }

    /// Exports the child count and the child list's size; warns once when the list outgrows
    /// what a Curator consumer can read.
    fn publish_size(&self, state: &mut State) {
        self.qm.queue_children.set(state.child_count);
        self.qm.children_bytes.set(state.children_bytes);
        if state.children_bytes > JUTE_MAXBUFFER && !state.over_limit_warned {
            state.over_limit_warned = true;
            tracing::warn!(queue = %self.label, children = state.child_count, bytes = state.children_bytes,
                limit = JUTE_MAXBUFFER,
                "the queue's child list is larger than Java's default jute.maxbuffer: Curator consumers of this \
                 queue now fail to read it (\"Packet len ... is out of range\"); set queues.NAME.max_items");
        } else if state.children_bytes < JUTE_MAXBUFFER / 10 * 9 {
            state.over_limit_warned = false;
        }
    }

    /// The name of a direct child of `dir` from a full path below it.
    fn child_of<'a>(dir: &str, path: &'a str) -> Option<&'a str> {
        let name = path.strip_prefix(dir)?.strip_prefix('/')?;
        (!name.is_empty() && !name.contains('/')).then_some(name)
    }

    /// Removes `name` from the candidates (and delayed items); true if it was one.
    fn remove_candidate(&self, state: &mut State, name: &str) -> bool {
        let Some(item) = names::parse(self.kind, name) else { return false };
        let kind = self.kind;
        if let Ok(index) = state.candidates.binary_search_by(|c| names::compare(kind, c, &item)) {
            state.candidates.remove(index);
            return true;
        }
        if let Some(index) = state.delayed.iter().position(|d| d.name == name) {
            state.delayed.remove(index);
        }
        false
    }

    /// Adds an existing, unlocked item to the candidates (or the delayed items) in its place.
    fn add_candidate(&self, state: &mut State, name: &str) {
        if state.undecodable.contains(name) || state.locked.contains(name) || state.claiming.contains(name) {
            return;
        }
        let Some(item) = names::parse(self.kind, name) else { return };
        if names::due_time(&item) > now_epoch_ms() {
            if !state.delayed.iter().any(|d| d.name == name) {
                let pos = state.delayed.partition_point(|d| names::due_time(d) <= names::due_time(&item));
                state.delayed.insert(pos, item);
                self.refresh.notify_one(); // the refresher re-arms its timer
            }
            return;
        }
        let kind = self.kind;
        if let Err(pos) = state.candidates.binary_search_by(|c| names::compare(kind, c, &item)) {
            state.candidates.insert(pos, item);
            Self::wake(state, 1);
        }
    }

    /// Applies one event of the queue node's tree watch.
    fn on_queue_event(&self, event: &TreeEvent) {
        let mut state = self.lock();
        if !state.live {
            return;
        }
        match event {
            TreeEvent::Created(path) => {
                let Some(name) = Self::child_of(&self.path, path) else { return };
                if state.present.insert(name.to_owned()) {
                    state.child_count += 1;
                    state.children_bytes += reply_bytes(name);
                    self.add_candidate(&mut state, name);
                    self.publish_size(&mut state);
                    if self.eager && state.known.insert(name.to_owned()) {
                        // Put by someone else: the undecodable mover reads it once.
                        state.unchecked.push(name.to_owned());
                        self.snapshots.send_modify(|n| *n += 1);
                    }
                }
            },
            TreeEvent::Deleted(path) => {
                let Some(name) = Self::child_of(&self.path, path) else { return };
                if state.recently_deleted.insert(name.to_owned()) {
                    state.recently_deleted_order.push_back(name.to_owned());
                    if state.recently_deleted_order.len() > RECENTLY_DELETED
                        && let Some(oldest) = state.recently_deleted_order.pop_front()
                    {
                        state.recently_deleted.remove(&oldest);
                    }
                }
                if state.present.remove(name) {
                    state.child_count -= 1;
                    state.children_bytes -= reply_bytes(name);
                    self.publish_size(&mut state);
                }
                state.undecodable.remove(name);
                if self.remove_candidate(&mut state, name) {
                    state.contended_at = Some(Instant::now());
                    self.qm.candidates_pruned.inc();
                }
                drop(state);
                self.room.notify_waiters();
            },
            TreeEvent::ConnectionLost | TreeEvent::Other => {},
        }
    }

    /// Applies one event of the lock directory's tree watch.
    fn on_lock_event(&self, lock_dir: &str, event: &TreeEvent) {
        let mut state = self.lock();
        if !state.live {
            return;
        }
        match event {
            TreeEvent::Created(path) => {
                let Some(name) = Self::child_of(lock_dir, path) else { return };
                state.locked.insert(name.to_owned());
                if self.remove_candidate(&mut state, name) {
                    state.contended_at = Some(Instant::now());
                    self.qm.candidates_pruned.inc();
                }
            },
            TreeEvent::Deleted(path) => {
                let Some(name) = Self::child_of(lock_dir, path) else { return };
                if state.locked.remove(name) && state.present.contains(name) {
                    self.add_candidate(&mut state, name);
                }
            },
            TreeEvent::ConnectionLost | TreeEvent::Other => {},
        }
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
        state.live = false;
        state.candidates.clear();
        state.delayed.clear();
    }

    /// The refresher: keeps the snapshot and the watch alive across reconnects and new sessions.
    ///
    /// On every new session it first ensures the queue node and `dirs` (the lock directory, the
    /// claim-marker directory), so the first claim of a queue does not pay a failed transaction.
    pub async fn run(
        self: Arc<Self>,
        session: ZkSession,
        dirs: Vec<String>,
        lock_dir: Option<String>,
        shutdown: CancellationToken,
    ) {
        let mut status_rx = session.subscribe();
        let mut ensured_generation = 0;
        // A refusal repeats at every retry: log each distinct one once.
        let mut logged: Option<ZkError> = None;
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
                        if logged.as_ref() != Some(&err) {
                            tracing::warn!(queue = %self.label, error = %err, "cannot create queue path; will retry");
                            logged = Some(err.clone());
                        }
                        self.refused(&err);
                        self.pause_until_status_change(&mut status_rx, &shutdown, Duration::from_secs(1)).await;
                        continue;
                    },
                }
            }
            // The watches first, then the reads: every change after a read arrives as an event,
            // and events already queued before it are harmless (they are applied idempotently).
            let watches = async {
                let queue_watch = zk.watch_tree(&self.path).await?;
                let lock_watch = match &lock_dir {
                    Some(dir) => Some(zk.watch_tree(dir).await?),
                    None => None,
                };
                let (children, stat, locks) = self.read_children(&zk, lock_dir.as_deref()).await?;
                Ok((queue_watch, lock_watch, children, stat, locks))
            };
            let (mut queue_watch, mut lock_watch) = match watches.await {
                Ok((queue_watch, lock_watch, children, stat, locks)) => {
                    self.apply_snapshot(children, stat.num_children, Some(locks));
                    (queue_watch, lock_watch)
                },
                Err(ZkError::NoNode) => {
                    ensured_generation = 0;
                    continue;
                },
                Err(err) => {
                    if !err.is_transient() && logged.as_ref() != Some(&err) {
                        tracing::warn!(queue = %self.label, error = %err, "cannot read or watch the queue; will retry");
                        logged = Some(err.clone());
                    } else {
                        tracing::debug!(queue = %self.label, error = %err, "children read failed");
                    }
                    self.refused(&err);
                    self.pause_until_status_change(&mut status_rx, &shutdown, Duration::from_millis(200)).await;
                    continue;
                },
            };
            // Keep the snapshot current from events until a reason to re-read.
            let mut resync_at = Instant::now() + RESYNC_EVERY;
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
                let lock_event = async {
                    match lock_watch.as_mut() {
                        Some(watch) => watch.next().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    event = queue_watch.next() => {
                        if event == TreeEvent::ConnectionLost {
                            self.invalidate();
                            break;
                        }
                        self.on_queue_event(&event);
                    },
                    event = lock_event => {
                        if event == TreeEvent::ConnectionLost {
                            self.invalidate();
                            break;
                        }
                        // The item's own deletion (same transaction as an ack's lock delete) was
                        // sent first: apply it before deciding whether to offer the item again.
                        while let Some(queued) = queue_watch.ready() {
                            self.on_queue_event(&queued);
                        }
                        if let Some(dir) = &lock_dir {
                            self.on_lock_event(dir, &event);
                        }
                    },
                    _ = self.barrier.notified() => {
                        let zk = zk.with_deadline(Instant::now() + session.request_timeout());
                        let locks = lock_dir.as_deref().zip(lock_watch.as_mut());
                        self.run_barrier(&zk, &mut queue_watch, locks).await;
                    },
                    _ = self.refresh.notified() => {
                        if self.is_dirty() {
                            break;
                        }
                        // Not dirty: the snapshot is current; count it as one anyway so the asker goes on.
                        self.snapshots.send_modify(|n| *n += 1);
                    },
                    _ = async { match due { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                        let mut state = self.lock();
                        self.promote_due(&mut state);
                    },
                    // A backstop: should an event ever be missed, a message is not stranded.
                    _ = tokio::time::sleep_until(resync_at) => {
                        resync_at = Instant::now() + RESYNC_EVERY;
                        let zk = zk.with_deadline(Instant::now() + session.request_timeout());
                        if let Ok((children, stat, locks)) = self.read_children(&zk, lock_dir.as_deref()).await {
                            self.apply_snapshot(children, stat.num_children, Some(locks));
                        }
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

    /// The queue node's children and the lock directory's (empty without one).
    async fn read_children(
        &self,
        zk: &Zk,
        lock_dir: Option<&str>,
    ) -> Result<(Vec<String>, crate::zk::NodeStat, Vec<String>), ZkError> {
        let (children, stat) = zk.get_children(&self.path).await?;
        let locks = match lock_dir {
            Some(dir) => match zk.get_children(dir).await {
                Ok((locks, _)) => locks,
                Err(ZkError::NoNode) => Vec::new(),
                Err(err) => return Err(err),
            },
            None => Vec::new(),
        };
        Ok((children, stat, locks))
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;

    use super::*;

    fn cache(kind: QueueKind) -> Arc<ChildrenCache> {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        ChildrenCache::new(kind, "/q".into(), "q".into(), metrics, CancellationToken::new(), TaskTracker::new(), false)
    }

    fn fifo_names(range: std::ops::Range<usize>) -> Vec<String> {
        range.map(|i| format!("queue-{i:010}")).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_item_wakes_the_longest_waiting_taker_and_only_one() {
        let cache = cache(QueueKind::Fifo);
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
        let first = waiters.remove(0);
        assert!(first.await.expect("join"), "the first waiter is woken");
        tokio::task::yield_now().await;
        assert_eq!(cache.waiting(), 2, "one item wakes one waiter");
        assert!(waiters.iter().all(|w| !w.is_finished()));
        cache.insert_local(names::parse(QueueKind::Fifo, "queue-0000000002").expect("item"));
        assert!(waiters.remove(0).await.expect("join"), "then the second");
        // The last one gives up at its deadline.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(!waiters.remove(0).await.expect("join"), "no item: it ends at its deadline");
        assert_eq!(cache.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn events_prune_candidates_others_took_or_locked_and_offer_released_ones_again() {
        let cache = cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..4), 4, Some(Vec::new()));
        let drain = |c: &ChildrenCache| {
            let mut got: Vec<i64> = std::iter::from_fn(|| c.pop().map(|i| i.sequence)).collect();
            got.sort_unstable();
            got
        };
        // Another consumer took item 0 and locks item 1: neither is tried. (Having seen another
        // consumer, takers now pick at random among the first candidates: compare sets.)
        cache.on_queue_event(&TreeEvent::Deleted("/q/queue-0000000000".into()));
        cache.on_lock_event("/locks", &TreeEvent::Created("/locks/queue-0000000001".into()));
        assert_eq!(drain(&cache), [2, 3]);
        // Its lock released, item 1 is offered again; a new item shows up without a re-read.
        cache.on_lock_event("/locks", &TreeEvent::Deleted("/locks/queue-0000000001".into()));
        cache.on_queue_event(&TreeEvent::Created("/q/queue-0000000009".into()));
        assert_eq!(drain(&cache), [1, 9]);
        assert_eq!(cache.child_count(), 4, "0 deleted, 9 created");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_snapshot_is_re_read_once_a_quarter_of_it_is_consumed() {
        // Without live tree watches (fallback), a dirty snapshot is re-read when needed.
        let cache = cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..8), 8, None);
        assert!(cache.refresh.notified().now_or_never().is_none(), "fresh: nothing asked");
        assert!(!cache.mark_dirty(), "nobody waits, so no re-read right now");
        assert_eq!(cache.pop().map(|i| i.sequence), Some(0));
        assert!(cache.refresh.notified().now_or_never().is_none(), "1 of 8 taken: not yet");
        assert_eq!(cache.pop().map(|i| i.sequence), Some(1));
        assert!(cache.refresh.notified().now_or_never().is_some(), "2 of 8 taken: re-read asked");
    }

    #[tokio::test(start_paused = true)]
    async fn delay_items_are_candidates_only_once_due() {
        let cache = cache(QueueKind::Delay);
        let now = now_epoch_ms();
        let due = format!("queue-|{:08X}|0000000001", now - 1000);
        let later = format!("queue-|{:08X}|0000000000", now + 3_600_000);
        cache.apply_snapshot(vec![later.clone(), due.clone()], 2, Some(Vec::new()));
        assert_eq!(cache.pop().map(|i| i.name), Some(due));
        assert_eq!(cache.pop(), None, "the other is not due for an hour");
        let next = cache.next_due().expect("a delayed item");
        let wait = next - Instant::now();
        assert!(wait > Duration::from_secs(3500) && wait <= Duration::from_secs(3600), "{wait:?}");
    }
}
