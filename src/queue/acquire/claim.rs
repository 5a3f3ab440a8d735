//! The one claim pipeline, for a take and a lease of one message or of many: read the
//! candidates, then claim them in ONE transaction.
//!
//! 1. When a byte budget limits a claim of several: their sizes (known for nodes this process
//!    wrote or read, else one `exists` each, sent together), and only the candidates within the
//!    budget go on. Then one multi-read of the candidates' nodes (and,
//!    for a lease, their delivery counts).
//! 2. Each candidate read is made ready, in order, within the byte budget and a transaction size
//!    ZooKeeper accepts: a take removes the node (`take.rs`), a lease locks it and counts the
//!    delivery (`lease/claim.rs`, which may move it to the dead-letter queue instead); either
//!    splits a Curator putMulti node. The first candidate is always tried: one whose claim alone
//!    would pass the request limit is first split to fit (`split.rs`).
//! 3. One transaction holds every ready candidate's operations (a take's also creates a claim
//!    marker). A candidate another consumer locked, took or changed fails it at its own
//!    operations: it is dropped and the others are sent again.
//! 4. A lost answer is settled for all of them at once, by one piece of evidence: a take's claim
//!    marker, or a lease's first lock (the transaction applied all or none of its locks, and each
//!    claim id is unique). If ZooKeeper cannot say in time, a background task settles it later:
//!    taken messages are put back, created locks released, candidates offered again.

use std::sync::Arc;

use tokio::time::Instant;

use super::super::QueueError;
use super::super::attributes;
use super::super::candidate::{Declined, Read};
use super::super::claims::{ClaimMarkers, Outcome};
use super::super::envelope;
use super::super::lease::{Claiming, FencingToken, LeasePrepared, NotNow, our_lock_created_at};
use super::super::names::ItemName;
use super::Claims;
use super::split::Fit;
use super::take;
use super::{Acquire, Delivery};
use crate::metrics::ClaimOutcome;
use crate::zk::{MAX_BATCH_BYTES, NodeStat, TxnError, TxnOp, TxnResult, Zk, ZkError};

/// A candidate read and ready to claim: the operations it adds to the transaction and what its
/// claim hands out once they applied.
enum Ready<'q> {
    Take {
        candidate: ItemName,
        items: Vec<Vec<u8>>,
        /// The attributes and traceparent kept with the message.
        annex: attributes::Trailer,
        ops: Vec<TxnOp>,
        splits: Vec<ItemName>,
    },
    Lease {
        prepared: LeasePrepared,
        _claiming: Claiming<'q>,
    },
}

impl Ready<'_> {
    fn candidate(&self) -> &ItemName {
        match self {
            Ready::Take { candidate, .. } => candidate,
            Ready::Lease { prepared, .. } => &prepared.candidate,
        }
    }

    fn ops(&self) -> &[TxnOp] {
        match self {
            Ready::Take { ops, .. } => ops,
            Ready::Lease { prepared, .. } => &prepared.ops,
        }
    }

    /// The bytes of the message it hands out.
    fn body_len(&self) -> usize {
        match self {
            Ready::Take { items, .. } => items.first().map_or(0, Vec::len),
            Ready::Lease { prepared, .. } => prepared.body.len(),
        }
    }

    /// Which candidate's operation failed a transaction: what that says about it.
    fn failed_at(&self, offset: usize, error: &ZkError, locking: bool) -> Option<Declined> {
        match self {
            Ready::Take { .. } if *error == ZkError::NodeExists && locking && offset == 0 => Some(Declined::Locked),
            Ready::Take { .. } => Some(Declined::Lost),
            Ready::Lease { .. } => LeasePrepared::failed_at(offset, error),
        }
    }
}

