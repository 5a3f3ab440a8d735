//! Browsing a queue without consuming it: peek, depth and head age, and removal by name or id.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::cache::{ChildrenCache, GroupStats};
use super::context::Context;
use super::message::PeekedItem;
use super::names::{self, ItemMeta, ItemName};
use super::{QueueError, envelope};
use crate::config::QueueKind;
use crate::zk::{TxnError, TxnOp, Zk, ZkError};

/// What `GET /v1/queues/{queue}` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueInfo {
    pub depth: i64,
    pub in_flight: i64,
    pub waiting_takers: usize,
    /// Messages waiting for their delivery time, while the cache follows the queue's events
    /// (`None` otherwise).
    pub delayed: Option<i64>,
    pub head: HeadAge,
    /// Grouped queues, while the cache follows the queue's events.
    pub groups: Option<GroupStats>,
}

/// What a purge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Purged {
    /// Messages removed.
    pub removed: usize,
    /// False when the request's deadline came first: the messages not reached are still there.
    pub complete: bool,
}

/// What a purge removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purge {
    /// Every message no consumer holds (zkq's own purge).
    Unheld,
    /// Every message, the held ones too (SQS's `PurgeQueue`): their consumers find their
    /// leases lost.
    All,
}

/// Messages a purge removes in one transaction.
const PURGE_BATCH: usize = 64;

/// What zkq knows of the age of a queue's next message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadAge {
    /// The next message has waited since this time (epoch milliseconds).
    Since(i64),
    /// The queue's child list was read and no message is waiting (empty, all in flight or not due).
    NoneWaiting,
    /// Not known: the child list was not read yet (a deep queue right after it opened, or a read
    /// refused), or the head was taken while zkq looked at it.
    NotKnownYet,
}

impl HeadAge {
    /// The age in milliseconds, when a message is known to wait.
    pub(crate) fn age_ms(self) -> Option<i64> {
        match self {
            HeadAge::Since(since) => Some((crate::types::now_epoch_ms() - since).max(0)),
            HeadAge::NoneWaiting | HeadAge::NotKnownYet => None,
        }
    }
}

/// Peek, info and removal on one queue. Its fields are private to this file.
pub(super) struct Browse {
    ctx: Arc<Context>,
    cache: Arc<ChildrenCache>,
    /// The head seen by the last age reading and since when it waits (epoch ms).
    head_seen: Mutex<Option<(String, i64)>>,
}

impl Browse {
    pub(super) fn new(ctx: Arc<Context>, cache: Arc<ChildrenCache>) -> Browse {
        Browse { ctx, cache, head_seen: Mutex::new(None) }
    }

    /// The first `limit` messages in delivery order, without removing them; stops before the
    /// bodies would exceed `api.max_peek_bytes`, but always shows the first message.
    ///
    /// The order comes from the children cache while it is live (no child list is read), and
    /// only the nodes shown are read. When the cache is not live, one full read of the child list
    /// serves it, one at a time per queue.
    pub(super) async fn peek(&self, limit: usize) -> Result<Vec<PeekedItem>, QueueError> {
        // A peek takes its order from the live cache: the queue is watched while one runs.
        let _demand = self.cache.demand();
        let zk = self.ctx.session.connected(self.ctx.deadline_for(Duration::ZERO)).await?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut read: HashSet<String> = HashSet::new();
        // A few more than asked, for nodes taken between the order and their read.
        let mut want = limit.saturating_add(8);
        // Not live (not watched until this peek's demand, or reconnecting): the refresher's next
        // snapshot, which this demand brings, serves it, and every peek meanwhile; only if that
        // does not come in time does the peek read the child list itself.
        let mut waited = false;
        loop {
            let (order, complete) = match self.cache.peek_order(want) {
                Some(order) => {
                    let complete = order.len() < want;
                    (order, complete)
                },
                None if !waited => {
                    waited = true;
                    let _ = self.cache.refreshed(self.ctx.deadline_for(Duration::ZERO)).await;
                    continue;
                },
                None => (self.peek_order_from_zookeeper(&zk).await?, true),
            };
            for item in order {
                if out.len() >= limit || bytes >= self.ctx.max_peek_bytes {
                    return Ok(out);
                }
                if !read.insert(item.name.clone()) {
                    continue;
                }
                let data = match zk.get_data(&format!("{}/{}", self.ctx.path, item.name)).await {
                    Ok((data, _)) => data,
                    Err(ZkError::NoNode) => continue,
                    Err(err) => return Err(err.into()),
                };
                let bodies = if self.ctx.kind == QueueKind::Simple {
                    vec![data]
                } else {
                    match envelope::decode(&data) {
                        Ok(bodies) => bodies,
                        Err(_) => continue,
                    }
                };
                for (index, body) in bodies.into_iter().enumerate() {
                    let within_budget = bytes.saturating_add(body.len()) <= self.ctx.max_peek_bytes;
                    if out.len() >= limit || !(within_budget || out.is_empty()) {
                        return Ok(out);
                    }
                    bytes = bytes.saturating_add(body.len());
                    out.push(PeekedItem {
                        message_id: item.name.clone(),
                        item_index: index,
                        body,
                        meta: item.meta.clone(),
                    });
                }
            }
            if complete || out.len() >= limit {
                return Ok(out);
            }
            // Nodes vanished under us: look further.
            want = want.saturating_mul(4);
        }
    }

