//! Integration tests: one binary, real Postgres, real HTTP, the mock provider
//! as the only fake.
//!
//! The contract, delivery and durability suites are written once, as
//! functions of the backend, and run against both Postgres and SQLite.

/// Turns each listed `async fn name(backend: Backend)` of the calling module
/// into two tests, `postgres::name` and `sqlite::name`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(crate::helpers::Backend::Postgres).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(crate::helpers::Backend::Sqlite).await
                }
            )*
        }
    };
}

mod batching;
mod caches;
mod campaigns;
mod contract;
mod db_failover;
mod delivery;
mod durability;
mod failover;
mod hardening;
mod hardening2;
mod helpers;
mod lifecycle;
mod observability;
mod outage;
mod process;
mod receipts;
mod sqlite_writer;
mod store;
mod twilio;
mod twilio_reconcile;
mod verify;
mod waiters;
