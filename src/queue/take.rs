//! The take protocol: acquire a candidate, claim it in ZooKeeper, resolve a lost answer by
//! evidence, and put back a message whose taker vanished.
//!
//! Invariants:
//! - Nothing is handed out from memory: the cache only proposes candidates; each is confirmed by
//!   one transaction in ZooKeeper, and a lost race moves on to the next candidate.
//! - A claim's transaction creates a claim marker (see `claims.rs`); when its answer is lost, the
//!   marker alone decides whether it applied. The absence of the message proves nothing: another
//!   consumer may have taken it while our transaction failed.
//! - A take never answers "empty" (204) unless a snapshot read after the request arrived had no
//!   deliverable message; without ZooKeeper it answers 503 by `max(wait, request timeout)`.
//! - The claim runs in a task of the queue's background tracker, apart from the HTTP request: a
//!   taker that leaves removes nothing, and a message removed just as it left is put back.
//!   Shutdown waits for that tracker before it closes the session.
//! - A put-back retries until ZooKeeper confirms it (resolving lost answers by its marker), so a
//!   message is never dropped while the process runs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::claims::{ClaimMarkers, Outcome};
use super::lease::{LeaseClaim, LeaseGrant};
use super::names::{self, ItemName};
use super::ops::Message;
use super::split::Fit;
use super::{Queue, QueueError};
use crate::metrics::GaugeGuard;
use crate::zk::{ConnectionState, MAX_BATCH_BYTES, NodeMode, TxnError, TxnOp, TxnResult, Zk, ZkError};

/// A message handed out, with its lease when it was leased.
pub(super) type Delivery = (Message, Option<LeaseGrant>);

/// Where the answer of an acquisition goes; closed when the HTTP client went away.
pub(super) type Caller = oneshot::Sender<Result<Vec<Delivery>, QueueError>>;

/// What kind of consumption is asked for.
#[derive(Debug, Clone, Copy)]
enum Acquire {
    Take,
    Lease(Duration),
}

/// How a claimed candidate ended.
enum Claim {
    /// The node (or its first item) was removed; this is the message.
    Taken(Message),
    /// The node is locked by this zkq for a lease.
    Leased(Message, LeaseGrant),
    /// Someone else changed or consumed it between our read and our claim: try the next one.
    Lost,
    /// It was already gone when read: try the next candidate.
    Gone,
    /// A consumer holds its lock.
    Locked,
    /// Not a Curator envelope: skipped and left in place.
    Undecodable,
    /// The taker left before anything was removed.
    Abandoned,
}

/// Capped exponential pause for background retries.
pub(super) struct Pause(Duration);

impl Pause {
    pub(super) fn new() -> Pause {
        Pause(Duration::from_millis(100))
    }

    pub(super) async fn sleep(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
    }
}

impl Queue {
    /// Removes the head message and returns it, waiting up to `wait` for one.
    pub async fn take(self: &Arc<Self>, wait: Duration) -> Result<Option<Message>, QueueError> {
        Ok(self.take_many(wait, 1, usize::MAX).await?.into_iter().next())
    }

