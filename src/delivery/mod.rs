//! Delivering a message: one provider attempt at a time, on a task of its own.
//!
//! A delivery task never belongs to an HTTP request: the handler spawns it and
//! only waits for its result, so a client that disconnects cancels nothing.
//! Each task runs exactly one attempt under a lease and then either makes the
//! message final or records a due time and lets the lease go; the
//! [`Scheduler`] (on any instance) picks the message up again when it is due,
//! or when its owner died and the lease expired.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::domain::{AttemptOutcome, MessageId};
use crate::provider::{OutgoingSms, Provider, SendOutcome};
use crate::store::{Lease, MessageRecord, Store, StoreError, StoredResponse};

pub mod apply;
pub mod circuit;
pub mod decide;
pub mod hub;
pub mod purge;
mod reconcile;
pub mod retry;
pub mod route;
mod routing;
pub mod scheduler;

pub use apply::Report;
pub use circuit::CircuitPolicy;
pub use decide::{Event, Snapshot, Transition, decide};
pub use hub::Hub;
pub use purge::Purger;
pub use retry::RetryPolicy;
pub use route::Route;
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
    /// New messages whose delivery may wait for a send slot at once; beyond
    /// this a new send is refused (503, nothing stored) until the queue
    /// drains. Messages the scheduler resumes never queue: it claims only as
    /// many as there are free slots.
    pub max_queued_sends: usize,
}

