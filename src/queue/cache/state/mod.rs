//! The candidates and waiters of one queue as plain data, changed only under the cache's lock.
//!
//! No I/O, no tasks, no metrics: the rules of what is offered to whom, and when, can be tested
//! without ZooKeeper. What a change asks of the world around it (export the size, wake the
//! refresher) comes back as [`Effects`] for the cache to act on while it still holds the lock.
//! `reports.rs` applies what ZooKeeper reports; this file, what this process's takers and puts do.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::QueueKind;
use crate::queue::names::{self, ItemName};
use crate::types::now_epoch_ms;
use crate::zk::ZkError;

mod groups;
mod owners;
mod reports;

pub(crate) use groups::GroupStats;
use groups::Groups;
#[cfg(test)]
pub(super) use owners::CLAIM_GRACE;
pub(super) use owners::Fleet;
pub(super) use reports::Snapshot;

/// How many of the first candidates a contended queue picks from at random.
pub(super) const SPREAD_WINDOW: usize = 64;

/// How long one sign of another consumer (a candidate it took or locked first) keeps the
/// random pick on.
const CONTENTION_MEMORY: Duration = Duration::from_secs(5);

/// Java's default `jute.maxbuffer`: a getChildren reply larger than this fails in Curator.
pub(super) const JUTE_MAXBUFFER: i64 = crate::config::JUTE_MAXBUFFER_BYTES as i64;

/// How many data lengths the cache keeps while no events say which children were deleted.
const KNOWN_BYTES_WITHOUT_EVENTS: usize = 65_536;

/// How many more data lengths than children the cache keeps before it forgets those of
/// children no longer there.
pub(super) const KNOWN_BYTES_SLACK: usize = 1024;

/// How many deleted names the cache remembers, so that a late local insert does not revive one.
const RECENTLY_DELETED: usize = 4096;
/// The most locks of one queue a process watches at once (one `exists` watch each). A locked
/// item past it is offered again after the next read of the child list instead of at once.
pub(super) const MAX_LOCK_WATCHES: usize = 1024;

/// Bytes a child name costs in a getChildren reply.
fn reply_bytes(name: &str) -> i64 {
    4 + i64::try_from(name.len()).unwrap_or(i64::MAX / 2)
}

/// When an item this process created joins a live cache's candidates ([`State::insert_local`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Joins {
    /// Once the events received before it are applied: a new message, which must not be handed
    /// out ahead of older ones whose events are still to be applied.
    AfterEvents,
    /// At once: an item split out of a node this process claims, in that node's place.
    Now,
}

/// What a change of the state asks of the cache around it.
#[must_use]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Effects {
    /// The child count or the child list's size changed: export them.
    pub(super) size_changed: bool,
    /// Wake the refresher (a new delayed item re-arms its timer).
    pub(super) refresh: bool,
    /// A candidate was pruned: another consumer took or locked it first.
    pub(super) pruned: bool,
    /// An eager cache met a name put by someone else: the undecodable mover reads it once.
    pub(super) unchecked: bool,
    /// The child count may have dropped (puts wait on `max_items`).
    pub(super) room: bool,
    /// Items put here wait to join the candidates: the refresher applies the events it has
    /// received, then [`State::settle_local`].
    pub(super) settle: bool,
}

struct Waiter {
    id: u64,
    wake: oneshot::Sender<()>,
}

/// The takers waiting for an item, first come, first served. Plain data in the cache's state, so
/// a wake-up is decided under the same lock as the candidate it announces.
#[derive(Default)]
struct WaiterQueue {
    waiters: VecDeque<Waiter>,
    next_id: u64,
}

impl WaiterQueue {
    /// Queues a taker; returns its id. A waiter that was woken but lost the race (`first`
    /// false) keeps its place at the front.
    fn add(&mut self, wake: oneshot::Sender<()>, first: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let waiter = Waiter { id, wake };
        if first {
            self.waiters.push_back(waiter)
        } else {
            self.waiters.push_front(waiter)
        }
        id
    }

    /// Removes a waiter that gave up; false if it was no longer queued (it was woken).
    fn remove(&mut self, id: u64) -> bool {
        let before = self.waiters.len();
        self.waiters.retain(|w| w.id != id);
        before != self.waiters.len()
    }

