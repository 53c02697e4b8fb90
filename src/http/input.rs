//! What handlers read from a request before the resource's own logic: the
//! tenant's request rate, the `Idempotency-Key`, a JSON body within its
//! limits. One place, so every route refuses bad input the same way.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use uuid::Uuid;

use super::{BODY_LIMIT, SharedState};
use crate::domain::IdempotencyKey;
use crate::error::ApiError;

/// Counts a request against the tenant's request rate (429 over it).
pub(crate) fn request_rate(state: &SharedState, tenant_id: Uuid) -> Result<(), ApiError> {
    state
        .limiter
        .request(tenant_id)
        .map_err(|r| ApiError::RateLimited {
            limit: r.limit,
            retry_after: r.retry_after,
        })
}

/// The request's `Idempotency-Key` header, required.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    optional_idempotency_key(headers)?.ok_or(ApiError::MissingIdempotencyKey)
}

/// The request's `Idempotency-Key` header, if any.
pub(crate) fn optional_idempotency_key(
    headers: &HeaderMap,
) -> Result<Option<IdempotencyKey>, ApiError> {
    headers
        .get("idempotency-key")
        .map(|v| {
            IdempotencyKey::parse_header(v.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)
        })
        .transpose()
}

/// A JSON request body: `application/json` (or `+json`), whole within
/// `limit` bytes and the body-read deadline.
pub(crate) async fn json_body(
    state: &SharedState,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    read_body_limited(body, state.body_read_timeout, limit).await
}

pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let mime = ct.split(';').next().unwrap_or("").trim();
    mime.eq_ignore_ascii_case("application/json")
        || mime
            .get(mime.len().saturating_sub(5)..)
            .is_some_and(|s| s.eq_ignore_ascii_case("+json"))
            && mime.to_ascii_lowercase().starts_with("application/")
}

/// Reads the body within the size and time limits.
pub(crate) async fn read_body(body: Body, timeout: Duration) -> Result<Bytes, ApiError> {
    read_body_limited(body, timeout, BODY_LIMIT).await
}

/// Reads the body within `limit` bytes and the time limit.
pub(crate) async fn read_body_limited(
    body: Body,
    timeout: Duration,
    limit: usize,
) -> Result<Bytes, ApiError> {
    crate::body::read_limited(body, timeout, limit)
        .await
        .map_err(|e| match e {
            crate::body::BodyError::TooSlow => ApiError::RequestTimeout,
            crate::body::BodyError::TooLarge => ApiError::PayloadTooLarge,
            crate::body::BodyError::Broken => ApiError::MalformedJson,
        })
}
