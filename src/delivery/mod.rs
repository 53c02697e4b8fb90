//! Delivering a message: one provider attempt at a time, on a task of its own.
//!
//! A delivery task never belongs to an HTTP request: the handler spawns it and
//! only waits for its result, so a client that disconnects cancels nothing.
//! Each task runs exactly one attempt under a lease and then either makes the
//! message final or records a due time and lets the lease go; the
//! [`Scheduler`] (on any instance) picks the message up again when it is due,
//! or when its owner died and the lease expired.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::clock::{Clock, to_time};
use crate::domain::{AttemptOutcome, MessageError, MessageId, Status};
use crate::provider::{OutgoingSms, Provider, Reconciled, SendOutcome};
use crate::store::{
    AttemptResult, Finish, Lease, MessageRecord, Reschedule, Store, StoreError, StoredResponse,
};

pub mod hub;
pub mod purge;
pub mod retry;
pub mod scheduler;

pub use hub::Hub;
pub use purge::Purger;
pub use retry::RetryPolicy;
pub use scheduler::Scheduler;

/// Settings for delivery.
#[derive(Clone, Debug)]
pub struct DeliverySettings {
    pub retry: RetryPolicy,
    /// How long a claim lasts without renewal. Longer than a provider call.
    pub lease: Duration,
    /// Upper bound of one provider call.
    pub provider_timeout: Duration,
    /// Simultaneous provider calls in this instance.
    pub max_concurrent_sends: usize,
}

/// Runs deliveries for this instance.
pub struct Deliverer {
    store: Arc<dyn Store>,
    provider: Arc<dyn Provider>,
    clock: Clock,
    settings: DeliverySettings,
    /// Who this instance is, in leases.
    owner: String,
    hub: Hub,
    permits: Arc<Semaphore>,
    tasks: TaskTracker,
    /// Cancelled when the shutdown grace period is over: tasks stop where
    /// they are and their leases are released for another instance.
    stop: CancellationToken,
    /// Wakes the scheduler early (a retry is due soon).
    pub(crate) nudge: Arc<Notify>,
    metrics: Arc<crate::metrics::Metrics>,
}

/// What the outcome of an attempt leads to.
#[derive(Clone, Debug, PartialEq)]
enum Next {
    Finish {
        status: Status,
        provider_message_id: Option<String>,
        error: Option<MessageError>,
    },
    RetryAt {
        at: OffsetDateTime,
        error: MessageError,
    },
    Reconcile,
}

impl Deliverer {
    pub fn new(
        store: Arc<dyn Store>,
        provider: Arc<dyn Provider>,
        clock: Clock,
        settings: DeliverySettings,
        owner: String,
    ) -> Arc<Self> {
        let permits = Arc::new(Semaphore::new(settings.max_concurrent_sends.max(1)));
        Arc::new(Self {
            store,
            provider,
            clock,
            settings,
            owner,
            hub: Hub::default(),
            permits,
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
            nudge: Arc::new(Notify::new()),
            metrics: Arc::default(),
        })
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn provider_name(&self) -> &'static str {
        self.provider.name()
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// This instance's metrics.
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    pub fn settings(&self) -> &DeliverySettings {
        &self.settings
    }

    /// A new lease for this instance, from now.
    pub fn new_lease(&self) -> Lease {
        Lease {
            token: Uuid::new_v4(),
            owner: self.owner.clone(),
            expires_at: self.clock.now() + to_time(self.settings.lease),
        }
    }

    /// Free provider-call slots (the scheduler claims no more than this).
    pub fn free_permits(&self) -> usize {
        self.permits.available_permits()
    }

    /// Deliveries running in this instance.
    pub fn in_flight(&self) -> usize {
        self.hub.len()
    }

    /// Starts delivering a message this instance holds the lease of.
    /// `fresh`: the message was just inserted with its first attempt started.
    pub fn spawn(self: &Arc<Self>, msg: MessageRecord, lease: Lease, fresh: bool) {
        let registration = self.hub.register(msg.id);
        let this = Arc::clone(self);
        let span = tracing::info_span!("deliver", message_id = %msg.id, attempt = msg.attempts);
        self.tasks.spawn(async move {
            let _ = tracing::Instrument::instrument(
                this.deliver(msg, lease, fresh, &registration),
                span,
            )
            .await;
        });
    }

    /// Waits up to `budget` for the final response of `id`.
    pub async fn await_final(
        &self,
        id: MessageId,
        budget: Duration,
    ) -> Result<Option<StoredResponse>, StoreError> {
        let deadline = Instant::now() + budget;
        let mut poll = Duration::from_millis(5);
        loop {
            if let Some(mut rx) = self.hub.subscribe(id) {
                match tokio::time::timeout_at(deadline, rx.wait_for(Option::is_some)).await {
                    Ok(Ok(response)) => return Ok(response.clone()),
                    // The task ended without a final answer (it scheduled a
                    // retry or lost its lease): read the row.
                    Ok(Err(_)) => {}
                    Err(_) => return Ok(None),
                }
            }
            match self.store.state_by_id(id).await? {
                Some(state) if state.status.is_final() => return Ok(state.response),
                Some(_) => {}
                None => return Ok(None),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep_until((now + poll).min(deadline)).await;
            poll = (poll * 2).min(Duration::from_millis(200));
        }
    }

    /// Stops accepting work and waits up to `grace` for running deliveries;
    /// then stops the rest where they are and releases their leases so
    /// another instance resumes them at once.
    pub async fn shutdown(&self, grace: Duration) -> Result<u64, StoreError> {
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = self.in_flight(),
                "grace period over: stopping deliveries and releasing their leases"
            );
        }
        self.stop.cancel();
        // Tasks stop at their next await point; none holds us for long.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.tasks.wait()).await;
        self.store
            .release_leases(&self.owner, self.clock.now())
            .await
    }

