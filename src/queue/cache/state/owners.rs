//! Which sidecar claims which candidate first.
//!
//! Every sidecar that takes from a queue registers as a member of its fleet (`cache/fleet.rs`),
//! and every member sees the same members. Each candidate has an order of members, by rendezvous
//! hashing of its name with theirs: the first (its owner) claims it as soon as it is offered, the
//! second only [`CLAIM_GRACE`] later, the third twice that, and so on. With one view of the
//! members, a message is claimed by one sidecar, not raced by all of them; a member without a
//! waiter, a member that died, or two views that differ cost a grace or a failed claim, never a
//! second delivery: a claim is still one ZooKeeper transaction. A taker whose wait ends before a
//! candidate's grace claims it anyway, so a fleet never answers "empty" while a candidate is known.
//!
//! The hash is written out (FNV-1a and a 64-bit finalizer) so that every version of zkq in a
//! fleet agrees on it.

use std::cmp::Ordering;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::State;
use crate::config::QueueKind;
use crate::queue::names::{self, ItemName};

/// How long each member after a candidate's owner waits before it claims the candidate itself.
pub(crate) const CLAIM_GRACE: Duration = Duration::from_millis(250);

/// This process's place among the members of a queue's fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fleet {
    me: String,
    /// Every member, this process included, sorted.
    members: Vec<String>,
    /// The members that watch the queue and own its new messages, sorted: every member, or the
    /// first few in the queue's own rendezvous order while no member asks for help
    /// (`cache/fleet.rs`). The others stand by.
    owners: Vec<String>,
}

impl Fleet {
    /// The fleet `members` (a directory listing), as member `me` sees it, every member watching;
    /// `None` when `me` is not among them (not registered yet, or its node is gone) or is alone:
    /// then it claims every candidate at once.
    #[cfg(test)]
    pub(crate) fn new(me: &str, members: Vec<String>) -> Option<Fleet> {
        Fleet::watched_by(me, members, "", 0)
    }

    /// Like [`Fleet::new`], with at most `watchers` members watching the queue `queue` (0: every
    /// member): the first `watchers` in the queue's rendezvous order, the same in every view.
    pub(crate) fn watched_by(me: &str, mut members: Vec<String>, queue: &str, watchers: usize) -> Option<Fleet> {
        members.sort_unstable();
        members.dedup();
        let counted = members.binary_search_by(|m| m.as_str().cmp(me)).is_ok();
        if !counted || members.len() < 2 {
            return None;
        }
        let owners = if watchers == 0 || members.len() <= watchers {
            members.clone()
        } else {
            let mut order: Vec<&String> = members.iter().collect();
            order.sort_unstable_by(|a, b| (score(b, queue), b.as_str()).cmp(&(score(a, queue), a.as_str())));
            let mut owners: Vec<String> = order.into_iter().take(watchers).cloned().collect();
            owners.sort_unstable();
            owners
        };
        Some(Fleet { me: me.to_owned(), members, owners })
    }

    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether this process watches the queue and owns a share of its new messages; false while
    /// it stands by, its takers waiting for a call for help or the end of their wait.
    pub(crate) fn watches(&self) -> bool {
        self.owners.binary_search(&self.me).is_ok()
    }

    /// Whether some members stand by.
    pub(crate) fn has_standby(&self) -> bool {
        self.owners.len() < self.members.len()
    }

    /// How many members claim `name` before this process does (0: this process owns it). A
    /// member standing by comes after every owner.
    pub(crate) fn rank(&self, name: &str) -> usize {
        let mine = (score(&self.me, name), self.me.as_str());
        let ahead = |among: &[String]| among.iter().filter(|m| (score(m, name), m.as_str()) > mine).count();
        if self.watches() { ahead(&self.owners) } else { self.owners.len() + ahead(&self.members) }
    }
}

