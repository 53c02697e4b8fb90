//! The records of verifications (one-time codes), shared by both backends.

use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use super::{MessageRecord, NewMessage, StoredResponse};
use crate::verify::decide::{self, PausePolicy, VerificationStatus};

/// A verification to insert, with its first send.
#[derive(Clone, Debug)]
pub struct NewVerification {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub idempotency_key: String,
    pub fingerprint: Vec<u8>,
    pub to: String,
    pub country: Option<String>,
    pub prefix: String,
    pub code_length: u32,
    pub code_mac: Vec<u8>,
    pub code_sealed: Vec<u8>,
    pub template: Option<String>,
    pub checks_remaining: u32,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
}

/// A verification row.
#[derive(Clone, Debug)]
pub struct VerificationRecord {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub idempotency_key: String,
    pub fingerprint: Vec<u8>,
    pub status: VerificationStatus,
    pub to: String,
    pub country: Option<String>,
    pub prefix: String,
    pub code_length: u32,
    pub code_mac: Vec<u8>,
    pub code_sealed: Vec<u8>,
    pub template: Option<String>,
    pub sends: u32,
    pub checks_remaining: u32,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
    pub last_sent_at: OffsetDateTime,
    pub approved_at: Option<OffsetDateTime>,
    pub updated_at: OffsetDateTime,
}

impl VerificationRecord {
    /// The row `start_verification` just inserted.
    pub fn started(v: &NewVerification) -> Self {
        Self {
            id: v.id,
            tenant_id: v.tenant_id,
            idempotency_key: v.idempotency_key.clone(),
            fingerprint: v.fingerprint.clone(),
            status: VerificationStatus::Pending,
            to: v.to.clone(),
            country: v.country.clone(),
            prefix: v.prefix.clone(),
            code_length: v.code_length,
            code_mac: v.code_mac.clone(),
            code_sealed: v.code_sealed.clone(),
            template: v.template.clone(),
            sends: 1,
            checks_remaining: v.checks_remaining,
            created_at: v.created_at,
            expires_at: v.expires_at,
            last_sent_at: v.created_at,
            approved_at: None,
            updated_at: v.created_at,
        }
    }

    /// What the decisions read.
    pub fn state(&self) -> decide::State {
        decide::State {
            status: self.status,
            expires_at: self.expires_at,
            checks_remaining: self.checks_remaining,
            sends: self.sends,
            last_sent_at: self.last_sent_at,
        }
    }

    /// The idempotency key of send number `n` (from 1).
    pub fn send_key(&self, n: u32) -> String {
        send_key(self.id, n)
    }
}

/// The idempotency key of a verification's send number `n`.
pub fn send_key(id: Uuid, n: u32) -> String {
    format!("ver_{}:send:{n}", id.simple())
}

/// The abuse rules a start is held to, all read and written in the start's
/// transaction (so they hold across instances).
#[derive(Clone, Copy, Debug)]
pub struct StartPolicy {
    /// Starts per destination number per hour (0: no limit).
    pub number_per_hour: u32,
    /// Starts per destination prefix per hour (0: no limit).
    pub prefix_per_hour: u32,
    pub pause: PausePolicy,
    /// The approval rate is judged over starts this recent.
    pub pause_window: Duration,
    /// How long an automatic pause lasts.
    pub pause_for: Duration,
    /// A limit this instance's own buckets already refused the send by
    /// (the per-number and per-prefix rates every send counts against): a
    /// new start is refused with it, a replay still answered.
    pub refused_here: Option<crate::ratelimit::Refused>,
}

/// What a start did.
#[derive(Debug)]
pub enum StartOutcome {
    /// The key was free: the verification and its first message (leased).
    Created {
        verification: Box<VerificationRecord>,
        message: Box<MessageRecord>,
    },
    /// The key is taken: the existing verification.
    Existing(Box<VerificationRecord>),
    /// A per-hour limit refused it; nothing was stored.
    Limited {
        limit: &'static str,
        retry_after: Duration,
    },
    /// The destination prefix is paused; `newly`: this start paused it.
    Paused { until: OffsetDateTime, newly: bool },
}

/// An idempotent check or resend: its key and the fingerprint of its body.
#[derive(Clone, Copy, Debug)]
pub struct OpKey<'a> {
    pub key: &'a str,
    pub fingerprint: &'a [u8],
}

/// A stored answer of an earlier check or resend with the same key.
#[derive(Clone, Debug)]
pub struct StoredOp {
    pub fingerprint: Vec<u8>,
    pub response: StoredResponse,
}

/// What a check did.
#[derive(Debug)]
pub enum CheckOutcome {
    NotFound,
    Replay(StoredOp),
    Done {
        verification: Box<VerificationRecord>,
        decision: decide::Check,
        /// The answer, for a check that is answered 200.
        response: Option<StoredResponse>,
    },
}

