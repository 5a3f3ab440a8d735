//! Leases: lock-path safe consumption over HTTP (ack, nack, extend, visibility timeout,
//! fenced receipts, delivery counts, dead-letter).
//!
//! A lease is Curator's lock node `<lockPath>/<item>` (EPHEMERAL) held by zkq's session. Every
//! later step of a lease (ack, nack, extend, expiry) goes through the `Zk` handle of the session
//! that created the lock, so it is fenced: once that session is gone, its lock is gone and every
//! call on it fails, and a newer session's zkq refuses the older receipts (CURATOR-605 is the
//! bug this prevents: a consumer whose session expired completing a message someone else holds).
//!
//! Delivery counts live in `{root}/deliveries/{queue}/{item}` (4-byte big-endian), a tree Curator
//! readers never look at; they survive restarts and are removed with the message.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::names::{self, ItemMeta, ItemName};
use super::{Queue, QueueError, envelope, now_epoch_ms};
use crate::config::QueueKind;
use crate::zk::{NodeMode, TxnOp, Zk, ZkError, ZkSession};

/// What a client gets with a leased message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The opaque receipt for ack, nack and extend.
    pub receipt: String,
    pub expires_at_ms: i64,
    pub delivery_count: u32,
}

/// What a nack does with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackMode {
    /// Delete it and put it back at the tail (Curator's ErrorMode.REQUEUE), keeping its kind fields.
    Requeue,
    /// Delete it (Curator's ErrorMode.DELETE).
    Delete,
    /// Release the lock; the message keeps its place.
    Keep,
}

impl NackMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NackMode::Requeue => "requeue",
            NackMode::Delete => "delete",
            NackMode::Keep => "keep",
        }
    }
}

/// Where dead letters of a queue go.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub max_deliveries: Option<u32>,
    pub name: String,
    pub kind: QueueKind,
    pub path: String,
}

/// What happens when a lease's time is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnExpiry {
    /// Visibility timeout: release the lock, the message keeps its place.
    Release,
    /// A nack with `delay` on a queue whose names cannot carry a time: requeue then.
    Requeue,
}

#[derive(Clone)]
struct Lease {
    item: ItemName,
    lock: String,
    counter: String,
    /// The session that created the lock; every later step goes through it.
    zk: Zk,
    /// The node's data when leased (all items, for a requeue with the same bytes).
    data: Vec<u8>,
    /// Items of the node (a Curator putMulti node has several; the lease hands out the first).
    items: Vec<Vec<u8>>,
    data_version: i32,
    delivery_count: u32,
    expires_at: Instant,
    on_expiry: OnExpiry,
    /// Still usable by the client (false once a delayed nack took it over).
    open: bool,
}

#[derive(Default)]
struct TableState {
    live: HashMap<u128, Lease>,
    next_sequence: u64,
    /// Items this process is leasing right now (lock being created, not yet in `live`).
    claiming: HashSet<String>,
}

/// The leases of one queue. A lease token is a sequence number and a MAC of it under a key of
/// this process, so a receipt that was issued here and has ended is told apart from one that
/// never was (409 against 404) without remembering ended leases.
#[derive(Default)]
pub struct LeaseTable {
    state: Mutex<TableState>,
    changed: Notify,
    key: std::hash::RandomState,
}

impl LeaseTable {
    fn lock(&self) -> MutexGuard<'_, TableState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn end(state: &mut TableState, token: u128) -> Option<Lease> {
        state.live.remove(&token)
    }

    fn mac(&self, session_id: i64, sequence: u64) -> u64 {
        use std::hash::BuildHasher;
        self.key.hash_one((session_id, sequence))
    }

    /// A new token for a lease of `session_id`.
    fn issue(&self, state: &mut TableState, session_id: i64) -> u128 {
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        (u128::from(sequence) << 64) | u128::from(self.mac(session_id, sequence))
    }

    /// Whether this process issued `token` for `session_id`.
    fn issued(&self, session_id: i64, token: u128) -> bool {
        let sequence = u64::try_from(token >> 64).unwrap_or(u64::MAX);
        let mac = u64::try_from(token & u128::from(u64::MAX)).unwrap_or(0);
        self.mac(session_id, sequence) == mac
    }

    pub fn in_flight(&self) -> usize {
        self.lock().live.len()
    }

    /// Whether a lease of this process holds or is taking `item`.
    pub(super) fn holds(&self, item: &str) -> bool {
        let state = self.lock();
        state.claiming.contains(item) || state.live.values().any(|l| l.item.name == item)
    }
}

