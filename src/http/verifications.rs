//! `POST /verifications`, `GET /verifications/{id}`, and a verification's
//! `check`, `resend` and `cancel` (see `src/verify/mod.rs`).
//!
//! A start follows the idempotency protocol of `POST /messages`: the insert
//! under the unique (tenant, key) constraint decides which request owns the
//! verification; its first message is inserted in the same transaction and
//! delivered by a task of its own, so the handler never calls the provider.
//! A replay answers the verification as it is now (it has no frozen final
//! answer: its status moves on with checks), with `Idempotent-Replayed`.
//! Checks and resends with an `Idempotency-Key` replay their first answer,
//! stored in the transaction that made the change.

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use uuid::Uuid;

use super::input::{idempotency_key, json_body, optional_idempotency_key, request_rate};
use super::{Authenticated, SharedState, Tenant};
use crate::domain::{FieldError, segments};
use crate::error::ApiError;
use crate::store::{
    Changed, Lease, MessageRecord, NewVerification, OpKey, OpKind, StartOutcome, StartPolicy,
    StoreError, StoredOp, StoredResponse, VerificationRecord, send_key,
};
use crate::verify::decide::{self, PausePolicy};
use crate::verify::{
    SentMessage, StartRequest, VerificationOut, crypto, next_send, parse_check, parse_id,
    public_id, send_message,
};

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/verifications", post(create))
        .route("/verifications/{id}", get(show))
        .route("/verifications/{id}/check", post(check))
        .route("/verifications/{id}/resend", post(resend))
        .route("/verifications/{id}/cancel", post(cancel))
}

fn respond(status: StatusCode, body: Vec<u8>, id: Uuid, replayed: bool) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("/verifications/{}", public_id(id))) {
        h.insert(header::LOCATION, v);
    }
    if replayed {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    resp
}

fn stored(r: StoredResponse, id: Uuid) -> Response {
    let status = StatusCode::from_u16(r.status_code).unwrap_or(StatusCode::OK);
    respond(status, r.body, id, true)
}

fn bad_body(e: Option<Vec<FieldError>>) -> ApiError {
    match e {
        None => ApiError::MalformedJson,
        Some(errors) => ApiError::Validation(errors),
    }
}

fn path_id(id: Result<Path<String>, PathRejection>) -> Result<Uuid, ApiError> {
    let Path(id) = id.map_err(|_| ApiError::NotFound)?;
    parse_id(&id).ok_or(ApiError::NotFound)
}

fn not_pending(s: decide::VerificationStatus) -> ApiError {
    ApiError::VerificationNotPending(s.as_str())
}

/// The messages sent for a verification, as answered (purged ones left out).
async fn messages(
    state: &SharedState,
    v: &VerificationRecord,
) -> Result<Vec<SentMessage>, ApiError> {
    let mut out = Vec::new();
    for n in 1..=v.sends {
        if let Some(m) = state.store.message(v.tenant_id, &send_key(v.id, n)).await? {
            out.push(SentMessage::of(&m, v));
        }
    }
    Ok(out)
}

async fn resource(state: &SharedState, v: &VerificationRecord) -> Result<Vec<u8>, ApiError> {
    let messages = messages(state, v).await?;
    Ok(VerificationOut::of(v, messages, &state.verify.settings, state.clock.now()).to_json())
}

