//! Schema, health, shutdown and retention on SQLite (the statements both
//! backends share are in `store/shared/maintenance.rs`).

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{MIGRATOR, SqliteStore};
use crate::domain::MessageId;
use crate::store::time::db;
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
        self.ping_db().await
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
