//! What a queue's leases leave behind when they end, kept by the process so that it outlives the
//! queue: the receipt key, the numbering of leases and claim ids, which ack or nack ended each of
//! the last [`REMEMBERED_COMPLETIONS`] leases, and which item each of the last as many ended leases
//! held.
//!
//! An idle dynamic queue is closed (its tasks end, its slot is freed), but a client may still
//! retry an ack whose answer it lost: the queue's memory stays in [`LeaseMemories`] (for the last
//! [`CLOSED_QUEUES_REMEMBERED`] closed queues), a lease step on that name opens the queue again
//! with the same memory, and the retry answers as the step did.
//!
//! Invariants:
//! - A queue has one memory for the life of the process (until evicted while closed), so a token
//!   is never issued twice for one session and a receipt is recognized after a reopen.
//! - Bounded: [`REMEMBERED_COMPLETIONS`] completions and as many ended items per memory (about 50
//!   and 80 bytes each), and the
//!   memories of at most [`CLOSED_QUEUES_REMEMBERED`] closed queues besides the open ones.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::Step;
use super::receipt::ReceiptKey;

/// How many leases completed by a client's ack or nack a queue remembers, so that a retry of a
/// step that applied answers as the step did even after the lease left the table (the reaper can
/// resolve a lost answer before the client's retry arrives). About 50 bytes each.
pub(super) const REMEMBERED_COMPLETIONS: usize = 4096;

/// How many closed queues' memories the process keeps (the oldest closed is forgotten first; a
/// queue that never leased leaves none). At most about 550 KiB each.
pub(super) const CLOSED_QUEUES_REMEMBERED: usize = 64;

/// The memory of one queue's leases.
#[derive(Default)]
pub(in crate::queue) struct LeaseMemory {
    pub(super) key: ReceiptKey,
    next_sequence: AtomicU64,
    /// Numbers the claim ids of this process's lock nodes.
    claims: AtomicU64,
    completed: Mutex<Completions>,
    ended: Mutex<EndedItems>,
}

/// The item each of the last [`REMEMBERED_COMPLETIONS`] ended leases held, oldest first in
/// `order` (SQS's `DeleteMessage` with the receipt of an ended lease removes its message).
#[derive(Default)]
struct EndedItems {
    by_token: HashMap<u128, String>,
    order: VecDeque<u128>,
}

/// The step that completed each of the last [`REMEMBERED_COMPLETIONS`] leases a client's ack or
/// nack ended, oldest first in `order`.
#[derive(Default)]
struct Completions {
    by_token: HashMap<u128, Step>,
    order: VecDeque<u128>,
}

impl LeaseMemory {
    fn completions(&self) -> MutexGuard<'_, Completions> {
        self.completed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next lease number.
    pub(super) fn next_sequence(&self) -> u64 {
        self.next_sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// The next claim id number.
    pub(super) fn next_claim(&self) -> u64 {
        self.claims.fetch_add(1, Ordering::Relaxed)
    }

    fn leased(&self) -> bool {
        self.next_sequence.load(Ordering::Relaxed) > 0
    }

    /// Remembers that `step` ended lease `token`.
    pub(super) fn remember_completion(&self, token: u128, step: Step) {
        let mut completed = self.completions();
        if completed.by_token.insert(token, step).is_none() {
            completed.order.push_back(token);
        }
        while completed.order.len() > REMEMBERED_COMPLETIONS {
            if let Some(oldest) = completed.order.pop_front() {
                completed.by_token.remove(&oldest);
            }
        }
    }

    /// Remembers that lease `token`, now ended, held item `name`.
    pub(super) fn remember_item(&self, token: u128, name: &str) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.by_token.insert(token, name.to_owned()).is_none() {
            ended.order.push_back(token);
        }
        while ended.order.len() > REMEMBERED_COMPLETIONS {
            if let Some(oldest) = ended.order.pop_front() {
                ended.by_token.remove(&oldest);
            }
        }
    }

    /// The item ended lease `token` held, if remembered.
    pub(super) fn item_of(&self, token: u128) -> Option<String> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).by_token.get(&token).cloned()
    }

    /// The step that ended lease `token`, if remembered.
    pub(super) fn completed_by(&self, token: u128) -> Option<Step> {
        self.completions().by_token.get(&token).copied()
    }
}

/// The lease memories of every queue of the process: those of open queues, and of the last
/// [`CLOSED_QUEUES_REMEMBERED`] closed ones.
#[derive(Default)]
pub(in crate::queue) struct LeaseMemories {
    state: Mutex<MemoriesState>,
}

