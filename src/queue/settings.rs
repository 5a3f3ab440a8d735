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
pub(crate) struct DeadLetter {
    pub max_deliveries: Option<u32>,
    pub name: QueueName,
    pub kind: QueueKind,
    pub path: String,
}

/// The highest `max_deliveries` a setting may ask for (as SQS's `maxReceiveCount`).
pub(crate) const MAX_DELIVERIES_SETTING: u32 = 1000;

/// The longest visibility timeout a setting may ask for, seconds (SQS's 12 hours).
pub(super) const MAX_VISIBILITY_SECONDS: u64 = 43_200;

/// The longest receive wait a setting may ask for, seconds (SQS's 20).
pub(super) const MAX_RECEIVE_WAIT_SECONDS: u64 = 20;

/// What the node holds. Every field is optional: unset, the configuration's default applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QueueSettings {
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
    /// An access policy (SQS's `Policy`: a JSON object of up to [`MAX_POLICY_BYTES`]), stored and
    /// answered, never enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The largest message an SQS send may put, bytes of body and attributes (SQS's
    /// `MaximumMessageSize`, at least [`MIN_MESSAGE_BYTES_SETTING`]); never more than
    /// `api.max_message_bytes`, whatever the node says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u64>,
    /// How long a message put without its own delay waits before it is delivered, seconds (SQS's
    /// `DelaySeconds`, up to [`MAX_DELAY_SECONDS`]); for queues whose names can hold a delivery
    /// time (delay queues, plain fifo queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_seconds: Option<u64>,
    /// How long a message is kept, seconds from its node's creation (SQS's
    /// `MessageRetentionPeriod`, [`MIN_RETENTION_SECONDS`] to [`MAX_RETENTION_SECONDS`]): older
    /// ones are deleted, never delivered. Unset: kept until consumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_seconds: Option<u64>,
    /// SQS's `KmsMasterKeyId` and `KmsDataKeyReusePeriodSeconds`: stored and answered; zkq
    /// encrypts nothing with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms_master_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms_data_key_reuse_seconds: Option<u64>,
    /// A FIFO queue's deduplication ids are its message groups' (SQS's `DeduplicationScope` =
    /// `messageGroup`): one id in two groups is two messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deduplication_per_group: Option<bool>,
    /// SQS's `FifoThroughputLimit` = `perMessageGroupId` (high-throughput FIFO): stored and
    /// answered; zkq sets no throughput limit either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput_per_group: Option<bool>,
}

/// The longest delay a setting may ask for, seconds (SQS's 15 minutes).
pub(crate) const MAX_DELAY_SECONDS: u64 = 900;

/// The shortest retention a setting may ask for, seconds (SQS's one minute).
pub(crate) const MIN_RETENTION_SECONDS: u64 = 60;

/// The longest retention a setting may ask for, seconds (SQS's 14 days).
pub(crate) const MAX_RETENTION_SECONDS: u64 = 1_209_600;

/// The smallest `MaximumMessageSize` a queue takes (SQS's 1 KiB).
pub(crate) const MIN_MESSAGE_BYTES_SETTING: u64 = 1_024;

/// The largest `Policy` a queue keeps (SQS's limit, 20 KiB).
pub(crate) const MAX_POLICY_BYTES: usize = 20_480;

impl QueueSettings {
    /// Reads a settings node: a JSON object of the fields above (others are ignored).
    pub(crate) fn parse(data: &[u8]) -> Result<QueueSettings, String> {
        match serde_json::from_slice::<serde_json::Value>(data) {
            Ok(object @ serde_json::Value::Object(_)) => serde_json::from_value(object).map_err(|err| err.to_string()),
            Ok(_) => Err("not a JSON object".to_owned()),
            Err(err) => Err(err.to_string()),
        }
    }

    /// Reads the settings node of queue `queue` as strictly as a client's request is read (the
    /// node is untrusted: any ZooKeeper client may have written it): it must parse and pass
    /// [`QueueSettings::check`]; the waits are then clamped to what a setting may ask for, so no
    /// value another client wrote can make a wait overflow.
    pub(crate) fn read_node(data: &[u8], queue: &QueueName) -> Result<QueueSettings, String> {
        let mut settings = QueueSettings::parse(data)?;
        settings.check(queue)?;
        settings.visibility_seconds = settings.visibility_seconds.map(|v| v.min(MAX_VISIBILITY_SECONDS));
        settings.receive_wait_seconds = settings.receive_wait_seconds.map(|w| w.min(MAX_RECEIVE_WAIT_SECONDS));
        Ok(settings)
    }

