//! What ZooKeeper reports, applied to the state: a full read of the child list, and the tree
//! watches' events in between. Kept apart from what this process's takers do, because it is the
//! only way other consumers' work (takes, locks, puts) reaches the candidates.

use std::collections::HashSet;

use super::{Effects, JUTE_MAXBUFFER, RECENTLY_DELETED, State, reply_bytes};
use crate::config::QueueKind;
use crate::queue::names::{self, ItemName};

/// A full read of the child list, put in delivery order outside the lock.
pub(in crate::queue::cache) struct Snapshot {
    candidates: Vec<ItemName>,
    delayed: Vec<ItemName>,
    children: Vec<String>,
    num_children: i32,
    bytes: i64,
    /// The lock directory's children, when the tree watches are live.
    locked: HashSet<String>,
    live: bool,
}

impl Snapshot {
    /// Orders `items` (the children [`State::offerable`] kept) and splits off delay-queue items
    /// not yet due at `now`.
    pub(in crate::queue::cache) fn new(
        kind: QueueKind,
        mut items: Vec<ItemName>,
        children: Vec<String>,
        num_children: i32,
        locked: HashSet<String>,
        live: bool,
        now: i64,
    ) -> Snapshot {
        items.sort_by(|a, b| names::compare(kind, a, b));
        // Not yet due: a delay queue's, and a plain fifo queue's delayed messages (`names::parse`).
        let (mut delayed, items): (Vec<ItemName>, Vec<ItemName>) =
            items.into_iter().partition(|i| names::due_time(i) > now);
        delayed.sort_by_key(names::due_time);
        let bytes: i64 = children.iter().map(|c| reply_bytes(c)).sum();
        Snapshot { candidates: items, delayed, children, num_children, bytes, locked, live }
    }
}

impl State {
    /// The children a snapshot may offer (decodable, not locked, not being claimed), parsed.
    pub(in crate::queue::cache) fn offerable(&self, children: &[String], locked: &HashSet<String>) -> Vec<ItemName> {
        let mut items: Vec<ItemName> = Vec::with_capacity(children.len());
        for child in children {
            if self.undecodable.contains(child) || locked.contains(child) || self.claiming.contains(child) {
                continue;
            }
            if let Some(item) = names::parse(self.kind, child) {
                items.push(item);
            }
        }
        items
    }

    /// Replaces the candidates with a full read; wakes as many waiters as it offers.
    pub(in crate::queue::cache) fn install(&mut self, snapshot: Snapshot) {
        let Snapshot { mut candidates, delayed, children, num_children, bytes, locked, live } = snapshot;
        if let Some(groups) = &mut self.groups {
            // Every member counts, locked or not: a locked head holds its group.
            let undecodable = &self.undecodable;
            let members: Vec<ItemName> = children
                .iter()
                .filter(|child| !undecodable.contains(*child))
                .filter_map(|child| names::parse(self.kind, child))
                .collect();
            groups.rebuild(&members);
            candidates.retain(|item| groups.is_head(item));
        }
        self.snapshot_len = candidates.len();
        self.candidates = candidates.into();
        if self.fleet.is_some() {
            // Those another member owns wait for its grace, counted from when they were first
            // offered here: a re-read does not restart it.
            self.defer_others();
        } else {
            self.others.clear();
        }
        self.delayed = delayed;
        self.taken_since_read = 0;
        self.dirty = false;
        self.read_once = true;
        self.refused = None;
        self.child_count = i64::from(num_children);
        self.children_bytes = bytes;
        self.live = live;
        self.locked = locked;
        let present: HashSet<String> = children.into_iter().collect();
        self.undecodable.retain(|name| present.contains(name));
        self.unverified.retain(|name| present.contains(name));
        if self.eager {
            let new: Vec<String> = present.iter().filter(|c| !self.known.contains(*c)).cloned().collect();
            self.unchecked.extend(new);
            self.known = present.clone();
        }
        self.present = if live { present } else { HashSet::new() };
        let n = self.candidates.len();
        self.waiters.wake(n);
    }

    /// Whether the child list just outgrew what a Curator consumer can read: true once, then
    /// again only after it shrank below 90% of the limit.
    pub(in crate::queue::cache) fn outgrew_jute_maxbuffer(&mut self) -> bool {
        if self.children_bytes > JUTE_MAXBUFFER && !self.over_limit_warned {
            self.over_limit_warned = true;
            return true;
        }
        if self.children_bytes < JUTE_MAXBUFFER / 10 * 9 {
            self.over_limit_warned = false;
        }
        false
    }

