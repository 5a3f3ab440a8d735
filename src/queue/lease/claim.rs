//! Leasing candidates: one read, then one transaction.
//!
//! The read fetches the item and its delivery count together. The transaction creates Curator's
//! lock node (holding a claim id unique to this lease), checks that the item is unchanged, and
//! writes the new delivery count. A candidate that another consumer holds or has taken fails the
//! transaction as a whole: nothing is written and nothing is left behind. When the answer is
//! lost, the lock with our claim id is the evidence; if ZooKeeper cannot be asked in time, a
//! background task finds out and releases the lock if it was created.
//!
//! The messages of a `?max=` lease after the first are leased together (`lease_now`): one
//! multi-read of their items and counts, then ONE transaction holding each one's operations, the
//! same as a lease of one. A candidate another consumer locked, took or changed fails the
//! transaction at its own operations: it is dropped and the others are sent again. A lost answer
//! is settled for all of them at once by the first one's lock (the transaction applied all or
//! none of its locks, and each claim id is unique).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::super::names::ItemName;
use super::super::split::Fit;
use super::super::take::{Caller, Delivery, Pause};
use super::super::{Message, Queue, envelope};
use super::{
    Claiming, Lease, LeaseGrant, OnExpiry, counter_bytes, epoch_ms_after, lock_is_ours, read_counter, receipt,
};
use crate::zk::{ConnectionState, MAX_BATCH_BYTES, NodeMode, NodeStat, TxnError, TxnOp, Zk, ZkError};

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

/// Operation indexes of a claim transaction (of each candidate's operations in a batch).
const LOCK_OP: usize = 0;
const CHECK_OP: usize = 1;
const COUNT_OP: usize = 2;

/// What a lease's claim writes besides the node: its lock and the delivery count.
struct LeaseOps<'a> {
    lock: &'a str,
    claim_id: &'a [u8],
    counter: &'a str,
    /// The new delivery count, and the version of the count node read (`None`: none yet).
    count: u32,
    counter_version: Option<i32>,
}

/// What a read of a candidate (its node, then its delivery count) gave.
type Read = Option<Result<(Vec<u8>, NodeStat), ZkError>>;

