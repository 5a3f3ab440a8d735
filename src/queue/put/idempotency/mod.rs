//! Idempotent puts: a put that carries an `Idempotency-Key` stores its message at most once per
//! key and queue within the queue's idempotency window, however often it is retried and through
//! whichever zkq.
//!
//! Layout, outside the queue node (Curator never sees it), for queue `q`:
//! - `{root}/idempotency/q/keys/{h}`: the key's record (JSON, `record.rs`); `h` is the first 16
//!   bytes of SHA-256(key) in hex.
//! - `{root}/idempotency/q/expiry/{t}/{h}`: an empty index entry in the bucket of the second in
//!   which the record expires (`t`: that second's end, epoch ms, 15 digits).
//!
//! `record.rs` is the record's format (pure); `protocol.rs` the keyed put, its record written with
//! its message; `recovery.rs` the name written after it and the settling of lost answers;
//! `sweep.rs` the sweepers; `forget.rs` what a queue's delete forgets.
//!
//! Invariants:
//! - A record's key and fingerprint are written only by a transaction that also creates the
//!   message; the name is written after it, versioned, so never over a newer record.
//! - Every record has one index entry, in the bucket of its `expires_at`: the transactions that
//!   create, renew and sweep a record create, move or delete its entry with it.
//! - The sweeper deletes a record only with its index entry, at the version it read as expired.
//! - A lost answer is resolved by evidence only: a record holds a token unique to the attempt
//!   that wrote it. Reads that fail on a dropped connection are asked again once reconnected,
//!   until the request's deadline (then 503: they wrote nothing).
//! - A put answers 201 only once its record names its message (or, after a lost answer, once the
//!   name proved impossible to tell).
//! - A record counts until its `expires_at` (the writer's clock), whether swept or not; a lookup
//!   treats an expired record as absent and the next put with its key renews it in place.

mod forget;
mod protocol;
mod record;
mod recovery;
mod sweep;

use crate::types::Layout;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

pub(in crate::queue) use forget::forget_written_before;
pub(in crate::queue) use protocol::{KeyedCaller, KeyedPut};
pub(crate) use record::{MAX_KEY_LEN, is_valid_key, key_pattern};
pub(in crate::queue) use sweep::{IDLE_CHECK, sweep_queues_not_open};

/// How long after a put found a used key the queue's keyed puts read their records first.
const READ_FIRST_AFTER_REPLAY: Duration = Duration::from_secs(1);

/// The idempotency state of one queue: where its records live, its window, and whether the
/// sweeper has work.
pub(super) struct Idempotency {
    /// `{root}/idempotency/{queue}`.
    dir: String,
    window: Duration,
    /// Records of this queue may be in ZooKeeper: the sweeper lists its buckets every period and
    /// the queue is not closed as idle.
    holds_records: AtomicBool,
    /// When the sweeper last listed the buckets.
    listed_at: Mutex<Option<Instant>>,
    /// When a put of this queue last found a key used (a replay or a 409).
    replayed_at: Mutex<Option<Instant>>,
}

impl Idempotency {
    pub(super) fn new(layout: &Layout, queue: &str, window: Duration) -> Idempotency {
        Idempotency {
            dir: layout.idempotency_of(queue),
            window,
            holds_records: AtomicBool::new(false),
            listed_at: Mutex::new(None),
            replayed_at: Mutex::new(None),
        }
    }

    /// Forgets every key of the queue (a purge): its records and their expiry index are deleted,
    /// so the next put with any key stores anew. `false` when the deadline came first.
    pub(super) async fn forget_all(&self, zk: &crate::zk::Zk) -> Result<bool, crate::zk::ZkError> {
        Ok(zk.delete_tree(&self.dir).await?.1)
    }

    /// `{dir}/keys`: the records.
    pub(super) fn keys_dir(&self) -> String {
        format!("{}/keys", self.dir)
    }

    fn expiry_dir(&self) -> String {
        format!("{}/expiry", self.dir)
    }

    fn record_path(&self, hash: &str) -> String {
        format!("{}/keys/{hash}", self.dir)
    }

    fn entry_path(&self, bucket: &str, hash: &str) -> String {
        format!("{}/expiry/{bucket}/{hash}", self.dir)
    }

    /// Whether records of this queue may still be in ZooKeeper (an idle queue stays open then, so
    /// its sweeper keeps running).
    pub(super) fn holds_records(&self) -> bool {
        self.holds_records.load(Ordering::SeqCst)
    }

    fn listed_at(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.listed_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the sweeper should list the buckets now.
    fn sweep_due(&self) -> bool {
        self.holds_records() || self.listed_at().is_none_or(|at| at.elapsed() >= IDLE_CHECK)
    }

    fn replayed_at(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.replayed_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether puts of this queue found used keys lately: then puts read their records first.
    fn replaying(&self) -> bool {
        self.replayed_at().is_some_and(|at| at.elapsed() < READ_FIRST_AFTER_REPLAY)
    }
}
