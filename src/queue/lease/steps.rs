//! The steps of a lease: ack, nack, extend, expiry, abandon and shutdown release.
//!
//! Every step that ends a lease runs one transaction that deletes the lease's lock; one that
//! changes the message also creates a claim marker, the evidence that it applied (see the module
//! invariants); a release is judged by the lock. Steps of one lease take turns (`Lease::turn`); a
//! step whose answer was lost and could not be resolved in time marks the lease `unresolved`, and
//! the next step of that lease (a client's retry, or the reaper) resolves it first; if the session
//! is lost meanwhile, the lease waits in `settling` for its marker to be read. So a retried ack
//! whose first attempt applied answers 204, and no retry ever deletes a lock another consumer took
//! after ours was released.
//!
//! Ack and nack(delete) are one completion path: remove the message, the lock and the count (a
//! leased node always holds one item: a Curator putMulti node is split when it is leased).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::super::QueueError;
use super::super::claims::{ClaimMarkers, Outcome};
use super::super::finish::finish;
use super::super::names::{self, ItemMeta};
use super::Leases;
use super::{
    LOCK_VERSION, Lease, NackMode, OnExpiry, Receipt, Step, Unresolved, counter_bytes, epoch_ms_after, lock_is_ours,
    release_uncounted,
};
use crate::config::QueueKind;
use crate::zk::{NodeMode, TxnOp, TxnResult, ZkError};

/// What a step's transaction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Remove the message (its first item), the lock and the delivery count.
    Complete,
    /// Delete and re-create the message at the tail, delivered after `delay` (delay queues).
    Requeue(Duration),
    /// Delete the lock only.
    Release,
    /// Delete the lock and take back the delivery count: no client received the message.
    Return,
}

impl Effect {
    /// Whether the message stays where it is, unlocked.
    fn releases(self) -> bool {
        matches!(self, Effect::Release | Effect::Return)
    }
}

impl Step {
    fn effect(self, on_expiry: OnExpiry) -> Effect {
        match self {
            Step::Ack | Step::Nack { mode: NackMode::Delete, .. } => Effect::Complete,
            Step::Nack { mode: NackMode::Requeue, delay } => Effect::Requeue(delay),
            Step::Expire if on_expiry == OnExpiry::Requeue => Effect::Requeue(Duration::ZERO),
            Step::Expire if on_expiry == OnExpiry::Return => Effect::Return,
            Step::Abandon => Effect::Return,
            Step::Nack { mode: NackMode::Keep, .. } | Step::Expire | Step::Shutdown => Effect::Release,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Step::Ack => "an ack",
            Step::Nack { .. } => "a nack",
            Step::Expire => "its expiry",
            Step::Abandon | Step::Shutdown => "a release",
        }
    }
}

const LOCK_GONE: &str = "its ZooKeeper session ended, and its lock with it";

impl Leases {
    /// Ack: the message is done and removed. Without ZooKeeper the lease stays held and the ack
    /// can be retried with the same receipt. Runs to its end whether or not the caller still
    /// waits (see [`Leases::detached`]).
    pub(crate) async fn ack(self: &Arc<Self>, receipt: Receipt) -> Result<(), QueueError> {
        self.detached(move |queue| async move { queue.ack_now(receipt).await }).await
    }

    /// Nack: the consumer failed. `delay` postpones the next delivery. Runs to its end whether or
    /// not the caller still waits.
    pub(crate) async fn nack(
        self: &Arc<Self>,
        receipt: Receipt,
        mode: NackMode,
        delay: Duration,
    ) -> Result<(), QueueError> {
        self.detached(move |queue| async move { queue.nack_now(receipt, mode, delay).await }).await
    }

    /// Extend: a heartbeat that moves the expiry; answers the new expiry (epoch ms). Runs to its
    /// end whether or not the caller still waits.
    pub(crate) async fn extend(self: &Arc<Self>, receipt: Receipt, visibility: Duration) -> Result<i64, QueueError> {
        self.detached(move |queue| async move { queue.extend_now(receipt, visibility).await }).await
    }

