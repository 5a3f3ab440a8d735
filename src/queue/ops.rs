//! Put, take, peek, remove and introspection on one queue.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lease::{LeaseClaim, LeaseGrant};
use super::names::{self, ItemMeta, ItemName};
use super::{Queue, QueueError, envelope};
use crate::config::QueueKind;
use crate::metrics::GaugeGuard;
use crate::zk::{NodeMode, TxnOp, Zk, ZkError};

/// What a put asks for beyond the body.
#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    pub priority: Option<i32>,
    /// Absolute delivery time, epoch ms (delay queues).
    pub deliver_at: Option<i64>,
    pub id: Option<String>,
    /// How long to wait for room when the queue is at `max_items`.
    pub wait: Duration,
}

/// A stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutReceipt {
    pub message_id: String,
}

/// A message handed out by a take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub message_id: String,
    pub body: Vec<u8>,
    pub meta: ItemMeta,
}

/// One message seen by a peek.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekedItem {
    pub message_id: String,
    /// Position inside a multi-item node written by Curator's `putMulti` (0 otherwise).
    pub item_index: usize,
    pub body: Vec<u8>,
    pub meta: ItemMeta,
}

/// What `GET /v1/queues/{queue}` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    pub depth: i64,
    pub in_flight: i64,
    pub waiting_takers: usize,
    pub oldest_age_ms: Option<i64>,
}

/// What a claim whose answer was lost turned out to be.
enum ClaimOutcome {
    Applied,
    NotApplied,
    Undetermined(ZkError),
}

/// A message handed out, with its lease when it was leased.
type Delivery = (Message, Option<LeaseGrant>);

/// What kind of consumption is asked for.
#[derive(Debug, Clone, Copy)]
enum Acquire {
    Take,
    Lease(Duration),
}

/// How a claimed node is resolved once its data is read.
enum Claim {
    /// The node (and our lock, if any) was removed; these are its items.
    Taken(Message),
    /// The node is locked by this zkq for a lease.
    Leased(Message, LeaseGrant),
    /// Someone else has it (consumed or changed): try the next candidate.
    Lost,
    /// A consumer holds its lock.
    Locked,
    /// Not a Curator envelope: skipped and left in place.
    Undecodable,
    /// The taker left before anything was removed.
    Abandoned,
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
            QueueKind::Delay => ItemMeta::DeliverAt(options.deliver_at.unwrap_or_else(super::now_epoch_ms).max(1)),
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

    fn encode(&self, body: &[u8]) -> Vec<u8> {
        if self.kind == QueueKind::Simple { body.to_vec() } else { envelope::encode([body]) }
    }

    /// Stores one message; answers only after ZooKeeper confirmed the node.
    pub async fn put(&self, body: &[u8], options: PutOptions) -> Result<PutReceipt, QueueError> {
        if self.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        if body.len() > self.max_message_bytes {
            return Err(QueueError::TooLarge { size: body.len(), max: self.max_message_bytes });
        }
        let meta = self.meta_for(&options)?;
        let _in_flight = GaugeGuard::new(self.metrics.puts_in_flight.with_label_values(&[&self.name]));
        let deadline = self.deadline_for(options.wait);
        if let Some(max_items) = self.max_items
            && !self.cache.room_for(max_items, Instant::now() + options.wait).await
        {
            return Err(QueueError::Full { max_items });
        }
        let zk = self.session.connected(deadline).await?;
        let prefix = format!("{}/{}", self.path, names::put_prefix(self.kind, &meta));
        let data = self.encode(body);
        let created = match zk.create(&prefix, &data, NodeMode::PersistentSequential).await {
            Err(ZkError::NoNode) => {
                // The queue node was removed under us: recreate it the way Curator does, once.
                zk.ensure_path(&self.path).await?;
                zk.create(&prefix, &data, NodeMode::PersistentSequential).await
            },
            other => other,
        };
        let created = created.inspect_err(|err| {
            if *err == ZkError::OutcomeUnknown {
                self.metrics.put_outcome_unknown.with_label_values(&[&self.name]).inc();
            }
        })?;
        let name = created.rsplit('/').next().unwrap_or(&created).to_owned();
        if let Some(item) = names::parse(self.kind, &name) {
            self.cache.insert_local(item);
        }
        self.metrics.messages_put.with_label_values(&[&self.name]).inc();
        Ok(PutReceipt { message_id: name })
    }

