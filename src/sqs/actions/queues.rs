//! The queue-level actions: finding, creating and listing queues, their attributes, purge.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Ctx, Empty, bounded, is_fifo, number, required};
use crate::config::QueueKind;
use crate::queue::Purpose;
use crate::queue::{QueueError, QueueRef, QueueSettings};
use crate::sqs::error::SqsError;
use crate::types::QueueName;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct GetQueueUrlInput {
    queue_name: Option<String>,
    #[serde(rename = "QueueOwnerAWSAccountId")]
    _owner: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct QueueUrlOutput {
    queue_url: String,
}

pub(super) async fn get_queue_url(ctx: &Ctx<'_>, input: GetQueueUrlInput) -> Result<QueueUrlOutput, SqsError> {
    let name = required(input.queue_name, "QueueName")?;
    let queue = ctx.existing(&name).await?;
    // A queue open here may have been deleted (here, while in use, or on another sidecar): ask
    // ZooKeeper.
    if !ctx.state.door.queues().stored(queue.name()).await? {
        return Err(SqsError::no_such_queue());
    }
    Ok(QueueUrlOutput { queue_url: ctx.queue_url(queue.name().as_str()) })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct CreateQueueInput {
    queue_name: Option<String>,
    #[serde(default)]
    attributes: Map<String, Value>,
    /// `tags` in the JSON protocol, `Tag.N.Key`/`Tag.N.Value` (decoded as `Tags`) in the query one.
    #[serde(default, alias = "Tags", rename = "tags")]
    tags: crate::queue::tags::Tags,
}

/// The settings a dynamic queue takes from `CreateQueue` and `SetQueueAttributes`.
const SETTABLE: [&str; 12] = [
    "VisibilityTimeout",
    "ReceiveMessageWaitTimeSeconds",
    "RedrivePolicy",
    "ContentBasedDeduplication",
    "Policy",
    "MaximumMessageSize",
    "DelaySeconds",
    "MessageRetentionPeriod",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "DeduplicationScope",
    "FifoThroughputLimit",
];

/// SQS's `MessageRetentionPeriod` of a queue `CreateQueue` makes without one: four days.
const DEFAULT_RETENTION_SECONDS: u64 = 345_600;

/// The queue's settings as SQS attributes: `own` (a dynamic queue's settings node) where it has
/// them, else what zkq's configuration makes them; for `GetQueueAttributes`, and what
/// `CreateQueue` of an existing queue must say.
fn served(ctx: &Ctx<'_>, queue: &QueueRef, own: &QueueSettings) -> Vec<(&'static str, String)> {
    let config = &ctx.state.config;
    let mut values = vec![
        (
            "VisibilityTimeout",
            own.visibility_seconds.unwrap_or_else(|| config.lease.default_visibility.as_secs()).to_string(),
        ),
        ("MaximumMessageSize", largest_message(config, own).to_string()),
        ("DelaySeconds", own.delay_seconds.unwrap_or(0).to_string()),
        ("ReceiveMessageWaitTimeSeconds", own.receive_wait_seconds.unwrap_or(0).to_string()),
    ];
    let retention = match queue.declared() {
        true => queue.retention().map(|r| r.as_secs()),
        false => own.retention_seconds,
    };
    if let Some(seconds) = retention {
        values.push(("MessageRetentionPeriod", seconds.to_string()));
    }
    // Stored and answered; zkq encrypts nothing with them.
    if let Some(key) = &own.kms_master_key_id {
        values.push(("KmsMasterKeyId", key.clone()));
    }
    if let Some(seconds) = own.kms_data_key_reuse_seconds {
        values.push(("KmsDataKeyReusePeriodSeconds", seconds.to_string()));
    }
    if is_fifo(queue.name()) {
        values.push(("FifoQueue", "true".to_owned()));
        let content = own.content_deduplication.unwrap_or(false);
        values.push(("ContentBasedDeduplication", content.to_string()));
        let scope = if own.deduplication_per_group == Some(true) { "messageGroup" } else { "queue" };
        values.push(("DeduplicationScope", scope.to_owned()));
        let limit = if own.throughput_per_group == Some(true) { "perMessageGroupId" } else { "perQueue" };
        values.push(("FifoThroughputLimit", limit.to_owned()));
    }
    // zkq does not encrypt what it stores (ZooKeeper's own storage does, if configured to).
    values.push(("SqsManagedSseEnabled", "false".to_owned()));
    let dead_letter = match queue.declared() {
        true => queue.dead_letter().map(|d| (d.name.clone(), d.max_deliveries)),
        false => own.dead_letter.clone().map(|name| (name, own.max_deliveries)),
    };
    if let Some(policy) = &own.policy {
        values.push(("Policy", policy.clone()));
    }
    if let Some((name, max_deliveries)) = dead_letter {
        let policy = serde_json::json!({
            "deadLetterTargetArn": ctx.queue_arn(name.as_str()),
            "maxReceiveCount": max_deliveries,
        });
        values.push(("RedrivePolicy", policy.to_string()));
    }
    values
}

/// The largest message an SQS send to a queue with `own` settings may put: its
/// `MaximumMessageSize`, within `api.max_message_bytes`.
pub(super) fn largest_message(config: &crate::config::Config, own: &QueueSettings) -> usize {
    let api = config.api.max_message_bytes;
    own.max_message_bytes.map_or(api, |bytes| usize::try_from(bytes).unwrap_or(usize::MAX).min(api))
}

/// An attribute's value as text (the query protocol sends text; the JSON one may send numbers).
fn text_of(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
}

/// A boolean attribute as SQS reads it: `true` or `false` in any case.
fn boolean(text: &str) -> Option<bool> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("true") {
        Some(true)
    } else if text.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// Whether `given` says what `served` is (booleans in any case; compared as JSON when both
/// parse, so key order and number formatting do not matter).
fn same(served: &str, given: &str) -> bool {
    served == given
        || boolean(served).is_some_and(|served| boolean(given) == Some(served))
        || serde_json::from_str::<Value>(served)
            .ok()
            .zip(serde_json::from_str::<Value>(given).ok())
            .is_some_and(|(a, b)| a == b)
}

/// Attributes a client gives a queue, sorted: the [`SETTABLE`] ones of a dynamic queue, read
/// into a change of its settings, and the others, which must say what the queue is.
struct Given {
    change: SettingsChange,
    /// The settable attributes as given, for a `CreateQueue` of a queue that exists already.
    settable: Vec<(String, String)>,
}

/// Sorts and checks attributes for `queue`, before anything is written: an attribute zkq
/// cannot set must say what the queue is (`InvalidAttributeName` for one zkq takes from its
/// configuration, `InvalidAttributeValue` for a value it cannot serve), and each settable
/// value is checked as SQS checks it.
fn given(ctx: &Ctx<'_>, queue: &QueueRef, attributes: &Map<String, Value>, creating: bool) -> Result<Given, SqsError> {
    let served = served(ctx, queue, &queue.settings());
    let mut settable = Map::new();
    let fifo = is_fifo(queue.name());
    // Names as SQS reads them, around any spaces a client left.
    for (key, value) in attributes {
        let key = key.trim();
        let text = text_of(value);
        if matches!(key, "FifoQueue" | "ContentBasedDeduplication") && boolean(&text).is_none() {
            return Err(SqsError::invalid_attribute_value(format!(
                "Invalid value for the parameter {key}: {text:?} is neither true nor false."
            )));
        }
        if key == "FifoQueue" && boolean(&text) == Some(true) && !fifo {
            return Err(SqsError::invalid_parameter(
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must \
                 end with .fifo suffix and be 1 to 80 in length.",
            ));
        }
        let fifo_only =
            matches!(key, "ContentBasedDeduplication" | "DeduplicationScope" | "FifoThroughputLimit") && !fifo;
        if !queue.declared() && SETTABLE.contains(&key) && !fifo_only {
            settable.insert(key.to_owned(), value.clone());
            continue;
        }
        let served = served.iter().find(|(name, _)| *name == key).map(|(_, served)| served.as_str());
        let Some(served) = served.or((key == "RedrivePolicy").then_some("")) else {
            if key == "FifoQueue" && boolean(&text) == Some(false) && !fifo {
                continue;
            }
            return Err(SqsError::invalid_attribute_name(format!(
                "zkq takes queue {}'s {key} from its configuration, and a client sets only {} of a dynamic queue; \
                 see docs/sqs.md",
                queue.name(),
                SETTABLE.join(", ")
            )));
        };
        if !same(served, &text) {
            if queue.declared() && creating {
                // A declared queue exists: as SQS answers a create whose attributes differ.
                return Err(SqsError::queue_exists(format!(
                    "queue {} has {key} = {served} in zkq's configuration, not {text}",
                    queue.name()
                )));
            }
            let whose = if queue.declared() { "in zkq's configuration" } else { "for every queue" };
            return Err(SqsError::invalid_attribute_value(format!(
                "queue {} has {key} = {served} {whose}, not {text}; zkq sets only {} of a dynamic queue",
                queue.name(),
                SETTABLE.join(", ")
            )));
        }
    }
    if is_fifo(queue.name()) && !queue.grouped() {
        return Err(SqsError::invalid_parameter(format!(
            "a FIFO queue ({}) is a grouped queue in zkq: declare queues.{}.grouped = true (or set \
             queues_dynamic_grouped)",
            queue.name(),
            queue.name()
        )));
    }
    let timed = queue.kind() == QueueKind::Delay || (queue.kind() == QueueKind::Fifo && !queue.grouped());
    let change = SettingsChange::of(ctx, &settable, fifo, timed)?;
    Ok(Given { change, settable: settable.iter().map(|(key, value)| (key.clone(), text_of(value))).collect() })
}

/// A change of a dynamic queue's settable attributes, each checked as SQS checks it:
/// `VisibilityTimeout` 0 to 43,200 seconds (within `lease.max_visibility`),
/// `ReceiveMessageWaitTimeSeconds` 0 to 20, `RedrivePolicy` a JSON object with
/// `deadLetterTargetArn` (an existing queue) and `maxReceiveCount` (1 to 1,000), or empty to
/// remove it, `ContentBasedDeduplication` true or false. `None`: not given.
#[derive(Clone, Default)]
struct SettingsChange {
    visibility: Option<Option<u64>>,
    wait: Option<Option<u64>>,
    redrive: Option<(Option<QueueName>, Option<u32>)>,
    content: Option<bool>,
    /// `Some(None)`: removed (an empty `Policy`).
    policy: Option<Option<String>>,
    max_message_bytes: Option<u64>,
    delay: Option<Option<u64>>,
    retention: Option<Option<u64>>,
    /// `Some(None)`: removed (an empty `KmsMasterKeyId`).
    kms_key: Option<Option<String>>,
    kms_reuse: Option<Option<u64>>,
    per_group: Option<bool>,
    throughput_per_group: Option<bool>,
}

impl SettingsChange {
    /// `fifo`: the queue is a FIFO queue, whose dead letters go to a FIFO queue (and a standard
    /// queue's to a standard one), as SQS requires. `timed`: its names can hold a delivery time
    /// (a delay queue, or a plain fifo one), so it can take a `DelaySeconds`.
    fn of(ctx: &Ctx<'_>, attributes: &Map<String, Value>, fifo: bool, timed: bool) -> Result<SettingsChange, SqsError> {
        let longest = ctx.state.config.lease.max_visibility.as_secs().min(43_200);
        let seconds = |key: &str, max: u64| -> Result<Option<Option<u64>>, SqsError> {
            let Some(value) = attributes.get(key) else { return Ok(None) };
            let text = text_of(value);
            match text.trim().parse::<u64>() {
                Ok(n) if n <= max => Ok(Some(Some(n))),
                _ => Err(SqsError::invalid_attribute_value(format!("{key} must be 0 to {max} seconds, not {text}"))),
            }
        };
        let visibility = seconds("VisibilityTimeout", longest)?;
        let delay = seconds("DelaySeconds", crate::queue::MAX_DELAY_SECONDS)?;
        if delay.flatten().is_some_and(|d| d > 0) && !timed {
            return Err(SqsError::invalid_attribute_value(
                "DelaySeconds above 0 needs a queue whose names can hold a delivery time: a standard queue (a plain \
                 fifo or delay queue in zkq); a FIFO queue's names hold its groups (docs/sqs.md)",
            ));
        }
        let ranged = |key: &str, min: u64, max: u64| -> Result<Option<Option<u64>>, SqsError> {
            let Some(value) = attributes.get(key) else { return Ok(None) };
            let text = text_of(value);
            match text.trim().parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(Some(Some(n))),
                _ => Err(SqsError::invalid_attribute_value(format!(
                    "Invalid value for the parameter {key}: {key} must be {min} to {max}, not {text}"
                ))),
            }
        };
        let retention =
            ranged("MessageRetentionPeriod", crate::queue::MIN_RETENTION_SECONDS, crate::queue::MAX_RETENTION_SECONDS)?;
        let kms_reuse = ranged("KmsDataKeyReusePeriodSeconds", 60, 86_400)?;
        let kms_key = match attributes.get("KmsMasterKeyId").map(text_of) {
            None => None,
            Some(text) if text.trim().is_empty() => Some(None),
            Some(text) if text.len() <= 2048 && text.chars().all(|c| !c.is_control()) => Some(Some(text)),
            Some(_) => {
                return Err(SqsError::invalid_attribute_value(
                    "KmsMasterKeyId must be at most 2048 characters, none of them a control character",
                ));
            },
        };
        let wait = seconds("ReceiveMessageWaitTimeSeconds", 20)?;
        let redrive = match attributes.get("RedrivePolicy").map(text_of) {
            None => None,
            Some(text) if text.trim().is_empty() => Some((None, None)),
            Some(text) => {
                #[derive(Deserialize)]
                #[serde(rename_all = "camelCase")]
                struct Policy {
                    dead_letter_target_arn: String,
                    max_receive_count: Value,
                }
                let policy: Policy = serde_json::from_str(&text).map_err(|err| {
                    SqsError::invalid_attribute_value(format!(
                        "RedrivePolicy must be JSON with deadLetterTargetArn and maxReceiveCount: {err}"
                    ))
                })?;
                let target = super::moves::queue_of_arn(&policy.dead_letter_target_arn)?;
                if is_fifo(&target) != fifo {
                    return Err(SqsError::invalid_parameter(format!(
                        "Value {text} for parameter RedrivePolicy is invalid. Reason: Dead-letter target must be the \
                         same type of queue as its source (both FIFO, or both standard)."
                    )));
                }
                let max = text_of(&policy.max_receive_count).trim().parse::<u32>().map_err(|_| {
                    SqsError::invalid_attribute_value("maxReceiveCount must be a whole number of 1 to 1000")
                })?;
                Some((Some(target), Some(max)))
            },
        };
        let content = match attributes.get("ContentBasedDeduplication").map(text_of) {
            None => None,
            Some(text) => match boolean(&text) {
                Some(content) => Some(content),
                None => {
                    return Err(SqsError::invalid_attribute_value(format!(
                        "ContentBasedDeduplication is true or false, not {text}"
                    )));
                },
            },
        };
        let policy = attributes.get("Policy").map(text_of).map(|text| (!text.trim().is_empty()).then_some(text));
        if let Some(Some(text)) = &policy {
            let object = serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object());
            if text.len() > crate::queue::MAX_POLICY_BYTES || !object {
                return Err(SqsError::invalid_attribute_value(format!(
                    "Policy must be a JSON object of at most {} bytes",
                    crate::queue::MAX_POLICY_BYTES
                )));
            }
        }
        let largest = ctx.state.config.api.max_message_bytes;
        let max_message_bytes = match attributes.get("MaximumMessageSize").map(text_of) {
            None => None,
            Some(text) => match text.trim().parse::<u64>() {
                Ok(bytes)
                    if bytes >= crate::queue::MIN_MESSAGE_BYTES_SETTING
                        && usize::try_from(bytes).is_ok_and(|bytes| bytes <= largest) =>
                {
                    Some(bytes)
                },
                _ => {
                    return Err(SqsError::invalid_attribute_value(format!(
                        "MaximumMessageSize must be {} to {largest} bytes (api.max_message_bytes), not {text}",
                        crate::queue::MIN_MESSAGE_BYTES_SETTING
                    )));
                },
            },
        };
        let choice = |key: &str, per_queue: &str, per_group: &str| -> Result<Option<bool>, SqsError> {
            match attributes.get(key).map(text_of) {
                None => Ok(None),
                Some(text) if text.trim() == per_queue => Ok(Some(false)),
                Some(text) if text.trim() == per_group => Ok(Some(true)),
                Some(text) => Err(SqsError::invalid_attribute_value(format!(
                    "Invalid value for the parameter {key}: {key} is {per_queue} or {per_group}, not {text}"
                ))),
            }
        };
        let per_group = choice("DeduplicationScope", "queue", "messageGroup")?;
        let throughput_per_group = choice("FifoThroughputLimit", "perQueue", "perMessageGroupId")?;
        Ok(SettingsChange {
            per_group,
            throughput_per_group,
            visibility,
            wait,
            redrive,
            content,
            policy,
            max_message_bytes,
            delay,
            retention,
            kms_key,
            kms_reuse,
        })
    }

    fn is_empty(&self) -> bool {
        self.visibility.is_none()
            && self.wait.is_none()
            && self.redrive.is_none()
            && self.content.is_none()
            && self.policy.is_none()
            && self.max_message_bytes.is_none()
            && self.delay.is_none()
            && self.retention.is_none()
            && self.kms_key.is_none()
            && self.kms_reuse.is_none()
            && self.per_group.is_none()
            && self.throughput_per_group.is_none()
    }

    fn apply(&self, mut settings: QueueSettings) -> QueueSettings {
        if let Some(content) = self.content {
            settings.content_deduplication = Some(content);
        }
        if let Some(visibility) = self.visibility {
            settings.visibility_seconds = visibility;
        }
        if let Some(wait) = self.wait {
            settings.receive_wait_seconds = wait;
        }
        if let Some((target, max)) = self.redrive.clone() {
            settings.dead_letter = target;
            settings.max_deliveries = max;
        }
        if let Some(policy) = self.policy.clone() {
            settings.policy = policy;
        }
        if let Some(bytes) = self.max_message_bytes {
            settings.max_message_bytes = Some(bytes);
        }
        if let Some(delay) = self.delay {
            settings.delay_seconds = delay.filter(|d| *d > 0);
        }
        if let Some(retention) = self.retention {
            settings.retention_seconds = retention;
        }
        if let Some(key) = self.kms_key.clone() {
            settings.kms_master_key_id = key;
        }
        if let Some(reuse) = self.kms_reuse {
            settings.kms_data_key_reuse_seconds = reuse;
        }
        if let Some(per_group) = self.per_group {
            settings.deduplication_per_group = Some(per_group);
        }
        if let Some(per_group) = self.throughput_per_group {
            settings.throughput_per_group = Some(per_group);
        }
        settings
    }
}

