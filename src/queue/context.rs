//! What every protocol of one queue reads and nothing changes: where the queue lives, its limits,
//! its metric series and the process's services (session, group commit, claim markers, the
//! background tracker, shutdown).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::claims::ClaimMarkers;
use super::lease::DeadLetter;
use crate::config::QueueKind;
use crate::metrics::QueueMetrics;
use crate::zk::{GroupCommit, ZkSession};

/// One queue's identity, limits and services, shared by its components.
pub(super) struct Context {
    pub(super) name: String,
    pub(super) kind: QueueKind,
    pub(super) path: String,
    pub(super) lock_path: Option<String>,
    pub(super) max_items: Option<u32>,
    pub(super) declared: bool,
    pub(super) dead_letter: Option<DeadLetter>,
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