    /// Every child in delivery order, from one full read (one such read at a time per queue).
    async fn peek_order_from_zookeeper(&self, zk: &Zk) -> Result<Vec<ItemName>, QueueError> {
        let _permit = self.cache.full_read_permit().await;
        let children = match zk.get_children(&self.ctx.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(err.into()),
        };
        let mut items: Vec<ItemName> = children.iter().filter_map(|c| names::parse(self.ctx.naming, c)).collect();
        items.sort_by(|a, b| names::compare(self.ctx.naming, a, b));
        Ok(items)
    }

    /// Depth, messages in flight, waiting takers and the age of the head message.
    pub(super) async fn info(&self) -> Result<QueueInfo, QueueError> {
        let zk = self.ctx.session.connected(self.ctx.deadline_for(Duration::ZERO)).await?;
        let depth = zk.exists(&self.ctx.path).await?.map_or(0, |s| i64::from(s.num_children));
        let in_flight = match &self.ctx.lock_path {
            Some(lock_path) => zk.exists(lock_path).await?.map_or(0, |s| i64::from(s.num_children)),
            None => 0,
        };
        if depth > 0 && !self.cache.has_snapshot() {
            // Right after the queue opened: the head is known after the first read.
            // Refused (an ACL that does not allow zkq to read the queue): the head stays unknown.
            let _ = self.cache.refreshed(self.ctx.deadline_for(Duration::ZERO)).await;
        }
        let head = if depth == 0 { HeadAge::NoneWaiting } else { self.head_waiting_since(&zk).await? };
        let groups = self.cache.group_stats();
        let delayed = self.cache.delayed_count().map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        Ok(QueueInfo { depth, in_flight, waiting_takers: self.cache.waiting(), delayed, head, groups })
    }

    /// Since when (epoch ms) the next message to deliver has waited: its creation, or for a delay
    /// queue the time it became due; `None` when no message is waiting. The head's time is read
    /// once per head (one `exists`), so scrapes of a queue whose head does not move cost nothing.
    pub(super) async fn head_waiting_since(&self, zk: &Zk) -> Result<HeadAge, QueueError> {
        if !self.cache.has_snapshot() {
            return Ok(HeadAge::NotKnownYet);
        }
        // Not watched now (demand watching, or reconnecting): the head of the last read. That
        // no message waited then says nothing of now.
        let (head, live) = self.cache.head_for_age();
        let Some(head) = head else {
            if live {
                return Ok(HeadAge::NoneWaiting);
            }
            self.cache.ask_reread();
            return Ok(HeadAge::NotKnownYet);
        };
        {
            let seen = self.head_seen.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((name, since)) = &*seen
                && *name == head.name
            {
                return Ok(HeadAge::Since(*since));
            }
        }
        let Some(stat) = zk.exists(&format!("{}/{}", self.ctx.path, head.name)).await? else {
            // Taken or removed since the cache proposed it: the next one's age is not known.
            if !live {
                self.cache.ask_reread();
            }
            return Ok(HeadAge::NotKnownYet);
        };
        let since = stat.ctime.max(names::due_time(&head));
        *self.head_seen.lock().unwrap_or_else(|p| p.into_inner()) = Some((head.name, since));
        Ok(HeadAge::Since(since))
    }

    /// Removes one message by its node name; respects locks held by others.
    pub(super) async fn remove(&self, message_id: &str) -> Result<(), QueueError> {
        if !names::is_item_name(self.ctx.naming, message_id) {
            return Err(QueueError::MessageNotFound(message_id.to_owned()));
        }
        let zk = self.ctx.session.connected(self.ctx.deadline_for(Duration::ZERO)).await?;
        if self.remove_node(&zk, message_id).await? {
            Ok(())
        } else {
            Err(QueueError::MessageNotFound(message_id.to_owned()))
        }
    }

