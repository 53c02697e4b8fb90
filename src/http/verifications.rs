//! `POST /verifications`, `GET /verifications/{id}`, and a verification's
//! `check`, `resend` and `cancel` (see `src/verify/mod.rs`).
//!
//! A start follows the idempotency protocol of `POST /messages`: the insert
//! under the unique (tenant, key) constraint decides which request owns the
//! verification; its first message is inserted in the same transaction and
//! delivered by a task of its own, so the handler never calls the provider.
//! The protocol (limits, the store's transactions, deciding a check or a
//! resend, handing a message to delivery) is the send layer's
//! (`src/send/verifications.rs`); these handlers parse, translate its
//! outcome to HTTP and count the metrics.
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
use crate::domain::FieldError;
use crate::error::ApiError;
use crate::send::{Checked, Resent};
use crate::store::{StartOutcome, StoredResponse, VerificationRecord};
use crate::verify::decide;
use crate::verify::{SentMessage, StartRequest, VerificationOut, parse_check, parse_id, public_id};

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

async fn resource(state: &SharedState, v: &VerificationRecord) -> Result<Vec<u8>, ApiError> {
    let messages = state.sends.sent_messages(v).await?;
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
    let request = StartRequest::parse_for(
        &body,
        tenant.home_country.as_deref(),
        tenant.verify_channels.as_ref(),
    )
    .map_err(bad_body)?;
    let country = request.country.as_deref();
    let (outcome, now) = state
        .sends
        .begin_verification(&state.verify, &tenant, key.as_str(), &request)
        .await?;
    match outcome {
        StartOutcome::Created {
            verification,
            message,
        } => {
            state.metrics.verify_event("start", country);
            state.metrics.verify_event("send", country);
            let out = VerificationOut::of(
                &verification,
                vec![SentMessage::of(&message, &verification)],
                &state.verify.settings,
                now,
            );
            Ok(respond(
                StatusCode::CREATED,
                out.to_json(),
                verification.id,
                false,
            ))
        }
        StartOutcome::Existing(v) => {
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

async fn check(
    State(state): State<SharedState>,
    Authenticated(tenant): Authenticated,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = path_id(id)?;
    let key = optional_idempotency_key(&headers)?;
    let body = json_body(&state, &headers, body, super::BODY_LIMIT).await?;
    let code = parse_check(&body).map_err(bad_body)?;
    let keys = state.verify.secret.keys().await?;
    let v = state
        .store
        .verification(tenant.id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let country = v.country.as_deref();
    let key = key.as_ref().map(|k| k.as_str());
    let checked = state
        .sends
        .check_verification(
            &keys,
            &state.verify.settings,
            (tenant.id, id),
            &code,
            key,
            tenant.is_test(),
        )
        .await?;
    let metrics = &state.metrics;
    match checked {
        Checked::Replay(response) => Ok(stored(response, id)),
        Checked::Expired => {
            metrics.verify_event("expiry", country);
            Err(not_pending(decide::VerificationStatus::Expired))
        }
        Checked::Answered { decision, response } => {
            metrics.verify_event("check", country);
            match decision {
                decide::Check::Approve => metrics.verify_event("approval", country),
                decide::Check::LastWrong => metrics.verify_event("max_attempts", country),
                _ => {}
            }
            Ok(respond(StatusCode::OK, response.body, id, false))
        }
    }
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
    let country = v.country.clone();
    let country = country.as_deref();
    let resent = state
        .sends
        .resend_verification(
            &keys,
            &state.verify.settings,
            v,
            key.as_str(),
            tenant.is_test(),
        )
        .await?;
    match resent {
        Resent::Replay(response) => Ok(stored(response, id)),
        Resent::Expired => {
            state.metrics.verify_event("expiry", country);
            Err(not_pending(decide::VerificationStatus::Expired))
        }
        Resent::Sent(response) => {
            state.metrics.verify_event("send", country);
            Ok(respond(StatusCode::CREATED, response.body, id, false))
        }
    }
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
