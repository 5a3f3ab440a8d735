//! The only code that knows HTTP: routes, extractors, the error table, the OpenAPI document.
//!
//! Two listeners: the API (queues; loopback by default, for the app in the pod) and the admin
//! listener (`/livez`, `/readyz`, `/metrics`, for the kubelet and Prometheus).

#![allow(clippy::disallowed_types, reason = "src/http/ owns the HTTP statuses")]

mod admin;
pub mod batch;
pub mod counters;
pub mod error;
mod extract;
pub mod leases;
pub mod queues;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::config::Config;
use crate::counter::CounterService;
use crate::metrics::Metrics;
use crate::queue::QueueService;
use crate::zk::ZkSession;
use error::{ApiError, ErrorCode};

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub session: ZkSession,
    pub metrics: Arc<Metrics>,
    pub queues: Arc<QueueService>,
    pub counters: Arc<CounterService>,
    /// Cancelled when shutdown starts: `/readyz` turns 503 at once.
    pub draining: CancellationToken,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "zkq",
        description = "Durable, Curator-compatible ZooKeeper queues over HTTP. Every error is JSON {code, message}.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "queues", description = "Put, take, peek and remove messages"),
        (name = "leases", description = "Lock-path safe consumption: lease, ack, nack, extend"),
        (name = "counters", description = "Shared counters compatible with Curator's SharedCount"),
    ),
    components(schemas(error::ErrorBody)),
)]
struct ApiDoc;

fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(queues::list_queues))
        .routes(routes!(queues::get_queue))
        .routes(routes!(queues::put_message, queues::peek_messages, queues::remove_by_id))
        .routes(routes!(batch::put_batch))
        .routes(routes!(batch::ack_batch))
        .routes(routes!(queues::remove_message))
        .routes(routes!(queues::take_message))
        .routes(routes!(leases::lease_message))
        .routes(routes!(leases::ack))
        .routes(routes!(leases::nack))
        .routes(routes!(leases::extend))
        .routes(routes!(counters::get_counter, counters::set_counter))
        .routes(routes!(counters::add_to_counter))
}

/// The OpenAPI document the API listener serves (and `openapi/openapi.json` holds).
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    api_routes().into_openapi()
}

