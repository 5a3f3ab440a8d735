//! Queue tags (`TagQueue`, `UntagQueue`, `ListQueueTags`, and `CreateQueue`'s tags): stored in
//! ZooKeeper, one node per queue at `{zookeeper.root}/sqs/tags/{queue}` holding a JSON object, so
//! every sidecar lists the same tags. A change is a read and a version-checked write, tried again
//! when another sidecar changed them meanwhile. A node that is not a JSON object of strings
//! (another client wrote it) is listed as no tags and written over by the next change. Limits are SQS's: 50 tags, keys of 1 to 128
//! characters not starting `aws:`, values of up to 256.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Ctx, Empty, required};
use crate::metrics::ForeignNode;
use crate::sqs::error::SqsError;
use crate::types::QueueName;
use crate::zk::{NodeMode, Zk, ZkError};

/// Tags one queue may have (SQS's limit).
const MAX_TAGS: usize = 50;
/// Writes tried when other sidecars keep changing the same queue's tags.
const ATTEMPTS: usize = 5;

pub(super) type Tags = BTreeMap<String, String>;

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
    let zk = session(ctx)?;
    let (tags, _) = read(ctx, &zk, &path(ctx, queue.name())).await?;
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

fn path(ctx: &Ctx<'_>, queue: &QueueName) -> String {
    crate::types::Layout::new(&ctx.state.config.zookeeper.root).tags(queue.as_str())
}

fn session(ctx: &Ctx<'_>) -> Result<Zk, SqsError> {
    let session = &ctx.state.session;
    let zk = session.current().ok_or_else(|| SqsError::from(crate::queue::QueueError::Zk(ZkError::Unavailable)))?;
    Ok(zk.with_deadline(tokio::time::Instant::now() + session.request_timeout()))
}

/// The queue's tags and their node's version (`None`: no node). A node another client wrote
/// that is not a JSON object of strings is logged, counted and read as no tags: the next change
/// writes over it at the version read, so `TagQueue` or `UntagQueue` repairs it.
async fn read(ctx: &Ctx<'_>, zk: &Zk, path: &str) -> Result<(Tags, Option<i32>), SqsError> {
    match zk.get_data(path).await {
        Ok((data, stat)) => {
            let tags = serde_json::from_slice(&data).unwrap_or_else(|err| {
                tracing::warn!(node = path, error = %err,
                    "a tags node does not hold a JSON object of strings (another client wrote it): read as no tags; \
                     the next TagQueue or UntagQueue writes over it");
                ctx.state.metrics.foreign_node(ForeignNode::Tags).inc();
                Tags::new()
            });
            Ok((tags, Some(stat.version)))
        },
        Err(ZkError::NoNode) => Ok((Tags::new(), None)),
        Err(err) => Err(crate::queue::QueueError::Zk(err).into()),
    }
}

/// Reads the queue's tags, applies `edit`, writes them back if the node did not change meanwhile.
async fn change(ctx: &Ctx<'_>, queue: &QueueName, edit: impl Fn(&mut Tags)) -> Result<(), SqsError> {
    let zk = session(ctx)?;
    let path = path(ctx, queue);
    let zk_error = |err: ZkError| SqsError::from(crate::queue::QueueError::Zk(err));
    for _ in 0..ATTEMPTS {
        let (mut tags, version) = read(ctx, &zk, &path).await?;
        edit(&mut tags);
        if tags.len() > MAX_TAGS {
            // SQS's words (a queue holds at most MAX_TAGS).
            return Err(SqsError::invalid_parameter(format!("Too many tags added for queue {queue}.")));
        }
        let data = serde_json::to_vec(&tags).map_err(|err| SqsError::invalid_parameter(err.to_string()))?;
        let written = match version {
            Some(version) => zk.set_data(&path, &data, Some(version)).await.map(|_| ()),
            None => match zk.create(&path, &data, NodeMode::Persistent).await {
                Err(ZkError::NoNode) => {
                    let parent = path.rsplit_once('/').map_or("/", |(parent, _)| parent);
                    zk.ensure_path(parent).await.map_err(zk_error)?;
                    continue;
                },
                other => other.map(|_| ()),
            },
        };
        match written {
            Ok(()) => return Ok(()),
            // Another sidecar changed them meanwhile: read them again.
            Err(ZkError::BadVersion | ZkError::NodeExists | ZkError::NoNode) => {},
            Err(err) => return Err(zk_error(err)),
        }
    }
    Err(zk_error(ZkError::Unavailable))
}