    /// Removes the head message and returns it, waiting up to `wait` for one.
    ///
    /// The claim runs in its own task: if the caller goes away (HTTP client disconnected),
    /// nothing is removed, and a message removed just as it left is put back.
    pub async fn take(self: &Arc<Self>, wait: Duration) -> Result<Option<Message>, QueueError> {
        Ok(self.acquire(wait, Acquire::Take).await?.map(|(message, _)| message))
    }

    /// Leases the head message for `visibility`, waiting up to `wait` for one. The message stays
    /// in ZooKeeper, locked with Curator's lock node, until it is acked, nacked or expires.
    pub async fn lease(
        self: &Arc<Self>,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Option<(Message, LeaseGrant)>, QueueError> {
        self.check_leasable()?;
        let acquired = self.acquire(wait, Acquire::Lease(visibility)).await?;
        Ok(acquired.and_then(|(message, grant)| grant.map(|grant| (message, grant))))
    }

    async fn acquire(self: &Arc<Self>, wait: Duration, how: Acquire) -> Result<Option<Delivery>, QueueError> {
        if self.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        let (tx, rx) = oneshot::channel();
        let queue = self.clone();
        tokio::spawn(async move {
            let mut tx = tx;
            let result = queue.acquire_until(Instant::now() + wait, how, &mut tx).await;
            if let Err(Ok(Some((message, grant)))) = tx.send(result) {
                // The caller left after the message was claimed: give it back.
                match grant {
                    Some(grant) => queue.abandon_lease(&grant.receipt).await,
                    None => queue.put_back(message).await,
                }
            }
        });
        rx.await.unwrap_or(Err(QueueError::ShuttingDown))
    }

    async fn acquire_until(
        self: &Arc<Self>,
        wait_until: Instant,
        how: Acquire,
        caller: &mut oneshot::Sender<Result<Option<Delivery>, QueueError>>,
    ) -> Result<Option<Delivery>, QueueError> {
        let gone = CancellationToken::new();
        let mut first_wait = true;
        loop {
            if caller.is_closed() {
                return Ok(None);
            }
            if self.shutdown.is_cancelled() {
                return Err(QueueError::ShuttingDown);
            }
            let Some(candidate) = self.cache.pop() else {
                // Empty: if a watch said something changed, re-read before answering.
                if self.cache.is_dirty() {
                    let refresh_deadline = wait_until.max(Instant::now() + self.session.request_timeout());
                    let refreshed = tokio::select! {
                        r = self.cache.refreshed(refresh_deadline) => r,
                        _ = caller.closed() => return Ok(None),
                    };
                    if refreshed {
                        continue;
                    }
                }
                if Instant::now() >= wait_until {
                    return Ok(None);
                }
                let shutdown = self.shutdown.clone();
                let woken = tokio::select! {
                    w = self.cache.wait_for_item(wait_until, &gone, first_wait) => w,
                    _ = caller.closed() => { gone.cancel(); return Ok(None) },
                    _ = shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                };
                first_wait = false;
                if !woken && Instant::now() >= wait_until {
                    return Ok(None);
                }
                continue;
            };
            // Each claim gets the full request timeout, whatever is left of the taker's wait.
            let Some(zk) = self.session.current() else {
                // Suspended: nothing is handed out from memory; wait for the session or the deadline.
                self.cache.push_front(candidate);
                if Instant::now() >= wait_until {
                    return Err(ZkError::Unavailable.into());
                }
                let _ = self.session.connected(wait_until).await;
                continue;
            };
            let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
            let claimed = match how {
                Acquire::Take => self.claim(&zk, &candidate, caller).await,
                Acquire::Lease(visibility) => match self.claim_lease(&zk, &candidate, visibility).await {
                    Ok(LeaseClaim::Granted(message, grant)) => Ok(Claim::Leased(message, grant)),
                    Ok(LeaseClaim::Lost) => Ok(Claim::Lost),
                    Ok(LeaseClaim::Locked) => Ok(Claim::Locked),
                    Ok(LeaseClaim::Undecodable) => Ok(Claim::Undecodable),
                    Err(err) => Err(err),
                },
            };
            match claimed {
                Ok(Claim::Taken(message)) => {
                    self.metrics.messages_taken.with_label_values(&[&self.name]).inc();
                    return Ok(Some((message, None)));
                },
                Ok(Claim::Leased(message, grant)) => {
                    self.metrics.messages_leased.with_label_values(&[&self.name]).inc();
                    return Ok(Some((message, Some(grant))));
                },
                Ok(Claim::Locked) => {
                    // Held by a consumer: offer it again when that lock goes away.
                    self.cache.watch_lock(&zk, candidate, self.lock_path.as_deref());
                },
                Ok(Claim::Lost | Claim::Undecodable) => {},
                Ok(Claim::Abandoned) => {
                    self.cache.push_front(candidate);
                    return Ok(None);
                },
                Err(err) if err.is_transient() => {
                    self.cache.push_front(candidate);
                    if Instant::now() >= wait_until {
                        return Err(err.into());
                    }
                },
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Tries to take `candidate` in two round trips: read it, then one transaction that removes
    /// it only if its version is unchanged. On a queue with a lock path the same transaction
    /// also creates and deletes Curator's lock node `<lockPath>/<item>`: if a Curator lock-safe
    /// consumer (or a lease) holds that lock, the create fails and nothing changes; if it does
    /// not, nobody can take the lock between our check and our delete, because both are one
    /// atomic step. Curator's own lock-safe consumer needs three round trips for the same.
    async fn claim(
        self: &Arc<Self>,
        zk: &Zk,
        candidate: &ItemName,
        caller: &oneshot::Sender<Result<Option<Delivery>, QueueError>>,
    ) -> Result<Claim, ZkError> {
        let item_path = format!("{}/{}", self.path, candidate.name);
        let (data, stat) = match zk.get_data(&item_path).await {
            Ok(found) => found,
            Err(ZkError::NoNode) => return Ok(Claim::Lost),
            Err(err) => return Err(err),
        };
        let mut items = if self.kind == QueueKind::Simple {
            vec![data]
        } else {
            match envelope::decode(&data) {
                Ok(items) if !items.is_empty() => items,
                Ok(_) | Err(_) => {
                    if self.cache.mark_undecodable(&candidate.name) {
                        let why = envelope::decode(&data).err().map_or("holds no items".to_owned(), |e| e.to_string());
                        tracing::warn!(queue = %self.name, node = %candidate.name, reason = %why,
                            "skipping a queue node that is not a Curator envelope (left in place)");
                    }
                    return Ok(Claim::Undecodable);
                },
            }
        };
        if caller.is_closed() {
            return Ok(Claim::Abandoned);
        }
        let first = items.remove(0);
        let lock = self.lock_path.as_ref().map(|dir| format!("{dir}/{}", candidate.name));
        let mut ops = Vec::with_capacity(3);
        if let Some(lock) = &lock {
            ops.push(TxnOp::Create { path: lock.clone(), data: Vec::new(), mode: NodeMode::Ephemeral });
        }
        if items.is_empty() {
            ops.push(TxnOp::Delete { path: item_path.clone(), version: Some(stat.version) });
        } else {
            // A multi-item node (Curator putMulti) keeps its place with the remaining items.
            let rest = envelope::encode(items.iter().map(Vec::as_slice));
            ops.push(TxnOp::SetData { path: item_path.clone(), data: rest, version: Some(stat.version) });
        }
        if let Some(lock) = &lock {
            ops.push(TxnOp::Delete { path: lock.clone(), version: None });
        }
        let applied = match self.apply_with_lock_dir(zk, &ops).await? {
            // The answer was lost: find out, so that a message removed by us is not lost.
            Err(ZkError::OutcomeUnknown) => {
                let deadline = Instant::now() + self.session.request_timeout();
                match self.claim_outcome(&item_path, stat.version, &items, deadline).await {
                    ClaimOutcome::Applied => Ok(()),
                    // Still there: offer it again.
                    ClaimOutcome::NotApplied => Err(ZkError::OutcomeUnknown),
                    ClaimOutcome::Undetermined(_) => {
                        // ZooKeeper is not back yet: settle it in the background (put the message
                        // back if our claim removed it, offer it again if not) and move on.
                        let message = Message {
                            message_id: candidate.name.clone(),
                            body: first.clone(),
                            meta: candidate.meta.clone(),
                        };
                        self.settle_claim_later(candidate.clone(), stat.version, items.clone(), message);
                        return Ok(Claim::Lost);
                    },
                }
            },
            other => other,
        };
        match applied {
            Ok(()) => {},
            // Consumed or changed by someone else: try the next one.
            Err(ZkError::NoNode | ZkError::BadVersion) => return Ok(Claim::Lost),
            // A consumer (Curator lock-safe, or a lease) holds its lock, unless it is an orphan of
            // ours (a lease step whose answer was lost): then release it and offer the item again.
            Err(ZkError::NodeExists) => {
                if let Some(lock) = &lock
                    && !self.leases.holds(&candidate.name)
                    && self.is_own_orphan_lock(zk, lock, &candidate.name).await?
                {
                    zk.delete(lock, None).await?;
                    self.cache.reoffer(candidate.clone());
                    return Ok(Claim::Lost);
                }
                return Ok(Claim::Locked);
            },
            Err(err) => return Err(err),
        }
        if items.is_empty() {
            self.cache.removed_local();
        } else {
            self.cache.push_front(candidate.clone());
        }
        Ok(Claim::Taken(Message { message_id: candidate.name.clone(), body: first, meta: candidate.meta.clone() }))
    }

    /// Settles a claim whose outcome is still unknown once ZooKeeper is back: if it removed the
    /// message (or its first item), the message is put back; if not, the item is offered again.
    fn settle_claim_later(self: &Arc<Self>, item: ItemName, version: i32, rest: Vec<Vec<u8>>, message: Message) {
        let queue = self.clone();
        tokio::spawn(async move {
            let item_path = format!("{}/{}", queue.path, item.name);
            let deadline = Instant::now() + queue.session.session_timeout() * 2;
            loop {
                match queue.claim_outcome(&item_path, version, &rest, deadline).await {
                    ClaimOutcome::Applied => return queue.put_back(message).await,
                    ClaimOutcome::NotApplied => return queue.cache.reoffer(item),
                    ClaimOutcome::Undetermined(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    },
                    ClaimOutcome::Undetermined(err) => {
                        // Never lose it: at worst it is delivered twice.
                        tracing::error!(queue = %queue.name, message = %message.message_id, error = %err,
                            "could not settle a take whose answer was lost; putting the message back");
                        return queue.put_back(message).await;
                    },
                }
            }
        });
    }

    /// After a claim whose answer was lost, looks at the node (waiting for a session until
    /// `deadline`). Gone, or holding exactly the remaining items at the next version, means our
    /// claim applied; unchanged (or changed by someone else) means it did not. A message someone
    /// else took in that very window counts as ours: that needs two faults at once, where
    /// guessing the other way loses a message on one.
    async fn claim_outcome(&self, item_path: &str, version: i32, rest: &[Vec<u8>], deadline: Instant) -> ClaimOutcome {
        let zk = match self.session.connected(deadline).await {
            Ok(zk) => zk.with_deadline(Instant::now() + self.session.request_timeout()),
            Err(err) => return ClaimOutcome::Undetermined(err),
        };
        match zk.get_data(item_path).await {
            Err(ZkError::NoNode) if rest.is_empty() => ClaimOutcome::Applied,
            Err(ZkError::NoNode) => ClaimOutcome::NotApplied,
            Err(err) => ClaimOutcome::Undetermined(err),
            Ok((data, stat)) => {
                let ours = !rest.is_empty()
                    && stat.version == version + 1
                    && data == envelope::encode(rest.iter().map(Vec::as_slice));
                if ours { ClaimOutcome::Applied } else { ClaimOutcome::NotApplied }
            },
        }
    }

    /// Applies `ops` that create a lock node; if the lock directory is missing (first use, or
    /// removed), creates it like Curator and tries once more. The outer error is a failure to
    /// check or create the directory; the inner result is the operations'.
    async fn apply_with_lock_dir(&self, zk: &Zk, ops: &[TxnOp]) -> Result<Result<(), ZkError>, ZkError> {
        let applied = self.apply(zk, ops).await;
        if applied == Err(ZkError::NoNode)
            && let Some(dir) = &self.lock_path
            && zk.exists(dir).await?.is_none()
        {
            zk.ensure_path(dir).await?;
            return Ok(self.apply(zk, ops).await);
        }
        Ok(applied)
    }

    /// Applies `ops`: a single operation as itself, several as one transaction.
    async fn apply(&self, zk: &Zk, ops: &[TxnOp]) -> Result<(), ZkError> {
        match ops {
            [TxnOp::Delete { path, version }] => zk.delete(path, *version).await,
            [TxnOp::SetData { path, data, version }] => zk.set_data(path, data, *version).await.map(|_| ()),
            _ => zk.multi(ops).await.map(|_| ()).map_err(|e| e.error),
        }
    }

    /// Puts back a message whose taker vanished after it was removed: same kind fields, at the
    /// tail (its original place is gone). Logged, since order changes.
    async fn put_back(&self, message: Message) {
        tracing::warn!(queue = %self.name, message = %message.message_id,
            "taker disconnected after the message was removed; putting it back");
        let options = PutOptions {
            priority: match message.meta {
                ItemMeta::Priority(p) => Some(p),
                _ => None,
            },
            deliver_at: match message.meta {
                ItemMeta::DeliverAt(at) => Some(at),
                _ => None,
            },
            id: match &message.meta {
                ItemMeta::Id(id) => Some(id.clone()),
                _ => None,
            },
            wait: self.session.session_timeout(),
        };
        let mut attempts = 0;
        loop {
            match self.put_unchecked(&message.body, &options).await {
                Ok(_) => return,
                Err(err) if attempts < 5 => {
                    attempts += 1;
                    tracing::warn!(queue = %self.name, error = ?err, "retrying put-back");
                    tokio::time::sleep(Duration::from_millis(200 * attempts)).await;
                },
                Err(err) => {
                    tracing::error!(queue = %self.name, message = %message.message_id, error = ?err,
                        "could not put back a message whose taker disconnected");
                    return;
                },
            }
        }
    }

    /// A put that ignores shutdown and `max_items` (for messages that were already accepted).
    async fn put_unchecked(&self, body: &[u8], options: &PutOptions) -> Result<(), QueueError> {
        let meta = self.meta_for(options)?;
        let zk = self.session.connected(self.deadline_for(options.wait)).await?;
        let prefix = format!("{}/{}", self.path, names::put_prefix(self.kind, &meta));
        zk.create(&prefix, &self.encode(body), NodeMode::PersistentSequential).await?;
        Ok(())
    }

    /// The first `limit` messages in delivery order, without removing them.
    pub async fn peek(&self, limit: usize) -> Result<Vec<PeekedItem>, QueueError> {
        let zk = self.session.connected(self.deadline_for(Duration::ZERO)).await?;
        let children = match zk.get_children(&self.path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(err.into()),
        };
        let mut items: Vec<ItemName> = children.iter().filter_map(|c| names::parse(self.kind, c)).collect();
        items.sort_by(|a, b| names::compare(self.kind, a, b));
        let mut out = Vec::new();
        for item in items {
            if out.len() >= limit {
                break;
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
                if out.len() >= limit {
                    break;
                }
                out.push(PeekedItem {
                    message_id: item.name.clone(),
                    item_index: index,
                    body,
                    meta: item.meta.clone(),
                });
            }
        }
        Ok(out)
    }

    /// Depth, messages in flight, waiting takers and the age of the head message.
    pub async fn info(&self) -> Result<QueueInfo, QueueError> {
        let zk = self.session.connected(self.deadline_for(Duration::ZERO)).await?;
        let depth = zk.exists(&self.path).await?.map_or(0, |s| i64::from(s.num_children));
        let in_flight = match &self.lock_path {
            Some(lock_path) => zk.exists(lock_path).await?.map_or(0, |s| i64::from(s.num_children)),
            None => 0,
        };
        let oldest_age_ms = match self.cache.head_candidate() {
            Some(head) => zk
                .exists(&format!("{}/{}", self.path, head.name))
                .await?
                .map(|s| (super::now_epoch_ms() - s.ctime).max(0)),
            None => None,
        };
        Ok(QueueInfo { depth, in_flight, waiting_takers: self.cache.waiting(), oldest_age_ms })
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
        // As in `claim`: the lock node is created and deleted in the same transaction, so an item
        // a consumer holds a lock on is never removed.
        let ops = match &self.lock_path {
            Some(dir) => {
                let lock = format!("{dir}/{name}");
                vec![
                    TxnOp::Create { path: lock.clone(), data: Vec::new(), mode: NodeMode::Ephemeral },
                    TxnOp::Delete { path: item_path, version: None },
                    TxnOp::Delete { path: lock, version: None },
                ]
            },
            None => vec![TxnOp::Delete { path: item_path, version: None }],
        };
        match self.apply_with_lock_dir(zk, &ops).await? {
            Ok(()) => {
                self.cache.removed_local();
                Ok(true)
            },
            Err(ZkError::NoNode | ZkError::NodeExists) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }
}
