//! `AddPermission` and `RemovePermission`: statements of the queue's `Policy`, which zkq stores
//! and answers but never enforces (the listener's own access is its signature check).
//!
//! A statement is SQS's: `Sid` the label, `Effect` `Allow`, `Principal` the accounts' root ARNs,
//! `Action` `SQS:{action}` (one value alone, several as a list), `Resource` the queue's ARN. The
//! change is a compare-and-set of the queue's settings node (`QueueService::set_settings`), so two
//! sidecars adding at once both land, and a label exists once.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Ctx, Empty, required};
use crate::queue::QueueError;
use crate::sqs::error::SqsError;

/// The actions a permission may grant: those an account other than the queue's owner may call.
const GRANTABLE: [&str; 9] = [
    "*",
    "ChangeMessageVisibility",
    "DeleteMessage",
    "GetQueueAttributes",
    "GetQueueUrl",
    "ListDeadLetterSourceQueues",
    "PurgeQueue",
    "ReceiveMessage",
    "SendMessage",
];

/// The most actions one permission grants.
const MAX_ACTIONS: usize = 7;

/// The longest label.
const MAX_LABEL: usize = 80;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct AddPermissionInput {
    queue_url: Option<String>,
    label: Option<String>,
    #[serde(default, rename = "AWSAccountIds")]
    aws_account_ids: Vec<String>,
    #[serde(default)]
    actions: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct RemovePermissionInput {
    queue_url: Option<String>,
    label: Option<String>,
}

/// Adds a statement labelled `Label` to the queue's policy (made if it has none).
pub(super) async fn add_permission(ctx: &Ctx<'_>, input: AddPermissionInput) -> Result<Empty, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let label = checked_label(required(input.label, "Label")?)?;
    if input.actions.is_empty() {
        return Err(SqsError::missing_parameter("Actions"));
    }
    if input.aws_account_ids.is_empty() || !input.aws_account_ids.iter().all(|id| is_account_id(id)) {
        return Err(SqsError::invalid_parameter(format!(
            "Value [{}] for parameter PrincipalId is invalid. Reason: Unable to verify.",
            input.aws_account_ids.join(", ")
        )));
    }
    if input.actions.len() > MAX_ACTIONS {
        return Err(SqsError::over_limit(format!(
            "{} Actions were found, maximum allowed is {MAX_ACTIONS}.",
            input.actions.len()
        )));
    }
    if let Some(owner_only) = input.actions.iter().find(|a| !GRANTABLE.contains(&a.as_str())) {
        return Err(SqsError::invalid_parameter(format!(
            "Value SQS:{owner_only} for parameter ActionName is invalid. Reason: Only the queue owner is allowed to invoke this action."
        )));
    }
    let queue = ctx.existing(&url).await?;
    let arn = ctx.queue_arn(queue.name().as_str());
    let one_or_many = |mut items: Vec<String>| match items.len() {
        1 => Value::String(items.remove(0)),
        _ => Value::Array(items.into_iter().map(Value::String).collect()),
    };
    let principal = one_or_many(input.aws_account_ids.iter().map(|id| format!("arn:aws:iam::{id}:root")).collect());
    let action = one_or_many(input.actions.iter().map(|a| format!("SQS:{a}")).collect());
    let statement = json!({
        "Sid": label,
        "Effect": "Allow",
        "Principal": { "AWS": principal },
        "Action": action,
        "Resource": arn,
    });
    ctx.state
        .door
        .queues()
        .set_settings(queue.name(), |mut settings| {
            let mut policy = policy_of(settings.policy.as_deref(), &arn);
            let mut statements = take_statements(&mut policy);
            if statements.iter().any(|s| s.get("Sid").and_then(Value::as_str) == Some(label.as_str())) {
                return Err(format!("Value {label} for parameter Label is invalid. Reason: Already exists."));
            }
            statements.push(statement.clone());
            policy.insert("Statement".to_owned(), Value::Array(statements));
            settings.policy = Some(Value::Object(policy).to_string());
            Ok(settings)
        })
        .await
        .map_err(permission_error)?;
    Ok(Empty {})
}

/// Removes the statement labelled `Label` from the queue's policy.
pub(super) async fn remove_permission(ctx: &Ctx<'_>, input: RemovePermissionInput) -> Result<Empty, SqsError> {
    let url = required(input.queue_url, "QueueUrl")?;
    let label = required(input.label, "Label")?;
    let queue = ctx.existing(&url).await?;
    let arn = ctx.queue_arn(queue.name().as_str());
    ctx.state
        .door
        .queues()
        .set_settings(queue.name(), |mut settings| {
            let mut policy = policy_of(settings.policy.as_deref(), &arn);
            let mut statements = take_statements(&mut policy);
            let before = statements.len();
            statements.retain(|s| s.get("Sid").and_then(Value::as_str) != Some(label.as_str()));
            if statements.len() == before {
                return Err(format!(
                    "Value {label} for parameter Label is invalid. Reason: can't find label on existing policy."
                ));
            }
            policy.insert("Statement".to_owned(), Value::Array(statements));
            settings.policy = Some(Value::Object(policy).to_string());
            Ok(settings)
        })
        .await
        .map_err(permission_error)?;
    Ok(Empty {})
}

/// SQS's rule for a label: 1 to 80 letters, digits, `-` and `_`.
fn checked_label(label: String) -> Result<String, SqsError> {
    let valid = !label.is_empty()
        && label.len() <= MAX_LABEL
        && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(label)
    } else {
        Err(SqsError::invalid_parameter(format!(
            "Value {} for parameter Label is invalid. Reason: 1 to {MAX_LABEL} letters, digits, hyphens or underscores.",
            label.chars().take(100).collect::<String>()
        )))
    }
}

