//! Tenants, API keys and tenant settings on SQLite.

use crate::domain::quiet::QuietHours;
use async_trait::async_trait;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;
use crate::store::row::ApiKeyRow;
use crate::store::time::{DbTime, db};
use crate::store::types::edited_senders;
use crate::store::{
    ApiKeyInfo, BootstrapOutcome, NewApiKey, SqlxResultExt, StoreError, TenantAuth, TenantStore,
};

#[async_trait]
impl TenantStore for SqliteStore {
    async fn tenant_count(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar("SELECT count(*) FROM tenants")
            .fetch_one(&self.pool)
            .await
            .store_err()
    }

    async fn create_tenant(&self, name: &str, key: &NewApiKey) -> Result<Uuid, StoreError> {
        let (name, key) = (name.to_string(), key.clone());
        self.write(move |c| {
            Box::pin(async move {
                let id = Uuid::now_v7();
                sqlx::query("INSERT INTO tenants (id, name) VALUES (?, ?)")
                    .bind(id)
                    .bind(&name)
                    .execute(&mut *c)
                    .await?;
                sqlx::query(
                    "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) \
                     VALUES (?, ?, ?, ?)",
                )
                .bind(key.id)
                .bind(id)
                .bind(&key.hash)
                .bind(&key.prefix)
                .execute(&mut *c)
                .await?;
                Ok(id)
            })
        })
        .await
    }

    async fn ensure_bootstrap_key(
        &self,
        name: &str,
        key: &NewApiKey,
        at: OffsetDateTime,
    ) -> Result<BootstrapOutcome, StoreError> {
        let (name, key) = (name.to_string(), key.clone());
        self.write(move |tx| {
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO tenants (id, name) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                )
                .bind(Uuid::now_v7())
                .bind(&name)
                .execute(&mut *tx)
                .await?;
                let configured: Option<(bool,)> = sqlx::query_as(
                    "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix, bootstrap) \
             SELECT ?, t.id, ?, ?, 1 FROM tenants t WHERE t.name = ? \
             ON CONFLICT (key_hash) DO UPDATE SET bootstrap = 1 \
             WHERE api_keys.tenant_id = excluded.tenant_id \
             RETURNING revoked_at IS NOT NULL",
                )
                .bind(key.id)
                .bind(&key.hash)
                .bind(&key.prefix)
                .bind(&name)
                .fetch_optional(&mut *tx)
                .await?;
                let mut outcome = BootstrapOutcome::default();
                match configured {
                    Some((false,)) => {
                        let revoked: Vec<(Uuid, String)> = sqlx::query_as(
                            "UPDATE api_keys SET revoked_at = ? \
                     WHERE bootstrap AND revoked_at IS NULL AND key_hash <> ? \
                     RETURNING id, key_prefix",
                        )
                        .bind(db(at))
                        .bind(&key.hash)
                        .fetch_all(&mut *tx)
                        .await?;
                        outcome.revoked = revoked;
                    }
                    _ => outcome.configured_key_revoked = true,
                }
                Ok(outcome)
            })
        })
        .await
    }

    #[tracing::instrument(name = "store.tenant_for_key", level = "debug", skip_all)]
    async fn tenant_for_key(&self, key_hash: &[u8]) -> Result<Option<TenantAuth>, StoreError> {
        type Row = (Uuid, Option<String>, Option<String>, bool, Option<String>);
        let row: Option<Row> = sqlx::query_as(
            "SELECT k.tenant_id, t.allowed_countries, t.allowed_senders, t.name = 'default', \
                t.quiet_hours \
             FROM api_keys k \
             JOIN tenants t ON t.id = k.tenant_id \
             WHERE k.key_hash = ? AND k.revoked_at IS NULL",
        )
        .bind(key_hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(
            |(id, countries, senders, bootstrap_tenant, quiet)| TenantAuth {
                id,
                // Stored comma-separated: SQLite has no arrays.
                allowed_countries: countries.as_deref().map(split_list),
                allowed_senders: senders.as_deref().map(split_list),
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
        let (tenant_name, key) = (tenant_name.to_string(), key.clone());
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) \
                     SELECT ?, t.id, ?, ? FROM tenants t WHERE t.name = ?",
                )
                .bind(key.id)
                .bind(&key.hash)
                .bind(&key.prefix)
                .bind(&tenant_name)
                .execute(&mut *c)
                .await?;
                Ok((done.rows_affected() == 1).then_some(key.id))
            })
        })
        .await
    }

    async fn revoke_key(&self, key_id: Uuid, at: OffsetDateTime) -> Result<bool, StoreError> {
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query(
                    "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?",
                )
                .bind(db(at))
                .bind(key_id)
                .execute(&mut *c)
                .await?;
                Ok(done.rows_affected() == 1)
            })
        })
        .await
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
        let (countries, tenant_name) = (countries.map(|c| c.join(",")), tenant_name.to_string());
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query("UPDATE tenants SET allowed_countries = ? WHERE name = ?")
                    .bind(&countries)
                    .bind(&tenant_name)
                    .execute(&mut *c)
                    .await?;
                Ok(done.rows_affected() == 1)
            })
        })
        .await
    }

    async fn set_quiet_hours(
        &self,
        tenant_name: &str,
        window: Option<QuietHours>,
    ) -> Result<bool, StoreError> {
        let (window, tenant_name) = (window.map(|w| w.to_string()), tenant_name.to_string());
        self.write(move |c| {
            Box::pin(async move {
                let done = sqlx::query("UPDATE tenants SET quiet_hours = ? WHERE name = ?")
                    .bind(&window)
                    .bind(&tenant_name)
                    .execute(&mut *c)
                    .await?;
                Ok(done.rows_affected() == 1)
            })
        })
        .await
    }

    async fn allowed_senders(
        &self,
        tenant_name: &str,
    ) -> Result<Option<Option<Vec<String>>>, StoreError> {
        let row: Option<(Option<String>,)> =
            sqlx::query_as("SELECT allowed_senders FROM tenants WHERE name = ?")
                .bind(tenant_name)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(s,)| s.as_deref().map(split_list)))
    }

    async fn edit_senders(
        &self,
        tenant_name: &str,
        sender: &str,
        add: bool,
    ) -> Result<Option<bool>, StoreError> {
        let (tenant_name, sender) = (tenant_name.to_string(), sender.to_string());
        self.write(move |tx| {
            Box::pin(async move {
                let row: Option<(Option<String>,)> =
                    sqlx::query_as("SELECT allowed_senders FROM tenants WHERE name = ?")
                        .bind(&tenant_name)
                        .fetch_optional(&mut *tx)
                        .await?;
                let Some((list,)) = row else {
                    return Ok(None);
                };
                let Some(list) = edited_senders(list.as_deref().map(split_list), &sender, add)
                else {
                    return Ok(Some(false));
                };
                sqlx::query("UPDATE tenants SET allowed_senders = ? WHERE name = ?")
                    .bind(list.join(","))
                    .bind(&tenant_name)
                    .execute(&mut *tx)
                    .await?;
                Ok(Some(true))
            })
        })
        .await
    }
}

/// A comma-separated list as stored (SQLite has no arrays); empty: no entries.
fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
