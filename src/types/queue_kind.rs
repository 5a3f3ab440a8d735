//! Which Curator recipe a queue follows.

use serde::{Deserialize, Serialize};

use super::znode::JUTE_MAXBUFFER_BYTES;

/// Which Curator recipe a queue's nodes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    /// `DistributedQueue`: `queue-<seq>`.
    Fifo,
    /// `DistributedPriorityQueue`: `queue-<sign><8 hex><seq>`.
    Priority,
    /// `DistributedDelayQueue`: `queue-|<epoch ms hex>|<seq>`.
    Delay,
    /// `DistributedIdQueue`: `queue-|<id>|<seq>`.
    Id,
    /// `SimpleDistributedQueue` / ZooKeeper's recipe: `qn-<seq>`, raw bytes.
    Simple,
}

impl QueueKind {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueKind::Fifo => "fifo",
            QueueKind::Priority => "priority",
            QueueKind::Delay => "delay",
            QueueKind::Id => "id",
            QueueKind::Simple => "simple",
        }
    }

    /// Length of a typical child name of this kind (an id queue's names also hold the id).
    pub fn typical_name_len(self) -> u64 {
        match self {
            QueueKind::Fifo => 16,     // queue-0000000042
            QueueKind::Priority => 25, // queue-8000000050000000042
            QueueKind::Delay => 29,    // queue-|18c2b1a4f00|0000000042
            QueueKind::Id => 18,       // queue-|ID|0000000042 with a one-character id
            QueueKind::Simple => 13,   // qn-0000000042
        }
    }

    /// A `max_items` that keeps the child list within 90% of Java's default `jute.maxbuffer`.
    pub fn recommended_max_items(self) -> u64 {
        JUTE_MAXBUFFER_BYTES * 9 / 10 / (4 + self.typical_name_len())
    }
}
