//! `/v1/queues`: put, take, peek, remove, introspection.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::attributes;
use super::error::{ApiError, ErrorBody, ZookeeperErrors};
use super::extract::{ApiBody, ApiPath, ApiQuery, bounded_duration};
use super::state::AppState;
use super::wire::{KindFields, QueuePath, check_max, delivered, message_response, put_options};

use tokio::time::Instant;

use crate::queue::Purpose;
use crate::queue::{HeadAge, ItemMeta, PutOptions, Queue, QueueError, QueueRef, Taken};
use crate::types::QueueName;
use crate::web::body::HandoverBody;
use crate::web::headers::{HEADER_IDEMPOTENCY_KEY, HEADER_IDEMPOTENT_REPLAY};

/// Path parameters: a queue name and a message id.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct MessagePath {
    #[param(value_type = String)]
    pub queue: QueueName,
    /// The message's node name, as returned by put (`zkq-message-id`). Characters ZooKeeper refuses in
    /// node names are refused (400).
    #[param(min_length = 1, max_length = 400)]
    pub message_id: String,
}

/// Query parameters of a put.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PutQuery {
    /// Priority queues only: lower is delivered first (int32, default 0).
    pub priority: Option<i32>,
    /// Delay queues and plain fifo queues: deliver no earlier than this long from now (`30s`, `5m`, or seconds); at most
    /// `api.max_delay` (30 days by default), longer is refused (400).
    pub delay: Option<String>,
    /// Delay queues and plain fifo queues: deliver no earlier than this time, epoch milliseconds. With `delay` too,
    /// the later of the two applies. At most `api.max_delay` from now (400 beyond it).
    #[param(minimum = 1)]
    pub deliver_at: Option<i64>,
    /// Id queues only (required there): the message's id; `/` and `|` are stored as `_`, as Curator does.
    /// Characters ZooKeeper refuses in node names are refused (400): control characters, U+D800–U+F8FF,
    /// U+FFF0 and above.
    pub id: Option<String>,
    /// Grouped queues only (`queues.NAME.grouped`): the message's group. Messages of one group are
    /// delivered one at a time, in put order; groups in parallel. On an id queue the id is the
    /// group. Same characters as `id`; delivered back as the message's `id` (`zkq-id`).
    pub group: Option<String>,
    /// How long to wait for room when the queue is at `max_items` (default 0; longer values are
    /// cut to `take.max_wait`).
    pub wait: Option<String>,
}

/// Query parameters of a take.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TakeQuery {
    /// How long to wait for a message: `20s`, `500ms`, or seconds (default 0; longer values are
    /// cut to `take.max_wait`, 20s by default).
    pub wait: Option<String>,
    /// Take up to this many messages (1 to `api.max_batch`) and answer them as JSON: `wait`
    /// applies to the first, the rest are whatever is there at once.
    pub max: Option<u32>,
}

/// The most messages a peek shows, and how many when it does not say.
pub(super) const MAX_PEEK_LIMIT: i64 = 1000;
const DEFAULT_PEEK_LIMIT: i64 = 10;

/// Query parameters of a peek.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PeekQuery {
    /// How many messages to show (1–1000, default 10). Fewer when their bodies would exceed
    /// `api.max_peek_bytes` (8 MiB by default); the first message is always shown.
    pub limit: Option<i64>,
}

/// Query parameters of a remove-by-id.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RemoveQuery {
    /// Remove every message with this id (id queues); matched after Curator's `/`,`|` → `_`.
    #[param(required = true)]
    pub id: Option<String>,
}

/// Answer to a put.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct PutResponse {
    pub queue: String,
    /// The node name, e.g. `queue-0000000042`. `null` only for a put with an `Idempotency-Key`
    /// whose message was stored but consumed before zkq could record or find its name (after a
    /// lost answer or a crash between the put's two steps).
    #[schema(required = true)]
    pub message_id: Option<String>,
}

