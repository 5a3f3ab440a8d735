//! Acquiring messages, for a take and a lease alike: wait for a candidate, claim it in ZooKeeper
//! (`claim.rs`, one pipeline for both), and hand it to the caller, or give it back.
//!
//! Invariants:
//! - Nothing is handed out from memory: the cache only proposes candidates; each is confirmed by
//!   one transaction in ZooKeeper, and a lost race moves on to the next candidate.
//! - A take or lease never answers "empty" (204) unless a snapshot read after the request
//!   arrived had no deliverable message; without ZooKeeper it answers 503 by
//!   `max(wait, request timeout)`.
//! - The acquisition runs to its end whatever the HTTP request does (`queue::finish`: on the
//!   request's task while it waits, on the queue's background tracker once it left): a caller
//!   that leaves removes nothing, and a message removed (or leased) just as it left is put back
//!   (or released). Shutdown waits for that tracker before it closes the session.

mod claim;
mod crew;
mod handover;
mod split;
mod take;

use handover::GROUPED_TAKE_VISIBILITY;
pub(crate) use handover::Handover;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::QueueError;
use super::cache::ChildrenCache;
use super::context::Context;
use super::finish::finish;
use super::lease::LeaseGrant;
use super::lease::Leases;
use super::message::Message;
use super::names::ItemName;
use super::retention::Retention;
use crate::metrics::GaugeGuard;
use crate::zk::ZkError;

/// A message handed out, with its lease when it was leased.
pub(super) type Delivery = (Message, Option<LeaseGrant>);

/// Where the answer of an acquisition goes; closed when the HTTP client went away.
pub(super) type Caller = oneshot::Sender<Result<Acquired, QueueError>>;

/// What an acquisition hands out: its deliveries, and for a grouped take their [`Handover`].
pub(super) type Acquired = (Vec<Delivery>, Option<Handover>);

/// Messages taken; a grouped queue's come with their [`Handover`], which the caller settles once
/// it has handed them on.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    pub messages: Vec<Message>,
    pub handover: Option<Handover>,
}

/// Takes and lease claims of one queue: the one acquire pipeline. Its fields are private to
/// `acquire/`; a lease's own operations are asked of [`Leases`].
pub(super) struct Claims {
    ctx: Arc<Context>,
    cache: Arc<ChildrenCache>,
    leases: Arc<Leases>,
    /// Single claims ready at the same time, sharing a round trip (`crew.rs`).
    crew: crew::Crew,
    /// A message read past retention is deleted, not handed out.
    retention: Retention,
}

impl Claims {
    pub(super) fn new(ctx: Arc<Context>, cache: Arc<ChildrenCache>, leases: Arc<Leases>) -> Claims {
        let retention = Retention::new(ctx.clone(), cache.clone());
        Claims { ctx, cache, leases, crew: crew::Crew::default(), retention }
    }
}

/// What follows once the caller has the answer.
#[derive(Debug, Clone, Copy)]
enum AfterAnswer {
    /// Nothing: a take is settled by its claim, a lease by its client.
    Keep,
    /// The leases go with the answer, in a [`Handover`] (a grouped take).
    HandOver,
}

/// How many messages of one group a batch may hold (grouped queues).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PerGroup {
    /// One: the group's head (zkq's own `?max=`, push).
    One,
    /// The head and the messages behind it, in group order, as SQS hands several messages of
    /// one group to one receive; the group stays held until all of them are done.
    InOrder,
}

/// What kind of consumption is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acquire {
    Take,
    Lease(Duration),
}

impl Claims {
    /// Removes the head message and returns it, waiting up to `wait` for one.
    pub(super) async fn take(self: &Arc<Self>, wait: Duration) -> Result<Taken, QueueError> {
        self.take_many(wait, 1, usize::MAX).await
    }