    /// Removes every message with this id (Curator's `DistributedIdQueue.remove`); the id is
    /// matched after Curator's `fixId`, so the id given to the put finds its messages.
    pub(super) async fn remove_by_id(&self, id: &str) -> Result<usize, QueueError> {
        if self.ctx.kind != QueueKind::Id {
            return Err(QueueError::NotForKind(format!(
                "`id` does not apply to {} queue {:?}",
                self.ctx.kind.as_str(),
                self.ctx.name
            )));
        }
        let wanted = names::fix_id(id);
        let zk = self.ctx.session.connected(self.ctx.deadline_for(Duration::ZERO)).await?;
        let children = match zk.get_children(&self.ctx.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(err.into()),
        };
        let mut removed = 0;
        for child in children {
            let matches = names::parse(self.ctx.naming, &child).is_some_and(|i| i.meta == ItemMeta::Id(wanted.clone()));
            if matches && self.remove_node(&zk, &child).await? {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes every message of the queue that no consumer holds (a lock protects it, as from a
    /// take), in transactions of up to [`PURGE_BATCH`] messages; foreign nodes are left alone.
    /// How many were removed, and whether the purge got through them all before the request's
    /// deadline.
    pub(super) async fn purge(&self, what: Purge) -> Result<Purged, QueueError> {
        let deadline = self.ctx.deadline_for(Duration::ZERO);
        let zk = self.ctx.session.connected(deadline).await?.with_deadline(deadline);
        let children = match zk.get_children(&self.ctx.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(Purged { removed: 0, complete: true }),
            Err(err) => return Err(err.into()),
        };
        let items: Vec<String> = children.into_iter().filter(|c| names::parse(self.ctx.naming, c).is_some()).collect();
        let mut removed = 0;
        let mut held = Vec::new();
        for chunk in items.chunks(PURGE_BATCH) {
            let mut batch: Vec<&String> = chunk.iter().collect();
            while !batch.is_empty() {
                if tokio::time::Instant::now() >= deadline {
                    return Ok(Purged { removed, complete: false });
                }
                let (ops, parents) = self.removal(batch.iter().map(|name| name.as_str()));
                let each = ops.len() / batch.len();
                match self.ctx.apply_txn(&zk, &ops, &parents).await {
                    Ok(_) => {
                        for _ in &batch {
                            self.cache.removed_local();
                        }
                        removed += batch.len();
                        break;
                    },
                    // Held by a consumer, or gone meanwhile: left out, the rest sent again.
                    Err(TxnError { index: Some(index), error })
                        if matches!(error, ZkError::NoNode | ZkError::NodeExists) =>
                    {
                        let name = batch.remove((index / each).min(batch.len() - 1));
                        if error == ZkError::NodeExists && index % each == 0 {
                            held.push(name.clone());
                        }
                    },
                    Err(err) => return Err(err.error.into()),
                }
            }
        }
        if what == Purge::All {
            // Then the held ones, as SQS purges messages in flight: the message, then its lock
            // (another session's), so its consumer's ack finds the lease lost.
            for name in held {
                if tokio::time::Instant::now() >= deadline {
                    return Ok(Purged { removed, complete: false });
                }
                match zk.delete(&format!("{}/{name}", self.ctx.path), None).await {
                    Ok(()) => {
                        self.cache.removed_candidate(&name);
                        removed += 1;
                    },
                    Err(ZkError::NoNode) => {},
                    Err(err) => return Err(err.into()),
                }
                if let Some(dir) = &self.ctx.lock_path {
                    match zk.delete(&format!("{dir}/{name}"), None).await {
                        Ok(()) | Err(ZkError::NoNode) => {},
                        Err(err) => return Err(err.into()),
                    }
                }
            }
        }
        Ok(Purged { removed, complete: true })
    }

    /// The operations that remove `names`, and the parent the first may need: as in a take's
    /// claim, each one's lock node is created and deleted in the same transaction, so an item a
    /// consumer holds a lock on is never removed.
    fn removal<'a>(&self, names: impl Iterator<Item = &'a str>) -> (Vec<TxnOp>, Vec<(usize, String)>) {
        let ops = names.flat_map(|name| self.ctx.unheld_removal(name, None)).collect();
        let parents = self.ctx.lock_path.iter().map(|dir| (0, dir.clone())).collect();
        (ops, parents)
    }

    async fn remove_node(&self, zk: &Zk, name: &str) -> Result<bool, QueueError> {
        let (ops, parents) = self.removal(std::iter::once(name));
        match self.ctx.apply_txn(zk, &ops, &parents).await.map_err(|e| e.error) {
            Ok(_) => {
                self.cache.removed_candidate(name);
                Ok(true)
            },
            Err(ZkError::NoNode | ZkError::NodeExists) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }
}
