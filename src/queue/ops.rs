//! Put, take, peek, remove and introspection on one queue.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use super::message::{NodeCreate, PeekedItem, PutOptions, PutReceipt};
use super::names::{self, ItemMeta, ItemName};
use super::{Queue, QueueError, envelope};
use crate::config::QueueKind;
use crate::metrics::GaugeGuard;
use crate::types::now_epoch_ms;
use crate::zk::{NodeMode, TxnOp, TxnResult, Zk, ZkError};

/// What `GET /v1/queues/{queue}` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    pub depth: i64,
    pub in_flight: i64,
    pub waiting_takers: usize,
    pub head: HeadAge,
}

/// What zkq knows of the age of a queue's next message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadAge {
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
    pub fn age_ms(self) -> Option<i64> {
        match self {
            HeadAge::Since(since) => Some((now_epoch_ms() - since).max(0)),
            HeadAge::NoneWaiting | HeadAge::NotKnownYet => None,
        }
    }
}

impl Queue {
    fn deadline_for(&self, wait: Duration) -> Instant {
        Instant::now() + wait.max(self.session.request_timeout())
    }

    fn meta_for(&self, options: &PutOptions) -> Result<ItemMeta, QueueError> {
        let kind = self.kind.as_str();
        let refuse = |param: &str| {
            Err(QueueError::NotForKind(format!("`{param}` does not apply to {kind} queue {:?}", self.name)))
        };
        if options.priority.is_some() && self.kind != QueueKind::Priority {
            return refuse("priority");
        }
        if options.deliver_at.is_some() && self.kind != QueueKind::Delay {
            return refuse("delay/deliver_at");
        }
        if options.id.is_some() && self.kind != QueueKind::Id {
            return refuse("id");
        }
        Ok(match self.kind {
            QueueKind::Priority => ItemMeta::Priority(options.priority.unwrap_or(0)),
            QueueKind::Delay => ItemMeta::DeliverAt(options.deliver_at.unwrap_or_else(now_epoch_ms).max(1)),
            QueueKind::Id => {
                let id = options.id.clone().ok_or_else(|| {
                    QueueError::NotForKind(format!("id queue {:?} needs ?id= on every put", self.name))
                })?;
                if !names::is_valid_id(&id) {
                    return Err(QueueError::InvalidParameter(
                        "id must be 1 to 200 bytes without characters ZooKeeper refuses (control characters, \
                         U+D800-U+F8FF, U+FFF0 and above)"
                            .to_owned(),
                    ));
                }
                ItemMeta::Id(id)
            },
            QueueKind::Fifo | QueueKind::Simple => ItemMeta::Plain,
        })
    }

    pub(super) fn encode(&self, body: &[u8]) -> Vec<u8> {
        if self.kind == QueueKind::Simple { body.to_vec() } else { envelope::encode([body]) }
    }

    /// Stores one message; answers only after ZooKeeper confirmed the node.
    pub async fn put(&self, body: &[u8], options: PutOptions) -> Result<PutReceipt, QueueError> {
        let wait = options.wait;
        let mut receipts = self.put_many(vec![(body, options)], wait).await?;
        receipts.pop().ok_or(QueueError::Zk(ZkError::OutcomeUnknown))
    }

    /// Stores `messages` all or none, in one ZooKeeper transaction (shared with other puts in
    /// flight, [`GroupCommit`](crate::zk::GroupCommit)); the receipts are in the same order. With
    /// `max_items`, waits up to `wait` until there is room for all of them. A message with an
    /// idempotency key goes with its key's record, in the same transaction; one whose key was used
    /// within the window is not stored again (`idempotency/`).
    pub async fn put_many(
        &self,
        messages: Vec<(&[u8], PutOptions)>,
        wait: Duration,
    ) -> Result<Vec<PutReceipt>, QueueError> {
        if self.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        let mut creates = Vec::with_capacity(messages.len());
        let mut keys = Vec::with_capacity(messages.len());
        for (body, options) in &messages {
            if body.len() > self.max_message_bytes {
                return Err(QueueError::TooLarge { size: body.len(), max: self.max_message_bytes });
            }
            let meta = self.meta_for(options)?;
            creates.push(NodeCreate { prefix: names::put_prefix(self.kind, &meta), data: self.encode(body) });
            keys.push(match options.idempotency_key.as_deref() {
                Some(key) => Some(self.keyed_put(key, body, options)?),
                None => None,
            });
        }
        let mut seen = HashMap::new();
        for (index, (_, options)) in messages.iter().enumerate() {
            if let Some(key) = options.idempotency_key.as_deref()
                && let Some(first) = seen.insert(key, index)
            {
                return Err(QueueError::InvalidParameter(format!(
                    "messages[{index}] carries the same idempotency key as messages[{first}]; a key stands for one message"
                )));
            }
        }
        let _in_flight = GaugeGuard::new(self.qm.puts_in_flight.clone());
        let deadline = self.deadline_for(wait);
        if !seen.is_empty() {
            return self.put_keyed(creates, keys, wait, deadline).await;
        }
        self.wait_for_room(creates.len(), wait).await?;
        let ops: Vec<TxnOp> = creates
            .into_iter()
            .map(|create| TxnOp::Create {
                path: format!("{}/{}", self.path, create.prefix),
                data: create.data,
                mode: NodeMode::PersistentSequential,
            })
            .collect();
        let created = self.create_nodes(ops, deadline).await?;
        Ok(created.into_iter().map(|name| PutReceipt { message_id: Some(self.stored(&name)), replay: false }).collect())
    }

