//! The SQLite store: the embedded default, for one instance.
//!
//! Same semantics as Postgres, different means. SQLite has one writer at a
//! time, so this process has one too: every write goes to the single writer
//! task ([`writer`]), which commits whatever writes are waiting as one
//! `BEGIN IMMEDIATE` transaction (group commit, `synchronous=FULL`) and
//! answers each caller after the commit. Claiming due rows needs no
//! `SKIP LOCKED`: the writer hands each row to one claimer. Reads (replays,
//! GETs, authentication) use a pool of their own beside it (WAL mode), so
//! they never queue behind writes. A busy timeout remains for a second
//! process on the same file, which stays safe (the file lock still decides)
//! but then waits for the lock. Times are stored as integer microseconds
//! since the epoch so that comparisons are numeric
//! ([`DbTime`](crate::store::time::DbTime)). One file per kind of record, as
//! the traits are split.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, SqliteConnection, SqlitePool};
use tokio::sync::{OnceCell, mpsc};

use super::{SqlxResultExt, StoreError};
use crate::metrics::BatchSizes;

/// The database's clock in the time columns' format (microseconds since the
/// epoch), for lease expiry. SQLite has no server: this is the operating
/// system clock of the one host whose processes share the file (SQLite's
/// locking needs them on one host), read at each statement, never an
/// instance's injectable [`crate::clock::Clock`]. `'subsec'` reads it to the
/// millisecond.
macro_rules! db_now {
    () => {
        "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"
    };
}

mod campaigns;
mod maintenance;
mod messages;
mod receipts;
mod tenants;
mod verifications;
mod webhooks;
mod writer;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Readers (and migrations, run before any write).
    pool: SqlitePool,
    /// How the writer's connection is opened.
    write_options: SqliteConnectOptions,
    /// The writer's queue, started with the first write.
    writer: Arc<OnceCell<mpsc::Sender<writer::Job>>>,
    /// Jobs per group commit (`/metrics`).
    sizes: Arc<BatchSizes>,
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
            // WAL + FULL: a commit is on disk (fsync of the WAL) before any
            // caller is told, so no acknowledged write is lost even on power
            // failure. Group commit pays that once per group.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        // Checkpoints are the writer's, between groups, never a commit's.
        let write_options = options.clone().pragma("wal_autocheckpoint", "0");
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(acquire_timeout)
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            write_options,
            writer: Arc::default(),
            sizes: Arc::default(),
        })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Runs `f` on the writer's connection in its next group commit and
    /// returns its result once that commit is durable. `f` runs inside a
    /// transaction (and a savepoint of its own): it must not begin or end
    /// one. Once handed over, the write happens even if the caller goes away.
    pub(crate) async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> writer::BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        self.write_headed(move |c, savepoint| {
            Box::pin(async move {
                savepoint.open(c).await?;
                f(c).await
            })
        })
        .await
    }

    /// [`write`](Self::write) for a write whose first query carries its
    /// savepoint's statements (one round trip fewer): `f` must run
    /// `savepoint.head(&QUERY)` before anything else, as the first query it
    /// sends, `QUERY` made with [`writer::headed!`].
    pub(crate) async fn write_headed<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(
                &'c mut SqliteConnection,
                writer::Savepoint,
            ) -> writer::BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        let queue = self
            .writer
            .get_or_try_init(|| async {
                let conn = self.write_options.connect().await.store_err()?;
                let (tx, rx) = mpsc::channel(writer::QUEUE);
                writer::start(conn, rx, Arc::clone(&self.sizes))?;
                Ok::<_, StoreError>(tx)
            })
            .await?;
        let (job, answer) = writer::job(f);
        queue.send(job).await.map_err(|_| writer_stopped())?;
        let value = answer.await.map_err(|_| writer_stopped())??;
        value
            .downcast::<T>()
            .map(|v| *v)
            .map_err(|_| StoreError::Invariant("the SQLite writer answered with another type"))
    }

    /// [`write`](Self::write): every write is in the writer's transaction
    /// already (the Postgres store begins one here).
    pub(crate) async fn write_tx<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> writer::BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        self.write(f).await
    }
}

/// What a caller sees when the writer dropped its job (it logged why).
fn writer_stopped() -> StoreError {
    StoreError::Unavailable(sqlx::Error::WorkerCrashed)
}
