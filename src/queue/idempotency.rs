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
//! A put goes to ZooKeeper as one unit of group commit ([`GroupCommit`](crate::zk::GroupCommit)):
//! for each keyed message, the ops that create its record (or renew an expired one) and its index
//! entry, then the message's create; a message without a key, its create alone. The unit is
//! applied all or none, possibly in one multi with other puts' units. The message's name is known
//! only once the multi has answered (the server appends the sequence), so the record cannot hold
//! it yet: a versioned `setData` writes it next, through group commit as well (so the names of
//! puts in flight together go in one transaction), and the put answers only once it applied. A
//! client that got 201 therefore gets the same id from every replay, also after the message was
//! consumed; a put whose name could not be written in time answers 504. A record without a name
//! (zkq died between the two steps, or could not write it in time) is resolved among the nodes
//! created by the transaction whose zxid is the record's `mzxid` (every operation of a multi has
//! the same zxid): the one with the record's content (a hash of the node's name prefix and data), and of
//! `copies` identical nodes in the record's unit, the `copy`-th in sequence order. After a lost
//! answer the put knows more: group commit tells it where its creates stood among all the
//! multi's identical creates ([`Twins`]), so identical messages of other puts in the same multi
//! are told apart too. A replay after a crash between the steps knows only the record's unit: an
//! identical node another put stored in the same multi leaves the name untold. A message consumed
//! before it is found has no name left to tell. Either way the answer says so
//! (`message_id: null`), never guesses.
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
//!   replaced, and the put answers `outcome_unknown`. Reads that fail on a dropped connection are
//!   asked again once reconnected, until the request's deadline (then 503: they wrote nothing).
//! - A put answers 201 only once its record names its message (or, after a lost answer, once the
//!   name proved impossible to tell).
//! - A record counts until its `expires_at` (the writer's clock), whether swept or not; a lookup
//!   treats an expired record as absent and the next put with its key renews it in place.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::names::{self, ItemName};
use super::ops::{PutOptions, PutReceipt};
use super::{Queue, QueueError, now_epoch_ms};
use crate::zk::{NodeMode, NodeStat, Refusal, Twins, TxnOp, TxnResult, Zk, ZkError};

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
/// another zkq wrote and could not sweep, because it stopped), and how often each process sweeps
/// the records of queues it does not have open.
pub(super) const IDLE_CHECK: Duration = Duration::from_secs(600);
/// Queues one pass of the sweep of queues not open here looks at, at most (a random run of them
/// when there are more: every one is reached over the passes).
const ORPHANS_PER_PASS: usize = 100;
/// Children of `{root}/idempotency` listed at most (more would not fit one ZooKeeper answer).
const MAX_ORPHAN_LIST: i32 = 50_000;
/// Transactions one keyed put sends at most (races with other puts of the same key, and the one
/// retry after a lost answer that did not apply).
const MAX_ATTEMPTS: usize = 4;
/// The largest unit a keyed put sends, estimated as its paths and data plus [`OP_OVERHEAD`] per
/// operation: ZooKeeper answers a request over `jute.maxbuffer` (1 MiB by default) by dropping the
/// connection, which every request in flight on it would pay for.
const MAX_UNIT_BYTES: usize = 960 * 1024;
/// Headers and ACLs of one operation of a transaction, at most (an estimate with room to spare).
const OP_OVERHEAD: usize = 64;
/// How long after a put found a used key the queue's keyed puts read their records first.
const READ_FIRST_AFTER_REPLAY: Duration = Duration::from_secs(1);
/// Nodes read at most while looking for those one transaction created (a unit holds at most
/// 1,000 ops; the rest allows for nodes consumed since).
const MAX_BLOCK_READS: usize = 2_048;

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
    /// The message among the nodes its transaction created ([`Copy`]): the hash of its node's
    /// name prefix and data, and which of its unit's identical nodes it is.
    content: String,
    copy: u32,
    copies: u32,
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
    /// When a put of this queue last found a key used (a replay or a 409).
    replayed_at: Mutex<Option<Instant>>,
}