async fn create(
    State(state): State<SharedState>,
    Authenticated(tenant): Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    request_rate(&state, tenant.id)?;
    let key = idempotency_key(&headers)?;
    let body = json_body(&state, &headers, body, super::BODY_LIMIT).await?;
    let request = StartRequest::parse(&body).map_err(bad_body)?;
    let mut errors: Vec<FieldError> =
        crate::send::country_refused(&tenant, request.country.as_deref())
            .into_iter()
            .collect();
    let longest = "9".repeat(usize::try_from(request.code_length).unwrap_or(10));
    let sample = crate::verify::render(request.template.as_deref(), &longest);
    if segments::count(&sample).segments > state.max_segments {
        errors.push(FieldError {
            field: "template".into(),
            message: format!("takes more than {} SMS segments", state.max_segments),
        });
    }
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let verify = &state.verify;
    let keys = verify.secret.keys().await?;
    let now = state.clock.now();
    let id = Uuid::now_v7();
    let code = crypto::generate_code(request.code_length);
    let new = NewVerification {
        id,
        tenant_id: tenant.id,
        idempotency_key: key.to_string(),
        fingerprint: request.fingerprint(),
        to: request.to.to_string(),
        country: request.country.clone(),
        prefix: crate::ratelimit::prefix_of(request.to.as_str()),
        code_length: request.code_length,
        code_mac: keys.code_mac(id, &code).to_vec(),
        code_sealed: keys.seal(id.as_bytes(), code.as_bytes()),
        template: request.template.clone(),
        checks_remaining: verify.settings.max_checks,
        created_at: now,
        expires_at: now + time::Duration::seconds(i64::from(request.ttl_seconds)),
    };
    let mut first = VerificationRecord::started(&new);
    first.sends = 0;
    let deliverer = &state.deliverer;
    let message = send_message(
        &keys,
        &first,
        1,
        &code,
        &deliverer.first_route(None),
        deliverer.settings().retry.deadline,
        now,
    )
    .ok_or_else(|| ApiError::Internal("a parsed number is not E.164".into()))?;
    drop(code);
    let lease = deliverer.new_lease();
    // The code's SMS counts against the destination limits like any send
    // (issue 29, finding 3); refused, a new start is refused by the store
    // and a replay still answered.
    let permit = state.limiter.send(tenant.id, request.to.as_str());
    let policy = StartPolicy {
        refused_here: permit.as_ref().err().copied(),
        number_per_hour: verify.number_per_hour,
        prefix_per_hour: verify.prefix_per_hour,
        pause: PausePolicy {
            min_starts: verify.settings.pause_min_starts,
            min_approval_percent: verify.settings.pause_min_approval_percent,
        },
        pause_window: verify.settings.pause_window,
        pause_for: verify.settings.pause_duration,
    };
    let country = request.country.as_deref();
    // Two starts with one key but different destinations take different
    // prefix locks; the unique (tenant, key) constraint decides, and the
    // loser, tried again, finds the winner's verification.
    let mut outcome = state
        .store
        .start_verification(&new, &message, &lease, &policy)
        .await;
    if matches!(outcome, Err(StoreError::Conflict { .. })) {
        outcome = state
            .store
            .start_verification(&new, &message, &lease, &policy)
            .await;
    }
    if !matches!(outcome, Ok(StartOutcome::Created { .. }))
        && let Ok(permit) = permit
    {
        state.limiter.refund(permit);
    }
    match outcome? {
        StartOutcome::Created {
            verification,
            message,
        } => {
            state.metrics.verify_event("start", country);
            state.metrics.verify_event("send", country);
            let out = VerificationOut::of(
                &verification,
                vec![SentMessage::of(&message, &verification)],
                &verify.settings,
                now,
            );
            deliverer.spawn(*message, lease);
            Ok(respond(StatusCode::CREATED, out.to_json(), id, false))
        }
        StartOutcome::Existing(v) => {
            if v.fingerprint != new.fingerprint {
                return Err(ApiError::KeyReused);
            }
            let body = resource(&state, &v).await?;
            Ok(respond(StatusCode::CREATED, body, v.id, true))
        }
        StartOutcome::Limited { limit, retry_after } => {
            Err(ApiError::RateLimited { limit, retry_after })
        }
        StartOutcome::Paused { until, newly } => {
            if newly {
                state.metrics.verify_event("pause", country);
            }
            let wait = std::time::Duration::try_from(until - now)
                .unwrap_or(std::time::Duration::from_secs(1));
            Err(ApiError::DestinationPaused(wait))
        }
    }
}

