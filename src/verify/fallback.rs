//! The next channel of a verification (issue 28): when its Telegram message
//! did not deliver, the same code goes by SMS.
//!
//! Each Telegram send has a row (`store/fallbacks.rs`) written with it.
//! What to do with a row is [`next`], a pure function of the row as read,
//! tested as a table; [`Fallbacks`] reads the rows that have something to
//! do on the scheduler's beat and does it:
//!
//! - the message was reported delivered (or read): nothing more, ever;
//! - it failed (the number is not on Telegram, the send was refused),
//!   expired unsent, or was reported expired or revoked: the SMS goes now;
//! - no delivery report within `fallback_after_seconds`: the Telegram
//!   message is revoked first (best effort), then the SMS goes;
//! - the verification ended (approved, canceled, expired) first: its
//!   Telegram message is revoked (best effort) and nothing more is sent.
//!
//! The SMS is inserted under the key `ver_<id>:send:<n>:sms` in the
//! transaction that moves the row from `waiting` to `fell_back`, and only
//! while the verification is pending: however many instances look at the
//! row, and whatever crashes between the revoke and the insert, one SMS.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::{Channel, SecretSource, VerificationStatus};
use crate::clock::Clock;
use crate::delivery::Deliverer;
use crate::domain::Status;
use crate::store::{FallbackDue, FallbackState, Store, StoreError};

/// How many rows one pass reads.
const BATCH: u32 = 100;

/// What to do with a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing yet.
    Wait,
    /// Reported delivered: no next channel.
    Delivered,
    /// Send the next channel's message, revoking the Telegram one first
    /// when it may still arrive.
    FallBack { revoke: bool },
    /// Nothing more to send: the verification ended, or there is no next
    /// channel; revoke the Telegram message first when it may still arrive.
    End { revoke: bool },
}

/// What to do with `f` at `now`.
pub fn next(f: &FallbackDue, now: OffsetDateTime) -> Next {
    let open = matches!(f.state, FallbackState::Waiting | FallbackState::Delivered);
    // Revoking is for a message that may be on its way: one that failed,
    // expired unsent or was reported undelivered never will be.
    let may_arrive = f.prepared_token.is_some()
        && !matches!(
            f.message_status,
            Status::Failed | Status::Canceled | Status::Undelivered
        );
    let pending = f.verification_status == VerificationStatus::Pending && f.expires_at > now;
    if !open {
        return Next::Wait;
    }
    if !pending {
        return Next::End { revoke: may_arrive };
    }
    if f.state == FallbackState::Delivered {
        return Next::Wait;
    }
    let has_next = f.channels.after(Channel::Telegram).is_some();
    match f.message_status {
        Status::Delivered => Next::Delivered,
        Status::Failed | Status::Canceled | Status::Undelivered => {
            if has_next {
                Next::FallBack { revoke: false }
            } else {
                Next::End { revoke: false }
            }
        }
        _ if now >= f.due_at && has_next => Next::FallBack { revoke: may_arrive },
        _ => Next::Wait,
    }
}

/// The worker that does what [`next`] says.
pub struct Fallbacks {
    pub store: Arc<dyn Store>,
    pub deliverer: Arc<Deliverer>,
    pub secret: Arc<SecretSource>,
    pub clock: Clock,
    pub interval: Duration,
}

