//! Schema, health, shutdown and retention on Postgres (the statements both
//! backends share are in `store/shared/maintenance.rs`).

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{MIGRATOR, PgStore};
use crate::domain::MessageId;
use crate::store::time::db;
use crate::store::{ConnectionStats, DbStatus, MaintenanceStore, StoreError};

#[async_trait]
impl MaintenanceStore for PgStore {
    fn announces_changes(&self) -> bool {
        true
    }

    fn change_feed(
        &self,
        notifier: crate::notify::Notifier,
        stop: tokio_util::sync::CancellationToken,
    ) -> Option<crate::store::ChangeFeed> {
        // LISTEN needs a session of its own: never through a transaction pooler.
        Some(Box::pin(notifier.listen(self.session_pool().clone(), stop)))
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // The migrator holds a session-level advisory lock.
        MIGRATOR
            .run(self.session_pool())
            .await
            .map_err(StoreError::from_migrate)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.ping_db().await
    }

    async fn status(&self) -> Result<DbStatus, StoreError> {
        let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&self.pool)
            .await?;
        if in_recovery {
            return Err(StoreError::Unavailable(sqlx::Error::Protocol(
                "the database server is a standby".into(),
            )));
        }
        let o = self.pool.connect_options();
        Ok(DbStatus {
            role: "primary",
            host: Some(format!("{}:{}", o.get_host(), o.get_port())),
        })
    }

    fn connection_stats(&self) -> ConnectionStats {
        self.hosts.as_ref().map(|h| h.stats()).unwrap_or_default()
    }

    #[tracing::instrument(name = "store.release_leases", level = "debug", skip_all)]
    async fn release_leases(
        &self,
        owner: &str,
        now: OffsetDateTime,
        hold: &[MessageId],
        hold_for: std::time::Duration,
    ) -> Result<u64, StoreError> {
        let hold: Vec<uuid::Uuid> = hold.iter().map(|id| id.0).collect();
        // One statement: the cut-off calls' leases shortened (never
        // lengthened), everything else released.
        let released: i64 = sqlx::query_scalar(
            "WITH held AS ( \
                UPDATE messages SET lease_expires_at = \
                    LEAST(lease_expires_at, now() + $4 * interval '1 microsecond') \
                WHERE lease_owner = $1 AND status = 'processing' AND id = ANY($3)), \
             released AS ( \
                UPDATE messages SET lease_token = NULL, lease_owner = NULL, \
                    lease_expires_at = NULL, next_attempt_at = $2 \
                WHERE lease_owner = $1 AND status = 'processing' AND id <> ALL($3) \
                RETURNING id) \
             SELECT count(*) FROM released",
        )
        .bind(owner)
        .bind(db(now))
        .bind(&hold)
        .bind(crate::store::time::micros(hold_for))
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(released).unwrap_or(0))
    }

    #[tracing::instrument(name = "store.purge", level = "debug", skip_all)]
    async fn purge(&self, cutoff: OffsetDateTime, batch: u32) -> Result<u64, StoreError> {
        self.purge_messages(cutoff, batch).await
    }

    async fn purge_unmatched_receipts(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        self.purge_unmatched(cutoff, batch).await
    }

    async fn oldest_processing(&self) -> Result<Option<OffsetDateTime>, StoreError> {
        self.oldest_processing_at().await
    }

    fn batch_sizes(&self) -> Option<std::sync::Arc<crate::metrics::BatchSizes>> {
        Some(std::sync::Arc::clone(&self.sizes))
    }
}
