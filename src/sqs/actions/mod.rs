//! The SQS actions zkq serves, each an input type (the JSON protocol's shape, which the query
//! protocol is decoded into) and an answer (the JSON protocol's output object).
//!
//! The mapping, kept exact:
//! - A queue URL is `http://{the Host the client used}/{sqs.account_id}/{queue}`; its last segment
//!   is the queue's name.
//! - `MessageId` is the message's node name: the same on every sidecar and every delivery.
//! - A receipt handle is a lease receipt: `ReceiveMessage` leases, `DeleteMessage` acks,
//!   `ChangeMessageVisibility` extends (0: released now, in its place).
//! - `ApproximateReceiveCount` is the lease's delivery count, `SentTimestamp` the node's creation,
//!   `ApproximateFirstReceiveTimestamp` its delivery count's (written by its first claim).
//! - `MessageGroupId` is the message's group on a grouped queue, `MessageDeduplicationId` its
//!   idempotency key.
//!
//! This file dispatches and holds what every action shares (the request's context, the queue a
//! URL names, number parsing); `queues.rs` has the queue-level actions, `tags.rs` the queue tags,
//! `permissions.rs` the policy's statements,
//! `messages.rs` the message actions and message attributes.

mod batch;
mod messages;
mod moves;
mod permissions;
mod queues;
mod receipts;
mod tags;

use std::time::Duration;

use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use messages::{receive_message, send_message, send_message_batch};
use moves::{cancel_move_task, list_move_tasks, start_move_task};
use permissions::{add_permission, remove_permission};
use queues::{
    create_queue, delete_queue, get_queue_attributes, get_queue_url, list_dead_letter_sources, list_queues,
    purge_queue, set_queue_attributes,
};
use receipts::{ReceiptStep, change_visibility, delete_message, receipt_batch};
use tags::{list_queue_tags, tag_queue, untag_queue};

use super::SqsState;
use super::error::SqsError;
use crate::queue::Purpose;
use crate::queue::QueueRef;
use crate::types::QueueName;

/// What every action knows of its request.
pub(super) struct Ctx<'a> {
    pub(super) state: &'a SqsState,
    /// `http://{host}`, from the request's `Host` header.
    pub(super) origin: String,
}

/// Runs `action` with `input`; its answer in the JSON protocol's shape.
pub(super) async fn run(ctx: &Ctx<'_>, action: &str, input: Value) -> Result<Value, SqsError> {
    match action {
        "GetQueueUrl" => answer(get_queue_url(ctx, parse(input)?).await),
        "CreateQueue" => answer(create_queue(ctx, parse(input)?).await),
        "ListQueues" => answer(list_queues(ctx, parse(input)?)),
        "SendMessage" => answer(send_message(ctx, parse(input)?).await),
        "SendMessageBatch" => answer(send_message_batch(ctx, parse(input)?).await),
        "ReceiveMessage" => answer(receive_message(ctx, parse(input)?).await),
        "DeleteMessage" => answer(delete_message(ctx, parse(input)?).await),
        "DeleteMessageBatch" => answer(receipt_batch(ctx, parse(input)?, ReceiptStep::Delete).await),
        "ChangeMessageVisibility" => answer(change_visibility(ctx, parse(input)?).await),
        "ChangeMessageVisibilityBatch" => {
            answer(receipt_batch(ctx, parse(input)?, ReceiptStep::ChangeVisibility).await)
        },
        "GetQueueAttributes" => answer(get_queue_attributes(ctx, parse(input)?).await),
        "PurgeQueue" => answer(purge_queue(ctx, parse(input)?).await),
        "DeleteQueue" => answer(delete_queue(ctx, parse(input)?).await),
        "SetQueueAttributes" => answer(set_queue_attributes(ctx, parse(input)?).await),
        "ListDeadLetterSourceQueues" => answer(list_dead_letter_sources(ctx, parse(input)?).await),
        "TagQueue" => answer(tag_queue(ctx, parse(input)?).await),
        "UntagQueue" => answer(untag_queue(ctx, parse(input)?).await),
        "ListQueueTags" => answer(list_queue_tags(ctx, parse(input)?).await),
        "StartMessageMoveTask" => answer(start_move_task(ctx, parse(input)?).await),
        "ListMessageMoveTasks" => answer(list_move_tasks(ctx, parse(input)?).await),
        "CancelMessageMoveTask" => answer(cancel_move_task(ctx, parse(input)?).await),
        "AddPermission" => answer(add_permission(ctx, parse(input)?).await),
        "RemovePermission" => answer(remove_permission(ctx, parse(input)?).await),
        other => Err(SqsError::not_for_endpoint(other)),
    }
}

