//! Tenants, API keys and tenant settings on Postgres.

use crate::domain::quiet::QuietHours;
use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::PgStore;
use crate::notify::Acks;
use crate::store::row::ApiKeyRow;
use crate::store::time::{DbTime, db};
use crate::store::types::edited_senders;
use crate::store::{
    ApiKeyInfo, BootstrapOutcome, NewApiKey, SqlxResultExt, StoreError, TenantAuth, TenantStore,
};

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

    async fn ensure_bootstrap_key(
        &self,
        name: &str,
        key: &NewApiKey,
        at: OffsetDateTime,
    ) -> Result<BootstrapOutcome, StoreError> {
        // A revoked previous bootstrap key is refused at once: wait, as
        // `revoke_key` does, until every instance dropped it from its cache.
        let acks = Acks::start(self.session_pool()).await;
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
            .bind(Uuid::now_v7())
            .bind(name)
            .execute(&mut *tx)
            .await?;
        // A key already there (a restart with the same value, or the first
        // start after the upgrade that added the flag) becomes the bootstrap
        // key, if it is this tenant's.
        let configured: Option<(bool,)> = sqlx::query_as(
            "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix, bootstrap) \
             SELECT $1, t.id, $3, $4, true FROM tenants t WHERE t.name = $2 \
             ON CONFLICT (key_hash) DO UPDATE SET bootstrap = true \
             WHERE api_keys.tenant_id = excluded.tenant_id \
             RETURNING revoked_at IS NOT NULL",
        )
        .bind(key.id)
        .bind(name)
        .bind(&key.hash)
        .bind(&key.prefix)
        .fetch_optional(&mut *tx)
        .await?;
        let mut outcome = BootstrapOutcome::default();
        match configured {
            Some((false,)) => {
                let revoked: Vec<(Uuid, String)> = sqlx::query_as(
                    "UPDATE api_keys SET revoked_at = $2 \
                     WHERE bootstrap AND revoked_at IS NULL AND key_hash <> $1 \
                     RETURNING id, key_prefix",
                )
                .bind(&key.hash)
                .bind(db(at))
                .fetch_all(&mut *tx)
                .await?;
                outcome.revoked = revoked;
            }
            // Revoked earlier, or (never in practice) another tenant's key.
            _ => outcome.configured_key_revoked = true,
        }
        tx.commit().await?;
        if let Some(acks) = acks
            && !outcome.revoked.is_empty()
        {
            acks.wait().await;
        }
        Ok(outcome)
    }

    #[tracing::instrument(name = "store.tenant_for_key", level = "debug", skip_all)]
    async fn tenant_for_key(&self, key_hash: &[u8]) -> Result<Option<TenantAuth>, StoreError> {
        type Row = (
            Uuid,
            Option<Vec<String>>,
            Option<Vec<String>>,
            bool,
            Option<String>,
        );
        let row: Option<Row> = sqlx::query_as(
            "SELECT k.tenant_id, t.allowed_countries, t.allowed_senders, t.name = 'default', \
                t.quiet_hours \
             FROM api_keys k \
             JOIN tenants t ON t.id = k.tenant_id \
             WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
        )
        .bind(key_hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(
            |(id, allowed_countries, allowed_senders, bootstrap_tenant, quiet)| TenantAuth {
                id,
                allowed_countries,
                allowed_senders,
                bootstrap_tenant,
                quiet_hours: quiet.as_deref().and_then(QuietHours::parse),
            },
        ))
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
        let acks = Acks::start(self.session_pool()).await;
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
        let acks = Acks::start(self.session_pool()).await;
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

    async fn set_quiet_hours(
        &self,
        tenant_name: &str,
        window: Option<QuietHours>,
    ) -> Result<bool, StoreError> {
        let acks = Acks::start(self.session_pool()).await;
        let done = sqlx::query("UPDATE tenants SET quiet_hours = $2 WHERE name = $1")
            .bind(tenant_name)
            .bind(window.map(|w| w.to_string()))
            .execute(&self.pool)
            .await?;
        if let Some(acks) = acks
            && done.rows_affected() > 0
        {
            acks.wait().await;
        }
        Ok(done.rows_affected() == 1)
    }

    async fn allowed_senders(
        &self,
        tenant_name: &str,
    ) -> Result<Option<Option<Vec<String>>>, StoreError> {
        let row: Option<(Option<Vec<String>>,)> =
            sqlx::query_as("SELECT allowed_senders FROM tenants WHERE name = $1")
                .bind(tenant_name)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(s,)| s))
    }

    async fn edit_senders(
        &self,
        tenant_name: &str,
        sender: &str,
        add: bool,
    ) -> Result<Option<bool>, StoreError> {
        // Returns once every instance dropped its cached view of the tenant
        // (as a revocation does), so the new list holds at once everywhere.
        let acks = Acks::start(self.session_pool()).await;
        let mut tx = self.pool.begin().await?;
        let row: Option<(Option<Vec<String>>,)> =
            sqlx::query_as("SELECT allowed_senders FROM tenants WHERE name = $1 FOR UPDATE")
                .bind(tenant_name)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((list,)) = row else {
            return Ok(None);
        };
        let Some(list) = edited_senders(list, sender, add) else {
            return Ok(Some(false));
        };
        sqlx::query("UPDATE tenants SET allowed_senders = $2 WHERE name = $1")
            .bind(tenant_name)
            .bind(&list)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        if let Some(acks) = acks {
            acks.wait().await;
        }
        Ok(Some(true))
    }
}
