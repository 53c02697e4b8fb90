//! `POST /messages`, `GET /messages/{key}`, `GET /messages/{key}/attempts`.
//!
//! The idempotency protocol, in order:
//! 1. authenticate; parse the `Idempotency-Key` and the body (a rejected
//!    request stores nothing);
//! 2. insert the message as `processing` under the unique (tenant, key)
//!    constraint, its first attempt started and the lease held: the insert
//!    alone decides which of several racing requests owns the send;
//! 3. the owner spawns the delivery task and waits for its outcome; any other
//!    request with the same key compares fingerprints (422 on mismatch),
//!    replays a final response byte for byte, or waits for it (409 when the
//!    wait runs out).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::{Authenticated, BODY_LIMIT, SharedState, Tenant, preferred_wait};
use crate::clock::to_time;
use crate::domain::request::RequestError;
use crate::domain::schedule::{self, cancelable};
use crate::domain::{FieldError, IdempotencyKey, MessageId, SendRequest, Status};
use crate::error::ApiError;
use crate::store::{Claim, MessageRecord, NewMessage, StoredResponse, TenantAuth};

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
    let tenant_id = tenant.id;
    // The tenant's request rate covers every POST, replays included.
    state
        .limiter
        .request(tenant_id)
        .map_err(|r| ApiError::RateLimited {
            limit: r.limit,
            retry_after: r.retry_after,
        })?;
    let key = match headers.get("idempotency-key") {
        None => return Err(ApiError::MissingIdempotencyKey),
        Some(v) => {
            IdempotencyKey::parse_header(v.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)?
        }
    };
    if !is_json(&headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let body = read_body(body, state.body_read_timeout).await?;
    let request = SendRequest::parse(&body).map_err(|e| match e {
        RequestError::Malformed => ApiError::MalformedJson,
        RequestError::Invalid(errors) => ApiError::Validation(errors),
    })?;
    check_policy(&request, &tenant, state.max_segments)?;
    let budget = preferred_wait(&headers, &state.wait);
    let fingerprint = request.fingerprint();

    // A final response is immutable: a replay of one this instance has seen
    // touches no database (the cache never outlives retention or a purge).
    let now = state.clock.now();
    // A `send_at` in the future, or the tenant's quiet hours, schedule the
    // message instead of sending.
    let due =
        schedule::start_at(request.send_at, now).map_err(|e| ApiError::Validation(vec![e]))?;
    let due = start_with_quiet_hours(&request, &tenant, due, now);
    if let Some(hit) = state.replays.get(tenant_id, key.as_str(), now) {
        if hit.fingerprint != fingerprint {
            return Err(ApiError::KeyReused);
        }
        let status = StatusCode::from_u16(hit.status_code).unwrap_or(StatusCode::CREATED);
        return Ok(message_response(status, hit.body, key.as_str(), true));
    }
    let replay_ticket = state.replays.ticket();

    let deliverer = &state.deliverer;
    // Validity and the retry deadline run from when the message starts.
    let starts = due.unwrap_or(now);
    let send_at = request.send_at.filter(|t| *t > now);
    let new = new_message(
        &state,
        tenant_id,
        key.clone(),
        request,
        &fingerprint,
        now,
        starts,
    );
    let lease = deliverer.new_lease();

    // Destination limits and the bound on queued sends count new sends
    // only: a request refused by either whose key already exists is a
    // replay (or a 422) and goes on. A scheduled message waits in the
    // database, not in this instance's send queue.
    let permit = state.limiter.send(tenant_id, &new.to);
    let queue_ticket = if due.is_some() {
        None
    } else {
        deliverer.reserve()
    };
    let queue_full = due.is_none() && queue_ticket.is_none();
    let permit = if permit.is_err() || queue_full {
        let exists = state
            .store
            .key_state(tenant_id, key.as_str())
            .await?
            .is_some();
        match permit {
            Err(refused) if !exists => {
                return Err(ApiError::RateLimited {
                    limit: refused.limit,
                    retry_after: refused.retry_after,
                });
            }
            Err(_) => None,
            Ok(permit) if !exists => {
                state.limiter.refund(permit);
                return Err(ApiError::Overloaded);
            }
            Ok(permit) => Some(permit),
        }
    } else {
        permit.ok()
    };
    crate::failpoint::hit("claim.before");
    let claim = match due {
        Some(due) => state.store.schedule_message(&new, due, send_at).await,
        None => state.store.insert_message(&new, &lease).await,
    };
    crate::failpoint::hit("claim.after");
    if !matches!(claim, Ok(Claim::Created(_)))
        && let Some(permit) = permit
    {
        state.limiter.refund(permit);
    }
    match claim? {
        Claim::Created(record) if record.status == Status::Scheduled => {
            // Any instance's scheduler starts it when due.
            drop(queue_ticket);
            if let Some(at) = record.next_attempt_at {
                deliverer.nudge_at(at);
            }
            Ok(message_response(
                StatusCode::ACCEPTED,
                record.to_out().to_json(),
                key.as_str(),
                false,
            ))
        }
        Claim::Created(record) => {
            let id = record.id;
            deliverer.spawn_queued(*record, lease, queue_ticket);
            let (response, done) = respond_when_final(&state, id, key.as_str(), budget).await?;
            if let Some(done) = done {
                remember(&state, tenant_id, &key, &fingerprint, &done, replay_ticket);
            }
            Ok(response)
        }
        Claim::Existing(existing) => {
            drop(queue_ticket);
            if existing.fingerprint != fingerprint {
                return Err(ApiError::KeyReused);
            }
            if let Some(response) = existing.response {
                remember(
                    &state,
                    tenant_id,
                    &key,
                    &fingerprint,
                    &response,
                    replay_ticket,
                );
                return Ok(stored(response, key.as_str(), true));
            }
            if existing.status == Status::Scheduled {
                // Waiting for a send weeks away makes no sense: the message
                // as it stands, as the first answer gave it.
                let record = state
                    .store
                    .message_by_id(existing.id)
                    .await?
                    .ok_or(ApiError::NotFound)?;
                if record.status == Status::Scheduled {
                    return Ok(message_response(
                        StatusCode::ACCEPTED,
                        record.to_out().to_json(),
                        key.as_str(),
                        true,
                    ));
                }
            }
            if budget.is_zero() {
                return Err(ApiError::KeyInUse);
            }
            // Waiting holds a place among the tenant's waiters, not a
            // database connection: one poller per message reads its row.
            let Some(_waiting) = state.waiters.enter(tenant_id) else {
                return Err(ApiError::TooManyWaiters);
            };
            match deliverer.await_final(existing.id, budget).await? {
                Some(response) => {
                    remember(
                        &state,
                        tenant_id,
                        &key,
                        &fingerprint,
                        &response,
                        replay_ticket,
                    );
                    Ok(stored(response, key.as_str(), true))
                }
                None => Err(ApiError::KeyInUse),
            }
        }
    }
}

