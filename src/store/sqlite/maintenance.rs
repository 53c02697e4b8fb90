//! Schema, health, shutdown and retention on SQLite.

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{MIGRATOR, SqliteStore};
use crate::store::time::{DbTime, db};
use crate::store::{MaintenanceStore, StoreError};

#[async_trait]
impl MaintenanceStore for SqliteStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(StoreError::from_migrate)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    #[tracing::instrument(name = "store.release_leases", level = "debug", skip_all)]
    async fn release_leases(&self, owner: &str, now: OffsetDateTime) -> Result<u64, StoreError> {
        let owner = owner.to_string();
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "UPDATE messages SET lease_token = NULL, lease_owner = NULL, \
                        lease_expires_at = NULL, next_attempt_at = ? \
                     WHERE lease_owner = ? AND status = 'processing'",
                )
                .bind(db(now))
                .bind(&owner)
                .execute(&mut *c)
                .await?;
                Ok(done.rows_affected())
            })
        })
        .await
    }

    #[tracing::instrument(name = "store.purge", level = "debug", skip_all)]
    async fn purge(&self, cutoff: OffsetDateTime, batch: u32) -> Result<u64, StoreError> {
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "DELETE FROM messages WHERE id IN ( \
                        SELECT id FROM messages WHERE created_at < ? AND status NOT IN ('processing', 'scheduled') \
                        ORDER BY created_at LIMIT ?)",
                )
                .bind(db(cutoff))
                .bind(i64::from(batch))
                .execute(&mut *c)
                .await?;
                Ok(done.rows_affected())
            })
        })
        .await
    }

    async fn purge_unmatched_receipts(
        &self,
        cutoff: OffsetDateTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "DELETE FROM receipts WHERE seq IN ( \
                        SELECT seq FROM receipts WHERE message_id IS NULL AND received_at < ? \
                        ORDER BY received_at LIMIT ?)",
                )
                .bind(db(cutoff))
                .bind(i64::from(batch))
                .execute(&mut *c)
                .await?;
                Ok(done.rows_affected())
            })
        })
        .await
    }

    async fn oldest_processing(&self) -> Result<Option<OffsetDateTime>, StoreError> {
        let oldest: Option<DbTime> =
            sqlx::query_scalar("SELECT min(created_at) FROM messages WHERE status = 'processing'")
                .fetch_one(&self.pool)
                .await?;
        Ok(oldest.map(|t| t.0))
    }
}
