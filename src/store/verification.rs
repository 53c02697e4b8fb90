//! The records of verifications (one-time codes), shared by both backends.

use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use super::{MessageRecord, StoredResponse};
use crate::domain::verification::{self as decide, PausePolicy, VerificationStatus};
use crate::domain::{Channel, Channels, FallbackAfter};

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
    /// The channels its code goes through, in order.
    pub channels: Channels,
    /// How long each step's message has to be reported delivered before
    /// the next channel is used.
    pub fallback_after: FallbackAfter,
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
    pub channels: Channels,
    pub fallback_after: FallbackAfter,
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
            channels: v.channels.clone(),
            fallback_after: v.fallback_after.clone(),
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

    /// The keys of send `n`'s messages, step by step (a step's message
    /// exists only if the one before it does).
    pub fn step_keys(&self, n: u32) -> impl Iterator<Item = String> + '_ {
        self.channels
            .iter()
            .enumerate()
            .map(move |(step, channel)| {
                if step == 0 {
                    send_key(self.id, n)
                } else {
                    fallback_key(self.id, n, channel)
                }
            })
    }
}

/// The idempotency key of a verification's send number `n`.
pub fn send_key(id: Uuid, n: u32) -> String {
    format!("ver_{}:send:{n}", id.simple())
}

/// The idempotency key of the message of send `n` on `channel`, a step
/// after the first (when the step before did not deliver it).
pub fn fallback_key(id: Uuid, n: u32, channel: Channel) -> String {
    format!("{}:{channel}", send_key(id, n))
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
    /// The same rule over the destination's country, all its prefixes
    /// together (needs the start's country).
    pub country_pause: PausePolicy,
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

/// Which kind of operation an answer stored under a key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Check,
    Resend,
}

impl OpKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Check => "check",
            Self::Resend => "resend",
        }
    }
}

/// What a change to a verification, decided from the row as it was read,
/// came to.
#[derive(Debug)]
pub enum Changed {
    /// Written, with its answer; for a resend, the message it sends (its
    /// first attempt started and leased).
    Written(Option<Box<MessageRecord>>),
    /// The key was answered already: that answer (nothing written).
    Replay(StoredOp),
    /// The verification is no longer as it was read (another change came
    /// first): nothing written. Read it again and decide again: every
    /// change of a pending verification moves its status, its checks left
    /// or its sends, so this ends.
    Stale,
}

impl VerificationRecord {
    /// The row after a check decided `d` at `now` (unchanged for a check
    /// that changes nothing).
    pub fn checked(&self, d: decide::Check, now: OffsetDateTime) -> Self {
        let mut rec = self.clone();
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
            decide::Check::NotPending(_) => return rec,
        }
        rec.updated_at = now;
        rec
    }

    /// The row after a resend at `now`: one send more.
    pub fn resent(&self, now: OffsetDateTime) -> Self {
        let mut rec = self.clone();
        rec.sends += 1;
        rec.last_sent_at = now;
        rec.updated_at = now;
        rec
    }

    /// The row once found expired at `now`.
    pub fn expired(&self, now: OffsetDateTime) -> Self {
        let mut rec = self.clone();
        rec.status = VerificationStatus::Expired;
        rec.updated_at = now;
        rec
    }
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