impl Claims {
    /// Claims `candidates` (popped from the cache, in order) within about `byte_budget` of bodies,
    /// the first always tried, in as few round trips as it can (see the module). Candidates not
    /// claimed are booked (lost, gone, locked: `zkq_claims_total`) or given back to the cache.
    /// Empty when none could be claimed; a transient error when ZooKeeper could not be asked;
    /// `TooManyLeases` when a lease would pass `lease.max_per_queue` and none was claimed.
    pub(super) async fn claim_now(
        self: &Arc<Self>,
        zk: &Zk,
        candidates: Vec<ItemName>,
        byte_budget: usize,
        how: Acquire,
        abandoned: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Delivery>, QueueError> {
        let lock_dir = match (how, &self.ctx.lock_path) {
            (Acquire::Lease(_), None) => {
                // Only a queue with a lock path can lease (checked before it gets here).
                self.give_back(candidates);
                return Ok(Vec::new());
            },
            (_, lock_dir) => lock_dir.clone(),
        };
        let marked = self.mark(zk, candidates, how)?;
        if marked.is_empty() {
            return Ok(Vec::new());
        }
        let chosen = self.ready_all(zk, marked, byte_budget, how, lock_dir.as_deref()).await?;
        self.commit(zk, chosen, how, lock_dir.as_deref(), abandoned).await
    }

    /// Marks each candidate of a lease as being leased by this process, so that two requests of
    /// one process never claim the same one (the second would find our own lock). Empty when
    /// none is left; `TooManyLeases` when a lease would pass `lease.max_per_queue` and none was
    /// marked.
    fn mark(
        self: &Arc<Self>,
        zk: &Zk,
        candidates: Vec<ItemName>,
        how: Acquire,
    ) -> Result<Vec<(ItemName, Option<Claiming<'_>>)>, QueueError> {
        let mut marked = Vec::with_capacity(candidates.len());
        let mut over_limit = Vec::new();
        for candidate in candidates {
            match how {
                Acquire::Lease(_) => match self.leases.claiming(&candidate.name) {
                    Ok(claiming) => marked.push((candidate, Some(claiming))),
                    Err(NotNow::BeingClaimed) => self.declined(zk, candidate, Declined::Locked),
                    Err(NotNow::Full) => over_limit.push(candidate),
                },
                Acquire::Take => marked.push((candidate, None)),
            }
        }
        let full = !over_limit.is_empty();
        self.give_back(over_limit);
        if marked.is_empty() && full {
            return Err(QueueError::TooManyLeases(self.ctx.max_leases));
        }
        Ok(marked)
    }

    /// Reads the marked candidates (within about `byte_budget` of bodies, the first always) and
    /// readies each for the transaction; those declined are booked, those left for later given
    /// back. Empty when none is ready; why the first could not be read when none is.
    async fn ready_all<'q>(
        self: &'q Arc<Self>,
        zk: &Zk,
        marked: Vec<(ItemName, Option<Claiming<'q>>)>,
        byte_budget: usize,
        how: Acquire,
        lock_dir: Option<&str>,
    ) -> Result<Vec<Ready<'q>>, QueueError> {
        let marked = match self.within_budget(zk, marked, byte_budget).await {
            Ok(marked) => marked,
            Err(err) => return Err(err.into()),
        };
        if marked.is_empty() {
            return Ok(Vec::new());
        }
        // A candidate taken after another member's grace, where no lock events would have told
        // that the member holds it: its lock is read with it, so a lease held past the grace
        // costs a read, not a failed transaction.
        let check_lock: Vec<bool> =
            marked.iter().map(|(c, _)| lock_dir.is_some() && self.cache.is_unverified(&c.name)).collect();
        let paths: Vec<String> = marked
            .iter()
            .zip(&check_lock)
            .flat_map(|((c, _), check)| {
                let node = format!("{}/{}", self.ctx.path, c.name);
                let mut paths = match how {
                    Acquire::Take => vec![node],
                    Acquire::Lease(_) => vec![node, self.leases.counter_path(&c.name)],
                };
                if let (true, Some(dir)) = (*check, lock_dir) {
                    paths.push(format!("{dir}/{}", c.name));
                }
                paths
            })
            .collect();
        let reads = match read_all(zk, &paths).await {
            Ok(reads) => reads,
            Err(err) => {
                self.give_back(marked.into_iter().map(|(candidate, _)| candidate).collect());
                return Err(err.into());
            },
        };
        let mut reads = reads.into_iter();
        let (mut chosen, mut back) = (Vec::new(), Vec::new());
        let (mut bytes, mut txn_bytes) = (0usize, 0usize);
        // Why the first candidate could not be read or readied: the answer if none is claimed.
        let mut first_error = None;
        for ((candidate, claiming), check) in marked.into_iter().zip(check_lock) {
            let item = reads.next();
            let count = if matches!(how, Acquire::Lease(_)) { reads.next() } else { None };
            if check && matches!(reads.next(), Some(Ok(_))) {
                self.declined(zk, candidate, Declined::Held);
                continue;
            }
            let first = chosen.is_empty() && back.is_empty();
            if !first && bytes >= byte_budget {
                // Read but not claimed now: the next claim knows its size without asking.
                if let Some(Ok((data, _))) = &item {
                    self.cache.learn_bytes(&candidate.name, data.len());
                }
                back.push(candidate);
                continue;
            }
            match self.ready(zk, lock_dir, candidate.clone(), item, count, claiming, how, first).await {
                Ok(Ok(ready)) => {
                    let cost = zk.request_bytes(ready.ops());
                    // A candidate too large to share a transaction is left to a claim of its own.
                    if !chosen.is_empty() && txn_bytes + cost > MAX_BATCH_BYTES {
                        back.push(candidate);
                        continue;
                    }
                    bytes += ready.body_len();
                    txn_bytes += cost;
                    chosen.push(ready);
                },
                Ok(Err(declined)) => self.declined(zk, candidate, declined),
                Err(err) => {
                    if first {
                        first_error = Some(err);
                    }
                    back.push(candidate);
                },
            }
        }
        self.give_back(back);
        if let (true, Some(err)) = (chosen.is_empty(), first_error) {
            return Err(err.into());
        }
        Ok(chosen)
    }

