//! A verification's next channel (issue 28): one row per Telegram send,
//! written in the transaction of the start or resend that makes the send
//! (`shared/verifications.rs`), and moved on only by conditional writes
//! (`shared/fallbacks.rs`), so that the next channel's message is inserted
//! once however many instances look at the row. What to do with a row is
//! decided by [`crate::verify::fallback::next`] from the row as read.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Lease, MessageRecord, NewMessage, StoreError, VerificationRecord};
use crate::domain::stop::Stop;
use crate::domain::verification::VerificationStatus;
use crate::domain::{MessageId, Status};

/// Where a send's next channel stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackState {
    /// Not decided yet.
    Waiting,
    /// The Telegram message was reported delivered: no next channel.
    Delivered,
    /// The next channel's message was inserted.
    FellBack,
    /// The verification ended first (its Telegram message was revoked).
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

/// The row a Telegram send starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewFallback {
    pub verification_id: Uuid,
    pub send_number: u32,
    pub tenant_id: Uuid,
    pub message_id: MessageId,
    /// When the next channel goes unless the message was reported
    /// delivered first.
    pub due_at: OffsetDateTime,
}

/// The row send `n` of `v` needs with its message `m`: one when `m` goes
/// through the Telegram Gateway. Without a next channel it is due when the
/// verification expires (then only its revoke is left to do).
pub fn fallback_of(v: &VerificationRecord, n: u32, m: &NewMessage) -> Option<NewFallback> {
    if m.provider != crate::provider::telegram_gateway::NAME {
        return None;
    }
    let due_at = match v.channels.after(crate::verify::Channel::Telegram) {
        Some(_) => (m.created_at + time::Duration::seconds(i64::from(v.fallback_after_seconds)))
            .min(v.expires_at),
        None => v.expires_at,
    };
    Some(NewFallback {
        verification_id: v.id,
        send_number: n,
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
    pub tenant_id: Uuid,
    pub message_id: MessageId,
    pub due_at: OffsetDateTime,
    pub state: FallbackState,
    /// The Telegram message's status.
    pub message_status: Status,
    /// Its attempts started: with the status, what the move checks the
    /// message is still as read (an attempt since, or a report, and the
    /// pass's revoke and question were about an older message).
    pub message_attempts: u32,
    /// Whether an instance holds it (a call may be in flight).
    pub message_leased: bool,
    /// The provider it is on (the one to revoke it through, or to ask).
    pub provider: String,
    /// Its Gateway request id, once it has one.
    pub prepared_token: Option<String>,
    pub verification_status: VerificationStatus,
    pub expires_at: OffsetDateTime,
    /// The verification's channels.
    pub channels: crate::verify::Channels,
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
    /// fell_back, and the next channel's message `m` inserted leased by
    /// `lease`.
    async fn fall_back(
        &self,
        f: &FallbackDue,
        m: &NewMessage,
        lease: &Lease,
        now: OffsetDateTime,
    ) -> Result<FellBack, StoreError>;
}
