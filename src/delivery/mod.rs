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
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::clock::{Clock, to_time};
use crate::domain::{AttemptOutcome, MessageId};
use crate::provider::{OutgoingSms, Provider, Reconciled, SendOutcome};
use crate::store::{Lease, MessageRecord, Store, StoreError, StoredResponse};

pub mod apply;
pub mod decide;
pub mod hub;
pub mod purge;
pub mod retry;
pub mod scheduler;

pub use apply::Report;
pub use decide::{Event, Snapshot, Transition, decide};
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
    /// Cancelled when shutdown starts: retry wake-ups are timers, not work,
    /// and live outside `tasks` so they never hold shutdown up.
    timers: CancellationToken,
    /// Wakes the scheduler early (a retry is due soon).
    pub(crate) nudge: Arc<Notify>,
    metrics: Arc<crate::metrics::Metrics>,
    /// Opens sealed message bodies (verification codes) right before the
    /// provider call; set once by `App::build`.
    sealed: std::sync::OnceLock<Arc<crate::verify::SecretSource>>,
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
            timers: CancellationToken::new(),
            nudge: Arc::new(Notify::new()),
            metrics: Arc::default(),
            sealed: std::sync::OnceLock::new(),
        })
    }

    /// Where the key to open sealed bodies comes from (verifications).
    pub fn open_sealed_bodies_with(&self, secret: Arc<crate::verify::SecretSource>) {
        let _ = self.sealed.set(secret);
    }

    /// The body to hand the provider: a sealed one (a verification's code)
    /// opened, any other as stored. `None` when a sealed body cannot be
    /// opened now (the database holding the secret is away, or the secret
    /// changed): nothing is sent, and the message is left to be resumed.
    async fn open_body(&self, sms: &mut OutgoingSms) -> Option<()> {
        if !crate::verify::crypto::is_sealed(&sms.body) {
            return Some(());
        }
        let Some(secret) = self.sealed.get() else {
            tracing::error!(message_id = %sms.message_id, "a sealed body, and no verify secret to open it");
            return None;
        };
        let keys = match secret.keys().await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(message_id = %sms.message_id, error = %e, "verify secret unavailable");
                return None;
            }
        };
        match keys.open_body(sms.message_id.0, &sms.body) {
            Ok(body) => {
                sms.body = body;
                Some(())
            }
            Err(e) => {
                tracing::error!(message_id = %sms.message_id, error = %e, "sealed body does not open");
                None
            }
        }
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

    /// A free provider-call slot, if there is one now. The scheduler takes
    /// its slots before it claims, so no claimed message waits leased for one.
    pub fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.permits).try_acquire_owned().ok()
    }

    /// Starts delivering a message this instance holds the lease of.
    /// `fresh`: the message was just inserted with its first attempt started.
    pub fn spawn(self: &Arc<Self>, msg: MessageRecord, lease: Lease, fresh: bool) {
        self.spawn_run(msg, lease, fresh, None);
    }

    /// Resumes a claimed message with the send slot taken for it.
    pub fn spawn_with_permit(
        self: &Arc<Self>,
        msg: MessageRecord,
        lease: Lease,
        permit: OwnedSemaphorePermit,
    ) {
        self.spawn_run(msg, lease, false, Some(permit));
    }

    fn spawn_run(
        self: &Arc<Self>,
        msg: MessageRecord,
        lease: Lease,
        fresh: bool,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let registration = self.hub.register(msg.id);
        let this = Arc::clone(self);
        let span = tracing::info_span!("deliver", message_id = %msg.id, attempt = msg.attempts);
        self.tasks.spawn(async move {
            let _ = tracing::Instrument::instrument(
                this.deliver(msg, lease, fresh, permit, &registration),
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

    /// Stops accepting work and waits until `deadline` for provider calls
    /// in flight; then stops the rest where they are and releases their
    /// leases so another instance resumes them at once. Retry wake-ups are
    /// dropped at once: the row holds the due time.
    pub async fn shutdown(&self, deadline: Instant) -> Result<u64, StoreError> {
        self.tasks.close();
        self.timers.cancel();
        if tokio::time::timeout_at(deadline, self.tasks.wait())
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
        let _ = tokio::time::timeout(Duration::from_secs(1), self.tasks.wait()).await;
        self.store
            .release_leases(&self.owner, self.clock.now())
            .await
    }

    /// Stops every task without releasing anything, as a crash would (tests).
    pub async fn halt(&self) {
        self.tasks.close();
        self.timers.cancel();
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

    /// One run of a delivery (at most one provider attempt), logged and
    /// counted once.
    pub async fn deliver(
        &self,
        msg: MessageRecord,
        lease: Lease,
        fresh: bool,
        permit: Option<OwnedSemaphorePermit>,
        registration: &hub::Registration,
    ) -> Report {
        let report = self.run(msg, lease, fresh, permit, registration).await;
        self.record(&report);
        report
    }

    fn decide(&self, snap: &Snapshot, event: &Event<'_>) -> Transition {
        decide(
            snap,
            event,
            self.clock.now(),
            &self.settings.retry,
            self.provider.dedupes_by_key(),
        )
    }

    async fn run(
        &self,
        mut msg: MessageRecord,
        mut lease: Lease,
        fresh: bool,
        permit: Option<OwnedSemaphorePermit>,
        registration: &hub::Registration,
    ) -> Report {
        let permit = match permit {
            Some(p) => p,
            None => tokio::select! {
                p = Arc::clone(&self.permits).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return Report::Stopped,
                },
                () = self.stop.cancelled() => return Report::Stopped,
            },
        };
        let now = self.clock.now();
        let mut sms = self.sms(&msg, now);
        if self.open_body(&mut sms).await.is_none() {
            return Report::StoreDown;
        }
        let previous_start = msg.last_attempt_started_at.unwrap_or(msg.created_at);

        let (attempt, started_at) = if fresh {
            (msg.attempts, previous_start)
        } else {
            let open = msg.last_attempt_open;
            if open && !self.provider.dedupes_by_key() {
                // The previous owner may have sent it and cannot tell us:
                // ask the provider before sending anything again.
                let snap = Snapshot::of(&msg, msg.attempts, previous_start);
                let Some(answer) = self.reconcile(&sms, previous_start).await else {
                    return Report::Stopped;
                };
                let t = self.decide(&snap, &Event::Resumed(&answer));
                if t != Transition::Proceed {
                    return self.apply(&mut msg, &lease, registration, t).await;
                }
            }
            msg.maybe_sent |= open;
            let snap = Snapshot::of(&msg, msg.attempts, previous_start);
            let closing = open.then_some((msg.attempts, AttemptOutcome::Lost));
            let t = self.decide(
                &snap,
                &Event::Starting {
                    opted_out: false,
                    closing,
                },
            );
            if t != Transition::Proceed {
                return self.apply(&mut msg, &lease, registration, t).await;
            }
            lease.expires_at = now + to_time(self.settings.lease);
            match self.store.start_attempt(msg.id, &lease, now).await {
                Ok(Some(n)) => {
                    msg.attempts = n;
                    (n, now)
                }
                Ok(None) => return Report::LeaseLost,
                Err(e) => {
                    tracing::warn!(error = %e, "could not start an attempt");
                    return Report::StoreDown;
                }
            }
        };
        let snap = Snapshot::of(&msg, attempt, started_at);

        // Past its validity (perhaps after waiting for a send slot), or to a
        // number that opted out (read with the row, the insert or the
        // claim): the provider is not called.
        let t = self.decide(
            &snap,
            &Event::Starting {
                opted_out: msg.recipient_opted_out,
                closing: Some((attempt, AttemptOutcome::Expired)),
            },
        );
        if t != Transition::Proceed {
            return self.apply(&mut msg, &lease, registration, t).await;
        }

        // Every call starts under a (nearly) full lease, however long the
        // wait for a slot was, so no other instance takes the message over
        // while it runs. A lease written within the last second (the insert
        // of a new message, the start of a resumed attempt) already is one:
        // renewing it again would cost a round trip per send for nothing.
        let now = self.clock.now();
        if needs_renewal(lease.expires_at, now, self.settings.lease) {
            lease.expires_at = now + to_time(self.settings.lease);
            match self.store.renew_lease(msg.id, &lease).await {
                Ok(true) => {}
                Ok(false) => return Report::LeaseLost,
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the lease");
                    return Report::StoreDown;
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
            () = self.stop.cancelled() => return Report::Stopped,
        };
        let class = outcome.class();
        self.metrics
            .provider_attempt(self.provider.name(), class, started.elapsed());
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            ?outcome,
            "provider answered"
        );
        drop(permit);

        let mut t = self.decide(&snap, &Event::Answered(&outcome));
        if let Transition::Reconcile { since } = t {
            let Some(answer) = self.reconcile(&sms, since).await else {
                return Report::Stopped;
            };
            t = self.decide(
                &snap,
                &Event::Reconciled {
                    after: &outcome,
                    answer: &answer,
                },
            );
        }
        self.apply(&mut msg, &lease, registration, t).await
    }

    /// Asks the provider whether it sent `sms` since `since`: the one
    /// reconcile path, for an attempt a previous owner left open and for an
    /// ambiguous answer. `None` when shutdown stopped it.
    ///
    /// A provider message id that another message already holds is never
    /// ours: the provider's single candidate was someone else's SMS, so
    /// nothing of ours was listed.
    async fn reconcile(&self, sms: &OutgoingSms, since: OffsetDateTime) -> Option<Reconciled> {
        let answer = tokio::select! {
            r = self.provider.reconcile(sms, since) => r,
            () = self.stop.cancelled() => return None,
        };
        let Reconciled::Sent {
            provider_message_id,
        } = &answer
        else {
            return Some(answer);
        };
        let owner = self
            .store
            .provider_message_owner(self.provider.name(), provider_message_id)
            .await;
        Some(match owner {
            Ok(Some(owner)) if owner != sms.message_id => {
                tracing::warn!(
                    %owner,
                    "the provider's only candidate belongs to another message: not ours"
                );
                Reconciled::NotSent
            }
            Ok(_) => answer,
            Err(e) => Reconciled::Unknown(format!(
                "could not check who holds provider message {provider_message_id}: {e}"
            )),
        })
    }

    /// Wakes the scheduler when a retry falls due before its next regular
    /// scan. The timer is not a delivery: shutdown does not wait for it.
    fn nudge_at(&self, at: OffsetDateTime) {
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

/// How fresh a lease must be for a provider call to start under it without
/// renewing it first.
pub const LEASE_FRESHNESS: Duration = Duration::from_secs(1);

/// Whether a lease expiring at `expires_at` must be renewed before a
/// provider call at `now`: unless it has at least `lease - LEASE_FRESHNESS`
/// left.
pub fn needs_renewal(expires_at: OffsetDateTime, now: OffsetDateTime, lease: Duration) -> bool {
    expires_at - now < to_time(lease.saturating_sub(LEASE_FRESHNESS))
}
