//! Rows as both databases return them, and their conversion into records:
//! written once. Columns whose SQL types differ between the backends decode
//! through types that know both ([`DbTime`], [`Json`], the text columns
//! below), so one `FromRow` struct serves Postgres and SQLite.

use std::collections::BTreeMap;

pub(crate) mod console;
pub(crate) mod routing;
pub(crate) mod tenants;
pub(crate) mod verifications;

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::types::Json;
use sqlx::{Decode, Encode, Postgres, Sqlite, Type};
use uuid::Uuid;

use super::time::DbTime;
use super::types::{AttemptRow, KeyState, LeaseState, MessageRecord, ReceiptRow, StoredResponse};
use crate::domain::{
    AttemptOutcome, Encoding, IdempotencyKey, MessageError, MessageId, Recipient, Status,
};

/// The columns of a message row (`m`), plus its latest attempt's state and
/// whether its recipient opted out: valid SQL on both backends, read by
/// [`MessageRow`]. A macro so queries stay `&'static str` (`concat!`).
macro_rules! message_columns {
    () => {
        "m.id, m.tenant_id, m.idempotency_key, m.fingerprint, \
        m.status, m.to_number, m.from_sender, m.body, m.segments, m.encoding, m.metadata, \
        m.validity_seconds, m.provider, m.route, m.route_order, m.provider_message_id, m.attempts, m.maybe_sent, m.error, \
        m.response_code, m.response_body, m.lease_token, m.lease_owner, m.lease_expires_at, \
        m.next_attempt_at, m.created_at, m.updated_at, m.sent_at, m.delivery_status_at, \
        m.expires_at, m.deadline_at, m.send_at, m.cost_micros, m.cost_currency, m.prepared_token, \
        m.verification_id, \
        (SELECT a.started_at FROM attempts a WHERE a.message_id = m.id AND a.number = m.attempts) \
            AS last_attempt_started_at, \
        (SELECT a.sender FROM attempts a WHERE a.message_id = m.id AND a.number = m.attempts) \
            AS last_attempt_sender, \
        COALESCE((SELECT a.finished_at IS NULL FROM attempts a \
            WHERE a.message_id = m.id AND a.number = m.attempts), false) AS last_attempt_open, \
        EXISTS (SELECT 1 FROM opt_outs o WHERE o.tenant_id = m.tenant_id \
            AND o.number IN (m.to_number, m.provider || ':' || m.to_number)) \
            AS recipient_opted_out"
    };
}

/// The columns a replay or a waiting duplicate reads ([`KeyStateRow`]).
macro_rules! key_state_columns {
    () => {
        "id, fingerprint, status, response_code, response_body"
    };
}

/// The columns of a receipt row ([`ReceiptDbRow`]).
macro_rules! receipt_columns {
    () => {
        "seq, provider, event_id, provider_message_id, message_id, provider_status, status, \
        error_code, applied, received_at"
    };
}

/// The columns of an attempt row ([`AttemptDbRow`]).
macro_rules! attempt_columns {
    () => {
        "number, lease_owner, started_at, finished_at, outcome, http_status, provider_code, \
        error, provider_message_id, COALESCE(provider, \
            (SELECT m.provider FROM messages m WHERE m.id = attempts.message_id)) AS provider"
    };
}

pub(crate) use {attempt_columns, key_state_columns, message_columns, receipt_columns};

/// A type stored as its name in a text column: decoding checks the name.
macro_rules! text_column {
    ($ty:ty, $what:literal, |$s:ident| $parse:expr, |$v:ident| $name:expr) => {
        text_column!(@db Postgres, $ty, $what, |$s| $parse, |$v| $name);
        text_column!(@db Sqlite, $ty, $what, |$s| $parse, |$v| $name);
    };
    (@db $db:ident, $ty:ty, $what:literal, |$s:ident| $parse:expr, |$v:ident| $name:expr) => {
        impl Type<$db> for $ty {
            fn type_info() -> <$db as sqlx::Database>::TypeInfo {
                <str as Type<$db>>::type_info()
            }
            fn compatible(ty: &<$db as sqlx::Database>::TypeInfo) -> bool {
                <str as Type<$db>>::compatible(ty)
            }
        }
        impl Encode<'_, $db> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut <$db as sqlx::Database>::ArgumentBuffer,
            ) -> Result<IsNull, BoxDynError> {
                let $v = self;
                <&str as Encode<$db>>::encode($name, buf)
            }
        }
        impl<'r> Decode<'r, $db> for $ty {
            fn decode(value: <$db as sqlx::Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
                let $s = <&str as Decode<$db>>::decode(value)?;
                $parse.ok_or_else(|| format!(concat!("not a valid ", $what, ": {:?}"), $s).into())
            }
        }
    };
}

