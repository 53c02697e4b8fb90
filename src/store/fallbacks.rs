//! A verification's next channel (issues 28, 40): one row per step's
//! message of a verification with more than the default channel, written
//! in the transaction that inserts the message (the start or resend of its
//! first step, `shared/verifications.rs`; the move to a later step,
//! `shared/fallbacks.rs`), and moved on only by conditional writes, so that
//! the next step's message is inserted once however many instances look at
//! the row. What to do with a row is decided by
//! [`crate::delivery::fallback::next`] from the row as read.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Lease, MessageRecord, NewMessage, StoreError, VerificationRecord};
use crate::domain::stop::Stop;
use crate::domain::verification::VerificationStatus;
use crate::domain::{Channels, FallbackAfter, MessageId, Status};

/// Where a send's next channel stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackState {
    /// Not decided yet.
    Waiting,
    /// The step's message was reported delivered: no next channel.
    Delivered,
    /// The next channel's message was inserted.
    FellBack,
    /// The verification ended first (its message was revoked where its
    /// channel can).
    Ended,
}

impl FallbackState {
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackState::Waiting => "waiting",
            FallbackState::Delivered => "delivered",
            FallbackState::FellBack => "fell_back",
            FallbackState::Ended => "ended",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "waiting" => FallbackState::Waiting,
            "delivered" => FallbackState::Delivered,
            "fell_back" => FallbackState::FellBack,
            "ended" => FallbackState::Ended,
            _ => return None,
        })
    }
}

/// The row a step's message starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewFallback {
    pub verification_id: Uuid,
    pub send_number: u32,
    /// The step (0: the first channel).
    pub step: u32,
    pub tenant_id: Uuid,
    pub message_id: MessageId,
    /// When the next channel goes unless the message was reported
    /// delivered first.
    pub due_at: OffsetDateTime,
}

/// The row step `step` of send `n` of `v` needs with its message `m`: one
/// unless `v` has the default channel alone (nothing to move on to, nothing
/// to revoke). Due when the step's time to report delivery is up, or, on
/// the last step, when the verification expires (then only its revoke is
/// left to do).
pub fn fallback_of(
    v: &VerificationRecord,
    n: u32,
    step: u32,
    m: &NewMessage,
) -> Option<NewFallback> {
    step_row(
        &Steps {
            verification_id: v.id,
            tenant_id: v.tenant_id,
            channels: &v.channels,
            after: &v.fallback_after,
            expires_at: v.expires_at,
        },
        n,
        step,
        m,
    )
}

/// What a step's row is made of, from the verification.
pub struct Steps<'a> {
    pub verification_id: Uuid,
    pub tenant_id: Uuid,
    pub channels: &'a Channels,
    pub after: &'a FallbackAfter,
    pub expires_at: OffsetDateTime,
}

/// [`fallback_of`], from the verification's parts.
pub fn step_row(v: &Steps<'_>, n: u32, step: u32, m: &NewMessage) -> Option<NewFallback> {
    if v.channels.is_default() {
        return None;
    }
    let due_at = match v.channels.at(step + 1) {
        Some(_) => (m.created_at + time::Duration::seconds(i64::from(v.after.for_step(step))))
            .min(v.expires_at),
        None => v.expires_at,
    };
    Some(NewFallback {
        verification_id: v.verification_id,
        send_number: n,
        step,
        tenant_id: v.tenant_id,
        message_id: m.id,
        due_at,
    })
}

/// A row with something to do, as read with its message and verification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallbackDue {
    pub verification_id: Uuid,
    pub send_number: u32,
    /// The step whose message this is (0: the first channel).
    pub step: u32,
    pub tenant_id: Uuid,
    pub message_id: MessageId,
    pub due_at: OffsetDateTime,
    pub state: FallbackState,
    /// The step's message's status.
    pub message_status: Status,
    /// Its attempts started: with the status, what the move checks the
    /// message is still as read (an attempt since, or a report, and the
    /// pass's revoke and question were about an older message).
    pub message_attempts: u32,
    /// Whether an instance holds it (a call may be in flight).
    pub message_leased: bool,
    /// The provider it is on (the one to revoke it through, or to ask).
    pub provider: String,
    /// What its provider handed out for it before the send (the Gateway's
    /// request id), once it has one.
    pub prepared_token: Option<String>,
    pub verification_status: VerificationStatus,
    pub expires_at: OffsetDateTime,
    /// The verification's channels.
    pub channels: Channels,
    /// How long each of its steps waits for a report.
    pub fallback_after: FallbackAfter,
    /// A receipt reported the message delivered (or read), whatever its
    /// status shows (a send that ended `unknown` keeps it).
    pub reported_delivered: bool,
}

/// What a fallback's transaction came to.
#[derive(Debug)]
pub enum FellBack {
    /// The next channel's message, inserted and leased; the message moved
    /// on from was stopped as the stop says (`domain::stop`).
    Moved(Box<MessageRecord>, Stop),
    /// The message moved on from was reported delivered: the row is
    /// settled `delivered`, nothing more goes.
    Delivered,
    /// Not now: the row or the verification moved on first, or the message
    /// is held by a lease (a call may be in flight). Nothing written.
    NotNow,
}

#[async_trait]
pub trait FallbackStore: Send + Sync {
    /// Writes `token` as message `id`'s prepared token unless it has one,
    /// fenced on `lease` (and renewing it): the token the message holds
    /// now, `None` when the lease is no longer ours.
    async fn prepare_send(
        &self,
        id: MessageId,
        lease: &Lease,
        token: &str,
    ) -> Result<Option<String>, StoreError>;
    /// Renews message `id`'s lease, fenced on `lease`, right before a
    /// provider call of a message that carries a verification's code:
    /// `None` when the lease is no longer ours, `Some(false)` when the
    /// message was stopped (its validity ended at or before `now`: the
    /// verification moved on or ended), `Some(true)` when the call may go.
    async fn guard_send(
        &self,
        id: MessageId,
        lease: &Lease,
        now: OffsetDateTime,
    ) -> Result<Option<bool>, StoreError>;
    /// Up to `batch` rows with something to do at `now`: waiting ones past
    /// their due time or whose message failed or was reported, and open
    /// ones whose verification ended.
    async fn due_fallbacks(
        &self,
        now: OffsetDateTime,
        batch: u32,
    ) -> Result<Vec<FallbackDue>, StoreError>;
    /// Moves `f` to `to` if it is still as read; false if it moved on.
    async fn settle_fallback(
        &self,
        f: &FallbackDue,
        to: FallbackState,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Falls back, in one transaction: `f`'s verification still pending at
    /// `now` (locked), its message read fresh (locked) and stopped as
    /// `domain::stop::for_next_channel` says, `f` from waiting to
    /// fell_back, and the next step's message `m` inserted leased by
    /// `lease` with its own row ([`step_row`]).
    async fn fall_back(
        &self,
        f: &FallbackDue,
        m: &NewMessage,
        lease: &Lease,
        now: OffsetDateTime,
    ) -> Result<FellBack, StoreError>;
}