/// The actions [`run`] serves, for the docs and their test.
pub(crate) const SERVED: &[&str] = &[
    "GetQueueUrl",
    "CreateQueue",
    "ListQueues",
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "GetQueueAttributes",
    "PurgeQueue",
    "DeleteQueue",
    "SetQueueAttributes",
    "ListDeadLetterSourceQueues",
    "TagQueue",
    "UntagQueue",
    "ListQueueTags",
    "StartMessageMoveTask",
    "ListMessageMoveTasks",
    "CancelMessageMoveTask",
    "AddPermission",
    "RemovePermission",
];

fn parse<T: DeserializeOwned>(input: Value) -> Result<T, SqsError> {
    serde_json::from_value(input).map_err(|err| SqsError::invalid_parameter(format!("{err}")))
}

fn answer<T: Serialize>(result: Result<T, SqsError>) -> Result<Value, SqsError> {
    let output = result?;
    serde_json::to_value(output).map_err(|err| SqsError::invalid_parameter(err.to_string()))
}

/// A number sent as JSON or (by the query protocol) as text.
fn number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Number(i64),
        Text(String),
    }
    match Option::<Either>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Either::Number(n)) => Ok(Some(n)),
        Some(Either::Text(text)) => {
            text.trim().parse().map(Some).map_err(|_| serde::de::Error::custom(format!("{text:?} is not a number")))
        },
    }
}

/// `value` within `min..=max`, else SQS's error naming `name`.
fn bounded(name: &str, value: Option<i64>, min: i64, max: i64) -> Result<Option<i64>, SqsError> {
    match value {
        Some(v) if !(min..=max).contains(&v) => {
            Err(SqsError::invalid_parameter(format!("{name} must be {min} to {max}, not {v}")))
        },
        other => Ok(other),
    }
}

fn seconds(value: i64) -> Duration {
    Duration::from_secs(u64::try_from(value).unwrap_or(0))
}

impl Ctx<'_> {
    fn queue_url(&self, name: &str) -> String {
        format!("{}/{}/{name}", self.origin, self.state.config.sqs.account_id)
    }

    fn queue_arn(&self, name: &str) -> String {
        let sqs = &self.state.config.sqs;
        format!("arn:aws:sqs:{}:{}:{name}", sqs.region, sqs.account_id)
    }

    /// The queue a queue URL names: its last path segment.
    fn name_of(url: &str) -> Result<QueueName, SqsError> {
        let last = url.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
        last.parse().map_err(|_| SqsError::no_such_queue())
    }

    /// The queue `url` names, for a read or a lease: it must exist.
    async fn existing(&self, url: &str) -> Result<QueueRef, SqsError> {
        let name = Ctx::name_of(url)?;
        Ok(self.state.door.queues().queue(&name, Purpose::Look).await?)
    }

    /// The queue `url` names for a lease step: this process leased from it.
    async fn leased_from(&self, url: &str) -> Result<QueueRef, SqsError> {
        let name = Ctx::name_of(url)?;
        Ok(self.state.door.queues().queue(&name, Purpose::Step).await?)
    }
}

/// Whether queue `name` is a FIFO queue: SQS's rule, its name ends in `.fifo`.
fn is_fifo(name: &QueueName) -> bool {
    name.as_str().ends_with(".fifo")
}

fn required<T>(value: Option<T>, name: &str) -> Result<T, SqsError> {
    value.ok_or_else(|| SqsError::missing_parameter(name))
}

/// An action's answer that carries nothing.
#[derive(Serialize)]
pub(super) struct Empty {}
