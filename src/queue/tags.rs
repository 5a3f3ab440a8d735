//! Queue tags, stored in ZooKeeper so every sidecar lists the same: one node per queue at
//! `{zookeeper.root}/sqs/tags/{queue}` holding a JSON object of strings (deleted with its queue,
//! [`super::catalog`]). A change is a read and a version-checked write, tried again when another
//! sidecar changed them meanwhile. A node that is not a JSON object of strings (another client
//! wrote it) is logged, counted and read as no tags: the next change writes over it at the version
//! read, so a change repairs it. What a tag may be is the front's to check (SQS's limits).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::QueueError;
use crate::metrics::{ForeignNode, Metrics};
use crate::types::{Layout, QueueName};
use crate::zk::{NodeMode, Zk, ZkError, ZkSession};

/// A queue's tags: key to value.
pub(crate) type Tags = BTreeMap<String, String>;

/// Writes tried when other sidecars keep changing the same queue's tags.
const ATTEMPTS: usize = 5;

/// Why a tags change was not written.
#[derive(Debug)]
pub(crate) enum TagsError {
    /// The change would leave the queue more tags than it may have.
    TooMany,
    Queue(QueueError),
}

impl From<ZkError> for TagsError {
    fn from(err: ZkError) -> TagsError {
        TagsError::Queue(QueueError::Zk(err))
    }
}

/// The tags of every queue, read and written through the session.
pub(crate) struct QueueTags {
    layout: Layout,
    session: ZkSession,
    metrics: Arc<Metrics>,
}

impl QueueTags {
    pub(crate) fn new(layout: Layout, session: ZkSession, metrics: Arc<Metrics>) -> QueueTags {
        QueueTags { layout, session, metrics }
    }

    /// The queue's tags.
    pub(crate) async fn list(&self, queue: &QueueName) -> Result<Tags, QueueError> {
        let zk = self.zk()?;
        let (tags, _) = self.read(&zk, &self.layout.tags(queue.as_str())).await.map_err(QueueError::Zk)?;
        Ok(tags)
    }

    /// Reads the queue's tags, applies `edit`, and writes them back if the node did not change
    /// meanwhile (else reads again); refused when the result has more than `max` tags.
    pub(crate) async fn change(
        &self,
        queue: &QueueName,
        max: usize,
        edit: impl Fn(&mut Tags),
    ) -> Result<(), TagsError> {
        let zk = self.zk().map_err(TagsError::Queue)?;
        let path = self.layout.tags(queue.as_str());
        for _ in 0..ATTEMPTS {
            let (mut tags, version) = self.read(&zk, &path).await?;
            edit(&mut tags);
            if tags.len() > max {
                return Err(TagsError::TooMany);
            }
            let data = serde_json::to_vec(&tags)
                .map_err(|err| TagsError::Queue(QueueError::InvalidParameter(format!("tags: {err}"))))?;
            let written = match version {
                Some(version) => zk.set_data(&path, &data, Some(version)).await.map(|_| ()),
                None => match zk.create(&path, &data, NodeMode::Persistent).await {
                    Err(ZkError::NoNode) => {
                        let parent = path.rsplit_once('/').map_or("/", |(parent, _)| parent);
                        zk.ensure_path(parent).await?;
                        continue;
                    },
                    other => other.map(|_| ()),
                },
            };
            match written {
                Ok(()) => return Ok(()),
                // Another sidecar changed them meanwhile: read them again.
                Err(ZkError::BadVersion | ZkError::NodeExists | ZkError::NoNode) => {},
                Err(err) => return Err(err.into()),
            }
        }
        Err(ZkError::Unavailable.into())
    }

    fn zk(&self) -> Result<Zk, QueueError> {
        let zk = self.session.current().ok_or(QueueError::Zk(ZkError::Unavailable))?;
        Ok(zk.with_deadline(Instant::now() + self.session.request_timeout()))
    }

    /// The queue's tags and their node's version (`None`: no node).
    async fn read(&self, zk: &Zk, path: &str) -> Result<(Tags, Option<i32>), ZkError> {
        match zk.get_data(path).await {
            Ok((data, stat)) => {
                let tags = serde_json::from_slice(&data).unwrap_or_else(|err| {
                    tracing::warn!(node = path, error = %err,
                        "a tags node does not hold a JSON object of strings (another client wrote it): read as no \
                         tags; the next change writes over it");
                    self.metrics.foreign_node(ForeignNode::Tags).inc();
                    Tags::new()
                });
                Ok((tags, Some(stat.version)))
            },
            Err(ZkError::NoNode) => Ok((Tags::new(), None)),
            Err(err) => Err(err),
        }
    }
}
