//! Delivery receipts, the same for every adapter: each adapter with a
//! receipt endpoint (`Adapter::receipts` in `src/provider/registry.rs`)
//! gets its path here, and its `ReceiptRoute` authenticates and reads the
//! request (`src/provider/<name>/receipts.rs`):
//!
//! - `POST /providers/twilio/status`: Twilio's status callback
//!   (form-encoded), signed with `X-Twilio-Signature`;
//! - `POST /providers/http/status`: the `http` provider's JSON receipt, with
//!   the shared secret `SENDONCE_RECEIPT_SECRET` in `X-Receipt-Secret`;
//! - `POST /providers/infobip/status`: Infobip's delivery reports, several
//!   per request (`results[]`), carrying `INFOBIP_RECEIPT_SECRET` in the URL
//!   Infobip was given;
//! - `POST` and `GET /providers/vonage/status`: Vonage's delivery receipt
//!   (form, JSON or query string), signed with `sig`.
//!
//! A route may also answer a provider's subscription handshake on `GET`
//! (`ReceiptRoute::handshake`: Meta's `hub.challenge`) with a plain-text
//! body, recording nothing.
//!
//! A request carrying one receipt is answered with its acknowledgement; one
//! carrying several (or none) with `{"receipts": [...]}`, one per receipt.
//!
//! A message's history, receipts included, is `GET /messages/{key}/events`
//! (`history.rs`).
//!
//! A receipt that is not authenticated is answered 403 and changes nothing.
//! What can be checked before the body is read is (`ReceiptRoute::admit`:
//! the http receipt's secret, the presence of Twilio's signature); the body
//! must arrive whole within the same deadline as `POST /messages`
//! (`body_read_timeout`), or the answer is 408.
//! An authenticated one is stored once under an identity built from what was
//! authenticated: the provider's message id, the status and the error code
//! ([`receipt_identity`]). Twilio's `I-Twilio-Idempotency-Token` is not
//! signed and the http provider's `event_id` adds nothing the secret does
//! not already cover, so neither is used: a redelivered or replayed receipt
//! (fresh tokens or not) is answered 200 and changes nothing. Status only
//! moves forward (`sent` to `delivered` or `undelivered`, never back), and a
//! receipt for a message we do not know is answered 200 and kept for
//! inspection. A receipt whose provider id matches no message but that
//! carries our own id under its authentication (Vonage's `client-ref`) is
//! matched by that id, when the message is on that provider and past its
//! send. The frozen POST response is never
//! touched: replays stay byte for byte what they were.

use axum::Router;
use axum::body::Body;
use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use serde::Serialize;

use super::SharedState;
use super::input::read_body;
use crate::error::ApiError;
use crate::provider::ADAPTERS;
use crate::provider::receipts::{Receipt, ReceiptError, ReceiptRequest, is_bare_code};
use crate::provider::registry::ReceiptRoutes;
use crate::store::{NewReceipt, ReceiptOutcome};

/// How receipts are taken.
#[derive(Clone, Debug, Default)]
pub struct ReceiptSettings {
    /// `SENDONCE_PUBLIC_URL`: the address providers call, which they sign.
    pub public_url: Option<String>,
    /// Every adapter's endpoint, with its secrets.
    pub routes: ReceiptRoutes,
}

/// Every adapter's receipt endpoint.
pub fn router() -> Router<SharedState> {
    ADAPTERS.iter().fold(Router::new(), |router, adapter| {
        let Some(receipts) = &adapter.receipts else {
            return router;
        };
        let name = adapter.name;
        let handler = move |State(state): State<SharedState>,
                            method: Method,
                            OriginalUri(uri): OriginalUri,
                            headers: HeaderMap,
                            body: Body| async move {
            receive(name, state, method, uri, headers, body).await
        };
        let route: MethodRouter<SharedState> = if receipts.get {
            post(handler).get(handler)
        } else {
            post(handler)
        };
        router.route(receipts.path, route)
    })
}

pub use crate::provider::receipts::delivery_status;

/// The identity a receipt is stored (and de-duplicated) under: what the
/// provider authenticated about the event, never an unsigned header. The
/// provider's message id, the status (lower case) and the error code,
/// joined by `:` (a `:` or `%` inside a part is percent-encoded, so two
/// different receipts never share an identity).
pub fn receipt_identity(
    provider_message_id: &str,
    status: &str,
    error_code: Option<&str>,
) -> String {
    let part = |s: &str| s.replace('%', "%25").replace(':', "%3A");
    format!(
        "{}:{}:{}",
        part(provider_message_id),
        part(&status.to_ascii_lowercase()),
        part(error_code.unwrap_or(""))
    )
}

#[derive(Serialize)]
struct Ack {
    /// Already recorded under the same event identity: nothing changed.
    duplicate: bool,
    /// The message it belongs to; `null` when no message has that provider id.
    message_id: Option<String>,
    /// The message's status moved forward because of it.
    applied: bool,
}