    /// Claims the readied candidates in as few transactions as it can: one, unless one of them
    /// fails (then again without it). Delivers what applied; gives back what it could not try.
    async fn commit<'q>(
        self: &'q Arc<Self>,
        zk: &Zk,
        mut chosen: Vec<Ready<'q>>,
        how: Acquire,
        lock_dir: Option<&str>,
        abandoned: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Delivery>, QueueError> {
        let locking = self.ctx.lock_path.is_some();
        let mut delivered = Vec::with_capacity(chosen.len());
        while !chosen.is_empty() {
            if abandoned() {
                self.give_back(chosen.iter().map(|ready| ready.candidate().clone()).collect());
                return Ok(delivered);
            }
            // A take's claim marker: its evidence should the answer be lost.
            let marker = matches!(how, Acquire::Take).then(|| self.ctx.markers.next(zk));
            let mut ops: Vec<TxnOp> = marker.iter().map(|marker| ClaimMarkers::create_op(marker)).collect();
            let mut spans = Vec::with_capacity(chosen.len());
            for ready in &chosen {
                let start = ops.len();
                ops.extend(ready.ops().iter().cloned());
                spans.push(start..ops.len());
            }
            let parents = match how {
                Acquire::Take => self.claim_parents(locking),
                Acquire::Lease(_) => LeasePrepared::parents(lock_dir.unwrap_or_default(), &self.ctx.deliveries_path),
            };
            let sent = Instant::now();
            // The transaction's zxid, once it is known to have applied (a lease's fencing token),
            // and its time by ZooKeeper's clock when its answer said it.
            let (mut claimed_at, mut claimed_ms) = (None, None);
            match self.ctx.apply_txn(zk, &ops, &parents).await {
                Ok(results) => {
                    // Every operation of a transaction shares its zxid and time: a lease's lock
                    // write says them.
                    let written = results.iter().find_map(|result| match result {
                        TxnResult::DataSet(stat) => Some((stat.mzxid, stat.mtime)),
                        _ => None,
                    });
                    (claimed_at, claimed_ms) = (written.map(|(zxid, _)| zxid), written.map(|(_, ms)| ms));
                },
                Err(TxnError { error: ZkError::OutcomeUnknown, .. }) => {
                    let deadline = Instant::now() + self.ctx.session.request_timeout();
                    let outcome = match (&marker, chosen.first()) {
                        (Some(marker), _) => self.ctx.markers.outcome(marker, sent, deadline).await,
                        (None, Some(Ready::Lease { prepared, .. })) => {
                            let bounded = zk.with_deadline(deadline);
                            match our_lock_created_at(&bounded, &prepared.lock, &prepared.claim_id).await {
                                Ok(Some(zxid)) => {
                                    claimed_at = Some(zxid);
                                    Outcome::Applied
                                },
                                Ok(None) => Outcome::NotApplied,
                                Err(ZkError::SessionLost) => {
                                    self.give_back(chosen.iter().map(|ready| ready.candidate().clone()).collect());
                                    return Err(ZkError::SessionLost.into());
                                },
                                Err(err) => Outcome::Unknown(err),
                            }
                        },
                        (None, _) => Outcome::NotApplied,
                    };
                    match outcome {
                        Outcome::Applied => {},
                        Outcome::NotApplied => {
                            self.give_back(chosen.iter().map(|ready| ready.candidate().clone()).collect());
                            return Err(ZkError::Unavailable.into());
                        },
                        Outcome::Unknown(_) | Outcome::TooOld => {
                            self.settle_unknown_later(zk, chosen, marker, sent);
                            return Ok(delivered);
                        },
                    }
                },
                Err(TxnError { index: Some(index), error })
                    if matches!(error, ZkError::NoNode | ZkError::BadVersion | ZkError::NodeExists) =>
                {
                    let Some(at) = spans.iter().position(|span| span.contains(&index)) else {
                        self.give_back(chosen.iter().map(|ready| ready.candidate().clone()).collect());
                        return Err(error.into());
                    };
                    let offset = index - spans.get(at).map_or(0, |span| span.start);
                    let ready = chosen.remove(at);
                    match ready.failed_at(offset, &error, locking) {
                        Some(declined) => self.declined(zk, ready.candidate().clone(), declined),
                        // Its count changed since our read: read it again with a later claim.
                        None => self.give_back(vec![ready.candidate().clone()]),
                    }
                    continue;
                },
                Err(err) => {
                    self.give_back(chosen.iter().map(|ready| ready.candidate().clone()).collect());
                    return Err(err.error.into());
                },
            }
            if let Some(marker) = marker {
                self.ctx.markers.applied(marker);
            }
            for (place, ready) in chosen.drain(..).enumerate() {
                self.cache.claim_ended(&ready.candidate().name);
                self.ctx.qm.claim(ClaimOutcome::Won).inc();
                let token = FencingToken::new(claimed_at.unwrap_or_default(), place);
                delivered.push(self.book(zk, ready, how, (token, claimed_ms)));
            }
        }
        Ok(delivered)
    }

