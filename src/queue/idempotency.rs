//! Idempotent puts: a put that carries an `Idempotency-Key` stores its message at most once per
//! key and queue within the queue's idempotency window, however often it is retried and through
//! whichever zkq.
//!
//! Layout, outside the queue node (Curator never sees it), for queue `q`:
//! - `{root}/idempotency/q/keys/{h}`: the key's record (JSON, [`Record`]); `h` is the first 16
//!   bytes of SHA-256(key) in hex. Creating it is the arbiter: of two puts with the same key, in one
//!   process or in two, only one `create` succeeds.
//! - `{root}/idempotency/q/expiry/{t}/{h}`: an empty index entry in the bucket of the second in
//!   which the record expires (`t`: that second's end, epoch ms, 15 digits). The sweeper lists only
//!   the bucket names and the buckets whose end has passed; it never lists or reads a live record.
//!
//! A keyed put's transaction creates the record (or renews an expired one), its index entry and
//! the message, in one multi. The message's name is known only once the multi has answered (the
//! server appends the sequence), so the record cannot hold it yet: a versioned `setData` writes it
//! after the put answered, batched with other puts' names ([`RecordNames`], best effort). A record
//! without a name (zkq died, or lost the connection, between the two steps) is
//! resolved by the message whose creation zxid is the record's `mzxid`, since every operation of a
//! multi has the same zxid; a message consumed before that is found has no name left to tell, and
//! the replay says so (`message_id: null`).
//!
//! Invariants:
//! - A record's key and fingerprint are written only by a transaction that also creates the
//!   message; the name is written after it, versioned, so never over a newer record.
//! - Every record has one index entry, in the bucket of its `expires_at`: the transactions that
//!   create, renew and sweep a record create, move or delete its entry with it.
//! - The sweeper deletes a record only with its index entry, in one transaction, at the version it
//!   read as expired. The entry is a fence: a sweeper working from a stale read fails on the entry
//!   another sweeper already deleted, so it never deletes a record that was swept and created
//!   again; a renewed record has a new version, so it is never deleted either.
//! - A lost answer is resolved by evidence only: a record holds a token unique to the attempt
//!   that wrote it. Our token there (after `sync`) means applied. Not there means not applied, but
//!   only within half a window of the attempt: later, the record could have expired and been
//!   replaced, and the put answers `outcome_unknown`.
//! - A record counts until its `expires_at` (the writer's clock), whether swept or not; a lookup
//!   treats an expired record as absent and the next put with its key renews it in place.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::names::{self, ItemName};
use super::ops::{PutOptions, PutReceipt};
use super::{Queue, QueueError, now_epoch_ms};
use crate::zk::{ConnectionState, NodeMode, NodeStat, TxnError, TxnOp, TxnResult, Zk, ZkError, ZkSession};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 200;
/// Format version of a record.
const RECORD_FORMAT: u32 = 1;
/// Width of an expiry bucket, in milliseconds: a record is swept at most this long after it
/// expired (plus the sweep period).
const BUCKET_MS: i64 = 1000;
/// Records (with their index entries) deleted per sweep transaction.
const SWEEP_BATCH: usize = 64;
/// How long a replay waits for the put in flight to record its message's name before it looks
/// for the message itself.
const NAME_WAIT: Duration = Duration::from_secs(1);
/// How often a queue whose idempotency directory this process found empty looks again (records
/// another zkq wrote and could not sweep, because it stopped).
const IDLE_CHECK: Duration = Duration::from_secs(600);
/// Transactions one keyed put sends at most (races with other puts of the same key, and the one
/// retry after a lost answer that did not apply).
const MAX_ATTEMPTS: usize = 4;
/// Message names written into their records per transaction, and how long the first one waits
/// for others: one round trip names many puts.
const NAME_BATCH: usize = 64;
const NAME_FLUSH_AFTER: Duration = Duration::from_millis(20);
/// Names waiting to be written at most; beyond, the oldest are dropped (their records are
/// resolved by zxid).
const MAX_PENDING_NAMES: usize = 10_000;

/// Whether `key` may be an idempotency key: 1 to 200 bytes of visible ASCII (`!` to `~`).
pub fn is_valid_key(key: &[u8]) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The record of a key, as stored in its node (JSON). Everything in it is read back as untrusted:
/// a record that does not parse is treated as expired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    /// Format version ([`RECORD_FORMAT`]).
    v: u32,
    /// The key itself, so that a hash collision is noticed instead of replayed.
    key: String,
    /// SHA-256 of what the put stores (body, priority, id), hex.
    fingerprint: String,
    /// Epoch ms (the writer's clock) after which the key is free again.
    expires_at: i64,
    /// The expiry bucket holding this record's index entry.
    bucket: String,
    /// Unique to the transaction that wrote the record: evidence after a lost answer.
    token: String,
    /// The message's node name, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message_id: Option<String>,
}

