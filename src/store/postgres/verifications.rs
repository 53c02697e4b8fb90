//! Verifications on Postgres: what is its own (the transactions are in
//! `store/shared/verifications.rs`).

use sqlx::PgConnection;
use uuid::Uuid;

use super::PgStore;
use crate::store::StoreError;

impl PgStore {
    /// Serialises the starts to one (tenant, destination prefix) across
    /// instances until the transaction ends, so its per-hour counts and
    /// pause decision are exact.
    pub(crate) async fn lock_verify_prefix(
        c: &mut PgConnection,
        tenant_id: Uuid,
        prefix: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("verify:{tenant_id}:{prefix}"))
            .execute(&mut *c)
            .await?;
        Ok(())
    }
}