    /// Wakes the `n` longest-waiting takers still there.
    fn wake(&mut self, mut n: usize) {
        while n > 0 {
            let Some(waiter) = self.waiters.pop_front() else { return };
            if waiter.wake.send(()).is_ok() {
                n -= 1;
            }
        }
    }

    fn len(&self) -> usize {
        self.waiters.len()
    }

    fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }
}

pub(super) struct State {
    kind: QueueKind,
    /// Re-read on every change and remember new names (queues with a dead-letter queue, so an
    /// undecodable node is moved there promptly).
    eager: bool,
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
    waiters: WaiterQueue,
    /// `queue-` nodes that are not Curator envelopes: logged once, then skipped.
    undecodable: HashSet<String>,
    /// Items whose lock (held by a consumer) is being watched, one watch each.
    watched_locks: HashSet<String>,
    /// Events keep the snapshot current (the tree watches are live).
    live: bool,
    /// Every child of the queue node, while live.
    present: HashSet<String>,
    /// Items whose Curator lock exists, while live: not candidates until it is released. Kept
    /// current by the lock directory's events where it is watched (grouped queues); elsewhere
    /// it is what the last read listed, less the locks that went since (a lock watch of the
    /// item, or this process's own release).
    locked: HashSet<String>,
    /// The lock directory's events are followed (grouped queues only: a locked head holds its
    /// group). Elsewhere locks are learned from reads and from the locks a claim meets.
    locks_watched: bool,
    /// Candidates taken after another member's grace while locks are not watched: that member
    /// may hold them by now, so their claim reads the lock first (`acquire/claim.rs`).
    unverified: HashSet<String>,
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
    /// Data lengths of children this process wrote or read (see [`State::learn_bytes`]), so a
    /// `?max=` claim asks ZooKeeper only for the sizes it does not know.
    known_bytes: HashMap<String, usize>,
    /// Grouped queues only: the present members of each group; only a group's head is offered.
    groups: Option<Groups>,
    /// The members of the queue's fleet, while this process is one of them and not alone
    /// (`owners.rs`): `candidates` then holds only those it owns (or whose grace is over).
    fleet: Option<Fleet>,
    /// Candidates another member claims first.
    others: owners::Others,
    /// Items this process created while live that are not candidates yet: older items'
    /// creation events may still wait to be applied ([`State::settle_local`]).
    settling: Vec<ItemName>,
    /// The head when events last stopped keeping the snapshot current (a read while the queue is
    /// not watched, or a lost connection): what the age gauge reports meanwhile.
    last_head: Option<ItemName>,
}

impl State {
    /// An empty state, dirty until the first snapshot.
    pub(super) fn new(kind: QueueKind, eager: bool, grouped: bool) -> State {
        State {
            groups: grouped.then(Groups::default),
            kind,
            eager,
            candidates: VecDeque::new(),
            delayed: Vec::new(),
            snapshot_len: 0,
            taken_since_read: 0,
            dirty: true,
            child_count: 0,
            waiters: WaiterQueue::default(),
            undecodable: HashSet::new(),
            watched_locks: HashSet::new(),
            live: false,
            locks_watched: grouped,
            unverified: HashSet::new(),
            present: HashSet::new(),
            locked: HashSet::new(),
            children_bytes: 0,
            over_limit_warned: false,
            contended_at: None,
            recently_deleted: HashSet::new(),
            recently_deleted_order: VecDeque::new(),
            claiming: HashSet::new(),
            read_once: false,
            known: HashSet::new(),
            unchecked: Vec::new(),
            refused: None,
            known_bytes: HashMap::new(),
            fleet: None,
            last_head: None,
            others: owners::Others::default(),
            settling: Vec::new(),
        }
    }

    pub(super) fn kind(&self) -> QueueKind {
        self.kind
    }

    pub(super) fn is_live(&self) -> bool {
        self.live
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.dirty
    }

    pub(super) fn has_snapshot(&self) -> bool {
        self.read_once
    }

    /// Whether a taker waiting until `wait_until` has a candidate to claim now.
    pub(super) fn has_candidates_for(&self, wait_until: Instant) -> bool {
        !self.candidates.is_empty() || self.has_deferred_for(wait_until)
    }

