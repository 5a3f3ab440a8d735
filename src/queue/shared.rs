//! What the protocols of one queue share: where the queue lives, its limits, the process's
//! services (session, group commit, claim markers, the background tracker) and the queue's
//! stateful components (children cache, lease table, idempotency records).
//!
//! The protocols (put, keyed put, take, lease claim, lease steps, browse) are methods of
//! [`Shared`] in their own files. What only the facade needs (who uses the queue, when it was last
//! used, the watches it keeps, its stop token) is not here: it lives in `facade.rs`, private to it.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::cache::ChildrenCache;
use super::claims::ClaimMarkers;
use super::idempotency::Idempotency;
use super::lease::{DeadLetter, LeaseTable};
use crate::config::QueueKind;
use crate::metrics::QueueMetrics;
use crate::zk::{GroupCommit, ZkSession};

/// One queue's identity, limits, services and components, shared by its protocols.
pub(super) struct Shared {
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
    pub(super) cache: Arc<ChildrenCache>,
    pub(super) leases: LeaseTable,
    /// Records of idempotency keys: `{root}/idempotency/{queue}`.
    pub(super) idempotency: Idempotency,
    /// Evidence for transactions whose answer was lost (shared by every queue of the process).
    pub(super) markers: Arc<ClaimMarkers>,
    /// Puts in flight together go to ZooKeeper as one transaction (shared by every queue).
    pub(super) group: Arc<GroupCommit>,
    /// Claims and their settlement (put-backs, unknown outcomes); shutdown waits for these
    /// before it closes the session.
    pub(super) background: TaskTracker,
    pub(super) shutdown: CancellationToken,
    /// The head seen by the last age reading and since when it waits (epoch ms).
    pub(super) head_seen: Mutex<Option<(String, i64)>>,
}