impl Record {
    fn parse(data: &[u8]) -> Option<Record> {
        serde_json::from_slice::<Record>(data).ok().filter(|r| r.v == RECORD_FORMAT)
    }

    fn to_bytes(&self) -> Vec<u8> {
        // A struct of strings and integers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

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
}

impl Idempotency {
    pub(super) fn new(root: &str, queue: &str, window: Duration) -> Idempotency {
        Idempotency {
            dir: format!("{root}/idempotency/{queue}"),
            window,
            holds_records: AtomicBool::new(false),
            listed_at: Mutex::new(None),
        }
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
}

/// A message name waiting to be written into its record.
struct NameWrite {
    path: String,
    data: Vec<u8>,
    /// The version the put's transaction left the record at.
    version: i32,
}

/// The names of stored messages, written into their records in batches after the puts answered
/// (one per process, shared by its queues). Best effort: a name that could not be written (zkq
/// stopped, the connection dropped, the record was renewed since) is found by its zxid.
pub(super) struct RecordNames {
    session: ZkSession,
    pending: Mutex<Vec<NameWrite>>,
    flush: Notify,
}

impl RecordNames {
    pub(super) fn new(session: ZkSession) -> RecordNames {
        RecordNames { session, pending: Mutex::new(Vec::new()), flush: Notify::new() }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<NameWrite>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, write: NameWrite) {
        let mut pending = self.pending();
        if pending.len() >= MAX_PENDING_NAMES {
            pending.remove(0);
        }
        pending.push(write);
        let (first, full) = (pending.len() == 1, pending.len() >= NAME_BATCH);
        drop(pending);
        if first || full {
            self.flush.notify_one();
        }
    }

    /// Writes pending names, a batch at most [`NAME_FLUSH_AFTER`] after its first, until the
    /// session is closed (shutdown writes the last ones with [`RecordNames::flush_now`]).
    pub(super) async fn run_flusher(&self) {
        let mut status = self.session.subscribe();
        loop {
            tokio::select! {
                changed = status.changed() => {
                    if changed.is_err() || status.borrow_and_update().state == ConnectionState::Closed {
                        return;
                    }
                    continue;
                },
                _ = self.flush.notified() => {},
            }
            if self.pending().len() < NAME_BATCH {
                tokio::time::sleep(NAME_FLUSH_AFTER).await;
            }
            self.flush_now().await;
        }
    }