impl Idempotency {
    pub(super) fn new(root: &str, queue: &str, window: Duration) -> Idempotency {
        Idempotency {
            dir: format!("{root}/idempotency/{queue}"),
            window,
            holds_records: AtomicBool::new(false),
            listed_at: Mutex::new(None),
            replayed_at: Mutex::new(None),
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

    fn replayed_at(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.replayed_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether puts of this queue found used keys lately: then puts read their records first.
    fn replaying(&self) -> bool {
        self.replayed_at().is_some_and(|at| at.elapsed() < READ_FIRST_AFTER_REPLAY)
    }
}

/// A put with a valid idempotency key, fingerprinted.
pub(super) struct KeyedPut {
    key: String,
    /// The record's node name.
    hash: String,
    fingerprint: String,
}

/// One message of a put as its create sends it: the server appends the sequence to `prefix`.
#[derive(Debug, Clone)]
pub(super) struct NodeCreate {
    /// The node name's prefix (`queue-`, `queue-{priority}-`, …), relative to the queue node.
    pub(super) prefix: String,
    pub(super) data: Vec<u8>,
}

/// A keyed message whose key was free when last read.
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

/// Where one message of a put stands.
enum Slot {
    /// No key: stored with the others, nothing to check.
    Plain,
    /// A key free when last read: the message goes with its record's ops.
    Fresh(FreshKey),
    /// Answered (a replay, or stored).
    Done(PutReceipt),
}

/// The message among those one transaction created: the hash of its node (name prefix and data),
/// and which of the `copies` identical nodes of its unit it is (in the order of the unit's ops).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Copy {
    content: String,
    copy: u32,
    copies: u32,
}

/// The operations a keyed message adds in front of its create, and what they write.
struct RecordWrite {
    /// In front of the message's create, in this order.
    ops: Vec<TxnOp>,
    /// Directories the ops may find missing (created like Curator would, then the unit goes
    /// again), by index within `ops`.
    parents: Vec<(usize, String)>,
    /// Index (within `ops`) of the op that fails when the index entry of the record being renewed
    /// is gone.
    fence: Option<usize>,
    path: String,
    record: Record,
    /// The record's version once the transaction applied.
    version: i32,
    started: Instant,
}

/// One message of a unit: where its ops are.
struct Member {
    /// Index of the message in the put.
    slot: usize,
    /// Its first op (a record's, or the create) and its create, within the unit.
    first_op: usize,
    create_op: usize,
    /// The record's ops of a keyed message.
    write: Option<RecordWrite>,
    copy: Copy,
}

/// The messages of a put still to store, as one unit of group commit: each keyed message's
/// record ops, then its create; a message without a key, its create.
struct Unit {
    ops: Vec<TxnOp>,
    /// Creates whose parent may be missing: (index within `ops`, directory).
    parents: Vec<(usize, String)>,
    members: Vec<Member>,
}

impl Unit {
    /// The directory a create at `index` needs.
    fn parent_of(&self, index: usize) -> Option<&str> {
        self.parents.iter().find(|(at, _)| *at == index).map(|(_, dir)| dir.as_str())
    }

    /// The keyed message one of whose record's ops is at `index`.
    fn record_of(&self, index: usize) -> Option<&Member> {
        self.members.iter().find(|m| m.write.is_some() && (m.first_op..m.create_op).contains(&index))
    }

    /// What the unit adds to a request, estimated: paths, data and [`OP_OVERHEAD`] per operation.
    fn size(&self) -> usize {
        self.ops
            .iter()
            .map(|op| {
                OP_OVERHEAD
                    + match op {
                        TxnOp::Create { path, data, .. } | TxnOp::SetData { path, data, .. } => path.len() + data.len(),
                        TxnOp::Delete { path, .. } | TxnOp::Check { path, .. } => path.len(),
                    }
            })
            .sum()
    }

    /// A record whose token tells whether the unit applied (they all share its fate).
    fn evidence(&self) -> Option<&RecordWrite> {
        self.members.iter().find_map(|m| m.write.as_ref())
    }
}

/// A keyed message whose unit was refused at one of its record's ops.
#[derive(Debug, Clone, Copy)]
struct Refused {
    slot: usize,
    /// The op was the fence: the index entry of the expired record being renewed is gone.
    fence_missing: bool,
}

/// What the evidence says about a unit whose answer was lost.
enum Written {
    /// Our record is there: the unit applied.
    Applied(NodeStat),
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

/// The hash of a node as a put creates it: its name's prefix (without the sequence) and its data.
fn content_of(prefix: &str, data: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(b"zkq-node-1\0");
    hash.update((prefix.len() as u64).to_be_bytes());
    hash.update(prefix.as_bytes());
    hash.update(data);
    let digest = hash.finalize();
    hex(digest.get(..16).unwrap_or(&digest))
}

/// The prefix a sequential node's name was created with: the name without its 10-digit sequence.
fn created_prefix(name: &str) -> Option<&str> {
    let cut = name.len().checked_sub(10)?;
    let (prefix, sequence) = (name.get(..cut)?, name.get(cut..)?);
    sequence.bytes().all(|b| b.is_ascii_digit()).then_some(prefix)
}

/// The name `copy` stands for among `block` (the nodes one transaction created, in sequence order,
/// with their contents): the `copy`-th node of its content when exactly `copies` such are there;
/// `None` when fewer are (consumed since) or more (another put stored the same node in that
/// transaction, and `copy` counts only its own unit's), as the name cannot be told then.
fn pick(block: &[(String, String)], copy: &Copy) -> Option<String> {
    let same: Vec<&String> =
        block.iter().filter(|(_, content)| *content == copy.content).map(|(name, _)| name).collect();
    if same.len() != usize::try_from(copy.copies).unwrap_or(usize::MAX) {
        return None;
    }
    same.get(usize::try_from(copy.copy).unwrap_or(usize::MAX)).map(|name| (*name).clone())
}

/// The name of the node a unit's create at `index` created.
fn created_name(results: &[TxnResult], index: usize) -> Option<String> {
    match results.get(index)? {
        TxnResult::Created(path) => path.rsplit('/').next().map(str::to_owned),
        _ => None,
    }
}

/// The answers of a put whose every message is answered.
fn receipts(slots: Vec<Slot>) -> Vec<PutReceipt> {
    slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Done(receipt) => receipt,
            // Never reached: every slot is answered before the receipts are gathered.
            Slot::Plain | Slot::Fresh(_) => PutReceipt { message_id: None, replay: false },
        })
        .collect()
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

    /// Stores the messages of a put of which some carry a key (`keys[i]` is that of `creates[i]`)
    /// all or none, as one unit of group commit that also writes each key's record. A message
    /// whose key was used within the window is not stored again: its receipt is the earlier
    /// message's, marked as a replay; a key used with another body refuses the whole put (409,
    /// nothing stored).
    ///
    /// On a queue with `max_items` the records are read first, so that a replay never waits for
    /// room; so they are for a second after a put of the queue found a used key (retries come in
    /// bursts, and each replay in a shared transaction would cost the others a round trip).
    /// Elsewhere the unit's creates of the records are the check: a unit refused at one of its
    /// records' ops (another put with that key, in this process or another, or a sweeper got there
    /// first) reads its keys again and goes once more without its replays. A lost answer is
    /// settled by a record's token: applied, the names are found by the transaction's zxid; not
    /// applied, the unit is sent once more. The put answers once each record names its message.
    /// Reads (and the creation of missing directories) that fail on a dropped connection are made
    /// again once reconnected, until `deadline`: then 503, as they wrote nothing.
    pub(super) async fn put_keyed(
        &self,
        creates: Vec<NodeCreate>,
        keys: Vec<Option<KeyedPut>>,
        wait: Duration,
        mut deadline: Instant,
    ) -> Result<Vec<PutReceipt>, QueueError> {
        let contents: Vec<String> = creates.iter().map(|c| content_of(&c.prefix, &c.data)).collect();
        let mut slots: Vec<Slot> = keys
            .into_iter()
            .map(|keyed| match keyed {
                Some(keyed) => Slot::Fresh(FreshKey { keyed, free: Free::Absent }),
                None => Slot::Plain,
            })
            .collect();
        if self.max_items.is_some() || self.idempotency.replaying() {
            self.check_keys(&mut slots, None, deadline).await?;
            let count = slots.iter().filter(|slot| !matches!(slot, Slot::Done(_))).count();
            if count > 0 {
                self.wait_for_room(count, wait).await?;
            }
        }
        let (mut retried_lost, mut races, mut parents_made) = (false, 0, 0);
        loop {
            if slots.iter().all(|slot| matches!(slot, Slot::Done(_))) {
                return Ok(receipts(slots));
            }
            let zk = self.session.connected(deadline).await?;
            let unit = self.unit(&creates, &contents, &slots);
            let size = unit.size();
            if size > MAX_UNIT_BYTES {
                return Err(QueueError::TransactionTooLarge { size, max: MAX_UNIT_BYTES });
            }
            let (failed, twins) = match self.group.submit_twins(&self.background, &zk, unit.ops.clone()).await {
                Ok(results) => {
                    let names = unit.members.iter().map(|m| created_name(&results, m.create_op)).collect();
                    return self.unit_stored(unit, names, slots).await;
                },
                Err(Refusal { error, twins }) => (error, twins),
            };
            // A lost session may have taken the answer of a transaction it sent with it: a record's
            // token tells.
            let lost_session = failed.error == ZkError::SessionLost && unit.evidence().is_some();
            if failed.error == ZkError::OutcomeUnknown || lost_session {
                // The evidence gets its own request timeout, as a claim's does.
                deadline = deadline.max(Instant::now() + self.session.request_timeout());
                let written = match unit.evidence() {
                    Some(write) => self.written(write, deadline).await,
                    None => Written::Unknown,
                };
                match written {
                    Written::Applied(stat) => {
                        let names = self.names_created_by(&unit, &twins, stat.mzxid, deadline).await;
                        return self.unit_stored(unit, names, slots).await;
                    },
                    Written::NotApplied if !retried_lost => {
                        retried_lost = true;
                        continue;
                    },
                    // Nothing was stored: say so (a retry is safe).
                    Written::NotApplied => return Err(ZkError::Unavailable.into()),
                    Written::Unknown => {
                        self.qm.put_outcome_unknown.inc();
                        return Err(ZkError::OutcomeUnknown.into());
                    },
                }
            }
            let Some(index) = failed.index else { return Err(failed.error.into()) };
            if failed.error == ZkError::NoNode
                && parents_made <= unit.parents.len()
                && let Some(dir) = unit.parent_of(index)
            {
                // A directory (the queue node, the records', a bucket) is missing: made the way
                // Curator makes parents, then the unit goes again.
                self.session.retrying(deadline, |zk| async move { zk.ensure_path(dir).await }).await?;
                parents_made += 1;
                continue;
            }
            let refused = match unit.record_of(index) {
                Some(member) if matches!(failed.error, ZkError::NodeExists | ZkError::BadVersion | ZkError::NoNode) => {
                    let fence = member.write.as_ref().and_then(|w| w.fence).map(|fence| member.first_op + fence);
                    Refused {
                        slot: member.slot,
                        fence_missing: failed.error == ZkError::NoNode && fence == Some(index),
                    }
                },
                _ => return Err(failed.error.into()),
            };
            races += 1;
            if races > MAX_ATTEMPTS {
                return Err(ZkError::Unavailable.into());
            }
            self.check_keys(&mut slots, Some(refused), deadline).await?;
        }
    }

    /// The unit of the messages not answered yet, with their records' ops (fresh tokens).
    fn unit(&self, creates: &[NodeCreate], contents: &[String], slots: &[Slot]) -> Unit {
        let sending = |slot: &Slot| !matches!(slot, Slot::Done(_));
        let mut copies: HashMap<&str, u32> = HashMap::new();
        for (_, content) in slots.iter().zip(contents).filter(|(slot, _)| sending(slot)) {
            *copies.entry(content.as_str()).or_default() += 1;
        }
        let mut seen: HashMap<&str, u32> = HashMap::new();
        let mut unit = Unit { ops: Vec::new(), parents: Vec::new(), members: Vec::new() };
        for (index, ((slot, create), content)) in slots.iter().zip(creates).zip(contents).enumerate() {
            if !sending(slot) {
                continue;
            }
            let copy = seen.entry(content.as_str()).or_default();
            let copy = Copy {
                content: content.clone(),
                copy: std::mem::replace(copy, copy.saturating_add(1)),
                copies: copies.get(content.as_str()).copied().unwrap_or(1),
            };
            let first_op = unit.ops.len();
            let write = match slot {
                Slot::Fresh(fresh) => {
                    let write = self.record_write(fresh, &copy);
                    unit.ops.extend(write.ops.iter().cloned());
                    unit.parents.extend(write.parents.iter().map(|(at, dir)| (first_op + at, dir.clone())));
                    Some(write)
                },
                Slot::Plain | Slot::Done(_) => None,
            };
            let create_op = unit.ops.len();
            unit.ops.push(TxnOp::Create {
                path: format!("{}/{}", self.path, create.prefix),
                data: create.data.clone(),
                mode: NodeMode::PersistentSequential,
            });
            unit.parents.push((create_op, self.path.clone()));
            unit.members.push(Member { slot: index, first_op, create_op, write, copy });
        }
        unit
    }

    /// The receipts of a unit that applied, its messages named `names` (in the order of its
    /// members), once each record holds its message's name ([`Queue::record_name`], all at once,
    /// within a request timeout): a replay then answers the same id, also after the message was
    /// consumed. The cache and the counter learn of the messages at once, as they are stored
    /// whatever happens next; a name that could not be written in time answers 504
    /// `outcome_unknown` (a retry with the key replays: the message is found by its zxid).
    async fn unit_stored(
        &self,
        unit: Unit,
        names: Vec<Option<String>>,
        mut slots: Vec<Slot>,
    ) -> Result<Vec<PutReceipt>, QueueError> {
        if unit.evidence().is_some() {
            self.idempotency.holds_records.store(true, Ordering::SeqCst);
        }
        let mut writes = Vec::new();
        for (member, name) in unit.members.iter().zip(names) {
            let message_id = name.map(|name| self.stored(&name));
            if let (Some(write), Some(name)) = (&member.write, &message_id) {
                writes.push((write, name.clone()));
            }
            if let Some(slot) = slots.get_mut(member.slot) {
                *slot = Slot::Done(PutReceipt { message_id, replay: false });
            }
        }
        let deadline = Instant::now() + self.session.request_timeout();
        let named =
            futures::future::join_all(writes.iter().map(|(write, name)| self.record_name(write, name, deadline))).await;
        if let Some(err) = named.into_iter().find_map(Result::err) {
            tracing::warn!(queue = %self.name, error = %err,
                "stored a keyed message but could not write its name into its key's record in time; answering 504");
            self.qm.put_outcome_unknown.inc();
            return Err(match err {
                err if err.is_transient() => ZkError::OutcomeUnknown,
                err => err,
            }
            .into());
        }
        Ok(receipts(slots))
    }

    /// Writes `name` into the record `write` left, at the version that transaction left it (so
    /// never over a newer record), through group commit: the names of puts in flight together go
    /// in one transaction. A write whose answer was lost is sent again; one refused because the
    /// record moved on is checked: named already (our lost write applied, or a replay found the
    /// name), or no longer ours (renewed or removed since), there is nothing left to write.
    async fn record_name(&self, write: &RecordWrite, name: &str, deadline: Instant) -> Result<(), ZkError> {
        let mut version = write.version;
        let mut pause = Duration::from_millis(10);
        loop {
            let named = Record { message_id: Some(name.to_owned()), ..write.record.clone() };
            let op = TxnOp::SetData { path: write.path.clone(), data: named.to_bytes(), version: Some(version) };
            let zk = self.session.connected(deadline).await?;
            let error = match self.group.submit(&self.background, &zk, vec![op]).await {
                Ok(_) => return Ok(()),
                Err(err) => err.error,
            };
            match error {
                ZkError::BadVersion | ZkError::NoNode => {
                    let path = write.path.as_str();
                    let read = self
                        .session
                        .retrying(deadline, |zk| async move {
                            match zk.get_data(path).await {
                                Ok((data, stat)) => Ok(Some((Record::parse(&data), stat))),
                                Err(ZkError::NoNode) => Ok(None),
                                Err(err) => Err(err),
                            }
                        })
                        .await?;
                    match read {
                        // Ours, and still without a name (it cannot be, but writing it is right).
                        Some((Some(record), stat))
                            if record.token == write.record.token && record.message_id.is_none() =>
                        {
                            version = stat.version;
                        },
                        _ => return Ok(()),
                    }
                },
                err if err.is_transient() => {
                    if Instant::now() >= deadline {
                        return Err(err);
                    }
                    tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                },
                err => return Err(err),
            }
        }
    }

    /// The names of a unit's messages after its answer was lost and its record showed it applied
    /// in transaction `zxid`: found among the nodes that transaction created, by content and, among
    /// identical ones, by the rank group commit reported (`twins`, per op of the unit: the server
    /// names sequential nodes in the order of the operations). A name that cannot be told (the
    /// message consumed since, or ZooKeeper not answering until `deadline`) is `None`: stored,
    /// name unknown.
    async fn names_created_by(&self, unit: &Unit, twins: &Twins, zxid: i64, deadline: Instant) -> Vec<Option<String>> {
        let block = self.session.retrying(deadline, |zk| async move { self.created_by(&zk, zxid).await }).await;
        let block = block.unwrap_or_else(|err| {
            tracing::debug!(queue = %self.name, error = %err, "could not find the names of messages stored by a lost answer");
            Vec::new()
        });
        unit.members
            .iter()
            .map(|member| {
                let copy = match twins.get(member.create_op) {
                    Some(&(copy, copies)) => Copy { content: member.copy.content.clone(), copy, copies },
                    None => member.copy.clone(),
                };
                pick(&block, &copy)
            })
            .collect()
    }

    /// Reads the records of the put's keys still free, all at once: a key used within the window
    /// makes its message a replay; used with another body (or by another key with the same hash),
    /// it refuses the whole put (409). After a unit was `refused`, a `sync` first: the winner may
    /// have written through another server. Reads lost with the connection are made again once
    /// reconnected, until `deadline`.
    async fn check_keys(
        &self,
        slots: &mut [Slot],
        refused: Option<Refused>,
        deadline: Instant,
    ) -> Result<(), QueueError> {
        let keys_dir = self.idempotency.keys_dir();
        let reading: &[Slot] = slots;
        let found = self
            .session
            .retrying(deadline, |zk| {
                let keys_dir = keys_dir.as_str();
                async move {
                    if refused.is_some() {
                        match zk.sync(keys_dir).await {
                            Ok(()) | Err(ZkError::NoNode) => {},
                            Err(err) => return Err(err),
                        }
                    }
                    let zk = &zk;
                    let found = futures::future::join_all(reading.iter().map(|slot| async move {
                        match slot {
                            Slot::Fresh(fresh) => self.look_up(zk, &fresh.keyed).await.map(Some),
                            Slot::Plain | Slot::Done(_) => Ok(None),
                        }
                    }))
                    .await;
                    found.into_iter().collect::<Result<Vec<Option<Found>>, ZkError>>()
                }
            })
            .await?;
        let mut live = Vec::new();
        let mut conflicts = Vec::new();
        for (index, (slot, found)) in slots.iter_mut().zip(found).enumerate() {
            let (Slot::Fresh(fresh), Some(found)) = (slot, found) else { continue };
            match found {
                Found::Live(record, stat) => match self.conflict(&fresh.keyed, &record) {
                    Some(what) => conflicts.push((index, what)),
                    None => live.push((index, record, stat)),
                },
                // The record is unchanged but its index entry is gone (removed by hand): renew
                // without the fence; the versioned write still guards the record.
                Found::Free(Free::Expired { version, .. })
                    if refused.is_some_and(|r| r.slot == index && r.fence_missing)
                        && matches!(fresh.free, Free::Expired { version: seen, .. } if seen == version) =>
                {
                    fresh.free = Free::Expired { version, entry: None };
                },
                Found::Free(free) => fresh.free = free,
            }
        }
        if !live.is_empty() || !conflicts.is_empty() {
            *self.idempotency.replayed_at() = Some(Instant::now());
        }
        if let Some((index, what)) = conflicts.first() {
            self.qm.idempotent_conflicts.inc_by(conflicts.len() as u64);
            let which = if slots.len() > 1 {
                format!("messages[{index}]: its idempotency key")
            } else {
                "this Idempotency-Key".to_owned()
            };
            return Err(QueueError::IdempotencyKeyReused(format!(
                "{which} was used {what} on queue {:?} within its idempotency window ({}); use a \
                 new key for a new message",
                self.name,
                humantime::format_duration(self.idempotency.window)
            )));
        }
        let replays = futures::future::join_all(live.into_iter().map(|(index, record, stat)| {
            let keyed = match slots.get(index) {
                Some(Slot::Fresh(fresh)) => Some(&fresh.keyed),
                _ => None,
            };
            async move {
                let Some(keyed) = keyed else { return (index, Ok(None)) };
                let hash = keyed.hash.as_str();
                let name = self
                    .session
                    .retrying(deadline, |zk| {
                        let record = record.clone();
                        async move { self.name_of(&zk, hash, record, stat, deadline, true).await }
                    })
                    .await;
                (index, name)
            }
        }))
        .await;
        for (index, message_id) in replays {
            let message_id = message_id?;
            self.qm.idempotent_replays.inc();
            if let Some(slot) = slots.get_mut(index) {
                *slot = Slot::Done(PutReceipt { message_id, replay: true });
            }
        }
        Ok(())
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

    /// How a live record differs from a put with its key, if it does: another body, priority or
    /// id (or another key with the same hash). The put is then refused (409).
    fn conflict(&self, keyed: &KeyedPut, record: &Record) -> Option<&'static str> {
        if record.key != keyed.key {
            Some("by another key with the same hash")
        } else if record.fingerprint != keyed.fingerprint {
            Some("with a different body, priority or id")
        } else {
            None
        }
    }

    /// The message name a record stands for: the one it holds, else (the put that wrote it has
    /// not recorded it yet, or never will) the node created by the same transaction with the
    /// record's content and copy, found by its zxid. `None` when that message is gone. `wait`:
    /// give the put in flight up to [`NAME_WAIT`] to record the name first.
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
        if let Some(name) = record.message_id.as_ref().filter(|name| names::is_item_name(self.kind, name)) {
            return Ok(Some(name.clone()));
        }
        let copy = Copy { content: record.content.clone(), copy: record.copy, copies: record.copies };
        let found = pick(&self.created_by(zk, stat.mzxid).await?, &copy);
        if let Some(name) = &found {
            // Later replays need no search; a newer record (another version) is left alone.
            let named = Record { message_id: Some(name.clone()), ..record };
            let _ = zk.set_data(&path, &named.to_bytes(), Some(stat.version)).await;
        }
        Ok(found)
    }

