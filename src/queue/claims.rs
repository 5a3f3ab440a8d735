//! Claim markers: evidence that a transaction of ours applied when its answer was lost.
//!
//! A take removes a message in one transaction; when the connection drops before the answer
//! arrives, the node being gone proves nothing: another consumer may have removed it while our
//! transaction failed. So every transaction whose effect leaves no trace of its own (a take's
//! claim, a put-back, a move to the dead-letter queue) also creates a marker node
//! `{root}/claims/c-{epoch ms}-{session}-{sequence}` that nothing else ever creates. After a lost
//! answer, zkq syncs with the leader and looks for the marker: present means applied, absent
//! means not applied. Nothing is ever concluded from the absence of the message itself.
//!
//! Invariants:
//! - A marker is deleted only once its transaction's outcome is known (answered, or resolved).
//! - Deletes are batched: one transaction per [`FLUSH_BATCH`] markers, or after a second of
//!   quiet, so the steady state costs a fraction of a round trip per message.
//! - A marker left behind by a process that died is removed by any zkq once it is older than
//!   the marker age (`take.claim_marker_age`, an hour by default), judged by ZooKeeper's clock:
//!   the marker's `ctime` against the `mtime` of a write the sweeper makes, never by a zkq's own
//!   clock (the time in a marker's name only lets the sweep skip markers that look young).
//! - A settlement trusts a missing marker only while its transaction was sent less than
//!   [`trust_within`] ago (three quarters of the age, by the settler's monotonic
//!   clock; a marker's `ctime` is later than the send, so it cannot have been swept yet). After
//!   that a missing marker proves nothing: the settlement stops, as a process that died would
//!   have, and logs and counts that the outcome is unknown. A marker that is there still proves
//!   "applied"; a settlement that cannot reach ZooKeeper keeps trying until the age has passed.

use crate::types::Layout;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::types::now_epoch_ms;
use crate::zk::{ConnectionState, NodeMode, TxnOp, Zk, ZkError, ZkSession};

/// Markers deleted per transaction.
pub(super) const FLUSH_BATCH: usize = 64;
/// How long a marker may wait for its batch.
const FLUSH_AFTER: Duration = Duration::from_secs(1);
/// How often the stale sweep runs at most (more often when the marker age is short).
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// What the evidence says about a transaction whose answer was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    Applied,
    NotApplied,
    /// ZooKeeper could not be asked before the deadline.
    Unknown(ZkError),
    /// The transaction was sent so long ago that a missing marker may have been swept as stale:
    /// nobody can tell any more. Stop, as a process that died would have.
    TooOld,
}

/// The claim markers of this process.
pub(super) struct ClaimMarkers {
    dir: String,
    session: ZkSession,
    /// `take.claim_marker_age`.
    stale_after: Duration,
    sequence: AtomicU64,
    /// Markers whose transaction is known to have applied, waiting to be deleted.
    pending: Mutex<Vec<String>>,
    flush: Notify,
}

impl ClaimMarkers {
    pub(super) fn new(layout: &Layout, session: ZkSession, stale_after: Duration) -> ClaimMarkers {
        ClaimMarkers {
            dir: layout.claims(),
            session,
            stale_after,
            sequence: AtomicU64::new(0),
            pending: Mutex::new(Vec::new()),
            flush: Notify::new(),
        }
    }