    /// The head whose age is the queue's: while live, the first candidate; else the head when
    /// events stopped keeping the snapshot current, `false` saying so (its absence then says
    /// nothing of the queue now).
    pub(super) fn head_for_age(&self) -> (Option<&ItemName>, bool) {
        if self.live { (self.head(), true) } else { (self.last_head.as_ref(), false) }
    }

    /// The first candidate in delivery order, whoever claims it first.
    /// Whether candidates this process owns wait to be claimed (`cache/fleet.rs`).
    pub(super) fn owns_candidates(&self) -> bool {
        !self.candidates.is_empty()
    }

    /// Whether this process stands by in the queue's fleet (`owners.rs`).
    pub(super) fn stands_by(&self) -> bool {
        self.fleet.as_ref().is_some_and(|f| !f.watches())
    }

    /// Whether some members of the queue's fleet stand by.
    pub(super) fn fleet_has_standby(&self) -> bool {
        self.fleet.as_ref().is_some_and(Fleet::has_standby)
    }

    pub(super) fn head(&self) -> Option<&ItemName> {
        match (self.candidates.front(), self.others.front()) {
            (Some(mine), Some(other)) if names::compare(self.kind, other, mine).is_lt() => Some(other),
            (Some(mine), _) => Some(mine),
            (None, other) => other,
        }
    }

    pub(super) fn child_count(&self) -> i64 {
        self.child_count
    }

    pub(super) fn children_bytes(&self) -> i64 {
        self.children_bytes
    }

    pub(super) fn waiting(&self) -> usize {
        self.waiters.len()
    }

    pub(super) fn refusal(&self) -> Option<ZkError> {
        self.refused.clone()
    }

    /// The next candidate for a taker waiting until `wait_until` to claim, and whether to ask
    /// the refresher for a re-read now (the snapshot is dirty and either empty or a quarter
    /// consumed). Candidates this process owns come first; then those whose owner's grace is
    /// over, or would be over only after the taker's wait (`owners.rs`).
    pub(super) fn pop(&mut self, wait_until: Instant) -> (Option<ItemName>, bool) {
        self.promote_due();
        let contended = self.contended_at.is_some_and(|at| at.elapsed() < CONTENTION_MEMORY);
        let item = if contended && self.candidates.len() > 1 {
            let window = self.candidates.len().min(SPREAD_WINDOW);
            self.candidates.remove(rand::random_range(0..window))
        } else {
            self.candidates.pop_front()
        };
        let item = item.or_else(|| {
            let deferred = self.pop_deferred(wait_until)?;
            if !self.locks_watched {
                self.unverified.insert(deferred.name.clone());
            }
            Some(deferred)
        });
        if let Some(item) = &item {
            self.taken_since_read += 1;
            self.claiming.insert(item.name.clone());
        }
        let reread = self.dirty && (item.is_none() || self.taken_since_read * 4 >= self.snapshot_len.max(1));
        (item, reread)
    }

    pub(super) fn claim_ended(&mut self, name: &str) {
        self.claiming.remove(name);
        self.unverified.remove(name);
    }

    /// Whether the lock directory's events are followed (see [`State::locks_watched`]).
    pub(super) fn locks_watched(&self) -> bool {
        self.locks_watched
    }

    /// Whether the claim of popped candidate `name` must read its lock first: it was taken after
    /// another member's grace, and this process follows no lock events that would have said
    /// that member holds it.
    pub(super) fn is_unverified(&self, name: &str) -> bool {
        self.unverified.contains(name)
    }

    pub(super) fn mark_contended(&mut self) {
        self.contended_at = Some(Instant::now());
    }

    /// The members that follow `items` in their groups, up to `n`, each marked as being claimed:
    /// for each item, the next members in group order as long as each is present, not locked
    /// and not being claimed (a batch that holds a group's head may take the messages behind it,
    /// in order, as SQS hands several messages of one group to one receive).
    pub(super) fn followers(&mut self, items: &[ItemName], n: usize) -> Vec<ItemName> {
        let Some(groups) = &self.groups else { return Vec::new() };
        let mut found: Vec<ItemName> = Vec::new();
        for item in items {
            for name in groups.after(item) {
                if found.len() >= n {
                    break;
                }
                if found.iter().any(|f| f.name == *name) {
                    continue; // behind an earlier item of the same group too
                }
                let free = self.present.contains(name)
                    && !self.locked.contains(name)
                    && !self.claiming.contains(name)
                    && !self.undecodable.contains(name);
                let Some(next) = names::parse(self.kind, name).filter(|_| free) else { break };
                found.push(next);
            }
        }
        for item in &found {
            self.claiming.insert(item.name.clone());
        }
        found
    }

