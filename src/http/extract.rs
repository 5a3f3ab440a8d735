//! Extractors whose rejections use the API's JSON error shape.

use std::time::Duration;

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorCode};

/// `Query<T>` with JSON errors.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(|e: QueryRejection| ApiError::invalid(format!("bad query string: {}", e.body_text())))
    }
}

/// `Path<T>` with JSON errors.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| ApiPath(v))
            .map_err(|e: PathRejection| ApiError::new(ErrorCode::BadRequest, format!("bad path: {}", e.body_text())))
    }
}

/// The raw request body, with JSON errors (413 when over the limit).
pub struct ApiBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(req, state).await.map(ApiBody).map_err(|e: BytesRejection| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorCode::PayloadTooLarge, "message body is larger than api.max_message_bytes")
            } else {
                ApiError::new(ErrorCode::BadRequest, format!("cannot read the body: {}", e.body_text()))
            }
        })
    }
}

/// Parses a duration parameter: `20s`, `500ms`, `2m`, or a bare number of seconds.
pub fn parse_duration(name: &str, text: &str) -> Result<Duration, ApiError> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(text).map_err(|_| {
        ApiError::invalid(format!("`{name}` = {text:?} is not a duration; write it like 20s, 500ms or 2m"))
    })
}
