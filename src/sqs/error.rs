//! SQS's errors: each one's code in both protocols (the JSON protocol's shape name, the query
//! protocol's classic code), its status and whose fault it is; zkq's own queue errors map onto them
//! here, once. `protocol.rs` writes them in each protocol's shape.

use axum::http::StatusCode;

use crate::config::ApiConfig;
use crate::queue::{QueueError, StoreFailure};
use crate::web::{Refusal, RefusalKind};

/// The code of [`SqsError::unknown_operation`], which the query protocol writes as a bare element.
pub(super) const UNKNOWN_OPERATION: &str = "UnknownOperationException";

/// The query protocol's code of a queue that does not exist.
const NON_EXISTENT_QUEUE: &str = "AWS.SimpleQueueService.NonExistentQueue";

/// One SQS error: its code in each protocol, its status and whose fault it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SqsError {
    /// The JSON protocol's error shape (`__type` is `com.amazonaws.sqs#<shape>`).
    pub(super) shape: &'static str,
    /// The query protocol's code (and the JSON protocol's `x-amzn-query-error`).
    pub(super) code: &'static str,
    pub(super) status: StatusCode,
    pub(super) sender_fault: bool,
    pub(super) message: String,
}

impl SqsError {
    fn sender(shape: &'static str, code: &'static str, message: impl Into<String>) -> SqsError {
        SqsError { shape, code, status: StatusCode::BAD_REQUEST, sender_fault: true, message: message.into() }
    }

    pub(super) fn invalid_parameter(message: impl Into<String>) -> SqsError {
        SqsError::sender("InvalidParameterValueException", "InvalidParameterValue", message)
    }

    pub(super) fn missing_parameter(name: &str) -> SqsError {
        SqsError::sender(
            "MissingRequiredParameterException",
            "MissingParameter",
            format!("The request must contain the parameter {name}."),
        )
    }

    pub(super) fn serialization(message: impl Into<String>) -> SqsError {
        SqsError::sender("SerializationException", "SerializationException", message)
    }

    /// SQS answers a limit reached with 403.
    pub(super) fn over_limit(message: impl Into<String>) -> SqsError {
        SqsError { status: StatusCode::FORBIDDEN, ..SqsError::sender("OverLimit", "OverLimit", message) }
    }

    pub(super) fn invalid_action(message: impl Into<String>) -> SqsError {
        SqsError::sender("InvalidAction", "InvalidAction", message)
    }

    /// An action SQS does not serve at the URL it was sent to (or at all), in SQS's words.
    pub(super) fn not_for_endpoint(action: &str) -> SqsError {
        let action: String = action.chars().take(100).collect();
        SqsError::invalid_action(format!("The action {action} is not valid for this endpoint."))
    }

    /// A query-protocol request that names no `Action`: SQS answers 404 with a bare
    /// `<UnknownOperationException/>` element, in XML whatever the request accepts.
    pub(super) fn unknown_operation() -> SqsError {
        SqsError {
            status: StatusCode::NOT_FOUND,
            ..SqsError::sender(
                "UnknownOperationException",
                UNKNOWN_OPERATION,
                "the request names no Action (a queue's URL takes ?Action=…)",
            )
        }
    }

    /// A `CreateQueue` of an existing queue whose attributes differ from the queue's.
    pub(super) fn queue_exists(message: impl Into<String>) -> SqsError {
        SqsError::sender("QueueNameExists", "QueueAlreadyExists", message)
    }

    /// A message move task or its source that does not exist.
    pub(super) fn resource_not_found(message: impl Into<String>) -> SqsError {
        SqsError::sender("ResourceNotFoundException", "ResourceNotFoundException", message)
    }

    /// `UnsupportedOperation` with zkq's reason.
    pub(super) fn unsupported_because(message: impl Into<String>) -> SqsError {
        SqsError::sender("UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation", message)
    }

    /// A queue that does not exist, in SQS's words (which name no queue; see [`SqsError::query_message`]).
    pub(super) fn no_such_queue() -> SqsError {
        SqsError::sender("QueueDoesNotExist", NON_EXISTENT_QUEUE, "The specified queue does not exist.")
    }

    /// The error's message in the query protocol: SQS words a missing queue there as its
    /// WSDL-described API always has, and SDKs of that protocol expect those words.
    pub(super) fn query_message(&self) -> &str {
        if self.code == NON_EXISTENT_QUEUE {
            "The specified queue does not exist for this wsdl version."
        } else {
            &self.message
        }
    }

    pub(super) fn receipt_handle_invalid(message: impl Into<String>) -> SqsError {
        SqsError::sender("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", message)
    }