    /// Stops every task without releasing anything, as a crash would (tests).
    pub async fn halt(&self) {
        self.tasks.close();
        self.stop.cancel();
        self.tasks.wait().await;
    }

    fn sms(&self, msg: &MessageRecord, now: OffsetDateTime) -> OutgoingSms {
        OutgoingSms {
            message_id: msg.id,
            to: msg.to.to_string(),
            from: msg.from.clone(),
            body: msg.body.clone(),
            validity: msg
                .expires_at
                .map(|e| Duration::try_from(e - now).unwrap_or(Duration::ZERO)),
        }
    }

    /// One run of a delivery: at most one provider attempt.
    async fn deliver(
        &self,
        mut msg: MessageRecord,
        mut lease: Lease,
        fresh: bool,
        registration: &hub::Registration,
    ) -> Option<()> {
        let _permit = tokio::select! {
            p = Arc::clone(&self.permits).acquire_owned() => p.ok()?,
            () = self.stop.cancelled() => return None,
        };
        let now = self.clock.now();
        let sms = self.sms(&msg, now);

        let attempt = if fresh {
            msg.attempts
        } else {
            if msg.last_attempt_open && !self.provider.dedupes_by_key() {
                // The previous owner may have sent it and cannot tell us:
                // ask the provider before sending anything again.
                let since = msg.last_attempt_started_at.unwrap_or(msg.created_at);
                match self.provider.reconcile(&sms, since).await {
                    Reconciled::Sent {
                        provider_message_id,
                    } => {
                        let result =
                            self.attempt_result(msg.attempts, AttemptOutcome::Reconciled, None);
                        return self
                            .finish(
                                &mut msg,
                                &lease,
                                registration,
                                Status::Sent,
                                Some(provider_message_id),
                                None,
                                Some(result),
                            )
                            .await;
                    }
                    Reconciled::NotSent => {}
                    Reconciled::Unknown(reason) => {
                        let error = error("outcome_unknown", &reason, None);
                        let result =
                            self.attempt_result(msg.attempts, AttemptOutcome::Lost, Some(reason));
                        return self
                            .finish(
                                &mut msg,
                                &lease,
                                registration,
                                Status::Unknown,
                                None,
                                Some(error),
                                Some(result),
                            )
                            .await;
                    }
                }
            }
            if let Some(e) = too_late(&msg, now) {
                let open = msg
                    .last_attempt_open
                    .then_some((msg.attempts, AttemptOutcome::Lost));
                msg.maybe_sent |= msg.last_attempt_open;
                return self.give_up(&mut msg, &lease, registration, e, open).await;
            }
            lease.expires_at = now + to_time(self.settings.lease);
            let n = match self.store.start_attempt(msg.id, &lease, now).await {
                Ok(Some(n)) => n,
                Ok(None) => {
                    tracing::info!("another instance owns this message now");
                    return None;
                }
                Err(e) => {
                    // The lease expires and the message is resumed from the row.
                    tracing::warn!(error = %e, "could not start an attempt");
                    return None;
                }
            };
            msg.maybe_sent |= msg.last_attempt_open;
            msg.attempts = n;
            n
        };

        if fresh && let Some(e) = too_late(&msg, now) {
            // Waited for a send slot past the message's validity.
            return self
                .give_up(
                    &mut msg,
                    &lease,
                    registration,
                    e,
                    Some((attempt, AttemptOutcome::Expired)),
                )
                .await;
        }

        // A number that opted out never reaches the provider. Whether it did
        // was read with the row (the insert, or the claim), so this costs no
        // round trip of its own.
        if msg.recipient_opted_out {
            let e = error(
                "recipient_opted_out",
                "the recipient opted out of messages from this account",
                None,
            );
            return self
                .give_up(
                    &mut msg,
                    &lease,
                    registration,
                    e,
                    Some((attempt, AttemptOutcome::OptedOut)),
                )
                .await;
        }

        // The provider is called only under a lease that outlives the call,
        // so no other instance can take the message over while it runs.
        let needed = to_time(self.settings.provider_timeout + Duration::from_secs(2));
        if lease.expires_at - self.clock.now() < needed {
            lease.expires_at = self.clock.now() + to_time(self.settings.lease);
            match self.store.renew_lease(msg.id, &lease).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!("lease lost before the provider call");
                    return None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the lease");
                    return None;
                }
            }
        }

        let started = Instant::now();
        let outcome = tokio::select! {
            o = tokio::time::timeout(self.settings.provider_timeout, self.provider.send(&sms)) => {
                o.unwrap_or_else(|_| SendOutcome::Ambiguous {
                    http_status: None,
                    retry_after: None,
                    message: "the provider did not answer in time".into(),
                })
            }
            // Shutdown grace is over: the attempt stays open and whoever
            // resumes the message treats it as ambiguous.
            () = self.stop.cancelled() => return None,
        };
        let class = outcome.class();
        self.metrics
            .provider_attempt(self.provider.name(), class, started.elapsed());
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            ?outcome,
            "provider answered"
        );
        drop(_permit);

        let now = self.clock.now();
        let mut next = decide(
            &outcome,
            attempt,
            &msg,
            now,
            &self.settings.retry,
            self.provider.dedupes_by_key(),
        );
        if next == Next::Reconcile {
            let since = msg.last_attempt_started_at.unwrap_or(msg.created_at);
            next = match self.provider.reconcile(&sms, since).await {
                Reconciled::Sent {
                    provider_message_id,
                } => Next::Finish {
                    status: Status::Sent,
                    provider_message_id: Some(provider_message_id),
                    error: None,
                },
                Reconciled::NotSent => {
                    // The provider shows no such message: resending is safe.
                    let (_, retry_after, message) = parts(&outcome);
                    retry_or_give_up(
                        attempt,
                        retry_after,
                        &msg,
                        now,
                        &self.settings.retry,
                        false,
                        &message,
                    )
                }
                Reconciled::Unknown(reason) => Next::Finish {
                    status: Status::Unknown,
                    provider_message_id: None,
                    error: Some(error("outcome_unknown", &reason, None)),
                },
            };
        }
        let result = attempt_result_from(&outcome, attempt, now);
        match next {
            Next::Finish {
                status,
                provider_message_id,
                error,
            } => {
                self.finish(
                    &mut msg,
                    &lease,
                    registration,
                    status,
                    provider_message_id,
                    error,
                    Some(result),
                )
                .await
            }
            Next::RetryAt { at, error } => {
                let r = Reschedule {
                    id: msg.id,
                    lease_token: lease.token,
                    next_attempt_at: at,
                    updated_at: now,
                    error: Some(error),
                    attempt: result,
                };
                if self.write(&lease, || self.store.reschedule(&r)).await? {
                    tracing::info!(next_attempt_at = %at, "retry scheduled");
                    self.metrics.retry_scheduled();
                    self.nudge_at(at);
                }
                Some(())
            }
            Next::Reconcile => None,
        }
    }

    fn attempt_result(
        &self,
        number: u32,
        outcome: AttemptOutcome,
        error: Option<String>,
    ) -> AttemptResult {
        AttemptResult {
            number,
            outcome,
            http_status: None,
            provider_code: None,
            error,
            provider_message_id: None,
            finished_at: self.clock.now(),
        }
    }

    /// Ends a message no attempt will be made for: `failed`, or `unknown` if
    /// an earlier attempt may have sent it. `closing` is the open attempt
    /// this ends, and why.
    async fn give_up(
        &self,
        msg: &mut MessageRecord,
        lease: &Lease,
        registration: &hub::Registration,
        e: MessageError,
        closing: Option<(u32, AttemptOutcome)>,
    ) -> Option<()> {
        let attempt =
            closing.map(|(n, outcome)| self.attempt_result(n, outcome, Some(e.message.clone())));
        let status = give_up_status(msg.maybe_sent);
        self.finish(msg, lease, registration, status, None, Some(e), attempt)
            .await
    }

    /// Makes the message final (fenced on the lease) and tells local waiters.
    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &self,
        msg: &mut MessageRecord,
        lease: &Lease,
        registration: &hub::Registration,
        status: Status,
        provider_message_id: Option<String>,
        error: Option<MessageError>,
        attempt: Option<AttemptResult>,
    ) -> Option<()> {
        let now = self.clock.now();
        msg.status = status;
        msg.provider_message_id = provider_message_id;
        msg.error = error;
        msg.updated_at = now;
        msg.next_attempt_at = None;
        if status == Status::Sent {
            msg.sent_at = Some(now);
        }
        let response = StoredResponse {
            status_code: 201,
            body: msg.to_out().to_json(),
        };
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
        };
        if self.write(lease, || self.store.finish(&f)).await? {
            tracing::info!(status = status.as_str(), "message final");
            self.metrics.message_final(status.as_str());
            registration.complete(response);
            // A fast provider's receipts can overtake our write of its id.
            // Looking only after our commit (one cheap read, and a locked
            // attach only when there is something to attach), while the
            // receipt path looks again after its own commit, means one of
            // the two always sees the other.
            if let Some(pmid) = msg
                .provider_message_id
                .as_deref()
                .filter(|_| status == Status::Sent)
            {
                let attached = match self.store.has_unmatched_receipts(&msg.provider, pmid).await {
                    Ok(false) => Ok(false),
                    Ok(true) => self.store.attach_receipts(&msg.provider, pmid, now).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = attached {
                    tracing::warn!(error = %e, "could not attach receipts that arrived early");
                }
            }
            Some(())
        } else {
            tracing::warn!("lease lost: another instance finished or owns this message");
            None
        }
    }

    /// Runs a fenced write, retrying while the database is unavailable and the
    /// lease lasts. `None` when it could not be written at all (the message
    /// is then resumed from the row by whoever claims it next).
    async fn write<F, Fut>(&self, lease: &Lease, op: F) -> Option<bool>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, StoreError>>,
    {
        let mut backoff = Duration::from_millis(50);
        loop {
            match op().await {
                Ok(done) => return Some(done),
                Err(StoreError::Unavailable(e)) if self.clock.now() < lease.expires_at => {
                    tracing::warn!(error = %e, "database unavailable, retrying the write");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = self.stop.cancelled() => return None,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not record the outcome");
                    return None;
                }
            }
        }
    }

    /// Wakes the scheduler when a retry falls due before its next regular scan.
    fn nudge_at(&self, at: OffsetDateTime) {
        let wait = Duration::try_from(at - self.clock.now()).unwrap_or(Duration::ZERO);
        if self.clock.is_manual() || wait > Duration::from_secs(60) {
            return;
        }
        let nudge = Arc::clone(&self.nudge);
        let stop = self.stop.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                // A little after the due time, so the claim finds it due.
                () = tokio::time::sleep(wait + Duration::from_millis(2)) => nudge.notify_one(),
                () = stop.cancelled() => {}
            }
        });
    }
}

