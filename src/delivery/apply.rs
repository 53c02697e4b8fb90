//! Applying a decided transition: the one place a delivery writes its
//! result (fenced on the lease) and the one place the run's [`Report`] is
//! logged and counted.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use super::Deliverer;
use super::decide::Write;
use super::hub::Registration;
use crate::domain::Status;
use crate::store::{Finish, Lease, MessageRecord, Reschedule, StoreError};

/// How one run of a delivery ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// The message is final.
    Final(Status),
    /// The attempt is recorded and the next one is due at this time.
    Rescheduled(OffsetDateTime),
    /// Another instance owns the message now; nothing was written.
    LeaseLost,
    /// The database could not be reached; the lease runs out and whoever
    /// claims the message next resumes it from the row.
    StoreDown,
    /// Shutdown stopped the run where it was.
    Stopped,
    /// The final write named a provider message id another message holds
    /// (the unique constraint refused it); nothing was written. Within a run
    /// only: a reconciliation that meets it learns the candidate was not
    /// its own, and an accepted answer is stored without the id.
    IdTaken,
}

impl Deliverer {
    /// Writes `w`, fenced on `lease`. A provider's answer with an id that
    /// another message already holds is a message the provider sent (it
    /// said so) under an id we cannot keep: it is stored `sent` without the
    /// id, and the error says why.
    pub(super) async fn apply(
        &self,
        msg: &mut MessageRecord,
        lease: &Lease,
        registration: &Registration,
        w: Write,
    ) -> Report {
        let Write::Final {
            status,
            provider_message_id,
            error,
            attempt,
        } = w
        else {
            return self.apply_once(msg, lease, registration, w).await;
        };
        let first = Write::Final {
            status,
            provider_message_id: provider_message_id.clone(),
            error,
            attempt: attempt.clone(),
        };
        match self.apply_once(msg, lease, registration, first).await {
            Report::IdTaken => {
                let w = Write::Final {
                    status,
                    error: Some(super::decide::error(
                        "provider_id_taken",
                        &format!(
                            "the provider answered with message id {}, which another message \
                             already holds; this message was sent, its id is not kept",
                            provider_message_id.as_deref().unwrap_or_default()
                        ),
                        None,
                    )),
                    provider_message_id: None,
                    attempt,
                };
                match self.apply_once(msg, lease, registration, w).await {
                    Report::IdTaken => Report::StoreDown,
                    report => report,
                }
            }
            report => report,
        }
    }

    /// [`Deliverer::apply`], answering [`Report::IdTaken`] instead of
    /// handling it.
    pub(super) async fn apply_once(
        &self,
        msg: &mut MessageRecord,
        lease: &Lease,
        registration: &Registration,
        w: Write,
    ) -> Report {
        match w {
            Write::Final {
                status,
                provider_message_id,
                error,
                attempt,
            } => {
                let now = self.clock.now();
                msg.status = status;
                msg.provider_message_id = provider_message_id;
                msg.error = error;
                msg.updated_at = now;
                msg.next_attempt_at = None;
                if status == Status::Sent {
                    msg.sent_at = Some(now);
                }
                // A message stopped before its call ends as a cancel does.
                let response = if status == Status::Canceled {
                    msg.canceled_response(now)
                } else {
                    msg.final_response()
                };
                let provider = self.provider(&msg.provider);
                let opt_out = attempt
                    .as_ref()
                    .filter(|a| {
                        provider.as_ref().is_some_and(|p| {
                            p.opts_out(&msg.to, a.outcome, a.provider_code.as_deref())
                        })
                    })
                    .map(|_| msg.to.as_str().to_string());
                let f = Finish {
                    id: msg.id,
                    lease_token: lease.token,
                    status,
                    provider_message_id: msg.provider_message_id.clone(),
                    error: msg.error.clone(),
                    sent_at: msg.sent_at,
                    updated_at: now,
                    response: response.clone(),
                    attempt,
                    opt_out,
                };
                crate::failpoint::hit("finish.before");
                match self.write(lease, || self.store.finish(&f)).await {
                    Ok(true) => {}
                    Ok(false) => return Report::LeaseLost,
                    Err(report) => return report,
                }
                crate::failpoint::hit("finish.after");
                registration.complete(response);
                if status == Status::Sent {
                    self.attach_early_receipts(msg, now).await;
                }
                Report::Final(status)
            }
            Write::Retry { at, error, attempt } => {
                self.reschedule(msg, lease, at, error, Some(attempt)).await
            }
            // The attempt stays open: whoever claims it when due asks the
            // provider again before anything else.
            Write::Recheck { at, error } => self.reschedule(msg, lease, at, error, None).await,
        }
    }

