//! What a claim makes of a candidate: the reads it is judged by, and why one was not claimed.

use crate::metrics::ClaimOutcome;
use crate::zk::{NodeStat, ZkError};

/// A candidate's read from a multi-read: its node, or its delivery count (`None` when the
/// answer holds fewer reads than asked).
pub(super) type Read = Option<Result<(Vec<u8>, NodeStat), ZkError>>;

/// Why a candidate read was not claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Declined {
    /// Someone else changed or consumed it between our read and our claim (or it was moved to the
    /// dead-letter queue).
    Lost,
    /// It was already gone when read.
    Gone,
    /// A consumer holds its lock: offered again when the lock goes away.
    Locked,
    /// Its lock was read before any claim: held by a consumer, offered again when it goes (no
    /// claim was attempted, so none is counted).
    Held,
    /// Not a Curator envelope (or too large to handle in one transaction): skipped and left in
    /// place.
    Undecodable,
    /// Older than the queue's retention: deleted instead (or left to the sweep, if a consumer
    /// locked it meanwhile), never handed out.
    PastRetention,
}

impl Declined {
    /// How `zkq_claim_attempts_total` counts it; not at all for a node that was skipped.
    pub(super) fn outcome(self) -> Option<ClaimOutcome> {
        match self {
            Declined::Lost => Some(ClaimOutcome::Lost),
            Declined::Gone => Some(ClaimOutcome::Gone),
            Declined::Locked => Some(ClaimOutcome::Locked),
            Declined::Undecodable | Declined::Held | Declined::PastRetention => None,
        }
    }
}
