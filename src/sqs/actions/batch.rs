//! What every batch action shares: its input's entries, its answer's successes and failures,
//! and the check of its entry ids.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::sqs::error::SqsError;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct BatchInput<E> {
    pub(super) queue_url: Option<String>,
    #[serde(default = "Vec::new")]
    pub(super) entries: Vec<E>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct BatchOutput<S> {
    pub(super) successful: Vec<S>,
    pub(super) failed: Vec<BatchError>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct BatchError {
    id: String,
    sender_fault: bool,
    code: String,
    message: String,
}

impl BatchError {
    pub(super) fn of(id: String, err: SqsError) -> BatchError {
        BatchError { id, sender_fault: err.sender_fault, code: err.code.to_owned(), message: err.message }
    }
}

/// Checks a batch's entries: 1 to 10, each id 1 to 80 of `[A-Za-z0-9_-]`, all distinct; `entry`
/// is the action's entry type, as SQS names it in its errors.
pub(super) fn check_batch<'a>(ids: impl Iterator<Item = &'a str>, entry: &str) -> Result<(), SqsError> {
    let mut seen = HashSet::new();
    for id in ids {
        if id.is_empty() || id.len() > 80 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(SqsError::invalid_batch_entry_id());
        }
        if !seen.insert(id) {
            return Err(SqsError::ids_not_distinct(id));
        }
    }
    match seen.len() {
        0 => Err(SqsError::empty_batch(entry)),
        n if n > 10 => Err(SqsError::too_many_entries(n)),
        _ => Ok(()),
    }
}
