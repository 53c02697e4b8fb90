//! `POST /messages/batch`: up to 1,000 sends in one request.
//!
//! Each item is exactly what `POST /messages` with its `idempotency_key` as
//! the `Idempotency-Key` and `Prefer: respond-async` would be: a new key is
//! created (202), the same key and item replays (the stored answer, or 202
//! for a message still scheduled; 409 while one is being sent), the same key
//! with another item is refused (422), an invalid item is refused with its
//! field errors (400), an item past the tenant's request rate (each item
//! counts as one request) or a destination rate limit gets 429. One
//! item's refusal never affects the others; results come in request order.
//!
//! All new rows are written by one statement (Postgres) or one writer
//! transaction (SQLite), without leases: each is `scheduled` for its
//! `send_at` or `processing` due now, and every instance's scheduler starts
//! them at the pace of its free send slots (a batch never fills one
//! instance's send queue, and a crash right after the answer loses none).

use std::collections::HashMap;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};

use super::input::{json_body, request_rate};
use super::{Authenticated, SharedState};
use crate::domain::request::{RequestError, duplicate_key};
use crate::domain::{FieldError, IdempotencyKey, SendRequest};
use crate::error::{ApiError, problem_value};
use crate::send::Sent;
use crate::store::{Claim, KeyState, Queued, TenantAuth};

/// Largest batch body accepted (413 above).
pub const BATCH_BODY_LIMIT: usize = 1024 * 1024;
/// Most items in one batch (413 above).
pub const BATCH_MAX_ITEMS: usize = 1000;

pub fn router() -> Router<SharedState> {
    // `GET` here is the message whose key is `batch` (a static route wins
    // over `/messages/{key}`).
    Router::new().route(
        "/messages/batch",
        post(create_batch).get(super::messages::get_message_named_batch),
    )
}

/// One item's answer.
#[derive(Clone)]
struct ItemResult {
    key: String,
    status: StatusCode,
    message: Option<Value>,
    problem: Option<Value>,
    /// The answer of an earlier request with this key (what
    /// `Idempotent-Replayed: true` says on `POST /messages`): nothing new
    /// was queued for it by this batch.
    replayed: bool,
    /// A limit's wait (429), in seconds.
    retry_after: Option<u64>,
}

impl ItemResult {
    fn refused(key: String, e: &ApiError) -> Self {
        Self {
            key,
            status: e.status(),
            message: None,
            problem: Some(problem_value(e)),
            replayed: false,
            retry_after: e.retry_after_secs(),
        }
    }

    fn answered(key: String, status: StatusCode, message: Option<Value>, replayed: bool) -> Self {
        Self {
            key,
            status,
            message,
            problem: None,
            replayed,
            retry_after: None,
        }
    }

    fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("idempotency_key".into(), Value::String(self.key.clone()));
        o.insert("status".into(), json!(self.status.as_u16()));
        o.insert("replayed".into(), Value::Bool(self.replayed));
        if let Some(m) = &self.message {
            o.insert("message".into(), m.clone());
        }
        if let Some(p) = &self.problem {
            o.insert("problem".into(), p.clone());
        }
        Value::Object(o)
    }
}

/// A valid item, about to be written.
struct Valid {
    index: usize,
    fingerprint: [u8; 32],
    queued: Queued,
    permit: Option<crate::ratelimit::SendPermit>,
}

/// What becomes of one item before the write.
enum Parsed {
    Done(ItemResult),
    Valid(Box<Valid>),
    /// The same key as an earlier item of this batch.
    Repeat {
        first: usize,
        key: String,
        fingerprint: [u8; 32],
    },
}