    /// The children of the queue created by transaction `zxid`, in sequence order, with their
    /// contents ([`content_of`]). A binary search over the children sorted by their sequence
    /// suffix (the server hands suffixes out in the order it applies operations, so their czxids
    /// ascend with them), one `exists` per probe, finds one; its neighbours with the same czxid
    /// are the rest (one transaction's nodes under one parent have adjacent sequences). Nodes
    /// split from a putMulti node (named, not sequential) are left out.
    async fn created_by(&self, zk: &Zk, zxid: i64) -> Result<Vec<(String, String)>, ZkError> {
        let children = match zk.get_children(&self.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(err),
        };
        let mut items: Vec<ItemName> = children
            .iter()
            .filter_map(|name| names::parse(self.kind, name))
            .filter(|item| item.sequence != i64::MAX && !names::is_split(&item.name))
            .collect();
        items.sort_by_key(|item| item.sequence);
        let (mut low, mut high) = (0, items.len());
        let mut found = None;
        while low < high {
            let middle = low + (high - low) / 2;
            let Some(item) = items.get(middle) else { break };
            match zk.exists(&format!("{}/{}", self.path, item.name)).await? {
                None => {
                    items.remove(middle);
                    high -= 1;
                },
                Some(stat) if stat.czxid == zxid => {
                    found = Some(middle);
                    break;
                },
                Some(stat) if stat.czxid < zxid => low = middle + 1,
                Some(_) => high = middle,
            }
        }
        let Some(found) = found else { return Ok(Vec::new()) };
        let mut block = std::collections::VecDeque::new();
        let mut reads = 0;
        for item in items.iter().take(found + 1).rev() {
            match self.created_node(zk, item, zxid, &mut reads).await? {
                Some(Some(node)) => block.push_front(node),
                Some(None) => {}, // gone: its neighbours may still be ours
                None => break,
            }
        }
        for item in items.iter().skip(found + 1) {
            match self.created_node(zk, item, zxid, &mut reads).await? {
                Some(Some(node)) => block.push_back(node),
                Some(None) => {},
                None => break,
            }
        }
        Ok(block.into())
    }

