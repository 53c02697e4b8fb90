//! The next channel of a verification (issues 28, 40): when a step's
//! message did not deliver, the same code goes on the next of the
//! verification's channels, one channel at a time (issue 39), in whatever
//! order the verification names them.
//!
//! Each step's message has a row (`store/fallbacks.rs`) written with it.
//! What to do with a row is [`next`], a pure function of the row as read,
//! tested as a table; [`Fallbacks`] reads the rows that have something to
//! do on the scheduler's beat and does it:
//!
//! - the message was reported delivered (or read): nothing more, ever;
//! - it failed (the number is not on the channel, the send was refused),
//!   expired unsent, or was reported expired or revoked: the next step
//!   goes now;
//! - no delivery report within the step's `fallback_after_seconds`: the
//!   message is revoked where its channel can (best effort), then its
//!   provider is asked what became of it where it documents a lookup (a
//!   report may have been lost, refused or never asked for), and a
//!   delivery it shows stops the rest (revoking first closes the gap in
//!   which a delivery after the answer would go unseen); otherwise the
//!   next step goes;
//! - the verification ended (approved, canceled, expired) first: its
//!   message is revoked (best effort) and nothing more is sent.
//!
//! The decision to send the next step is not taken on the row as read
//! before the revoke: the next message is inserted under the key
//! `ver_<id>:send:<n>:<channel>` in the transaction that moves the row from
//! `waiting` to `fell_back`, which first locks the verification pending and
//! reads the step's message fresh, locked, and stops it as
//! `domain::stop::for_next_channel` says: a report of delivery that came
//! meanwhile ends the row `delivered` with nothing more; a message held by
//! a lease (a call may be in flight) puts the move off to a later pass; a
//! message waiting for a retry is canceled, one only ever looked up again
//! is expired (no provider call starts after it). However many instances
//! look at the row, and whatever crashes between the revoke and the insert,
//! one message per step, and no send of an earlier step after it. The end
//! of a verification stops its unsent messages in its own transaction
//! (`shared/fallbacks.rs`, `Driver::stop_unsent`).

use std::sync::Arc;

use futures_util::StreamExt;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::Deliverer;
use crate::clock::Clock;
use crate::domain::Status;
use crate::domain::stop::Stop;
use crate::provider::receipts::ReceiptSink;
use crate::store::{FallbackDue, FallbackState, FellBack, Store, StoreError};
use crate::verify::{SecretSource, VerificationStatus};

/// How many rows one pass reads.
const BATCH: u32 = 100;

/// How many of them it acts on at once.
const CONCURRENT: usize = 16;

/// What to do with a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing yet.
    Wait,
    /// Reported delivered: no next channel.
    Delivered,
    /// Another step of the send was reported delivered (or this message,
    /// where its status cannot show it): no next channel, and this
    /// message, if it has not gone out, never goes; revoked first when it
    /// may still arrive (one channel at a time).
    DeliveredElsewhere { revoke: bool },
    /// Send the next step's message: first revoke the step's message when
    /// it may still arrive (`revoke`), then ask the provider what became of
    /// it when it went out and was not reported (`ask`).
    FallBack { ask: bool, revoke: bool },
    /// Nothing more to send: the verification ended, or there is no next
    /// channel; revoke the step's message first when it may still arrive.
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
        // A call in flight ends first, so that the revoke comes after it
        // (the end stopped the message: no call starts any more).
        if f.message_leased {
            return Next::Wait;
        }
        return Next::End { revoke: may_arrive };
    }
    if f.state == FallbackState::Delivered {
        return Next::Wait;
    }
    let has_next = f.channels.at(f.step + 1).is_some();
    // Reported delivered on some step of the send, whatever the status can
    // show (a send that ended `unknown` keeps its status when the report
    // comes later; a report of an earlier step can come after the move).
    if f.reported_delivered && f.message_status != Status::Delivered {
        return Next::DeliveredElsewhere { revoke: may_arrive };
    }
    match f.message_status {
        Status::Delivered => Next::Delivered,
        Status::Failed | Status::Canceled | Status::Undelivered => {
            if has_next {
                Next::FallBack {
                    ask: false,
                    revoke: false,
                }
            } else {
                Next::End { revoke: false }
            }
        }
        // A call may be in flight: the move waits for it.
        _ if f.message_leased => Next::Wait,
        // Whatever may have gone out (sent, unknown, or still looked up
        // after an ambiguous answer) is revoked, then asked about.
        _ if now >= f.due_at && has_next => Next::FallBack {
            ask: may_arrive,
            revoke: may_arrive,
        },
        _ => Next::Wait,
    }
}

