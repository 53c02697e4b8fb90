//! Tenants, API keys and tenant settings on Postgres.

use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::PgStore;
use crate::notify::Acks;
use crate::store::row::ApiKeyRow;
use crate::store::time::{DbTime, db};
use crate::store::{ApiKeyInfo, NewApiKey, SqlxResultExt, StoreError, TenantAuth, TenantStore};

#[async_trait]
impl TenantStore for PgStore {
    async fn tenant_count(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar("SELECT count(*) FROM tenants")
            .fetch_one(&self.pool)
            .await
            .store_err()
    }

    async fn create_tenant(&self, name: &str, key: &NewApiKey) -> Result<Uuid, StoreError> {
        let mut tx = self.pool.begin().await?;
        let id = Uuid::now_v7();
        sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2)")
            .bind(id)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) VALUES ($1, $2, $3, $4)",
        )
        .bind(key.id)
        .bind(id)
        .bind(&key.hash)
        .bind(&key.prefix)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    async fn ensure_tenant_key(&self, name: &str, key: &NewApiKey) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
            .bind(Uuid::now_v7())
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) \
             SELECT $1, t.id, $3, $4 FROM tenants t WHERE t.name = $2 \
             ON CONFLICT (key_hash) DO NOTHING",
        )
        .bind(key.id)
        .bind(name)
        .bind(&key.hash)
        .bind(&key.prefix)
        .execute(&mut *tx)
        .await?;
        tx.commit().await.store_err()
    }

    #[tracing::instrument(name = "store.tenant_for_key", level = "debug", skip_all)]
    async fn tenant_for_key(&self, key_hash: &[u8]) -> Result<Option<TenantAuth>, StoreError> {
        let row: Option<(Uuid, Option<Vec<String>>)> = sqlx::query_as(
            "SELECT k.tenant_id, t.allowed_countries FROM api_keys k \
             JOIN tenants t ON t.id = k.tenant_id \
             WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
        )
        .bind(key_hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(id, allowed_countries)| TenantAuth {
            id,
            allowed_countries,
        }))
    }

    async fn list_tenants(&self) -> Result<Vec<(Uuid, String, OffsetDateTime)>, StoreError> {
        let rows: Vec<(Uuid, String, DbTime)> =
            sqlx::query_as("SELECT id, name, created_at FROM tenants ORDER BY name")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(id, name, at)| (id, name, at.0))
            .collect())
    }

    async fn add_key(
        &self,
        tenant_name: &str,
        key: &NewApiKey,
    ) -> Result<Option<Uuid>, StoreError> {
        let done = sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) \
             SELECT $1, t.id, $3, $4 FROM tenants t WHERE t.name = $2",
        )
        .bind(key.id)
        .bind(tenant_name)
        .bind(&key.hash)
        .bind(&key.prefix)
        .execute(&self.pool)
        .await?;
        Ok((done.rows_affected() == 1).then_some(key.id))
    }

    async fn revoke_key(&self, key_id: Uuid, at: OffsetDateTime) -> Result<bool, StoreError> {
        // Returns once every instance has dropped the key from its cache.
        let acks = Acks::start(&self.pool).await;
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1")
                .bind(key_id)
                .bind(db(at))
                .execute(&self.pool)
                .await?;
        if let Some(acks) = acks
            && done.rows_affected() > 0
        {
            acks.wait().await;
        }
        Ok(done.rows_affected() == 1)
    }

    async fn list_keys(&self) -> Result<Vec<ApiKeyInfo>, StoreError> {
        let rows: Vec<ApiKeyRow> = sqlx::query_as(
            "SELECT k.id, t.name, k.key_prefix, k.created_at, k.revoked_at \
             FROM api_keys k JOIN tenants t ON t.id = k.tenant_id ORDER BY t.name, k.created_at",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(ApiKeyInfo::from).collect())
    }

    async fn set_allowed_countries(
        &self,
        tenant_name: &str,
        countries: Option<&[String]>,
    ) -> Result<bool, StoreError> {
        let acks = Acks::start(&self.pool).await;
        let done = sqlx::query("UPDATE tenants SET allowed_countries = $2 WHERE name = $1")
            .bind(tenant_name)
            .bind(countries)
            .execute(&self.pool)
            .await?;
        if let Some(acks) = acks
            && done.rows_affected() > 0
        {
            acks.wait().await;
        }
        Ok(done.rows_affected() == 1)
    }
}