/// What a queue `CreateQueue` makes has unless its attributes say otherwise: SQS's four days of
/// retention.
fn sqs_defaults() -> QueueSettings {
    QueueSettings { retention_seconds: Some(DEFAULT_RETENTION_SECONDS), ..QueueSettings::default() }
}

/// What a refused setting says in SQS.
fn settings_error(err: QueueError) -> SqsError {
    match err {
        QueueError::InvalidParameter(message) => SqsError::invalid_attribute_value(message),
        other => other.into(),
    }
}

/// Makes the queue, or finds it existing with the attributes given (SQS answers
/// `QueueAlreadyExists` for one whose attributes differ). Everything is checked before anything
/// is written, and the queue's node and settings are written in one transaction
/// (`QueueService::create`): a refused call leaves nothing behind, and of two calls with
/// different attributes one makes the queue and the other is told it exists.
pub(super) async fn create_queue(ctx: &Ctx<'_>, input: CreateQueueInput) -> Result<QueueUrlOutput, SqsError> {
    let name = sqs_queue_name(&required(input.queue_name, "QueueName")?)?;
    super::tags::check_tags(&input.tags)?;
    let queue = ctx.state.door.queues().queue(&name, Purpose::Serve).await?;
    let given = given(ctx, &queue, &input.attributes, true)?;
    let (queue, created) =
        ctx.state.door.queues().create(&name, given.change.apply(sqs_defaults())).await.map_err(settings_error)?;
    if !created.made {
        let served = served(ctx, &queue, &created.settings);
        for (key, text) in &given.settable {
            let now = served.iter().find(|(name, _)| name == key).map_or("", |(_, value)| value.as_str());
            if !same(now, text) {
                return Err(SqsError::queue_exists(format!(
                    "queue {} has {key} = {now} already, not {text}",
                    queue.name()
                )));
            }
        }
    }
    super::tags::add_tags(ctx, &name, input.tags).await?;
    Ok(QueueUrlOutput { queue_url: ctx.queue_url(name.as_str()) })
}

