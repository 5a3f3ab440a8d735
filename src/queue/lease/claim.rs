//! Leasing a candidate: what the claim pipeline (`acquire/claim.rs`) sends for a lease.
//!
//! The read fetches the item and its delivery count together. The transaction creates Curator's
//! lock node (holding a claim id unique to this lease), checks that the item is unchanged, and
//! writes the new delivery count. A candidate that another consumer holds or has taken fails the
//! transaction as a whole: nothing is written and nothing is left behind. When the answer is
//! lost, the lock with our claim id is the evidence; if ZooKeeper cannot be asked in time, a
//! background task finds out and releases the lock if it was created.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::super::candidate::{Declined, Read};
use super::super::context::Context;
use super::super::context::SETTLE_RETRIES;
use super::super::names::ItemName;
use super::super::{Message, envelope};
use super::Leases;
use super::{
    FencingToken, Lease, LeaseGrant, OnExpiry, Receipt, counter_bytes, epoch_ms_after, lock_is_ours, read_counter,
    release_uncounted, uncount_op,
};
use crate::zk::{ConnectionState, NodeMode, NodeStat, TxnOp, Zk, ZkError};

/// Operation indexes of each candidate's operations in a lease's claim transaction: its lock,
/// the lock's first write (at 1, which makes it [`LOCK_VERSION`](super::LOCK_VERSION)), the version check of its node
/// (at 2), then its delivery count.
const LOCK_OP: usize = 0;
const COUNT_OP: usize = 3;

/// What a lease's claim writes besides the node: its lock and the delivery count.
pub(in crate::queue) struct LeaseClaim {
    lock: String,
    claim_id: Vec<u8>,
    counter: String,
    /// The new delivery count, and the version of the count node read (`None`: none yet).
    count: u32,
    counter_version: Option<i32>,
}

/// A candidate read and ready to lease: its claim operations (lock, check, count, the split of a
/// putMulti node, in this order) and what its lease holds once they applied.
pub(in crate::queue) struct LeasePrepared {
    pub(in crate::queue) candidate: ItemName,
    pub(in crate::queue) lock: String,
    pub(in crate::queue) claim_id: Vec<u8>,
    counter: String,
    /// The version of the delivery count read (`None`: there was none).
    counter_version: Option<i32>,
    /// The leased node's data (one item) and its version after the claim.
    data: Vec<u8>,
    /// The node's creation time (`ctime`, epoch ms), from the read the claim is based on.
    created_at_ms: i64,
    /// When the message was first delivered: its delivery count's creation (epoch ms), when it
    /// had one.
    first_delivered_at_ms: Option<i64>,
    data_version: i32,
    count: u32,
    pub(in crate::queue) body: Vec<u8>,
    pub(in crate::queue) ops: Vec<TxnOp>,
    split_items: Vec<ItemName>,
}

impl LeasePrepared {
    /// Parent directories a lease's transaction may find missing, by operation index (of its
    /// first candidate): the lock directory and the delivery counts' directory.
    pub(in crate::queue) fn parents(lock_dir: &str, deliveries: &str) -> Vec<(usize, String)> {
        vec![(LOCK_OP, lock_dir.to_owned()), (COUNT_OP, deliveries.to_owned())]
    }

    /// What the failure of its operation at `offset` says about the candidate; `None` when only
    /// its count changed since the read (read it again with a later claim).
    pub(in crate::queue) fn failed_at(offset: usize, error: &ZkError) -> Option<Declined> {
        match (error, offset) {
            // Another consumer holds its lock: watch it, offer it again when released.
            (ZkError::NodeExists, LOCK_OP) => Some(Declined::Locked),
            (_, COUNT_OP) => None,
            // Its version check (or a split's create) failed: taken or changed by someone else.
            _ => Some(Declined::Lost),
        }
    }
}

