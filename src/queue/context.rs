//! What every protocol of one queue reads and nothing changes (but a dynamic queue's own settings,
//! which its settings node sets: `settings.rs`): where the queue lives, its limits,
//! its metric series and the process's services (session, group commit, claim markers, the
//! background tracker, shutdown).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::claims::ClaimMarkers;
use super::envelope;
use super::settings::DeadLetter;
use crate::config::QueueKind;
use crate::metrics::QueueMetrics;
use crate::types::{Backoff, QueueName};
use crate::zk::{GroupCommit, TxnError, TxnOp, TxnResult, Zk, ZkError, ZkSession};

/// How background retries (settlements, put-backs, lock releases) pace themselves: from 100 ms,
/// doubling, to 5 s.
pub(super) const SETTLE_RETRIES: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5), 0.0);

/// One queue's identity, limits and services, shared by its components.
pub(super) struct Context {
    pub(super) name: QueueName,
    pub(super) kind: QueueKind,
    /// How its node names are read and ordered: its kind, except that a grouped fifo queue's
    /// names are those of an id queue (`names::naming`).
    pub(super) naming: QueueKind,
    /// Its messages carry groups: one in flight per group, in put order (`cache/state/groups.rs`).
    pub(super) grouped: bool,
    pub(super) path: String,
    pub(super) lock_path: Option<String>,
    pub(super) max_items: Option<u32>,
    pub(super) declared: bool,
    /// The declared dead-letter queue (`queues.NAME.dead_letter`); see [`Context::dead_letter_now`].
    pub(super) dead_letter: Option<Arc<DeadLetter>>,
    /// A dynamic queue's own settings, as its settings node says now (`settings.rs`).
    pub(super) settings: Arc<super::settings::SettingsCell>,
    /// A declared queue's `retention`; see [`Context::retention_now`].
    pub(super) retention: Option<Duration>,
    /// Where delivery counts of leased messages live: `{root}/deliveries/{queue}`.
    pub(super) deliveries_path: String,
    pub(super) max_message_bytes: usize,
    pub(super) max_peek_bytes: usize,
    pub(super) max_leases: usize,
    pub(super) session: ZkSession,
    /// This queue's series, resolved once.
    pub(super) qm: QueueMetrics,
    /// Evidence for transactions whose answer was lost (shared by every queue of the process).
    pub(super) markers: Arc<ClaimMarkers>,
    /// Puts in flight together go to ZooKeeper as one transaction (shared by every queue).
    pub(super) group: Arc<GroupCommit>,
    /// Claims, lease steps and their settlement (put-backs, unknown outcomes); shutdown waits for
    /// these before it closes the session.
    pub(super) background: TaskTracker,
    pub(super) shutdown: CancellationToken,
}

impl Context {
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

    /// When a request that may wait `wait` must be answered: its wait, or at least a request
    /// timeout.
    /// Where dead letters go now: the declared dead-letter queue, else the one the queue's
    /// settings name.
    pub(super) fn dead_letter_now(&self) -> Option<Arc<DeadLetter>> {
        self.dead_letter.clone().or_else(|| self.settings.dead_letter())
    }

    /// How long a message is kept now: the declared `retention`, else the queue's settings'
    /// (`MessageRetentionPeriod`); `None`: until consumed.
    pub(super) fn retention_now(&self) -> Option<Duration> {
        self.retention.or_else(|| self.settings.retention_seconds().map(Duration::from_secs))
    }

    /// Whether a message whose node ZooKeeper created at `ctime` (epoch ms, its clock) is past
    /// the queue's retention at `now` (epoch ms).
    pub(super) fn past_retention(&self, ctime: i64, now: i64) -> bool {
        self.retention_now().is_some_and(|kept| {
            let kept_ms = i64::try_from(kept.as_millis()).unwrap_or(i64::MAX);
            ctime.saturating_add(kept_ms) < now
        })
    }

    /// The operations that delete message `name` (at `version`, if given) unless a consumer holds
    /// it: its lock node is created and deleted in the same transaction, which ZooKeeper refuses
    /// while a consumer's lock exists. A queue without locks (`simple`) deletes it alone. The
    /// first operation may need the lock directory (see [`Context::apply_txn`]).
    pub(super) fn unheld_removal(&self, name: &str, version: Option<i32>) -> Vec<TxnOp> {
        let item = TxnOp::Delete { path: format!("{}/{name}", self.path), version };
        match &self.lock_path {
            Some(dir) => {
                let lock = format!("{dir}/{name}");
                vec![
                    TxnOp::Create { path: lock.clone(), data: Vec::new(), mode: crate::zk::NodeMode::Ephemeral },
                    item,
                    TxnOp::Delete { path: lock, version: None },
                ]
            },
            None => vec![item],
        }
    }

    pub(super) fn deadline_for(&self, wait: Duration) -> Instant {
        Instant::now() + wait.max(self.session.request_timeout())
    }

    /// A message's node data: Curator's envelope, or the bare body in a simple queue.
    pub(super) fn encode(&self, body: &[u8]) -> Vec<u8> {
        if self.kind == QueueKind::Simple { body.to_vec() } else { envelope::encode([body]) }
    }
}