fn error(code: &str, message: &str, provider_code: Option<String>) -> MessageError {
    MessageError {
        code: code.to_string(),
        message: message.to_string(),
        provider_code,
    }
}

/// Giving up on a message the provider may have sent ends it `unknown`.
fn give_up_status(maybe_sent: bool) -> Status {
    if maybe_sent {
        Status::Unknown
    } else {
        Status::Failed
    }
}

/// Why no attempt may start now, if none may.
fn too_late(msg: &MessageRecord, now: OffsetDateTime) -> Option<MessageError> {
    if msg.expires_at.is_some_and(|e| now >= e) {
        return Some(error(
            "validity_expired",
            "the message's validity period ended before it could be sent",
            None,
        ));
    }
    if now >= msg.deadline_at {
        return Some(error(
            "retries_exhausted",
            "the retry deadline passed before the provider accepted the message",
            None,
        ));
    }
    None
}

fn parts(outcome: &SendOutcome) -> (Option<u16>, Option<Duration>, String) {
    match outcome {
        SendOutcome::Accepted { http_status, .. } => (*http_status, None, String::new()),
        SendOutcome::Rejected {
            http_status,
            message,
            ..
        } => (*http_status, None, message.clone()),
        SendOutcome::Retryable {
            http_status,
            retry_after,
            message,
            ..
        }
        | SendOutcome::Ambiguous {
            http_status,
            retry_after,
            message,
        } => (*http_status, *retry_after, message.clone()),
    }
}