    /// Records a due time (fenced), closing `attempt` or leaving the
    /// current one open, and releases the lease.
    async fn reschedule(
        &self,
        msg: &MessageRecord,
        lease: &Lease,
        at: OffsetDateTime,
        error: crate::domain::MessageError,
        attempt: Option<crate::store::AttemptResult>,
    ) -> Report {
        let r = Reschedule {
            id: msg.id,
            lease_token: lease.token,
            next_attempt_at: at,
            updated_at: self.clock.now(),
            error: Some(error),
            attempt,
        };
        match self.write(lease, || self.store.reschedule(&r)).await {
            Ok(true) => {
                self.nudge_at(at);
                Report::Rescheduled(at)
            }
            Ok(false) => Report::LeaseLost,
            Err(report) => report,
        }
    }

    /// Logs and counts how a run ended; `mode`: `live` or `test`.
    pub(super) fn record(&self, report: &Report, mode: &'static str) {
        match report {
            Report::Final(status) => {
                tracing::info!(status = status.as_str(), mode, "message final");
                self.metrics.message_final(status.as_str(), mode);
            }
            Report::Rescheduled(at) => {
                tracing::info!(next_attempt_at = %at, "retry scheduled");
                self.metrics.retry_scheduled();
            }
            Report::LeaseLost => {
                tracing::warn!("lease lost: another instance finished or owns this message");
                self.metrics.delivery_interrupted("lease_lost");
            }
            Report::StoreDown => {
                tracing::warn!("database unavailable: the message is resumed when its lease ends");
                self.metrics.delivery_interrupted("store_down");
            }
            Report::Stopped => {
                tracing::info!("stopped by shutdown");
                self.metrics.delivery_interrupted("stopped");
            }
            Report::IdTaken => {
                tracing::warn!("the provider message id is another message's: nothing written");
                self.metrics.delivery_interrupted("store_down");
            }
        }
    }

    /// A fast provider's receipts can overtake our write of its id. Looking
    /// only after our commit (one cheap read, and a locked attach only when
    /// there is something to attach), while the receipt path looks again
    /// after its own commit, means one of the two always sees the other.
    async fn attach_early_receipts(&self, msg: &MessageRecord, now: OffsetDateTime) {
        let Some(pmid) = msg.provider_message_id.as_deref() else {
            return;
        };
        let attached = match self.store.has_unmatched_receipts(&msg.provider, pmid).await {
            Ok(false) => Ok(false),
            Ok(true) => self.store.attach_receipts(&msg.provider, pmid, now).await,
            Err(e) => Err(e),
        };
        if let Err(e) = attached {
            tracing::warn!(error = %e, "could not attach receipts that arrived early");
        }
        // A long message's later parts have provider ids of their own:
        // their receipts find it by our id, which a receipt that came
        // before the send was saved could not link (issue 42's ten runs:
        // Vonage's second part).
        if msg.segments > 1
            && let Err(e) = self
                .store
                .attach_receipts_naming(msg.id, &msg.provider, now)
                .await
        {
            tracing::warn!(error = %e, "could not attach the parts' receipts that arrived early");
        }
    }

    /// Runs a fenced write, retrying while the database is unavailable and the
    /// lease lasts. `Err(report)` when it could not be written at all (the
    /// message is then resumed from the row by whoever claims it next).
    pub(super) async fn write<F, Fut>(&self, lease: &Lease, op: F) -> Result<bool, Report>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, StoreError>>,
    {
        let mut backoff = Duration::from_millis(50);
        loop {
            match op().await {
                Ok(done) => return Ok(done),
                Err(StoreError::Conflict { .. }) => return Err(Report::IdTaken),
                Err(StoreError::Unavailable(e)) if !lease.left().is_zero() => {
                    tracing::warn!(error = %e, "database unavailable, retrying the write");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = self.stop.cancelled() => return Err(Report::Stopped),
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not record the outcome");
                    return Err(Report::StoreDown);
                }
            }
        }
    }

    /// Wakes the scheduler when a retry (or a scheduled send) falls due before its next regular
    /// scan. The timer is not a delivery: shutdown does not wait for it.
    pub fn nudge_at(&self, at: OffsetDateTime) {
        let wait = Duration::try_from(at - self.clock.now()).unwrap_or(Duration::ZERO);
        if self.clock.is_manual() || wait > Duration::from_secs(60) {
            return;
        }
        let nudge = Arc::clone(&self.nudge);
        let timers = self.timers.clone();
        tokio::spawn(async move {
            tokio::select! {
                // A little after the due time, so the claim finds it due.
                () = tokio::time::sleep(wait + Duration::from_millis(2)) => nudge.notify_one(),
                () = timers.cancelled() => {}
            }
        });
    }
}
