//! [`Queue`], the one door to a queue: what HTTP, push delivery and the service see. Its fields
//! are private to this file. Each call goes to the component that owns the protocol: puts
//! ([`Puts`], `put/`), takes and lease claims ([`Claims`], `acquire/`), lease steps
//! ([`Leases`], `lease/`), peek, info and removal ([`Browse`], `browse.rs`); they share one
//! [`Context`] and the children cache. The facade itself keeps only what decides when an idle
//! dynamic queue may close.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::acquire::{Claims, PerGroup, Taken};
use super::browse::Browse;
use super::cache::ChildrenCache;
use super::catalog::Presence;
use super::context::Context;
use super::lease::Leases;
use super::put::Puts;
use super::{
    DeadLetter, LeaseGrant, Message, NackMode, PeekedItem, PutOptions, PutReceipt, QueueError, QueueInfo, Receipt,
};
use crate::config::QueueKind;
use crate::metrics::QueueMetrics;
use crate::types::QueueName;
use crate::zk::Zk;

/// The components of a queue, built by the service (`service.rs`).
pub(super) struct Parts {
    pub(super) ctx: Arc<Context>,
    pub(super) cache: Arc<ChildrenCache>,
    pub(super) puts: Arc<Puts>,
    pub(super) claims: Arc<Claims>,
    pub(super) leases: Arc<Leases>,
    pub(super) browse: Browse,
}

/// One queue: where it lives, how its nodes are named, and the protocols that read and write it.
pub(crate) struct Queue {
    ctx: Arc<Context>,
    cache: Arc<ChildrenCache>,
    puts: Arc<Puts>,
    claims: Arc<Claims>,
    leases: Arc<Leases>,
    browse: Browse,
    /// Ends this queue's own tasks (refresher, reaper, sweeper, lock watches) when it is closed.
    stop: CancellationToken,
    /// Requests using the queue right now ([`QueueRef`]s alive).
    users: AtomicUsize,
    /// When the last request using it ended.
    last_used: Mutex<Instant>,
}

/// A queue in use by a request: an idle dynamic queue is closed only when no `QueueRef` to it
/// lives (and it has no waiter and no lease).
pub(crate) struct QueueRef(Arc<Queue>);

impl std::ops::Deref for QueueRef {
    type Target = Arc<Queue>;

    fn deref(&self) -> &Arc<Queue> {
        &self.0
    }
}

