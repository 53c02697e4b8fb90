//! The Postgres store.
//!
//! Plain `sqlx::query` with bound parameters (no compile-time checked macros,
//! so building needs no database). Multi-row changes that must happen
//! together are single statements with data-modifying CTEs: one round trip,
//! one commit, atomic. One file per kind of record, as the traits are split.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

use super::StoreError;
use super::shared::BoxFuture;
use crate::config::Pooler;
use crate::metrics::BatchSizes;

mod batch;
mod campaigns;
pub mod connect;
mod lanes;
mod maintenance;
mod messages;
mod receipts;
mod tenants;
mod verifications;
mod webhooks;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub max_connections: u32,
    /// How long a request waits for a connection before the database is
    /// called unavailable (503): short, so an outage fails fast.
    pub acquire_timeout: Duration,
}

#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// Rows per coalesced write, for `/metrics`.
    sizes: Arc<BatchSizes>,
    /// The coalesced writes (`batch.rs`), started on first use so that
    /// building a store needs no runtime.
    lanes: Arc<OnceLock<batch::Lanes>>,
    /// The hosts `DATABASE_URL` names and which one is in use; `None` for a
    /// pool built elsewhere.
    hosts: Option<Arc<connect::HostState>>,
    /// Direct connections for what lives in a session (LISTEN, the
    /// migrations' advisory lock, acknowledgements), when a direct URL was
    /// given (a transaction pooler needs one); `None`: `pool` does it all.
    direct: Option<PgPool>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Builds a lazily connecting pool: the service starts (and answers 503)
    /// even while the database is down, and recovers when it returns.
    ///
    /// `url` may name several hosts (see [`connect`]); the pool then only
    /// keeps connections to the writable one, and a monitor task (started
    /// here, so call this inside a Tokio runtime) follows a failover.
    pub fn connect_lazy(url: &str, settings: &PoolSettings) -> Result<Self, StoreError> {
        let targets = connect::Targets::parse(url).map_err(StoreError::Other)?;
        Ok(Self::connect_lazy_to(targets, settings))
    }

    /// [`connect_lazy`](Self::connect_lazy) to hosts given one by one.
    pub fn connect_lazy_to(targets: connect::Targets, settings: &PoolSettings) -> Self {
        let (pool, hosts) = lazy_pool(targets, settings);
        Self {
            pool,
            sizes: Arc::default(),
            lanes: Arc::default(),
            hosts: Some(hosts),
            direct: None,
        }
    }

    /// [`connect_lazy`](Self::connect_lazy) through a connection pooler at
    /// `url`. With [`Pooler::Transaction`] nothing that lives in a session
    /// goes through it: LISTEN, the migrations (their advisory lock) and
    /// the acknowledgements of tenant changes use `direct_url` (which may
    /// name several hosts too), and the pooled connections send no
    /// startup parameter a pooler does not know (`extra_float_digits`).
    /// Statements stay named and cached per connection: this needs a
    /// pooler that keeps protocol-level prepared statements apart per
    /// client (PgBouncer 1.21 or later with `max_prepared_statements` > 0;
    /// docs/high-availability.md, "Behind a connection pooler").
    pub fn connect_lazy_via(
        url: &str,
        pooler: Pooler,
        direct_url: Option<&str>,
        settings: &PoolSettings,
    ) -> Result<Self, StoreError> {
        let mut targets = connect::Targets::parse(url).map_err(StoreError::Other)?;
        if pooler == Pooler::Transaction {
            for host in &mut targets.hosts {
                *host = host.clone().extra_float_digits(None);
            }
        }
        let mut store = Self::connect_lazy_to(targets, settings);
        if let Some(direct_url) = direct_url {
            let targets = connect::Targets::parse(direct_url).map_err(StoreError::Other)?;
            let settings = PoolSettings {
                max_connections: settings.max_connections.min(DIRECT_CONNECTIONS),
                acquire_timeout: settings.acquire_timeout,
            };
            store.direct = Some(lazy_pool(targets, &settings).0);
        }
        Ok(store)
    }

    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool,
            sizes: Arc::default(),
            lanes: Arc::default(),
            hosts: None,
            direct: None,
        }
    }

    /// Where session state may live: the direct pool if there is one.
    fn session_pool(&self) -> &PgPool {
        self.direct.as_ref().unwrap_or(&self.pool)
    }

    fn lanes(&self) -> &batch::Lanes {
        self.lanes.get_or_init(|| batch::Lanes::start(self))
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs `f` on a pooled connection, outside a transaction: for one
    /// statement (it commits on its own). The shape of
    /// [`SqliteStore::write`](crate::store::SqliteStore), so the shared
    /// code (`store/shared`) writes one closure for both.
    pub(crate) async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        let mut conn = self.pool.acquire().await?;
        f(&mut conn).await
    }

    /// Runs `f` in a transaction, committed when it returns `Ok` (rolled
    /// back when it fails).
    pub(crate) async fn write_tx<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        let mut tx = self.pool.begin().await?;
        let value = f(&mut tx).await?;
        tx.commit().await?;
        Ok(value)
    }
}

/// The most direct connections an instance opens beside its pool: they
/// only carry migrations and the acknowledgements of tenant changes (the
/// listener has a connection of its own).
const DIRECT_CONNECTIONS: u32 = 4;

/// A lazily connecting pool that follows the writable one of `targets`.
fn lazy_pool(
    targets: connect::Targets,
    settings: &PoolSettings,
) -> (PgPool, Arc<connect::HostState>) {
    let hosts = Arc::new(connect::HostState::new(targets));
    let options = hosts.current_options().clone();
    let pool_options = PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .min_connections(0)
        .acquire_timeout(settings.acquire_timeout)
        // Checking each connection before use costs a round trip per
        // query; a broken connection is discarded on its first error instead.
        .test_before_acquire(false);
    let pool = connect::hook(pool_options, &hosts).connect_lazy_with(options);
    connect::spawn_monitor(
        &pool,
        &hosts,
        settings.acquire_timeout.max(connect::PROBE_TIMEOUT),
    );
    (pool, hosts)
}

/// A count or number as Postgres `integer`.
fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
