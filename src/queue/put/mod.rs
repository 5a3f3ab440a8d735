//! Puts: one message, a batch (all or none), a Curator `putMulti` node, and keyed puts stored
//! once per idempotency key (`idempotency/`). Every put is a unit of group commit
//! (`zk/group.rs`): puts in flight together go to ZooKeeper as one transaction.

pub(super) mod idempotency;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::attributes;
use super::cache::ChildrenCache;
use super::context::Context;
use super::finish::finish;
use super::message::{NodeCreate, PutOptions, PutReceipt};
use super::names::{self, ItemMeta};
use super::{QueueError, envelope};
use crate::config::QueueKind;
use crate::metrics::GaugeGuard;
use crate::types::Layout;
use crate::zk::{Booking, NodeMode, TxnOp, TxnResult, Zk, ZkError};
use idempotency::{Idempotency, KeyedCaller, KeyedPut};

/// The puts of one queue, with the records of its idempotency keys. Its fields are private to
/// `put/`: the rest of the queue puts only through these methods.
pub(super) struct Puts {
    ctx: Arc<Context>,
    cache: Arc<ChildrenCache>,
    /// Records of idempotency keys: `{root}/idempotency/{queue}`.
    idempotency: Idempotency,
}

impl Puts {
    pub(super) fn new(ctx: Arc<Context>, cache: Arc<ChildrenCache>, layout: &Layout, window: Duration) -> Puts {
        let idempotency = Idempotency::new(layout, &ctx.name, window);
        Puts { ctx, cache, idempotency }
    }

    /// Whether idempotency records of this queue wait for its sweeper (the queue stays open).
    pub(super) fn holds_records(&self) -> bool {
        self.idempotency.holds_records()
    }

    /// Forgets every idempotency key of the queue (a purge: SQS forgets its deduplication ids
    /// then). `false` when the request's deadline came first.
    pub(super) async fn forget_keys(&self) -> Result<bool, QueueError> {
        let deadline = self.ctx.deadline_for(Duration::ZERO);
        let zk = self.ctx.session.connected(deadline).await?.with_deadline(deadline);
        Ok(self.idempotency.forget_all(&zk).await?)
    }

    /// Where the records of this queue's keys live.
    pub(super) fn records_dir(&self) -> String {
        self.idempotency.keys_dir()
    }

    fn meta_for(&self, options: &PutOptions) -> Result<ItemMeta, QueueError> {
        let kind = self.ctx.kind.as_str();
        let refuse = |param: &str| {
            Err(QueueError::NotForKind(format!("`{param}` does not apply to {kind} queue {:?}", self.ctx.name)))
        };
        if options.priority.is_some() && self.ctx.kind != QueueKind::Priority {
            return refuse("priority");
        }
        // A delay queue's messages, and a plain fifo queue's, have a delivery time (`names::parse`).
        let timed = self.ctx.kind == QueueKind::Delay || (self.ctx.kind == QueueKind::Fifo && !self.ctx.grouped);
        if options.deliver_at.is_some() && !timed {
            if self.ctx.grouped {
                return Err(QueueError::NotForKind(format!(
                    "`delay/deliver_at` does not apply to grouped queue {:?}: its names hold the group",
                    self.ctx.name
                )));
            }
            return refuse("delay/deliver_at");
        }
        if options.id.is_some() && self.ctx.kind != QueueKind::Id {
            return refuse("id");
        }
        if options.group.is_some() && !self.ctx.grouped {
            return Err(QueueError::NotForKind(format!(
                "`group` applies only to a grouped queue (queues.NAME.grouped = true); {:?} is not grouped",
                self.ctx.name
            )));
        }
        // An id queue's id is its group: both given must agree.
        let id = match (&options.id, &options.group) {
            (Some(id), Some(group)) if id != group => {
                return Err(QueueError::InvalidParameter(format!(
                    "`group` ({group:?}) and `id` ({id:?}) differ; on an id queue the id is the group: give one"
                )));
            },
            (Some(id), _) | (None, Some(id)) => Some(id.clone()),
            (None, None) => None,
        };
        let valid_id = |id: String, what: &str| {
            if names::is_valid_id(&id) {
                return Ok(id);
            }
            Err(QueueError::InvalidParameter(format!(
                "{what} must be 1 to 200 bytes without characters ZooKeeper refuses (control characters, \
                 U+D800-U+F8FF, U+FFF0 and above)"
            )))
        };
        Ok(match self.ctx.kind {
            QueueKind::Priority => ItemMeta::Priority(options.priority.unwrap_or(0)),
            QueueKind::Delay => {
                ItemMeta::DeliverAt(options.deliver_at.unwrap_or_else(crate::types::now_epoch_ms).max(1))
            },
            QueueKind::Id => {
                let id = id.ok_or_else(|| {
                    QueueError::NotForKind(format!("id queue {:?} needs ?id= on every put", self.ctx.name))
                })?;
                ItemMeta::Id(valid_id(id, "id")?)
            },
            // A grouped fifo queue names a grouped message as an id queue does (`names::naming`).
            QueueKind::Fifo => match (id, options.deliver_at) {
                (Some(group), _) => ItemMeta::Id(valid_id(group, "group")?),
                // Due already: a plain name, in Curator's order with the others.
                (None, Some(at)) if at > crate::types::now_epoch_ms() => ItemMeta::DeliverAt(at),
                (None, _) => ItemMeta::Plain,
            },
            QueueKind::Simple => ItemMeta::Plain,
        })
    }