async fn show(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_id(id)?;
    let v = state
        .store
        .verification(tenant_id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(respond(
        StatusCode::OK,
        resource(&state, &v).await?,
        id,
        false,
    ))
}

/// How many times a check or a resend reads, decides and tries its fenced
/// write before giving up (503). Each failed try means another change was
/// written first, and a pending verification takes only a few (its checks
/// and sends are counted down), so this is never reached in practice.
const CHANGE_TRIES: usize = 64;

fn kept_changing() -> ApiError {
    ApiError::Unavailable("the verification kept changing under the write".into())
}

async fn check(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = path_id(id)?;
    let key = optional_idempotency_key(&headers)?;
    let body = json_body(&state, &headers, body, super::BODY_LIMIT).await?;
    let code = parse_check(&body).map_err(bad_body)?;
    let keys = state.verify.secret.keys().await?;
    // The fingerprint of a check is the code's HMAC: never the code.
    let fingerprint = keys.code_mac(id, &code);
    let op = key.as_ref().map(|k| OpKey {
        key: k.as_str(),
        fingerprint: &fingerprint,
    });
    let metrics = &state.metrics;
    for _ in 0..CHANGE_TRIES {
        let v = state
            .store
            .verification(tenant_id, id)
            .await?
            .ok_or(ApiError::NotFound)?;
        if let Some(op) = op
            && let Some(done) = state
                .store
                .verification_op(id, OpKind::Check, op.key)
                .await?
        {
            return replay_check(done, &fingerprint, id);
        }
        let country = v.country.as_deref();
        let now = state.clock.now();
        let matches = keys.code_matches(id, &code, &v.code_mac);
        let decision = decide::check(&v.state(), now, matches);
        let after = v.checked(decision, now);
        let valid = match decision {
            decide::Check::Approve => true,
            decide::Check::Wrong { .. } | decide::Check::LastWrong => false,
            decide::Check::Expire => {
                match state.store.check_verification(&v, &after, None).await? {
                    Changed::Stale => continue,
                    _ => {
                        metrics.verify_event("expiry", country);
                        return Err(not_pending(decide::VerificationStatus::Expired));
                    }
                }
            }
            decide::Check::NotPending(s) => return Err(not_pending(s)),
        };
        let mut out = VerificationOut::of(
            &after,
            messages(&state, &v).await?,
            &state.verify.settings,
            now,
        );
        out.valid = Some(valid);
        let response = StoredResponse {
            status_code: 200,
            body: out.to_json(),
        };
        match state
            .store
            .check_verification(&v, &after, op.map(|op| (op, &response)))
            .await?
        {
            Changed::Stale => continue,
            Changed::Replay(done) => return replay_check(done, &fingerprint, id),
            Changed::Written(_) => {}
        }
        metrics.verify_event("check", country);
        match decision {
            decide::Check::Approve => metrics.verify_event("approval", country),
            decide::Check::LastWrong => metrics.verify_event("max_attempts", country),
            _ => {}
        }
        return Ok(respond(StatusCode::OK, response.body, id, false));
    }
    Err(kept_changing())
}

/// The stored answer of a check under the same key, if it was this check.
fn replay_check(done: StoredOp, fingerprint: &[u8], id: Uuid) -> Result<Response, ApiError> {
    if done.fingerprint != fingerprint {
        return Err(ApiError::KeyReused);
    }
    Ok(stored(done.response, id))
}

/// What a resend came to.
enum Resent {
    /// Answered already under its key.
    Replay(StoredResponse),
    /// Sent: its answer, and its message with the lease it holds.
    Sent(StoredResponse, Box<MessageRecord>, Lease),
}

async fn resend(
    State(state): State<SharedState>,
    Authenticated(tenant): Authenticated,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    request_rate(&state, tenant.id)?;
    let id = path_id(id)?;
    let key = idempotency_key(&headers)?;
    let keys = state.verify.secret.keys().await?;
    let v = state
        .store
        .verification(tenant.id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    // A resend is a send: it counts against the destination limits like a
    // `POST /messages` (issue 29, finding 3), before anything is queued. A
    // retried resend already answered is a replay and goes on.
    let permit = match state.limiter.send(tenant.id, &v.to) {
        Ok(permit) => Some(permit),
        Err(refused) => {
            let answered = state
                .store
                .verification_op(id, OpKind::Resend, key.as_str())
                .await?;
            if answered.is_none() {
                return Err(ApiError::RateLimited {
                    limit: refused.limit,
                    retry_after: refused.retry_after,
                });
            }
            None
        }
    };
    let country = v.country.clone();
    let outcome = resend_once(&state, &keys, v, key.as_str()).await;
    if !matches!(outcome, Ok(Resent::Sent(..)))
        && let Some(permit) = permit
    {
        state.limiter.refund(permit);
    }
    match outcome {
        Ok(Resent::Replay(response)) => Ok(stored(response, id)),
        Ok(Resent::Sent(response, message, lease)) => {
            state.metrics.verify_event("send", country.as_deref());
            state.deliverer.spawn(*message, lease);
            Ok(respond(StatusCode::CREATED, response.body, id, false))
        }
        Err(e) => Err(e),
    }
}

/// Reads, decides and writes one resend under `key`, starting from `v` as
/// read, until a write holds.
async fn resend_once(
    state: &SharedState,
    keys: &crate::verify::Keys,
    mut v: VerificationRecord,
    key: &str,
) -> Result<Resent, ApiError> {
    let settings = &state.verify.settings;
    let deliverer = &state.deliverer;
    let op = OpKey {
        key,
        fingerprint: b"resend",
    };
    for _ in 0..CHANGE_TRIES {
        if let Some(done) = state
            .store
            .verification_op(v.id, OpKind::Resend, key)
            .await?
        {
            return Ok(Resent::Replay(done.response));
        }
        let now = state.clock.now();
        match decide::resend(
            &v.state(),
            now,
            settings.resend_cooldown,
            settings.max_sends,
        ) {
            decide::Resend::Send => {}
            decide::Resend::Expire => {
                let after = v.expired(now);
                if let Changed::Stale = state.store.check_verification(&v, &after, None).await? {
                    v = reread(state, &v).await?;
                    continue;
                }
                state.metrics.verify_event("expiry", v.country.as_deref());
                return Err(not_pending(decide::VerificationStatus::Expired));
            }
            decide::Resend::TooSoon(wait) => return Err(ApiError::ResendTooSoon(wait)),
            decide::Resend::MaxSends => return Err(ApiError::MaxSendsReached),
            decide::Resend::NotPending(s) => return Err(not_pending(s)),
        }
        let after = v.resent(now);
        let deadline = deliverer.settings().retry.deadline;
        let m = next_send(keys, &v, &deliverer.first_route(None), deadline, now).ok_or(
            StoreError::Invariant("a verification's code does not open with the verify secret"),
        )?;
        let mut all = messages(state, &v).await?;
        all.push(SentMessage::queued(&m, &after));
        let response = StoredResponse {
            status_code: 201,
            body: VerificationOut::of(&after, all, settings, now).to_json(),
        };
        let lease = deliverer.new_lease();
        match state
            .store
            .resend_verification(&v, &after, (op, &response), &m, &lease)
            .await?
        {
            Changed::Stale => v = reread(state, &v).await?,
            Changed::Replay(done) => return Ok(Resent::Replay(done.response)),
            Changed::Written(Some(message)) => return Ok(Resent::Sent(response, message, lease)),
            Changed::Written(None) => {
                return Err(ApiError::Internal(
                    "a resend written without its message".into(),
                ));
            }
        }
    }
    Err(kept_changing())
}

async fn reread(
    state: &SharedState,
    v: &VerificationRecord,
) -> Result<VerificationRecord, ApiError> {
    state
        .store
        .verification(v.tenant_id, v.id)
        .await?
        .ok_or(ApiError::NotFound)
}

async fn cancel(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_id(id)?;
    let now = state.clock.now();
    let v = state
        .store
        .cancel_verification(tenant_id, id, now)
        .await?
        .ok_or(ApiError::NotFound)?;
    match decide::status_at(&v.state(), now) {
        decide::VerificationStatus::Canceled => Ok(respond(
            StatusCode::OK,
            resource(&state, &v).await?,
            id,
            false,
        )),
        other => Err(not_pending(other)),
    }
}
