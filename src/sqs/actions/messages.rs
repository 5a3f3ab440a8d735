//! The message actions: send, receive, delete and change visibility, one or a batch, and message
//! attributes as SQS writes them.

use std::collections::HashSet;
use std::time::Duration;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::Digest;

use super::batch::{BatchError, BatchInput, BatchOutput, check_batch};
use super::{Ctx, bounded, is_fifo, number, required, seconds};
use crate::config::{BinaryBodies, QueueKind};
use crate::queue::attributes;
use crate::queue::{
    AttributeValue, ItemMeta, LeaseGrant, Message, MessageAttributes, NackMode, PutOptions, QueueRef, QueueSettings,
};
use crate::sqs::error::SqsError;
use crate::types::{Traceparent, now_epoch_ms};

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct SendMessageInput {
    queue_url: Option<String>,
    #[serde(flatten)]
    message: MessageEntry,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct MessageEntry {
    #[serde(default)]
    id: Option<String>,
    message_body: Option<String>,
    #[serde(default, deserialize_with = "number")]
    delay_seconds: Option<i64>,
    #[serde(default)]
    message_attributes: Option<Map<String, Value>>,
    #[serde(default)]
    message_system_attributes: Option<Map<String, Value>>,
    message_group_id: Option<String>,
    message_deduplication_id: Option<String>,
}

impl MessageEntry {
    /// The entry's size as SQS counts it against a batch's limit, before it is parsed: its body,
    /// and each attribute's name, type and value (a binary one decoded from its base64).
    fn bytes(&self) -> usize {
        let text = |value: &Value, key: &str| value.get(key).and_then(Value::as_str).map_or(0, str::len);
        let attributes = self.message_attributes.iter().flatten().map(|(name, value)| {
            let binary = text(value, "BinaryValue") / 4 * 3;
            name.len() + text(value, "DataType") + text(value, "StringValue") + binary
        });
        attributes.fold(self.message_body.as_ref().map_or(0, String::len), usize::saturating_add)
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct SendMessageOutput {
    #[serde(rename = "MD5OfMessageBody")]
    md5_of_message_body: String,
    #[serde(rename = "MD5OfMessageAttributes", skip_serializing_if = "Option::is_none")]
    md5_of_message_attributes: Option<String>,
    message_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    sequence_number: Option<String>,
}

/// A FIFO queue's `SequenceNumber` of the message in node `node`: the order ZooKeeper stored it in
/// (`queue::order_of`), 29 digits wide, so that text order is number order.
fn sequence_number(fifo: bool, node: &str) -> Option<String> {
    fifo.then(|| crate::queue::order_of(node)).flatten().map(|order| format!("{order:029}"))
}

/// `MD5OfMessageAttributes`, when there are attributes.
fn attributes_md5(attributes: &MessageAttributes) -> Option<String> {
    (!attributes.is_empty()).then(|| attributes::md5_hex(attributes))
}

fn md5_hex(bytes: &[u8]) -> String {
    format!("{:x}", md5::compute(bytes))
}

/// The body and put options of one message to send to `queue`, whose settings are `own` (read
/// once per call). `largest`: the queue's `MaximumMessageSize` (`queues::largest_message`), which
/// the body and the attributes (names, types and values) fit, as SQS counts them.
fn prepare(
    entry: MessageEntry,
    queue: &QueueRef,
    own: &QueueSettings,
    largest: usize,
) -> Result<(String, PutOptions), SqsError> {
    let body = required(entry.message_body, "MessageBody")?;
    if body.is_empty() {
        return Err(SqsError::invalid_parameter("MessageBody must not be empty"));
    }
    if let Some(bad) = body.chars().find(|c| !is_sqs_char(*c)) {
        return Err(SqsError::invalid_message_contents(format!(
            "the message body holds character U+{:04X}, which SQS does not allow",
            u32::from(bad)
        )));
    }
    let traceparent = trace_header(entry.message_system_attributes.unwrap_or_default())?;
    let attributes = message_attributes(entry.message_attributes.unwrap_or_default())?;
    let size = attributes.iter().fold(body.len(), |size, (name, value)| {
        let value_len = value.string.as_ref().map_or(0, String::len) + value.binary.as_ref().map_or(0, Vec::len);
        size.saturating_add(name.len() + value.data_type.len() + value_len)
    });
    if size > largest {
        return Err(SqsError::message_too_long(largest));
    }
    // A message's own DelaySeconds, else its queue's. A delay queue's messages and a standard
    // queue's (a plain fifo queue in zkq) wait; a FIFO queue's names hold the group, not a time.
    let delay = match bounded("DelaySeconds", entry.delay_seconds, 0, 900)? {
        Some(delay) => delay,
        None => own.delay_seconds.map_or(0, |d| i64::try_from(d).unwrap_or(900)),
    };
    let timed = queue.kind() == QueueKind::Delay || (queue.kind() == QueueKind::Fifo && !queue.grouped());
    let deliver_at = match delay {
        0 => None,
        delay if timed => Some(now_epoch_ms() + delay * 1000),
        delay if is_fifo(queue.name()) => {
            // As SQS refuses a message's own delay on a FIFO queue.
            return Err(SqsError::invalid_parameter(format!(
                "Value {delay} for parameter DelaySeconds is invalid. Reason: The request include parameter that \
                 is not valid for this queue type."
            )));
        },
        _ => {
            return Err(SqsError::invalid_parameter(format!(
                "DelaySeconds needs a delay queue or a plain fifo one; {} is a grouped {} queue (docs/sqs.md)",
                queue.name(),
                queue.kind().as_str()
            )));
        },
    };
    let mut deduplication = entry.message_deduplication_id;
    if is_fifo(queue.name()) {
        // As SQS: a FIFO queue's message names its group, and is deduplicated by its id or, with
        // ContentBasedDeduplication, by its body's SHA-256.
        if entry.message_group_id.is_none() {
            return Err(SqsError::missing_parameter("MessageGroupId"));
        }
        if deduplication.is_none() {
            if own.content_deduplication != Some(true) {
                return Err(SqsError::invalid_parameter(NO_DEDUPLICATION));
            }
            let digest = sha2::Sha256::digest(body.as_bytes());
            deduplication = Some(digest.iter().map(|b| format!("{b:02x}")).collect());
        }
    }
    // DeduplicationScope = messageGroup: an id is its group's. The group scopes the key as a
    // digest, so that any group keeps it visible ASCII.
    let key_scope = match (&entry.message_group_id, own.deduplication_per_group) {
        (Some(group), Some(true)) => {
            let digest = sha2::Sha256::digest(group.as_bytes());
            Some(digest.iter().take(12).map(|b| format!("{b:02x}")).collect::<String>())
        },
        _ => None,
    };
    let options = PutOptions {
        attributes,
        priority: None,
        deliver_at,
        id: None,
        group: entry.message_group_id,
        wait: Duration::ZERO,
        idempotency_key: deduplication,
        // As SQS: a send that repeats a deduplication id within the window is accepted and not
        // delivered, whatever its body.
        key_alone: true,
        key_scope,
        traceparent,
    };
    Ok((body, options))
}

/// The trace context a message's system attributes carry: SQS's only one, `AWSTraceHeader` (a
/// `String`, an AWS X-Ray trace header), kept as the W3C `traceparent` zkq keeps with a message.
fn trace_header(given: Map<String, Value>) -> Result<Option<Traceparent>, SqsError> {
    let mut traceparent = None;
    for (name, value) in given {
        if name != "AWSTraceHeader" {
            return Err(SqsError::invalid_parameter(format!(
                "Message system attribute name '{name}' is invalid; AWSTraceHeader is the only one"
            )));
        }
        let field = |key: &str| value.get(key).and_then(Value::as_str);
        if field("DataType") != Some("String") {
            return Err(SqsError::invalid_parameter("AWSTraceHeader's DataType must be String"));
        }
        let header = field("StringValue").ok_or_else(|| SqsError::missing_parameter("StringValue"))?;
        let parsed = Traceparent::from_xray(header).map_err(|why| {
            SqsError::invalid_parameter(format!("the AWSTraceHeader {why}; AWS X-Ray: Root=1-…;Parent=…;Sampled=…"))
        })?;
        traceparent = Some(parsed);
    }
    Ok(traceparent)
}

/// Attributes refused, in SQS's words.
fn attributes_refused(err: attributes::InvalidAttributes) -> SqsError {
    use attributes::InvalidAttributes as Invalid;
    SqsError::invalid_parameter(match err {
        Invalid::TooMany(count) => {
            format!(
                "Number of message attributes [{count}] exceeds the allowed maximum [{}].",
                attributes::MAX_ATTRIBUTES
            )
        },
        Invalid::Name(name) => format!(
            "The message attribute name '{name}' is invalid. Attribute name can contain A-Z, a-z, 0-9, underscore \
             (_), hyphen (-), and period (.) characters."
        ),
        Invalid::DataType { name, .. } => format!(
            "The message attribute '{name}' has an invalid message attribute type, the set of supported type \
             prefixes is Binary, Number, and String."
        ),
        Invalid::Value { name, base } => format!(
            "The message attribute '{name}' must contain non-empty message attribute value for message attribute \
             type '{base}'."
        ),
    })
}

/// A request's `MessageAttributes` (the JSON protocol's shape: name → `DataType` and
/// `StringValue` or base64 `BinaryValue`), checked as SQS checks them.
fn message_attributes(given: Map<String, Value>) -> Result<MessageAttributes, SqsError> {
    let mut attributes = MessageAttributes::new();
    for (name, value) in given {
        let field = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        if value.get("StringListValues").is_some() || value.get("BinaryListValues").is_some() {
            return Err(SqsError::invalid_parameter(format!(
                "attribute {name}: list values are reserved by SQS and not supported"
            )));
        }
        let binary =
            match field("BinaryValue") {
                Some(text) => Some(base64::engine::general_purpose::STANDARD.decode(text).map_err(|_| {
                    SqsError::invalid_parameter(format!("attribute {name}: BinaryValue is not base64"))
                })?),
                None => None,
            };
        let data_type = field("DataType").ok_or_else(|| {
            SqsError::invalid_parameter(format!(
                "The message attribute '{name}' must contain non-empty message attribute type."
            ))
        })?;
        attributes.insert(name, AttributeValue { data_type, string: field("StringValue"), binary });
    }
    attributes::check(&attributes).map_err(attributes_refused)?;
    Ok(attributes)
}

/// The attributes of `attributes` that `names` ask for (`All`, `*`, `.*`, `prefix.*` or a name),
/// as the JSON protocol writes them.
fn requested_attributes(attributes: &MessageAttributes, names: &[String]) -> MessageAttributes {
    let wanted = |name: &str| {
        names.iter().any(|n| {
            matches!(n.as_str(), "All" | "*" | ".*")
                || n == name
                || n.strip_suffix(".*").is_some_and(|prefix| name.starts_with(prefix))
        })
    };
    attributes.iter().filter(|(name, _)| wanted(name)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn attributes_json(attributes: &MessageAttributes) -> Map<String, Value> {
    attributes
        .iter()
        .map(|(name, value)| {
            let mut out = Map::new();
            out.insert("DataType".to_owned(), Value::String(value.data_type.clone()));
            if let Some(text) = &value.string {
                out.insert("StringValue".to_owned(), Value::String(text.clone()));
            }
            if let Some(bytes) = &value.binary {
                out.insert(
                    "BinaryValue".to_owned(),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
                );
            }
            (name.clone(), Value::Object(out))
        })
        .collect()
}

/// The characters SQS accepts in a body: #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD |
/// #x10000 to #x10FFFF.
fn is_sqs_char(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// The SQS `MessageId` of the message in node `node` of the queue at `queue_path`: a UUID (version
/// 8, name-based) of the node's full path. A queue's node names never repeat (a deleted queue's node
/// is kept, so its successor goes on numbering: `queue::catalog`) and two queues never share a path,
/// so the id is unique across queues and incarnations, and every sidecar computes the same one for
/// the send and for every receive of the message. zkq's own API names the message by its node name.
fn sqs_message_id(queue_path: &str, node: &str) -> String {
    let digest = sha2::Sha256::new()
        .chain_update(queue_path.as_bytes())
        .chain_update(b"/")
        .chain_update(node.as_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(digest.get(..16).unwrap_or(&[0; 16]));
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let part = |range: std::ops::Range<usize>| hex.get(range).unwrap_or_default().to_owned();
    format!("{}-{}-{}-{}-{}", part(0..8), part(8..12), part(12..16), part(16..20), part(20..32))
}

pub(super) async fn send_message(ctx: &Ctx<'_>, input: SendMessageInput) -> Result<SendMessageOutput, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let queue = ctx.existing(&url).await?;
    let own = queue.settings();
    let largest = super::queues::largest_message(&ctx.state.config, &own);
    let (body, options) = prepare(input.message, &queue, &own, largest)?;
    let md5_of_message_attributes = attributes_md5(&options.attributes);
    let receipt = queue.put(body.as_bytes(), options).await.map_err(|err| match err {
        // One message: SQS's error for a body too long, not a batch's.
        crate::queue::QueueError::TooLarge { max, .. } => SqsError::message_too_long(max),
        other => other.into(),
    })?;
    let fifo = is_fifo(queue.name());
    Ok(SendMessageOutput {
        md5_of_message_body: md5_hex(body.as_bytes()),
        md5_of_message_attributes,
        sequence_number: receipt.message_id.as_deref().and_then(|node| sequence_number(fifo, node)),
        message_id: receipt.message_id.map(|node| sqs_message_id(queue.path(), &node)).unwrap_or_default(),
    })
}

/// A FIFO message with no deduplication id, on a queue that does not deduplicate by content.
const NO_DEDUPLICATION: &str =
    "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly";

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct SentEntry {
    id: String,
    message_id: String,
    #[serde(rename = "MD5OfMessageBody")]
    md5_of_message_body: String,
    #[serde(rename = "MD5OfMessageAttributes", skip_serializing_if = "Option::is_none")]
    md5_of_message_attributes: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sequence_number: Option<String>,
}

/// Every valid entry is stored in one transaction, all or none; an invalid one fails alone.
pub(super) async fn send_message_batch(
    ctx: &Ctx<'_>,
    input: BatchInput<MessageEntry>,
) -> Result<BatchOutput<SentEntry>, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    check_batch(input.entries.iter().map(|e| e.id.as_deref().unwrap_or("")), "SendMessageBatchRequestEntry")?;
    // As SQS: entries larger than the batch limit together refuse the whole request, before any
    // entry is judged alone.
    let sent = input.entries.iter().map(MessageEntry::bytes).fold(0, usize::saturating_add);
    let limit = ctx.state.config.api.max_batch_bytes;
    if sent > limit {
        return Err(SqsError::batch_too_long(limit, sent));
    }
    let queue = ctx.existing(&url).await?;
    // As SQS: on a FIFO queue, an entry without a group, or without a deduplication id where the
    // queue does not deduplicate by content, refuses the whole batch (the other checks fail an
    // entry alone).
    let own = queue.settings();
    if is_fifo(queue.name()) {
        if input.entries.iter().any(|entry| entry.message_group_id.is_none()) {
            return Err(SqsError::missing_parameter("MessageGroupId"));
        }
        let by_content = own.content_deduplication == Some(true);
        if !by_content && input.entries.iter().any(|entry| entry.message_deduplication_id.is_none()) {
            return Err(SqsError::invalid_parameter(NO_DEDUPLICATION));
        }
    }
    let mut failed = Vec::new();
    let mut valid = Vec::new();
    let largest = super::queues::largest_message(&ctx.state.config, &own);
    for entry in input.entries {
        let id = entry.id.clone().unwrap_or_default();
        match prepare(entry, &queue, &own, largest) {
            Ok((body, options)) => valid.push((id, body, options)),
            Err(err) => failed.push(BatchError::of(id, err)),
        }
    }
    // Entries that repeat an earlier entry's deduplication id (or, under content-based
    // deduplication, its body) are duplicates, as SQS takes them: stored once, each answered
    // with the first one's MessageId, whatever its body.
    let mut first_with_key: std::collections::HashMap<(Option<String>, String), usize> =
        std::collections::HashMap::new();
    let mut unique: Vec<(String, String, PutOptions)> = Vec::with_capacity(valid.len());
    let mut duplicates: Vec<(String, String, PutOptions, usize)> = Vec::new();
    for (id, body, options) in valid {
        let scoped = options.idempotency_key.clone().map(|key| (options.key_scope.clone(), key));
        match scoped.as_ref().and_then(|key| first_with_key.get(key).copied()) {
            Some(first) => duplicates.push((id, body, options, first)),
            None => {
                if let Some(key) = scoped {
                    first_with_key.insert(key, unique.len());
                }
                unique.push((id, body, options));
            },
        }
    }
    let fifo = is_fifo(queue.name());
    let entry = |id: String, body: &str, options: &PutOptions, node: Option<&String>| SentEntry {
        id,
        message_id: node.map(|node| sqs_message_id(queue.path(), node)).unwrap_or_default(),
        md5_of_message_body: md5_hex(body.as_bytes()),
        md5_of_message_attributes: attributes_md5(&options.attributes),
        sequence_number: node.and_then(|node| sequence_number(fifo, node)),
    };
    let mut successful = Vec::with_capacity(unique.len() + duplicates.len());
    if !unique.is_empty() {
        let messages = unique.iter().map(|(_, body, options)| (body.as_bytes(), options.clone())).collect();
        match queue.put_many(messages, Duration::ZERO).await {
            Ok(receipts) => {
                let nodes: Vec<Option<String>> = receipts.into_iter().map(|receipt| receipt.message_id).collect();
                for (id, body, options, first) in duplicates {
                    successful.push(entry(id, &body, &options, nodes.get(first).and_then(Option::as_ref)));
                }
                for ((id, body, options), node) in unique.into_iter().zip(&nodes) {
                    successful.push(entry(id, &body, &options, node.as_ref()));
                }
            },
            Err(err) => {
                let err = SqsError::from(err);
                let ids = unique.into_iter().map(|(id, ..)| id).chain(duplicates.into_iter().map(|(id, ..)| id));
                failed.extend(ids.map(|id| BatchError::of(id, err.clone())));
            },
        }
    }
    Ok(BatchOutput { successful, failed })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ReceiveMessageInput {
    queue_url: Option<String>,
    #[serde(default, deserialize_with = "number")]
    max_number_of_messages: Option<i64>,
    #[serde(default, deserialize_with = "number")]
    visibility_timeout: Option<i64>,
    #[serde(default, deserialize_with = "number")]
    wait_time_seconds: Option<i64>,
    #[serde(default)]
    attribute_names: Vec<String>,
    #[serde(default)]
    message_system_attribute_names: Vec<String>,
    #[serde(default)]
    message_attribute_names: Vec<String>,
    #[serde(rename = "ReceiveRequestAttemptId")]
    _attempt: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ReceiveMessageOutput {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    messages: Vec<ReceivedMessage>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ReceivedMessage {
    message_id: String,
    receipt_handle: String,
    #[serde(rename = "MD5OfBody")]
    md5_of_body: String,
    body: String,
    #[serde(skip_serializing_if = "Map::is_empty")]
    attributes: Map<String, Value>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    message_attributes: Map<String, Value>,
    #[serde(rename = "MD5OfMessageAttributes", skip_serializing_if = "Option::is_none")]
    md5_of_message_attributes: Option<String>,
}

/// The system attributes zkq knows of a delivery.
const SYSTEM_ATTRIBUTES: [&str; 4] =
    ["ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp", "SentTimestamp", "MessageGroupId"];

/// What a received message's system attributes say of its queue and sender: the queue's path and
/// whether it is grouped and a FIFO queue; `SenderId`, the account of the listener
/// (`sqs.account_id`), as zkq does not know who put a message.
struct Origin<'a> {
    queue_path: &'a str,
    grouped: bool,
    fifo: bool,
    sender: &'a str,
}

fn received(
    message: Message,
    grant: &LeaseGrant,
    (wanted, attribute_names): (&HashSet<&str>, &[String]),
    origin: &Origin<'_>,
) -> ReceivedMessage {
    let chosen = requested_attributes(&message.attributes, attribute_names);
    // A body that is not SQS text (a Curator producer's bytes) is delivered base64-encoded, never
    // altered (a queue that refuses such bodies never gets here with one: see `sqs_text`).
    let body = match String::from_utf8(message.body) {
        Ok(text) if text.chars().all(is_sqs_char) => text,
        Ok(text) => base64::engine::general_purpose::STANDARD.encode(text.as_bytes()),
        Err(err) => base64::engine::general_purpose::STANDARD.encode(err.as_bytes()),
    };
    let all = wanted.contains("All");
    let mut attributes = Map::new();
    let mut add = |name: &str, value: String| {
        if all || wanted.contains(name) {
            attributes.insert(name.to_owned(), Value::String(value));
        }
    };
    add("ApproximateReceiveCount", grant.delivery_count.to_string());
    add("SentTimestamp", grant.created_at_ms.to_string());
    add("ApproximateFirstReceiveTimestamp", grant.first_delivered_at_ms.to_string());
    add("SenderId", origin.sender.to_owned());
    if let (true, ItemMeta::Id(group)) = (origin.grouped, &message.meta) {
        add("MessageGroupId", group.clone());
    }
    if let Some(sequence) = sequence_number(origin.fifo, &message.message_id) {
        add("SequenceNumber", sequence);
    }
    if let Some(trace) = &message.traceparent {
        add("AWSTraceHeader", trace.to_xray());
    }
    if let (true, Some(id)) = (origin.fifo, &message.deduplication_id) {
        add("MessageDeduplicationId", id.clone());
    }
    ReceivedMessage {
        message_id: sqs_message_id(origin.queue_path, &message.message_id),
        receipt_handle: grant.receipt.to_string(),
        md5_of_body: md5_hex(body.as_bytes()),
        body,
        attributes,
        message_attributes: attributes_json(&chosen),
        md5_of_message_attributes: attributes_md5(&chosen),
    }
}

pub(super) async fn receive_message(
    ctx: &Ctx<'_>,
    input: ReceiveMessageInput,
) -> Result<ReceiveMessageOutput, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let max = bounded("MaxNumberOfMessages", input.max_number_of_messages, 1, 10)?.unwrap_or(1);
    let wait = bounded("WaitTimeSeconds", input.wait_time_seconds, 0, 20)?;
    let lease = &ctx.state.config.lease;
    let longest = i64::try_from(lease.max_visibility.as_secs()).unwrap_or(43_200);
    let visibility = bounded("VisibilityTimeout", input.visibility_timeout, 0, 43_200.min(longest))?;
    let names: Vec<&str> =
        input.attribute_names.iter().chain(&input.message_system_attribute_names).map(String::as_str).collect();
    if let Some(unknown) = names.iter().find(|n| {
        !n.starts_with("Approximate")
            && **n != "All"
            && !SYSTEM_ATTRIBUTES.contains(n)
            && !matches!(**n, "SenderId" | "SequenceNumber" | "MessageDeduplicationId" | "AWSTraceHeader")
    }) {
        return Err(SqsError::invalid_attribute_name(format!("unknown attribute name {unknown}")));
    }
    let wanted: HashSet<&str> = names.into_iter().collect();
    let queue = ctx.existing(&url).await?;
    // Unsaid, the queue's own settings (a dynamic queue's `SetQueueAttributes`) or zkq's defaults.
    let own = queue.settings();
    let wait = wait.map_or_else(|| Duration::from_secs(own.receive_wait_seconds.unwrap_or(0)), seconds);
    // Unsaid, the queue's own `VisibilityTimeout`, else zkq's default.
    let visibility = visibility.or_else(|| own.visibility_seconds.and_then(|s| i64::try_from(s).ok()));
    // Visible again at once, as in SQS: leased for the shortest time there is, and released as
    // soon as it is read (should the release fail, the lease ends after its second).
    let release_at_once = visibility == Some(0);
    let visibility = match visibility {
        Some(0) => Duration::from_secs(1),
        Some(seconds_) => seconds(seconds_),
        None => lease.default_visibility,
    }
    .clamp(Duration::from_secs(1), lease.max_visibility);
    let max = usize::try_from(max).unwrap_or(1);
    let leased = lease_text(ctx, &queue, wait, visibility, max).await?;
    let origin = Origin {
        queue_path: queue.path(),
        grouped: queue.grouped(),
        fifo: is_fifo(queue.name()),
        sender: &ctx.state.config.sqs.account_id,
    };
    let names = &input.message_attribute_names;
    if release_at_once {
        let releases = leased.iter().map(|(_, grant)| queue.nack(grant.receipt, NackMode::Keep, Duration::ZERO));
        for released in futures::future::join_all(releases).await {
            if let Err(err) = released {
                tracing::debug!(queue = %queue.name(), error = %err, "a VisibilityTimeout=0 receive's release failed; its lease ends in a second");
            }
        }
    }
    let messages =
        leased.into_iter().map(|(message, grant)| received(message, &grant, (&wanted, names), &origin)).collect();
    Ok(ReceiveMessageOutput { messages })
}

/// Whether `body` is SQS text: UTF-8 of characters SQS allows.
fn sqs_text(body: &[u8]) -> bool {
    std::str::from_utf8(body).is_ok_and(|text| text.chars().all(is_sqs_char))
}

/// Leases up to `max` messages for a `ReceiveMessage`, waiting up to `wait` for the first.
///
/// On a queue whose `sqs_binary_bodies` (or `sqs.binary_bodies`) is `refuse`, a leased message
/// whose body is not SQS text is never handed out, and it does not end the long-poll: the
/// receive goes on waiting for a text message. Counted in `zkq_sqs_refused_bodies_total` and
/// logged. A refused message's lease is held while the receive waits (so the long-poll does not
/// lease it again), then ended:
/// - on a queue with a dead-letter queue, released with its delivery counted, one per
///   `ReceiveMessage` that met it, so that after `max_deliveries` such receives it moves there
///   (it can never be received over SQS);
/// - on one without, given back uncounted, in its place, for zkq's own API or a Curator
///   consumer: refusals never grow its delivery count.
async fn lease_text(
    ctx: &Ctx<'_>,
    queue: &QueueRef,
    wait: Duration,
    visibility: Duration,
    max: usize,
) -> Result<Vec<(Message, LeaseGrant)>, SqsError> {
    let config = &ctx.state.config;
    let policy = config.queues.get(queue.name()).and_then(|q| q.sqs_binary_bodies).unwrap_or(config.sqs.binary_bodies);
    if policy != BinaryBodies::Refuse {
        return Ok(queue.lease_many(wait, visibility, (max, usize::MAX), crate::queue::PerGroup::InOrder).await?);
    }
    let started = tokio::time::Instant::now();
    // A held lease must not expire while held (its expiry would count a delivery).
    let until = started + wait.min(visibility.saturating_sub(Duration::from_secs(1)));
    let mut held = Vec::new();
    let result = loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let leased = match queue.lease_many(left, visibility, (max, usize::MAX), crate::queue::PerGroup::InOrder).await
        {
            Ok(leased) => leased,
            Err(err) => break Err(err.into()),
        };
        let (text, refused): (Vec<_>, Vec<_>) = leased.into_iter().partition(|(message, _)| sqs_text(&message.body));
        let none_leased = text.is_empty() && refused.is_empty();
        for (message, grant) in refused {
            ctx.state.metrics.sqs_refused_bodies.inc();
            tracing::warn!(queue = %queue.name(), message = %message.message_id, delivery = grant.delivery_count,
                "a body that is not SQS text was not handed out (sqs_binary_bodies = \"refuse\")");
            held.push(grant.receipt);
        }
        if !text.is_empty() || none_leased || tokio::time::Instant::now() >= until {
            break Ok(text);
        }
    };
    let counted = queue.dead_letter().is_some();
    for receipt in held {
        if !counted {
            queue.give_back_unhanded(receipt).await;
        } else if let Err(err) = queue.nack(receipt, NackMode::Keep, Duration::ZERO).await {
            // Its lease ends by itself at its visibility timeout.
            tracing::warn!(queue = %queue.name(), error = %err,
                "could not release a refused message; it is released when its lease expires");
        }
    }
    result
}