    /// The candidates whose bodies a claim reads: when a byte budget limits a claim of several,
    /// in order as long as the bytes before each are within the budget (the first always), so
    /// that a claim reads about `byte_budget` of bodies from ZooKeeper, not every candidate's.
    /// Sizes this process knows (it wrote or read the node) are taken from the cache; the others
    /// are asked (one `exists` each, sent together: a few dozen bytes per answer). The others are
    /// given back; a candidate already gone is booked so. An error when ZooKeeper could not be
    /// asked (every candidate is given back).
    async fn within_budget<'q>(
        self: &Arc<Self>,
        zk: &Zk,
        marked: Vec<(ItemName, Option<Claiming<'q>>)>,
        byte_budget: usize,
    ) -> Result<Vec<(ItemName, Option<Claiming<'q>>)>, ZkError> {
        if marked.len() < 2 || byte_budget == usize::MAX {
            return Ok(marked);
        }
        let known = self.cache.known_bytes(marked.iter().map(|(c, _)| c.name.as_str()));
        let unknown: Vec<String> = marked
            .iter()
            .zip(&known)
            .filter(|(_, size)| size.is_none())
            .map(|((c, _), _)| format!("{}/{}", self.ctx.path, c.name))
            .collect();
        let asked = futures::future::join_all(unknown.iter().map(|path| zk.exists(path))).await;
        if let Some(err) = asked.iter().find_map(|stat| stat.as_ref().err()) {
            let err = err.clone();
            self.give_back(marked.into_iter().map(|(candidate, _)| candidate).collect());
            return Err(err);
        }
        let mut asked = asked.into_iter();
        let (mut kept, mut back) = (Vec::with_capacity(marked.len()), Vec::new());
        let mut bytes = 0usize;
        for ((candidate, claiming), known) in marked.into_iter().zip(known) {
            let size = match known {
                Some(size) => Some(size),
                None => match asked.next() {
                    Some(Ok(Some(stat))) => {
                        let size = usize::try_from(stat.data_length).unwrap_or(0);
                        self.cache.learn_bytes(&candidate.name, size);
                        Some(size)
                    },
                    Some(Ok(None)) => {
                        self.declined(zk, candidate, Declined::Gone);
                        continue;
                    },
                    _ => None,
                },
            };
            match size {
                Some(size) if kept.is_empty() || bytes < byte_budget => {
                    bytes = bytes.saturating_add(size);
                    kept.push((candidate, claiming));
                },
                _ => back.push(candidate),
            }
        }
        self.give_back(back);
        Ok(kept)
    }

