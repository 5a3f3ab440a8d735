//! The keyed put: each keyed message goes to ZooKeeper with the ops that create its key's record
//! (or renew an expired one) and its index entry, in one unit of group commit
//! ([`GroupCommit`](crate::zk::GroupCommit)) with its create; a message without a key, its create
//! alone. The unit is applied all or none, possibly in one multi with other puts' units. ZooKeeper's
//! `create` of the record is the arbiter: of two puts with the same key, in one process or in two,
//! only one succeeds; the other reads the record and replays its message (or, with another body,
//! refuses the put: 409). The message's name is written into the record after the transaction
//! answered, and a lost answer is settled by the record's token (`recovery.rs`).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::record::{Copy, MAX_KEY_LEN, Record, bucket_end, content_of, fingerprint, is_valid_key, key_hash, millis};
use crate::queue::QueueError;
use crate::queue::message::{NodeCreate, PutOptions, PutReceipt};
use crate::queue::put::Puts;
use crate::types::now_epoch_ms;
use crate::zk::{NodeMode, NodeStat, Refusal, TxnOp, TxnResult, Zk, ZkError};

/// Transactions one keyed put sends at most (races with other puts of the same key, and the one
/// retry after a lost answer that did not apply).
const MAX_ATTEMPTS: usize = 4;

/// Who waits for a keyed put's answer (its request's handler, while it has not left).
pub(in crate::queue) type KeyedCaller = tokio::sync::oneshot::Sender<Result<Vec<PutReceipt>, QueueError>>;

/// A put with a valid idempotency key, fingerprinted.
pub(in crate::queue) struct KeyedPut {
    key: String,
    /// The record's node name.
    hash: String,
    fingerprint: String,
    /// The key alone decides ([`PutOptions::key_alone`]): another fingerprint is no conflict.
    key_alone: bool,
}

/// What the evidence says about a unit whose answer was lost (`recovery.rs` reads it).
pub(super) enum Written {
    /// Our record is there: the unit applied.
    Applied(NodeStat),
    NotApplied,
    Unknown,
}

/// A keyed message whose key was free when last read.
pub(in crate::queue) struct FreshKey {
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
pub(super) enum Slot {
    /// No key: stored with the others, nothing to check.
    Plain,
    /// A key free when last read: the message goes with its record's ops.
    Fresh(FreshKey),
    /// Answered (a replay, or stored).
    Done(PutReceipt),
}

/// The operations a keyed message adds in front of its create, and what they write.
pub(super) struct RecordWrite {
    /// In front of the message's create, in this order.
    ops: Vec<TxnOp>,
    /// Directories the ops may find missing (created like Curator would, then the unit goes
    /// again), by index within `ops`.
    parents: Vec<(usize, String)>,
    /// Index (within `ops`) of the op that fails when the index entry of the record being renewed
    /// is gone.
    fence: Option<usize>,
    pub(super) path: String,
    pub(super) record: Record,
    /// The record's version once the transaction applied.
    pub(super) version: i32,
    pub(super) started: Instant,
}

/// One message of a unit: where its ops are.
pub(super) struct Member {
    /// Index of the message in the put.
    pub(super) slot: usize,
    /// Its first op (a record's, or the create) and its create, within the unit.
    first_op: usize,
    pub(super) create_op: usize,
    /// The record's ops of a keyed message.
    pub(super) write: Option<RecordWrite>,
    pub(super) copy: Copy,
}

/// The messages of a put still to store, as one unit of group commit: each keyed message's
/// record ops, then its create; a message without a key, its create.
pub(super) struct Unit {
    ops: Vec<TxnOp>,
    /// Creates whose parent may be missing: (index within `ops`, directory).
    parents: Vec<(usize, String)>,
    pub(super) members: Vec<Member>,
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