/// What a resend did.
#[derive(Debug)]
pub enum ResendOutcome {
    NotFound,
    Replay(StoredOp),
    /// Refused (or expired); nothing but an expiry was written.
    Refused {
        verification: Box<VerificationRecord>,
        decision: decide::Resend,
    },
    Sent {
        verification: Box<VerificationRecord>,
        message: Box<MessageRecord>,
        response: StoredResponse,
    },
}

// The decisions a check or a resend makes inside its transaction are the
// caller's (the code's HMAC, the answer's JSON), handed in as shared
// closures: `'static`, so that the SQLite store can run them inside a job of
// its single writer.

/// Decides whether a check's code is right, in constant time.
pub type CodeMatcher = std::sync::Arc<dyn Fn(&VerificationRecord) -> bool + Send + Sync>;
/// Builds the answer of a check (`valid`) from the verification after it.
pub type CheckRenderer = std::sync::Arc<dyn Fn(&VerificationRecord, bool) -> Vec<u8> + Send + Sync>;
/// Builds the message of the next send; `None` when the code cannot be
/// opened (the secret changed).
pub type SendBuilder =
    std::sync::Arc<dyn Fn(&VerificationRecord) -> Option<NewMessage> + Send + Sync>;
/// Builds the answer of a resend from the verification and its new message.
pub type ResendRenderer =
    std::sync::Arc<dyn Fn(&VerificationRecord, &MessageRecord) -> Vec<u8> + Send + Sync>;

/// The columns of a verification row, in [`VerificationRow`]'s order.
macro_rules! verification_columns {
    () => {
        "id, tenant_id, idempotency_key, fingerprint, status, to_number, country, prefix, \
         code_length, code_mac, code_sealed, template, sends, checks_remaining, created_at, \
         expires_at, last_sent_at, approved_at, updated_at"
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
    created_at: super::time::DbTime,
    expires_at: super::time::DbTime,
    last_sent_at: super::time::DbTime,
    approved_at: Option<super::time::DbTime>,
    updated_at: super::time::DbTime,
}

impl TryFrom<VerificationRow> for VerificationRecord {
    type Error = super::StoreError;

    fn try_from(r: VerificationRow) -> Result<Self, Self::Error> {
        let count =
            |n: i32| u32::try_from(n).map_err(|_| super::StoreError::Invariant("a negative count"));
        Ok(Self {
            id: r.id,
            tenant_id: r.tenant_id,
            idempotency_key: r.idempotency_key,
            fingerprint: r.fingerprint,
            status: VerificationStatus::parse(&r.status).ok_or(super::StoreError::Invariant(
                "an unknown verification status",
            ))?,
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
        })
    }
}

/// Applies a check's decision to the record (the store writes the result).
pub(crate) fn apply_check(rec: &mut VerificationRecord, d: decide::Check, now: OffsetDateTime) {
    match d {
        decide::Check::Approve => {
            rec.status = VerificationStatus::Approved;
            rec.approved_at = Some(now);
        }
        decide::Check::Wrong { remaining } => rec.checks_remaining = remaining,
        decide::Check::LastWrong => {
            rec.checks_remaining = 0;
            rec.status = VerificationStatus::MaxAttemptsReached;
        }
        decide::Check::Expire => rec.status = VerificationStatus::Expired,
        decide::Check::NotPending(_) => return,
    }
    rec.updated_at = now;
}

/// The per-hour limit a start reaches, if any: `(count, oldest)` of the
/// destination number's and prefix's starts in the last hour.
pub(crate) fn start_limit(
    policy: &StartPolicy,
    number: (i64, Option<OffsetDateTime>),
    prefix: (i64, Option<OffsetDateTime>),
    now: OffsetDateTime,
) -> Option<StartOutcome> {
    if let Some(r) = &policy.refused_here {
        return Some(StartOutcome::Limited {
            limit: r.limit,
            retry_after: r.retry_after,
        });
    }
    let hour = time::Duration::HOUR;
    for (cap, (count, oldest), limit) in [
        (
            policy.number_per_hour,
            number,
            "verifications per destination number",
        ),
        (
            policy.prefix_per_hour,
            prefix,
            "verifications per destination prefix",
        ),
    ] {
        if cap > 0 && count >= i64::from(cap) {
            let free_at = oldest.map_or(now, |t| t + hour);
            return Some(StartOutcome::Limited {
                limit,
                retry_after: Duration::try_from(free_at - now).unwrap_or(Duration::from_secs(1)),
            });
        }
    }
    None
}

/// The start of the window an approval rate is judged over: the policy's
/// window, but never before the end of the prefix's last pause (the starts
/// that caused it do not pause it again).
pub(crate) fn pause_window_start(
    policy: &StartPolicy,
    last_pause_until: Option<OffsetDateTime>,
    now: OffsetDateTime,
) -> OffsetDateTime {
    let start = now - policy.pause_window;
    last_pause_until.map_or(start, |t| t.max(start))
}
