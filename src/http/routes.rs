//! `GET /routes` and pinning a route's order (issue 43), for keys with the
//! `admin` scope. The work is [`RouteQuality`]'s; this is the thin HTTP
//! side.
//!
//! [`RouteQuality`]: crate::delivery::route_quality::RouteQuality

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::opt_outs::json_object;
use super::{Authenticated, SharedState};
use crate::delivery::quality::{Measured, humantime};
use crate::delivery::route_quality::{PinError, Report, RouteReport};
use crate::error::ApiError;
use crate::store::webhooks::rfc3339;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/routes", get(list))
        .route("/routes/{prefix}/pin", put(pin).delete(unpin))
}

impl From<PinError> for ApiError {
    fn from(e: PinError) -> Self {
        match e {
            PinError::NoRoute => ApiError::NotFound,
            PinError::NotTheRoutes(want) => ApiError::invalid(
                "providers",
                format!(
                    "must name each of the route's providers once, in the order wanted: {}",
                    want.join(", ")
                ),
            ),
            PinError::Store(e) => e.into(),
            PinError::Busy => {
                ApiError::Conflict("the route's order changed while pinning: try again".into())
            }
        }
    }
}

/// One provider's quality as `GET /routes` shows it.
pub fn quality_json(m: &Measured) -> Value {
    let cost = |micros: Option<i64>| {
        micros.zip(m.currency.as_deref()).map(|(v, currency)| {
            json!({ "amount": crate::spend::format_amount(v), "currency": currency })
        })
    };
    json!({
        "messages": m.messages,
        "sent": m.sent,
        "delivered": m.delivered,
        "undelivered": m.undelivered,
        "failed": m.failed,
        "unknown": m.unknown,
        "delivery_rate": m.delivery_rate(),
        "delivery_seconds": {
            "p50": m.delivery_seconds(0.5),
            "p90": m.delivery_seconds(0.9),
        },
        "judged": m.judged,
        "slow": m.slow,
        "slow_share": m.slow_share(),
        "codes": m.codes,
        "approved": m.approved,
        "conversion": m.conversion(),
        "cost_per_delivered": cost(m.cost_per_delivered()),
        "cost_per_approved": cost(m.cost_per_approved()),
    })
}

fn route_json(r: &RouteReport) -> Value {
    json!({
        "prefix": r.prefix,
        "configured": r.configured,
        "providers": r.providers.iter().map(|p| {
            let mut q = quality_json(&p.measured);
            q["verdict"] = json!(p.verdict.as_str());
            if let crate::delivery::quality::Verdict::Bad(why) = &p.verdict {
                q["reason"] = json!(why);
            }
            json!({ "name": p.name, "quality": q })
        }).collect::<Vec<_>>(),
        "pinned": r.pinned,
        "reason": r.reason,
        "changed_at": r.changed_at.map(rfc3339),
    })
}

pub fn report_json(report: &Report) -> Value {
    json!({
        "data": report.routes.iter().map(route_json).collect::<Vec<_>>(),
        "channels": report.channels.iter().map(|m| json!({
            "provider": m.provider,
            "quality": quality_json(m),
        })).collect::<Vec<_>>(),
        "quality": if report.on { "on" } else { "off" },
        "window": humantime(report.window),
        "slow_after": humantime(report.slow_after),
        "measured_at": rfc3339(report.at),
    })
}

async fn list(
    State(state): State<SharedState>,
    Authenticated(_auth): Authenticated,
) -> Result<Response, ApiError> {
    let report = state.quality.report().await?;
    Ok(Json(report_json(&report)).into_response())
}

fn prefix_of(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    p.map(|Path(p)| p).map_err(|_| ApiError::NotFound)
}

/// The route as `GET /routes` shows it, after a change.
async fn route_now(state: &SharedState, prefix: &str) -> Result<Response, ApiError> {
    let report = state.quality.report().await?;
    let route = report
        .routes
        .iter()
        .find(|r| r.prefix == prefix)
        .ok_or(ApiError::NotFound)?;
    Ok(Json(route_json(route)).into_response())
}

async fn pin(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    prefix: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let prefix = prefix_of(prefix)?;
    let map = json_object(&state, &headers, body, &["providers"]).await?;
    let providers: Vec<String> = match map.get("providers") {
        Some(Value::Array(items)) if !items.is_empty() => {
            let names: Option<Vec<String>> = items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect();
            names
                .ok_or_else(|| ApiError::invalid("providers", "must be a list of provider names"))?
        }
        None | Some(Value::Null) => return Err(ApiError::invalid("providers", "is required")),
        Some(_) => {
            return Err(ApiError::invalid(
                "providers",
                "must be a non-empty list of provider names",
            ));
        }
    };
    state
        .quality
        .pin(&super::admin::actor(&auth), &prefix, providers)
        .await?;
    route_now(&state, &prefix).await
}

async fn unpin(
    State(state): State<SharedState>,
    Authenticated(auth): Authenticated,
    prefix: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let prefix = prefix_of(prefix)?;
    state
        .quality
        .unpin(&super::admin::actor(&auth), &prefix)
        .await?;
    route_now(&state, &prefix).await
}