async fn create_batch(
    State(state): State<SharedState>,
    Authenticated(tenant): Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // The batch's first item counts against the tenant's request rate here
    // (none left: 429 for the whole batch, nothing read); every other item
    // below. Each new item counts against the destination limits like a
    // send.
    request_rate(&state, tenant.id)?;
    let bytes = json_body(&state, &headers, body, BATCH_BODY_LIMIT).await?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| ApiError::MalformedJson)?;
    // Items are read from the parsed value; a duplicated JSON key anywhere
    // would mean different things to different parsers.
    if let Some(path) = duplicate_key(&bytes) {
        return Err(ApiError::Validation(vec![FieldError {
            field: path,
            message: "appears more than once in the JSON object".into(),
        }]));
    }
    let items = batch_items(value)?;
    let now = state.clock.now();

    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut parsed = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        // Each item is a request for the tenant's request rate, as its own
        // `POST /messages` would be (the batch's own count was the first
        // item's): an item past the rate gets 429 and nothing is queued.
        if index > 0
            && let Err(r) = state.limiter.request(tenant.id)
        {
            let shown = item
                .get("idempotency_key")
                .and_then(Value::as_str)
                .map(|k| k.chars().take(255).collect())
                .unwrap_or_default();
            let e = ApiError::RateLimited {
                limit: r.limit,
                retry_after: r.retry_after,
            };
            parsed.push(Parsed::Done(ItemResult::refused(shown, &e)));
            continue;
        }
        let p = parse_item(&state, &tenant, index, item, now, &mut seen).await?;
        parsed.push(p);
    }

    let mut permits: HashMap<usize, crate::ratelimit::SendPermit> = parsed
        .iter_mut()
        .filter_map(|p| match p {
            Parsed::Valid(v) => v.permit.take().map(|permit| (v.index, permit)),
            _ => None,
        })
        .collect();
    let valid: Vec<&Valid> = parsed
        .iter()
        .filter_map(|p| match p {
            Parsed::Valid(v) => Some(&**v),
            _ => None,
        })
        .collect();
    let queued: Vec<Queued> = valid.iter().map(|v| v.queued.clone()).collect();
    let claims: Vec<Result<Claim, ApiError>> = if queued.is_empty() {
        Vec::new()
    } else if tenant.spend_caps.any() {
        capped_claims(&state, &tenant, queued).await?
    } else {
        state
            .store
            .insert_batch(&queued)
            .await?
            .into_iter()
            .map(Ok)
            .collect()
    };
    let mut by_index: HashMap<usize, (&Valid, &Result<Claim, ApiError>)> = HashMap::new();
    for (v, claim) in valid.iter().zip(&claims) {
        by_index.insert(v.index, (v, claim));
    }

    let mut results = Vec::with_capacity(parsed.len());
    let mut wake = None::<time::OffsetDateTime>;
    // The longest wait an item was told (429): after it, every refused item
    // of this batch may be sent again.
    let mut retry_after = None::<u64>;
    for p in &parsed {
        let r = match p {
            Parsed::Done(r) => r.clone(),
            Parsed::Valid(v) => {
                let Some((v, claim)) = by_index.get(&v.index) else {
                    return Err(ApiError::Internal("a batch item without its answer".into()));
                };
                let key = v.queued.message.idempotency_key.to_string();
                match claim {
                    Err(e) => {
                        if let Some(permit) = permits.remove(&v.index) {
                            state.limiter.refund(permit);
                        }
                        ItemResult::refused(key, e)
                    }
                    Ok(Claim::Created(record)) => {
                        if let Some(at) = record.next_attempt_at {
                            wake = Some(wake.map_or(at, |w| w.min(at)));
                        }
                        ItemResult::answered(
                            key,
                            StatusCode::ACCEPTED,
                            serde_json::to_value(record.to_out()).ok(),
                            false,
                        )
                    }
                    Ok(Claim::Existing(existing)) => {
                        if let Some(permit) = permits.remove(&v.index) {
                            state.limiter.refund(permit);
                        }
                        existing_result(&state, tenant.id, key, &v.fingerprint, existing).await?
                    }
                }
            }
            Parsed::Repeat {
                first,
                key,
                fingerprint,
            } => {
                // What a POST right after the first item would get.
                match by_index.get(first) {
                    Some((_, Err(e))) => ItemResult::refused(key.clone(), e),
                    Some((v, Ok(Claim::Created(record)))) => {
                        let state_now = KeyState {
                            id: record.id,
                            fingerprint: v.fingerprint.to_vec(),
                            status: record.status,
                            response: None,
                        };
                        existing_result(&state, tenant.id, key.clone(), fingerprint, &state_now)
                            .await?
                    }
                    Some((_, Ok(Claim::Existing(existing)))) => {
                        existing_result(&state, tenant.id, key.clone(), fingerprint, existing)
                            .await?
                    }
                    // The first was refused before the write (invalid or
                    // rate limited): so is this one, for the same reason.
                    None => match parsed.get(*first) {
                        Some(Parsed::Done(r)) => ItemResult {
                            key: key.clone(),
                            ..r.clone()
                        },
                        _ => {
                            return Err(ApiError::Internal(
                                "a repeated batch key without its first".into(),
                            ));
                        }
                    },
                }
            }
        };
        if let Some(secs) = r.retry_after {
            retry_after = Some(retry_after.map_or(secs, |w| w.max(secs)));
        }
        results.push(r.to_json());
    }
    if let Some(at) = wake {
        state.deliverer.nudge_at(at);
    }
    let mut response = (StatusCode::OK, axum::Json(json!({ "results": results }))).into_response();
    if let Some(secs) = retry_after {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(secs),
        );
    }
    Ok(response)
}