    /// Removes up to `max` messages (and about `max_bytes` of bodies; the first always) from the
    /// head: waits up to `wait` for the first, then takes whatever else is there at once. Empty
    /// only when a 204 would be right for a single take.
    pub(super) async fn take_many(
        self: &Arc<Self>,
        wait: Duration,
        max: usize,
        max_bytes: usize,
    ) -> Result<Taken, QueueError> {
        let (acquired, handover) = if self.ctx.grouped {
            // A grouped take is a lease acked once its answer has left zkq (`handover.rs`): its
            // message keeps its place at the head of its group until then, so a taker that
            // leaves puts nothing out of order (a take's put-back would go to the tail).
            self.leases.check_leasable()?;
            let how = Acquire::Lease(GROUPED_TAKE_VISIBILITY);
            self.acquire(wait, how, (max, max_bytes, PerGroup::One), AfterAnswer::HandOver).await?
        } else {
            self.acquire(wait, Acquire::Take, (max, max_bytes, PerGroup::One), AfterAnswer::Keep).await?
        };
        Ok(Taken { messages: acquired.into_iter().map(|(message, _)| message).collect(), handover })
    }

    /// Leases the head message for `visibility`, waiting up to `wait` for one. The message stays
    /// in ZooKeeper, locked with Curator's lock node, until it is acked, nacked or expires.
    pub(super) async fn lease(
        self: &Arc<Self>,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Option<(Message, LeaseGrant)>, QueueError> {
        Ok(self.lease_many(wait, visibility, (1, usize::MAX), PerGroup::One).await?.into_iter().next())
    }

    /// Leases up to `max` messages, like [`Claims::take_many`].
    pub(super) async fn lease_many(
        self: &Arc<Self>,
        wait: Duration,
        visibility: Duration,
        (max, max_bytes): (usize, usize),
        per_group: PerGroup,
    ) -> Result<Vec<(Message, LeaseGrant)>, QueueError> {
        self.leases.check_leasable()?;
        let how = Acquire::Lease(visibility);
        let (acquired, _) = self.acquire(wait, how, (max, max_bytes, per_group), AfterAnswer::Keep).await?;
        Ok(acquired.into_iter().filter_map(|(message, grant)| grant.map(|grant| (message, grant))).collect())
    }

    async fn acquire(
        self: &Arc<Self>,
        wait: Duration,
        how: Acquire,
        batch: (usize, usize, PerGroup),
        after: AfterAnswer,
    ) -> Result<Acquired, QueueError> {
        if self.ctx.shutdown.is_cancelled() {
            return Err(QueueError::ShuttingDown);
        }
        let queue = self.clone();
        // The claim runs to its end whether or not the request still waits (`finish`); its log
        // lines still carry the request's id.
        let claimed = finish(&self.ctx.background, |tx| async move {
            let mut tx = tx;
            let result = queue.acquire_up_to(Instant::now() + wait, how, batch, &mut tx).await;
            let result = result.map(|delivered| match after {
                AfterAnswer::HandOver if !delivered.is_empty() => {
                    let receipts = delivered.iter().filter_map(|(_, grant)| grant.as_ref().map(|g| g.receipt));
                    let handover = Handover::new(queue.clone(), receipts.collect());
                    (delivered, Some(handover))
                },
                AfterAnswer::HandOver | AfterAnswer::Keep => (delivered, None),
            });
            if let Err(Ok((delivered, handover))) = tx.send(result) {
                // The caller left after messages were claimed: give them back (a handover
                // releases its leases as it is dropped).
                if handover.is_some() {
                    return;
                }
                for delivery in delivered {
                    queue.give_back_delivery(delivery).await;
                }
            }
        });
        claimed.await.unwrap_or(Err(QueueError::ShuttingDown))
    }

    /// The first delivery (waiting until `wait_until`), then more that are there now, up to
    /// `max` deliveries or `max_bytes` of bodies. A failure after the first ends the batch with
    /// what it has.
    async fn acquire_up_to(
        self: &Arc<Self>,
        wait_until: Instant,
        how: Acquire,
        (max, max_bytes, per_group): (usize, usize, PerGroup),
        caller: &mut Caller,
    ) -> Result<Vec<Delivery>, QueueError> {
        let Some(first) = self.acquire_until(wait_until, how, caller).await? else {
            return Ok(Vec::new());
        };
        let mut bytes = first.0.body.len();
        let mut delivered = vec![first];
        while delivered.len() < max && bytes < max_bytes {
            // The rest: the candidates there now, claimed together in one transaction; on a
            // grouped queue first the messages behind those delivered in their groups.
            let behind: Vec<ItemName> = match per_group {
                PerGroup::One => Vec::new(),
                PerGroup::InOrder => delivered
                    .iter()
                    .filter_map(|(message, _)| super::names::parse(self.ctx.naming, &message.message_id))
                    .collect(),
            };
            match Box::pin(self.claim_more(&behind, max - delivered.len(), max_bytes - bytes, how, caller)).await {
                Ok(more) if !more.is_empty() => {
                    bytes += more.iter().map(|(message, _)| message.body.len()).sum::<usize>();
                    delivered.extend(more);
                },
                Ok(_) | Err(_) => break,
            }
        }
        Ok(delivered)
    }

    /// Claims up to `want` of the candidates there now (and about `byte_budget` of bodies)
    /// without waiting: empty when there is none, or none could be claimed. Those this process
    /// owns come first, then those another fleet member owns: a batch takes what is there.
    async fn claim_more(
        self: &Arc<Self>,
        behind: &[ItemName],
        want: usize,
        byte_budget: usize,
        how: Acquire,
        caller: &Caller,
    ) -> Result<Vec<Delivery>, QueueError> {
        if self.ctx.shutdown.is_cancelled() {
            return Ok(Vec::new());
        }
        let Some(zk) = self.ctx.session.current() else { return Ok(Vec::new()) };
        let zk = zk.with_deadline(Instant::now() + self.ctx.session.request_timeout());
        let mut candidates = self.cache.followers(behind, want);
        while candidates.len() < want
            && let Some(candidate) = self.cache.pop(Instant::now())
        {
            candidates.push(candidate);
        }
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        self.claim_now(&zk, candidates, byte_budget, how, &|| caller.is_closed()).await
    }

    /// Gives back a message claimed for a caller that left: a lease is released, a taken message
    /// put back. Boxed, like the claims: an acquisition's task stays small while it only waits
    /// (10,000 waiting takes are 10,000 such tasks).
    async fn give_back_delivery(&self, (message, grant): Delivery) {
        match grant {
            Some(grant) => Box::pin(self.leases.abandon_lease(grant.receipt)).await,
            None => Box::pin(self.put_back(message)).await,
        }
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
        let arrived = Instant::now();
        let answer_by = wait_until.max(arrived + self.ctx.session.request_timeout());
        // The queue is watched while a taker is here (and a while after).
        let _demand = self.cache.demand();
        // And this process is a member of the queue's fleet: each new message has one owner.
        let _taking = self.cache.taking();
        let gone = CancellationToken::new();
        let mut first_wait = true;
        // Whether a barrier after the request arrived found the snapshot without a candidate.
        let mut vouched = false;
        loop {
            if caller.is_closed() {
                return Ok(None);
            }
            if self.ctx.shutdown.is_cancelled() {
                return Err(QueueError::ShuttingDown);
            }
            if self.cache.stands_by() {
                // Other members watch the queue for the fleet: wait for a call for help (then
                // this process watches too), or read the queue once at the end of the wait.
                let _waiting = GaugeGuard::new(self.ctx.qm.waiting_takers.clone());
                tokio::select! {
                    () = self.cache.until_watching() => continue,
                    () = tokio::time::sleep_until(wait_until) => {},
                    _ = caller.closed() => return Ok(None),
                    _ = self.ctx.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                }
                if self.cache.read_empty_since(arrived) {
                    // Another taker here read the queue after this one came, and found nothing.
                    return Ok(None);
                }
                return Box::pin(self.claim_from_read(answer_by, how, caller)).await;
            }
            let Some(candidate) = self.cache.pop(wait_until) else {
                if self.cache.is_dirty() {
                    // The snapshot may be missing items: re-read (one read shared by all takers).
                    let _waiting = GaugeGuard::new(self.ctx.qm.waiting_takers.clone());
                    let refreshed = tokio::select! {
                        r = self.cache.refreshed(answer_by) => r,
                        () = self.cache.until_standing_by() => continue,
                        _ = caller.closed() => return Ok(None),
                        _ = self.ctx.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
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
                        () = self.cache.until_standing_by() => continue,
                        _ = caller.closed() => return Ok(None),
                        _ = self.ctx.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
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
                    () = self.cache.until_standing_by() => {},
                    _ = caller.closed() => { gone.cancel(); return Ok(None) },
                    _ = self.ctx.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                };
                first_wait = false;
                continue;
            };
            let Some(zk) = self.ctx.session.current() else {
                // Suspended: nothing is handed out from memory; wait for the session.
                self.cache.push_front(candidate);
                let _waiting = GaugeGuard::new(self.ctx.qm.waiting_takers.clone());
                let connected = tokio::select! {
                    c = self.ctx.session.connected(answer_by) => c,
                    _ = caller.closed() => return Ok(None),
                    _ = self.ctx.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                };
                connected?;
                continue;
            };
            // Each claim gets the full request timeout, whatever is left of the taker's wait.
            let zk = zk.with_deadline(Instant::now() + self.ctx.session.request_timeout());
            match Box::pin(self.claim_one(&zk, candidate, how, caller)).await {
                Ok(delivered) => {
                    if let Some(first) = delivered {
                        return Ok(Some(first));
                    }
                    // Lost to another consumer, gone, locked or unreadable: the next candidate.
                },
                Err(QueueError::Zk(err)) if err.is_transient() => {
                    if Instant::now() >= answer_by {
                        return Err(err.into());
                    }
                },
                Err(err) => return Err(err),
            }
        }
    }

    /// A taker of a member that stands by, at the end of its wait: reads the queue (and its
    /// locks) and claims what it finds at once, in delivery order. So a fleet answers "empty"
    /// only on a read made after the request arrived that found nothing deliverable, as a
    /// watching member does: when every candidate it tried went to another consumer, it reads
    /// again, until `answer_by` (then 503, never a 204 it cannot vouch for).
    async fn claim_from_read(
        self: &Arc<Self>,
        answer_by: Instant,
        how: Acquire,
        caller: &mut Caller,
    ) -> Result<Option<Delivery>, QueueError> {
        /// At most this many claims from one read: each lost one was claimed by a watching member.
        const TRIES: usize = 4;
        loop {
            if Instant::now() >= answer_by {
                return Err(ZkError::Unavailable.into());
            }
            let Some(zk) = self.ctx.session.current() else {
                let connected = tokio::select! {
                    c = self.ctx.session.connected(answer_by) => c,
                    _ = caller.closed() => return Ok(None),
                    _ = self.ctx.shutdown.cancelled() => return Err(QueueError::ShuttingDown),
                };
                connected?;
                continue;
            };
            let zk = zk.with_deadline(Instant::now() + self.ctx.session.request_timeout());
            let read = async {
                let (children, _) = match zk.get_children(&self.ctx.path).await {
                    Ok(read) => read,
                    Err(ZkError::NoNode) => return Ok((Vec::new(), Vec::new())),
                    Err(err) => return Err(err),
                };
                let locked = match &self.ctx.lock_path {
                    Some(dir) if !children.is_empty() => match zk.get_children(dir).await {
                        Ok((locked, _)) => locked,
                        Err(ZkError::NoNode) => Vec::new(),
                        Err(err) => return Err(err),
                    },
                    _ => Vec::new(),
                };
                Ok((children, locked))
            };
            let started = Instant::now();
            let (children, locked) = match read.await {
                Ok(read) => read,
                Err(err) if err.is_transient() && Instant::now() < answer_by => continue,
                Err(err) => return Err(err.into()),
            };
            if children.is_empty() {
                self.cache.read_empty(started);
            }
            let offerable = self.cache.offerable_now(&children, &locked);
            if offerable.is_empty() {
                // Nothing deliverable at a moment after the request arrived: every child, if
                // any, is leased or being claimed.
                return Ok(None);
            }
            for candidate in offerable.into_iter().take(TRIES) {
                if caller.is_closed() {
                    return Ok(None);
                }
                match Box::pin(self.claim_one(&zk, candidate, how, caller)).await {
                    Ok(Some(first)) => return Ok(Some(first)),
                    Ok(None) => {},
                    Err(QueueError::Zk(err)) if err.is_transient() && Instant::now() < answer_by => {},
                    Err(err) => return Err(err),
                }
            }
            // Every one tried went to another consumer: the queue is busy, not empty.
        }
    }
}
