//! Delivery receipts on Postgres: what is its own (the statements are in
//! `store/shared/receipts.rs`).

use super::PgStore;
use crate::store::StoreError;

impl PgStore {
    /// Serialises everything that links or applies receipts of one provider
    /// message id, until the transaction ends: a receipt and the delivery
    /// task's write of that id can then never miss each other.
    pub(crate) async fn lock_receipts(
        tx: &mut sqlx::PgConnection,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!(
                "sendonce.receipts:{provider}:{provider_message_id}"
            ))
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    /// Whether receipts wait for this id: coalesced with the other callers'
    /// reads (`batch.rs`).
    pub(crate) async fn lookup_unmatched(
        &self,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<bool, StoreError> {
        self.lanes()
            .look
            .call((provider.to_string(), provider_message_id.to_string()))
            .await
    }
}
