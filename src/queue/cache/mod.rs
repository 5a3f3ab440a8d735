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
//! Ordering: a single consumer gets the head, in Curator's order. Once a claim of this process
//! lost a race for a candidate (within the last few seconds), takers pick at random among the
//! first [`SPREAD_WINDOW`](state::SPREAD_WINDOW) candidates instead, so that several sidecars do
//! not all propose the same head; with several consumers Curator promises no global order either.
//! A candidate another consumer took or locked is only pruned: that raced no claim of ours.
//!
//! Waiters are served first come, first served, and a new item wakes one waiter.
//!
//! Files: `state/` holds the candidates and waiters as plain data (no I/O, testable without
//! ZooKeeper); `waiters.rs` the waiting (takers, puts waiting for room, barriers); `refresher.rs`
//! the task that reads and watches ZooKeeper, and the lock watches. This file is the face the
//! rest of `queue/` uses; every change of the state goes through its one lock.

mod fleet;
mod refresher;
mod state;
mod waiters;

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::catalog::Presence;
use super::names::ItemName;
use crate::config::QueueKind;
use crate::metrics::{Metrics, QueueMetrics};
use crate::types::QueueName;
pub(crate) use state::GroupStats;
#[cfg(test)]
use state::KNOWN_BYTES_SLACK;
use state::{Effects, JUTE_MAXBUFFER, Joins, State};
use waiters::Barriers;

/// Shared between the refresher task and the takers.
pub(super) struct ChildrenCache {
    path: String,
    label: QueueName,
    metrics: Arc<Metrics>,
    /// This queue's series, resolved once.
    qm: QueueMetrics,
    state: Mutex<State>,
    /// Asks the refresher for a new snapshot.
    refresh: Notify,
    /// Asks the refresher to let the items put here join the candidates
    /// ([`ChildrenCache::insert_local`]).
    settle: Notify,
    /// Asks the refresher of a queue it does not watch for a read of its child list before the
    /// minute is over (at most one per 5 s): its head's age is not known.
    reread: Notify,
    /// Counts snapshots; takers wait on it after asking for a refresh.
    snapshots: watch::Sender<u64>,
    /// Counts refused refresh attempts (see [`ChildrenCache::refreshed`]).
    refusals: watch::Sender<u64>,
    /// Signalled when the child count may have dropped (for puts waiting on `max_items`).
    room: Notify,
    /// Ends the lock watches (they hold the session open) when zkq shuts down.
    shutdown: CancellationToken,
    /// Owns the lock watches.
    tasks: TaskTracker,
    /// Full reads of the child list made for peeks while not live: one at a time.
    full_reads: tokio::sync::Semaphore,
    /// Barriers ([`ChildrenCache::barrier`]), run by the refresher.
    barriers: Barriers,
    /// What the queue's node last said about the queue (`queue::catalog`): `None` until the
    /// refresher first read it. Kept current from the node's own events.
    presence: watch::Sender<Option<Presence>>,
    /// How many here need the queue's state now (takers, reads waiting for a snapshot): the
    /// refresher watches the queue only while some do, or did within [`DEMAND_LINGER`]
    /// (`Rules::watch_always` queues always).
    demand: watch::Sender<usize>,
    /// Since when nobody needs it (`None` while somebody does).
    idle_since: Mutex<Option<tokio::time::Instant>>,
    watch_always: bool,
    /// How many takers wait in the acquire loop here now (`fleet.rs`: this process is a member
    /// of the queue's fleet while any do, and a while after).
    takers: watch::Sender<usize>,
    /// At most how many members of the queue's fleet watch it (`Rules::watchers`).
    watchers: usize,
    /// Whether this process stands by in the queue's fleet: another member watches the queue
    /// for it, and its takers wait for a call for help or the end of their wait (`fleet.rs`).
    standby: watch::Sender<bool>,
    /// Since when it stands by (`None`: it does not): the refresher lets go of the queue's
    /// watches [`STANDBY_LINGER`] after.
    standby_since: Mutex<Option<tokio::time::Instant>>,
    /// When the last read of a taker standing by that found the queue empty was sent: it
    /// vouches for the "empty" of every taker here that came before it.
    read_empty_at: Mutex<Option<tokio::time::Instant>>,
}