/// Marks an item as being leased by this process for as long as it lives.
struct Claiming<'a> {
    table: &'a LeaseTable,
    item: String,
}

impl<'a> Claiming<'a> {
    fn begin(table: &'a LeaseTable, item: &str) -> Option<Claiming<'a>> {
        table.lock().claiming.insert(item.to_owned()).then(|| Claiming { table, item: item.to_owned() })
    }
}

impl Drop for Claiming<'_> {
    fn drop(&mut self) {
        self.table.lock().claiming.remove(&self.item);
    }
}

impl LeaseTable {}

fn receipt(session_id: i64, token: u128) -> String {
    format!("{:016x}{token:032x}", u64::from_ne_bytes(session_id.to_ne_bytes()))
}

fn parse_receipt(text: &str) -> Option<(i64, u128)> {
    if text.len() != 48 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let session = u64::from_str_radix(&text[..16], 16).ok()?;
    let token = u128::from_str_radix(&text[16..], 16).ok()?;
    Some((i64::from_ne_bytes(session.to_ne_bytes()), token))
}

fn counter_bytes(count: u32) -> Vec<u8> {
    count.to_be_bytes().to_vec()
}

fn read_counter(data: &[u8]) -> u32 {
    data.get(..4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_be_bytes)
}

fn epoch_ms_after(duration: Duration) -> i64 {
    now_epoch_ms().saturating_add(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
}

/// How a step on a held lease ended.
enum Settled {
    /// Done (now, or by an earlier attempt whose answer was lost).
    Done,
    /// The lease is no longer held; why.
    Lost(&'static str),
    /// ZooKeeper could not be asked or did not answer: the lease stays, the step can be retried.
    Retry(ZkError),
}

/// The result of trying to lease one candidate.
pub(super) enum LeaseClaim {
    Granted(super::Message, LeaseGrant),
    /// Someone else has it, it is gone, or it was moved to the dead-letter queue.
    Lost,
    /// Someone holds its lock: watch the lock and offer it again when released.
    Locked,
    Undecodable,
}

impl Queue {
    fn lock_dir(&self) -> Result<&str, QueueError> {
        self.lock_path.as_deref().ok_or_else(|| {
            QueueError::NotForKind(format!(
                "queue {:?} has no lock path, so it cannot lease (simple queues never lock); use take",
                self.name
            ))
        })
    }

    /// Checks that leases are possible on this queue.
    pub fn check_leasable(&self) -> Result<(), QueueError> {
        self.lock_dir().map(|_| ())
    }

    fn counter_path(&self, item: &str) -> String {
        format!("{}/{}", self.deliveries_path, item)
    }

    /// Tries to lease `candidate`: lock it like a Curator lock-safe consumer, read it and its
    /// delivery count in one round trip, then count this delivery (or dead-letter it).
    pub(super) async fn claim_lease(
        &self,
        zk: &Zk,
        candidate: &ItemName,
        visibility: Duration,
    ) -> Result<LeaseClaim, ZkError> {
        let Some(lock_dir) = self.lock_path.as_deref() else {
            return Ok(LeaseClaim::Lost);
        };
        let Some(_claiming) = Claiming::begin(&self.leases, &candidate.name) else {
            return Ok(LeaseClaim::Locked);
        };
        let lock = format!("{lock_dir}/{}", candidate.name);
        let mut created = zk.create(&lock, b"zkq", NodeMode::Ephemeral).await;
        if created == Err(ZkError::NoNode) {
            zk.ensure_path(lock_dir).await?;
            created = zk.create(&lock, b"zkq", NodeMode::Ephemeral).await;
        }
        match created {
            Ok(_) => {},
            // Ours without a lease: an earlier create whose answer was lost. Adopt it.
            Err(ZkError::NodeExists) if self.is_own_orphan_lock(zk, &lock, &candidate.name).await? => {},
            Err(ZkError::NodeExists) => return Ok(LeaseClaim::Locked),
            Err(err) => return Err(err),
        }
        let release = |zk: Zk, lock: String| async move {
            let _ = zk.delete(&lock, None).await;
        };
        let item_path = format!("{}/{}", self.path, candidate.name);
        let counter = self.counter_path(&candidate.name);
        let read = match zk.get_data_many(&[&item_path, &counter]).await {
            Ok(read) => read,
            Err(err) => {
                release(zk.clone(), lock).await;
                return Err(err);
            },
        };
        let mut read = read.into_iter();
        let (data, stat) = match read.next() {
            Some(Ok(found)) => found,
            Some(Err(ZkError::NoNode)) | None => {
                release(zk.clone(), lock).await;
                return Ok(LeaseClaim::Lost);
            },
            Some(Err(err)) => {
                release(zk.clone(), lock).await;
                return Err(err);
            },
        };
        let (previous, counter_version) = match read.next() {
            Some(Ok((bytes, stat))) => (read_counter(&bytes), Some(stat.version)),
            _ => (0, None),
        };
        let items = if self.kind == QueueKind::Simple {
            Some(vec![data.clone()])
        } else {
            envelope::decode(&data).ok().filter(|items| !items.is_empty())
        };
        let Some(items) = items else {
            if let Some(dead_letter) = &self.dead_letter {
                self.dead_letter(zk, candidate, &data, &lock, counter_version.map(|_| counter.as_str()), dead_letter)
                    .await?;
                return Ok(LeaseClaim::Lost);
            }
            if self.cache.mark_undecodable(&candidate.name) {
                tracing::warn!(queue = %self.name, node = %candidate.name,
                    "skipping a queue node that is not a Curator envelope (left in place; configure dead_letter to move it)");
            }
            release(zk.clone(), lock).await;
            return Ok(LeaseClaim::Undecodable);
        };
        let count = previous.saturating_add(1);
        if let Some(dead_letter) = &self.dead_letter
            && dead_letter.max_deliveries.is_some_and(|max| count > max)
        {
            self.dead_letter(zk, candidate, &data, &lock, counter_version.map(|_| counter.as_str()), dead_letter)
                .await?;
            return Ok(LeaseClaim::Lost);
        }
        let counted = match counter_version {
            Some(version) => zk.set_data(&counter, &counter_bytes(count), Some(version)).await.map(|_| ()),
            None => match zk.create(&counter, &counter_bytes(count), NodeMode::Persistent).await {
                Err(ZkError::NoNode) => {
                    zk.ensure_path(&self.deliveries_path).await?;
                    zk.create(&counter, &counter_bytes(count), NodeMode::Persistent).await.map(|_| ())
                },
                other => other.map(|_| ()),
            },
        };
        if let Err(err) = counted {
            // Another zkq counted concurrently? It cannot hold the lock; treat as transient.
            release(zk.clone(), lock).await;
            return Err(err);
        }
        let expires_at_ms = epoch_ms_after(visibility);
        let token = {
            let mut state = self.leases.lock();
            self.leases.issue(&mut state, zk.session_id())
        };
        let grant = LeaseGrant { receipt: receipt(zk.session_id(), token), expires_at_ms, delivery_count: count };
        let message = super::Message {
            message_id: candidate.name.clone(),
            body: items.first().cloned().unwrap_or_default(),
            meta: candidate.meta.clone(),
        };
        let lease = Lease {
            item: candidate.clone(),
            lock,
            counter,
            zk: zk.clone(),
            data,
            items,
            data_version: stat.version,
            delivery_count: count,
            expires_at: Instant::now() + visibility,
            on_expiry: OnExpiry::Release,
            open: true,
        };
        self.leases.lock().live.insert(token, lease);
        self.leases.changed.notify_one();
        self.metrics.leases_in_flight.with_label_values(&[&self.name]).inc();
        Ok(LeaseClaim::Granted(message, grant))
    }

    /// Whether `lock` is held by this process's session without a lease of this process: left by
    /// a step whose answer was lost (the create applied, or the delete did not). Nobody else can
    /// release it while the session lives, so the owner must.
    pub(super) async fn is_own_orphan_lock(&self, zk: &Zk, lock: &str, item: &str) -> Result<bool, ZkError> {
        let owned = zk.exists(lock).await?.is_some_and(|stat| stat.ephemeral_owner == zk.session_id());
        if !owned {
            return Ok(false);
        }
        // Our own claim of this item holds the `Claiming` mark; any other use would be a lease.
        let state = self.leases.lock();
        Ok(!state.live.values().any(|l| l.item.name == item))
    }

    /// Moves the node to the dead-letter queue in one transaction (create there, delete here,
    /// release the lock, drop the delivery count).
    async fn dead_letter(
        &self,
        zk: &Zk,
        candidate: &ItemName,
        data: &[u8],
        lock: &str,
        counter: Option<&str>,
        target: &DeadLetter,
    ) -> Result<(), ZkError> {
        // Re-encode for the target's kind; undecodable bytes become one item, so Curator can read them.
        let items = envelope::decode(data).unwrap_or_else(|_| vec![data.to_vec()]);
        let moved = if target.kind == QueueKind::Simple {
            items.concat()
        } else {
            envelope::encode(items.iter().map(Vec::as_slice))
        };
        let meta = match (&candidate.meta, target.kind) {
            (ItemMeta::Priority(p), QueueKind::Priority) => ItemMeta::Priority(*p),
            (ItemMeta::Id(id), QueueKind::Id) => ItemMeta::Id(id.clone()),
            (_, QueueKind::Id) => ItemMeta::Id(self.name.clone()),
            (_, QueueKind::Priority) => ItemMeta::Priority(0),
            (_, QueueKind::Delay) => ItemMeta::DeliverAt(now_epoch_ms()),
            _ => ItemMeta::Plain,
        };
        let mut ops = vec![
            TxnOp::Create {
                path: format!("{}/{}", target.path, names::put_prefix(target.kind, &meta)),
                data: moved,
                mode: NodeMode::PersistentSequential,
            },
            TxnOp::Delete { path: format!("{}/{}", self.path, candidate.name), version: None },
            TxnOp::Delete { path: lock.to_owned(), version: None },
        ];
        if let Some(counter) = counter {
            ops.push(TxnOp::Delete { path: counter.to_owned(), version: None });
        }
        let mut result = zk.multi(&ops).await;
        if result.as_ref().err().is_some_and(|e| e.error == ZkError::NoNode && e.index == Some(0)) {
            zk.ensure_path(&target.path).await?;
            result = zk.multi(&ops).await;
        }
        match result {
            Ok(_) => {
                self.cache.removed_local();
                self.metrics.messages_dead_lettered.with_label_values(&[&self.name]).inc();
                tracing::warn!(queue = %self.name, message = %candidate.name, dead_letter = %target.name,
                    "moved a message to the dead-letter queue");
                Ok(())
            },
            Err(err) => {
                let _ = zk.delete(lock, None).await;
                Err(err.error)
            },
        }
    }

    /// Looks up a receipt: the lease if it is live, else 409 (ended, or from an older session
    /// or another zkq process) or 404 (malformed, or never issued).
    fn open_lease(&self, receipt_text: &str) -> Result<u128, QueueError> {
        let Some((session_id, token)) = parse_receipt(receipt_text) else {
            return Err(QueueError::LeaseNotFound(receipt_text.to_owned()));
        };
        let current = self.session.status().session_id;
        let state = self.leases.lock();
        match state.live.get(&token) {
            Some(lease) if lease.zk.session_id() == session_id => {
                if !lease.open {
                    return Err(QueueError::LeaseLost(
                        "the lease was nacked or expired and is being released".to_owned(),
                    ));
                }
                if lease.expires_at <= Instant::now() {
                    return Err(QueueError::LeaseLost("the lease's visibility timeout passed".to_owned()));
                }
                Ok(token)
            },
            _ if self.leases.issued(session_id, token) => Err(QueueError::LeaseLost(
                "the lease ended: it was acked, nacked or expired, or its session was lost".to_owned(),
            )),
            _ if session_id != current => Err(QueueError::LeaseLost(
                "the lease belongs to an older ZooKeeper session or another zkq; its message is delivered again"
                    .to_owned(),
            )),
            _ => Err(QueueError::LeaseNotFound(receipt_text.to_owned())),
        }
    }

    fn take_lease(&self, token: u128) -> Option<Lease> {
        let lease = LeaseTable::end(&mut self.leases.lock(), token);
        if lease.is_some() {
            self.metrics.leases_in_flight.with_label_values(&[&self.name]).dec();
        }
        lease
    }

    /// A copy of a live lease, to work on while it stays in the table (so a step that fails for
    /// want of ZooKeeper can be retried with the same receipt).
    fn lease_snapshot(&self, token: u128) -> Result<Lease, QueueError> {
        self.leases.lock().live.get(&token).cloned().ok_or_else(|| QueueError::LeaseLost("the lease ended".to_owned()))
    }

    /// Classifies the result of a step that removes our lock (ack, nack, release).
    async fn settle(&self, lease: &Lease, result: Result<(), ZkError>) -> Settled {
        match result {
            Ok(()) => Settled::Done,
            Err(ZkError::SessionLost) => Settled::Lost("its ZooKeeper session ended, and its lock with it"),
            Err(ZkError::BadVersion) => Settled::Lost("the message was changed by a consumer that ignores locks"),
            Err(ZkError::NoNode) => {
                // While our session lives, nobody else removes our lock: if it is gone, an earlier
                // attempt of this step whose answer was lost did the work.
                let zk = lease.zk.with_deadline(Instant::now() + self.session.request_timeout());
                match zk.exists(&lease.lock).await {
                    Ok(None) => Settled::Done,
                    Ok(Some(_)) => Settled::Lost("the message was removed by a consumer that ignores locks"),
                    Err(ZkError::SessionLost) => Settled::Lost("its ZooKeeper session ended, and its lock with it"),
                    Err(err) => Settled::Retry(err),
                }
            },
            Err(err) => Settled::Retry(err),
        }
    }

    /// Ends a lease after a settled step; `Retry` keeps it for another attempt.
    fn conclude(&self, token: u128, settled: Settled) -> Result<(), QueueError> {
        match settled {
            Settled::Done => {
                self.take_lease(token);
                Ok(())
            },
            Settled::Lost(why) => {
                self.take_lease(token);
                Err(QueueError::LeaseLost(why.to_owned()))
            },
            Settled::Retry(err) => Err(QueueError::Zk(err)),
        }
    }

    /// The transaction that completes a lease: remove the message (or the first item of a
    /// multi-item node), the lock and the delivery count. Deleting our lock fails if it is gone,
    /// so this is fenced by the lock.
    fn completion_ops(lease: &Lease, item_path: &str) -> Vec<TxnOp> {
        let mut ops = Vec::with_capacity(3);
        if lease.items.len() > 1 {
            let rest = envelope::encode(lease.items[1..].iter().map(Vec::as_slice));
            ops.push(TxnOp::SetData { path: item_path.to_owned(), data: rest, version: Some(lease.data_version) });
        } else {
            ops.push(TxnOp::Delete { path: item_path.to_owned(), version: None });
        }
        ops.push(TxnOp::Delete { path: lease.lock.clone(), version: None });
        ops
    }

    async fn run_fenced(&self, lease: &Lease, mut ops: Vec<TxnOp>) -> Result<(), ZkError> {
        // The delivery count goes with the message; it may be missing (counted by an older zkq).
        let with_counter = {
            let mut with = ops.clone();
            with.push(TxnOp::Delete { path: lease.counter.clone(), version: None });
            with
        };
        let zk = lease.zk.with_deadline(Instant::now() + self.session.request_timeout());
        match zk.multi(&with_counter).await {
            Ok(_) => Ok(()),
            Err(err) if err.error == ZkError::NoNode && err.index == Some(with_counter.len() - 1) => {
                zk.multi(&std::mem::take(&mut ops)).await.map(|_| ()).map_err(|e| e.error)
            },
            Err(err) => Err(err.error),
        }
    }

    /// Ack: the message is done and removed. Without ZooKeeper the lease stays held and the ack
    /// can be retried with the same receipt.
    pub async fn ack(&self, receipt_text: &str) -> Result<(), QueueError> {
        let token = self.open_lease(receipt_text)?;
        let lease = self.lease_snapshot(token)?;
        let item_path = format!("{}/{}", self.path, lease.item.name);
        let result = self.run_fenced(&lease, Self::completion_ops(&lease, &item_path)).await;
        let settled = self.settle(&lease, result).await;
        let done = matches!(settled, Settled::Done);
        self.conclude(token, settled)?;
        if done {
            if lease.items.len() > 1 {
                self.cache.reoffer(lease.item.clone());
            } else {
                self.cache.removed_local();
            }
            self.metrics.messages_acked.with_label_values(&[&self.name]).inc();
        }
        Ok(())
    }

    /// Extend: a heartbeat that moves the expiry; answers the new expiry (epoch ms).
    pub async fn extend(&self, receipt_text: &str, visibility: Duration) -> Result<i64, QueueError> {
        let token = self.open_lease(receipt_text)?;
        let (zk, lock) = {
            let state = self.leases.lock();
            let Some(lease) = state.live.get(&token) else {
                return Err(QueueError::LeaseLost("the lease ended".to_owned()));
            };
            (lease.zk.with_deadline(Instant::now() + self.session.request_timeout()), lease.lock.clone())
        };
        // One transaction on the lease's session that checks its lock still exists.
        let check = [TxnOp::Check { path: lock, version: 0 }];
        if let Err(err) = zk.multi(&check).await {
            let settled = match err.error {
                ZkError::NoNode | ZkError::BadVersion | ZkError::SessionLost => {
                    Settled::Lost("its lock is gone (its ZooKeeper session ended)")
                },
                other => Settled::Retry(other),
            };
            self.conclude(token, settled)?;
        }
        let mut state = self.leases.lock();
        let Some(lease) = state.live.get_mut(&token) else {
            return Err(QueueError::LeaseLost("the lease ended".to_owned()));
        };
        lease.expires_at = Instant::now() + visibility;
        drop(state);
        self.leases.changed.notify_one();
        self.metrics.leases_extended.with_label_values(&[&self.name]).inc();
        Ok(epoch_ms_after(visibility))
    }

    /// Nack: the consumer failed. `delay` postpones the next delivery.
    pub async fn nack(&self, receipt_text: &str, mode: NackMode, delay: Duration) -> Result<(), QueueError> {
        let token = self.open_lease(receipt_text)?;
        if !delay.is_zero() && (mode == NackMode::Keep || (mode == NackMode::Requeue && self.kind != QueueKind::Delay))
        {
            // Keep the lock for `delay`, then release (keep) or requeue: the message stays
            // invisible meanwhile. The client's receipt is spent.
            let mut state = self.leases.lock();
            let Some(lease) = state.live.get_mut(&token) else {
                return Err(QueueError::LeaseLost("the lease ended".to_owned()));
            };
            lease.open = false;
            lease.expires_at = Instant::now() + delay;
            lease.on_expiry = if mode == NackMode::Keep { OnExpiry::Release } else { OnExpiry::Requeue };
            drop(state);
            self.leases.changed.notify_one();
            self.metrics.messages_nacked.with_label_values(&[&self.name, mode.as_str()]).inc();
            return Ok(());
        }
        let lease = self.lease_snapshot(token)?;
        let result = match mode {
            NackMode::Keep => self.release(&lease).await,
            NackMode::Delete => {
                let item_path = format!("{}/{}", self.path, lease.item.name);
                let result = self.run_fenced(&lease, Self::completion_ops(&lease, &item_path)).await;
                if result.is_ok() {
                    self.cache.removed_local();
                }
                result
            },
            NackMode::Requeue => self.requeue(&lease, delay).await,
        };
        let settled = self.settle(&lease, result).await;
        let done = matches!(settled, Settled::Done);
        self.conclude(token, settled)?;
        if done {
            self.metrics.messages_nacked.with_label_values(&[&self.name, mode.as_str()]).inc();
        }
        Ok(())
    }

    /// Releases a lease whose client left before it was handed over (not counted as a nack).
    pub(super) async fn abandon_lease(&self, receipt_text: &str) {
        let Some((_, token)) = parse_receipt(receipt_text) else { return };
        let Ok(lease) = self.lease_snapshot(token) else { return };
        let result = self.release(&lease).await;
        match self.settle(&lease, result).await {
            Settled::Retry(_) => {
                // No ZooKeeper now: let the reaper release it as soon as it can.
                if let Some(held) = self.leases.lock().live.get_mut(&token) {
                    held.open = false;
                    held.expires_at = Instant::now();
                }
                self.leases.changed.notify_one();
            },
            settled => {
                let _ = self.conclude(token, settled);
            },
        }
    }

    /// Releases the lock only: the message keeps its place and is offered again.
    async fn release(&self, lease: &Lease) -> Result<(), ZkError> {
        let zk = lease.zk.with_deadline(Instant::now() + self.session.request_timeout());
        zk.delete(&lease.lock, None).await?;
        self.cache.reoffer(lease.item.clone());
        Ok(())
    }

    /// Curator's requeue, done right: one transaction deletes the node and re-creates it at the
    /// tail with the same bytes, keeping its priority, delivery time (moved by `delay` on delay
    /// queues) and id. The delivery count moves to the new name.
    async fn requeue(&self, lease: &Lease, delay: Duration) -> Result<(), ZkError> {
        let meta = match &lease.item.meta {
            ItemMeta::DeliverAt(at) if !delay.is_zero() => ItemMeta::DeliverAt((*at).max(epoch_ms_after(delay))),
            _ if self.kind == QueueKind::Delay && !delay.is_zero() => ItemMeta::DeliverAt(epoch_ms_after(delay)),
            other => other.clone(),
        };
        let item_path = format!("{}/{}", self.path, lease.item.name);
        let ops = vec![
            TxnOp::Delete { path: item_path, version: None },
            TxnOp::Create {
                path: format!("{}/{}", self.path, names::put_prefix(self.kind, &meta)),
                data: lease.data.clone(),
                mode: NodeMode::PersistentSequential,
            },
            TxnOp::Delete { path: lease.lock.clone(), version: None },
            TxnOp::Delete { path: lease.counter.clone(), version: None },
        ];
        let zk = lease.zk.with_deadline(Instant::now() + self.session.request_timeout());
        let created = match zk.multi(&ops).await {
            Ok(results) => results,
            Err(err) if err.error == ZkError::NoNode && err.index == Some(3) => {
                zk.multi(&ops[..3]).await.map_err(|e| e.error)?
            },
            Err(err) => return Err(err.error),
        };
        let new_name = created
            .iter()
            .find_map(|r| match r {
                crate::zk::TxnResult::Created(path) => path.rsplit('/').next().map(str::to_owned),
                _ => None,
            })
            .unwrap_or_default();
        // Keep the count with the message (best effort: a crash here resets it).
        let _ =
            zk.create(&self.counter_path(&new_name), &counter_bytes(lease.delivery_count), NodeMode::Persistent).await;
        self.cache.removed_local();
        if let Some(item) = names::parse(self.kind, &new_name) {
            self.cache.insert_local(item);
        }
        Ok(())
    }

    /// Expires leases whose visibility passed, and forgets leases of a lost session.
    pub(super) async fn run_lease_reaper(self: Arc<Self>, session: ZkSession, shutdown: CancellationToken) {
        let mut status = session.subscribe();
        loop {
            let next = self.leases.lock().live.values().map(|l| l.expires_at).min();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.leases.changed.notified() => continue,
                changed = status.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let generation = status.borrow_and_update().generation;
                    self.forget_older_sessions(generation);
                    continue;
                },
                _ = async { match next { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {},
            }
            let now = Instant::now();
            let due: Vec<u128> =
                self.leases.lock().live.iter().filter(|(_, l)| l.expires_at <= now).map(|(t, _)| *t).collect();
            for token in due {
                let Ok(lease) = self.lease_snapshot(token) else { continue };
                let result = match lease.on_expiry {
                    OnExpiry::Release => self.release(&lease).await,
                    OnExpiry::Requeue => self.requeue(&lease, Duration::ZERO).await,
                };
                match self.settle(&lease, result).await {
                    Settled::Retry(err) => {
                        // No ZooKeeper now: keep the lease (its receipt is spent) and try again soon.
                        tracing::debug!(queue = %self.name, error = %err, "could not release an expired lease; retrying");
                        if let Some(held) = self.leases.lock().live.get_mut(&token) {
                            held.open = false;
                            held.expires_at = Instant::now() + Duration::from_secs(1);
                        }
                    },
                    settled => {
                        if lease.on_expiry == OnExpiry::Release && lease.open {
                            self.metrics.messages_expired.with_label_values(&[&self.name]).inc();
                        }
                        let _ = self.conclude(token, settled);
                    },
                }
            }
        }
    }

    /// Releases every lease (shutdown): their messages are delivered again at once instead of
    /// after the session timeout. Returns how many were released.
    pub async fn release_all_leases(&self) -> usize {
        let leases: Vec<Lease> = {
            let mut state = self.leases.lock();
            let tokens: Vec<u128> = state.live.keys().copied().collect();
            tokens.into_iter().filter_map(|t| LeaseTable::end(&mut state, t)).collect()
        };
        let releases = leases.iter().map(|lease| async move {
            let zk = lease.zk.with_deadline(Instant::now() + self.session.request_timeout());
            zk.delete(&lease.lock, None).await.is_ok()
        });
        let released = futures::future::join_all(releases).await.into_iter().filter(|ok| *ok).count();
        self.metrics.leases_in_flight.with_label_values(&[&self.name]).set(0);
        released
    }

    fn forget_older_sessions(&self, generation: u64) {
        let mut state = self.leases.lock();
        let stale: Vec<u128> =
            state.live.iter().filter(|(_, l)| l.zk.generation() < generation).map(|(t, _)| *t).collect();
        for token in &stale {
            LeaseTable::end(&mut state, *token);
        }
        drop(state);
        if !stale.is_empty() {
            self.metrics.leases_in_flight.with_label_values(&[&self.name]).sub(i64::try_from(stale.len()).unwrap_or(0));
            tracing::warn!(queue = %self.name, leases = stale.len(), "session lost: its leases are void");
        }
    }

    /// Removes delivery counts whose message is gone: once when the queue opens, then every minute.
    pub(super) async fn run_delivery_count_sweeper(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            let zk = tokio::select! {
                _ = shutdown.cancelled() => return,
                zk = self.session.connected(far) => zk,
            };
            if let Ok(zk) = zk {
                let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
                match self.sweep_delivery_counts(&zk).await {
                    Ok(0) => {},
                    Ok(n) => tracing::debug!(queue = %self.name, removed = n, "removed stale delivery counts"),
                    Err(err) => tracing::debug!(queue = %self.name, error = %err, "delivery count sweep failed"),
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(60)) => {},
            }
        }
    }

    /// Delivery counts whose message is gone (consumed by Curator, removed by hand) are removed,
    /// so nothing accumulates.
    async fn sweep_delivery_counts(&self, zk: &Zk) -> Result<usize, ZkError> {
        let counted = match zk.get_children(&self.deliveries_path).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(err),
        };
        let held: HashSet<String> = self.leases.lock().live.values().map(|l| l.item.name.clone()).collect();
        let mut removed = 0;
        for name in counted {
            if held.contains(&name) {
                continue;
            }
            if zk.exists(&format!("{}/{}", self.path, name)).await?.is_none()
                && zk.delete(&self.counter_path(&name), None).await.is_ok()
            {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_round_trip_and_refuse_garbage() {
        let text = receipt(0x1000_0123_4567_89ab, 42);
        assert_eq!(text.len(), 48);
        assert_eq!(parse_receipt(&text), Some((0x1000_0123_4567_89ab, 42)));
        let negative = receipt(-5, u128::MAX);
        assert_eq!(parse_receipt(&negative), Some((-5, u128::MAX)));
        for bad in ["", "xyz", &"g".repeat(48), &text[..47], &text.to_uppercase()] {
            assert_eq!(parse_receipt(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tokens_are_recognised_only_by_the_process_and_session_that_issued_them() {
        let table = LeaseTable::default();
        let token = table.issue(&mut table.lock(), 7);
        let second = table.issue(&mut table.lock(), 7);
        assert_ne!(token, second);
        assert!(table.issued(7, token) && table.issued(7, second));
        assert!(!table.issued(8, token), "bound to its session");
        assert!(!table.issued(7, token ^ 1), "a forged MAC");
        assert!(!LeaseTable::default().issued(7, token), "another process's key");
    }

    #[test]
    fn delivery_counts_are_big_endian() {
        assert_eq!(counter_bytes(258), vec![0, 0, 1, 2]);
        assert_eq!(read_counter(&[0, 0, 1, 2]), 258);
        assert_eq!(read_counter(&[1]), 0);
    }
}