    /// `{root}/claims`.
    pub(super) fn dir(&self) -> &str {
        &self.dir
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh marker path for a transaction run on `zk`'s session.
    pub(super) fn next(&self, zk: &Zk) -> String {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        format!("{}/c-{}-{:016x}-{sequence}", self.dir, now_epoch_ms(), zk.session_id())
    }

    /// The operation that creates `marker` (put it first in the transaction, so that a missing
    /// marker directory is told apart by its index).
    pub(super) fn create_op(marker: &str) -> TxnOp {
        TxnOp::Create { path: marker.to_owned(), data: Vec::new(), mode: NodeMode::Persistent }
    }

    /// The transaction of `marker` applied: delete the marker with the next batch.
    pub(super) fn applied(&self, marker: String) {
        let full = {
            let mut pending = self.pending();
            pending.push(marker);
            pending.len() >= FLUSH_BATCH
        };
        if full {
            self.flush.notify_one();
        }
    }

    /// Finds out whether the transaction that created `marker`, sent at `sent`, applied, waiting
    /// for a session until `deadline`. Syncs first, so a lagging server cannot answer with the
    /// past. A marker that is there always decides ([`Outcome::Applied`]); a missing one only
    /// within [`trust_within`] of `sent`, and ZooKeeper is asked again only until
    /// the marker age has passed since `sent`: after that, [`Outcome::TooOld`].
    pub(super) async fn outcome(&self, marker: &str, sent: Instant, deadline: Instant) -> Outcome {
        let outcome = self.look(marker, deadline).await;
        // Measured after the answer: the marker's age when ZooKeeper read it was less.
        judge(outcome, Instant::now().saturating_duration_since(sent), self.stale_after)
    }

    async fn look(&self, marker: &str, deadline: Instant) -> Outcome {
        let zk = match self.session.connected(deadline).await {
            Ok(zk) => zk,
            Err(err) => return Outcome::Unknown(err),
        };
        match zk.sync(&self.dir).await {
            // No marker directory: the read below says so too.
            Ok(()) | Err(ZkError::NoNode) => {},
            Err(err) => return Outcome::Unknown(err),
        }
        match zk.exists(marker).await {
            Ok(Some(_)) => {
                self.applied(marker.to_owned());
                Outcome::Applied
            },
            Ok(None) => Outcome::NotApplied,
            Err(err) => Outcome::Unknown(err),
        }
    }

    /// Deletes applied markers in batches until the session is closed (shutdown flushes the
    /// last ones through [`ClaimMarkers::flush_now`] before it closes the session).
    pub(super) async fn run_flusher(&self) {
        let mut status = self.session.subscribe();
        loop {
            tokio::select! {
                changed = status.changed() => {
                    if changed.is_err() || status.borrow_and_update().state == ConnectionState::Closed {
                        return;
                    }
                    continue;
                },
                _ = self.flush.notified() => {},
                _ = tokio::time::sleep(FLUSH_AFTER) => {},
            }
            self.flush_now().await;
        }
    }

    /// Deletes every pending marker now (best effort: what fails stays pending).
    pub(super) async fn flush_now(&self) {
        loop {
            let batch: Vec<String> = {
                let mut pending = self.pending();
                let n = pending.len().min(FLUSH_BATCH);
                pending.drain(..n).collect()
            };
            if batch.is_empty() {
                return;
            }
            let Some(zk) = self.session.current() else {
                self.pending().extend(batch);
                return;
            };
            let zk = zk.with_deadline(Instant::now() + self.session.request_timeout());
            let mut batch = batch;
            loop {
                let ops: Vec<TxnOp> = batch.iter().map(|m| TxnOp::Delete { path: m.clone(), version: None }).collect();
                match zk.multi(&ops).await {
                    Ok(_) => break,
                    // Already gone (swept as stale, or a delete whose answer was lost): drop it.
                    Err(err) if err.error == ZkError::NoNode => match err.index {
                        Some(index) if index < batch.len() => {
                            batch.remove(index);
                            if batch.is_empty() {
                                break;
                            }
                        },
                        _ => break,
                    },
                    Err(err) => {
                        tracing::debug!(error = %err.error, markers = batch.len(), "claim marker cleanup failed; will retry");
                        self.pending().extend(batch);
                        return;
                    },
                }
            }
        }
    }

    /// Removes markers older than the marker age (left by a process that died mid-claim): at
    /// start and every [`SWEEP_EVERY`] (or a quarter of the age, if that is shorter).
    pub(super) async fn run_stale_sweeper(&self, shutdown: CancellationToken) {
        let session = self.session.clone();
        session
            .periodically(SWEEP_EVERY.min(self.stale_after / 4), &shutdown, |zk| async move {
                match self.sweep_stale(&zk).await {
                    Ok(0) => {},
                    Ok(n) => tracing::info!(removed = n, "removed claim markers left by a stopped zkq"),
                    Err(err) => tracing::debug!(error = %err, "claim marker sweep failed"),
                }
            })
            .await;
    }

    /// One sweep. ZooKeeper's clock decides: a write to the marker directory gives its time now
    /// (the write's `mtime`), each marker that may be old is read for its `ctime`. The time in a
    /// marker's name (its creator's clock) only skips markers that look younger than the age, so
    /// a creator whose clock runs behind costs a read, never a marker still in use.
    async fn sweep_stale(&self, zk: &Zk) -> Result<usize, ZkError> {
        let children = match zk.get_children(&self.dir).await {
            Ok((children, _)) => children,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(err),
        };
        let age_ms = i64::try_from(self.stale_after.as_millis()).unwrap_or(i64::MAX);
        let local_cutoff = now_epoch_ms().saturating_sub(age_ms);
        let old_looking: Vec<&String> =
            children.iter().filter(|name| marker_time(name).is_some_and(|created| created < local_cutoff)).collect();
        if old_looking.is_empty() {
            return Ok(0);
        }
        let now = match zk.set_data(&self.dir, &[], None).await {
            Ok(stat) => stat.mtime,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(err),
        };
        let cutoff = now.saturating_sub(age_ms);
        let mut removed = 0;
        for name in old_looking {
            let path = format!("{}/{name}", self.dir);
            let Some(stat) = zk.exists(&path).await? else { continue };
            if stat.ctime < cutoff && zk.delete(&path, Some(stat.version)).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// How long after its transaction was sent a missing marker still proves "not applied", for
/// markers swept at `stale_after`: three quarters of it, so that servers of the ensemble whose
/// clocks differ by less than a quarter of it cannot make the sweeper remove a marker a
/// settlement still reads.
fn trust_within(stale_after: Duration) -> Duration {
    stale_after - stale_after / 4
}

/// What a look at a marker says of its transaction, sent `since` ago, when markers are swept at
/// `stale_after`: a marker that is there always proves "applied"; a missing one proves "not
/// applied" only within [`trust_within`]; ZooKeeper is asked until `stale_after`.
fn judge(looked: Outcome, since: Duration, stale_after: Duration) -> Outcome {
    match looked {
        Outcome::NotApplied if since >= trust_within(stale_after) => Outcome::TooOld,
        Outcome::Unknown(_) if since >= stale_after => Outcome::TooOld,
        other => other,
    }
}

/// The creation time (epoch ms) a marker's name carries; `None` for foreign names.
fn marker_time(name: &str) -> Option<i64> {
    name.strip_prefix("c-")?.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_marker_proves_not_applied_only_for_three_quarters_of_the_age_and_zookeeper_is_asked_for_all_of_it() {
        let age = Duration::from_secs(3600);
        let minutes = |m: u64| Duration::from_secs(m * 60);
        assert_eq!(judge(Outcome::NotApplied, minutes(44), age), Outcome::NotApplied);
        assert_eq!(judge(Outcome::NotApplied, minutes(45), age), Outcome::TooOld);
        assert_eq!(judge(Outcome::Applied, minutes(600), age), Outcome::Applied, "a marker that is there decides");
        assert_eq!(
            judge(Outcome::Unknown(ZkError::Unavailable), minutes(59), age),
            Outcome::Unknown(ZkError::Unavailable)
        );
        assert_eq!(judge(Outcome::Unknown(ZkError::Unavailable), minutes(60), age), Outcome::TooOld);
    }

    #[test]
    fn marker_names_carry_their_creation_time_and_foreign_names_are_ignored() {
        assert_eq!(marker_time("c-1732370000000-00000000000000ab-7"), Some(1_732_370_000_000));
        assert_eq!(marker_time("c-x-1"), None);
        assert_eq!(marker_time("lock-1"), None);
        assert_eq!(marker_time("c-"), None);
        assert_eq!(marker_time("c-é"), None);
    }
}
