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

/// Turns each listed `async fn name(backend: Backend)` of the calling module
/// into a test `pgbouncer::name` that runs it on Postgres through PgBouncer
/// in transaction mode (see `pooler.rs`).
macro_rules! through_pgbouncer {
    ($($name:ident),* $(,)?) => {
        mod pgbouncer {
            $(
                #[tokio::test]
                async fn $name() {
                    crate::pooler::through_pgbouncer(
                        super::$name(crate::helpers::Backend::Postgres),
                    )
                    .await
                }
            )*
        }
    };
}

mod access;
mod admin;
mod batch_answers;
mod batching;
mod caches;
mod campaigns;
mod channel_orders;
mod cli;
mod conformance;
mod console;
mod contract;
mod crash_points;
mod db_failover;
mod delivery;
mod driver;
mod durability;
mod failover;
mod fair_slots;
mod fallback_crashes;
mod gateway_promise;
mod hardening;
mod hardening2;
mod hardening3;
mod hardening4;
mod hardening5;
mod helpers;
mod infobip;
mod lagging_lookups;
mod lifecycle;
mod national;
mod npm_smsc;
mod observability;
mod order_matrix;
mod outage;
mod outbox;
mod paging;
mod pooler;
mod process;
mod promise;
mod receipts;
mod route_quality;
mod routes;
mod scrubbing;
mod sealed;
mod slow_bodies;
mod smpp;
mod smpp_load;
mod smpp_npm;
mod smsc;
mod spend;
mod sqlite_writer;
mod store;
mod telegram;
mod telegram_gateway;
mod telegram_updates;
mod test_mode;
mod twilio;
mod twilio_reconcile;
mod verify;
mod vonage;
mod waiters;
mod webhooks;
mod whatsapp;