    /// Writes the names pending now (those arriving meanwhile wait for the next flush): one
    /// `setData`, or one transaction per [`NAME_BATCH`]; a write whose record changed since is
    /// dropped and the rest sent again.
    pub(super) async fn flush_now(&self) {
        let mut pending = std::mem::take(&mut *self.pending());
        while !pending.is_empty() {
            let rest = pending.split_off(pending.len().min(NAME_BATCH));
            let mut batch = std::mem::replace(&mut pending, rest);
            let Some(zk) = self.session.current() else { return };
            let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
            while !batch.is_empty() {
                let written = match batch.as_slice() {
                    [one] => zk
                        .set_data(&one.path, &one.data, Some(one.version))
                        .await
                        .map(|_| ())
                        .map_err(|error| TxnError { index: Some(0), error }),
                    many => {
                        let ops: Vec<TxnOp> = many
                            .iter()
                            .map(|w| TxnOp::SetData {
                                path: w.path.clone(),
                                data: w.data.clone(),
                                version: Some(w.version),
                            })
                            .collect();
                        zk.multi(&ops).await.map(|_| ())
                    },
                };
                match written {
                    Ok(()) => break,
                    // Renewed or swept since: that record needs no name from us.
                    Err(err) if matches!(err.error, ZkError::BadVersion | ZkError::NoNode) => match err.index {
                        Some(index) if index < batch.len() => {
                            batch.remove(index);
                        },
                        _ => break,
                    },
                    Err(err) => {
                        tracing::debug!(error = %err.error, names = batch.len(),
                            "could not record message names of idempotency keys; replays will look them up");
                        break;
                    },
                }
            }
        }
    }
}

/// A put with a valid idempotency key, fingerprinted.
pub(super) struct KeyedPut {
    key: String,
    /// The record's node name.
    hash: String,
    fingerprint: String,
}

/// What a keyed put found in ZooKeeper for its key.
pub(super) enum KeyCheck {
    /// An earlier put with this key stored its message within the window.
    Replay(PutReceipt),
    /// The key is free: the put goes on and writes its record with its message.
    Fresh(FreshKey),
}

/// A keyed put whose key was free when last read.
pub(super) struct FreshKey {
    keyed: KeyedPut,
    free: Free,
}

/// A free key: no record, or one the next put takes over.
#[derive(Debug, Clone)]
enum Free {
    /// No record: the put creates it.
    Absent,
    /// An expired (or unreadable) record at `version`: the put renews it in place. `entry` is its
    /// index entry, deleted in the same transaction as a fence against a sweeper (`None` when the
    /// record does not name one, or it proved missing).
    Expired { version: i32, entry: Option<String> },
}

/// What ZooKeeper holds for a key.
enum Found {
    Live(Record, NodeStat),
    Free(Free),
}

/// The operations a keyed put adds to the transaction that creates its message, and what they
/// write (see [`Queue::put_keyed`] for the steps around them).
pub(super) struct RecordWrite {
    /// Put these in front of the message's create, in this order.
    pub(super) ops: Vec<TxnOp>,
    /// Directories the ops may find missing (created like Curator would, then the transaction
    /// runs again), by index within `ops`.
    pub(super) parents: Vec<(usize, String)>,
    /// Index (within `ops`) of the op that fails when the index entry of the record being renewed
    /// is gone.
    fence: Option<usize>,
    path: String,
    record: Record,
    /// The record's version once the transaction applied.
    version: i32,
    started: Instant,
}

/// What the evidence says about a keyed put whose answer was lost.
pub(super) enum Written {
    /// Our record is there: the message was stored.
    Applied(Record, NodeStat),
    NotApplied,
    Unknown,
}

/// The fingerprint of what a put stores: SHA-256 over the body, the priority and the id (the
/// delivery time is left out: a relative `delay` differs at every retry).
fn fingerprint(body: &[u8], options: &PutOptions) -> String {
    let mut hash = Sha256::new();
    hash.update(b"zkq-put-1\0");
    hash.update((body.len() as u64).to_be_bytes());
    hash.update(body);
    match options.priority {
        Some(priority) => {
            hash.update(b"p");
            hash.update(priority.to_be_bytes());
        },
        None => hash.update(b"-"),
    }
    match &options.id {
        Some(id) => {
            hash.update(b"i");
            hash.update((id.len() as u64).to_be_bytes());
            hash.update(id.as_bytes());
        },
        None => hash.update(b"-"),
    }
    hex(&hash.finalize())
}

fn key_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    hex(digest.get(..16).unwrap_or(&digest))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bucket (its end, epoch ms, as a node name) of a record expiring at `expires_at`.
fn bucket_of(expires_at: i64) -> String {
    let end = (expires_at.max(0) / BUCKET_MS).saturating_add(1).saturating_mul(BUCKET_MS);
    format!("{end:015}")
}

/// The end (epoch ms) a bucket's name says; `None` for foreign names.
fn bucket_end(name: &str) -> Option<i64> {
    if name.len() != 15 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The name a transaction gave the sequential node it created under `prefix`.
fn created_name<'a>(results: &'a [TxnResult], prefix: &str) -> Option<&'a str> {
    results.iter().find_map(|r| match r {
        TxnResult::Created(path) if path.starts_with(prefix) => path.rsplit('/').next(),
        _ => None,
    })
}

impl Queue {
    /// Checks a put's key and fingerprints what the put stores.
    pub(super) fn keyed_put(&self, key: &str, body: &[u8], options: &PutOptions) -> Result<KeyedPut, QueueError> {
        if !is_valid_key(key.as_bytes()) {
            return Err(QueueError::InvalidParameter(format!(
                "Idempotency-Key must be 1 to {MAX_KEY_LEN} bytes of visible ASCII (! to ~)"
            )));
        }
        Ok(KeyedPut { key: key.to_owned(), hash: key_hash(key), fingerprint: fingerprint(body, options) })
    }

