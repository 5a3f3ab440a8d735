//! The vocabulary of messages shared by the put protocol (`ops.rs`), idempotent puts
//! (`idempotency/`) and the claims: what a put asks for, what it sends and answers, and what a take
//! or a peek hands out. Plain data; it imports nothing of the protocols.

use std::time::Duration;

use super::names::ItemMeta;

/// What a put asks for beyond the body.
#[derive(Debug, Clone, Default)]
pub(crate) struct PutOptions {
    pub priority: Option<i32>,
    /// Absolute delivery time, epoch ms (delay queues).
    pub deliver_at: Option<i64>,
    pub id: Option<String>,
    /// Grouped queues only: the message's group (an id queue's id is its group).
    pub group: Option<String>,
    /// Attributes kept with the message (`attributes.rs`); empty for none.
    pub attributes: super::MessageAttributes,
    /// The producer's W3C trace context, kept with the message (`attributes.rs`).
    pub traceparent: Option<crate::types::Traceparent>,
    /// How long to wait for room when the queue is at `max_items`.
    pub wait: Duration,
    /// Stores the message at most once per key within the queue's idempotency window
    /// (`idempotency/`).
    pub idempotency_key: Option<String>,
    /// The key alone says a put repeats an earlier one, whatever it stores (SQS's deduplication
    /// id): a put with a key used within the window is answered with the earlier message, even
    /// with another body. Else a key used with another body, priority or id is refused.
    pub key_alone: bool,
    /// Where the key is unique, if not in the whole queue (a FIFO queue's message group under
    /// SQS's `DeduplicationScope` = `messageGroup`): a few bytes of visible ASCII, which count in
    /// the key's length. The message keeps the key as given.
    pub key_scope: Option<String>,
}

/// A stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PutReceipt {
    /// The message's node name. `None` only when a keyed put's message was consumed before its
    /// name could be recorded or found (it was stored; its name is gone with it).
    pub message_id: Option<String>,
    /// An earlier put with the same idempotency key stored the message; nothing new was stored.
    pub replay: bool,
}

/// A message handed out by a take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub message_id: String,
    pub body: Vec<u8>,
    pub meta: ItemMeta,
    /// Its attributes (`attributes.rs`); empty for none.
    pub attributes: super::MessageAttributes,
    /// Its producer's W3C trace context, if the put carried one.
    pub traceparent: Option<crate::types::Traceparent>,
    /// The key of the put that stored it (SQS's `MessageDeduplicationId`), if it had one.
    pub deduplication_id: Option<String>,
}

/// One message seen by a peek.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeekedItem {
    pub message_id: String,
    /// Position inside a multi-item node written by Curator's `putMulti` (0 otherwise).
    pub item_index: usize,
    pub body: Vec<u8>,
    pub meta: ItemMeta,
}

/// One message of a put as its create sends it: the server appends the sequence to `prefix`.
#[derive(Debug, Clone)]
pub(in crate::queue) struct NodeCreate {
    /// The node name's prefix (`queue-`, `queue-{priority}-`, …), relative to the queue node.
    pub(in crate::queue) prefix: String,
    pub(in crate::queue) data: Vec<u8>,
}