fn attempt_result_from(outcome: &SendOutcome, number: u32, now: OffsetDateTime) -> AttemptResult {
    let (http_status, _, message) = parts(outcome);
    let (name, provider_code, provider_message_id) = match outcome {
        SendOutcome::Accepted {
            provider_message_id,
            ..
        } => (
            AttemptOutcome::Sent,
            None,
            Some(provider_message_id.clone()),
        ),
        SendOutcome::Rejected { provider_code, .. } => {
            (AttemptOutcome::Rejected, provider_code.clone(), None)
        }
        SendOutcome::Retryable { provider_code, .. } => {
            (AttemptOutcome::Retryable, provider_code.clone(), None)
        }
        SendOutcome::Ambiguous { .. } => (AttemptOutcome::Ambiguous, None, None),
    };
    AttemptResult {
        number,
        outcome: name,
        http_status,
        provider_code,
        error: (!message.is_empty()).then_some(message),
        provider_message_id,
        finished_at: now,
    }
}

/// What an attempt's outcome leads to.
fn decide(
    outcome: &SendOutcome,
    attempt: u32,
    msg: &MessageRecord,
    now: OffsetDateTime,
    policy: &RetryPolicy,
    dedupes: bool,
) -> Next {
    match outcome {
        SendOutcome::Accepted {
            provider_message_id,
            ..
        } => Next::Finish {
            status: Status::Sent,
            provider_message_id: Some(provider_message_id.clone()),
            error: None,
        },
        SendOutcome::Rejected {
            provider_code,
            message,
            ..
        } => Next::Finish {
            // A definite "no" to this very key: with a de-duplicating
            // provider that also covers any earlier ambiguous attempt.
            status: if dedupes {
                Status::Failed
            } else {
                give_up_status(msg.maybe_sent)
            },
            provider_message_id: None,
            error: Some(error("provider_rejected", message, provider_code.clone())),
        },
        SendOutcome::Retryable {
            retry_after,
            message,
            ..
        } => retry_or_give_up(attempt, *retry_after, msg, now, policy, false, message),
        SendOutcome::Ambiguous {
            retry_after,
            message,
            ..
        } => {
            if dedupes {
                // Resending with the same key cannot send twice.
                retry_or_give_up(attempt, *retry_after, msg, now, policy, true, message)
            } else {
                Next::Reconcile
            }
        }
    }
}