    /// Checks the key of a put before anything waits or is written. On a queue with `max_items`
    /// the record is read first: an earlier put with the key within the window is answered (a
    /// replay, or 409 for another body) without waiting for room. Elsewhere the put goes on at
    /// once and its transaction's create of the record is the check ([`Queue::check_again`]).
    pub(super) async fn check_key(
        &self,
        key: &str,
        body: &[u8],
        options: &PutOptions,
        deadline: Instant,
    ) -> Result<KeyCheck, QueueError> {
        let keyed = self.keyed_put(key, body, options)?;
        if self.max_items.is_none() {
            // Optimistic: the transaction's create of the record is the check (a replay costs a
            // failed transaction and a read instead of every put costing a read). A queue with
            // max_items reads first, so that a replay never waits for room.
            return Ok(KeyCheck::Fresh(FreshKey { keyed, free: Free::Absent }));
        }
        let zk = self.session.connected(deadline).await?;
        match self.look_up(&zk, &keyed).await? {
            Found::Live(record, stat) => Ok(KeyCheck::Replay(self.replay(&zk, &keyed, record, stat, deadline).await?)),
            Found::Free(free) => Ok(KeyCheck::Fresh(FreshKey { keyed, free })),
        }
    }

    /// Reads the key's record.
    async fn look_up(&self, zk: &Zk, keyed: &KeyedPut) -> Result<Found, ZkError> {
        let path = self.idempotency.record_path(&keyed.hash);
        let (data, stat) = match zk.get_data(&path).await {
            Ok(found) => found,
            Err(ZkError::NoNode) => return Ok(Found::Free(Free::Absent)),
            Err(err) => return Err(err),
        };
        Ok(match Record::parse(&data) {
            Some(record) if record.expires_at > now_epoch_ms() => Found::Live(record, stat),
            Some(record) => Found::Free(Free::Expired {
                version: stat.version,
                entry: Some(self.idempotency.entry_path(&record.bucket, &keyed.hash))
                    .filter(|_| bucket_end(&record.bucket).is_some()),
            }),
            None => {
                tracing::warn!(queue = %self.name, record = %path, "an idempotency record does not parse; the key is taken over");
                Found::Free(Free::Expired { version: stat.version, entry: None })
            },
        })
    }

    /// Answers a put whose key has a live record: the original message (a replay), or 409 when
    /// the record is of another body (or of another key with the same hash).
    async fn replay(
        &self,
        zk: &Zk,
        keyed: &KeyedPut,
        record: Record,
        stat: NodeStat,
        deadline: Instant,
    ) -> Result<PutReceipt, QueueError> {
        if record.key != keyed.key || record.fingerprint != keyed.fingerprint {
            self.qm.idempotent_conflicts.inc();
            let what = if record.key == keyed.key {
                "with a different body, priority or id"
            } else {
                "by another key with the same hash"
            };
            return Err(QueueError::IdempotencyKeyReused(format!(
                "this Idempotency-Key was used {what} on queue {:?} within its idempotency window \
                 ({}); use a new key for a new message",
                self.name,
                humantime::format_duration(self.idempotency.window)
            )));
        }
        let message_id = self.name_of(zk, &keyed.hash, record, stat, deadline, true).await?;
        self.qm.idempotent_replays.inc();
        Ok(PutReceipt { message_id, replay: true })
    }

    /// The message name a record stands for: the one it holds, else (the put that wrote it has
    /// not recorded it yet, or never will) the message created by the same transaction, found by
    /// its zxid. `None` when that message is gone. `wait`: give the put in flight up to
    /// [`NAME_WAIT`] to record the name first.
    async fn name_of(
        &self,
        zk: &Zk,
        hash: &str,
        mut record: Record,
        mut stat: NodeStat,
        deadline: Instant,
        wait: bool,
    ) -> Result<Option<String>, ZkError> {
        let path = self.idempotency.record_path(hash);
        let waited_until = (Instant::now() + NAME_WAIT).min(deadline);
        while wait && record.message_id.is_none() && Instant::now() < waited_until {
            let (data, latest, watch) = match zk.get_and_watch_data(&path).await {
                Ok(read) => read,
                Err(ZkError::NoNode) => break,
                Err(err) => return Err(err),
            };
            match Record::parse(&data) {
                Some(latest_record) if latest_record.token == record.token => {
                    (record, stat) = (latest_record, latest);
                    if record.message_id.is_some() {
                        break;
                    }
                },
                _ => break, // renewed or replaced: look for the message of what we read
            }
            tokio::select! {
                _ = watch.changed() => {},
                _ = tokio::time::sleep_until(waited_until) => break,
            }
        }
        if let Some(name) = record.message_id.filter(|name| names::is_item_name(self.kind, name)) {
            return Ok(Some(name));
        }
        let found = self.find_created(zk, stat.mzxid).await?;
        if let Some(name) = &found {
            // Later replays need no search; a newer record (another version) is left alone.
            let named = Record { message_id: Some(name.clone()), ..record };
            let _ = zk.set_data(&path, &named.to_bytes(), Some(stat.version)).await;
        }
        Ok(found)
    }