    pub(super) fn not_in_flight(message: impl Into<String>) -> SqsError {
        SqsError::sender("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", message)
    }

    pub(super) fn invalid_attribute_name(message: impl Into<String>) -> SqsError {
        SqsError::sender("InvalidAttributeName", "InvalidAttributeName", message)
    }

    pub(super) fn invalid_attribute_value(message: impl Into<String>) -> SqsError {
        SqsError::sender("InvalidAttributeValue", "InvalidAttributeValue", message)
    }

    pub(super) fn too_many_entries(count: usize) -> SqsError {
        SqsError::sender(
            "TooManyEntriesInBatchRequest",
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            format!("Maximum number of entries per request are 10. You have sent {count}."),
        )
    }

    /// A `SendMessageBatch` whose entries (bodies and attributes) are larger than
    /// `api.max_batch_bytes` together, in SQS's words: the whole request is refused.
    pub(super) fn batch_too_long(max: usize, sent: usize) -> SqsError {
        SqsError::sender(
            "BatchRequestTooLong",
            "AWS.SimpleQueueService.BatchRequestTooLong",
            format!("Batch requests cannot be longer than {max} bytes. You have sent {sent} bytes."),
        )
    }

    /// A batch without entries; `entry` is the action's entry type (`SendMessageBatchRequestEntry`).
    pub(super) fn empty_batch(entry: &str) -> SqsError {
        SqsError::sender(
            "EmptyBatchRequest",
            "AWS.SimpleQueueService.EmptyBatchRequest",
            format!("There should be at least one {entry} in the request."),
        )
    }

    pub(super) fn ids_not_distinct(id: &str) -> SqsError {
        SqsError::sender(
            "BatchEntryIdsNotDistinct",
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            format!("Id {id} repeated."),
        )
    }

    pub(super) fn invalid_batch_entry_id() -> SqsError {
        SqsError::sender(
            "InvalidBatchEntryId",
            "AWS.SimpleQueueService.InvalidBatchEntryId",
            "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most \
             80 letters long.",
        )
    }

    pub(super) fn invalid_message_contents(message: impl Into<String>) -> SqsError {
        SqsError::sender("InvalidMessageContents", "InvalidMessageContents", message)
    }

    /// A request whose signature does not pass (`sigv4.rs`): its code is the shape in both protocols.
    pub(super) fn auth(code: &'static str, status: u16, message: impl Into<String>) -> SqsError {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
        SqsError { status, ..SqsError::sender(code, code, message) }
    }

    /// A message body over `api.max_message_bytes`, in SQS's words.
    pub(super) fn message_too_long(max: usize) -> SqsError {
        SqsError::invalid_parameter(format!(
            "One or more parameters are invalid. Reason: Message must be shorter than {max} bytes."
        ))
    }

    /// What the guard refused (or a handler that panicked), as SQS answers it: a request too
    /// large `InvalidParameterValue` (a `SendMessageBatch`: `BatchRequestTooLong`), like a message
    /// over SQS's size limit, which SDKs do not retry; shed for load `RequestThrottled` (SQS's
    /// throttling error, which SDKs retry with backoff); a body too slow `RequestTimeout`; a
    /// panic `InternalFailure`.
    pub(super) fn refused(refusal: Refusal, api: &ApiConfig) -> SqsError {
        let Refusal { kind, batch, message } = refusal;
        match kind {
            // In SQS's words, which clients match on; the batch's size is not known (its body
            // was not read), only that it passes what the listener reads.
            RefusalKind::TooLarge { limit } if batch => SqsError::sender(
                "BatchRequestTooLong",
                "AWS.SimpleQueueService.BatchRequestTooLong",
                format!(
                    "Batch requests cannot be longer than {} bytes. You have sent more than {limit} bytes.",
                    api.max_batch_bytes
                ),
            ),
            RefusalKind::TooLarge { .. } => SqsError::message_too_long(api.max_message_bytes),
            RefusalKind::Overloaded => SqsError {
                status: StatusCode::FORBIDDEN,
                ..SqsError::sender("RequestThrottled", "RequestThrottled", message)
            },
            RefusalKind::TimedOut => SqsError::sender("RequestTimeout", "RequestTimeout", message),
            RefusalKind::Unauthorized => SqsError {
                status: StatusCode::FORBIDDEN,
                ..SqsError::sender("MissingAuthenticationToken", "MissingAuthenticationToken", message)
            },
            RefusalKind::CrossOrigin => {
                SqsError { status: StatusCode::FORBIDDEN, ..SqsError::sender("AccessDenied", "AccessDenied", message) }
            },
            RefusalKind::Panic => {
                SqsError::server("InternalFailure", "InternalFailure", StatusCode::INTERNAL_SERVER_ERROR, message)
            },
        }
    }