/// One queue's description.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct QueueSummary {
    pub name: String,
    /// `fifo`, `priority`, `delay`, `id` or `simple`.
    pub kind: String,
    pub path: String,
    pub lock_path: Option<String>,
    pub max_items: Option<u32>,
    /// Declared in the configuration (false: created on first use).
    pub declared: bool,
    /// Children of the queue node (`numChildren`; foreign nodes included).
    pub depth: i64,
    /// Lock nodes under the lock path: messages being processed.
    pub in_flight: i64,
    /// Long-polling takes waiting on this zkq.
    pub waiting_takers: usize,
    /// Age of the next message to deliver, in milliseconds; null when no message is waiting or
    /// when the age is not known (see `oldest_message_age_known`).
    pub oldest_message_age_ms: Option<i64>,
    /// False when zkq does not know the age yet: right after it opened a deep queue, before its
    /// first read of the child list ended (within the request's deadline), when it may not read the
    /// queue, or when the head was taken while zkq looked. A null age is "no message waiting" only
    /// when this is true.
    pub oldest_message_age_known: bool,
    /// Declared grouped (`queues.NAME.grouped`): one message of a group in flight at a time, in
    /// put order, groups in parallel.
    pub grouped: bool,
    /// Grouped queues, as this zkq sees them (null when not grouped, or not known yet).
    pub groups: Option<GroupsSummary>,
}

/// The groups of a grouped queue.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub(crate) struct GroupsSummary {
    /// Groups with a message in the queue.
    pub groups: usize,
    /// Groups whose first message is being consumed (leased, or being taken).
    pub in_flight: usize,
    /// Messages waiting behind a group's first message that is being consumed.
    pub blocked_messages: usize,
}

/// The queues this zkq has opened, or (with `all=true`) every queue in ZooKeeper.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct QueueList {
    pub queues: Vec<QueueSummary>,
    /// With `all=true`: queues that exist but are not listed (beyond the 1000-queue limit, in a
    /// `{root}/queues` list of more than 100,000 names, or not read before the request's deadline);
    /// 0 otherwise.
    pub omitted: usize,
}

/// Query parameters of the queue list.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// `true`: every queue in ZooKeeper, not only those this zkq has open: the declared queues and
    /// every child of `{root}/queues`, sorted by name. Bounded like `zkq inspect`: at most 1000
    /// queues (declared ones always), child lists of up to 100,000 names, 8 queues read at once,
    /// all within `zookeeper.request_timeout`. A queue this zkq does not have open shows 0
    /// `waiting_takers`; its `kind` is the declared one, or `fifo` (how zkq serves an undeclared queue).
    pub all: Option<bool>,
}

/// One message seen by a peek.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct PeekedMessage {
    pub message_id: String,
    /// Index inside a node written by Curator's `putMulti` (0 otherwise).
    pub item_index: usize,
    pub size: usize,
    /// The body, base64 (standard alphabet, padded).
    pub body_base64: String,
    pub priority: Option<i32>,
    pub deliver_at: Option<i64>,
    pub id: Option<String>,
}

/// A peek's answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct PeekResponse {
    pub queue: String,
    pub messages: Vec<PeekedMessage>,
}

/// A remove-by-id's answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct RemovedResponse {
    pub removed: usize,
}

/// A purge's answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct PurgedResponse {
    pub queue: String,
    /// Messages removed.
    pub removed: usize,
    /// False when the request's deadline (`zookeeper.request_timeout`) came first: the messages
    /// not reached are still there; purge again.
    pub complete: bool,
}

/// A queue delete's answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct DeletedResponse {
    pub queue: String,
    /// Message nodes deleted.
    pub removed: usize,
    /// False when the request's deadline (`zookeeper.request_timeout`) came first: the queue is
    /// not gone yet; delete again to go on.
    pub complete: bool,
}

/// 400 for text ZooKeeper would refuse in a node name (else it answers an error zkq would report as 502).
fn refuse_characters(name: &str, text: &str) -> Result<(), ApiError> {
    match crate::queue::names::refused_char(text) {
        Some(c) => Err(ApiError::invalid(format!(
            "`{name}` holds {:?} (U+{:04X}), a character ZooKeeper refuses in node names",
            c,
            u32::from(c)
        ))),
        None => Ok(()),
    }
}