    /// Runs a lease step to its end whether or not the caller still waits ([`finish`]). A client
    /// may give up on any request: hyper then drops the handler's future, and a step run inside
    /// it would stop between its transaction and its bookkeeping, so that the applied step is
    /// forgotten and its retry told "delivered again". Finished on the queue's background
    /// tracker, the step is always recorded (the lease ended, its completion remembered, the
    /// metrics counted), and a retry learns the truth. Shutdown waits for the tracker.
    async fn detached<T, F, Fut>(self: &Arc<Self>, step: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Leases>) -> Fut,
        Fut: Future<Output = Result<T, QueueError>> + Send + 'static,
    {
        let work = step(self.clone());
        // Polled by the request's task while it waits, moved to the tracker if it leaves (its
        // log lines still carry the request's id): the step is done and recorded all the same.
        let answer = finish(&self.ctx.background, |answer| async move {
            let _ = answer.send(work.await);
        });
        answer.await.unwrap_or(Err(QueueError::ShuttingDown))
    }

    async fn ack_now(&self, receipt: Receipt) -> Result<(), QueueError> {
        let result = match self.open_lease(receipt) {
            Ok(token) => self.run_step(token, Step::Ack).await,
            Err(err) => Err(err),
        };
        self.as_retry_of(receipt, Step::Ack, result).await
    }

    async fn nack_now(&self, receipt: Receipt, mode: NackMode, delay: Duration) -> Result<(), QueueError> {
        let step = Step::Nack { mode, delay };
        let token = match self.open_lease(receipt) {
            Ok(token) => token,
            Err(err) => return self.as_retry_of(receipt, step, Err(err)).await,
        };
        if mode == NackMode::Requeue && self.ctx.grouped && names::group_of(&self.lease_snapshot(token)?.item).is_some()
        {
            // The lease stays held: the client may still nack it another way, or ack it.
            return Err(QueueError::NotForKind(
                "a grouped message keeps its place at the head of its group: nack it with mode=keep (the default \
                 on a grouped queue) or mode=delete, not mode=requeue"
                    .to_owned(),
            ));
        }
        let held = mode == NackMode::Keep || (mode == NackMode::Requeue && self.ctx.kind != QueueKind::Delay);
        if delay.is_zero() || !held {
            let result = self.run_step(token, step).await;
            return self.as_retry_of(receipt, step, result).await;
        }
        // Keep the lock for `delay`, then release (keep) or requeue: the message stays invisible
        // meanwhile. The client's receipt is spent.
        let turn = self.lease_snapshot(token)?.turn;
        let _turn = turn.lock().await;
        self.resolve_previous(token, None).await?;
        let on_expiry = if mode == NackMode::Keep { OnExpiry::Release } else { OnExpiry::Requeue };
        let updated = self.update_lease(token, |lease| {
            lease.open = false;
            lease.expires_at = Instant::now() + delay;
            lease.on_expiry = on_expiry;
        });
        if !updated {
            return Err(QueueError::LeaseLost("the lease ended".to_owned()));
        }
        // The client's step is done: its retry (the answer lost on the way) answers as it did.
        self.table.memory.remember_completion(token, step);
        self.ctx.qm.nacked(mode).inc();
        Ok(())
    }

    async fn extend_now(&self, receipt: Receipt, visibility: Duration) -> Result<i64, QueueError> {
        let token = self.open_lease(receipt)?;
        let turn = self.lease_snapshot(token)?.turn;
        let _turn = turn.lock().await;
        self.resolve_previous(token, None).await?;
        let lease = self.lease_snapshot(token)?;
        let zk = lease.zk.with_deadline(Instant::now() + self.ctx.session.request_timeout());
        // One transaction on the lease's session that checks its lock still exists.
        if let Err(err) = zk.multi(&[TxnOp::Check { path: lease.lock.clone(), version: LOCK_VERSION }]).await {
            return match err.error {
                ZkError::NoNode | ZkError::BadVersion | ZkError::SessionLost => {
                    self.end_lease(token);
                    Err(QueueError::LeaseLost("its lock is gone (its ZooKeeper session ended)".to_owned()))
                },
                other => Err(QueueError::Zk(other)),
            };
        }
        if !self.update_lease(token, |lease| lease.expires_at = Instant::now() + visibility) {
            return Err(QueueError::LeaseLost("the lease ended".to_owned()));
        }
        self.ctx.qm.leases_extended.inc();
        Ok(epoch_ms_after(visibility))
    }