/// How long the refresher keeps watching a queue after its last demand ended: a consumer's loop
/// of requests keeps one watch, and a sidecar that only puts holds none.
pub(super) const DEMAND_LINGER: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a member that stands by keeps watching the queue after it last watched for the fleet:
/// a call for help that comes and goes does not cost a full read each time.
pub(super) const STANDBY_LINGER: std::time::Duration = std::time::Duration::from_secs(10);

/// Held while something here needs the queue's state from ZooKeeper (see `ChildrenCache::demand`).
pub(super) struct Demand<'a>(&'a ChildrenCache);

impl Drop for Demand<'_> {
    fn drop(&mut self) {
        let mut idle_since = self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        self.0.demand.send_modify(|n| {
            *n = n.saturating_sub(1);
            if *n == 0 {
                *idle_since = Some(tokio::time::Instant::now());
            }
        });
    }
}

/// How a cache reads and offers a queue's children.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules {
    /// How the names are read and ordered (`names::naming`).
    pub(super) naming: QueueKind,
    /// Only the first message of each group is offered (`state/groups.rs`).
    pub(super) grouped: bool,
    /// Re-read on every change and remember new names (queues with a dead-letter queue, so an
    /// undecodable node is moved there promptly).
    pub(super) eager: bool,
    /// Watch the queue even while nobody here takes from it (grouped, eager and `max_items`
    /// queues, whose puts and background work read the cache).
    pub(super) watch_always: bool,
    /// At most how many members of the queue's fleet watch it and own its new messages (0: every
    /// member); the others stand by (`fleet.rs`).
    pub(super) watchers: usize,
}

impl ChildrenCache {
    pub(super) fn new(
        rules: Rules,
        path: String,
        label: QueueName,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Arc<ChildrenCache> {
        let Rules { naming: kind, grouped, eager, .. } = rules;
        let qm = metrics.queue(&label);
        Arc::new(ChildrenCache {
            qm,
            path,
            label,
            metrics,
            state: Mutex::new(State::new(kind, eager, grouped)),
            refresh: Notify::new(),
            snapshots: watch::channel(0).0,
            refusals: watch::channel(0).0,
            room: Notify::new(),
            shutdown,
            tasks,
            full_reads: tokio::sync::Semaphore::new(1),
            barriers: Barriers::new(),
            settle: Notify::new(),
            reread: Notify::new(),
            presence: watch::channel(None).0,
            demand: watch::channel(0).0,
            idle_since: Mutex::new(Some(tokio::time::Instant::now())),
            watch_always: rules.watch_always,
            takers: watch::channel(0).0,
            watchers: rules.watchers,
            standby: watch::channel(false).0,
            standby_since: Mutex::new(None),
            read_empty_at: Mutex::new(None),
        })
    }

    /// Marks a need for the queue's state until the guard drops: the refresher watches and reads
    /// the queue (again) while any is held.
    pub(super) fn demand(&self) -> Demand<'_> {
        let mut idle_since = self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        *idle_since = None;
        self.demand.send_modify(|n| *n += 1);
        drop(idle_since);
        Demand(self)
    }

    /// Whether the refresher should watch the queue now: something here needs it, and this
    /// process does not stand by in its fleet.
    fn in_demand(&self) -> bool {
        self.watch_always || (*self.demand.borrow() > 0 && !self.stands_by())
    }

    /// Records that a read sent at `sent` found the queue empty (a taker standing by).
    pub(super) fn read_empty(&self, sent: tokio::time::Instant) {
        let mut at = self.read_empty_at.lock().unwrap_or_else(|p| p.into_inner());
        *at = Some(at.map_or(sent, |at| at.max(sent)));
    }