/// A queue to read: 404 `queue_not_found` for a dynamic queue that does not exist (nothing is created).
async fn existing(state: &AppState, name: &QueueName) -> Result<QueueRef, ApiError> {
    Ok(state.door.queues().queue(name, Purpose::Look).await?)
}

/// The `Idempotency-Key` of a put, if it sent one: one header of 1–200 bytes of visible ASCII.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(HEADER_IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ApiError::invalid("send one Idempotency-Key header, not several"));
    }
    let key = value.as_bytes();
    if !crate::queue::is_valid_idempotency_key(key) {
        return Err(ApiError::invalid(format!(
            "Idempotency-Key must be 1 to {} bytes of visible ASCII (! to ~), without spaces or control \
             characters; this one has {} bytes",
            crate::queue::MAX_IDEMPOTENCY_KEY_LEN,
            key.len()
        )));
    }
    Ok(Some(String::from_utf8_lossy(key).into_owned()))
}

/// Put a message.
///
/// With an `Idempotency-Key`, the message is stored at most once per key within the queue's
/// idempotency window (`queues.NAME.idempotency_window`, 5 minutes by default): a put with a key
/// seen within the window stores nothing and answers 201 with the first put's `message_id` and
/// `zkq-idempotent-replay: true`, or 409 `idempotency_key_reused` when its body, `priority` or
/// `id` differ. A keyed put whose ZooKeeper answer was lost is settled by zkq before it answers.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/messages", tag = "queues",
    params(
        QueuePath, PutQuery,
        ("Idempotency-Key" = Option<String>, Header, nullable = false,
            description = "Store the message at most once per key within the queue's idempotency window: 1–200 bytes of visible ASCII"),
        ("zkq-attributes" = Option<String>, Header, nullable = false,
            description = "The message's attributes, a JSON object by name of {\"type\": \"String\"|\"Number\"|\"Binary\" (optionally .label), \"value\": \"…\" (Binary: base64)}: up to 10, names of 1–256 letters, digits, _ - and .; kept beside the body (Curator consumers see the body alone); not on simple queues"),
        ("traceparent" = Option<String>, Header, nullable = false,
            description = "W3C Trace Context: kept with the message and handed to its consumer (take, lease, push delivery); not on simple queues"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The message, any bytes (empty allowed), stored verbatim."),
    responses(
        (status = 201, description = "Stored in ZooKeeper (or, with an Idempotency-Key seen within the window, stored by an earlier put)", body = PutResponse,
            headers(("zkq-idempotent-replay" = String, description = "`true` when an earlier put with the same Idempotency-Key stored the message and this one stored nothing"))),
        (status = 400, description = "Bad queue name, parameter, Idempotency-Key, zkq-attributes or traceparent", body = ErrorBody),
        (status = 404, description = "Unknown queue (dynamic queues disabled)", body = ErrorBody),
        (status = 409, description = "A parameter that does not fit the queue's kind, an id queue without `id`, attributes or a traceparent on a simple queue (`parameter_not_for_kind`); an Idempotency-Key used within the window with another body, priority or id (`idempotency_key_reused`)", body = ErrorBody),
        (status = 408, description = "The body did not arrive within api.body_read_timeout of the headers (`request_timeout`); nothing was done", body = ErrorBody),
        (status = 413, description = "Message larger than api.max_message_bytes; or, with an Idempotency-Key, a message that with its key's record would make a ZooKeeper transaction over its request limit, zookeeper.jute_maxbuffer less 4 KiB encoded (with api.max_message_bytes within its bound, only with a very long ACL or root)", body = ErrorBody),
        (status = 429, description = "Queue at max_items", body = ErrorBody, headers(("Retry-After" = u32, description = "Seconds"))),
        ZookeeperErrors,
    )
)]
pub(crate) async fn put_message(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
    ApiQuery(query): ApiQuery<PutQuery>,
    headers: HeaderMap,
    ApiBody(body): ApiBody,
) -> Result<Response, ApiError> {
    let queue = state.door.queues().queue(&path.queue, Purpose::Put).await?;
    let idempotency_key = idempotency_key(&headers)?;
    let wait = bounded_duration("wait", query.wait.as_deref(), state.config.take.max_wait)?;
    let fields = KindFields {
        priority: query.priority,
        delay: query.delay,
        deliver_at: query.deliver_at,
        id: query.id,
        group: query.group,
    };
    let options = PutOptions {
        idempotency_key,
        attributes: attributes::from_header(&headers)?,
        traceparent: attributes::traceparent_from_header(&headers)?,
        ..put_options(&state, fields, wait)?
    };
    let receipt = queue.put(&body, options).await?;
    let body = PutResponse { queue: queue.name().to_string(), message_id: receipt.message_id };
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    if receipt.replay {
        response.headers_mut().insert(HEADER_IDEMPOTENT_REPLAY, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// Take the head message (removes it).
#[utoipa::path(
    post, path = "/v1/queues/{queue}/take", tag = "queues",
    params(QueuePath, TakeQuery),
    responses(
        (status = 200, description = "The message body, raw; with `max`, JSON with up to `max` messages (base64 bodies)",
            content((Vec<u8> = "application/octet-stream"), (super::wire::DeliveredMessages = "application/json")),
            headers(
                ("zkq-message-id" = String, description = "Node name of the message"),
                ("zkq-priority" = i32, description = "Priority queues"),
                ("zkq-deliver-at" = i64, description = "Delay queues: epoch ms"),
                ("zkq-id" = String, description = "Id queues"),
                ("zkq-attributes" = String, description = "The message's attributes, when it has any: a JSON object by name of {type, value} (ASCII, other characters as \\u escapes)"),
                ("traceparent" = String, description = "The W3C trace context its put carried, if any"),
            )),
        (status = 204, description = "No message arrived within `wait` (also for a dynamic queue whose node does not exist yet: nothing is created)"),
        (status = 400, description = "Bad queue name or parameter", body = ErrorBody),
        (status = 404, description = "Undeclared queue with dynamic queues disabled", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn take_message(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
    ApiQuery(query): ApiQuery<TakeQuery>,
) -> Result<Response, ApiError> {
    let wait = bounded_duration("wait", query.wait.as_deref(), state.config.take.max_wait)?;
    let max = query.max.map(|max| check_max(&state, max)).transpose()?;
    let wait_until = Instant::now() + wait;
    // A dynamic queue that does not exist yet is an empty queue to a taker: it waits for the
    // first put (of any sidecar or Curator producer) without creating anything.
    let Some(queue) = state.door.queues().queue_to_take(&path.queue, wait).await? else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let wait = wait_until.saturating_duration_since(Instant::now());
    let Taken { messages, handover } = match max {
        Some(max) => queue.take_many(wait, max, state.config.api.max_batch_bytes).await?,
        None => queue.take(wait).await?,
    };
    let response = match (max, messages.into_iter()) {
        (Some(_), messages) => delivered(messages.map(|message| (message, None)).collect()),
        (None, mut messages) => match messages.next() {
            Some(message) => message_response(message),
            None => StatusCode::NO_CONTENT.into_response(),
        },
    };
    // A grouped take's messages are taken once the answer has left: its body carries them.
    Ok(match handover {
        Some(handover) => HandoverBody::wrap(response, handover),
        None => response,
    })
}

/// Peek at the first messages in delivery order.
#[utoipa::path(
    get, path = "/v1/queues/{queue}/messages", tag = "queues",
    params(QueuePath, PeekQuery),
    responses(
        (status = 200, description = "The first messages, not removed", body = PeekResponse),
        (status = 400, description = "Bad queue name or parameter", body = ErrorBody),
        (status = 404, description = "No such queue: not declared and its node does not exist (reads create nothing), or dynamic queues disabled", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn peek_messages(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
    ApiQuery(query): ApiQuery<PeekQuery>,
) -> Result<Json<PeekResponse>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PEEK_LIMIT);
    if !(1..=MAX_PEEK_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(format!("`limit` = {limit} must be between 1 and {MAX_PEEK_LIMIT}")));
    }
    let queue = existing(&state, &path.queue).await?;
    let items = queue.peek(usize::try_from(limit).unwrap_or(1)).await?;
    let engine = base64::engine::general_purpose::STANDARD;
    let messages = items
        .into_iter()
        .map(|item| PeekedMessage {
            message_id: item.message_id,
            item_index: item.item_index,
            size: item.body.len(),
            body_base64: engine.encode(&item.body),
            priority: match item.meta {
                ItemMeta::Priority(p) => Some(p),
                _ => None,
            },
            deliver_at: match item.meta {
                ItemMeta::DeliverAt(at) => Some(at),
                _ => None,
            },
            id: match item.meta {
                ItemMeta::Id(id) => Some(id),
                _ => None,
            },
        })
        .collect();
    Ok(Json(PeekResponse { queue: queue.name().to_string(), messages }))
}

/// Remove one message by id.
#[utoipa::path(
    delete, path = "/v1/queues/{queue}/messages/{message_id}", tag = "queues",
    params(MessagePath),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Bad queue name, or a message id with characters ZooKeeper refuses", body = ErrorBody),
        (status = 404, description = "No such message (or it is locked by a consumer), or no such queue", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn remove_message(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<MessagePath>,
) -> Result<StatusCode, ApiError> {
    refuse_characters("message_id", &path.message_id)?;
    let queue = existing(&state, &path.queue).await?;
    queue.remove(&path.message_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Purge: remove every message that no consumer holds (leased or locked messages stay), in
/// transactions of up to 64 messages; nodes that are not messages stay too.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/purge", tag = "queues",
    params(QueuePath),
    responses(
        (status = 200, description = "How many were removed, and whether all were reached", body = PurgedResponse),
        (status = 400, description = "Bad queue name", body = ErrorBody),
        (status = 404, description = "No such queue: not declared and its node does not exist (reads create nothing), or dynamic queues disabled", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn purge_queue(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
) -> Result<Json<PurgedResponse>, ApiError> {
    let queue = existing(&state, &path.queue).await?;
    let purged = queue.purge(crate::queue::Purge::Unheld).await?;
    Ok(Json(PurgedResponse { queue: queue.name().to_string(), removed: purged.removed, complete: purged.complete }))
}

/// Delete a dynamic queue: its node marked deleted, then every message (held by a consumer or
/// not), its locks, delivery counts, idempotency records and tags. A put afterwards creates it
/// anew; a message put once it was made anew, while the delete still runs, is not deleted.
/// Every zkq that has it open sees the mark and ends its leases.
#[utoipa::path(
    delete, path = "/v1/queues/{queue}", tag = "queues",
    params(QueuePath),
    responses(
        (status = 200, description = "How many message nodes were deleted, and whether the queue is gone", body = DeletedResponse),
        (status = 400, description = "Bad queue name", body = ErrorBody),
        (status = 404, description = "No such queue: its node does not exist, or dynamic queues disabled", body = ErrorBody),
        (status = 409, description = "The queue is declared in the configuration", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn delete_queue(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
) -> Result<Json<DeletedResponse>, ApiError> {
    let deleted = state.door.queues().delete(&path.queue).await?;
    Ok(Json(DeletedResponse { queue: path.queue.to_string(), removed: deleted.removed, complete: deleted.complete }))
}

/// Remove every message with an id (id queues; Curator's `remove(id)`).
#[utoipa::path(
    delete, path = "/v1/queues/{queue}/messages", tag = "queues",
    params(QueuePath, RemoveQuery),
    responses(
        (status = 200, description = "How many were removed", body = RemovedResponse),
        (status = 400, description = "Bad queue name or missing id", body = ErrorBody),
        (status = 404, description = "No such queue: not declared and its node does not exist (reads create nothing), or dynamic queues disabled", body = ErrorBody),
        (status = 409, description = "Not an id queue", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn remove_by_id(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
    ApiQuery(query): ApiQuery<RemoveQuery>,
) -> Result<Json<RemovedResponse>, ApiError> {
    let Some(id) = query.id.filter(|id| !id.is_empty()) else {
        return Err(ApiError::invalid("give ?id= to remove every message with that id"));
    };
    refuse_characters("id", &id)?;
    let queue = existing(&state, &path.queue).await?;
    let removed = queue.remove_by_id(&id).await?;
    Ok(Json(RemovedResponse { removed }))
}

async fn summary(queue: &Queue) -> Result<QueueSummary, QueueError> {
    let info = queue.info().await?;
    Ok(QueueSummary {
        name: queue.name().to_string(),
        kind: queue.kind().as_str().to_owned(),
        path: queue.path().to_owned(),
        lock_path: queue.lock_path().map(str::to_owned),
        max_items: queue.max_items(),
        declared: queue.declared(),
        depth: info.depth,
        in_flight: info.in_flight,
        waiting_takers: info.waiting_takers,
        oldest_message_age_ms: info.head.age_ms(),
        oldest_message_age_known: info.head != HeadAge::NotKnownYet,
        grouped: queue.grouped(),
        groups: info.groups.map(|g| GroupsSummary {
            groups: g.groups,
            in_flight: g.in_flight,
            blocked_messages: g.blocked,
        }),
    })
}

/// Describe one queue.
#[utoipa::path(
    get, path = "/v1/queues/{queue}", tag = "queues",
    params(QueuePath),
    responses(
        (status = 200, description = "The queue", body = QueueSummary),
        (status = 400, description = "Bad queue name", body = ErrorBody),
        (status = 404, description = "No such queue: not declared and its node does not exist (reads create nothing), or dynamic queues disabled", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn get_queue(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
) -> Result<Json<QueueSummary>, ApiError> {
    let queue = existing(&state, &path.queue).await?;
    Ok(Json(summary(&queue).await?))
}

/// List the queues this zkq serves (declared ones and dynamic ones opened so far), or every queue
/// in ZooKeeper with `all=true`.
#[utoipa::path(
    get, path = "/v1/queues", tag = "queues",
    params(ListQuery),
    responses(
        (status = 200, description = "The queues", body = QueueList),
        (status = 400, description = "Bad parameter", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn list_queues(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<QueueList>, ApiError> {
    if !query.all.unwrap_or(false) {
        let mut queues = Vec::new();
        for queue in state.door.queues().opened() {
            queues.push(summary(&queue).await?);
        }
        return Ok(Json(QueueList { queues, omitted: 0 }));
    }
    list_all_queues(&state).await.map(Json)
}

/// Queues read at once by `GET /v1/queues?all=true`.
const LIST_ALL_IN_FLIGHT: usize = 8;

/// Every declared queue and every child of `{root}/queues`: queues this zkq has open from their own
/// state, the others from the core's bounded survey summary (no node is created, no queue opened).
async fn list_all_queues(state: &AppState) -> Result<QueueList, ApiError> {
    use crate::queue::survey::Surveyed;
    let (surveyed, omitted) = state.door.survey_every_queue(LIST_ALL_IN_FLIGHT).await?;
    let mut queues = Vec::with_capacity(surveyed.len());
    for queue in surveyed {
        queues.push(match queue {
            Surveyed::Open(queue) => summary(&queue).await?,
            Surveyed::Read { location, kind, report } => QueueSummary {
                kind: kind.as_str().to_owned(),
                name: location.name,
                path: location.path,
                lock_path: location.lock_path,
                max_items: None,
                declared: location.declared,
                depth: report.depth,
                in_flight: report.locks.map_or(0, |l| l.held),
                waiting_takers: 0,
                oldest_message_age_ms: report.oldest_message_age_ms,
                oldest_message_age_known: report.oldest_message_age_known,
                grouped: report.grouped,
                // Which heads are in flight is known only to a zkq serving the queue.
                groups: None,
            },
        });
    }
    Ok(QueueList { queues, omitted })
}