impl Drop for QueueRef {
    fn drop(&mut self) {
        *self.0.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.users.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Queue {
    pub(super) fn new(parts: Parts, stop: CancellationToken) -> Queue {
        let Parts { ctx, cache, puts, claims, leases, browse } = parts;
        Queue {
            ctx,
            cache,
            puts,
            claims,
            leases,
            browse,
            stop,
            users: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
        }
    }

    /// A new user of the queue (a request), until the `QueueRef` is dropped.
    pub(super) fn used(self: &Arc<Self>) -> QueueRef {
        self.users.fetch_add(1, Ordering::SeqCst);
        QueueRef(self.clone())
    }

    /// Whether nothing uses the queue (no request, waiter or lease) and has not for `idle`, and
    /// its sweeper has no idempotency record left to delete.
    pub(super) fn idle_for(&self, idle: Duration) -> bool {
        self.users.load(Ordering::SeqCst) == 0
            && self.cache.waiting() == 0
            && self.leases.leases_out() == 0
            && !self.leases.settling_leases()
            && !self.puts.holds_records()
            && self.last_used.lock().unwrap_or_else(|p| p.into_inner()).elapsed() >= idle
    }

    /// Ends the queue's own tasks (it was closed).
    pub(super) fn close(&self) {
        self.stop.cancel();
    }

    /// Where the records of this queue's idempotency keys live.
    pub(super) fn records_dir(&self) -> String {
        self.puts.records_dir()
    }

    pub(crate) fn name(&self) -> &QueueName {
        &self.ctx.name
    }

    pub(crate) fn kind(&self) -> QueueKind {
        self.ctx.kind
    }

    /// The queue node's path.
    pub(crate) fn path(&self) -> &str {
        &self.ctx.path
    }

    /// Where consumers lock its messages (Curator's lock path), if they do.
    pub(crate) fn lock_path(&self) -> Option<&str> {
        self.ctx.lock_path.as_deref()
    }

    pub(crate) fn max_items(&self) -> Option<u32> {
        self.ctx.max_items
    }

    /// Whether the configuration declares it (else it is dynamic).
    pub(crate) fn declared(&self) -> bool {
        self.ctx.declared
    }

    /// Where its dead letters go now: its declared `dead_letter`, else its settings' (a dynamic
    /// queue's `RedrivePolicy`).
    pub(crate) fn dead_letter(&self) -> Option<Arc<DeadLetter>> {
        self.ctx.dead_letter_now()
    }

    /// How long its messages are kept: its declared `retention`, else its settings'
    /// (`MessageRetentionPeriod`); `None`: until consumed.
    pub(crate) fn retention(&self) -> Option<std::time::Duration> {
        self.ctx.retention_now()
    }

    /// A dynamic queue's own settings, as its settings node says now (none for a declared queue).
    pub(crate) fn settings(&self) -> super::QueueSettings {
        self.ctx.settings.get().settings
    }

    /// Applies settings just written to its node here at once (the node's watch follows).
    pub(super) fn settings_written(&self, current: super::settings::Current) {
        self.ctx.settings.set(current);
    }

    /// What this process last saw the queue's node say (`None`: not read since it opened).
    pub(super) fn presence(&self) -> Option<Presence> {
        self.cache.presence()
    }

    /// What the queue's node says, as the refresher follows it (its persistent watch).
    pub(super) fn presence_changes(&self) -> tokio::sync::watch::Receiver<Option<Presence>> {
        self.cache.presence_changes()
    }

    /// Whether a list of the queues this process serves shows it: declared, or not seen deleted
    /// (or without a node) since it opened.
    pub(crate) fn listed(&self) -> bool {
        self.declared() || matches!(self.presence(), None | Some(Presence::Live))
    }

    /// Waits until the queue's own settings are known (see `SettingsCell::wait_loaded`).
    pub(super) async fn settings_loaded(&self, deadline: tokio::time::Instant) -> bool {
        self.ctx.settings.wait_loaded(deadline).await
    }

    /// ZooKeeper just showed the queue's node live (this process read or revived it).
    pub(super) fn seen_live(&self) {
        self.cache.set_presence(Presence::Live);
    }

    /// This process deleted the queue: its leases end now, before the node's event arrives.
    pub(super) fn seen_deleted(&self) {
        self.cache.set_presence(Presence::Deleted);
    }

    pub(crate) fn metrics(&self) -> &QueueMetrics {
        &self.ctx.qm
    }

    /// Stores one message; answers only after ZooKeeper confirmed the node.
    pub(crate) async fn put(&self, body: &[u8], options: PutOptions) -> Result<PutReceipt, QueueError> {
        self.puts.put(body, options).await
    }

    /// Stores `messages` all or none, in one ZooKeeper transaction (shared with other puts in
    /// flight); keyed messages are stored once per key within the window.
    pub(crate) async fn put_many(
        &self,
        messages: Vec<(&[u8], PutOptions)>,
        wait: Duration,
    ) -> Result<Vec<PutReceipt>, QueueError> {
        self.puts.put_many(messages, wait).await
    }

    /// Stores `messages` as ONE node holding all of them, as Curator's `putMulti` does.
    pub(crate) async fn put_multi(
        &self,
        messages: Vec<(&[u8], PutOptions)>,
        wait: Duration,
    ) -> Result<PutReceipt, QueueError> {
        self.puts.put_multi(messages, wait).await
    }

    /// Removes the head message and returns it, waiting up to `wait` for one. A grouped queue's
    /// message comes with the [`Handover`](super::Handover) its answer must carry to the client.
    pub(crate) async fn take(&self, wait: Duration) -> Result<Taken, QueueError> {
        self.claims.take(wait).await
    }

    /// Removes up to `max` messages (and about `max_bytes` of bodies; the first always) from the
    /// head: waits up to `wait` for the first, then takes whatever else is there at once.
    pub(crate) async fn take_many(&self, wait: Duration, max: usize, max_bytes: usize) -> Result<Taken, QueueError> {
        self.claims.take_many(wait, max, max_bytes).await
    }

    /// Leases the head message for `visibility`, waiting up to `wait` for one.
    pub(crate) async fn lease(
        &self,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Option<(Message, LeaseGrant)>, QueueError> {
        self.claims.lease(wait, visibility).await
    }

    /// Leases up to `max` messages, like [`Queue::take_many`]; on a grouped queue one per group,
    /// or with [`PerGroup::InOrder`] several of one group in its order.
    pub(crate) async fn lease_many(
        &self,
        wait: Duration,
        visibility: Duration,
        (max, max_bytes): (usize, usize),
        per_group: PerGroup,
    ) -> Result<Vec<(Message, LeaseGrant)>, QueueError> {
        self.claims.lease_many(wait, visibility, (max, max_bytes), per_group).await
    }

    /// Whether a lease could be granted now: the queue has a lock path and fewer than
    /// `lease.max_per_queue` leases out.
    pub(crate) fn check_leasable(&self) -> Result<(), QueueError> {
        self.leases.check_leasable()
    }

    /// Ack: the message is done and deleted. Runs to its end whether or not the caller waits.
    pub(crate) async fn ack(&self, receipt: Receipt) -> Result<(), QueueError> {
        self.leases.ack(receipt).await
    }

    /// SQS's `DeleteMessage` with the receipt of a lease that ended (its visibility passed, it
    /// was released, or it was acked): removes the message the lease held unless a consumer holds
    /// it now (then it is left to that consumer, as SQS's "the message might not be deleted"
    /// allows); a message already gone is no error. False when this process does not know the
    /// receipt (not issued here, or too long ago): nothing was done.
    pub(crate) async fn remove_after_lease(&self, receipt: Receipt) -> Result<bool, QueueError> {
        let Some(name) = self.leases.ended_item(receipt).await else { return Ok(false) };
        match self.browse.remove(&name).await {
            Ok(()) | Err(QueueError::MessageNotFound(_)) => Ok(true),
            Err(err) => Err(err),
        }
    }

    /// The lease that holds now the message an ended lease `receipt` held, when a lease of this
    /// process does (SQS changes the visibility of a message in flight by an old receipt).
    pub(crate) async fn current_lease_of(&self, receipt: Receipt) -> Option<Receipt> {
        self.leases.current_lease_of(receipt).await
    }

    /// Gives back a lease whose message was not handed out: released in its place, its delivery
    /// not counted, as if it had never been leased.
    pub(crate) async fn give_back_unhanded(&self, receipt: Receipt) {
        self.leases.abandon_lease(receipt).await;
    }

    /// Nack: the consumer failed; `delay` postpones the next delivery. Runs to its end whether
    /// or not the caller waits.
    pub(crate) async fn nack(&self, receipt: Receipt, mode: NackMode, delay: Duration) -> Result<(), QueueError> {
        self.leases.nack(receipt, mode, delay).await
    }

    /// What a nack without a mode does: a grouped message keeps its place at the head of its
    /// group; any other is requeued at the tail.
    pub(crate) fn default_nack_mode(&self) -> NackMode {
        if self.ctx.grouped { NackMode::Keep } else { NackMode::Requeue }
    }

    /// Whether its messages carry groups (`queues.NAME.grouped`).
    pub(crate) fn grouped(&self) -> bool {
        self.ctx.grouped
    }

    /// What its groups look like now, as this zkq's cache sees them (`None`: not grouped, or the
    /// cache does not follow the queue's events right now).
    pub(crate) fn group_stats(&self) -> Option<super::GroupStats> {
        self.cache.group_stats()
    }

    /// Extend: moves the lease's expiry; answers the new expiry (epoch ms).
    pub(crate) async fn extend(&self, receipt: Receipt, visibility: Duration) -> Result<i64, QueueError> {
        self.leases.extend(receipt, visibility).await
    }

    /// Releases every lease of the queue (shutdown); how many were released.
    pub(crate) async fn release_all_leases(&self) -> usize {
        self.leases.release_all_leases().await
    }

    /// The first `limit` messages in delivery order, without removing them.
    pub(crate) async fn peek(&self, limit: usize) -> Result<Vec<PeekedItem>, QueueError> {
        self.browse.peek(limit).await
    }

    /// Depth, messages in flight, waiting takers and the age of the head message.
    pub(crate) async fn info(&self) -> Result<QueueInfo, QueueError> {
        self.browse.info().await
    }

    /// Removes one message by its node name; respects locks held by others.
    pub(crate) async fn remove(&self, message_id: &str) -> Result<(), QueueError> {
        self.browse.remove(message_id).await
    }

    /// Removes every message no consumer holds, or every message ([`super::Purge`]).
    pub(crate) async fn purge(&self, what: super::Purge) -> Result<super::Purged, QueueError> {
        let purged = self.browse.purge(what).await?;
        if !purged.complete {
            return Ok(purged);
        }
        // Then its idempotency keys (SQS's deduplication ids): a purge starts the queue over.
        let complete = self.puts.forget_keys().await?;
        Ok(super::Purged { complete, ..purged })
    }

    /// Removes every message put with `id` (id queues); how many were removed.
    pub(crate) async fn remove_by_id(&self, id: &str) -> Result<usize, QueueError> {
        self.browse.remove_by_id(id).await
    }

    /// Since when the head message waits, read with `zk` (the metrics scrape).
    pub(super) async fn head_waiting_since(&self, zk: &Zk) -> Result<super::HeadAge, QueueError> {
        self.browse.head_waiting_since(zk).await
    }
}
