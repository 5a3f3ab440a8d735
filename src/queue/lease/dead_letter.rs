//! Moving a message to the dead-letter queue: poison (past `max_deliveries`) and undecodable
//! nodes. One transaction creates it there, removes it here (versioned, and only if nobody holds
//! its lock: the lock is created and deleted in the same transaction, as a take does), drops its
//! delivery count and creates a claim marker, the evidence should the answer be lost.

use super::super::candidate::Declined;
use super::super::claims::{ClaimMarkers, Outcome};
use super::super::envelope;
use super::super::names::{self, ItemMeta, ItemName};
use super::super::settings::DeadLetter;
use super::Leases;
use crate::config::QueueKind;
use crate::types::now_epoch_ms;
use crate::zk::{NodeMode, TxnOp, Zk, ZkError};

impl Leases {
    pub(super) async fn dead_letter(
        &self,
        zk: &Zk,
        candidate: &ItemName,
        data: &[u8],
        version: i32,
        counter: Option<&str>,
        target: &DeadLetter,
    ) -> Result<Declined, ZkError> {
        let Some(lock_dir) = &self.ctx.lock_path else { return Ok(Declined::Lost) };
        // Re-encode for the target's kind; undecodable bytes become one item, so Curator can read them.
        let items = envelope::decode(data).unwrap_or_else(|_| vec![data.to_vec()]);
        let moved = if target.kind == QueueKind::Simple {
            items.concat()
        } else {
            // The message's attributes, after the envelope, go with it.
            let mut moved = envelope::encode(items.iter().map(Vec::as_slice));
            moved.extend_from_slice(envelope::after_end(data));
            moved
        };
        let meta = match (&candidate.meta, target.kind) {
            (ItemMeta::Priority(p), QueueKind::Priority) => ItemMeta::Priority(*p),
            (ItemMeta::Id(id), QueueKind::Id) => ItemMeta::Id(id.clone()),
            (_, QueueKind::Id) => ItemMeta::Id(self.ctx.name.to_string()),
            (_, QueueKind::Priority) => ItemMeta::Priority(0),
            (_, QueueKind::Delay) => ItemMeta::DeliverAt(now_epoch_ms()),
            _ => ItemMeta::Plain,
        };
        let marker = self.ctx.markers.next(zk);
        let lock = format!("{lock_dir}/{}", candidate.name);
        let mut ops = vec![
            ClaimMarkers::create_op(&marker),
            TxnOp::Create { path: lock.clone(), data: Vec::new(), mode: NodeMode::Ephemeral },
            TxnOp::Create {
                path: format!("{}/{}", target.path, names::put_prefix(target.kind, &meta)),
                data: moved,
                mode: NodeMode::PersistentSequential,
            },
            TxnOp::Delete { path: format!("{}/{}", self.ctx.path, candidate.name), version: Some(version) },
            TxnOp::Delete { path: lock, version: None },
        ];
        if let Some(counter) = counter {
            ops.push(TxnOp::Delete { path: counter.to_owned(), version: None });
        }
        if zk.request_bytes(&ops) > zk.max_request_bytes() {
            // Its copy there with its removal here would pass ZooKeeper's request limit (a node
            // within a few hundred bytes of it, or a longer path there): left in place.
            if self.cache.mark_undecodable(&candidate.name) {
                tracing::warn!(queue = %self.ctx.name, message = %candidate.name, dead_letter = %target.name,
                    bytes = data.len(), "a message too large to move to the dead-letter queue in one transaction \
                    is left in place");
            }
            return Ok(Declined::Undecodable);
        }
        let parents = [(0, self.ctx.markers.dir().to_owned()), (1, lock_dir.clone()), (2, target.path.clone())];
        let sent = tokio::time::Instant::now();
        let mut result = self.ctx.apply_txn(zk, &ops, &parents).await;
        if let Err(err) = &result
            && err.error == ZkError::NoNode
            && counter.is_some()
            && err.index == Some(ops.len() - 1)
        {
            // The count was removed meanwhile (a sweep): move the message without it.
            ops.pop();
            result = self.ctx.apply_txn(zk, &ops, &parents).await;
        }
        match result {
            Ok(_) => {},
            Err(err) => match (err.error, err.index) {
                (ZkError::NodeExists, Some(1)) => return Ok(Declined::Locked),
                (ZkError::NoNode | ZkError::BadVersion, Some(3)) => return Ok(Declined::Lost),
                (ZkError::OutcomeUnknown, _) => {
                    let deadline = tokio::time::Instant::now() + self.ctx.session.request_timeout();
                    match self.ctx.markers.outcome(&marker, sent, deadline).await {
                        Outcome::Applied => {},
                        Outcome::NotApplied => return Err(ZkError::Unavailable),
                        // Either way nothing is lost (it is here or there); a later read tells.
                        Outcome::Unknown(_) | Outcome::TooOld => {
                            self.cache.mark_stale();
                            return Ok(Declined::Lost);
                        },
                    }
                },
                (error, _) => return Err(error),
            },
        }
        self.ctx.markers.applied(marker);
        self.cache.removed_local();
        self.ctx.qm.messages_dead_lettered.inc();
        tracing::warn!(queue = %self.ctx.name, message = %candidate.name, dead_letter = %target.name,
            "moved a message to the dead-letter queue");
        Ok(Declined::Lost)
    }
}