    /// Stores one message; answers only after ZooKeeper confirmed the node.
    pub(super) async fn put(self: &Arc<Self>, body: &[u8], options: PutOptions) -> Result<PutReceipt, QueueError> {
        let wait = options.wait;
        let mut receipts = self.put_many(vec![(body, options)], wait).await?;
        receipts.pop().ok_or(QueueError::Zk(ZkError::OutcomeUnknown))
    }

    /// Stores `messages` all or none, in one ZooKeeper transaction (shared with other puts in
    /// flight, [`GroupCommit`](crate::zk::GroupCommit)); the receipts are in the same order. With
    /// `max_items`, waits up to `wait` until there is room for all of them. A message with an
    /// idempotency key goes with its key's record, in the same transaction; one whose key was used
    /// within the window is not stored again (`idempotency/`).
    pub(super) async fn put_many(
        self: &Arc<Self>,
        messages: Vec<(&[u8], PutOptions)>,
        wait: Duration,
    ) -> Result<Vec<PutReceipt>, QueueError> {
        if self.ctx.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        let mut creates = Vec::with_capacity(messages.len());
        let mut keys = Vec::with_capacity(messages.len());
        for (body, options) in &messages {
            if body.len() > self.ctx.max_message_bytes {
                return Err(QueueError::TooLarge { size: body.len(), max: self.ctx.max_message_bytes });
            }
            let meta = self.meta_for(options)?;
            let mut data = self.ctx.encode(body);
            let carries = !options.attributes.is_empty() || options.traceparent.is_some();
            if carries && self.ctx.kind == QueueKind::Simple {
                return Err(QueueError::NotForKind(format!(
                    "simple queue {:?} stores bare bodies: it has no place for message attributes or a traceparent",
                    self.ctx.name
                )));
            }
            // The put's key goes with the message (SQS's MessageDeduplicationId), beside what the
            // client sent: at most 128 bytes more, not counted in the message's size. A simple
            // queue's bare bodies keep none.
            let key = options.idempotency_key.clone().filter(|_| self.ctx.kind != QueueKind::Simple);
            if carries || key.is_some() {
                attributes::check(&options.attributes).map_err(|err| QueueError::InvalidParameter(err.to_string()))?;
                let mut trailer = attributes::Trailer {
                    attributes: options.attributes.clone(),
                    traceparent: options.traceparent.clone(),
                    deduplication_id: None,
                };
                let mut bytes = attributes::trailer(&trailer);
                let size = body.len() + bytes.len();
                if size > self.ctx.max_message_bytes {
                    return Err(QueueError::TooLarge { size, max: self.ctx.max_message_bytes });
                }
                if key.is_some() {
                    trailer.deduplication_id = key;
                    bytes = attributes::trailer(&trailer);
                }
                data.extend(bytes);
            }
            creates.push(NodeCreate { prefix: names::put_prefix(self.ctx.naming, &meta), data });
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
        let deadline = self.ctx.deadline_for(wait);
        if !seen.is_empty() {
            return self.put_keyed_detached(creates, keys, wait, deadline).await;
        }
        let _in_flight = GaugeGuard::new(self.ctx.qm.puts_in_flight.clone());
        self.wait_for_room(creates.len(), wait).await?;
        let nodes: Vec<(usize, u64)> = creates.iter().map(|create| (create.data.len(), 1)).collect();
        let ops: Vec<TxnOp> = creates
            .into_iter()
            .map(|create| TxnOp::Create {
                path: format!("{}/{}", self.ctx.path, create.prefix),
                data: create.data,
                mode: NodeMode::PersistentSequential,
            })
            .collect();
        let created = self.create_nodes(ops, deadline, nodes).await?;
        Ok(created.into_iter().map(|name| PutReceipt { message_id: Some(name), replay: false }).collect())
    }

    /// Keyed puts run to their end whether or not the request still waits ([`finish`]), as claims do:
    /// a keyed put takes several steps (its records, the transaction, the message's name written
    /// into its record, a lost answer resolved by evidence), and a client that leaves must not cut
    /// them short once a transaction was sent. A retry with the same key then learns what was
    /// stored. A keyed put whose client left before it sent anything stops (`put_keyed`).
    async fn put_keyed_detached(
        self: &Arc<Self>,
        creates: Vec<NodeCreate>,
        keys: Vec<Option<KeyedPut>>,
        wait: Duration,
        deadline: Instant,
    ) -> Result<Vec<PutReceipt>, QueueError> {
        let puts = self.clone();
        // Its log lines still carry the request's id.
        let stored = finish(&self.ctx.background, |tx| async move {
            let mut caller: KeyedCaller = tx;
            let _in_flight = GaugeGuard::new(puts.ctx.qm.puts_in_flight.clone());
            let result = Box::pin(puts.put_keyed(creates, keys, wait, deadline, &mut caller)).await;
            let _ = caller.send(result);
        });
        stored.await.unwrap_or(Err(QueueError::ShuttingDown))
    }

    /// Stores `messages` as ONE node holding all of them, the way Curator's `putMulti` does
    /// (fifo, priority and delay queues; Curator has none for id and simple queues), with the
    /// kind fields every message shares (different ones are refused). Curator consumers receive
    /// them together, in order; zkq's first take or lease of the node hands out the first message
    /// and splits the others into nodes of their own right behind it. The node counts as one
    /// child against `max_items`, as in Curator. Idempotency keys are refused: a key stands for
    /// one message, and this node holds several.
    pub(super) async fn put_multi(
        &self,
        messages: Vec<(&[u8], PutOptions)>,
        wait: Duration,
    ) -> Result<PutReceipt, QueueError> {
        if self.ctx.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        if !matches!(self.ctx.kind, QueueKind::Fifo | QueueKind::Priority | QueueKind::Delay) {
            return Err(QueueError::NotForKind(format!(
                "format=curator-multi is for fifo, priority and delay queues; Curator has no putMulti for {} queue {:?}",
                self.ctx.kind.as_str(),
                self.ctx.name
            )));
        }
        let annexed = |options: &PutOptions| !options.attributes.is_empty() || options.traceparent.is_some();
        if let Some(index) = messages.iter().position(|(_, options)| annexed(options)) {
            return Err(QueueError::InvalidParameter(format!(
                "messages[{index}] has attributes or a traceparent: format=curator-multi stores the batch as one \
                 node, which holds neither"
            )));
        }
        if let Some(index) = messages.iter().position(|(_, options)| options.group.is_some()) {
            return Err(QueueError::InvalidParameter(format!(
                "messages[{index}] has a group: format=curator-multi stores the batch as one node, which \
                 belongs to no group; put grouped messages as nodes"
            )));
        }
        if let Some(index) = messages.iter().position(|(_, options)| options.idempotency_key.is_some()) {
            return Err(QueueError::InvalidParameter(format!(
                "messages[{index}] has an idempotency_key: format=curator-multi stores the batch as one node, \
                 and a key stands for one message"
            )));
        }
        // A delay queue's message without a delivery time is due now: the same "now" for all.
        let now = crate::types::now_epoch_ms();
        let mut shared: Option<ItemMeta> = None;
        for (index, (body, options)) in messages.iter().enumerate() {
            if body.len() > self.ctx.max_message_bytes {
                return Err(QueueError::TooLarge { size: body.len(), max: self.ctx.max_message_bytes });
            }
            let mut options = options.clone();
            if self.ctx.kind == QueueKind::Delay {
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
                        if self.ctx.kind == QueueKind::Priority { "priority" } else { "delivery time" },
                        describe(&meta),
                        describe(first),
                    )));
                },
            }
        }
        let Some(meta) = shared else {
            return Err(QueueError::InvalidParameter("a batch holds at least one message".to_owned()));
        };
        let data = envelope::encode(messages.iter().map(|(body, _)| *body));
        let len = data.len();
        let op = TxnOp::Create {
            path: format!("{}/{}", self.ctx.path, names::put_prefix(self.ctx.naming, &meta)),
            data,
            mode: NodeMode::PersistentSequential,
        };
        let _in_flight = GaugeGuard::new(self.ctx.qm.puts_in_flight.clone());
        self.wait_for_room(1, wait).await?;
        let nodes = vec![(len, messages.len() as u64)];
        let mut created = self.create_nodes(vec![op], self.ctx.deadline_for(wait), nodes).await?;
        let name = created.pop().ok_or(QueueError::Zk(ZkError::OutcomeUnknown))?;
        Ok(PutReceipt { message_id: Some(name), replay: false })
    }

    /// Creates the sequential nodes of `ops` in one transaction (shared with other writes in
    /// flight); recreates the queue node once if it was removed; answers the nodes' names in order.
    /// `nodes` (per create: its data length and how many messages it holds) is booked once the
    /// transaction applied, whether or not the caller still waits ([`Puts::booking`]).
    async fn create_nodes(
        &self,
        ops: Vec<TxnOp>,
        deadline: Instant,
        nodes: Vec<(usize, u64)>,
    ) -> Result<Vec<String>, QueueError> {
        let zk = self.ctx.session.connected(deadline).await?;
        let submit =
            |ops: Vec<TxnOp>| self.ctx.group.submit_booked(&self.ctx.background, &zk, ops, self.booking(nodes.clone()));
        let created = match submit(ops.clone()).await {
            Err(err) if err.error == ZkError::NoNode => {
                // No queue node (never made, deleted, or a container reaped): a put makes it, once.
                self.create_queue_node(&zk).await?;
                submit(ops).await
            },
            other => other,
        };
        let created = created.map_err(|err| {
            if err.error == ZkError::OutcomeUnknown {
                self.ctx.qm.put_outcome_unknown.inc();
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
        let mode = if self.ctx.kind == QueueKind::Simple { NodeMode::Container } else { NodeMode::Persistent };
        zk.ensure_path_as(&self.ctx.path, mode).await
    }

    /// With `max_items`, waits up to `wait` until there is room for `count` more messages.
    pub(super) async fn wait_for_room(&self, count: usize, wait: Duration) -> Result<(), QueueError> {
        let Some(max_items) = self.ctx.max_items else { return Ok(()) };
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
        book(&self.cache, self.ctx.naming, &self.ctx.qm.messages_put, name, None, 1);
        name.to_owned()
    }

    /// What follows a transaction of puts that applied, run by group commit whether or not the
    /// put's client still waits: each created node (`nodes`: its data length, its messages)
    /// booked as [`book`] says. A put whose client left is stored, so it is counted, and this
    /// sidecar's takers see it at once.
    fn booking(&self, nodes: Vec<(usize, u64)>) -> Booking {
        let (cache, kind, counter) = (self.cache.clone(), self.ctx.naming, self.ctx.qm.messages_put.clone());
        Box::new(move |results: &[TxnResult]| {
            let created = results.iter().filter_map(|result| match result {
                TxnResult::Created(path) => Some(path.rsplit('/').next().unwrap_or(path)),
                _ => None,
            });
            for (name, (len, messages)) in created.zip(nodes) {
                book(&cache, kind, &counter, name, Some(len), messages);
            }
        })
    }
}

/// A node of `messages` messages that a put of this sidecar stored (its data `len` bytes, when
/// known): the cache learns of it and its size, the counter counts its messages.
fn book(
    cache: &ChildrenCache,
    kind: QueueKind,
    counter: &prometheus::IntCounter,
    name: &str,
    len: Option<usize>,
    messages: u64,
) {
    if let Some(len) = len {
        cache.learn_bytes(name, len);
    }
    if let Some(item) = names::parse(kind, name) {
        cache.insert_local(item);
    }
    counter.inc_by(messages);
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