/// An AWS account id: 12 digits.
fn is_account_id(id: &str) -> bool {
    id.len() == 12 && id.bytes().all(|b| b.is_ascii_digit())
}

/// The queue's policy as a JSON object: the stored one, or SQS's default (no statement) when it
/// has none. A stored policy is a JSON object (the settings check it when they are written).
fn policy_of(stored: Option<&str>, arn: &str) -> Map<String, Value> {
    match stored.and_then(|text| serde_json::from_str::<Value>(text).ok()) {
        Some(Value::Object(policy)) => policy,
        _ => {
            let mut policy = Map::new();
            policy.insert("Version".to_owned(), Value::String("2012-10-17".to_owned()));
            policy.insert("Id".to_owned(), Value::String(format!("{arn}/SQSDefaultPolicy")));
            policy
        },
    }
}

/// Takes the policy's statements out as a list (IAM allows one statement alone: a list of one);
/// the caller puts the list back.
fn take_statements(policy: &mut Map<String, Value>) -> Vec<Value> {
    match policy.remove("Statement") {
        Some(Value::Array(list)) => list,
        None | Some(Value::Null) => Vec::new(),
        Some(single) => vec![single],
    }
}

fn permission_error(err: QueueError) -> SqsError {
    match err {
        QueueError::InvalidParameter(message) => SqsError::invalid_parameter(message),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_without_statements_or_with_one_alone_gets_a_list() {
        let arn = "arn:aws:sqs:us-east-1:000000000000:q";
        let mut made = policy_of(None, arn);
        assert!(take_statements(&mut made).is_empty());
        assert_eq!(made["Id"], "arn:aws:sqs:us-east-1:000000000000:q/SQSDefaultPolicy");
        let mut single = policy_of(Some(r#"{"Version":"2012-10-17","Statement":{"Sid":"a"}}"#), arn);
        let statements = take_statements(&mut single);
        assert_eq!(statements.len(), 1);
        assert_eq!(statements[0]["Sid"], "a");
        assert!(!single.contains_key("Id"), "a stored policy is kept as it is");
    }

    #[test]
    fn labels_and_account_ids_follow_sqs_rules() {
        assert!(checked_label("Alice-Send_1".to_owned()).is_ok());
        assert!(checked_label(String::new()).is_err());
        assert!(checked_label("a".repeat(81)).is_err());
        assert!(checked_label("a b".to_owned()).is_err());
        assert!(is_account_id("111111111111"));
        assert!(!is_account_id("11111111111"));
        assert!(!is_account_id("11111111111x"));
    }
}