    /// Checks values a client gives: a dead-letter queue with a `max_deliveries` of 1 to
    /// [`MAX_DELIVERIES_SETTING`], never the queue itself.
    pub(crate) fn check(&self, queue: &QueueName) -> Result<(), String> {
        if let Some(policy) = &self.policy {
            let object = serde_json::from_str::<serde_json::Value>(policy).is_ok_and(|v| v.is_object());
            if policy.len() > MAX_POLICY_BYTES || !object {
                return Err(format!("a Policy is a JSON object of at most {MAX_POLICY_BYTES} bytes"));
            }
        }
        if self.throughput_per_group == Some(true) && self.deduplication_per_group != Some(true) {
            return Err(
                "a FifoThroughputLimit of perMessageGroupId needs a DeduplicationScope of messageGroup".to_owned()
            );
        }
        if self.delay_seconds.is_some_and(|delay| delay > MAX_DELAY_SECONDS) {
            return Err(format!("a DelaySeconds is at most {MAX_DELAY_SECONDS} seconds"));
        }
        if self.retention_seconds.is_some_and(|r| !(MIN_RETENTION_SECONDS..=MAX_RETENTION_SECONDS).contains(&r)) {
            return Err(format!(
                "a MessageRetentionPeriod is {MIN_RETENTION_SECONDS} to {MAX_RETENTION_SECONDS} seconds"
            ));
        }
        if self.max_message_bytes.is_some_and(|bytes| bytes < MIN_MESSAGE_BYTES_SETTING) {
            return Err(format!("a MaximumMessageSize is at least {MIN_MESSAGE_BYTES_SETTING} bytes"));
        }
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
pub(super) struct SettingsCell {
    current: RwLock<Current>,
    /// Whether `current` is what ZooKeeper holds (read once since the queue opened, or a declared
    /// queue's, which has no node): a request waits for it before it is served.
    loaded: tokio::sync::watch::Sender<bool>,
}

impl SettingsCell {
    /// The cell of a dynamic queue: not loaded until its follower read the node.
    pub(super) fn unloaded() -> SettingsCell {
        SettingsCell { current: RwLock::default(), loaded: tokio::sync::watch::channel(false).0 }
    }

    /// The cell of a declared queue: its configuration is its settings, known at once.
    pub(super) fn declared() -> SettingsCell {
        SettingsCell { current: RwLock::default(), loaded: tokio::sync::watch::channel(true).0 }
    }

    /// Waits until the settings are what ZooKeeper holds, at most until `deadline` (`false`: not
    /// known by then, so nothing may be served with the defaults in their place).
    pub(super) async fn wait_loaded(&self, deadline: tokio::time::Instant) -> bool {
        let mut loaded = self.loaded.subscribe();
        tokio::time::timeout_at(deadline, loaded.wait_for(|loaded| *loaded)).await.is_ok_and(|r| r.is_ok())
    }

    pub(super) fn get(&self) -> Current {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The retention the settings set, if any (read without copying the settings: every claim asks).
    pub(super) fn retention_seconds(&self) -> Option<u64> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).settings.retention_seconds
    }

    /// The dead-letter queue the settings name, if any.
    pub(super) fn dead_letter(&self) -> Option<Arc<DeadLetter>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).dead_letter.clone()
    }

    pub(super) fn set(&self, current: Current) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = current;
        self.loaded.send_if_modified(|loaded| !std::mem::replace(loaded, true));
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
        refused: prometheus::IntCounter,
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
                    let settings = QueueSettings::read_node(&data, &queue).unwrap_or_else(|err| {
                        tracing::warn!(queue = %queue, node = %path, error = %err,
                            "the queue's settings node does not hold valid zkq settings; serving the defaults");
                        refused.inc();
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

    #[test]
    fn a_settings_node_another_client_wrote_is_read_as_strictly_as_a_request() {
        let queue: QueueName = "orders".parse().expect("a name");
        // Its own dead-letter queue, or a count of 0: refused (the node then counts as none).
        for refused in [
            br#"{"dead_letter": "orders", "max_deliveries": 3}"#.as_slice(),
            br#"{"dead_letter": "dead", "max_deliveries": 0}"#,
            br#"{"max_deliveries": 5}"#,
        ] {
            assert!(QueueSettings::read_node(refused, &queue).is_err(), "{}", String::from_utf8_lossy(refused));
        }
        // Waits beyond what a setting may ask for are clamped, never trusted.
        let huge = br#"{"receive_wait_seconds": 18446744073709551615, "visibility_seconds": 18446744073709551615}"#;
        let read = QueueSettings::read_node(huge, &queue).expect("clamped");
        assert_eq!(read.receive_wait_seconds, Some(MAX_RECEIVE_WAIT_SECONDS));
        assert_eq!(read.visibility_seconds, Some(MAX_VISIBILITY_SECONDS));
    }
}