    /// A client's step that finds its lease ended answers as that step did when the lease ended
    /// by this very step (a retry after a lost answer, resolved meanwhile by the reaper or by an
    /// earlier retry); any other answer stands. A lease of a lost session whose last step is still
    /// being settled is settled first: until its marker can be read, the answer is 504.
    async fn as_retry_of(
        &self,
        receipt: Receipt,
        step: Step,
        result: Result<(), QueueError>,
    ) -> Result<(), QueueError> {
        let Err(QueueError::LeaseLost(why)) = result else { return result };
        if self.is_settling(receipt) {
            self.settle(receipt.token, Instant::now() + self.ctx.session.request_timeout()).await;
            if self.is_settling(receipt) {
                return Err(QueueError::Zk(ZkError::OutcomeUnknown));
            }
        }
        if self.completed_by(receipt, step) { Ok(()) } else { Err(QueueError::LeaseLost(why)) }
    }

    /// Whether `receipt` names a lease of a lost session whose last step is being settled.
    fn is_settling(&self, receipt: Receipt) -> bool {
        self.table.issued(receipt.session_id, receipt.token)
            && self
                .table
                .lock()
                .settling
                .get(&receipt.token)
                .is_some_and(|lease| lease.zk.session_id() == receipt.session_id)
    }

    /// Settles a lease of a lost session by its last step's claim marker: applied, the step is
    /// booked (and remembered for the client's retry); not applied, the lease just ends (its lock
    /// died with the session: the message is delivered again). Unknown, it stays to settle;
    /// false then.
    pub(super) async fn settle(&self, token: u128, deadline: Instant) -> bool {
        let Some(lease) = self.table.lock().settling.get(&token).cloned() else { return true };
        let turn = lease.turn.clone();
        let _turn = turn.lock().await;
        if !self.table.lock().settling.contains_key(&token) {
            return true; // settled meanwhile
        }
        let Some(Unresolved { step, marker: Some(marker), sent }) = lease.unresolved.clone() else {
            self.end_lease(token);
            return true;
        };
        match self.ctx.markers.outcome(&marker, sent, deadline).await {
            Outcome::Applied => self.step_applied(token, &lease, step, None).await,
            Outcome::NotApplied => {
                self.end_lease(token);
            },
            Outcome::TooOld => self.give_up(token, &lease, step, &marker),
            Outcome::Unknown(_) => return false,
        }
        true
    }

    /// A step whose marker could not be read within the marker age: nobody can tell any more
    /// whether it applied (a missing marker may have been swept as stale). The lease ends, as it
    /// would have had this process stopped; counted and logged, never guessed.
    fn give_up(&self, token: u128, lease: &Lease, step: Step, marker: &str) {
        self.ctx.qm.settlements_given_up.inc();
        tracing::error!(queue = %self.ctx.name, message = %lease.item.name, marker = %marker, step = step.describe(),
            "zkq could not learn within take.claim_marker_age whether a lease step applied; the lease ends");
        self.end_lease(token);
    }

    /// Keeps a step whose outcome is unknown for later: on its live lease (resolved before
    /// anything else happens to it), or, when its session was lost meanwhile, to be settled by
    /// its marker.
    fn keep_unresolved(&self, token: u128, lease: &Lease, unresolved: Unresolved) {
        let has_marker = unresolved.marker.is_some();
        let kept = unresolved.clone();
        if self.update_lease(token, |lease| lease.unresolved = Some(kept)) || !has_marker {
            return;
        }
        let mut settling = lease.clone();
        settling.unresolved = Some(unresolved);
        self.table.lock().settling.insert(token, settling);
        self.table.changed.notify_one();
    }

    /// Whether `receipt` names a lease this process issued and that `step` completed
    /// (remembered for the last [`super::memory::REMEMBERED_COMPLETIONS`] completions of the queue).
    fn completed_by(&self, receipt: Receipt, step: Step) -> bool {
        self.table.issued(receipt.session_id, receipt.token)
            && self.table.memory.completed_by(receipt.token) == Some(step)
    }

