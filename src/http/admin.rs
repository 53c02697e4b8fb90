//! The operator's admin API (issue 27), for keys with the `admin` scope:
//! tenants, their settings and keys, and the audit log. The work is
//! [`crate::admin::Admin`]'s (the CLI calls it too); this is the thin HTTP
//! side.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde_json::{Value, json};
use uuid::Uuid;

use super::opt_outs::json_object;
use super::page::Page;
use super::{Authenticated, SharedState};
use crate::admin::{Actor, Admin, AdminError, KeySpec, TenantPatch, valid_label};
use crate::domain::FieldError;
use crate::error::ApiError;
use crate::scopes::{Scope, Scopes};
use crate::spend::format_amount;
use crate::store::webhooks::rfc3339;
use crate::store::{ApiKeyInfo, TenantAuth, TenantSettings};

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/admin/tenants", get(list_tenants).post(create_tenant))
        .route(
            "/admin/tenants/{name}",
            get(show_tenant).patch(update_tenant),
        )
        .route(
            "/admin/tenants/{name}/keys",
            get(list_keys).post(create_key),
        )
        .route("/admin/keys/{id}", delete(revoke_key))
        .route("/admin/audit", get(audit))
}

impl From<AdminError> for ApiError {
    fn from(e: AdminError) -> Self {
        match e {
            AdminError::Invalid(errors) => ApiError::Validation(errors),
            AdminError::NotFound(_) => ApiError::NotFound,
            AdminError::Conflict(what) => ApiError::Conflict(what),
            AdminError::Scope(s) => ApiError::InsufficientScope(s),
            AdminError::Store(e) => e.into(),
        }
    }
}

pub(crate) fn actor(auth: &TenantAuth) -> Actor {
    Actor {
        via: "api",
        key_id: Some(auth.key_id),
        key_label: auth.key_label.clone(),
        scopes: auth.scopes,
        // The live tenant, for a test key too (its shadow's id would let it
        // disable the live tenant it belongs to).
        tenant_id: Some(auth.live_id.unwrap_or(auth.id)),
    }
}

/// The rate limits every tenant is under (`SENDONCE_RATE_*`: set per
/// instance, not per tenant; shown, not changed, here). 0: no limit.
fn limits_json(l: &crate::ratelimit::Limits) -> Value {
    json!({
        "requests": {
            "per_second": l.tenant.per_second(),
            "burst": l.tenant.capacity,
            "capacity": l.tenant.capacity,
            "per_seconds": l.tenant.per.as_secs_f64(),
        },
        "new_sends_per_number_per_hour": l.number.per_hour(),
        "new_sends_per_prefix_per_hour": l.prefix.per_hour(),
    })
}

/// A tenant as shown; its spend caps in the price table's `currency`.
pub fn tenant_json(t: &TenantSettings, limits: &crate::ratelimit::Limits, currency: &str) -> Value {
    let caps = &t.spend_caps;
    json!({
        "spend_caps": {
            "daily": caps.daily.map(format_amount),
            "monthly": caps.monthly.map(format_amount),
            "international_daily_messages": caps.international_daily_messages,
            "currency": currency,
        },
        "limits": limits_json(limits),
        "id": t.id,
        "name": t.name,
        "created_at": rfc3339(t.created_at),
        "quiet_hours": t.quiet_hours.map(|w| w.to_string()),
        "senders": t.allowed_senders,
        "allowed_countries": t.allowed_countries,
        "home_country": t.home_country,
        "disabled": t.disabled,
        "verify_channels": t.verify_channels.as_ref().map(|c| c.names()),
    })
}

/// A key as listed: never its secret or hash.
pub fn key_json(k: &ApiKeyInfo) -> Value {
    json!({
        "id": k.id,
        "tenant": k.tenant_name,
        "prefix": k.prefix,
        "label": k.label,
        "scopes": k.scopes.iter().map(Scope::as_str).collect::<Vec<_>>(),
        "created_at": rfc3339(k.created_at),
        "last_used_at": k.last_used_at.map(rfc3339),
        "revoked_at": k.revoked_at.map(rfc3339),
        "test": k.test,
    })
}

fn name_of(name: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    name.map(|Path(n)| n).map_err(|_| ApiError::NotFound)
}

async fn create_tenant(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = json_object(&state, &headers, body, &["name"]).await?;
    let Some(Value::String(name)) = map.get("name") else {
        return Err(ApiError::invalid("name", "is required: a string"));
    };
    let admin = Admin {
        store: state.store.as_ref(),
    };
    let t = admin
        .create_tenant(&actor(&auth), name, state.clock.now())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(tenant_json(
            &t,
            &state.limiter.limits(),
            state.sends.currency(),
        )),
    )
        .into_response())
}

