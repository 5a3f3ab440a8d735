//! Queue semantics, without HTTP: Curator node names and envelope, the children cache and its
//! waiters, put, take, peek and remove.
//!
//! The door is [`Queue`] (`facade.rs`), opened through [`QueueService`] (`service.rs`); the
//! components behind it (puts, claims, leases, browse) own their protocols and their state.

mod acquire;
pub(crate) mod attributes;
mod browse;
mod cache;
mod candidate;
mod catalog;
mod claims;
mod context;
pub mod envelope;
mod facade;
mod finish;
mod lease;
mod message;
pub(crate) mod names;
mod put;
mod retention;
mod service;
mod settings;
mod spec;
pub(crate) mod survey;
pub(crate) mod tags;

pub(crate) use acquire::{Handover, PerGroup, Taken};
pub(crate) use attributes::{AttributeValue, MessageAttributes};
pub(crate) use browse::{HeadAge, Purge, Purged, QueueInfo};
pub(crate) use cache::GroupStats;
pub(crate) use catalog::is_deleted_queue_node;
pub(crate) use facade::{Queue, QueueRef};
pub(crate) use lease::read_counter;
pub(crate) use lease::{LeaseGrant, MalformedReceipt, NackMode, Receipt};
pub(crate) use message::{Message, PeekedItem, PutOptions, PutReceipt};
pub(crate) use names::{ItemMeta, MAX_ID_LEN, id_pattern, order_of};
pub(crate) use put::idempotency::{
    MAX_KEY_LEN as MAX_IDEMPOTENCY_KEY_LEN, is_valid_key as is_valid_idempotency_key,
    key_pattern as idempotency_key_pattern,
};
pub(crate) use service::queue_layout;
pub(crate) use service::{Purpose, QueueService};
pub(crate) use settings::DeadLetter;
pub(crate) use settings::{
    MAX_DELAY_SECONDS, MAX_POLICY_BYTES, MAX_RETENTION_SECONDS, MIN_MESSAGE_BYTES_SETTING, MIN_RETENTION_SECONDS,
    QueueSettings,
};

use crate::types::QueueName;
use crate::zk::ZkError;

/// Why a queue operation failed. The wording is the domain's; `http/error.rs` picks the status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QueueError {
    #[error("queue {0:?} is not declared and dynamic queues are disabled (queues_dynamic = false)")]
    UnknownQueue(QueueName),
    /// A dynamic queue whose node does not exist: nobody has put to it yet.
    #[error("queue {0:?} does not exist: nothing was put to it yet (a put creates a dynamic queue)")]
    NoSuchQueue(QueueName),
    #[error("this zkq already serves {0} dynamic queues (max_dynamic_queues); declare the queue")]
    TooManyQueues(usize),
    #[error("{0}")]
    InvalidParameter(String),
    #[error("{0}")]
    NotForKind(String),
    #[error("message of {size} bytes is larger than api.max_message_bytes = {max}")]
    TooLarge { size: usize, max: usize },
    #[error("the queue holds max_items = {max_items} messages; retry later or raise ?wait=")]
    Full { max_items: u32 },
    #[error("no message {0:?} in this queue")]
    MessageNotFound(String),
    /// The lease is no longer held (expired, acked, nacked, its session lost).
    #[error("the lease is no longer held: {0}; the message is (or will be) delivered again")]
    LeaseLost(String),
    /// The receipt is malformed or was never issued by this process.
    #[error("no lease {0:?} on this queue; use the zkq-lease header of a lease response")]
    LeaseNotFound(String),
    /// The queue has `lease.max_per_queue` leases out.
    #[error("the queue has lease.max_per_queue = {0} leases out; ack or nack some, then retry")]
    TooManyLeases(usize),
    /// The put's idempotency key was used within the window for another message.
    #[error("{0}")]
    IdempotencyKeyReused(String),
    /// A put whose messages with their idempotency records would pass ZooKeeper's request limit.
    #[error(
        "the messages with their idempotency records would be a ZooKeeper transaction of {size} bytes, more \
         than its request limit of {max}; send fewer messages (or shorter keys) per batch"
    )]
    TransactionTooLarge { size: usize, max: usize },
    /// A queue declared in the configuration is not deleted through the API.
    #[error("queue {0:?} is declared in zkq's configuration; remove it there (and purge it) instead of deleting it")]
    Declared(QueueName),
    #[error("zkq is shutting down; retry on another instance")]
    ShuttingDown,
    #[error(transparent)]
    Zk(ZkError),
}

impl From<ZkError> for QueueError {
    fn from(err: ZkError) -> Self {
        QueueError::Zk(err)
    }
}

/// What a ZooKeeper failure under [`QueueError::Zk`] means to a client: each front words it in its
/// own codes, naming no `zk` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreFailure {
    /// ZooKeeper out of reach, or the session lost: nothing was done; retry.
    Unavailable,
    /// The connection dropped before the answer: the request may or may not have applied.
    OutcomeUnknown,
    /// The node's ACL does not allow zkq's session.
    NotAuthorized,
    /// ZooKeeper refused the request for a reason retrying will not fix (a quota, a bad argument).
    Rejected,
    /// The request would pass ZooKeeper's request limit.
    TooLarge,
    /// Any other answer.
    Unexpected,
}

impl QueueError {
    /// The ZooKeeper failure this error is, if it is one.
    pub(crate) fn store_failure(&self) -> Option<StoreFailure> {
        let QueueError::Zk(err) = self else {
            return None;
        };
        Some(match err {
            ZkError::Unavailable | ZkError::SessionLost => StoreFailure::Unavailable,
            ZkError::OutcomeUnknown => StoreFailure::OutcomeUnknown,
            ZkError::NotAuthorized => StoreFailure::NotAuthorized,
            ZkError::Rejected(_) => StoreFailure::Rejected,
            ZkError::TooLarge { .. } => StoreFailure::TooLarge,
            _ => StoreFailure::Unexpected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zookeepers_errors_are_the_failures_a_front_words() {
        let table = [
            (ZkError::Unavailable, StoreFailure::Unavailable),
            (ZkError::SessionLost, StoreFailure::Unavailable),
            (ZkError::OutcomeUnknown, StoreFailure::OutcomeUnknown),
            (ZkError::NotAuthorized, StoreFailure::NotAuthorized),
            (ZkError::Rejected("quota".to_owned()), StoreFailure::Rejected),
            (ZkError::TooLarge { size: 2, max: 1 }, StoreFailure::TooLarge),
            (ZkError::NoNode, StoreFailure::Unexpected),
        ];
        for (zk, failure) in table {
            assert_eq!(QueueError::Zk(zk.clone()).store_failure(), Some(failure), "{zk:?}");
        }
        assert_eq!(QueueError::ShuttingDown.store_failure(), None);
    }
}