    /// Stores `messages` as ONE node holding all of them, the way Curator's `putMulti` does
    /// (fifo, priority and delay queues; Curator has none for id and simple queues), with the
    /// kind fields every message shares (different ones are refused). Curator consumers receive
    /// them together, in order; zkq's first take or lease of the node hands out the first message
    /// and splits the others into nodes of their own right behind it. The node counts as one
    /// child against `max_items`, as in Curator. Idempotency keys are refused: a key stands for
    /// one message, and this node holds several.
    pub async fn put_multi(
        &self,
        messages: Vec<(&[u8], PutOptions)>,
        wait: Duration,
    ) -> Result<PutReceipt, QueueError> {
        if self.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        if !matches!(self.kind, QueueKind::Fifo | QueueKind::Priority | QueueKind::Delay) {
            return Err(QueueError::NotForKind(format!(
                "format=curator-multi is for fifo, priority and delay queues; Curator has no putMulti for {} queue {:?}",
                self.kind.as_str(),
                self.name
            )));
        }
        if let Some(index) = messages.iter().position(|(_, options)| options.idempotency_key.is_some()) {
            return Err(QueueError::InvalidParameter(format!(
                "messages[{index}] has an idempotency_key: format=curator-multi stores the batch as one node, \
                 and a key stands for one message"
            )));
        }
        // A delay queue's message without a delivery time is due now: the same "now" for all.
        let now = now_epoch_ms();
        let mut shared: Option<ItemMeta> = None;
        for (index, (body, options)) in messages.iter().enumerate() {
            if body.len() > self.max_message_bytes {
                return Err(QueueError::TooLarge { size: body.len(), max: self.max_message_bytes });
            }
            let mut options = options.clone();
            if self.kind == QueueKind::Delay {
                options.deliver_at = options.deliver_at.or(Some(now));
            }
            let meta = self.meta_for(&options)?;
            match &shared {
                None => shared = Some(meta),
                Some(first) if *first == meta => {},
                Some(first) => {
                    return Err(QueueError::InvalidParameter(format!(
                        "format=curator-multi stores every message in one node with one {}: messages[{index}] has {} \
                         where messages[0] has {}",
                        if self.kind == QueueKind::Priority { "priority" } else { "delivery time" },
                        describe(&meta),
                        describe(first),
                    )));
                },
            }
        }
        let Some(meta) = shared else {
            return Err(QueueError::InvalidParameter("a batch holds at least one message".to_owned()));
        };
        let op = TxnOp::Create {
            path: format!("{}/{}", self.path, names::put_prefix(self.kind, &meta)),
            data: envelope::encode(messages.iter().map(|(body, _)| *body)),
            mode: NodeMode::PersistentSequential,
        };
        let _in_flight = GaugeGuard::new(self.qm.puts_in_flight.clone());
        self.wait_for_room(1, wait).await?;
        let mut created = self.create_nodes(vec![op], self.deadline_for(wait)).await?;
        let name = created.pop().ok_or(QueueError::Zk(ZkError::OutcomeUnknown))?;
        if let Some(item) = names::parse(self.kind, &name) {
            self.cache.insert_local(item);
        }
        self.qm.messages_put.inc_by(messages.len() as u64);
        Ok(PutReceipt { message_id: Some(name), replay: false })
    }

