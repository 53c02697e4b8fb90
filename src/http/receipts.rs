//! Delivery receipts and a message's event history.
//!
//! - `POST /providers/twilio/status`: Twilio's status callback (form-encoded),
//!   authenticated by `X-Twilio-Signature` (HMAC-SHA1 keyed with
//!   `TWILIO_AUTH_TOKEN` over the public URL of this endpoint and every POST
//!   parameter; compared in constant time).
//! - `POST /providers/http/status`: the `http` provider's receipt, JSON
//!   `{"id","status","event_id","error_code"?}`, authenticated by the shared
//!   secret `SENDONCE_RECEIPT_SECRET` in `X-Receipt-Secret`.
//! - `GET /messages/{key}/events`: attempts, failovers, circuit changes and
//!   receipts, oldest first, in pages (`limit`, and `cursor` from the
//!   previous page's `next_cursor`).
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
use axum::extract::rejection::PathRejection;
use axum::extract::rejection::QueryRejection;
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use subtle::ConstantTimeEq;
use time::OffsetDateTime;

use super::messages::read_body;
use super::{SharedState, Tenant};
use crate::domain::request::duplicate_key;
use crate::domain::{FieldError, Status};
use crate::error::ApiError;
use crate::provider::twilio;
use crate::store::{AttemptRow, NewReceipt, ReceiptOutcome, ReceiptRow};

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
        .route("/messages/{key}/events", get(list_events))
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

fn invalid(field: &str, message: &str) -> ApiError {
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

/// One entry of a message's history.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Event {
    Attempt {
        #[serde(with = "time::serde::rfc3339")]
        at: OffsetDateTime,
        #[serde(flatten)]
        attempt: AttemptRow,
    },
    /// The message moved on from provider `from` to `to`.
    Failover {
        #[serde(with = "time::serde::rfc3339")]
        at: OffsetDateTime,
        from: String,
        to: String,
        reason: String,
    },
    /// An answer to this message opened or closed its provider's circuit.
    Circuit {
        #[serde(with = "time::serde::rfc3339")]
        at: OffsetDateTime,
        provider: String,
        state: &'static str,
        detail: String,
    },
    Receipt {
        #[serde(with = "time::serde::rfc3339")]
        at: OffsetDateTime,
        provider: String,
        event_id: String,
        provider_status: String,
        status: Option<Status>,
        error_code: Option<String>,
        applied: bool,
    },
}

/// Where an event sits in a message's history: its time, then attempts,
/// routing events (failovers, circuit changes) and receipts at the same
/// instant, then the attempt's number, the routing event's place in the
/// message's routing history or the receipt's arrival order. Pages of `/events` continue after one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    /// Microseconds since the epoch (the precision both databases keep).
    micros: i64,
    /// 0: attempt, 1: routing event, 2: receipt.
    kind: u8,
    /// Attempt number, routing event index or receipt `seq`.
    n: i64,
}

impl Position {
    fn at(t: OffsetDateTime, kind: u8, n: i64) -> Self {
        let micros = i64::try_from(t.unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX);
        Position { micros, kind, n }
    }

    fn time(self) -> Option<OffsetDateTime> {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.micros) * 1000).ok()
    }

    /// The opaque cursor a client hands back.
    fn cursor(self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}.{}.{}", self.micros, self.kind, self.n))
    }

    fn from_cursor(cursor: &str) -> Option<Self> {
        if cursor.len() > 64 {
            return None;
        }
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(cursor).ok()?).ok()?;
        let mut parts = text.split('.');
        let position = Position {
            micros: parts.next()?.parse().ok()?,
            kind: parts.next()?.parse().ok().filter(|k| *k <= 2)?,
            n: parts.next()?.parse().ok()?,
        };
        (parts.next().is_none() && position.time().is_some()).then_some(position)
    }
}

/// One page of a message's history: the attempts, routing events and
/// receipts after
/// `after`, oldest first, at most `limit`, and the position to continue
/// from when more remain. `receipts` must hold the receipts after `after`
/// in order (at least `limit + 1` of them if there are that many).
fn page(
    attempts: Vec<AttemptRow>,
    routing: Vec<crate::store::MessageEvent>,
    receipts: Vec<ReceiptRow>,
    after: Option<Position>,
    limit: usize,
) -> (Vec<Event>, Option<Position>) {
    let mut events: Vec<(Position, Event)> = Vec::new();
    for (i, e) in routing.into_iter().enumerate() {
        let event = if e.kind == "failover" {
            Event::Failover {
                at: e.at,
                from: e.provider,
                to: e.to_provider.unwrap_or_default(),
                reason: e.detail,
            }
        } else {
            Event::Circuit {
                at: e.at,
                provider: e.provider,
                state: if e.kind == "circuit_closed" {
                    "closed"
                } else {
                    "open"
                },
                detail: e.detail,
            }
        };
        // After the attempt that caused it, which started no later.
        let n = i64::try_from(i).unwrap_or(i64::MAX);
        events.push((Position::at(e.at, 1, n), event));
    }
    for a in attempts {
        let at = Position::at(a.started_at, 0, i64::from(a.number));
        events.push((
            at,
            Event::Attempt {
                at: a.started_at,
                attempt: a,
            },
        ));
    }
    for r in receipts {
        events.push((
            Position::at(r.received_at, 2, r.seq),
            Event::Receipt {
                at: r.received_at,
                provider: r.provider,
                event_id: r.event_id,
                provider_status: r.provider_status,
                status: r.status,
                error_code: r.error_code,
                applied: r.applied,
            },
        ));
    }
    events.retain(|(p, _)| after.is_none_or(|after| *p > after));
    events.sort_by_key(|(p, _)| *p);
    let more = events.len() > limit;
    events.truncate(limit);
    let next = more.then(|| events.last().map(|(p, _)| *p)).flatten();
    (events.into_iter().map(|(_, e)| e).collect(), next)
}

