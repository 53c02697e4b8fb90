//! The verification rows: a `verifications` row, and a stored answer of a
//! check or resend (`verification_ops`).

use uuid::Uuid;

use crate::domain::verification::VerificationStatus;
use crate::store::time::DbTime;
use crate::store::{StoreError, StoredOp, StoredResponse, VerificationRecord};

/// The columns of a verification row, in [`VerificationRow`]'s order.
macro_rules! verification_columns {
    () => {
        "id, tenant_id, idempotency_key, fingerprint, status, to_number, country, prefix, \
         code_length, code_mac, code_sealed, template, sends, checks_remaining, created_at, \
         expires_at, last_sent_at, approved_at, updated_at, channels, fallback_after_seconds, \
         fallback_after_list"
    };
}
pub(crate) use verification_columns;

/// A verification row as read (both backends).
#[derive(sqlx::FromRow)]
pub(crate) struct VerificationRow {
    id: Uuid,
    tenant_id: Uuid,
    idempotency_key: String,
    fingerprint: Vec<u8>,
    status: String,
    to_number: String,
    country: Option<String>,
    prefix: String,
    code_length: i32,
    code_mac: Vec<u8>,
    code_sealed: Vec<u8>,
    template: Option<String>,
    sends: i32,
    checks_remaining: i32,
    created_at: DbTime,
    expires_at: DbTime,
    last_sent_at: DbTime,
    approved_at: Option<DbTime>,
    updated_at: DbTime,
    channels: String,
    fallback_after_seconds: i32,
    fallback_after_list: Option<String>,
}

impl TryFrom<VerificationRow> for VerificationRecord {
    type Error = StoreError;

    fn try_from(r: VerificationRow) -> Result<Self, Self::Error> {
        let count =
            |n: i32| u32::try_from(n).map_err(|_| StoreError::Invariant("a negative count"));
        Ok(Self {
            id: r.id,
            tenant_id: r.tenant_id,
            idempotency_key: r.idempotency_key,
            fingerprint: r.fingerprint,
            status: VerificationStatus::parse(&r.status)
                .ok_or(StoreError::Invariant("an unknown verification status"))?,
            to: r.to_number,
            country: r.country,
            prefix: r.prefix,
            code_length: count(r.code_length)?,
            code_mac: r.code_mac,
            code_sealed: r.code_sealed,
            template: r.template,
            sends: count(r.sends)?,
            checks_remaining: count(r.checks_remaining)?,
            created_at: r.created_at.0,
            expires_at: r.expires_at.0,
            last_sent_at: r.last_sent_at.0,
            approved_at: r.approved_at.map(|t| t.0),
            updated_at: r.updated_at.0,
            channels: crate::domain::Channels::parse_stored(
                &r.channels,
                &crate::provider::registry::verify_channels(),
            )
            .ok_or(StoreError::Invariant("an unknown verification channel"))?,
            fallback_after: crate::domain::FallbackAfter::from_stored(
                count(r.fallback_after_seconds)?,
                r.fallback_after_list.as_deref(),
            )
            .ok_or(StoreError::Invariant("a broken fallback_after_list"))?,
        })
    }
}

/// A `verification_ops` row: the fingerprint and answer of a check or a
/// resend under its key.
#[derive(sqlx::FromRow)]
pub(crate) struct OpRow {
    fingerprint: Vec<u8>,
    response_code: i16,
    response_body: Vec<u8>,
}

impl From<OpRow> for StoredOp {
    fn from(r: OpRow) -> Self {
        StoredOp {
            fingerprint: r.fingerprint,
            response: StoredResponse {
                status_code: u16::try_from(r.response_code).unwrap_or(200),
                body: r.response_body,
            },
        }
    }
}