/// When a request starts, given its checked `send_at` (`due`): later still
/// if that falls in the tenant's quiet hours in the recipient's zones
/// (unless the request says `"quiet_hours": false`). `None`: at once.
pub(crate) fn start_with_quiet_hours(
    request: &SendRequest,
    tenant: &TenantAuth,
    due: Option<time::OffsetDateTime>,
    now: time::OffsetDateTime,
) -> Option<time::OffsetDateTime> {
    let Some(quiet) = tenant.quiet_hours.as_ref() else {
        return due;
    };
    let zones = crate::domain::quiet::zones_for(request.to.as_str(), request.to_country.as_deref());
    schedule::starts_at(
        due,
        now,
        Some(quiet),
        request.quiet_hours != Some(false),
        &zones,
    )
}

/// The row a valid request makes, starting at `starts` (now, or when it is
/// scheduled): its validity and retry deadline run from then.
pub(crate) fn new_message(
    state: &SharedState,
    tenant_id: uuid::Uuid,
    key: IdempotencyKey,
    request: SendRequest,
    fingerprint: &[u8],
    now: time::OffsetDateTime,
    starts: time::OffsetDateTime,
) -> NewMessage {
    let sender = state.deliverer.first_route(request.from.as_deref()).sender;
    NewMessage {
        id: MessageId::new(),
        tenant_id,
        idempotency_key: key,
        fingerprint: fingerprint.to_vec(),
        to: request.to,
        from: request.from,
        body: request.body,
        segments: request.segments.segments,
        encoding: request.segments.encoding,
        metadata: request.metadata,
        validity_seconds: request.validity_seconds,
        provider: state.deliverer.provider_name().to_string(),
        sender,
        created_at: now,
        expires_at: request
            .validity_seconds
            .map(|s| starts + time::Duration::seconds(i64::from(s))),
        deadline_at: starts + to_time(state.deliverer.settings().retry.deadline),
    }
}

