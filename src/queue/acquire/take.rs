//! What a take writes: the claim's operations (the message removed, Curator's lock created and
//! deleted around it, a putMulti node split), the lost answers it settles by its claim marker, and
//! the put-back of a message whose taker vanished. The claim itself runs in the one claim
//! pipeline (`acquire/claim.rs`).
//!
//! Invariants:
//! - A claim's transaction creates a claim marker (see `claims.rs`); when its answer is lost, the
//!   marker alone decides whether it applied. The absence of the message proves nothing: another
//!   consumer may have taken it while our transaction failed.
//! - A put-back retries until ZooKeeper confirms it (resolving lost answers by its marker), so a
//!   message is never dropped while the process runs.

use std::sync::Arc;

use tokio::time::Instant;

use super::Claims;
use crate::queue::attributes;
use crate::queue::claims::{ClaimMarkers, Outcome};
use crate::queue::context::SETTLE_RETRIES;
use crate::queue::message::Message;
use crate::queue::names::{self, ItemName};
use crate::zk::{ConnectionState, NodeMode, TxnOp, TxnResult, ZkError};

impl Claims {
    /// The operations that take node `name` at `version` whose items after the first are `rest`:
    /// Curator's lock created and deleted around the delete (when the queue has a lock path), and
    /// the creates that split `rest` off; and the split items. A claim sends them after its
    /// marker's create.
    pub(super) fn take_ops(&self, name: &str, rest: &[Vec<u8>], version: i32) -> (Vec<TxnOp>, Vec<ItemName>) {
        let lock = self.ctx.lock_path.as_ref().map(|dir| format!("{dir}/{name}"));
        let (split_ops, split_items) = self.ctx.split_ops(name, rest, version);
        let mut ops = Vec::with_capacity(split_ops.len() + 3);
        if let Some(lock) = &lock {
            ops.push(TxnOp::Create { path: lock.clone(), data: Vec::new(), mode: NodeMode::Ephemeral });
        }
        ops.extend(split_ops);
        ops.push(TxnOp::Delete { path: format!("{}/{name}", self.ctx.path), version: Some(version) });
        if let Some(lock) = lock {
            ops.push(TxnOp::Delete { path: lock, version: None });
        }
        (ops, split_items)
    }

    /// Parent directories a claim transaction may find missing, by operation index: the marker
    /// directory (operation 0) and the lock directory (operation 1, when locking).
    pub(super) fn claim_parents(&self, locking: bool) -> Vec<(usize, String)> {
        let mut parents = vec![(0, self.ctx.markers.dir().to_owned())];
        if let (true, Some(dir)) = (locking, &self.ctx.lock_path) {
            parents.push((1, dir.clone()));
        }
        parents
    }

    /// Settles a claim transaction (sent at `sent`) whose outcome is still unknown once ZooKeeper
    /// is back: if it applied, its messages (the first item of each node) are put back; if not,
    /// the candidates are offered again. One task per transaction: its marker decides for all of
    /// them at once (once resolved, the marker is deleted, so a second look would find "not
    /// applied"). Gives up once a missing marker no longer proves anything (see `claims.rs`).
    pub(super) fn settle_claims_later(
        self: &Arc<Self>,
        claimed: Vec<(ItemName, Message)>,
        marker: String,
        sent: Instant,
    ) {
        let queue = self.clone();
        self.ctx.background.spawn(async move {
            let mut pause = SETTLE_RETRIES.retries();
            loop {
                if queue.ctx.session.status().state == ConnectionState::Closed {
                    for (_, message) in &claimed {
                        tracing::error!(queue = %queue.ctx.name, message = %message.message_id, marker = %marker,
                            "zkq stopped before it could learn whether a take applied; if it did, the message is lost");
                    }
                    return;
                }
                let deadline = Instant::now() + queue.ctx.session.request_timeout();
                match queue.ctx.markers.outcome(&marker, sent, deadline).await {
                    Outcome::Applied => {
                        for (_, message) in claimed {
                            queue.put_back(message).await;
                        }
                        return;
                    },
                    Outcome::NotApplied => {
                        for (item, _) in claimed {
                            queue.cache.reoffer(item);
                        }
                        return;
                    },
                    Outcome::TooOld => {
                        queue.ctx.qm.settlements_given_up.inc();
                        for (item, message) in claimed {
                            tracing::error!(queue = %queue.ctx.name, message = %message.message_id, marker = %marker,
                                "zkq could not learn in time whether a take applied; if it did, the message is lost");
                            queue.cache.reoffer(item);
                        }
                        return;
                    },
                    Outcome::Unknown(_) => pause.sleep().await,
                }
            }
        });
    }