impl LeaseClaim {
    /// The operations that lease node `name` at `version` holding `items`: the lock with its
    /// claim id, the version check (for a putMulti node, the rewrite that keeps only the first
    /// item), the delivery count, and the creates that split the other items off right behind
    /// it; the split items; and the leased node's new data when it is rewritten.
    pub(in crate::queue) fn ops(
        &self,
        ctx: &Context,
        name: &str,
        items: &[Vec<u8>],
        version: i32,
    ) -> (Vec<TxnOp>, Vec<ItemName>, Option<Vec<u8>>) {
        let claim = self;
        let item_path = format!("{}/{name}", ctx.path);
        let (split_ops, split_items) = ctx.split_ops(name, items.get(1..).unwrap_or_default(), version);
        let (check, rewritten) = if split_ops.is_empty() {
            (TxnOp::Check { path: item_path, version }, None)
        } else {
            let first = envelope::encode(items.first().map(Vec::as_slice));
            (TxnOp::SetData { path: item_path, data: first.clone(), version: Some(version) }, Some(first))
        };
        let (counter, data) = (claim.counter.clone(), counter_bytes(claim.count));
        let count_op = match claim.counter_version {
            Some(version) => TxnOp::SetData { path: counter, data, version: Some(version) },
            None => TxnOp::Create { path: counter, data, mode: NodeMode::Persistent },
        };
        let mut ops = Vec::with_capacity(split_ops.len() + 4);
        ops.push(TxnOp::Create {
            path: claim.lock.to_owned(),
            data: claim.claim_id.to_vec(),
            mode: NodeMode::Ephemeral,
        });
        // Written once, so that only a lock zkq created has version LOCK_VERSION: every later
        // step deletes it only at that version, never a Curator consumer's lock of the same name.
        ops.push(TxnOp::SetData { path: claim.lock.to_owned(), data: claim.claim_id.to_vec(), version: Some(0) });
        ops.push(check);
        ops.push(count_op);
        ops.extend(split_ops);
        (ops, split_items, rewritten)
    }
}

impl Leases {
    /// A lease claim of node `name` as it would be written, for measuring its transaction before
    /// the node is split to fit (the count is a placeholder of the same size).
    pub(in crate::queue) fn lease_claim_template(
        &self,
        zk: &Zk,
        lock_dir: &str,
        name: &str,
        count: &Read,
    ) -> LeaseClaim {
        let counter_version = match count {
            Some(Ok((_, stat))) => Some(stat.version),
            _ => None,
        };
        LeaseClaim {
            lock: format!("{lock_dir}/{name}"),
            claim_id: self.table.claim_id(zk),
            counter: self.counter_path(name),
            count: 0,
            counter_version,
        }
    }

    /// Turns the reads of a candidate (its node, its delivery count) into its claim operations,
    /// or the claim's outcome when it cannot be leased: gone, undecodable, or moved to the
    /// dead-letter queue (poison, or undecodable when the queue has one).
    pub(in crate::queue) async fn prepare_lease(
        &self,
        zk: &Zk,
        lock_dir: &str,
        candidate: &ItemName,
        (data, stat): (Vec<u8>, NodeStat),
        count: Read,
    ) -> Result<Result<LeasePrepared, Declined>, ZkError> {
        let counter = self.counter_path(&candidate.name);
        let (previous, counter_version, first_delivered_at_ms) = match count {
            Some(Ok((bytes, stat))) => (read_counter(&bytes), Some(stat.version), Some(stat.ctime)),
            _ => (0, None, None),
        };
        let count = previous.saturating_add(1);
        let undecodable = self.ctx.kind != crate::config::QueueKind::Simple
            && !envelope::decode(&data).is_ok_and(|items| !items.is_empty());
        if let Some(dead_letter) = self.ctx.dead_letter_now()
            && (undecodable || dead_letter.max_deliveries.is_some_and(|max| count > max))
        {
            let counter = counter_version.map(|_| counter.as_str());
            return self.dead_letter(zk, candidate, &data, stat.version, counter, &dead_letter).await.map(Err);
        }
        let Some(mut items) = self.cache.items_of(&candidate.name, &data) else {
            return Ok(Err(Declined::Undecodable));
        };
        let claim_id = self.table.claim_id(zk);
        let lock = format!("{lock_dir}/{}", candidate.name);
        let claim = LeaseClaim { lock, claim_id, counter, count, counter_version };
        let (ops, split_items, rewritten) = claim.ops(&self.ctx, &candidate.name, &items, stat.version);
        let LeaseClaim { lock, claim_id, counter, counter_version, .. } = claim;
        // The leased node's data and version once the claim applied.
        let (data, data_version) = match rewritten {
            Some(first) => (first, stat.version + 1),
            None => (data, stat.version),
        };
        items.truncate(1);
        let body = items.pop().unwrap_or_default();
        Ok(Ok(LeasePrepared {
            candidate: candidate.clone(),
            lock,
            claim_id,
            counter,
            counter_version,
            data,
            created_at_ms: stat.ctime,
            first_delivered_at_ms,
            data_version,
            count,
            body,
            ops,
            split_items,
        }))
    }

