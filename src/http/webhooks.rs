//! Webhook endpoints and the events feed.
//!
//! `POST /webhook-endpoints` registers a URL (https, public: see
//! `webhooks::ssrf`) for some or all event types and shows its secret once;
//! `GET /webhook-endpoints`, `GET`/`DELETE /webhook-endpoints/{id}`,
//! `POST /webhook-endpoints/{id}/rotate-secret` (the old secret keeps signing
//! beside the new one for 24 h), `GET /webhook-endpoints/{id}/attempts`.
//! Every list pages as `http::page` says.
//! `GET /events?limit=&cursor=` is the tenant's feed of the same events, in
//! order, with a cursor: what an integrator who was down catches up from.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use uuid::Uuid;

use super::opt_outs::json_object;
use super::page::Page;
use super::{Authenticated, SharedState, Tenant};
use crate::domain::FieldError;
use crate::error::ApiError;
use crate::store::webhooks::rfc3339;
use crate::store::{EventCursor, NewWebhookEndpoint, WebhookEndpoint};
use crate::webhooks::{EVENT_TYPES, is_event_type, signing, ssrf};

/// Most endpoints one tenant may have.
pub const MAX_ENDPOINTS: u32 = 20;
/// How long a rotated-out secret keeps signing.
pub const OLD_SECRET_VALIDITY: time::Duration = time::Duration::hours(24);
/// The prefix of endpoint ids.
const ID_PREFIX: &str = "whe_";

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/webhook-endpoints", get(list).post(create))
        .route("/webhook-endpoints/{id}", get(show).delete(remove))
        .route("/webhook-endpoints/{id}/rotate-secret", post(rotate))
        .route("/webhook-endpoints/{id}/attempts", get(attempts))
        .route("/events", get(feed))
}

fn public_id(id: Uuid) -> String {
    format!("{ID_PREFIX}{}", id.simple())
}

/// The endpoint id in a path; anything else is the same 404 as an unknown id.
fn endpoint_id(id: Result<Path<String>, PathRejection>) -> Result<Uuid, ApiError> {
    let Path(id) = id.map_err(|_| ApiError::NotFound)?;
    let hex = id.strip_prefix(ID_PREFIX).ok_or(ApiError::NotFound)?;
    if hex.len() != 32 {
        return Err(ApiError::NotFound);
    }
    Uuid::try_parse(hex).map_err(|_| ApiError::NotFound)
}

/// The endpoint resource; the secret only when it was just made. `mode`:
/// the mode of the keys that see it (`test`: a test namespace's endpoint,
/// which gets test events only).
fn endpoint_json(e: &WebhookEndpoint, secret: Option<&str>, mode: &str) -> Value {
    let mut v = json!({
        "id": public_id(e.id),
        "mode": mode,
        "url": e.url,
        "events": e.events.clone().unwrap_or_else(|| EVENT_TYPES.iter().map(|s| s.to_string()).collect()),
        "enabled": e.enabled,
        "disabled_reason": e.disabled_reason,
        "created_at": rfc3339(e.created_at),
        "updated_at": rfc3339(e.updated_at),
        "previous_secret_expires_at": e.previous_secret_expires_at.map(rfc3339),
    });
    if let (Some(secret), Value::Object(map)) = (secret, &mut v) {
        map.insert("secret".into(), Value::String(secret.to_string()));
    }
    v
}