    /// Reads `item` for [`Queue::created_by`]: `Some(Some((name, content)))` when transaction
    /// `zxid` created it, `Some(None)` when it is gone, `None` when another transaction created it
    /// (or [`MAX_BLOCK_READS`] were made: the search ends there).
    async fn created_node(
        &self,
        zk: &Zk,
        item: &ItemName,
        zxid: i64,
        reads: &mut usize,
    ) -> Result<Option<Option<(String, String)>>, ZkError> {
        *reads += 1;
        if *reads > MAX_BLOCK_READS {
            return Ok(None);
        }
        match zk.get_data(&format!("{}/{}", self.path, item.name)).await {
            Err(ZkError::NoNode) => Ok(Some(None)),
            Err(err) => Err(err),
            Ok((data, stat)) if stat.czxid == zxid => {
                Ok(Some(created_prefix(&item.name).map(|prefix| (item.name.clone(), content_of(prefix, &data)))))
            },
            Ok(_) => Ok(None),
        }
    }

    /// The operations that write a keyed message's record (created, or renewed in place when the
    /// one found had expired) and its index entry; a fresh token each time.
    fn record_write(&self, fresh: &FreshKey, copy: &Copy) -> RecordWrite {
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
            content: copy.content.clone(),
            copy: copy.copy,
            copies: copy.copies,
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

    /// Whether the unit holding `write`, whose answer was lost, applied: after a `sync`, our
    /// record (its token) is there or not. Asked again after every transient failure until
    /// `deadline`.
    async fn written(&self, write: &RecordWrite, deadline: Instant) -> Written {
        let path = write.path.as_str();
        let token = write.record.token.as_str();
        let mine = self
            .session
            .retrying(deadline, |zk| async move {
                match zk.sync(path).await {
                    Ok(()) | Err(ZkError::NoNode) => {},
                    Err(err) => return Err(err),
                }
                match zk.get_data(path).await {
                    Ok((data, stat)) => Ok(Record::parse(&data).filter(|r| r.token == token).map(|_| stat)),
                    Err(ZkError::NoNode) => Ok(None),
                    Err(err) => Err(err),
                }
            })
            .await;
        match mine {
            Ok(Some(stat)) => Written::Applied(stat),
            // Within half a window our record cannot have expired and been replaced or swept
            // (allowing for clocks half a window apart; the window is at least 10 s): not there
            // means not applied. The read ended before this check, so the rule holds for it too.
            Ok(None) if write.started.elapsed() < self.idempotency.window / 2 => Written::NotApplied,
            Ok(None) | Err(_) => Written::Unknown,
        }
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
                let mut swept = 0;
                let result = queue.idempotency.sweep(&zk, &mut swept).await;
                queue.qm.idempotency_records_swept.inc_by(swept as u64);
                match result {
                    Ok(()) if swept == 0 => {},
                    Ok(()) => tracing::debug!(queue = %queue.name, swept, "swept expired idempotency records"),
                    Err(err) => tracing::debug!(queue = %queue.name, error = %err, "idempotency sweep failed"),
                }
            })
            .await;
    }
}

