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

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::domain::MessageId;
use crate::provider::Provider;
use crate::store::{Lease, MessageRecord, Store, StoreError, StoredResponse};

pub mod apply;
mod attempt;
mod calls;
pub mod circuit;
pub mod decide;
pub mod destinations;
pub mod fair;
pub mod fallback;
pub mod hub;
pub mod orders;
pub mod orphans;
pub mod purge;
pub mod quality;
mod reconcile;
pub mod retry;
pub mod route;
pub mod route_quality;
mod routing;
pub mod scheduler;

pub use apply::Report;
pub use attempt::Start;
pub use circuit::CircuitPolicy;
pub use decide::{Event, Snapshot, Step, Transition, Write, decide};
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
    /// Send slots a tenant's further deliveries leave free for other
    /// tenants ([`fair`]); `None`: a sixteenth of the slots.
    pub spare_send_slots: Option<usize>,
}

impl DeliverySettings {
    /// Send slots kept free for other tenants' next sends (below the
    /// slots; none of one slot).
    pub fn spare_slots(&self) -> usize {
        let slots = self.max_concurrent_sends.max(1);
        self.spare_send_slots.unwrap_or(slots / 16).min(slots - 1)
    }
}

/// A place in the queue of deliveries waiting for a send slot, released when
/// the delivery gets its slot or ends (its tenant's share: [`fair`]).
pub struct QueueTicket {
    _place: fair::QueuePlace,
}

/// Runs deliveries for this instance. It reads as five parts: the store
/// side (the rows, who this instance is in leases, the waiters), the call
/// side ([`CallSide`]: whom to call and what may be in flight), this
/// instance's capacity ([`Slots`]: send slots, the queue for one, the
/// tasks), time and shutdown (the clock, the two stop signals, the
/// scheduler's nudge), and its policy and counters.
pub struct Deliverer {
    // The store side.
    store: Arc<dyn Store>,
    /// Who this instance is, in leases.
    owner: String,
    /// Where requests wait for a message's final response.
    hub: Hub,
    // The call side.
    calls: CallSide,
    // Capacity.
    slots: Slots,
    // Time and shutdown.
    clock: Clock,
    /// Cancelled when the shutdown grace period is over: tasks stop where
    /// they are and their leases are released for another instance.
    stop: CancellationToken,
    /// Cancelled when shutdown starts: retry wake-ups are timers, not work,
    /// and live outside the tasks so they never hold shutdown up.
    timers: CancellationToken,
    /// Wakes the scheduler early (a retry is due soon).
    pub(crate) nudge: Arc<Notify>,
    // Policy and counters.
    settings: DeliverySettings,
    metrics: Arc<crate::metrics::Metrics>,
}

/// The call side: the providers in order, their circuits, what opens a
/// sealed body right before a call, and the calls in flight.
struct CallSide {
    /// In order: the first is the primary. Never empty.
    providers: Vec<Arc<dyn Provider>>,
    /// Test mode's provider: the only one a test key's messages (stored
    /// with its name) ever reach, and one no route or failover leads to.
    test: Arc<crate::provider::testmode::TestProvider>,
    /// The same, as the providers are held.
    test_dyn: Arc<dyn Provider>,
    /// Routes by destination: each names some of `providers`, in its own
    /// order. `None`: every message takes `providers` in order.
    routes: Option<destinations::Routes>,
    circuit_policy: CircuitPolicy,
    /// This instance's copy of the circuits shared through the store.
    circuits: std::sync::Mutex<routing::CircuitCache>,
    /// Opens sealed message bodies (verification codes) right before the
    /// provider call; set once by `App::build`.
    sealed: std::sync::OnceLock<Arc<crate::verify::SecretSource>>,
    /// The configured secrets, taken out of every provider answer; set
    /// once by `App::build` (none until then).
    secrets: std::sync::OnceLock<crate::provider::Secrets>,
    /// The price table: a message that moves to another provider is
    /// charged at that one's price; set once by `App::build` (until then
    /// a move keeps the cost).
    prices: std::sync::OnceLock<Arc<crate::spend::Prices>>,
    /// The routes' orders as quality or a pin set them (issue 43); set
    /// once by `App::build` (until then every route its configured order).
    orders: std::sync::OnceLock<Arc<orders::RouteOrders>>,
    /// Provider calls that may be in flight (see [`Deliverer::shutdown`]).
    in_flight: std::sync::Mutex<Calls>,
}