/// Keeps a final response for replays without the database.
fn remember(
    state: &SharedState,
    tenant_id: uuid::Uuid,
    key: &IdempotencyKey,
    fingerprint: &[u8],
    response: &StoredResponse,
    ticket: u64,
) {
    state.replays.put(
        tenant_id,
        key.as_str(),
        fingerprint,
        response,
        ticket,
        state.clock.now(),
    );
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

/// What the tenant and the service allow beyond a well-formed request.
pub(crate) fn check_policy(
    request: &SendRequest,
    tenant: &TenantAuth,
    max_segments: u32,
) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if request.segments.segments > max_segments {
        errors.push(FieldError {
            field: "body".into(),
            message: format!(
                "takes {} SMS segments; at most {max_segments} are allowed",
                request.segments.segments
            ),
        });
    }
    if let Some(allowed) = &tenant.allowed_countries {
        let ok = request
            .to_country
            .as_ref()
            .is_some_and(|c| allowed.iter().any(|a| a.eq_ignore_ascii_case(c)));
        if !ok {
            errors.push(FieldError {
                field: "to".into(),
                message: format!(
                    "the destination country is not allowed for this account (allowed: {})",
                    allowed.join(", ")
                ),
            });
        }
    }
    if !tenant.may_send_as(request.from.as_deref()) {
        errors.push(FieldError {
            field: "from".into(),
            message: if tenant.allowed_senders.is_some() {
                "this sender is not on this account's list of allowed senders".into()
            } else {
                "this account has no allowed senders: leave `from` out to use the default sender"
                    .into()
            },
        });
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::Validation(errors))
    }
}

/// The owner's answer: 201 with the final message, or 202 with the message
/// as it stands when the wait runs out; with the final response, if any.
async fn respond_when_final(
    state: &SharedState,
    id: MessageId,
    key: &str,
    budget: Duration,
) -> Result<(Response, Option<StoredResponse>), ApiError> {
    if let Some(response) = state.deliverer.await_final(id, budget).await? {
        return Ok((stored(response.clone(), key, false), Some(response)));
    }
    let record =
        state.store.message_by_id(id).await?.ok_or_else(|| {
            ApiError::Internal("a message vanished right after its insert".into())
        })?;
    if let Some(response) = record.response.clone() {
        return Ok((stored(response.clone(), key, false), Some(response)));
    }
    Ok((
        message_response(StatusCode::ACCEPTED, record.to_out().to_json(), key, false),
        None,
    ))
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
) -> Result<Response, ApiError> {
    let (_, record) = message_at(&state, tenant_id, key).await?;
    let attempts = state.store.attempts(record.id).await?;
    Ok(Json(serde_json::json!({ "data": attempts })).into_response())
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
        let mut out = record.to_out();
        out.status = Status::Canceled;
        out.updated_at = now;
        out.next_attempt_at = None;
        let response = StoredResponse {
            status_code: StatusCode::OK.as_u16(),
            body: out.to_json(),
        };
        if state
            .store
            .cancel_message(record.id, record.attempts, now, &response)
            .await?
        {
            state.metrics.message_final(Status::Canceled.as_str());
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