/// The worker that does what [`next`] says.
pub struct Fallbacks {
    pub store: Arc<dyn Store>,
    pub deliverer: Arc<Deliverer>,
    pub secret: Arc<SecretSource>,
    /// Where what a provider answers when asked is recorded, as a receipt.
    pub receipts: Arc<dyn ReceiptSink>,
    pub clock: Clock,
    pub interval: Duration,
}

impl Fallbacks {
    /// One pass over the rows with something to do; how many moved on.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let due = self.store.due_fallbacks(now, BATCH).await?;
        // Rows are independent (every write is conditional, in its own
        // transaction), and a revoke or a question can take the provider's
        // timeout: one at a time, a pass over many rows outlasted the
        // verifications' life (the three-channel chaos run: 21 of 150
        // expired without their next step with 1 s revokes).
        let acts: Vec<_> = due.iter().map(|f| Box::pin(self.act(f))).collect();
        let mut acts = futures_util::stream::iter(acts).buffer_unordered(CONCURRENT);
        let mut moved = 0;
        let mut first_error = None;
        while let Some(done) = acts.next().await {
            match done {
                Ok(true) => moved += 1,
                Ok(false) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if moved == 0 => Err(e),
            _ => Ok(moved),
        }
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
            Next::DeliveredElsewhere { revoke } => {
                if revoke {
                    self.revoke(f).await;
                }
                self.store
                    .settle_fallback(f, FallbackState::Delivered, self.clock.now())
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
            Next::FallBack { ask, revoke } => {
                // Revoked first, then asked: a message that reaches the
                // phone before the revoke is shown delivered by the
                // answer, and one revoked before it did never reaches it;
                // asked first, a delivery between the answer and the
                // revoke would go unseen.
                if revoke {
                    self.revoke(f).await;
                }
                match if ask {
                    self.asked(f).await
                } else {
                    Some(false)
                } {
                    // What the provider said could not be recorded: not now.
                    None => Ok(false),
                    // Delivered, whatever the message's status can show
                    // (an `unknown` one keeps its status): no next channel.
                    Some(true) => {
                        self.store
                            .settle_fallback(f, FallbackState::Delivered, self.clock.now())
                            .await
                    }
                    Some(false) => self.fall_back(f).await,
                }
            }
        }
    }

    /// Asks `f`'s provider what became of its message and records
    /// the answer as a receipt (a `sent` message becomes `delivered` by
    /// it): whether it was delivered; `None` when the answer could not be
    /// recorded.
    async fn asked(&self, f: &FallbackDue) -> Option<bool> {
        let (Some(token), Some(provider)) = (
            f.prepared_token.as_deref(),
            self.deliverer.provider(&f.provider),
        ) else {
            return Some(false);
        };
        let Some((receipt, status)) = provider.delivery_status(token).await else {
            return Some(false);
        };
        match self.receipts.take(provider.name(), receipt, status).await {
            Ok(()) => Some(status == Some(Status::Delivered)),
            Err(e) => {
                tracing::warn!(error = %e, "could not record what the provider said of the message");
                None
            }
        }
    }

    /// Revokes `f`'s message, best effort.
    async fn revoke(&self, f: &FallbackDue) {
        let (Some(token), Some(provider)) = (
            f.prepared_token.as_deref(),
            self.deliverer.provider(&f.provider),
        ) else {
            return;
        };
        if !provider.revoke(token).await {
            tracing::info!(
                verification_id = %f.verification_id,
                "the provider did not revoke the message (it may have been delivered)"
            );
        }
    }

