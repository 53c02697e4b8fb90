//! `POST /channels/telegram/updates`: the URL an operator gives the bot's
//! `setWebhook` (with `secret_token` = `TELEGRAM_WEBHOOK_SECRET`). Thin: the
//! secret is checked ([`Inbound::admits`], constant time; 401 without it),
//! the update read and decided ([`updates::read`]; 400 or 413, nothing
//! stored), and the store takes it once under the unique (bot, update_id),
//! with its event and opt-out in the same transaction. 200 as soon as it
//! is stored, and for a repeat (nothing changes); 5xx only when it could
//! not be stored, so that Telegram delivers it again.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use super::SharedState;
use super::input::read_body_limited;
use crate::clock::to_time;
use crate::error::ApiError;
use crate::provider::telegram::updates::{self, KEEP, MAX_UPDATE_BYTES, Malformed, SECRET_HEADER};
use crate::store::{TakeUpdate, Taken};

/// Where the bot's updates are posted.
pub const UPDATES_PATH: &str = "/channels/telegram/updates";

pub fn router() -> Router<SharedState> {
    Router::new().route(UPDATES_PATH, post(take))
}

async fn take(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let inbound = state.telegram.clone().ok_or(ApiError::Unauthorized)?;
    if !inbound.admits(headers.get(SECRET_HEADER).map(|v| v.as_bytes())) {
        return Err(ApiError::Unauthorized);
    }
    let body = read_body_limited(body, state.body_read_timeout, MAX_UPDATE_BYTES).await?;
    let update = updates::read(&body).map_err(|Malformed(m)| ApiError::invalid("update", m))?;
    let now = state.clock.now();
    let taken = state
        .store
        .take_telegram_update(&TakeUpdate {
            bot_id: inbound.bot_id,
            update_id: update.update_id,
            tenant: inbound.tenant.clone(),
            effect: update.effect,
            received_at: now,
            restarted_before: now - to_time(KEEP),
        })
        .await?;
    match taken {
        Taken::New | Taken::Repeat => Ok((
            StatusCode::OK,
            axum::Json(json!({ "ok": true, "duplicate": taken == Taken::Repeat })),
        )
            .into_response()),
        Taken::NoTenant => {
            tracing::error!(tenant = %inbound.tenant, "a Telegram update for a tenant that does not exist (TELEGRAM_TENANT): not stored");
            Err(ApiError::Unavailable(
                "the tenant that owns the bot's updates does not exist".into(),
            ))
        }
    }
}