impl Idempotency {
    /// One sweep: the buckets whose end has passed, oldest first. Counts the records it deleted
    /// into `swept`, also when it fails part way.
    pub(super) async fn sweep(&self, zk: &Zk, swept: &mut usize) -> Result<(), ZkError> {
        let buckets = match zk.get_children(&self.expiry_dir()).await {
            Ok((buckets, _)) => buckets,
            Err(ZkError::NoNode) => Vec::new(),
            Err(err) => return Err(err),
        };
        *self.listed_at() = Some(Instant::now());
        self.holds_records.store(!buckets.is_empty(), Ordering::SeqCst);
        let now = now_epoch_ms();
        let mut due: Vec<(i64, String)> = buckets
            .into_iter()
            .filter_map(|b| bucket_end(&b).map(|end| (end, b)))
            .filter(|(end, _)| *end <= now)
            .collect();
        due.sort();
        for (_, bucket) in due {
            self.sweep_bucket(zk, &bucket, now, swept).await?;
        }
        Ok(())
    }

    /// Deletes the records of one expired bucket with their entries, then the bucket.
    async fn sweep_bucket(&self, zk: &Zk, bucket: &str, now: i64, swept: &mut usize) -> Result<(), ZkError> {
        let bucket_path = format!("{}/{bucket}", self.expiry_dir());
        let hashes = match zk.get_children(&bucket_path).await {
            Ok((hashes, _)) => hashes,
            Err(ZkError::NoNode) => return Ok(()),
            Err(err) => return Err(err),
        };
        for chunk in hashes.chunks(SWEEP_BATCH) {
            let paths: Vec<String> = chunk.iter().map(|hash| self.record_path(hash)).collect();
            let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
            let reads = zk.get_data_many(&refs).await?;
            // Each group is deleted whole or not at all; `true`: it deletes a record.
            let mut groups: Vec<(Vec<TxnOp>, bool)> = Vec::with_capacity(chunk.len());
            for ((hash, path), read) in chunk.iter().zip(&paths).zip(reads) {
                let entry = TxnOp::Delete { path: self.entry_path(bucket, hash), version: None };
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
            *swept += delete_groups(zk, groups).await?;
        }
        // Empty now, unless a group lost a race: the next sweep finds it again.
        match zk.delete(&bucket_path, None).await {
            Ok(()) | Err(ZkError::NoNode | ZkError::NotEmpty) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

/// Deletes `groups` in one transaction; a group that fails (a put renewed its record, or another
/// sweeper was first) is dropped and the rest tried again. Answers how many records went.
async fn delete_groups(zk: &Zk, mut groups: Vec<(Vec<TxnOp>, bool)>) -> Result<usize, ZkError> {
    while !groups.is_empty() {
        let ops: Vec<TxnOp> = groups.iter().flat_map(|(ops, _)| ops.iter().cloned()).collect();
        match zk.multi(&ops).await {
            Ok(_) => return Ok(groups.iter().filter(|(_, record)| *record).count()),
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

/// One pass over the queues under `{root}/idempotency` that this process does not have open
/// (`is_open`): each one's expired records are swept, as its own sweeper would if it were open.
/// So records of a dynamic queue nobody opens again do not stay forever. Cheap and bounded: one
/// `exists` and one child list of `{root}/idempotency` (skipped past [`MAX_ORPHAN_LIST`]
/// children), then at most [`ORPHANS_PER_PASS`] queues (a run starting at random when there are
/// more), each with its own request timeout; a queue without due buckets costs one child list.
/// Many processes doing this at once stay safe: every delete is fenced like the sweeper's (by the
/// record's version and its index entry). Answers how many records went.
pub(super) async fn sweep_queues_not_open(
    zk: &Zk,
    root: &str,
    request_timeout: Duration,
    is_open: impl Fn(&str) -> bool,
    stop: &CancellationToken,
) -> Result<usize, ZkError> {
    let dir = format!("{root}/idempotency");
    let zk_now = zk.with_deadline(Instant::now() + request_timeout);
    match zk_now.exists(&dir).await? {
        None => return Ok(0),
        Some(stat) if stat.num_children > MAX_ORPHAN_LIST => {
            tracing::warn!(dir = %dir, queues = stat.num_children,
                "too many queues hold idempotency records to look for those no zkq has open; their own sweepers still run");
            return Ok(0);
        },
        Some(_) => {},
    }
    let mut queues: Vec<String> = match zk_now.get_children(&dir).await {
        Ok((queues, _)) => queues.into_iter().filter(|queue| !is_open(queue)).collect(),
        Err(ZkError::NoNode) => return Ok(0),
        Err(err) => return Err(err),
    };
    queues.sort();
    if queues.len() > ORPHANS_PER_PASS {
        let start = rand::random_range(0..queues.len());
        queues.rotate_left(start);
        queues.truncate(ORPHANS_PER_PASS);
    }
    let mut swept = 0;
    for queue in queues {
        if stop.is_cancelled() {
            break;
        }
        // The window only matters to puts; the sweep reads each record's own expiry.
        let records = Idempotency::new(root, &queue, Duration::ZERO);
        let zk = zk.with_deadline(Instant::now() + request_timeout);
        if let Err(err) = records.sweep(&zk, &mut swept).await {
            tracing::debug!(queue = %queue, error = %err, "sweep of the idempotency records of a queue not open here failed");
        }
    }
    Ok(swept)
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
            content: content_of("queue-", b"x"),
            copy: 0,
            copies: 1,
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

    #[test]
    fn a_node_is_known_by_its_name_prefix_and_data() {
        assert_eq!(created_prefix("queue-0000000042"), Some("queue-"));
        assert_eq!(created_prefix("queue-5-0000000042"), Some("queue-5-"));
        for foreign in ["", "000000004", "queue-00000000x2", "xé000000004"] {
            assert_eq!(created_prefix(foreign), None, "{foreign:?}");
        }
        let base = content_of("queue-", b"body");
        assert_eq!(base.len(), 32);
        assert_ne!(base, content_of("queue-1-", b"body"), "another priority is another node");
        assert_ne!(base, content_of("queue-", b"body2"));
        // The length prefix keeps name and data apart.
        assert_ne!(content_of("queue-a", b"b"), content_of("queue-", b"ab"));
    }

    #[test]
    fn identical_nodes_of_one_transaction_are_told_apart_by_their_order_while_all_are_there() {
        let (a, b) = (content_of("queue-", b"a"), content_of("queue-", b"b"));
        let block: Vec<(String, String)> =
            [("queue-0000000010", &a), ("queue-0000000011", &b), ("queue-0000000012", &a)]
                .into_iter()
                .map(|(name, content)| (name.to_owned(), content.clone()))
                .collect();
        let of = |content: &String, copy, copies| Copy { content: content.clone(), copy, copies };
        assert_eq!(pick(&block, &of(&b, 0, 1)).as_deref(), Some("queue-0000000011"));
        assert_eq!(pick(&block, &of(&a, 0, 2)).as_deref(), Some("queue-0000000010"));
        assert_eq!(pick(&block, &of(&a, 1, 2)).as_deref(), Some("queue-0000000012"));
        // Another unit stored the same node, or one of ours was consumed: not told apart.
        assert_eq!(pick(&block, &of(&a, 0, 1)), None);
        assert_eq!(pick(&block, &of(&a, 2, 3)), None);
        assert_eq!(pick(&block, &of(&content_of("queue-", b"c"), 0, 1)), None);
        assert_eq!(pick(&[], &of(&b, 0, 1)), None);
    }
}
