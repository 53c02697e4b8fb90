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
//!   Telegram message is revoked (best effort) and nothing more is sent;
//! - either way, a Telegram message still without a request id (its
//!   `checkSendAbility` being retried) was never sent and is canceled in
//!   the same transaction, so that it never goes after the SMS or the end.
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
use crate::store::{FallbackDue, FallbackState, Store, StoreError, Unsent};

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
    /// when it may still arrive, or canceling it when it was never sent
    /// and could still be.
    FallBack { revoke: bool, cancel: bool },
    /// Nothing more to send: the verification ended, or there is no next
    /// channel; revoke the Telegram message first when it may still
    /// arrive, or cancel it when it was never sent and could still be.
    End { revoke: bool, cancel: bool },
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
    // Never sent, and it could still be: no request id yet (the send
    // starts only once it is written) and not final.
    let cancel = f.prepared_token.is_none() && f.message_status == Status::Processing;
    let pending = f.verification_status == VerificationStatus::Pending && f.expires_at > now;
    if !open {
        return Next::Wait;
    }
    if !pending {
        return Next::End {
            revoke: may_arrive,
            cancel,
        };
    }
    if f.state == FallbackState::Delivered {
        return Next::Wait;
    }
    let has_next = f.channels.after(Channel::Telegram).is_some();
    match f.message_status {
        Status::Delivered => Next::Delivered,
        Status::Failed | Status::Canceled | Status::Undelivered => {
            if has_next {
                Next::FallBack {
                    revoke: false,
                    cancel: false,
                }
            } else {
                Next::End {
                    revoke: false,
                    cancel: false,
                }
            }
        }
        _ if now >= f.due_at && has_next => Next::FallBack {
            revoke: may_arrive,
            cancel,
        },
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
                    .settle_fallback(f, FallbackState::Delivered, now, None)
                    .await
            }
            Next::End { revoke, cancel } => {
                if revoke {
                    self.revoke(f).await;
                }
                let Some(unsent) = self.unsent(f, cancel).await? else {
                    return Ok(false);
                };
                let settled = self
                    .store
                    .settle_fallback(f, FallbackState::Ended, self.clock.now(), unsent.as_ref())
                    .await?;
                if settled {
                    self.count_canceled(unsent.as_ref());
                }
                Ok(settled)
            }
            Next::FallBack { revoke, cancel } => {
                if revoke {
                    self.revoke(f).await;
                }
                self.fall_back(f, cancel).await
            }
        }
    }

    /// Counts a Telegram message canceled unsent (the Gateway is live
    /// only: a test key's codes go to test mode's provider).
    fn count_canceled(&self, unsent: Option<&Unsent>) {
        if unsent.is_some() {
            self.deliverer
                .metrics()
                .message_final(Status::Canceled.as_str(), "live");
        }
    }

    /// What canceling `f`'s unsent Telegram message takes, when `cancel`
    /// asks for it: `Some(None)` nothing to cancel, `None` the message is
    /// gone (nothing to do now).
    async fn unsent(
        &self,
        f: &FallbackDue,
        cancel: bool,
    ) -> Result<Option<Option<Unsent>>, StoreError> {
        if !cancel {
            return Ok(Some(None));
        }
        let Some(m) = self.store.message_by_id(f.message_id).await? else {
            return Ok(None);
        };
        Ok(Some(Some(Unsent {
            attempts: m.attempts,
            response: m.canceled_response(self.clock.now()),
        })))
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

    async fn fall_back(&self, f: &FallbackDue, cancel: bool) -> Result<bool, StoreError> {
        let Some(v) = self
            .store
            .verification(f.tenant_id, f.verification_id)
            .await?
        else {
            return Ok(false);
        };
        let Some(via) = self.deliverer.first_route(&v.to, None) else {
            // No SMS to fall back to: the Telegram message, even one still
            // being checked, is the only way the code can go.
            tracing::warn!(verification_id = %f.verification_id, "no SMS route for the fallback");
            return self
                .store
                .settle_fallback(f, FallbackState::Ended, self.clock.now(), None)
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
                .settle_fallback(f, FallbackState::Ended, now, None)
                .await;
        };
        let Some(unsent) = self.unsent(f, cancel).await? else {
            return Ok(false);
        };
        let lease = self.deliverer.new_lease();
        match self
            .store
            .fall_back(f, &m, &lease, now, unsent.as_ref())
            .await?
        {
            Some(message) => {
                self.count_canceled(unsent.as_ref());
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
        crate::shutdown::every(self.interval, stop, "verification fallback pass", || {
            self.run_once()
        })
        .await;
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
        const SMS: Next = Next::FallBack {
            revoke: false,
            cancel: false,
        };
        const REVOKE_SMS: Next = Next::FallBack {
            revoke: true,
            cancel: false,
        };
        const CANCEL_SMS: Next = Next::FallBack {
            revoke: false,
            cancel: true,
        };
        const END: Next = Next::End {
            revoke: false,
            cancel: false,
        };
        const REVOKE_END: Next = Next::End {
            revoke: true,
            cancel: false,
        };
        const CANCEL_END: Next = Next::End {
            revoke: false,
            cancel: true,
        };
        // (state, message, has a request id, verification, channels, now, next)
        #[rustfmt::skip]
        let rows = [
            (Waiting, Status::Processing, false, V::Pending, both, 10, Next::Wait),
            (Waiting, Status::Sent, true, V::Pending, both, 10, Next::Wait),
            (Waiting, Status::Delivered, true, V::Pending, both, 10, Next::Delivered),
            // Not on Telegram, refused: nothing was sent, the SMS goes now.
            (Waiting, Status::Failed, false, V::Pending, both, 10, SMS),
            (Waiting, Status::Failed, true, V::Pending, both, 10, SMS),
            // Reported expired or revoked.
            (Waiting, Status::Undelivered, true, V::Pending, both, 10, SMS),
            // No delivery report in time: revoke, then the SMS.
            (Waiting, Status::Sent, true, V::Pending, both, 59, Next::Wait),
            (Waiting, Status::Sent, true, V::Pending, both, 60, REVOKE_SMS),
            (Waiting, Status::Unknown, true, V::Pending, both, 61, REVOKE_SMS),
            // Being retried with its request id: the retry cannot make a
            // second message, the revoke withdraws the first.
            (Waiting, Status::Processing, true, V::Pending, both, 61, REVOKE_SMS),
            // Still checking (no request id): never sent, canceled with the
            // SMS's insert, so that it cannot go after it.
            (Waiting, Status::Processing, false, V::Pending, both, 61, CANCEL_SMS),
            // Telegram alone: no next channel.
            (Waiting, Status::Sent, true, V::Pending, "telegram", 61, Next::Wait),
            (Waiting, Status::Failed, false, V::Pending, "telegram", 10, END),
            // The verification ended: revoke what may still arrive, cancel
            // what was never sent.
            (Waiting, Status::Sent, true, V::Approved, both, 10, REVOKE_END),
            (Waiting, Status::Sent, true, V::Pending, both, 600, REVOKE_END),
            (Delivered, Status::Delivered, true, V::Canceled, both, 10, REVOKE_END),
            (Delivered, Status::Delivered, true, V::Pending, both, 100, Next::Wait),
            (Waiting, Status::Undelivered, true, V::Expired, both, 10, END),
            (Waiting, Status::Processing, false, V::Approved, both, 10, CANCEL_END),
            (Waiting, Status::Processing, false, V::Pending, "telegram", 600, CANCEL_END),
            // Settled rows never move again.
            (FellBack, Status::Sent, true, V::Approved, both, 10, Next::Wait),
            (Ended, Status::Sent, true, V::Approved, both, 10, Next::Wait),
            (FellBack, Status::Processing, false, V::Pending, both, 61, Next::Wait),
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