/// A capped tenant's batch: each item charged in its own transaction, in
/// order. Once a cap refuses one, every later new item is refused with the
/// same 429 (nothing past it is sent); a later item whose key is already
/// taken still gets its stored answer.
async fn capped_claims(
    state: &SharedState,
    tenant: &crate::store::TenantAuth,
    queued: Vec<Queued>,
) -> Result<Vec<Result<Claim, ApiError>>, ApiError> {
    let mut out = Vec::with_capacity(queued.len());
    let mut refused: Option<ApiError> = None;
    for q in queued {
        if let Some(e) = &refused {
            let m = &q.message;
            out.push(
                match state
                    .store
                    .key_state(m.tenant_id, m.idempotency_key.as_str())
                    .await?
                {
                    Some(existing) => Ok(Claim::Existing(existing)),
                    None => Err(same_refusal(e)),
                },
            );
            continue;
        }
        let item = crate::store::SpendItem {
            due: q.due,
            send_at: q.send_at,
            message: q.message,
            lease: None,
        };
        match state.sends.insert_capped(tenant, item).await {
            Err(e @ ApiError::SpendCapReached { .. }) => {
                refused = Some(same_refusal(&e));
                out.push(Err(e));
            }
            other => out.push(Ok(other?)),
        }
    }
    Ok(out)
}

/// A copy of a spend refusal for the items after it.
fn same_refusal(e: &ApiError) -> ApiError {
    match e {
        ApiError::SpendCapReached { cap, retry_after } => ApiError::SpendCapReached {
            cap,
            retry_after: *retry_after,
        },
        _ => ApiError::Internal("not a spend refusal".into()),
    }
}

/// The `messages` array, 1 to [`BATCH_MAX_ITEMS`] items.
fn batch_items(value: Value) -> Result<Vec<Value>, ApiError> {
    let field = |message: &str| {
        ApiError::Validation(vec![FieldError {
            field: "messages".into(),
            message: message.into(),
        }])
    };
    let Value::Object(mut map) = value else {
        return Err(ApiError::Validation(vec![FieldError {
            field: String::new(),
            message: "the request body must be a JSON object".into(),
        }]));
    };
    let unknown: Vec<FieldError> = map
        .keys()
        .filter(|k| k.as_str() != "messages")
        .take(10)
        .map(|k| FieldError {
            field: k.chars().take(40).collect(),
            message: "is not a known field".into(),
        })
        .collect();
    if !unknown.is_empty() {
        return Err(ApiError::Validation(unknown));
    }
    match map.remove("messages") {
        None | Some(Value::Null) => Err(field("is required")),
        Some(Value::Array(items)) if items.is_empty() => Err(field("must have at least one item")),
        Some(Value::Array(items)) if items.len() > BATCH_MAX_ITEMS => {
            Err(ApiError::PayloadTooLarge)
        }
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(field("must be an array of messages")),
    }
}