    /// Whether a read sent after `arrived` found the queue empty: a taker that came then may
    /// answer "empty" on it.
    pub(super) fn read_empty_since(&self, arrived: tokio::time::Instant) -> bool {
        self.read_empty_at.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|at| at >= arrived)
    }

    /// Whether this process stands by in the queue's fleet now (`fleet.rs`).
    pub(super) fn stands_by(&self) -> bool {
        *self.standby.borrow()
    }

    /// Resolves once this process no longer stands by.
    pub(super) async fn until_watching(&self) {
        let mut standby = self.standby.subscribe();
        let _ = standby.wait_for(|s| !*s).await;
    }

    /// Resolves once this process stands by.
    pub(super) async fn until_standing_by(&self) {
        let mut standby = self.standby.subscribe();
        let _ = standby.wait_for(|s| *s).await;
    }

    /// Resolves when the refresher's reason to watch may have changed.
    async fn demand_changed(&self) {
        let (mut demand, mut standby) = (self.demand.subscribe(), self.standby.subscribe());
        loop {
            if self.in_demand() {
                return;
            }
            tokio::select! {
                // Both senders live as long as the cache: a change, never a close.
                _ = demand.changed() => {},
                _ = standby.changed() => {},
            }
        }
    }

    /// When the refresher may stop watching (`None`: not while somebody needs it): a while after
    /// the last demand here ended, or after this process began to stand by.
    fn unwatch_at(&self) -> Option<tokio::time::Instant> {
        if self.watch_always {
            return None;
        }
        let idle_since = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        let standby_since = *self.standby_since.lock().unwrap_or_else(|p| p.into_inner());
        let idle = idle_since.map(|since| since + DEMAND_LINGER);
        let standby = standby_since.map(|since| since + STANDBY_LINGER);
        match (idle, standby) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// What the queue's node said when last read or changed (`None`: not read yet).
    pub(super) fn presence(&self) -> Option<Presence> {
        *self.presence.borrow()
    }

    /// Follows the queue node's presence (the lease reaper ends a deleted queue's leases).
    pub(super) fn presence_changes(&self) -> watch::Receiver<Option<Presence>> {
        self.presence.subscribe()
    }

    /// Forgets what the queue's node said (it can no longer be followed): requests ask ZooKeeper.
    pub(super) fn forget_presence(&self) {
        self.presence.send_if_modified(|now| now.take().is_some());
    }

    /// Records what the queue's node says now (read by the refresher, or written by this process).
    pub(super) fn set_presence(&self, presence: Presence) {
        self.presence.send_if_modified(|now| {
            let changed = *now != Some(presence);
            *now = Some(presence);
            changed
        });
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-updated in a way that
        // matters (every candidate is re-confirmed in ZooKeeper), so recover from poisoning.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Does what a change of the state asks, still under its lock (room is signalled by the
    /// caller once the lock is released).
    fn apply(&self, state: &mut State, effects: Effects) {
        if effects.size_changed {
            self.publish_size(state);
        }
        if effects.refresh {
            self.refresh.notify_one(); // the refresher re-arms its timer
        }
        if effects.settle {
            self.settle.notify_one();
        }
        if effects.pruned {
            self.qm.candidates_pruned.inc();
        }
        if effects.unchecked {
            self.snapshots.send_modify(|n| *n += 1);
        }
    }

    /// Exports the child count and the child list's size; warns once when the list outgrows
    /// what a Curator consumer can read.
    fn publish_size(&self, state: &mut State) {
        let (children, bytes) = (state.child_count(), state.children_bytes());
        self.qm.queue_children.set(children);
        self.qm.children_bytes.set(bytes);
        if state.outgrew_jute_maxbuffer() {
            tracing::warn!(queue = %self.label, children, bytes, limit = JUTE_MAXBUFFER,
                "the queue's child list is larger than Java's default jute.maxbuffer: Curator consumers of this \
                 queue now fail to read it (\"Packet len ... is out of range\"); set queues.NAME.max_items");
        }
    }

    /// The deliverable children of a read made beside the snapshot (a member standing by reads
    /// the queue itself), in delivery order; a delayed message only once due.
    pub(super) fn offerable_now(&self, children: &[String], locked: &[String]) -> Vec<ItemName> {
        let locked: std::collections::HashSet<String> = locked.iter().cloned().collect();
        let (kind, mut items) = {
            let state = self.lock();
            (state.kind(), state.offerable(children, &locked))
        };
        let now = crate::types::now_epoch_ms();
        items.retain(|item| crate::queue::names::due_time(item) <= now);
        items.sort_by(|a, b| crate::queue::names::compare(kind, a, b));
        items
    }

    /// The next candidate for a taker waiting until `wait_until` to claim, if the snapshot has
    /// one (`state/owners.rs`: another member's waits for its grace, unless the taker's wait
    /// ends first).
    pub(super) fn pop(&self, wait_until: tokio::time::Instant) -> Option<ItemName> {
        let mut state = self.lock();
        let (item, reread) = state.pop(wait_until);
        if reread {
            self.refresh.notify_one();
        }
        item
    }

    /// Records that the claim of a popped candidate ended (whatever its outcome).
    pub(super) fn claim_ended(&self, name: &str) {
        self.lock().claim_ended(name);
    }

    /// Whether the claim of popped candidate `name` reads its lock first (`State::is_unverified`).
    pub(super) fn is_unverified(&self, name: &str) -> bool {
        self.lock().is_unverified(name)
    }

    /// Records that another consumer took or locked a candidate before this process could.
    pub(super) fn contended(&self) {
        self.lock().mark_contended();
    }

    /// Whether the snapshot may be missing items (a watch fired or nothing was read yet).
    pub(super) fn is_dirty(&self) -> bool {
        self.lock().is_dirty()
    }

    /// Puts a candidate back at the head (its claim failed for a transient reason).
    pub(super) fn push_front(&self, item: ItemName) {
        self.lock().push_front(item);
    }

    /// Adds an item this process just created, so local takers see it without a re-read. While
    /// the queue is watched it joins the candidates once the refresher has applied the events it
    /// received before (older items first), at once or at a taker's barrier.
    pub(super) fn insert_local(&self, item: ItemName) {
        let mut state = self.lock();
        let effects = state.insert_local(item, Joins::AfterEvents);
        self.apply(&mut state, effects);
    }

    /// Adds an item split out of a node this process claims: offered at once, in that node's
    /// place (a `?max=` claim goes on with it).
    pub(super) fn insert_split(&self, item: ItemName) {
        let mut state = self.lock();
        let effects = state.insert_local(item, Joins::Now);
        self.apply(&mut state, effects);
    }

    /// Lets the items put here join the candidates: every event received before their puts'
    /// answers is applied (the refresher's part, `refresher.rs`).
    fn settle_local(&self) {
        let mut state = self.lock();
        let effects = state.settle_local();
        self.apply(&mut state, effects);
    }

    /// The items of node `name` read for a claim; `None` (logged once, and not proposed again)
    /// when it is not a Curator envelope or holds no item.
    pub(super) fn items_of(&self, name: &str, data: &[u8]) -> Option<Vec<Vec<u8>>> {
        if self.lock().kind() == QueueKind::Simple {
            return Some(vec![data.to_vec()]);
        }
        match super::envelope::decode(data) {
            Ok(items) if !items.is_empty() => Some(items),
            decoded => {
                if self.mark_undecodable(name) {
                    let why = decoded.err().map_or("holds no items".to_owned(), |e| e.to_string());
                    tracing::warn!(queue = %self.label, node = %name, reason = %why,
                        "skipping a queue node that is not a Curator envelope (left in place)");
                }
                None
            },
        }
    }

    /// Remembers the data length of a child this process wrote or read, so that a claim of
    /// several need not ask ZooKeeper for it.
    pub(super) fn learn_bytes(&self, name: &str, bytes: usize) {
        self.lock().learn_bytes(name, bytes);
    }

    /// The data lengths of `names` this process knows, in order (`None`: not known).
    pub(super) fn known_bytes<'n>(&self, names: impl IntoIterator<Item = &'n str>) -> Vec<Option<usize>> {
        let state = self.lock();
        names.into_iter().map(|name| state.known_bytes(name)).collect()
    }

    /// Offers an existing item again (its lock was released), in its place in the order.
    pub(super) fn reoffer(&self, item: ItemName) {
        self.lock().reoffer(item);
    }

    /// Offers again an item whose lock this process has just deleted itself (a lease released):
    /// it is unlocked now, though the lock directory's event saying so may still be on its way.
    /// Without this, a consumer leasing right after a release would skip the released item and
    /// take the next one, out of order.
    pub(super) fn released_local(&self, item: ItemName) {
        self.lock().unlocked_local(&item.name);
        self.reoffer(item);
    }

    /// The snapshot may be missing a node this process created without learning its name:
    /// re-read it when it is needed (now, if someone waits).
    pub(super) fn mark_stale(&self) {
        if self.lock().is_live() {
            return; // its creation event adds it
        }
        if self.mark_dirty() {
            self.refresh.notify_one();
        }
    }

    fn mark_dirty(&self) -> bool {
        self.lock().mark_dirty()
    }

    /// Records that this process removed the candidate `name` (a delete by id, a purge): it is
    /// no longer proposed, at once and without taking it for a race with another consumer.
    pub(super) fn removed_candidate(&self, name: &str) {
        self.lock().prune(name);
        self.removed_local();
    }

    /// Records that this process removed a child.
    pub(super) fn removed_local(&self) {
        self.lock().removed_local();
        self.room.notify_waiters();
    }

    /// Records an undecodable node; true the first time (log it then).
    pub(super) fn mark_undecodable(&self, name: &str) -> bool {
        let first = self.lock().mark_undecodable(name);
        if first {
            self.qm.undecodable_messages.inc();
        }
        first
    }

    /// What the groups of a grouped queue look like now (`None`: not grouped).
    pub(super) fn group_stats(&self) -> Option<GroupStats> {
        self.lock().group_stats()
    }

    pub(super) fn child_count(&self) -> i64 {
        self.lock().child_count()
    }

    pub(super) fn waiting(&self) -> usize {
        self.lock().waiting()
    }

    /// A scrape found messages in a queue this process does not watch, and no head it knows of:
    /// its refresher reads the child list soon instead of within the minute.
    pub(super) fn ask_reread(&self) {
        self.reread.notify_one();
    }

    /// The head whose age is the queue's, and whether events keep it current
    /// ([`State::head_for_age`]).
    pub(super) fn head_for_age(&self) -> (Option<ItemName>, bool) {
        let state = self.lock();
        let (head, live) = state.head_for_age();
        (head.cloned(), live)
    }

    /// Whether a snapshot has been read since the cache was made.
    pub(super) fn has_snapshot(&self) -> bool {
        self.lock().has_snapshot()
    }

    /// The first `n` children of the queue in delivery order (locked and not-yet-due ones
    /// included, as a peek shows them), from the live cache; `None` when the cache is not live
    /// (no session yet, or reconnecting): then only a full read knows them.
    pub(super) fn peek_order(&self, n: usize) -> Option<Vec<ItemName>> {
        self.lock().peek_order(n)
    }

    /// The members behind `items` in their groups, up to `n`, marked as being claimed
    /// ([`State::followers`]); none on a queue without groups.
    pub(super) fn followers(&self, items: &[ItemName], n: usize) -> Vec<ItemName> {
        self.lock().followers(items, n)
    }

    /// How many messages wait for their delivery time, from the live cache; `None` when the cache
    /// is not live.
    pub(super) fn delayed_count(&self) -> Option<usize> {
        self.lock().delayed_count()
    }

    /// The `n` children ZooKeeper stored first, oldest first, from the live cache; `None` when
    /// the cache is not live.
    pub(super) fn oldest(&self, n: usize) -> Option<Vec<String>> {
        self.lock().oldest(n)
    }

    /// One full read of the child list at a time per queue (peeks while the cache is not live):
    /// the others wait for the permit instead of all reading a deep queue at once.
    pub(super) async fn full_read_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.full_reads.acquire().await.ok()
    }

    /// Names read for the first time since the last call (eager caches only).
    pub(super) fn take_unchecked(&self) -> Vec<String> {
        self.lock().take_unchecked()
    }

    /// Changes with every snapshot read.
    pub(super) fn subscribe_snapshots(&self) -> watch::Receiver<u64> {
        self.snapshots.subscribe()
    }
}

