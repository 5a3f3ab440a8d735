//! A grouped take's answer on its way to the client.
//!
//! A grouped take is a lease acked once its answer has left zkq: until then its message keeps
//! its place at the head of its group, so no other consumer is handed the next message of the
//! group while this one is still inside zkq. The HTTP layer holds the [`Handover`] in the
//! answer's body: the body's last byte handed to the connection acks the leases; an answer
//! dropped before that (the client left, the request timed out) releases them, and their
//! messages are delivered again, first of their groups.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Claims;
use crate::queue::QueueError;
use crate::queue::Receipt;
use crate::queue::context::SETTLE_RETRIES;
use crate::zk::ZkError;

/// How long a grouped take's lease lasts: from its claim to its ack, which follows the answer
/// at once; a zkq that dies in between leaves it to expire (the message is delivered again).
pub(super) const GROUPED_TAKE_VISIBILITY: Duration = Duration::from_secs(60);

/// The leases of a grouped take's answer. [`Handover::handed_over`] acks them; dropping it
/// unsent releases them. Either runs on the queue's background tracker, to its end.
#[must_use = "dropping a handover releases its messages"]
pub(crate) struct Handover {
    claims: Arc<Claims>,
    receipts: Vec<Receipt>,
    span: tracing::Span,
}

impl Handover {
    pub(super) fn new(claims: Arc<Claims>, receipts: Vec<Receipt>) -> Handover {
        Handover { claims, receipts, span: tracing::Span::current() }
    }

    /// The answer's last byte was handed to the client's connection: its messages are taken.
    pub(crate) fn handed_over(mut self) {
        let receipts = std::mem::take(&mut self.receipts);
        let claims = self.claims.clone();
        self.claims.ctx.background.spawn(tracing::Instrument::instrument(
            async move {
                for receipt in receipts {
                    Box::pin(claims.ack_handed_over(receipt)).await;
                }
            },
            self.span.clone(),
        ));
    }
}

impl Drop for Handover {
    fn drop(&mut self) {
        if self.receipts.is_empty() {
            return;
        }
        // Never handed over: the messages go back to the heads of their groups.
        let receipts = std::mem::take(&mut self.receipts);
        let claims = self.claims.clone();
        self.claims.ctx.background.spawn(tracing::Instrument::instrument(
            async move {
                for receipt in receipts {
                    Box::pin(claims.leases.abandon_lease(receipt)).await;
                }
            },
            self.span.clone(),
        ));
    }
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover").field("messages", &self.receipts.len()).finish()
    }
}

impl Claims {
    /// Acknowledges the lease of a grouped take whose answer was handed over: retried while
    /// ZooKeeper cannot be asked or its answer was lost (a retry is settled by the first
    /// attempt's evidence), for up to half the lease, so the message is not delivered again.
    async fn ack_handed_over(&self, receipt: Receipt) {
        let give_up = Instant::now() + GROUPED_TAKE_VISIBILITY / 2;
        let mut pause = SETTLE_RETRIES.retries();
        loop {
            match self.leases.ack(receipt).await {
                Ok(()) => return self.ctx.qm.messages_taken.inc(),
                Err(QueueError::Zk(ZkError::Unavailable | ZkError::OutcomeUnknown)) if Instant::now() < give_up => {
                    pause.sleep().await;
                },
                // Its lease is gone (its session was lost, zkq is stopping): the message is
                // delivered again, first of its group.
                Err(err) => {
                    return tracing::warn!(queue = %self.ctx.name, error = %err,
                        "a grouped take's message was answered but could not be acknowledged; it will be delivered again");
                },
            }
        }
    }
}