/// The document as committed: pretty JSON with a trailing newline.
pub fn openapi_json() -> String {
    let mut text = openapi_document().to_pretty_json().unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

/// The queue API router.
pub fn api_router(state: AppState) -> Router {
    let (router, openapi) = api_routes().split_for_parts();
    let spec = openapi_json();
    let limits = BodyLimits::of(&state.config);
    let router = router
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let spec = spec.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], spec) }
            }),
        )
        .merge(utoipa_swagger_ui::SwaggerUi::new("/docs").url("/docs/openapi.json", openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    let guard = Guard {
        state: state.clone(),
        in_flight: Some(Arc::new(tokio::sync::Semaphore::new(state.config.api.max_concurrent_requests))),
        body_limits: Some(limits),
    };
    with_layers(router, guard, Some(limits.message.max(limits.batch))).with_state(state)
}

/// Every layer in one `Router::layer` call: each call wraps every route in a boxed service of its
/// own, and a waiting long-poll holds each box for as long as it waits (see "Memory per
/// connection" in docs/architecture.md). Outermost first: request ids (an incoming `x-request-id`
/// is kept, else one is made; either way it is echoed and every log line of the request carries
/// it), then [`guard`] (metrics, shedding, declared size), then a panic guard that still answers
/// in the API's shape, then the body limit.
fn with_layers(router: Router<AppState>, guard: Guard, body_limit: Option<usize>) -> Router<AppState> {
    use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
    router.layer(
        tower::ServiceBuilder::new()
            .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(middleware::from_fn_with_state(guard, guard_request))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
            .option_layer(body_limit.map(DefaultBodyLimit::max)),
    )
}

fn panic_response(_panic: Box<dyn std::any::Any + Send>) -> Response {
    tracing::error!("a request handler panicked; this is a bug");
    ApiError::new(ErrorCode::Internal, "internal error; this is a bug, please report it").into_response()
}

/// The admin router: health and metrics.
pub fn admin_router(state: AppState) -> Router {
    let router = Router::new()
        .route("/livez", axum::routing::get(admin::livez))
        .route("/readyz", axum::routing::get(admin::readyz))
        .route("/metrics", axum::routing::get(admin::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    let guard = Guard { state: state.clone(), in_flight: None, body_limits: None };
    with_layers(router, guard, None).with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such endpoint; see /openapi.json on the API listener")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed on this endpoint; see /openapi.json")
}

/// What [`guard_request`] checks on one listener: the API sheds load and refuses declared
/// oversize bodies; the admin listener only counts its requests.
#[derive(Clone)]
struct Guard {
    state: AppState,
    /// `api.max_concurrent_requests` permits (long-polls included).
    in_flight: Option<Arc<tokio::sync::Semaphore>>,
    body_limits: Option<BodyLimits>,
}

/// Largest request bodies of the API, in bytes.
#[derive(Debug, Clone, Copy)]
struct BodyLimits {
    /// `api.max_message_bytes`: every route but the batch put.
    message: usize,
    /// A batch put: `api.max_batch_bytes` of bodies in base64 (4/3), and up to 1 KiB of JSON and
    /// kind fields per message.
    batch: usize,
}

impl BodyLimits {
    fn of(config: &Config) -> BodyLimits {
        let api = &config.api;
        let batch =
            api.max_batch_bytes.div_ceil(3).saturating_mul(4).saturating_add(api.max_batch.saturating_mul(1024));
        BodyLimits { message: api.max_message_bytes, batch }
    }
}

/// 503 `overloaded` at once when `api.max_concurrent_requests` requests are already being handled
/// (shedding keeps memory bounded and answers fast instead of queueing); 413 at once for a body
/// declared (`Content-Length`) larger than the limit, before anything reads it (hyper sends
/// `100 Continue` only when the body is first read, so a client that sent
/// `Expect: 100-continue` is told to stop instead of being asked to upload the body).
fn refusal(
    guard: &Guard,
    route: &str,
    request: &Request,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ApiError> {
    if let Some(limits) = guard.body_limits {
        let (limit, key) = if route == batch::BATCH_PUT_ROUTE {
            (limits.batch, "api.max_batch_bytes, as base64 in JSON")
        } else {
            (limits.message, "api.max_message_bytes")
        };
        let declared = request
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|len| len > u64::try_from(limit).unwrap_or(u64::MAX)) {
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the body is larger than {limit} bytes ({key})"),
            ));
        }
    }
    match &guard.in_flight {
        Some(in_flight) => match in_flight.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(ApiError::new(
                ErrorCode::Overloaded,
                "zkq is handling api.max_concurrent_requests requests already; retry after the Retry-After delay",
            )),
        },
        None => Ok(None),
    }
}

/// The `method` label: the standard methods, and `other` for any other token a client sends
/// (a method is free text in HTTP: as a label it would grow the series without bound).
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// Counts and times every request by route template (never the raw path: bounded labels), and
/// answers the [`refusal`]s before the handler runs. One middleware for all of it: each
/// middleware boxes the rest of the stack's future, and a waiting long-poll holds every box.
async fn guard_request(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let route =
        request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(request.method());
    let started = Instant::now();
    // Set (kept or made) by the request-id layer; every log line of the request carries it.
    let request_id = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let span = tracing::info_span!("request", id = %request_id, %method, %route);
    let response = match refusal(&guard, &route, &request) {
        Ok(permit) => {
            let response = next.run(request).instrument(span).await;
            drop(permit);
            response
        },
        Err(refused) => refused.into_response(),
    };
    let status = response.status();
    let metrics = &guard.state.metrics;
    metrics.http_requests.with_label_values(&[&route, method, status.as_str()]).inc();
    metrics.http_request_duration.with_label_values(&[&route, method]).observe(started.elapsed().as_secs_f64());
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::error!(request = %request_id, %method, %route, status = status.as_u16(), "request failed");
    } else {
        tracing::debug!(request = %request_id, %method, %route, status = status.as_u16(), "request served");
    }
    response
}