    /// Books a claim that applied: the lease goes into the table, a split node's other items
    /// into the cache, and the client gets the message and its receipt.
    pub(in crate::queue) fn grant_lease(
        &self,
        zk: &Zk,
        prepared: LeasePrepared,
        visibility: Duration,
        (fencing_token, claimed_ms): (FencingToken, Option<i64>),
    ) -> (Message, LeaseGrant) {
        let LeasePrepared {
            candidate,
            lock,
            claim_id,
            counter,
            counter_version,
            data,
            created_at_ms,
            first_delivered_at_ms,
            data_version,
            count,
            body,
            split_items,
            ..
        } = prepared;
        let uncount = uncount_op(&counter, count, counter_version);
        for item in split_items {
            self.cache.insert_split(item);
        }
        let expires_at_ms = epoch_ms_after(visibility);
        let token = self.table.issue(zk.session_id());
        let grant = LeaseGrant {
            receipt: Receipt::new(zk.session_id(), token),
            expires_at_ms,
            delivery_count: count,
            created_at_ms,
            // A first delivery creates the count in the claim's own transaction.
            first_delivered_at_ms: first_delivered_at_ms
                .or(claimed_ms)
                .unwrap_or_else(|| epoch_ms_after(Duration::ZERO)),
            fencing_token,
        };
        let trailer = super::super::attributes::from_trailer(envelope::after_end(&data));
        let message = Message {
            message_id: candidate.name.clone(),
            body,
            meta: candidate.meta.clone(),
            attributes: trailer.attributes,
            traceparent: trailer.traceparent,
            deduplication_id: trailer.deduplication_id,
        };
        let lease = Lease {
            item: candidate,
            lock,
            claim_id,
            counter,
            uncount,
            zk: zk.clone(),
            data,
            data_version,
            delivery_count: count,
            expires_at: Instant::now() + visibility,
            on_expiry: OnExpiry::Release,
            open: true,
            turn: Arc::default(),
            unresolved: None,
        };
        self.table.lock().live.insert(token, lease);
        self.table.changed.notify_one();
        self.ctx.qm.leases_in_flight.inc();
        (message, grant)
    }

    /// Lease claims whose outcome is unknown: once ZooKeeper answers, release each lock the
    /// claim created (its claim id is the evidence), taking back the delivery count it wrote (no
    /// client received the message), and offer the items again. Owned by the queue's background
    /// tracker.
    pub(in crate::queue) fn release_unknown_claims_later(self: &Arc<Self>, zk: Zk, claims: Vec<LeasePrepared>) {
        let queue = self.clone();
        self.ctx.background.spawn(async move {
            let mut pause = SETTLE_RETRIES.retries();
            for LeasePrepared { lock, claim_id, candidate: item, counter, count, counter_version, .. } in claims {
                let uncount = uncount_op(&counter, count, counter_version);
                loop {
                    if queue.ctx.session.status().state == ConnectionState::Closed {
                        return; // the session is closed: the locks, if any, are gone with it
                    }
                    let zk = zk.with_deadline(Instant::now() + queue.ctx.session.request_timeout());
                    match lock_is_ours(&zk, &lock, &claim_id).await {
                        Ok(true) => match release_uncounted(&zk, &lock, &uncount).await {
                            Ok(()) | Err(ZkError::NoNode | ZkError::BadVersion | ZkError::SessionLost) => {
                                break queue.cache.reoffer(item);
                            },
                            // Re-read the evidence: a lost delete answer may have applied.
                            Err(_) => pause.sleep().await,
                        },
                        Ok(false) | Err(ZkError::SessionLost) => break queue.cache.reoffer(item),
                        Err(_) => pause.sleep().await,
                    }
                }
            }
        });
    }
}
