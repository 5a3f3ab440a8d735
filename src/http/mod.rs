//! zkq's native API: routes, extractors, the error table, the OpenAPI document.
//!
//! Two listeners: the API (queues; loopback by default, for the app in the pod) and the admin
//! listener (`/livez`, `/readyz`, `/metrics`, for the kubelet and Prometheus). Both stand on
//! `crate::web`'s server and guard, as the SQS-compatible API (`crate::sqs`) does.

#![allow(clippy::disallowed_types, reason = "src/http/ owns the HTTP statuses")]

mod admin;
pub(crate) mod attributes;
pub(crate) mod batch;
pub(crate) mod counters;
pub(crate) mod error;
mod extract;
pub(crate) mod leases;
mod openapi;
pub(crate) mod queues;
pub(crate) mod redrive;
mod state;
pub(crate) mod wire;

use std::sync::Arc;

use axum::Router;

use error::{ApiError, ErrorCode, Native};
pub use openapi::openapi_json;
use openapi::{api_routes, document_access_control, document_bounds};
pub(crate) use state::AppState;

use crate::web::{Access, BodyLimits, Guard, TokenCheck, with_layers};

/// The queue API router. `admin` is where the admin listener listens: the API's 404 for the admin
/// paths (`/livez`, `/readyz`, `/metrics`) names it, so a request sent to the wrong port says where to go.
pub(crate) fn api_router(state: AppState, admin: std::net::SocketAddr) -> Router {
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
    let access = Access {
        refuse_cross_origin: state.config.api.refuse_cross_origin,
        token: state.api_token.clone().map(|token| TokenCheck { token, exempt: holds_no_data }),
    };
    let guard = Guard {
        metrics: state.metrics.clone(),
        in_flight: Some(Arc::new(tokio::sync::Semaphore::new(state.config.api.max_concurrent_requests))),
        body_limits: Some(limits),
        batch_route: Some(batch::BATCH_PUT_ROUTE),
        access,
        dialect: Arc::new(Native),
    };
    with_layers(router, guard, Some(limits.message.max(limits.batch))).with_state(state)
}

/// The OpenAPI document and its viewer (`/openapi.json`, `/docs`) hold no data and need no token.
fn holds_no_data(path: &str) -> bool {
    path == "/openapi.json" || path == "/docs" || path.starts_with("/docs/")
}

/// The admin router: health and metrics.
pub(crate) fn admin_router(state: AppState) -> Router {
    let router = Router::new()
        .route("/livez", axum::routing::get(admin::livez))
        .route("/readyz", axum::routing::get(admin::readyz))
        .route("/metrics", axum::routing::get(admin::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    let guard = Guard {
        metrics: state.metrics.clone(),
        in_flight: None,
        body_limits: None,
        batch_route: None,
        access: Access::default(),
        dialect: Arc::new(Native),
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
