//! Message move tasks on zkq's own API: dead letters moved back at a bounded rate
//! (`redrive.rs` at the crate's root runs them; the SQS-compatible API's
//! `StartMessageMoveTask`, `ListMessageMoveTasks` and `CancelMessageMoveTask` are the same tasks).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody, ErrorCode, ZookeeperErrors};
use super::extract::{ApiJson, ApiPath, not_null};
use super::state::AppState;
use super::wire::QueuePath;
use crate::redrive::{RedriveError, TaskReport, TaskStatus};
use crate::types::QueueName;

/// A message move task to start.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RedriveRequest {
    /// The queue the messages go to; default: the one declared queue whose `dead_letter` this
    /// queue is.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = Option<String>)]
    pub destination: Option<QueueName>,
    /// Messages moved a second, at most (1 to 500; default 100).
    #[serde(default)]
    pub max_per_second: Option<u32>,
}

/// A message move task.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct MoveTask {
    /// Opaque: cancels the task (also through the SQS-compatible API's `CancelMessageMoveTask`).
    pub handle: String,
    pub source: String,
    pub destination: String,
    pub max_per_second: u32,
    /// `RUNNING`, `COMPLETED`, `CANCELLED` or `FAILED`.
    pub status: String,
    /// Messages moved so far (a second late for a task running on another zkq).
    pub moved: u64,
    /// The source's depth when the task started.
    pub to_move: u64,
    /// Epoch ms.
    pub started_at: i64,
    /// Why a `FAILED` task stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

impl From<TaskReport> for MoveTask {
    fn from(report: TaskReport) -> MoveTask {
        let status = match report.status {
            TaskStatus::Running => "RUNNING",
            TaskStatus::Completed => "COMPLETED",
            TaskStatus::Cancelled => "CANCELLED",
            TaskStatus::Failed => "FAILED",
        };
        MoveTask {
            handle: report.handle,
            source: report.source,
            destination: report.destination,
            max_per_second: report.max_per_second,
            status: status.to_owned(),
            moved: report.moved,
            to_move: report.to_move,
            started_at: report.started_at,
            failure: report.failure,
        }
    }
}

/// A queue's message move tasks.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct MoveTasks {
    pub tasks: Vec<MoveTask>,
}

/// What a cancel stopped.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct CancelledTask {
    pub handle: String,
    /// Messages it had moved (when it stopped, or at its last report if it had not confirmed).
    pub moved: u64,
}

impl From<RedriveError> for ApiError {
    fn from(err: RedriveError) -> ApiError {
        match err {
            RedriveError::Invalid(message) => ApiError::invalid(message),
            RedriveError::Running(_) => ApiError::new(ErrorCode::MoveTaskRunning, err.to_string()),
            RedriveError::NoSuchTask(_) => ApiError::new(ErrorCode::MoveTaskNotFound, err.to_string()),
            RedriveError::Queue(err) => err.into(),
        }
    }
}

/// Start moving this queue's messages (a dead-letter queue's) to `destination`, at up to
/// `max_per_second`. Each message leaves only once its copy is stored there (keyed, so none is
/// stored twice), with its body, attributes and traceparent. One task per queue on the whole
/// ensemble; it runs in this zkq until the queue has no message left to lease, a cancel, or
/// shutdown. A destination whose idempotency window is under 3 minutes (three times a move's
/// lease) is refused: it could store a message twice.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/redrive", tag = "queues",
    params(QueuePath),
    request_body = RedriveRequest,
    responses(
        (status = 202, description = "Started", body = MoveTask),
        (status = 400, description = "Bad queue name or rate, no destination given where none is implied, the queue itself, or a destination whose idempotency window is under 3 minutes (`invalid_parameter`)", body = ErrorBody),
        (status = 404, description = "No such queue (the source, or the destination)", body = ErrorBody),
        (status = 409, description = "A task already runs for this queue (`move_task_running`), or the queue has no lock path (`parameter_not_for_kind`)", body = ErrorBody),
        (status = 415, description = "The body is not sent as JSON (`Content-Type: application/json`)", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn start_redrive(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
    ApiJson(request): ApiJson<RedriveRequest>,
) -> Result<(StatusCode, Json<MoveTask>), ApiError> {
    let report = state.door.moves().start(&path.queue, request.destination, request.max_per_second).await?;
    Ok((StatusCode::ACCEPTED, Json(report.into())))
}

/// This queue's message move tasks: the one running (here or on another zkq), then the last
/// ones this zkq ran, newest first.
#[utoipa::path(
    get, path = "/v1/queues/{queue}/redrive", tag = "queues",
    params(QueuePath),
    responses(
        (status = 200, description = "The tasks", body = MoveTasks),
        (status = 400, description = "Bad queue name", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn list_redrives(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
) -> Result<Json<MoveTasks>, ApiError> {
    let tasks = state.door.moves().list(&path.queue).await?;
    Ok(Json(MoveTasks { tasks: tasks.into_iter().map(MoveTask::from).collect() }))
}

/// Cancel the task running for this queue (on any zkq): answers once the task has stopped (or,
/// if the zkq running it has not confirmed by the request's deadline, once it was asked), with
/// what it moved; that stays moved, the rest stays here.
#[utoipa::path(
    delete, path = "/v1/queues/{queue}/redrive", tag = "queues",
    params(QueuePath),
    responses(
        (status = 200, description = "Cancelled", body = CancelledTask),
        (status = 400, description = "Bad queue name", body = ErrorBody),
        (status = 404, description = "No task runs for this queue (`move_task_not_found`)", body = ErrorBody),
        ZookeeperErrors,
    )
)]
pub(crate) async fn cancel_redrive(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<QueuePath>,
) -> Result<Json<CancelledTask>, ApiError> {
    let running = state.door.moves().list(&path.queue).await?.into_iter().find(|t| t.status == TaskStatus::Running);
    let Some(task) = running else {
        return Err(ApiError::new(
            ErrorCode::MoveTaskNotFound,
            format!("no message move task runs for queue {}", path.queue),
        ));
    };
    let moved = state.door.moves().cancel(&task.handle).await?;
    Ok(Json(CancelledTask { handle: task.handle, moved }))
}
