//! The SQLite store: the embedded default, for one instance.
//!
//! Same semantics as Postgres, different means. SQLite has one writer at a
//! time, so multi-row changes are `BEGIN IMMEDIATE` transactions (they take
//! the write lock up front and never fail half-way on a lock upgrade), and
//! claiming due rows needs no `SKIP LOCKED`: the write lock already hands
//! each row to one claimer. WAL mode lets readers (replays, GETs) run beside
//! the writer; a busy timeout makes writers queue instead of failing. Times
//! are stored as integer microseconds since the epoch so that comparisons
//! are numeric ([`DbTime`](crate::store::time::DbTime)). One file per kind
//! of record, as the traits are split.

use std::str::FromStr;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::{SqlxResultExt, StoreError};

mod maintenance;
mod messages;
mod opt_outs;
mod receipts;
mod tenants;
mod verifications;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path`).
    pub fn connect_lazy(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(StoreError::Other)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // WAL + NORMAL: a commit survives a process crash; only an OS
            // crash or power loss can lose the last transactions.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(acquire_timeout)
            .connect_lazy_with(options);
        Ok(Self { pool })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A write transaction that holds the write lock from its first statement.
    async fn begin(&self) -> Result<Tx, StoreError> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.store_err()
    }
}

type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;
