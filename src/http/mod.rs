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
mod state;
pub mod wire;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tracing::Instrument;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::config::Config;
use error::{ApiError, ErrorCode};
pub use state::AppState;
pub use wire::API_TOKEN_HEADER;

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
    let mut openapi = api_routes().into_openapi();
    document_access_control(&mut openapi);
    openapi
}

/// The API token as a security scheme (optional: required only when `api.token_file` is set),
/// and the 401 and 403 answers of [`guard_access`] on every operation.
fn document_access_control(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityRequirement, SecurityScheme};
    use utoipa::openapi::{Content, Ref, Response};
    openapi.components.get_or_insert_with(Default::default).add_security_scheme(
        "api_token",
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            API_TOKEN_HEADER,
            "The token of api.token_file; required only when zkq is configured with one",
        ))),
    );
    openapi.security =
        Some(vec![SecurityRequirement::new("api_token", Vec::<String>::new()), SecurityRequirement::default()]);
    let error = |description: &str| {
        let mut response = Response::new(description);
        response
            .content
            .insert("application/json".to_owned(), Content::new(Some(Ref::from_schema_name("ErrorBody"))).into());
        response
    };
    for item in openapi.paths.paths.values_mut() {
        for operation in
            [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch].into_iter().flatten()
        {
            let responses = &mut operation.responses.responses;
            responses.entry("401".to_owned()).or_insert_with(|| {
                error("`unauthorized`: zkq has an API token (api.token_file) and the request's zkq-api-token header is missing or wrong").into()
            });
            responses.entry("403".to_owned()).or_insert_with(|| {
                error("`cross_origin_refused`: a web browser sent the request for a page of another origin").into()
            });
        }
    }
}

/// The document as committed: pretty JSON with a trailing newline.
pub fn openapi_json() -> String {
    let mut text = openapi_document().to_pretty_json().unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

/// The queue API router.
pub fn api_router(state: AppState) -> Router {
    let (router, mut openapi) = api_routes().split_for_parts();
    document_access_control(&mut openapi);
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
        access: true,
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
    let guard = Guard { state: state.clone(), in_flight: None, body_limits: None, access: false };
    with_layers(router, guard, None).with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such endpoint; see /openapi.json on the API listener")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed on this endpoint; see /openapi.json")
}

/// Who may use the API: refuses requests a web browser sends for another site's page (403
/// `cross_origin_refused`, unless `api.refuse_cross_origin = false`), and with an API token
/// configured, requests without it (401 `unauthorized`). The OpenAPI document and its viewer
/// (`/openapi.json`, `/docs`) hold no data and need no token.
fn access_refusal(state: &AppState, request: &Request) -> Option<ApiError> {
    if state.config.api.refuse_cross_origin
        && let Some(why) = browser_request_refused(request.headers())
    {
        return Some(ApiError::new(
            ErrorCode::CrossOriginRefused,
            format!(
                "{why}: zkq's API is for the application in its pod, not for web pages \
                 (api.refuse_cross_origin)"
            ),
        ));
    }
    if let Some(token) = &state.api_token {
        let path = request.uri().path();
        let open = path == "/openapi.json" || path == "/docs" || path.starts_with("/docs/");
        if !open {
            let refusal = match request.headers().get(API_TOKEN_HEADER) {
                None => Some("the request has no zkq-api-token header; zkq requires the token of api.token_file"),
                Some(given) if !same_secret(given.as_bytes(), token.expose().as_bytes()) => {
                    Some("the zkq-api-token header does not match the token of api.token_file")
                },
                Some(_) => None,
            };
            if let Some(message) = refusal {
                return Some(ApiError::new(ErrorCode::Unauthorized, message));
            }
        }
    }
    None
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was right.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
}

/// Why a request that a web browser sent must be refused, if it must. Browsers mark their
/// requests with `Sec-Fetch-Site` and (for most cross-origin ones) `Origin`; other HTTP clients
/// send neither. Allowed from a browser: a page zkq served itself (`/docs`) or a URL typed in,
/// with the host given as an address or `localhost` (a name would allow DNS rebinding: a page
/// whose own name resolves to 127.0.0.1).
fn browser_request_refused(headers: &axum::http::HeaderMap) -> Option<String> {
    use axum::http::header::{HOST, ORIGIN};
    let site = headers.get("sec-fetch-site").map(|v| v.to_str().unwrap_or("?").to_ascii_lowercase());
    let origin = headers.get(ORIGIN).map(|v| v.to_str().unwrap_or("?").to_owned());
    if site.is_none() && origin.is_none() {
        return None;
    }
    if let Some(site) = site.as_deref()
        && (site == "cross-site" || site == "same-site")
    {
        return Some(format!("a web browser sent this request for a page of another site (Sec-Fetch-Site: {site})"));
    }
    let host = headers.get(HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if let Some(origin) = origin
        && origin != format!("http://{host}")
    {
        return Some(format!("a web browser sent this request for the page of another origin (Origin: {origin})"));
    }
    let name = host.rsplit_once(':').map_or(
        host,
        |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }
        },
    );
    let literal = name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok()
        || name.trim_start_matches('[').trim_end_matches(']').parse::<std::net::Ipv6Addr>().is_ok();
    if !literal {
        return Some(format!("a web browser sent this request to the host name `{name}` (use 127.0.0.1 or localhost)"));
    }
    None
}

/// What [`guard_request`] checks on one listener: the API sheds load and refuses declared
/// oversize bodies; the admin listener only counts its requests.
#[derive(Clone)]
struct Guard {
    state: AppState,
    /// `api.max_concurrent_requests` permits (long-polls included).
    in_flight: Option<Arc<tokio::sync::Semaphore>>,
    body_limits: Option<BodyLimits>,
    /// The API listener checks who may use it ([`access_refusal`]); the admin listener does not.
    access: bool,
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
    if guard.access
        && let Some(refused) = access_refusal(&guard.state, request)
    {
        return Err(refused);
    }
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
