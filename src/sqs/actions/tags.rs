//! Queue tags (`TagQueue`, `UntagQueue`, `ListQueueTags`, and `CreateQueue`'s tags), kept by the
//! core's tags store (`queue/tags.rs`) so every sidecar lists the same; here SQS's limits: 50 tags,
//! keys of 1 to 128 characters not starting `aws:`, values of up to 256.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Ctx, Empty, required};
use crate::queue::tags::{Tags, TagsError};
use crate::sqs::error::SqsError;
use crate::types::QueueName;

/// Tags one queue may have (SQS's limit).
const MAX_TAGS: usize = 50;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TagQueueInput {
    queue_url: Option<String>,
    #[serde(default)]
    tags: Tags,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct UntagQueueInput {
    queue_url: Option<String>,
    #[serde(default)]
    tag_keys: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListQueueTagsInput {
    queue_url: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListQueueTagsOutput {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    tags: Tags,
}

pub(super) async fn tag_queue(ctx: &Ctx<'_>, input: TagQueueInput) -> Result<Empty, SqsError> {
    let queue = ctx.existing(&required(input.queue_url, "QueueUrl")?).await?;
    if input.tags.is_empty() {
        return Err(SqsError::missing_parameter("Tags"));
    }
    check_tags(&input.tags)?;
    change(ctx, queue.name(), |tags| tags.extend(input.tags.clone())).await?;
    Ok(Empty {})
}

pub(super) async fn untag_queue(ctx: &Ctx<'_>, input: UntagQueueInput) -> Result<Empty, SqsError> {
    let queue = ctx.existing(&required(input.queue_url, "QueueUrl")?).await?;
    if input.tag_keys.is_empty() || input.tag_keys.iter().any(|key| !(1..=128).contains(&key.chars().count())) {
        return Err(SqsError::invalid_parameter("Tag keys must be between 1 and 128 characters in length."));
    }
    change(ctx, queue.name(), |tags| {
        for key in &input.tag_keys {
            tags.remove(key);
        }
    })
    .await?;
    Ok(Empty {})
}

pub(super) async fn list_queue_tags(ctx: &Ctx<'_>, input: ListQueueTagsInput) -> Result<ListQueueTagsOutput, SqsError> {
    let queue = ctx.existing(&required(input.queue_url, "QueueUrl")?).await?;
    let tags = ctx.state.door.tags().list(queue.name()).await?;
    Ok(ListQueueTagsOutput { tags })
}

/// Adds `tags` to the queue's (`CreateQueue`).
pub(super) async fn add_tags(ctx: &Ctx<'_>, queue: &QueueName, tags: Tags) -> Result<(), SqsError> {
    if tags.is_empty() {
        return Ok(());
    }
    check_tags(&tags)?;
    change(ctx, queue, |stored| stored.extend(tags.clone())).await
}

pub(super) fn check_tags(tags: &Tags) -> Result<(), SqsError> {
    for (key, value) in tags {
        if key.is_empty() || key.chars().count() > 128 || key.to_ascii_lowercase().starts_with("aws:") {
            return Err(SqsError::invalid_parameter(format!(
                "tag key {key:?} must be 1 to 128 characters and not start with aws:"
            )));
        }
        if value.chars().count() > 256 {
            return Err(SqsError::invalid_parameter(format!("the value of tag {key:?} is over 256 characters")));
        }
    }
    Ok(())
}

/// Applies `edit` to the queue's tags, within SQS's limit of tags per queue.
async fn change(ctx: &Ctx<'_>, queue: &QueueName, edit: impl Fn(&mut Tags)) -> Result<(), SqsError> {
    ctx.state.door.tags().change(queue, MAX_TAGS, edit).await.map_err(|err| match err {
        // SQS's words (a queue holds at most MAX_TAGS).
        TagsError::TooMany => SqsError::invalid_parameter(format!("Too many tags added for queue {queue}.")),
        TagsError::Queue(err) => err.into(),
    })
}
