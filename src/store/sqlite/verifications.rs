//! Verifications on SQLite: what is its own (the transactions are in
//! `store/shared/verifications.rs`).

use sqlx::SqliteConnection;
use uuid::Uuid;

use super::SqliteStore;
use crate::store::StoreError;

impl SqliteStore {
    /// Nothing to take: every start runs in the single writer's
    /// transaction, which holds the file's write lock, so its per-hour
    /// counts and pause decision are exact.
    pub(crate) async fn lock_verify_prefix(
        _c: &mut SqliteConnection,
        _tenant_id: Uuid,
        _prefix: &str,
    ) -> Result<(), StoreError> {
        Ok(())
    }
}