    /// Creates the sequential nodes of `ops` in one transaction (shared with other writes in
    /// flight); recreates the queue node once if it was removed; answers the nodes' names in order.
    async fn create_nodes(&self, ops: Vec<TxnOp>, deadline: Instant) -> Result<Vec<String>, QueueError> {
        let zk = self.session.connected(deadline).await?;
        let created = match self.group.submit(&self.background, &zk, ops.clone()).await {
            Err(err) if err.error == ZkError::NoNode => {
                // No queue node (never made, deleted, or a container reaped): a put makes it, once.
                self.create_queue_node(&zk).await?;
                self.group.submit(&self.background, &zk, ops).await
            },
            other => other,
        };
        let created = created.map_err(|err| {
            if err.error == ZkError::OutcomeUnknown {
                self.qm.put_outcome_unknown.inc();
            }
            err.error
        })?;
        Ok(created
            .into_iter()
            .filter_map(|result| match result {
                TxnResult::Created(path) => Some(path.rsplit('/').next().unwrap_or(&path).to_owned()),
                _ => None,
            })
            .collect())
    }

    /// Creates the queue's node (and missing parents, as containers), as Curator's producer of
    /// this kind would: a `simple` queue's as a container (`SimpleDistributedQueue` makes its
    /// directory so, and ZooKeeper removes it once it is empty), the others' persistent (as
    /// `DistributedQueue.start()` does). Only a put calls this.
    pub(super) async fn create_queue_node(&self, zk: &Zk) -> Result<(), ZkError> {
        let mode = if self.kind == QueueKind::Simple { NodeMode::Container } else { NodeMode::Persistent };
        zk.ensure_path_as(&self.path, mode).await
    }

    /// With `max_items`, waits up to `wait` until there is room for `count` more messages.
    pub(super) async fn wait_for_room(&self, count: usize, wait: Duration) -> Result<(), QueueError> {
        let Some(max_items) = self.max_items else { return Ok(()) };
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        // Room for all: fewer than `max_items - count + 1` children now.
        let below = max_items.checked_sub(count.saturating_sub(1)).filter(|below| *below > 0);
        let room = match below {
            Some(below) => self.cache.room_for(below, Instant::now() + wait).await,
            None => false,
        };
        if room { Ok(()) } else { Err(QueueError::Full { max_items }) }
    }

    /// A message ZooKeeper confirmed: the cache learns of it, the counter counts it.
    pub(super) fn stored(&self, name: &str) -> String {
        if let Some(item) = names::parse(self.kind, name) {
            self.cache.insert_local(item);
        }
        self.qm.messages_put.inc();
        name.to_owned()
    }