    async fn fall_back(&self, f: &FallbackDue) -> Result<bool, StoreError> {
        let Some(channel) = f.channels.at(f.step + 1) else {
            return Ok(false);
        };
        let Some(v) = self
            .store
            .verification(f.tenant_id, f.verification_id)
            .await?
        else {
            return Ok(false);
        };
        let Some(via) = self.deliverer.step_route(channel, &v.to, &f.provider) else {
            // Nowhere to send the next step (its channel is no longer
            // configured, no route covers the number): the message sent,
            // even one still being checked, is the only way the code can go.
            tracing::warn!(
                verification_id = %f.verification_id,
                channel = %channel,
                "no route for the verification's next channel"
            );
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
        let Some(mut m) =
            crate::verify::fallback_message(&keys, &v, f.send_number, channel, &via, deadline, now)
        else {
            tracing::error!(verification_id = %f.verification_id, "the code does not open: no fallback");
            return self
                .store
                .settle_fallback(f, FallbackState::Ended, now)
                .await;
        };
        // Charged at the channel's price, past a cap too (issue 41,
        // finding 2).
        m.cost = self.deliverer.verification_cost(&m);
        let lease = self.deliverer.new_lease();
        crate::failpoint::hit("fallback.before_move");
        let moved = self.store.fall_back(f, &m, &lease, now).await?;
        crate::failpoint::hit("fallback.after_move");
        match moved {
            FellBack::Moved(message, stop) => {
                if stop == Stop::Cancel {
                    self.deliverer
                        .metrics()
                        .message_final(Status::Canceled.as_str(), Deliverer::mode_of(&f.provider));
                }
                self.deliverer
                    .metrics()
                    .verify_event("fallback", v.country.as_deref());
                self.deliverer.spawn(*message, lease);
                Ok(true)
            }
            FellBack::Delivered => Ok(true),
            FellBack::NotNow => Ok(false),
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
        (message_status, leased, token): (Status, bool, bool),
        verification: VerificationStatus,
        channels: &str,
    ) -> FallbackDue {
        // `channels` with `@n`: the row is step n's (else step 0's).
        let (channels, step) = match channels.split_once('@') {
            Some((c, n)) => (c, n.parse().expect("step")),
            None => (channels, 0),
        };
        let known = [
            crate::domain::Channel::SMS,
            crate::domain::Channel::named("telegram"),
            crate::domain::Channel::named("whatsapp"),
        ];
        FallbackDue {
            verification_id: Uuid::nil(),
            send_number: 1,
            step,
            tenant_id: Uuid::nil(),
            message_id: MessageId(Uuid::nil()),
            due_at: at(60),
            state,
            message_status,
            message_attempts: 1,
            message_leased: leased,
            provider: "telegram_gateway".into(),
            prepared_token: token.then(|| "r1".to_string()),
            verification_status: verification,
            expires_at: at(600),
            channels: Channels::parse_stored(channels, &known).expect("channels"),
            fallback_after: crate::domain::FallbackAfter::Every(60),
            reported_delivered: false,
        }
    }

    #[test]
    fn what_a_row_leads_to_as_a_table() {
        use FallbackState::{Ended, FellBack, Waiting};
        use Status::{Canceled, Failed, Processing, Sent, Undelivered, Unknown};
        use VerificationStatus as V;
        const DELIVERED: Status = Status::Delivered;
        let both = "telegram,sms";
        const SMS: Next = Next::FallBack {
            ask: false,
            revoke: false,
        };
        // Silence: revoke, ask, then the SMS.
        const ASK_REVOKE_SMS: Next = Next::FallBack {
            ask: true,
            revoke: true,
        };
        const END: Next = Next::End { revoke: false };
        const REVOKE_END: Next = Next::End { revoke: true };
        // (state, (message, leased, has a request id), verification, channels, now, next)
        #[rustfmt::skip]
        let rows = [
            (Waiting, (Processing, true, false), V::Pending, both, 10, Next::Wait),
            (Waiting, (Sent, false, true), V::Pending, both, 10, Next::Wait),
            (Waiting, (DELIVERED, false, true), V::Pending, both, 10, Next::Delivered),
            // Not on Telegram, refused: nothing was sent, the SMS goes now.
            (Waiting, (Failed, false, false), V::Pending, both, 10, SMS),
            (Waiting, (Failed, false, true), V::Pending, both, 10, SMS),
            // Reported expired or revoked.
            (Waiting, (Undelivered, false, true), V::Pending, both, 10, SMS),
            // No delivery report in time: ask, revoke, then the SMS.
            (Waiting, (Sent, false, true), V::Pending, both, 59, Next::Wait),
            (Waiting, (Sent, false, true), V::Pending, both, 60, ASK_REVOKE_SMS),
            (Waiting, (Unknown, false, true), V::Pending, both, 61, ASK_REVOKE_SMS),
            // Waiting for a retry, or looked up again after an ambiguous
            // answer: the move's transaction cancels or expires it.
            (Waiting, (Processing, false, true), V::Pending, both, 61, ASK_REVOKE_SMS),
            (Waiting, (Processing, false, false), V::Pending, both, 61, SMS),
            // Held by a lease (a call may be in flight): wait for it.
            (Waiting, (Processing, true, true), V::Pending, both, 61, Next::Wait),
            (Waiting, (Processing, true, false), V::Pending, both, 61, Next::Wait),
            // Telegram alone: no next channel.
            (Waiting, (Sent, false, true), V::Pending, "telegram", 61, Next::Wait),
            (Waiting, (Failed, false, false), V::Pending, "telegram", 10, END),
            // The verification ended: revoke what may still arrive (its
            // unsent message was stopped by the end itself).
            (Waiting, (Sent, false, true), V::Approved, both, 10, REVOKE_END),
            (Waiting, (Sent, false, true), V::Pending, both, 600, REVOKE_END),
            (FallbackState::Delivered, (DELIVERED, false, true), V::Canceled, both, 10, REVOKE_END),
            (FallbackState::Delivered, (DELIVERED, false, true), V::Pending, both, 100, Next::Wait),
            (Waiting, (Undelivered, false, true), V::Expired, both, 10, END),
            (Waiting, (Processing, false, false), V::Approved, both, 10, END),
            (Waiting, (Canceled, false, true), V::Canceled, both, 10, END),
            // ... but a call in flight lands before the revoke.
            (Waiting, (Processing, true, true), V::Canceled, both, 10, Next::Wait),
            // Settled rows never move again.
            (FellBack, (Sent, false, true), V::Approved, both, 10, Next::Wait),
            (Ended, (Sent, false, true), V::Approved, both, 10, Next::Wait),
            (FellBack, (Processing, false, false), V::Pending, both, 61, Next::Wait),
            // Any order, any length (issue 40): a step moves on as the
            // first does while there is a step after it.
            (Waiting, (Sent, false, false), V::Pending, "sms,telegram", 61, SMS),
            (Waiting, (Failed, false, false), V::Pending, "sms,telegram", 10, SMS),
            (Waiting, (DELIVERED, false, false), V::Pending, "sms,telegram", 10, Next::Delivered),
            (Waiting, (Sent, false, true), V::Pending, "whatsapp,telegram,sms@1", 61, ASK_REVOKE_SMS),
            (Waiting, (Sent, false, false), V::Pending, "whatsapp,telegram,sms@0", 59, Next::Wait),
            (Waiting, (Unknown, false, false), V::Pending, "whatsapp,telegram,sms@0", 60, SMS),
            (Waiting, (Failed, false, false), V::Pending, "whatsapp,telegram,sms@1", 10, SMS),
            // The last step has no next one: it waits for the end.
            (Waiting, (Sent, false, false), V::Pending, "whatsapp,telegram,sms@2", 61, Next::Wait),
            (Waiting, (Failed, false, false), V::Pending, "whatsapp,telegram,sms@2", 10, END),
            (Waiting, (Sent, false, true), V::Pending, "sms,telegram@1", 61, Next::Wait),
            (Waiting, (Sent, false, true), V::Approved, "sms,telegram@1", 61, REVOKE_END),
            (Waiting, (Sent, false, false), V::Canceled, "whatsapp,telegram,sms@2", 10, END),
            (Waiting, (Processing, true, false), V::Pending, "whatsapp,telegram,sms@1", 61, Next::Wait),
        ];
        for (state, message, v, channels, now, want) in rows {
            let f = row(state, message, v, channels);
            assert_eq!(
                next(&f, at(now)),
                want,
                "{state:?} {message:?} {v:?} {channels} {now}"
            );
        }
        // A report of delivery of a send that ended `unknown` (its status
        // stays): no next channel, at once or past the delay.
        for now in [10, 61] {
            let mut f = row(Waiting, (Unknown, false, false), V::Pending, "whatsapp,sms");
            f.reported_delivered = true;
            assert_eq!(
                next(&f, at(now)),
                Next::DeliveredElsewhere { revoke: false },
                "{now}"
            );
        }
        // An earlier step reported delivered after the move: this step's
        // message (sent by the Gateway) is revoked and nothing more goes.
        let mut f = row(
            Waiting,
            (Sent, false, true),
            V::Pending,
            "whatsapp,telegram,sms@1",
        );
        f.reported_delivered = true;
        assert_eq!(next(&f, at(10)), Next::DeliveredElsewhere { revoke: true });
        // ... also while its retry waits, or its call is in flight (the
        // settle stops it: canceled, or expired so that no call starts).
        let mut f = row(
            Waiting,
            (Processing, true, true),
            V::Pending,
            "whatsapp,telegram,sms@1",
        );
        f.reported_delivered = true;
        assert_eq!(next(&f, at(10)), Next::DeliveredElsewhere { revoke: true });
    }
}
