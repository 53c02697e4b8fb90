//! The store's logic and SQL, written once for both backends (issue 25).
//!
//! Each file here holds one kind of record's statements and trait
//! implementation inside [`per_backend!`], which expands it twice: once
//! in a module `pg` over Postgres and once in a module `sqlite` over SQLite.
//! The two dialects agree on almost all of it: sqlx's SQLite driver binds
//! `$1`-style numbered parameters as Postgres does, and the row types decode
//! on both ([`super::row`]). What differs is said once per backend, here:
//!
//! - the database's clock (`db_now!()`: `now()`, or the file host's clock in
//!   integer microseconds) and how microseconds are added to it (`us!()`);
//! - `greatest!()`: `GREATEST` on Postgres, the scalar `max` on SQLite;
//! - `for_update!()`: a row lock on Postgres, nothing on SQLite (its
//!   writer's transaction holds the file); `skip_locked!()` the same for
//!   a claim that passes over rows another transaction holds;
//! - how a write runs: [`PgStore::write`] on a pooled connection
//!   (autocommit, one statement) and [`PgStore::write_tx`] in a transaction;
//!   on SQLite both go to the single writer ([`SqliteStore::write`]), whose
//!   group commit is the transaction;
//! - the few primitives that are the backend's own means (advisory locks,
//!   coalesced lanes), as inherent methods of each store that the shared
//!   code calls by name on `Driver`.
//!
//! Inside `per_backend!`, `Driver` is the store type, `Db` the sqlx
//! database and `Conn` its connection.
//!
//! [`PgStore::write`]: crate::store::PgStore
//! [`PgStore::write_tx`]: crate::store::PgStore
//! [`SqliteStore::write`]: crate::store::SqliteStore

use std::future::Future;
use std::pin::Pin;

pub(crate) mod admin;
pub(crate) mod channels;
pub(crate) mod console;
pub(crate) mod fallbacks;
pub(crate) mod maintenance;
pub(crate) mod messages;
pub(crate) mod opt_outs;
pub(crate) mod quality;
pub(crate) mod receipts;
pub(crate) mod routing;
pub(crate) mod spend;
pub(crate) mod tenants;
pub(crate) mod verifications;
pub(crate) mod webhooks;

/// The future a write closure returns (the shape of the SQLite writer's
/// jobs, used by both backends so the shared code writes one closure).
pub(crate) type BoxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// Expands the items given once per backend (see the module's docs).
macro_rules! per_backend {
    ($($body:tt)*) => {
        /// The items above, on Postgres.
        #[allow(unused_imports, unused_macros, dead_code)]
        pub(crate) mod pg {
            use super::*;
            pub(crate) type Driver = crate::store::PgStore;
            pub(crate) type Db = sqlx::Postgres;
            pub(crate) type Conn = sqlx::PgConnection;
            macro_rules! db_now { () => { "now()" } }
            macro_rules! us { () => { " * interval '1 microsecond'" } }
            macro_rules! greatest { () => { "GREATEST" } }
            macro_rules! for_update { () => { " FOR UPDATE" } }
            macro_rules! skip_locked { () => { " FOR UPDATE SKIP LOCKED" } }
            macro_rules! json_values { () => { "jsonb_each_text(metadata)" } }
            $($body)*
        }
        /// The items above, on SQLite.
        #[allow(unused_imports, unused_macros, dead_code)]
        pub(crate) mod sqlite {
            use super::*;
            pub(crate) type Driver = crate::store::SqliteStore;
            pub(crate) type Db = sqlx::Sqlite;
            pub(crate) type Conn = sqlx::SqliteConnection;
            macro_rules! db_now { () => { "CAST(unixepoch('subsec') * 1000000 AS INTEGER)" } }
            macro_rules! us { () => { "" } }
            macro_rules! greatest { () => { "max" } }
            macro_rules! for_update { () => { "" } }
            macro_rules! skip_locked { () => { "" } }
            macro_rules! json_values { () => { "json_each(metadata)" } }
            $($body)*
        }
    };
}

pub(crate) use per_backend;

/// A count as an `integer` column (saturating).
pub(crate) fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