    /// The first `limit` messages in delivery order, without removing them; stops before the
    /// bodies would exceed `api.max_peek_bytes`, but always shows the first message.
    ///
    /// The order comes from the children cache while it is live (no child list is read), and
    /// only the nodes shown are read. When the cache is not live, one full read of the child list
    /// serves it, one at a time per queue.
    pub async fn peek(&self, limit: usize) -> Result<Vec<PeekedItem>, QueueError> {
        let zk = self.session.connected(self.deadline_for(Duration::ZERO)).await?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut read: HashSet<String> = HashSet::new();
        // A few more than asked, for nodes taken between the order and their read.
        let mut want = limit.saturating_add(8);
        loop {
            let (order, complete) = match self.cache.peek_order(want) {
                Some(order) => {
                    let complete = order.len() < want;
                    (order, complete)
                },
                None => (self.peek_order_from_zookeeper(&zk).await?, true),
            };
            for item in order {
                if out.len() >= limit || bytes >= self.max_peek_bytes {
                    return Ok(out);
                }
                if !read.insert(item.name.clone()) {
                    continue;
                }
                let data = match zk.get_data(&format!("{}/{}", self.path, item.name)).await {
                    Ok((data, _)) => data,
                    Err(ZkError::NoNode) => continue,
                    Err(err) => return Err(err.into()),
                };
                let bodies = if self.kind == QueueKind::Simple {
                    vec![data]
                } else {
                    match envelope::decode(&data) {
                        Ok(bodies) => bodies,
                        Err(_) => continue,
                    }
                };
                for (index, body) in bodies.into_iter().enumerate() {
                    let within_budget = bytes.saturating_add(body.len()) <= self.max_peek_bytes;
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
        let children = match zk.get_children(&self.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(err.into()),
        };
        let mut items: Vec<ItemName> = children.iter().filter_map(|c| names::parse(self.kind, c)).collect();
        items.sort_by(|a, b| names::compare(self.kind, a, b));
        Ok(items)
    }

    /// Depth, messages in flight, waiting takers and the age of the head message.
    pub async fn info(&self) -> Result<QueueInfo, QueueError> {
        let zk = self.session.connected(self.deadline_for(Duration::ZERO)).await?;
        let depth = zk.exists(&self.path).await?.map_or(0, |s| i64::from(s.num_children));
        let in_flight = match &self.lock_path {
            Some(lock_path) => zk.exists(lock_path).await?.map_or(0, |s| i64::from(s.num_children)),
            None => 0,
        };
        if depth > 0 && !self.cache.has_snapshot() {
            // Right after the queue opened: the head is known after the first read.
            // Refused (an ACL that does not allow zkq to read the queue): the head stays unknown.
            let _ = self.cache.refreshed(self.deadline_for(Duration::ZERO)).await;
        }
        let head = if depth == 0 { HeadAge::NoneWaiting } else { self.head_waiting_since(&zk).await? };
        Ok(QueueInfo { depth, in_flight, waiting_takers: self.cache.waiting(), head })
    }

    /// Since when (epoch ms) the next message to deliver has waited: its creation, or for a delay
    /// queue the time it became due; `None` when no message is waiting. The head's time is read
    /// once per head (one `exists`), so scrapes of a queue whose head does not move cost nothing.
    pub(super) async fn head_waiting_since(&self, zk: &Zk) -> Result<HeadAge, QueueError> {
        if !self.cache.has_snapshot() {
            return Ok(HeadAge::NotKnownYet);
        }
        let Some(head) = self.cache.head_candidate() else { return Ok(HeadAge::NoneWaiting) };
        {
            let seen = self.head_seen.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((name, since)) = &*seen
                && *name == head.name
            {
                return Ok(HeadAge::Since(*since));
            }
        }
        let Some(stat) = zk.exists(&format!("{}/{}", self.path, head.name)).await? else {
            // Taken or removed since the cache proposed it: the next one's age is not known.
            return Ok(HeadAge::NotKnownYet);
        };
        let since = stat.ctime.max(names::due_time(&head));
        *self.head_seen.lock().unwrap_or_else(|p| p.into_inner()) = Some((head.name, since));
        Ok(HeadAge::Since(since))
    }

    /// Removes one message by its node name; respects locks held by others.
    pub async fn remove(&self, message_id: &str) -> Result<(), QueueError> {
        if !names::is_item_name(self.kind, message_id) {
            return Err(QueueError::MessageNotFound(message_id.to_owned()));
        }
        let zk = self.session.connected(self.deadline_for(Duration::ZERO)).await?;
        if self.remove_node(&zk, message_id).await? {
            Ok(())
        } else {
            Err(QueueError::MessageNotFound(message_id.to_owned()))
        }
    }

    /// Removes every message with this id (Curator's `DistributedIdQueue.remove`); the id is
    /// matched after Curator's `fixId`, so the id given to the put finds its messages.
    pub async fn remove_by_id(&self, id: &str) -> Result<usize, QueueError> {
        if self.kind != QueueKind::Id {
            return Err(QueueError::NotForKind(format!(
                "`id` does not apply to {} queue {:?}",
                self.kind.as_str(),
                self.name
            )));
        }
        let wanted = names::fix_id(id);
        let zk = self.session.connected(self.deadline_for(Duration::ZERO)).await?;
        let children = match zk.get_children(&self.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(err.into()),
        };
        let mut removed = 0;
        for child in children {
            let matches = names::parse(self.kind, &child).is_some_and(|i| i.meta == ItemMeta::Id(wanted.clone()));
            if matches && self.remove_node(&zk, &child).await? {
                removed += 1;
            }
        }
        Ok(removed)
    }

    async fn remove_node(&self, zk: &Zk, name: &str) -> Result<bool, QueueError> {
        let item_path = format!("{}/{}", self.path, name);
        // As in a take's claim: the lock node is created and deleted in the same transaction, so
        // an item a consumer holds a lock on is never removed.
        let (ops, parents) = match &self.lock_path {
            Some(dir) => {
                let lock = format!("{dir}/{name}");
                let ops = vec![
                    TxnOp::Create { path: lock.clone(), data: Vec::new(), mode: NodeMode::Ephemeral },
                    TxnOp::Delete { path: item_path, version: None },
                    TxnOp::Delete { path: lock, version: None },
                ];
                (ops, vec![(0, dir.clone())])
            },
            None => (vec![TxnOp::Delete { path: item_path, version: None }], Vec::new()),
        };
        match self.apply_txn(zk, &ops, &parents).await.map_err(|e| e.error) {
            Ok(_) => {
                self.cache.removed_local();
                Ok(true)
            },
            Err(ZkError::NoNode | ZkError::NodeExists) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }
}

/// A message's kind fields, for an error message.
fn describe(meta: &ItemMeta) -> String {
    match meta {
        ItemMeta::Priority(priority) => format!("priority {priority}"),
        ItemMeta::DeliverAt(at) => format!("deliver_at {at}"),
        ItemMeta::Id(id) => format!("id {id:?}"),
        ItemMeta::Plain => "no kind fields".to_owned(),
    }
}