    /// Puts a popped candidate back in its place in the order (with a random pick it need not
    /// have been the head). A member behind its group's head (a batch's follower) is not offered:
    /// it is again once it heads its group.
    pub(super) fn push_front(&mut self, item: ItemName) {
        self.claiming.remove(&item.name);
        if self.groups.as_ref().is_some_and(|groups| !groups.is_head(&item)) {
            return;
        }
        let kind = self.kind;
        if let Err(pos) = self.candidates.binary_search_by(|c| names::compare(kind, c, &item)) {
            self.candidates.insert(pos, item);
        }
        self.waiters.wake(1);
    }

    /// Remembers that child `name` holds `bytes` of data (this process wrote or read it). A name
    /// already deleted is not remembered. Deletion events forget the others; names whose deletion
    /// went unseen (while no events came) are forgotten once the map outgrows the children by
    /// [`KNOWN_BYTES_SLACK`]; without events it holds at most [`KNOWN_BYTES_WITHOUT_EVENTS`].
    pub(super) fn learn_bytes(&mut self, name: &str, bytes: usize) {
        if self.recently_deleted.contains(name) {
            return;
        }
        let bound =
            if self.live { self.present.len().saturating_add(KNOWN_BYTES_SLACK) } else { KNOWN_BYTES_WITHOUT_EVENTS };
        if self.known_bytes.len() >= bound && !self.known_bytes.contains_key(name) {
            if !self.live {
                return;
            }
            let present = &self.present;
            self.known_bytes.retain(|name, _| present.contains(name));
        }
        self.known_bytes.insert(name.to_owned(), bytes);
    }

    #[cfg(test)]
    pub(super) fn known_bytes_len(&self) -> usize {
        self.known_bytes.len()
    }

    /// The data length of child `name`, if this process wrote or read it.
    pub(super) fn known_bytes(&self, name: &str) -> Option<usize> {
        self.known_bytes.get(name).copied()
    }

    /// Adds an item this process just created: a new message, after every older one, joins once
    /// the events received before its put's answer are applied (`Joins::AfterEvents`); an item
    /// split out of a node this process claims takes that node's place at once (`Joins::Now`).
    pub(super) fn insert_local(&mut self, item: ItemName, joins: Joins) -> Effects {
        let mut effects = Effects::default();
        if self.groups.is_some() && names::group_of(&item).is_some() {
            // A grouped message joins its group only by its event or a full read, which come
            // after every earlier member's (see `groups.rs`): its put's answer may come first.
            if !self.live {
                self.child_count += 1;
                self.dirty = true;
            }
            return effects;
        }
        if self.live {
            // Not a candidate yet. ZooKeeper sends a session's watch events in order with its
            // replies, so every older item's creation event arrived before this put's answer,
            // but the refresher may not have applied them yet (it may be waiting on a read):
            // offered now, this item would be handed out ahead of them. It joins once the
            // refresher has applied what it received (`settle_local`): at once when it is idle,
            // else when it is done, or at a taker's barrier.
            if self.eager {
                self.known.insert(item.name.clone());
            }
            // Counted now (a put waiting for room under `max_items` must see it); its event
            // counts it no second time.
            if self.recently_deleted.contains(&item.name) {
                return effects;
            }
            if self.present.insert(item.name.clone()) {
                self.child_count += 1;
                self.children_bytes += reply_bytes(&item.name);
                effects.size_changed = true;
            }
            match joins {
                Joins::AfterEvents => {
                    self.settling.push(item);
                    effects.settle = true;
                },
                Joins::Now => effects.refresh = self.add_candidate(&item.name),
            }
            return effects;
        }
        self.child_count += 1;
        if self.eager {
            self.known.insert(item.name.clone());
        }
        if !self.read_once || self.dirty {
            // Before the first snapshot, or once the snapshot is stale (the watches were let go, or
            // the connection lost), the candidates would hold only this item, and a take would
            // hand it out ahead of older ones; the next read (or the watch it arms) has it. It is
            // a message known to wait, though: the head whose age is reported, if none is known.
            if self.last_head.is_none() {
                self.last_head = Some(item);
            }
            return effects;
        }
        if names::due_time(&item) > now_epoch_ms() {
            let pos = self.delayed.partition_point(|d| names::compare(self.kind, d, &item).is_lt());
            self.delayed.insert(pos, item);
            effects.refresh = true; // the refresher re-arms its timer
            return effects;
        }
        effects.refresh = self.place(item);
        effects
    }

