//! Delivery receipts and a message's event history.
//!
//! - `POST /providers/twilio/status`: Twilio's status callback (form-encoded),
//!   authenticated by `X-Twilio-Signature` (HMAC-SHA1 keyed with
//!   `TWILIO_AUTH_TOKEN` over the public URL of this endpoint and every POST
//!   parameter; compared in constant time).
//! - `POST /providers/http/status`: the `http` provider's receipt, JSON
//!   `{"id","status","event_id","error_code"?}`, authenticated by the shared
//!   secret `SENDONCE_RECEIPT_SECRET` in `X-Receipt-Secret`.
//!
//! A message's history, receipts included, is `GET /messages/{key}/events`
//! (`history.rs`).
//!
//! A receipt that is not authenticated is answered 403 and changes nothing.
//! The `http` receipt's secret is checked before its body is read; Twilio's
//! signature covers the body, so only the presence of the signature (and of
//! a configured token) is. Either body must arrive whole within the same
//! deadline as `POST /messages` (`body_read_timeout`), or the answer is 408.
//! An authenticated one is stored once under an identity built from what was
//! authenticated: the provider's message id, the status and the error code
//! ([`receipt_identity`]). Twilio's `I-Twilio-Idempotency-Token` is not
//! signed and the http provider's `event_id` adds nothing the secret does
//! not already cover, so neither is used: a redelivered or replayed receipt
//! (fresh tokens or not) is answered 200 and changes nothing. Status only
//! moves forward (`sent` to `delivered` or `undelivered`, never back), and a
//! receipt for a message we do not know is answered 200 and kept for
//! inspection. The frozen POST response is never
//! touched: replays stay byte for byte what they were.

use axum::Router;
use axum::body::Body;
use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Serialize;
use subtle::ConstantTimeEq;

use super::SharedState;
use super::input::read_body;
use crate::domain::request::duplicate_key;
use crate::domain::{FieldError, Status};
use crate::error::ApiError;
use crate::provider::twilio;
use crate::store::{NewReceipt, ReceiptOutcome};

/// Where Twilio posts status callbacks (`StatusCallback` is this on the public URL).
pub use crate::config::ReceiptSettings;
pub use crate::provider::twilio::STATUS_CALLBACK_PATH as TWILIO_STATUS_PATH;
/// Where the `http` provider posts receipts.
pub const HTTP_STATUS_PATH: &str = "/providers/http/status";
/// The header carrying `SENDONCE_RECEIPT_SECRET` on `http` receipts.
pub const RECEIPT_SECRET_HEADER: &str = "x-receipt-secret";

/// Longest provider id, event id or status accepted in a receipt.
const MAX_ID_LEN: usize = 255;
const MAX_STATUS_LEN: usize = 64;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route(TWILIO_STATUS_PATH, post(twilio_status))
        .route(HTTP_STATUS_PATH, post(http_status))
}

/// What a provider's status word means for us. `None`: not a status we track
/// (recorded in the history, changes nothing).
pub fn delivery_status(provider_status: &str) -> Option<Status> {
    match provider_status.to_ascii_lowercase().as_str() {
        "accepted" | "scheduled" | "queued" | "sending" | "sent" => Some(Status::Sent),
        "delivered" | "read" => Some(Status::Delivered),
        // Twilio's `failed` after it accepted a message means it could not
        // be sent on: for us that is a message not delivered.
        "undelivered" | "failed" | "canceled" => Some(Status::Undelivered),
        _ => None,
    }
}

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

fn ack(outcome: ReceiptOutcome) -> Response {
    let body = Ack {
        duplicate: outcome.duplicate,
        message_id: outcome.message_id.map(|id| id.to_string()),
        applied: outcome.applied,
    };
    (StatusCode::OK, axum::Json(body)).into_response()
}

pub(super) fn invalid(field: &str, message: &str) -> ApiError {
    ApiError::Validation(vec![FieldError {
        field: field.to_string(),
        message: message.to_string(),
    }])
}

/// The URLs Twilio may have signed for this request: the configured public
/// URL, or (none configured) this request's own address as http and https.
/// Trying several is safe: the signature must still match one of them.
fn signed_urls(
    settings: &ReceiptSettings,
    headers: &HeaderMap,
    path_and_query: &str,
) -> Vec<String> {
    if let Some(base) = &settings.public_url {
        return vec![format!("{base}{path_and_query}")];
    }
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return Vec::new();
    };
    vec![
        format!("https://{host}{path_and_query}"),
        format!("http://{host}{path_and_query}"),
    ]
}

async fn twilio_status(
    State(state): State<SharedState>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Some(token) = state.receipts.twilio_auth_token.as_deref() else {
        tracing::warn!("a Twilio status callback arrived but TWILIO_AUTH_TOKEN is not set");
        return Err(ApiError::Forbidden);
    };
    let signature = headers
        .get("x-twilio-signature")
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::Forbidden)?;
    let body = read_body(body, state.body_read_timeout).await?;
    let params: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let path_and_query = uri
        .path_and_query()
        .map_or(TWILIO_STATUS_PATH, |p| p.as_str());
    let authentic = signed_urls(&state.receipts, &headers, path_and_query)
        .iter()
        .any(|url| twilio::verify_signature(token, url, &params, signature));
    if !authentic {
        tracing::warn!("rejected a Twilio status callback with a bad signature");
        return Err(ApiError::Forbidden);
    }
    let param = |names: &[&str]| {
        names.iter().find_map(|n| {
            params
                .iter()
                .find(|(k, v)| k == n && !v.is_empty())
                .map(|(_, v)| v.clone())
        })
    };
    let sid =
        param(&["MessageSid", "SmsSid"]).ok_or_else(|| invalid("MessageSid", "is required"))?;
    let status = param(&["MessageStatus", "SmsStatus"])
        .ok_or_else(|| invalid("MessageStatus", "is required"))?;
    if sid.len() > MAX_ID_LEN {
        return Err(invalid("MessageSid", "is longer than 255 characters"));
    }
    if status.len() > MAX_STATUS_LEN {
        return Err(invalid("MessageStatus", "is longer than 64 characters"));
    }
    // Not the unsigned I-Twilio-Idempotency-Token header: a captured
    // callback replayed with fresh tokens must still be a duplicate.
    let error_code = param(&["ErrorCode"]);
    let receipt = NewReceipt {
        provider: "twilio".into(),
        event_id: receipt_identity(&sid, &status, error_code.as_deref()),
        provider_message_id: sid,
        status: delivery_status(&status),
        provider_status: status,
        error_code,
        received_at: state.clock.now(),
    };
    record(&state, &receipt).await
}

