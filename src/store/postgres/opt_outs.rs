//! Opt-out lists on Postgres.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::PgStore;
use crate::store::time::{DbTime, db};
use crate::store::{OptOut, OptOutStore, StoreError};

#[async_trait]
impl OptOutStore for PgStore {
    async fn add_opt_out(
        &self,
        tenant_id: Uuid,
        number: &str,
        source: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO opt_outs (tenant_id, number, source, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant_id, number) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(number)
        .bind(source)
        .bind(db(at))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn remove_opt_out(&self, tenant_id: Uuid, number: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM opt_outs WHERE tenant_id = $1 AND number = $2")
            .bind(tenant_id)
            .bind(number)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn list_opt_outs(
        &self,
        tenant_id: Uuid,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<OptOut>, StoreError> {
        let rows: Vec<(String, String, DbTime, Option<String>)> = sqlx::query_as(
            "SELECT number, source, created_at, added_by FROM opt_outs \
             WHERE tenant_id = $1 AND ($2::text IS NULL OR number > $2) \
             ORDER BY number LIMIT $3",
        )
        .bind(tenant_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(number, source, created_at, added_by)| OptOut {
                number,
                source,
                created_at: created_at.0,
                added_by,
            })
            .collect())
    }
}