impl Fallbacks {
    /// One pass over the rows with something to do; how many moved on.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let due = self.store.due_fallbacks(now, BATCH).await?;
        let mut moved = 0;
        for f in &due {
            if self.act(f).await? {
                moved += 1;
            }
        }
        Ok(moved)
    }

    async fn act(&self, f: &FallbackDue) -> Result<bool, StoreError> {
        let now = self.clock.now();
        match next(f, now) {
            Next::Wait => Ok(false),
            Next::Delivered => {
                self.store
                    .settle_fallback(f, FallbackState::Delivered, now)
                    .await
            }
            Next::End { revoke } => {
                if revoke {
                    self.revoke(f).await;
                }
                self.store
                    .settle_fallback(f, FallbackState::Ended, self.clock.now())
                    .await
            }
            Next::FallBack { revoke } => {
                if revoke {
                    self.revoke(f).await;
                }
                self.fall_back(f).await
            }
        }
    }

    /// Revokes `f`'s Telegram message, best effort.
    async fn revoke(&self, f: &FallbackDue) {
        let (Some(token), Some(gateway)) = (
            f.prepared_token.as_deref(),
            self.deliverer
                .provider(crate::provider::telegram_gateway::NAME),
        ) else {
            return;
        };
        if !gateway.revoke(token).await {
            tracing::info!(
                verification_id = %f.verification_id,
                "the Telegram Gateway did not revoke the message (it may have been delivered)"
            );
        }
    }

    async fn fall_back(&self, f: &FallbackDue) -> Result<bool, StoreError> {
        let Some(v) = self
            .store
            .verification(f.tenant_id, f.verification_id)
            .await?
        else {
            return Ok(false);
        };
        let Some(via) = self.deliverer.first_route(&v.to, None) else {
            tracing::warn!(verification_id = %f.verification_id, "no SMS route for the fallback");
            return self
                .store
                .settle_fallback(f, FallbackState::Ended, self.clock.now())
                .await;
        };
        let keys = match self.secret.keys().await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "verify secret unavailable: fallback later");
                return Ok(false);
            }
        };
        let now = self.clock.now();
        let deadline = self.deliverer.settings().retry.deadline;
        let Some(m) = super::fallback_message(&keys, &v, f.send_number, &via, deadline, now) else {
            tracing::error!(verification_id = %f.verification_id, "the code does not open: no fallback");
            return self
                .store
                .settle_fallback(f, FallbackState::Ended, now)
                .await;
        };
        let lease = self.deliverer.new_lease();
        match self.store.fall_back(f, &m, &lease, now).await? {
            Some(message) => {
                self.deliverer
                    .metrics()
                    .verify_event("fallback", v.country.as_deref());
                self.deliverer.spawn(message, lease);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub async fn run(self, stop: CancellationToken) {
        loop {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "verification fallback pass failed");
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::domain::MessageId;
    use crate::verify::Channels;

    fn at(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_700_000_000 + s).expect("time")
    }

    fn row(
        state: FallbackState,
        message_status: Status,
        token: bool,
        verification: VerificationStatus,
        channels: &str,
    ) -> FallbackDue {
        FallbackDue {
            verification_id: Uuid::nil(),
            send_number: 1,
            tenant_id: Uuid::nil(),
            message_id: MessageId(Uuid::nil()),
            due_at: at(60),
            state,
            message_status,
            prepared_token: token.then(|| "r1".to_string()),
            verification_status: verification,
            expires_at: at(600),
            channels: Channels::parse_stored(channels).expect("channels"),
        }
    }

    #[test]
    fn what_a_row_leads_to_as_a_table() {
        use FallbackState::*;
        use VerificationStatus as V;
        let both = "telegram,sms";
        // (state, message, has a request id, verification, channels, now, next)
        #[rustfmt::skip]
        let rows = [
            (Waiting, Status::Processing, false, V::Pending, both, 10, Next::Wait),
            (Waiting, Status::Sent, true, V::Pending, both, 10, Next::Wait),
            (Waiting, Status::Delivered, true, V::Pending, both, 10, Next::Delivered),
            // Not on Telegram, refused: nothing was sent, the SMS goes now.
            (Waiting, Status::Failed, false, V::Pending, both, 10, Next::FallBack { revoke: false }),
            (Waiting, Status::Failed, true, V::Pending, both, 10, Next::FallBack { revoke: false }),
            // Reported expired or revoked.
            (Waiting, Status::Undelivered, true, V::Pending, both, 10, Next::FallBack { revoke: false }),
            // No delivery report in time: revoke, then the SMS.
            (Waiting, Status::Sent, true, V::Pending, both, 59, Next::Wait),
            (Waiting, Status::Sent, true, V::Pending, both, 60, Next::FallBack { revoke: true }),
            (Waiting, Status::Unknown, true, V::Pending, both, 61, Next::FallBack { revoke: true }),
            (Waiting, Status::Processing, false, V::Pending, both, 61, Next::FallBack { revoke: false }),
            // Telegram alone: no next channel.
            (Waiting, Status::Sent, true, V::Pending, "telegram", 61, Next::Wait),
            (Waiting, Status::Failed, false, V::Pending, "telegram", 10, Next::End { revoke: false }),
            // The verification ended: revoke what may still arrive.
            (Waiting, Status::Sent, true, V::Approved, both, 10, Next::End { revoke: true }),
            (Waiting, Status::Sent, true, V::Pending, both, 600, Next::End { revoke: true }),
            (Delivered, Status::Delivered, true, V::Canceled, both, 10, Next::End { revoke: true }),
            (Delivered, Status::Delivered, true, V::Pending, both, 100, Next::Wait),
            (Waiting, Status::Undelivered, true, V::Expired, both, 10, Next::End { revoke: false }),
            // Settled rows never move again.
            (FellBack, Status::Sent, true, V::Approved, both, 10, Next::Wait),
            (Ended, Status::Sent, true, V::Approved, both, 10, Next::Wait),
        ];
        for (state, status, token, v, channels, now, want) in rows {
            let f = row(state, status, token, v, channels);
            assert_eq!(
                next(&f, at(now)),
                want,
                "{state:?} {status:?} {token} {v:?} {channels} {now}"
            );
        }
    }
}