text_column!(Status, "status", |s| Status::parse(s), |v| v.as_str());
text_column!(Encoding, "encoding", |s| Encoding::parse(s), |v| v.as_str());
text_column!(
    AttemptOutcome,
    "attempt outcome",
    |s| AttemptOutcome::parse(s),
    |v| v.as_str()
);
text_column!(
    IdempotencyKey,
    "idempotency key",
    |s| IdempotencyKey::parse(s).ok(),
    |v| v.as_str()
);
// The one conversion between a message's recipient and its `to_number`
// column (a channel column comes with a second channel).
text_column!(
    Recipient,
    "recipient address",
    |s| Recipient::from_stored(s, crate::provider::registry::chat_channels()),
    |v| v.as_str()
);

/// A message row with its latest attempt's state.
#[derive(sqlx::FromRow)]
pub struct MessageRow {
    id: Uuid,
    tenant_id: Uuid,
    idempotency_key: IdempotencyKey,
    fingerprint: Vec<u8>,
    status: Status,
    to_number: Recipient,
    from_sender: Option<String>,
    body: String,
    segments: i32,
    encoding: Encoding,
    metadata: Json<BTreeMap<String, String>>,
    validity_seconds: Option<i32>,
    provider: String,
    route: Option<String>,
    route_order: Option<String>,
    provider_message_id: Option<String>,
    attempts: i32,
    maybe_sent: bool,
    error: Option<Json<MessageError>>,
    response_code: Option<i16>,
    response_body: Option<Vec<u8>>,
    lease_token: Option<Uuid>,
    lease_owner: Option<String>,
    lease_expires_at: Option<DbTime>,
    next_attempt_at: Option<DbTime>,
    created_at: DbTime,
    updated_at: DbTime,
    sent_at: Option<DbTime>,
    delivery_status_at: Option<DbTime>,
    expires_at: Option<DbTime>,
    deadline_at: DbTime,
    send_at: Option<DbTime>,
    cost_micros: Option<i64>,
    cost_currency: Option<String>,
    prepared_token: Option<String>,
    verification_id: Option<Uuid>,
    last_attempt_started_at: Option<DbTime>,
    last_attempt_sender: Option<String>,
    last_attempt_open: bool,
    recipient_opted_out: bool,
}

fn t(v: Option<DbTime>) -> Option<time::OffsetDateTime> {
    v.map(|t| t.0)
}

pub fn stored_response(code: Option<i16>, body: Option<Vec<u8>>) -> Option<StoredResponse> {
    match (code, body) {
        (Some(code), Some(body)) => Some(StoredResponse {
            status_code: u16::try_from(code).unwrap_or(500),
            body,
        }),
        _ => None,
    }
}

/// A count the schema keeps non-negative.
fn count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

impl From<MessageRow> for MessageRecord {
    fn from(r: MessageRow) -> Self {
        MessageRecord {
            id: MessageId(r.id),
            tenant_id: r.tenant_id,
            idempotency_key: r.idempotency_key,
            fingerprint: r.fingerprint,
            status: r.status,
            to: r.to_number,
            from: r.from_sender,
            body: r.body,
            segments: count(r.segments),
            encoding: r.encoding,
            metadata: r.metadata.0,
            validity_seconds: r.validity_seconds,
            provider: r.provider,
            route: r.route,
            route_order: r.route_order,
            provider_message_id: r.provider_message_id,
            attempts: count(r.attempts),
            maybe_sent: r.maybe_sent,
            error: r.error.map(|e| e.0),
            response: stored_response(r.response_code, r.response_body),
            lease: match (r.lease_token, r.lease_owner, r.lease_expires_at) {
                (Some(token), Some(owner), Some(expires_at)) => Some(LeaseState {
                    token,
                    owner,
                    expires_at: expires_at.0,
                }),
                _ => None,
            },
            next_attempt_at: t(r.next_attempt_at),
            created_at: r.created_at.0,
            updated_at: r.updated_at.0,
            sent_at: t(r.sent_at),
            delivery_status_at: t(r.delivery_status_at),
            expires_at: t(r.expires_at),
            deadline_at: r.deadline_at.0,
            last_attempt_open: r.last_attempt_open,
            last_attempt_started_at: t(r.last_attempt_started_at),
            last_attempt_sender: r.last_attempt_sender,
            recipient_opted_out: r.recipient_opted_out,
            send_at: t(r.send_at),
            cost: match (r.cost_micros, r.cost_currency) {
                (Some(m), Some(c)) => Some(crate::spend::Cost::new(m, &c)),
                _ => None,
            },
            prepared_token: r.prepared_token,
            verification_id: r.verification_id,
        }
    }
}