/// A place in the queue of deliveries waiting for a send slot, released when
/// the delivery gets its slot or ends.
pub struct QueueTicket {
    deliverer: std::sync::Weak<Deliverer>,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        if let Some(d) = self.deliverer.upgrade() {
            d.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Runs deliveries for this instance.
pub struct Deliverer {
    store: Arc<dyn Store>,
    /// In order: the first is the primary. Never empty.
    providers: Vec<Arc<dyn Provider>>,
    circuit_policy: CircuitPolicy,
    /// This instance's copy of the circuits shared through the store.
    circuits: std::sync::Mutex<routing::CircuitCache>,
    clock: Clock,
    settings: DeliverySettings,
    /// Who this instance is, in leases.
    owner: String,
    hub: Hub,
    permits: Arc<Semaphore>,
    /// Deliveries holding a [`QueueTicket`].
    queued: AtomicUsize,
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
        Self::routed(
            store,
            vec![provider],
            CircuitPolicy::default(),
            clock,
            settings,
            owner,
        )
    }

    /// A deliverer that sends through `providers` in order (the first is
    /// the primary), failing over as [`route`](route::route) decides.
    /// An empty list is one simulated provider.
    pub fn routed(
        store: Arc<dyn Store>,
        mut providers: Vec<Arc<dyn Provider>>,
        circuit_policy: CircuitPolicy,
        clock: Clock,
        settings: DeliverySettings,
        owner: String,
    ) -> Arc<Self> {
        if providers.is_empty() {
            providers.push(Arc::new(crate::provider::SimulatedProvider {
                log_bodies: false,
            }));
        }
        let permits = Arc::new(Semaphore::new(settings.max_concurrent_sends.max(1)));
        let hub = Hub::new(Arc::clone(&store));
        Arc::new(Self {
            store,
            providers,
            circuit_policy,
            circuits: routing::cache(),
            clock,
            settings,
            owner,
            hub,
            permits,
            queued: AtomicUsize::new(0),
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
    /// The SMS to hand the provider, its body opened if it was sealed (a
    /// verification's code); `None` when it cannot be opened.
    async fn outgoing(&self, msg: &MessageRecord, now: OffsetDateTime) -> Option<OutgoingSms> {
        let mut sms = self.sms(msg, now);
        self.open_body(&mut sms).await?;
        Some(sms)
    }

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

    /// The primary provider's name: where new messages start.
    pub fn provider_name(&self) -> &'static str {
        self.providers[0].name()
    }

    /// The configured providers' names, in order.
    pub fn provider_names(&self) -> Vec<&'static str> {
        self.providers.iter().map(|p| p.name()).collect()
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

    /// A new lease for this instance, about to be written (its expiry is
    /// the database's clock at that write plus the lease duration).
    pub fn new_lease(&self) -> Lease {
        Lease::new(&self.owner, self.settings.lease)
    }

    /// Free provider-call slots (the scheduler claims no more than this).
    pub fn free_permits(&self) -> usize {
        self.permits.available_permits()
    }

    /// Deliveries running in this instance.
    pub fn in_flight(&self) -> usize {
        self.hub.len()
    }

    /// Waits until a provider-call slot is free (and leaves it free); false
    /// if the slots are closed.
    pub async fn slot_freed(&self) -> bool {
        Arc::clone(&self.permits).acquire_owned().await.is_ok()
    }

    /// A free provider-call slot, if there is one now. The scheduler takes
    /// its slots before it claims, so no claimed message waits leased for one.
    pub fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.permits).try_acquire_owned().ok()
    }

    /// Starts delivering a message this instance holds the lease of.
    /// `fresh`: the message was just inserted with its first attempt started.
    pub fn spawn(self: &Arc<Self>, msg: MessageRecord, lease: Lease, fresh: bool) {
        self.spawn_run(msg, lease, fresh, None, None);
    }

    /// Starts delivering a new message with its place in the send queue
    /// (see [`Deliverer::reserve`]), given up when it gets a send slot.
    pub fn spawn_queued(
        self: &Arc<Self>,
        msg: MessageRecord,
        lease: Lease,
        ticket: Option<QueueTicket>,
    ) {
        self.spawn_run(msg, lease, true, None, ticket);
    }

    /// Resumes a claimed message with the send slot taken for it.
    pub fn spawn_with_permit(
        self: &Arc<Self>,
        msg: MessageRecord,
        lease: Lease,
        permit: OwnedSemaphorePermit,
    ) {
        self.spawn_run(msg, lease, false, Some(permit), None);
    }

    fn spawn_run(
        self: &Arc<Self>,
        msg: MessageRecord,
        lease: Lease,
        fresh: bool,
        permit: Option<OwnedSemaphorePermit>,
        ticket: Option<QueueTicket>,
    ) {
        let registration = self.hub.register(msg.id);
        let this = Arc::clone(self);
        let span = tracing::info_span!("deliver", message_id = %msg.id, attempt = msg.attempts);
        self.tasks.spawn(async move {
            let permit = match permit {
                Some(p) => Some(p),
                None => tokio::select! {
                    p = Arc::clone(&this.permits).acquire_owned() => p.ok(),
                    () = this.stop.cancelled() => None,
                },
            };
            // Out of the queue: sending, or stopped.
            drop(ticket);
            let _ = tracing::Instrument::instrument(
                this.deliver(msg, lease, fresh, permit, &registration),
                span,
            )
            .await;
        });
    }

    /// Waits up to `budget` for the final response of `id`: told by the
    /// delivery when it runs here, else by the message's one poller (see
    /// [`Hub`]); this request itself never reads the database.
    pub async fn await_final(
        &self,
        id: MessageId,
        budget: Duration,
    ) -> Result<Option<StoredResponse>, StoreError> {
        let mut rx = self.hub.wait(id);
        match tokio::time::timeout(budget, rx.wait_for(Option::is_some)).await {
            Ok(Ok(response)) => Ok(response.clone()),
            Ok(Err(_)) | Err(_) => Ok(None),
        }
    }

    /// The waiters' rendezvous (tests and metrics).
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// Reserves a place in the queue of deliveries waiting for a send slot,
    /// for a message about to be inserted; `None` when the queue is full
    /// ([`DeliverySettings::max_queued_sends`]).
    pub fn reserve(self: &Arc<Self>) -> Option<QueueTicket> {
        let max = self.settings.max_queued_sends;
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(QueueTicket {
            deliverer: Arc::downgrade(self),
        })
    }

    /// Deliveries waiting for a send slot now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
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

    fn decide(
        &self,
        snap: &Snapshot,
        event: &Event<'_>,
        dedupes: bool,
        r: &Route<'_>,
    ) -> Transition {
        route::route(
            snap,
            event,
            self.clock.now(),
            &self.settings.retry,
            dedupes,
            r,
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
        let mut permit = Some(match permit {
            Some(p) => p,
            None => match self.acquire().await {
                Some(p) => p,
                None => return Report::Stopped,
            },
        });
        let now = self.clock.now();
        let previous_start = msg.last_attempt_started_at.unwrap_or(msg.created_at);
        // Routing as of a message that is not moving: decisions before a
        // send never move it except through `route_state`.
        let stay = Route {
            current: "",
            current_open: false,
            next: None,
        };

        let (mut attempt, mut started_at) = if fresh {
            (msg.attempts, previous_start)
        } else {
            let open = msg.last_attempt_open;
            let provider = self.provider_named(&msg.provider);
            let dedupes = provider.as_ref().is_some_and(|p| p.dedupes_by_key());
            if open && !dedupes {
                // The previous owner may have sent it and cannot tell us:
                // ask the provider it was sending with before sending
                // anything again.
                let Some(sms) = self.outgoing(&msg, now).await else {
                    return Report::StoreDown;
                };
                let snap = Snapshot::of(&msg, msg.attempts, previous_start);
                let Some(answer) = self
                    .reconcile(provider.as_deref(), &msg.provider, &sms, previous_start)
                    .await
                else {
                    return Report::Stopped;
                };
                let t = self.decide(&snap, &Event::Resumed(&answer), dedupes, &stay);
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
                dedupes,
                &stay,
            );
            if t != Transition::Proceed {
                return self.apply(&mut msg, &lease, registration, t).await;
            }
            let written = std::time::Instant::now();
            match self.store.start_attempt(msg.id, &lease, now).await {
                Ok(Some(n)) => {
                    lease.written = written;
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

        // One provider call per pass; a message that moves on to the next
        // provider goes round again at once.
        loop {
            let snap = Snapshot::of(&msg, attempt, started_at);
            let routing = self.route_state(&msg).await;
            let current = msg.provider.clone();
            let r = Route {
                current: &current,
                current_open: routing.current_open,
                next: routing.next,
            };
            let dedupes = routing
                .provider
                .as_ref()
                .is_some_and(|p| p.dedupes_by_key());

            // Past its validity (perhaps after waiting for a send slot), or
            // to a number that opted out (read with the row, the insert or
            // the claim): no provider is called. A circuit that is open
            // sends the message on to the next provider.
            let t = self.decide(
                &snap,
                &Event::Starting {
                    opted_out: msg.recipient_opted_out,
                    closing: Some((attempt, AttemptOutcome::Expired)),
                },
                dedupes,
                &r,
            );
            match t {
                Transition::Proceed => {}
                Transition::MoveOn {
                    to,
                    reason,
                    attempt: closing,
                } => {
                    let moved_attempt = closing.is_some();
                    match self
                        .move_on(&mut msg, &mut lease, to, reason, closing)
                        .await
                    {
                        Ok(n) => {
                            attempt = n;
                            if moved_attempt {
                                started_at = self.clock.now();
                            }
                            continue;
                        }
                        Err(report) => return report,
                    }
                }
                t => return self.apply(&mut msg, &lease, registration, t).await,
            }
            let Some(provider) = routing.provider else {
                // Its provider is no longer configured and something may
                // have been sent through it: nobody can tell.
                let t = Transition::Final {
                    status: crate::domain::Status::Unknown,
                    provider_message_id: None,
                    error: Some(decide::error(
                        "outcome_unknown",
                        &format!(
                            "the {} provider is no longer configured and may have sent it",
                            msg.provider
                        ),
                        None,
                    )),
                    attempt: None,
                };
                return self.apply(&mut msg, &lease, registration, t).await;
            };

            // Every call starts under a (nearly) full lease, however long
            // the wait for a slot was, so no other instance takes the
            // message over while it runs. A lease whose latest write started
            // within the last second (the insert of a new message, the claim,
            // the start of a resumed attempt or a move to the next provider)
            // already is one: renewing it again would cost a round trip per
            // send for nothing. The age is measured on this instance's
            // monotonic clock, from before that write, so neither a skewed
            // nor a hand-moved wall clock bears on it; the lease itself runs
            // on the database's clock, which advances at the same rate.
            let now = self.clock.now();
            if needs_renewal(lease.age()) {
                let written = std::time::Instant::now();
                match self.store.renew_lease(msg.id, &lease).await {
                    Ok(true) => lease.written = written,
                    Ok(false) => return Report::LeaseLost,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not renew the lease");
                        return Report::StoreDown;
                    }
                }
            }
            let slot = match permit.take() {
                Some(p) => p,
                None => match self.acquire().await {
                    Some(p) => p,
                    None => return Report::Stopped,
                },
            };

            let Some(sms) = self.outgoing(&msg, now).await else {
                return Report::StoreDown;
            };
            let started = Instant::now();
            let outcome = tokio::select! {
                o = tokio::time::timeout(self.settings.provider_timeout, provider.send(&sms)) => {
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
                .provider_attempt(provider.name(), class, started.elapsed());
            tracing::debug!(
                provider = provider.name(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                ?outcome,
                "provider answered"
            );
            drop(slot);
            self.record_circuit(provider.name(), outcome.provider_works(), &msg)
                .await;

            let mut t = self.decide(&snap, &Event::Answered(&outcome), dedupes, &r);
            if let Transition::Reconcile { since } = t {
                let Some(answer) = self
                    .reconcile(Some(provider.as_ref()), provider.name(), &sms, since)
                    .await
                else {
                    return Report::Stopped;
                };
                t = self.decide(
                    &snap,
                    &Event::Reconciled {
                        after: &outcome,
                        answer: &answer,
                    },
                    dedupes,
                    &r,
                );
            }
            match t {
                Transition::MoveOn {
                    to,
                    reason,
                    attempt: closing,
                } => match self
                    .move_on(&mut msg, &mut lease, to, reason, closing)
                    .await
                {
                    Ok(n) => {
                        attempt = n;
                        started_at = self.clock.now();
                    }
                    Err(report) => return report,
                },
                t => return self.apply(&mut msg, &lease, registration, t).await,
            }
        }
    }

    /// A provider-call slot; `None` when shutdown stopped the wait.
    async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        tokio::select! {
            p = Arc::clone(&self.permits).acquire_owned() => p.ok(),
            () = self.stop.cancelled() => None,
        }
    }
}

/// How fresh a lease must be for a provider call to start under it without
/// renewing it first. The configuration keeps a lease at least twice the
/// provider timeout plus 2 s, so a call started under a lease this fresh ends
/// with more than the provider timeout left.
pub const LEASE_FRESHNESS: Duration = Duration::from_secs(1);

/// Whether a lease whose latest write started `age` ago must be renewed
/// before a provider call: unless that write is less than
/// [`LEASE_FRESHNESS`] old.
pub fn needs_renewal(age: Duration) -> bool {
    age >= LEASE_FRESHNESS
}
