//! `/livez`, `/readyz`, `/metrics` on the admin listener.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::error::{ApiError, ErrorCode};
use super::state::AppState;
use crate::door::Readiness;

#[derive(Serialize)]
struct Health {
    status: &'static str,
    zookeeper: &'static str,
    session: String,
}

/// The process is alive and serving HTTP. Never depends on ZooKeeper.
pub(super) async fn livez() -> impl IntoResponse {
    Json(serde_json::json!({"status": "alive"}))
}

/// Why zkq is not ready, or `None` when it is: the session is connected and zkq is not shutting down.
fn not_ready_reason(state: &AppState, readiness: &Readiness) -> Option<String> {
    if state.draining.is_cancelled() {
        return Some("zkq is shutting down".to_owned());
    }
    readiness.not_serving.clone()
}

/// Ready only while the session is connected and zkq is not shutting down.
pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    let readiness = state.door.readiness();
    match not_ready_reason(&state, &readiness) {
        None => {
            Json(Health { status: "ready", zookeeper: readiness.state, session: readiness.session }).into_response()
        },
        Some(message) => {
            // Why the last attempt to open a session failed (a TLS handshake, refused credentials).
            let last = match &readiness.last_error {
                Some(error) if !state.draining.is_cancelled() => format!("; last attempt: {error}"),
                _ => String::new(),
            };
            ApiError::new(ErrorCode::NotReady, format!("{message} (state: {}){last}", readiness.state)).into_response()
        },
    }
}

/// How long a scrape waits for the queue depths and head ages it reads from ZooKeeper.
const SCRAPE_SAMPLE_BUDGET: Duration = Duration::from_secs(1);

/// Prometheus text format; queue depths and head ages are read from ZooKeeper first (bounded),
/// and `zkq_ready` says what `/readyz` would answer.
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    state.metrics.ready.set(i64::from(not_ready_reason(&state, &state.door.readiness()).is_none()));
    state.door.queues().sample_for_scrape(SCRAPE_SAMPLE_BUDGET).await;
    match state.metrics.render() {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response(),
        Err(err) => ApiError::new(ErrorCode::Internal, format!("cannot render metrics: {err}")).into_response(),
    }
}