    /// The child of the queue created by transaction `zxid`: a binary search over the children
    /// sorted by their sequence suffix (the server hands suffixes out in the order it orders
    /// transactions, so their czxids ascend with them), one `exists` per probe. Nodes split from a
    /// putMulti node (named, not sequential) are left out.
    async fn find_created(&self, zk: &Zk, zxid: i64) -> Result<Option<String>, ZkError> {
        let children = match zk.get_children(&self.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(err),
        };
        let mut items: Vec<ItemName> = children
            .iter()
            .filter_map(|name| names::parse(self.kind, name))
            .filter(|item| item.sequence != i64::MAX && !names::is_split(&item.name))
            .collect();
        items.sort_by_key(|item| item.sequence);
        let (mut low, mut high) = (0, items.len());
        while low < high {
            let middle = low + (high - low) / 2;
            let Some(item) = items.get(middle) else { break };
            match zk.exists(&format!("{}/{}", self.path, item.name)).await? {
                None => {
                    items.remove(middle);
                    high -= 1;
                },
                Some(stat) if stat.czxid == zxid => return Ok(Some(item.name.clone())),
                Some(stat) if stat.czxid < zxid => low = middle + 1,
                Some(_) => high = middle,
            }
        }
        Ok(None)
    }

    /// The operations that write a keyed put's record (created, or renewed in place when the one
    /// found had expired) and its index entry; a fresh token each time.
    pub(super) fn record_write(&self, fresh: &FreshKey) -> RecordWrite {
        let FreshKey { keyed, free } = fresh;
        let started = Instant::now();
        let expires_at = now_epoch_ms().saturating_add(millis(self.idempotency.window));
        let record = Record {
            v: RECORD_FORMAT,
            key: keyed.key.clone(),
            fingerprint: keyed.fingerprint.clone(),
            expires_at,
            bucket: bucket_of(expires_at),
            token: format!("{:032x}", rand::random::<u128>()),
            message_id: None,
        };
        let path = self.idempotency.record_path(&keyed.hash);
        let bucket_dir = format!("{}/{}", self.idempotency.expiry_dir(), record.bucket);
        let entry = TxnOp::Create {
            path: self.idempotency.entry_path(&record.bucket, &keyed.hash),
            data: Vec::new(),
            mode: NodeMode::Persistent,
        };
        let (ops, parents, fence, version) = match free {
            Free::Absent => {
                let create = TxnOp::Create { path: path.clone(), data: record.to_bytes(), mode: NodeMode::Persistent };
                (vec![create, entry], vec![(0, self.idempotency.keys_dir()), (1, bucket_dir)], None, 0)
            },
            Free::Expired { version, entry: old_entry } => {
                let mut ops =
                    vec![TxnOp::SetData { path: path.clone(), data: record.to_bytes(), version: Some(*version) }];
                let fence = old_entry.as_ref().map(|old| {
                    ops.push(TxnOp::Delete { path: old.clone(), version: None });
                    ops.len() - 1
                });
                ops.push(entry);
                let entry_index = ops.len() - 1;
                (ops, vec![(entry_index, bucket_dir)], fence, version.saturating_add(1))
            },
        };
        RecordWrite { ops, parents, fence, path, record, version, started }
    }

    /// The step after the transaction of `write` applied and created the message `name`: the
    /// record learns the name soon, in a batch with others (versioned: a record renewed since is
    /// left alone; best effort, as a record without a name is resolved by its zxid), the cache and
    /// the counter learn of the message now.
    pub(super) fn committed(&self, write: &RecordWrite, name: Option<&str>) -> PutReceipt {
        self.idempotency.holds_records.store(true, Ordering::SeqCst);
        if let Some(name) = name {
            let named = Record { message_id: Some(name.to_owned()), ..write.record.clone() };
            self.record_names.push(NameWrite {
                path: write.path.clone(),
                data: named.to_bytes(),
                version: write.version,
            });
        }
        PutReceipt { message_id: name.map(|name| self.stored(name)), replay: false }
    }