/// `events`: absent for every type, else a non-empty list of known
/// types (duplicates dropped, documentation order).
fn events_field(map: &serde_json::Map<String, Value>) -> Result<Option<Vec<String>>, ApiError> {
    let list = match map.get("events") {
        None => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid("events", "must be a list of event types")),
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "events",
            "must name at least one event type (leave it out for all)",
        ));
    }
    let mut errors = Vec::new();
    for (i, item) in list.iter().enumerate() {
        match item.as_str() {
            Some(t) if is_event_type(t) => {}
            _ => errors.push(FieldError {
                field: format!("events[{i}]"),
                message: format!("must be one of: {}", EVENT_TYPES.join(", ")),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let events = EVENT_TYPES
        .iter()
        .filter(|t| list.iter().any(|i| i.as_str() == Some(**t)))
        .map(|t| t.to_string())
        .collect();
    Ok(Some(events))
}

async fn create(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = json_object(&state, &headers, body, &["url", "events"]).await?;
    let url = match map.get("url") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => return Err(ApiError::invalid("url", "is required")),
        Some(_) => return Err(ApiError::invalid("url", "must be a string")),
    };
    let events = events_field(&map)?;
    let url = ssrf::check(&url, state.webhooks.allow_private)
        .await
        .map_err(|refused| ApiError::invalid("url", refused.to_string()))?;
    let secret = signing::new_secret();
    let created = state
        .store
        .create_webhook_endpoint(
            &NewWebhookEndpoint {
                id: Uuid::now_v7(),
                tenant_id: auth.id,
                url: url.to_string(),
                events,
                secret: secret.clone(),
                created_at: state.clock.now(),
            },
            MAX_ENDPOINTS,
        )
        .await?
        .ok_or_else(|| {
            ApiError::invalid(
                "url",
                format!(
                    "this account already has {MAX_ENDPOINTS} webhook endpoints, the most allowed"
                ),
            )
        })?;
    state.webhook_dispatcher.endpoint_created();
    Ok((
        StatusCode::CREATED,
        Json(endpoint_json(&created, Some(&secret), auth.mode())),
    )
        .into_response())
}

/// `GET /webhook-endpoints`: oldest first, paged (at most
/// [`MAX_ENDPOINTS`], read whole and paged here).
async fn list(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let tenant_id = auth.id;
    let page = Page::of(
        &state,
        tenant_id,
        "webhook-endpoints",
        query.as_deref(),
        100,
        1000,
    )
    .await?;
    let position = |e: &WebhookEndpoint| {
        [
            e.created_at.unix_timestamp_nanos().to_be_bytes().as_slice(),
            e.id.as_bytes(),
        ]
        .concat()
    };
    let after = page.after_as(|b| (b.len() == 32).then(|| b.to_vec()))?;
    let mut all = state.store.webhook_endpoints(tenant_id).await?;
    all.retain(|e| after.as_ref().is_none_or(|a| position(e) > *a));
    let (endpoints, next) = page.finish(all, position);
    let data: Vec<Value> = endpoints
        .iter()
        .map(|e| endpoint_json(e, None, auth.mode()))
        .collect();
    Ok(Json(json!({ "data": data, "next_cursor": next })).into_response())
}

async fn show(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = endpoint_id(id)?;
    let e = state
        .store
        .webhook_endpoint(auth.id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(endpoint_json(&e, None, auth.mode())).into_response())
}

async fn remove(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = endpoint_id(id)?;
    if state.store.delete_webhook_endpoint(tenant_id, id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::NotFound)
    }
}

async fn rotate(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let tenant_id = auth.id;
    let id = endpoint_id(id)?;
    let now = state.clock.now();
    let secret = signing::new_secret();
    let e = state
        .store
        .rotate_webhook_secret(tenant_id, id, &secret, now + OLD_SECRET_VALIDITY, now)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(endpoint_json(&e, Some(&secret), auth.mode())).into_response())
}

/// `GET /webhook-endpoints/{id}/attempts`: newest first, paged.
async fn attempts(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = endpoint_id(id)?;
    let page = Page::of(
        &state,
        tenant_id,
        "webhook-attempts",
        query.as_deref(),
        100,
        1000,
    )
    .await?;
    let before = page.after_as(|b| Some(i64::from_be_bytes(b.try_into().ok()?)))?;
    if state.store.webhook_endpoint(tenant_id, id).await?.is_none() {
        return Err(ApiError::NotFound);
    }
    let rows = state
        .store
        .webhook_attempts(tenant_id, id, before, page.limit + 1)
        .await?;
    let (data, next) = page.finish(rows, |a| a.id.to_be_bytes().to_vec());
    Ok(Json(json!({ "data": data, "next_cursor": next })).into_response())
}

/// `GET /events`: the tenant's events in order, paged; each event carries
/// its own cursor too (where a poller that reached the end goes on from).
async fn feed(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let page = Page::of(&state, tenant_id, "events", query.as_deref(), 100, 1000).await?;
    let after = page.after_as(EventCursor::from_bytes)?;
    let events = state
        .store
        .webhook_events_after(tenant_id, after, page.limit + 1)
        .await?;
    let (events, next) = page.finish(events, |e| e.cursor.to_bytes());
    let data: Vec<Value> = events
        .iter()
        .map(|e| e.to_feed_json(&page.cursor(&e.cursor.to_bytes())))
        .collect();
    Ok(Json(json!({ "data": data, "next_cursor": next })).into_response())
}