/// What a replay reads ([`key_state_columns`]).
#[derive(sqlx::FromRow)]
pub struct KeyStateRow {
    id: Uuid,
    fingerprint: Vec<u8>,
    status: Status,
    response_code: Option<i16>,
    response_body: Option<Vec<u8>>,
}

impl From<KeyStateRow> for KeyState {
    fn from(r: KeyStateRow) -> Self {
        KeyState {
            id: MessageId(r.id),
            fingerprint: r.fingerprint,
            status: r.status,
            response: stored_response(r.response_code, r.response_body),
        }
    }
}

/// An attempt row ([`attempt_columns`]).
#[derive(sqlx::FromRow)]
pub struct AttemptDbRow {
    number: i32,
    lease_owner: Option<String>,
    started_at: DbTime,
    finished_at: Option<DbTime>,
    outcome: Option<AttemptOutcome>,
    http_status: Option<i32>,
    provider_code: Option<String>,
    error: Option<String>,
    provider_message_id: Option<String>,
    provider: Option<String>,
}

impl From<AttemptDbRow> for AttemptRow {
    fn from(r: AttemptDbRow) -> Self {
        AttemptRow {
            number: count(r.number),
            lease_owner: r.lease_owner,
            started_at: r.started_at.0,
            finished_at: t(r.finished_at),
            outcome: r.outcome.map(|o| o.as_str().to_string()),
            http_status: r.http_status.and_then(|s| u16::try_from(s).ok()),
            provider_code: r.provider_code,
            error: r.error,
            provider_message_id: r.provider_message_id,
            provider: r.provider.unwrap_or_default(),
        }
    }
}

/// A receipt row ([`receipt_columns`]).
#[derive(sqlx::FromRow)]
pub struct ReceiptDbRow {
    seq: i64,
    provider: String,
    event_id: String,
    provider_message_id: String,
    message_id: Option<Uuid>,
    provider_status: String,
    status: Option<Status>,
    error_code: Option<String>,
    applied: bool,
    received_at: DbTime,
}

impl From<ReceiptDbRow> for ReceiptRow {
    fn from(r: ReceiptDbRow) -> Self {
        ReceiptRow {
            seq: r.seq,
            provider: r.provider,
            event_id: r.event_id,
            provider_message_id: r.provider_message_id,
            message_id: r.message_id.map(|id| MessageId(id).to_string()),
            provider_status: r.provider_status,
            status: r.status,
            error_code: r.error_code,
            applied: r.applied,
            received_at: r.received_at.0,
        }
    }
}

/// The first final delivery receipt of a message, and the message's status.
#[derive(sqlx::FromRow)]
pub struct FirstFinalReceipt {
    pub seq: i64,
    pub status: Status,
    pub provider_status: String,
    pub error_code: Option<String>,
    pub received_at: DbTime,
}

/// An API key as listed.
#[derive(sqlx::FromRow)]
pub struct ApiKeyRow {
    id: Uuid,
    name: String,
    key_prefix: String,
    created_at: DbTime,
    revoked_at: Option<DbTime>,
    scopes: String,
    label: Option<String>,
    last_used_at: Option<DbTime>,
    test: bool,
}

impl From<ApiKeyRow> for super::types::ApiKeyInfo {
    fn from(r: ApiKeyRow) -> Self {
        super::types::ApiKeyInfo {
            id: r.id,
            tenant_name: r.name,
            prefix: r.key_prefix,
            created_at: r.created_at.0,
            revoked_at: t(r.revoked_at),
            scopes: crate::scopes::Scopes::from_stored(&r.scopes),
            label: r.label,
            last_used_at: t(r.last_used_at),
            test: r.test,
        }
    }
}

/// An opt-out as listed.
#[derive(sqlx::FromRow)]
pub struct OptOutRow {
    number: String,
    source: String,
    created_at: DbTime,
    added_by: Option<String>,
}

impl From<OptOutRow> for super::types::OptOut {
    fn from(r: OptOutRow) -> Self {
        super::types::OptOut {
            number: r.number,
            source: r.source,
            created_at: r.created_at.0,
            added_by: r.added_by,
        }
    }
}
