//! Leasing one candidate: one read, then one transaction.
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

use super::super::names::ItemName;
use super::super::take::Pause;
use super::super::{Message, Queue, envelope};
use super::{
    Claiming, Lease, LeaseGrant, OnExpiry, counter_bytes, epoch_ms_after, lock_is_ours, read_counter, receipt,
};
use crate::zk::{ConnectionState, NodeMode, TxnOp, Zk, ZkError};

/// The result of trying to lease one candidate.
pub(in crate::queue) enum LeaseClaim {
    Granted(Message, LeaseGrant),
    /// Someone else has it, or it was moved to the dead-letter queue.
    Lost,
    /// It was already gone when read.
    Gone,
    /// Someone holds its lock: watch the lock and offer it again when released.
    Locked,
    Undecodable,
}

/// Operation indexes of the claim transaction.
const LOCK_OP: usize = 0;
const CHECK_OP: usize = 1;
const COUNT_OP: usize = 2;

impl Queue {
    /// Tries to lease `candidate` for `visibility`.
    pub(in crate::queue) async fn claim_lease(
        self: &Arc<Self>,
        zk: &Zk,
        candidate: &ItemName,
        visibility: Duration,
    ) -> Result<LeaseClaim, ZkError> {
        let Some(lock_dir) = self.lock_path.clone() else {
            return Ok(LeaseClaim::Lost);
        };
        let Some(_claiming) = Claiming::begin(&self.leases, &candidate.name) else {
            return Ok(LeaseClaim::Locked);
        };
        let item_path = format!("{}/{}", self.path, candidate.name);
        let counter = self.counter_path(&candidate.name);
        let mut read = zk.get_data_many(&[&item_path, &counter]).await?.into_iter();
        let (data, stat) = match read.next() {
            Some(Ok(found)) => found,
            Some(Err(ZkError::NoNode)) | None => return Ok(LeaseClaim::Gone),
            Some(Err(err)) => return Err(err),
        };
        let (previous, counter_version) = match read.next() {
            Some(Ok((bytes, stat))) => (read_counter(&bytes), Some(stat.version)),
            _ => (0, None),
        };
        let count = previous.saturating_add(1);
        let undecodable = self.kind != crate::config::QueueKind::Simple
            && !envelope::decode(&data).is_ok_and(|items| !items.is_empty());
        if let Some(dead_letter) = &self.dead_letter
            && (undecodable || dead_letter.max_deliveries.is_some_and(|max| count > max))
        {
            let counter = counter_version.map(|_| counter.as_str());
            return self.dead_letter(zk, candidate, &data, stat.version, counter, dead_letter).await;
        }
        let Some(items) = self.items_of(&candidate.name, &data) else {
            return Ok(LeaseClaim::Undecodable);
        };
        let claim_id = self.leases.claim_id(zk);
        let lock = format!("{lock_dir}/{}", candidate.name);
        // A Curator putMulti node is split on first touch: the leased node keeps the first item,
        // the others become nodes of their own right behind it.
        let (split_ops, split_items) = self.split_ops(&candidate.name, items.get(1..).unwrap_or_default());
        let (data, data_version, check) = if split_ops.is_empty() {
            (data, stat.version, TxnOp::Check { path: item_path, version: stat.version })
        } else {
            let first = envelope::encode(items.first().map(Vec::as_slice));
            let check = TxnOp::SetData { path: item_path, data: first.clone(), version: Some(stat.version) };
            (first, stat.version + 1, check)
        };
        let count_op = match counter_version {
            Some(version) => {
                TxnOp::SetData { path: counter.clone(), data: counter_bytes(count), version: Some(version) }
            },
            None => TxnOp::Create { path: counter.clone(), data: counter_bytes(count), mode: NodeMode::Persistent },
        };
        let mut ops = vec![
            TxnOp::Create { path: lock.clone(), data: claim_id.clone(), mode: NodeMode::Ephemeral },
            check,
            count_op,
        ];
        ops.extend(split_ops);
        let parents = [(LOCK_OP, lock_dir), (COUNT_OP, self.deliveries_path.clone())];
        match self.apply_txn(zk, &ops, &parents).await {
            Ok(_) => {},
            Err(err) => match (err.error, err.index) {
                (ZkError::NodeExists, Some(LOCK_OP)) => return Ok(LeaseClaim::Locked),
                (ZkError::NoNode | ZkError::BadVersion, Some(CHECK_OP)) => return Ok(LeaseClaim::Lost),
                // The count changed between our read and our transaction: read again.
                (ZkError::NodeExists | ZkError::BadVersion, Some(COUNT_OP)) => return Err(ZkError::Unavailable),
                (ZkError::OutcomeUnknown, _) => {
                    let deadline = Instant::now() + self.session.request_timeout();
                    match lock_is_ours(&zk.with_deadline(deadline), &lock, &claim_id).await {
                        Ok(true) => {},
                        // Not applied: offer the candidate again.
                        Ok(false) => return Err(ZkError::Unavailable),
                        Err(ZkError::SessionLost) => return Err(ZkError::SessionLost),
                        Err(_) => {
                            self.release_unknown_claim_later(zk.clone(), lock, claim_id, candidate.clone());
                            return Ok(LeaseClaim::Lost);
                        },
                    }
                },
                (error, _) => return Err(error),
            },
        }
        for item in split_items {
            self.cache.insert_local(item);
        }
        let expires_at_ms = epoch_ms_after(visibility);
        let token = {
            let mut state = self.leases.lock();
            self.leases.issue(&mut state, zk.session_id())
        };
        let grant =
            LeaseGrant { receipt: receipt::format(zk.session_id(), token), expires_at_ms, delivery_count: count };
        let message = Message {
            message_id: candidate.name.clone(),
            body: items.into_iter().next().unwrap_or_default(),
            meta: candidate.meta.clone(),
        };
        let lease = Lease {
            item: candidate.clone(),
            lock,
            claim_id,
            counter,
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
        self.leases.lock().live.insert(token, lease);
        self.leases.changed.notify_one();
        self.qm.leases_in_flight.inc();
        Ok(LeaseClaim::Granted(message, grant))
    }

    /// A lease claim whose outcome is unknown: once ZooKeeper answers, release the lock if the
    /// claim created it, and offer the item again. Owned by the queue's background tracker.
    fn release_unknown_claim_later(self: &Arc<Self>, zk: Zk, lock: String, claim_id: Vec<u8>, item: ItemName) {
        let queue = self.clone();
        self.background.spawn(async move {
            let mut pause = Pause::new();
            loop {
                if queue.session.status().state == ConnectionState::Closed {
                    return; // the session is closed: the lock, if any, is gone with it
                }
                let zk = zk.with_deadline(Instant::now() + queue.session.request_timeout());
                match lock_is_ours(&zk, &lock, &claim_id).await {
                    Ok(true) => match zk.delete(&lock, None).await {
                        Ok(()) | Err(ZkError::NoNode) => return queue.cache.reoffer(item),
                        Err(ZkError::SessionLost) => return queue.cache.reoffer(item),
                        // Re-read the evidence: a lost delete answer may have applied.
                        Err(_) => pause.sleep().await,
                    },
                    Ok(false) | Err(ZkError::SessionLost) => return queue.cache.reoffer(item),
                    Err(_) => pause.sleep().await,
                }
            }
        });
    }
}
