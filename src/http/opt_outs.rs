//! Opt-outs: numbers that asked not to be messaged, per tenant.
//!
//! `POST /opt-outs` adds one, `DELETE /opt-outs/{number}` removes it,
//! `GET /opt-outs` lists them (in number order, paged as `http::page` says).
//! `POST /inbound` takes an inbound SMS (forwarded by a provider webhook or
//! the tenant's own gateway): a STOP-type keyword opts its sender out, START
//! opts it back in. A send to an opted-out number ends `failed` with
//! `recipient_opted_out` and never reaches the provider.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::page::Page;
use super::{Authenticated, SharedState, Tenant};
use crate::domain::FieldError;
use crate::domain::phone;
use crate::domain::recipient::{InvalidRecipient, Recipient};
use crate::domain::request::{duplicate_key, unknown_fields};
use crate::error::ApiError;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/opt-outs", get(list).post(add))
        .route("/opt-outs/{number}", delete(remove))
        .route("/inbound", post(inbound))
}

use crate::domain::opt_out::keyword;

/// A JSON object body, within the limits, or the problem saying why not.
pub(crate) async fn json_object(
    state: &SharedState,
    headers: &HeaderMap,
    body: Body,
    fields: &[&str],
) -> Result<serde_json::Map<String, Value>, ApiError> {
    if !super::input::is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let bytes = super::input::read_body(body, state.body_read_timeout).await?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| ApiError::MalformedJson)?;
    if let Some(path) = duplicate_key(&bytes) {
        return Err(ApiError::Validation(vec![FieldError {
            field: path,
            message: "appears more than once in the JSON object".into(),
        }]));
    }
    let Value::Object(map) = value else {
        return Err(ApiError::Validation(vec![FieldError {
            field: String::new(),
            message: "the request body must be a JSON object".into(),
        }]));
    };
    let unknown = unknown_fields(map.keys(), fields);
    if !unknown.is_empty() {
        return Err(ApiError::Validation(unknown));
    }
    Ok(map)
}

fn number_field(
    map: &serde_json::Map<String, Value>,
    field: &str,
    home: Option<&str>,
) -> Result<String, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Err(ApiError::invalid(field, "is required")),
        Some(Value::String(s)) => phone::parse_in(s, home)
            .map(|p| p.e164)
            .map_err(|message| ApiError::invalid(field, message)),
        Some(_) => Err(ApiError::invalid(field, "must be a string")),
    }
}

/// A number (without `+` read in the tenant's `home_country`), or a chat
/// of a channel whose addresses are chats (`telegram:<chat_id>`): what a
/// message's `to` takes.
fn address_field(
    map: &serde_json::Map<String, Value>,
    field: &str,
    home: Option<&str>,
) -> Result<String, ApiError> {
    let chats = crate::provider::registry::chat_channels();
    match map.get(field) {
        Some(Value::String(s))
            if s.trim()
                .split_once(':')
                .is_some_and(|(name, _)| chats.iter().any(|c| c.as_str() == name)) =>
        {
            Recipient::parse(s, chats)
                .map(|p| p.recipient.as_str().to_string())
                .map_err(|InvalidRecipient(m)| ApiError::invalid(field, m))
        }
        _ => number_field(map, field, home),
    }
}

async fn add(
    State(state): State<SharedState>,
    Authenticated(tenant): Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = json_object(&state, &headers, body, &["number"]).await?;
    let tenant_id = tenant.id;
    let number = address_field(&map, "number", tenant.home_country.as_deref())?;
    let now = state.clock.now();
    let created = state
        .store
        .add_opt_out(tenant_id, &number, "api", now)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(json!({ "number": number, "opted_out": true }))).into_response())
}

async fn remove(
    State(state): State<SharedState>,
    Authenticated(tenant): Authenticated,
    number: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let tenant_id = tenant.id;
    let Path(number) = number.map_err(|_| ApiError::NotFound)?;
    let number = Recipient::parse_in(
        &number,
        tenant.home_country.as_deref(),
        crate::provider::registry::chat_channels(),
    )
    .map_err(|_| ApiError::NotFound)?
    .recipient
    .as_str()
    .to_string();
    if state.store.remove_opt_out(tenant_id, &number).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::NotFound)
    }
}

/// `GET /opt-outs`: in number order, paged.
async fn list(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let page = Page::of(&state, tenant_id, "opt-outs", query.as_deref(), 100, 1000).await?;
    let after = page.after_as(|b| String::from_utf8(b.to_vec()).ok())?;
    let data = state
        .store
        .list_opt_outs(tenant_id, after.as_deref(), page.limit + 1)
        .await?;
    let (data, next) = page.finish(data, |o| o.number.as_bytes().to_vec());
    Ok(Json(json!({ "data": data, "next_cursor": next })).into_response())
}

async fn inbound(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = json_object(&state, &headers, body, &["from", "to", "body"]).await?;
    let from = number_field(&map, "from", None)?;
    if !matches!(
        map.get("to"),
        None | Some(Value::Null) | Some(Value::String(_))
    ) {
        return Err(ApiError::Validation(vec![FieldError {
            field: "to".into(),
            message: "must be a string".into(),
        }]));
    }
    let text = match map.get("body") {
        Some(Value::String(s)) if s.chars().count() <= 1600 => s.clone(),
        _ => {
            return Err(ApiError::Validation(vec![FieldError {
                field: "body".into(),
                message: "is required: a string of at most 1600 characters".into(),
            }]));
        }
    };
    let now = state.clock.now();
    let action = match keyword(&text) {
        Some(true) => {
            state
                .store
                .add_opt_out(tenant_id, &from, "inbound", now)
                .await?;
            "opted_out"
        }
        Some(false) => {
            state.store.remove_opt_out(tenant_id, &from).await?;
            "opted_in"
        }
        None => "none",
    };
    Ok(Json(json!({ "from": from, "action": action })).into_response())
}