/// A candidate read and ready to lease: its claim operations (lock, check, count, the split of a
/// putMulti node, in this order) and what its lease holds once they applied.
struct Prepared {
    candidate: ItemName,
    lock: String,
    claim_id: Vec<u8>,
    counter: String,
    /// The leased node's data (one item) and its version after the claim.
    data: Vec<u8>,
    /// The node's creation time (`ctime`, epoch ms), from the read the claim is based on.
    created_at_ms: i64,
    data_version: i32,
    count: u32,
    body: Vec<u8>,
    ops: Vec<TxnOp>,
    split_items: Vec<ItemName>,
}

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
        let (item, count) = (read.next(), read.next());
        // A putMulti node whose split would not fit one request is made smaller first.
        let item = match item {
            Some(Ok(found)) => {
                let (lock, counter) = (format!("{lock_dir}/{}", candidate.name), self.counter_path(&candidate.name));
                let counter_version = match &count {
                    Some(Ok((_, stat))) => Some(stat.version),
                    _ => None,
                };
                let claim_id = self.leases.claim_id(zk);
                let claim = LeaseOps { lock: &lock, claim_id: &claim_id, counter: &counter, count: 0, counter_version };
                let claim_bytes = |items: &[Vec<u8>], version| {
                    zk.request_bytes(&self.lease_ops(&claim, &candidate.name, items, version).0)
                };
                match self.fit_for_claim(zk, &candidate.name, found, claim_bytes).await? {
                    Fit::Ready(data, stat) => Some(Ok((data, stat))),
                    Fit::Gone => return Ok(LeaseClaim::Gone),
                    Fit::Locked => return Ok(LeaseClaim::Locked),
                    Fit::Unsplittable => return Ok(LeaseClaim::Undecodable),
                }
            },
            other => other,
        };
        let prepared = match self.prepare_lease(zk, &lock_dir, candidate, item, count).await? {
            Ok(prepared) => prepared,
            Err(claim) => return Ok(claim),
        };
        let parents = [(LOCK_OP, lock_dir), (COUNT_OP, self.deliveries_path.clone())];
        match self.apply_txn(zk, &prepared.ops, &parents).await {
            Ok(_) => {},
            Err(err) => match (err.error, err.index) {
                (ZkError::NodeExists, Some(LOCK_OP)) => return Ok(LeaseClaim::Locked),
                (ZkError::NoNode | ZkError::BadVersion, Some(CHECK_OP)) => return Ok(LeaseClaim::Lost),
                // The count changed between our read and our transaction: read again.
                (ZkError::NodeExists | ZkError::BadVersion, Some(COUNT_OP)) => return Err(ZkError::Unavailable),
                (ZkError::OutcomeUnknown, _) => {
                    let deadline = Instant::now() + self.session.request_timeout();
                    match lock_is_ours(&zk.with_deadline(deadline), &prepared.lock, &prepared.claim_id).await {
                        Ok(true) => {},
                        // Not applied: offer the candidate again.
                        Ok(false) => return Err(ZkError::Unavailable),
                        Err(ZkError::SessionLost) => return Err(ZkError::SessionLost),
                        Err(_) => {
                            self.release_unknown_claims_later(zk.clone(), vec![prepared]);
                            return Ok(LeaseClaim::Lost);
                        },
                    }
                },
                (error, _) => return Err(error),
            },
        }
        let (message, grant) = self.grant_lease(zk, prepared, visibility);
        Ok(LeaseClaim::Granted(message, grant))
    }

    /// Leases up to `want` of the candidates there now (and about `byte_budget` of bodies) in as
    /// few round trips as it can: one multi-read of their nodes and delivery counts, then ONE
    /// transaction holding, for each, the operations [`Queue::claim_lease`] sends for one (its
    /// lock with a claim id of its own, the version check, the delivery count, a putMulti node's
    /// split). `None` when there was no candidate; an empty list when none could be leased.
    pub(in crate::queue) async fn lease_now(
        self: &Arc<Self>,
        want: usize,
        byte_budget: usize,
        visibility: Duration,
        caller: &Caller,
    ) -> Result<Option<Vec<Delivery>>, ZkError> {
        if self.shutdown.is_cancelled() {
            return Ok(None);
        }
        let Some(lock_dir) = self.lock_path.clone() else { return Ok(None) };
        let Some(zk) = self.session.current() else { return Ok(None) };
        let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
        let mut candidates = Vec::new();
        while candidates.len() < want
            && let Some(candidate) = self.cache.pop()
        {
            // Being leased by another request of this process: as good as locked.
            match Claiming::begin(&self.leases, &candidate.name) {
                Some(claiming) => candidates.push((candidate, claiming)),
                None => self.not_leased(&zk, candidate, LeaseClaim::Locked),
            }
        }
        if candidates.is_empty() {
            return Ok(None);
        }
        let paths: Vec<String> = candidates
            .iter()
            .flat_map(|(c, _)| [format!("{}/{}", self.path, c.name), self.counter_path(&c.name)])
            .collect();
        let reads = match zk.get_data_many(&paths.iter().map(String::as_str).collect::<Vec<_>>()).await {
            Ok(reads) => reads,
            Err(err) => {
                self.give_back(candidates.into_iter().map(|(candidate, _)| candidate).collect());
                return Err(err);
            },
        };
        // In order, within the byte budget and a transaction size ZooKeeper accepts; the first
        // is always tried.
        let mut reads = reads.into_iter();
        let (mut chosen, mut back) = (Vec::new(), Vec::new());
        let (mut bytes, mut txn_bytes) = (0usize, 0usize);
        for (candidate, claiming) in candidates {
            let (item, count) = (reads.next(), reads.next());
            let unread = match &item {
                Some(Err(ZkError::NoNode)) => false,
                Some(Err(_)) | None => true,
                Some(Ok(_)) => false,
            };
            if bytes >= byte_budget || unread {
                back.push(candidate);
                continue;
            }
            match self.prepare_lease(&zk, &lock_dir, &candidate, item, count).await {
                // A node too large to share a transaction is left to a lease of its own (which
                // splits it to fit, see `split.rs`).
                Ok(Ok(prepared)) if txn_bytes + zk.request_bytes(&prepared.ops) > MAX_BATCH_BYTES => {
                    back.push(candidate);
                },
                Ok(Ok(prepared)) => {
                    bytes += prepared.body.len();
                    txn_bytes += zk.request_bytes(&prepared.ops);
                    chosen.push((prepared, claiming));
                },
                Ok(Err(claim)) => self.not_leased(&zk, candidate, claim),
                Err(_) => back.push(candidate),
            }
        }
        self.give_back(back);
        let parents = [(LOCK_OP, lock_dir), (COUNT_OP, self.deliveries_path.clone())];
        let mut leased = Vec::with_capacity(chosen.len());
        while !chosen.is_empty() {
            if caller.is_closed() {
                self.give_back(chosen.into_iter().map(|(prepared, _)| prepared.candidate).collect());
                return Ok(Some(leased));
            }
            let mut ops = Vec::new();
            let mut spans = Vec::with_capacity(chosen.len());
            for (prepared, _) in &chosen {
                let start = ops.len();
                ops.extend(prepared.ops.iter().cloned());
                spans.push(start..ops.len());
            }
            let applied = match self.apply_txn(&zk, &ops, &parents).await {
                Ok(_) => true,
                Err(TxnError { error: ZkError::OutcomeUnknown, .. }) => {
                    // All or none of the locks were created: the first one's evidence is theirs.
                    let deadline = Instant::now() + self.session.request_timeout();
                    let evidence = match chosen.first() {
                        Some((first, _)) => {
                            lock_is_ours(&zk.with_deadline(deadline), &first.lock, &first.claim_id).await
                        },
                        None => Ok(false),
                    };
                    match evidence {
                        Ok(true) => true,
                        Ok(false) => {
                            // Not applied: the candidates are offered again.
                            self.give_back(chosen.into_iter().map(|(prepared, _)| prepared.candidate).collect());
                            return Err(ZkError::Unavailable);
                        },
                        Err(ZkError::SessionLost) => {
                            self.give_back(chosen.into_iter().map(|(prepared, _)| prepared.candidate).collect());
                            return Err(ZkError::SessionLost);
                        },
                        Err(_) => {
                            // Settled in the background: the locks released if they were created,
                            // the candidates offered again either way.
                            let unknown: Vec<Prepared> = chosen
                                .into_iter()
                                .map(|(prepared, _)| {
                                    self.cache.claim_ended(&prepared.candidate.name);
                                    self.qm.claim("lost").inc();
                                    prepared
                                })
                                .collect();
                            self.cache.contended();
                            self.release_unknown_claims_later(zk.clone(), unknown);
                            return Ok(Some(leased));
                        },
                    }
                },
                Err(TxnError { index: Some(index), error })
                    if matches!(error, ZkError::NoNode | ZkError::BadVersion | ZkError::NodeExists) =>
                {
                    let Some(at) = spans.iter().position(|span| span.contains(&index)) else {
                        self.give_back(chosen.into_iter().map(|(prepared, _)| prepared.candidate).collect());
                        return Err(error);
                    };
                    let offset = index - spans.get(at).map_or(0, |span| span.start);
                    let (prepared, _claiming) = chosen.remove(at);
                    match (error, offset) {
                        // Another consumer holds its lock: watch it, offer it again when released.
                        (ZkError::NodeExists, LOCK_OP) => self.not_leased(&zk, prepared.candidate, LeaseClaim::Locked),
                        // Its count changed since our read: read it again with a later lease.
                        (_, COUNT_OP) => self.give_back(vec![prepared.candidate]),
                        // Taken or changed by someone else.
                        _ => self.not_leased(&zk, prepared.candidate, LeaseClaim::Lost),
                    }
                    false
                },
                Err(err) => {
                    self.give_back(chosen.into_iter().map(|(prepared, _)| prepared.candidate).collect());
                    return Err(err.error);
                },
            };
            if applied {
                for (prepared, _claiming) in chosen.drain(..) {
                    self.cache.claim_ended(&prepared.candidate.name);
                    self.qm.claim("won").inc();
                    self.qm.messages_leased.inc();
                    let (message, grant) = self.grant_lease(&zk, prepared, visibility);
                    leased.push((message, Some(grant)));
                }
            }
        }
        Ok(Some(leased))
    }

    /// Books a candidate of a batch that was not leased, as `acquire_until` books a single
    /// claim's outcome.
    fn not_leased(self: &Arc<Self>, zk: &Zk, candidate: ItemName, claim: LeaseClaim) {
        self.cache.claim_ended(&candidate.name);
        let outcome = match claim {
            LeaseClaim::Lost => "lost",
            LeaseClaim::Gone => "gone",
            LeaseClaim::Locked => "locked",
            LeaseClaim::Undecodable | LeaseClaim::Granted(..) => return,
        };
        self.qm.claim(outcome).inc();
        self.cache.contended();
        if outcome == "locked" {
            self.cache.watch_lock(zk, candidate, self.lock_path.as_deref());
        }
    }

    /// Turns the reads of a candidate (its node, its delivery count) into its claim operations,
    /// or the claim's outcome when it cannot be leased: gone, undecodable, or moved to the
    /// dead-letter queue (poison, or undecodable when the queue has one).
    async fn prepare_lease(
        &self,
        zk: &Zk,
        lock_dir: &str,
        candidate: &ItemName,
        item: Read,
        count: Read,
    ) -> Result<Result<Prepared, LeaseClaim>, ZkError> {
        let counter = self.counter_path(&candidate.name);
        let (data, stat) = match item {
            Some(Ok(found)) => found,
            Some(Err(ZkError::NoNode)) | None => return Ok(Err(LeaseClaim::Gone)),
            Some(Err(err)) => return Err(err),
        };
        let (previous, counter_version) = match count {
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
            return self.dead_letter(zk, candidate, &data, stat.version, counter, dead_letter).await.map(Err);
        }
        let Some(mut items) = self.items_of(&candidate.name, &data) else {
            return Ok(Err(LeaseClaim::Undecodable));
        };
        let claim_id = self.leases.claim_id(zk);
        let lock = format!("{lock_dir}/{}", candidate.name);
        let claim = LeaseOps { lock: &lock, claim_id: &claim_id, counter: &counter, count, counter_version };
        let (ops, split_items, rewritten) = self.lease_ops(&claim, &candidate.name, &items, stat.version);
        // The leased node's data and version once the claim applied.
        let (data, data_version) = match rewritten {
            Some(first) => (first, stat.version + 1),
            None => (data, stat.version),
        };
        items.truncate(1);
        let body = items.pop().unwrap_or_default();
        Ok(Ok(Prepared {
            candidate: candidate.clone(),
            lock,
            claim_id,
            counter,
            data,
            created_at_ms: stat.ctime,
            data_version,
            count,
            body,
            ops,
            split_items,
        }))
    }

    /// The operations that lease node `name` at `version` holding `items`: the lock with its
    /// claim id, the version check (for a putMulti node, the rewrite that keeps only the first
    /// item), the delivery count, and the creates that split the other items off right behind
    /// it; the split items; and the leased node's new data when it is rewritten.
    fn lease_ops(
        &self,
        claim: &LeaseOps<'_>,
        name: &str,
        items: &[Vec<u8>],
        version: i32,
    ) -> (Vec<TxnOp>, Vec<ItemName>, Option<Vec<u8>>) {
        let item_path = format!("{}/{name}", self.path);
        let (split_ops, split_items) = self.split_ops(name, items.get(1..).unwrap_or_default(), version);
        let (check, rewritten) = if split_ops.is_empty() {
            (TxnOp::Check { path: item_path, version }, None)
        } else {
            let first = envelope::encode(items.first().map(Vec::as_slice));
            (TxnOp::SetData { path: item_path, data: first.clone(), version: Some(version) }, Some(first))
        };
        let (counter, data) = (claim.counter.to_owned(), counter_bytes(claim.count));
        let count_op = match claim.counter_version {
            Some(version) => TxnOp::SetData { path: counter, data, version: Some(version) },
            None => TxnOp::Create { path: counter, data, mode: NodeMode::Persistent },
        };
        let mut ops = Vec::with_capacity(split_ops.len() + 3);
        ops.push(TxnOp::Create {
            path: claim.lock.to_owned(),
            data: claim.claim_id.to_vec(),
            mode: NodeMode::Ephemeral,
        });
        ops.push(check);
        ops.push(count_op);
        ops.extend(split_ops);
        (ops, split_items, rewritten)
    }

    /// Books a claim that applied: the lease goes into the table, a split node's other items
    /// into the cache, and the client gets the message and its receipt.
    fn grant_lease(&self, zk: &Zk, prepared: Prepared, visibility: Duration) -> (Message, LeaseGrant) {
        let Prepared {
            candidate,
            lock,
            claim_id,
            counter,
            data,
            created_at_ms,
            data_version,
            count,
            body,
            split_items,
            ..
        } = prepared;
        for item in split_items {
            self.cache.insert_local(item);
        }
        let expires_at_ms = epoch_ms_after(visibility);
        let token = {
            let mut state = self.leases.lock();
            self.leases.issue(&mut state, zk.session_id())
        };
        let grant = LeaseGrant {
            receipt: receipt::format(zk.session_id(), token),
            expires_at_ms,
            delivery_count: count,
            created_at_ms,
        };
        let message = Message { message_id: candidate.name.clone(), body, meta: candidate.meta.clone() };
        let lease = Lease {
            item: candidate,
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
        (message, grant)
    }

    /// Lease claims whose outcome is unknown: once ZooKeeper answers, release each lock the
    /// claim created (its claim id is the evidence), and offer the items again. Owned by the
    /// queue's background tracker.
    fn release_unknown_claims_later(self: &Arc<Self>, zk: Zk, claims: Vec<Prepared>) {
        let queue = self.clone();
        self.background.spawn(async move {
            let mut pause = Pause::new();
            for Prepared { lock, claim_id, candidate: item, .. } in claims {
                loop {
                    if queue.session.status().state == ConnectionState::Closed {
                        return; // the session is closed: the locks, if any, are gone with it
                    }
                    let zk = zk.with_deadline(Instant::now() + queue.session.request_timeout());
                    match lock_is_ours(&zk, &lock, &claim_id).await {
                        Ok(true) => match zk.delete(&lock, None).await {
                            Ok(()) | Err(ZkError::NoNode | ZkError::SessionLost) => break queue.cache.reoffer(item),
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