fn ack(outcome: ReceiptOutcome) -> Ack {
    Ack {
        duplicate: outcome.duplicate,
        message_id: outcome.message_id.map(|id| id.to_string()),
        applied: outcome.applied,
    }
}

impl From<ReceiptError> for ApiError {
    fn from(e: ReceiptError) -> Self {
        match e {
            ReceiptError::Forbidden => ApiError::Forbidden,
            ReceiptError::UnsupportedMediaType => ApiError::UnsupportedMediaType,
            ReceiptError::MalformedJson => ApiError::MalformedJson,
            ReceiptError::Invalid(errors) => ApiError::Validation(errors),
        }
    }
}

/// One receipt for adapter `provider`: authenticated and read by its
/// route, then recorded.
async fn receive(
    provider: &'static str,
    state: SharedState,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let route = state
        .receipts
        .routes
        .get(provider)
        .cloned()
        .ok_or(ApiError::Forbidden)?;
    let req = ReceiptRequest {
        method: &method,
        headers: &headers,
        path_and_query: uri.path_and_query().map_or(uri.path(), |p| p.as_str()),
        public_url: state.receipts.public_url.as_deref(),
        now: state.clock.now(),
    };
    if method == Method::GET
        && let Some(answer) = route.handshake(&req)
    {
        let text = answer?;
        return Ok((
            StatusCode::OK,
            [
                (
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; charset=utf-8",
                ),
                (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            text,
        )
            .into_response());
    }
    route.admit(&req)?;
    let body = read_body(body, state.body_read_timeout).await?;
    let receipts = route.read_all(&req, &body)?;
    let mut outcomes = Vec::with_capacity(receipts.len());
    for receipt in receipts {
        let status = route.delivery_status(&receipt.status);
        let receipt = stored_receipt(
            &state.deliverer,
            state.store.as_ref(),
            provider,
            receipt,
            status,
            state.clock.now(),
        )
        .await?;
        // One that fails to be recorded fails the request (5xx): the
        // provider posts it again, and those already recorded are then
        // duplicates that change nothing.
        outcomes.push(record(&state, provider, &receipt).await?);
    }
    // What users wrote, when the adapter's inbound route shares this path
    // (WhatsApp's webhook): taken once each, opt-outs with them.
    super::inbound::take_shared(provider, &state, &headers, &body).await?;
    Ok(match <[Ack; 1]>::try_from(outcomes) {
        Ok([one]) => (StatusCode::OK, axum::Json(one)).into_response(),
        Err(many) => (StatusCode::OK, axum::Json(Acks { receipts: many })).into_response(),
    })
}

/// The answer to a request that carried other than one receipt (a batch
/// of Infobip reports): one entry per receipt, in order.
#[derive(Serialize)]
struct Acks {
    receipts: Vec<Ack>,
}

async fn record(
    state: &SharedState,
    provider: &'static str,
    receipt: &NewReceipt,
) -> Result<Ack, ApiError> {
    let outcome = record_receipt(
        state.store.as_ref(),
        &state.clock,
        &state.metrics,
        provider,
        receipt,
    )
    .await?;
    Ok(ack(outcome))
}

/// `receipt` as it is stored (issue 41): its error code and status word
/// scrubbed as a send's answer is ([`Receipt::scrubbed`]), of the message's
/// text too when the message is known (its sealed body opened), and its
/// identity built from what is left without that text, so that the same
/// receipt has the same identity before and after its message is known.
/// The message is looked up only for an error code that could quote it
/// (not a bare provider code such as `30003`).
pub async fn stored_receipt(
    deliverer: &crate::delivery::Deliverer,
    store: &dyn crate::store::Store,
    provider: &'static str,
    receipt: Receipt,
    status: Option<crate::domain::Status>,
    received_at: time::OffsetDateTime,
) -> Result<NewReceipt, crate::store::StoreError> {
    let secrets = deliverer.secrets();
    let body = match receipt.error_code.as_deref() {
        Some(code) if !is_bare_code(code) => {
            let id = match receipt.message_id {
                Some(id) => Some(id),
                None => {
                    store
                        .provider_message_owner(provider, &receipt.provider_message_id)
                        .await?
                }
            };
            match id {
                Some(id) => match store.message_by_id(id).await? {
                    Some(m) => deliverer.readable_body(&m).await,
                    None => None,
                },
                None => None,
            }
        }
        _ => None,
    };
    let identified = receipt.clone().scrubbed(None, secrets);
    let receipt = receipt.scrubbed(body.as_deref(), secrets);
    Ok(NewReceipt {
        provider: provider.into(),
        event_id: receipt_identity(
            &identified.provider_message_id,
            &identified.status,
            identified.error_code.as_deref(),
        ),
        provider_message_id: receipt.provider_message_id,
        message_id: receipt.message_id,
        status,
        provider_status: receipt.status,
        error_code: receipt.error_code,
        received_at,
    })
}

/// Receipts that do not come over HTTP (SMPP's `deliver_sm`), handled as
/// those that do: [`record_receipt`].
pub struct StoreReceipts {
    pub store: std::sync::Arc<dyn crate::store::Store>,
    /// Opens a sealed body and holds the secrets a receipt is scrubbed of.
    /// Weak: the deliverer holds the providers, and test mode's provider
    /// holds this sink; a strong handle made a cycle that kept every
    /// stopped instance's store, and its database connections, for the
    /// life of the process (tests/api/lifecycle.rs,
    /// a_stopped_instance_closes_its_database_connections).
    pub deliverer: std::sync::Weak<crate::delivery::Deliverer>,
    pub clock: crate::clock::Clock,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
}

#[async_trait::async_trait]
impl crate::provider::receipts::ReceiptSink for StoreReceipts {
    async fn take(
        &self,
        provider: &'static str,
        receipt: crate::provider::receipts::Receipt,
        status: Option<crate::domain::Status>,
    ) -> Result<(), String> {
        let Some(deliverer) = self.deliverer.upgrade() else {
            // Unanswered, the provider offers the receipt again (SMPP
            // resends an unacknowledged deliver_sm) to an instance that runs.
            return Err("this instance has stopped".into());
        };
        let receipt = stored_receipt(
            &deliverer,
            self.store.as_ref(),
            provider,
            receipt,
            status,
            self.clock.now(),
        )
        .await
        .map_err(|e| e.to_string())?;
        // SMPP's receipts name no message of ours.
        let receipt = NewReceipt {
            message_id: None,
            ..receipt
        };
        record_receipt(
            self.store.as_ref(),
            &self.clock,
            &self.metrics,
            provider,
            &receipt,
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
    }
}

/// Stores one authenticated receipt once, matches it to its message by
/// (provider, provider message id) and moves the message on; a receipt for
/// no known message is kept as unmatched. The same for every adapter, with
/// or without an HTTP request.
pub async fn record_receipt(
    store: &dyn crate::store::Store,
    clock: &crate::clock::Clock,
    metrics: &crate::metrics::Metrics,
    provider: &'static str,
    receipt: &NewReceipt,
) -> Result<ReceiptOutcome, crate::store::StoreError> {
    let mut outcome = store.record_receipt(receipt).await?;
    if !outcome.duplicate && outcome.message_id.is_none() {
        // The send may have recorded this provider id after our lookup and
        // before our commit; it checks for early receipts only after its own
        // commit, so one of the two looks always comes after both commits.
        let now = clock.now();
        if store
            .attach_receipts(&receipt.provider, &receipt.provider_message_id, now)
            .await?
        {
            outcome.applied = true;
        }
    }
    let counted = if outcome.duplicate {
        "duplicate"
    } else if outcome.message_id.is_none() {
        "unmatched"
    } else if outcome.applied {
        "applied"
    } else {
        "recorded"
    };
    metrics.receipt(provider, counted);
    if outcome.duplicate {
        tracing::debug!(provider = %receipt.provider, "duplicate receipt ignored");
    } else if outcome.message_id.is_none() {
        tracing::warn!(
            provider = %receipt.provider,
            provider_message_id = %receipt.provider_message_id,
            provider_status = %receipt.provider_status,
            "receipt for no known message recorded (see `sendonce receipts unmatched`)"
        );
    } else {
        tracing::info!(
            provider = %receipt.provider,
            provider_status = %receipt.provider_status,
            applied = outcome.applied,
            "receipt recorded"
        );
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Status;

    #[test]
    fn provider_statuses() {
        assert_eq!(delivery_status("queued"), Some(Status::Sent));
        assert_eq!(delivery_status("sent"), Some(Status::Sent));
        assert_eq!(delivery_status("DELIVERED"), Some(Status::Delivered));
        assert_eq!(delivery_status("read"), Some(Status::Delivered));
        assert_eq!(delivery_status("undelivered"), Some(Status::Undelivered));
        assert_eq!(delivery_status("failed"), Some(Status::Undelivered));
        assert_eq!(delivery_status("receiving"), None);
        assert_eq!(delivery_status(""), None);
    }

    #[test]
    fn receipts_are_identified_by_what_was_authenticated() {
        // (message id, status, error code, identity)
        #[rustfmt::skip]
        let cases = [
            ("SM1", "delivered", None, "SM1:delivered:"),
            ("SM1", "Delivered", None, "SM1:delivered:"),
            ("SM1", "undelivered", Some("30003"), "SM1:undelivered:30003"),
            ("a:b", "c", None, "a%3Ab:c:"),
            ("a", "b:c", None, "a:b%3Ac:"),
            ("a%3Ab", "c", None, "a%253Ab:c:"),
            ("a", "b", Some(":"), "a:b:%3A"),
        ];
        for (id, status, code, want) in cases {
            assert_eq!(
                receipt_identity(id, status, code),
                want,
                "{id} {status} {code:?}"
            );
        }
    }
}