/// This instance's capacity: provider-call slots, the deliveries waiting
/// for one, and the tasks running deliveries.
struct Slots {
    permits: Arc<Semaphore>,
    /// What each tenant holds of the slots and the queue ([`fair`]).
    fair: Arc<fair::Fair>,
    tasks: TaskTracker,
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
            None,
            CircuitPolicy::default(),
            clock,
            settings,
            owner,
        )
    }

    /// A deliverer that sends through `providers` in order (the first is
    /// the primary), or along the route of each message's number when
    /// `routes` are given (they name only `providers`), failing over as
    /// [`route`](route::route) decides. An empty list is one simulated
    /// provider.
    pub fn routed(
        store: Arc<dyn Store>,
        mut providers: Vec<Arc<dyn Provider>>,
        routes: Option<destinations::Routes>,
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
        let test = Arc::new(crate::provider::testmode::TestProvider::default());
        let test_dyn: Arc<dyn Provider> = Arc::clone(&test) as Arc<dyn Provider>;
        Arc::new(Self {
            store,
            owner,
            hub,
            calls: CallSide {
                providers,
                test,
                test_dyn,
                routes,
                circuit_policy,
                circuits: routing::cache(),
                sealed: std::sync::OnceLock::new(),
                secrets: std::sync::OnceLock::new(),
                prices: std::sync::OnceLock::new(),
                orders: std::sync::OnceLock::new(),
                in_flight: std::sync::Mutex::default(),
            },
            slots: Slots {
                permits,
                fair: Arc::default(),
                tasks: TaskTracker::new(),
            },
            clock,
            stop: CancellationToken::new(),
            timers: CancellationToken::new(),
            nudge: Arc::new(Notify::new()),
            settings,
            metrics: Arc::default(),
        })
    }

    /// Where the key to open sealed bodies comes from (verifications).
    pub fn open_sealed_bodies_with(&self, secret: Arc<crate::verify::SecretSource>) {
        let _ = self.calls.sealed.set(secret);
    }

    /// Takes `secrets` out of every provider answer from now on (see
    /// [`SendOutcome::scrubbed`](crate::provider::SendOutcome::scrubbed)).
    pub fn scrub_secrets(&self, secrets: crate::provider::Secrets) {
        let _ = self.calls.secrets.set(secrets);
    }

    /// Prices a message that moves on to another provider with `prices`.
    pub fn price_with(&self, prices: Arc<crate::spend::Prices>) {
        let _ = self.calls.prices.set(prices);
    }

    /// Orders routes by `orders` (quality's shifts, operators' pins).
    pub fn order_routes_with(&self, orders: Arc<orders::RouteOrders>) {
        let _ = self.calls.orders.set(orders);
    }

    /// The routes' orders, when routes are ordered (`App::build`).
    pub fn route_orders(&self) -> Option<&Arc<orders::RouteOrders>> {
        self.calls.orders.get()
    }

    /// The routes by destination, if configured.
    pub fn routes(&self) -> Option<&destinations::Routes> {
        self.calls.routes.as_ref()
    }

    /// What `msg` costs when sent through `provider`, if it has a cost
    /// (`None`: keep the stored one).
    pub(super) fn cost_at(&self, msg: &MessageRecord, provider: &str) -> Option<i64> {
        let prices = self.calls.prices.get()?;
        msg.cost.as_ref()?;
        let phone = msg.to.phone()?;
        let country = crate::domain::phone::parse(phone.as_str()).and_then(|p| p.into_parts().1);
        Some(prices.cost(country.as_deref(), provider, msg.segments))
    }

    /// What verification message `m` costs (issue 41, finding 2): an SMS
    /// at its provider's price, a message of a channel the registry says is
    /// priced only where listed (the Telegram Gateway's) only at a price
    /// row naming its provider (else it costs nothing and is not charged).
    /// `international` is decided by the store, which knows the tenant's
    /// home country. `None`: no price table.
    pub fn verification_cost(&self, m: &crate::store::NewMessage) -> Option<crate::spend::Charge> {
        let prices = self.calls.prices.get()?;
        let phone = m.to.phone()?;
        let country = crate::domain::phone::parse(phone.as_str()).and_then(|p| p.into_parts().1);
        let listed_only = crate::provider::registry::adapter(&m.provider)
            .and_then(|a| a.verify.as_ref())
            .is_some_and(|v| v.priced_when_listed);
        let per = if listed_only {
            prices.listed(country.as_deref(), &m.provider)?
        } else {
            prices
                .per_segment(country.as_deref(), &m.provider)
                .unwrap_or(0)
        };
        Some(crate::spend::Charge {
            micros: per.saturating_mul(i64::from(m.segments)),
            currency: prices.currency().to_string(),
            international: false,
        })
    }

    /// The secrets taken out of provider answers (and receipts).
    pub fn secrets(&self) -> &crate::provider::Secrets {
        static NONE: std::sync::OnceLock<crate::provider::Secrets> = std::sync::OnceLock::new();
        self.calls
            .secrets
            .get()
            .unwrap_or_else(|| NONE.get_or_init(crate::provider::Secrets::default))
    }

    /// `msg`'s text as it was sent (a sealed body opened), to take out of
    /// a receipt that quotes it; `None` if it does not open now.
    pub async fn readable_body(&self, msg: &MessageRecord) -> Option<String> {
        self.outgoing(msg, self.clock.now())
            .await
            .ok()
            .map(|sms| sms.body)
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Where a new message to `to` with this `from` starts: the first
    /// provider of its route (without routes, the primary), and who its
    /// first attempt sends as there. `None`: no route covers `to`.
    ///
    /// An address of a channel of its own (a Telegram chat) starts, and
    /// stays, on that channel's adapter; `None` when none is configured.
    /// Routes and the SMS providers are for numbers only.
    pub fn first_route(&self, to: &str, from: Option<&str>) -> Option<crate::domain::Via> {
        let channel = channel_of(to);
        if channel != SMS {
            let first = self
                .calls
                .providers
                .iter()
                .find(|p| p.channel() == channel)?;
            return Some(crate::domain::Via {
                provider: first.name().to_string(),
                sender: first.sender(from),
                route: None,
                order: None,
            });
        }
        let (route, first, order) = match &self.calls.routes {
            None => (
                None,
                self.calls.providers.iter().find(|p| p.channel() == SMS)?,
                None,
            ),
            Some(routes) => {
                let r = routes.lookup(to)?;
                match self.calls.orders.get() {
                    // The route's order now: quality's, a pin's, and the
                    // measuring floor's turn (issue 43).
                    Some(orders) if r.providers.len() >= 2 => {
                        let order = orders.for_new(r);
                        let first = order.first().and_then(|n| self.provider_named_ref(n))?;
                        (
                            Some(r.prefix.clone()),
                            first,
                            orders::stored_form(r, &order),
                        )
                    }
                    _ => {
                        let first = r
                            .providers
                            .first()
                            .and_then(|n| self.provider_named_ref(n))?;
                        (Some(r.prefix.clone()), first, None)
                    }
                }
            }
        };
        Some(crate::domain::Via {
            provider: first.name().to_string(),
            sender: first.sender(from),
            route,
            order,
        })
    }

    /// Whether a new message to `to` would have somewhere to start
    /// ([`Self::first_route`] without taking a new message's turn of the
    /// route's measuring floor).
    pub fn has_route(&self, to: &str) -> bool {
        let channel = channel_of(to);
        let of_channel = || self.calls.providers.iter().any(|p| p.channel() == channel);
        match &self.calls.routes {
            Some(routes) if channel == SMS => routes.lookup(to).is_some_and(|r| {
                r.providers
                    .iter()
                    .any(|n| self.provider_named_ref(n).is_some())
            }),
            _ => of_channel(),
        }
    }

    /// Where a test key's message starts, and stays: test mode's provider.
    pub fn test_route() -> crate::domain::Via {
        crate::domain::Via {
            provider: crate::provider::testmode::NAME.to_string(),
            sender: None,
            route: None,
            order: None,
        }
    }

    /// Where a verification's message on `channel` to `to` starts, and
    /// stays: for SMS the number's route, for a channel of its own the
    /// adapter the registry says serves it, when it is configured. `None`:
    /// nowhere.
    pub fn channel_route(
        &self,
        channel: crate::domain::Channel,
        to: &str,
    ) -> Option<crate::domain::Via> {
        let Some((adapter, _)) = crate::provider::registry::verify_adapter(channel) else {
            return self.first_route(to, None);
        };
        self.provider_named_ref(adapter.name)?;
        Some(crate::domain::Via {
            provider: adapter.name.to_string(),
            sender: None,
            route: None,
            order: None,
        })
    }

    /// Where a verification's next step on `channel` starts, after a step
    /// on provider `from`: a test-mode verification stays with test mode's
    /// provider, whatever the channel.
    pub fn step_route(
        &self,
        channel: crate::domain::Channel,
        to: &str,
        from: &str,
    ) -> Option<crate::domain::Via> {
        if from == crate::provider::testmode::NAME {
            return Some(Self::test_route());
        }
        self.channel_route(channel, to)
    }

    /// "live" or "test": the metric label of a message on `provider`.
    pub fn mode_of(provider: &str) -> &'static str {
        crate::provider::testmode::mode_of(provider)
    }

    /// The configured provider called `name` (or test mode's).
    pub fn provider(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.provider_named_ref(name).cloned()
    }

    /// Every provider this deliverer sends through (test mode's aside).
    pub fn providers(&self) -> &[Arc<dyn Provider>] {
        &self.calls.providers
    }

    /// Test mode's provider.
    pub fn test_provider(&self) -> &Arc<crate::provider::testmode::TestProvider> {
        &self.calls.test
    }

    /// The provider called `name`: a configured one, or test mode's.
    fn provider_named_ref(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        if name == crate::provider::testmode::NAME {
            return Some(&self.calls.test_dyn);
        }
        self.calls.providers.iter().find(|p| p.name() == name)
    }

    /// The providers `msg` may use, in order: its route's (the stored one,
    /// else the one its number takes now), without routes all of them.
    pub(super) fn providers_of(&self, msg: &MessageRecord) -> Vec<&Arc<dyn Provider>> {
        // A test-mode message stays with test mode's provider.
        if msg.provider == crate::provider::testmode::NAME {
            return vec![&self.calls.test_dyn];
        }
        // A message on a provider of a channel of its own that its address
        // is not of (a code to a number through the Telegram Gateway) stays
        // with it: no SMS provider is its failover (the verification's
        // next channel is a message of its own).
        if let Some(own) = self.provider_named_ref(&msg.provider)
            && own.channel() != msg.to.channel()
        {
            return vec![own];
        }
        let channel = msg.to.channel();
        let of_channel = || {
            self.calls
                .providers
                .iter()
                .filter(|p| p.channel() == channel)
                .collect()
        };
        if channel != SMS {
            return of_channel();
        }
        let Some(routes) = &self.calls.routes else {
            return of_channel();
        };
        let route = msg
            .route
            .as_deref()
            .and_then(|p| routes.get(p))
            .or_else(|| routes.lookup(msg.to.as_str()));
        let Some(r) = route else {
            return of_channel();
        };
        // The order it was created with, when not the configured one (a
        // quality shift, the measuring floor, a pin): only the route's
        // providers, each once.
        if let Some(order) = msg.route_order.as_deref() {
            let named: Vec<&str> = quality::effective(
                &r.providers,
                Some(&order.split(',').map(str::to_string).collect::<Vec<_>>()),
            )
            .into_iter()
            .filter_map(|n| r.providers.iter().copied().find(|p| *p == n))
            .collect();
            return named
                .into_iter()
                .filter_map(|n| self.provider_named_ref(n))
                .collect();
        }
        r.providers
            .iter()
            .filter_map(|n| self.provider_named_ref(n))
            .collect()
    }

    /// The configured providers' names, in order.
    pub fn provider_names(&self) -> Vec<&'static str> {
        self.calls.providers.iter().map(|p| p.name()).collect()
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
        self.slots.permits.available_permits()
    }

    /// Deliveries running in this instance.
    pub fn in_flight(&self) -> usize {
        self.hub.len()
    }

    /// Waits until a provider-call slot the scheduler may claim for is free
    /// (more than the spare ones, [`DeliverySettings::spare_slots`]) and
    /// leaves it free; false once shutdown stopped the wait.
    pub async fn slot_freed(&self) -> bool {
        self.slots
            .fair
            .wait_free(&self.slots.permits, self.settings.spare_slots(), &self.stop)
            .await
    }

    /// Free slots the scheduler may claim for now: the spare ones stay for
    /// a tenant's next new send ([`fair`]), so a batch or a burst of
    /// retries of one tenant does not take every slot either.
    pub fn claimable_permits(&self) -> usize {
        self.free_permits()
            .saturating_sub(self.settings.spare_slots())
    }

    /// A free provider-call slot, if there is one now. The scheduler takes
    /// its slots before it claims, so no claimed message waits leased for one.
    pub fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots.permits).try_acquire_owned().ok()
    }

    /// Starts delivering a message just inserted with its first attempt
    /// started under `lease`.
    pub fn spawn(self: &Arc<Self>, msg: MessageRecord, lease: Lease) {
        self.spawn_run(msg, lease, Start::Fresh, None, None);
    }

    /// Starts delivering a new message with its place in the send queue
    /// (see [`Deliverer::reserve`]), given up when it gets a send slot.
    pub fn spawn_queued(
        self: &Arc<Self>,
        msg: MessageRecord,
        lease: Lease,
        ticket: Option<QueueTicket>,
    ) {
        self.spawn_run(msg, lease, Start::Fresh, None, ticket);
    }

    /// Resumes a claimed message with the send slot taken for it; `start`
    /// says whether it was due or taken over from an expired lease.
    pub fn spawn_with_permit(
        self: &Arc<Self>,
        msg: MessageRecord,
        lease: Lease,
        start: Start,
        permit: OwnedSemaphorePermit,
    ) {
        self.spawn_run(msg, lease, start, Some(permit), None);
    }

    fn spawn_run(
        self: &Arc<Self>,
        msg: MessageRecord,
        lease: Lease,
        start: Start,
        permit: Option<OwnedSemaphorePermit>,
        ticket: Option<QueueTicket>,
    ) {
        let registration = self.hub.register(msg.id);
        let this = Arc::clone(self);
        let span = tracing::info_span!("deliver", message_id = %msg.id, attempt = msg.attempts);
        let tenant = msg.tenant_id;
        self.slots.tasks.spawn(async move {
            // A slot taken for it (the scheduler's) counts against its
            // tenant; else it waits for one within its tenant's share.
            let (permit, _holding) = match permit {
                Some(p) => (Some(p), Some(this.slots.fair.hold(tenant))),
                None => match this
                    .slots
                    .fair
                    .take_slot(
                        tenant,
                        &this.slots.permits,
                        (
                            this.settings.max_concurrent_sends.max(1),
                            this.settings.spare_slots(),
                        ),
                        &this.stop,
                    )
                    .await
                {
                    Some((p, holding)) => (Some(p), Some(holding)),
                    None => (None, None),
                },
            };
            // Out of the queue: sending, or stopped.
            drop(ticket);
            // Boxed: a delivery's future, with every provider's call in
            // it, is large, and tokio moves a task's future by value when
            // it spawns and finishes it (a ninth of a send's instructions
            // were those copies: BENCHMARKS.md, "Instructions per send").
            let _ = tracing::Instrument::instrument(
                Box::pin(this.deliver(msg, lease, start, permit, &registration)),
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
    /// for `tenant`'s message about to be inserted; `None` when the queue
    /// is full ([`DeliverySettings::max_queued_sends`]) or the tenant holds
    /// its share of it ([`fair::may_queue`]).
    pub fn reserve(&self, tenant: uuid::Uuid) -> Option<QueueTicket> {
        let place = self
            .slots
            .fair
            .reserve(tenant, self.settings.max_queued_sends)?;
        Some(QueueTicket { _place: place })
    }

    /// Deliveries waiting for a send slot now.
    pub fn queued(&self) -> usize {
        self.slots.fair.queued()
    }

    /// Slots taken and given back outside a delivery (the scheduler's
    /// left-overs): deliveries waiting for one look again.
    pub fn slots_returned(&self) {
        self.slots.fair.changed();
    }

    /// Stops accepting work and waits until `deadline` for provider calls
    /// in flight; then stops the rest where they are. What never reached a
    /// provider call is released so another instance resumes it at once; a
    /// call cut off mid-flight keeps its lease for the provider timeout (the
    /// provider may still be acting on it: issue 24, finding 1), and its
    /// next owner waits that out again before asking. Retry wake-ups are
    /// dropped at once: the row holds the due time.
    pub async fn shutdown(&self, deadline: Instant) -> Result<u64, StoreError> {
        self.slots.tasks.close();
        self.timers.cancel();
        if tokio::time::timeout_at(deadline, self.slots.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = self.in_flight(),
                "grace period over: stopping deliveries; calls cut off keep their leases"
            );
        }
        self.cut_off_calls();
        self.stop.cancel();
        // Tasks stop at their next await point; none holds us for long.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.slots.tasks.wait()).await;
        let cut_off = self.held_calls();
        crate::failpoint::hit("shutdown.before_release");
        let released = self
            .store
            .release_leases(
                &self.owner,
                self.clock.now(),
                &cut_off,
                self.settings.provider_timeout,
            )
            .await;
        crate::failpoint::hit("shutdown.after_release");
        if !cut_off.is_empty() {
            tracing::warn!(
                cut_off = cut_off.len(),
                "provider calls cut off: their messages are resumed once the provider timeout has passed"
            );
        }
        released
    }

    /// Stops every task without releasing anything, as a crash would (tests).
    pub async fn halt(&self) {
        self.slots.tasks.close();
        self.timers.cancel();
        self.stop.cancel();
        self.slots.tasks.wait().await;
    }

    /// One run of a delivery (at most one provider attempt), logged and
    /// counted once.
    pub async fn deliver(
        &self,
        msg: MessageRecord,
        lease: Lease,
        start: Start,
        permit: Option<OwnedSemaphorePermit>,
        registration: &hub::Registration,
    ) -> Report {
        let mode = crate::provider::testmode::mode_of(&msg.provider);
        let report = self.run(msg, lease, start, permit, registration).await;
        self.record(&report, mode);
        report
    }
}

/// The provider calls of this instance that may be in flight.
#[derive(Default)]
struct Calls {
    /// Set once shutdown has cut calls off: none may start after.
    stopping: bool,
    in_flight: std::collections::HashSet<MessageId>,
    /// Once stopping: the messages whose leases a shutdown holds.
    held: std::collections::HashSet<MessageId>,
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

/// The SMS channel's name (`Recipient::channel`, `Provider::channel`).
const SMS: &str = "sms";

/// The channel of a stored address (`to_number`): a number's is SMS.
fn channel_of(to: &str) -> &'static str {
    crate::domain::Recipient::from_stored(to, crate::provider::registry::chat_channels())
        .map_or(SMS, |r| r.channel())
}
