//! Message move tasks (dead-letter redrive): `StartMessageMoveTask`, `ListMessageMoveTasks`,
//! `CancelMessageMoveTask`, as zkq's own `…/redrive` runs them (`crate::redrive`). Queues are named
//! by ARN, `arn:aws:sqs:{region}:{account}:{queue}`.

use serde::{Deserialize, Serialize};

use super::{Ctx, bounded, number, required};
use crate::redrive::{TaskReport, TaskStatus};
use crate::sqs::error::SqsError;
use crate::types::QueueName;

/// The queue an ARN names: its last segment, after the service (`sqs`).
pub(super) fn queue_of_arn(arn: &str) -> Result<QueueName, SqsError> {
    let parts: Vec<&str> = arn.split(':').collect();
    match parts.as_slice() {
        ["arn", _, "sqs", _, _, name] => {
            name.parse().map_err(|_| SqsError::resource_not_found(format!("no queue is named by {arn:?}")))
        },
        _ => Err(SqsError::invalid_parameter(format!(
            "{arn:?} is not an SQS queue ARN (arn:aws:sqs:region:account:queue)"
        ))),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct StartInput {
    source_arn: Option<String>,
    destination_arn: Option<String>,
    #[serde(default, deserialize_with = "number")]
    max_number_of_messages_per_second: Option<i64>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct StartOutput {
    task_handle: String,
}

pub(super) async fn start_move_task(ctx: &Ctx<'_>, input: StartInput) -> Result<StartOutput, SqsError> {
    let source = queue_of_arn(&required(input.source_arn, "SourceArn")?)?;
    let destination = input.destination_arn.as_deref().map(queue_of_arn).transpose()?;
    let rate = bounded("MaxNumberOfMessagesPerSecond", input.max_number_of_messages_per_second, 1, 500)?;
    let rate = rate.and_then(|r| u32::try_from(r).ok());
    let report = ctx.state.door.moves().start(&source, destination, rate).await?;
    Ok(StartOutput { task_handle: report.handle })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListInput {
    source_arn: Option<String>,
    #[serde(default, deserialize_with = "number")]
    max_results: Option<i64>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListOutput {
    results: Vec<ListEntry>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ListEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    task_handle: Option<String>,
    status: &'static str,
    source_arn: String,
    destination_arn: String,
    max_number_of_messages_per_second: u32,
    approximate_number_of_messages_moved: u64,
    approximate_number_of_messages_to_move: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_reason: Option<String>,
    started_timestamp: i64,
}

pub(super) async fn list_move_tasks(ctx: &Ctx<'_>, input: ListInput) -> Result<ListOutput, SqsError> {
    let source = queue_of_arn(&required(input.source_arn, "SourceArn")?)?;
    let max = bounded("MaxResults", input.max_results, 1, 10)?.unwrap_or(1);
    let reports = ctx.state.door.moves().list(&source).await?;
    let results = reports.into_iter().take(usize::try_from(max).unwrap_or(1)).map(|r| entry(ctx, r)).collect();
    Ok(ListOutput { results })
}

fn entry(ctx: &Ctx<'_>, report: TaskReport) -> ListEntry {
    let running = report.status == TaskStatus::Running;
    ListEntry {
        // SQS shows the handle of a running task only.
        task_handle: running.then_some(report.handle),
        status: match report.status {
            TaskStatus::Running => "RUNNING",
            TaskStatus::Completed => "COMPLETED",
            TaskStatus::Cancelled => "CANCELLED",
            TaskStatus::Failed => "FAILED",
        },
        source_arn: ctx.queue_arn(&report.source),
        destination_arn: ctx.queue_arn(&report.destination),
        max_number_of_messages_per_second: report.max_per_second,
        approximate_number_of_messages_moved: report.moved,
        approximate_number_of_messages_to_move: report.to_move,
        failure_reason: report.failure,
        started_timestamp: report.started_at,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct CancelInput {
    task_handle: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct CancelOutput {
    approximate_number_of_messages_moved: u64,
}

pub(super) async fn cancel_move_task(ctx: &Ctx<'_>, input: CancelInput) -> Result<CancelOutput, SqsError> {
    let handle = required(input.task_handle, "TaskHandle")?;
    let moved = ctx.state.door.moves().cancel(&handle).await?;
    Ok(CancelOutput { approximate_number_of_messages_moved: moved })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arn_names_its_queue_and_anything_else_is_refused() {
        assert_eq!(
            queue_of_arn("arn:aws:sqs:us-east-1:000000000000:dead").map(|q| q.to_string()),
            Ok("dead".to_owned())
        );
        assert!(queue_of_arn("arn:aws:sns:us-east-1:000000000000:dead").is_err());
        assert!(queue_of_arn("dead").is_err());
        assert!(queue_of_arn("arn:aws:sqs:us-east-1:000000000000:bad name").is_err());
    }
}
