//! Health and retention: the statements both backends share. The trait
//! implementations stay per backend (`postgres/maintenance.rs`,
//! `sqlite/maintenance.rs`): migrations, status, the change feed and
//! releasing leases are each backend's own means; they call these.

use time::OffsetDateTime;

use super::per_backend;
use crate::store::StoreError;
use crate::store::time::{DbTime, db};

const PING: &str = "SELECT 1";

/// Final messages created before `$1`, oldest first, at most `$2`.
const PURGE_MESSAGES: &str = "DELETE FROM messages WHERE id IN ( \
        SELECT id FROM messages WHERE created_at < $1 \
            AND status NOT IN ('processing', 'scheduled') \
        ORDER BY created_at LIMIT $2)";

const PURGE_UNMATCHED_RECEIPTS: &str = "DELETE FROM receipts WHERE seq IN ( \
        SELECT seq FROM receipts WHERE message_id IS NULL AND received_at < $1 \
        ORDER BY received_at LIMIT $2)";

const OLDEST_PROCESSING: &str = "SELECT min(created_at) FROM messages WHERE status = 'processing'";

per_backend! {
    impl Driver {
        pub(crate) async fn ping_db(&self) -> Result<(), StoreError> {
            sqlx::query(PING).execute(self.pool()).await?;
            Ok(())
        }

        pub(crate) async fn purge_messages(
            &self,
            cutoff: OffsetDateTime,
            batch: u32,
        ) -> Result<u64, StoreError> {
            self.purge_rows(PURGE_MESSAGES, cutoff, batch).await
        }

        pub(crate) async fn purge_unmatched(
            &self,
            cutoff: OffsetDateTime,
            batch: u32,
        ) -> Result<u64, StoreError> {
            self.purge_rows(PURGE_UNMATCHED_RECEIPTS, cutoff, batch).await
        }

        /// One retention statement (`$1` the cutoff, `$2` the batch).
        pub(crate) async fn purge_rows(
            &self,
            sql: &'static str,
            cutoff: OffsetDateTime,
            batch: u32,
        ) -> Result<u64, StoreError> {
            self.write(move |c| {
                Box::pin(async move {
                    let done = sqlx::query(sql)
                        .bind(db(cutoff))
                        .bind(i64::from(batch))
                        .execute(&mut *c)
                        .await?;
                    Ok(done.rows_affected())
                })
            })
            .await
        }

        pub(crate) async fn oldest_processing_at(&self) -> Result<Option<OffsetDateTime>, StoreError> {
            let oldest: Option<DbTime> = sqlx::query_scalar(OLDEST_PROCESSING)
                .fetch_one(self.pool())
                .await?;
            Ok(oldest.map(|t| t.0))
        }
    }
}