    pub(super) fn server_unavailable(message: impl Into<String>) -> SqsError {
        SqsError::server("ServiceUnavailable", "ServiceUnavailable", StatusCode::SERVICE_UNAVAILABLE, message)
    }

    fn server(shape: &'static str, code: &'static str, status: StatusCode, message: impl Into<String>) -> SqsError {
        SqsError { shape, code, status, sender_fault: false, message: message.into() }
    }
}

impl From<crate::redrive::RedriveError> for SqsError {
    fn from(err: crate::redrive::RedriveError) -> SqsError {
        use crate::redrive::RedriveError;
        match err {
            RedriveError::Invalid(message) => SqsError::invalid_parameter(message),
            RedriveError::Running(_) => SqsError::unsupported_because(err.to_string()),
            RedriveError::NoSuchTask(_) => SqsError::resource_not_found(err.to_string()),
            RedriveError::Queue(QueueError::UnknownQueue(name) | QueueError::NoSuchQueue(name)) => {
                SqsError::resource_not_found(format!("the queue {name} does not exist"))
            },
            RedriveError::Queue(err) => err.into(),
        }
    }
}

impl From<QueueError> for SqsError {
    fn from(err: QueueError) -> SqsError {
        let message = err.to_string();
        match err {
            QueueError::UnknownQueue(_) | QueueError::NoSuchQueue(_) => SqsError::no_such_queue(),
            QueueError::TooManyQueues(_) => SqsError::over_limit(message),
            QueueError::InvalidParameter(_)
            | QueueError::NotForKind(_)
            | QueueError::IdempotencyKeyReused(_)
            | QueueError::Declared(_) => SqsError::invalid_parameter(message),
            QueueError::TooLarge { .. } | QueueError::TransactionTooLarge { .. } => {
                SqsError::sender("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong", message)
            },
            QueueError::Full { .. } | QueueError::TooManyLeases(_) => SqsError::over_limit(message),
            QueueError::MessageNotFound(_) => SqsError::invalid_parameter(message),
            QueueError::LeaseLost(_) => {
                SqsError::invalid_parameter(format!("the receipt handle has expired: {message}"))
            },
            QueueError::LeaseNotFound(_) => SqsError::receipt_handle_invalid(message),
            QueueError::ShuttingDown => {
                SqsError::server("ServiceUnavailable", "ServiceUnavailable", StatusCode::SERVICE_UNAVAILABLE, message)
            },
            QueueError::Zk(_) => match err.store_failure() {
                Some(StoreFailure::OutcomeUnknown) => SqsError::server(
                    "InternalError",
                    "InternalError",
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{message}; the request may or may not have applied"),
                ),
                Some(StoreFailure::Unavailable) => SqsError::server(
                    "ServiceUnavailable",
                    "ServiceUnavailable",
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("ZooKeeper is unavailable: {message}"),
                ),
                _ => SqsError::server("InternalError", "InternalError", StatusCode::INTERNAL_SERVER_ERROR, message),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_has_an_sqs_code() {
        let api = ApiConfig::default();
        let too_large = RefusalKind::TooLarge { limit: 10 };
        let table = [
            (too_large, false, 400, "InvalidParameterValueException", "InvalidParameterValue"),
            (too_large, true, 400, "BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong"),
            (RefusalKind::Overloaded, false, 403, "RequestThrottled", "RequestThrottled"),
            (RefusalKind::TimedOut, false, 400, "RequestTimeout", "RequestTimeout"),
            (RefusalKind::Unauthorized, false, 403, "MissingAuthenticationToken", "MissingAuthenticationToken"),
            (RefusalKind::CrossOrigin, false, 403, "AccessDenied", "AccessDenied"),
            (RefusalKind::Panic, false, 500, "InternalFailure", "InternalFailure"),
        ];
        for (kind, batch, status, shape, code) in table {
            let refusal = Refusal { kind, batch, message: "why".to_owned() };
            let err = SqsError::refused(refusal, &api);
            assert_eq!((err.status.as_u16(), err.shape, err.code), (status, shape, code), "{kind:?}");
            assert_eq!(err.sender_fault, kind != RefusalKind::Panic, "{kind:?}");
        }
        let err = SqsError::refused(Refusal::new(too_large, "why"), &api);
        assert!(
            err.message.contains(&format!("Message must be shorter than {} bytes", api.max_message_bytes)),
            "{}",
            err.message
        );
        assert_eq!(SqsError::message_too_long(5).code, "InvalidParameterValue");
    }
}