/// Validates one item and takes its rate-limit permit.
async fn parse_item(
    state: &SharedState,
    tenant: &TenantAuth,
    index: usize,
    item: Value,
    now: time::OffsetDateTime,
    seen: &mut HashMap<String, usize>,
) -> Result<Parsed, ApiError> {
    let Value::Object(mut fields) = item else {
        let e = ApiError::Validation(vec![FieldError {
            field: String::new(),
            message: "each item must be a JSON object".into(),
        }]);
        return Ok(Parsed::Done(ItemResult::refused(String::new(), &e)));
    };
    let raw_key = match fields.remove("idempotency_key") {
        Some(Value::String(k)) => k,
        None | Some(Value::Null) => {
            return Ok(Parsed::Done(ItemResult::refused(
                String::new(),
                &ApiError::MissingIdempotencyKey,
            )));
        }
        Some(_) => {
            let e = ApiError::Validation(vec![FieldError {
                field: "idempotency_key".into(),
                message: "must be a string".into(),
            }]);
            return Ok(Parsed::Done(ItemResult::refused(String::new(), &e)));
        }
    };
    let key = match IdempotencyKey::parse(&raw_key) {
        Ok(k) => k,
        Err(e) => {
            let shown: String = raw_key.chars().take(255).collect();
            return Ok(Parsed::Done(ItemResult::refused(
                shown,
                &ApiError::InvalidIdempotencyKey(e),
            )));
        }
    };
    let key_text = key.to_string();
    let body = serde_json::to_vec(&Value::Object(fields)).unwrap_or_default();
    let request = match SendRequest::parse_in(
        &body,
        tenant.home_country.as_deref(),
        crate::provider::registry::chat_channels(),
    ) {
        Ok(r) => r,
        Err(RequestError::Malformed) => {
            return Ok(Parsed::Done(ItemResult::refused(
                key_text,
                &ApiError::MalformedJson,
            )));
        }
        Err(RequestError::Invalid(errors)) => {
            return Ok(Parsed::Done(ItemResult::refused(
                key_text,
                &ApiError::Validation(errors),
            )));
        }
    };
    let prepared = match state.sends.prepare(tenant, key, request, now) {
        Ok(p) => p,
        Err(e) => return Ok(Parsed::Done(ItemResult::refused(key_text, &e))),
    };
    let fingerprint = *prepared.fingerprint();
    if let Some(&first) = seen.get(&key_text) {
        return Ok(Parsed::Repeat {
            first,
            key: key_text,
            fingerprint,
        });
    }
    seen.insert(key_text.clone(), index);

    // Destination limits count new sends only: a refused item whose key
    // exists is a replay (or a 422) and goes on.
    let permit = match state.limiter.send(tenant.id, prepared.to()) {
        Ok(p) => Some(p),
        Err(refused) => match state.store.key_state(tenant.id, key_text.as_str()).await? {
            Some(existing) => {
                return Ok(Parsed::Done(
                    existing_result(state, tenant.id, key_text, &fingerprint, &existing).await?,
                ));
            }
            None => {
                let e = ApiError::RateLimited {
                    limit: refused.limit,
                    retry_after: refused.retry_after,
                };
                return Ok(Parsed::Done(ItemResult::refused(key_text, &e)));
            }
        },
    };
    Ok(Parsed::Valid(Box::new(Valid {
        index,
        fingerprint,
        queued: state.sends.queued(tenant.id, prepared),
        permit,
    })))
}

/// What a respond-async `POST /messages` with a taken key answers.
async fn existing_result(
    state: &SharedState,
    tenant_id: uuid::Uuid,
    key: String,
    fingerprint: &[u8],
    existing: &KeyState,
) -> Result<ItemResult, ApiError> {
    let sent = state
        .sends
        .answer_existing(tenant_id, fingerprint, existing, std::time::Duration::ZERO)
        .await;
    let replayed = sent.as_ref().is_ok_and(super::messages::is_replay);
    let (status, message) = match sent {
        Ok(Sent::Final(r) | Sent::Replayed(r)) => (
            StatusCode::from_u16(r.status_code).unwrap_or(StatusCode::CREATED),
            serde_json::from_slice(&r.body).ok(),
        ),
        Ok(Sent::Remembered { status_code, body }) => (
            StatusCode::from_u16(status_code).unwrap_or(StatusCode::CREATED),
            serde_json::from_slice(&body).ok(),
        ),
        Ok(Sent::Scheduled(record) | Sent::Pending(record) | Sent::ReplayedScheduled(record)) => (
            StatusCode::ACCEPTED,
            serde_json::to_value(record.to_out()).ok(),
        ),
        Err(e @ (ApiError::KeyReused | ApiError::KeyInUse)) => {
            return Ok(ItemResult::refused(key, &e));
        }
        Err(e) => return Err(e),
    };
    Ok(ItemResult::answered(key, status, message, replayed))
}
