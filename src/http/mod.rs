//! The only code that knows HTTP: routes, extractors, the error table, the OpenAPI document.
//!
//! Two listeners: the API (queues; loopback by default, for the app in the pod) and the admin
//! listener (`/livez`, `/readyz`, `/metrics`, for the kubelet and Prometheus); and, when
//! `sqs.listen` is set, the SQS-compatible API (`crate::sqs`) stands on the same server and guard.

#![allow(clippy::disallowed_types, reason = "src/http/ owns the HTTP statuses")]

mod admin;
pub mod attributes;
pub mod batch;
pub(crate) mod body;
pub mod counters;
pub mod error;
mod extract;
pub(crate) mod guard;
pub mod leases;
mod openapi;
pub mod queues;
pub mod redrive;
pub mod server;
mod state;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::response::{IntoResponse, Response};

use error::{ApiError, ErrorCode};
use guard::{Answers, BodyLimits, Guard, Refusal, guard_request};
use openapi::{api_routes, document_access_control, document_bounds};
pub use openapi::{openapi_document, openapi_json};
pub use state::AppState;
pub use wire::API_TOKEN_HEADER;

/// The queue API router. `admin` is where the admin listener listens: the API's 404 for the admin
/// paths (`/livez`, `/readyz`, `/metrics`) names it, so a request sent to the wrong port says where to go.
pub fn api_router(state: AppState, admin: std::net::SocketAddr) -> Router {
    let (router, mut openapi) = api_routes().split_for_parts();
    document_access_control(&mut openapi);
    document_bounds(&mut openapi, &state.config);
    let spec = openapi_json(&state.config);
    let limits = BodyLimits::of(&state.config);
    let router = router
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let spec = spec.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], spec) }
            }),
        )
        .merge(utoipa_swagger_ui::SwaggerUi::new("/docs").url("/docs/openapi.json", openapi));
    let router = ADMIN_PATHS
        .iter()
        .fold(router, |router, path| router.route(path, axum::routing::any(move || admin_path_not_found(path, admin))))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    let guard = Guard {
        state: state.clone(),
        in_flight: Some(Arc::new(tokio::sync::Semaphore::new(state.config.api.max_concurrent_requests))),
        body_limits: Some(limits),
        access: guard::Access::Token,
        answers: Answers::Native,
    };
    with_layers(router, guard, Some(limits.message.max(limits.batch))).with_state(state)
}

/// Every layer in one `Router::layer` call: each call wraps every route in a boxed service of its
/// own, and a waiting long-poll holds each box for as long as it waits (see "Memory per
/// connection" in docs/architecture.md). Outermost first: request ids (an incoming `x-request-id`
/// is kept, else one is made; either way it is echoed and every log line of the request carries
/// it), then [`guard`] (metrics, shedding, declared size), then a panic guard that still answers
/// in the listener's shape (its answer carries the [`Refusal`], which the SQS listener's guard
/// writes in the request's protocol), then the body limit.
pub(crate) fn with_layers(router: Router<AppState>, guard: Guard, body_limit: Option<usize>) -> Router<AppState> {
    use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};
    router.layer(
        tower::ServiceBuilder::new()
            .layer(SetRequestIdLayer::x_request_id(NewRequestId))
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(middleware::from_fn_with_state(guard, guard_request))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
            .option_layer(body_limit.map(DefaultBodyLimit::max)),
    )
}

/// A new request id: a random UUID (version 4), as tower-http's `MakeRequestUuid` makes, with its
/// random bits from the thread's generator (seeded from the operating system) instead of one
/// `getrandom` system call per request.
#[derive(Debug, Clone, Copy)]
struct NewRequestId;

impl tower_http::request_id::MakeRequestId for NewRequestId {
    fn make_request_id<B>(&mut self, _request: &axum::http::Request<B>) -> Option<tower_http::request_id::RequestId> {
        let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let text = id.hyphenated().encode_lower(&mut text);
        axum::http::HeaderValue::from_str(text).ok().map(tower_http::request_id::RequestId::new)
    }
}

fn panic_response(_panic: Box<dyn std::any::Any + Send>) -> Response {
    tracing::error!("a request handler panicked; this is a bug");
    let refusal = Refusal::panic();
    let mut response = ApiError::from(refusal.clone()).into_response();
    response.extensions_mut().insert(refusal);
    response
}

/// The admin router: health and metrics.
pub fn admin_router(state: AppState) -> Router {
    let router = Router::new()
        .route("/livez", axum::routing::get(admin::livez))
        .route("/readyz", axum::routing::get(admin::readyz))
        .route("/metrics", axum::routing::get(admin::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    let guard = Guard {
        state: state.clone(),
        in_flight: None,
        body_limits: None,
        access: guard::Access::Open,
        answers: Answers::Native,
    };
    with_layers(router, guard, None).with_state(state)
}

/// The admin listener's paths, which the API listener does not serve.
const ADMIN_PATHS: [&str; 3] = ["/livez", "/readyz", "/metrics"];

async fn admin_path_not_found(path: &str, admin: std::net::SocketAddr) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("{path} is served by the admin listener, not the API listener: http://{admin}{path}"),
    )
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such endpoint; see /openapi.json on the API listener")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed on this endpoint; see /openapi.json")
}

#[cfg(test)]
mod tests {
    use tower_http::request_id::MakeRequestId;

    use super::NewRequestId;

    #[test]
    fn new_request_ids_are_distinct_version_4_uuids() {
        let request = axum::http::Request::new(());
        let ids: Vec<String> = (0..1000)
            .map(|_| {
                let id = NewRequestId.make_request_id(&request).expect("an id");
                id.header_value().to_str().expect("ascii").to_owned()
            })
            .collect();
        for id in &ids {
            let parsed = uuid::Uuid::parse_str(id).expect("a UUID");
            assert_eq!(parsed.get_version(), Some(uuid::Version::Random), "{id}");
            assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122, "{id}");
            assert_eq!(id.len(), 36, "hyphenated: {id}");
        }
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
    }
}
