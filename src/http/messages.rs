//! `POST /messages`, `GET /messages/{key}`, `GET /messages/{key}/attempts`.
//!
//! `POST /messages` authenticates, parses the `Idempotency-Key` and the
//! body (a rejected request stores nothing), and hands the rest to the send
//! protocol (`crate::send`), whose outcome it only translates to HTTP.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::input::{idempotency_key, json_body, request_rate};
use super::{Authenticated, BODY_LIMIT, SharedState, Tenant, preferred_wait};
use crate::domain::request::RequestError;
use crate::domain::schedule::cancelable;
use crate::domain::{IdempotencyKey, SendRequest, Status};
use crate::error::ApiError;
use crate::send::Sent;
use crate::store::{MessageRecord, StoredResponse};

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/messages", post(create_message))
        .route("/messages/{key}", get(get_message))
        .route("/messages/{key}/attempts", get(list_attempts))
        .route("/messages/{key}/cancel", post(cancel_message))
}

/// Unreserved characters (RFC 3986) stay as they are in `Location`.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn location(key: &str) -> HeaderValue {
    let path = format!("/messages/{}", utf8_percent_encode(key, PATH_SEGMENT));
    // Percent-encoded ASCII is always a valid header value.
    HeaderValue::from_str(&path).unwrap_or_else(|_| HeaderValue::from_static("/messages"))
}

/// A response carrying a message body.
pub(crate) fn message_response(
    status: StatusCode,
    body: impl Into<Body>,
    key: &str,
    replayed: bool,
) -> Response {
    let mut resp = (status, body.into()).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::LOCATION, location(key));
    if replayed {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    resp
}

fn stored(response: StoredResponse, key: &str, replayed: bool) -> Response {
    let status = StatusCode::from_u16(response.status_code).unwrap_or(StatusCode::CREATED);
    message_response(status, response.body, key, replayed)
}

async fn create_message(
    State(state): State<SharedState>,
    Authenticated(tenant): Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // The tenant's request rate covers every POST, replays included.
    request_rate(&state, tenant.id)?;
    let key = idempotency_key(&headers)?;
    let body = json_body(&state, &headers, body, BODY_LIMIT).await?;
    let request = SendRequest::parse_in(
        &body,
        tenant.home_country.as_deref(),
        crate::provider::registry::chat_channels(),
    )
    .map_err(|e| match e {
        RequestError::Malformed => ApiError::MalformedJson,
        RequestError::Invalid(errors) => ApiError::Validation(errors),
    })?;
    let wait = preferred_wait(&headers, &state.wait);
    let sent = state
        .sends
        .send(&tenant, key.clone(), request, wait)
        .await?;
    Ok(sent_response(sent, key.as_str()))
}

/// Whether a send's outcome is the answer of an earlier request with the
/// key (`Idempotent-Replayed: true`; a batch item's `"replayed": true`).
pub(crate) fn is_replay(sent: &Sent) -> bool {
    matches!(
        sent,
        Sent::Replayed(_) | Sent::Remembered { .. } | Sent::ReplayedScheduled(_)
    )
}

/// A send's outcome as HTTP: 201 (or the frozen code) with a final message,
/// 202 with one still on its way, and `Idempotent-Replayed` on replays.
pub(crate) fn sent_response(sent: Sent, key: &str) -> Response {
    let replayed = is_replay(&sent);
    match sent {
        Sent::Final(response) | Sent::Replayed(response) => stored(response, key, replayed),
        Sent::Remembered { status_code, body } => {
            let status = StatusCode::from_u16(status_code).unwrap_or(StatusCode::CREATED);
            message_response(status, body, key, replayed)
        }
        Sent::Scheduled(record) | Sent::Pending(record) | Sent::ReplayedScheduled(record) => {
            message_response(
                StatusCode::ACCEPTED,
                record.to_out().to_json(),
                key,
                replayed,
            )
        }
    }
}

/// The tenant's message named by the key in a path. A path that cannot be a
/// key, and another tenant's key, are the same 404 as a key never used.
pub(crate) async fn message_at(
    state: &SharedState,
    tenant_id: uuid::Uuid,
    key: Result<Path<String>, PathRejection>,
) -> Result<(IdempotencyKey, MessageRecord), ApiError> {
    let Path(key) = key.map_err(|_| ApiError::NotFound)?;
    let key = IdempotencyKey::parse(&key).map_err(|_| ApiError::NotFound)?;
    let record = state
        .store
        .message(tenant_id, key.as_str())
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok((key, record))
}

/// `GET /messages/batch`: the static batch route shadows the message whose
/// key is `batch`; this serves it.
pub(crate) async fn get_message_named_batch(
    state: State<SharedState>,
    tenant: Tenant,
) -> Result<Response, ApiError> {
    get_message(state, tenant, Ok(Path("batch".to_string()))).await
}

async fn get_message(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    key: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let (key, record) = message_at(&state, tenant_id, key).await?;
    Ok(message_response(
        StatusCode::OK,
        record.to_out().to_json(),
        key.as_str(),
        false,
    ))
}

async fn list_attempts(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    key: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (_, record) = message_at(&state, tenant_id, key).await?;
    let list = format!("message-attempts:{}", record.id);
    let page = super::page::Page::of(&state, tenant_id, &list, query.as_deref(), 100, 1000).await?;
    let after = page.after_as(|b| Some(u32::from_be_bytes(b.try_into().ok()?)))?;
    // A message has few attempts (its retry policy bounds them): read whole.
    let mut attempts = state.store.attempts(record.id).await?;
    attempts.retain(|a| after.is_none_or(|n| a.number > n));
    let (data, next) = page.finish(attempts, |a| a.number.to_be_bytes().to_vec());
    Ok(Json(serde_json::json!({ "data": data, "next_cursor": next })).into_response())
}

/// `POST /messages/{key}/cancel`: a `scheduled` message, or one waiting for
/// a retry with no attempt in flight, becomes `canceled` (final: replays of
/// its `POST` then answer the canceled message). 409 `not-cancelable` once
/// it is final or an attempt may have reached the provider (one in flight,
/// one without a recorded answer, or one whose answer was ambiguous). Canceling a
/// canceled message answers it again (a retried cancel is safe).
///
/// The rule is [`cancelable`]; the write is one conditional `UPDATE` fenced
/// on the same rule, so a cancel racing a scheduler's claim is decided by
/// the database: whichever commits first wins and the other changes nothing.
async fn cancel_message(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    key: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let (key, mut record) = message_at(&state, tenant_id, key).await?;
    // A lost race re-reads the row: it has moved on (claimed, attempted,
    // canceled by another request), and the rule decides again.
    for _ in 0..3 {
        if record.status == Status::Canceled {
            return Ok(message_response(
                StatusCode::OK,
                record.to_out().to_json(),
                key.as_str(),
                false,
            ));
        }
        if !cancelable(
            record.status,
            record.lease.is_some(),
            record.last_attempt_open,
            record.maybe_sent,
        ) {
            return Err(ApiError::NotCancelable);
        }
        let now = state.clock.now();
        let response = record.canceled_response(now);
        if state
            .store
            .cancel_message(record.id, record.attempts, now, &response)
            .await?
        {
            state.metrics.message_final(
                Status::Canceled.as_str(),
                crate::provider::testmode::mode_of(&record.provider),
            );
            return Ok(stored(response, key.as_str(), false));
        }
        record = state
            .store
            .message_by_id(record.id)
            .await?
            .ok_or(ApiError::NotFound)?;
    }
    Err(ApiError::NotCancelable)
}