    /// Whether the transaction of `write`, whose answer was lost, applied: after a `sync`, our
    /// record (its token) is there or not.
    pub(super) async fn written(&self, write: &RecordWrite, deadline: Instant) -> Written {
        let Ok(zk) = self.session.connected(deadline).await else { return Written::Unknown };
        match zk.sync(&write.path).await {
            Ok(()) | Err(ZkError::NoNode) => {},
            Err(_) => return Written::Unknown,
        }
        let mine = match zk.get_data(&write.path).await {
            Ok((data, stat)) => Record::parse(&data).filter(|r| r.token == write.record.token).map(|r| (r, stat)),
            Err(ZkError::NoNode) => None,
            Err(_) => return Written::Unknown,
        };
        match mine {
            Some((record, stat)) => Written::Applied(record, stat),
            // Within half a window our record cannot have expired and been replaced or swept
            // (allowing for clocks half a window apart): not there means not applied.
            None if write.started.elapsed() < self.idempotency.window / 2 => Written::NotApplied,
            None => Written::Unknown,
        }
    }

    /// The answer to a put whose lost transaction did apply: its message, found by the record's
    /// zxid (the record cannot name it yet).
    pub(super) async fn applied(
        &self,
        fresh: &FreshKey,
        record: Record,
        stat: NodeStat,
        deadline: Instant,
    ) -> Result<PutReceipt, QueueError> {
        self.idempotency.holds_records.store(true, Ordering::SeqCst);
        let zk = self.session.connected(deadline).await?;
        let name = self.name_of(&zk, &fresh.keyed.hash, record, stat, deadline, false).await?;
        Ok(PutReceipt { message_id: name.map(|name| self.stored(&name)), replay: false })
    }

    /// Reads the key again after the transaction of `write` failed on one of its record's
    /// operations (`failed`, an index within `write.ops`): another put with this key, or a
    /// sweeper, got there first. A replay now, or free again.
    pub(super) async fn check_again(
        &self,
        fresh: FreshKey,
        write: &RecordWrite,
        failed: &TxnError,
        deadline: Instant,
    ) -> Result<KeyCheck, QueueError> {
        let zk = self.session.connected(deadline).await?;
        // The winner may have written through another server.
        match zk.sync(&write.path).await {
            Ok(()) | Err(ZkError::NoNode) => {},
            Err(err) => return Err(err.into()),
        }
        let fence_missing = failed.error == ZkError::NoNode && failed.index.is_some() && failed.index == write.fence;
        let FreshKey { keyed, free: before } = fresh;
        let free = match self.look_up(&zk, &keyed).await? {
            Found::Live(record, stat) => {
                return Ok(KeyCheck::Replay(self.replay(&zk, &keyed, record, stat, deadline).await?));
            },
            // The record is unchanged but its index entry is gone (removed by hand): renew
            // without the fence; the versioned write still guards the record.
            Found::Free(Free::Expired { version, .. })
                if fence_missing && matches!(before, Free::Expired { version: seen, .. } if seen == version) =>
            {
                Free::Expired { version, entry: None }
            },
            Found::Free(free) => free,
        };
        Ok(KeyCheck::Fresh(FreshKey { keyed, free }))
    }

    /// Stores a keyed put's message with its record, in one transaction. Another put with the
    /// same key that wins the race makes this one a replay; a lost answer is resolved by the
    /// record's token and, if it did not apply, the transaction is sent once more.
    ///
    /// A put of several messages does the same per keyed message: [`Queue::record_write`]'s ops
    /// go in front of each message's create, [`Queue::committed`] runs after the commit,
    /// [`Queue::written`] and [`Queue::applied`] settle a lost answer, [`Queue::check_again`]
    /// follows a failure at one of the record's ops.
    pub(super) async fn put_keyed(
        &self,
        mut fresh: FreshKey,
        prefix: &str,
        data: &[u8],
        mut deadline: Instant,
    ) -> Result<PutReceipt, QueueError> {
        let mut retried_lost = false;
        for _ in 0..MAX_ATTEMPTS {
            let zk = self.session.connected(deadline).await?;
            let write = self.record_write(&fresh);
            let message_index = write.ops.len();
            let mut ops = write.ops.clone();
            ops.push(TxnOp::Create {
                path: prefix.to_owned(),
                data: data.to_vec(),
                mode: NodeMode::PersistentSequential,
            });
            let mut parents = write.parents.clone();
            parents.push((message_index, self.path.clone()));
            let failed = match self.apply_txn(&zk, &ops, &parents).await {
                Ok(results) => return Ok(self.committed(&write, created_name(&results, prefix))),
                Err(err) => err,
            };
            match failed.error {
                ZkError::OutcomeUnknown => {
                    // The evidence gets its own request timeout, as a claim's does.
                    deadline = deadline.max(Instant::now() + self.session.request_timeout());
                    match self.written(&write, deadline).await {
                        Written::Applied(record, stat) => return self.applied(&fresh, record, stat, deadline).await,
                        // Nothing was stored: send it once more, else say so (a retry is safe).
                        Written::NotApplied if !retried_lost => retried_lost = true,
                        Written::NotApplied => return Err(ZkError::Unavailable.into()),
                        Written::Unknown => {
                            self.qm.put_outcome_unknown.inc();
                            return Err(ZkError::OutcomeUnknown.into());
                        },
                    }
                },
                ZkError::NodeExists | ZkError::BadVersion | ZkError::NoNode
                    if failed.index.is_some_and(|index| index < message_index) => {},
                other => return Err(other.into()),
            }
            fresh = match self.check_again(fresh, &write, &failed, deadline).await? {
                KeyCheck::Replay(receipt) => return Ok(receipt),
                KeyCheck::Fresh(fresh) => fresh,
            };
        }
        Err(ZkError::Unavailable.into())
    }

