//! Delivery receipts on SQLite: what is its own (the statements are in
//! `store/shared/receipts.rs`).

use sqlx::SqliteConnection;

use super::SqliteStore;
use crate::store::StoreError;

impl SqliteStore {
    /// Nothing to take: the single writer serialises every receipt with the
    /// delivery task's `attach_receipts`.
    pub(crate) async fn lock_receipts(
        _c: &mut SqliteConnection,
        _provider: &str,
        _provider_message_id: &str,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// Whether receipts wait for this id: one read on the readers' pool.
    pub(crate) async fn lookup_unmatched(
        &self,
        provider: &str,
        provider_message_id: &str,
    ) -> Result<bool, StoreError> {
        self.has_unmatched_one(provider, provider_message_id).await
    }
}