#[derive(Default)]
struct MemoriesState {
    by_queue: HashMap<String, Arc<LeaseMemory>>,
    /// Names of closed queues whose memory is kept, the longest closed first.
    closed: VecDeque<String>,
}

impl LeaseMemories {
    fn state(&self) -> MutexGuard<'_, MemoriesState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The memory of queue `name`, being opened: the one it had before it closed, or a new one.
    pub(in crate::queue) fn open(&self, name: &str) -> Arc<LeaseMemory> {
        let mut state = self.state();
        state.closed.retain(|closed| closed != name);
        state.by_queue.entry(name.to_owned()).or_default().clone()
    }

    /// Queue `name` closed: its memory is kept if it ever leased, the oldest closed beyond
    /// [`CLOSED_QUEUES_REMEMBERED`] are forgotten.
    pub(in crate::queue) fn closed(&self, name: &str) {
        let mut state = self.state();
        if !state.by_queue.get(name).is_some_and(|memory| memory.leased()) {
            state.by_queue.remove(name);
            return;
        }
        state.closed.retain(|closed| closed != name);
        state.closed.push_back(name.to_owned());
        while state.closed.len() > CLOSED_QUEUES_REMEMBERED {
            if let Some(oldest) = state.closed.pop_front() {
                state.by_queue.remove(&oldest);
            }
        }
    }

    /// Forgets queue `name`'s memory (it was deleted): its receipts are never honoured again.
    pub(in crate::queue) fn forget(&self, name: &str) {
        let mut state = self.state();
        state.closed.retain(|closed| closed != name);
        state.by_queue.remove(name);
    }

    /// Whether closed queue `name` left a memory (a lease step on it opens it again).
    pub(in crate::queue) fn remembers(&self, name: &str) -> bool {
        self.state().by_queue.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_items_are_remembered_for_the_last_few_thousand_leases_only() {
        let memory = LeaseMemory::default();
        let total = REMEMBERED_COMPLETIONS as u128 + 10;
        for token in 0..total {
            memory.remember_item(token, &format!("queue-{token:010}"));
        }
        assert_eq!(memory.item_of(0), None, "the oldest is forgotten");
        assert_eq!(memory.item_of(total - 1).as_deref(), Some(format!("queue-{:010}", total - 1).as_str()));
        let ended = memory.ended.lock().expect("not poisoned");
        assert_eq!((ended.by_token.len(), ended.order.len()), (REMEMBERED_COMPLETIONS, REMEMBERED_COMPLETIONS));
    }

    #[test]
    fn completions_are_remembered_for_the_last_few_thousand_leases_only() {
        let memory = LeaseMemory::default();
        let total = REMEMBERED_COMPLETIONS as u128 + 10;
        for token in 0..total {
            memory.remember_completion(token, Step::Ack);
        }
        memory.remember_completion(total - 1, Step::Ack); // a second record of one lease adds nothing
        let completed = memory.completions();
        assert_eq!(completed.by_token.len(), REMEMBERED_COMPLETIONS);
        assert_eq!(completed.order.len(), REMEMBERED_COMPLETIONS);
        drop(completed);
        assert_eq!(memory.completed_by(9), None, "the oldest are forgotten first");
        assert_eq!(memory.completed_by(10), Some(Step::Ack));
        assert_eq!(memory.completed_by(total - 1), Some(Step::Ack));
    }

    #[test]
    fn a_closed_queue_keeps_its_memory_until_many_others_closed_after_it() {
        let memories = LeaseMemories::default();
        let first = memories.open("first");
        first.next_sequence();
        first.remember_completion(7, Step::Ack);
        drop(first);
        memories.closed("first");
        assert!(memories.remembers("first"));
        let reopened = memories.open("first");
        assert_eq!(reopened.completed_by(7), Some(Step::Ack), "the same memory after a reopen");
        assert_eq!(reopened.next_sequence(), 1, "lease numbers go on");
        drop(reopened);
        memories.closed("first");
        // A queue that never leased leaves nothing.
        drop(memories.open("idle"));
        memories.closed("idle");
        assert!(!memories.remembers("idle"));
        for n in 0..CLOSED_QUEUES_REMEMBERED {
            let name = format!("q{n}");
            memories.open(&name).next_sequence();
            memories.closed(&name);
        }
        assert!(!memories.remembers("first"), "the longest closed is forgotten first");
        assert!(memories.remembers("q0"));
        assert_eq!(memories.state().by_queue.len(), CLOSED_QUEUES_REMEMBERED);
    }
}