/// Longest page of `/events`, and the default.
pub const EVENTS_MAX_LIMIT: u32 = 500;
pub const EVENTS_DEFAULT_LIMIT: u32 = 100;

#[derive(serde::Deserialize)]
struct EventsQuery {
    cursor: Option<String>,
    limit: Option<u32>,
}

async fn list_events(
    State(state): State<SharedState>,
    Tenant(tenant_id): Tenant,
    key: Result<Path<String>, PathRejection>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let limit_error = || {
        invalid(
            "limit",
            &format!("must be a whole number from 1 to {EVENTS_MAX_LIMIT}"),
        )
    };
    let (_, record) = super::messages::message_at(&state, tenant_id, key).await?;
    let Query(query) = query.map_err(|_| limit_error())?;
    let limit = query.limit.unwrap_or(EVENTS_DEFAULT_LIMIT);
    if !(1..=EVENTS_MAX_LIMIT).contains(&limit) {
        return Err(limit_error());
    }
    let after = match query.cursor.as_deref() {
        None => None,
        Some(c) => Some(Position::from_cursor(c).ok_or_else(|| {
            invalid(
                "cursor",
                "is not a cursor this endpoint returned (next_cursor)",
            )
        })?),
    };
    // Receipts after the cursor: an attempt position takes every receipt at
    // its instant (receipts come after attempts), a receipt position those
    // after its seq.
    let receipts_after = after.and_then(|p| {
        let seq = if p.kind < 2 { 0 } else { p.n };
        p.time().map(|t| (t, seq))
    });
    let attempts = state.store.attempts(record.id).await?;
    let routing = state.store.message_events(record.id).await?;
    let receipts = state
        .store
        .receipts_after(record.id, receipts_after, limit + 1)
        .await?;
    let (data, next) = page(attempts, routing, receipts, after, limit as usize);
    Ok(axum::Json(serde_json::json!({
        "data": data,
        "next_cursor": next.map(Position::cursor),
    }))
    .into_response())
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

    fn attempt(number: u32, at: i64) -> AttemptRow {
        AttemptRow {
            number,
            lease_owner: None,
            started_at: OffsetDateTime::from_unix_timestamp(at).unwrap(),
            finished_at: None,
            outcome: None,
            http_status: None,
            provider_code: None,
            error: None,
            provider_message_id: None,
            provider: "twilio".into(),
        }
    }

    fn failover(at: i64) -> crate::store::MessageEvent {
        crate::store::MessageEvent {
            at: OffsetDateTime::from_unix_timestamp(at).unwrap(),
            kind: "failover".into(),
            provider: "twilio".into(),
            to_provider: Some("http".into()),
            detail: "not reachable".into(),
        }
    }

    fn receipt(seq: i64, at: i64) -> ReceiptRow {
        ReceiptRow {
            seq,
            provider: "http".into(),
            event_id: format!("e{seq}"),
            provider_message_id: "p".into(),
            message_id: None,
            provider_status: "sent".into(),
            status: None,
            error_code: None,
            applied: false,
            received_at: OffsetDateTime::from_unix_timestamp(at).unwrap(),
        }
    }

    /// The (kind, n) of each event on a page.
    fn names(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Attempt { attempt, .. } => format!("a{}", attempt.number),
                Event::Receipt { event_id, .. } => event_id.clone(),
                Event::Failover { to, .. } => format!("f{to}"),
                Event::Circuit { provider, .. } => format!("c{provider}"),
            })
            .collect()
    }

    #[test]
    fn history_pages_follow_one_order_without_gaps_or_repeats() {
        // Attempt 2, a failover and receipt 2 at the same second: the
        // attempt first, then the failover, then the receipt.
        let attempts = || vec![attempt(1, 10), attempt(2, 20)];
        let routing = || vec![failover(20)];
        let receipts = || vec![receipt(1, 15), receipt(2, 20), receipt(3, 30)];
        let (all, next) = page(attempts(), routing(), receipts(), None, 10);
        assert_eq!(names(&all), ["a1", "e1", "a2", "fhttp", "e2", "e3"]);
        assert_eq!(next, None);

        let mut seen = Vec::new();
        let mut after = None;
        for _ in 0..10 {
            // As the store would: only receipts after the position.
            let rs: Vec<ReceiptRow> = receipts()
                .into_iter()
                .filter(|r| {
                    after.is_none_or(|p: Position| Position::at(r.received_at, 2, r.seq) > p)
                })
                .collect();
            let (events, next) = page(attempts(), routing(), rs, after, 2);
            assert!(events.len() <= 2);
            seen.extend(names(&events));
            let Some(next) = next else { break };
            let round_trip = Position::from_cursor(&next.cursor());
            assert_eq!(round_trip, Some(next));
            after = round_trip;
        }
        assert_eq!(seen, ["a1", "e1", "a2", "fhttp", "e2", "e3"]);
    }

    #[test]
    fn only_our_cursors_are_accepted() {
        let p = Position::at(
            OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
            1,
            7,
        );
        assert_eq!(Position::from_cursor(&p.cursor()), Some(p));
        for bad in [
            "",
            "x",
            "not base64!",
            &URL_SAFE_NO_PAD.encode("1.3.3"),
            &URL_SAFE_NO_PAD.encode("1.0"),
            &URL_SAFE_NO_PAD.encode("1.0.1.1"),
            &URL_SAFE_NO_PAD.encode("a.0.1"),
            &"A".repeat(100),
        ] {
            assert_eq!(Position::from_cursor(bad), None, "{bad}");
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
