//! The SQS-compatible API, on its own listener (`sqs.listen`): AWS SDKs, the AWS CLI and SQS
//! workers use zkq's queues without a line of zkq-specific code (docs/sqs.md).
//!
//! One handler takes every request: `protocol.rs` tells the JSON protocol from the query
//! protocol and decodes either into the action's one input shape, `actions.rs` runs the action
//! on the same queue core as zkq's own API, and the answer (or `error.rs`'s error) is encoded in
//! the protocol the request came in; so is what the guard in front of it refuses ([`Asked`]).

#![allow(clippy::disallowed_types, reason = "src/sqs/ maps SQS errors to HTTP statuses, as src/http/ does its own")]

mod actions;
mod error;
mod protocol;
mod sigv4;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;

use crate::config::{Config, SqsKeyPair};
use crate::door::Door;
use crate::metrics::Metrics;
use crate::web::{Access, Answer, BodyLimits, Dialect, Guard, Refusal, RefusalKind, closes_connection, with_layers};
use error::SqsError;
use protocol::Protocol;

/// What every SQS action and the listener's guard reach: the core's door and the front's own
/// settings.
#[derive(Clone)]
pub(crate) struct SqsState {
    pub(crate) config: Arc<Config>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) door: Door,
    /// The key pair requests must be signed with (`sqs.access_key_id`), if any.
    pub(crate) key_pair: Option<Arc<SqsKeyPair>>,
}

/// The largest body the listener reads: an SQS request carries at most a batch of bodies, JSON-
/// or form-encoded.
fn body_limit(config: &Config) -> usize {
    let limits = BodyLimits::of(config);
    limits.batch.max(limits.message.saturating_mul(2))
}

/// The SQS dialect of the guard's refusals: SQS's codes, in the request's protocol, counted in
/// `zkq_sqs_requests_total`.
#[derive(Clone)]
struct Refusals {
    config: Arc<Config>,
    metrics: Arc<Metrics>,
}

impl Refusals {
    fn of(state: &SqsState) -> Refusals {
        Refusals { config: state.config.clone(), metrics: state.metrics.clone() }
    }
}

impl Dialect for Refusals {
    fn asked(&self, headers: &HeaderMap, uri: &Uri) -> Box<dyn Answer> {
        Box::new(Asked::of(headers, uri, self.clone()))
    }
}

/// What the SQS answer to a request that the guard refused (or whose handler panicked) needs of
/// the request, read from its head: its protocol and its action (the JSON protocol's
/// `X-Amz-Target`; a query-protocol request's `Action` only when its URL names it, as the body
/// is not read).
struct Asked {
    protocol: Protocol,
    /// One of [`actions::SERVED`], or `other`.
    action: &'static str,
    refusals: Refusals,
}

impl Asked {
    fn of(headers: &HeaderMap, uri: &Uri, refusals: Refusals) -> Asked {
        let protocol = protocol::protocol_of(headers);
        let named = match protocol {
            Protocol::Json => headers
                .get(protocol::TARGET_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|target| target.strip_prefix(protocol::TARGET_PREFIX)),
            Protocol::Query | Protocol::QueryInJson => {
                uri.query().and_then(|query| query.split('&').find_map(|p| p.strip_prefix("Action=")))
            },
        };
        let action = named.and_then(|name| actions::SERVED.iter().find(|a| **a == name).copied()).unwrap_or("other");
        Asked { protocol, action, refusals }
    }
}

impl Answer for Asked {
    /// Whether the request is a `SendMessageBatch`.
    fn is_batch(&self) -> bool {
        self.action == "SendMessageBatch"
    }

    /// `refusal` as SQS answers it, in the request's protocol, counted in `zkq_sqs_requests_total`.
    fn refused(&self, request_id: &str, refusal: Refusal) -> Response {
        let unread = refusal.leaves_body_unread();
        let overloaded = refusal.kind == RefusalKind::Overloaded;
        let err = SqsError::refused(refusal, &self.refusals.config.api);
        self.refusals.metrics.sqs_requests.with_label_values(&[self.action, err.code]).inc();
        let mut response = protocol::encode_error(self.protocol, err, request_id);
        if overloaded {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if unread {
            closes_connection(&mut response);
        }
        response
    }
}

/// The SQS-compatible router: every path and method goes to [`handle`] (the query protocol may
/// post to a queue's URL).
pub(crate) fn sqs_router(state: SqsState) -> Router {
    let limits = BodyLimits::of(&state.config);
    let body = body_limit(&state.config);
    let guard = Guard {
        metrics: state.metrics.clone(),
        in_flight: Some(Arc::new(tokio::sync::Semaphore::new(state.config.api.max_concurrent_requests))),
        body_limits: Some(BodyLimits { message: body, batch: body, read_timeout: limits.read_timeout }),
        batch_route: None,
        access: Access { refuse_cross_origin: state.config.api.refuse_cross_origin, token: None },
        dialect: Arc::new(Refusals::of(&state)),
    };
    let router = Router::new().route("/", axum::routing::any(handle)).route("/{*path}", axum::routing::any(handle));
    with_layers(router, guard, Some(body)).with_state(state)
}

async fn handle(
    State(state): State<SqsState>,
    method: Method,
    headers: HeaderMap,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let protocol = protocol::protocol_of(&headers);
    let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return unread(&state, &headers, &uri, &request_id, &rejection),
    };
    if let Some(key_pair) = &state.key_pair
        && let Err(err) = sigv4::verify(key_pair, &method, &uri, &headers, &body, std::time::SystemTime::now())
    {
        state.metrics.sqs_requests.with_label_values(&["other", err.code]).inc();
        return protocol::encode_error(protocol, err, &request_id);
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    let origin = format!("http://{host}");
    let decoded = match protocol {
        Protocol::Json => protocol::decode_json(&headers, &body),
        Protocol::Query | Protocol::QueryInJson => {
            protocol::decode_query(uri.query(), &body, |action| actions::SERVED.contains(&action))
                .and_then(|decoded| protocol::addressed(decoded, &origin, uri.path()))
        },
    };
    let decoded = match decoded {
        Ok(decoded) => decoded,
        Err(err) => {
            state.metrics.sqs_requests.with_label_values(&["other", err.code]).inc();
            return protocol::encode_error(protocol, err, &request_id);
        },
    };
    let ctx = actions::Ctx { state: &state, origin };
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

/// The answer to a request whose body could not be read: too slow (`api.body_read_timeout`), larger
/// than the listener reads (a body of undeclared length), or cut off.
fn unread(state: &SqsState, headers: &HeaderMap, uri: &Uri, request_id: &str, rejection: &BytesRejection) -> Response {
    let asked = Asked::of(headers, uri, Refusals::of(state));
    let refusal = if crate::web::body::timed_out(rejection) {
        Refusal::new(
            RefusalKind::TimedOut,
            "the request body did not arrive within api.body_read_timeout of its headers; nothing was done",
        )
    } else if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        let limit = body_limit(&state.config);
        Refusal {
            batch: asked.is_batch(),
            ..Refusal::new(RefusalKind::TooLarge { limit }, format!("the body is larger than {limit} bytes"))
        }
    } else {
        let err = SqsError::invalid_parameter(format!("cannot read the body: {}", rejection.body_text()));
        state.metrics.sqs_requests.with_label_values(&[asked.action, err.code]).inc();
        return protocol::encode_error(asked.protocol, err, request_id);
    };
    asked.refused(request_id, refusal)
}
