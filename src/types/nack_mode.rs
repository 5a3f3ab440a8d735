//! What a nack does with the message: the vocabulary of the API, the lease steps and the metrics.

/// What a nack does with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackMode {
    /// Delete it and put it back at the tail (Curator's ErrorMode.REQUEUE), keeping its kind fields.
    Requeue,
    /// Delete it (Curator's ErrorMode.DELETE).
    Delete,
    /// Release the lock; the message keeps its place.
    Keep,
}

impl NackMode {
    /// Every mode, in the order of the `mode` label's series.
    pub const ALL: [NackMode; 3] = [NackMode::Requeue, NackMode::Delete, NackMode::Keep];

    /// The `mode` label of `zkq_messages_nacked_total`, and the API's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            NackMode::Requeue => "requeue",
            NackMode::Delete => "delete",
            NackMode::Keep => "keep",
        }
    }
}
