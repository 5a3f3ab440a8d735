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
