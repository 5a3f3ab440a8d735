//! A dynamic queue's own settings, set through the SQS-compatible API (`CreateQueue`'s and
//! `SetQueueAttributes`' `VisibilityTimeout`, `ReceiveMessageWaitTimeSeconds`, `RedrivePolicy`):
//! kept in ZooKeeper at `{root}/settings/{queue}` as a JSON object, so every sidecar serves the
//! queue alike, and followed by each sidecar that has the queue open (a data watch). A declared
//! queue's settings are its configuration; it has no such node.
//!
//! The node is untrusted input: one that does not parse is logged and read as no settings.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::QueueKind;
use crate::types::QueueName;
use crate::zk::{WatchEvent, ZkError, ZkSession};

/// Where dead letters of a queue go: its declared `dead_letter`, or the one its settings name.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub max_deliveries: Option<u32>,
    pub name: QueueName,
    pub kind: QueueKind,
    pub path: String,
}

/// The highest `max_deliveries` a setting may ask for (as SQS's `maxReceiveCount`).
pub const MAX_DELIVERIES_SETTING: u32 = 1000;

/// What the node holds. Every field is optional: unset, the configuration's default applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSettings {
    /// The visibility timeout of a lease that asks for none, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_seconds: Option<u64>,
    /// How long an SQS `ReceiveMessage` without `WaitTimeSeconds` waits, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive_wait_seconds: Option<u64>,
    /// Where messages go after `max_deliveries` deliveries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<QueueName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deliveries: Option<u32>,
    /// A FIFO queue's sends without a deduplication id are deduplicated by their body's SHA-256
    /// (SQS's `ContentBasedDeduplication`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_deduplication: Option<bool>,
}

impl QueueSettings {
    /// Reads a settings node: a JSON object of the fields above (others are ignored).
    pub fn parse(data: &[u8]) -> Result<QueueSettings, String> {
        match serde_json::from_slice::<serde_json::Value>(data) {
            Ok(object @ serde_json::Value::Object(_)) => serde_json::from_value(object).map_err(|err| err.to_string()),
            Ok(_) => Err("not a JSON object".to_owned()),
            Err(err) => Err(err.to_string()),
        }
    }

    /// Checks values a client gives: a dead-letter queue with a `max_deliveries` of 1 to
    /// [`MAX_DELIVERIES_SETTING`], never the queue itself.
    pub fn check(&self, queue: &QueueName) -> Result<(), String> {
        match (&self.dead_letter, self.max_deliveries) {
            (Some(target), _) if target == queue => Err("a queue cannot be its own dead-letter queue".to_owned()),
            (Some(_), Some(1..=MAX_DELIVERIES_SETTING)) | (None, None) => Ok(()),
            (Some(_), _) => Err(format!("maxReceiveCount must be 1 to {MAX_DELIVERIES_SETTING}")),
            (None, Some(_)) => Err("maxReceiveCount needs a deadLetterTargetArn".to_owned()),
        }
    }
}

/// The settings a queue is served with now, with its dead-letter queue resolved.
#[derive(Debug, Clone, Default)]
pub(super) struct Current {
    pub(super) settings: QueueSettings,
    pub(super) dead_letter: Option<Arc<DeadLetter>>,
}

/// The settings one open queue follows.
#[derive(Default)]
pub(super) struct SettingsCell {
    current: RwLock<Current>,
}

impl SettingsCell {
    pub(super) fn get(&self) -> Current {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The dead-letter queue the settings name, if any.
    pub(super) fn dead_letter(&self) -> Option<Arc<DeadLetter>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).dead_letter.clone()
    }

    pub(super) fn set(&self, current: Current) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = current;
    }

    /// Follows the node at `path` until `stop`: read with a watch (or, while it does not exist,
    /// an existence watch), applied through `resolve`, read again on every change and after every
    /// reconnect.
    pub(super) async fn follow(
        self: Arc<Self>,
        session: ZkSession,
        path: String,
        queue: QueueName,
        resolve: impl Fn(QueueSettings) -> Current + Send + Sync,
        stop: CancellationToken,
    ) {
        loop {
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            let zk = tokio::select! {
                _ = stop.cancelled() => return,
                zk = session.connected(far) => zk,
            };
            let Ok(zk) = zk else { continue };
            let zk = zk.with_deadline(tokio::time::Instant::now() + session.request_timeout());
            let watch = match zk.get_and_watch_data(&path).await {
                Ok((data, _, watch)) => {
                    let settings = QueueSettings::parse(&data).unwrap_or_else(|err| {
                        tracing::warn!(queue = %queue, node = %path, error = %err,
                            "the queue's settings node does not hold zkq's settings; serving the defaults");
                        QueueSettings::default()
                    });
                    self.set(resolve(settings));
                    watch
                },
                Err(ZkError::NoNode) => {
                    self.set(resolve(QueueSettings::default()));
                    match zk.watch_exists(&path).await {
                        Ok((Some(_), _)) => continue,
                        Ok((None, watch)) => watch,
                        Err(_) => {
                            tokio::select! {
                                _ = stop.cancelled() => return,
                                _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                            }
                        },
                    }
                },
                Err(_) => {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    }
                },
            };
            let mut status = session.subscribe();
            let epoch = status.borrow_and_update().epoch;
            tokio::select! {
                _ = stop.cancelled() => return,
                event = watch.changed() => if event == WatchEvent::SessionEnded { continue },
                // A reconnect may have hidden a change: read again.
                _ = async { while status.changed().await.is_ok() { if status.borrow_and_update().epoch != epoch { return } } } => {},
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_policy_names_another_queue_and_a_count_of_1_to_1000() {
        let queue: QueueName = "orders".parse().expect("a name");
        let with = |target: &str, max: Option<u32>| QueueSettings {
            dead_letter: Some(target.parse().expect("a name")),
            max_deliveries: max,
            ..QueueSettings::default()
        };
        assert!(with("dead", Some(5)).check(&queue).is_ok());
        assert!(QueueSettings::default().check(&queue).is_ok());
        assert!(with("orders", Some(5)).check(&queue).is_err());
        assert!(with("dead", Some(0)).check(&queue).is_err());
        assert!(with("dead", Some(1001)).check(&queue).is_err());
        assert!(with("dead", None).check(&queue).is_err());
        for foreign in [b"[1,2]".as_slice(), b"\"x\"", b"{\"visibility_seconds\": -1}", b"not json"] {
            assert!(QueueSettings::parse(foreign).is_err(), "{foreign:?} is not settings");
        }
        let parsed = QueueSettings::parse(br#"{"visibility_seconds": 7, "from_a_newer_zkq": true}"#);
        assert_eq!(parsed.map(|s| s.visibility_seconds), Ok(Some(7)));
    }
}