/// A taker's wait that outlasts any grace: it claims only the candidates this process owns.
#[cfg(test)]
fn far() -> tokio::time::Instant {
    tokio::time::Instant::now() + std::time::Duration::from_secs(3600)
}

#[cfg(test)]
fn test_cache(kind: QueueKind) -> Arc<ChildrenCache> {
    test_cache_grouped(kind, false)
}

#[cfg(test)]
fn test_cache_grouped(kind: QueueKind, grouped: bool) -> Arc<ChildrenCache> {
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let name = "q".parse().expect("a valid name");
    let naming = super::names::naming(kind, grouped);
    let rules = Rules { naming, grouped, eager: false, watch_always: true, watchers: 0 };
    ChildrenCache::new(rules, "/q".into(), name, metrics, CancellationToken::new(), TaskTracker::new())
}

#[cfg(test)]
fn fifo_names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("queue-{i:010}")).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;
    use tokio::time::Instant;

    use super::*;
    use crate::queue::names;
    use crate::types::now_epoch_ms;

    #[tokio::test(start_paused = true)]
    async fn a_stale_snapshot_is_re_read_once_a_quarter_of_it_is_consumed() {
        // Without live tree watches (fallback), a dirty snapshot is re-read when needed.
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..8), 8, None);
        assert!(cache.refresh.notified().now_or_never().is_none(), "fresh: nothing asked");
        assert!(!cache.mark_dirty(), "nobody waits, so no re-read right now");
        assert_eq!(cache.pop(far()).map(|i| i.sequence), Some(0));
        assert!(cache.refresh.notified().now_or_never().is_none(), "1 of 8 taken: not yet");
        assert_eq!(cache.pop(far()).map(|i| i.sequence), Some(1));
        assert!(cache.refresh.notified().now_or_never().is_some(), "2 of 8 taken: re-read asked");
    }

    #[tokio::test(start_paused = true)]
    async fn known_sizes_are_forgotten_with_their_nodes_and_stay_bounded() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..2), 2, Some(Vec::new()));
        let [a, b] = [0, 1].map(|i| format!("queue-{i:010}"));
        cache.learn_bytes(&a, 10);
        cache.learn_bytes(&b, 20);
        assert_eq!(cache.known_bytes([a.as_str(), b.as_str()]), vec![Some(10), Some(20)]);
        let _ = cache.lock().child_deleted(&a);
        assert_eq!(cache.known_bytes([a.as_str(), b.as_str()]), vec![None, Some(20)], "deleted: forgotten");
        cache.learn_bytes(&a, 10);
        assert_eq!(cache.known_bytes([a.as_str()]), vec![None], "a deleted name is not learned again");
        // Names whose deletion went unseen: forgotten once the sizes outgrow the children.
        for i in 100..100 + KNOWN_BYTES_SLACK + 10 {
            cache.learn_bytes(&format!("queue-{i:010}"), 1);
        }
        let held = cache.lock().known_bytes_len();
        assert!(held <= KNOWN_BYTES_SLACK + 1, "{held} sizes held for 1 child");
        assert_eq!(cache.known_bytes([b.as_str()]), vec![Some(20)], "a child still there keeps its size");
    }

    #[tokio::test(start_paused = true)]
    async fn delay_items_are_candidates_only_once_due() {
        let cache = test_cache(QueueKind::Delay);
        let now = now_epoch_ms();
        let due = format!("queue-|{:08X}|0000000001", now - 1000);
        let later = format!("queue-|{:08X}|0000000000", now + 3_600_000);
        cache.apply_snapshot(vec![later.clone(), due.clone()], 2, Some(Vec::new()));
        assert_eq!(cache.pop(far()).map(|i| i.name), Some(due));
        assert_eq!(cache.pop(far()), None, "the other is not due for an hour");
        let next = cache.next_due().expect("a delayed item");
        let wait = next - Instant::now();
        assert!(wait > Duration::from_secs(3500) && wait <= Duration::from_secs(3600), "{wait:?}");
    }

    /// `queue-|{group}|{sequence}`, as a grouped put names it.
    fn grouped(group: &str, sequence: usize) -> String {
        format!("queue-|{group}|{sequence:010}")
    }

    fn popped(cache: &ChildrenCache) -> Vec<String> {
        std::iter::from_fn(|| cache.pop(far()).map(|item| item.name)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_first_message_of_each_group_is_offered() {
        let cache = test_cache_grouped(QueueKind::Fifo, true);
        let (a0, b1, a2, plain, b4) =
            (grouped("a", 0), grouped("b", 1), grouped("a", 2), fifo_names(3..4).remove(0), grouped("b", 4));
        let children = vec![b4.clone(), a2.clone(), plain.clone(), a0.clone(), b1.clone()];
        cache.apply_snapshot(children, 5, Some(Vec::new()));
        assert_eq!(popped(&cache), [a0.clone(), b1.clone(), plain.clone()], "heads, and the message without a group");
        // a0 is claimed (its lock appears), then acked (deleted): a2 is next, not before.
        let _ = cache.lock().lock_created(&a0);
        assert_eq!(cache.pop(far()), None);
        let stats = cache.group_stats().expect("grouped and live");
        assert_eq!((stats.groups, stats.in_flight, stats.blocked), (2, 2, 2), "a0 locked, b1 being claimed");
        let _ = cache.lock().child_deleted(&a0);
        let _ = cache.lock().lock_deleted(&a0);
        assert_eq!(popped(&cache), std::slice::from_ref(&a2));
        // b1 is released (nack keep, expiry): it is offered again, and still before b4.
        cache.claim_ended(&b1);
        cache.reoffer(names::parse(QueueKind::Id, &b1).expect("an item"));
        assert_eq!(popped(&cache), std::slice::from_ref(&b1));
        let _ = cache.lock().child_deleted(&b1);
        assert_eq!(popped(&cache), [b4]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_grouped_put_of_this_process_waits_for_its_event() {
        // Another sidecar put a0; its event has not arrived when our put of a1 is answered.
        let cache = test_cache_grouped(QueueKind::Fifo, true);
        cache.apply_snapshot(Vec::new(), 0, Some(Vec::new()));
        let (a0, a1) = (grouped("a", 0), grouped("a", 1));
        cache.insert_local(names::parse(QueueKind::Id, &a1).expect("an item"));
        assert_eq!(cache.pop(far()), None, "a1 is not offered ahead of a0's event");
        let _ = cache.lock().child_created(&a0);
        let _ = cache.lock().child_created(&a1);
        assert_eq!(popped(&cache), std::slice::from_ref(&a0));
        let _ = cache.lock().child_deleted(&a0);
        assert_eq!(popped(&cache), [a1]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_undecodable_head_holds_back_nothing() {
        let cache = test_cache_grouped(QueueKind::Id, true);
        let (a0, a1) = (grouped("a", 0), grouped("a", 1));
        cache.apply_snapshot(vec![a0.clone(), a1.clone()], 2, Some(Vec::new()));
        assert_eq!(popped(&cache), std::slice::from_ref(&a0));
        assert!(cache.mark_undecodable(&a0));
        cache.claim_ended(&a0);
        assert_eq!(popped(&cache), [a1]);
    }

    /// Pops candidates for a taker waiting until `wait_until`, their sequence numbers.
    fn drain_until(cache: &ChildrenCache, wait_until: Instant) -> Vec<i64> {
        std::iter::from_fn(|| cache.pop(wait_until).map(|i| i.sequence)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_fleet_member_claims_what_it_owns_at_once_and_the_rest_only_after_their_grace() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..40), 40, Some(Vec::new()));
        let members = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let fleet = state::Fleet::new("a", members.clone()).expect("a member");
        cache.set_fleet(Some(fleet.clone()));
        let rank = |n: i64| fleet.rank(&format!("queue-{n:010}"));
        let owned: Vec<i64> = (0..40).filter(|n| rank(*n) == 0).collect();
        assert!(!owned.is_empty() && owned.len() < 40, "owns some: {owned:?}");
        // A patient taker gets what this member owns, in order, and nothing else yet.
        assert_eq!(drain_until(&cache, far()), owned);
        // A message put now that another member owns waits too; one this member owns does not.
        let (theirs, mine) = {
            let mut next = (40..).map(|n| (n, rank(n)));
            let theirs = next.find(|(_, r)| *r > 0).expect("one of theirs").0;
            let mine = (40..).find(|n| rank(*n) == 0).expect("one of mine");
            (theirs, mine)
        };
        let _ = cache.lock().child_created(&format!("queue-{theirs:010}"));
        let _ = cache.lock().child_created(&format!("queue-{mine:010}"));
        assert_eq!(drain_until(&cache, far()), [mine]);
        // Once the second in their order waited one grace, it claims those it comes second for.
        tokio::time::advance(state::CLAIM_GRACE).await;
        let second: Vec<i64> = (0..40).chain([theirs]).filter(|n| rank(*n) == 1).collect();
        let mut got = drain_until(&cache, far());
        got.sort_unstable();
        let mut want = second.clone();
        want.sort_unstable();
        assert_eq!(got, want, "second in line after one grace");
        // A taker whose wait ends before their grace does claims them now: never "empty" while
        // a candidate is known.
        let rest = drain_until(&cache, Instant::now());
        assert_eq!(rest.len(), 41 - owned.len() - second.len());
        assert_eq!(cache.pop(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_leaves_hands_its_candidates_to_the_others_at_once() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..20), 20, Some(Vec::new()));
        let both = vec!["a".to_owned(), "b".to_owned()];
        cache.set_fleet(state::Fleet::new("a", both));
        let mine = drain_until(&cache, far());
        assert!(mine.len() < 20);
        // b's session ended (or it stopped taking): a alone claims every candidate at once.
        cache.set_fleet(state::Fleet::new("a", vec!["a".to_owned()]));
        let rest = drain_until(&cache, far());
        assert_eq!(mine.len() + rest.len(), 20);
        assert!(rest.windows(2).all(|w| w[0] < w[1]), "in order: {rest:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_put_answered_before_an_older_messages_event_is_applied_waits_for_it() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(Vec::new(), 0, Some(Vec::new()));
        // Message 0's creation event is received but not applied yet (the refresher is busy)
        // when this process's put of message 1 is answered.
        cache.insert_local(names::parse(QueueKind::Fifo, "queue-0000000001").expect("an item"));
        assert_eq!(cache.pop(far()), None, "not offered ahead of what the refresher has yet to apply");
        let _ = cache.lock().child_created("queue-0000000000");
        cache.settle_local();
        assert_eq!(drain_until(&cache, far()), [0, 1], "the older message first");
        assert_eq!(cache.lock().child_count(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_put_whose_own_event_came_first_is_offered_and_counted_once() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(Vec::new(), 0, Some(Vec::new()));
        let _ = cache.lock().child_created("queue-0000000000");
        cache.insert_local(names::parse(QueueKind::Fifo, "queue-0000000000").expect("an item"));
        cache.settle_local();
        assert_eq!(drain_until(&cache, far()), [0]);
        assert_eq!(cache.lock().child_count(), 1);
        // Taken and deleted before the refresher settles a later put of the same name: not back.
        cache.insert_local(names::parse(QueueKind::Fifo, "queue-0000000000").expect("an item"));
        let _ = cache.lock().child_deleted("queue-0000000000");
        cache.claim_ended("queue-0000000000");
        cache.settle_local();
        assert_eq!(cache.pop(far()), None);
        assert_eq!(cache.lock().child_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_put_while_the_snapshot_is_stale_is_not_handed_out_ahead_of_older_messages() {
        let cache = test_cache(QueueKind::Fifo);
        cache.apply_snapshot(fifo_names(0..1), 1, Some(Vec::new()));
        // The watches let go (nobody here took for a while): the snapshot is stale.
        cache.lock().invalidate();
        // This process puts message 1; message 0 is still there, unknown to the empty candidates.
        cache.insert_local(names::parse(QueueKind::Fifo, "queue-0000000001").expect("an item"));
        assert_eq!(cache.pop(far()), None, "nothing is offered from a stale snapshot");
        cache.apply_snapshot(fifo_names(0..2), 2, Some(Vec::new()));
        assert_eq!(drain_until(&cache, far()), [0, 1], "the older message first");
    }
}