/// SQS's rule for the name `CreateQueue` gives a queue, in its own words.
const SQS_NAME_RULE: &str = "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length";

/// A queue name as SQS makes one: 1 to 80 characters, letters, digits, `-` and `_`, a FIFO
/// queue's ending in `.fifo` (counted). Stricter than zkq's own names, so every queue made over
/// SQS can be named by every SQS client.
fn sqs_queue_name(text: &str) -> Result<QueueName, SqsError> {
    let base = text.strip_suffix(".fifo").unwrap_or(text);
    let sqs_name = (1..=80).contains(&text.len())
        && !base.is_empty()
        && base.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !sqs_name {
        return Err(SqsError::invalid_parameter(SQS_NAME_RULE));
    }
    text.parse().map_err(|_| SqsError::invalid_parameter(SQS_NAME_RULE))
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListQueuesInput {
    queue_name_prefix: Option<String>,
    next_token: Option<String>,
    #[serde(default, deserialize_with = "number")]
    max_results: Option<i64>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListQueuesOutput {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    queue_urls: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_token: Option<String>,
}

/// The queues this zkq has open (every declared one, and dynamic ones in use), by name.
pub(super) fn list_queues(ctx: &Ctx<'_>, input: ListQueuesInput) -> Result<ListQueuesOutput, SqsError> {
    let max = bounded("MaxResults", input.max_results, 1, 1000)?;
    let prefix = input.queue_name_prefix.unwrap_or_default();
    let after = input.next_token.unwrap_or_default();
    let mut names: Vec<String> = ctx.state.config.queues.keys().map(|n| n.to_string()).collect();
    names.extend(ctx.state.door.queues().opened().iter().filter(|q| q.listed()).map(|q| q.name().to_string()));
    names.sort();
    names.dedup();
    let mut matching = names.into_iter().filter(|n| n.starts_with(&prefix) && n.as_str() > after.as_str());
    let limit = usize::try_from(max.unwrap_or(1000)).unwrap_or(1000);
    let page: Vec<String> = matching.by_ref().take(limit).collect();
    let next_token = match (max, matching.next()) {
        (Some(_), Some(_)) => page.last().cloned(),
        _ => None,
    };
    Ok(ListQueuesOutput { queue_urls: page.iter().map(|n| ctx.queue_url(n)).collect(), next_token })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct QueueUrlInput {
    queue_url: Option<String>,
}

/// Removes every message, those in flight too, before it answers (SQS answers first and purges
/// within a minute; zkq's purge is done, or as far as its deadline let it go, when it answers).
pub(super) async fn purge_queue(ctx: &Ctx<'_>, input: QueueUrlInput) -> Result<Empty, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let queue = ctx.existing(&url).await?;
    let purged = queue.purge(crate::queue::Purge::All).await?;
    if !purged.complete {
        return Err(SqsError::server_unavailable(format!(
            "the purge removed {} messages before its deadline; purge again for the rest",
            purged.removed
        )));
    }
    Ok(Empty {})
}

/// Deletes the queue (`QueueService::delete`); a queue declared in zkq's configuration is
/// refused with `InvalidParameterValue`.
pub(super) async fn delete_queue(ctx: &Ctx<'_>, input: QueueUrlInput) -> Result<Empty, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let name = Ctx::name_of(&url)?;
    let deleted = ctx.state.door.queues().delete(&name).await?;
    if !deleted.complete {
        return Err(SqsError::server_unavailable(format!(
            "the delete removed {} messages before its deadline; delete again for the rest",
            deleted.removed
        )));
    }
    Ok(Empty {})
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct GetQueueAttributesInput {
    queue_url: Option<String>,
    #[serde(default)]
    attribute_names: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct AttributesOutput {
    #[serde(skip_serializing_if = "Map::is_empty")]
    attributes: Map<String, Value>,
}

/// Every queue attribute name AWS knows: asked for by name, each is answered when the queue has
/// it (`KmsMasterKeyId` of a queue zkq never encrypts is left out, as AWS leaves out an unset one);
/// any other name fails the call.
const QUEUE_ATTRIBUTES: [&str; 21] = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "VisibilityTimeout",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "DelaySeconds",
    "ReceiveMessageWaitTimeSeconds",
    "QueueArn",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "Policy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
];

pub(super) async fn get_queue_attributes(
    ctx: &Ctx<'_>,
    input: GetQueueAttributesInput,
) -> Result<AttributesOutput, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let all = input.attribute_names.iter().any(|n| n == "All");
    if let Some(unknown) = input.attribute_names.iter().find(|n| *n != "All" && !QUEUE_ATTRIBUTES.contains(&n.as_str()))
    {
        return Err(SqsError::invalid_attribute_name(format!("Unknown Attribute {unknown}.")));
    }
    let queue = ctx.existing(&url).await?;
    let info = queue.info().await?;
    // Known while this sidecar follows the queue's events; else none are counted as delayed.
    let delayed = info.delayed.unwrap_or(0);
    let name = queue.name().to_string();
    let mut values: Vec<(&str, String)> = vec![
        ("ApproximateNumberOfMessages", (info.depth - info.in_flight - delayed).max(0).to_string()),
        ("ApproximateNumberOfMessagesNotVisible", info.in_flight.to_string()),
        ("ApproximateNumberOfMessagesDelayed", delayed.to_string()),
        ("QueueArn", ctx.queue_arn(&name)),
    ];
    values.extend(served(ctx, &queue, &queue.settings()));
    if let Some(times) = ctx.state.door.queues().timestamps(queue.name()).await? {
        // Epoch seconds, as AWS answers them.
        values.push(("CreatedTimestamp", (times.created_ms / 1000).to_string()));
        values.push(("LastModifiedTimestamp", (times.modified_ms / 1000).to_string()));
    }
    let attributes = values
        .into_iter()
        .filter(|(key, _)| all || input.attribute_names.iter().any(|n| n == key))
        .map(|(key, value)| (key.to_owned(), Value::String(value)))
        .collect();
    Ok(AttributesOutput { attributes })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct SetQueueAttributesInput {
    queue_url: Option<String>,
    #[serde(default)]
    attributes: Map<String, Value>,
}

/// Sets a dynamic queue's settable attributes ([`SETTABLE`]); any other attribute is accepted
/// only when it says what the queue already is.
pub(super) async fn set_queue_attributes(ctx: &Ctx<'_>, input: SetQueueAttributesInput) -> Result<Empty, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let queue = ctx.existing(&url).await?;
    let change = given(ctx, &queue, &input.attributes, false)?.change;
    if change.is_empty() {
        return Ok(Empty {});
    }
    ctx.state
        .door
        .queues()
        .set_settings(queue.name(), |settings| Ok(change.apply(settings)))
        .await
        .map_err(settings_error)?;
    Ok(Empty {})
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListDeadLetterSourcesInput {
    queue_url: Option<String>,
    #[serde(rename = "NextToken")]
    _next_token: Option<String>,
    #[serde(default, rename = "MaxResults", deserialize_with = "number")]
    _max_results: Option<i64>,
}

#[derive(Serialize)]
pub(super) struct DeadLetterSourcesOutput {
    #[serde(rename = "queueUrls")]
    queue_urls: Vec<String>,
}

/// The declared queues whose `dead_letter` is this queue.
pub(super) async fn list_dead_letter_sources(
    ctx: &Ctx<'_>,
    input: ListDeadLetterSourcesInput,
) -> Result<DeadLetterSourcesOutput, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let queue = ctx.existing(&url).await?;
    let sources = ctx.state.door.queues().dead_letter_sources(queue.name()).await?;
    let queue_urls = sources.iter().map(|name| ctx.queue_url(name.as_str())).collect();
    Ok(DeadLetterSourcesOutput { queue_urls })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_are_read_in_any_case_and_nothing_else_is_one() {
        for (text, value) in [("true", true), ("True", true), ("TRUE", true), (" false ", false), ("False", false)] {
            assert_eq!(boolean(text), Some(value), "{text:?}");
        }
        for text in ["", "1", "yes", "tru", "truefalse"] {
            assert_eq!(boolean(text), None, "{text:?}");
        }
        assert!(same("true", "True") && same("false", "FALSE"));
        assert!(!same("true", "False") && !same("0", "false"));
    }

    #[test]
    fn create_queue_takes_sqs_names_only() {
        for name in ["a", "name_with_underscores", "Name-with_all_the_THings", "jobs.fifo", &"p".repeat(80)] {
            assert!(sqs_queue_name(name).is_ok(), "{name}");
        }
        let long_fifo = format!("{}.fifo", "p".repeat(76));
        assert!(sqs_queue_name(&long_fifo).is_err(), "81 characters with the suffix");
        for name in ["", &"p".repeat(81), "/my/test", "!@£$%^&*()queue", "a.b", ".fifo", "x.fifo.fifo"] {
            let err = sqs_queue_name(name).err().unwrap_or_else(|| panic!("{name:?} was taken"));
            assert_eq!((err.code, err.message.as_str()), ("InvalidParameterValue", SQS_NAME_RULE), "{name:?}");
        }
    }
}