    /// The refresher has applied every event it received: the items this process created before
    /// now join the candidates in their places (one already deleted is not brought back).
    pub(super) fn settle_local(&mut self) -> Effects {
        let mut effects = Effects::default();
        if !self.live {
            // Not watched any more: the next read has them.
            self.settling.clear();
            return effects;
        }
        for item in std::mem::take(&mut self.settling) {
            // Not if it was deleted meanwhile (taken here, or by another consumer).
            if self.present.contains(&item.name) && !self.recently_deleted.contains(&item.name) {
                effects.refresh |= self.add_candidate(&item.name);
            }
        }
        effects
    }

    /// Offers an existing item again, in its place in the order.
    pub(super) fn reoffer(&mut self, item: ItemName) {
        // While live, events say whether it still exists and whether someone else locked it.
        if self.live && (!self.present.contains(&item.name) || self.locked.contains(&item.name)) {
            return;
        }
        if self.groups.as_ref().is_some_and(|groups| !groups.is_head(&item)) {
            return;
        }
        // A duplicate is found (and kept once) by its place in the order.
        let _deferred = self.place(item);
    }

    /// Forgets that `name` is locked (this process has just deleted the lock itself).
    pub(super) fn unlocked_local(&mut self, name: &str) {
        self.locked.remove(name);
    }

    /// Records that a lock on `name` is being watched; false if one already is, or if
    /// [`MAX_LOCK_WATCHES`] are (the item is then offered again after the next read).
    pub(super) fn watch_lock(&mut self, name: &str) -> bool {
        if self.watched_locks.len() >= MAX_LOCK_WATCHES {
            return false;
        }
        self.watched_locks.insert(name.to_owned())
    }

    /// The lock on `name` is gone (its watch saw it deleted, or the watch ended with the
    /// session): it is no longer known locked.
    pub(super) fn lock_watch_ended(&mut self, name: &str) {
        self.watched_locks.remove(name);
        self.locked.remove(name);
    }

    /// The items of the last read whose lock exists and is not watched yet, where locks are
    /// not followed by events: each is offered again once its lock goes.
    pub(super) fn locks_to_watch(&self) -> Vec<ItemName> {
        if self.locks_watched || !self.live {
            return Vec::new();
        }
        self.locked
            .iter()
            .filter(|name| self.present.contains(*name) && !self.watched_locks.contains(*name))
            .filter_map(|name| names::parse(self.kind, name))
            .take(MAX_LOCK_WATCHES.saturating_sub(self.watched_locks.len()))
            .collect()
    }

    /// Records that this process removed a child.
    pub(super) fn removed_local(&mut self) {
        // While live, the deletion event counts it.
        if !self.live {
            self.child_count -= 1;
        }
    }

    /// Records an undecodable node; true the first time. It is no message, so it holds back no
    /// other member of its group.
    pub(super) fn mark_undecodable(&mut self, name: &str) -> bool {
        let first = self.undecodable.insert(name.to_owned());
        if first && let Some(item) = names::parse(self.kind, name) {
            self.group_left(&item);
        }
        first
    }

    /// `item` is no longer a member of its group: its next member, if it now heads the group,
    /// becomes a candidate. True if the refresher must re-arm its timer.
    fn group_left(&mut self, item: &ItemName) -> bool {
        let Some(next) = self.groups.as_mut().and_then(|groups| groups.remove(item)) else { return false };
        self.add_candidate(&next)
    }

    /// What the groups look like now (grouped queues, while live: locks are known only then).
    pub(super) fn group_stats(&self) -> Option<GroupStats> {
        let groups = self.groups.as_ref().filter(|_| self.live)?;
        Some(groups.stats(|head| self.locked.contains(head) || self.claiming.contains(head)))
    }

