//! The SQS-compatible API, on its own listener (`sqs.listen`): AWS SDKs, the AWS CLI and SQS
//! workers use zkq's queues without a line of zkq-specific code (docs/sqs.md).
//!
//! One handler takes every request: `protocol.rs` tells the JSON protocol from the query
//! protocol and decodes either into the action's one input shape, `actions.rs` runs the action
//! on the same queue core as zkq's own API, and the answer (or `error.rs`'s error) is encoded in
//! the protocol the request came in.

mod actions;
mod error;
mod protocol;
mod sigv4;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri, header};
use axum::response::Response;

use super::AppState;
use super::guard::{Access, BodyLimits, Guard};
pub use actions::SERVED as SERVED_ACTIONS;
use protocol::Protocol;

/// The SQS-compatible router: every path and method goes to [`handle`] (the query protocol may
/// post to a queue's URL).
pub fn sqs_router(state: AppState) -> Router {
    let limits = BodyLimits::of(&state.config);
    // An SQS request carries at most a batch of bodies, JSON- or form-encoded.
    let body = limits.batch.max(limits.message.saturating_mul(2));
    let guard = Guard {
        state: state.clone(),
        in_flight: Some(Arc::new(tokio::sync::Semaphore::new(state.config.api.max_concurrent_requests))),
        body_limits: Some(BodyLimits { message: body, batch: body, read_timeout: limits.read_timeout }),
        access: Access::NoBrowsers,
    };
    let router = Router::new().route("/", axum::routing::any(handle)).route("/{*path}", axum::routing::any(handle));
    super::with_layers(router, guard, Some(body)).with_state(state)
}

async fn handle(State(state): State<AppState>, method: Method, headers: HeaderMap, uri: Uri, body: Bytes) -> Response {
    let protocol = protocol::protocol_of(&headers);
    let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    if let Some(key_pair) = &state.sqs_key_pair
        && let Err(err) = sigv4::verify(key_pair, &method, &uri, &headers, &body, std::time::SystemTime::now())
    {
        state.metrics.sqs_requests.with_label_values(&["other", err.code]).inc();
        return protocol::encode_error(protocol, err, &request_id);
    }
    let decoded = match protocol {
        Protocol::Json => protocol::decode_json(&headers, &body),
        Protocol::Query => protocol::decode_query(uri.query(), &body, |action| {
            actions::SERVED.contains(&action) || matches!(action, "AddPermission" | "RemovePermission")
        }),
    };
    let decoded = match decoded {
        Ok(decoded) => decoded,
        Err(err) => {
            state.metrics.sqs_requests.with_label_values(&["other", err.code]).inc();
            return protocol::encode_error(protocol, err, &request_id);
        },
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    let ctx = actions::Ctx { state: &state, origin: format!("http://{host}") };
    let result = actions::run(&ctx, &decoded.action, decoded.input).await;
    // Labels from fixed sets: the actions zkq serves, and the codes it answers.
    let action = actions::SERVED.iter().find(|a| **a == decoded.action).copied().unwrap_or("other");
    let code = result.as_ref().map_or_else(|err| err.code, |_| "ok");
    state.metrics.sqs_requests.with_label_values(&[action, code]).inc();
    match result {
        Ok(output) => protocol::encode(protocol, &decoded.action, output, &request_id),
        Err(err) => protocol::encode_error(protocol, err, &request_id),
    }
}
