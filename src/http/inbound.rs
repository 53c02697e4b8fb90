//! What users write to a channel of its own: one handler for every inbound
//! route the registry declares (`Adapter::inbound`; the Telegram bot's
//! `POST /channels/telegram/updates`, the URL an operator gives its
//! `setWebhook`; WhatsApp's messages, on its status webhook's path, through
//! the receipts handler: [`take_shared`]). Thin: the body is read (at most
//! the route's declared size; 413 beyond), the route authenticates the
//! request ([`InboundRoute::admits`], constant time: a secret header or a
//! signature of the body; 401 without it), reads and decides its updates
//! ([`InboundRoute::read`]; 400, nothing stored),
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
/// 401: its owner and secret are not set). A route on the adapter's
/// receipt path is served by the receipts handler ([`take_shared`]).
pub fn router() -> Router<SharedState> {
    ADAPTERS.iter().fold(Router::new(), |router, adapter| {
        let Some(inbound) = &adapter.inbound else {
            return router;
        };
        if adapter
            .receipts
            .as_ref()
            .is_some_and(|r| r.path == inbound.path)
        {
            return router;
        }
        let name = adapter.name;
        router.route(
            inbound.path,
            post(
                move |State(state): State<SharedState>, headers: HeaderMap, body: Body| async move {
                    let body =
                        read_body_limited(body, state.body_read_timeout, inbound.max_bytes).await?;
                    let taken = take(name, inbound, &state, &headers, &body).await?;
                    // One update per request (Telegram's): a repeat is
                    // `"duplicate": true`, and so is a request of repeats.
                    let duplicate = !taken.is_empty() && taken.iter().all(|t| *t == Taken::Repeat);
                    Ok::<Response, ApiError>(
                        (
                            StatusCode::OK,
                            axum::Json(json!({ "ok": true, "duplicate": duplicate })),
                        )
                            .into_response(),
                    )
                },
            ),
        )
    })
}

/// The updates a request to `channel`'s receipt path carries, when its
/// inbound route shares that path (WhatsApp's one webhook): taken as on a
/// route of their own, after the receipts. Nothing when the adapter has no
/// such route.
pub async fn take_shared(
    channel: &'static str,
    state: &SharedState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), ApiError> {
    let Some(adapter) = ADAPTERS.iter().find(|a| a.name == channel) else {
        return Ok(());
    };
    let (Some(inbound), Some(receipts)) = (&adapter.inbound, &adapter.receipts) else {
        return Ok(());
    };
    // Not configured (WhatsApp's phone number id unset): the receipts
    // were the request's whole business.
    if inbound.path != receipts.path || !state.inbound.iter().any(|r| r.channel() == channel) {
        return Ok(());
    }
    take(channel, inbound, state, headers, body)
        .await
        .map(|_| ())
}

/// Authenticates, reads and takes every update of one request, each once.
async fn take(
    channel: &'static str,
    declared: &'static Inbound,
    state: &SharedState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<Taken>, ApiError> {
    let route = state
        .inbound
        .iter()
        .find(|r| r.channel() == channel)
        .cloned()
        .ok_or(ApiError::Unauthorized)?;
    if !route.admits(headers, body) {
        return Err(ApiError::Unauthorized);
    }
    let updates = route
        .read(body)
        .map_err(|m| ApiError::invalid("update", m))?;
    let mut out = Vec::with_capacity(updates.len());
    for update in updates {
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
        if taken == Taken::NoTenant {
            tracing::error!(
                channel,
                tenant = %route.tenant(),
                "an inbound update for a tenant that does not exist: not stored"
            );
            return Err(ApiError::Unavailable(
                "the tenant that owns the channel's updates does not exist".into(),
            ));
        }
        out.push(taken);
    }
    Ok(out)
}