    /// The first `n` children in delivery order (locked and not-yet-due ones included); `None`
    /// when not live.
    pub(super) fn peek_order(&self, n: usize) -> Option<Vec<ItemName>> {
        if !self.live {
            return None;
        }
        let kind = self.kind;
        // A bounded insertion sort: memory stays O(n) however deep the queue is.
        let mut first: Vec<ItemName> = Vec::with_capacity(n.min(self.present.len()));
        for name in &self.present {
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

    /// How many messages wait for their delivery time; `None` when not live.
    pub(super) fn delayed_count(&self) -> Option<usize> {
        self.live.then_some(self.delayed.len())
    }

    /// The `n` children ZooKeeper stored first (by sequence; names without one are left out),
    /// oldest first; `None` when not live.
    pub(super) fn oldest(&self, n: usize) -> Option<Vec<String>> {
        self.live.then(|| names::oldest(self.present.iter().map(String::as_str), n))
    }

    /// Notes a refresh attempt that ZooKeeper refused for good.
    pub(super) fn refused(&mut self, err: ZkError) {
        self.refused = Some(err);
    }

    /// Queues a taker to be woken by a new candidate; returns its id.
    pub(super) fn add_waiter(&mut self, wake: oneshot::Sender<()>, first: bool) -> u64 {
        self.waiters.add(wake, first)
    }

    /// Removes a waiter that gave up without being woken.
    pub(super) fn waiter_left(&mut self, id: u64) {
        if !self.waiters.remove(id) && !self.candidates.is_empty() {
            // We were woken just as we gave up: hand the wake-up to the next waiter.
            self.waiters.wake(1);
        }
    }

    /// Moves delay-queue items whose time has come to the candidates.
    pub(super) fn promote_due(&mut self) {
        if self.delayed.is_empty() {
            return;
        }
        let now = now_epoch_ms();
        let due = self.delayed.partition_point(|d| names::due_time(d) <= now);
        if due == 0 {
            return;
        }
        for item in self.delayed.drain(..due).collect::<Vec<_>>() {
            let _deferred = self.place(item);
        }
        let n = self.candidates.len();
        self.waiters.wake(n);
    }

    /// Makes due what is due: delay-queue items whose time has come, and candidates whose
    /// owner's grace is over (their waiters are woken).
    pub(super) fn fall_due(&mut self) {
        self.promote_due();
        self.wake_deferred_due();
    }

    /// When the first delayed item is due, or the next deferred candidate's grace ends.
    pub(super) fn next_due(&self) -> Option<Instant> {
        let delayed = self.delayed.first().map(|first| {
            let wait_ms = (names::due_time(first) - now_epoch_ms()).max(0);
            Instant::now() + Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0))
        });
        match (delayed, self.next_deferred_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Removes `name` from the candidates (and delayed items); true if it was one.
    /// No longer proposes `name` (this process removed it; its event may still be on its way).
    pub(super) fn prune(&mut self, name: &str) {
        self.remove_candidate(name);
    }

    fn remove_candidate(&mut self, name: &str) -> bool {
        let Some(item) = names::parse(self.kind, name) else { return false };
        let kind = self.kind;
        if let Ok(index) = self.candidates.binary_search_by(|c| names::compare(kind, c, &item)) {
            self.candidates.remove(index);
            return true;
        }
        if self.others.remove(kind, &item) {
            return true;
        }
        if let Some(index) = self.delayed.iter().position(|d| d.name == name) {
            self.delayed.remove(index);
        }
        false
    }

    /// Adds an existing, unlocked item to the candidates (or the delayed items) in its place;
    /// true if the refresher must re-arm its timer for it.
    fn add_candidate(&mut self, name: &str) -> bool {
        if self.undecodable.contains(name) || self.locked.contains(name) || self.claiming.contains(name) {
            return false;
        }
        let Some(item) = names::parse(self.kind, name) else { return false };
        if self.groups.as_ref().is_some_and(|groups| !groups.is_head(&item)) {
            return false;
        }
        if names::due_time(&item) > now_epoch_ms() {
            if !self.delayed.iter().any(|d| d.name == name) {
                let pos = self.delayed.partition_point(|d| names::due_time(d) <= names::due_time(&item));
                self.delayed.insert(pos, item);
                return true;
            }
            return false;
        }
        self.place(item)
    }
}