fn retry_or_give_up(
    attempt: u32,
    retry_after: Option<Duration>,
    msg: &MessageRecord,
    now: OffsetDateTime,
    policy: &RetryPolicy,
    ambiguous: bool,
    message: &str,
) -> Next {
    let maybe_sent = msg.maybe_sent || ambiguous;
    let give_up = |code: &str, why: String| Next::Finish {
        status: give_up_status(maybe_sent),
        provider_message_id: None,
        error: Some(error(
            if maybe_sent { "outcome_unknown" } else { code },
            &why,
            None,
        )),
    };
    if attempt >= policy.max_attempts {
        return give_up(
            "retries_exhausted",
            format!("gave up after {attempt} attempts; last: {message}"),
        );
    }
    let at = now + to_time(policy.delay(attempt, retry_after));
    if msg.expires_at.is_some_and(|e| at >= e) {
        return give_up(
            "validity_expired",
            format!("the next attempt would fall after the validity period; last: {message}"),
        );
    }
    if at > msg.deadline_at {
        return give_up(
            "retries_exhausted",
            format!("the next attempt would fall after the retry deadline; last: {message}"),
        );
    }
    Next::RetryAt {
        at,
        error: error(
            if ambiguous {
                "provider_ambiguous"
            } else {
                "provider_unavailable"
            },
            message,
            None,
        ),
    }
}