    /// The queue node's child `name` was created (an event while live).
    pub(in crate::queue::cache) fn child_created(&mut self, name: &str) -> Effects {
        let mut effects = Effects::default();
        if !self.live || !self.present.insert(name.to_owned()) {
            return effects;
        }
        self.child_count += 1;
        self.children_bytes += reply_bytes(name);
        if let Some(groups) = &mut self.groups
            && let Some(item) = names::parse(self.kind, name)
            && !self.undecodable.contains(name)
        {
            groups.add(&item);
        }
        effects.refresh = self.add_candidate(name);
        effects.size_changed = true;
        if self.eager && self.known.insert(name.to_owned()) {
            self.unchecked.push(name.to_owned());
            effects.unchecked = true;
        }
        effects
    }

    /// The queue node's child `name` was deleted (an event while live).
    pub(in crate::queue::cache) fn child_deleted(&mut self, name: &str) -> Effects {
        let mut effects = Effects::default();
        if !self.live {
            return effects;
        }
        if self.recently_deleted.insert(name.to_owned()) {
            self.recently_deleted_order.push_back(name.to_owned());
            if self.recently_deleted_order.len() > RECENTLY_DELETED
                && let Some(oldest) = self.recently_deleted_order.pop_front()
            {
                self.recently_deleted.remove(&oldest);
            }
        }
        if self.present.remove(name) {
            self.child_count -= 1;
            self.children_bytes -= reply_bytes(name);
            effects.size_changed = true;
        }
        self.undecodable.remove(name);
        self.known_bytes.remove(name);
        self.unverified.remove(name);
        if !self.locks_watched {
            // Its lock went with it (an ack), or goes soon: no event of the lock will say so.
            self.locked.remove(name);
        }
        // Pruned, not contended: a deletion (a lone Curator consumer's take, zkq's own delete by
        // id or purge) raced no claim of ours. Only a claim of ours that lost (`claim.rs`) says
        // several consumers propose the same head; until then a single consumer keeps Curator's order.
        if self.remove_candidate(name) {
            effects.pruned = true;
        }
        if self.groups.is_some()
            && let Some(item) = names::parse(self.kind, name)
        {
            effects.refresh |= self.group_left(&item);
        }
        effects.room = true;
        effects
    }

    /// A consumer locked the item `name` (an event while live).
    pub(in crate::queue::cache) fn lock_created(&mut self, name: &str) -> Effects {
        let mut effects = Effects::default();
        if !self.live {
            return effects;
        }
        self.locked.insert(name.to_owned());
        // Pruned, not contended (as a deletion): only a claim of ours that lost says so.
        if self.remove_candidate(name) {
            effects.pruned = true;
        }
        effects
    }

    /// The lock on the item `name` was deleted (an event while live).
    pub(in crate::queue::cache) fn lock_deleted(&mut self, name: &str) -> Effects {
        let mut effects = Effects::default();
        if self.live && self.locked.remove(name) && self.present.contains(name) {
            effects.refresh = self.add_candidate(name);
        }
        effects
    }

    /// Marks the snapshot stale; true if it should be re-read at once (it is needed now, or
    /// the cache is eager), otherwise it waits until a taker asks.
    pub(in crate::queue::cache) fn mark_dirty(&mut self) -> bool {
        self.dirty = true;
        self.eager || (self.candidates.is_empty() && !self.waiters.is_empty())
    }

    /// Names read for the first time since the last call (eager caches only).
    pub(in crate::queue::cache) fn take_unchecked(&mut self) -> Vec<String> {
        std::mem::take(&mut self.unchecked)
    }

    /// The tree watches are gone: nothing is offered until the next snapshot.
    pub(in crate::queue::cache) fn invalidate(&mut self) {
        // The head of a snapshot that was current (live, or just read): invalidating again
        // must not forget it.
        if !self.dirty {
            self.last_head = self.head().cloned();
        }
        self.dirty = true;
        self.live = false;
        self.candidates.clear();
        self.others.clear();
        self.delayed.clear();
        self.settling.clear();
    }
}