    /// A record whose token tells whether the unit applied (they all share its fate).
    pub(super) fn evidence(&self) -> Option<&RecordWrite> {
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

/// The name of the node a unit's create at `index` created.
fn created_name(results: &[TxnResult], index: usize) -> Option<String> {
    match results.get(index)? {
        TxnResult::Created(path) => path.rsplit('/').next().map(str::to_owned),
        _ => None,
    }
}

/// The answers of a put whose every message is answered.
pub(super) fn receipts(slots: Vec<Slot>) -> Vec<PutReceipt> {
    slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Done(receipt) => receipt,
            // Never reached: every slot is answered before the receipts are gathered.
            Slot::Plain | Slot::Fresh(_) => PutReceipt { message_id: None, replay: false },
        })
        .collect()
}

impl Puts {
    /// Checks a put's key and fingerprints what the put stores.
    pub(in crate::queue) fn keyed_put(
        &self,
        key: &str,
        body: &[u8],
        options: &PutOptions,
    ) -> Result<KeyedPut, QueueError> {
        if !is_valid_key(key.as_bytes()) {
            return Err(QueueError::InvalidParameter(format!(
                "Idempotency-Key must be 1 to {MAX_KEY_LEN} bytes of visible ASCII (! to ~)"
            )));
        }
        // A scoped key is its scope's: the same key in another scope is another key.
        let key = match &options.key_scope {
            Some(scope) => format!("{scope}:{key}"),
            None => key.to_owned(),
        };
        Ok(KeyedPut {
            hash: key_hash(&key),
            key,
            fingerprint: fingerprint(body, options),
            key_alone: options.key_alone,
        })
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
    ///
    /// It runs to its end whatever the request does (see `Puts::put_keyed_detached`), answering
    /// `caller`. Once
    /// the caller left, it stops wherever nothing of its own is stored (waiting for room, or
    /// before sending a unit: each attempt before has been refused or found not applied, so
    /// nothing is lost); a unit sent is carried to its end.
    pub(in crate::queue) async fn put_keyed(
        &self,
        creates: Vec<NodeCreate>,
        keys: Vec<Option<KeyedPut>>,
        wait: Duration,
        mut deadline: Instant,
        caller: &mut KeyedCaller,
    ) -> Result<Vec<PutReceipt>, QueueError> {
        let contents: Vec<String> = creates.iter().map(|c| content_of(&c.prefix, &c.data)).collect();
        let mut slots: Vec<Slot> = keys
            .into_iter()
            .map(|keyed| match keyed {
                Some(keyed) => Slot::Fresh(FreshKey { keyed, free: Free::Absent }),
                None => Slot::Plain,
            })
            .collect();
        if self.ctx.max_items.is_some() || self.idempotency.replaying() {
            self.check_keys(&mut slots, None, deadline).await?;
            let count = slots.iter().filter(|slot| !matches!(slot, Slot::Done(_))).count();
            if count > 0 {
                tokio::select! {
                    room = self.wait_for_room(count, wait) => room?,
                    () = caller.closed() => return Err(ZkError::Unavailable.into()),
                }
            }
        }
        let (mut retried_lost, mut races, mut parents_made) = (false, 0, 0);
        loop {
            if slots.iter().all(|slot| matches!(slot, Slot::Done(_))) {
                return Ok(receipts(slots));
            }
            if caller.is_closed() {
                return Err(ZkError::Unavailable.into());
            }
            let zk = self.ctx.session.connected(deadline).await?;
            let unit = self.unit(&creates, &contents, &slots);
            // The unit's own request, encoded as this session sends it (ACLs, chroot): group commit
            // joins it to other units only within its batch limit, and ZooKeeper answers a request
            // over its limit by dropping the connection, which every request in flight would pay for.
            let size = zk.request_bytes(&unit.ops);
            if size > zk.max_request_bytes() {
                return Err(QueueError::TransactionTooLarge { size, max: zk.max_request_bytes() });
            }
            let (failed, twins) = match self.ctx.group.submit_twins(&self.ctx.background, &zk, unit.ops.clone()).await {
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
                deadline = deadline.max(Instant::now() + self.ctx.session.request_timeout());
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
                        self.ctx.qm.put_outcome_unknown.inc();
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
                self.ctx
                    .session
                    .retrying(deadline, |zk| async move {
                        if dir == self.ctx.path { self.create_queue_node(&zk).await } else { zk.ensure_path(dir).await }
                    })
                    .await?;
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
                path: format!("{}/{}", self.ctx.path, create.prefix),
                data: create.data.clone(),
                mode: NodeMode::PersistentSequential,
            });
            unit.parents.push((create_op, self.ctx.path.clone()));
            unit.members.push(Member { slot: index, first_op, create_op, write, copy });
        }
        unit
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
            .ctx
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
            self.ctx.qm.idempotent_conflicts.inc_by(conflicts.len() as u64);
            let which = if slots.len() > 1 {
                format!("messages[{index}]: its idempotency key")
            } else {
                "this Idempotency-Key".to_owned()
            };
            return Err(QueueError::IdempotencyKeyReused(format!(
                "{which} was used {what} on queue {:?} within its idempotency window ({}); use a \
                 new key for a new message",
                self.ctx.name,
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
                    .ctx
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
            self.ctx.qm.idempotent_replays.inc();
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
                tracing::warn!(queue = %self.ctx.name, record = %path, "an idempotency record does not parse; the key is taken over");
                Found::Free(Free::Expired { version: stat.version, entry: None })
            },
        })
    }

    /// How a live record differs from a put with its key, if it does: another body, priority or
    /// id, unless the key alone decides (or another key with the same hash). The put is then
    /// refused (409).
    fn conflict(&self, keyed: &KeyedPut, record: &Record) -> Option<&'static str> {
        if record.key != keyed.key {
            Some("by another key with the same hash")
        } else if record.fingerprint != keyed.fingerprint && !keyed.key_alone {
            Some("with a different body, priority or id")
        } else {
            None
        }
    }

    /// The operations that write a keyed message's record (created, or renewed in place when the
    /// one found had expired) and its index entry; a fresh token each time.
    fn record_write(&self, fresh: &FreshKey, copy: &Copy) -> RecordWrite {
        let FreshKey { keyed, free } = fresh;
        let started = Instant::now();
        let expires_at = now_epoch_ms().saturating_add(millis(self.idempotency.window));
        let token = format!("{:032x}", rand::random::<u128>());
        let record = Record::new(keyed.key.clone(), keyed.fingerprint.clone(), expires_at, token, copy);
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
}