async fn http_status(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Some(secret) = state.receipts.http_secret.as_deref() else {
        tracing::warn!("an http provider receipt arrived but SENDONCE_RECEIPT_SECRET is not set");
        return Err(ApiError::Forbidden);
    };
    let given = headers
        .get(RECEIPT_SECRET_HEADER)
        .map(|v| v.as_bytes())
        .ok_or(ApiError::Forbidden)?;
    if !bool::from(given.ct_eq(secret.as_bytes())) {
        tracing::warn!("rejected an http provider receipt with a wrong secret");
        return Err(ApiError::Forbidden);
    }
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if !json_body {
        return Err(ApiError::UnsupportedMediaType);
    }
    let body = read_body(body, state.body_read_timeout).await?;
    let value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|_| ApiError::MalformedJson)?;
    // Parsers disagree on which duplicate wins: refused, as on POST /messages.
    if let Some(path) = duplicate_key(&body) {
        return Err(invalid(&path, "appears more than once in the JSON object"));
    }
    let Some(object) = value.as_object() else {
        return Err(invalid("", "the request body must be a JSON object"));
    };
    let mut errors = Vec::new();
    let mut text = |name: &str, max: usize| -> Option<String> {
        match object.get(name) {
            Some(serde_json::Value::String(s)) if !s.is_empty() && s.chars().count() <= max => {
                Some(s.clone())
            }
            Some(serde_json::Value::String(s)) if !s.is_empty() => {
                errors.push(FieldError {
                    field: name.into(),
                    message: format!("must be at most {max} characters"),
                });
                None
            }
            None | Some(serde_json::Value::Null) => {
                errors.push(FieldError {
                    field: name.into(),
                    message: "is required".into(),
                });
                None
            }
            Some(_) => {
                errors.push(FieldError {
                    field: name.into(),
                    message: "must be a non-empty string".into(),
                });
                None
            }
        }
    };
    let id = text("id", MAX_ID_LEN);
    let status = text("status", MAX_STATUS_LEN);
    let event_id = text("event_id", MAX_ID_LEN);
    let error_code = match object.get("error_code") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) if s.chars().count() <= MAX_STATUS_LEN => {
            Some(s.clone())
        }
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        Some(_) => {
            errors.push(FieldError {
                field: "error_code".into(),
                message: "must be a string of at most 64 characters, a number or null".into(),
            });
            None
        }
    };
    let (Some(id), Some(status), Some(_event_id)) = (id, status, event_id) else {
        errors.sort_by(|a, b| a.field.cmp(&b.field));
        return Err(ApiError::Validation(errors));
    };
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    // The provider's `event_id` is required but is not the identity: the
    // whole body is what the secret authenticates, and a replay of it with
    // a fresh `event_id` is the same event.
    let receipt = NewReceipt {
        provider: "http".into(),
        event_id: receipt_identity(&id, &status, error_code.as_deref()),
        provider_message_id: id,
        status: delivery_status(&status),
        provider_status: status,
        error_code,
        received_at: state.clock.now(),
    };
    record(&state, &receipt).await
}

async fn record(state: &SharedState, receipt: &NewReceipt) -> Result<Response, ApiError> {
    let mut outcome = state.store.record_receipt(receipt).await?;
    if !outcome.duplicate && outcome.message_id.is_none() {
        // The send may have recorded this provider id after our lookup and
        // before our commit; it checks for early receipts only after its own
        // commit, so one of the two looks always comes after both commits.
        let now = state.clock.now();
        if state
            .store
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
    state.metrics.receipt(&receipt.provider, counted);
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
    Ok(ack(outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn signed_urls_prefer_the_public_url() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "10.0.0.5:8080".parse().unwrap());
        let configured = ReceiptSettings {
            public_url: Some("https://sms.example.com".into()),
            ..ReceiptSettings::default()
        };
        assert_eq!(
            signed_urls(&configured, &headers, TWILIO_STATUS_PATH),
            vec!["https://sms.example.com/providers/twilio/status"]
        );
        assert_eq!(
            signed_urls(
                &ReceiptSettings::default(),
                &headers,
                "/providers/twilio/status?a=1"
            ),
            vec![
                "https://10.0.0.5:8080/providers/twilio/status?a=1",
                "http://10.0.0.5:8080/providers/twilio/status?a=1"
            ]
        );
        let debug = format!(
            "{:?}",
            ReceiptSettings {
                twilio_auth_token: Some("secret-token".into()),
                ..configured
            }
        );
        assert!(!debug.contains("secret-token"), "{debug}");
    }
}
