//! Building and running the service. The caller hands in the listener, the
//! store, the provider, the clock and a shutdown signal: no global state, so
//! tests run several instances in one process.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cache::{KeyCache, ReplayCache, Waiters};
use crate::clock::Clock;
use crate::config::Settings;
use crate::delivery::{Deliverer, Purger, Scheduler};
use crate::http::{self, AppState};
use crate::notify::Notifier;
use crate::provider::Provider;
use crate::ratelimit::RateLimiter;
use crate::store::{Store, StoreError};

/// A built, not yet running, instance.
pub struct App {
    listener: TcpListener,
    /// Serves `GET /metrics` instead of `listener` when set.
    metrics_listener: Option<TcpListener>,
    state: Arc<AppState>,
    scheduler: Arc<Scheduler>,
    settings: Settings,
    clock: Clock,
    notifier: Notifier,
    webhooks: Arc<crate::webhooks::Dispatcher>,
}

/// What tests and operators can reach in a running instance.
#[derive(Clone)]
pub struct Handle {
    pub addr: SocketAddr,
    /// The separate metrics listener's address, if there is one.
    pub metrics_addr: Option<SocketAddr>,
    pub deliverer: Arc<Deliverer>,
    pub scheduler: Arc<Scheduler>,
    pub store: Arc<dyn Store>,
    /// This instance's change notifications.
    pub notifier: Notifier,
    pub keys: Arc<KeyCache>,
    pub replays: Arc<ReplayCache>,
    pub waiters: Arc<Waiters>,
    /// This instance's webhook deliveries.
    pub webhooks: Arc<crate::webhooks::Dispatcher>,
    /// Routes' quality: a test runs its beat with `evaluate`.
    pub quality: Arc<crate::delivery::route_quality::RouteQuality>,
}

impl App {
    pub fn build(
        settings: Settings,
        store: Arc<dyn Store>,
        provider: Arc<dyn Provider>,
        clock: Clock,
        listener: TcpListener,
    ) -> std::io::Result<App> {
        Self::build_routed(settings, store, vec![provider], clock, listener)
    }

    /// An instance that sends through `providers` in order (the first is
    /// the primary), with the circuit policy of `settings.provider`.
    pub fn build_routed(
        settings: Settings,
        store: Arc<dyn Store>,
        providers: Vec<Arc<dyn Provider>>,
        clock: Clock,
        listener: TcpListener,
    ) -> std::io::Result<App> {
        for warning in settings.warnings() {
            tracing::warn!("{warning}");
        }
        let owner = instance_id();
        let webhooks = Arc::new(
            crate::webhooks::Dispatcher::new(
                Arc::clone(&store),
                clock.clone(),
                settings.webhooks.clone(),
                owner.clone(),
            )
            .map_err(std::io::Error::other)?,
        );
        let deliverer = Deliverer::routed(
            Arc::clone(&store),
            providers,
            settings.provider.routes.clone(),
            settings.provider.circuit.clone(),
            clock.clone(),
            settings.delivery.clone(),
            owner,
        );
        // A slow test-mode number outlasts the instance's default wait.
        deliverer
            .test_provider()
            .set_sync_wait(settings.server.wait.default);
        let secret = Arc::new(crate::verify::SecretSource::new(
            settings.verify.secret.as_ref().map(|s| s.0.clone()),
            Arc::clone(&store),
        ));
        deliverer.open_sealed_bodies_with(Arc::clone(&secret));
        deliverer.scrub_secrets(settings.provider.secrets.clone());
        deliverer.price_with(Arc::clone(&settings.prices));
        let q = &settings.provider.quality;
        let orders = Arc::new(crate::delivery::orders::RouteOrders::new(
            settings.provider.routes.as_ref(),
            q.on,
            q.thresholds.floor,
        ));
        deliverer.order_routes_with(Arc::clone(&orders));
        let quality = Arc::new(crate::delivery::route_quality::RouteQuality {
            store: Arc::clone(&store),
            deliverer: Arc::clone(&deliverer),
            orders,
            clock: clock.clone(),
            settings: q.clone(),
        });
        let verify = Arc::new(crate::verify::Verifier {
            settings: settings.verify.clone(),
            secret,
            number_per_hour: settings.limits.rates.number.per_hour(),
            prefix_per_hour: settings.verify.starts_per_prefix_per_hour,
        });
        let scheduler = Arc::new(Scheduler::new(
            Arc::clone(&store),
            Arc::clone(&deliverer),
            settings.scheduler.poll_interval,
        ));
        crate::domain::phone::warm();
        if let Some(sizes) = store.batch_sizes() {
            deliverer.metrics().attach_batch_sizes(sizes);
        }
        let notifier = Notifier::local();
        // Without a notification channel (SQLite: the CLI that revokes keys
        // is another process) keys are not cached, so a revocation still
        // takes effect at once.
        let mut key_cache = settings.caches.clone();
        if !store.announces_changes() {
            key_cache.key_ttl = std::time::Duration::ZERO;
        }
        let replays = ReplayCache::new(
            notifier.clone(),
            settings.caches.replay_entries,
            settings.retention.period,
        );
        let waiters = Waiters::new(settings.caches.max_waiters_per_tenant);
        let limiter = Arc::new(RateLimiter::new(settings.limits.rates, clock.clone()));
        let sends = crate::send::Sends::new(
            Arc::clone(&store),
            Arc::clone(&deliverer),
            Arc::clone(&limiter),
            Arc::clone(&replays),
            Arc::clone(&waiters),
            clock.clone(),
            (settings.limits.max_segments, Arc::clone(&settings.prices)),
        );
        let state = Arc::new(AppState {
            keys: KeyCache::new(notifier.clone(), key_cache),
            replays,
            waiters,
            sends,
            store,
            clock: clock.clone(),
            metrics: Arc::clone(deliverer.metrics()),
            deliverer,
            wait: settings.server.wait.clone(),
            limiter,
            body_read_timeout: settings.server.body_read_timeout,
            receipts: http::receipts::ReceiptSettings {
                public_url: settings.server.public_url.clone(),
                routes: settings.provider.receipts.clone(),
            },
            inbound: settings.provider.inbound.clone(),
            verify,
            webhooks: settings.webhooks.clone(),
            webhook_dispatcher: Arc::clone(&webhooks),
            quality,
        });
        Ok(App {
            listener,
            metrics_listener: None,
            state,
            notifier,
            scheduler,
            settings,
            clock,
            webhooks,
        })
    }