    /// Releases a lease whose client left before it was handed over (not counted as a nack).
    pub(in crate::queue) async fn abandon_lease(&self, receipt: Receipt) {
        let token = receipt.token;
        if self.run_step(token, Step::Abandon).await.is_err() {
            // No ZooKeeper now: let the reaper release it as soon as it can.
            self.update_lease(token, |lease| {
                lease.open = false;
                lease.on_expiry = OnExpiry::Return;
                lease.expires_at = Instant::now();
            });
        }
    }

    /// Releases every lease (shutdown): their messages are delivered again at once instead of
    /// after the session timeout. Returns how many were released.
    pub(crate) async fn release_all_leases(&self) -> usize {
        let tokens: Vec<u128> = self.table.lock().live.keys().copied().collect();
        let releases = tokens.into_iter().map(|token| self.run_step(token, Step::Shutdown));
        futures::future::join_all(releases).await.into_iter().filter(Result::is_ok).count()
    }

    /// Runs `step` on a live lease: waits for the lease's turn, resolves an earlier step whose
    /// answer was lost, then runs the step's transaction. A lost answer is resolved at once by
    /// the lock's evidence; if ZooKeeper cannot say in time, the lease is marked unresolved and
    /// the error (503/504) tells the client to retry with the same receipt.
    pub(super) async fn run_step(&self, token: u128, step: Step) -> Result<(), QueueError> {
        let turn = self.lease_snapshot(token)?.turn;
        let _turn = turn.lock().await;
        if self.resolve_previous(token, Some(step)).await? {
            return Ok(());
        }
        let lease = self.lease_snapshot(token)?;
        let deadline = Instant::now() + self.ctx.session.request_timeout();
        let effect = step.effect(lease.on_expiry);
        let mut attempts = 0;
        loop {
            attempts += 1;
            // A step that changes the message leaves evidence that outlives the session.
            let marker = (!effect.releases()).then(|| self.ctx.markers.next(&lease.zk));
            let sent = Instant::now();
            match self.step_txn(&lease, effect, marker.as_deref(), deadline).await {
                Ok(created) => {
                    if let Some(marker) = marker {
                        self.ctx.markers.applied(marker);
                    }
                    self.step_applied(token, &lease, step, created).await;
                    return Ok(());
                },
                // Its marker decides, whatever became of the session.
                Err(ZkError::OutcomeUnknown | ZkError::SessionLost) if let Some(marker) = marker => {
                    match self.ctx.markers.outcome(&marker, sent, deadline).await {
                        Outcome::Applied => {
                            self.step_applied(token, &lease, step, None).await;
                            return Ok(());
                        },
                        Outcome::NotApplied => {
                            match lock_is_ours(&lease.zk.with_deadline(deadline), &lease.lock, &lease.claim_id).await {
                                Ok(true) if attempts < 2 && Instant::now() < deadline => {},
                                Ok(true) | Err(ZkError::Unavailable | ZkError::OutcomeUnknown) => {
                                    return Err(QueueError::Zk(ZkError::Unavailable));
                                },
                                // Not applied, and our lock is gone: with the session, or by
                                // someone else's hand. The message is delivered again.
                                Ok(false) | Err(ZkError::SessionLost) => {
                                    self.end_lease(token);
                                    return Err(QueueError::LeaseLost(LOCK_GONE.to_owned()));
                                },
                                // Not applied; the lease stays for a retry.
                                Err(err) => return Err(QueueError::Zk(err)),
                            }
                        },
                        Outcome::Unknown(_) | Outcome::TooOld => {
                            self.keep_unresolved(token, &lease, Unresolved { step, marker: Some(marker), sent });
                            return Err(QueueError::Zk(ZkError::OutcomeUnknown));
                        },
                    }
                },
                Err(ZkError::OutcomeUnknown) => {
                    match lock_is_ours(&lease.zk.with_deadline(deadline), &lease.lock, &lease.claim_id).await {
                        Ok(false) => {
                            self.step_applied(token, &lease, step, None).await;
                            return Ok(());
                        },
                        Ok(true) if attempts < 2 && Instant::now() < deadline => {},
                        Ok(true) => return Err(QueueError::Zk(ZkError::Unavailable)),
                        Err(ZkError::SessionLost) => {
                            self.end_lease(token);
                            return Err(QueueError::LeaseLost(LOCK_GONE.to_owned()));
                        },
                        Err(_) => {
                            self.keep_unresolved(token, &lease, Unresolved { step, marker: None, sent });
                            return Err(QueueError::Zk(ZkError::OutcomeUnknown));
                        },
                    }
                },
                Err(ZkError::SessionLost) => {
                    self.end_lease(token);
                    return Err(QueueError::LeaseLost(LOCK_GONE.to_owned()));
                },
                // Our lock is gone although our session lives (someone else's lock may stand in
                // its place, which the version kept us from deleting). For a release that is the
                // goal; for anything else the message may be anywhere now.
                Err(ZkError::NoNode | ZkError::BadVersion) if effect.releases() => {
                    self.step_applied(token, &lease, step, None).await;
                    return Ok(());
                },
                // The message was changed or removed by a consumer that ignores locks, or our lock
                // was removed (a Curator consumer's retried delete) or replaced: the lease is void.
                // Release our lock if it is still there (a release step never fails this way).
                Err(ZkError::NoNode | ZkError::BadVersion) => {
                    if !effect.releases() {
                        let _ = self.step_txn(&lease, Effect::Release, None, deadline).await;
                    }
                    self.end_lease(token);
                    return Err(QueueError::LeaseLost(
                        "the message or its lock was changed or removed by another client".to_owned(),
                    ));
                },
                Err(err) => return Err(QueueError::Zk(err)),
            }
        }
    }

