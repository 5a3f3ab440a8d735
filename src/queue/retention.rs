//! Retention: a message older than its queue's retention (`queues.NAME.retention`, or a dynamic
//! queue's `MessageRetentionPeriod`) is deleted, never delivered. Its age is its node's `ctime`,
//! ZooKeeper's clock at its creation, so every sidecar judges one message alike.
//!
//! Two paths delete such messages, both with the same transaction:
//! - a claim that reads a message past retention deletes it instead of handing it out
//!   (`acquire/claim.rs`), so a consumer never gets one, whatever the sweeps did;
//! - the sweep of each open queue looks at the queue's oldest messages a few times per retention
//!   period (at least once a minute): one `exists` per message, stopping at the first one still
//!   kept (ZooKeeper numbers the children in creation order), so a queue with nothing expired
//!   costs one request per look.
//!
//! A message a consumer holds is never deleted under it: each deletion is
//! `create lock, delete message (at the version read), delete lock` in one transaction, which
//! ZooKeeper refuses whole while a consumer's lock exists. Deletions go in transactions of at most
//! [`MAX_PER_TXN`] messages, within [`MAX_BATCH_BYTES`].

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::cache::ChildrenCache;
use super::context::Context;
use crate::types::now_epoch_ms;
use crate::zk::{Zk, ZkError};

/// Messages one sweep looks at, at most (the oldest first); a sweep that deleted them all looks
/// again at once.
const MAX_PER_SWEEP: usize = 256;

/// Messages deleted in one transaction, at most.
const MAX_PER_TXN: usize = 64;

/// Bytes of one deletion transaction, at most: well inside ZooKeeper's request limit.
const MAX_BATCH_BYTES: usize = 256 * 1024;

/// How often a queue whose retention is unset looks whether it has one now.
const UNSET_LOOK: Duration = Duration::from_secs(60);

/// The pause between sweeps: a quarter of the retention, from 1 s to a minute.
fn sweep_period(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// One queue's retention: its sweep, and the deletion both paths share.
pub(super) struct Retention {
    ctx: Arc<Context>,
    cache: Arc<ChildrenCache>,
}

impl Retention {
    pub(super) fn new(ctx: Arc<Context>, cache: Arc<ChildrenCache>) -> Retention {
        Retention { ctx, cache }
    }

    /// Whether a message whose node ZooKeeper created at `ctime` is past retention now.
    pub(super) fn is_past(&self, ctime: i64) -> bool {
        self.ctx.past_retention(ctime, now_epoch_ms())
    }

    /// Sweeps the queue until `stop`.
    pub(super) async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let pause = match self.ctx.retention_now() {
                None => UNSET_LOOK,
                Some(retention) => match self.sweep().await {
                    Ok(removed) if removed >= MAX_PER_SWEEP / 2 => Duration::ZERO,
                    Ok(_) => sweep_period(retention),
                    Err(err) => {
                        tracing::debug!(queue = %self.ctx.name, error = %err, "retention sweep failed");
                        sweep_period(retention)
                    },
                },
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {},
            }
        }
    }

    /// One look at the oldest messages: deletes those past retention; how many it deleted.
    async fn sweep(&self) -> Result<usize, ZkError> {
        let deadline = tokio::time::Instant::now() + self.ctx.session.request_timeout();
        let zk = self.ctx.session.connected(deadline).await?.with_deadline(deadline);
        let oldest = match self.cache.oldest(MAX_PER_SWEEP) {
            Some(oldest) => oldest,
            None => match zk.get_children(&self.ctx.path).await {
                Ok((children, _)) => super::names::oldest(children.iter().map(String::as_str), MAX_PER_SWEEP),
                Err(ZkError::NoNode) => return Ok(0),
                Err(err) => return Err(err),
            },
        };
        let mut past = Vec::new();
        // In creation order, a chunk at a time: the first one still kept ends the look.
        'look: for chunk in oldest.chunks(16) {
            let paths: Vec<String> = chunk.iter().map(|name| format!("{}/{name}", self.ctx.path)).collect();
            let stats = futures::future::join_all(paths.iter().map(|path| zk.exists(path))).await;
            for (name, stat) in chunk.iter().zip(stats) {
                match stat? {
                    Some(stat) if self.is_past(stat.ctime) => past.push((name.clone(), stat.version)),
                    Some(_) => break 'look,
                    None => {},
                }
            }
        }
        Ok(self.delete(&zk, past).await)
    }

    /// Deletes messages past retention, each at the version read and only while no consumer
    /// holds it; how many were deleted. A message ZooKeeper refuses (locked, changed, gone) is
    /// left: a claim or a later sweep looks at it again.
    pub(super) async fn delete(&self, zk: &Zk, mut messages: Vec<(String, i32)>) -> usize {
        let mut removed = 0;
        while !messages.is_empty() {
            let mut ops = Vec::new();
            let mut taken = 0;
            for (name, version) in messages.iter().take(MAX_PER_TXN) {
                let more = self.ctx.unheld_removal(name, Some(*version));
                if taken > 0 && zk.request_bytes(ops.iter().chain(&more)) > MAX_BATCH_BYTES {
                    break;
                }
                ops.extend(more);
                taken += 1;
            }
            let per = self.ctx.unheld_removal("", None).len();
            let parents: Vec<(usize, String)> = self.ctx.lock_path.iter().map(|dir| (0, dir.clone())).collect();
            match self.ctx.apply_txn(zk, &ops, &parents).await {
                Ok(_) => {
                    for (name, _) in messages.drain(..taken) {
                        self.cache.removed_candidate(&name);
                        self.ctx.qm.messages_past_retention.inc();
                        removed += 1;
                    }
                },
                Err(err) => match err.index {
                    // One message refused: the others go in the next transaction.
                    Some(index) if !matches!(err.error, ZkError::OutcomeUnknown) && index / per < taken => {
                        messages.remove(index / per);
                    },
                    _ => {
                        tracing::debug!(queue = %self.ctx.name, error = %err.error,
                            "deleting messages past retention failed; the next look tries again");
                        break;
                    },
                },
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_looks_four_times_per_retention_within_a_second_and_a_minute() {
        assert_eq!(sweep_period(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(sweep_period(Duration::from_secs(120)), Duration::from_secs(30));
        assert_eq!(sweep_period(Duration::from_secs(345_600)), Duration::from_secs(60));
    }

    #[test]
    fn the_oldest_are_the_first_stored_whatever_their_names_say() {
        let names = ["queue-0000000007", "queue-|18C2B1A4F00|0000000003", "queue-0000000005", "lock", "qn-0000000001"];
        assert_eq!(
            crate::queue::names::oldest(names, 3),
            ["qn-0000000001", "queue-|18C2B1A4F00|0000000003", "queue-0000000005"]
        );
        assert!(crate::queue::names::oldest(names, 0).is_empty());
    }
}
