//! Message groups among the candidates: a grouped message is offered only while it is the first
//! member of its group that the cache knows to be present (its head), so one message of a group
//! is in flight at a time, in put order, and a busy group never holds back another.
//!
//! Why the head the cache sees is the group's true head, on every sidecar at once:
//! - A grouped message's name is `queue-|group|sequence`, and ZooKeeper assigns the sequence in
//!   commit order, so every earlier member of a group was created in an earlier transaction.
//!   zkq never creates a grouped name out of that order: a grouped queue has no put-back (a take
//!   is a lease acked as it is answered), refuses a requeue to the tail, and splits a Curator
//!   putMulti node by rewriting the node in place, so its split items (which sort before later
//!   messages) are created while the node they come from is present and still heads the group.
//! - A session receives the events of its watches in zxid order. So a cache that learned of a
//!   member from its tree watch has learned of the creation of every earlier member; one it no
//!   longer holds was deleted, and sequential names never return. That is why a grouped message
//!   enters the groups only by an event or a full read of the child list (a consistent cut),
//!   never by this process's own put, whose answer can come before an earlier member's event.
//! - A member the cache still holds may already be deleted: it then holds the next one back a
//!   little longer, never offers it early.
//!
//! The head's claim is still confirmed in ZooKeeper (its lock and version check), and it stays
//! the head until it is deleted (acked, dead-lettered, removed): a nack, an expiry or a lost
//! session release its lock and it is offered again, first of its group.

use std::collections::{BTreeSet, HashMap};

use crate::queue::names::{self, ItemName};

/// What the groups of a queue look like now (queue info and metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupStats {
    /// Groups with at least one message present.
    pub groups: usize,
    /// Groups whose head is being consumed (locked, or being claimed by this process).
    pub in_flight: usize,
    /// Messages waiting behind a head that is being consumed.
    pub blocked: usize,
}

/// The members of each group the cache knows to be present, in group order.
#[derive(Default)]
pub(super) struct Groups {
    members: HashMap<String, BTreeSet<(i64, String)>>,
}

impl Groups {
    /// Adds a present message; messages without a group are not tracked.
    pub(super) fn add(&mut self, item: &ItemName) {
        if let Some(group) = names::group_of(item) {
            self.members.entry(group.to_owned()).or_default().insert((item.sequence, item.name.clone()));
        }
    }

    /// Removes a message that is no longer present; the group's new head when it was the head.
    pub(super) fn remove(&mut self, item: &ItemName) -> Option<String> {
        let group = names::group_of(item)?;
        let members = self.members.get_mut(group)?;
        let key = (item.sequence, item.name.clone());
        let was_head = members.first() == Some(&key);
        if !members.remove(&key) {
            return None;
        }
        let next = members.first().map(|(_, name)| name.clone());
        if members.is_empty() {
            self.members.remove(group);
        }
        if was_head { next } else { None }
    }

    /// Whether `item` may be offered: it has no group, or it heads its group.
    pub(super) fn is_head(&self, item: &ItemName) -> bool {
        let Some(group) = names::group_of(item) else { return true };
        self.members.get(group).and_then(BTreeSet::first).is_none_or(|(_, name)| *name == item.name)
    }

    /// The members of `item`'s group after it, in group order (none for a message without a
    /// group, or one the groups do not hold).
    pub(super) fn after<'a>(&'a self, item: &ItemName) -> impl Iterator<Item = &'a String> + 'a {
        let key = (item.sequence, item.name.clone());
        let members = names::group_of(item).and_then(|group| self.members.get(group));
        let held = members.is_some_and(|members| members.contains(&key));
        members
            .filter(|_| held)
            .into_iter()
            .flat_map(move |members| {
                members.range((std::ops::Bound::Excluded(key.clone()), std::ops::Bound::Unbounded))
            })
            .map(|(_, name)| name)
    }

    /// Replaces the members with those of a full read of the child list.
    pub(super) fn rebuild<'a>(&mut self, items: impl IntoIterator<Item = &'a ItemName>) {
        self.members.clear();
        for item in items {
            self.add(item);
        }
    }

    /// Counts groups, those whose head is `busy`, and the messages behind those.
    pub(super) fn stats(&self, busy: impl Fn(&str) -> bool) -> GroupStats {
        let mut stats = GroupStats { groups: self.members.len(), ..GroupStats::default() };
        for members in self.members.values() {
            if members.first().is_some_and(|(_, head)| busy(head)) {
                stats.in_flight += 1;
                stats.blocked += members.len() - 1;
            }
        }
        stats
    }
}