    /// Resolves a step of this lease whose answer was lost, by the lock's evidence. Returns
    /// true when it applied and was `step` itself (a retry): the lease is then complete.
    async fn resolve_previous(&self, token: u128, step: Option<Step>) -> Result<bool, QueueError> {
        let lease = self.lease_snapshot(token)?;
        let Some(Unresolved { step: previous, marker, sent }) = lease.unresolved.clone() else { return Ok(false) };
        let deadline = Instant::now() + self.ctx.session.request_timeout();
        let zk = lease.zk.with_deadline(deadline);
        if let Some(marker) = marker {
            return match self.ctx.markers.outcome(&marker, sent, deadline).await {
                Outcome::Applied => {
                    self.step_applied(token, &lease, previous, None).await;
                    if step == Some(previous) {
                        Ok(true)
                    } else {
                        Err(QueueError::LeaseLost(format!("the lease ended: {} of it completed", previous.describe())))
                    }
                },
                // Not applied: the lease goes on (if its lock is gone, its next step finds out).
                Outcome::NotApplied => {
                    self.update_lease(token, |lease| lease.unresolved = None);
                    Ok(false)
                },
                Outcome::TooOld => {
                    self.give_up(token, &lease, previous, &marker);
                    Err(QueueError::Zk(ZkError::OutcomeUnknown))
                },
                Outcome::Unknown(err) => Err(QueueError::Zk(err)),
            };
        }
        match lock_is_ours(&zk, &lease.lock, &lease.claim_id).await {
            Ok(true) => {
                self.update_lease(token, |lease| lease.unresolved = None);
                Ok(false)
            },
            Ok(false) => {
                self.step_applied(token, &lease, previous, None).await;
                if step == Some(previous) {
                    Ok(true)
                } else {
                    Err(QueueError::LeaseLost(format!("the lease ended: {} of it completed", previous.describe())))
                }
            },
            Err(ZkError::SessionLost) => {
                self.end_lease(token);
                Err(QueueError::LeaseLost(LOCK_GONE.to_owned()))
            },
            Err(err) => Err(QueueError::Zk(err)),
        }
    }

