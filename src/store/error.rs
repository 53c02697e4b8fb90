//! What went wrong talking to the database, decided once for both backends.

use sqlx::error::{DatabaseError, ErrorKind};

/// What went wrong talking to the database. Every variant that comes from the
/// driver keeps the driver's error as its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached (down, restarting, pool exhausted,
    /// busy): the request may be retried later.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A uniqueness rule refused the write.
    #[error("conflict on {}: {source}", constraint.as_deref().unwrap_or("a unique constraint"))]
    Conflict {
        /// The constraint's name, when the database reports it (Postgres does).
        constraint: Option<String>,
        #[source]
        source: sqlx::Error,
    },
    /// A migration could not be applied (other than the database being away).
    /// (Shown bare: the caller says it was migrating.)
    #[error("{0}")]
    Migration(#[source] sqlx::migrate::MigrateError),
    /// Anything else from the driver: a bug or a schema mismatch.
    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
    /// The database answered, but not as the store expects (a broken invariant).
    #[error("unexpected database state: {0}")]
    Invariant(&'static str),
    /// A capped send's charge would pass this cap: its transaction is
    /// rolled back (the store answers `Charged::Refused`).
    #[error("the {} spend cap is reached", .0.as_str())]
    SpendCap(crate::spend::Cap),
}

impl StoreError {
    /// Maps a driver error to what the service can do about it.
    pub fn from_sqlx(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            // A connection cut mid-conversation surfaces as a protocol error.
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e),
            sqlx::Error::Database(db) => {
                if db.kind() == ErrorKind::UniqueViolation {
                    let constraint = db.constraint().map(str::to_string);
                    StoreError::Conflict {
                        constraint,
                        source: e,
                    }
                } else if is_unavailable(db.as_ref()) {
                    StoreError::Unavailable(e)
                } else {
                    StoreError::Other(e)
                }
            }
            _ => StoreError::Other(e),
        }
    }

    /// Maps a migration error: a database that cannot be reached stays
    /// `Unavailable`, everything else is a `Migration` failure.
    pub fn from_migrate(e: sqlx::migrate::MigrateError) -> Self {
        match e {
            sqlx::migrate::MigrateError::Execute(inner) => Self::from_sqlx(inner),
            other => StoreError::Migration(other),
        }
    }
}

/// Whether a database's own error says "not now" rather than "never".
fn is_unavailable(db: &dyn DatabaseError) -> bool {
    let Some(code) = db.code() else {
        return false;
    };
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // Primary result codes (the low byte of extended ones): SQLITE_BUSY,
        // SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN.
        return code
            .parse::<i32>()
            .is_ok_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13 | 14));
    }
    // Postgres SQLSTATE: connection exceptions, admin shutdown / crash /
    // starting up, too many connections; a write reaching a server that was
    // demoted to a standby in a failover (read_only_sql_transaction).
    code.starts_with("08") || code.starts_with("57P") || code == "53300" || code == "25006"
}

/// Turns a driver result into a store result: the one place errors are mapped.
pub trait SqlxResultExt<T> {
    fn store_err(self) -> Result<T, StoreError>;
}

impl<T> SqlxResultExt<T> for Result<T, sqlx::Error> {
    fn store_err(self) -> Result<T, StoreError> {
        self.map_err(StoreError::from_sqlx)
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::from_sqlx(e)
    }
}