/// The rendezvous score of `member` for the candidate `name`.
fn score(member: &str, name: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in member.bytes().chain([0u8]).chain(name.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    // FNV alone spreads names that differ in their last digits poorly: finish like splitmix64.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// A candidate another member claims first.
#[derive(Debug, Clone)]
pub(super) struct Deferred {
    pub(super) item: ItemName,
    /// When this process first offered it (or last saw its owner change).
    seen: Instant,
    rank: usize,
}

impl Deferred {
    /// When this process claims it itself.
    fn due(&self) -> Instant {
        self.seen + CLAIM_GRACE * u32::try_from(self.rank).unwrap_or(u32::MAX)
    }
}

/// Candidates other members claim first, in delivery order, and when they fall due.
#[derive(Default)]
pub(super) struct Others {
    items: VecDeque<Deferred>,
    /// The instants at which deferred candidates fall due (one entry per distinct instant), so
    /// waiting takers are woken then.
    due: BTreeSet<Instant>,
}

impl Others {
    pub(super) fn front(&self) -> Option<&ItemName> {
        self.items.front().map(|d| &d.item)
    }

    pub(super) fn clear(&mut self) {
        self.items.clear();
        self.due.clear();
    }

    /// Inserts `item` in its place; false if it is there already.
    fn insert(&mut self, kind: QueueKind, item: ItemName, seen: Instant, rank: usize) -> bool {
        let place = match self.items.back().map(|last| names::compare(kind, &last.item, &item)) {
            None | Some(Ordering::Less) => Err(self.items.len()),
            Some(Ordering::Equal) => Ok(()),
            Some(Ordering::Greater) => {
                self.items.binary_search_by(|d| names::compare(kind, &d.item, &item)).map(|_| ())
            },
        };
        let Err(pos) = place else { return false };
        let deferred = Deferred { item, seen, rank };
        self.due.insert(deferred.due());
        self.items.insert(pos, deferred);
        true
    }

    /// Removes `item`; true if it was there.
    pub(super) fn remove(&mut self, kind: QueueKind, item: &ItemName) -> bool {
        match self.items.binary_search_by(|d| names::compare(kind, &d.item, item)) {
            Ok(index) => self.items.remove(index).is_some(),
            Err(_) => false,
        }
    }

    /// The first candidate (among the first `window`) that a taker waiting until `wait_until`
    /// claims now: due, or due only after the taker's wait is over.
    fn take(&mut self, now: Instant, wait_until: Instant, window: usize) -> Option<ItemName> {
        let index = self.items.iter().take(window).position(|d| {
            let due = d.due();
            due <= now || due >= wait_until
        })?;
        self.items.remove(index).map(|d| d.item)
    }

    /// Forgets the instants that have passed; how many candidates are due now.
    fn fall_due(&mut self, now: Instant) -> usize {
        let passed = self.due.iter().take_while(|at| **at <= now).count();
        if passed == 0 {
            return 0;
        }
        for _ in 0..passed {
            self.due.pop_first();
        }
        self.items.iter().filter(|d| d.due() <= now).count()
    }

    /// The next instant a deferred candidate falls due.
    fn next_due(&self) -> Option<Instant> {
        self.due.first().copied()
    }

    /// Empties the candidates, for a new view of the fleet.
    fn drain(&mut self) -> Vec<Deferred> {
        self.due.clear();
        self.items.drain(..).collect()
    }
}

impl State {
    /// Who takes from the queue now (`None`: this process alone, or not registered).
    pub(in crate::queue::cache) fn set_fleet(&mut self, fleet: Option<Fleet>) {
        if self.fleet == fleet {
            return;
        }
        self.fleet = fleet;
        let now = Instant::now();
        let kind = self.kind;
        // Every candidate, in delivery order (its own and the deferred ones, each sorted: one
        // sort of both), with when this process first deferred it (now, for its own).
        let mut all: Vec<(ItemName, Instant)> = self.candidates.drain(..).map(|item| (item, now)).collect();
        all.extend(self.others.drain().into_iter().map(|d| (d.item, d.seen)));
        all.sort_by(|a, b| names::compare(kind, &a.0, &b.0));
        let mut mine: Vec<ItemName> = Vec::with_capacity(all.len());
        for (item, seen) in all {
            match self.fleet.as_ref().map_or(0, |f| f.rank(&item.name)) {
                0 => mine.push(item),
                // In order: each insert is a push at the back.
                rank => {
                    self.others.insert(kind, item, seen, rank);
                },
            }
        }
        self.candidates = mine.into();
        let n = self.candidates.len();
        self.waiters.wake(n);
    }

    /// After a full read put every candidate in `candidates`: moves those another member owns
    /// to the deferred ones, each keeping when it was first deferred here.
    pub(super) fn defer_others(&mut self) {
        let Some(fleet) = self.fleet.as_ref() else { return };
        let now = Instant::now();
        let kind = self.kind;
        let seen: std::collections::HashMap<String, Instant> =
            self.others.drain().into_iter().map(|d| (d.item.name, d.seen)).collect();
        let mut mine = VecDeque::with_capacity(self.candidates.len() / fleet.len().max(1) + 1);
        for item in self.candidates.drain(..) {
            match fleet.rank(&item.name) {
                0 => mine.push_back(item),
                rank => {
                    let at = seen.get(&item.name).copied().unwrap_or(now);
                    self.others.insert(kind, item, at, rank);
                },
            }
        }
        self.candidates = mine;
    }

    /// Offers a deliverable item: to this process's takers now if it owns it, else once its
    /// grace is over. True if the refresher must re-arm its timer (it was deferred).
    pub(super) fn place(&mut self, item: ItemName) -> bool {
        let rank = self.fleet.as_ref().map_or(0, |f| f.rank(&item.name));
        if rank > 0 {
            return self.others.insert(self.kind, item, Instant::now(), rank);
        }
        let kind = self.kind;
        // A new message of a fifo queue sorts after every candidate (once when this process put
        // it, once more when its event comes): one comparison with the last, not a search of a
        // deep queue's candidates.
        let place = match self.candidates.back().map(|last| names::compare(kind, last, &item)) {
            None | Some(Ordering::Less) => Err(self.candidates.len()),
            Some(Ordering::Equal) => Ok(()),
            Some(Ordering::Greater) => self.candidates.binary_search_by(|c| names::compare(kind, c, &item)).map(|_| ()),
        };
        if let Err(pos) = place {
            self.candidates.insert(pos, item);
            self.waiters.wake(1);
        }
        false
    }

    /// A candidate another member claims first that a taker waiting until `wait_until` claims now.
    pub(super) fn pop_deferred(&mut self, wait_until: Instant) -> Option<ItemName> {
        self.others.take(Instant::now(), wait_until, super::SPREAD_WINDOW)
    }

    /// Wakes a waiter for each deferred candidate whose grace just ended.
    pub(super) fn wake_deferred_due(&mut self) {
        let due = self.others.fall_due(Instant::now());
        if due > 0 {
            self.waiters.wake(due);
        }
    }

    pub(super) fn next_deferred_due(&self) -> Option<Instant> {
        self.others.next_due()
    }

    /// Whether a taker waiting until `wait_until` may claim one of the deferred candidates now.
    pub(super) fn has_deferred_for(&self, wait_until: Instant) -> bool {
        let now = Instant::now();
        self.others.items.iter().take(super::SPREAD_WINDOW).any(|d| {
            let due = d.due();
            due <= now || due >= wait_until
        })
    }

    /// How many members the queue's fleet has, as this process sees it (0: it is alone in it).
    pub(in crate::queue::cache) fn fleet_size(&self) -> usize {
        self.fleet.as_ref().map_or(0, Fleet::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{:016x}", 0x1000_0000_u64 + i as u64 * 7919)).collect()
    }

    #[test]
    fn every_candidate_has_one_owner_and_one_order_of_members() {
        let all = members(8);
        let views: Vec<Fleet> = all.iter().map(|me| Fleet::new(me, all.clone()).expect("a member")).collect();
        let mut owned = vec![0usize; all.len()];
        for n in 0..8000 {
            let name = format!("queue-{n:010}");
            let mut ranks: Vec<usize> = views.iter().map(|v| v.rank(&name)).collect();
            let owner = ranks.iter().position(|r| *r == 0).expect("an owner");
            owned[owner] += 1;
            ranks.sort_unstable();
            assert_eq!(ranks, (0..all.len()).collect::<Vec<_>>(), "each rank once for {name}");
        }
        // Spread evenly: each of 8 members owns about 1,000 of 8,000.
        assert!(owned.iter().all(|n| (800..1200).contains(n)), "owned: {owned:?}");
    }

    #[test]
    fn a_few_members_watch_the_same_ones_in_every_view_and_own_every_candidate() {
        let all = members(8);
        let views: Vec<Fleet> =
            all.iter().map(|me| Fleet::watched_by(me, all.clone(), "/zkq/queues/jobs", 3).expect("a member")).collect();
        let watching: Vec<&String> = views.iter().filter(|v| v.watches()).map(|v| &v.me).collect();
        assert_eq!(watching.len(), 3, "three of eight watch");
        assert!(views.iter().all(Fleet::has_standby));
        // Another queue has its own watchers: the load spreads over the members.
        let other: Vec<bool> = all
            .iter()
            .map(|me| Fleet::watched_by(me, all.clone(), "/zkq/queues/mail", 3).expect("a member").watches())
            .collect();
        assert_eq!(other.iter().filter(|w| **w).count(), 3);
        for n in 0..2000 {
            let name = format!("queue-{n:010}");
            let mut ranks: Vec<(usize, bool)> = views.iter().map(|v| (v.rank(&name), v.watches())).collect();
            ranks.sort_unstable();
            // The owner and the next two are the watchers, in one order; every standby comes after.
            assert!(ranks[..3].iter().all(|(_, watches)| *watches), "{name}: {ranks:?}");
            assert_eq!(ranks[..3].iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![0, 1, 2]);
            assert!(ranks[3..].iter().all(|(r, watches)| !*watches && *r >= 3), "{name}: {ranks:?}");
        }
        // Fewer members than watchers, or 0: every member watches.
        let few = Fleet::watched_by(&all[0], all[..3].to_vec(), "/zkq/queues/jobs", 3).expect("a member");
        assert!(few.watches() && !few.has_standby());
        assert!(views.iter().all(|v| Fleet::watched_by(&v.me, all.clone(), "/q", 0).expect("a member").watches()));
    }

    #[test]
    fn a_process_alone_or_not_registered_has_no_fleet() {
        let all = members(3);
        assert!(Fleet::new(&all[0], vec![all[0].clone()]).is_none(), "alone");
        assert!(Fleet::new("ffffffffffffffff", all.clone()).is_none(), "not registered");
        let fleet = Fleet::new(&all[1].clone(), all).expect("a member");
        assert_eq!(fleet.len(), 3);
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_candidates() {
        let all = members(4);
        let before = Fleet::new(&all[0], all.clone()).expect("a member");
        let after = Fleet::new(&all[0], all[..3].to_vec()).expect("a member");
        for n in 0..2000 {
            let name = format!("queue-{n:010}");
            if before.rank(&name) == 0 {
                assert_eq!(after.rank(&name), 0, "{name} stays this member's");
            }
        }
    }
}