    /// Runs the transaction of `effect` (creating `marker` with it); for a requeue, answers the
    /// new node's name.
    async fn step_txn(
        &self,
        lease: &Lease,
        effect: Effect,
        marker: Option<&str>,
        deadline: Instant,
    ) -> Result<Option<String>, ZkError> {
        let zk = lease.zk.with_deadline(deadline);
        let item_path = lease.item_path(&self.ctx.path);
        // Only our lock: one created under the same name by someone else has another version.
        let lock = TxnOp::Delete { path: lease.lock.clone(), version: Some(LOCK_VERSION) };
        let counter = TxnOp::Delete { path: lease.counter.clone(), version: None };
        let mut ops = match effect {
            Effect::Release => return zk.delete(&lease.lock, Some(LOCK_VERSION)).await.map(|()| None),
            Effect::Return => return release_uncounted(&zk, &lease.lock, &lease.uncount).await.map(|()| None),
            Effect::Complete => {
                vec![TxnOp::Delete { path: item_path, version: Some(lease.data_version) }, lock, counter]
            },
            Effect::Requeue(delay) => {
                let meta = match &lease.item.meta {
                    ItemMeta::DeliverAt(at) if !delay.is_zero() => {
                        ItemMeta::DeliverAt((*at).max(epoch_ms_after(delay)))
                    },
                    _ if self.ctx.kind == QueueKind::Delay && !delay.is_zero() => {
                        ItemMeta::DeliverAt(epoch_ms_after(delay))
                    },
                    other => other.clone(),
                };
                let create = TxnOp::Create {
                    path: format!("{}/{}", self.ctx.path, names::put_prefix(self.ctx.naming, &meta)),
                    data: lease.data.clone(),
                    mode: NodeMode::PersistentSequential,
                };
                vec![TxnOp::Delete { path: item_path, version: Some(lease.data_version) }, create, lock, counter]
            },
        };
        if let Some(marker) = marker {
            ops.insert(0, ClaimMarkers::create_op(marker));
        }
        // The delivery count goes with the message; it may be missing (counted by an older zkq).
        // The marker directory may be missing too (first use, or removed by hand).
        // Through group commit: acks in flight together share one transaction; a step sends
        // its own when it can (it runs to its end, see `Leases::detached`).
        let (mut counted, mut marker_dir) = (true, marker.is_none());
        let results = loop {
            match self.ctx.group.submit_here(&self.ctx.background, &zk, ops.clone()).await {
                Ok(results) => break results,
                Err(err) if err.error == ZkError::NoNode && counted && err.index == Some(ops.len() - 1) => {
                    ops.pop();
                    counted = false;
                },
                Err(err) if err.error == ZkError::NoNode && !marker_dir && err.index == Some(0) => {
                    zk.ensure_path(self.ctx.markers.dir()).await?;
                    marker_dir = true;
                },
                Err(err) => return Err(err.error),
            }
        };
        // The requeued node (not the marker).
        let queue_dir = format!("{}/", self.ctx.path);
        Ok(results.into_iter().find_map(|r| match r {
            TxnResult::Created(path) if path.starts_with(&queue_dir) => path.rsplit('/').next().map(str::to_owned),
            _ => None,
        }))
    }

    /// Books a step that applied: the lease ends, the cache and the metrics follow.
    async fn step_applied(&self, token: u128, lease: &Lease, step: Step, created: Option<String>) {
        self.end_lease(token);
        if matches!(step, Step::Ack | Step::Nack { .. }) {
            self.table.memory.remember_completion(token, step);
        }
        match step.effect(lease.on_expiry) {
            Effect::Complete => self.cache.removed_local(),
            Effect::Requeue(_) => {
                self.cache.removed_local();
                match created.as_deref().and_then(|name| names::parse(self.ctx.naming, name)) {
                    Some(item) => {
                        // Keep the count with the message (best effort: a crash here resets it).
                        let zk = lease.zk.with_deadline(Instant::now() + self.ctx.session.request_timeout());
                        let count = counter_bytes(lease.delivery_count);
                        let _ = zk.create(&self.counter_path(&item.name), &count, NodeMode::Persistent).await;
                        self.cache.insert_local(item);
                    },
                    None => self.cache.mark_stale(),
                }
            },
            Effect::Release | Effect::Return => self.cache.released_local(lease.item.clone()),
        }
        match step {
            Step::Ack => self.ctx.qm.messages_acked.inc(),
            Step::Nack { mode, .. } => self.ctx.qm.nacked(mode).inc(),
            Step::Expire if lease.open && lease.on_expiry == OnExpiry::Release => self.ctx.qm.messages_expired.inc(),
            Step::Expire | Step::Abandon | Step::Shutdown => {},
        }
    }
}