async fn list_tenants(
    State(state): State<SharedState>,
    Authenticated(_): Authenticated,
) -> Result<Response, ApiError> {
    let data: Vec<Value> = state
        .store
        .tenant_settings()
        .await?
        .iter()
        .map(|t| tenant_json(t, &state.limiter.limits(), state.sends.currency()))
        .collect();
    Ok(Json(json!({ "data": data, "next_cursor": null })).into_response())
}

async fn show_tenant(
    State(state): State<SharedState>,
    Authenticated(_): Authenticated,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = name_of(name)?;
    let admin = Admin {
        store: state.store.as_ref(),
    };
    let t = admin.tenant(&name).await?;
    Ok(Json(tenant_json(
        &t,
        &state.limiter.limits(),
        state.sends.currency(),
    ))
    .into_response())
}

async fn update_tenant(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = name_of(name)?;
    let map = json_object(&state, &headers, body, crate::admin::patch::FIELDS).await?;
    let patch = TenantPatch::from_json(&map).map_err(ApiError::Validation)?;
    let admin = Admin {
        store: state.store.as_ref(),
    };
    let t = admin
        .update_tenant(&actor(&auth), &name, &patch, state.clock.now())
        .await?;
    Ok(Json(tenant_json(
        &t,
        &state.limiter.limits(),
        state.sends.currency(),
    ))
    .into_response())
}

/// Reads `{scopes, label, test}` of a new key.
fn key_spec(map: &serde_json::Map<String, Value>) -> Result<KeySpec, ApiError> {
    let mut errors = Vec::new();
    let scopes = match map.get("scopes") {
        None => Scopes::DEFAULT,
        Some(Value::Array(items)) => {
            let named: Vec<Option<Scope>> = items
                .iter()
                .map(|i| i.as_str().and_then(Scope::parse))
                .collect();
            if named.iter().any(Option::is_none) || named.is_empty() {
                errors.push(FieldError::new(
                    "scopes",
                    "must be a non-empty list of send, read, opt-outs, webhooks, admin",
                ));
            }
            Scopes::of(&named.into_iter().flatten().collect::<Vec<_>>())
        }
        Some(_) => {
            errors.push(FieldError::new("scopes", "must be a list of scope names"));
            Scopes::DEFAULT
        }
    };
    let label = match map.get("label") {
        None | Some(Value::Null) => None,
        Some(Value::String(l)) if valid_label(l) => Some(l.trim().to_string()),
        Some(_) => {
            errors.push(FieldError::new(
                "label",
                "must be 1 to 100 characters without control characters",
            ));
            None
        }
    };
    let test = match map.get("test") {
        None => false,
        Some(Value::Bool(test)) => *test,
        Some(_) => {
            errors.push(FieldError::new("test", "must be true or false"));
            false
        }
    };
    if errors.is_empty() {
        Ok(KeySpec {
            scopes,
            label,
            test,
        })
    } else {
        Err(ApiError::Validation(errors))
    }
}

async fn create_key(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = name_of(name)?;
    let map = json_object(&state, &headers, body, &["scopes", "label", "test"]).await?;
    let spec = key_spec(&map)?;
    let admin = Admin {
        store: state.store.as_ref(),
    };
    let (secret, info) = admin
        .create_key(&actor(&auth), &name, &spec, state.clock.now())
        .await?;
    let mut body = key_json(&info);
    body["key"] = json!(secret);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn list_keys(
    State(state): State<SharedState>,
    Authenticated(_): Authenticated,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = name_of(name)?;
    let admin = Admin {
        store: state.store.as_ref(),
    };
    let data: Vec<Value> = admin.keys(&name).await?.iter().map(key_json).collect();
    Ok(Json(json!({ "data": data, "next_cursor": null })).into_response())
}

async fn revoke_key(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id.map_err(|_| ApiError::NotFound)?;
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let admin = Admin {
        store: state.store.as_ref(),
    };
    admin
        .revoke_key(&actor(&auth), id, state.clock.now())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /admin/audit`: newest first, paged (`limit`, `cursor`).
async fn audit(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let page = Page::of(&state, auth.id, "admin-audit", query.as_deref(), 50, 500).await?;
    let before = page.after_as(|b| Uuid::from_slice(b).ok())?;
    let rows = state.store.audit_log(before, page.limit + 1).await?;
    let (data, next) = page.finish(rows, |r| r.id.as_bytes().to_vec());
    Ok(Json(json!({ "data": data, "next_cursor": next })).into_response())
}

#[cfg(test)]
mod tests {
    /// Issue 42, item 6: the tenant rate reads as the docs say it, 100 a
    /// second in bursts of 200, beside the bucket it is.
    #[test]
    fn the_request_rate_reads_as_documented() {
        let limits = crate::config::Settings::default().limits.rates;
        let shown = super::limits_json(&limits);
        let r = &shown["requests"];
        assert_eq!(r["per_second"], 100.0, "{shown}");
        assert_eq!(r["burst"], 200, "{shown}");
        assert_eq!(r["capacity"], 200, "{shown}");
        assert_eq!(r["per_seconds"], 2.0, "{shown}");
    }
}