    /// Serves `GET /metrics` on `listener` only (the API listener then has
    /// no `/metrics`).
    pub fn with_metrics_listener(mut self, listener: TcpListener) -> Self {
        self.metrics_listener = Some(listener);
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn handle(&self) -> std::io::Result<Handle> {
        Ok(Handle {
            addr: self.local_addr()?,
            metrics_addr: self
                .metrics_listener
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()?,
            deliverer: Arc::clone(&self.state.deliverer),
            scheduler: Arc::clone(&self.scheduler),
            store: Arc::clone(&self.state.store),
            notifier: self.notifier.clone(),
            keys: Arc::clone(&self.state.keys),
            replays: Arc::clone(&self.state.replays),
            waiters: Arc::clone(&self.state.waiters),
            webhooks: Arc::clone(&self.webhooks),
            quality: Arc::clone(&self.state.quality),
        })
    }

    /// Serves until `shutdown` resolves, then drains: stops accepting, lets
    /// open requests and in-flight sends finish before one deadline (the
    /// signal plus the grace period), releases the leases of the rest, and
    /// returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StoreError> {
        let stop = CancellationToken::new();
        let listen_task = self
            .state
            .store
            .change_feed(self.notifier.clone(), stop.clone())
            .map(tokio::spawn);
        let deliverer = Arc::clone(&self.state.deliverer);
        // What providers keep running (SMPP's sessions) starts first and
        // stops last, once the sends have drained.
        let providers_stop = CancellationToken::new();
        let runtime = crate::provider::ProviderRuntime {
            stop: providers_stop.clone(),
            receipts: Arc::new(http::receipts::StoreReceipts {
                store: Arc::clone(&self.state.store),
                deliverer: Arc::downgrade(&self.state.deliverer),
                clock: self.clock.clone(),
                metrics: Arc::clone(self.state.deliverer.metrics()),
            }),
        };
        let provider_tasks: Vec<_> = deliverer
            .providers()
            .iter()
            .filter_map(|p| p.start(runtime.clone()))
            .collect();
        // Test mode's provider takes the receipt handling too (it keeps
        // nothing running).
        let _ = deliverer.test_provider().start(runtime.clone());
        let scheduler = Arc::clone(&self.scheduler);
        let scheduler_stop = stop.clone();
        let scheduler_task = tokio::spawn(async move { scheduler.run(scheduler_stop).await });
        let purger = Purger::new(
            Arc::clone(&self.state.store),
            self.clock.clone(),
            self.settings.retention.period,
            self.settings.retention.purge_interval,
        )
        .with_metrics(Arc::clone(self.state.deliverer.metrics()))
        .with_notifier(self.notifier.clone());
        let purge_task = tokio::spawn(purger.run(stop.clone()));
        let upkeep = Arc::clone(self.state.deliverer.metrics()).run_upkeep(stop.clone());
        let upkeep_task = tokio::spawn(upkeep);
        let webhooks_task = tokio::spawn(Arc::clone(&self.webhooks).run(stop.clone()));
        // Routes' orders follow measured quality, off the send path.
        let quality_task = tokio::spawn(Arc::clone(&self.state.quality).run(stop.clone()));
        // Verifications run out on the scheduler's beat.
        let expiry_task = tokio::spawn(
            crate::verify::expiry::Expirer::new(
                Arc::clone(&self.state.store),
                self.clock.clone(),
                Arc::clone(self.state.deliverer.metrics()),
                self.settings.scheduler.poll_interval,
            )
            .run(stop.clone()),
        );

        // A verification's next channel goes on the same beat.
        let fallback_task = tokio::spawn(
            crate::delivery::fallback::Fallbacks {
                store: Arc::clone(&self.state.store),
                deliverer: Arc::clone(&self.state.deliverer),
                secret: Arc::clone(&self.state.verify.secret),
                receipts: Arc::clone(&runtime.receipts),
                clock: self.clock.clone(),
                interval: self.settings.scheduler.poll_interval,
            }
            .run(stop.clone()),
        );

        // Receipts an instance that stopped left unlinked, on the same beat.
        let orphans_task = tokio::spawn(
            crate::delivery::orphans::Orphans {
                store: Arc::clone(&self.state.store),
                clock: self.clock.clone(),
                interval: self.settings.scheduler.poll_interval,
                window: crate::delivery::orphans::Orphans::window_for(
                    self.settings.delivery.retry.deadline,
                ),
            }
            .run(stop.clone()),
        );

        let router = http::router_with(
            Arc::clone(&self.state),
            crate::console::router(Arc::clone(&self.state)),
            self.metrics_listener.is_none(),
        );
        let metrics_task = self.metrics_listener.map(|listener| {
            tokio::spawn(http::server::serve(
                listener,
                http::metrics_router(Arc::clone(&self.state)),
                self.settings.server.connection,
                stop.clone(),
            ))
        });
        let signalled = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            signalled.cancel();
        });
        let server = http::server::serve(
            self.listener,
            router,
            self.settings.server.connection,
            stop.clone(),
        );
        // One deadline, fixed when the signal arrives, bounds the whole
        // drain: requests still waiting for an outcome and provider calls in
        // flight share it (their sends go on regardless of the requests).
        let grace = self.settings.server.shutdown_grace;
        tokio::pin!(server);
        let deadline = tokio::select! {
            () = &mut server => tokio::time::Instant::now() + grace,
            () = stop.cancelled() => {
                let deadline = tokio::time::Instant::now() + grace;
                if tokio::time::timeout_at(deadline, &mut server).await.is_err() {
                    tracing::warn!("grace period over with requests still open");
                }
                deadline
            }
        };
        stop.cancel();
        let _ = scheduler_task.await;
        let _ = purge_task.await;
        let _ = upkeep_task.await;
        let _ = webhooks_task.await;
        let _ = quality_task.await;
        let _ = expiry_task.await;
        let _ = fallback_task.await;
        let _ = orphans_task.await;
        if let Some(task) = metrics_task {
            let _ = task.await;
        }
        if let Some(task) = listen_task {
            let _ = task.await;
        }
        let released = deliverer.shutdown(deadline).await;
        providers_stop.cancel();
        for task in provider_tasks {
            let _ = task.await;
        }
        let released = released?;
        if released > 0 {
            tracing::info!(released, "released leases for another instance to resume");
        }
        Ok(())
    }
}

/// Names this process in leases: host, pid and a random part, so a restarted
/// process is never mistaken for its predecessor.
pub fn instance_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "sendonce".into());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}/{}/{}", std::process::id(), &random[..8])
}