    /// Removes up to `max` messages (and about `max_bytes` of bodies; the first always) from the
    /// head: waits up to `wait` for the first, then takes whatever else is there at once. Empty
    /// only when a 204 would be right for a single take.
    pub async fn take_many(
        self: &Arc<Self>,
        wait: Duration,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Message>, QueueError> {
        let acquired = self.acquire(wait, Acquire::Take, max, max_bytes).await?;
        Ok(acquired.into_iter().map(|(message, _)| message).collect())
    }

    /// Leases the head message for `visibility`, waiting up to `wait` for one. The message stays
    /// in ZooKeeper, locked with Curator's lock node, until it is acked, nacked or expires.
    pub async fn lease(
        self: &Arc<Self>,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Option<(Message, LeaseGrant)>, QueueError> {
        Ok(self.lease_many(wait, visibility, 1, usize::MAX).await?.into_iter().next())
    }

    /// Leases up to `max` messages, like [`Queue::take_many`].
    pub async fn lease_many(
        self: &Arc<Self>,
        wait: Duration,
        visibility: Duration,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(Message, LeaseGrant)>, QueueError> {
        self.check_leasable()?;
        let acquired = self.acquire(wait, Acquire::Lease(visibility), max, max_bytes).await?;
        Ok(acquired.into_iter().filter_map(|(message, grant)| grant.map(|grant| (message, grant))).collect())
    }

    async fn acquire(
        self: &Arc<Self>,
        wait: Duration,
        how: Acquire,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Delivery>, QueueError> {
        if self.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        let (tx, rx) = oneshot::channel();
        let queue = self.clone();
        // The claim runs apart from the request; its log lines still carry the request's id.
        let span = tracing::Span::current();
        self.background.spawn(tracing::Instrument::instrument(
            async move {
                let mut tx = tx;
                let result = queue.acquire_up_to(Instant::now() + wait, how, (max, max_bytes), &mut tx).await;
                if let Err(Ok(delivered)) = tx.send(result) {
                    // The caller left after messages were claimed: give them back.
                    // Boxed, like the claims below: the task's own future stays small while it
                    // only waits (10,000 waiting takes are 10,000 such tasks).
                    for (message, grant) in delivered {
                        match grant {
                            Some(grant) => Box::pin(queue.abandon_lease(&grant.receipt)).await,
                            None => Box::pin(queue.put_back(message)).await,
                        }
                    }
                }
            },
            span,
        ));
        rx.await.unwrap_or(Err(QueueError::ShuttingDown))
    }

    /// The first delivery (waiting until `wait_until`), then more that are there now, up to
    /// `max` deliveries or `max_bytes` of bodies. A failure after the first ends the batch with
    /// what it has.
    async fn acquire_up_to(
        self: &Arc<Self>,
        wait_until: Instant,
        how: Acquire,
        (max, max_bytes): (usize, usize),
        caller: &mut Caller,
    ) -> Result<Vec<Delivery>, QueueError> {
        let Some(first) = self.acquire_until(wait_until, how, caller).await? else {
            return Ok(Vec::new());
        };
        let mut bytes = first.0.body.len();
        let mut delivered = vec![first];
        while delivered.len() < max && bytes < max_bytes {
            let more = match how {
                // The rest of a take: the candidates there now, claimed together.
                Acquire::Take => Box::pin(self.take_now(max - delivered.len(), max_bytes - bytes, caller))
                    .await
                    .map_err(QueueError::from),
                // The rest of a lease: the same, each with its own lock, in one transaction.
                Acquire::Lease(visibility) => {
                    Box::pin(self.lease_now(max - delivered.len(), max_bytes - bytes, visibility, caller))
                        .await
                        .map_err(QueueError::from)
                },
            };
            match more {
                Ok(Some(more)) if !more.is_empty() => {
                    bytes += more.iter().map(|(message, _)| message.body.len()).sum::<usize>();
                    delivered.extend(more);
                },
                Ok(_) | Err(_) => break,
            }
        }
        Ok(delivered)
    }

    /// Takes up to `want` of the candidates there now (and about `byte_budget` of bodies) in as
    /// few round trips as it can: one multi-read of their nodes, then ONE transaction that claims
    /// them all under one claim marker, each exactly as [`Queue::claim`] claims one (version
    /// check, Curator's lock created and deleted, a putMulti node split). A candidate that
    /// another consumer changed, took or locked in between fails the transaction at its own
    /// operations: it is dropped and the others are sent again. `None` when there was no
    /// candidate; an empty list when none could be taken (lost to someone else, unreadable).
    async fn take_now(
        self: &Arc<Self>,
        want: usize,
        byte_budget: usize,
        caller: &Caller,
    ) -> Result<Option<Vec<Delivery>>, ZkError> {
        if self.shutdown.is_cancelled() {
            return Ok(None);
        }
        let Some(zk) = self.session.current() else { return Ok(None) };
        let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
        let mut candidates = Vec::new();
        while candidates.len() < want
            && let Some(candidate) = self.cache.pop()
        {
            candidates.push(candidate);
        }
        if candidates.is_empty() {
            return Ok(None);
        }
        let paths: Vec<String> = candidates.iter().map(|c| format!("{}/{}", self.path, c.name)).collect();
        let reads = match zk.get_data_many(&paths.iter().map(String::as_str).collect::<Vec<_>>()).await {
            Ok(reads) => reads,
            Err(err) => {
                self.give_back(candidates);
                return Err(err);
            },
        };
        // In order, within the byte budget and a transaction size ZooKeeper accepts (a split
        // putMulti node writes its items again); the first is always tried.
        let mut reads = reads.into_iter();
        let (mut chosen, mut back) = (Vec::new(), Vec::new());
        let (mut bytes, mut txn_bytes) = (0usize, 0usize);
        for candidate in candidates {
            let read = reads.next();
            if bytes >= byte_budget {
                back.push(candidate);
                continue;
            }
            match read {
                Some(Ok((data, stat))) => match self.items_of(&candidate.name, &data) {
                    Some(items) => {
                        let rest = items.get(1..).unwrap_or_default();
                        let (ops, _) = self.take_ops(&candidate.name, rest, stat.version);
                        let cost = zk.request_bytes(&ops);
                        // A node too large to share a transaction is left to a take of its own
                        // (which splits it to fit, see `split.rs`).
                        if txn_bytes + cost > MAX_BATCH_BYTES {
                            back.push(candidate);
                            continue;
                        }
                        bytes += items.first().map_or(0, Vec::len);
                        txn_bytes += cost;
                        chosen.push((candidate, items, stat.version));
                    },
                    None => self.cache.claim_ended(&candidate.name),
                },
                Some(Err(ZkError::NoNode)) => {
                    self.cache.claim_ended(&candidate.name);
                    self.qm.claim("gone").inc();
                    self.cache.contended();
                },
                Some(Err(_)) | None => back.push(candidate),
            }
        }
        self.give_back(back);
        let mut taken = Vec::with_capacity(chosen.len());
        while !chosen.is_empty() {
            if caller.is_closed() {
                self.give_back(chosen.into_iter().map(|(candidate, ..)| candidate).collect());
                return Ok(Some(taken));
            }
            let marker = self.markers.next(&zk);
            let mut ops = vec![ClaimMarkers::create_op(&marker)];
            // Each candidate's operations: the range, and where its lock is created.
            let mut spans = Vec::with_capacity(chosen.len());
            let mut splits = Vec::with_capacity(chosen.len());
            for (candidate, items, version) in &chosen {
                let start = ops.len();
                let (take_ops, split_items) =
                    self.take_ops(&candidate.name, items.get(1..).unwrap_or_default(), *version);
                ops.extend(take_ops);
                spans.push(start..ops.len());
                splits.push(split_items);
            }
            let applied = match self.apply_txn(&zk, &ops, &self.claim_parents(self.lock_path.is_some())).await {
                Ok(_) => {
                    self.markers.applied(marker);
                    true
                },
                Err(TxnError { error: ZkError::OutcomeUnknown, .. }) => {
                    let deadline = Instant::now() + self.session.request_timeout();
                    match self.markers.outcome(&marker, deadline).await {
                        Outcome::Applied => true,
                        Outcome::NotApplied => {
                            self.give_back(chosen.into_iter().map(|(candidate, ..)| candidate).collect());
                            return Err(ZkError::Unavailable);
                        },
                        Outcome::Unknown(_) => {
                            // Settled in the background, all together: put the messages back if
                            // the claim applied, offer the candidates again if not.
                            let claimed: Vec<(ItemName, Message)> = chosen
                                .into_iter()
                                .map(|(candidate, items, _)| {
                                    self.cache.claim_ended(&candidate.name);
                                    self.qm.claim("lost").inc();
                                    let message = first_message(&candidate, items);
                                    (candidate, message)
                                })
                                .collect();
                            self.settle_claims_later(claimed, marker);
                            return Ok(Some(taken));
                        },
                    }
                },
                Err(TxnError { index: Some(index), error })
                    if matches!(error, ZkError::NoNode | ZkError::BadVersion | ZkError::NodeExists) =>
                {
                    let Some(at) = spans.iter().position(|span| span.contains(&index)) else {
                        self.give_back(chosen.into_iter().map(|(candidate, ..)| candidate).collect());
                        return Err(error);
                    };
                    // Consumed, changed or locked by someone else: drop it, send the others again.
                    let (candidate, ..) = chosen.remove(at);
                    self.cache.claim_ended(&candidate.name);
                    self.cache.contended();
                    let locked = error == ZkError::NodeExists && self.lock_path.is_some() && index == spans[at].start;
                    if locked {
                        self.qm.claim("locked").inc();
                        self.cache.watch_lock(&zk, candidate, self.lock_path.as_deref());
                    } else {
                        self.qm.claim("lost").inc();
                    }
                    false
                },
                Err(err) => {
                    self.give_back(chosen.into_iter().map(|(candidate, ..)| candidate).collect());
                    return Err(err.error);
                },
            };
            if applied {
                for ((candidate, items, _), split_items) in chosen.drain(..).zip(splits) {
                    self.cache.claim_ended(&candidate.name);
                    self.cache.removed_local();
                    for item in split_items {
                        self.cache.insert_local(item);
                    }
                    self.qm.claim("won").inc();
                    self.qm.messages_taken.inc();
                    taken.push((first_message(&candidate, items), None));
                }
            }
        }
        Ok(Some(taken))
    }

    /// Offers candidates that were popped but not claimed again, in their places.
    pub(super) fn give_back(&self, candidates: Vec<ItemName>) {
        for candidate in candidates {
            self.cache.push_front(candidate);
        }
    }

    async fn acquire_until(
        self: &Arc<Self>,
        wait_until: Instant,
        how: Acquire,
        caller: &mut Caller,
    ) -> Result<Option<Delivery>, QueueError> {
        // Past its wait, a request still gets up to the request timeout to learn the queue's
        // state; then it answers 503, never a 204 it cannot vouch for.
        let answer_by = wait_until.max(Instant::now() + self.session.request_timeout());
        let gone = CancellationToken::new();
        let mut first_wait = true;
        // Whether a barrier after the request arrived found the snapshot without a candidate.
        let mut vouched = false;
        loop {
            if caller.is_closed() {
                return Ok(None);
            }
            if self.shutdown.is_cancelled() {
                return Err(QueueError::ShuttingDown);
            }
            let Some(candidate) = self.cache.pop() else {
                if self.cache.is_dirty() {
                    // The snapshot may be missing items: re-read (one read shared by all takers).
                    let _waiting = GaugeGuard::new(self.qm.waiting_takers.clone());
                    let refreshed = tokio::select! {
                        r = self.cache.refreshed(answer_by) => r,
                        _ = caller.closed() => return Ok(None),
                        _ = self.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                    };
                    // A refusal (the queue's ACL does not allow zkq) is the answer; waiting would not change it.
                    if refreshed? || !self.cache.is_dirty() {
                        continue;
                    }
                    return Err(ZkError::Unavailable.into());
                }
                if !vouched {
                    // "Empty" only once the snapshot holds every change made before now: a put
                    // acknowledged just before this request may not have reached us as an event.
                    // Checked before waiting, while the request has time left to learn it.
                    let confirmed = tokio::select! {
                        c = self.cache.barrier(answer_by) => c,
                        _ = caller.closed() => return Ok(None),
                        _ = self.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                    };
                    if !confirmed {
                        return Err(ZkError::Unavailable.into());
                    }
                    vouched = true;
                    continue;
                }
                if Instant::now() >= wait_until {
                    return Ok(None);
                }
                tokio::select! {
                    _ = self.cache.wait_for_item(wait_until, &gone, first_wait) => {},
                    _ = caller.closed() => { gone.cancel(); return Ok(None) },
                    _ = self.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                };
                first_wait = false;
                continue;
            };
            let Some(zk) = self.session.current() else {
                // Suspended: nothing is handed out from memory; wait for the session.
                self.cache.push_front(candidate);
                let _waiting = GaugeGuard::new(self.qm.waiting_takers.clone());
                let connected = tokio::select! {
                    c = self.session.connected(answer_by) => c,
                    _ = caller.closed() => return Ok(None),
                    _ = self.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                };
                connected?;
                continue;
            };
            // Each claim gets the full request timeout, whatever is left of the taker's wait.
            let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
            let claimed = match how {
                Acquire::Take => Box::pin(self.claim(&zk, &candidate, caller)).await,
                Acquire::Lease(visibility) => {
                    Box::pin(self.claim_lease(&zk, &candidate, visibility)).await.map(|c| match c {
                        LeaseClaim::Granted(message, grant) => Claim::Leased(message, grant),
                        LeaseClaim::Lost => Claim::Lost,
                        LeaseClaim::Gone => Claim::Gone,
                        LeaseClaim::Locked => Claim::Locked,
                        LeaseClaim::Undecodable => Claim::Undecodable,
                    })
                },
            };
            self.cache.claim_ended(&candidate.name);
            let outcome = match &claimed {
                Ok(Claim::Taken(_) | Claim::Leased(..)) => Some("won"),
                Ok(Claim::Lost) => Some("lost"),
                Ok(Claim::Gone) => Some("gone"),
                Ok(Claim::Locked) => Some("locked"),
                _ => None,
            };
            if let Some(outcome) = outcome {
                self.qm.claim(outcome).inc();
                if outcome != "won" {
                    self.cache.contended();
                }
            }
            match claimed {
                Ok(Claim::Taken(message)) => {
                    self.qm.messages_taken.inc();
                    return Ok(Some((message, None)));
                },
                Ok(Claim::Leased(message, grant)) => {
                    self.qm.messages_leased.inc();
                    return Ok(Some((message, Some(grant))));
                },
                Ok(Claim::Locked) => {
                    // Held by a consumer: offer it again when that lock goes away.
                    self.cache.watch_lock(&zk, candidate, self.lock_path.as_deref());
                },
                Ok(Claim::Lost | Claim::Gone | Claim::Undecodable) => {},
                Ok(Claim::Abandoned) => {
                    self.cache.push_front(candidate);
                    return Ok(None);
                },
                Err(err) if err.is_transient() => {
                    self.cache.push_front(candidate);
                    if Instant::now() >= answer_by {
                        return Err(err.into());
                    }
                },
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Tries to take `candidate` in two round trips: read it, then one transaction that creates
    /// a claim marker and removes the node only if its version is unchanged. On a queue with a
    /// lock path the same transaction also creates and deletes Curator's lock node
    /// `<lockPath>/<item>`: if a Curator lock-safe consumer (or a lease) holds that lock, the
    /// create fails and nothing changes; if not, nobody can take the lock between our check and
    /// our delete, because both are one atomic step.
    async fn claim(self: &Arc<Self>, zk: &Zk, candidate: &ItemName, caller: &Caller) -> Result<Claim, ZkError> {
        let item_path = format!("{}/{}", self.path, candidate.name);
        let read = match zk.get_data(&item_path).await {
            Ok(found) => found,
            Err(ZkError::NoNode) => return Ok(Claim::Gone),
            Err(err) => return Err(err),
        };
        let marker = self.markers.next(zk);
        let marker_op = ClaimMarkers::create_op(&marker);
        let claim_bytes = |items: &[Vec<u8>], version| {
            let (ops, _) = self.take_ops(&candidate.name, items.get(1..).unwrap_or_default(), version);
            zk.request_bytes(std::iter::once(&marker_op).chain(&ops))
        };
        let (data, stat) = match self.fit_for_claim(zk, &candidate.name, read, claim_bytes).await? {
            Fit::Ready(data, stat) => (data, stat),
            Fit::Gone => return Ok(Claim::Gone),
            Fit::Locked => return Ok(Claim::Locked),
            Fit::Unsplittable => return Ok(Claim::Undecodable),
        };
        let Some(mut items) = self.items_of(&candidate.name, &data) else {
            return Ok(Claim::Undecodable);
        };
        if caller.is_closed() {
            return Ok(Claim::Abandoned);
        }
        let first = items.remove(0);
        let lock = self.lock_path.as_ref().map(|dir| format!("{dir}/{}", candidate.name));
        let (take_ops, split_items) = self.take_ops(&candidate.name, &items, stat.version);
        let ops: Vec<TxnOp> = std::iter::once(marker_op).chain(take_ops).collect();
        let message = Message { message_id: candidate.name.clone(), body: first, meta: candidate.meta.clone() };
        let applied = match self.apply_txn(zk, &ops, &self.claim_parents(lock.is_some())).await.map_err(|e| e.error) {
            // The answer was lost: only our marker can say whether the claim applied (the node
            // being gone proves nothing: another consumer may have taken it).
            Err(ZkError::OutcomeUnknown) => {
                let deadline = Instant::now() + self.session.request_timeout();
                match self.markers.outcome(&marker, deadline).await {
                    Outcome::Applied => Ok(Vec::new()),
                    // Not applied: the candidate is offered again (a transient failure).
                    Outcome::NotApplied => return Err(ZkError::Unavailable),
                    Outcome::Unknown(_) => {
                        // ZooKeeper is not back yet: settle it in the background (put the
                        // message back if our claim removed it, offer it again if not).
                        self.settle_claims_later(vec![(candidate.clone(), message)], marker);
                        return Ok(Claim::Lost);
                    },
                }
            },
            other => other,
        };
        match applied {
            Ok(_) => self.markers.applied(marker),
            // Consumed or changed by someone else: try the next one.
            Err(ZkError::NoNode | ZkError::BadVersion) => return Ok(Claim::Lost),
            // A consumer (Curator lock-safe, or a lease) holds its lock.
            Err(ZkError::NodeExists) => return Ok(Claim::Locked),
            Err(err) => return Err(err),
        }
        self.cache.removed_local();
        for item in split_items {
            self.cache.insert_local(item);
        }
        Ok(Claim::Taken(message))
    }

    /// The operations that take node `name` at `version` whose items after the first are `rest`:
    /// Curator's lock created and deleted around the delete (when the queue has a lock path), and
    /// the creates that split `rest` off; and the split items. A claim sends them after its
    /// marker's create.
    fn take_ops(&self, name: &str, rest: &[Vec<u8>], version: i32) -> (Vec<TxnOp>, Vec<ItemName>) {
        let lock = self.lock_path.as_ref().map(|dir| format!("{dir}/{name}"));
        let (split_ops, split_items) = self.split_ops(name, rest, version);
        let mut ops = Vec::with_capacity(split_ops.len() + 3);
        if let Some(lock) = &lock {
            ops.push(TxnOp::Create { path: lock.clone(), data: Vec::new(), mode: NodeMode::Ephemeral });
        }
        ops.extend(split_ops);
        ops.push(TxnOp::Delete { path: format!("{}/{name}", self.path), version: Some(version) });
        if let Some(lock) = lock {
            ops.push(TxnOp::Delete { path: lock, version: None });
        }
        (ops, split_items)
    }

    /// Parent directories a claim transaction may find missing, by operation index: the marker
    /// directory (operation 0) and the lock directory (operation 1, when locking).
    fn claim_parents(&self, locking: bool) -> Vec<(usize, String)> {
        let mut parents = vec![(0, self.markers.dir().to_owned())];
        if let (true, Some(dir)) = (locking, &self.lock_path) {
            parents.push((1, dir.clone()));
        }
        parents
    }

    /// Runs `ops` as one transaction. When it fails because the parent of the operation at one
    /// of `parents`' indexes is missing (first use, or removed by hand), creates that directory
    /// like Curator does and runs it again.
    pub(super) async fn apply_txn(
        &self,
        zk: &Zk,
        ops: &[TxnOp],
        parents: &[(usize, String)],
    ) -> Result<Vec<TxnResult>, TxnError> {
        let mut created = 0;
        loop {
            match zk.multi(ops).await {
                Ok(results) => return Ok(results),
                Err(err) if err.error == ZkError::NoNode && created < parents.len() => {
                    let Some((_, dir)) = parents.iter().find(|(index, _)| Some(*index) == err.index) else {
                        return Err(err);
                    };
                    zk.ensure_path(dir).await.map_err(|error| TxnError { index: None, error })?;
                    created += 1;
                },
                Err(err) => return Err(err),
            }
        }
    }

    /// Settles a claim transaction whose outcome is still unknown once ZooKeeper is back: if it
    /// applied, its messages (the first item of each node) are put back; if not, the candidates
    /// are offered again. One task per transaction: its marker decides for all of them at once
    /// (once resolved, the marker is deleted, so a second look would find "not applied").
    fn settle_claims_later(self: &Arc<Self>, claimed: Vec<(ItemName, Message)>, marker: String) {
        let queue = self.clone();
        self.background.spawn(async move {
            let mut pause = Pause::new();
            loop {
                if queue.session.status().state == ConnectionState::Closed {
                    for (_, message) in &claimed {
                        tracing::error!(queue = %queue.name, message = %message.message_id, marker = %marker,
                            "zkq stopped before it could learn whether a take applied; if it did, the message is lost");
                    }
                    return;
                }
                let deadline = Instant::now() + queue.session.request_timeout();
                match queue.markers.outcome(&marker, deadline).await {
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
                    Outcome::Unknown(_) => pause.sleep().await,
                }
            }
        });
    }

    /// Puts back a message whose taker vanished after it was removed: same kind fields, at the
    /// tail (its original place is gone). Retries until ZooKeeper confirms it; a lost answer is
    /// resolved by the put-back's own marker, so it is never stored twice.
    pub(super) async fn put_back(&self, message: Message) {
        tracing::warn!(queue = %self.name, message = %message.message_id,
            "taker disconnected after the message was removed; putting it back");
        let prefix = format!("{}/{}", self.path, names::put_prefix(self.kind, &message.meta));
        let data = self.encode(&message.body);
        let mut pause = Pause::new();
        let mut unresolved: Option<String> = None;
        loop {
            if self.session.status().state == ConnectionState::Closed {
                tracing::error!(queue = %self.name, message = %message.message_id,
                    "zkq stopped before it could put back a message whose taker disconnected; the message is lost");
                return;
            }
            if let Some(marker) = unresolved.take() {
                match self.markers.outcome(&marker, Instant::now() + self.session.request_timeout()).await {
                    Outcome::Applied => return self.cache.mark_stale(),
                    Outcome::NotApplied => {},
                    Outcome::Unknown(_) => {
                        unresolved = Some(marker);
                        pause.sleep().await;
                        continue;
                    },
                }
            }
            let Ok(zk) = self.session.connected(Instant::now() + self.session.request_timeout()).await else {
                pause.sleep().await;
                continue;
            };
            let marker = self.markers.next(&zk);
            let ops = [
                ClaimMarkers::create_op(&marker),
                TxnOp::Create { path: prefix.clone(), data: data.clone(), mode: NodeMode::PersistentSequential },
            ];
            let parents = [(0, self.markers.dir().to_owned()), (1, self.path.clone())];
            match self.apply_txn(&zk, &ops, &parents).await.map_err(|e| e.error) {
                Ok(results) => {
                    self.markers.applied(marker);
                    let created = results.iter().find_map(|r| match r {
                        TxnResult::Created(path) if path.starts_with(&prefix) => path.rsplit('/').next(),
                        _ => None,
                    });
                    match created.and_then(|name| names::parse(self.kind, name)) {
                        Some(item) => self.cache.insert_local(item),
                        None => self.cache.mark_stale(),
                    }
                    return;
                },
                Err(ZkError::OutcomeUnknown) => unresolved = Some(marker),
                Err(err) => {
                    tracing::warn!(queue = %self.name, message = %message.message_id, error = %err, "retrying put-back");
                    pause.sleep().await;
                },
            }
        }
    }
}

/// The message a claim of `candidate` hands out: the node's first item, under the node's name.
fn first_message(candidate: &ItemName, items: Vec<Vec<u8>>) -> Message {
    Message {
        message_id: candidate.name.clone(),
        body: items.into_iter().next().unwrap_or_default(),
        meta: candidate.meta.clone(),
    }
}
