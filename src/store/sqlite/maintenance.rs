//! Schema, health, shutdown and retention on SQLite.

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{MIGRATOR, SqliteStore};
use crate::domain::MessageId;
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
    async fn release_leases(
        &self,
        owner: &str,
        now: OffsetDateTime,
        hold: &[MessageId],
        hold_for: std::time::Duration,
    ) -> Result<u64, StoreError> {
        let owner = owner.to_string();
        // The held ids as a JSON array of hex (`json_each`, `unhex`: ids are
        // 16-byte blobs), one statement each way.
        let hold = serde_json::to_string(
            &hold
                .iter()
                .map(|id| id.0.simple().to_string())
                .collect::<Vec<_>>(),
        )
        .map_err(|_| StoreError::Invariant("message ids that are not JSON"))?;
        self.write(move |c| {
            Box::pin(async move {
                sqlx::query(concat!(
                    "UPDATE messages SET lease_expires_at = min(lease_expires_at, ",
                    db_now!(),
                    " + ?) WHERE lease_owner = ? AND status = 'processing' \
                        AND id IN (SELECT unhex(value) FROM json_each(?))",
                ))
                .bind(crate::store::time::micros(hold_for))
                .bind(&owner)
                .bind(&hold)
                .execute(&mut *c)
                .await?;
                let done = sqlx::query(
                    "UPDATE messages SET lease_token = NULL, lease_owner = NULL, \
                        lease_expires_at = NULL, next_attempt_at = ? \
                     WHERE lease_owner = ? AND status = 'processing' \
                        AND id NOT IN (SELECT unhex(value) FROM json_each(?))",
                )
                .bind(db(now))
                .bind(&owner)
                .bind(&hold)
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