    /// Puts back a message whose taker vanished after it was removed: same kind fields, at the
    /// tail (its original place is gone). Retries until ZooKeeper confirms it; a lost answer is
    /// resolved by the put-back's own marker, so it is never stored twice (a lost answer that
    /// cannot be settled before its missing marker stops proving anything is given up, logged).
    pub(super) async fn put_back(&self, message: Message) {
        tracing::warn!(queue = %self.ctx.name, message = %message.message_id,
            "taker disconnected after the message was removed; putting it back");
        let prefix = format!("{}/{}", self.ctx.path, names::put_prefix(self.ctx.naming, &message.meta));
        let mut data = self.ctx.encode(&message.body);
        data.extend(attributes::trailer(&attributes::Trailer {
            attributes: message.attributes.clone(),
            traceparent: message.traceparent.clone(),
            deduplication_id: message.deduplication_id.clone(),
        }));
        let mut pause = SETTLE_RETRIES.retries();
        // A put-back whose answer was lost: its marker, and when it was sent.
        let mut unresolved: Option<(String, Instant)> = None;
        loop {
            if self.ctx.session.status().state == ConnectionState::Closed {
                tracing::error!(queue = %self.ctx.name, message = %message.message_id,
                    "zkq stopped before it could put back a message whose taker disconnected; the message is lost");
                return;
            }
            if let Some((marker, sent)) = unresolved.take() {
                match self.ctx.markers.outcome(&marker, sent, Instant::now() + self.ctx.session.request_timeout()).await
                {
                    Outcome::Applied => return self.cache.mark_stale(),
                    Outcome::NotApplied => {},
                    Outcome::TooOld => {
                        self.ctx.qm.settlements_given_up.inc();
                        tracing::error!(queue = %self.ctx.name, message = %message.message_id, marker = %marker,
                            "zkq could not learn in time whether it put back a message; if it did not, the message is lost");
                        return self.cache.mark_stale();
                    },
                    Outcome::Unknown(_) => {
                        unresolved = Some((marker, sent));
                        pause.sleep().await;
                        continue;
                    },
                }
            }
            let Ok(zk) = self.ctx.session.connected(Instant::now() + self.ctx.session.request_timeout()).await else {
                pause.sleep().await;
                continue;
            };
            let marker = self.ctx.markers.next(&zk);
            let ops = [
                ClaimMarkers::create_op(&marker),
                TxnOp::Create { path: prefix.clone(), data: data.clone(), mode: NodeMode::PersistentSequential },
            ];
            let parents = [(0, self.ctx.markers.dir().to_owned()), (1, self.ctx.path.clone())];
            let sent = Instant::now();
            match self.ctx.apply_txn(&zk, &ops, &parents).await.map_err(|e| e.error) {
                Ok(results) => {
                    self.ctx.markers.applied(marker);
                    let created = results.iter().find_map(|r| match r {
                        TxnResult::Created(path) if path.starts_with(&prefix) => path.rsplit('/').next(),
                        _ => None,
                    });
                    match created.and_then(|name| names::parse(self.ctx.naming, name)) {
                        Some(item) => self.cache.insert_local(item),
                        None => self.cache.mark_stale(),
                    }
                    return;
                },
                Err(ZkError::OutcomeUnknown) => unresolved = Some((marker, sent)),
                Err(err) => {
                    tracing::warn!(queue = %self.ctx.name, message = %message.message_id, error = %err, "retrying put-back");
                    pause.sleep().await;
                },
            }
        }
    }
}

/// The message a claim of `candidate` hands out: the node's first item, under the node's name.
pub(super) fn first_message(candidate: &ItemName, items: Vec<Vec<u8>>, trailer: attributes::Trailer) -> Message {
    Message {
        message_id: candidate.name.clone(),
        body: items.into_iter().next().unwrap_or_default(),
        meta: candidate.meta.clone(),
        attributes: trailer.attributes,
        traceparent: trailer.traceparent,
        deduplication_id: trailer.deduplication_id,
    }
}
