//! What users write to a channel of its own: one handler for every inbound
//! route the registry declares (`Adapter::inbound`; the Telegram bot's
//! `POST /channels/telegram/updates`, the URL an operator gives its
//! `setWebhook`). Thin: the route authenticates the request
//! ([`InboundRoute::admits`], constant time; 401 without it), reads and
//! decides the update ([`InboundRoute::read`]; 400 or 413, nothing stored),
//! and the store takes it once under the unique (channel, source, event
//! id), with its event and opt-out in the same transaction. 200 as soon as
//! it is stored, and for a repeat (nothing changes); 5xx only when it could
//! not be stored, so that the channel delivers it again.

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
use crate::provider::registry::{ADAPTERS, Inbound};
use crate::store::{TakeUpdate, Taken};

/// Every adapter's inbound route, whether it is configured or not (then
/// 401: its owner and secret are not set).
pub fn router() -> Router<SharedState> {
    ADAPTERS.iter().fold(Router::new(), |router, adapter| {
        let Some(inbound) = &adapter.inbound else {
            return router;
        };
        let name = adapter.name;
        router.route(
            inbound.path,
            post(
                move |State(state): State<SharedState>, headers: HeaderMap, body: Body| async move {
                    take(name, inbound, state, headers, body).await
                },
            ),
        )
    })
}

async fn take(
    channel: &'static str,
    declared: &'static Inbound,
    state: SharedState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let route = state
        .inbound
        .iter()
        .find(|r| r.channel() == channel)
        .cloned()
        .ok_or(ApiError::Unauthorized)?;
    if !route.admits(&headers) {
        return Err(ApiError::Unauthorized);
    }
    let body = read_body_limited(body, state.body_read_timeout, declared.max_bytes).await?;
    let update = route
        .read(&body)
        .map_err(|m| ApiError::invalid("update", m))?;
    let now = state.clock.now();
    let taken = state
        .store
        .take_update(&TakeUpdate {
            channel,
            source: route.source(),
            event_id: update.event_id,
            tenant: route.tenant().to_string(),
            effect: update.effect,
            received_at: now,
            restarted_before: now - to_time(declared.keep),
        })
        .await?;
    match taken {
        Taken::New | Taken::Repeat => Ok((
            StatusCode::OK,
            axum::Json(json!({ "ok": true, "duplicate": taken == Taken::Repeat })),
        )
            .into_response()),
        Taken::NoTenant => {
            tracing::error!(
                channel,
                tenant = %route.tenant(),
                "an inbound update for a tenant that does not exist: not stored"
            );
            Err(ApiError::Unavailable(
                "the tenant that owns the channel's updates does not exist".into(),
            ))
        }
    }
}