    /// Deletes expired records of this queue, in batches: every period (a tenth of the window,
    /// between 1 s and 1 min) while records may exist, else every [`IDLE_CHECK`].
    pub(in crate::queue) async fn run_idempotency_sweeper(self: std::sync::Arc<Self>, stop: CancellationToken) {
        let period = (self.idempotency.window / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let queue = &self;
        self.session
            .periodically(period, &stop, |zk| async move {
                if !queue.idempotency.sweep_due() {
                    return;
                }
                match queue.sweep_records(&zk).await {
                    Ok(0) => {},
                    Ok(n) => tracing::debug!(queue = %queue.name, swept = n, "swept expired idempotency records"),
                    Err(err) => tracing::debug!(queue = %queue.name, error = %err, "idempotency sweep failed"),
                }
            })
            .await;
    }

    /// One sweep: the buckets whose end has passed, oldest first.
    async fn sweep_records(&self, zk: &Zk) -> Result<usize, ZkError> {
        let buckets = match zk.get_children(&self.idempotency.expiry_dir()).await {
            Ok((buckets, _)) => buckets,
            Err(ZkError::NoNode) => Vec::new(),
            Err(err) => return Err(err),
        };
        *self.idempotency.listed_at() = Some(Instant::now());
        self.idempotency.holds_records.store(!buckets.is_empty(), Ordering::SeqCst);
        let now = now_epoch_ms();
        let mut due: Vec<(i64, String)> = buckets
            .into_iter()
            .filter_map(|b| bucket_end(&b).map(|end| (end, b)))
            .filter(|(end, _)| *end <= now)
            .collect();
        due.sort();
        let mut swept = 0;
        for (_, bucket) in due {
            swept += self.sweep_bucket(zk, &bucket, now).await?;
        }
        Ok(swept)
    }

    /// Deletes the records of one expired bucket with their entries, then the bucket.
    async fn sweep_bucket(&self, zk: &Zk, bucket: &str, now: i64) -> Result<usize, ZkError> {
        let bucket_path = format!("{}/{bucket}", self.idempotency.expiry_dir());
        let hashes = match zk.get_children(&bucket_path).await {
            Ok((hashes, _)) => hashes,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(err),
        };
        let mut swept = 0;
        for chunk in hashes.chunks(SWEEP_BATCH) {
            let paths: Vec<String> = chunk.iter().map(|hash| self.idempotency.record_path(hash)).collect();
            let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
            let reads = zk.get_data_many(&refs).await?;
            // Each group is deleted whole or not at all; `true`: it deletes a record.
            let mut groups: Vec<(Vec<TxnOp>, bool)> = Vec::with_capacity(chunk.len());
            for ((hash, path), read) in chunk.iter().zip(&paths).zip(reads) {
                let entry = TxnOp::Delete { path: self.idempotency.entry_path(bucket, hash), version: None };
                match read {
                    Err(ZkError::NoNode) => groups.push((vec![entry], false)),
                    Err(err) => return Err(err),
                    Ok((data, stat)) => match Record::parse(&data) {
                        // Renewed since (its entry is in a later bucket): only this entry goes.
                        Some(record) if record.expires_at > now && record.bucket != bucket => {
                            groups.push((vec![entry], false));
                        },
                        Some(record) if record.expires_at > now => {},
                        _ => groups.push((
                            vec![TxnOp::Delete { path: path.clone(), version: Some(stat.version) }, entry],
                            true,
                        )),
                    },
                }
            }
            swept += self.delete_groups(zk, groups).await?;
        }
        // Empty now, unless a group lost a race: the next sweep finds it again.
        match zk.delete(&bucket_path, None).await {
            Ok(()) | Err(ZkError::NoNode | ZkError::NotEmpty) => {},
            Err(err) => return Err(err),
        }
        Ok(swept)
    }

    /// Deletes `groups` in one transaction; a group that fails (a put renewed its record, or
    /// another sweeper was first) is dropped and the rest tried again.
    async fn delete_groups(&self, zk: &Zk, mut groups: Vec<(Vec<TxnOp>, bool)>) -> Result<usize, ZkError> {
        while !groups.is_empty() {
            let ops: Vec<TxnOp> = groups.iter().flat_map(|(ops, _)| ops.iter().cloned()).collect();
            match zk.multi(&ops).await {
                Ok(_) => {
                    let swept = groups.iter().filter(|(_, record)| *record).count();
                    self.qm.idempotency_records_swept.inc_by(swept as u64);
                    return Ok(swept);
                },
                Err(err) if matches!(err.error, ZkError::NoNode | ZkError::BadVersion) => {
                    let Some(index) = err.index else { return Ok(0) };
                    let mut first = 0;
                    let failed = groups.iter().position(|(ops, _)| {
                        first += ops.len();
                        index < first
                    });
                    match failed {
                        Some(group) => {
                            groups.remove(group);
                        },
                        None => return Ok(0),
                    }
                },
                Err(err) => return Err(err.error),
            }
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_two_hundred_bytes_of_visible_ascii() {
        assert!(is_valid_key(b"order-42"));
        assert!(is_valid_key(b"!~"));
        assert!(is_valid_key(&[b'k'; 200]));
        for bad in [&b""[..], &[b'k'; 201], b"a b", b"tab\there", b"caf\xc3\xa9", b"\x7f", b"new\nline"] {
            assert!(!is_valid_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn fingerprints_tell_bodies_priorities_and_ids_apart_but_not_delays() {
        let plain = PutOptions::default();
        let base = fingerprint(b"body", &plain);
        assert_eq!(base, fingerprint(b"body", &plain));
        assert_eq!(base.len(), 64);
        assert_ne!(base, fingerprint(b"body2", &plain));
        assert_ne!(base, fingerprint(b"body", &PutOptions { priority: Some(0), ..PutOptions::default() }));
        assert_ne!(base, fingerprint(b"body", &PutOptions { id: Some(String::new()), ..PutOptions::default() }));
        assert_eq!(base, fingerprint(b"body", &PutOptions { deliver_at: Some(5), ..PutOptions::default() }));
        // The length prefix keeps body and fields apart.
        assert_ne!(
            fingerprint(b"p", &PutOptions::default()),
            fingerprint(b"", &PutOptions { priority: Some(0), ..PutOptions::default() })
        );
    }

    #[test]
    fn record_names_are_stable_hex_hashes_of_the_key() {
        // SHA-256("abc") starts ba7816bf8f01cfea414140de5dae2223.
        assert_eq!(key_hash("abc"), "ba7816bf8f01cfea414140de5dae2223");
        assert_ne!(key_hash("abc"), key_hash("abd"));
    }

    #[test]
    fn buckets_end_after_their_records_expire_and_sort_by_name() {
        assert_eq!(bucket_of(1_732_370_000_000), "001732370001000");
        assert_eq!(bucket_of(1_732_370_000_999), "001732370001000");
        assert_eq!(bucket_end(&bucket_of(1_732_370_000_500)), Some(1_732_370_001_000));
        assert!(bucket_of(999) < bucket_of(1_000));
        for foreign in ["", "12", "00173237000100x", "0017323700010000", "é"] {
            assert_eq!(bucket_end(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn records_round_trip_and_anything_else_does_not_parse() {
        let record = Record {
            v: RECORD_FORMAT,
            key: "k".into(),
            fingerprint: "f".into(),
            expires_at: 7,
            bucket: bucket_of(7),
            token: "t".into(),
            message_id: None,
        };
        assert_eq!(Record::parse(&record.to_bytes()), Some(record.clone()));
        let named = Record { message_id: Some("queue-0000000001".into()), ..record };
        assert_eq!(Record::parse(&named.to_bytes()), Some(named.clone()));
        let future = Record { v: 2, ..named };
        assert_eq!(Record::parse(&future.to_bytes()), None, "an unknown format is not trusted");
        for garbage in [&b""[..], b"{}", b"\xff\x00", b"[1,2]", b"{\"v\":1}"] {
            assert_eq!(Record::parse(garbage), None);
        }
    }
}