    /// Makes one candidate read ready to claim, or says why it will not be claimed. The first
    /// candidate of a claim is split first if its claim alone would pass the request limit.
    #[allow(clippy::too_many_arguments, reason = "one call site; the pipeline's state")]
    async fn ready<'q>(
        &'q self,
        zk: &Zk,
        lock_dir: Option<&str>,
        candidate: ItemName,
        item: Read,
        count: Read,
        claiming: Option<Claiming<'q>>,
        how: Acquire,
        first: bool,
    ) -> Result<Result<Ready<'q>, Declined>, ZkError> {
        let read = match item {
            Some(Ok(read)) => read,
            Some(Err(ZkError::NoNode)) | None => return Ok(Err(Declined::Gone)),
            Some(Err(err)) => return Err(err),
        };
        if self.retention.is_past(read.1.ctime) {
            // Past retention: deleted, never handed out (`retention.rs`).
            self.retention.delete(zk, vec![(candidate.name.clone(), read.1.version)]).await;
            return Ok(Err(Declined::PastRetention));
        }
        let (data, stat) = if first {
            let fitted = match (how, lock_dir) {
                (Acquire::Lease(_), Some(lock_dir)) => {
                    let claim = self.leases.lease_claim_template(zk, lock_dir, &candidate.name, &count);
                    let claim_bytes = |items: &[Vec<u8>], version| {
                        zk.request_bytes(&claim.ops(&self.ctx, &candidate.name, items, version).0)
                    };
                    self.fit_for_claim(zk, &candidate.name, read, claim_bytes).await?
                },
                _ => {
                    let marker = ClaimMarkers::create_op(&self.ctx.markers.next(zk));
                    let claim_bytes = |items: &[Vec<u8>], version| {
                        let (ops, _) = self.take_ops(&candidate.name, items.get(1..).unwrap_or_default(), version);
                        zk.request_bytes(std::iter::once(&marker).chain(&ops))
                    };
                    self.fit_for_claim(zk, &candidate.name, read, claim_bytes).await?
                },
            };
            match fitted {
                Fit::Ready(data, stat) => (data, stat),
                Fit::Gone => return Ok(Err(Declined::Gone)),
                Fit::Locked => return Ok(Err(Declined::Locked)),
                Fit::Unsplittable => return Ok(Err(Declined::Undecodable)),
            }
        } else {
            read
        };
        match (how, lock_dir, claiming) {
            (Acquire::Lease(_), Some(lock_dir), Some(claiming)) => {
                let prepared = self.leases.prepare_lease(zk, lock_dir, &candidate, (data, stat), count).await?;
                Ok(prepared.map(|prepared| Ready::Lease { prepared, _claiming: claiming }))
            },
            (Acquire::Lease(_), ..) => Ok(Err(Declined::Lost)),
            (Acquire::Take, ..) => {
                let Some(items) = self.cache.items_of(&candidate.name, &data) else {
                    return Ok(Err(Declined::Undecodable));
                };
                let (ops, splits) = self.take_ops(&candidate.name, items.get(1..).unwrap_or_default(), stat.version);
                let annex = attributes::from_trailer(envelope::after_end(&data));
                Ok(Ok(Ready::Take { candidate, items, annex, ops, splits }))
            },
        }
    }

    /// Books a candidate that was not claimed.
    pub(super) fn declined(self: &Arc<Self>, zk: &Zk, candidate: ItemName, declined: Declined) {
        self.cache.claim_ended(&candidate.name);
        if declined == Declined::Held {
            // Seen locked before any claim was sent: no contention, nothing failed.
            self.cache.watch_lock(zk, candidate, self.ctx.lock_path.as_deref());
            return;
        }
        let Some(outcome) = declined.outcome() else { return };
        self.ctx.qm.claim(outcome).inc();
        self.cache.contended();
        if declined == Declined::Locked {
            // Held by a consumer: offer it again when that lock goes away.
            self.cache.watch_lock(zk, candidate, self.ctx.lock_path.as_deref());
        }
    }

    /// Books a claim that applied: the cache and the metrics follow, and the caller gets the
    /// message (with its lease).
    fn book(
        self: &Arc<Self>,
        zk: &Zk,
        ready: Ready<'_>,
        how: Acquire,
        claimed: (FencingToken, Option<i64>),
    ) -> Delivery {
        match (ready, how) {
            (Ready::Take { candidate, items, annex, splits, .. }, _) => {
                self.cache.removed_local();
                for item in splits {
                    self.cache.insert_split(item);
                }
                self.ctx.qm.messages_taken.inc();
                (take::first_message(&candidate, items, annex), None)
            },
            (Ready::Lease { prepared, .. }, how) => {
                let visibility = match how {
                    Acquire::Lease(visibility) => visibility,
                    Acquire::Take => std::time::Duration::ZERO,
                };
                self.ctx.qm.messages_leased.inc();
                let (message, grant) = self.leases.grant_lease(zk, prepared, visibility, claimed);
                (message, Some(grant))
            },
        }
    }

    /// A claim whose outcome ZooKeeper could not tell in time, settled in the background once it
    /// can: taken messages put back or candidates offered again (by the take's marker), created
    /// locks released (by each lease's claim id).
    fn settle_unknown_later(self: &Arc<Self>, zk: &Zk, chosen: Vec<Ready<'_>>, marker: Option<String>, sent: Instant) {
        let mut taken = Vec::new();
        let mut leased = Vec::new();
        for ready in chosen {
            self.cache.claim_ended(&ready.candidate().name);
            self.ctx.qm.claim(ClaimOutcome::Lost).inc();
            match ready {
                Ready::Take { candidate, items, annex, .. } => {
                    let message = take::first_message(&candidate, items, annex);
                    taken.push((candidate, message));
                },
                Ready::Lease { prepared, .. } => leased.push(prepared),
            }
        }
        self.cache.contended();
        if let Some(marker) = marker {
            self.settle_claims_later(taken, marker, sent);
        }
        if !leased.is_empty() {
            self.leases.release_unknown_claims_later(zk.clone(), leased);
        }
    }
}

/// Reads `paths` in one round trip: a plain read for one, a multi-read for more.
async fn read_all(zk: &Zk, paths: &[String]) -> Result<Vec<Result<(Vec<u8>, NodeStat), ZkError>>, ZkError> {
    match paths {
        [path] => match zk.get_data(path).await {
            Ok(read) => Ok(vec![Ok(read)]),
            Err(ZkError::NoNode) => Ok(vec![Err(ZkError::NoNode)]),
            Err(err) => Err(err),
        },
        _ => zk.get_data_many(&paths.iter().map(String::as_str).collect::<Vec<_>>()).await,
    }
}
