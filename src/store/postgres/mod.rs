//! The Postgres store.
//!
//! Plain `sqlx::query` with bound parameters (no compile-time checked macros,
//! so building needs no database). Multi-row changes that must happen
//! together are single statements with data-modifying CTEs: one round trip,
//! one commit, atomic. One file per kind of record, as the traits are split.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::StoreError;

mod maintenance;
mod messages;
mod opt_outs;
mod receipts;
mod tenants;
mod verifications;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub max_connections: u32,
    /// How long a request waits for a connection before the database is
    /// called unavailable (503): short, so an outage fails fast.
    pub acquire_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Builds a lazily connecting pool: the service starts (and answers 503)
    /// even while the database is down, and recovers when it returns.
    pub fn connect_lazy(url: &str, settings: &PoolSettings) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse().map_err(StoreError::Other)?;
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .min_connections(0)
            .acquire_timeout(settings.acquire_timeout)
            // Checking each connection before use costs a round trip per
            // query; a broken connection is discarded on its first error instead.
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Ok(Self { pool })
    }

    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// A count or number as Postgres `integer`.
fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
