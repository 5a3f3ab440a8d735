//! The receipt actions: delete a message and change its visibility, one or a batch, by the
//! receipt handle of its lease (an ended lease's too, as SQS takes an old handle).

use serde::{Deserialize, Serialize};

use super::batch::{BatchError, BatchInput, BatchOutput, check_batch};
use super::{Ctx, Empty, bounded, number, required, seconds};
use crate::queue::{NackMode, QueueError, QueueRef, Receipt};
use crate::sqs::error::SqsError;
use std::time::Duration;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct DeleteMessageInput {
    queue_url: Option<String>,
    receipt_handle: Option<String>,
}

/// The receipt a single call's `ReceiptHandle` names (a batch entry's says which handle, as SQS's
/// do: `receipt_batch`).
fn receipt_of(text: Option<String>) -> Result<Receipt, SqsError> {
    required(text, "ReceiptHandle")?
        .parse()
        .map_err(|_| SqsError::receipt_handle_invalid("The input receipt handle is invalid."))
}

pub(super) async fn delete_message(ctx: &Ctx<'_>, input: DeleteMessageInput) -> Result<Empty, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let queue = ctx.leased_from(&url).await?;
    delete_one(&queue, receipt_of(input.receipt_handle)?).await?;
    Ok(Empty {})
}

/// Acks the lease `receipt` names; the receipt of a lease that ended (its visibility passed)
/// removes the message the lease held, unless a consumer holds it now, as SQS deletes a message
/// by an old receipt handle.
async fn delete_one(queue: &QueueRef, receipt: Receipt) -> Result<(), SqsError> {
    match queue.ack(receipt).await {
        Err(QueueError::LeaseLost(why)) => match queue.remove_after_lease(receipt).await? {
            true => Ok(()),
            false => Err(QueueError::LeaseLost(why).into()),
        },
        other => Ok(other?),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ReceiptEntry {
    id: Option<String>,
    receipt_handle: Option<String>,
    #[serde(default, deserialize_with = "number")]
    visibility_timeout: Option<i64>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct IdEntry {
    id: String,
}

/// What a batch of receipts asks for each.
#[derive(Debug, Clone, Copy)]
pub(super) enum ReceiptStep {
    Delete,
    ChangeVisibility,
}

/// Runs `step` for every entry of a receipt batch, all at once; each entry succeeds or fails on its
/// own.
pub(super) async fn receipt_batch(
    ctx: &Ctx<'_>,
    input: BatchInput<ReceiptEntry>,
    step: ReceiptStep,
) -> Result<BatchOutput<IdEntry>, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let entry = match step {
        ReceiptStep::Delete => "DeleteMessageBatchRequestEntry",
        ReceiptStep::ChangeVisibility => "ChangeMessageVisibilityBatchRequestEntry",
    };
    check_batch(input.entries.iter().map(|e| e.id.as_deref().unwrap_or("")), entry)?;
    let queue = ctx.leased_from(&url).await?;
    let steps = input.entries.into_iter().map(|entry| {
        let queue = &queue;
        async move {
            let receipt = required(entry.receipt_handle, "ReceiptHandle").and_then(|text| {
                text.parse::<Receipt>().map_err(|_| {
                    SqsError::receipt_handle_invalid(format!(
                        "The input receipt handle {text:?} is not a valid receipt handle."
                    ))
                })
            });
            let result = match (receipt, step) {
                (Err(err), _) => Err(err),
                (Ok(receipt), ReceiptStep::Delete) => delete_one(queue, receipt).await,
                (Ok(receipt), ReceiptStep::ChangeVisibility) => {
                    change_one(ctx, queue, receipt, entry.visibility_timeout).await
                },
            };
            (entry.id.unwrap_or_default(), result)
        }
    });
    Ok(split(futures::future::join_all(steps).await))
}

fn split(results: Vec<(String, Result<(), SqsError>)>) -> BatchOutput<IdEntry> {
    let (mut successful, mut failed) = (Vec::new(), Vec::new());
    for (id, result) in results {
        match result {
            Ok(()) => successful.push(IdEntry { id }),
            Err(err) => failed.push(BatchError::of(id, err)),
        }
    }
    BatchOutput { successful, failed }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ChangeVisibilityInput {
    queue_url: Option<String>,
    receipt_handle: Option<String>,
    #[serde(default, deserialize_with = "number")]
    visibility_timeout: Option<i64>,
}

/// Extends the lease to `visibility` seconds from now; 0 releases it now, in its place.
async fn change_one(
    ctx: &Ctx<'_>,
    queue: &QueueRef,
    receipt: Receipt,
    visibility: Option<i64>,
) -> Result<(), SqsError> {
    let longest = i64::try_from(ctx.state.config.lease.max_visibility.as_secs()).unwrap_or(43_200);
    let visibility = required(bounded("VisibilityTimeout", visibility, 0, 43_200.min(longest))?, "VisibilityTimeout")?;
    let change = |receipt: Receipt| async move {
        if visibility == 0 {
            queue.nack(receipt, NackMode::Keep, Duration::ZERO).await
        } else {
            queue.extend(receipt, seconds(visibility)).await.map(|_| ())
        }
    };
    let step = match change(receipt).await {
        // An old receipt of a message in flight again, here: SQS changes that lease's visibility.
        Err(crate::queue::QueueError::LeaseLost(why)) => match queue.current_lease_of(receipt).await {
            Some(current) => change(current).await,
            None => Err(crate::queue::QueueError::LeaseLost(why)),
        },
        other => other,
    };
    step.map_err(|err| match err {
        crate::queue::QueueError::LeaseLost(why) => {
            SqsError::not_in_flight(format!("the message is not in flight: {why}; it will be delivered again"))
        },
        other => SqsError::from(other),
    })
}

pub(super) async fn change_visibility(ctx: &Ctx<'_>, input: ChangeVisibilityInput) -> Result<Empty, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let queue = ctx.leased_from(&url).await?;
    change_one(ctx, &queue, receipt_of(input.receipt_handle)?, input.visibility_timeout).await?;
    Ok(Empty {})
}
